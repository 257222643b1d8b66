"""kv_bench.py's child processes as the parent sees them: each started with its stderr in a
log file and dying with the parent (PR_SET_PDEATHSIG on Linux), talked to by lines on its
stdin and stdout under a deadline, and stopped (SIGTERM, then SIGKILL); the environment
the children start in (no DMLC_* or MIXRT_KV_* of this shell's, no spinning OpenMP
threads). Nothing here knows what the children measure: that is ``_kv_children.py``.
"""

from __future__ import annotations

import ctypes
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # where the children run
JOB_TIMEOUT = 300.0  # seconds a start, a block of steps or a finish may take


class BenchError(RuntimeError):
    pass


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Child:
    """One process: commands on stdin, short result lines on stdout, stderr to a log."""

    def __init__(self, name: str, argv: list[str], env: dict, logdir: Path):
        self.name = name
        self.log = logdir / (re.sub(r"\W+", "_", name) + ".log")
        with open(self.log, "wb") as err:
            self.popen = subprocess.Popen(
                argv, env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self._buffer = b""

    def readline(self, deadline: float) -> str:
        fd = self.popen.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"{self.name}: no answer within {JOB_TIMEOUT:.0f} s"
                                 f"{self.tail()}")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    code = self.popen.wait()
                    raise BenchError(f"{self.name} exited with status {code}{self.tail()}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def expect(self, word: str, deadline: float) -> str:
        while True:  # skip anything a library printed on stdout
            line = self.readline(deadline)
            if line.startswith(word):
                return line[len(word):].strip()

    def send(self, text: str) -> None:
        try:
            self.popen.stdin.write(text.encode())
            self.popen.stdin.flush()
        except OSError:  # it has exited
            raise BenchError(f"{self.name} exited with status {self.popen.wait()}"
                             f"{self.tail()}") from None

    def wait(self, deadline: float) -> int:
        try:
            return self.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise BenchError(f"{self.name} did not exit{self.tail()}") from None

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(3)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        for stream in (self.popen.stdin, self.popen.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return ("; its stderr ends:\n    " + "\n    ".join(text)) if text else ""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "MIXRT_KV_", "PS_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # no spinning OpenMP threads while waiting
    env.update(extra or {})
    return env
