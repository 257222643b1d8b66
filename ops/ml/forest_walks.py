"""A tree ensemble's walks over its forest (:class:`_Forest`, its tables laid out by
``forest_tables.py``): the compiled walks of ``_jit_trees.py`` where they may run, split
between threads for large batches (Python threads, or the native worker through
``_jit_tree_parts.py``), the walk a batch's size chose by the clock (``walk_choice.py``), and
the NumPy tier's walk to the leaves with the ensembles' aggregates.
"""

from __future__ import annotations

import threading

import numpy as np

from mixrt.base import run_options
from mixrt.ops.compiled import jit_cpu, worker_wakes
from mixrt.ops.panels import native_parts
from mixrt.ops.compiled.parallel import intra_op_threads, parallel_for
from mixrt.ops.ml import walk_choice
from mixrt.ops.ml.forest_tables import _LEAF, _MEMBER, _ForestTables
from mixrt.ops.ml.tree_split_calls import RowsSplit, SplitCall

_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
# a rough count of node visits per tree and row, where the stepped walk's counts are not made
_STEPS_PER_TREE = 16
# steps of a walk (rows x a row's steps; ~2 ns each) from which it is split between threads:
# the native worker takes a part in ~5 us (ops/ml/_jit_tree_parts.py), a Python thread in 20-40
NATIVE_SPLIT_STEPS = 1 << 13
THREAD_SPLIT_STEPS = 1 << 17
SPLIT_ROWS = 4  # the fewest rows of a part (the stepped walk's, _jit_trees.STEPPED_FROM_ROWS)
# A walk of fewer rows than two parts take has its trees split between this thread and the
# native worker instead (_jit_tree_parts.py, TREE_ENTRIES) where half its time is more than
# what splitting costs by a quarter of it (at the bare break-even the clock's noise decides):
# the hand-off, the leaves' addition and the call prepared per thread and batch shape
# (tree_split_calls.py), ~8 us (2026-11-28; the general path's, made at every call, ~15).
# A step of a row whose values change costs ~5 ns where the forest's nodes fit the core's
# own cache (LightGBM's 400 trees, 0.6 MB: ~7 ns with the call's overhead) and ~15 where they
# do not (scikit-learn's 200 extra trees, ~10 MB: 14 ns; its deep random forest, 5 MB: ~22).
# A request's one row through 1,200 LightGBM trees, ~12,700 steps: 118 -> 83 us.
# The split also pays for the worker's wake: a service's requests come paced, and by the
# next one the worker sleeps (it spins 50 us after a run, _jit_native_pool.py), so the
# futex call that wakes it holds the caller 12-16 us (a virtual CPU's interrupt), and a
# plan that split once wakes it at the start of every run after. Counting the hand-off
# alone (split from ~4,000 steps), a LightGBM's two rows through 852 trees (~5,100 steps)
# were split: 30-39 us back to back against 27 on one thread, 72-94 against 50 with 1 ms
# between requests (2026-11-28). Walks of 5,400-16,200 steps, split or not, A/B in one
# process, 1 ms apart: losses of up to 25 us below ~10,000 steps, gains of 12-15 from
# ~10,800; back to back the split gains up to 13 us from ~5,000, which a service's rhythm
# does not keep.
SPLIT_COST_NS, WAKE_COST_NS = 8_000, 14_000
STEP_NS, STEP_NS_PAST_CACHE = 5, 15
TREE_SPLIT_STEPS = 5 * (SPLIT_COST_NS + WAKE_COST_NS) // (2 * STEP_NS)  # (nodes in cache)
STEPPED_FROM_ROWS = 4  # _jit_trees.STEPPED_FROM_ROWS (that module loads numba)
CHOSEN_FROM_ROWS = 1  # rows from which a batch times its walks (walk_choice.py)
MOST_SPLIT_CALLS = 64  # prepared split calls a forest keeps (threads x batch shapes x walks)
# rows the NumPy tier walks at a time (_by_blocks)
NUMPY_BLOCK_ROWS = 2048
# a run with limits (base/run_options.py) walks a large batch in blocks of about this many
# steps (~20 ms), checking its limits between them
LIMITED_BLOCK_STEPS = 1 << 23


class _Forest(_ForestTables):
    """A tree ensemble's forest (its tables: :class:`forest_tables._ForestTables`) and its
    walks: the compiled ones, split between threads for large batches, and the NumPy tier's
    walk to the leaves with their aggregates."""

    def sums(self, xp, X, precision):
        """Each target's summed leaf weights [N, targets] in ``precision``, added tree by
        tree (onnxruntime's order), and whether any reached leaf weighs that target."""
        kernels = self._kernels(xp, X)
        if kernels is None:
            return _by_blocks(xp, X, lambda rows: _leaf_sums(xp, self, self.leaves(xp, rows),
                                                             precision))
        return self.compiled_sums(kernels, X, precision)

    def compiled_sums(self, kernels, X, precision):
        """:meth:`sums` through ``kernels`` (ops/ml/_jit_trees.py; :meth:`_kernels` said they
        may walk X)."""
        total = np.zeros((X.shape[0], self.weights.shape[1]), dtype=precision)
        reached = np.zeros(total.shape, dtype=bool)
        self._walk(kernels.forest_sums, X, precision, total, reached, sums=True)
        return total, reached

    def aggregate_rows(self, xp, X, function):
        """``aggregate`` of the leaves X's rows reach, walked by the compiled kernels where
        they can run."""
        function = _aggregate_name(function)
        kernels = self._kernels(xp, X)
        if kernels is None:
            return _by_blocks(xp, X, lambda rows: self.aggregate(xp, self.leaves(xp, rows),
                                                                 function))
        if function in ("SUM", "AVERAGE"):
            total = np.zeros((X.shape[0], self.weights.shape[1]))
            reached = np.zeros(total.shape, dtype=bool)
            self._walk(kernels.forest_sums, X, np.float64, total, reached, sums=True)
            return total / len(self.roots) if function == "AVERAGE" else total
        start = np.inf if function == "MIN" else -np.inf
        best = np.full((X.shape[0], self.weights.shape[1]), start)
        self._walk(kernels.forest_extremes, X, np.float64, best, function == "MAX")
        return np.where(np.isinf(best), 0.0, best)

    def _kernels(self, xp, X):
        """ops/ml/_jit_trees.py where it may run on X (host arrays, the compiled tier on, a
        table it can walk safely), else None."""
        # the trees' compiled walk on host arrays, not an op's kernel: the ensembles share it
        if xp is not np or not self._compilable or not len(self.roots) \
                or not self._fits(X.shape[1]) or not jit_cpu.enabled():
            return None
        return jit_cpu.load("mixrt.ops.ml._jit_trees")

    def alone_rows(self) -> int:
        """The most rows whose walk is one call on the calling thread whatever the pool
        (:meth:`walks_alone` without the thread count, which it reads only for larger
        batches)."""
        return max(2 * SPLIT_ROWS - 1, (NATIVE_SPLIT_STEPS - 1) // self._steps_per_row())

    def alone_rows_asleep(self) -> int:
        """The most rows whose walk is one call on the calling thread in a run that leaves
        the native workers asleep (``worker_wakes.runs_alone``): short of a split between
        Python threads."""
        return max(self.alone_rows(), (THREAD_SPLIT_STEPS - 1) // self._steps_per_row())

    def _steps_per_row(self) -> int:
        """A row's steps through the whole forest: the stepped walk's counts, else a rough
        count per tree."""
        if self._row_steps is None:
            steps = self._stepped()[0]
            self._row_steps = max(1, int(np.abs(steps).sum()) if steps.size
                                  else len(self.roots) * _STEPS_PER_TREE)
        return self._row_steps

    def walks_alone(self, rows: int) -> bool:
        """Is a walk of ``rows`` rows one call on the calling thread (not split)?"""
        return self._split(rows, True)[1] is None

    def _split(self, rows: int, sums: bool) -> tuple:
        """(the native pool or None, the parts' (start, stop) rows or None: one call here).
        The native workers take a part of a walk of sums from NATIVE_SPLIT_STEPS, Python
        threads any walk's from THREAD_SPLIT_STEPS; one part per thread, contiguous, so each
        keeps whole blocks of rows side by side, and each of SPLIT_ROWS rows at least (two
        rows of a 500-tree forest, a row a thread: 29 -> 35 us, the hand-off and the
        compiled call's setup against half a walk of ~14 us)."""
        work = rows * self._steps_per_row()
        if rows < 2 * SPLIT_ROWS or work < NATIVE_SPLIT_STEPS:
            return None, None  # before the pool's lookup: a request's rows
        # a run that leaves the workers asleep would take every part itself; one that woke
        # them says which pool
        native = None if not sums or worker_wakes.runs_alone() \
            else worker_wakes.run_pool() or jit_cpu.native_pool()
        if native is not None:
            threads = native.workers + 1
        elif work >= THREAD_SPLIT_STEPS:
            threads = intra_op_threads()
        else:
            return None, None
        count = min(rows // SPLIT_ROWS, threads)
        if count < 2:
            return None, None
        bounds = [rows * p // count for p in range(count + 1)]
        return native, [(bounds[p], bounds[p + 1]) for p in range(count)]

    def _walk(self, kernel, X, precision, *outputs, sums: bool = False):
        """kernel(rows, start, stop, tables..., outputs...) over row ranges, split between
        threads for large batches (:meth:`_split`); ``sums``: the kernel is forest_sums,
        whose parts the native worker can take. Where the forest has both walks, the batch
        takes the one its size's choice keeps (``ops/ml/walk_choice.py``)."""
        data, tables = self.walk_inputs(X, precision)
        rows = X.shape[0]
        choices = self.walk_choices() if sums and rows >= CHOSEN_FROM_ROWS else None
        choice = None if choices is None else choices.for_rows(rows)
        if choice is None:
            self._walk_parts(kernel, data, tables, rows, outputs, sums)
            return
        candidates = self.walk_candidates(precision)
        loaded = choices.loaded(kernel, (data.dtype.char, precision), lambda index: (
            data, 0, rows, *candidates[index], *outputs))
        walk_choice.walk(choice, lambda index: self._walk_parts(
            kernel, data, candidates[index], rows, outputs, sums), loaded)

    def _walk_parts(self, kernel, data, tables, rows, outputs, sums):
        block = rows if run_options.current() is None \
            else max(1, LIMITED_BLOCK_STEPS // self._steps_per_row())
        for first in range(0, rows, block):  # blocks of rows where the run has limits
            if block < rows:
                run_options.check()
            self._walk_rows(kernel, data, tables, first, min(rows, first + block), outputs,
                            sums)

    def _walk_rows(self, kernel, data, tables, first, end, outputs, sums):
        native, parts = self._split(end - first, sums)
        if parts is None and sums:  # a request's few rows through many trees: by trees
            total, reached = outputs
            found = self.split_sums(data[first:end], tables, total.dtype, total.shape[1])
            if found is not None:  # (sums from zeros, as the callers' own start)
                total[first:end], reached[first:end] = found
                return
        if parts is None:  # a request's few rows: the call itself, no hand-out (~2 us)
            kernel(data, first, end, *tables, *outputs)
            return
        parts = [(first + start, first + stop) for start, stop in parts]
        if native is None or not _native_walk(native, parts, data, tables, *outputs):
            parallel_for(parts, lambda start, stop: kernel(data, start, stop, *tables,
                                                           *outputs))

    def classify_parts(self, X, precision, finish: tuple, base, chosen, scores) -> bool:
        """A classifier's walk of X's rows and their labels and scores, split by rows
        between this thread and the native worker, each part finishing its own rows
        (``_jit_tree_parts.CLASSIFY_ENTRIES``), with the walk the batch's choice keeps;
        False, nothing done, where :meth:`rows_split` has no split for them. ``finish``:
        (targets of the sums, many classes, transform, binary case, all positive)."""
        split = self.rows_split(X, precision, finish, base)
        if split is None:
            return False
        split(self.walk_inputs(X, precision)[0], chosen, scores)
        return True

    def rows_split(self, X, precision, finish: tuple | None = None, base=None):
        """The walk of X's rows split by rows between this thread and the native worker,
        prepared once on this thread for rows of X's width split in as many parts
        (``tree_split_calls.RowsSplit``: a later call writes its rows' count, bounds and
        addresses and runs): with ``finish``
        and ``base``, a classifier's (:meth:`classify_parts`: ``split(data, chosen,
        scores)``); without, the sums' (``split(data, total, reached)``, from zeros, as
        :meth:`compiled_sums`). None where :meth:`_split` keeps the rows on one thread, the
        run has limits (the blocked walk checks them) or no entry takes these dtypes."""
        native, parts = self._split(X.shape[0], True)
        if native is None or run_options.current() is not None:
            return None
        data_type = X.dtype if X.dtype in (np.float32, np.float64) else np.dtype(np.float64)
        precision = np.dtype(precision)
        # any count of rows of this width (each call writes its count and bounds)
        key = ("rows", threading.get_ident(), X.shape[1:], len(parts), data_type.char,
               precision.char, finish, id(base))
        split = self._split_calls.get(key)
        if split is not None and split.native is native \
                and (finish is None or split.fixed[2] is base):
            return split
        family = "ENTRIES" if finish is None else "CLASSIFY_ENTRIES"
        entry = _part_entry(family, np.empty(0, data_type), precision)
        if entry is None:
            return None
        if finish is None:
            settings, fixed = (), ()
        else:
            empty = np.zeros((0, finish[0]), precision)
            settings = tuple(int(value) for value in finish)
            fixed = (empty, empty.astype(bool), base)
        choices = self.walk_choices() if X.shape[0] >= CHOSEN_FROM_ROWS else None
        walks = [self.walk_tables(precision)] if choices is None \
            else list(self.walk_candidates(precision))
        if len(self._split_calls) >= MOST_SPLIT_CALLS:  # threads come and go
            self._split_calls.clear()
        split = self._split_calls[key] = RowsSplit(native, entry, len(parts), settings,
                                                   fixed, choices, walks)
        return split

    def tree_parts(self, rows: int) -> tuple:
        """(the native pool, the parts' tree bounds) where a walk of ``rows`` rows, too few
        to split by rows (:meth:`_split`), holds TREE_SPLIT_STEPS steps and is split by
        its trees between this thread and the native worker; (None, None) otherwise."""
        if rows >= 2 * SPLIT_ROWS or rows * self._steps_per_row() < self._split_from_steps():
            return None, None
        native = worker_wakes.run_pool() or jit_cpu.native_pool()
        count = 0 if native is None else min(native.workers + 1, len(self.roots))
        if count < 2:
            return None, None
        bounds = self._tree_bounds.get(count)
        if bounds is None:
            bounds = self._tree_bounds[count] = self._trees_in_parts(count)
        return native, bounds

    def tree_split_rows(self) -> int | None:
        """The fewest rows whose walk :meth:`tree_parts` splits by trees, or None where no
        request's walk is."""
        rows = -(-self._split_from_steps() // self._steps_per_row())
        return rows if self.tree_parts(rows)[1] is not None else None

    def _split_from_steps(self) -> int:
        """TREE_SPLIT_STEPS, scaled down where the forest's nodes do not fit the core's own
        cache (each step then waits on a miss)."""
        if self._fits_core_cache is None:  # (asked once: the records stay)
            splits, links = self._records()
            self._fits_core_cache = splits.nbytes + links.nbytes <= jit_cpu.core_cache_bytes()
        return TREE_SPLIT_STEPS if self._fits_core_cache \
            else TREE_SPLIT_STEPS * STEP_NS // STEP_NS_PAST_CACHE

    def _trees_in_parts(self, count: int) -> np.ndarray:
        """Tree bounds of ``count`` parts of about the same steps (the stepped walk's
        counts, else as many trees each)."""
        steps = np.abs(self._stepped()[0])
        if steps.size != len(self.roots):
            steps = np.ones(len(self.roots), np.int64)
        reached = np.cumsum(steps)
        cuts = np.searchsorted(reached, reached[-1] * np.arange(1, count) / count) + 1
        return np.unique(np.concatenate(([0], np.minimum(cuts, len(self.roots)),
                                         [len(self.roots)]))).astype(np.int64)

    def split_sums(self, data, tables, precision, targets: int):
        """(sums, hits) of ``data``'s rows over ``tables`` where :meth:`tree_parts` splits
        their walk by trees, else None: this thread's prepared call (``tree_split_calls``),
        whose arrays its next call fills again (the request path reads them at once)."""
        if worker_wakes.runs_alone():  # every part would be this thread's
            return None
        native, bounds = self.tree_parts(data.shape[0])
        if bounds is None:
            return None
        key = (threading.get_ident(), id(tables), data.shape, data.dtype.char,
               np.dtype(precision).char, targets)
        call = self._split_calls.get(key)
        if call is None or call.native is not native or call.tables is not tables:
            entry = _part_entry("TREE_ENTRIES", data, np.dtype(precision))
            if entry is None:
                return None
            if len(self._split_calls) >= MOST_SPLIT_CALLS:  # threads come and go
                self._split_calls.clear()
            call = self._split_calls[key] = SplitCall(native, entry, bounds, data, tables,
                                                      precision, targets)
        return call(data)

    def walk_choices(self):
        """The forest's choices of walk by batch size, or None where it has one walk only
        (its branches mix modes, or its table is not a set of trees)."""
        if not self._stepped()[0].size:
            return None
        if self._choices is None:
            walks = 2 if self._depth_first() is None else 4
            self._choices = walk_choice.WalkChoices(walks)
        return self._choices

    def leaves(self, xp, X):
        """The leaf each sample reaches in each tree: [N, trees]."""
        table = {name: xp.asarray(getattr(self, name)) for name in (
            "features", "splits", "modes", "true_next", "false_next", "tracks_true", "members")}
        data = X.astype(np.float64)
        node = xp.broadcast_to(xp.asarray(self.roots), (X.shape[0], len(self.roots))).copy()
        for _ in range(len(self.modes)):  # a path never visits a node twice
            run_options.check()  # a level of every tree at a time: a huge batch has limits
            mode = table["modes"][node]
            interior = mode != _LEAF
            if not bool(interior.any()):
                break
            x = xp.take_along_axis(data, table["features"][node], axis=1)
            go_true = _compare(xp, x, table["splits"][node], mode)
            is_member = (x[..., None] == table["members"][node]).any(axis=-1)
            go_true = xp.where(mode == _MEMBER, is_member, go_true)
            # a NaN takes the true branch when its node tracks missing values there, else
            # whatever the comparison says (false, but true for BRANCH_NEQ): onnxruntime and
            # onnx's TreeEnsemble-5 reference do so; the opset-1/3 text would send it false
            go_true = go_true | (xp.isnan(x) & table["tracks_true"][node])
            following = xp.where(go_true, table["true_next"][node], table["false_next"][node])
            node = xp.where(interior, following, node)
        return node

    def aggregate(self, xp, leaves, function: str):
        function = _aggregate_name(function)
        weights, hit = xp.asarray(self.weights), xp.asarray(self.hit)
        if function in ("SUM", "AVERAGE"):
            total = weights[leaves[:, 0]].copy()
            for t in range(1, leaves.shape[1]):
                total += weights[leaves[:, t]]
            return total / leaves.shape[1] if function == "AVERAGE" else total
        pick = xp.minimum if function == "MIN" else xp.maximum
        start = np.inf if function == "MIN" else -np.inf
        best = xp.full((leaves.shape[0], weights.shape[1]), start)
        for t in range(leaves.shape[1]):
            best = xp.where(hit[leaves[:, t]], pick(best, weights[leaves[:, t]]), best)
        return xp.where(xp.isinf(best), 0.0, best)  # a target no leaf reached scores 0


def _native_walk(native, parts, data, tables, total, reached) -> bool:
    """forest_sums over ``parts`` on this thread and the native worker
    (ops/ml/_jit_tree_parts.py); False, with nothing done, where no entry takes these
    dtypes."""
    entry = _part_entry("ENTRIES", data, total.dtype)
    if entry is None:
        return False
    (roots, splits, links, members, uniform, steps, records, thresholds, leaf_start,
     leaf_targets, leaf_values) = tables
    arrays = (data, roots, splits, links, members, steps, records, thresholds, leaf_start,
              leaf_targets, leaf_values, total, reached)
    _run_parts(native, entry, arrays, (uniform,), [start for start, _ in parts] + [parts[-1][1]])
    return True


def _part_entry(family: str, data, sums_dtype):
    """The cfunc of ops/ml/_jit_tree_parts.py's ``family`` (ENTRIES: rows, TREE_ENTRIES:
    trees) for these rows' and sums' dtypes, or None."""
    module = jit_cpu.load("mixrt.ops.ml._jit_tree_parts")
    return None if module is None else \
        getattr(module, family).get((data.dtype.char, sums_dtype.char))


def _run_parts(native, entry, arrays: tuple, settings: tuple, bounds: list) -> None:
    """The parts [bounds[p], bounds[p + 1]) of a walk on this thread and the native worker,
    through ``entry`` (a cfunc of ops/ml/_jit_tree_parts.py), whose words are every array's
    shape, the walk's ``settings`` (``uniform``, then what its entry reads after it) and the
    bounds."""
    words = np.array([0, *(extent for array in arrays for extent in array.shape), *settings,
                      *bounds], np.int64)
    words[0] = words.size
    addresses = np.empty(len(arrays) + 1, np.uint64)
    native_parts.fill_addresses(addresses, (words,) + arrays)
    jit_cpu.note_native_job()
    jit_cpu.panel_kernels().native_for(native.block, entry.address, addresses, len(bounds) - 1)


def _by_blocks(xp, X, walk):
    """``walk(X)`` (an array, or a tuple of arrays, a row each) on the host in blocks of
    NUMPY_BLOCK_ROWS rows, joined: the NumPy tier's walk keeps a [rows, trees] table of nodes
    and its temporaries, which past a few thousand rows leave the caches (a 120-tree forest:
    20 us a row at 1,000 rows, 53 at 100,000, ~210 at a million). Each row's values are its
    own, so the blocks give the same bits."""
    rows = X.shape[0]
    if xp is not np or rows <= NUMPY_BLOCK_ROWS:
        return walk(X)
    parts = [walk(X[start:start + NUMPY_BLOCK_ROWS]) for start in range(0, rows, NUMPY_BLOCK_ROWS)]
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate(values) for values in zip(*parts))
    return np.concatenate(parts)


def _aggregate_name(function) -> str:
    function = function.decode() if isinstance(function, bytes) else function
    if function not in _AGGREGATES:
        raise ValueError(f"aggregate_function must be one of {', '.join(_AGGREGATES)}, "
                         f"got {function!r}")
    return function


def _leaf_sums(xp, forest, leaves, precision):
    """The NumPy tier of ``_Forest.sums``: dense weight rows gathered and added tree by
    tree."""
    weights = xp.asarray(forest.weights.astype(precision))
    hit = xp.asarray(forest.hit)
    total = xp.zeros((leaves.shape[0], weights.shape[1]), dtype=precision)
    reached = xp.zeros(total.shape, dtype=bool)
    for tree in range(leaves.shape[1]):
        total += weights[leaves[:, tree]]
        reached |= hit[leaves[:, tree]]
    return total, reached


def _compare(xp, x, split, mode):
    tests = [x <= split, x < split, x >= split, x > split, x == split, x != split]
    result = xp.zeros(x.shape, dtype=bool)
    for code, test in enumerate(tests):
        result = xp.where(mode == code, test, result)
    return result
