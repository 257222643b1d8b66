"""Tree-ensemble traversal compiled by numba (``ops/ml_trees.py``): per row, per tree, walk
from the root to a leaf and add that leaf's weights to the row's scores.

The NumPy tier walks every row of every tree at once, level by level: ~15 array operations
per level, so a 100-tree forest of depth 20 costs thousands of NumPy calls for one row. Here
a row's walk is a few loads per node.

The node table is the one ``ops/ml._Forest`` builds (interior nodes and leaves share the
index space, a leaf's mode is ``LEAF``); a leaf's weights are given sparsely (``leaf_start``
into ``leaf_targets``/``leaf_values``, the nonzero-or-hit entries of the dense table), which
adds the same values in the same order as the NumPy tier's dense rows (adding the dense
table's zeros changes nothing), so both tiers give identical scores. Comparisons are in
float64, as the NumPy tier converts its input.
"""

from __future__ import annotations

from numba import float64, njit

LEAF = 7  # ops/ml._MODES
MEMBER = 6

_jit = njit(nogil=True, cache=True, boundscheck=False)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _leaf(data, row, node, features, splits, modes, true_next, false_next, tracks, members):
    """The node a row reaches from ``node``; at most one step per node, as the NumPy walk
    (a malformed table with a cycle stops where the NumPy walk stops)."""
    for _ in range(modes.shape[0]):
        mode = modes[node]
        if mode == LEAF:
            break
        x = float64(data[row, features[node]])
        split = splits[node]
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
        if not go_true and x != x and tracks[node]:
            go_true = True
        node = true_next[node] if go_true else false_next[node]
    return node


@_jit
def forest_sums(data, start, stop, roots, features, splits, modes, true_next, false_next,
                tracks, members, leaf_start, leaf_targets, leaf_values, total, reached):
    """Rows [start, stop): ``total[row, target]`` += every reached leaf's weight for the
    target, tree by tree (the NumPy tier's order), and ``reached`` marks the targets a
    reached leaf weighs."""
    for row in range(start, stop):
        for tree in range(roots.shape[0]):
            leaf = _leaf(data, row, roots[tree], features, splits, modes, true_next,
                         false_next, tracks, members)
            for k in range(leaf_start[leaf], leaf_start[leaf + 1]):
                target = leaf_targets[k]
                total[row, target] += leaf_values[k]
                reached[row, target] = True


@_jit
def forest_extremes(data, start, stop, roots, features, splits, modes, true_next,
                    false_next, tracks, members, leaf_start, leaf_targets, leaf_values, best,
                    take_max):
    """Rows [start, stop): ``best[row, target]`` becomes the minimum (maximum with
    ``take_max``) of its start value and every reached leaf's weight for the target; a NaN
    wins and stays, as with np.minimum/np.maximum."""
    for row in range(start, stop):
        for tree in range(roots.shape[0]):
            leaf = _leaf(data, row, roots[tree], features, splits, modes, true_next,
                         false_next, tracks, members)
            for k in range(leaf_start[leaf], leaf_start[leaf + 1]):
                target = leaf_targets[k]
                current, value = best[row, target], leaf_values[k]
                if current != current:
                    continue
                if value != value or (value > current if take_max else value < current):
                    best[row, target] = value

