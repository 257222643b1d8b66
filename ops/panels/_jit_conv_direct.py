"""Direct convolutions on the packed-panel tile (``ops/conv/conv_direct_cpu.py``): the image copied
once into its zero-padded stride phases (or packed into strips), the tile reading each output at
its taps there, the bias, residual and activation applied as each tile is stored (HardSwish and
Swish by each part once its tiles are stored: :func:`gated`); no im2col columns and no pass
after. Compiled because the tile is (``ops/panels/_jit_tile.py``), and so that one call
per image splits its parts with the native worker (the driver at the end).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from mixrt.ops.compiled.first_use import first_use_cfunc
from mixrt.ops.panels._jit_native_pool import (
    ARGS, BIAS, BLOCK_WORDS, BOUNDS, BY_ROWS, CHUNK, COLUMN_BLOCK, CONV_JOB, EDGE, HALO,
    HAS_RESIDUAL, IMAGE_RUNS, IMAGES, IN_PLACE, JOB, JOB_SIGNATURE, LEFT, LIMITS, NO_BIAS, OH,
    OW, PANELS, PARTS, PH, PLACES, PLANES, PW, RESIDUAL, ROW_BLOCK, ROWS_AT, SHAPE0, SHAPE1,
    SHAPE2, SHAPE3, SPILL, STRIPS, SX, SY, TAPS, TOP, WEIGHTS, WORKER_EDGE, WORKER_PLANES,
    WORKER_SPILL, X, Y, begin, claim, finish, get1, get2, get3, publish, put, register_job)
from mixrt.ops.panels._jit_prefetch import prefetch_run
from mixrt.ops.panels._jit_tile import STRIP_ROWS, _make_tap_tile, _make_tile, _tile8, limited

_jit = njit(nogil=True, cache=True, boundscheck=False)


# -- convolutions -------------------------------------------------------------------------------
#
# ops/conv/conv_direct_cpu.py's two forms. A kernel of several taps takes its output positions as
# the tile's rows: each read at its taps in the image's zero-padded stride phases (one
# broadcast per position and tap, as ops/panels/_jit_dense.py's products read their activation),
# the weight's transpose packed once into panels of output channels, and each tile's columns
# stored as 8 consecutive outputs of one channel. A 1x1 convolution of a large image takes
# the weight on the left, its panels 32 consecutive outputs of every input channel, read
# where they lie.

_finished_tile = _make_tile(STRIP_ROWS, finished=True)
_tap_tile = _make_tap_tile(STRIP_ROWS)
# 7 outputs a tile where the outputs come in sevens (7x7 planes: 49 outputs in 7 tiles, where
# 8-output tiles computed 56)
_tap_tile7 = _make_tap_tile(STRIP_ROWS - 1)


@_jit
def phase_planes(x, planes, ph, pw, sy, sx, top, left, first, rows):
    """Rows first..first + rows of the stride phases of ``x`` (C, H, W) zero-padded by
    ``top`` and ``left``, into rows 0..rows of the (ph, pw) planes held at the start of each
    ``planes[ry, rx, c]`` (its last axis can be longer, to align the next plane): plane
    (ry, rx) holds padded pixel (i * sy + ry, j * sx + rx). Every cell of those rows is
    written (zeros outside the image), so a reused buffer holds no stale values there.
    Indices are unsigned: numba's check for negative ones kept these loops from vectorizing
    (a 64 x 56 x 56 image took 120 us, 18 without it)."""
    channels, height, width = x.shape
    stride = planes.shape[3]
    source, target = x.reshape(-1), planes.reshape(-1)
    phases_x = planes.shape[1]
    for ry in range(planes.shape[0]):  # the phases the taps read: (0, 0) alone for 1x1
        for rx in range(phases_x):
            # columns j_lo..j_hi of each plane row read the image; the rest are padding
            j_lo = min(pw, max(0, -(-(left - rx) // sx)))
            j_hi = max(j_lo, min(pw, (width - 1 + left - rx) // sx + 1))
            for c in range(channels):
                base = ((ry * phases_x + rx) * channels + c) * stride
                for i in range(min(rows, ph - first)):
                    row = (first + i) * sy + ry - top
                    start = np.uint64(base + i * pw)
                    if row < 0 or row >= height:
                        _zero(target, start, np.uint64(pw))
                        continue
                    _zero(target, start, np.uint64(j_lo))
                    read_at = np.uint64((c * height + row) * width + j_lo * sx + rx - left)
                    into = start + np.uint64(j_lo)
                    step = np.uint64(sx)
                    for t in range(np.uint64(j_hi - j_lo)):
                        target[into + t] = source[read_at + t * step]
                    _zero(target, start + np.uint64(j_hi), np.uint64(pw - j_hi))


@_jit
def pack_strips(x, packed, first, rows, ow, sy, sx, top, left):
    """Output rows first..first + rows of a 1x1 convolution's input ``x`` (C, H, W), packed
    for the tap tile: the strip of outputs q..q + STRIP_ROWS (q a multiple of STRIP_ROWS,
    counted from output row ``first``) holds, for each channel c, the pixels those outputs
    read, side by side at ``packed[(q // STRIP_ROWS * C + c) * STRIP_ROWS:]``. The tile then
    reads one line per two channels in order, where on the image it read a line per channel
    a plane apart. Pixels in the padding and lanes past the last output are zeros."""
    channels, height, width = x.shape
    count = rows * ow
    strips = -(-count // STRIP_ROWS)
    source = x.reshape(-1)
    # each strip's lanes: the pixel its output reads, or -1 (padding, past the last output)
    lanes = np.empty(STRIP_ROWS, np.int64)
    for s in range(strips):
        for i in range(STRIP_ROWS):
            q = s * STRIP_ROWS + i
            lanes[i] = -1
            if q < count:
                iy, ix = (first + q // ow) * sy - top, q % ow * sx - left
                if 0 <= iy < height and 0 <= ix < width:
                    lanes[i] = iy * width + ix
        for c in range(channels):
            into = (s * channels + c) * STRIP_ROWS
            for i in range(STRIP_ROWS):
                at = lanes[i]
                packed[into + i] = source[c * height * width + at] if at >= 0 else 0


@_jit
def _zero(target, start, count):
    for t in range(count):
        target[start + t] = 0


@_jit
def tap_conv(image, rows_at, places, count, panels, y, first, bias, residual, has_residual,
             low, high, slope, p0, p1, spill, no_bias, strip):
    """Outputs first..first + count of y (M, L), for the output-channel panels p0..p1:
    ``image`` the flat phase planes, ``rows_at`` (K,) each tap's offset in them, ``places``
    the place in them of each output from ``first`` on (padded with valid places to a whole
    strip past the last), ``panels`` (P, K, width) the weight's transpose zero-padded to P *
    width channels, ``bias`` as long, ``spill`` a (width, STRIP_ROWS) scratch for a last
    strip of fewer than STRIP_ROWS - 1 outputs, ``no_bias`` zeros of at least a panel's
    width. ``strip``: outputs per tile, STRIP_ROWS or STRIP_ROWS - 1 (:func:`strip_rows`).
    Epilogue per output: + bias, + residual (y's layout) when ``has_residual``, times
    ``slope`` when negative, clamped to [low, high]."""
    k_len, width = panels.shape[1], panels.shape[2]
    channels, length = y.shape
    flat_y, flat_spill, flat_residual = y.reshape(-1), spill.reshape(-1), residual.reshape(-1)
    flat_panels = panels.reshape(-1)
    panel_size = k_len * width
    # each panel is read from memory once, then serves every strip from cache: the strips of
    # one panel ask for the next one, a share each, while they compute (the first panel is
    # asked for before)
    share = -(-k_len // -(-count // strip))
    prefetch_run(flat_panels, p0 * panel_size, panel_size)
    for p in range(p0, p1):
        column = p * width
        columns = min(width, channels - column)
        for s in range(first, first + count, strip):
            start = (s - first) // strip * share
            ahead = panel_size + start * width  # from row k of this panel
            ahead_rows = min(share, k_len - start) if p + 1 < p1 else 0
            rows = min(strip, first + count - s)
            if rows == STRIP_ROWS:
                _tap_tile(image, s - first, places, panels, p * panel_size, rows_at, flat_y,
                          column * length + s, length, k_len, bias, column, flat_residual,
                          has_residual, low, high, slope, columns, ahead, ahead_rows)
                continue
            if rows == STRIP_ROWS - 1:
                _tap_tile7(image, s - first, places, panels, p * panel_size, rows_at, flat_y,
                           column * length + s, length, k_len, bias, column, flat_residual,
                           has_residual, low, high, slope, columns, ahead, ahead_rows)
                continue
            _tap_tile(image, s - first, places, panels, p * panel_size, rows_at, flat_spill,
                      0, STRIP_ROWS, k_len, no_bias, 0, flat_spill, False, -np.inf, np.inf,
                      1.0, width, ahead, ahead_rows)
            for j in range(columns):
                _finish_run(flat_spill, np.uint64(j * STRIP_ROWS), flat_y,
                            np.uint64((column + j) * length + s), np.uint64(rows),
                            bias[column + j], flat_residual, has_residual, low, high, slope)


@_jit
def strip_rows(count):
    """Outputs per tap tile for ``count`` outputs: 7 where that computes fewer rows than 8
    (49 outputs: 7 tiles of 7 against 7 of 8, the last with one output), else 8."""
    shorter = STRIP_ROWS - 1
    return shorter if -(-count // shorter) * shorter < -(-count // STRIP_ROWS) * STRIP_ROWS \
        else STRIP_ROWS


@_jit
def pointwise_conv(w, image, stride, offset, count, y, first, bias, residual, has_residual,
                   low, high, slope, m0, m1, row_block, column_block, edge, spill):
    """Output channels m0..m1 (whole strips) at outputs first..first + count of y (M, L):
    ``w`` (>= m1 rows, C) the weight with zero rows past M, ``image`` flat with its
    channels ``stride`` apart, output ``first`` at ``offset`` in each. Panels of outputs are
    read in place, a last partial one under a mask. A strip of rows past M goes through
    ``spill`` (STRIP_ROWS, width), its partial panel copied first into ``edge`` (C, width),
    zero-padded. The epilogue is :func:`tap_conv`'s. Weight rows go in blocks of
    ``row_block`` that stay in L2 while the outputs pass over them, and the outputs in
    blocks of ``column_block`` (whole panels) whose image columns stay in L2 while every
    strip of the rows passes over them in turn (:func:`_strips_over`)."""
    k_len = w.shape[1]
    width = spill.shape[1]
    channels = y.shape[0]
    whole = count // width * width
    if whole < count and m1 > channels // STRIP_ROWS * STRIP_ROWS:
        for k in range(k_len):
            for j in range(width):
                edge[k, j] = image[k * stride + offset + whole + j] if whole + j < count else 0
    for b0 in range(m0, m1, row_block):
        b1 = min(m1, b0 + row_block)
        for c0 in range(0, count, column_block):
            _strips_over(w, image, stride, offset, count, y, first, bias, residual,
                         has_residual, low, high, slope, b0, b1, c0,
                         min(count, c0 + column_block), edge, spill)


@_jit
def _strips_over(w, image, stride, offset, count, y, first, bias, residual, has_residual,
                 low, high, slope, b0, b1, c0, c1, edge, spill):
    """:func:`pointwise_conv`'s strips b0..b1 of output channels, each over the panels of
    outputs c0..c1 before the next strip. A strip writes its eight rows a block at a time:
    each panel taken by every strip in turn wrote all M rows 128 bytes at a time, more
    streams of stores than the CPU follows (a 16 -> 96 layer over 4 x 80 x 128 pixels, one
    thread, its input cold: 3.5 ms in single panels, 1.6 in blocks of 1,024 outputs;
    onnxruntime 2.7; 2026-12-03, Xeon). Each output's sum is the same sequence either way."""
    k_len, width = w.shape[1], spill.shape[1]
    channels, length = y.shape
    flat_y, flat_spill, flat_residual = y.reshape(-1), spill.reshape(-1), residual.reshape(-1)
    whole = count // width * width
    for s in range(b0, b1, STRIP_ROWS):
        for q0 in range(c0, c1, width):
            if s + STRIP_ROWS <= channels:
                _finished_tile(w, s * k_len, k_len, image, offset + q0, stride, flat_y,
                               s * length + first + q0, length, k_len, bias, s,
                               flat_residual, has_residual, low, high, slope,
                               min(width, count - q0))
                continue
            if q0 < whole:
                _tile8(w, s * k_len, k_len, image, offset + q0, stride, spill, 0, width,
                       k_len)
            else:
                _tile8(w, s * k_len, k_len, edge, 0, width, spill, 0, width, k_len)
            for i in range(min(STRIP_ROWS, channels - s)):
                _finish_run(flat_spill, np.uint64(i * width), flat_y,
                            np.uint64((s + i) * length + first + q0),
                            np.uint64(min(width, count - q0)), bias[s + i], flat_residual,
                            has_residual, low, high, slope)


@_jit
def left_tap_conv(w, image, rows_at, r0, r1, ow, pw, y, first, bias, residual, has_residual,
                  low, high, slope, m0, m1, width):
    """Output rows r0..r1 (``ow`` outputs each) and channels m0..m1 (whole strips of 8) of a
    kernel of several taps with the weight on the left: ``w`` (M, K) the weight's rows, M a
    multiple of STRIP_ROWS; ``image`` the flat phase planes from plane row r0 on (rows ``pw``
    apart), ``rows_at`` (K,) each tap's offset in them; each tile is 8 channels by up to
    ``width`` consecutive outputs of one row, its panel rows read where they lie (a last
    partial panel under a mask), stored as rows of y (M, L) from output row ``first``. The
    epilogue is :func:`tap_conv`'s."""
    k_len = w.shape[1]
    length = y.shape[1]
    flat_y, flat_residual = y.reshape(-1), residual.reshape(-1)
    for row in range(r0, r1):
        out_at = (first + row - r0) * ow
        for q0 in range(0, ow, width):
            columns = min(width, ow - q0)
            place = (row - r0) * pw + q0
            for s in range(m0, m1, STRIP_ROWS):
                _finished_tile(w, s * k_len, k_len, image, place, rows_at, flat_y,
                               s * length + out_at + q0, length, k_len, bias, s,
                               flat_residual, has_residual, low, high, slope, columns)


# The epilogue of one run of sums, in two loops (with and without the residual) so that each
# is branch-free and vectorizes: with the residual test inside, and signed indices (numba
# checks them for negative values), one loop wrote 0.5 ns an element against 0.06 here.
# Comparisons rather than min/max, which LLVM left scalar, and pass NaN through.

@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _finish_run(sums, at, y, out, count, shift, residual, has_residual, low, high, slope):
    if has_residual:
        _finish_residual(sums, at, y, out, count, shift, residual, low, high, slope)
    else:
        _finish(sums, at, y, out, count, shift, low, high, slope)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _finish(sums, at, y, out, count, shift, low, high, slope):
    for t in range(count):
        y[out + t] = limited(sums[at + t] + shift, low, high, slope)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _finish_residual(sums, at, y, out, count, shift, residual, low, high, slope):
    for t in range(count):
        y[out + t] = limited(sums[at + t] + shift + residual[out + t], low, high, slope)


# -- the direct convolutions, split between threads in native code ----------------------------
#
# ``ops/conv/conv_direct_cpu.py``'s convolutions split between threads in native code.
#
# One compiled call per image (:func:`conv`) does what ``conv_direct_cpu.conv`` did through
# ``parallel_for``: it builds the shared phase planes when the threads split the output
# channels, publishes the job in the pool's control block (its argument slots are laid out in
# ops/panels/_jit_native_pool.py), claims parts until none are left and waits for the worker's. The
# worker (its registered entry, through _jit_native_pool.worker_job) rebuilds the arguments from the
# block and claims parts the same way. A part is a band of output rows (each thread builds
# that band's phase planes in its own buffer, or reads a 1x1's image in place) or a run of
# output channels over the shared planes, as before: panels of the tap form, strips of the
# weight-on-the-left form.


@_jit
def _build(x, flat, shape, geometry, strips, r0, r1):
    """The phase planes (or strips) of output rows r0..r1 into ``flat``."""
    ph, pw, sy, sx, top, left, halo, oh, ow = geometry
    if strips:
        pack_strips(x, flat, r0, r1 - r0, ow, sy, sx, top, left)
    else:
        size = shape[0] * shape[1] * shape[2] * shape[3]
        phase_planes(x, flat[:size].reshape(shape), ph, pw, sy, sx, top, left, r0,
                             r1 - r0 + halo)


# The epilogue's limits array: (low, high, slope) as the tile reads them, then a gate the
# part applies to its outputs once the tile has stored them (0: none; 1: HardSwish, y times
# HardSigmoid(y, alpha, beta); 2: Swish, y times Sigmoid(y) through the float32 sigmoid
# rational), its constants in the array's dtype (``direct_forms.limits_array``)
GATE, ALPHA, BETA, ZERO, ONE, HALF, SIGMOID_LOW, SIGMOID_HIGH, SIGMOID_SCALE, SIGMOID_P, \
    SIGMOID_Q = 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 17
HARD_SWISH, SWISH = 1, 2


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def gated(y, m0, m1, first, count, limits):
    """Rows m0..m1 of y (M, L), outputs first..first + count, times their gate (see GATE),
    each step in y's dtype in the order of the FusedElementwise pass that computed it after
    the tile before (``ops/elementwise/jit_elementwise.py``'s templates: HardSigmoid then
    Mul, or Sigmoid then Mul), clips by comparisons that pass NaN on: the same bits. The
    constants are read out of ``limits`` before the loops (which LLVM cannot tell apart
    from y). Swish's loop ran ~0.53 ns an element on one thread through the tanh rational
    (HardSwish's ~0.15), against 1.31 for the pass it replaces (2026-12-04); its own
    sigmoid rational takes about a third less (2026-12-05)."""
    flat, length = y.reshape(-1), np.uint64(y.shape[1])
    if limits[GATE] == SWISH:
        k = (limits[SIGMOID_LOW], limits[SIGMOID_HIGH], limits[SIGMOID_SCALE],
             limits[SIGMOID_P], limits[SIGMOID_P + 1], limits[SIGMOID_P + 2],
             limits[SIGMOID_P + 3], limits[SIGMOID_P + 4], limits[SIGMOID_Q],
             limits[SIGMOID_Q + 1], limits[SIGMOID_Q + 2], limits[SIGMOID_Q + 3],
             limits[SIGMOID_Q + 4], limits[HALF])
        for c in range(m0, m1):
            _swish_run(flat, np.uint64(c) * length + np.uint64(first), np.uint64(count), k)
        return
    alpha, beta, zero, one = limits[ALPHA], limits[BETA], limits[ZERO], limits[ONE]
    for c in range(m0, m1):
        start = np.uint64(c) * length + np.uint64(first)
        for t in range(np.uint64(count)):
            v = flat[start + t]
            g = v * alpha + beta
            g = g if (g > zero or g != g) else zero
            g = g if (g < one or g != g) else one
            flat[start + t] = v * g


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def _swish_run(flat, start, count, k):
    """flat[start:start + count] times Sigmoid of itself through the float32 sigmoid
    rational, ``k`` its constants (:func:`gated`)."""
    for t in range(count):
        v = flat[start + t]
        flat[start + t] = v * _sigmoid(v, k)


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def _sigmoid(x, k):
    """The float32 sigmoid rational (``ops/elementwise/odd_rational.numba_source``) in its
    order of operations: ``k`` its clip limits, scale, P and Q (degree 4 in u each), then a
    half."""
    low, high, half = k[0], k[1], k[13]
    a = low if x < low else x
    c = high if a > high else a
    u = c * c * k[2]
    top = (((u * k[7] + k[6]) * u + k[5]) * u + k[4]) * u + k[3]
    bottom = (((u * k[12] + k[11]) * u + k[10]) * u + k[9]) * u + k[8]
    r = (c * top) / bottom
    s = -half if r < -half else r
    s = half if s > half else s
    return s + half


@_jit
def _part(part, job, x, own, shared, shape, geometry, rows_at, places, bounds, panels,
          weights, y, bias, residual, limits, spill, edge, no_bias):
    """One part: a band of rows on this thread's own planes (or a 1x1's image in place), or
    a run of output channels on the shared ones. ``job``: (form, by_rows, strips, in_place,
    chunk, row_block, column_block, has_residual), form 0 a 1x1 kernel, 1 the tap tile, 2
    taps with the weight on the left."""
    taps, by_rows, strips, in_place, chunk, row_block, column_block, has_residual = job
    ph, pw, oh, ow = geometry[0], geometry[1], geometry[7], geometry[8]
    low, high, slope = limits[0], limits[1], limits[2]
    r0, r1, image = 0, oh, shared
    if by_rows:
        r0, r1 = bounds[part], bounds[part + 1]
        if not in_place:
            _build(x, own, shape, geometry, strips, r0, r1)
            image = own
    count = (r1 - r0) * ow
    if taps == 2:
        m0, m1 = (0, weights.shape[0]) if by_rows else \
            (part * chunk * STRIP_ROWS, min(weights.shape[0], (part + 1) * chunk * STRIP_ROWS))
        left_tap_conv(weights, image, rows_at, r0, r1, ow, pw, y, r0, bias, residual,
                      has_residual, low, high, slope, m0, m1, spill.shape[0])
    elif taps:
        strip = STRIP_ROWS if strips else strip_rows(count)
        p0, p1 = (0, panels.shape[0]) if by_rows else \
            (part * chunk, min(panels.shape[0], (part + 1) * chunk))
        tap_conv(image, rows_at, places[part if by_rows else 0], count, panels, y,
                         r0 * ow, bias, residual, has_residual, low, high, slope, p0, p1,
                         spill, no_bias, strip)
        m0, m1 = p0 * panels.shape[2], min(y.shape[0], p1 * panels.shape[2])
    else:
        stride, offset = shape[3], 0
        if in_place:
            image, stride, offset = x.reshape(-1), ph * pw, r0 * ow
        m0, m1 = (0, weights.shape[0]) if by_rows else \
            (part * chunk * STRIP_ROWS,
             min(weights.shape[0], (part + 1) * chunk * STRIP_ROWS))
        pointwise_conv(weights, image, stride, offset, count, y, r0 * ow, bias, residual,
                       has_residual, low, high, slope, m0, m1, row_block, column_block, edge,
                       spill.reshape((STRIP_ROWS, spill.size // STRIP_ROWS)))
    if limits[GATE] != 0:  # the part's outputs, still in cache
        gated(y, m0, min(m1, y.shape[0]), r0 * ow, count, limits)


@_jit
def native_conv(block, kit, x, y, bias, residual, has_residual):
    """Conv of one image ``x`` into ``y`` (M, L), its parts taken by this thread and the
    pool's worker (``block``; with another caller using it, or one part, all here).
    ``kit`` is laid out like the block: every argument that does not change from call to
    call (the planes, weights, parts, the epilogue's ``limits`` in x's dtype, this thread's
    ``SPILL`` and ``EDGE`` scratch) written once by ``conv_direct_cpu``, so a call passes
    only what does; a call of 22 arrays and tuples cost ~4 us in numba's dispatch alone.

    An empty output returns at once: its parts divide by a zero width, and an error between
    taking the pool and :func:`finish` would leave the pool taken for good (every later split
    kernel of the process then ran on its caller alone)."""
    if y.size == 0:
        return
    planes = get1(kit, PLANES, x)
    spill, edge = get2(kit, SPILL, x), get2(kit, EDGE, x)
    (rows_at, places, bounds, panels, weights, limits, no_bias), shape, geometry, form, \
        parts = _fixed_arguments(kit, x)
    job = form + (has_residual,)
    if not job[1] and not job[3]:  # neither split by rows nor a 1x1 read in place
        _build(x, planes, shape, geometry, job[2], 0, geometry[7])
    sequence = begin(block) if parts > 1 else -1
    if sequence >= 0:
        _publish(block, kit, sequence, x, y, bias, residual, has_residual, 0, 0)
        part = claim(block, parts)
        while part >= 0:
            _part(part, job, x, planes, planes, shape, geometry, rows_at, places, bounds,
                  panels, weights, y, bias, residual, limits, spill, edge, no_bias)
            part = claim(block, parts)
        finish(block)
        return
    for part in range(parts):
        _part(part, job, x, planes, planes, shape, geometry, rows_at, places, bounds, panels,
              weights, y, bias, residual, limits, spill, edge, no_bias)


@_jit
def native_conv_images(block, kit, x, y, bias, residual, has_residual, images, runs):
    """Conv of ``images`` whole images in ``runs`` runs of consecutive ones, each run taken
    by this thread or the pool's worker (``block``; with another caller using it, all here):
    ``x`` (images x C, H, W) and ``y`` and ``residual`` (images x M, L) hold them one after
    another. Each image's parts run on the thread that took its run, over that thread's own
    planes, so an image stays on one core: the one that wrote it where the node before split
    its planes in the same runs (a depthwise convolution, a pool). Split inside each image
    (:func:`native_conv`), both threads read all of an image's input channels, half of them
    from the other core's cache, and met at every image's end: a 384 -> 64 1x1 convolution
    at 2 x 14 x 14 ran no faster on two threads than on one (2026-12-01)."""
    if y.size == 0 or images == 0:
        return
    planes = get1(kit, PLANES, x)
    spill, edge = get2(kit, SPILL, x), get2(kit, EDGE, x)
    arrays, shape, geometry, form, parts = _fixed_arguments(kit, x)
    job = form + (has_residual,)
    sequence = begin(block) if runs > 1 else -1
    if sequence < 0:
        for run in range(runs):
            _image_run(run, runs, images, job, x, y, residual, planes, shape, geometry,
                       arrays, bias, spill, edge, parts)
        return
    _publish(block, kit, sequence, x, y, bias, residual, has_residual, images, runs)
    run = claim(block, runs)
    while run >= 0:
        _image_run(run, runs, images, job, x, y, residual, planes, shape, geometry, arrays,
                   bias, spill, edge, parts)
        run = claim(block, runs)
    finish(block)


@_jit
def _publish(block, kit, sequence, x, y, bias, residual, has_residual, images, runs):
    """Job ``sequence`` of a convolution opened in the pool's ``block``: the kit's fixed
    arguments and the call's arrays written first; ``images`` 0 for one image's parts,
    else whole images in ``runs`` runs (:func:`native_conv_images`)."""
    block[JOB], block[IMAGES], block[IMAGE_RUNS] = CONV_JOB, images, runs
    for slot in range(ARGS, COLUMN_BLOCK + 1):
        block[slot] = kit[slot]
    put(block, X, x)
    put(block, Y, y)
    put(block, BIAS, bias)
    put(block, RESIDUAL, residual)
    block[HAS_RESIDUAL] = has_residual
    publish(block, sequence)


@_jit
def _image_run(run, runs, images, job, x, y, residual, planes, shape, geometry, arrays, bias,
               spill, edge, parts):
    """Every part of each image of run ``run`` (of ``runs`` even runs of consecutive images)
    of :func:`native_conv_images`, on this thread over its own ``planes``."""
    rows_at, places, bounds, panels, weights, limits, no_bias = arrays
    channels, outputs = x.shape[0] // images, y.shape[0] // images
    for image in range(images * run // runs, images * (run + 1) // runs):
        one = x[image * channels:(image + 1) * channels]
        out = y[image * outputs:(image + 1) * outputs]
        added = residual[image * outputs:(image + 1) * outputs]
        if not job[1] and not job[3]:  # neither split by rows nor a 1x1 read in place
            _build(one, planes, shape, geometry, job[2], 0, geometry[7])
        for part in range(parts):
            _part(part, job, one, planes, planes, shape, geometry, rows_at, places, bounds,
                  panels, weights, out, bias, added, limits, spill, edge, no_bias)


@_jit
def _fixed_arguments(words, like):
    """What a convolution's parts read that does not change from call to call, from its kit
    (the caller's side) or the pool's block (the worker's), which lay it out alike: the
    arrays (rows_at, places, bounds, panels, weights, limits, no_bias; floats in the dtype
    of ``like``), the planes' shape, the geometry, the form (taps, by_rows, strips,
    in_place, chunk, row_block, column_block) and the number of parts."""
    index = np.int64(0)
    arrays = (get1(words, ROWS_AT, index), get2(words, PLACES, index),
              get1(words, BOUNDS, index), get3(words, PANELS, like), get2(words, WEIGHTS, like),
              get1(words, LIMITS, like), get1(words, NO_BIAS, like))
    shape = (words[SHAPE0], words[SHAPE1], words[SHAPE2], words[SHAPE3])
    geometry = (words[PH], words[PW], words[SY], words[SX], words[TOP], words[LEFT],
                words[HALO], words[OH], words[OW])
    form = (words[TAPS], words[BY_ROWS] != 0, words[STRIPS] != 0, words[IN_PLACE] != 0,
            words[CHUNK], words[ROW_BLOCK], words[COLUMN_BLOCK])
    return arrays, shape, geometry, form, words[PARTS]


@_jit
def _worker_parts(block, zero):
    """The worker's side of :func:`native_conv`, in the dtype of ``zero``."""
    x, y = get3(block, X, zero), get2(block, Y, zero)
    planes, own = get1(block, PLANES, zero), get1(block, WORKER_PLANES, zero)
    bias, residual = get1(block, BIAS, zero), get2(block, RESIDUAL, zero)
    spill, edge = get2(block, WORKER_SPILL, zero), get2(block, WORKER_EDGE, zero)
    arrays, shape, geometry, form, parts = _fixed_arguments(block, zero)
    rows_at, places, bounds, panels, weights, limits, no_bias = arrays
    job = form + (block[HAS_RESIDUAL] != 0,)
    images, runs = block[IMAGES], block[IMAGE_RUNS]
    if images > 0:  # runs of whole images (native_conv_images), over this thread's planes
        run = claim(block, runs)
        while run >= 0:
            _image_run(run, runs, images, job, x, y, residual, own, shape, geometry, arrays,
                       bias, spill, edge, parts)
            run = claim(block, runs)
        return
    part = claim(block, parts)
    while part >= 0:
        _part(part, job, x, own, planes, shape, geometry, rows_at, places, bounds, panels,
              weights, y, bias, residual, limits, spill, edge, no_bias)
        part = claim(block, parts)


# the worker's side, in each dtype, through the pool's job table (_jit_native_pool.register_job)
@first_use_cfunc(JOB_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def _conv_job_f(raw, unused):
    _worker_parts(carray(raw, (BLOCK_WORDS,)), np.float32(0))


@first_use_cfunc(JOB_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def _conv_job_d(raw, unused):
    _worker_parts(carray(raw, (BLOCK_WORDS,)), np.float64(0))


register_job(CONV_JOB, _conv_job_f, _conv_job_d)
