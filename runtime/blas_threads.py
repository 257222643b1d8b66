"""How many threads each BLAS call may use, by how many CPU runs are in flight.

One run alone should use every core inside its matrix products: that is NumPy's default, and
the latency a single-threaded service sees. Several runs at once must not: a multi-threaded
OpenBLAS serializes concurrent callers on its one thread pool, and its waiting threads spin,
so on this 2-core machine 8 request threads sharing a SqueezeNet session ran 23 runs/s
against 159 from one thread. With one BLAS thread per call, the same 8 threads ran 185/s.

So CPU runs pass through :data:`GATE`. While a run is in flight at full width, a second one
waits until the process has no run in flight (one run's length), then the BLAS goes down to
one thread, and every run admitted until the process is idle again runs at that width. The
width is only ever changed with no run in flight, never under a running BLAS call (OpenBLAS
documents ``openblas_set_num_threads`` as global; changing it during a call is not a
supported use). When the last run leaves and nobody waits, the original width comes back.

threadpoolctl finds the BLAS libraries loaded in this process and sets their thread counts.
``MIXRT_BLAS_GATE=0`` turns the gate off (the BLAS keeps whatever width it has).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager


class _Blas:
    """The process's BLAS libraries, found on first use (threadpoolctl scans loaded ones)."""

    def __init__(self):
        self._libraries = None
        self._original: list[int] = []

    def narrow(self) -> None:
        if self._libraries is None:
            from threadpoolctl import ThreadpoolController
            self._libraries = ThreadpoolController().select(user_api="blas").lib_controllers
        self._original = [library.num_threads for library in self._libraries]
        for library in self._libraries:
            library.set_num_threads(1)

    def widen(self) -> None:
        for library, threads in zip(self._libraries or (), self._original):
            library.set_num_threads(threads)


class BlasGate:
    """Admits runs; see the module docstring. ``blas`` needs ``narrow()`` and ``widen()``."""

    def __init__(self, blas=None, enabled: bool | None = None):
        self._blas = blas if blas is not None else _Blas()
        self._enabled = enabled if enabled is not None else \
            os.environ.get("MIXRT_BLAS_GATE", "1").strip() != "0"
        self._changed = threading.Condition()
        self._inside = threading.local()  # a run inside a run (a kernel calling a session)
        self.running = 0  # runs admitted and not yet left
        self.waiting = 0  # runs waiting for the process to be idle so the width can change
        self.narrow = False  # whether the BLAS runs one thread per call now

    @contextmanager
    def admitted(self):
        if not self._enabled or getattr(self._inside, "run", False):
            yield
            return
        self._enter()
        self._inside.run = True
        try:
            yield
        finally:
            self._inside.run = False
            self._leave()

    def _enter(self) -> None:
        with self._changed:
            if self.running and not self.narrow:
                self.waiting += 1
                try:
                    while self.running and not self.narrow:
                        self._changed.wait()
                finally:
                    self.waiting -= 1
                if not self.narrow:  # idle now: the first of the waiters narrows
                    self._set_narrow(True)
            elif not self.running and self.waiting and not self.narrow:
                self._set_narrow(True)  # arrived between the last run leaving and a waiter waking
            self.running += 1

    def _leave(self) -> None:
        with self._changed:
            self.running -= 1
            if self.running == 0:
                if self.narrow and not self.waiting:
                    self._set_narrow(False)
                self._changed.notify_all()

    def _set_narrow(self, narrow: bool) -> None:
        (self._blas.narrow if narrow else self._blas.widen)()
        self.narrow = narrow


GATE = BlasGate()
UNGATED = BlasGate(enabled=False)  # GPU sessions: their products do not run on the BLAS
