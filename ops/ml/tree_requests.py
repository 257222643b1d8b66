"""A tree ensemble's request: a few float32 rows, answered by one compiled call.

A service sends a classifier or regressor one row at a time. The compiled walk of a small
forest takes ~1 us for it; the general path around it (the tier and table checks, the row
conversion, two or three allocations, the labels' lookup) took ~3 us more, and the regressor
another ~4 in NumPy's small calls for the division, the base values and the cast. A request
object, made on a node's first compiled run, keeps what those checks settle once (the
kernel, its tables, the width a row needs, how labels map), so a later call checks only what
can change between calls: the array's dtype, shape and layout, and whether compiled kernels
may run on this thread. Anything else returns None and the general path answers, with the
same values either way (the same compiled functions in the same order).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from mixrt.base import made_up_feeds, run_options
from mixrt.ops.compiled import jit_cpu, jit_tier
from mixrt.ops.compiled.worker_wakes import run_pool, runs_alone
from mixrt.ops.compiled.jit_tier import compiled_allowed
from mixrt.ops.ml import walk_choice
from mixrt.ops.ml.forest import CHOSEN_FROM_ROWS
from mixrt.ops.ml.forest_walks import SPLIT_ROWS

_FLOAT32 = np.dtype(np.float32)
_NO_ROW_FITS = 1 << 62  # the width asked of rows where a node reads a negative feature
_ANY_COUNT = 1 << 62  # the most rows of :meth:`_Request.takes_any_count`
MOST_SPLITS = 16  # batch shapes a request keeps its split by rows for
SPLIT_RECHECK_S = 30.0  # how long rows past the one call stay on it where the split's
# kernels were in no cache (:meth:`_Request._split_or_one_call`)


class _Request:
    """What a request path checks of ``X`` before its one compiled call."""

    __slots__ = ("kernels", "forest", "precision", "tables", "candidates", "choices", "width",
                 "most_rows", "most_rows_alone", "split_from", "split_missed", "splits",
                 "split_choices")

    def __init__(self, kernels, forest, precision):
        self.kernels, self.forest, self.precision = kernels, forest, precision
        self.tables = forest.walk_tables(precision)
        # where the forest has several walks, a batch takes the one its size's choice keeps
        # (ops/ml/walk_choice.py): each walk's tables
        self.choices = forest.walk_choices()
        self.candidates = None if self.choices is None else forest.walk_candidates(precision)
        width = forest.widest_row_read()
        self.width = width if width is not None else _NO_ROW_FITS
        self.most_rows = forest.alone_rows()
        # in a run that leaves the workers asleep, more rows than that are one call too
        self.most_rows_alone = forest.alone_rows_asleep()
        # the fewest rows whose walk is split by trees (fewer than two parts' rows), or None
        self.split_from = forest.tree_split_rows()
        # there, the choice between each walk split by trees and the same walk whole (below)
        walks = 1 if self.candidates is None else len(self.candidates)
        self.split_choices = None if self.split_from is None \
            else walk_choice.WalkChoices(2 * walks)
        # when past_one_call last met a kernel in no cache (_split_or_one_call), or None
        self.split_missed = None
        self.splits: dict = {}  # batch shape -> its walk split by rows (_split_again)

    def _walk(self, kernel, X, arguments, rest, *outputs, by_trees):
        """kernel(X, *arguments, *outputs) with the walk the batch's choice keeps (timed
        while it is being chosen): ``arguments`` the walk's tables and ``rest``, or, where
        the batch chooses, each walk's tables and then ``rest``. Where the forest may split
        the rows' walk by trees (``forest.tree_parts``: few rows, many trees), each walk
        split, ``by_trees(tables)``, is one more candidate (:meth:`_walk_or_split`)."""
        rows = X.shape[0]
        split_from = self.split_from
        if split_from is not None and split_from <= rows < 2 * SPLIT_ROWS:
            self._walk_or_split(kernel, X, rest, outputs, by_trees)
            return
        choice = None if self.choices is None or rows < CHOSEN_FROM_ROWS \
            else self.choices.for_rows(rows)
        if choice is None:
            kernel(X, *arguments, *outputs)
            return
        candidates = self.candidates

        def run(index):
            kernel(X, *candidates[index], *rest, *outputs)
        loaded = self.choices.loaded(kernel, (X.dtype.char, self.precision), lambda index: (
            X, *candidates[index], *rest, *outputs))
        walk_choice.walk(choice, run, loaded)

    def _walk_or_split(self, kernel, X, rest, outputs, by_trees) -> None:
        """The walk of rows the forest may split by trees, chosen by the clock among each
        walk split (first: made-up rows take it, so its kernels load with the node,
        :meth:`_ready_by_trees`) and each walk whole on this thread, as the walks are
        chosen (``walk_choice.py``). Whether the split's hand-off and its leaves' addition
        on this thread cost less than half the walk depends on the rows: one row through a
        LightGBM's 690 trees, back to back, 19-20 us split against 16-17 whole where each
        request sent the same row (its branches learnt), 27 against 30 where rows changed
        (onnxruntime 9-11 and 15-19; 2026-12-05). A split that does not hold (a run that
        leaves the workers asleep) walks whole."""
        candidates = (self.tables,) if self.candidates is None else self.candidates
        walks = len(candidates)
        choice = self.split_choices.for_rows(X.shape[0])

        def run(index):
            tables = candidates[index % walks]
            if index >= walks or not by_trees(tables):
                kernel(X, *tables, *rest, *outputs)
        if choice is None:  # (sizes past the choices kept: the split, as before)
            run(0)
            return
        loaded = None if self.choices is None else self.choices.loaded(
            kernel, (X.dtype.char, self.precision),
            lambda index: (X, *candidates[index], *rest, *outputs))
        walk_choice.walk(choice, run, None if loaded is None else loaded + loaded)

    def _ready_by_trees(self) -> None:
        """Where a request of a few rows is split by trees (``forest.tree_parts``), one
        such request answered now, on zeros, as the node's first compiled run makes this
        path: the split's kernels (its part entry, the leaves' addition, the scores from
        its sums) load here instead of at the first such request of a service's stream (a
        LightGBM's first seven rows among requests of 1-64: ~19 ms, 2026-11-28). Made-up
        rows teach the walk's choice nothing (``base/made_up_feeds.py``), nor the run's
        plan to wake the workers as it begins (its own rows may not be split: a LightGBM's
        two rows whose plan learnt it went 27 -> 51 us a request)."""
        rows = self.split_from
        if rows is None or self.width == _NO_ROW_FITS:
            return
        noted = jit_cpu.native_job_noted()
        with made_up_feeds.made_up():
            self.answer(np.zeros((rows, self.width), np.float32))
        if not noted:
            jit_cpu.forget_native_job()

    def _sums_by_trees(self, tables, X, targets: int):
        """(the sums, whether a leaf reached each target) of X's rows over ``tables`` split
        by trees (``forest.split_sums``: arrays its next call fills again), else None: the
        same bits as the one call's."""
        return self.forest.split_sums(X, tables, self.precision, targets)

    def takes(self, X) -> bool:
        """Is ``X`` rows this path walks as it is in any run (and may compiled kernels run
        here)? What a bound call is made for (``ml_trees.bind_tree_request``)."""
        return self._takes(X, self.most_rows)

    def takes_now(self, X) -> bool:
        """:meth:`takes`, or more rows where the run in progress leaves the workers asleep
        (``worker_wakes.runs_alone``): their walk is one call then, as a request's is,
        rather than the general path's parts (each part this thread's) or its one call
        behind ~10 Python calls more (a LightGBM's 14-60 rows 10 ms apart: ~0.15 ms of
        the request's ~0.4, 2026-11-30)."""
        return self._takes(X, self._most_rows_now())

    def _most_rows_now(self) -> int:
        """The most rows the run in progress takes in one call."""
        return self.most_rows_alone if runs_alone() else self.most_rows

    def takes_any_count(self, X) -> bool:
        """:meth:`takes` of X's rows whatever their count: what a bound call of more rows
        than a run's one call answers is made for (``ml_trees.bind_tree_request``)."""
        return self._takes(X, _ANY_COUNT)

    def any_rows(self, X):
        """The answer to rows :meth:`takes_any_count` takes, as the run in progress takes
        them: in one call where :meth:`takes_now` does, else through the compiled kernels
        split between threads (:meth:`past_one_call`). A batch past the one call of every run
        (a LightGBM's 13-64 rows) had no bound call, so its runs were never settled: each
        took the node's dispatch, the request's checks and the pinned settings, ~70 us more
        than 12 rows of a request 10 ms after the last, cold (2026-11-30)."""
        if X.shape[0] <= self._most_rows_now():
            return self.answer(X)
        answer = self._split_again(X)
        return answer if answer is not None else self._split_or_one_call(X)

    def _split_again(self, X):
        """The answer of a batch shape this request split by rows before
        (:meth:`_kept_split`) where its split still holds: this thread, the run's pool, its
        workers awake, no limits. Through ``_split_or_one_call`` each such request paid its
        checks and ~10 Python calls more: an XGBoost's 10 rows through 273 trees, 37 us a
        request against 18 for the split's two half-walks (onnxruntime 24; 2026-12-05)."""
        split = self.splits.get(X.shape)
        if split is None or split.thread != threading.get_ident() or runs_alone() \
                or (run_pool() or jit_cpu.native_pool()) is not split.native \
                or run_options.current() is not None or X.dtype is not _FLOAT32 \
                or not X.flags.c_contiguous or not compiled_allowed():
            return None
        return self._split_answer(split, X)

    def _kept_split(self, X, split):
        """The answer of X's rows through ``split`` (``forest.rows_split``), kept for the
        batch shape's next requests (:meth:`_split_again`)."""
        if len(self.splits) >= MOST_SPLITS:
            self.splits.clear()
        self.splits[X.shape] = split
        return self._split_answer(split, X)

    def _split_answer(self, split, X):  # (each kind of request says how)
        raise NotImplementedError

    def _split_or_one_call(self, X):
        """:meth:`past_one_call` where its kernels load without compiling, else the one
        call (:meth:`answer`, all rows on this thread). The bound call may have been made on
        made-up rows with the workers asleep (a row bucket's, ``runtime/row_buckets.py``),
        whose runs never called the split's kernels: XGBoost's first real request of 1,282
        rows with the workers awake compiled its sums walk there, 2.1 s (2026-12-04).
        Run on the real rows inside ``jit_tier.loading_only`` (~2 us of the hundreds of
        rows' walk), as the walk it takes depends on the batch's size class
        (``walk_choice.py``): a kernel in no cache raises before it writes, and the
        outputs are the call's own new arrays."""
        if jit_tier.compile_misses() is not None or not jit_tier.background_compiles():
            return self.past_one_call(X)  # a loading run's miss is its own; or compiling here
        missed = self.split_missed
        if missed is not None and time.monotonic() - missed < SPLIT_RECHECK_S:
            return self.answer(X)
        try:
            with jit_tier.loading_only():
                return self.past_one_call(X)
        except jit_tier.CompileForbidden:
            self.split_missed = time.monotonic()
        return self.answer(X)

    def past_one_call(self, X):  # (each kind of request says how)
        raise NotImplementedError

    def _takes(self, X, most_rows: int) -> bool:
        """Of ``jit_cpu.enabled`` only the thread's tier is asked (~0.1 us of its ~0.5): the
        kernels are loaded (the request was made by a compiled run), and the environment
        setting it also reads is the process's, fixed before its first run."""
        return X.dtype is _FLOAT32 and X.ndim == 2 and X.shape[1] >= self.width \
            and X.shape[0] <= most_rows and X.flags.c_contiguous and compiled_allowed()


class ClassifierRequest(_Request):
    """``_Classifier.run`` for a request: the walk, scores and labels of ``classify_many``
    or ``classify_two`` (ops/ml/_jit_trees.py), as ``_Classifier._one_call`` calls them."""

    __slots__ = ("classify", "arguments", "rest", "columns", "labels", "classifier", "finish")

    def __init__(self, kernels, classifier):
        super().__init__(kernels, classifier.forest, np.float32)
        self.classifier = classifier
        labels, base = classifier.labels, classifier.base[_FLOAT32]
        self.columns = max(2, len(labels))
        if len(labels) > 2:
            self.classify = kernels.classify_many
            rest = (base, classifier.transform)
        else:
            self.classify = kernels.classify_two
            rest = (classifier.forest.weights.shape[1], base, classifier.binary_case,
                    classifier.all_positive, classifier.transform)
        self.rest = rest
        self.arguments = (*self.tables, *rest)
        # what forest.classify_parts finishes a part's rows with (ml_trees._by_parts)
        many = len(labels) > 2
        self.finish = (self.columns if many else classifier.forest.weights.shape[1], many,
                       classifier.transform, classifier.binary_case, classifier.all_positive)
        # the labels to look the chosen indices up in; None: the indices are the labels
        # (labels 0..n-1, or two classes without the binary case, which answer the index)
        looked_up = len(labels) > 2 or classifier.binary_case or labels.dtype == object
        indices = labels.dtype != object and np.array_equal(labels, np.arange(len(labels)))
        self.labels = labels if looked_up and not indices else None
        self._ready_by_trees()

    def __call__(self, X):
        return self.answer(X) if self.takes_now(X) else None

    def answer(self, X):
        """The label and scores of rows this path :meth:`takes_now`."""
        rows = X.shape[0]
        scores = np.empty((rows, self.columns), np.float32)
        chosen = np.empty(rows, np.int64)
        self._walk(self.classify, X, self.arguments, self.rest, chosen, scores,
                   by_trees=lambda tables: self._by_trees(tables, X, chosen, scores))
        return (chosen if self.labels is None else self.labels[chosen]), scores

    def past_one_call(self, X):
        """The classifier's compiled answer, its rows split between threads where they are
        (the split kept: :meth:`_kept_split`)."""
        split = self.forest.rows_split(X, np.float32, self.finish,
                                       self.classifier.base[_FLOAT32])
        if split is None:
            return self.classifier.compiled_rows(self.kernels, X, np.float32)
        return self._kept_split(X, split)

    def _split_answer(self, split, X):
        rows = X.shape[0]
        scores = np.empty((rows, self.columns), np.float32)
        chosen = np.empty(rows, np.int64)
        split(X, chosen, scores)
        return (chosen if self.labels is None else self.labels[chosen]), scores

    def _by_trees(self, tables, X, chosen, scores) -> bool:
        """classify_many's or classify_two's answer with the walk split by trees."""
        many = self.classify is self.kernels.classify_many
        sums = self._sums_by_trees(tables, X, self.columns if many else self.rest[0])
        if sums is None:
            return False
        if many:
            self.kernels.many_class_scores(*sums, *self.rest, chosen, scores)
        else:
            self.kernels.two_class_scores(*sums, *self.rest[1:], chosen, scores)
        return True


class RegressorRequest(_Request):
    """``_Regressor.run`` for a request with SUM or AVERAGE and no post-transform: the walk,
    the division, the base values and the rounding in ``regress`` (ops/ml/_jit_trees.py)."""

    __slots__ = ("average", "base", "targets", "arguments", "rest")

    def __init__(self, kernels, regressor):
        super().__init__(kernels, regressor.forest, np.float64)
        self.average = regressor.function == "AVERAGE"
        self.base = np.empty(0) if regressor.base is None \
            else np.ascontiguousarray(regressor.base.reshape(-1))
        self.targets = regressor.forest.weights.shape[1]
        self.rest = (self.average, self.base)
        self.arguments = (*self.tables, *self.rest)
        self._ready_by_trees()

    def __call__(self, X):
        return self.answer(X) if self.takes_now(X) else None

    def answer(self, X):
        """The scores of rows this path :meth:`takes_now`."""
        values = np.empty((X.shape[0], self.targets), np.float32)
        self._walk(self.kernels.regress, X, self.arguments, self.rest, values,
                   by_trees=lambda tables: self._by_trees(tables, X, values))
        return values

    def past_one_call(self, X):
        """regress's scores with the walk split between threads (``forest.compiled_sums``,
        each row's trees in order: the same sums; the split by rows kept:
        :meth:`_kept_split`), then the same ``regressed``."""
        split = self.forest.rows_split(X, np.float64)
        if split is not None:
            return self._kept_split(X, split)
        total, _ = self.forest.compiled_sums(self.kernels, X, np.float64)
        return self._regressed(total)

    def _split_answer(self, split, X):
        total = np.zeros((X.shape[0], self.targets), np.float64)
        split(X, total, np.zeros(total.shape, np.bool_))
        return self._regressed(total)

    def _regressed(self, total):
        values = np.empty((total.shape[0], self.targets), np.float32)
        self.kernels.regressed(total, len(self.forest.roots), *self.rest, values)
        return values

    def _by_trees(self, tables, X, values) -> bool:
        """regress's answer with the walk split by trees."""
        sums = self._sums_by_trees(tables, X, self.targets)
        if sums is None:
            return False
        self.kernels.regressed(sums[0], len(self.forest.roots), *self.rest, values)
        return True


def regressor_request(kernels, regressor):
    """A :class:`RegressorRequest` where ``regress`` computes what ``_Regressor.run`` does
    (SUM or AVERAGE, no post-transform, base values NumPy broadcasts the same way), else
    None."""
    base = regressor.base
    targets = regressor.forest.weights.shape[1]
    if regressor.function not in ("SUM", "AVERAGE") or _name(regressor.post_transform) != "NONE" \
            or (base is not None and base.size not in (1, targets)) \
            or (base is not None and base.ndim > 1):
        return None
    return RegressorRequest(kernels, regressor)


def _name(post_transform) -> str:
    return post_transform.decode() if isinstance(post_transform, bytes) else post_transform
