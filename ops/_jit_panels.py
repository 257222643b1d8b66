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

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

VECTOR_BYTES = 64
PANEL_VECTORS = 2  # vectors across a panel: 32 floats or 16 doubles
STRIP_ROWS = 8  # activation rows of one tile: 16 sums in registers, 2 panel vectors, a broadcast
ROW_BLOCK = 256  # rows taken through all of a thread's panels before the next rows
K_BLOCK = 128  # k per block of sums added to the totals (see _tile_codegen)

_jit = njit(nogil=True, cache=True, boundscheck=False)


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
    result is clamped to [low, high] by comparisons (NaN passes through)."""

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
                      ldc, k_len, bias, bias_offset, residual, has_residual, low, high, slope):
        sig = types.void(a, types.intp, types.intp, panels, types.intp, types.intp, c,
                         types.intp, types.intp, types.intp, bias, types.intp, residual,
                         types.boolean, a.dtype, a.dtype, a.dtype)
        return sig, _tile_codegen(rows, finished=True, taps=False)
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


def _tile_codegen(rows: int, finished: bool, taps: bool):
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

        def load_vector(pointer, offset, width=lanes):
            return builder.load(builder.bitcast(
                at(pointer, offset), ir.VectorType(scalar, width).as_pointer()), align=itemsize)

        def store_vector(value, pointer, offset):
            builder.store(value, builder.bitcast(at(pointer, offset), value.type.as_pointer()),
                          align=itemsize)

        if taps:  # the image; each row's place in it, loaded once; the taps' offsets
            A = data(0, a_arg)
            places = at(data(2, lda), a_offset)
            row_places = [builder.load(at(places, i)) for i in range(rows)]
            rows_at = data(5, ldw)
            ldw = ir.Constant(index, lanes * PANEL_VECTORS)
        else:
            A = at(data(0, a_arg), a_offset)
        W = at(data(3, panels_arg), panel_offset)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector, [vector] * 3),
            f"llvm.fma.v{lanes}{'f32' if lanes == 16 else 'f64'}")
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

        def step(k):
            """One k: the panel's row, each row's a[i, k] spread, the multiply-adds."""
            w_row = at(W, builder.mul(k, ldw))
            w = [load_vector(w_row, v * lanes) for v in range(PANEL_VECTORS)]
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

        # K goes in blocks of K_BLOCK: each block's sums start at zero and are then added to
        # the totals, so that a long K is not one chain of roundings (a 64 x 576 layer of
        # SqueezeNet: 2.3e-6 of the largest output in one chain, 1.7e-6 through OpenBLAS)
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
                step(builder.add(k0, inner.index))
            for row_sums, row_totals in zip(sums, totals):
                for total, part in zip(row_totals, row_sums):
                    builder.store(builder.fadd(builder.load(total), builder.load(part)), total)
        sums = totals

        C = at(data(6, c_arg), c_offset)
        if taps:
            def store(*arguments):
                _transposed_store(*arguments, columns=args[17])
        else:
            store = _row_store

        def finish(value, adding, offset):
            if finished:
                value = _epilogue(builder, value, adding, offset, args[14:17], spread,
                                  load_vector)
            return value
        if not finished:
            store(builder, sums, C, None, ldc, finish, store_vector)
            return context.get_dummy_value()
        residual = at(data(12, args[12]), c_offset)
        with builder.if_else(args[13]) as (with_residual, without):
            with with_residual:
                store(builder, sums, C, residual, ldc, finish, store_vector)
            with without:
                store(builder, sums, C, None, ldc, finish, store_vector)
        return context.get_dummy_value()

    return codegen


def _row_store(builder, sums, C, residual, ldc, finish, store_vector):
    """Row i of the tile at ``C + i * ldc``: its vectors side by side."""
    lanes = sums[0][0].type.pointee.count
    for i, row_sums in enumerate(sums):
        row = builder.mul(ir.Constant(ir.IntType(64), i), ldc)
        for v, total in enumerate(row_sums):
            offset = builder.add(row, ir.Constant(ir.IntType(64), v * lanes))
            store_vector(finish(builder.load(total), residual, offset), C, offset)


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


def strip_rows(count: int) -> int:
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
    channels ``stride`` apart, output ``first`` at ``offset`` in each. Whole panels of
    outputs are read in place; the last, partial one is copied into ``edge`` (C, width),
    zero-padded (reads past the image could fault), and with tiles of rows past M goes
    through ``spill`` (STRIP_ROWS, width). The epilogue is :func:`tap_conv`'s. Weight rows
    go in blocks of ``row_block`` that stay in L2 while the outputs pass over them."""
    k_len = w.shape[1]
    width = spill.shape[1]
    channels, length = y.shape
    flat_y, flat_spill, flat_residual = y.reshape(-1), spill.reshape(-1), residual.reshape(-1)
    whole = count // width * width
    if whole < count:
        for k in range(k_len):
            for j in range(width):
                edge[k, j] = image[k * stride + offset + whole + j] if whole + j < count else 0
    for b0 in range(m0, m1, row_block):
        b1 = min(m1, b0 + row_block)
        for q0 in range(0, count, width):
            inside = q0 < whole
            for s in range(b0, b1, STRIP_ROWS):
                if inside and s + STRIP_ROWS <= channels:
                    _finished_tile(w, s * k_len, k_len, image, offset + q0, stride, flat_y,
                                   s * length + first + q0, length, k_len, bias, s,
                                   flat_residual, has_residual, low, high, slope)
                    continue
                if inside:
                    _tile8(w, s * k_len, k_len, image, offset + q0, stride, spill, 0, width,
                           k_len)
                else:
                    _tile8(w, s * k_len, k_len, edge, 0, width, spill, 0, width, k_len)
                for i in range(min(STRIP_ROWS, channels - s)):
                    _finish_run(flat_spill, np.uint64(i * width), flat_y,
                                np.uint64((s + i) * length + first + q0),
                                np.uint64(min(width, count - q0)), bias[s + i], flat_residual,
                                has_residual, low, high, slope)


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
