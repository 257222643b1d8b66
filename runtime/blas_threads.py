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

A run inside a run on the same thread (a kernel calling a session) passes straight through.
``MIXRT_RUN_GATE=0`` turns the gate off, and it is off by itself when the BLAS was started
with one thread.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager


def _single_threaded_blas() -> bool:
    """Whether the environment started OpenBLAS/MKL/OpenMP with one thread: then concurrent
    runs do not contend inside the BLAS and may overlap."""
    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value:
            return value == "1"
    return False


class BlasGate:
    """Admits one run at a time (per process), reentrant on one thread."""

    def __init__(self, enabled: bool | None = None):
        if enabled is None:
            enabled = os.environ.get("MIXRT_RUN_GATE", "1").strip() != "0" \
                and not _single_threaded_blas()
        self._enabled = enabled
        self._turn = threading.Lock()
        self._inside = threading.local()

    @contextmanager
    def admitted(self):
        if not self._enabled or getattr(self._inside, "run", False):
            yield
            return
        with self._turn:
            self._inside.run = True
            try:
                yield
            finally:
                self._inside.run = False


GATE = BlasGate()
UNGATED = BlasGate(enabled=False)  # GPU sessions: their products do not run on the BLAS
