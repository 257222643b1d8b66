"""Kernels over rows held in L1: LayerNormalization and its RMS form, the softmax of a few short
rows (``ops/nn/nn_cpu.py``), and pools whose one window is a whole
plane (``ops/pool/inplace_cpu.py``). NumPy's reductions over such short rows spend their time in
per-row overhead. Arrays are flat and indexed with unsigned offsets (see
``ops/compiled/jit_cpu.py``); only the sums are reassociated, so NaNs pass through.
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

_jit = njit(nogil=True, cache=True, boundscheck=False)


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", fastmath={"reassoc"})
def layer_norm(x, scale, bias, y, rows, n, epsilon):
    """LayerNormalization over rows of ``n`` (flat x, y; scale and bias of n): each row is
    read three times while it sits in L1 (sum, centred sum of squares, affine output), so
    reading the row back as it is written makes ``y`` over ``x`` safe. ``reassoc`` lets LLVM
    vectorize the two sums (lane-wise partial sums, like NumPy's pairwise ones); nothing
    else is relaxed, so a NaN in a row still fills that row with NaN."""
    count = x.dtype.type(n)
    for r in range(rows):
        start = r * n
        total = x.dtype.type(0)
        for i in range(n):
            total += x[uint64(start + i)]
        mean = total / count
        squares = x.dtype.type(0)
        for i in range(n):
            centred = x[uint64(start + i)] - mean
            squares += centred * centred
        inverse = x.dtype.type(1) / np.sqrt(squares / count + epsilon)
        for i in range(n):
            y[uint64(start + i)] = ((x[uint64(start + i)] - mean) * inverse * scale[i]
                                    + bias[i])


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", fastmath={"reassoc"})
def rms_norm(x, scale, y, rows, n, epsilon):
    """SimplifiedLayerNormalization (RMS) over rows of ``n``: ``y = x * (1 / sqrt(mean(x^2)
    + epsilon)) * scale``, the NumPy form's order (``ops/attention/contrib_norm.py``); each row
    read twice while in L1, so ``y`` over ``x`` is safe. Only the sum is reassociated."""
    count = x.dtype.type(n)
    for r in range(rows):
        start = r * n
        squares = x.dtype.type(0)
        for i in range(n):
            value = x[uint64(start + i)]
            squares += value * value
        inverse = x.dtype.type(1) / np.sqrt(squares / count + epsilon)
        for i in range(n):
            y[uint64(start + i)] = x[uint64(start + i)] * inverse * scale[i]


# -- small softmax rows (ops/nn/nn_cpu.py) --------------------------------------------------------

@njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")
def _row_max(x, s, n):
    """(max of x[s:s + n] over its non-NaN elements, whether one was NaN). Eight lanes of
    partial maxima and a NaN flag beside them, which LLVM turns into vector code; one
    running max over the row stayed scalar. A caller that ignores the flag loses its
    compares once inlined."""
    n8 = n - n % 8
    m0 = x[uint64(s)]
    m1, m2, m3, m4, m5, m6, m7 = m0, m0, m0, m0, m0, m0, m0
    seen = False
    for i in range(0, n8, 8):
        b = uint64(s + i)
        v0, v1, v2, v3 = x[b], x[b + 1], x[b + 2], x[b + 3]
        v4, v5, v6, v7 = x[b + 4], x[b + 5], x[b + 6], x[b + 7]
        seen |= (v0 != v0) | (v1 != v1) | (v2 != v2) | (v3 != v3) \
            | (v4 != v4) | (v5 != v5) | (v6 != v6) | (v7 != v7)
        m0, m1, m2, m3 = _larger(v0, m0), _larger(v1, m1), _larger(v2, m2), _larger(v3, m3)
        m4, m5, m6, m7 = _larger(v4, m4), _larger(v5, m5), _larger(v6, m6), _larger(v7, m7)
    for i in range(n8, n):
        v = x[uint64(s + i)]
        seen |= v != v
        m0 = _larger(v, m0)
    m = _larger(_larger(_larger(m1, m0), _larger(m3, m2)),
                _larger(_larger(m5, m4), _larger(m7, m6)))
    return m, seen


@njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")
def _larger(v, m):
    return v if v > m else m


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", fastmath={"reassoc"})
def softmax_small(x, y, rows, n):
    """The whole softmax of a few short rows of ``n`` (flat x, y; y may be x) in one call:
    each row shifted by its max (:func:`_row_max`, which skips NaN; a NaN still reaches the
    sum through its own exp and makes the row NaN), each exp from libm (a classifier's ten
    scores do not fill a vector), then times 1 / the row's sum. Longer rows take the vector
    IR of ops/panels/_jit_vector_softmax.py."""
    for r in range(rows):
        s = r * n
        m, _ = _row_max(x, s, n)
        for i in range(n):
            y[uint64(s + i)] = np.exp(x[uint64(s + i)] - m)
        # summed in a loop of its own, which only reads: in the loop above the sum had
        # LLVM check at run time whether x and y overlap and take its vector or its scalar
        # loop by the answer, whose reassociated sums differ, so a row's bits depended on
        # where the arrays lay (a classifier's row alone and in a batch: 1.5e-8 apart)
        total = y.dtype.type(0)
        for i in range(n):
            total += y[uint64(s + i)]
        inverse = y.dtype.type(1) / total
        for i in range(n):
            y[uint64(s + i)] *= inverse


# -- whole-plane pools (ops/pool/inplace_cpu.py) --------------------------------------------------

@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", fastmath={"reassoc"})
def row_means(x, y, rows, n, count):
    """``y[r]`` = the sum of row r of ``n`` (flat x) over ``count``: an average pool with one
    window per plane, each plane one row. ``reassoc`` vectorizes the sum (lane-wise partial
    sums); NumPy's reduction over 7x7 and 13x13 planes spent 40-120 us on per-row overhead
    where this takes 2-6."""
    scale = x.dtype.type(1) / x.dtype.type(count)
    for r in range(rows):
        s = r * n
        total = x.dtype.type(0)
        for i in range(n):
            total += x[uint64(s + i)]
        y[r] = total * scale


@_jit
def row_maxima(x, y, rows, n):
    """``y[r]`` = the max of row r of ``n`` (flat x), NaN when the row holds one (as
    np.max)."""
    for r in range(rows):
        m, seen = _row_max(x, r * n, n)
        y[r] = np.nan if seen else m
