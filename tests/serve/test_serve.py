"""``mixrt serve`` as a service runs it: a real server process (two workers, batching on)
over a model repository, asked with tritonclient over HTTP (JSON and binary tensors) and
gRPC, and with raw bodies no client would send; answers compared with onnxruntime."""

from __future__ import annotations

import importlib.util
import json
import re
import threading

import numpy as np
import onnxruntime as ort
import pytest

tritonclient_http = pytest.importorskip("tritonclient.http")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
# the server's process needs KServe; this one must not load it beside tritonclient.grpc
# (both register the protocol's protobuf messages)
if importlib.util.find_spec("kserve") is None:
    pytest.skip("mixrt serve needs KServe (mixrt[serve])", allow_module_level=True)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from serving import (get, mlp_model, post, raw_exchange, start_server,  # noqa: E402
                     write_repository)

FEATURES = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    repo = write_repository(root / "repo")
    running = start_server(repo, root / "server.log", "--workers", "2", "--max-batch-size",
                           "8", "--max-delay-ms", "20", "--max-body-mb", "1",
                           "--max-queue", "64")
    yield running
    assert running.stop() == 0, running.text()[-3000:]


def reference(seed: int, x: np.ndarray) -> list:
    session = ort.InferenceSession(mlp_model(seed).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def rows(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, FEATURES)).astype(np.float32)


def http_infer(client, x, model="mlp", version="", binary=True):
    item = tritonclient_http.InferInput("x", list(x.shape), "FP32")
    item.set_data_from_numpy(x, binary_data=binary)
    wanted = [tritonclient_http.InferRequestedOutput(n, binary_data=binary)
              for n in ("scores", "label")]
    return client.infer(model, [item], model_version=version, outputs=wanted)


def grpc_infer(client, x, model="mlp", version=""):
    item = tritonclient_grpc.InferInput("x", list(x.shape), "FP32")
    item.set_data_from_numpy(x)
    return client.infer(model, [item], model_version=version)


def test_health_and_metadata_over_http_and_grpc(server):
    http = tritonclient_http.InferenceServerClient(server.url)
    grpc = tritonclient_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    for client in (http, grpc):
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("mlp", "1") and client.is_model_ready("mlp", "2")
    for client in (http, grpc):  # an unknown model, or version, is not ready (as in Triton)
        assert not client.is_model_ready("nothing")
        assert not client.is_model_ready("mlp", "7")
    metadata = http.get_model_metadata("mlp", "2")
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, FEATURES]}]
    assert metadata["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, 5]},
                                   {"name": "label", "datatype": "INT64", "shape": [-1]}]
    over_grpc = grpc.get_model_metadata("mlp", "1", as_json=True)
    assert [(t["name"], t["datatype"]) for t in over_grpc["outputs"]] == [
        ("scores", "FP32"), ("label", "INT64")]


@pytest.mark.parametrize("version, seed", [("1", 1), ("2", 2)])
def test_json_binary_and_grpc_answers_agree_with_onnxruntime(server, version, seed):
    x = rows(3, seed=10 + seed)
    scores, label = reference(seed, x)
    http = tritonclient_http.InferenceServerClient(server.url)
    grpc = tritonclient_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    answers = [http_infer(http, x, version=version, binary=True),
               http_infer(http, x, version=version, binary=False),
               grpc_infer(grpc, x, version=version)]
    for answer in answers:
        np.testing.assert_allclose(answer.as_numpy("scores"), scores, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(answer.as_numpy("label"), label)
    first = answers[0].as_numpy("scores")
    for answer in answers[1:]:  # one model, one answer, whichever the protocol
        assert answer.as_numpy("scores").tobytes() == first.tobytes()


def test_concurrent_requests_are_joined_and_each_answer_is_the_one_it_gets_alone(server):
    requests = [rows(1 + i % 3, seed=100 + i) for i in range(32)]
    joined = [None] * len(requests)

    def ask(i):
        client = tritonclient_http.InferenceServerClient(server.url)
        joined[i] = http_infer(client, requests[i]).as_numpy("scores")
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    client = tritonclient_http.InferenceServerClient(server.url)
    for x, answer in zip(requests, joined):
        alone = http_infer(client, x).as_numpy("scores")  # sequential: nothing to join
        assert answer is not None and answer.tobytes() == alone.tobytes()
    assert _total(server, "mixrt_batch_requests_sum") \
        > _total(server, "mixrt_batch_requests_count"), "no run joined two requests"


def test_bad_requests_are_refused_naming_what_was_wrong_and_the_server_goes_on(server):
    good = {"inputs": [{"name": "x", "shape": [1, FEATURES], "datatype": "FP32",
                        "data": rows(1).ravel().tolist()}]}
    cases = {
        "input 'y'": ({"inputs": [{**good["inputs"][0], "name": "y"}]}, "mlp", 400),
        "takes shape [-1, 12]": ({"inputs": [{**good["inputs"][0], "shape": [1, 11],
                                              "data": [0.0] * 11}]}, "mlp", 400),
        "is FP32, the request sent INT32": (
            {"inputs": [{**good["inputs"][0], "datatype": "INT32",
                         "data": [1] * FEATURES}]}, "mlp", 400),
        "12 values for shape [2, 12]": (
            {"inputs": [{**good["inputs"][0], "shape": [2, FEATURES]}]}, "mlp", 400),
        "needs input x": ({"inputs": []}, "mlp", 400),
        "nothing": (good, "nothing", 404),
        "version 7 not found": (good, "mlp/versions/7", 404),
    }
    for needle, (body, model, status) in cases.items():
        code, answer = post(server.http, f"/v2/models/{model}/infer", json.dumps(body).encode())
        assert code == status and needle in answer.decode(), (needle, code, answer)
    code, answer = post(server.http, "/v2/models/mlp/infer", b'{"inputs": [')
    assert 400 <= code < 500, (code, answer)
    header = json.dumps({"inputs": [{"name": "x", "shape": [1, FEATURES], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4 * FEATURES}}]})
    short = header.encode() + b"\0" * 8  # 8 of the 48 bytes announced
    code, answer = post(server.http, "/v2/models/mlp/infer", short,
                        {"Inference-Header-Content-Length": str(len(header))})
    assert code == 400 and b"binary_data_size 48 runs past the body's end" in answer
    announced = (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 2097152\r\n\r\n")
    code, answer = raw_exchange(server.http, announced)  # refused before the body comes
    assert code == 413 and b"2097152 bytes over the cap of 1048576 bytes" in answer
    chunk = b"0" * (1 << 16)
    streamed = (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 17)  # 1.06 MiB, no end
    code, answer = raw_exchange(server.http, streamed)
    assert code == 413 and b"the body over the cap" in answer
    grpc = tritonclient_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    with pytest.raises(InferenceServerException, match=r"takes shape \[-1, 12\]"):
        grpc_infer(grpc, np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT|400|takes shape"):
        grpc_infer(grpc, np.zeros((2, 4, 3), np.float32))
    http = tritonclient_http.InferenceServerClient(server.url)
    x = rows(2, seed=5)
    np.testing.assert_allclose(http_infer(http, x).as_numpy("scores"),
                               reference(2, x)[0], rtol=1e-5, atol=1e-5)
    assert _total(server, "mixrt_requests_total", model="mlp", outcome="bad_request") >= 5


def test_metrics_sum_the_workers(server):
    # a request of its own: the request families appear once a worker has served one, and
    # the test must not rest on the module's earlier tests (run alone with -k, or spread
    # over xdist workers, it found none)
    http_infer(tritonclient_http.InferenceServerClient(server.url), rows(2, seed=7))
    status, text = get(server.metrics, "/metrics")
    assert status == 200
    names = {family.name for family in text_string_to_metric_families(text.decode())}
    assert {"mixrt_requests", "mixrt_request_seconds", "mixrt_batch_rows",
            "mixrt_queue_depth", "mixrt_compiled_kernels", "mixrt_batching"} <= names
    # each of the 3 models passes the batching check (a live gauge: its least over the workers)
    assert _total(server, "mixrt_batching") == 3


def test_the_log_names_each_refused_request_by_its_id(server):
    body = {"id": "request-7f3a", "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                              "data": [0.0, 1.0]}]}
    post(server.http, "/v2/models/mlp/infer", json.dumps(body).encode())
    assert re.search(r"request request-7f3a to mlp version 2: refused: input 'x' takes shape",
                     server.text())


def test_the_repository_api_unloads_and_loads_in_every_worker(server):
    index = tritonclient_http.InferenceServerClient(server.url).get_model_repository_index()
    assert sorted((m["name"], m["version"], m["state"]) for m in index) == [
        ("mlp", "1", "READY"), ("mlp", "2", "READY"), ("other", "1", "READY")]
    tritonclient_http.InferenceServerClient(server.url).unload_model("other")
    # each check on a new connection, which either worker may accept: a worker that had
    # not unloaded it would answer ready about every other time
    for _ in range(12):
        assert not tritonclient_http.InferenceServerClient(server.url).is_model_ready("other")
    grpc = tritonclient_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    grpc.load_model("other")
    x = rows(2, seed=9)
    for _ in range(12):
        client = tritonclient_http.InferenceServerClient(server.url)
        assert client.is_model_ready("other")
        np.testing.assert_allclose(http_infer(client, x, model="other").as_numpy("scores"),
                                   reference(3, x)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(InferenceServerException, match="nothing"):
        tritonclient_http.InferenceServerClient(server.url).load_model("nothing")


def _total(server, sample: str, **labels) -> float:
    """A metric's samples named ``sample`` whose labels include ``labels``, summed (over
    the workers, the versions...), as the supervisor's /metrics reports them."""
    status, text = get(server.metrics, "/metrics")
    assert status == 200
    return sum(s.value for family in text_string_to_metric_families(text.decode())
               for s in family.samples
               if s.name == sample and labels.items() <= s.labels.items())


def test_statistics_as_triton_reports_them_over_http_and_grpc(server):
    """The model statistics perf_analyzer reads (Triton's shape): counts and cumulative
    times of each stage, summed over both workers, per version and batch size."""
    http = tritonclient_http.InferenceServerClient(server.url)
    grpc = tritonclient_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    before = http.get_inference_statistics("mlp", "1")["model_stats"][0]
    for i in range(6):  # new connections: either worker may answer
        client = tritonclient_http.InferenceServerClient(server.url)
        http_infer(client, rows(2, seed=40 + i), version="1")
    grpc_infer(grpc, rows(3, seed=50), version="1")
    over_http = http.get_inference_statistics("mlp", "1")["model_stats"]
    over_grpc = grpc.get_inference_statistics("mlp", "1", as_json=True)["model_stats"]
    assert [(m["name"], m["version"]) for m in over_http] == [("mlp", "1")]
    after = over_http[0]
    stages = after["inference_stats"]
    assert stages["success"]["count"] - before["inference_stats"]["success"]["count"] == 7
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stages[stage]["count"] == stages["success"]["count"]
        assert 0 < stages[stage]["ns"] <= stages["success"]["ns"]
    assert after["inference_count"] - before["inference_count"] == 6 * 2 + 3  # rows
    assert after["execution_count"] >= 1 and after["last_inference"] > 0
    assert {b["batch_size"] for b in after["batch_stats"]} >= {2, 3}
    grpc_stats = over_grpc[0]  # the same counts (JSON of protobuf: uint64 as strings)
    assert grpc_stats["name"] == "mlp" and grpc_stats["version"] == "1"
    assert int(grpc_stats["inference_stats"]["success"]["count"]) == stages["success"]["count"]
    every = http.get_inference_statistics()["model_stats"]
    assert {(m["name"], m["version"]) for m in every} >= {("mlp", "1"), ("mlp", "2")}
    with pytest.raises(InferenceServerException, match="version 9 not found"):
        http.get_inference_statistics("mlp", "9")


def test_json_without_a_content_type_as_tritons_http_client_sends_it(server):
    x = rows(2, seed=60)
    client = tritonclient_http.InferenceServerClient(server.url)
    answer = http_infer(client, x, binary=False)  # no version: the latest, 2
    np.testing.assert_allclose(answer.as_numpy("scores"), reference(2, x)[0], rtol=1e-5,
                               atol=1e-5)


def test_the_model_configuration_perf_analyzer_reads(server):
    http = tritonclient_http.InferenceServerClient(server.url)
    grpc = tritonclient_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    config = http.get_model_config("mlp", "1")
    assert config["max_batch_size"] == 8  # batching on: dims past the batch axis
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [FEATURES]}]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("scores", "TYPE_FP32", [5]), ("label", "TYPE_INT64", [])]
    over_grpc = grpc.get_model_config("mlp", "1", as_json=True)["config"]
    assert over_grpc["max_batch_size"] == 8
    assert over_grpc["input"][0]["data_type"] == "TYPE_FP32"
    assert over_grpc["input"][0]["dims"] == [str(FEATURES)]  # JSON of protobuf's int64
