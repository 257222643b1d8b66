"""The dependency engine (MXNet paper, section 3.2).

Work is pushed with the variables it reads and writes and runs once they are free: writes to
one variable run in push order, reads of one variable may run at the same time, and a write
waits for the reads pushed before it. Pooled work runs on daemon threads (NumPy and CuPy drop
the GIL in heavy kernels, so the threads really overlap); ``inline=True`` runs the work on
the caller's thread, which is the imperative NDArray's fast path.

A failure in pooled work is recorded on the variables the op writes, inherited by every op
that reads them (those do not run), and raised as an ``EngineError`` naming the op and the
line that pushed it at the next wait on an affected variable.

``MIXRT_ENGINE=naive`` runs every push at once on the caller's thread, for debugging.
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from mixrt.base.errors import EngineError, InputError

KINDS = ("threaded", "naive")
DEFAULT_THREADS = 4
_WORKER_PREFIX = "mixrt-engine-"  # the threaded engine's worker threads' names

_ENGINE_FILE = __file__
# Frames under these folders are mixrt's own (the frontend's dispatch, the runtime); the
# line a user wants to see is the first frame outside them.
_INTERNAL_DIRS = tuple(os.path.dirname(path) + os.sep
                       for path in (sys.modules["mixrt"].__file__, __file__))


class Var:
    """An opaque tag naming one piece of state; an NDArray owns one.

    The engine keeps its bookkeeping here: the pending op that last writes the variable,
    the pending ops that read it since, and the error of a failed write not yet raised.
    """

    __slots__ = ("name", "_writer", "_readers", "_error", "__weakref__")

    def __init__(self, name: str = ""):
        self.name = name
        self._writer: _Op | None = None
        self._readers: dict[_Op, None] = {}
        self._error: EngineError | None = None

    def __repr__(self) -> str:
        return f"Var({self.name!r})"


def new_var(name: str = "") -> Var:
    return Var(name)


class _Op:
    __slots__ = ("fn", "name", "inline", "reads", "writes", "pending", "dependents",
                 "pushed_at", "done")

    def __init__(self, fn, name, reads, writes, inline, pushed_at):
        self.fn = fn
        self.name = name
        self.inline = inline
        # Left as given: a var listed twice, or read and written, needs no normalizing
        # because _register never makes an op depend on itself.
        self.reads = tuple(reads)
        self.writes = tuple(writes)
        self.pending = 0
        self.dependents: list[_Op] = []
        self.pushed_at = pushed_at
        self.done = False


def _pushed_at() -> tuple[str, int, str] | None:
    """(file, line, function) of the first caller outside mixrt, else outside this file."""
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        code = frame.f_code
        if code.co_filename != _ENGINE_FILE:
            where = (code.co_filename, frame.f_lineno, code.co_name)
            if not code.co_filename.startswith(_INTERNAL_DIRS):
                return where
            fallback = fallback or where
        frame = frame.f_back
    return fallback


def _engine_error(op_name: str, pushed_at, exc: BaseException) -> EngineError:
    where = "{}:{} in {}".format(*pushed_at) if pushed_at else "an unknown line"
    error = EngineError(f"op '{op_name}' pushed at {where} raised {type(exc).__name__}: {exc}",
                        op_name=op_name, pushed_at=where)
    error.__cause__, error.__suppress_context__ = exc, True
    return error


def _input_error(op: _Op) -> EngineError | None:
    return next((v._error for v in op.reads if v._error is not None), None)


class Engine:
    """The threaded engine: ops run on a pool once the ops they depend on have finished."""

    kind = "threaded"

    def __init__(self, threads: int | None = None):
        self.threads = threads if threads is not None else _threads_from_env()
        self._cond = threading.Condition(threading.Lock())  # guards all the bookkeeping
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._pending = 0   # ops pushed and not finished
        self._waiting = 0   # threads blocked on self._cond
        self._errors: dict[EngineError, list[Var]] = {}  # not yet raised, oldest first

    new_var = staticmethod(new_var)

    def push(self, fn: Callable[[], object], reads=(), writes=(), name: str = "op", *,
             inline: bool = False) -> None:
        """Run ``fn()`` after every earlier op that writes a var it reads or writes and every
        earlier op that reads a var it writes (a var in both lists counts as written).

        Pooled (the default): returns at once; a failure is raised at a later wait.
        ``inline=True``: runs ``fn`` on this thread once those ops are done (at once when
        none is pending); its exception propagates unwrapped, and a failed input raises
        that input's ``EngineError`` here without running ``fn``.
        """
        op = _Op(fn, name, reads, writes, inline, None if inline else _pushed_at())
        with self._cond:
            self._register(op)
            if not inline:
                if op.pending == 0:
                    self._dispatch(op)
                return
            if op.pending:
                self._wait_until(lambda: op.pending == 0)
        self._run_inline(op)

    def wait_to_read(self, var: Var) -> None:
        """Block until the writes of ``var`` pushed so far have finished; raise their error."""
        with self._cond:
            writer = var._writer
            if writer is not None:
                self._wait_until(lambda: writer.done)
            self._raise_error_of(var)

    def wait_to_write(self, var: Var) -> None:
        """Block until the reads and writes of ``var`` pushed so far have finished."""
        with self._cond:
            ops = [*var._readers] + ([var._writer] if var._writer is not None else [])
            self._wait_until(lambda: all(op.done for op in ops))
            self._raise_error_of(var)

    def failure_of(self, var: Var) -> EngineError | None:
        """Block until the writes of ``var`` pushed so far have finished; the error they
        left on it if no wait has raised it yet (what an op that reads ``var`` may carry on
        instead of raising), else None."""
        with self._cond:
            writer = var._writer
            if writer is not None:
                self._wait_until(lambda: writer.done)
            return var._error if var._error in self._errors else None

    def inherit(self, error: EngineError, variables) -> None:
        """Put ``error`` on ``variables``, as a pooled op that read a failed input leaves it
        on what it writes: raised at the next wait on one of them, or once by wait_all."""
        with self._cond:
            for var in variables:
                var._error = error
            if error in self._errors:
                self._errors[error].extend(variables)

    def wait_all(self) -> None:
        """Block until everything pushed has finished; raise the oldest error not yet raised
        (and clear it from every variable that holds it)."""
        with self._cond:
            self._wait_until(lambda: self._pending == 0)
            if self._errors:
                error = next(iter(self._errors))
                for var in self._errors.pop(error):
                    if var._error is error:
                        var._error = None
                raise error

    def drain(self) -> None:
        """Block until everything pushed has finished, raising nothing."""
        with self._cond:
            self._wait_until(lambda: self._pending == 0)

    def close(self) -> None:
        """Drain, then stop the worker threads (a later pooled push starts new ones)."""
        with self._cond:
            self._wait_until(lambda: self._pending == 0)
            for _ in self._workers:
                self._queue.put(None)
            self._workers = []

    # -- bookkeeping; every method below runs with self._cond held ----------------------

    def _register(self, op: _Op) -> None:
        for var in op.reads:
            if var._writer is not None:
                self._depend(op, var._writer)
            var._readers[op] = None
        for var in op.writes:
            if var._writer is not None and var._writer is not op:
                self._depend(op, var._writer)
            if var._readers:
                for reader in var._readers:
                    if reader is not op:
                        self._depend(op, reader)
                var._readers = {}
            var._writer = op
        self._pending += 1

    @staticmethod
    def _depend(op: _Op, earlier: _Op) -> None:
        earlier.dependents.append(op)
        op.pending += 1

    def _finish(self, op: _Op, error: EngineError | None, *, wrote: bool) -> None:
        """Record the op's outcome on its writes and release the ops waiting for it."""
        if error in self._errors:  # not yet raised: wait_all must clear these vars too
            self._errors[error].extend(op.writes)
        for var in op.writes:
            if wrote or error is not None:
                var._error = error
            if var._writer is op:
                var._writer = None
        for var in op.reads:
            var._readers.pop(op, None)
        op.done, op.fn = True, None
        self._pending -= 1
        for dependent in op.dependents:
            dependent.pending -= 1
            if dependent.pending == 0 and not dependent.inline:
                self._dispatch(dependent)
        if self._waiting:  # an inline op or a wait may be the one released
            self._cond.notify_all()

    def _dispatch(self, op: _Op) -> None:
        if not self._workers:
            for i in range(self.threads):
                worker = threading.Thread(target=self._work, name=f"{_WORKER_PREFIX}{i}",
                                          daemon=True)
                worker.start()
                self._workers.append(worker)
        self._queue.put(op)

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        self._waiting += 1
        try:
            while not ready():
                self._cond.wait()
        finally:
            self._waiting -= 1

    def _raise_error_of(self, var: Var) -> None:
        error = var._error
        if error is not None:
            var._error = None
            self._errors.pop(error, None)
            raise error

    # -- running ------------------------------------------------------------------------

    def _run_inline(self, op: _Op) -> None:
        error = _input_error(op)
        wrote = False
        try:
            if error is not None:  # raised here, at the call site; the input keeps it
                with self._cond:
                    self._errors.pop(error, None)
                raise error
            op.fn()
            wrote = True
        finally:
            with self._cond:
                self._finish(op, None, wrote=wrote)

    def _work(self) -> None:
        while (op := self._queue.get()) is not None:
            error, failed_here = _input_error(op), False
            if error is None:
                try:
                    op.fn()
                except BaseException as exc:  # a dying worker would hang every wait
                    error, failed_here = _engine_error(op.name, op.pushed_at, exc), True
            with self._cond:
                if failed_here:
                    self._errors[error] = []
                self._finish(op, error, wrote=True)
            del op


class NaiveEngine:
    """Every push runs at once on the caller's thread, one at a time: the debug mode."""

    kind = "naive"

    def __init__(self):
        self._lock = threading.RLock()  # an op may push more ops

    new_var = staticmethod(new_var)

    def push(self, fn: Callable[[], object], reads=(), writes=(), name: str = "op", *,
             inline: bool = False) -> None:
        op = _Op(fn, name, reads, writes, inline, None)
        with self._lock:
            error = _input_error(op)
            if error is not None:
                raise error
            try:
                fn()
            except Exception as exc:
                if inline:
                    raise
                raise _engine_error(name, _pushed_at(), exc) from exc
            for var in op.writes:
                var._error = None

    def failure_of(self, var: Var) -> EngineError | None:
        return None  # every failure was raised where its op was pushed

    def inherit(self, error: EngineError, variables) -> None:
        for var in variables:
            var._error = error

    def wait_to_read(self, var: Var) -> None:
        error, var._error = var._error, None
        if error is not None:  # left by the threaded engine this one replaced
            raise error

    wait_to_write = wait_to_read

    def wait_all(self) -> None:
        """Nothing is ever pending."""

    drain = close = wait_all


def _threads_from_env() -> int:
    text = os.environ.get("MIXRT_ENGINE_THREADS", str(DEFAULT_THREADS))
    if not text.strip().isdigit() or int(text) < 1:
        raise InputError(f"MIXRT_ENGINE_THREADS={text!r}: expected a whole number >= 1")
    return int(text)


def make_engine(kind: str) -> Engine | NaiveEngine:
    if kind == "threaded":
        return Engine()
    if kind == "naive":
        return NaiveEngine()
    raise InputError(f"unknown engine kind {kind!r}; valid kinds: {', '.join(KINDS)}")


def _engine_from_env() -> Engine | NaiveEngine:
    return make_engine(os.environ.get("MIXRT_ENGINE", "threaded"))


_current: Engine | NaiveEngine | None = None
_current_lock = threading.Lock()


def get_engine() -> Engine | NaiveEngine:
    """The process-wide engine, made on first use from ``MIXRT_ENGINE`` (default threaded)."""
    global _current
    if _current is None:
        with _current_lock:
            if _current is None:
                _current = _engine_from_env()
                atexit.register(_finish_at_exit)
    return _current


def on_engine_thread() -> bool:
    """Whether the caller is one of the threaded engine's workers (waiting there for work
    queued behind the caller's own op would never end)."""
    return threading.current_thread().name.startswith(_WORKER_PREFIX)


def drain_if_running() -> None:
    """Wait for the pushed work of the process-wide engine, if one was ever made (a KVStore
    closing must not leave before the pushes queued to it)."""
    if _current is not None:
        _current.drain()


def _finish_at_exit() -> None:
    """Let pushed work finish before the interpreter goes (as MXNet's engine does at
    shutdown): a script's last KVStore push must reach the servers. A failure nobody waited
    for is printed rather than lost."""
    engine = _current
    if engine is None:
        return
    try:
        engine.wait_all()
    except EngineError as error:
        print(f"mixrt engine: work failed and was never waited for: {error}", file=sys.stderr)


def set_engine(kind: str | Engine | NaiveEngine) -> Engine | NaiveEngine:
    """Install a new engine of ``kind`` (or the engine given) and return the previous one,
    drained. Errors not yet raised stay on their variables."""
    global _current
    engine = make_engine(kind) if isinstance(kind, str) else kind
    with _current_lock:
        previous = _current if _current is not None else _engine_from_env()
        _current = engine
    previous.drain()
    return previous


@contextmanager
def engine_kind(kind: str) -> Iterator[Engine | NaiveEngine]:
    """Run the block under a fresh engine of ``kind``; the previous engine comes back after."""
    previous = set_engine(kind)
    try:
        yield get_engine()
    finally:
        set_engine(previous).close()
