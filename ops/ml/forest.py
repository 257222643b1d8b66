"""The tree ensembles' shared form: every encoding (TreeEnsemble of ``ai.onnx.ml`` opset 5
here, TreeEnsembleClassifier/Regressor in ``ml_trees.py``) is turned once, at load, into one
flat node table (:class:`_Forest`) that the compiled walks of ``_jit_trees.py`` read.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.panels import native_parts
from mixrt.ops.compiled.parallel import intra_op_threads, parallel_for
from mixrt.ops.ir.node_state import cached as _cached
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.ml import walk_choice
from mixrt.ops.ml.ml import ML, _rows, post_transform_scores

# -- tree ensembles ---------------------------------------------------------------------
#
# Every encoding is first turned into one flat table: interior nodes and leaves share the
# index space, a leaf's mode is _LEAF, and each leaf's contribution to the targets is a row
# of `weights` (with `hit` saying which targets it touches, for MIN/MAX).

_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
          "BRANCH_MEMBER", "LEAF")
_MEMBER, _LEAF = 6, 7
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
# a rough count of node visits per tree and row, where the stepped walk's counts are not made
_STEPS_PER_TREE = 16
# steps of a walk (rows x a row's steps; ~2 ns each) from which it is split between threads:
# the native worker takes a part in ~5 us (ops/ml/_jit_tree_parts.py), a Python thread in 20-40
NATIVE_SPLIT_STEPS = 1 << 13
THREAD_SPLIT_STEPS = 1 << 17
SPLIT_ROWS = 4  # the fewest rows of a part (the stepped walk's, _jit_trees.STEPPED_FROM_ROWS)
STEPPED_FROM_ROWS = 4  # _jit_trees.STEPPED_FROM_ROWS (that module loads numba)
CHOSEN_FROM_ROWS = 1  # rows from which a batch times its walks (walk_choice.py)
BRANCHING_ROWS, BRANCHING_TREES = 4, 8  # _jit_trees's: added to ``uniform``, they pick its walk
_STEPS_AT = 5  # the stepped walk's step counts in walk_tables (roots, splits, links, members,
#                uniform mode, steps, ...)


class _Forest:
    def __init__(self, *, roots, features, splits, modes, true_next, false_next, tracks_true,
                 members, weights, hit):
        self.roots = np.asarray(roots, dtype=np.int64)
        self.features = np.asarray(features, dtype=np.int64)
        self.splits = np.asarray(splits, dtype=np.float64)
        self.modes = np.asarray(modes, dtype=np.int64)
        self.true_next = np.asarray(true_next, dtype=np.int64)
        self.false_next = np.asarray(false_next, dtype=np.int64)
        self.tracks_true = np.asarray(tracks_true, dtype=bool)
        self.members = members  # [node count, widest set], NaN-padded; row i for node i
        self.weights = weights  # [node count, targets]
        self.hit = hit
        self._sparse = {}  # precision -> the leaves' weights as the compiled walk reads them
        self._compilable = self._tables_in_range()
        self._feature_range = None  # (lowest, highest) feature an interior node reads
        self._packed = None  # the node records (_records)
        self._tables = {}  # precision -> every table the compiled walk reads, in its order
        self._row_steps = None  # a row's steps through the forest (_steps_per_row)
        self._stepped_tables = None  # the stepped walk's tables (_stepped), made once
        self._unstepped = {}  # precision -> the walk's tables without the stepped walk's
        self._depth_first_nodes = None  # the nodes in depth-first order (_depth_first)
        self._candidates = {}  # precision -> the walks' tables a batch chooses among
        self._choices = None  # which walk a batch takes (walk_choice.py), made when asked

    def _tables_in_range(self) -> bool:
        """Can the compiled walk (which does not check bounds) follow this table? Else the
        NumPy walk runs it, and raises where it always did."""
        count = len(self.modes)
        links = np.concatenate([self.roots, self.true_next, self.false_next])
        same_length = all(len(table) == count for table in (
            self.features, self.splits, self.true_next, self.false_next, self.tracks_true,
            self.members, self.weights))
        small = count < 2**31 and (not self.features.size or np.abs(self.features).max() < 2**31)
        return bool(count and same_length and small and links.min() >= 0
                    and links.max() < count)

    def _fits(self, width: int) -> bool:
        """Do the interior nodes' features index rows of ``width`` columns?"""
        low, high = self._feature_range_of()
        return low >= 0 and high < width

    def _feature_range_of(self) -> tuple[int, int]:
        if self._feature_range is None:
            interior = self.features[self.modes != _LEAF]
            self._feature_range = ((int(interior.min()), int(interior.max())) if interior.size
                                   else (0, -1))
        return self._feature_range

    def sums(self, xp, X, precision):
        """Each target's summed leaf weights [N, targets] in ``precision``, added tree by
        tree (onnxruntime's order), and whether any reached leaf weighs that target."""
        kernels = self._kernels(xp, X)
        if kernels is None:
            return _leaf_sums(xp, self, self.leaves(xp, X), precision)
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
            return self.aggregate(xp, self.leaves(xp, X), function)
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

    def walk_inputs(self, X, precision):
        """(X as the compiled walk reads it, the tables it walks in ``precision``)."""
        native = X.dtype in (np.float32, np.float64)
        data = X if native and X.flags.c_contiguous \
            else np.ascontiguousarray(X, dtype=X.dtype if native else np.float64)
        return data, self.walk_tables(precision)

    def walk_tables(self, precision) -> tuple:
        """Every table the compiled walk reads, in its order, the leaves in ``precision``."""
        tables = self._tables.get(precision)
        if tables is None:
            tables = self._tables[precision] = (self.roots, *self._records(), self.members,
                                                self._uniform_mode(), *self._stepped(),
                                                *self._leaf_table(precision))
        return tables

    def widest_row_read(self) -> int | None:
        """How many columns a row needs for every interior node's feature (None where some
        node reads a negative feature: no row fits)."""
        low, high = self._feature_range_of()
        return high + 1 if low >= 0 else None

    def alone_rows(self) -> int:
        """The most rows whose walk is one call on the calling thread whatever the pool
        (:meth:`walks_alone` without the thread count, which it reads only for larger
        batches)."""
        return max(2 * SPLIT_ROWS - 1, (NATIVE_SPLIT_STEPS - 1) // self._steps_per_row())

    def _steps_per_row(self) -> int:
        """A row's steps through the whole forest: the stepped walk's counts, else a rough
        count per tree."""
        if self._row_steps is None:
            steps = self._stepped()[0]
            self._row_steps = max(1, int(np.abs(steps).sum()) if steps.size
                                  else len(self.roots) * _STEPS_PER_TREE)
        return self._row_steps

    def _uniform_mode(self) -> int:
        """BRANCH_LEQ (0) or BRANCH_LT (1) when every branch has that mode (the compiled
        walk then compares without choosing the mode), else -1."""
        branch_modes = set(self.modes[self.modes != _LEAF].tolist())
        return branch_modes.pop() if branch_modes in ({0}, {1}) else -1

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
        native = jit_cpu.native_pool() if sums else None
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
        walk_choice.walk(choice, lambda index: self._walk_parts(
            kernel, data, candidates[index], rows, outputs, sums))

    def _walk_parts(self, kernel, data, tables, rows, outputs, sums):
        native, parts = self._split(rows, sums)
        if parts is None:  # a request's few rows: the call itself, no hand-out (~2 us)
            kernel(data, 0, rows, *tables, *outputs)
        elif native is None or not _native_walk(native, parts, data, tables, *outputs):
            parallel_for(parts, lambda start, stop: kernel(data, start, stop, *tables,
                                                           *outputs))

    def walk_choices(self):
        """The forest's choices of walk by batch size, or None where it has one walk only
        (its branches mix modes, or its table is not a set of trees)."""
        if not self._stepped()[0].size:
            return None
        if self._choices is None:
            walks = 2 if self._depth_first() is None else 4
            self._choices = walk_choice.WalkChoices(walks)
        return self._choices

    def walk_candidates(self, precision) -> tuple:
        """The tables of each walk a batch may take, in the order of a ``WalkChoice``'s
        indices: the stepped walk, the walk in step over a block of rows, and the branching
        walks row by row and tree by tree (``_jit_trees._branching_sums``) over the
        depth-first tables."""
        candidates = self._candidates.get(precision)
        if candidates is None:
            tables = self.walk_tables(precision)
            ordered = self._depth_first()
            branching = () if ordered is None else self._depth_first_tables(precision, ordered)
            uniform = tables[_STEPS_AT - 1]
            candidates = self._candidates[precision] = (
                tables, self._walk_tables_unstepped(precision, tables),
                *(branching[:_STEPS_AT - 1] + (uniform + code,) + branching[_STEPS_AT - 1:]
                  for code in (BRANCHING_ROWS, BRANCHING_TREES)
                  if branching))
        return candidates

    def _depth_first(self):
        """The reached nodes in depth-first order, each tree's false child right after its
        node (``_jit_trees._branching_sums``), or None where the forest has no stepped walk
        (mixed modes, a shared node or a cycle) or the order breaks that rule."""
        if self._depth_first_nodes is None:
            self._depth_first_nodes = self._order_depth_first() if self._stepped()[0].size \
                else np.zeros(0, np.int64)
        return self._depth_first_nodes if self._depth_first_nodes.size else None

    def _order_depth_first(self) -> np.ndarray:
        interior = (self.modes != _LEAF).tolist()
        true_next, false_next = self.true_next.tolist(), self.false_next.tolist()
        order = []
        for root in self.roots.tolist():
            stack = [root]
            while stack:
                node = stack.pop()
                order.append(node)
                if interior[node]:  # the false child is popped next: the following record
                    stack.append(true_next[node])
                    stack.append(false_next[node])
        order = np.array(order, np.int64)
        renumbered = np.full(len(self.modes), -1, np.int64)
        renumbered[order] = np.arange(order.size)
        inner = order[self.modes[order] != _LEAF]
        at = renumbered[inner]
        if np.unique(order).size != order.size or (renumbered[self.true_next[inner]] <= at).any() \
                or (renumbered[self.false_next[inner]] != at + 1).any():
            return np.zeros(0, np.int64)
        return order

    def _depth_first_tables(self, precision, order) -> tuple:
        """walk_tables over the nodes renumbered in ``order``: the roots, records, members and
        leaf table; the stepped walk's tables empty."""
        renumbered = np.full(len(self.modes), -1, np.int64)
        renumbered[order] = np.arange(order.size)
        leaves = self.modes[order] == _LEAF
        splits, links = self._pack_records(
            order, np.where(leaves, 0, renumbered[self.true_next[order]]),
            np.where(leaves, 0, renumbered[self.false_next[order]]))
        start, targets, values = self._leaf_table(precision)
        counts = np.diff(start)[order]
        moved = np.zeros(order.size + 1, np.int64)
        np.cumsum(counts, out=moved[1:])
        entries = np.repeat(start[order] - moved[:-1], counts) + np.arange(moved[-1])
        empty_steps = np.zeros(0, np.int64)
        return (renumbered[self.roots], splits, links, self.members[order], empty_steps, np.zeros((0, 4), np.int32), np.zeros(0),
                moved, targets[entries], values[entries])

    def _walk_tables_unstepped(self, precision, tables):
        """``tables`` with the stepped walk's step counts empty: the kernels then walk to
        each leaf (``_jit_trees.forest_sums``)."""
        unstepped = self._unstepped.get(precision)
        if unstepped is None:
            at = _STEPS_AT
            unstepped = self._unstepped[precision] = \
                tables[:at] + (np.zeros(0, np.int64),) + tables[at + 1:]
        return unstepped

    def _records(self):
        """The nodes as 24-byte records, two flat views of one buffer: float64 (the split
        at 3 i) and int32 (feature, mode | missing-tracks-true << 8, true and false child at
        6 i + 2..5)."""
        if self._packed is None:
            self._packed = self._pack_records(slice(None), self.true_next, self.false_next)
        return self._packed

    def _pack_records(self, nodes, true_next, false_next) -> tuple:
        """The records of ``nodes`` (an index or a slice of the node table) in that order,
        with these children (:meth:`_records`' layout)."""
        splits = np.zeros((len(self.modes[nodes]), 3))
        links = splits.view(np.int32)
        splits[:, 0] = self.splits[nodes]
        links[:, 2] = self.features[nodes]
        links[:, 3] = self.modes[nodes] | (self.tracks_true[nodes].astype(np.int64) << 8)
        links[:, 4], links[:, 5] = true_next, false_next
        return splits.reshape(-1), links.reshape(-1)

    def _stepped(self):
        """The stepped walk's tables (ops/ml/_jit_trees._stepped_sums), or three empty ones
        where the branches mix modes or the table is not a set of trees: each tree's step
        count (its depth; negated where its deepest leaf lies more than twice as deep as its
        leaves do on average, so the walk stops once no row moves), int32 records (feature,
        true child, false child, tracks missing values as true) in which a leaf reads
        feature 0 and leads to itself, and the split of every node."""
        if self._stepped_tables is not None:
            return self._stepped_tables
        leaves = self.modes == _LEAF
        steps = self._step_counts(leaves) if self._uniform_mode() >= 0 else None
        if steps is None:
            self._stepped_tables = (np.zeros(0, np.int64), np.zeros((0, 4), np.int32),
                                    np.zeros(0))
            return self._stepped_tables
        itself = np.arange(len(self.modes))
        records = np.empty((len(self.modes), 4), np.int32)
        records[:, 0] = np.where(leaves, 0, self.features)
        records[:, 1] = np.where(leaves, itself, self.true_next)
        records[:, 2] = np.where(leaves, itself, self.false_next)
        records[:, 3] = self.tracks_true & ~leaves
        self._stepped_tables = steps, records, np.where(leaves, 0.0, self.splits)
        return self._stepped_tables

    def _step_counts(self, leaves) -> np.ndarray | None:
        """Each tree's depth, negated where its deepest leaf is over twice its leaves'
        mean depth (see :meth:`_stepped`); None unless every node the roots reach is
        reached once (a root, or one interior node's child): a shared node or a cycle is
        walked as the NumPy tier walks it, by the walk that stops at leaves."""
        interior = ~leaves
        parents = np.bincount(np.concatenate([self.roots, self.true_next[interior],
                                              self.false_next[interior]]),
                              minlength=len(self.modes))
        if parents.max(initial=0) > 1:
            return None
        tree_of = np.zeros(len(self.modes), np.int64)
        depth_of = np.zeros(len(self.modes), np.int64)
        visited = np.zeros(len(self.modes), bool)
        level, depth = self.roots, 0
        tree_of[level] = np.arange(len(self.roots))
        while level.size:  # in-degree <= 1 from the roots: no cycle, at most every node
            depth_of[level], visited[level] = depth, True
            inner = level[interior[level]]
            children = np.concatenate([self.true_next[inner], self.false_next[inner]])
            tree_of[children] = np.tile(tree_of[inner], 2)
            level, depth = children, depth + 1
        reached_leaves = np.flatnonzero(leaves & visited)
        trees = tree_of[reached_leaves]
        deepest = np.zeros(len(self.roots), np.int64)
        np.maximum.at(deepest, trees, depth_of[reached_leaves])
        count = np.bincount(trees, minlength=len(self.roots))
        mean = np.bincount(trees, depth_of[reached_leaves], len(self.roots)) / np.maximum(count, 1)
        return np.where(deepest > 2 * mean, -deepest, deepest)

    def _leaf_table(self, precision):
        """The leaves' weights, sparse: node i's entries are [start[i], start[i + 1]) of
        (targets, values), the dense table's hit entries in ``precision``."""
        key = np.dtype(precision)
        if key not in self._sparse:
            nodes, targets = np.nonzero(self.hit)
            start = np.zeros(len(self.modes) + 1, dtype=np.int64)
            np.cumsum(np.bincount(nodes, minlength=len(self.modes)), out=start[1:])
            values = np.ascontiguousarray(self.weights[nodes, targets], dtype=precision)
            self._sparse[key] = (start, targets.astype(np.int64), values)
        return self._sparse[key]

    def leaves(self, xp, X):
        """The leaf each sample reaches in each tree: [N, trees]."""
        table = {name: xp.asarray(getattr(self, name)) for name in (
            "features", "splits", "modes", "true_next", "false_next", "tracks_true", "members")}
        data = X.astype(np.float64)
        node = xp.broadcast_to(xp.asarray(self.roots), (X.shape[0], len(self.roots))).copy()
        for _ in range(len(self.modes)):  # a path never visits a node twice
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
    module = jit_cpu.load("mixrt.ops.ml._jit_tree_parts")
    entry = None if module is None else \
        module.ENTRIES.get((data.dtype.char, total.dtype.char))
    if entry is None:
        return False
    (roots, splits, links, members, uniform, steps, records, thresholds, leaf_start,
     leaf_targets, leaf_values) = tables
    arrays = (data, roots, splits, links, members, steps, records, thresholds, leaf_start,
              leaf_targets, leaf_values, total, reached)
    bounds = [start for start, _ in parts] + [parts[-1][1]]
    words = np.array([0, *(extent for array in arrays for extent in array.shape), uniform,
                      *bounds], np.int64)
    words[0] = words.size
    addresses = np.empty(len(arrays) + 1, np.uint64)
    native_parts.fill_addresses(addresses, (words,) + arrays)
    jit_cpu.note_native_job()
    jit_cpu.panel_kernels().native_for(native.block, entry.address, addresses, len(parts))
    return True


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


def _member_table(modes, membership_values):
    """One NaN-padded row of members per node; the sets, NaN-separated in
    membership_values, belong to the BRANCH_MEMBER nodes in order."""
    sets, current = [], []
    for v in (np.asarray(membership_values, dtype=np.float64).tolist()
              if membership_values is not None else []):
        if v != v:
            sets.append(current)
            current = []
        else:
            current.append(v)
    if current:
        sets.append(current)
    table = np.full((len(modes), max([len(s) for s in sets] + [1])), np.nan)
    member_nodes = [i for i, m in enumerate(modes) if m == _MEMBER]
    for node, members in zip(member_nodes, sets):
        table[node, :len(members)] = members
    return table


def _forest_v5(*, leaf_targetids, leaf_weights, membership_values, n_targets, nodes_falseleafs,
               nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true,
               nodes_modes, nodes_splits, nodes_trueleafs, nodes_truenodeids, tree_roots):
    n_nodes, n_leaves = len(nodes_featureids), len(leaf_targetids)
    targets = int(n_targets) if n_targets is not None else int(max(leaf_targetids)) + 1
    modes = np.asarray(nodes_modes).reshape(-1).astype(np.int64).tolist() + [_LEAF] * n_leaves

    def next_positions(ids, to_leaf):  # leaves are numbered after the interior nodes
        return [n_nodes + i if leaf else i for i, leaf in zip(ids, to_leaf)] + [0] * n_leaves

    weights = np.zeros((n_nodes + n_leaves, targets))
    hit = np.zeros(weights.shape, dtype=bool)
    leaf_rows = n_nodes + np.arange(n_leaves)
    np.add.at(weights, (leaf_rows, np.asarray(leaf_targetids)),
              np.asarray(leaf_weights, dtype=np.float64).reshape(-1))
    hit[leaf_rows, np.asarray(leaf_targetids)] = True
    tracks = list(nodes_missing_value_tracks_true or [0] * n_nodes) + [0] * n_leaves
    return _Forest(
        roots=tree_roots, features=list(nodes_featureids) + [0] * n_leaves,
        splits=np.asarray(nodes_splits, dtype=np.float64).reshape(-1).tolist() + [0] * n_leaves,
        modes=modes, true_next=next_positions(nodes_truenodeids, nodes_trueleafs),
        false_next=next_positions(nodes_falsenodeids, nodes_falseleafs), tracks_true=tracks,
        members=_member_table(modes, membership_values), weights=weights, hit=hit)


@op("TreeEnsemble", since=5, domain=ML, dtypes=frozenset({"float16", "float32", "float64"}))
def tree_ensemble(xp, X, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None,
                  membership_values=None, n_targets=None, nodes_falseleafs=None,
                  nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                  nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                  nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0,
                  tree_roots=None, _node=None):
    forest = _cached(_node, lambda: _forest_v5(
        leaf_targetids=leaf_targetids, leaf_weights=leaf_weights,
        membership_values=membership_values, n_targets=n_targets,
        nodes_falseleafs=nodes_falseleafs, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_splits=nodes_splits, nodes_trueleafs=nodes_trueleafs,
        nodes_truenodeids=nodes_truenodeids, tree_roots=tree_roots))
    scores = forest.aggregate_rows(xp, _rows(X), _AGGREGATES[aggregate_function])
    return post_transform_scores(xp, scores, post_transform).astype(X.dtype)


@tree_ensemble.infer
def _(X, *, n_targets=None, leaf_targetids=None, **_):
    if n_targets is None and leaf_targetids is not None:
        n_targets = int(max(leaf_targetids)) + 1
    batch = X.shape[0] if X.shape is not None and len(X.shape) > 1 else None
    return [TensorType(X.dtype, (batch, n_targets))]


def _forest_from_node_ids(*, treeids, nodeids, featureids, modes, values, truenodeids,
                          falsenodeids, missing_tracks_true, leaf_treeids, leaf_nodeids,
                          leaf_ids, leaf_weights, n_outputs, leaf_prefix="target_"):
    """The (tree id, node id) encoding of TreeEnsembleRegressor/Classifier: node ids restart
    at 0 (the root) in every tree, and a leaf may feed several targets/classes (its weights
    are the ``leaf_prefix`` attributes: target_* or class_*). Inconsistent attributes raise a
    ValueError naming the attribute."""
    _same_lengths("nodes_", treeids=treeids, nodeids=nodeids, featureids=featureids,
                  modes=modes, values=values, truenodeids=truenodeids,
                  falsenodeids=falsenodeids)
    if missing_tracks_true:
        _same_lengths("nodes_", treeids=treeids, missing_value_tracks_true=missing_tracks_true)
    _same_lengths(leaf_prefix, treeids=leaf_treeids, nodeids=leaf_nodeids, ids=leaf_ids,
                  weights=leaf_weights)
    position = {}
    for i, key in enumerate(zip(treeids, nodeids)):
        if position.setdefault(key, i) != i:
            raise ValueError(f"nodes_nodeids: node {key[1]} appears twice in tree {key[0]}")
    codes = _mode_codes(modes)

    def at(tree, node, attribute):
        if (tree, node) not in position:
            raise ValueError(f"{attribute}: tree {tree} has no node {node}")
        return position[tree, node]

    def next_positions(children, attribute):
        return [at(t, c, attribute) if code != _LEAF else i
                for i, (t, c, code) in enumerate(zip(treeids, children, codes))]

    ids = np.asarray(leaf_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= n_outputs):
        raise ValueError(f"{leaf_prefix}ids: {int(ids.min() if ids.min() < 0 else ids.max())} "
                         f"is out of range for {n_outputs} output(s)")
    weights = np.zeros((len(codes), n_outputs))
    hit = np.zeros(weights.shape, dtype=bool)
    rows = [at(t, n, f"{leaf_prefix}nodeids") for t, n in zip(leaf_treeids, leaf_nodeids)]
    values_at_leaves = np.asarray([] if leaf_weights is None else leaf_weights, np.float64)
    np.add.at(weights, (rows, ids), values_at_leaves.reshape(-1))
    hit[rows, ids] = True
    return _Forest(
        roots=[at(t, 0, "nodes_nodeids") for t in dict.fromkeys(treeids)],
        features=featureids, splits=np.asarray(values, dtype=np.float64).reshape(-1),
        modes=codes, true_next=next_positions(truenodeids, "nodes_truenodeids"),
        false_next=next_positions(falsenodeids, "nodes_falsenodeids"),
        tracks_true=missing_tracks_true or [0] * len(codes),
        members=np.full((len(codes), 1), np.nan), weights=weights, hit=hit)


def _same_lengths(prefix: str, **lists) -> None:
    """Parallel attribute lists (``nodes_*``, ``class_*``, ...) must have one length."""
    lengths = {f"{prefix}{name}": len(np.asarray(v).reshape(-1)) if v is not None else 0
               for name, v in lists.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise ValueError(f"{prefix}* attributes must have one length: {listed}")


def _mode_codes(modes) -> list[int]:
    """nodes_modes as codes; BRANCH_MEMBER exists only in TreeEnsemble-5."""
    codes = []
    for mode in modes:
        name = mode.decode() if isinstance(mode, bytes) else mode
        if name not in _MODES or name == "BRANCH_MEMBER":
            allowed = ", ".join(m for m in _MODES if m != "BRANCH_MEMBER")
            raise ValueError(f"nodes_modes: unknown mode {name!r}; expected one of {allowed}")
        codes.append(_MODES.index(name))
    return codes


def _either(listed, as_tensor):
    return as_tensor if as_tensor is not None else listed


