"""A tree ensemble's flat node table (:class:`_ForestTables`, the base of ``forest_walks``'s
``_Forest``) and the tables the compiled walks of ``_jit_trees.py`` read, laid out from it:
node records, the stepped walk's step counts and records, the depth-first tables of the
branching walks, and the leaves' weights as sparse rows. Every encoding (``forest.py``,
``ml_trees.py``) makes one; the walks (``forest_walks.py``) and a request's prepared call
(``tree_requests.py``) read the tables.
"""

from __future__ import annotations

import numpy as np

# -- tree ensembles ---------------------------------------------------------------------
#
# Every encoding is first turned into one flat table: interior nodes and leaves share the
# index space, a leaf's mode is _LEAF, and each leaf's contribution to the targets is a row
# of `weights` (with `hit` saying which targets it touches, for MIN/MAX).

_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
          "BRANCH_MEMBER", "LEAF")
_MEMBER, _LEAF = 6, 7
BRANCHING_ROWS, BRANCHING_TREES = 4, 8  # _jit_trees's: added to ``uniform``, they pick its walk
_STEPS_AT = 5  # the stepped walk's step counts in walk_tables (roots, splits, links, members,
#                uniform mode, steps, ...)


class _ForestTables:
    """The flat node table of a tree ensemble, and every table the compiled walks
    (``ops/ml/_jit_trees.py``) read, laid out from it when first asked for and kept: the
    node records, the stepped walk's tables, the depth-first tables of the branching walks
    and the leaves' sparse weights. :class:`forest_walks._Forest` walks them."""

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
        self._tree_bounds = {}  # parts -> the trees' bounds of a walk split by trees
        self._fits_core_cache = None  # do the records fit a core's own cache? (asked once)
        self._split_calls = {}  # (thread, tables, batch shape, dtypes) -> tree_split_calls

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

    def widest_row_read(self) -> int | None:
        """How many columns a row needs for every interior node's feature (None where some
        node reads a negative feature: no row fits)."""
        low, high = self._feature_range_of()
        return high + 1 if low >= 0 else None

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

    def _uniform_mode(self) -> int:
        """BRANCH_LEQ (0) or BRANCH_LT (1) when every branch has that mode (the compiled
        walk then compares without choosing the mode), else -1."""
        branch_modes = set(self.modes[self.modes != _LEAF].tolist())
        return branch_modes.pop() if branch_modes in ({0}, {1}) else -1

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
        return (renumbered[self.roots], splits, links, self.members[order], empty_steps,
                np.zeros((0, 4), np.int32), np.zeros(0), moved, targets[entries],
                values[entries])

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
