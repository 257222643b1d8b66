"""Starting ``mixrt serve`` as users do (a real process on real sockets) and the models the
serving tests send requests to."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

READY_TIMEOUT_S = 240  # a cold numba cache compiles the model's kernels before it is ready
PORTS_LINE = re.compile(r"serving on http [^:]+:(\d+), grpc (\d+), metrics (\d+)")


def mlp_model(seed: int, features: int = 12, hidden: int = 32, classes: int = 5):
    """A two-layer perceptron with an open batch axis: x (batch, features) -> scores
    (batch, classes), label (batch,) int64."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((features, hidden)).astype(np.float32) / 3
    w2 = rng.standard_normal((hidden, classes)).astype(np.float32) / 5
    b1 = rng.standard_normal(hidden).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["scores"]),
             helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0)]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                     ["batch", features])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", classes]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
         numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def write_repository(root: Path) -> Path:
    """``root/mlp/1`` and ``root/mlp/2`` (two weights), ``root/other/1``."""
    for name, version, seed in (("mlp", "1", 1), ("mlp", "2", 2), ("other", "1", 3)):
        folder = root / name / version
        folder.mkdir(parents=True)
        onnx.save(mlp_model(seed), folder / "model.onnx")
    return root


@dataclass
class Server:
    process: subprocess.Popen
    http: int
    grpc: int
    metrics: int
    log: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def start_server(source: Path, log: Path, *args: str, command=None, ports=None) -> Server:
    """``mixrt serve SOURCE ARGS`` on free ports; returns once it answers ready. Another
    ``command`` (MLServer's own) listens on the given ``ports`` (http, grpc, metrics)."""
    command = command or [sys.executable, "-m", "mixrt", "serve", str(source),
                          "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
                          "--metrics-port", "0", *args]
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + READY_TIMEOUT_S
    ports = [None, *ports] if ports else None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n"
                                 f"{log.read_text(errors='replace')[-4000:]}")
        ports = ports or PORTS_LINE.search(log.read_text(errors="replace"))
        if ports and _ready(int(ports[1])):
            return Server(process, int(ports[1]), int(ports[2]), int(ports[3]), log)
        time.sleep(0.2)
    process.kill()
    raise AssertionError(f"not ready after {READY_TIMEOUT_S} s:\n"
                         f"{log.read_text(errors='replace')[-4000:]}")


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready",
                                    timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def post(port: int, path: str, body: bytes, headers: dict | None = None):
    """(status, body) of a raw POST, for bodies no client library would send."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                     headers=headers or {"Content-Type": "application/json"},
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def raw_exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` (head and as much body as given) on one connection, then read the
    answer: for a body the server refuses before it has all of it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer or not _complete(answer):
            chunk = connection.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False

