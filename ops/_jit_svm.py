"""libsvm's probability coupling (``ops/ml_svm._couple``) compiled by numba: per row, at most
100 sweeps of coordinate updates over k classes.

The NumPy tier runs the sweeps for every row at once, ~10 array operations per class per
sweep: for one row and ten classes several hundred NumPy calls. Here a row's sweeps are
plain float32 loops. Every operation is the NumPy tier's, in the same order and in float32
(each constant is a float32, so nothing widens to float64, and without fastmath nothing is
contracted into a fused multiply-add), so both tiers give the same bits.
"""

from __future__ import annotations

from numba import float32, njit

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
