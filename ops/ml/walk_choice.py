"""Which of the two compiled walks a forest's batch takes, chosen by the clock.

A forest whose branches share one mode has two walks (``ops/ml/_jit_trees.py``) that reach
the same leaves and add them in the same order, so either gives the same bits: the walk
that stops at each leaf, which branches at every step, and the stepped walk, which takes
every row of a block through a tree's depth with nothing to branch on. Which is faster
depends on the forest, the rows and the core: where a caller sends rows whose branches the
predictor has learnt, or a core predicts deep histories well, the branching walk wins; on
a 2026 Xeon with rows that change it lost by 2x. On a Zen 4 core, with the rows the sweep
repeats, 64 rows of LightGBM's regressor took 191 us stepped and 145 walked on one thread,
while scikit-learn's random forest took 230 stepped and 385 walked (2026-11-25). No rule
of thumb holds for both, so a forest times its first calls of each batch size both ways
(``SAMPLES`` each, alternating) and keeps the faster; every ``RETUNE_CALLS`` calls it times
them again, as traffic changes.
"""

from __future__ import annotations

import time

SAMPLES = 3  # timed calls of each walk before the faster one is kept
RETUNE_CALLS = 4096  # calls of one batch size between two rounds of timing
MOST_SIZES = 64  # batch sizes a forest keeps a choice for (others take the stepped walk)

clock = time.perf_counter_ns  # what a walk is timed by


class WalkChoice:
    """The choice for one batch size: :meth:`next` says which walk the next call takes
    and whether to time it, :meth:`timed` takes the time it took."""

    __slots__ = ("_samples", "_stepped", "_calls")

    def __init__(self):
        self._samples: dict[bool, list[int]] = {True: [], False: []}
        self._stepped: bool | None = None  # the kept walk, None while timing
        self._calls = 0

    def next(self) -> tuple[bool, bool]:
        """(take the stepped walk, time this call)."""
        self._calls += 1
        if self._stepped is not None:
            if self._calls % RETUNE_CALLS:
                return self._stepped, False
            self._stepped = None
            self._samples = {True: [], False: []}
        stepped = len(self._samples[True]) <= len(self._samples[False])
        return stepped, True

    def timed(self, stepped: bool, nanoseconds: int) -> None:
        samples = self._samples
        samples[stepped].append(nanoseconds)
        if len(samples[True]) >= SAMPLES and len(samples[False]) >= SAMPLES:
            # the fastest of each: a call another process interrupted says nothing
            self._stepped = min(samples[True]) <= min(samples[False])

    @property
    def kept(self) -> bool | None:
        """The walk kept (True: stepped), or None while timing."""
        return self._stepped


class WalkChoices:
    """A forest's choices by batch size."""

    __slots__ = ("_by_rows",)

    def __init__(self):
        self._by_rows: dict[int, WalkChoice] = {}

    def for_rows(self, rows: int) -> WalkChoice | None:
        choice = self._by_rows.get(rows)
        if choice is None and len(self._by_rows) < MOST_SIZES:
            choice = self._by_rows.setdefault(rows, WalkChoice())
        return choice


def walk(choice: WalkChoice, run) -> None:
    """``run(stepped)`` with the walk ``choice`` keeps, timed while it is being chosen."""
    stepped, timing = choice.next()
    if not timing:
        run(stepped)
        return
    started = clock()
    run(stepped)
    choice.timed(stepped, clock() - started)

