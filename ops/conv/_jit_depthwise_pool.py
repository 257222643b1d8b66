"""Depthwise convolution and 2-D pools (MaxPool, AveragePool) over stride-phase planes, for
``ops/compiled/jit_cpu.py``: in NumPy a 3x3 depthwise conv is eighteen ufunc calls over the whole
tensor, each mostly overhead on small layers, and a pooling window is the same story.

Both kernels read stride-phase planes that NumPy prepared (``jit_cpu._phase_planes``):
``planes[n, ry * sw + rx, c]`` holds the padded pixels (i * sh + ry, j * sw + rx) of image n,
channel c. In them, tap (a, b) of every output window is one contiguous run starting at
``(a // sh) * pw + b // sw``, with output rows ``pw`` apart: one vectorized pass per tap, the
``pw - ow`` columns past each output row computed and dropped. Arrays are flat and indexed
with unsigned offsets (see ``ops/compiled/jit_cpu.py``).

No fastmath: it would let LLVM assume there are no NaNs, and a max pool must pass them on.
"""

from __future__ import annotations

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
