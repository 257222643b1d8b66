"""CPU runs take turns: one session run at a time per process, each with every BLAS thread.

A multi-threaded OpenBLAS serializes concurrent callers on its one thread pool while the
waiting threads spin, so on this 2-core machine 8 request threads sharing a SqueezeNet session
ran 23 runs/s against 159 from one thread. Letting concurrent runs take turns at full width
gives 8 threads the serial throughput, and a lone run keeps its latency.

Lowering the BLAS to one thread per call while several runs are in flight looked better
(185 runs/s) but is not safe: switching OpenBLAS 0.3.31's thread count back and forth at run
time (``openblas_set_num_threads`` through threadpoolctl) sometimes left it reporting one
thread after being set to two, and in that state SqueezeNet's outputs came back as zeros. So
mixrt never changes the BLAS's thread count; a service that wants one BLAS thread per request
sets ``OPENBLAS_NUM_THREADS=1`` before starting (then concurrent runs do overlap).

Taking turns is not enough once the calling thread changes from one run to the next: with
the convolutions on mixrt's own tiles, OpenBLAS's threads fall asleep between its calls
(``OPENBLAS_THREAD_TIMEOUT``, runtime/blas_policy.py), and when a different thread woke them now
and then a call stalled ~12 ms; 8 threads taking turns ran 111-146 runs/s against 259-283
from one. So once runs have come from a second thread, every gated run is carried out on one
runner thread (the caller waits; its context variables, NumPy's error state and the profiler
scope among them, go with the run): 204 runs/s. A process that runs from one thread never
hands a run over.

A run inside a run on the same thread (a kernel calling a session) passes straight through.
``MIXRT_RUN_GATE=0`` turns the gate off, and it is off by itself when the BLAS was started
with one thread.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
from functools import partial
from threading import get_ident
from typing import Callable, TypeVar

from mixrt.base.settings import process_id

T = TypeVar("T")


def _single_threaded_blas() -> bool:
    """Whether the environment started OpenBLAS/MKL/OpenMP with one thread: then concurrent
    runs do not contend inside the BLAS and may overlap."""
    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value:
            return value == "1"
    return False


class BlasGate:
    """Admits one run at a time (per process), reentrant on one thread; after runs from a
    second thread, carries each run out on its runner thread."""

    def __init__(self, enabled: bool | None = None):
        if enabled is None:
            enabled = os.environ.get("MIXRT_RUN_GATE", "1").strip() != "0" \
                and not _single_threaded_blas()
        self._enabled = enabled
        self._turn = threading.Lock()
        # the thread a run is admitted on while it runs (the caller, or the runner thread
        # carrying out a caller's run): a run inside it on that thread passes straight
        # through. Set and cleared only while the turn is held, so a thread finds its own
        # id here only inside its own run (a thread-local flag cost a paced request ~5 us)
        self._holder: int | None = None
        # the first thread to run, and the runner, of the process they are in: a child forked
        # after its parent ran (``mixrt serve``'s workers, forked from the supervisor that
        # prepared the model) inherited both, so its one request thread was a second caller
        # and every request crossed to a runner thread and back (~60-150 us a round trip on
        # a 2-core VM, 10 ms apart; ~300 us at p99)
        self._process = process_id()
        self._first_caller: int | None = None
        self._runner: _Runner | None = None

    def run(self, body: Callable[..., T], *args, aside: bool = False) -> T:
        """``body(*args)`` admitted: alone among the gate's runs, on the calling thread or
        (once a second thread has run) on the runner thread. Its exception, if any, is
        raised here.

        ``aside``: a run the process makes for itself in the background (the kernel tiers'
        loading run, runtime/kernel_tiers.py) takes its turn on its own thread and does not
        count as a second caller: it once handed every later run of a one-thread service
        to the runner, +20 us a run (a one-node model went 16 -> 40 us)."""
        caller = get_ident()
        if not self._enabled or self._holder == caller:
            return body(*args)
        with self._turn:
            if self._process != process_id():  # a forked child: its threads are its own
                self._process, self._first_caller, self._runner = process_id(), None, None
            if not aside and self._runner is None:
                if self._first_caller is None:
                    self._first_caller = caller
                if caller != self._first_caller:
                    self._runner = _Runner(self)
                    return self._runner.call(partial(body, *args))
            elif not aside:
                return self._runner.call(partial(body, *args))
            return self.admitted_here(body, *args)

    def admitted_here(self, body, *args):
        """``body(*args)`` on this thread, marked as inside a run (for reentrancy); the
        caller holds the turn."""
        self._holder = get_ident()
        try:
            return body(*args)
        finally:
            self._holder = None


class _Runner:
    """The thread that carries out a gate's runs for callers on other threads."""

    def __init__(self, gate: BlasGate):
        self.gate = gate
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="mixrt-run", daemon=True).start()

    def call(self, body):
        done, outcome = threading.Event(), []
        self.requests.put((contextvars.copy_context(), body, done, outcome))
        done.wait()
        value, error = outcome
        if error is not None:
            raise error
        return value

    def _serve(self) -> None:
        while True:
            context, body, done, outcome = self.requests.get()
            try:
                outcome[:] = [context.run(self.gate.admitted_here, body), None]
            except BaseException as error:  # noqa: BLE001  (raised in the caller)
                outcome[:] = [None, error]
            done.set()


GATE = BlasGate()
UNGATED = BlasGate(enabled=False)  # GPU sessions: their products do not run on the BLAS
