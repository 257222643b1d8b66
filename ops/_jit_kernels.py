"""The numba-compiled loops behind ``ops/jit_cpu.py`` (imported by it on first use, so that
``import mixrt`` does not pay for numba).

Both kernels read stride-phase planes that NumPy prepared (``jit_cpu._phase_planes``):
``planes[n, ry * sw + rx, c]`` holds the padded pixels (i * sh + ry, j * sw + rx) of image n,
channel c. In them, tap (a, b) of every output window is one contiguous run starting at
``(a // sh) * pw + b // sw``, with output rows ``pw`` apart: one vectorized pass per tap, the
``pw - ow`` columns past each output row computed and dropped.

Every array is passed flat (1-D) and indexed as ``array[uint64(offset + i)]``. With a signed
index numba wraps negative values on every access, and that alone kept LLVM from vectorizing
(314 against 38 microseconds for the same multiply-adds); slicing a view per run avoids the
wrap but costs ~20-30 ns a view (reference counts), more than a short run's arithmetic.
Copies and padding stay in NumPy (``jit_cpu._phase_planes``), one strided copy per phase.

No fastmath: it would let LLVM assume there are no NaNs, and a max pool must pass them on.
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

_jit = njit(nogil=True, cache=True, boundscheck=False)


@_jit
def depthwise(planes, shape, w, kernel, b, y, out_dims, sh, sw, dh, dw, acc):
    """Depthwise convolution. ``planes``: flat (N, sh*sw, C, ph, pw), ``shape`` = those five
    dims; ``w``: flat (C*k, kh, kw), ``kernel`` = (kh, kw); bias ``b`` (C*k); ``y``: flat
    (N, C*k, oh, ow), ``out_dims`` = (oh, ow); ``acc``: scratch of ph*pw elements."""
    n_images, phases, channels, ph, pw = shape[0], shape[1], shape[2], shape[3], shape[4]
    kh, kw = kernel[0], kernel[1]
    oh, ow = out_dims[0], out_dims[1]
    m_out = b.shape[0]
    multiplier = m_out // channels
    run = (oh - 1) * pw + ow
    for n in range(n_images):
        for m in range(m_out):
            c = m // multiplier
            bias = b[m]
            if kh == 3 and kw == 3:
                _depthwise_3x3(planes, w, m, bias, acc, run, n, c, phases, channels, ph, pw,
                               sh, sw, dh, dw)
            else:
                _depthwise_taps(planes, w, m, bias, acc, run, n, c, kh, kw, phases, channels,
                                ph, pw, sh, sw, dh, dw)
            base = (n * m_out + m) * oh * ow
            for oy in range(oh):
                row, target = oy * pw, base + oy * ow
                for ox in range(ow):
                    y[uint64(target + ox)] = acc[uint64(row + ox)]


@_jit
def _tap_start(n, c, ky, kx, phases, channels, ph, pw, sh, sw, dh, dw):
    """Where tap (ky, kx) of output (0, 0) sits in the flat phase planes."""
    a, e = ky * dh, kx * dw
    phase = (a % sh) * sw + e % sw
    return ((n * phases + phase) * channels + c) * ph * pw + (a // sh) * pw + e // sw


@_jit
def _depthwise_3x3(planes, w, m, bias, acc, run, n, c, phases, channels, ph, pw, sh, sw, dh,
                   dw):
    """The nine taps in one pass (nine loads, one store per output), for the common 3x3."""
    s0 = _tap_start(n, c, 0, 0, phases, channels, ph, pw, sh, sw, dh, dw)
    s1 = _tap_start(n, c, 0, 1, phases, channels, ph, pw, sh, sw, dh, dw)
    s2 = _tap_start(n, c, 0, 2, phases, channels, ph, pw, sh, sw, dh, dw)
    s3 = _tap_start(n, c, 1, 0, phases, channels, ph, pw, sh, sw, dh, dw)
    s4 = _tap_start(n, c, 1, 1, phases, channels, ph, pw, sh, sw, dh, dw)
    s5 = _tap_start(n, c, 1, 2, phases, channels, ph, pw, sh, sw, dh, dw)
    s6 = _tap_start(n, c, 2, 0, phases, channels, ph, pw, sh, sw, dh, dw)
    s7 = _tap_start(n, c, 2, 1, phases, channels, ph, pw, sh, sw, dh, dw)
    s8 = _tap_start(n, c, 2, 2, phases, channels, ph, pw, sh, sw, dh, dw)
    k = m * 9
    w0, w1, w2, w3, w4 = w[k], w[k + 1], w[k + 2], w[k + 3], w[k + 4]
    w5, w6, w7, w8 = w[k + 5], w[k + 6], w[k + 7], w[k + 8]
    for i in range(run):
        acc[i] = (bias + w0 * planes[uint64(s0 + i)] + w1 * planes[uint64(s1 + i)]
                  + w2 * planes[uint64(s2 + i)] + w3 * planes[uint64(s3 + i)]
                  + w4 * planes[uint64(s4 + i)] + w5 * planes[uint64(s5 + i)]
                  + w6 * planes[uint64(s6 + i)] + w7 * planes[uint64(s7 + i)]
                  + w8 * planes[uint64(s8 + i)])


@_jit
def _depthwise_taps(planes, w, m, bias, acc, run, n, c, kh, kw, phases, channels, ph, pw, sh,
                    sw, dh, dw):
    """Any kernel size: one pass over the run per tap."""
    for i in range(run):
        acc[i] = bias
    for ky in range(kh):
        for kx in range(kw):
            start = _tap_start(n, c, ky, kx, phases, channels, ph, pw, sh, sw, dh, dw)
            weight = w[(m * kh + ky) * kw + kx]
            for i in range(run):
                acc[i] += weight * planes[uint64(start + i)]


@_jit
def pool(planes, shape, kernel, y, out_dims, sh, sw, dh, dw, acc, maximum, divisor):
    """MaxPool (``maximum``) or AveragePool (window sums / ``divisor``, flat (oh, ow)).
    ``planes``: flat (sh*sw, P, ph, pw) padded with -inf or 0 (the depthwise layout with one
    image and P channels), ``shape`` its dims; ``y``:
    flat (P, oh, ow). A NaN in a window makes the max NaN, as np.maximum does."""
    phases, count, ph, pw = shape[0], shape[1], shape[2], shape[3]
    kh, kw = kernel[0], kernel[1]
    oh, ow = out_dims[0], out_dims[1]
    run = (oh - 1) * pw + ow
    for p in range(count):
        for ky in range(kh):
            for kx in range(kw):
                start = _tap_start(0, p, ky, kx, phases, count, ph, pw, sh, sw, dh, dw)
                if ky == 0 and kx == 0:
                    for i in range(run):
                        acc[i] = planes[uint64(start + i)]
                elif maximum:
                    for i in range(run):
                        value = planes[uint64(start + i)]
                        current = acc[i]
                        acc[i] = value if (value > current or value != value) else current
                else:
                    for i in range(run):
                        acc[i] += planes[uint64(start + i)]
        base = p * oh * ow
        for oy in range(oh):
            row, target = oy * pw, base + oy * ow
            if maximum:
                for ox in range(ow):
                    y[uint64(target + ox)] = acc[uint64(row + ox)]
            else:
                for ox in range(ow):
                    y[uint64(target + ox)] = acc[uint64(row + ox)] / divisor[uint64(oy * ow + ox)]


@_jit
def max_pool_grad(x, dy, dx, p0, p1, shape, kernel, strides, dilations, top, left, lowest,
                  planes, grads, best, winner):
    """dX of a 2-D MaxPool for planes p0..p1 of ``x``, ``dy`` and ``dx`` (flat (P, H, W),
    (P, oh, ow), (P, H, W); ``shape`` = (H, W, oh, ow, ph, pw)), by the generic kernel's rule
    and in its order (ops/conv_grad.py): each window's dy goes to its first maximal tap in
    row-major order (a later tap wins only when strictly larger; after a NaN, which
    np.maximum carries, none does), added tap by tap as dy times (winner == tap), so a
    non-finite dy reaches every tap as the generic's does. A tap in the padding reads
    ``lowest``, and what it receives is dropped.

    Each plane is split into its padded stride phases (flat ``planes``, (sy, sx, ph, pw)),
    where every tap of every window is a unit-stride run: the winners (flat ``best`` and
    ``winner``, (oh, pw), the tap index held in x's dtype so that the loops keep one vector
    width) and the scattered gradient (flat ``grads``, as ``planes``) are
    vectorized passes in cache, and the phases are interleaved back into dx."""
    h, w, oh, ow, ph, pw = shape
    (kh, kw), (sy, sx), (dh, dw) = kernel, strides, dilations
    plane = ph * pw
    run = (oh - 1) * pw + ow  # windows as one run over the phase rows (pw - ow dropped)
    for p in range(p0, p1):
        source = p * h * w
        for ry in range(sy):
            for rx in range(sx):
                base = (ry * sx + rx) * plane
                # columns v_lo..v_hi of each phase row lie in the image
                v_lo = min(pw, max(0, -(-(left - rx) // sx)))
                v_hi = max(v_lo, min(pw, (w - 1 + left - rx) // sx + 1))
                for u in range(ph):
                    r = u * sy + ry - top
                    row = base + u * pw
                    for v in range(pw):
                        grads[uint64(row + v)] = 0
                    if r < 0 or r >= h:
                        for v in range(pw):
                            planes[uint64(row + v)] = lowest
                        continue
                    for v in range(v_lo):
                        planes[uint64(row + v)] = lowest
                    start = source + r * w + v_lo * sx + rx - left
                    for v in range(v_hi - v_lo):
                        planes[uint64(row + v_lo + v)] = x[uint64(start + v * sx)]
                    for v in range(v_hi, pw):
                        planes[uint64(row + v)] = lowest
        for tap in range(kh * kw):
            at = _phase_tap(tap, kw, dh, dw, sy, sx, plane, pw)
            mark = winner.dtype.type(tap)
            if tap == 0:
                for i in range(run):
                    best[uint64(i)] = planes[uint64(at + i)]
                    winner[uint64(i)] = mark
                continue
            for i in range(run):
                value = planes[uint64(at + i)]
                current = best[uint64(i)]
                larger = value > current
                winner[uint64(i)] = mark if larger else winner[uint64(i)]
                best[uint64(i)] = value if (larger or value != value) else current
        one, zero = dy.dtype.type(1), dy.dtype.type(0)
        for tap in range(kh * kw):
            at = _phase_tap(tap, kw, dh, dw, sy, sx, plane, pw)
            mark = winner.dtype.type(tap)
            for i in range(oh):
                row, out = i * pw, p * oh * ow + i * ow
                for j in range(ow):
                    share = dy[uint64(out + j)] * (one if winner[uint64(row + j)] == mark
                                                   else zero)
                    grads[uint64(at + row + j)] += share
        for r in range(h):
            u, ry = divmod(r + top, sy)
            target = source + r * w
            for rx in range(sx):
                c0 = (rx - left) % sx  # first column of this phase
                v0 = (c0 + left) // sx
                row = (ry * sx + rx) * plane + u * pw + v0
                for v in range((w - c0 + sx - 1) // sx):
                    dx[uint64(target + c0 + v * sx)] = grads[uint64(row + v)]


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _phase_tap(tap, kw, dh, dw, sy, sx, plane, pw):
    """Where tap ``tap`` (row-major in a kh x kw window) of the first window lies in the
    flat (sy, sx, ph, pw) phase planes; window (i, j)'s is ``i * pw + j`` further on."""
    a, b = divmod(tap, kw)
    qy, ry = divmod(a * dh, sy)
    qx, rx = divmod(b * dw, sx)
    return (ry * sx + rx) * plane + qy * pw + qx


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


# -- softmax rows (ops/fast_cpu.py) --------------------------------------------------------------

@_jit
def softmax_shift(x, y, rows, n):
    """``y[r] = x[r] - max(x[r])`` for each row of ``n`` (flat x, y; y may be x: a row's
    max is taken before it is written). NumPy's ``max(axis=1)`` over 128-element rows took
    3x this whole loop. A NaN that the max skips still reaches the row through its own
    ``x - max`` (the caller's sum then makes the whole row NaN, as the max would)."""
    for r in range(rows):
        s = r * n
        m, _ = _row_max(x, s, n)
        for i in range(n):
            y[uint64(s + i)] = x[uint64(s + i)] - m


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
def softmax_scale(y, rows, n):
    """Each row of ``n`` divided by its sum, in place (``reassoc`` vectorizes the sum, as in
    layer_norm); one multiply by the reciprocal per element."""
    for r in range(rows):
        s = r * n
        total = y.dtype.type(0)
        for i in range(n):
            total += y[uint64(s + i)]
        inverse = y.dtype.type(1) / total
        for i in range(n):
            y[uint64(s + i)] *= inverse


# -- whole-plane pools (ops/inplace_cpu.py) ------------------------------------------------------

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


# -- products with a few rows (ops/matmul_cpu.py) ------------------------------------------------

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


# -- Winograd F(2x2, 3x3) transforms (ops/winograd_cpu.py) ---------------------------------------
#
# A band is the global tile rows g0..g1 (g = image * th + tile row). Each tile row takes
# tw + 1 columns of the transformed planes: tile (ty, tx) of a band's image sits at column
# (ty - first row) * (tw + 1) + tx, and the last column of each row is spare. With that
# layout, element (a, b) of every tile is one flat run of a stride-phase plane of the padded
# image (``phases[(a % 2) * 2 + b % 2]``, rows tw + 1 wide) shifted by (a // 2) * (tw + 1) +
# b // 2, so both transforms are long unit-stride runs. Each run reads one or two (three)
# streams and writes one: a loop writing all 16 planes at once kept LLVM from vectorizing
# (it could not check that many pairs for overlap) and ran 3.6x slower on 64x56x56.
# ``v`` and ``mm`` hold 16 planes of (channels, columns), ``plane`` elements apart,
# staggered so that the streams do not fall into the same cache sets.

@njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")
def _combine(out, o, a, sa, sb, sign, count):
    """out[o + i] = a[sa + i] + sign * a[sb + i] for i < count."""
    for i in range(count):
        out[uint64(o + i)] = a[uint64(sa + i)] + sign * a[uint64(sb + i)]


@njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")
def _combine3(out, o, a, sa, sb, sc, sign, bias, count):
    """out[o + i] = a[sa + i] + sign * (a[sb + i] + a[sc + i]) + bias for i < count."""
    for i in range(count):
        out[uint64(o + i)] = a[uint64(sa + i)] + sign * (a[uint64(sb + i)]
                                                         + a[uint64(sc + i)]) + bias


@_jit
def _split_phases(x, phases, source, row, size, left, w, wide):
    """Input row ``x[source:source + w]`` into the two column phases of a padded row: padded
    column 2k + b (x column 2k + b - left) goes to ``phases[row + b * size + k]``."""
    inner0 = max(0, (left + 1) // 2)
    inner1 = min(wide, (w + left) // 2)  # from inner0 to here both columns are inside x
    for k in range(inner0, inner1):
        phases[uint64(row + k)] = x[uint64(source + 2 * k - left)]
        phases[uint64(row + size + k)] = x[uint64(source + 2 * k + 1 - left)]
    for k in range(wide):
        if inner0 <= k < inner1:
            continue
        for b in range(2):
            j = 2 * k + b - left
            if 0 <= j < w:
                phases[uint64(row + b * size + k)] = x[uint64(source + j)]


@_jit
def winograd_input(x, v, c, h, w, top, left, th, tw, g0, g1, plane, phases, rows):
    """V = B^T d B for every 4x4 input tile d of the band: tile (ty, tx) covers padded rows
    2*ty..2*ty+3 and columns 2*tx..2*tx+3. ``x``: flat (N, C, H, W); scratch ``phases``:
    4 * ((th + 1) * (tw + 1) + 1) elements, ``rows``: 8 * ((g1 - g0) * (tw + 1) + 1)."""
    wide = tw + 1
    columns = (g1 - g0) * wide
    for image in range(g0 // th, (g1 - 1) // th + 1):
        ty0 = max(g0, image * th) - image * th
        ty1 = min(g1, (image + 1) * th) - image * th
        size = (ty1 - ty0 + 1) * wide + 1  # a phase plane, one spare cell for the last run
        count = (ty1 - ty0) * wide
        span = count + 1
        first = (image * th + ty0 - g0) * wide
        for ch in range(c):
            for q in range(4 * size):
                phases[uint64(q)] = 0.0
            for q in range(2 * ty0, 2 * ty1 + 2):  # the padded rows these tiles read
                r = q - top
                if 0 <= r < h:
                    _split_phases(x, phases, ((image * c + ch) * h + r) * w,
                                  (q & 1) * 2 * size + ((q >> 1) - ty0) * wide, size, left, w,
                                  wide)
            # B^T d, per column phase b: rows (d0 - d2, d1 + d2, d2 - d1, d1 - d3), where d0
            # and d2 are row phase 0 (d2 one row down), d1 and d3 row phase 1
            for b in range(2):
                even, odd = b * size, (2 + b) * size
                _combine(rows, b * span, phases, even, even + wide, -1.0, span)
                _combine(rows, (2 + b) * span, phases, odd, even + wide, 1.0, span)
                _combine(rows, (4 + b) * span, phases, even + wide, odd, -1.0, span)
                _combine(rows, (6 + b) * span, phases, odd, odd + wide, -1.0, span)
            # times B: the same combination along each row's columns e0..e3, where e0 and e2
            # are column phase 0 (e2 one column on), e1 and e3 column phase 1
            out = ch * columns + first
            for r in range(4):
                even = 2 * r * span
                odd = even + span
                _combine(v, out + 4 * r * plane, rows, even, even + 1, -1.0, count)
                _combine(v, out + (4 * r + 1) * plane, rows, odd, even + 1, 1.0, count)
                _combine(v, out + (4 * r + 2) * plane, rows, even + 1, odd, -1.0, count)
                _combine(v, out + (4 * r + 3) * plane, rows, odd, odd + 1, -1.0, count)


@_jit
def winograd_output(mm, y, bias, m, oh, ow, th, tw, g0, g1, plane, quads):
    """Y = A^T M A + bias for every tile of the band, into output rows 2*ty and 2*ty + 1
    (the second only where the image has it; likewise the last column). ``mm``: 16 planes
    of (M, columns); ``y``: flat (N, M, oh, ow); scratch ``quads``: 12 * columns."""
    wide = tw + 1
    columns = (g1 - g0) * wide
    half = ow // 2
    for ch in range(m):
        b = bias[uint64(ch)]
        e = ch * columns
        # A^T M: rows (m0 + m1 + m2, m1 - m2 - m3) per column s, into quads[s], quads[4 + s]
        for s in range(4):
            _combine3(quads, s * columns, mm, e + s * plane, e + (4 + s) * plane,
                      e + (8 + s) * plane, 1.0, 0.0, columns)
            _combine3(quads, (4 + s) * columns, mm, e + (4 + s) * plane, e + (8 + s) * plane,
                      e + (12 + s) * plane, -1.0, 0.0, columns)
        # times A, plus the bias: output (i, j) of every tile into quads[8 + 2i + j]
        for i in range(2):
            rows = 4 * i * columns
            _combine3(quads, (8 + 2 * i) * columns, quads, rows, rows + columns,
                      rows + 2 * columns, 1.0, b, columns)
            _combine3(quads, (9 + 2 * i) * columns, quads, rows + columns, rows + 2 * columns,
                      rows + 3 * columns, -1.0, b, columns)
        for g in range(g0, g1):  # interleave the four quarter planes into the output rows
            image = g // th
            ty = g - image * th
            for i in range(2):
                r = 2 * ty + i
                if r >= oh:
                    break
                target = uint64(((image * m + ch) * oh + r) * ow)
                even = uint64((8 + 2 * i) * columns + (g - g0) * wide)
                odd = even + uint64(columns)
                for tx in range(half):
                    y[target + uint64(2 * tx)] = quads[even + uint64(tx)]
                    y[target + uint64(2 * tx + 1)] = quads[odd + uint64(tx)]
                if ow % 2:
                    y[target + uint64(2 * half)] = quads[even + uint64(half)]


# -- a standard LSTM's steps (ops/lstm_cpu.py) -----------------------------------------------
# A step's cache ``block`` is (8, batch, hidden), flat: the states it started from (h, c),
# then i, forget, candidate, cell, o and tanh(cell), the entries ops/rnn_grad.py's workspace
# keeps for sigmoid and tanh gates. Plain float arithmetic in the array's own dtype, in the
# order ops/rnn.py and ops/rnn_grad.py's NumPy expressions take, so both give the same
# numbers from the same gates. Sequence n runs at step t while t < lengths[n]; past its
# length (padding) its states hold, its output is zero and its step passes no gradient.

@_jit
def lstm_step(gates, h, c, block, batch, hidden):
    """One step after NumPy's tanh over its gates: ``gates`` (batch, 4 hidden), flat, holds
    tanh(pre / 2) for i, o and f (a sigmoid is tanh(x / 2) / 2 + 1 / 2, as ops/rnn.py takes
    it) and tanh(pre) for the candidate; ``h``, ``c`` (batch, hidden), flat, are the states
    the step starts from. Writes ``block``'s first seven entries; the caller's tanh makes the
    eighth, and :func:`lstm_output` the new states."""
    half = gates.dtype.type(0.5)
    size = batch * hidden
    for n in range(batch):
        row = n * 4 * hidden
        for k in range(hidden):
            s = uint64(n * hidden + k)
            i = gates[uint64(row + k)] * half + half
            o = gates[uint64(row + hidden + k)] * half + half
            forget = gates[uint64(row + 2 * hidden + k)] * half + half
            candidate = gates[uint64(row + 3 * hidden + k)]
            old = c[s]
            cell = forget * old
            cell += i * candidate
            block[s] = h[s]
            block[uint64(size) + s] = old
            block[uint64(2 * size) + s] = i
            block[uint64(3 * size) + s] = forget
            block[uint64(4 * size) + s] = candidate
            block[uint64(5 * size) + s] = cell
            block[uint64(6 * size) + s] = o


@_jit
def lstm_output(block, h, c, out, lengths, t, batch, hidden):
    """Step t's output o tanh(cell) into ``out`` and, for the sequences still running, into
    the states ``h`` and ``c`` (the cell from the block); zeros for the others. All flat."""
    size = batch * hidden
    zero = block.dtype.type(0)
    for n in range(batch):
        running = t < lengths[n]
        for k in range(hidden):
            s = uint64(n * hidden + k)
            if running:
                y = block[uint64(6 * size) + s] * block[uint64(7 * size) + s]
                out[s] = y
                h[s] = y
                c[s] = block[uint64(5 * size) + s]
            else:
                out[s] = zero


@_jit
def lstm_step_grad(block, dh, dy, dc, d_gates, lengths, t, batch, hidden):
    """Step t backward from its cache ``block``: ``dh`` + ``dy`` is the gradient of the h
    it made, ``dc`` that of its cell (overwritten with the gradient of the cell it started
    from); writes the gradient of its pre-activations into ``d_gates`` (batch, 4 hidden).
    A sequence past its length gets zeros there and keeps its ``dc``. All flat. The slopes
    are functions of the values: s (1 - s), 1 - t t."""
    one, zero = block.dtype.type(1), block.dtype.type(0)
    size = batch * hidden
    for n in range(batch):
        row = n * 4 * hidden
        if t >= lengths[n]:
            for j in range(4 * hidden):
                d_gates[uint64(row + j)] = zero
            continue
        for k in range(hidden):
            s = uint64(n * hidden + k)
            old = block[uint64(size) + s]
            i = block[uint64(2 * size) + s]
            forget = block[uint64(3 * size) + s]
            candidate = block[uint64(4 * size) + s]
            o = block[uint64(6 * size) + s]
            squashed = block[uint64(7 * size) + s]
            d_h = dh[s] + dy[s]
            d_cell = dc[s] + d_h * o * (one - squashed * squashed)
            d_gates[uint64(row + k)] = d_cell * candidate * (i * (one - i))
            d_gates[uint64(row + hidden + k)] = d_h * squashed * (o * (one - o))
            d_gates[uint64(row + 2 * hidden + k)] = d_cell * old * (forget * (one - forget))
            d_gates[uint64(row + 3 * hidden + k)] = d_cell * i * (one - candidate * candidate)
            dc[s] = d_cell * forget


@_jit
def hold_rows(carried, dh, lengths, t, batch, hidden):
    """``carried``'s rows of the sequences past their length at step t take ``dh``'s: the
    state's gradient passes a padded step unchanged. Flat (batch, hidden)."""
    for n in range(batch):
        if t >= lengths[n]:
            for k in range(hidden):
                carried[uint64(n * hidden + k)] = dh[uint64(n * hidden + k)]


# -- a standard GRU's steps, reset after the recurrent product (ops/gru_cpu.py) --------------
# A step's cache ``block`` is (5, batch, hidden), flat: the h it started from, z, reset, the
# candidate and the recurrent term R_h h + Rb_h, the entries ops/rnn_grad.py's workspace
# keeps for sigmoid and tanh gates with linear_before_reset. ``recurrent`` (batch, 3 hidden)
# is h R'^T: z's and r's columns halved, the candidate's not. Padding as for the LSTM.

@_jit
def gru_gates(recurrent, projected, bias_h, gates, block, batch, hidden):
    """Before the sigmoids: ``gates`` (batch, 2 hidden) = the halved z and r pre-activations,
    and the step's recurrent term (block entry 4) = R_h h + ``bias_h``. All flat."""
    size = batch * hidden
    for n in range(batch):
        row, two = n * 3 * hidden, n * 2 * hidden
        for k in range(hidden):
            gates[uint64(two + k)] = projected[uint64(row + k)] + recurrent[uint64(row + k)]
            gates[uint64(two + hidden + k)] = (projected[uint64(row + hidden + k)]
                                               + recurrent[uint64(row + hidden + k)])
            block[uint64(4 * size + n * hidden + k)] = (recurrent[uint64(row + 2 * hidden + k)]
                                                        + bias_h[k])


@_jit
def gru_candidate(gates, projected, h, block, pre, batch, hidden):
    """After NumPy's tanh over ``gates`` (tanh of half the z and r pre-activations): z and
    reset, and the candidate's pre-activation ``pre`` (batch, hidden) = x_h + reset times
    the recurrent term. Writes block entries h, z and reset. All flat."""
    half = gates.dtype.type(0.5)
    size = batch * hidden
    for n in range(batch):
        two, row = n * 2 * hidden, n * 3 * hidden
        for k in range(hidden):
            s = uint64(n * hidden + k)
            reset = _gru_sigmoids(gates, h, block, s, two + k, hidden, size, half)
            pre[s] = projected[uint64(row + 2 * hidden + k)] + reset * block[uint64(4 * size) + s]


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _gru_sigmoids(gates, h, block, s, at, hidden, size, half):
    """z and reset of element ``s`` (its z at ``at`` in the flat (batch, 2 hidden)
    ``gates``, tanh of half the pre-activations) into the block with h; returns reset."""
    z = gates[uint64(at)] * half + half
    reset = gates[uint64(at + hidden)] * half + half
    block[s] = h[s]
    block[uint64(size) + s] = z
    block[uint64(2 * size) + s] = reset
    return reset


@_jit
def gru_output(block, h, out, lengths, t, batch, hidden):
    """Step t's new h = (1 - z) candidate + z h (the candidate, block entry 3, made by the
    caller's tanh) into ``out`` and the state ``h`` for the sequences still running; zeros
    into ``out`` for the others, whose ``h`` holds. All flat."""
    one, zero = block.dtype.type(1), block.dtype.type(0)
    size = batch * hidden
    for n in range(batch):
        running = t < lengths[n]
        for k in range(hidden):
            s = uint64(n * hidden + k)
            if running:
                z = block[uint64(size) + s]
                y = (one - z) * block[uint64(3 * size) + s] + z * block[s]
                out[s] = y
                h[s] = y
            else:
                out[s] = zero


@_jit
def gru_step_grad(block, dh, dy, d_gates, d_recurrent, carried, lengths, t, batch, hidden):
    """Step t backward from its cache: ``dh`` + ``dy`` is the gradient of the h it made.
    Writes the gradient of its three pre-activations into ``d_gates`` (batch, 3 hidden),
    that of h R^T + Rb into ``d_recurrent`` (batch, 3 hidden), and into ``carried`` the
    part of the old h's gradient that does not pass through R (dh z). A sequence past its
    length gets zeros in both and carries ``dh`` unchanged. All flat."""
    one, zero = block.dtype.type(1), block.dtype.type(0)
    size = batch * hidden
    for n in range(batch):
        row = n * 3 * hidden
        if t >= lengths[n]:
            for j in range(3 * hidden):
                d_gates[uint64(row + j)] = zero
                d_recurrent[uint64(row + j)] = zero
            for k in range(hidden):
                carried[uint64(n * hidden + k)] = dh[uint64(n * hidden + k)]
            continue
        for k in range(hidden):
            s = uint64(n * hidden + k)
            h = block[s]
            z = block[uint64(size) + s]
            reset = block[uint64(2 * size) + s]
            candidate = block[uint64(3 * size) + s]
            recurrent = block[uint64(4 * size) + s]
            d_h = dh[s] + dy[s]
            dz = d_h * (h - candidate)
            da_h = d_h * (one - z) * (one - candidate * candidate)
            da_z = dz * (z * (one - z))
            da_r = da_h * recurrent * (reset * (one - reset))
            d_gates[uint64(row + k)] = da_z
            d_gates[uint64(row + hidden + k)] = da_r
            d_gates[uint64(row + 2 * hidden + k)] = da_h
            d_recurrent[uint64(row + k)] = da_z
            d_recurrent[uint64(row + hidden + k)] = da_r
            d_recurrent[uint64(row + 2 * hidden + k)] = da_h * reset
            carried[s] = d_h * z


# -- a standard GRU's steps, reset before the recurrent product (ops/gru_cpu.py) -------------
# The cache ``block`` is (4, batch, hidden), flat: the h the step started from, z, reset and
# the candidate (the entries ops/rnn_grad.py's workspace keeps without linear_before_reset).

@_jit
def gru_reset(gates, h, block, gated, batch, hidden):
    """After NumPy's tanh over ``gates`` (batch, 2 hidden: tanh of half the z and r
    pre-activations): z and reset into the block (with h), and ``gated`` = reset h, the
    candidate's recurrent product's operand. All flat."""
    half = gates.dtype.type(0.5)
    size = batch * hidden
    for n in range(batch):
        two = n * 2 * hidden
        for k in range(hidden):
            s = uint64(n * hidden + k)
            gated[s] = _gru_sigmoids(gates, h, block, s, two + k, hidden, size, half) * h[s]


@_jit
def gru_reset_grad_candidate(block, dh, dy, d_gates, da_h, dz, carried, lengths, t, batch,
                             hidden):
    """Step t backward, first part: the candidate's pre-activation gradient into ``da_h``
    (batch, hidden) and the last third of ``d_gates`` (batch, 3 hidden), z's output-side
    gradient into ``dz``, and dh z into ``carried``. A sequence past its length gets zeros
    and carries ``dh`` unchanged. All flat."""
    one, zero = block.dtype.type(1), block.dtype.type(0)
    size = batch * hidden
    for n in range(batch):
        row = n * 3 * hidden
        running = t < lengths[n]
        for k in range(hidden):
            s = uint64(n * hidden + k)
            if not running:
                d_gates[uint64(row + 2 * hidden + k)] = zero
                da_h[s] = zero
                dz[s] = zero
                carried[s] = dh[s]
                continue
            h = block[s]
            z = block[uint64(size) + s]
            candidate = block[uint64(3 * size) + s]
            d_h = dh[s] + dy[s]
            d = d_h * (one - z) * (one - candidate * candidate)
            d_gates[uint64(row + 2 * hidden + k)] = d
            da_h[s] = d
            dz[s] = d_h * (h - candidate)
            carried[s] = d_h * z


@_jit
def gru_reset_grad_gates(block, d_gated, dz, d_gates, d_zr, carried, batch, hidden):
    """Step t backward, second part, from ``d_gated`` = da_h R_h (the gradient of reset h):
    z's and r's pre-activation gradients into the first two thirds of ``d_gates`` and into
    ``d_zr`` (batch, 2 hidden), and d_gated reset added to ``carried``. All flat."""
    one = block.dtype.type(1)
    size = batch * hidden
    for n in range(batch):
        row, two = n * 3 * hidden, n * 2 * hidden
        for k in range(hidden):
            s = uint64(n * hidden + k)
            h = block[s]
            z = block[uint64(size) + s]
            reset = block[uint64(2 * size) + s]
            g = d_gated[s]
            da_r = g * h * (reset * (one - reset))
            da_z = dz[s] * (z * (one - z))
            carried[s] += g * reset
            d_gates[uint64(row + k)] = da_z
            d_gates[uint64(row + hidden + k)] = da_r
            d_zr[uint64(two + k)] = da_z
            d_zr[uint64(two + hidden + k)] = da_r
