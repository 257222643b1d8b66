"""A parameter-server job of real processes on loopback, for the tests: a scheduler and
servers (``python -m mixrt.kvstore.dist``) and workers running a script, each configured by
the DMLC_* variables as users configure them. Output goes to files; ``stop()`` kills what is
left, so no test leaves a process behind. Its processes run the NumPy kernels, as every
KVStore test does (tests/kvstore/conftest.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    def __init__(self, tmp_path: Path, *, workers: int = 2, servers: int = 1, **env):
        self.tmp_path = Path(tmp_path)
        self.workers, self.servers = workers, servers
        self.env = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(
            free_port()), DMLC_NUM_SERVER=str(servers), DMLC_NUM_WORKER=str(workers),
            MIXRT_KV_HEARTBEAT="0.25", MIXRT_KV_HEARTBEAT_TIMEOUT="2", PYTHONUNBUFFERED="1")
        self.env.update({k: str(v) for k, v in env.items()})
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, script: str, *args, worker_env: dict | None = None) -> "Cluster":
        path = self.tmp_path / "worker_script.py"
        path.write_text(script)
        self._spawn("scheduler", "scheduler", 0, [sys.executable, "-m", "mixrt.kvstore.dist"])
        for index in range(self.servers):
            self._spawn(f"server{index}", "server", index,
                        [sys.executable, "-m", "mixrt.kvstore.dist"])
        for index in range(self.workers):
            extra = (worker_env or {}).get(index, {})
            self._spawn(f"worker{index}", "worker", index,
                        [sys.executable, str(path), *map(str, args)], extra)
        return self

    def _spawn(self, name: str, role: str, index: int, command: list, extra=None) -> None:
        env = dict(self.env, DMLC_ROLE=role, MIXRT_KV_ROLE_INDEX=str(index), **(extra or {}))
        log = open(self.tmp_path / f"{name}.log", "wb")
        self.processes[name] = subprocess.Popen(command, env=env, stdout=log,
                                                stderr=subprocess.STDOUT, cwd=self.tmp_path,
                                                start_new_session=True)
        log.close()

    def wait(self, timeout: float = 120) -> dict[str, int]:
        """Exit status of every process (None for one still running at the deadline)."""
        deadline = time.monotonic() + timeout
        codes = {}
        for name, process in self.processes.items():
            try:
                codes[name] = process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        return codes

    def output(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")

    def all_output(self) -> str:
        return "\n".join(f"--- {name}\n{self.output(name)}" for name in self.processes)

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        self.processes[name].send_signal(sig)

    def wait_for_line(self, name: str, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output(name):
            if time.monotonic() > deadline or self.processes[name].poll() is not None:
                raise AssertionError(f"{name} never printed {text!r}:\n{self.all_output()}")
            time.sleep(0.05)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()

    def alive(self) -> list[str]:
        return [name for name, process in self.processes.items() if process.poll() is None]
