"""Compiled products against a weight packed into column panels (``ops/nn/matmul_cpu.py``), on
the tile of ``ops/panels/_jit_tile.py``, and their split over the native worker pool.

OpenBLAS packs both operands on every sgemm call and splits a 128-row product poorly over
two threads: BERT's 128 x 768 @ 768 x 768 ran at 385 GFLOP/s on this 2-core machine, where
one thread alone reached 212 and onnxruntime (its weights packed once) ~490. Here the
constant weight is packed once, into panels of ``2 * lanes`` columns (``lanes`` = one
64-byte vector: 16 floats, 8 doubles), each panel a contiguous (K, 2 * lanes) block, and
the activation is read where it lies.

The tile is also served here behind C entry points (``tile_f``, ``tile_d``), for compiled
kernels in other files.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types

from mixrt.ops.compiled.first_use import first_use_cfunc
from mixrt.ops.panels._jit_native_pool import (
    BLOCK_WORDS, ITEMSIZE, JOB, JOB_SIGNATURE, PARTS, PRODUCT_A, PRODUCT_BIAS, PRODUCT_BOUNDS,
    PRODUCT_C, PRODUCT_JOB, PRODUCT_LIMITS, PRODUCT_PACKED, PRODUCT_PACKS, PRODUCT_PANELS,
    PRODUCT_SPILL, PRODUCT_STRIPS, begin, claim, finish, get1, get2, get3, pointer_like,
    publish, put, register_job)
from mixrt.ops.panels._jit_atomics import address, fetch_add, load, pause
from mixrt.ops.panels._jit_prefetch import prefetch_run
from mixrt.ops.panels._jit_dense_tiles import (WIDE_ROWS, _btile12_packed, _dense_biased_tile,
                                              _dense_half_tile, _dense_tile, _tile12_packed,
                                              _wide_biased_tile, _wide_tile, wide_across)
from mixrt.ops.panels._jit_tile import DENSE_ROWS, PACKED_STRIDE, _tile, limited
from mixrt.ops.panels._jit_transpose import transpose

# Rows taken through all of a thread's panels before the next rows: whole strips of DENSE_ROWS
# (115 before the strips were 12, an accident of an older file's names, 2026-12-02). 300 rows
# in one block against 120 read within noise of each other on BERT's products (0.85-0.92 of the
# 8-row strips either way), so the block stays small enough that A's rows stay in L2 at K 3072.
ROW_BLOCK = 120

_jit = njit(nogil=True, cache=True, boundscheck=False)


@_jit
def panel_product(a, panels, c, p0, p1, spill, bias, limits):
    """:func:`packed_rows_product` with nothing packed ahead: its strips packed here, block
    by block, where they serve more than one panel."""
    packed_rows_product(a, panels, c, p0, p1, spill, bias, limits, np.empty(0, a.dtype), 0)


@_jit
def packed_rows_product(a, panels, c, p0, p1, spill, bias, limits, shared, first_strip):
    """``c = a @ w (+ bias)`` over the panels p0..p1 of ``w``: ``a`` (rows, K) and ``c``
    (rows, N) with contiguous rows, ``panels`` (P, K, width) the weight's columns zero-padded
    to P * width, ``spill`` a (DENSE_ROWS, width) scratch for a last panel that reaches past
    N, ``bias`` one value per column added to each finished sum in its register as the tile
    is stored (as ``c += bias`` afterwards would add it), or empty. ``limits``: a dense
    layer's activation as (low, high, slope) in c's dtype (``direct_forms.activation_limits``
    in the tile's order), applied to each sum after its bias (:func:`limited`), or empty.
    Rows go in blocks of ROW_BLOCK so that a block of ``a`` stays in L2 while the thread's
    panels pass over it. Over more than one panel, a block's whole strips are packed first
    (:func:`_pack_strips`) and their tiles read them packed (``_jit_dense_tiles._tile12_packed``);
    a strip of fewer rows, or a part of one panel, reads ``a`` in place. Where ``shared`` is
    not empty, every whole strip of ``a`` was packed there already (strip t of ``a`` as strip
    ``first_strip + t``: :func:`native_packed_product`), and is read from there.

    Each strip of a panel also asks for its share of the next panel's cache lines
    (:func:`_ask_ahead`): in a model's run a weight comes from L3 or memory (a BERT's are
    tens of MB), and a panel's first strip waited on each line of it, two lines a k, faster
    than one core's stream brings them. One process, 20-81 weights taken in turn so that each
    comes cold (2026-12-02), against the same strips without: 25 x 384 @ 384 x 384 0.76,
    25 x 384 @ 384 x 1536 0.78, 137 x 384 @ 384 x 1536 0.81, 137 x 1536 @ 1536 x 384 0.94,
    300 x 384 @ 384 x 1536 0.94, 64 x 768 @ 768 x 3072 0.82 (two panels ahead: no better)."""
    rows, columns = c.shape
    k_len, width = panels.shape[1], panels.shape[2]
    lda, ldc = a.strides[0] // a.itemsize, c.strides[0] // c.itemsize
    biased = bias.shape[0] > 0
    limiting = limits.shape[0] > 0
    low, high, slope = _limits(limits)
    flat_panels, panel_size = panels.reshape(-1), k_len * width
    packed_ahead = shared.shape[0] > 0
    packing = packed_ahead or (p1 - p0 > 1 and rows >= DENSE_ROWS)
    strips = shared if packed_ahead else \
        np.empty(-(-min(rows, ROW_BLOCK) // DENSE_ROWS) * PACKED_STRIDE * k_len
                 if packing else 0, a.dtype)
    if 0 < rows <= WIDE_ROWS and not packed_ahead:  # a few rows: panels side by side
        p0 = _wide_panels(a, panels, c, p0, p1, bias, limits)
    for r0 in range(0, rows, ROW_BLOCK):
        r1 = min(rows, r0 + ROW_BLOCK)
        share = -(-panel_size // -(-(r1 - r0) // DENSE_ROWS))  # of the next panel, a strip
        if packing and not packed_ahead:
            _pack_strips(a, r0, r1, strips, 0)
        # where strip s of this block lies in ``strips``: the block's own, or a's shared
        first = first_strip if packed_ahead else -(r0 // DENSE_ROWS)
        for p in range(p0, p1):
            column = p * width
            offset = p * panel_size
            inside = column + width <= columns
            for s in range(r0, r1, DENSE_ROWS):
                if p + 1 < p1:
                    _ask_ahead(flat_panels, offset + panel_size, panel_size,
                               (s - r0) // DENSE_ROWS * share, share)
                count = min(DENSE_ROWS, r1 - s)
                if packing and inside and count == DENSE_ROWS:  # the strip packed k by k
                    strip = (first + s // DENSE_ROWS) * PACKED_STRIDE
                    if biased:
                        _btile12_packed(strips, strip * k_len, 1, panels, offset, width,
                                        c, s * ldc + column, ldc, k_len, bias, column, low,
                                        high, slope)
                    else:
                        _tile12_packed(strips, strip * k_len, 1, panels, offset, width, c,
                                       s * ldc + column, ldc, k_len)
                        if limiting:
                            _limit(c, s, count, column, width, low, high, slope)
                elif inside and biased:  # the bias and activation in the tile's registers
                    _dense_biased_tile(count, a, s * lda, lda, panels, offset, width, c,
                                       s * ldc + column, ldc, k_len, bias, column, low, high,
                                       slope)
                elif inside:
                    _dense_tile(count, a, s * lda, lda, panels, offset, width, c,
                                s * ldc + column, ldc, k_len)
                    if limiting:
                        _limit(c, s, count, column, width, low, high, slope)
                else:
                    if columns - column <= width // 2:  # padding past one vector: skip it
                        _dense_half_tile(count, a, s * lda, lda, panels, offset, width,
                                         spill, 0, width, k_len)
                    else:
                        _dense_tile(count, a, s * lda, lda, panels, offset, width, spill, 0,
                                    width, k_len)
                    for i in range(count):
                        for j in range(columns - column):
                            value = spill[i, j] + bias[column + j] if biased else spill[i, j]
                            c[s + i, column + j] = limited(value, low, high, slope) \
                                if limiting else value


@_jit
def _wide_panels(a, panels, c, p0, p1, bias, limits):
    """The panels from ``p0`` of a product of 1..WIDE_ROWS rows (:func:`packed_rows_product`'s
    arguments) through the wide tiles (``_jit_dense_tiles.WIDE_ACROSS``), as many of them side by
    side as the tile takes, while whole ones remain; the first panel left to take one by one.
    The next group's lines are asked for as a group starts, as one panel's are there."""
    rows, columns = c.shape
    k_len, width = panels.shape[1], panels.shape[2]
    lda, ldc = a.strides[0] // a.itemsize, c.strides[0] // c.itemsize
    across = wide_across(rows)
    biased = bias.shape[0] > 0
    low, high, slope = _limits(limits)
    flat_panels, panel_size = panels.reshape(-1), k_len * width
    p = p0
    while p + across <= p1 and (p + across) * width <= columns:
        offset, column = p * panel_size, p * width
        ahead = min(across, p1 - p - across) * panel_size  # the next group's
        if ahead > 0:
            _ask_ahead(flat_panels, offset + across * panel_size, ahead, 0, ahead)
        if biased:
            _wide_biased_tile(rows, a, lda, panels, offset, width, c, column, ldc, k_len, bias,
                              column, low, high, slope, panel_size)
        else:
            _wide_tile(rows, a, lda, panels, offset, width, c, column, ldc, k_len, panel_size)
            if limits.shape[0] > 0:
                _limit(c, 0, rows, column, across * width, low, high, slope)
        p += across
    return p


@_jit
def _limit(c, s, count, column, width, low, high, slope):
    """The activation (:func:`limited`) on a tile's outputs in C: rows s.. s + count,
    columns column.. column + width."""
    for i in range(count):
        for j in range(width):
            c[s + i, column + j] = limited(c[s + i, column + j], low, high, slope)


@_jit
def _pack_strips(a, r0, r1, strips, at):
    """The whole strips of rows r0..r1 of ``a`` packed k by k: strip t's a[s + i, k] at
    ``strips[(at + t) * PACKED_STRIDE * K + k * PACKED_STRIDE + i]`` (s = r0 + t *
    DENSE_ROWS), each strip a transpose in registers (``_jit_transpose``), from ``a``'s
    memory read flat (its rows contiguous, ``lda`` apart)."""
    k_len = a.shape[1]
    lda = a.strides[0] // a.itemsize
    flat = carray(pointer_like(address(a), a.dtype.type(0)), ((r1 - 1) * lda + k_len,))
    for s in range(r0, r1 - DENSE_ROWS + 1, DENSE_ROWS):
        transpose(flat, s * lda, lda, strips,
                  (at + (s - r0) // DENSE_ROWS) * PACKED_STRIDE * k_len, PACKED_STRIDE,
                  DENSE_ROWS, k_len)


@_jit
def _ask_ahead(flat_panels, start, size, first, count):
    """Prefetch elements ``first .. first + count`` of the panel at ``start`` (``size``
    elements), those of them that exist."""
    if first < size:
        prefetch_run(flat_panels, start + first, min(count, size - first))


@_jit
def _limits(limits):
    """(low, high, slope) from ``limits``, or the ones that change nothing where it is
    empty (-inf, inf, 1)."""
    if limits.shape[0] > 0:
        return limits[0], limits[1], limits[2]
    inf = limits.dtype.type(np.inf)
    return -inf, inf, limits.dtype.type(1)


@_jit
def product(a, b, c, edge, spill):
    """``c = a @ b`` with ``b``'s panels read in place (a MatMul of two computed tensors, as
    in attention's ``Q @ K^T``): ``a`` (rows, K), ``b`` (K, N), ``c`` (rows, N), each with
    contiguous rows. A last panel that reaches past N is first copied into ``edge`` (K,
    width), zero-padded, and its tiles written through ``spill`` (DENSE_ROWS, width)."""
    rows, k_len = a.shape
    columns = b.shape[1]
    width = spill.shape[1]
    lda, ldb, ldc = a.strides[0] // a.itemsize, b.strides[0] // b.itemsize, \
        c.strides[0] // c.itemsize
    for p in range(-(-columns // width)):
        column = p * width
        if column + width <= columns:
            for s in range(0, rows, DENSE_ROWS):
                _dense_tile(min(DENSE_ROWS, rows - s), a, s * lda, lda, b, column, ldb, c,
                            s * ldc + column, ldc, k_len)
            continue
        left = columns - column
        for k in range(k_len):
            for j in range(left):
                edge[k, j] = b[k, column + j]
            for j in range(left, width):
                edge[k, j] = 0
        for s in range(0, rows, DENSE_ROWS):
            count = min(DENSE_ROWS, rows - s)
            _dense_tile(count, a, s * lda, lda, edge, 0, width, spill, 0, width, k_len)
            for i in range(count):
                for j in range(left):
                    c[s + i, column + j] = spill[i, j]


@_jit
def batched_product(a, b, c, n0, n1, edge, spill):
    """``c[n] = a[n] @ b[n]`` for the stacked matrices n0..n1 (3-D arrays)."""
    for n in range(n0, n1):
        product(a[n], b[n], c[n], edge, spill)


# -- split between threads in native code (see ops/panels/_jit_native_pool.py, JOB) --------------

@_jit
def native_product(block, parts, a, panels, c, bounds, spill, worker_spill, bias, limits):
    """``c = a @ w (+ bias)``, then the activation ``limits`` (:func:`panel_product`), over
    ``parts`` parts, part p the panels
    ``bounds[4p]..bounds[4p + 1]`` of rows ``bounds[4p + 2]..bounds[4p + 3]``, taken by this
    thread and the pool's worker (with another caller using the pool, all here); each part
    packs the strips it reads (:func:`native_packed_product` packs them once for all)."""
    native_packed_product(block, parts, a, panels, c, bounds, spill, worker_spill, bias,
                          limits, np.empty(0, a.dtype), 0)


@_jit
def native_packed_product(block, parts, a, panels, c, bounds, spill, worker_spill, bias,
                          limits, strips, packs):
    """:func:`native_product` with ``a``'s whole strips packed into ``strips`` first, in
    ``packs`` parts the threads claim before the product's parts (which wait until all are
    packed), where ``packs`` > 0: parts that share rows (runs of panels over the same
    rows) each packed those rows again, so a 752 x 1536 @ 1536 x 384 product in six parts
    packed its A six times, ~270 us each, a quarter of its two threads' time."""
    sequence = begin(block) if parts > 1 else -1
    if sequence < 0:
        for pack in range(packs):
            _pack_part(a, strips, pack, packs)
        for part in range(parts):
            _product_part(a, panels, c, bounds, part, spill, bias, limits, strips)
        return
    block[JOB] = PRODUCT_JOB
    put(block, PRODUCT_A, a)
    put(block, PRODUCT_PANELS, panels)
    put(block, PRODUCT_C, c)
    put(block, PRODUCT_BOUNDS, bounds)
    put(block, PRODUCT_SPILL, worker_spill)
    put(block, PRODUCT_BIAS, bias)
    put(block, PRODUCT_LIMITS, limits)
    put(block, PRODUCT_STRIPS, strips)
    block[ITEMSIZE], block[PARTS] = a.itemsize, parts
    block[PRODUCT_PACKS], block[PRODUCT_PACKED] = packs, 0
    publish(block, sequence)
    _take_parts(block, a, panels, c, bounds, spill, bias, limits, strips, packs, parts)
    finish(block)


@_jit
def _take_parts(block, a, panels, c, bounds, spill, bias, limits, strips, packs, parts):
    """A thread's side of :func:`native_packed_product`: the packing parts, then the
    product's, as it claims them (in order: every packing part is claimed, by a thread
    that is packing it, before any product part is, so the wait below ends)."""
    item = claim(block, packs + parts)
    while item >= 0:
        if item < packs:
            _pack_part(a, strips, item, packs)
            fetch_add(block, PRODUCT_PACKED, 1)  # after its stores, as the loads below see
        else:
            while load(block, PRODUCT_PACKED) < packs:
                pause()
            _product_part(a, panels, c, bounds, item - packs, spill, bias, limits, strips)
        item = claim(block, packs + parts)


@_jit
def _pack_part(a, strips, pack, packs):
    """Packing part ``pack`` of ``packs``: its share of ``a``'s whole strips."""
    whole = a.shape[0] // DENSE_ROWS
    t0, t1 = whole * pack // packs, whole * (pack + 1) // packs
    if t1 > t0:
        _pack_strips(a, t0 * DENSE_ROWS, t1 * DENSE_ROWS, strips, t0)


@_jit
def _product_part(a, panels, c, bounds, part, spill, bias, limits, strips):
    """Part ``part`` of :func:`native_product`: its panels over its rows (which start at a
    whole strip: ``product_parts.even_parts``)."""
    at = 4 * part
    r0, r1 = bounds[at + 2], bounds[at + 3]
    packed_rows_product(a[r0:r1], panels, c[r0:r1], bounds[at], bounds[at + 1], spill, bias,
                        limits, strips, r0 // DENSE_ROWS)


@_jit
def _worker_product(block, zero):
    a, c = get2(block, PRODUCT_A, zero), get2(block, PRODUCT_C, zero)
    panels, spill = get3(block, PRODUCT_PANELS, zero), get2(block, PRODUCT_SPILL, zero)
    bounds = get1(block, PRODUCT_BOUNDS, np.int64(0))
    bias, limits = get1(block, PRODUCT_BIAS, zero), get1(block, PRODUCT_LIMITS, zero)
    strips = get1(block, PRODUCT_STRIPS, zero)
    _take_parts(block, a, panels, c, bounds, spill, bias, limits, strips,
                block[PRODUCT_PACKS], block[PARTS])


@_jit
def swap_last_axes(source, target):
    """``target[b, j, i] = source[b, i, j]``: a batch of (A, B) matrices written as (B, A),
    C-contiguous floats (the pixel rows of a 1x1 convolution over a small plane,
    ``ops/conv/pointwise_rows.py``, and its output back to channels), in blocks transposed
    in registers (``_jit_transpose.py``). NumPy's copy of a transposed view walked the
    source a column at a time: 576 channels of 6 x 6 pixels took 13-15 us, a loop of one
    value at a time 8; 5 images of 576 channels at 6 x 8 40.6 us that way, 19.8 in blocks."""
    images, a, b = source.shape
    flat_source, flat_target = source.reshape(-1), target.reshape(-1)
    for image in range(images):
        transpose(flat_source, image * a * b, b, flat_target, image * a * b, a, a, b)


@_jit
def pixel_rows_conv(block, parts, x, rows, panels, products, y, bounds, spill, worker_spill,
                    bias, residual, has_residual, low, high, slope):
    """A 1x1 convolution over small planes as a product of pixel rows
    (``ops/conv/pointwise_rows.py``), in one call: ``x`` (N, C, P) written as ``rows`` (N * P,
    C), their product with ``panels`` plus ``bias`` into ``products`` (N * P, M) over the parts
    of ``bounds`` (:func:`native_product`), then each output of ``y`` (N, M, P) from its
    product: + ``residual`` (y's layout) when ``has_residual``, times ``slope`` below zero,
    clamped to [low, high] by comparisons (NaN passes), as the direct convolutions' tile
    finishes its outputs. As separate calls (two copies, the product, an epilogue pass) a
    64 -> 64 layer at 6 x 6 took 10.9 us, here 9.5."""
    n, m, p = y.shape
    swap_last_axes(x, rows.reshape((n, p, x.shape[1])))
    native_product(block, parts, rows, panels, products, bounds, spill, worker_spill, bias,
                   bias[:0])  # its activation comes with its epilogue, below
    if has_residual:  # read and written one at a time: the residual may be y itself
        for b in range(n):
            for i in range(p):
                for j in range(m):
                    y[b, j, i] = limited(products[b * p + i, j] + residual[b, j, i], low,
                                         high, slope)
        return
    swap_last_axes(products.reshape((n, p, m)), y)  # in blocks, then finished in order
    for b in range(n):
        for j in range(m):
            for i in range(p):
                y[b, j, i] = limited(y[b, j, i], low, high, slope)


# the worker's side, in each dtype, through the pool's job table (_jit_native_pool.register_job)
@first_use_cfunc(JOB_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def _product_job_f(raw, unused):
    _worker_product(carray(raw, (BLOCK_WORDS,)), np.float32(0))


@first_use_cfunc(JOB_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def _product_job_d(raw, unused):
    _worker_product(carray(raw, (BLOCK_WORDS,)), np.float64(0))


register_job(PRODUCT_JOB, _product_job_f, _product_job_d)


# -- the tile, for compiled kernels in other files -------------------------------------------
#
# ``tile_f`` and ``tile_d`` are :func:`_tile` behind a C entry point of TILE_SIGNATURE, for a
# kernel in another file to call through its address (ops/rnn/_jit_recurrent.py), so that its
# cached code never holds a copy of the tile: ``(rows, a, a_offset, lda, panels,
# panel_offset, ldw, c, c_offset, ldc, k)`` with a, panels and c as addresses, as in
# :func:`_tile` (c = a @ panel for 1..8 rows).

TILE_SIGNATURE = types.void(*([types.int64] * 11))


@_jit
def _tile_at(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, zero):
    _tile(rows, carray(pointer_like(a, zero), (a_offset + rows * lda,)), a_offset, lda,
          carray(pointer_like(panels, zero), (panel_offset + k_len * ldw,)), panel_offset,
          ldw, carray(pointer_like(c, zero), (c_offset + rows * ldc,)), c_offset, ldc, k_len)


@first_use_cfunc(TILE_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def tile_f(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len):
    _tile_at(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len,
             np.float32(0))


@first_use_cfunc(TILE_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def tile_d(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len):
    _tile_at(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len,
             np.float64(0))
