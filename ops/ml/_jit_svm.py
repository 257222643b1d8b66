"""libsvm's probability coupling (``ops/ml/ml_svm._couple``) compiled by numba: per row, at most
100 sweeps of coordinate updates over k classes.

The NumPy tier runs the sweeps for every row at once, ~10 array operations per class per
sweep: for one row and ten classes several hundred NumPy calls. Here a row's sweeps are
plain float32 loops. Every operation is the NumPy tier's, in the same order and in float32
(each constant is a float32, so nothing widens to float64, and without fastmath nothing is
contracted into a fused multiply-add), so both tiers give the same bits.
"""

from __future__ import annotations

import numpy as np
from numba import float32, float64, njit

_SWEEPS = 100


@njit(nogil=True, cache=True)
def couple(q, p):
    """Solve every row's p in place; q [rows, k, k] and p [rows, k] float32, p starting at
    1/k."""
    rows, k = p.shape
    eps = float32(0.005) / float32(k)
    qp = p[0].copy()
    for row in range(rows):
        for _ in range(_SWEEPS):
            pqp = _products(q[row], p[row], qp, k)
            error = float32(0)
            for t in range(k):
                error = max(error, abs(qp[t] - pqp))
            if error < eps:
                break
            _sweep(q[row], p[row], qp, pqp, k)


@njit(nogil=True, cache=True, inline="always")
def _products(q, p, qp, k):
    """qp = Q p (each sum left to right), and returns p'Qp (left to right)."""
    for t in range(k):
        total = q[t, 0] * p[0]
        for j in range(1, k):
            total = total + q[t, j] * p[j]
        qp[t] = total
    pqp = p[0] * qp[0]
    for t in range(1, k):
        pqp = pqp + p[t] * qp[t]
    return pqp


@njit(nogil=True, cache=True, inline="always")
def _sweep(q, p, qp, pqp, k):
    one, two = float32(1), float32(2)
    for t in range(k):
        diff = (-qp[t] + pqp) / q[t, t]
        p[t] = p[t] + diff
        scale = one + diff
        pqp = (pqp + diff * (diff * q[t, t] + two * qp[t])) / (one + diff) / (one + diff)
        for j in range(k):
            qp[j] = (qp[j] + diff * q[t, j]) / scale
        for j in range(k):
            p[j] = p[j] / scale


# -- the support-vector decisions ---------------------------------------------------------------
#
# ops/ml/ml_svm._kernel_matrix and _one_vs_one for a few rows: NumPy formed [rows, vectors,
# features] differences and [rows, pairs, 2, vectors] products (~110 us for a 747-vector,
# ten-class SVC at batch 1); here each row's kernel values are one pass over the vectors and
# each pair's sums run over its two classes' vectors only (the other classes' zero weights
# add nothing). Float32 kernel values and products, float64 sums, as the NumPy tier; the
# feature sums run left to right where NumPy sums pairwise (float32 rounding apart).

LINEAR, POLY, RBF, SIGMOID = 0, 1, 2, 3  # ops/ml/ml_svm._KERNELS' order


@njit(nogil=True, cache=True, boundscheck=False)
def one_vs_one(rows, by_feature, kernel, gamma, coef0, degree, starts, counts, dual, rho,
               kernel_row, decisions, votes):
    """Rows [N, F] against the vectors given a feature to a row, [F, V] (float32):
    ``decisions`` [N, pairs] each class pair's decision value (libsvm's pair order), ``votes``
    [N, classes] the pairs each class won (i wins when its value is > 0). ``kernel_row`` [V]
    is scratch."""
    classes = counts.shape[0]
    for row in range(rows.shape[0]):
        _kernel_values(rows, row, by_feature, kernel, gamma, coef0, degree, kernel_row)
        for c in range(classes):
            votes[row, c] = 0
        pair = 0
        for i in range(classes - 1):
            for j in range(i + 1, classes):
                mine = _weighted_sum(kernel_row, dual, j - 1, starts[i], counts[i])
                theirs = _weighted_sum(kernel_row, dual, i, starts[j], counts[j])
                total = mine + theirs + float64(rho[pair])
                decisions[row, pair] = float32(total)
                if total > 0:
                    votes[row, i] += 1
                else:
                    votes[row, j] += 1
                pair += 1


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _kernel_values(rows, row, by_feature, kernel, gamma, coef0, degree, out):
    """``out[v]``: the kernel of the row and vector v, from ``by_feature`` [F, V] (the
    vectors transposed): each vector's sum over the features runs left to right in its own
    lane, the vectors side by side, in the order and with the bits of one vector's sum at a
    time, which was a chain of dependent additions (a 3-class SVC of 1,120 vectors over 20
    features, 100 rows: the node 1.69 -> 0.59 ms; onnxruntime's 1.5 ms, 2026-11-28)."""
    vectors = by_feature.shape[1]
    for v in range(vectors):
        out[v] = float32(0.0)
    if kernel == RBF:
        for f in range(rows.shape[1]):
            x = rows[row, f]
            for v in range(vectors):
                difference = x - by_feature[f, v]
                out[v] += difference * difference
        for v in range(vectors):
            out[v] = np.exp(-gamma * out[v])
        return
    for f in range(rows.shape[1]):
        x = rows[row, f]
        for v in range(vectors):
            out[v] += x * by_feature[f, v]
    for v in range(vectors):
        total = out[v]
        if kernel == POLY:
            out[v] = (gamma * total + coef0) ** degree
        elif kernel == SIGMOID:
            out[v] = np.tanh(gamma * total + coef0)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _weighted_sum(kernel_row, dual, line, start, count):
    total = float64(0.0)
    for v in range(start, start + count):
        total += float64(kernel_row[v] * dual[line, v])
    return total


@njit(nogil=True, cache=True)
def coupled_probabilities(decisions, prob_a, prob_b, q, p):
    """ops/ml/ml_svm._coupled_probabilities: each pair's decision through its Platt sigmoid
    (clipped to [1e-7, 1 - 1e-7]) into libsvm's pairwise matrix r, its Q [rows, k, k] into
    ``q`` and the coupled probabilities into ``p`` [rows, k] (float32 throughout)."""
    rows, k = p.shape
    low, high = float32(1e-7), float32(1 - 1e-7)
    r = np.zeros((k, k), np.float32)
    for row in range(rows):
        pair = 0
        for i in range(k - 1):
            for j in range(i + 1, k):
                value = decisions[row, pair] * prob_a[pair] + prob_b[pair]
                v = float32(1) / (float32(1) + np.exp(-abs(value)))
                logistic = float32(1) - v if value < 0 else v
                probability = min(max(float32(1) - logistic, low), high)
                r[i, j], r[j, i] = probability, float32(1) - probability
                pair += 1
        for t in range(k):
            diagonal = float32(0.0)
            for j in range(k):
                diagonal = diagonal + r[j, t] * r[j, t]
            for j in range(k):
                q[row, t, j] = diagonal if j == t else -(r[j, t] * r[t, j])
            p[row, t] = float32(1) / float32(k)
    couple(q, p)
