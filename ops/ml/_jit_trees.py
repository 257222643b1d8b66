"""Tree-ensemble traversal compiled by numba (``ops/ml/ml_trees.py``): per row, per tree, walk
from the root to a leaf and add that leaf's weights to the row's scores.

The NumPy tier walks every row of every tree at once, level by level: ~15 array operations
per level, so a 100-tree forest of depth 20 costs thousands of NumPy calls for one row. Here
a row's walk is a few loads per node.

The node table is the one ``ops/ml/forest._Forest`` builds (interior nodes and leaves share the
index space, a leaf's mode is ``LEAF``), packed one node to a 24-byte record (split, feature, mode
with the missing-value flag, children) so that a step reads one cache line rather than one per
array (an extra-trees forest's row 7 -> 2 us); a leaf's weights are given sparsely (``leaf_start``
into ``leaf_targets``/``leaf_values``, the nonzero-or-hit entries of the dense table), which adds
the same values in the same order as the NumPy tier's dense rows (adding the dense table's zeros
changes nothing), so both tiers give identical scores. Comparisons are in float64, as the NumPy
tier converts its input.
"""

from __future__ import annotations

import numpy as np
from numba import float64, njit, uint64

LEAF = 7  # ops/ml/forest._MODES
MEMBER = 6
# a node record's int32 slots (after its float64 split, slots 0-1): ops/ml/forest._Forest.records
FEATURE, MODE, TRUE_NEXT, FALSE_NEXT = 2, 3, 4, 5

_jit = njit(nogil=True, cache=True, boundscheck=False)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _leaf(data, row, node, splits, links, members):
    """The node a row reaches from ``node``; at most one step per
    node, as the NumPy walk (a malformed table with a cycle stops where the NumPy walk
    stops). ``splits`` and ``links`` are flat views of the same 24-byte records (see
    ``ops/ml/forest._Forest.records``), indexed unsigned (see ``ops/compiled/jit_cpu.py``)."""
    for _ in range(splits.shape[0] // 3):
        at = uint64(node) * uint64(6)
        mode_word = links[at + MODE]
        mode = mode_word & 255
        if mode == LEAF:
            break
        x = float64(data[uint64(row), uint64(links[at + FEATURE])])
        split = splits[at >> uint64(1)]
        if mode == 0:
            go_true = x <= split
        elif mode == 1:
            go_true = x < split
        elif mode == 2:
            go_true = x >= split
        elif mode == 3:
            go_true = x > split
        elif mode == 4:
            go_true = x == split
        elif mode == 5:
            go_true = x != split
        elif mode == MEMBER:
            go_true = False
            for j in range(members.shape[1]):
                if x == members[node, j]:
                    go_true = True
                    break
        else:
            go_true = False
        # a NaN follows the true branch where its node tracks missing values there
        if not go_true and x != x and mode_word >> 8:
            go_true = True
        node = links[at + TRUE_NEXT] if go_true else links[at + FALSE_NEXT]
    return node


@_jit
def forest_sums(data, start, stop, roots, splits, links, members, uniform, steps, records,
                thresholds, leaf_start, leaf_targets, leaf_values, total, reached):
    """Rows [start, stop): ``total[row, target]`` += every reached leaf's weight for the
    target, tree by tree (the NumPy tier's order), and ``reached`` marks the targets a
    reached leaf weighs. ``steps``, ``records`` and ``thresholds``: the stepped walk's tables
    (``ops/ml/forest._Forest._stepped``), empty where the forest mixes branch modes."""
    if uniform >= BRANCHING_ROWS:  # the depth-first tables (ops/ml/forest._depth_first)
        _branching_sums(data, start, stop, roots, splits, links, (uniform & 1) == 1,
                        uniform >= BRANCHING_TREES, leaf_start, leaf_targets, leaf_values,
                        total, reached)
        return
    if uniform >= 0 and stop - start >= STEPPED_FROM_ROWS and steps.shape[0]:
        _stepped_sums(data, start, stop, roots, steps, records, thresholds, uniform == 1,
                      leaf_start, leaf_targets, leaf_values, total, reached)
        return
    if uniform >= 0:
        _uniform_sums(data, start, stop, roots, splits, links, uniform == 1, leaf_start,
                      leaf_targets, leaf_values, total, reached)
        return
    for row in range(start, stop):
        for tree in range(roots.shape[0]):
            leaf = _leaf(data, row, roots[tree], splits, links, members)
            for k in range(leaf_start[leaf], leaf_start[leaf + 1]):
                target = leaf_targets[k]
                total[row, target] += leaf_values[k]
                reached[row, target] = True


# -- the branching walks: one row's path at a time, over depth-first tables ------------------
#
# Each tree is laid out depth first (``ops/ml/forest._Forest._depth_first``): a node's false
# child is the next record, its true child a later one. A step then either loads the true
# child's index or adds one, so the compiled loop keeps a real branch rather than a select:
# where the core predicts that branch (a caller that sends the same rows again, a benchmark's
# fixed feeds, or forests whose paths it learns) the next step's loads start before this
# step's comparison is known, as onnxruntime's walk does. Taken tree by tree (each tree over
# the rows) the predictor sees one tree's pattern at a time: 64 repeated rows of a 100-tree
# LightGBM forest 75 us on one thread, where the stepped walk took 184 and the walk above 128
# (onnxruntime 59). Taken row by row it was the fastest with rows that change on LightGBM's and
# scikit-learn's boosted forests (LightGBM: 109 us, stepped 181, onnxruntime 203), and slower
# on the deeper random forests. Which one a batch takes is the clock's choice
# (``ops/ml/walk_choice.py``). Depth first, every step goes to a later record, so a walk ends.

BRANCHING_ROWS = 4  # added to ``uniform``: forest_sums walks depth-first tables row by row
BRANCHING_TREES = 8  # ... tree by tree


@_jit
def _branching_sums(data, start, stop, roots, splits, links, less, by_tree, leaf_start,
                    leaf_targets, leaf_values, total, reached):
    """forest_sums of a uniform forest over its depth-first tables: each row adds its trees'
    leaves in tree order, as every walk does, so the sums are the same bits."""
    if by_tree:
        for tree in range(roots.shape[0]):
            root = uint64(roots[tree])
            for row in range(start, stop):
                _add_leaf(uint64(row), _branching_leaf(data, uint64(row), root, splits, links,
                                                       less),
                          leaf_start, leaf_targets, leaf_values, total, reached)
        return
    for row in range(start, stop):
        for tree in range(roots.shape[0]):
            _add_leaf(uint64(row), _branching_leaf(data, uint64(row), uint64(roots[tree]),
                                                   splits, links, less),
                      leaf_start, leaf_targets, leaf_values, total, reached)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _branching_leaf(data, row, node, splits, links, less):
    """The leaf a row reaches from ``node`` in depth-first tables (indices unsigned: a signed
    index made numba check for negative ones at every load). A NaN follows the true branch
    where its node tracks missing values there."""
    while True:
        at = node * uint64(6)
        mode_word = links[at + uint64(MODE)]
        if (mode_word & 255) == LEAF:
            return node
        x = float64(data[row, uint64(links[at + uint64(FEATURE)])])
        split = splits[at >> uint64(1)]
        if (x < split) if less else (x <= split):
            node = uint64(links[at + uint64(TRUE_NEXT)])
        elif x != x and mode_word >> 8:
            node = uint64(links[at + uint64(TRUE_NEXT)])
        else:
            node += uint64(1)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _add_leaf(row, node, leaf_start, leaf_targets, leaf_values, total, reached):
    for k in range(leaf_start[node], leaf_start[node + uint64(1)]):
        target = leaf_targets[k]
        total[row, target] += leaf_values[k]
        reached[row, target] = True


# -- the stepped walk: rows side by side, a fixed number of steps per tree -------------------
#
# A walk that stops at its leaf branches on every step of every row (is it a leaf? which
# child?), and with inputs that change from call to call those branches are a coin toss: a
# LightGBM forest of depth 14 took ~5 ns a step. Here a leaf leads to itself, so every row of a
# block can take the tree's depth in steps with nothing to decide: each step is loads, one
# comparison and a select, and the block's rows are independent chains the core overlaps. Rows
# that reach a shallow leaf early step in place (a tree as deep as it is wide costs ~2x the
# steps a walk would take, still ~2x faster: 64 rows of that forest 345 -> 160 us,
# scikit-learn's 100-tree forest 632 -> 325; 4 rows 21 -> 14 us and 44 -> 31). A tree whose
# deepest leaf is far below its others (``steps`` negative) stops as soon as no row of the block
# moved. Fewer rows keep the walk that stops at leaves: alone, a row has no chains to overlap
# (one changing row of that forest: 8.2 us walked, 9.6 stepped), two or three about break even
# when their values change, and a caller that sends the same rows again (a benchmark) has its
# branches predicted (two rows of it: 5.6 us walked, 11.4 stepped).

STEPPED_FROM_ROWS = 4  # rows of a call from which the walk is stepped
STEPPED_BLOCK = 64  # rows stepped side by side
# a stepped record's int32 slots (ops/ml/forest._Forest._stepped)
STEP_FEATURE, STEP_TRUE, STEP_FALSE, STEP_TRACKS = 0, 1, 2, 3


@_jit
def _stepped_sums(data, start, stop, roots, steps, records, thresholds, less, leaf_start,
                  leaf_targets, leaf_values, total, reached):
    """forest_sums of a forest whose branches all have one mode (BRANCH_LT where ``less``,
    else BRANCH_LEQ), as the stepped walk: the same leaves, added in the same order."""
    nodes = np.empty(STEPPED_BLOCK, np.int32)
    for first in range(start, stop, STEPPED_BLOCK):
        count = min(STEPPED_BLOCK, stop - first)
        for tree in range(roots.shape[0]):
            for r in range(count):
                nodes[r] = roots[tree]
            depth = steps[tree]
            if depth >= 0:
                for _ in range(depth):
                    _step(data, first, count, nodes, records, thresholds, less)
            else:
                for _ in range(-depth):
                    if not _step(data, first, count, nodes, records, thresholds, less):
                        break
            for r in range(count):
                node = nodes[r]
                row = first + r
                for k in range(leaf_start[node], leaf_start[node + 1]):
                    target = leaf_targets[k]
                    total[row, target] += leaf_values[k]
                    reached[row, target] = True


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _step(data, first, count, nodes, records, thresholds, less):
    """One step of the block's ``count`` rows from ``nodes``; whether any row moved. A NaN
    follows the true branch where its node tracks missing values there."""
    moved = 0
    for r in range(count):
        node = nodes[r]
        x = float64(data[uint64(first + r), uint64(records[node, STEP_FEATURE])])
        split = thresholds[node]
        go_true = (x < split) if less else (x <= split)
        go_true = go_true | ((x != x) & (records[node, STEP_TRACKS] != 0))
        following = records[node, STEP_TRUE] if go_true else records[node, STEP_FALSE]
        moved |= following ^ node
        nodes[r] = following
    return moved != 0


# rows walked side by side through one tree in _uniform_sums: a walk is a chain of dependent
# loads, and several rows' chains overlap their cache misses and mispredicted branches
ROW_BLOCK = 8


@_jit
def _uniform_sums(data, start, stop, roots, splits, links, less, leaf_start, leaf_targets,
                  leaf_values, total, reached):
    """forest_sums where every branch is BRANCH_LEQ (``less`` False: scikit-learn,
    LightGBM) or BRANCH_LT (True: XGBoost): the walk compares without choosing the mode,
    written out in the tree loop (a 500-tree LightGBM forest, one row: 19.8 -> 14.4 us; the
    same steps through :func:`_leaf`, or a helper per walk, stayed at 14-21). ROW_BLOCK rows
    walk each tree together, one step each in turn; every row still adds its trees' leaves
    in tree order, so the sums are the same bits."""
    limit = splits.shape[0] // 3
    nodes = np.empty(ROW_BLOCK, np.int64)
    for first in range(start, stop, ROW_BLOCK):
        count = min(ROW_BLOCK, stop - first)
        for tree in range(roots.shape[0]):
            for r in range(count):
                nodes[r] = roots[tree]
            for _ in range(limit):  # the steps _leaf takes (a cycle stops where it stops)
                moving = False
                for r in range(count):
                    node = nodes[r]
                    at = uint64(node) * uint64(6)
                    mode_word = links[at + MODE]
                    if (mode_word & 255) == LEAF:
                        continue
                    moving = True
                    x = float64(data[uint64(first + r), uint64(links[at + FEATURE])])
                    split = splits[at >> uint64(1)]
                    go_true = x < split if less else x <= split
                    if not go_true and x != x and mode_word >> 8:
                        go_true = True
                    nodes[r] = links[at + TRUE_NEXT] if go_true else links[at + FALSE_NEXT]
                if not moving:
                    break
            # the leaves' weights, as forest_sums adds them (written out in both loops: as
            # an inline helper the generic walk went from 19 to 29 us on that forest)
            for r in range(count):
                node = nodes[r]
                row = first + r
                for k in range(leaf_start[node], leaf_start[node + 1]):
                    target = leaf_targets[k]
                    total[row, target] += leaf_values[k]
                    reached[row, target] = True


@_jit
def forest_extremes(data, start, stop, roots, splits, links, members, uniform, steps, records,
                    thresholds, leaf_start, leaf_targets, leaf_values, best, take_max):
    """(``uniform`` and the stepped tables are forest_sums's, unused here: the tables
    travel as one tuple.)

    Rows [start, stop): ``best[row, target]`` becomes the minimum (maximum with
    ``take_max``) of its start value and every reached leaf's weight for the target; a NaN
    wins and stays, as with np.minimum/np.maximum."""
    for row in range(start, stop):
        for tree in range(roots.shape[0]):
            leaf = _leaf(data, row, roots[tree], splits, links, members)
            for k in range(leaf_start[leaf], leaf_start[leaf + 1]):
                target = leaf_targets[k]
                current, value = best[row, target], leaf_values[k]
                if current != current:
                    continue
                if value != value or (value > current if take_max else value < current):
                    best[row, target] = value


# -- a classifier's scores from the summed leaves ---------------------------------------------
#
# ops/ml/ml_trees.py's NumPy forms, row by row, for the post-transforms every converter writes
# (NONE, LOGISTIC, SOFTMAX): at batch 1 the NumPy forms were ~15 array calls of ~1 us each,
# more than the forest's walk. The arithmetic is theirs, in float32 where they cast to it.

NONE, LOGISTIC, SOFTMAX = 0, 1, 2  # the codes ops/ml/ml_trees.COMPILED_TRANSFORMS gives
_ONE = np.float32(1.0)


@njit(nogil=True, cache=True, inline="always")
def _logistic32(x):
    return _ONE / (_ONE + np.exp(-x))


@_jit
def two_class_scores(raw, has, base, binary_case, all_positive, transform, positive, scores):
    """ops/ml/ml_trees._two_classes for rows of ``raw``/``has`` [N, 2]: ``positive`` [N] gets
    0/1 (the label's index, or with no binary case the label value), ``scores`` [N, 2]
    float32 the columns. A row whose single column onnxruntime leaves unwritten gets NaN."""
    zero = raw.dtype.type(0)
    for row in range(raw.shape[0]):
        s0, s1 = raw[row, 0], raw[row, 1]
        h0, h1 = has[row, 0], has[row, 1]
        pair = h1
        if base.shape[0] == 2:
            shifted = base[1] + s0
            if h1:
                s1, s0 = shifted, -shifted
            else:
                s1, s0 = s1 + base[1], s0 + base[0]
            pair = True
        elif base.shape[0] == 1:
            s0 = s0 + base[0]
        read0 = s0 if h0 else zero
        score = s1 if (pair and h1) else read0
        if binary_case:
            positive[row] = 1 if score > (0.5 if all_positive else 0.0) else 0
            mirrored = not all_positive
        else:
            positive[row] = 1 if score > 0 else 0
            mirrored = base.shape[0] != 1
        if pair:
            _pair_columns(np.float32(read0), np.float32(s1 if h1 else zero), transform,
                          scores, row)
        else:
            _single_columns(np.float32(read0), transform, mirrored, binary_case, scores, row)


@njit(nogil=True, cache=True, inline="always")
def _pair_columns(a, b, transform, scores, row):
    if transform == LOGISTIC:
        a, b = _logistic32(a), _logistic32(b)
    elif transform == SOFTMAX:
        top = a if (a > b or a != a) else b
        a, b = np.exp(a - top), np.exp(b - top)
        total = a + b
        a, b = a / total, b / total
    scores[row, 0], scores[row, 1] = a, b


@njit(nogil=True, cache=True, inline="always")
def _single_columns(s, transform, mirrored, binary_case, scores, row):
    if not binary_case and not mirrored:
        scores[row, 0], scores[row, 1] = s, np.float32(np.nan)
    elif transform == LOGISTIC:
        scores[row, 0], scores[row, 1] = _logistic32(-s), _logistic32(s)
    elif mirrored:
        scores[row, 0], scores[row, 1] = -s, s
    else:
        scores[row, 0], scores[row, 1] = _ONE - s, s


@_jit
def many_class_scores(raw, has, base, transform, chosen, scores):
    """ops/ml/ml_trees._multiclass for rows of ``raw``/``has`` [N, classes]: base values added
    (a class they reach counts as scored), ``chosen`` the best scored class (the first on
    ties, the first NaN if any), ``scores`` the float32 scores post-transformed, an unscored
    class reading 0."""
    classes, based = raw.shape[1], base.shape[0]
    for row in range(raw.shape[0]):
        best, best_value, first_nan = 0, -np.inf, -1
        for j in range(classes):
            # widened once, after the float32 sum: a float32 value that meets the float64
            # -inf below cost float32 rows twice float64's time (a decision tree's 2,308
            # rows of 10 classes: 116 -> 57 us, 2026-11-27)
            if j < based:
                value, scored = np.float64(raw[row, j] + base[j]), True
            else:
                value, scored = np.float64(raw[row, j]), has[row, j]
            scores[row, j] = np.float32(value) if scored else np.float32(0.0)
            candidate = value if scored else -np.inf
            # the best as selects, not a branch on the data (a random class wins each row:
            # 58 -> 27 us for those rows), the first NaN apart
            better = candidate > best_value
            best = j if better else best
            best_value = candidate if better else best_value
            if candidate != candidate and first_nan < 0:
                first_nan = j
        chosen[row] = first_nan if first_nan >= 0 else best
        transform_row(scores, row, classes, transform)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def transform_row(scores, row, width, transform):
    """Row ``row`` of float32 ``scores`` post-transformed in place: LOGISTIC per value, or
    SOFTMAX shifted by the row's max (the first NaN if any), as the NumPy forms compute
    them (NONE leaves it). Also ops/ml/_jit_ml.py's linear classifier's."""
    if transform == LOGISTIC:
        for j in range(width):
            scores[row, j] = _logistic32(scores[row, j])
    elif transform == SOFTMAX:
        top = scores[row, 0]
        for j in range(1, width):
            if scores[row, j] > top or scores[row, j] != scores[row, j]:
                top = scores[row, j]
        total = np.float32(0.0)
        for j in range(width):
            scores[row, j] = np.exp(scores[row, j] - top)
            total += scores[row, j]
        for j in range(width):
            scores[row, j] = scores[row, j] / total


# -- a request's classification in one call ----------------------------------------------------
#
# For a few rows the walk and the scores above were two calls, four allocations and their
# Python between them: ~6 us of a one-tree classifier's ~14 us run. The same functions, in
# the same order, from one compiled call.

@_jit
def classify_two(data, roots, splits, links, members, uniform, steps, records, thresholds,
                 leaf_start, leaf_targets, leaf_values, targets, base, binary_case, all_positive,
                 transform, positive, scores):
    """forest_sums over every row of ``data`` into fresh totals, then two_class_scores."""
    rows = data.shape[0]
    total = np.zeros((rows, targets), leaf_values.dtype)
    reached = np.zeros((rows, targets), np.bool_)
    forest_sums(data, 0, rows, roots, splits, links, members, uniform, steps, records,
                thresholds, leaf_start, leaf_targets, leaf_values, total, reached)
    two_class_scores(total, reached, base, binary_case, all_positive, transform, positive,
                     scores)


@_jit
def classify_many(data, roots, splits, links, members, uniform, steps, records, thresholds,
                  leaf_start, leaf_targets, leaf_values, base, transform, chosen, scores):
    """forest_sums over every row of ``data`` into fresh totals, then many_class_scores."""
    rows = data.shape[0]
    total = np.zeros((rows, scores.shape[1]), leaf_values.dtype)
    reached = np.zeros((rows, scores.shape[1]), np.bool_)
    forest_sums(data, 0, rows, roots, splits, links, members, uniform, steps, records,
                thresholds, leaf_start, leaf_targets, leaf_values, total, reached)
    many_class_scores(total, reached, base, transform, chosen, scores)


@_jit
def regress(data, roots, splits, links, members, uniform, steps, records, thresholds,
            leaf_start, leaf_targets, leaf_values, average, base, values):
    """A regressor's SUM or AVERAGE (``average``) scores for every row of ``data``, plus
    ``base`` (empty, one value for every target, or one per target), into float32
    ``values`` [rows, targets]: ops/ml/ml_trees._Regressor's float64 arithmetic in its
    order (sums tree by tree, the division, the base) before the one rounding to float32."""
    rows, targets = values.shape
    total = np.zeros((rows, targets), np.float64)
    reached = np.zeros((rows, targets), np.bool_)
    forest_sums(data, 0, rows, roots, splits, links, members, uniform, steps, records,
                thresholds, leaf_start, leaf_targets, leaf_values, total, reached)
    regressed(total, roots.shape[0], average, base, values)


@_jit
def regressed(total, trees, average, base, values):
    """regress's scores from a forest's float64 sums ``total`` over ``trees`` trees."""
    rows, targets = values.shape
    for row in range(rows):
        for target in range(targets):
            value = total[row, target]
            if average:
                value = value / trees
            if base.shape[0] == 1:
                value = value + base[0]
            elif base.shape[0] > 1:
                value = value + base[target]
            values[row, target] = np.float32(value)
