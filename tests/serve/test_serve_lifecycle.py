"""A server's life: SIGTERM finishes the requests in flight, a worker that dies is
replaced while the others serve, and MLServer itself runs mixrt's runtime class from a
model-settings.json (as KServe's MLServer runtime does)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

tritonclient_http = pytest.importorskip("tritonclient.http")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
if importlib.util.find_spec("kserve") is None:
    pytest.skip("mixrt serve needs KServe (mixrt[serve])", allow_module_level=True)

import onnxruntime as ort  # noqa: E402

from mixrt.ops.device import gpu_available  # noqa: E402

from helpers import loop_model  # noqa: E402
from serving import mlp_model, post, start_server  # noqa: E402


def scores_of(seed: int, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(mlp_model(seed).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(["scores"], {"x": x})[0]


def ask(url: str, x: np.ndarray, answers: list, index: int) -> None:
    client = tritonclient_http.InferenceServerClient(url, network_timeout=60)
    item = tritonclient_http.InferInput("x", list(x.shape), "FP32")
    item.set_data_from_numpy(x)
    try:
        answers[index] = client.infer("mlp", [item]).as_numpy("scores")
    except Exception as exc:  # noqa: BLE001 - the test reports it
        answers[index] = exc


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(1), path)
    return path


def test_sigterm_finishes_the_requests_in_flight(model_file, tmp_path):
    # requests wait 1.5 s to be joined: SIGTERM comes while they are queued
    server = start_server(model_file, tmp_path / "log", "--max-batch-size", "64",
                          "--max-delay-ms", "1500")
    requests = [np.random.default_rng(i).standard_normal((1, 12)).astype(np.float32)
                for i in range(3)]
    answers = [None] * len(requests)
    threads = [threading.Thread(target=ask, args=(server.url, x, answers, i))
               for i, x in enumerate(requests)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    assert server.stop(timeout=60) == 0, server.text()[-3000:]
    for thread in threads:
        thread.join(30)
    for x, answer in zip(requests, answers):
        assert isinstance(answer, np.ndarray), (answer, server.text()[-3000:])
        np.testing.assert_allclose(answer, scores_of(1, x), rtol=1e-5, atol=1e-5)
    assert time.monotonic() - started < 20


def test_a_worker_that_dies_is_replaced_and_the_others_serve(model_file, tmp_path):
    server = start_server(model_file, tmp_path / "log", "--workers", "2")
    try:
        workers = children_of(server.process.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        x = np.ones((2, 12), np.float32)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = children_of(server.process.pid)
            if len(now) == 2 and workers[0] not in now:
                break
            time.sleep(0.2)
        assert len(children_of(server.process.pid)) == 2, server.text()[-3000:]
        for _ in range(6):  # answered, whichever worker takes the connection
            answers = [None]
            ask(server.url, x, answers, 0)
            np.testing.assert_allclose(answers[0], scores_of(1, x), rtol=1e-5, atol=1e-5)
        assert f"pid {workers[0]}) ended with status -9; starting another" in server.text()
    finally:
        assert server.stop() == 0


def test_kserves_own_model_server_runs_mixrts_model_class(model_file, tmp_path):
    """A custom KServe predictor as KServe documents them: ``kserve.ModelServer().start``
    over ``MixrtModel.from_file`` on a folder laid out as KServe's /mnt/models, asked with
    Triton's clients over gRPC (raw contents) and REST (JSON and binary)."""
    folder = tmp_path / "mnt" / "models"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(model_file.read_bytes())
    ports = [_free_port() for _ in range(2)]
    script = (f"import kserve\nfrom mixrt.serve import MixrtModel\n"
              f"model = MixrtModel.from_file('mlp', {str(folder)!r}, max_batch_size=4)\n"
              f"kserve.ModelServer(http_port={ports[0]}, grpc_port={ports[1]}).start([model])\n")
    command = [sys.executable, "-c", script]
    server = start_server(None, tmp_path / "log", command=command, ports=[*ports, 0])
    try:
        x = np.random.default_rng(4).standard_normal((3, 12)).astype(np.float32)
        expected = scores_of(1, x)
        client = tritonclient_grpc.InferenceServerClient(f"127.0.0.1:{ports[1]}")
        item = tritonclient_grpc.InferInput("x", [3, 12], "FP32")
        item.set_data_from_numpy(x)
        np.testing.assert_allclose(client.infer("mlp", [item]).as_numpy("scores"), expected,
                                   rtol=1e-5, atol=1e-5)
        metadata = client.get_model_metadata("mlp", as_json=True)
        assert metadata["inputs"][0]["shape"] == ["-1", "12"]
        http = tritonclient_http.InferenceServerClient(f"127.0.0.1:{ports[0]}")
        item = tritonclient_http.InferInput("x", [3, 12], "FP32")
        item.set_data_from_numpy(x, binary_data=True)
        answer = http.infer("mlp", [item]).as_numpy("scores")
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)
        # JSON (with its Content-Type: KServe reads a body without one as binary, and
        # Triton's HTTP client sends none), and a request of the wrong shape
        body = {"inputs": [{"name": "x", "shape": [3, 12], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}
        status, answer = post(ports[0], "/v2/models/mlp/infer", json.dumps(body).encode())
        assert status == 200, answer
        scores = json.loads(answer)["outputs"][0]["data"]
        np.testing.assert_allclose(np.reshape(scores, (3, 5)), expected, rtol=1e-5, atol=1e-5)
        body["inputs"][0]["shape"] = [3, 11]
        body["inputs"][0]["data"] = x[:, :11].ravel().tolist()
        status, answer = post(ports[0], "/v2/models/mlp/infer", json.dumps(body).encode())
        assert status == 400 and b"takes shape [-1, 12]" in answer, answer
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("rows", [2, 5])
def test_prepare_only_checks_batching_at_any_batch_size_and_exits(model_file, rows):
    """``--prepare-only`` (an image's build step) prepares as a start would, says whether
    batching is on, and exits; at a batch of 2 the check joins no more rows than that."""
    done = subprocess.run([sys.executable, "-m", "mixrt", "serve", str(model_file),
                           "--max-batch-size", str(rows), "--prepare-only"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "prepared mlp version None: batching on" in done.stderr, done.stderr[-3000:]


def test_workers_still_busy_after_the_grace_period_are_killed_and_the_exit_says_so(
        model_file, tmp_path):
    # two requests queue for a 10 s batch behind a first one; SIGTERM allows 1 s
    server = start_server(model_file, tmp_path / "log", "--max-batch-size", "64",
                          "--max-delay-ms", "10000", "--grace-s", "1")
    answers = [None] * 3
    threads = [threading.Thread(target=ask, args=(server.url, np.ones((1, 12), np.float32),
                                                  answers, i)) for i in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    assert server.stop(timeout=30) == 1, server.text()[-3000:]
    assert time.monotonic() - started < 8
    assert "workers still busy 1.0 s after the signal: killed" in server.text()
    for thread in threads:
        thread.join(30)


@pytest.mark.skipif(gpu_available(), reason="a GPU is here: the model would load on it")
def test_a_model_no_worker_can_load_stops_the_server_instead_of_restarting_forever(
        model_file, tmp_path):
    """A GPU model is loaded by each worker (CUDA does not survive the fork), so without a
    GPU every worker fails at its start; after three such deaths in a row the supervisor
    stops with status 1 rather than starting workers forever."""
    log = tmp_path / "log"
    with open(log, "wb") as sink:
        done = subprocess.run([sys.executable, "-m", "mixrt", "serve", str(model_file),
                               "--device", "gpu:0", "--http-port", "0", "--grpc-port", "0",
                               "--metrics-port", "0", "--host", "127.0.0.1"],
                              stdout=sink, stderr=subprocess.STDOUT, timeout=120)
    text = log.read_text(errors="replace")
    assert done.returncode == 1, text[-3000:]
    assert "3 times in a row: stopping" in text and "no CUDA GPU is usable here" in text


def test_a_misspelled_device_is_refused_before_anything_starts(model_file):
    done = subprocess.run([sys.executable, "-m", "mixrt", "serve", str(model_file),
                           "--device", "gpu-0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "device 'gpu-0' is not understood" in done.stderr


def test_workers_end_when_the_supervisor_is_killed(model_file, tmp_path):
    """SIGKILL gives the supervisor no chance to stop its workers: the kernel's parent-death
    signal does, rather than leave them serving on the port with no one to restart them."""
    server = start_server(model_file, tmp_path / "log", "--workers", "2")
    workers = children_of(server.process.pid)
    assert len(workers) == 2
    server.process.kill()
    server.process.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists()
                                              and not _zombie(pid) for pid in workers):
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in workers)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False


def test_a_request_past_its_deadline_gets_a_504_and_frees_the_worker(tmp_path):
    """A request whose run would take hours (a Loop's trip count in its input) is answered
    504 at --request-timeout-s, naming it; its run ends there, so the one worker serves the
    next request at once."""
    path = tmp_path / "loop.onnx"
    onnx.save(loop_model(trips_shape=[1]), path)
    server = start_server(path, tmp_path / "server.log", "--request-timeout-s", "1")
    try:
        client = tritonclient_http.InferenceServerClient(server.url, network_timeout=60)

        def infer(trips: int, request_id: str):
            feeds = [tritonclient_http.InferInput("trips", [1], "INT64"),
                     tritonclient_http.InferInput("x", [4], "FP32")]
            feeds[0].set_data_from_numpy(np.array([trips], np.int64))
            feeds[1].set_data_from_numpy(np.zeros(4, np.float32))
            return client.infer("loop", feeds, request_id=request_id).as_numpy("y")

        np.testing.assert_array_equal(infer(3, "warm"), [3, 3, 3, 3])
        started = time.perf_counter()
        with pytest.raises(Exception, match="(?s)504|no answer within 1 s") as refused:
            infer(10**9, "hours")
        assert time.perf_counter() - started < 10
        assert "hours" in str(refused.value) and "loop" in str(refused.value)
        started = time.perf_counter()
        np.testing.assert_array_equal(infer(5, "after"), [5, 5, 5, 5])
        assert time.perf_counter() - started < 2  # the worker is free again
    finally:
        assert server.stop() == 0, server.text()[-3000:]
    assert re.search(r"request hours to loop: .*no answer within 1 s", server.text())
