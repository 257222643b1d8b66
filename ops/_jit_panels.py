"""Compiled products against a weight packed into column panels (``ops/matmul_cpu.py``),
and the direct convolutions built on the same tile (``ops/conv_direct_cpu.py``).

OpenBLAS packs both operands on every sgemm call and splits a 128-row product poorly over
two threads: BERT's 128 x 768 @ 768 x 768 ran at 385 GFLOP/s on this 2-core machine, where
one thread alone reached 212 and onnxruntime (its weights packed once) ~490. Here the
constant weight is packed once, into panels of ``2 * lanes`` columns (``lanes`` = one
64-byte vector: 16 floats, 8 doubles), each panel a contiguous (K, 2 * lanes) block, and
the activation is read where it lies.

The inner kernel computes a tile of up to eight rows by one panel with its sums held in
registers: for each k, two vector loads of the panel's row and, per activation row, one
broadcast and two fused multiply-adds. numba's loops did not get there (written as scalar
sums, LLVM left them unvectorized; as dot products along K, the sixteen horizontal
reductions per tile held them to 165 GFLOP/s), so the tile is emitted as LLVM IR through
``numba.extending.intrinsic``, with ``<lanes x float>`` values and ``llvm.fma``. One thread
runs it at ~250 GFLOP/s.

Each sum is the sequence ``fma(a[i, k], w[k, j], sum)`` over a block of K_BLOCK values of k,
the blocks' sums then added in order: NaNs and infinities propagate as in any product, and a
long K is not one chain of roundings.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
from llvmlite import binding, ir
from numba import carray, cfunc, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from mixrt.ops._jit_atomics import address, compare_swap, fetch_add, load, pause, store
from mixrt.ops.parallel import intra_op_threads

VECTOR_BYTES = 64
PANEL_VECTORS = 2  # vectors across a panel: 32 floats or 16 doubles
STRIP_ROWS = 8  # activation rows of one tile: 16 sums in registers, 2 panel vectors, a broadcast
ROW_BLOCK = 256  # rows taken through all of a thread's panels before the next rows
K_BLOCK = 128  # k per block of sums added to the totals (see _tile_codegen)

_jit = njit(nogil=True, cache=True, boundscheck=False)
binding.initialize_native_asmparser()  # for the futex's inline ``syscall`` (numba leaves it out)


def _make_tile(rows: int, finished: bool = False):
    """The tile kernel for ``rows`` activation rows: ``c[i, j] = sum_k a[i, k] * w[k, j]``
    for i < rows and the panel's columns j. Arguments: flat ``a`` and its offset and row
    stride, flat ``panels`` and the panel's offset and row stride (the panel's width when it
    is packed, a row of the matrix when the panel is read in place), flat ``c`` and its
    offset and row stride, and K.

    ``finished``: the convolution's epilogue on the way out, from seven more arguments
    (``bias, bias_offset, residual, has_residual, low, high, slope``): the sums start at
    ``bias[bias_offset + i]`` for row i; ``residual`` (c's layout, read at c's offsets) is
    added when ``has_residual``, values below zero are multiplied by ``slope`` and the
    result is clamped to [low, high] by comparisons (NaN passes through). Its last argument,
    ``columns``, is how many of the panel's columns exist: fewer than a panel's width (a
    last panel of outputs read in place) and the panel's rows, the residual and c are read
    and written under a mask, so nothing past them is touched."""

    if not finished:
        @intrinsic
        def tile(typingctx, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc,
                 k_len):
            sig = types.void(a, types.intp, types.intp, panels, types.intp, types.intp, c,
                             types.intp, types.intp, types.intp)
            return sig, _tile_codegen(rows, finished=False, taps=False)
        return tile

    @intrinsic
    def finished_tile(typingctx, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset,
                      ldc, k_len, bias, bias_offset, residual, has_residual, low, high, slope,
                      columns):
        # ``gathered``: ldw is an array, row k of the panel at ``panel_offset + ldw[k]``
        gathered = isinstance(ldw, types.Array)
        sig = types.void(a, types.intp, types.intp, panels, types.intp,
                         ldw if gathered else types.intp, c, types.intp, types.intp,
                         types.intp, bias, types.intp, residual, types.boolean, a.dtype,
                         a.dtype, a.dtype, types.intp)
        return sig, _tile_codegen(rows, finished=True, taps=False, gathered=gathered)
    return finished_tile


def _make_tap_tile(rows: int):
    """The tile of a convolution with its output positions as rows, read at their taps:
    ``a[i, k] = image[rows_at[k] + places[strip + i]]`` (``rows_at[k]`` tap k's offset in
    the flat phase planes ``image``, ``places`` each output's place in them), the panels
    packed (rows ``2 * lanes`` apart), a bias per column (read for the whole panel), the
    epilogue of a finished :func:`_make_tile`, and the tile stored transposed: column j's
    ``rows`` values as one vector at ``c_offset + j * ldc``, consecutive outputs of one
    channel, for the first ``columns`` columns (a last panel's channels). In its first
    ``ahead_rows`` steps of k it also asks for panel row ``ahead / width + k`` (a later
    panel's rows, spread over the tiles that use this one, so that it comes from memory
    while they compute: a burst of prefetches at each tile's start mostly fell away)."""

    @intrinsic
    def tile(typingctx, image, strip, places, panels, panel_offset, rows_at, c, c_offset,
             ldc, k_len, bias, bias_offset, residual, has_residual, low, high, slope, columns,
             ahead, ahead_rows):
        sig = types.void(image, types.intp, places, panels, types.intp, rows_at, c,
                         types.intp, types.intp, types.intp, bias, types.intp, residual,
                         types.boolean, image.dtype, image.dtype, image.dtype, types.intp,
                         types.intp, types.intp)
        return sig, _tile_codegen(rows, finished=True, taps=True)

    return tile


def _tile_codegen(rows: int, finished: bool, taps: bool, gathered: bool = False):
    def codegen(context, builder, signature, args):
        (a_arg, a_offset, lda, panels_arg, panel_offset, ldw, c_arg, c_offset, ldc,
         k_len) = args[:10]
        scalar = context.get_value_type(signature.args[0].dtype)
        itemsize = 4 if isinstance(scalar, ir.FloatType) else 8
        lanes = VECTOR_BYTES // itemsize
        vector = ir.VectorType(scalar, lanes)
        index = ir.IntType(64)

        def data(position, value):
            return context.make_array(signature.args[position])(context, builder, value).data

        def spread(value, width=lanes):
            """``value`` in every lane of a ``width`` vector."""
            undefined = ir.Constant(ir.VectorType(value.type, width), ir.Undefined)
            return builder.shuffle_vector(
                builder.insert_element(undefined, value, ir.Constant(ir.IntType(32), 0)),
                undefined, ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width))

        def at(pointer, offset):
            return builder.gep(pointer, [offset if isinstance(offset, ir.Value)
                                         else ir.Constant(index, offset)])

        # a last panel of fewer columns (finished, not taps): the lanes of each panel vector
        # that exist, for masked loads and stores (None: a whole panel, plain ones)
        masks = None

        def load_vector(pointer, offset, width=lanes, mask=None):
            address = builder.bitcast(at(pointer, offset), ir.VectorType(scalar, width)
                                      .as_pointer())
            if mask is None:
                return builder.load(address, align=itemsize)
            return builder.call(masked_load, [address, ir.Constant(ir.IntType(32), itemsize),
                                              mask, ir.Constant(vector, [0.0] * lanes)])

        def store_vector(value, pointer, offset, mask=None):
            address = builder.bitcast(at(pointer, offset), value.type.as_pointer())
            if mask is None:
                builder.store(value, address, align=itemsize)
                return
            builder.call(masked_store, [value, address, ir.Constant(ir.IntType(32), itemsize),
                                        mask])

        if taps:  # the image; each row's place in it, loaded once; the taps' offsets
            A = data(0, a_arg)
            places = at(data(2, lda), a_offset)
            row_places = [builder.load(at(places, i)) for i in range(rows)]
            rows_at = data(5, ldw)
            ldw = ir.Constant(index, lanes * PANEL_VECTORS)
        else:
            A = at(data(0, a_arg), a_offset)
        W = at(data(3, panels_arg), panel_offset)
        if gathered:  # each panel row's own offset (the weight on the left of a tap conv)
            w_rows_at = data(5, ldw)
        kind = f"v{lanes}{'f32' if lanes == 16 else 'f64'}"
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector, [vector] * 3), f"llvm.fma.{kind}")
        mask_type = ir.VectorType(ir.IntType(1), lanes)
        masked_load = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector, [vector.as_pointer(), ir.IntType(32),
                                                     mask_type, vector]),
            f"llvm.masked.load.{kind}.p0")
        masked_store = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [vector, vector.as_pointer(),
                                                            ir.IntType(32), mask_type]),
            f"llvm.masked.store.{kind}.p0")
        # the sums live in allocas that LLVM promotes to registers (mem2reg)
        if not finished:
            starts = [[ir.Constant(vector, [0.0] * lanes)] * PANEL_VECTORS] * rows
        elif taps:  # a bias per column: one vector load per panel vector
            bias = at(data(10, args[10]), args[11])
            starts = [[load_vector(bias, v * lanes) for v in range(PANEL_VECTORS)]] * rows
        else:  # a bias per row
            bias = at(data(10, args[10]), args[11])
            starts = [[spread(builder.load(at(bias, i)))] * PANEL_VECTORS
                      for i in range(rows)]

        if taps:
            hint = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()]
                                                + [ir.IntType(32)] * 3), "llvm.prefetch.p0")
            ahead, ahead_rows = args[18], args[19]

        def step(k, sums):
            """One k: the panel's row, each row's a[i, k] spread, the multiply-adds."""
            w_row = at(W, builder.load(at(w_rows_at, k)) if gathered else builder.mul(k, ldw))
            w = [load_vector(w_row, v * lanes, mask=masked(v)) for v in range(PANEL_VECTORS)]
            if taps:  # a later panel's row k, while k < ahead_rows
                with cgutils.if_unlikely(builder, builder.icmp_signed("<", k, ahead_rows)):
                    later = at(w_row, ahead)
                    for line in range(PANEL_VECTORS * VECTOR_BYTES // 64):
                        builder.call(hint, [builder.bitcast(at(later, line * 64 // itemsize),
                                                            ir.IntType(8).as_pointer()),
                                            ir.Constant(ir.IntType(32), 0),
                                            ir.Constant(ir.IntType(32), 3),
                                            ir.Constant(ir.IntType(32), 1)])
            # a[i, k]: rows lda apart and k unit-stride, or (taps) tap k's offset from row
            # i's place
            if taps:
                a_column = at(A, builder.load(at(rows_at, k)))
            else:
                a_column = at(A, k)
            for i in range(rows):
                place = row_places[i] if taps else builder.mul(ir.Constant(index, i), lda)
                value = spread(builder.load(at(a_column, place)))
                for v in range(PANEL_VECTORS):
                    total = builder.call(fma, [value, w[v], builder.load(sums[i][v])])
                    builder.store(total, sums[i][v])

        def run_and_store():
            """The sums over K, then the tile stored (finished: through the epilogue)."""
            # K goes in blocks of K_BLOCK: each block's sums start at zero and are then added
            # to the totals, so that a long K is not one chain of roundings (a 64 x 576 layer
            # of SqueezeNet: 2.3e-6 of the largest output in one chain, 1.7e-6 via OpenBLAS)
            totals = [[cgutils.alloca_once_value(builder, starts[i][v])
                       for v in range(PANEL_VECTORS)] for i in range(rows)]
            zeros = ir.Constant(vector, [0.0] * lanes)
            sums = [[cgutils.alloca_once_value(builder, zeros) for _ in range(PANEL_VECTORS)]
                    for _ in range(rows)]
            block = ir.Constant(index, K_BLOCK)
            blocks = builder.udiv(builder.add(k_len, ir.Constant(index, K_BLOCK - 1)), block)
            with cgutils.for_range(builder, blocks) as outer:
                k0 = builder.mul(outer.index, block)
                span = builder.sub(k_len, k0)
                span = builder.select(builder.icmp_signed("<", span, block), span, block)
                for row_sums in sums:
                    for part in row_sums:
                        builder.store(zeros, part)
                with cgutils.for_range(builder, span) as inner:
                    step(builder.add(k0, inner.index), sums)
                for row_sums, row_totals in zip(sums, totals):
                    for total, part in zip(row_totals, row_sums):
                        builder.store(builder.fadd(builder.load(total), builder.load(part)),
                                      total)
            store_tile(totals)

        C = at(data(6, c_arg), c_offset)

        def masked(v):
            return None if masks is None or v is None else masks[v]

        def put(value, pointer, offset, v=None):
            store_vector(value, pointer, offset, mask=masked(v))

        def finish(value, adding, offset, v=None):
            if finished:
                value = _epilogue(builder, value, adding, offset, args[14:17], spread,
                                  lambda p, o, w: load_vector(p, o, w, mask=masked(v)))
            return value

        if taps:
            def store(*arguments):
                _transposed_store(*arguments, columns=args[17])
        else:
            store = _row_store

        def store_tile(sums):
            if not finished:
                store(builder, sums, C, None, ldc, finish, put)
                return
            residual = at(data(12, args[12]), c_offset)
            with builder.if_else(args[13]) as (with_residual, without):
                with with_residual:
                    store(builder, sums, C, residual, ldc, finish, put)
                with without:
                    store(builder, sums, C, None, ldc, finish, put)

        if not finished or taps:
            run_and_store()
            return context.get_dummy_value()
        # the weight on the left: a whole panel, or its first ``columns`` under a mask
        columns = args[17]
        whole = builder.icmp_signed(">=", columns, ir.Constant(index, PANEL_VECTORS * lanes))
        with builder.if_else(whole, likely=True) as (plain, partial):
            with plain:
                run_and_store()
            with partial:
                mask_index = ir.VectorType(index, lanes)
                limit = spread(columns)
                masks = [builder.icmp_signed("<", ir.Constant(mask_index, [
                    v * lanes + lane for lane in range(lanes)]), limit)
                    for v in range(PANEL_VECTORS)]
                run_and_store()
        return context.get_dummy_value()

    return codegen


def _row_store(builder, sums, C, residual, ldc, finish, store_vector):
    """Row i of the tile at ``C + i * ldc``: its vectors side by side (``finish`` and
    ``store_vector`` told which vector of the row, for a mask)."""
    lanes = sums[0][0].type.pointee.count
    for i, row_sums in enumerate(sums):
        row = builder.mul(ir.Constant(ir.IntType(64), i), ldc)
        for v, total in enumerate(row_sums):
            offset = builder.add(row, ir.Constant(ir.IntType(64), v * lanes))
            store_vector(finish(builder.load(total), residual, offset, v), C, offset, v)


def _transposed_store(builder, sums, C, residual, ldc, finish, store_vector, columns):
    """Column j < ``columns`` of the tile (its ``rows`` values) as one vector at
    ``C + j * ldc``."""
    rows, lanes = len(sums), sums[0][0].type.pointee.count
    column_type = ir.VectorType(sums[0][0].type.pointee.element, rows)
    index = ir.IntType(64)
    loaded = [[builder.load(total) for total in row_sums] for row_sums in sums]
    for v in range(len(sums[0])):
        for lane in range(lanes):
            j = ir.Constant(index, v * lanes + lane)
            with cgutils.if_likely(builder, builder.icmp_signed("<", j, columns)):
                column = ir.Constant(column_type, ir.Undefined)
                for i in range(rows):
                    value = builder.extract_element(loaded[i][v],
                                                    ir.Constant(ir.IntType(32), lane))
                    column = builder.insert_element(column, value,
                                                    ir.Constant(ir.IntType(32), i))
                offset = builder.mul(j, ldc)
                store_vector(finish(column, residual, offset), C, offset)


def _epilogue(builder, value, residual, offset, limits, spread, load_vector):
    """value [+ the residual's vector at ``offset``], slope below zero, clamped (see
    :func:`_make_tile`)."""
    low, high, slope = limits
    width = value.type.count
    if residual is not None:
        value = builder.fadd(value, load_vector(residual, offset, width))
    zero = ir.Constant(value.type.element, 0.0)
    negative = builder.fcmp_ordered("<", value, spread(zero, width))
    value = builder.select(negative, builder.fmul(value, spread(slope, width)), value)
    low, high = spread(low, width), spread(high, width)
    value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
    return builder.select(builder.fcmp_ordered(">", value, high), high, value)


@intrinsic
def _prefetch(typingctx, array, offset):
    """Asks for the cache line holding ``array.flat[offset]`` (a hint: never faults, so an
    offset past the array is harmless)."""
    sig = types.void(array, types.intp)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        hint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]),
            "llvm.prefetch.p0")
        # a read, kept in every cache level, data
        builder.call(hint, [builder.bitcast(builder.gep(data, [args[1]]), byte),
                            ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@_jit
def _prefetch_run(array, start, count):
    """The cache lines of ``count`` elements of flat ``array`` from ``start``."""
    step = max(1, VECTOR_BYTES // array.itemsize)
    for offset in range(start, start + count, step):
        _prefetch(array, offset)


_tile1, _tile2, _tile3, _tile4, _tile5, _tile6, _tile7, _tile8 = \
    (_make_tile(rows) for rows in range(1, STRIP_ROWS + 1))


@_jit
def _tile(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len):
    """The tile kernel for 1..8 rows (each row count is its own unrolled kernel)."""
    if rows == 8:
        _tile8(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 7:
        _tile7(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 6:
        _tile6(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 5:
        _tile5(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 4:
        _tile4(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 3:
        _tile3(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 2:
        _tile2(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    else:
        _tile1(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)


@_jit
def panel_product(a, panels, c, p0, p1, spill):
    """``c = a @ w`` over the panels p0..p1 of ``w``: ``a`` (rows, K) and ``c`` (rows, N)
    with contiguous rows, ``panels`` (P, K, width) the weight's columns zero-padded to
    P * width, ``spill`` a (STRIP_ROWS, width) scratch for a last panel that reaches past N.
    Rows go in blocks of ROW_BLOCK so that a block of ``a`` stays in L2 while the thread's
    panels pass over it."""
    rows, columns = c.shape
    k_len, width = panels.shape[1], panels.shape[2]
    lda, ldc = a.strides[0] // a.itemsize, c.strides[0] // c.itemsize
    for r0 in range(0, rows, ROW_BLOCK):
        r1 = min(rows, r0 + ROW_BLOCK)
        for p in range(p0, p1):
            column = p * width
            offset = p * k_len * width
            inside = column + width <= columns
            for s in range(r0, r1, STRIP_ROWS):
                count = min(STRIP_ROWS, r1 - s)
                if inside:
                    _tile(count, a, s * lda, lda, panels, offset, width, c, s * ldc + column,
                          ldc, k_len)
                else:
                    _tile(count, a, s * lda, lda, panels, offset, width, spill, 0, width, k_len)
                    for i in range(count):
                        for j in range(columns - column):
                            c[s + i, column + j] = spill[i, j]


@_jit
def product(a, b, c, edge, spill):
    """``c = a @ b`` with ``b``'s panels read in place (a MatMul of two computed tensors, as
    in attention's ``Q @ K^T``): ``a`` (rows, K), ``b`` (K, N), ``c`` (rows, N), each with
    contiguous rows. A last panel that reaches past N is first copied into ``edge`` (K,
    width), zero-padded, and its tiles written through ``spill`` (STRIP_ROWS, width)."""
    rows, k_len = a.shape
    columns = b.shape[1]
    width = spill.shape[1]
    lda, ldb, ldc = a.strides[0] // a.itemsize, b.strides[0] // b.itemsize, \
        c.strides[0] // c.itemsize
    for p in range(-(-columns // width)):
        column = p * width
        if column + width <= columns:
            for s in range(0, rows, STRIP_ROWS):
                _tile(min(STRIP_ROWS, rows - s), a, s * lda, lda, b, column, ldb, c,
                      s * ldc + column, ldc, k_len)
            continue
        left = columns - column
        for k in range(k_len):
            for j in range(left):
                edge[k, j] = b[k, column + j]
            for j in range(left, width):
                edge[k, j] = 0
        for s in range(0, rows, STRIP_ROWS):
            count = min(STRIP_ROWS, rows - s)
            _tile(count, a, s * lda, lda, edge, 0, width, spill, 0, width, k_len)
            for i in range(count):
                for j in range(left):
                    c[s + i, column + j] = spill[i, j]


@_jit
def batched_product(a, b, c, n0, n1, edge, spill):
    """``c[n] = a[n] @ b[n]`` for the stacked matrices n0..n1 (3-D arrays)."""
    for n in range(n0, n1):
        product(a[n], b[n], c[n], edge, spill)


# -- convolutions -------------------------------------------------------------------------------
#
# ops/conv_direct_cpu.py's two forms. A kernel of several taps takes its output positions as
# the tile's rows: each read at its taps in the image's zero-padded stride phases (one
# broadcast per position and tap, as the products above read their activation), the weight's
# transpose packed once into panels of output channels, and each tile's columns stored as 8
# consecutive outputs of one channel. A 1x1 convolution of a large image takes the weight on
# the left, its panels 32 consecutive outputs of every input channel, read where they lie.

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
    _prefetch_run(flat_panels, p0 * panel_size, panel_size)
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
                   low, high, slope, m0, m1, row_block, edge, spill):
    """Output channels m0..m1 (whole strips) at outputs first..first + count of y (M, L):
    ``w`` (>= m1 rows, C) the weight with zero rows past M, ``image`` flat with its
    channels ``stride`` apart, output ``first`` at ``offset`` in each. Panels of outputs are
    read in place, a last partial one under a mask. A strip of rows past M goes through
    ``spill`` (STRIP_ROWS, width), its partial panel copied first into ``edge`` (C, width),
    zero-padded. The epilogue is :func:`tap_conv`'s. Weight rows go in blocks of
    ``row_block`` that stay in L2 while the outputs pass over them."""
    k_len = w.shape[1]
    width = spill.shape[1]
    channels, length = y.shape
    flat_y, flat_spill, flat_residual = y.reshape(-1), spill.reshape(-1), residual.reshape(-1)
    whole = count // width * width
    if whole < count and m1 > channels // STRIP_ROWS * STRIP_ROWS:
        for k in range(k_len):
            for j in range(width):
                edge[k, j] = image[k * stride + offset + whole + j] if whole + j < count else 0
    for b0 in range(m0, m1, row_block):
        b1 = min(m1, b0 + row_block)
        for q0 in range(0, count, width):
            for s in range(b0, b1, STRIP_ROWS):
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
        y[out + t] = _limited(sums[at + t] + shift, low, high, slope)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _finish_residual(sums, at, y, out, count, shift, residual, low, high, slope):
    for t in range(count):
        y[out + t] = _limited(sums[at + t] + shift + residual[out + t], low, high, slope)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _limited(v, low, high, slope):
    """v times ``slope`` when negative, then clamped to [low, high]."""
    if v < 0:
        v *= slope
    if v < low:
        v = low
    if v > high:
        v = high
    return v


# -- attention ---------------------------------------------------------------------------------
#
# ``ops/fused_attention.py``'s heads. Q, K, V and the output stay in the (batch, seq, heads,
# size) layout the dense layers use: a head is a column band of each row, read and written
# with the row stride, so the transposes the unfused graph copies through never happen. Per
# (batch, head) pair, K's head is packed transposed into panels (size x 32 keys) and V's into
# panels of its columns (keys x 32); then each strip of up to eight queries gets its scores
# from the tile into an (8, keys) scratch that stays in L1, turns them into probabilities in
# place (scaled, masked, softmax), and multiplies them by V's panels straight into the output.
#
# The softmax is vector IR (:func:`_softmax_row`): numba's exp is a scalar libm call, and its
# loops keep a running max scalar. exp(x) = 2^n e^r with n = rint(x / ln 2) and r = x - n ln 2
# in [-ln2/2, ln2/2], ln 2 split in two so that n * ln2_hi is exact (Cody and Waite); e^r is
# its Taylor polynomial, of degree 7 for float32 (truncation 5e-9, under half an ulp) and 13
# for float64 (4e-18); 2^n is written into the exponent bits. Below the log of the smallest
# normal the result is 0 (a masked -inf score weighs exactly nothing); above ``high`` x is
# clamped (a softmax argument is at most 0); NaN stays NaN.

_EXP = {
    4: dict(bits=32, mantissa=23, bias=127, low=-87.33654, high=88.0,
            ln2_hi=0.693359375, ln2_lo=-2.12194440e-4, degree=7),
    8: dict(bits=64, mantissa=52, bias=1023, low=-708.3964185322641, high=709.0,
            ln2_hi=0.693145751953125, ln2_lo=1.42860682030941723212e-6, degree=13),
}


def _exp_codegen(builder, value, itemsize):
    """e**value for a float vector ``value`` of float32 (itemsize 4) or float64 lanes."""
    spec = _EXP[itemsize]
    lanes = value.type.count
    integers = ir.VectorType(ir.IntType(spec["bits"]), lanes)
    kind = f"v{lanes}{'f32' if itemsize == 4 else 'f64'}"

    def constant(number):
        return ir.Constant(value.type, [number] * lanes)

    def call(name, *operands):
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(value.type, [value.type] * len(operands)),
            f"llvm.{name}.{kind}")
        return builder.call(function, list(operands))

    below = builder.fcmp_ordered("<", value, constant(spec["low"]))
    clamped = builder.select(below, constant(spec["low"]), value)
    clamped = builder.select(builder.fcmp_ordered(">", clamped, constant(spec["high"])),
                             constant(spec["high"]), clamped)
    n = call("rint", builder.fmul(clamped, constant(1.4426950408889634)))
    r = call("fma", n, constant(-spec["ln2_hi"]), clamped)
    r = call("fma", n, constant(-spec["ln2_lo"]), r)
    coefficients = [1.0]
    for power in range(1, spec["degree"] + 1):
        coefficients.append(coefficients[-1] / power)
    polynomial = constant(coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        polynomial = call("fma", polynomial, r, constant(coefficient))
    exponent = builder.add(builder.fptosi(n, integers),
                           ir.Constant(integers, [spec["bias"]] * lanes))
    power_of_two = builder.bitcast(
        builder.shl(exponent, ir.Constant(integers, [spec["mantissa"]] * lanes)), value.type)
    result = builder.select(below, constant(0.0), builder.fmul(polynomial, power_of_two))
    # rint and fptosi of NaN give poison in the other arm, which this select never takes
    return builder.select(builder.fcmp_unordered("uno", value, value), value, result)


@intrinsic
def _softmax_row(typingctx, flat, start, count):
    """``flat[start:start + count]`` (count >= 1) replaced by its softmax: the max, then
    exp(x - max) stored and summed, then each times 1 / sum; whole vectors, and the last
    partial one under a mask. A NaN makes the row NaN through the sum (the max skips it)."""
    sig = types.void(flat, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        scalar = context.get_value_type(signature.args[0].dtype)
        itemsize = 4 if isinstance(scalar, ir.FloatType) else 8
        lanes = VECTOR_BYTES // itemsize
        vector = ir.VectorType(scalar, lanes)
        index, i32 = ir.IntType(64), ir.IntType(32)
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        row, count = builder.gep(data, [args[1]]), args[2]
        kind = f"v{lanes}{'f32' if itemsize == 4 else 'f64'}"
        mask_type = ir.VectorType(ir.IntType(1), lanes)
        masked_load = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            vector, [vector.as_pointer(), i32, mask_type, vector]),
            f"llvm.masked.load.{kind}.p0")
        masked_store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.VoidType(), [vector, vector.as_pointer(), i32, mask_type]),
            f"llvm.masked.store.{kind}.p0")
        whole = builder.udiv(count, ir.Constant(index, lanes))
        tail_at = builder.mul(whole, ir.Constant(index, lanes))
        left = builder.sub(count, tail_at)
        lane_ids = ir.Constant(ir.VectorType(index, lanes), list(range(lanes)))
        tail_mask = builder.icmp_signed("<", lane_ids, _spread_value(builder, left, lanes))

        def address(offset):
            return builder.bitcast(builder.gep(row, [offset]), vector.as_pointer())

        def load(offset):
            return builder.load(address(offset), align=itemsize)

        def load_tail(fill):
            return builder.call(masked_load, [address(tail_at), ir.Constant(i32, itemsize),
                                              tail_mask, fill])

        def store(value, offset):
            builder.store(value, address(offset), align=itemsize)

        def store_tail(value):
            builder.call(masked_store, [value, address(tail_at), ir.Constant(i32, itemsize),
                                        tail_mask])

        def each_vector(body):
            with cgutils.for_range(builder, whole) as loop:
                body(builder.mul(loop.index, ir.Constant(index, lanes)))

        def spread(value):
            return ir.Constant(vector, [value] * lanes) if not isinstance(value, ir.Value) \
                else _spread_value(builder, value, lanes)

        def lanes_of(value):
            return [builder.extract_element(value, ir.Constant(i32, lane))
                    for lane in range(lanes)]

        # the max, lane by lane, then across lanes
        largest = cgutils.alloca_once_value(builder, spread(float("-inf")))

        def take_max(x):
            held = builder.load(largest)
            builder.store(builder.select(builder.fcmp_ordered(">", x, held), x, held), largest)
        each_vector(lambda offset: take_max(load(offset)))
        take_max(load_tail(spread(float("-inf"))))
        top = None
        for value in lanes_of(builder.load(largest)):
            top = value if top is None else builder.select(
                builder.fcmp_ordered(">", value, top), value, top)
        shift = spread(top)

        # exp(x - max), stored and summed
        total = cgutils.alloca_once_value(builder, spread(0.0))

        def exp_step(offset):
            e = _exp_codegen(builder, builder.fsub(load(offset), shift), itemsize)
            store(e, offset)
            builder.store(builder.fadd(builder.load(total), e), total)
        each_vector(exp_step)
        e = _exp_codegen(builder, builder.fsub(load_tail(shift), shift), itemsize)
        store_tail(e)
        builder.store(builder.fadd(builder.load(total), builder.select(
            tail_mask, e, spread(0.0))), total)
        parts = lanes_of(builder.load(total))
        while len(parts) > 1:
            parts = [builder.fadd(a, b) for a, b in zip(parts[::2], parts[1::2])]
        inverse = spread(builder.fdiv(ir.Constant(scalar, 1.0), parts[0]))

        each_vector(lambda offset: store(builder.fmul(load(offset), inverse), offset))
        store_tail(builder.fmul(load_tail(spread(0.0)), inverse))
        return context.get_dummy_value()

    return sig, codegen


def _spread_value(builder, value, lanes):
    """``value`` in every lane of a vector."""
    undefined = ir.Constant(ir.VectorType(value.type, lanes), ir.Undefined)
    return builder.shuffle_vector(
        builder.insert_element(undefined, value, ir.Constant(ir.IntType(32), 0)),
        undefined, ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))


@_jit
def softmax_rows(x, rows, n):
    """Softmax of each of ``rows`` rows of ``n`` in flat ``x``, in place (the vector IR of
    :func:`_softmax_row`)."""
    for r in range(rows):
        _softmax_row(x, r * n, n)


@_jit
def _pack_columns(m, panels, width):
    """The columns of ``m`` (rows, columns; any strides) in ``panels`` (P, rows, width):
    [p, r, c] = m[r, p * width + c], zero past the last column. Attention packs K's head
    transposed (size x keys) and V's head (keys x size) this way."""
    rows, columns = m.shape
    for p in range(panels.shape[0]):
        for r in range(rows):
            for c in range(width):
                at = p * width + c
                panels[p, r, c] = m[r, at] if at < columns else 0


@_jit
def _scale_and_mask(flat, start, keys, scale, mask, at, step, has_mask):
    """A row of scores times ``scale``, plus the mask's row (``mask[at + j * step]``): the
    unfused Mul, then Add."""
    if has_mask:
        for j in range(keys):
            flat[np.uint64(start + j)] = flat[np.uint64(start + j)] * scale + mask[at + j * step]
    elif scale != 1:
        for j in range(keys):
            flat[np.uint64(start + j)] *= scale


@_jit
def attention(q, k, v, mask, mask_strides, has_mask, out, scale, pair0, pair1, row0, row1,
              key_panels, value_panels, scores, spill):
    """``out[b, i, h] = softmax(scale * q[b, i, h] . k[b, :, h] + mask[b, h, i]) @ v[b, :, h]``
    for the (batch, head) pairs pair0..pair1 (pair = b * heads + h) and query rows
    row0..row1. ``q``, ``k``, ``v`` and ``out`` are C-contiguous (batch, seq, heads, size);
    the mask (batch, heads, queries, keys) is read at ``mask[b * strides[0] + h * strides[1]
    + i * strides[2] + j * strides[3]]`` (a broadcast mask has zero strides). Scratch:
    ``key_panels`` (ceil(keys / width), size, width), ``value_panels`` (ceil(v size /
    width), keys, width), ``scores`` (STRIP_ROWS, ceil(keys / width) * width), ``spill``
    (STRIP_ROWS, width)."""
    heads, size = q.shape[2], q.shape[3]
    keys, value_size = k.shape[1], v.shape[3]
    width = spill.shape[1]
    lda, ldo, lds = heads * size, heads * value_size, scores.shape[1]
    flat_scores, flat_out = scores.reshape(-1), out.reshape(-1)
    for pair in range(pair0, pair1):
        b, h = pair // heads, pair % heads
        _pack_columns(k[b, :, h, :].T, key_panels, width)
        _pack_columns(v[b, :, h, :], value_panels, width)
        for s in range(row0, row1, STRIP_ROWS):
            count = min(STRIP_ROWS, row1 - s)
            q_at = (b * q.shape[1] + s) * lda + h * size
            for p in range(key_panels.shape[0]):
                _tile(count, q, q_at, lda, key_panels, p * size * width, width, scores,
                      p * width, lds, size)
            for r in range(count):
                at = b * mask_strides[0] + h * mask_strides[1] + (s + r) * mask_strides[2]
                _scale_and_mask(flat_scores, r * lds, keys, scale, mask, at, mask_strides[3],
                                has_mask)
                _softmax_row(flat_scores, r * lds, keys)
            out_at = (b * out.shape[1] + s) * ldo + h * value_size
            for p in range(value_panels.shape[0]):
                column = p * width
                panel_at = p * keys * width
                if column + width <= value_size:
                    _tile(count, scores, 0, lds, value_panels, panel_at, width, out,
                          out_at + column, ldo, keys)
                    continue
                _tile(count, scores, 0, lds, value_panels, panel_at, width, spill, 0, width,
                      keys)
                for r in range(count):
                    for c in range(value_size - column):
                        flat_out[out_at + r * ldo + column + c] = spill[r, c]


# -- native worker threads ---------------------------------------------------------------------
#
# Worker threads that take a compiled kernel's parts without the GIL.
#
# ``ops/parallel.py`` hands a part to a Python thread: the worker wakes from its queue, then
# waits for the GIL, which the caller holds until its own part enters compiled code. Each of
# those is a sleep: a job of two 236 us parts of a 1x1 convolution ran 280 us, the worker
# starting 15 us after the caller and the caller seeing the end 13 us after the worker
# (benchmarks/NOTES.md §19). Here the hand-off never leaves native code: a kernel's driver
# (compiled, called once from Python) publishes its arguments in a shared control block,
# takes parts itself, and waits for the worker's by spinning; the worker is a thread started
# with ``pthread_create`` on a numba ``cfunc`` that spins on the same block, so two 7 us
# parts take 7.4 us instead of 21-31.
#
# A worker spins for SPIN_ROUNDS pauses after its last job (~45 us: a worker spinning without
# end took a core from OpenBLAS and the Python threads between jobs, ResNet-50 22 -> 31-39
# ms), then sleeps on a futex until a caller wakes it; ``conv_direct_cpu.conv`` wakes it
# before its setup, which covers the ~10-15 us a sleeping thread takes to run again. A caller never
# waits for a worker to arrive: parts are claimed one at a time from a counter, so a sleeping
# or busy worker only means the caller takes more of them; it waits only for parts a worker
# has already claimed.
#
# The control block (int64), one 64-byte line per word the threads write:
#
# * ``STATE``: the job's sequence number << 16, plus the workers inside it, plus ``CLOSED``
#   once the caller has taken the last part (no worker may join after that);
# * ``NEXT``: the next part to claim; ``BUSY``: a caller owns the pool (another caller runs
#   all of its parts itself); ``SLEEPERS``: workers asleep on the futex word ``WAKE`` (the
#   low 32 bits of its word); ``JOINED``: jobs a worker took part in (for the tests);
# * ``ARGS`` on: the job's arguments, written by the driver before it publishes the job.
#
# A pool is made per process on first use and again in a forked child (whose threads did not
# survive the fork). Its block and threads live until the process ends.
#
# The pool and the convolution driver below live in this file because numba's disk cache is
# stamped per source file: a cached caller keeps the code of what it called in another file,
# and would not see that file change (the argument slots, the tile).

LINE = 8  # int64 words per 64-byte line
STATE, NEXT, BUSY, SLEEPERS, WAKE, JOINED = (LINE * i for i in range(6))
ARGS = 6 * LINE
BLOCK_WORDS = ARGS + 128
CLOSED = 1 << 15
COUNT_MASK = CLOSED - 1
SPIN_ROUNDS = 2000  # pauses (~22 ns each on this EPYC) before a worker sleeps
FUTEX_SYSCALL, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 202, 128, 129


# -- atomics: ops/_jit_atomics.py ---------------------------------------------------------

@intrinsic
def pointer_like(typingctx, value, like):
    """The int64 ``value`` as a pointer to ``like``'s type (a scalar's, an array's
    elements')."""
    element = like.dtype if isinstance(like, types.Array) else like

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_data_type(element).as_pointer())
    return types.CPointer(element)(types.int64, like), codegen


@_jit
def put(block, slot, array):
    """``array`` (contiguous, up to 3 dimensions) into slots slot..slot + 3."""
    block[slot] = address(array)
    for axis in range(array.ndim):
        block[slot + 1 + axis] = array.shape[axis]


@_jit
def get1(block, slot, like):
    return carray(pointer_like(block[slot], like), (block[slot + 1],))


@_jit
def get2(block, slot, like):
    return carray(pointer_like(block[slot], like), (block[slot + 1], block[slot + 2]))


@_jit
def get3(block, slot, like):
    return carray(pointer_like(block[slot], like),
                  (block[slot + 1], block[slot + 2], block[slot + 3]))


@intrinsic
def _as_block(typingctx, raw):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64).as_pointer())
    return types.CPointer(types.int64)(types.voidptr), codegen


@intrinsic
def _futex(typingctx, word, operation, value):
    """The futex system call on ``word`` (an int32 array's first element), as an inline
    ``syscall`` (Linux x86-64): through ctypes numba could not cache the callers."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        i64 = ir.IntType(64)
        call = ir.InlineAsm(ir.FunctionType(i64, [i64] * 7), "syscall",
                            "={rax},{rax},{rdi},{rsi},{rdx},{r10},{r8},{r9},~{rcx},~{r11},"
                            "~{memory}", side_effect=True)
        zero = ir.Constant(i64, 0)
        return builder.call(call, [ir.Constant(i64, FUTEX_SYSCALL),
                                   builder.ptrtoint(data, i64), args[1],
                                   builder.sext(args[2], i64), zero, zero, zero])
    return types.int64(word, types.int64, types.int32), codegen


# -- the caller's side, called from a kernel's compiled driver ---------------------------------

@_jit
def begin(block) -> int:
    """Takes the pool for one job: its sequence number, or -1 when another caller has it
    (then the driver runs every part itself)."""
    if not compare_swap(block, BUSY, 0, 1):
        return -1
    block[NEXT] = 0
    return (load(block, STATE) >> 16) + 1


@_jit
def wake(block):
    """Wakes the sleeping workers. A driver calls it before its own setup (its phase planes),
    which covers the ~10-15 us a sleeping thread takes to run again."""
    if fetch_add(block, SLEEPERS, 0) > 0:
        word = block[WAKE:WAKE + 1].view(np.int32)
        fetch_add(word, 0, np.int32(1))
        _futex(word, FUTEX_WAKE_PRIVATE, np.int32(1 << 30))


@_jit
def publish(block, sequence):
    """Opens job ``sequence`` (its arguments are in ``block[ARGS:]``) and wakes workers still
    asleep."""
    store(block, STATE, sequence << 16)
    wake(block)


@_jit
def claim(block, parts) -> int:
    """The next unclaimed part of the job, or -1 when all are taken."""
    part = fetch_add(block, NEXT, 1)
    return part if part < parts else -1


@_jit
def finish(block):
    """Closes the job (no worker joins after this) and waits for the workers inside it to
    leave; then the pool is free."""
    while True:
        state = load(block, STATE)
        if compare_swap(block, STATE, state, state | CLOSED):
            break
    while load(block, STATE) & COUNT_MASK:
        pause()
    store(block, BUSY, 0)


# -- the worker --------------------------------------------------------------------------------

@_jit
def serve(raw):
    """The worker loop over the jobs in the block at ``raw``, each run by :func:`_dispatch`
    (it claims parts until none are left); never returns."""
    block = carray(_as_block(raw), (BLOCK_WORDS,))
    wake = block[WAKE:WAKE + 1].view(np.int32)
    done, idle = 0, 0
    while True:
        state = load(block, STATE)
        sequence = state >> 16
        if sequence != done and not state & CLOSED:
            if compare_swap(block, STATE, state, state + 1):
                done, idle = sequence, 0
                fetch_add(block, JOINED, 1)
                _dispatch(block)
                fetch_add(block, STATE, -1)
            continue
        idle += 1
        if idle < SPIN_ROUNDS:
            pause()
            continue
        # sleep: count in, then check the job once more, so that a caller who published
        # after the check sees a sleeper and wakes it
        word = load(wake, 0)
        fetch_add(block, SLEEPERS, 1)
        if load(block, STATE) == state:
            _futex(wake, FUTEX_WAIT_PRIVATE, word)
        fetch_add(block, SLEEPERS, -1)
        idle = 0


WORKER_SIGNATURE = types.voidptr(types.voidptr)


_libc = ctypes.CDLL(None)


class Pool:
    """A control block and its worker threads (``intra_op_threads() - 1`` of them)."""

    def __init__(self, worker, workers: int):
        self.block = np.zeros(BLOCK_WORDS, np.int64)
        self.workers = 0
        for _ in range(workers):
            thread = ctypes.c_ulong()
            if _libc.pthread_create(ctypes.byref(thread), None, ctypes.c_void_p(worker.address),
                                    ctypes.c_void_p(self.block.ctypes.data)) != 0:
                break  # fewer threads than asked: the callers take the parts left
            _libc.pthread_detach(thread)
            self.workers += 1

    def wake(self):
        wake(self.block)


_pools: dict = {}
_lock = threading.Lock()


def pool(name: str, worker) -> Pool | None:
    """This process's pool ``name``, its threads running the ``cfunc`` ``worker`` (which
    calls :func:`serve`), or None when one thread is all this process may use or no worker
    started."""
    workers = intra_op_threads() - 1
    if workers < 1:
        return None
    key = (name, os.getpid(), workers)
    found = _pools.get(key)
    if found is None:
        with _lock:
            found = _pools.get(key)
            if found is None:
                found = _pools[key] = Pool(worker, workers)  # kept for the process's life
    return found if found.workers else None


# -- the direct convolutions, split between threads in native code ----------------------------
#
# ``ops/conv_direct_cpu.py``'s convolutions split between threads in native code.
#
# One compiled call per image (:func:`conv`) does what ``conv_direct_cpu.conv`` did through
# ``parallel_for``: it builds the shared phase planes when the threads split the output
# channels, publishes the job in the pool's control block, claims parts until
# none are left and waits for the worker's. The worker (:func:`_dispatch`) rebuilds the
# arguments from the block and claims parts the same way. A part is a band of output rows
# (each thread builds that band's phase planes in its own buffer, or reads a 1x1's image in
# place) or a run of output channels over the shared planes, as before: panels of the tap
# form, strips of the weight-on-the-left form.

# argument slots, from ARGS on: arrays take four (address, shape), then scalars
(X, PLANES, WORKER_PLANES, ROWS_AT, PLACES, BOUNDS, PANELS, WEIGHTS, Y, BIAS, RESIDUAL,
 WORKER_SPILL, WORKER_EDGE, NO_BIAS, LIMITS) = (ARGS + 4 * i for i in range(15))
SCALARS = ARGS + 60
(ITEMSIZE, TAPS, BY_ROWS, STRIPS, IN_PLACE, PARTS, CHUNK, ROW_BLOCK, HAS_RESIDUAL, SHAPE0,
 SHAPE1, SHAPE2, SHAPE3, PH, PW, SY, SX, TOP, LEFT, HALO, OH, OW) = \
    range(SCALARS, SCALARS + 22)
# a kit's own slots (:func:`native_conv`), past those it copies into the block: the calling
# thread's spill and edge scratch
SPILL, EDGE = OW + 1, OW + 5
assert EDGE + 4 < BLOCK_WORDS - 1  # the block's last word names the job


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


@_jit
def _part(part, job, x, own, shared, shape, geometry, rows_at, places, bounds, panels,
          weights, y, bias, residual, limits, spill, edge, no_bias):
    """One part: a band of rows on this thread's own planes (or a 1x1's image in place), or
    a run of output channels on the shared ones. ``job``: (form, by_rows, strips, in_place,
    chunk, row_block, has_residual), form 0 a 1x1 kernel, 1 the tap tile, 2 taps with the
    weight on the left."""
    taps, by_rows, strips, in_place, chunk, row_block, has_residual = job
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
        return
    if taps:
        strip = STRIP_ROWS if strips else strip_rows(count)
        p0, p1 = (0, panels.shape[0]) if by_rows else \
            (part * chunk, min(panels.shape[0], (part + 1) * chunk))
        tap_conv(image, rows_at, places[part if by_rows else 0], count, panels, y,
                         r0 * ow, bias, residual, has_residual, low, high, slope, p0, p1,
                         spill, no_bias, strip)
        return
    stride, offset = shape[3], 0
    if in_place:
        image, stride, offset = x.reshape(-1), ph * pw, r0 * ow
    m0, m1 = (0, weights.shape[0]) if by_rows else \
        (part * chunk * STRIP_ROWS, min(weights.shape[0], (part + 1) * chunk * STRIP_ROWS))
    pointwise_conv(weights, image, stride, offset, count, y, r0 * ow, bias, residual,
                           has_residual, low, high, slope, m0, m1, row_block, edge,
                           spill.reshape((STRIP_ROWS, spill.size // STRIP_ROWS)))


@_jit
def native_conv(block, kit, x, y, bias, residual, has_residual):
    """Conv of one image ``x`` into ``y`` (M, L), its parts taken by this thread and the
    pool's worker (``block``; with another caller using it, or one part, all here).
    ``kit`` is laid out like the block: every argument that does not change from call to
    call (the planes, weights, parts, the epilogue's ``limits`` in x's dtype, this thread's
    ``SPILL`` and ``EDGE`` scratch) written once by ``conv_direct_cpu``, so a call passes
    only what does; a call of 22 arrays and tuples cost ~4 us in numba's dispatch alone."""
    planes = get1(kit, PLANES, x)
    spill, edge = get2(kit, SPILL, x), get2(kit, EDGE, x)
    (rows_at, places, bounds, panels, weights, limits, no_bias), shape, geometry, form, \
        parts = _fixed_arguments(kit, x)
    job = form + (has_residual,)
    if not job[1] and not job[3]:  # neither split by rows nor a 1x1 read in place
        _build(x, planes, shape, geometry, job[2], 0, geometry[7])
    sequence = begin(block) if parts > 1 else -1
    if sequence >= 0:
        block[JOB] = CONV_JOB
        for slot in range(ARGS, OW + 1):
            block[slot] = kit[slot]
        put(block, X, x)
        put(block, Y, y)
        put(block, BIAS, bias)
        put(block, RESIDUAL, residual)
        block[HAS_RESIDUAL] = has_residual
        publish(block, sequence)
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
def _fixed_arguments(words, like):
    """What a convolution's parts read that does not change from call to call, from its kit
    (the caller's side) or the pool's block (the worker's), which lay it out alike: the
    arrays (rows_at, places, bounds, panels, weights, limits, no_bias; floats in the dtype
    of ``like``), the planes' shape, the geometry, the form (taps, by_rows, strips,
    in_place, chunk, row_block) and the number of parts."""
    index = np.int64(0)
    arrays = (get1(words, ROWS_AT, index), get2(words, PLACES, index),
              get1(words, BOUNDS, index), get3(words, PANELS, like), get2(words, WEIGHTS, like),
              get1(words, LIMITS, like), get1(words, NO_BIAS, like))
    shape = (words[SHAPE0], words[SHAPE1], words[SHAPE2], words[SHAPE3])
    geometry = (words[PH], words[PW], words[SY], words[SX], words[TOP], words[LEFT],
                words[HALO], words[OH], words[OW])
    form = (words[TAPS], words[BY_ROWS] != 0, words[STRIPS] != 0, words[IN_PLACE] != 0,
            words[CHUNK], words[ROW_BLOCK])
    return arrays, shape, geometry, form, words[PARTS]


@_jit
def _worker_parts(block, zero):
    """The worker's side of :func:`native_conv`, in the dtype of ``zero``."""
    x, y = get3(block, X, zero), get2(block, Y, zero)
    planes, own = get1(block, PLANES, zero), get1(block, WORKER_PLANES, zero)
    bias, residual = get1(block, BIAS, zero), get2(block, RESIDUAL, zero)
    spill, edge = get2(block, WORKER_SPILL, zero), get2(block, WORKER_EDGE, zero)
    (rows_at, places, bounds, panels, weights, limits, no_bias), shape, geometry, form, \
        parts = _fixed_arguments(block, zero)
    job = form + (block[HAS_RESIDUAL] != 0,)
    part = claim(block, parts)
    while part >= 0:
        _part(part, job, x, own, planes, shape, geometry, rows_at, places, bounds, panels,
              weights, y, bias, residual, limits, spill, edge, no_bias)
        part = claim(block, parts)


# -- dense products and attention, split between threads in native code ----------------------
#
# ``ops/matmul_cpu.py``'s panel products and ``ops/fused_attention.py``'s heads go through the
# same pool: the driver publishes its arrays in the block (the slots from ARGS on, as the
# convolution's do) and the job's kind in JOB, and both threads claim parts. Through
# ``parallel_for`` the hand-off cost 55-70 us a call (BERT's 128 x 768 @ 768 x 768: 0.39 ms
# against 0.32 for one thread's half; numba's prange, 0.33).

JOB = BLOCK_WORDS - 1
CONV_JOB, PRODUCT_JOB, ATTENTION_JOB, CALL_JOB = 0, 1, 2, 3
# product slots (arrays)
(PRODUCT_A, PRODUCT_PANELS, PRODUCT_C, PRODUCT_BOUNDS, PRODUCT_SPILL) = \
    (ARGS + 4 * i for i in range(5))
# attention slots: Q, K, V and the output flat with their dims as scalars, the mask's span
(ATT_Q, ATT_K, ATT_V, ATT_OUT, ATT_MASK, ATT_MASK_STRIDES, ATT_BOUNDS, ATT_KEYS, ATT_VALUES,
 ATT_SCORES, ATT_SPILL, ATT_SCALE) = (ARGS + 4 * i for i in range(12))
(ATT_BATCH, ATT_QUERIES, ATT_KEY_COUNT, ATT_HEADS, ATT_SIZE, ATT_VALUE_SIZE,
 ATT_HAS_MASK) = range(PARTS + 1, PARTS + 8)
assert ATT_SCALE + 3 < ITEMSIZE and ATT_HAS_MASK < JOB and PRODUCT_SPILL + 3 < ITEMSIZE


@_jit
def native_product(block, parts, a, panels, c, bounds, spill, worker_spill):
    """``c = a @ w`` (:func:`panel_product`) over the panel runs bounds[p]..bounds[p + 1],
    taken by this thread and the pool's worker (with another caller using the pool, all
    here)."""
    sequence = begin(block) if parts > 1 else -1
    if sequence < 0:
        panel_product(a, panels, c, bounds[0], bounds[parts], spill)
        return
    block[JOB] = PRODUCT_JOB
    put(block, PRODUCT_A, a)
    put(block, PRODUCT_PANELS, panels)
    put(block, PRODUCT_C, c)
    put(block, PRODUCT_BOUNDS, bounds)
    put(block, PRODUCT_SPILL, worker_spill)
    block[ITEMSIZE], block[PARTS] = a.itemsize, parts
    publish(block, sequence)
    part = claim(block, parts)
    while part >= 0:
        panel_product(a, panels, c, bounds[part], bounds[part + 1], spill)
        part = claim(block, parts)
    finish(block)


@_jit
def _worker_product(block, zero):
    a, c = get2(block, PRODUCT_A, zero), get2(block, PRODUCT_C, zero)
    panels, spill = get3(block, PRODUCT_PANELS, zero), get2(block, PRODUCT_SPILL, zero)
    bounds = get1(block, PRODUCT_BOUNDS, np.int64(0))
    parts = block[PARTS]
    part = claim(block, parts)
    while part >= 0:
        panel_product(a, panels, c, bounds[part], bounds[part + 1], spill)
        part = claim(block, parts)


@_jit
def native_attention(block, parts, bounds, q, k, v, mask, mask_strides, has_mask, out, scale,
                     scratch, worker_scratch):
    """:func:`attention` over the parts ``bounds[p]`` = (pair0, pair1, row0, row1), taken by
    this thread and the pool's worker. ``scratch``: (key_panels, value_panels, scores,
    spill), one set per thread."""
    keys_, values_, scores_, spill_ = scratch
    sequence = begin(block) if parts > 1 else -1
    if sequence < 0:
        for part in range(parts):
            attention(q, k, v, mask, mask_strides, has_mask, out, scale, bounds[part, 0],
                      bounds[part, 1], bounds[part, 2], bounds[part, 3], keys_, values_,
                      scores_, spill_)
        return
    block[JOB] = ATTENTION_JOB
    put(block, ATT_Q, q.reshape(-1))
    put(block, ATT_K, k.reshape(-1))
    put(block, ATT_V, v.reshape(-1))
    put(block, ATT_OUT, out.reshape(-1))
    put(block, ATT_MASK, mask)
    put(block, ATT_MASK_STRIDES, mask_strides)
    put(block, ATT_BOUNDS, bounds)
    put(block, ATT_KEYS, worker_scratch[0])
    put(block, ATT_VALUES, worker_scratch[1])
    put(block, ATT_SCORES, worker_scratch[2])
    put(block, ATT_SPILL, worker_scratch[3])
    block[ATT_BATCH], block[ATT_QUERIES], block[ATT_HEADS], block[ATT_SIZE] = q.shape
    block[ATT_KEY_COUNT], block[ATT_VALUE_SIZE] = k.shape[1], v.shape[3]
    block[ATT_HAS_MASK] = has_mask
    held_scale = np.empty(1, q.dtype)  # in the dtype, so both threads scale alike
    held_scale[0] = scale
    put(block, ATT_SCALE, held_scale)
    block[ITEMSIZE], block[PARTS] = q.itemsize, parts
    publish(block, sequence)
    part = claim(block, parts)
    while part >= 0:
        attention(q, k, v, mask, mask_strides, has_mask, out, scale, bounds[part, 0],
                  bounds[part, 1], bounds[part, 2], bounds[part, 3], keys_, values_, scores_,
                  spill_)
        part = claim(block, parts)
    finish(block)


@_jit
def _worker_attention(block, zero):
    batch, queries, heads = block[ATT_BATCH], block[ATT_QUERIES], block[ATT_HEADS]
    size, keys, value_size = block[ATT_SIZE], block[ATT_KEY_COUNT], block[ATT_VALUE_SIZE]
    q = get1(block, ATT_Q, zero).reshape((batch, queries, heads, size))
    k = get1(block, ATT_K, zero).reshape((batch, keys, heads, size))
    v = get1(block, ATT_V, zero).reshape((batch, keys, heads, value_size))
    out = get1(block, ATT_OUT, zero).reshape((batch, queries, heads, value_size))
    mask, mask_strides = get1(block, ATT_MASK, zero), get1(block, ATT_MASK_STRIDES, np.int64(0))
    bounds = get2(block, ATT_BOUNDS, np.int64(0))
    keys_, values_ = get3(block, ATT_KEYS, zero), get3(block, ATT_VALUES, zero)
    scores_, spill_ = get2(block, ATT_SCORES, zero), get2(block, ATT_SPILL, zero)
    scale = get1(block, ATT_SCALE, zero)[0]
    has_mask = block[ATT_HAS_MASK] != 0
    parts = block[PARTS]
    part = claim(block, parts)
    while part >= 0:
        attention(q, k, v, mask, mask_strides, has_mask, out, scale, bounds[part, 0],
                  bounds[part, 1], bounds[part, 2], bounds[part, 3], keys_, values_, scores_,
                  spill_)
        part = claim(block, parts)


# -- any kernel's parts, through a function pointer ----------------------------------------
#
# A kernel in another file hands its parts to the pool as a ``cfunc`` of PART_SIGNATURE,
# ``part(args, index)``: ``args`` points at the caller's array of addresses (its arrays'
# data, and one int64 array of its sizes and scalars), which the cfunc reads back with
# ``carray(args[i], shape, dtype)``. The worker calls it without knowing what it computes, so
# nothing of the kernel is compiled into this file's cache (see above), and a kernel whose
# file changes is compiled again on its own.

PART_SIGNATURE = types.void(types.CPointer(types.voidptr), types.int64)
CALL_FN, CALL_ARGS = ARGS, ARGS + 1


@intrinsic
def _call_part(typingctx, fn, args, part):
    """Calls the PART_SIGNATURE function at address ``fn`` on (``args``, ``part``)."""
    def codegen(context, builder, signature, values):
        i64 = ir.IntType(64)
        arguments = ir.IntType(8).as_pointer().as_pointer()
        function = ir.FunctionType(ir.VoidType(), [arguments, i64])
        target = builder.inttoptr(values[0], function.as_pointer())
        builder.call(target, [builder.inttoptr(values[1], arguments), values[2]])
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@_jit
def native_for(block, fn, args, parts):
    """``fn(args, p)`` for p < ``parts`` (``fn`` a PART_SIGNATURE address, ``args`` the
    uint64 array of addresses it reads), taken by this thread and the pool's worker (with
    another caller using the pool, all here)."""
    where = address(args)
    sequence = begin(block) if parts > 1 else -1
    if sequence < 0:
        for part in range(parts):
            _call_part(fn, where, part)
        return
    block[JOB], block[CALL_FN], block[CALL_ARGS], block[PARTS] = CALL_JOB, fn, where, parts
    block[ITEMSIZE] = 0
    publish(block, sequence)
    part = claim(block, parts)
    while part >= 0:
        _call_part(fn, where, part)
        part = claim(block, parts)
    finish(block)


# -- the tile, for compiled kernels in other files -------------------------------------------
#
# ``tile_f`` and ``tile_d`` are :func:`_tile` behind a C entry point of TILE_SIGNATURE, for a
# kernel in another file to call through its address (ops/_jit_recurrent.py), so that its
# cached code never holds a copy of the tile: ``(rows, a, a_offset, lda, panels,
# panel_offset, ldw, c, c_offset, ldc, k)`` with a, panels and c as addresses, as in
# :func:`_tile` (c = a @ panel for 1..8 rows).

TILE_SIGNATURE = types.void(*([types.int64] * 11))


@_jit
def _tile_at(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, zero):
    _tile(rows, carray(pointer_like(a, zero), (a_offset + rows * lda,)), a_offset, lda,
          carray(pointer_like(panels, zero), (panel_offset + k_len * ldw,)), panel_offset,
          ldw, carray(pointer_like(c, zero), (c_offset + rows * ldc,)), c_offset, ldc, k_len)


@cfunc(TILE_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def tile_f(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len):
    _tile_at(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len,
             np.float32(0))


@cfunc(TILE_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def tile_d(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len):
    _tile_at(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len,
             np.float64(0))


@_jit
def _worker_calls(block):
    fn, where, parts = block[CALL_FN], block[CALL_ARGS], block[PARTS]
    part = claim(block, parts)
    while part >= 0:
        _call_part(fn, where, part)
        part = claim(block, parts)


@_jit
def _run_job(block, zero):
    """The worker's side of the job in the block, in the dtype of ``zero``."""
    job = block[JOB]
    if job == PRODUCT_JOB:
        _worker_product(block, zero)
    elif job == ATTENTION_JOB:
        _worker_attention(block, zero)
    else:
        _worker_parts(block, zero)


@_jit
def _dispatch(block):
    """The job in the block, by its dtype (each dtype its own compiled code)."""
    if block[JOB] == CALL_JOB:
        _worker_calls(block)
    elif block[ITEMSIZE] == 4:
        _run_job(block, np.float32(0))
    else:
        _run_job(block, np.float64(0))


@cfunc(WORKER_SIGNATURE, nopython=True, error_model="numpy", cache=True)
def _worker(raw):
    serve(raw)
    return raw


def native_pool():
    """The worker pool of the native drivers (convolutions, panel products, attention), or
    None (one thread)."""
    return pool("panels", _worker)
