"""The servers ``serve_bench.py`` measures, as processes: each started alone with its output
in a log file, waited for until its model answers ready over HTTP, and stopped (SIGTERM,
then SIGKILL).

* mixrt: ``mixrt serve MODEL.mxr --workers 1``, batching on (``--max-batch-size B
  --max-delay-ms D``) or off (``--max-batch-size 0``), on ports it chooses and prints;
* onnxruntime: ``_ort_kserve_model.py``, the ``.onnx`` behind KServe's Python model server
  (one process, no batching: KServe's server has none), on free ports chosen here.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import _serve_models

HERE = Path(__file__).resolve().parent
READY_TIMEOUT_S = 600  # a cold kernel cache compiles the model's kernels before it is ready
PORTS_LINE = re.compile(r"serving on http [^:]+:(\d+), grpc (\d+), metrics (\d+)")


class Server:
    def __init__(self, command: list, log: Path, env: dict, cwd: str | None = None):
        self.command = command
        self.log = log
        with open(log, "wb") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                            env=env, cwd=cwd, start_new_session=True)
        self.http = self.grpc = 0

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.command[:4]} exited with {self.process.returncode}:\n"
                               f"{self.text()[-4000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def _http_ok(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def wait_ready(server: Server, model: str, ports_from_log: bool) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        server.check_alive()
        if ports_from_log and not server.http:
            found = PORTS_LINE.search(server.text())
            if found:
                server.http, server.grpc = int(found[1]), int(found[2])
        if server.http and _http_ok(server.http, "/v2/health/ready") \
                and _http_ok(server.http, f"/v2/models/{model}/ready"):
            return
        time.sleep(0.25)
    server.stop()
    raise RuntimeError(f"not ready after {READY_TIMEOUT_S} s:\n{server.text()[-4000:]}")


def _free_ports(count: int) -> list:
    holds = [socket.socket() for _ in range(count)]
    for hold in holds:
        hold.bind(("127.0.0.1", 0))
    ports = [hold.getsockname()[1] for hold in holds]
    for hold in holds:
        hold.close()
    return ports


def start_mixrt(model: _serve_models.ServeModel, batching: bool, args, workdir: Path) -> Server:
    command = [sys.executable, "-m", "mixrt", "serve", str(model.mxr), "--name", model.name,
               "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
               "--metrics-port", "0", "--workers", "1",
               "--max-batch-size", str(args.max_batch_size if batching else 0),
               "--max-delay-ms", str(args.max_delay_ms if batching else 0)]
    server = Server(command, workdir / f"mixrt_{model.name}_{'on' if batching else 'off'}.log",
                    dict(os.environ, PYTHONUNBUFFERED="1"))
    wait_ready(server, model.name, ports_from_log=True)
    return server


def start_onnxruntime(model: _serve_models.ServeModel, batching: bool, args,
                      workdir: Path) -> Server:
    """KServe's server over ``model.onnx`` in a folder of its own (the layout KServe's
    storage initializer gives ``/mnt/models``). ``batching`` must be off: there is none."""
    if batching:
        raise ValueError("onnxruntime behind KServe's Python model server has no batching")
    folder = workdir / f"kserve_{model.name}"
    folder.mkdir(parents=True)
    (folder / "model.onnx").symlink_to(model.onnx)
    http, grpc = _free_ports(2)
    # KServe logs two lines a request (its latency line, its gRPC interceptor's) at INFO,
    # its default level; mixrt serve logs requests at DEBUG: kept out of both figures
    command = [sys.executable, str(HERE / "_ort_kserve_model.py"), "--model_dir", str(folder),
               "--model_name", model.name, "--http_port", str(http), "--grpc_port", str(grpc),
               "--enable_latency_logging", "false"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", KSERVE_LOGLEVEL="WARNING")
    server = Server(command, folder.with_suffix(".log"), env, cwd=str(folder))
    server.http, server.grpc = http, grpc
    wait_ready(server, model.name, ports_from_log=False)
    return server
