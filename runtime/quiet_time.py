"""When a serving process is quiet: the time since its last run, for the background compiler's
idle children (``runtime/kernel_tiers.py``), which compile only then and stop when a run
begins.

An idle child compiles kernels a session serves without (*optional* ones: a depthwise
convolution's form for one plane geometry, whose compiled fallback the runs take). Until
2026-12-02 it started as soon as a signature with such misses came back, at Linux's idle
priority, and ran beside the requests: SCHED_IDLE gives a serving thread the core back when
it wakes, but not the caches, the memory bandwidth and the second core its workers split
their kernels onto. MobileNetV2 at a size met before, requests 10 ms apart on 2 cores:
19-29 ms a request while an idle child compiled that size's forms, 10-11 ms without one;
and with the forms it compiled loaded, 11 ms, no faster than the fallbacks. A service
sending a new size per request kept such a child running nearly all the time. Now the
child waits until no session of the process has run for :data:`QUIET_S`, and the first run
that begins while it compiles stops it (what it wrote stays in the cache); its job waits
for the next quiet time. A service that is never quiet for that long compiles nothing per
shape; one with idle seconds compiles the forms of the sizes that came back in them.
"""

from __future__ import annotations

import contextlib
import time

QUIET_S = 2.0  # no run for this long: an idle child may compile

_last_run = [float("-inf")]  # time.monotonic() at the start of the process's latest run
_on_run: list = [None]  # what a run's start calls while an idle child compiles: its stop


def note_run() -> None:
    """A session's run begins (``Session.run``): the process is not quiet, and an idle
    child compiling now is stopped. ~0.1 us on a request."""
    _last_run[0] = time.monotonic()
    stop = _on_run[0]
    if stop is not None:
        _on_run[0] = None  # stopped once
        stop()


def seconds_to_quiet() -> float:
    """How long until the process is quiet if no run begins meanwhile (0: quiet now)."""
    return max(0.0, _last_run[0] + QUIET_S - time.monotonic())


@contextlib.contextmanager
def stopped_by_runs(stop):
    """While the block runs (an idle child's compile), the next run's start calls
    ``stop()``, once, on the thread that runs."""
    _on_run[0] = stop
    try:
        yield
    finally:
        _on_run[0] = None
