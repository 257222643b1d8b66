"""Which of the compiled walks a forest's batch takes, chosen by the clock.

A forest whose branches share one mode has four walks (``ops/ml/_jit_trees.py``) that reach
the same leaves and add them in the same order, so each gives the same bits: the stepped
walk, which takes every row of a block through a tree's depth with nothing to branch on; the
walk that stops at each leaf, a block of rows in step; and the branching walks over the
depth-first tables, one row's path at a time, row by row or tree by tree. Which is faster
depends on the forest, the rows and the core: where a caller sends rows whose branches the
predictor has learnt, the branching walks win; with rows that change, the stepped walk or
the branching walk row by row. On a Zen 4 core, 64 rows on one thread (us, the sweep's
repeated rows / rows that change): LightGBM's regressor stepped 184 / 187, in step 128 /
392, branching by row 105 / 109, by tree 75 / 233; scikit-learn's random forest 322 / 328,
365 / 732, 405 / 415, 254 / 501 (2026-11-26). No rule of thumb holds for all, so a forest
times its first calls of each batch size every way (``SAMPLES`` each, one walk after the
other) and keeps the fastest of each walk's calls (from one row: a single row of LightGBM's
3-class forest took 31 us in step, 22.5 branching); every ``RETUNE_CALLS`` calls it times them
again, as traffic changes. Runs a session makes on feeds of its own (its warm-up on zeros,
``base/made_up_feeds.py``) teach it nothing: rows of zeros all take one path.

The choice is kept per *class* of batch sizes, a power of two apart (1, 2-3, 4-7, ...,
8192-16383 rows), not per size: a service whose batches each have their own size timed
every way again at nearly every call, and at thousands of rows the slow walks are slow (a
536-tree random forest at 2,490 rows: 56, 119, 146 and 40 ms; the sweep's median there,
the timing rounds included, 119 ms against onnxruntime's 61, 2026-11-27). Within a class
the order of the walks held where it was measured. A walk whose call took LONG_CALL_NS or
more is timed twice, not SAMPLES times: the clock's noise is small against it, and each
more sample of a slow walk costs the request that takes it; but not once, since its
first call after another walk's is the one that teaches the core its branches. Timed
once, the branching walk lost to the stepped walk that it beats once learnt: XGBoost's
46-tree regressor at 7,450 rows of its dataset kept the stepped walk, 2.69 ms a call,
against the branching walk's 1.98 (onnxruntime 1.5-2.3; 2026-12-04).

Each walk is a numba kernel called with its own tables, so each is its own compiled
signature, and a session's first runs (on made-up rows, or the one walk a first call
times) may have loaded only the first. Nothing is compiled in a request: a walk whose
signature is in no cache is left out (:meth:`WalkChoices.loaded`, :func:`walk`),
and a process that compiles in the foreground (the background compiler's child,
``runtime/compile_worker.py``) compiles every walk's signature the first time it times one,
so the cache the session loads from holds them all. Before, a row bucket's bound call
(``runtime/row_buckets.py``), made on made-up rows, timed XGBoost's branching walk at its
first real request of 1,282 rows and compiled it there: 2.3 s (2026-12-04).

A class's first round starts from what its neighbour learnt: where the class a power of
two below or above has kept a walk, the walks that were PRIOR_SLOWER times its fastest
there or slower are left out of this class's first round (the next rounds, every
RETUNE_CALLS calls, time them all again). A service whose batches each have their own size
met each class's round in turn, and most of a round's calls took a slow walk: a 103-tree
depth-4 random forest's batches of 1-64 rows, a new size every 10 ms, had up to 96 of
their first 200 calls timed (six classes, 16 calls each), the branching walks there 90-140
us against the stepped walk's 30-60 (the new-shape p50 0.30 ms against onnxruntime's 0.11,
2026-12-05).
"""

from __future__ import annotations

import time

from mixrt.base import made_up_feeds
from mixrt.ops.compiled import jit_tier

SAMPLES = 4  # timed calls of each walk before the fastest one is kept
RETUNE_CALLS = 4096  # calls of one batch size between two rounds of timing
MOST_SIZES = 64  # classes of batch sizes a forest keeps a choice for (others: the stepped walk)
LONG_CALL_NS = 2_000_000  # a walk whose call takes this long is timed LONG_SAMPLES times
LONG_SAMPLES = 2
LEFT_OUT_NS = 1 << 62  # the time a walk whose kernel is in no cache counts as
RECHECK_NS = 30_000_000_000  # how long a walk found in no cache stays left out
PRIOR_SLOWER = 2.0  # a walk this much slower in the neighbouring class sits a first round out

clock = time.perf_counter_ns  # what a walk is timed by


class WalkChoice:
    """The choice among ``count`` walks (indices in the order ``forest.walk_candidates``
    gives their tables) for one batch size: :meth:`next` says which walk the next call takes
    and whether to time it, :meth:`timed` takes the time it took."""

    __slots__ = ("_samples", "_kept", "_calls", "fastest")

    def __init__(self, count: int = 4, prior: list[int] | None = None):
        self._samples: list[list[int]] = [[] for _ in range(count)]
        self._kept: int | None = None  # the kept walk, None while timing
        self._calls = 0
        self.fastest: list[int] | None = None  # each walk's fastest call, once one is kept
        if prior is not None and len(prior) == count and min(prior) > 0:
            # a neighbouring class's fastest calls: its slow walks sit this round out
            bar = min(prior) * PRIOR_SLOWER
            for index, took in enumerate(prior):
                if took >= bar:
                    self.leave_out(index)

    def next(self) -> tuple[int, bool]:
        """(the walk this call takes, time this call)."""
        self._calls += 1
        if self._kept is not None:
            if self._calls % RETUNE_CALLS:
                return self._kept, False
            self._kept = None
            self._samples = [[] for _ in self._samples]
        # each walk's samples one after another: a branching walk is fast only once the
        # core has learnt its branches, which timing the walks in turn kept it from
        # (LightGBM's 64 repeated rows: 133 us a call in turn, 62 after a few calls of its own)
        index = next(i for i, times in enumerate(self._samples) if not _enough(times))
        return index, True

    def timed(self, index: int, nanoseconds: int) -> None:
        samples = self._samples
        samples[index].append(nanoseconds)
        if all(_enough(times) for times in samples):
            # the fastest of each: a call another process interrupted says nothing
            fastest = [min(times) for times in samples]
            self._kept = fastest.index(min(fastest))
            self.fastest = fastest

    def leave_out(self, index: int) -> None:
        """Walk ``index`` cannot run here without compiling, or sits this round out (a
        neighbouring class found it slow): timed as never fastest, until the next round
        of timing asks again."""
        while not _enough(self._samples[index]):
            self.timed(index, LEFT_OUT_NS)

    @property
    def count(self) -> int:
        """The walks chosen among."""
        return len(self._samples)

    @property
    def kept(self) -> int | None:
        """The walk kept, or None while timing."""
        return self._kept


def _enough(times: list[int]) -> bool:
    """Whether a walk's calls so far time it: SAMPLES of them, or LONG_SAMPLES where its
    first was long."""
    return len(times) >= SAMPLES or (len(times) >= LONG_SAMPLES and times[0] >= LONG_CALL_NS)


class WalkChoices:
    """A forest's choices by class of batch size (a power of two apart), among ``count``
    walks, and which walks each of its kernels may run without compiling
    (:meth:`loaded`)."""

    __slots__ = ("_by_rows", "_count", "_loaded")

    def __init__(self, count: int = 4):
        self._by_rows: dict[int, WalkChoice] = {}
        self._count = count
        self._loaded: dict = {}  # (kernel, key) -> (walks loaded, when a walk was not)

    def for_rows(self, rows: int) -> WalkChoice | None:
        size_class = rows.bit_length()
        choice = self._by_rows.get(size_class)
        if choice is None and len(self._by_rows) < MOST_SIZES:
            choice = self._by_rows.setdefault(size_class, WalkChoice(
                self._count, self._neighbours_fastest(size_class)))
        return choice

    def _neighbours_fastest(self, size_class: int) -> list[int] | None:
        """The fastest calls of each walk in the class below ``size_class`` or, failing
        that, above it, where that class has kept a walk; else None."""
        for neighbour in (size_class - 1, size_class + 1):
            choice = self._by_rows.get(neighbour)
            if choice is not None and choice.fastest is not None:
                return choice.fastest
        return None

    def loaded(self, kernel, key, kernel_arguments) -> tuple | None:
        """Which walks ``kernel`` may take here without compiling, a bool each, or None
        for all (:func:`_loaded`); ``kernel_arguments(index)``: walk ``index``'s arguments
        of ``kernel``, ``key`` what their types depend on besides the walk (the dtypes).
        Kept, as a dict lookup a call; where a walk was not loaded, asked again after
        RECHECK_NS (a child may have compiled it since)."""
        known = self._loaded.get((kernel, key))
        if known is not None and (known[1] is None or clock() - known[1] < RECHECK_NS):
            return known[0]
        walks = _loaded(kernel, kernel_arguments, self._count)
        if walks is not None or jit_tier.compile_misses() is None:
            self._loaded[(kernel, key)] = (walks, None if walks is None or all(walks)
                                           else clock())
        return walks


def walk(choice: WalkChoice, run, loaded: tuple | None = None) -> None:
    """``run(index)`` with the walk ``choice`` keeps, timed while it is being chosen; on
    feeds a session made up (``base/made_up_feeds.py``) the kept walk, else the first,
    untimed. ``loaded``: which walks ``run`` may take without compiling
    (:meth:`WalkChoices.loaded`): the others are left out of the timing, and where the
    kept walk is one (kept by another kernel's timing: a forest's kernels share its
    choices), the first loaded walk runs instead."""
    if made_up_feeds.in_progress():
        run(choice.kept or 0)
        return
    index, timing = choice.next()
    if loaded is not None:
        while timing and not loaded[index]:
            choice.leave_out(index)
            index, timing = choice.next()
        if not loaded[index] and True in loaded:
            index, timing = loaded.index(True), False
    if not timing:
        run(index)
        return
    started = clock()
    run(index)
    choice.timed(index, clock() - started)


def _loaded(kernel, kernel_arguments, count: int) -> tuple | None:
    """Which of ``count`` walks ``kernel`` runs without compiling in this call. Inside a
    loading run (``jit_tier.loading_only``) every walk, as None: a miss is that run's to
    note and to answer on its NumPy path. Where this process compiles in the foreground
    (the background compiler's child) every walk's signature is compiled now, so that the
    cache holds them all. Else a walk whose signature is neither loaded nor loads from a
    cache (a load, not a compile: ~ms, once) is not."""
    if jit_tier.compile_misses() is not None:
        return None
    signatures = [_signature(kernel, kernel_arguments(index)) for index in range(count)]
    if not jit_tier.background_compiles():
        for signature in signatures:
            kernel.compile(signature)
        return None
    return tuple(_loads(kernel, signature) for signature in signatures)


def _loads(kernel, signature: tuple) -> bool:
    if signature in kernel.overloads:
        return True
    try:
        with jit_tier.loading_only():
            kernel.compile(signature)
    except jit_tier.CompileForbidden:
        return False
    return True


def _signature(kernel, arguments: tuple) -> tuple:
    """The numba types ``kernel`` would be compiled for on ``arguments``."""
    return tuple(kernel.typeof_pyval(argument) for argument in arguments)
