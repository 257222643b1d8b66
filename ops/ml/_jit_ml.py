"""The small ``ai.onnx.ml`` transforms compiled by numba: a linear classifier's scores and
label, a Normalizer's rows, a Scaler's columns (``ops/ml/ml.py``).

A converted scikit-learn pipeline serves one row per request, and there each of these ops
was 5-10 NumPy calls of ~1 us on a handful of numbers: more than the arithmetic by far.
Here each is one call. The arithmetic follows the NumPy forms in float32 (products and sums
left to right, where BLAS and NumPy's pairwise sums may group them otherwise: the tiers
agree to float32 rounding, not bit for bit).
"""

from __future__ import annotations

import numpy as np
from numba import float32, njit

# the post-transform codes ops/ml/ml.py gives (NONE 0, LOGISTIC 1, SOFTMAX 2) and the row's
# transform are the tree classifiers'
from mixrt.ops.ml._jit_trees import LOGISTIC, transform_row

MAX, L1, L2 = 0, 1, 2  # the Normalizer norms

_jit = njit(nogil=True, cache=True, boundscheck=False)
_ONE = float32(1.0)


@_jit
def linear_classify(rows, weights, intercepts, transform, binary, chosen, scores, products):
    """LinearClassifier over rows [N, F] float32 with weights [F, C] (the model's [C, F]
    transposed) and intercepts [C] (zeros when the model has none): ``chosen`` [N] the
    label index, ``scores`` [N, width] float32. ``binary``: one weight column for two
    labels, whose score s says the second label when s > 0 and gives the columns [1 - p, p]
    (p = logistic(s) under LOGISTIC). Otherwise the best score's index (the first on ties,
    the first NaN if any), then the transform of the row.

    ``products`` [N, C]: rows @ weights, made by the caller through NumPy's BLAS for many
    rows (as the NumPy tier takes them), or no rows ([0, C]): the products summed here
    (:func:`_row_products`), where each class's additions wait on the one before: 1,500 rows
    of 79 features into 6 classes took ~400 us, onnxruntime's whole LinearClassifier 75,
    the BLAS's product 26. NumPy's product rather than numba's ``np.dot``, whose first
    call in a process imports SciPy for its BLAS (~190 ms: a service's first request of
    16 rows or more, 2026-11-28)."""
    classes = weights.shape[1]
    by_blas = products.shape[0] > 0
    sums = np.empty(classes, np.float32)
    for row in range(rows.shape[0]):
        if not by_blas:
            _row_products(rows, row, weights, sums)
        if binary:
            s = (products[row, 0] if by_blas else sums[0]) + intercepts[0]
            chosen[row] = 1 if s > 0 else 0
            p = _ONE / (_ONE + np.exp(-s)) if transform == LOGISTIC else s
            scores[row, 0], scores[row, 1] = _ONE - p, p
            continue
        best, best_value = 0, float32(-np.inf)
        for j in range(classes):
            s = (products[row, j] if by_blas else sums[j]) + intercepts[j]
            scores[row, j] = s
            if best_value == best_value and (s > best_value or s != s):
                best, best_value = j, s
        chosen[row] = best
        transform_row(scores, row, classes, transform)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _row_products(rows, row, weights, sums):
    """Row ``row``'s products with every class's weights (the columns of [F, C]) into
    ``sums``, each class's summed over the features in order. The classes side by side, a
    feature at a time: each class's additions still wait on the one before, but the
    classes' chains overlap and a feature's weights are read as one contiguous row (a
    logistic regression's 5 rows of 153 features into 10 classes: 5.8 us a class at a
    time, 3.7 so, and as much with eight classes' sums held in registers)."""
    classes = weights.shape[1]
    for j in range(classes):
        sums[j] = float32(0.0)
    for k in range(weights.shape[0]):
        x = rows[row, k]
        for j in range(classes):
            sums[j] += x * weights[k, j]


@_jit
def normalize_rows(rows, norm, out):
    """Normalizer: each row of rows [N, F] float32 divided by its max (MAX), sum of
    absolute values (L1) or Euclidean length (L2) into out; a row whose norm is 0 is kept
    as it is (onnxruntime's choice for an empty document)."""
    for row in range(rows.shape[0]):
        if norm == MAX:
            scale = rows[row, 0]
            for k in range(1, rows.shape[1]):
                value = rows[row, k]
                if value > scale or value != value:
                    scale = value
        else:
            scale = float32(0.0)
            for k in range(rows.shape[1]):
                value = rows[row, k]
                scale += abs(value) if norm == L1 else value * value
            if norm == L2:
                scale = np.sqrt(scale)
        if scale == 0:
            scale = _ONE
        for k in range(rows.shape[1]):
            out[row, k] = rows[row, k] / scale


@_jit
def scale_columns(rows, offset, scale, out):
    """Scaler: (rows - offset) * scale into out, rows [N, F] float32 and offset/scale one
    value per column or a single value for every column."""
    one_offset, one_scale = offset.shape[0] == 1, scale.shape[0] == 1
    for row in range(rows.shape[0]):
        for k in range(rows.shape[1]):
            shift = offset[0] if one_offset else offset[k]
            factor = scale[0] if one_scale else scale[k]
            out[row, k] = (rows[row, k] - shift) * factor
