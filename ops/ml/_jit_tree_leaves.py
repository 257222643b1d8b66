"""A few rows' walk of a forest split by its trees (``ops/ml/forest_walks.py``): each part
finds the leaves its trees lead the rows to, and the leaves are then added row by row in
tree order, so the sums are the bits of one thread's walk.

A request's one row walks every tree on one thread (a 1,200-tree LightGBM classifier: ~90
us), and splitting its rows between threads would leave one of them idle. Its trees are split
instead (``_jit_tree_parts.TREE_ENTRIES``): the first part adds its trees' leaves into the
sums as ``forest_sums`` does, the others only find theirs here. Each walk of ``forest_sums``
has its counterpart, chosen from the same tables by the same rule, so a part takes the walk
the batch's size chose by the clock (``walk_choice.py``) and reaches the same leaves.
"""

from __future__ import annotations

import numpy as np
from numba import float64, njit, uint64

from mixrt.ops.ml._jit_trees import (BRANCHING_ROWS, FEATURE, FALSE_NEXT, LEAF, MODE,
                                     ROW_BLOCK, STEPPED_BLOCK, STEPPED_FROM_ROWS, TRUE_NEXT,
                                     _add_leaf, _branching_leaf, _leaf, _step)

_jit = njit(nogil=True, cache=True, boundscheck=False)


@_jit
def forest_leaves(data, start, stop, tree_start, tree_stop, roots, splits, links, members,
                  uniform, steps, records, thresholds, leaves):
    """``leaves[row, tree]``: the leaf each row of [start, stop) reaches in each tree of
    [tree_start, tree_stop), by the walk ``forest_sums`` takes over these tables."""
    less = (uniform & 1) == 1
    if uniform >= BRANCHING_ROWS:  # the depth-first tables
        for tree in range(tree_start, tree_stop):
            root = uint64(roots[tree])
            for row in range(start, stop):
                leaves[row, tree] = _branching_leaf(data, uint64(row), root, splits, links,
                                                    less)
        return
    if uniform >= 0 and stop - start >= STEPPED_FROM_ROWS and steps.shape[0]:
        _stepped_leaves(data, start, stop, tree_start, tree_stop, roots, steps, records,
                        thresholds, less, leaves)
        return
    if uniform >= 0:
        _uniform_leaves(data, start, stop, tree_start, tree_stop, roots, splits, links, less,
                        leaves)
        return
    for row in range(start, stop):
        for tree in range(tree_start, tree_stop):
            leaves[row, tree] = _leaf(data, row, roots[tree], splits, links, members)


@_jit
def _stepped_leaves(data, start, stop, tree_start, tree_stop, roots, steps, records,
                    thresholds, less, leaves):
    """The stepped walk's leaves (``_jit_trees._stepped_sums``)."""
    nodes = np.empty(STEPPED_BLOCK, np.int32)
    for first in range(start, stop, STEPPED_BLOCK):
        count = min(STEPPED_BLOCK, stop - first)
        for tree in range(tree_start, tree_stop):
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
                leaves[first + r, tree] = nodes[r]


@_jit
def _uniform_leaves(data, start, stop, tree_start, tree_stop, roots, splits, links, less,
                    leaves):
    """The leaves of the walk in step over a block of rows (``_jit_trees._uniform_sums``)."""
    limit = splits.shape[0] // 3
    nodes = np.empty(ROW_BLOCK, np.int64)
    for first in range(start, stop, ROW_BLOCK):
        count = min(ROW_BLOCK, stop - first)
        for tree in range(tree_start, tree_stop):
            for r in range(count):
                nodes[r] = roots[tree]
            for _ in range(limit):
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
            for r in range(count):
                leaves[first + r, tree] = nodes[r]


@_jit
def add_leaves(leaves, start, stop, tree_start, tree_stop, leaf_start, leaf_targets,
               leaf_values, total, reached):
    """forest_sums's additions for the leaves :func:`forest_leaves` found: rows [start,
    stop), trees [tree_start, tree_stop) in order."""
    for row in range(start, stop):
        for tree in range(tree_start, tree_stop):
            _add_leaf(uint64(row), uint64(leaves[row, tree]), leaf_start, leaf_targets,
                      leaf_values, total, reached)
