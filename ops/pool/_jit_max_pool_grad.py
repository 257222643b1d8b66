"""dX of a 2-D MaxPool (``ops/pool/pool_grad_cpu.py``) a plane at a time: the plane split into its
padded stride phases, where every tap of every window is a unit-stride run, so finding each
window's winner and scattering dY are vectorized passes in cache (the NumPy form takes ~70
calls a chunk). Arrays are flat and indexed with unsigned offsets (see
``ops/compiled/jit_cpu.py``).
"""

from __future__ import annotations

from numba import njit, uint64

_jit = njit(nogil=True, cache=True, boundscheck=False)


@_jit
def max_pool_grad(x, dy, dx, p0, p1, shape, kernel, strides, dilations, top, left, lowest,
                  planes, grads, best, winner):
    """dX of a 2-D MaxPool for planes p0..p1 of ``x``, ``dy`` and ``dx`` (flat (P, H, W),
    (P, oh, ow), (P, H, W); ``shape`` = (H, W, oh, ow, ph, pw)), by the generic kernel's rule
    and in its order (ops/conv/conv_grad.py): each window's dy goes to its first maximal tap in
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
