"""Whether a run that finds the native workers asleep wakes them: learned per plan from the
times of its own runs.

A run whose kernels split their work over the native workers (``ExecutionPlan
.wakes_workers``) wakes them as it begins. Back to back they are still spinning from the
last run, and the split is nearly free; a service's requests come paced, between other
work, and find them asleep (they spin 50 us after a run, ``_jit_native_pool.py``). Waking
one then costs the caller the futex call (12-16 us in a virtual machine) and the worker
10-15 us more before it takes a part, more on a busy host; a run that gains less than that
from its split is faster on its caller alone. Which one a plan's runs are is not a
property of its shapes alone (the wake's cost is the machine's, a neighbour's load comes
and goes), so each plan times both, on the runs that found the workers asleep:

* its first such runs wake them (as every run did before 2026-11-28), and their times are
  kept;
* where those runs are short enough that a wake may matter (under ``TRY_ALONE_BELOW_S``:
  a wake is 2-5% of a 1 ms run, while a run on one thread may take up to twice as long),
  the next few run alone: the workers stay asleep (``Pool.alone_begins``) and the kernels
  take every part of their jobs on the calling thread;
* then each such run takes whichever kept the lower median of its last ``RECENT`` times,
  and every ``RETRY_EVERY``-th the other one, so a change of load is noticed (seldom
  enough not to be a p99: at one in 16, a 64-row MLP's p99 with 0.3 ms of other work
  between requests went 218 -> 247 us, its runs alone the slower way).

Runs that find the workers awake use them, as before, and are not timed. A 42-101-911-13
MLP at 16 rows (2 cores, 2026-11-28): back to back 51-63 us with the workers, 65 on one
thread; with 0.3 ms of other work between requests 81-106 us waking them, 71 without.
"""

from __future__ import annotations

import time

from mixrt.ops.compiled import jit_cpu

TRY_ALONE_BELOW_S = 1e-3  # woken runs slower than this never try running alone
LEARN = 3  # times of each way before the two are compared
RECENT = 8  # times kept of each way
RETRY_EVERY = 128  # asleep-found runs between tries of the way not taken (under 1%: a p99)

AWAKE = None  # a run that found the workers awake (or some of them): not timed


class WakeChoice:
    """One plan's times of its runs that found the workers asleep, woken or not."""

    __slots__ = ("_woken", "_alone", "_asleep_runs")

    def __init__(self):
        self._woken: list[float] = []
        self._alone: list[float] = []
        self._asleep_runs = 0

    def begins(self):
        """The workers' side of a run that may split its kernels: a token for :meth:`ends`,
        or None when no native pool is loaded."""
        pool = jit_cpu.loaded_native_pool()
        if pool is None:
            return None
        if not pool.asleep():
            pool.run_begins()
            return pool, AWAKE, 0.0
        started = time.perf_counter()  # the wake's own cost counts
        woken = self._wakes()
        if woken:
            pool.run_begins()
        else:
            pool.alone_begins()
        return pool, woken, started

    def ends(self, token) -> None:
        pool, woken, started = token
        if woken is False:
            pool.alone_ends()
        else:
            pool.run_ends()
        if woken is not AWAKE:
            self._record(self._woken if woken else self._alone, time.perf_counter() - started)

    def _wakes(self) -> bool:
        self._asleep_runs += 1
        woken, alone = self._woken, self._alone
        if len(woken) < LEARN:
            return True
        if len(alone) < LEARN:
            return _median(woken) >= TRY_ALONE_BELOW_S
        better = _median(woken) <= _median(alone)
        return not better if self._asleep_runs % RETRY_EVERY == 0 else better

    @staticmethod
    def _record(times: list, seconds: float) -> None:
        times.append(seconds)
        if len(times) > RECENT:
            del times[0]

    def state(self) -> dict:
        """What the plan learned (for tests and benchmarks): the kept times of each way."""
        return {"woken": list(self._woken), "alone": list(self._alone),
                "asleep_runs": self._asleep_runs}


def _median(times: list) -> float:
    return sorted(times)[len(times) // 2]
