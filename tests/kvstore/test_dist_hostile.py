"""A live job started by `mixrt launch`, and a process that is not part of it sending frames
over ZeroMQ to its scheduler and server: without the job's token it gets nothing through;
with it (an insider, or a job whose token leaked) every hostile frame is dropped. Either
way the job finishes with exit 0, every pulled sum exact, and the server's memory grows by
less than 100 MB."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from cluster import Cluster, free_port
from mixrt.kvstore.dist import protocol as p

STEPS, MAX_STEPS, SIZE = 60, 3000, 1000
ATTACK_OVER = "attack-over"  # the file the test writes in the job's folder

# The job runs at least STEPS steps and then goes on until the test writes ATTACK_OVER, so
# the attack always lands on a running job however slow the machine is. Rank 0 reads the
# file and pushes its finding on the key "over"; every worker pulls the sum, so all of them
# stop at the same step (a sync push waits for every worker).
JOB = f"""
import os, time, mixrt, numpy as np
kv = mixrt.kv.create("dist_sync")
kv.init("w", np.zeros({SIZE}, np.float32))
kv.init("over", np.zeros(1, np.float32))
w, over = np.empty({SIZE}, np.float32), np.empty(1, np.float32)
step = 0
while True:
    kv.push("w", np.full({SIZE}, (step + 1) * (kv.rank + 1), np.float32))
    kv.pull("w", out=w)
    expected = (step + 1) * sum(r + 1 for r in range(kv.num_workers))
    assert (w == expected).all(), (step, w[:3], expected)
    step += 1
    done = step >= {STEPS} and kv.rank == 0 and os.path.exists("{ATTACK_OVER}")
    kv.push("over", np.full(1, float(done), np.float32))
    kv.pull("over", out=over)
    if over[0] > 0 or step >= {MAX_STEPS}:
        break
    time.sleep(0.1)
print("SUMS OK", step, flush=True)
kv.close()
"""


class LaunchedJob:
    """`mixrt launch -n 2 -s 1` on the job above, with its output in files."""

    def __init__(self, tmp_path: Path, env: dict):
        self.tmp_path, self.port = tmp_path, free_port()
        script = tmp_path / "job.py"
        script.write_text(JOB)
        self.out = tmp_path / "launch.out"
        with open(self.out, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mixrt", "launch", "-n", "2", "-s", "1", "--port",
                 str(self.port), "--", sys.executable, str(script)],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def server_address(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"server 0 serving at (tcp://\S+)", self.output())
            if found:
                return found.group(1)
            assert self.process.poll() is None, self.output()
            time.sleep(0.05)
        raise AssertionError(f"the server never said where it serves:\n{self.output()}")

    def finish(self, timeout: float = 120) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()


def _server_pid(launcher_pid: int) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PPid:\t{launcher_pid}\n" in status and b"DMLC_ROLE=server" in environ:
            return int(entry.name)
    raise AssertionError("no server process under the launcher")


class PeakMemory(threading.Thread):
    """The server's resident memory, sampled every 50 ms: the first sample and the peak."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.path, self.samples, self.running = Path(f"/proc/{pid}/status"), [], True
        self.start()

    def run(self):
        while self.running:
            try:
                found = re.search(r"VmRSS:\s+(\d+) kB", self.path.read_text())
            except OSError:
                found = None
            if found is None:  # the server has exited
                return
            self.samples.append(int(found.group(1)) << 10)
            time.sleep(0.05)

    def growth(self) -> int:
        self.running = False
        self.join()
        return max(self.samples) - self.samples[0]


def _client(context: zmq.Context, address: str, token: str | None) -> zmq.Socket:
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, 0)
    if token is not None:
        socket.plain_username, socket.plain_password = b"mixrt-kv", token.encode()
    socket.connect(address)
    return socket


def _send(socket: zmq.Socket, frames: list) -> bool:
    """Send without waiting: a socket whose handshake was refused has no peer to queue to."""
    try:
        socket.send_multipart(frames, flags=zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False


def _json_frames(type_: int, body: bytes, **fields) -> list:
    header = p.encode(p.Message(type_, dtype=p.JSON, **fields))[0]
    return [header, body]


def _message(type_: int, body: dict | None = None, **fields) -> list:
    return p.encode(p.json_message(type_, body or {}, **fields))


def _six_frames(context, scheduler: str, server: str, token) -> list[str]:
    """The issue's six frames, each from its own connection; returns what answered."""
    nested = b"[" * 100_000
    deep_but_small = b"[" * 30_000 + b"]" * 30_000
    sends = [
        (scheduler, [_json_frames(p.REGISTER, nested)]),
        (scheduler, [_json_frames(p.REGISTER, deep_but_small)]),
        (server, [_json_frames(p.HELLO, nested)]),
        (server, [_message(p.HELLO, {"rank": 1, "mode": "sync"}, rank=1),
                  p.encode(p.Message(p.LOAD_STATES, rank=1, dtype=p.BLOB,
                                     payload=(2).to_bytes(4, "little") + b"{}"))]),
        (server, [_message(p.HELLO, {"rank": 1, "mode": "sync"}, rank=1),
                  p.encode(p.array_message(p.PUSH, "w", np.full(SIZE, 1e6, np.float32),
                                           rank=1))]),
        (server, [_message(p.HELLO, {"rank": 1, "mode": "sync"}, rank=1),
                  _message(p.SET_OPTIMIZER, {"name": "sgd", "params": {"learning_rate": 0}},
                           rank=1)]),
        (server, [_message(p.HELLO, {"rank": 1, "mode": "sync"}, rank=1)] + [
            p.encode(p.array_message(p.INIT, f"junk{i}", np.zeros(1 << 18, np.float32),
                                     rank=1)) for i in range(200)]),
        (server, [_message(p.HELLO, {"rank": 1, "mode": "sync", "ticket": "0" * 32},
                           rank=1)]),
    ]
    answered = []
    for address, messages in sends:
        socket = _client(context, address, token)
        for frames in messages:
            _send(socket, frames)
        if socket.poll(300):
            answered.append(p.decode(socket.recv_multipart(), 1 << 20).type_name)
        socket.close()
    return answered


def _malformed(rng: np.random.Generator, count: int):
    """Frames no registered peer sends: noise, truncated or bit-flipped headers, every
    message type without a HELLO or a registration, wrong sizes, bad JSON."""
    types = list(p.TYPE_NAMES)
    for index in range(count):
        kind = index % 5
        if kind == 0:
            yield [rng.bytes(int(rng.integers(1, 200)))]
        elif kind == 1:
            header = bytearray(p.encode(p.Message(p.PUSH, key="w", dtype=11, count=4,
                                                  total=4))[0])
            header[int(rng.integers(0, len(header)))] ^= 1 << int(rng.integers(0, 8))
            yield [bytes(header[:int(rng.integers(1, len(header) + 1))]), rng.bytes(16)]
        elif kind == 2:
            yield _message(int(rng.choice(types)), {"rank": 0, "rounds": -1},
                           rank=int(rng.integers(-2, 3)))
        elif kind == 3:
            yield _json_frames(int(rng.choice(types)), rng.bytes(64))
        else:
            yield [p.encode(p.Message(p.PUSH, rank=0, key="w", dtype=11, count=1 << 40,
                                      total=1 << 40))[0], b"x"]


def _flood(context, address: str, token, count: int = 10_000) -> None:
    rng = np.random.default_rng(0)
    sockets = [_client(context, address, token) for _ in range(20)]
    time.sleep(0.2)  # the handshakes
    for index, frames in enumerate(_malformed(rng, count)):
        _send(sockets[index % len(sockets)], frames)
    time.sleep(0.5)
    for socket in sockets:
        socket.close()


def _attack(tmp_path, env: dict, token) -> tuple[LaunchedJob, list, int, int]:
    job = LaunchedJob(tmp_path, env)
    server = job.server_address()
    memory = PeakMemory(_server_pid(job.process.pid))
    scheduler = f"tcp://127.0.0.1:{job.port}"
    context = zmq.Context()
    try:
        answered = _six_frames(context, scheduler, server, token)
        _flood(context, server, token)
        _flood(context, scheduler, token)
    finally:
        context.destroy(linger=0)
    assert job.process.poll() is None, f"the job ended before the attack did:\n{job.output()}"
    (tmp_path / ATTACK_OVER).write_text("")
    status = job.finish()
    return job, answered, memory.growth(), status


def _job_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "MIXRT_KV_"))}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.mark.parametrize("insider", [False, True], ids=["stranger", "insider"])
def test_hostile_frames_leave_the_job_finishing_with_exact_sums(tmp_path, insider):
    """A stranger (no token: the launcher made a fresh one) gets no frame through; an
    insider (the token set by hand and known to the attacker) gets every frame dropped."""
    token = "a token the attacker knows" if insider else None
    job, answered, growth, status = _attack(
        tmp_path, _job_env(**({"MIXRT_KV_TOKEN": token} if insider else {})), token)
    output = job.output()
    print(f"server RSS growth {growth / 2**20:.1f} MiB; answers {answered}")
    assert status == 0, output
    finished = [int(steps) for steps in re.findall(r"SUMS OK (\d+)", output)]
    assert len(finished) == 2 and finished[0] == finished[1] >= STEPS, output
    assert growth < 100 << 20, growth
    if insider:  # only the well-formed HELLO with a wrong ticket is answered, with an error
        assert answered == ["ERROR"], answered
        assert "dropped a bad message from a peer that did not say HELLO" in output
        assert "scheduler: dropped a bad message from an unregistered peer" in output
        assert "without that worker's ticket" in output
    else:
        assert answered == [] and "dropped a bad message" not in output, (answered, output)


TWO_CONNECTIONS = """
import mixrt, numpy as np, zmq
from mixrt.kvstore.dist import protocol as p
from mixrt.kvstore.dist.security import secure_client
kv = mixrt.kv.create("dist_sync")
kv.init("w", np.zeros(3, np.float32))

def hello(rank):
    socket = zmq.Context.instance().socket(zmq.DEALER)
    secure_client(socket, kv.config)
    socket.connect(kv.servers[0])
    socket.send_multipart(p.encode(p.json_message(
        p.HELLO, {"rank": rank, "mode": "sync", "ticket": kv._ticket}, rank=rank)))
    assert socket.poll(5000), "no answer"
    reply = p.decode(socket.recv_multipart(), 1 << 20)
    socket.close(linger=0)
    return reply.type_name, reply.json().get("message", "")

if kv.rank == 1:
    print("SECOND", hello(1), flush=True)   # this worker's own ticket, a second connection
    print("OTHER", hello(0), flush=True)    # this worker's ticket, another's rank
w = np.empty(3, np.float32)
kv.push("w", np.ones(3, np.float32))
kv.pull("w", out=w)
print("SUM", w.tolist(), flush=True)
kv.close()
"""


def test_a_rank_is_held_by_one_connection_and_proved_by_its_own_ticket(tmp_path):
    cluster = Cluster(tmp_path, workers=2, servers=1, MIXRT_KV_TOKEN="t").start(
        TWO_CONNECTIONS)
    try:
        codes = cluster.wait(60)
        output = cluster.all_output()
        assert set(codes.values()) == {0}, output
        second = cluster.output("worker1")
        assert "SECOND ('ERROR'" in second and "another connection holds" in second, second
        assert "OTHER ('ERROR'" in second and "without that worker's ticket" in second, second
        assert "SUM [2.0, 2.0, 2.0]" in cluster.output("worker0"), output
    finally:
        cluster.stop()


def test_a_client_without_the_launchers_token_gets_no_answer(tmp_path):
    job = LaunchedJob(tmp_path, _job_env())
    server = job.server_address()
    context = zmq.Context()
    try:
        for token in (None, "a guess"):
            socket = _client(context, server, token)
            _send(socket, _message(p.HELLO, {"rank": 0, "mode": "sync", "ticket": "0"}))
            assert not socket.poll(1000)
            socket.close()
    finally:
        context.destroy(linger=0)
    (tmp_path / ATTACK_OVER).write_text("")
    assert job.finish() == 0, job.output()
    assert job.output().count("SUMS OK") == 2, job.output()
