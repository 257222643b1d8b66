"""The compiled pass of ``mixrt::FusedRotary`` (``ops/attention/fused_rotary.py``).

No ``fastmath``: each product is rounded, then their sum, as the ONNX composition the node
stands for computes them (a fused multiply-add would round once and differ in the last bit).
"""

from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True, boundscheck=False)
def rotate(x, cos, sin, out, half):
    """``out = x * cos + [-x2, x1] * sin`` over the last axis, all four-dimensional; cos
    and sin have extent 1 on the axes where they broadcast. Each pair (x[j], x[j + half])
    is read before either output is written, so ``out`` may be ``x`` itself."""
    d0, d1, d2 = x.shape[0], x.shape[1], x.shape[2]
    for a in range(d0):
        ca = a if cos.shape[0] > 1 else 0
        sa = a if sin.shape[0] > 1 else 0
        for b in range(d1):
            cb = b if cos.shape[1] > 1 else 0
            sb = b if sin.shape[1] > 1 else 0
            for c in range(d2):
                row, target = x[a, b, c], out[a, b, c]
                c_row = cos[ca, cb, c if cos.shape[2] > 1 else 0]
                s_row = sin[sa, sb, c if sin.shape[2] > 1 else 0]
                wide_c, wide_s = c_row.shape[0] > 1, s_row.shape[0] > 1
                for j in range(half):
                    low, high = row[j], row[j + half]
                    k = j if wide_c else 0
                    m = j if wide_s else 0
                    target[j] = low * c_row[k] + (-high) * s_row[m]
                    k = j + half if wide_c else 0
                    m = j + half if wide_s else 0
                    target[j + half] = high * c_row[k] + low * s_row[m]
