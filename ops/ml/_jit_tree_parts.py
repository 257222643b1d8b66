"""A forest's walk split between this thread and the native worker
(``ops/panels/_jit_native_pool.py``, CALL_JOB): the ``cfunc`` part entries
``ops/ml/forest._Forest`` hands the pool.

``parallel_for`` hands a part to a Python thread: 20-40 us to wake it and take the GIL, more
than 64 rows of an XGBoost forest take on one thread (~50 us), so split that way the walk got
slower (LightGBM's 100 trees, 64 rows: 149 us on one thread, 204 split). The native worker
takes its part without the GIL in ~5 us.

Each entry reads its arguments as the pool's parts do: ``args[0]`` is an int64 array of words
(its own length, every array's shape in :data:`ARRAYS` order, ``uniform``, then the parts'
row bounds), ``args[1:]`` the arrays' data. One entry per pair of dtypes a walk meets: the
rows' (float32 or float64) and the sums' (float32 for a float32 classifier, float64 else).

A few rows are split by their trees instead (``TREE_ENTRIES``, the same words with the
parts' tree bounds and one more array, ``leaves``): the first part adds its trees' leaves
into the sums as forest_sums does, the others only find theirs (``forest_leaves``), which
the caller then adds in tree order (``add_leaves``): the bits of one thread's walk.

A classifier's rows are split with their scores (``CLASSIFY_ENTRIES``: the ARRAYS, the
sums' two empty, then the base values, the chosen labels' indices and the scores; the words
with the classifier's settings after ``uniform``): each part sums its rows' leaves and
finishes those rows' labels and scores on its own thread, as one thread's
``classify_many``/``classify_two`` would.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types

from mixrt.ops.compiled.first_use import first_use_cfunc
from mixrt.ops.ml._jit_tree_leaves import forest_leaves
from mixrt.ops.ml._jit_trees import forest_sums, many_class_scores, two_class_scores

PART_SIGNATURE = types.void(types.CPointer(types.voidptr), types.int64)
# the arrays in the order of the words and addresses, with their dimensions
ARRAYS = (("data", 2), ("roots", 1), ("splits", 1), ("links", 1), ("members", 2),
          ("steps", 1), ("records", 2), ("thresholds", 1), ("leaf_start", 1),
          ("leaf_targets", 1), ("leaf_values", 1), ("total", 2), ("reached", 2))
WORDS = 1 + sum(ndim for _, ndim in ARRAYS) + 1  # the length, the shapes, ``uniform``


@njit(nogil=True, cache=True, inline="always")
def _walk_arrays(args, data_type, value_type):
    """The words and the ARRAYS of a part's arguments (see the module's docstring)."""
    words = carray(args[0], (carray(args[0], (1,), np.int64)[0],), np.int64)
    return (words, carray(args[1], (words[1], words[2]), data_type),
            carray(args[2], (words[3],), np.int64), carray(args[3], (words[4],), np.float64),
            carray(args[4], (words[5],), np.int32),
            carray(args[5], (words[6], words[7]), np.float64),
            carray(args[6], (words[8],), np.int64),
            carray(args[7], (words[9], words[10]), np.int32),
            carray(args[8], (words[11],), np.float64), carray(args[9], (words[12],), np.int64),
            carray(args[10], (words[13],), np.int64), carray(args[11], (words[14],), value_type),
            carray(args[12], (words[15], words[16]), value_type),
            carray(args[13], (words[17], words[18]), np.bool_))


@njit(nogil=True, cache=True, inline="always")
def _part(args, index, data_type, value_type):
    """forest_sums over the rows of part ``index`` (see the module's docstring)."""
    (words, data, roots, splits, links, members, steps, records, thresholds, leaf_start,
     leaf_targets, leaf_values, total, reached) = _walk_arrays(args, data_type, value_type)
    uniform = words[19]
    start, stop = words[WORDS + index], words[WORDS + index + 1]
    # the part's rows summed into buffers of its own, written back once: two threads adding
    # into neighbouring rows of ``total`` shared its cache lines at their boundary, on every
    # tree (64 rows of a 100-tree forest: 43 us split against 29; two rows of a 500-tree
    # one, a row each: twice the time of one thread)
    sums = total[start:stop].copy()
    hits = reached[start:stop].copy()
    forest_sums(data[start:stop], 0, stop - start, roots, splits, links, members, uniform,
                steps, records, thresholds, leaf_start, leaf_targets, leaf_values, sums, hits)
    total[start:stop] = sums
    reached[start:stop] = hits


_FLAGS = {"nopython": True, "cache": True, "error_model": "numpy"}


@first_use_cfunc(PART_SIGNATURE, **_FLAGS)
def part_ff(args, index):
    _part(args, index, np.float32, np.float32)


@first_use_cfunc(PART_SIGNATURE, **_FLAGS)
def part_fd(args, index):
    _part(args, index, np.float32, np.float64)


@first_use_cfunc(PART_SIGNATURE, **_FLAGS)
def part_dd(args, index):
    _part(args, index, np.float64, np.float64)


ENTRIES = {("f", "f"): part_ff, ("f", "d"): part_fd, ("d", "d"): part_dd}


TREE_ARRAYS = ARRAYS + (("leaves", 2),)


@njit(nogil=True, cache=True, inline="always")
def _tree_part(args, index, data_type, value_type):
    """Part ``index`` of a walk split by trees (see the module's docstring)."""
    (words, data, roots, splits, links, members, steps, records, thresholds, leaf_start,
     leaf_targets, leaf_values, total, reached) = _walk_arrays(args, data_type, value_type)
    leaves = carray(args[14], (words[19], words[20]), np.int64)
    uniform = words[21]
    first, last = words[WORDS + 2 + index], words[WORDS + 2 + index + 1]
    rows = data.shape[0]
    if index == 0:  # the first trees, added as they are reached (no other part adds)
        forest_sums(data, 0, rows, roots[first:last], splits, links, members, uniform,
                    steps[first:last] if steps.shape[0] else steps, records, thresholds,
                    leaf_start, leaf_targets, leaf_values, total, reached)
    else:
        forest_leaves(data, 0, rows, first, last, roots, splits, links, members, uniform,
                      steps, records, thresholds, leaves)


@first_use_cfunc(PART_SIGNATURE, **_FLAGS)
def tree_part_ff(args, index):
    _tree_part(args, index, np.float32, np.float32)


@first_use_cfunc(PART_SIGNATURE, **_FLAGS)
def tree_part_fd(args, index):
    _tree_part(args, index, np.float32, np.float64)


@first_use_cfunc(PART_SIGNATURE, **_FLAGS)
def tree_part_dd(args, index):
    _tree_part(args, index, np.float64, np.float64)


TREE_ENTRIES = {("f", "f"): tree_part_ff, ("f", "d"): tree_part_fd,
                ("d", "d"): tree_part_dd}


# -- a classifier's rows, walked and scored by parts -------------------------------------------
#
# Split as forest_sums alone, a classifier's scores were a pass of their own on the calling
# thread after the walk, over sums half of which the other core had written: a depth-14
# decision tree's 1,000 rows took 80 us on two threads against 85 on one (onnxruntime 44).

CLASSIFY_ARRAYS = ARRAYS + (("base", 1), ("chosen", 1), ("scores", 2))
# the length, the shapes; uniform, targets, many classes, transform, binary case, all positive
CLASSIFY_WORDS = 1 + sum(ndim for _, ndim in CLASSIFY_ARRAYS) + 6


@njit(nogil=True, cache=True, inline="always")
def _classify_part(args, index, data_type, value_type):
    """Rows of part ``index``: their sums from zeros, then their labels and scores (see the
    module's docstring)."""
    (words, data, roots, splits, links, members, steps, records, thresholds, leaf_start,
     leaf_targets, leaf_values, _, _) = _walk_arrays(args, data_type, value_type)
    base = carray(args[14], (words[19],), value_type)
    chosen = carray(args[15], (words[20],), np.int64)
    scores = carray(args[16], (words[21], words[22]), np.float32)
    uniform, targets, many, transform = words[23], words[24], words[25], words[26]
    binary_case, all_positive = words[27] != 0, words[28] != 0
    start, stop = words[CLASSIFY_WORDS + index], words[CLASSIFY_WORDS + index + 1]
    sums = np.zeros((stop - start, targets), value_type)
    hits = np.zeros((stop - start, targets), np.bool_)
    forest_sums(data[start:stop], 0, stop - start, roots, splits, links, members, uniform,
                steps, records, thresholds, leaf_start, leaf_targets, leaf_values, sums, hits)
    if many:
        many_class_scores(sums, hits, base, transform, chosen[start:stop], scores[start:stop])
    else:
        two_class_scores(sums, hits, base, binary_case, all_positive, transform,
                         chosen[start:stop], scores[start:stop])


@first_use_cfunc(PART_SIGNATURE, **_FLAGS)
def classify_part_ff(args, index):
    _classify_part(args, index, np.float32, np.float32)


@first_use_cfunc(PART_SIGNATURE, **_FLAGS)
def classify_part_dd(args, index):
    _classify_part(args, index, np.float64, np.float64)


CLASSIFY_ENTRIES = {("f", "f"): classify_part_ff, ("d", "d"): classify_part_dd}
