"""Products with a few rows (up to eight, padded to eight) against a transposed weight
(``ops/nn/matmul_cpu.py``, through ``row_kernels.few_rows_product``): OpenBLAS's sgemm with eight
columns ran 1.4-1.9x this loop's time.
"""

from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy",
      fastmath={"reassoc", "contract"})
def eight_rows(a, bt, out, n0, n1):
    """``out[:, n] = a @ bt[n]`` for the columns n0..n1: a (8, K) (a few rows padded to
    eight), bt (N, K) the transposed weight, out (8, N). Two weight rows at a time against
    the eight activation rows: sixteen dot products in one pass over K, each weight value
    loaded once for eight multiply-adds. ``reassoc`` lets LLVM vectorize the sixteen sums
    (lane-wise partial sums, as BLAS's own order differs from a plain loop); NaNs and
    infinities still propagate. OpenBLAS's sgemm with eight columns ran 1.4-1.9x this."""
    k_len = a.shape[1]
    a0, a1, a2, a3, a4, a5, a6, a7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    zero = a.dtype.type(0)
    for n in range(n0, n1, 2):
        b, c = bt[n], bt[min(n + 1, n1 - 1)]  # an odd last column pairs with itself
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
        t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = zero
        for k in range(k_len):
            x, y = b[k], c[k]
            s0 += a0[k] * x
            s1 += a1[k] * x
            s2 += a2[k] * x
            s3 += a3[k] * x
            s4 += a4[k] * x
            s5 += a5[k] * x
            s6 += a6[k] * x
            s7 += a7[k] * x
            t0 += a0[k] * y
            t1 += a1[k] * y
            t2 += a2[k] * y
            t3 += a3[k] * y
            t4 += a4[k] * y
            t5 += a5[k] * y
            t6 += a6[k] * y
            t7 += a7[k] * y
        out[0, n], out[1, n], out[2, n], out[3, n] = s0, s1, s2, s3
        out[4, n], out[5, n], out[6, n], out[7, n] = s4, s5, s6, s7
        if n + 1 < n1:
            out[0, n + 1], out[1, n + 1], out[2, n + 1], out[3, n + 1] = t0, t1, t2, t3
            out[4, n + 1], out[5, n + 1], out[6, n + 1], out[7, n + 1] = t4, t5, t6, t7


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy",
      fastmath={"reassoc", "contract"})
def eight_rows_by_one(a, bt, out, n0, n1):
    """:func:`eight_rows` one weight row at a time: eight sums, which with their vector
    lanes fit AVX2's 16 registers, where the sixteen of the pair spill. On an AMD EPYC Zen 3
    (AVX2) 8 x 256 @ 256 x 256 took 14 us against the pair's 33, 8 x 256 @ 256 x 1024 57
    against 105, 8 x 768 @ 768 x 768 115 against 208 (2026-11-25)."""
    k_len = a.shape[1]
    a0, a1, a2, a3, a4, a5, a6, a7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    zero = a.dtype.type(0)
    for n in range(n0, n1):
        b = bt[n]
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
        for k in range(k_len):
            x = b[k]
            s0 += a0[k] * x
            s1 += a1[k] * x
            s2 += a2[k] * x
            s3 += a3[k] * x
            s4 += a4[k] * x
            s5 += a5[k] * x
            s6 += a6[k] * x
            s7 += a7[k] * x
        out[0, n], out[1, n], out[2, n], out[3, n] = s0, s1, s2, s3
        out[4, n], out[5, n], out[6, n], out[7, n] = s4, s5, s6, s7
