"""A dense layer too small for any product form to pay for itself (``ops/nn/fused_cpu.py``'s
tiny layers: a scikit-learn MLP's 1 x 64 @ 64 x 64 and its bias and Relu), in one compiled
call. As NumPy's matmul, add and maximum it took three dispatches of ~1 us each around ~0.3
us of arithmetic: a 64-32-10 MLP at one row ran 16.5 us against onnxruntime's 8.5.
"""

from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def tiny_layer(a, w, bias, out, relu):
    """``out = a @ w (+ bias)``, then Relu where ``relu``: ``a`` (rows, K), ``w`` (K, N) as
    given, ``bias`` N values or none, ``out`` (rows, N) apart from ``a``. Each sum adds
    k = 0, 1, ... in order (the rows of ``w`` read in order, a vector of columns at a time);
    the Relu keeps a NaN, as NumPy's maximum does."""
    rows, k_len = a.shape
    n = w.shape[1]
    zero = out.dtype.type(0)
    for i in range(rows):
        row = out[i]
        for j in range(n):
            row[j] = zero
        for k in range(k_len):
            x = a[i, k]
            weights = w[k]
            for j in range(n):
                row[j] += x * weights[j]
        if bias.shape[0] > 0:
            for j in range(n):
                row[j] += bias[j]
        if relu:
            for j in range(n):
                v = row[j]
                row[j] = v if (v > zero or v != v) else zero
