"""Tree-ensemble traversal compiled by numba (``ops/ml_trees.py``): per row, per tree, walk
from the root to a leaf and add that leaf's weights to the row's scores.

The NumPy tier walks every row of every tree at once, level by level: ~15 array operations
per level, so a 100-tree forest of depth 20 costs thousands of NumPy calls for one row. Here
a row's walk is a few loads per node.

The node table is the one ``ops/ml._Forest`` builds (interior nodes and leaves share the
index space, a leaf's mode is ``LEAF``), packed one node to a 24-byte record (split,
feature, mode with the missing-value flag, children) so that a step reads one cache line
rather than one per array (an extra-trees forest's row 7 -> 2 us); a leaf's weights are given sparsely (``leaf_start``
into ``leaf_targets``/``leaf_values``, the nonzero-or-hit entries of the dense table), which
adds the same values in the same order as the NumPy tier's dense rows (adding the dense
table's zeros changes nothing), so both tiers give identical scores. Comparisons are in
float64, as the NumPy tier converts its input.
"""

from __future__ import annotations

from numba import float64, njit, uint64

LEAF = 7  # ops/ml._MODES
MEMBER = 6
# a node record's int32 slots (after its float64 split, slots 0-1): ops/ml._Forest.records
FEATURE, MODE, TRUE_NEXT, FALSE_NEXT = 2, 3, 4, 5

_jit = njit(nogil=True, cache=True, boundscheck=False)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _leaf(data, row, node, splits, links, members):
    """The node a row reaches from ``node``; at most one step per
    node, as the NumPy walk (a malformed table with a cycle stops where the NumPy walk
    stops). ``splits`` and ``links`` are flat views of the same 24-byte records (see
    ``ops/ml._Forest.records``), indexed unsigned (see ``ops/_jit_kernels.py``)."""
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
def forest_sums(data, start, stop, roots, splits, links, members, leaf_start, leaf_targets,
                leaf_values, total, reached):
    """Rows [start, stop): ``total[row, target]`` += every reached leaf's weight for the
    target, tree by tree (the NumPy tier's order), and ``reached`` marks the targets a
    reached leaf weighs."""
    for row in range(start, stop):
        for tree in range(roots.shape[0]):
            leaf = _leaf(data, row, roots[tree], splits, links, members)
            for k in range(leaf_start[leaf], leaf_start[leaf + 1]):
                target = leaf_targets[k]
                total[row, target] += leaf_values[k]
                reached[row, target] = True


@_jit
def forest_extremes(data, start, stop, roots, splits, links, members, leaf_start,
                    leaf_targets, leaf_values, best, take_max):
    """Rows [start, stop): ``best[row, target]`` becomes the minimum (maximum with
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
