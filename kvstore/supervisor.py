"""Running a planned job: each process started (in its own process group, dying with the
launcher on Linux), its output relayed line by line with its name as prefix, and the job
stopped at the first failure (SIGTERM, then SIGKILL) or once the workers are done and the
scheduler and servers have had their grace to leave. ``launch.py`` makes the plan.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from mixrt.base.errors import KVStoreError

SERVER_GRACE_S = 15.0   # after the last worker: time for the scheduler and servers to leave
KILL_GRACE_S = 3.0      # between SIGTERM and SIGKILL when the job is stopped
POLL_S = 0.05
MAX_LINE = 1 << 16      # a longer line is passed on in pieces rather than held back
PR_SET_PDEATHSIG = 1


@dataclass
class Planned:
    """One process to start here: ``name`` prefixes its output and names it in messages."""

    name: str
    role: str                   # scheduler | server | worker | mpirun
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)   # on top of the launcher's own
    host: str = ""              # the remote host of an ssh process
    # a process that starts others and relays their lines (srun): line -> (name, line), the
    # name of the process that printed it (None: this one's own)
    speaker: Callable[[bytes], tuple[str | None, bytes]] | None = None
    # such a process's word on which of its processes failed first, once it has failed:
    # (its name, its return code as Popen gives one: -N for signal N), or None
    culprit: Callable[[], tuple[str, int] | None] | None = None

    @property
    def finishes_job(self) -> bool:
        # the job is done when these exit 0; mpirun and srun exit when their tasks have
        return self.role in ("worker", "mpirun", "srun")


def exit_status(returncode: int) -> int:
    """A shell's view of a child's end: its status, or 128+N when signal N killed it."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name} (status {exit_status(returncode)})"


class _LineSink:
    """Writes whole prefixed lines to a stream, one at a time, each flushed."""

    def __init__(self, stream, lock: threading.Lock):
        self._stream, self._lock = stream, lock

    def write(self, prefix: bytes, line: bytes) -> None:
        if not line.endswith(b"\n"):
            line += b"\n"
        with self._lock:
            try:
                self._write(prefix + line)
            except (OSError, ValueError):
                pass        # our own output is gone (a closed pipe): keep draining the child

    def _write(self, data: bytes) -> None:
        buffer = getattr(self._stream, "buffer", None)
        if buffer is None:      # a text-only stream (io.StringIO)
            self._stream.write(data.decode("utf-8", "replace"))
        else:                   # bytes pass through untouched, whatever their encoding
            self._stream.flush()
            buffer.write(data)
            buffer.flush()
        self._stream.flush()


@dataclass
class _Child:
    planned: Planned
    popen: subprocess.Popen
    readers: list[threading.Thread] = field(default_factory=list)
    returncode: int | None = None

    @property
    def label(self) -> str:
        return f"{self.planned.name} on {self.planned.host}" if self.planned.host else \
            self.planned.name

    def poll(self) -> bool:
        """Reap the child if it has exited; True the first time it is seen gone."""
        if self.returncode is not None or self.popen.poll() is None:
            return False
        self.returncode = self.popen.returncode
        return True

    def signal_group(self, signum: int) -> None:
        """Signal the child's whole group: a worker's own children die with it."""
        if self.returncode is not None and _pid_exists(self.popen.pid):
            # our child is reaped, so this pid is someone else's now; while our group still
            # had members the kernel would not have handed the pid out again
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signum)

    def join_readers(self, timeout: float) -> None:
        # a grandchild may still hold the pipes open: do not wait for it forever
        deadline = time.monotonic() + timeout
        for reader in self.readers:
            reader.join(max(0.0, deadline - time.monotonic()))


class Supervisor:
    """Starts the planned processes and applies the exit rules until none is left."""

    def __init__(self, planned: list[Planned], *, server_grace: float = SERVER_GRACE_S,
                 kill_grace: float = KILL_GRACE_S, stdout=None, stderr=None):
        self._planned, self._children = planned, []
        self._server_grace, self._kill_grace = server_grace, kill_grace
        lock = threading.Lock()
        self._out = _LineSink(stdout or sys.stdout, lock)
        self._err = _LineSink(stderr or sys.stderr, lock)
        self._received_signal: int | None = None

    def run(self) -> int:
        with self._catching_signals():
            try:
                self._start_all()
                return self._watch()
            finally:
                self._stop_all()    # on every path: no child outlives the launcher

    # -- starting --

    def _start_all(self) -> None:
        die_with_launcher = _parent_death_hook()
        for planned in self._planned:
            self._children.append(self._spawn(planned, die_with_launcher))
        # reader threads only after every fork: preexec_fn is unsafe while threads run
        for child in self._children:
            self._start_readers(child)

    @staticmethod
    def _spawn(planned: Planned, preexec_fn) -> _Child:
        try:
            popen = subprocess.Popen(planned.argv, env={**os.environ, **planned.env},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, process_group=0,
                                     preexec_fn=preexec_fn)
        except OSError as exc:
            raise KVStoreError(f"cannot start {planned.name} ({planned.argv[0]}): "
                               f"{exc.strerror or exc}") from exc
        return _Child(planned, popen)

    def _start_readers(self, child: _Child) -> None:
        prefix = _prefixer(child.planned)
        for pipe, sink in ((child.popen.stdout, self._out), (child.popen.stderr, self._err)):
            reader = threading.Thread(target=_relay, args=(pipe, prefix, sink), daemon=True,
                                      name=f"mixrt-launch {child.planned.name}")
            reader.start()
            child.readers.append(reader)

    # -- watching --

    def _watch(self) -> int:
        deadline = None     # set when every worker has finished: the servers' time to leave
        while True:
            if self._received_signal is not None:
                return self._stop_for_signal(self._received_signal)
            for child in self._children:
                if child.poll() and child.returncode != 0:
                    return self._stop_for_failure(child)
            if deadline is None and all(child.returncode == 0 for child in self._children
                                        if child.planned.finishes_job):
                deadline = time.monotonic() + self._server_grace
            running = self._running()
            if deadline is not None and not running:
                return 0
            if deadline is not None and time.monotonic() >= deadline:
                self._say(f"warning: {', '.join(c.label for c in running)} still running "
                          f"{self._server_grace:g} s after the workers finished; stopping "
                          f"{'it' if len(running) == 1 else 'them'}")
                return 0
            time.sleep(POLL_S)

    def _running(self) -> list[_Child]:
        return [child for child in self._children if child.returncode is None]

    def _stop_for_failure(self, child: _Child) -> int:
        child.join_readers(1.0)     # its last words come before the verdict
        # a process that started others (srun) names the one that failed, as if it were ours
        culprit = child.planned.culprit() if child.planned.culprit is not None else None
        label, returncode = culprit if culprit is not None else (child.label,
                                                                  child.returncode)
        self._say(f"{label} {describe_exit(returncode)}; stopping the job")
        return exit_status(returncode)

    def _stop_for_signal(self, signum: int) -> int:
        self._say(f"received {signal.Signals(signum).name}; stopping the job")
        self._stop_all(signum)
        return 128 + signum

    # -- stopping --

    def _stop_all(self, first_signal: int = signal.SIGTERM) -> None:
        """``first_signal`` to every group, SIGKILL after the grace, then reap everything."""
        if not self._children:
            return
        for child in self._children:
            child.signal_group(first_signal)
        self._wait_all(self._kill_grace)
        # every group again, exited leaders included: their children may ignore SIGTERM
        for child in self._children:
            child.signal_group(signal.SIGKILL)
        self._wait_all(None)
        for child in self._children:
            child.join_readers(1.0)

    def _wait_all(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for child in self._children:
                child.poll()
            if not self._running() or (deadline is not None and time.monotonic() >= deadline):
                return
            time.sleep(POLL_S)

    def _say(self, message: str) -> None:
        self._err.write(b"", f"mixrt launch: {message}".encode())

    @contextlib.contextmanager
    def _catching_signals(self):
        """While the job runs, SIGINT/SIGTERM mean: stop the job (the loop forwards them)."""
        if threading.current_thread() is not threading.main_thread():
            yield           # only the main thread may install handlers
            return
        caught = (signal.SIGINT, signal.SIGTERM)
        previous = {signum: signal.signal(signum, self._on_signal) for signum in caught}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum, frame) -> None:
        if self._received_signal is None:
            self._received_signal = signum


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prefixer(planned: Planned):
    """line -> (prefix, line): the name of the process that printed it, in brackets."""
    own = f"[{planned.name}] ".encode()
    if planned.speaker is None:
        return lambda line: (own, line)

    def prefix(line: bytes) -> tuple[bytes, bytes]:
        name, text = planned.speaker(line)
        return (own if name is None else f"[{name}] ".encode()), text
    return prefix


def _relay(pipe, prefix, sink: _LineSink) -> None:
    with pipe:
        for line in iter(functools.partial(pipe.readline, MAX_LINE), b""):
            sink.write(*prefix(line))


# -- dying with the launcher -----------------------------------------------------------------

@functools.cache
def _prctl():
    # loaded in the parent: the forked child must only call it, not load a library
    return ctypes.CDLL(None, use_errno=True).prctl


def _set_parent_death_signal() -> None:
    if sys.platform.startswith("linux"):
        _prctl()(PR_SET_PDEATHSIG, int(signal.SIGKILL))


def _parent_death_hook():
    """A preexec_fn that makes the child get SIGKILL when the launcher dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    _prctl()
    launcher = os.getpid()

    def die_with_launcher():
        _set_parent_death_signal()
        if os.getppid() != launcher:    # the launcher died before prctl: nobody will tell us
            os._exit(1)
    return die_with_launcher
