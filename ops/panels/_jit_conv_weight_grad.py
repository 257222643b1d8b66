"""The weight gradient of a convolution on the packed-panel tile (``ops/conv/conv_grad_cpu.py``):
each image copied once into its stride phases (``ops/panels/_jit_conv_direct.py``'s planes), dY
packed into panels, and the tile summing taps times dY's channels straight into the
transposed gradient, with no im2col columns. Compiled because the tile is
(``ops/panels/_jit_tile.py``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mixrt.ops.panels._jit_conv_direct import _finished_tile, _zero, phase_planes

_jit = njit(nogil=True, cache=True, boundscheck=False)


@_jit
def weight_grad(x, dy, n0, n1, p0, p1, group, buffer, slot, phases_y, phases_x, panels, sums,
                strip_at, strip_row, lda, ph, pw, sy, sx, top, left, oh, ow, no_bias):
    """The weight gradient of a convolution, transposed, for images n0..n1 and the
    output-channel panels p0..p1: ``sums`` (T, Mp) = sum over images and output positions of
    tap t's input times dY's channel, T = taps x channels in (kernel row, kernel column,
    channel) order, Mp = M rounded up to whole panels.

    The images go ``group`` at a time. Each is copied into its zero-padded stride phases, in
    its own ``slot`` of the flat ``buffer`` ((phases_y, phases_x, C, lda) planes as the
    forward's :func:`phase_planes`, then slack read past the last plane), and its dY packed
    (:func:`pack_gradient`) into ``panels`` (group, P, oh * pw, width). Tap t's value at output
    (i, j) then lies at ``strip_at + i * pw + j`` in the image's planes, eight channels
    ``lda`` apart, so one plain tile (8 taps by a panel of output channels, K the image's
    output rows at the planes' width) adds its sums into ``sums`` (the tile's residual).
    Per panel, all the group's images pass before the next panel: the panel's columns of
    ``sums`` stay in cache (on 7x7 layers the whole table, 9.4 MB for 512 channels, went
    through memory once per image). ``strip_at[s]``, ``strip_row[s]``: strip s's offset in
    an image's planes and its first row of ``sums``, in the order taken (channel strips
    outer, taps inner: the eight channels' rows serve every tap from cache).
    The columns past ``ow`` read pixels that dY's zeros cancel, so an infinite input gives
    NaN there where im2col gives infinity."""
    width = panels.shape[3]
    k_len = oh * pw
    count = phases_y * phases_x * x.shape[1]
    used = count * lda
    flat_panels, flat_sums = panels.reshape(-1), sums.reshape(-1)
    ldc = sums.shape[1]
    _zero(flat_sums, np.uint64(0), np.uint64(flat_sums.size))
    # the cells that align each plane and the slack past the last are read by the columns
    # past ``ow`` (times dY's zeros): zeros, never a stale NaN
    for image in range(group):
        base = image * slot
        for plane in range(count):
            _zero(buffer, np.uint64(base + plane * lda + ph * pw), np.uint64(lda - ph * pw))
        _zero(buffer, np.uint64(base + used), np.uint64(slot - used))
    panel_size = panels.shape[1] * k_len * width
    for g0 in range(n0, n1, group):
        images = min(group, n1 - g0)
        for image in range(images):
            planes = buffer[image * slot:image * slot + used].reshape(
                (phases_y, phases_x, x.shape[1], lda))
            phase_planes(x[g0 + image], planes, ph, pw, sy, sx, top, left, 0, ph)
            pack_gradient(dy[g0 + image], panels[image], p0, p1, oh, ow, pw)
        for p in range(p0, p1):
            for image in range(images):
                offset = image * panel_size + p * k_len * width
                for s in range(strip_at.size):
                    _finished_tile(buffer, image * slot + strip_at[s], lda, flat_panels,
                                   offset, width, flat_sums, strip_row[s] * ldc + p * width,
                                   ldc, k_len, no_bias, 0, flat_sums, True, -np.inf, np.inf,
                                   1.0, width)


@_jit
def pack_gradient(dy, panels, p0, p1, oh, ow, pw):
    """Panels p0..p1 of ``panels`` (P, oh * pw, width) = dY (M, oh, ow) transposed: row
    ``i * pw + j`` of panel p holds dY[p * width : (p + 1) * width, i, j], zeros at the
    columns j >= ow and past M. dY is read in order, each panel row written a lane at a
    time (the panel stays in cache)."""
    m = dy.shape[0]
    width = panels.shape[2]
    for p in range(p0, p1):
        for lane in range(width):
            channel = p * width + lane
            if channel >= m:
                for row in range(oh * pw):
                    panels[p, row, lane] = 0
                continue
            for i in range(oh):
                for j in range(ow):
                    panels[p, i * pw + j, lane] = dy[channel, i, j]
                for j in range(ow, pw):
                    panels[p, i * pw + j, lane] = 0
