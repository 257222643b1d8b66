"""The packed-panel tile, emitted as LLVM IR: the inner kernel of the dense products
(``ops/panels/_jit_dense.py``), the direct convolutions (``ops/panels/_jit_conv_direct.py``), their
weight gradient (``ops/panels/_jit_conv_weight_grad.py``) and the attention heads
(``ops/panels/_jit_attention.py``).

The inner kernel computes a tile of up to eight rows (twelve for the dense products:
DENSE_ROWS) by one panel with its sums held in registers: for each k, two vector loads of
the panel's row and, per activation row, one broadcast and two fused multiply-adds.
numba's loops did not get there (written as scalar sums, LLVM left them unvectorized; as dot
products along K, the sixteen horizontal reductions per tile held them to 165 GFLOP/s), so
the tile is emitted as LLVM IR through ``numba.extending.intrinsic``, with ``<lanes x
float>`` values and ``llvm.fma``. One thread runs it at ~250 GFLOP/s.

Each sum is the sequence ``fma(a[i, k], w[k, j], sum)`` over a block of K_BLOCK values of k,
the blocks' sums then added in order: NaNs and infinities propagate as in any product, and a
long K is not one chain of roundings.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

VECTOR_BYTES = 64
PANEL_VECTORS = 2  # vectors across a panel: 32 floats or 16 doubles
STRIP_ROWS = 8  # activation rows of one tile: 16 sums in registers, 2 panel vectors, a broadcast
# Rows of a dense product's tile (``_jit_dense.py``): 24 sums, 2 panel vectors and a broadcast,
# 27 of AVX-512's 32 registers. Each panel row loaded serves 12 rows' multiply-adds instead of
# 8, so a panel streamed from L2 (any panel of K past ~300: K x 32 floats) feeds half as much
# work again per byte. The same rows as onnxruntime's AVX-512 sgemm kernel. One process, the two
# alternating on the same arrays (2026-12-02), 12 rows against 8: 137 x 384 @ 384 x 384 0.89,
# 137 x 1536 @ 1536 x 384 0.88, 300 x 384 @ 384 x 1536 0.86, 17 x 1536 @ 1536 x 384 0.86,
# 24 x 384 @ 384 x 384 0.88-0.94, the same bits (each output's sum is the same sequence).
DENSE_ROWS = 12
K_BLOCK = 128  # k per block of sums added to the totals (see _tile_codegen)
K_UNROLL = 4  # k per iteration of a block's loop
# a packed strip's rows at each k (its DENSE_ROWS and padding): one aligned 64-byte line of
# floats, which the strip's transpose writes whole (12 apart, its stores crossed lines)
PACKED_STRIDE = 16

_jit = njit(nogil=True, cache=True, boundscheck=False)


def _make_tile(rows: int, finished: bool = False, vectors: int = PANEL_VECTORS,
               biased: bool = False, packed: bool = False, across: int = 1):
    """The tile kernel for ``rows`` activation rows: ``c[i, j] = sum_k a[i, k] * w[k, j]``
    for i < rows and the panel's first ``vectors`` vectors of columns j (one: the half
    tile of a last panel with at most ``lanes`` columns, ``_jit_dense_tiles._half_tile``).
    Arguments: flat ``a`` and its offset and row stride, flat ``panels`` and the panel's
    offset and row stride (the panel's width when it is packed, a row of the matrix when
    the panel is read in place), flat ``c`` and its offset and row stride, and K.

    ``finished``: the convolution's epilogue on the way out, from seven more arguments
    (``bias, bias_offset, residual, has_residual, low, high, slope``): the sums start at
    ``bias[bias_offset + i]`` for row i; ``residual`` (c's layout, read at c's offsets) is
    added when ``has_residual``, values below zero are multiplied by ``slope`` and the
    result is clamped to [low, high] by comparisons (NaN passes through). Its last argument,
    ``columns``, is how many of the panel's columns exist: fewer than a panel's width (a
    last panel of outputs read in place) and the panel's rows, the residual and c are read
    and written under a mask, so nothing past them is touched.

    ``biased`` (a plain tile): five more arguments, ``bias, bias_offset, low, high, slope``,
    a bias per column and a dense layer's activation; each finished sum gets
    ``bias[bias_offset + j]`` added in its register as the tile is stored, the same one
    addition per output as a pass of ``c += bias`` after the tile, which cost a dense layer
    with a short K as much as a third of its product (a 1536 x 64 @ 64 x 896 layer 4.4 ms
    against 2.7 unbiased); then the convolution's slope and clamp (``low, high, slope`` =
    -inf, inf, 1 leave every value as it is, NaN included). A Relu as a compiled pass of its
    own after each of an MLP's layers was ~30 us a layer of a request 10 ms after the last,
    cold, for a few microseconds of work (2026-11-30).

    ``across`` (plain and biased tiles): that many consecutive panels side by side, their
    columns one row of the tile, from a last argument ``panel_stride`` (elements from one
    panel to the next): see ``_jit_dense_tiles.WIDE_ACROSS``."""

    if biased and across > 1:
        @intrinsic
        def wide_biased_tile(typingctx, a, a_offset, lda, panels, panel_offset, ldw, c,
                             c_offset, ldc, k_len, bias, bias_offset, low, high, slope,
                             panel_stride):
            sig = types.void(a, types.intp, types.intp, panels, types.intp, types.intp, c,
                             types.intp, types.intp, types.intp, bias, types.intp, a.dtype,
                             a.dtype, a.dtype, types.intp)
            return sig, _tile_codegen(rows, finished=False, taps=False, biased=True,
                                      across=across)
        return wide_biased_tile

    if across > 1:
        @intrinsic
        def wide_tile(typingctx, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset,
                      ldc, k_len, panel_stride):
            sig = types.void(a, types.intp, types.intp, panels, types.intp, types.intp, c,
                             types.intp, types.intp, types.intp, types.intp)
            return sig, _tile_codegen(rows, finished=False, taps=False, across=across)
        return wide_tile

    if biased:
        @intrinsic
        def biased_tile(typingctx, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset,
                        ldc, k_len, bias, bias_offset, low, high, slope):
            sig = types.void(a, types.intp, types.intp, panels, types.intp, types.intp, c,
                             types.intp, types.intp, types.intp, bias, types.intp, a.dtype,
                             a.dtype, a.dtype)
            return sig, _tile_codegen(rows, finished=False, taps=False, vectors=vectors,
                                      biased=True, packed=packed)
        return biased_tile

    if not finished:
        @intrinsic
        def tile(typingctx, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc,
                 k_len):
            sig = types.void(a, types.intp, types.intp, panels, types.intp, types.intp, c,
                             types.intp, types.intp, types.intp)
            return sig, _tile_codegen(rows, finished=False, taps=False, vectors=vectors,
                                      packed=packed)
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


def _tile_codegen(rows: int, finished: bool, taps: bool, gathered: bool = False,
                  vectors: int = PANEL_VECTORS, biased: bool = False, packed: bool = False,
                  across: int = 1):
    # ``vectors``: of the panel's PANEL_VECTORS, how many the tile computes (plain tiles only;
    # the packed panels' rows stay PANEL_VECTORS wide). ``across``: panels side by side
    # (plain and biased tiles), ``vectors`` of each, the row's vectors ``row_vectors`` in all
    assert vectors == PANEL_VECTORS or not (finished or taps)
    assert across == 1 or not (finished or taps or packed)
    row_vectors = vectors * across

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
        # sums in allocas that LLVM promotes to registers (mem2reg); a finished tile's totals
        if not finished:  # start at its bias (a plain tile's are in C: run_into_c)
            starts = None
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
            w = [load_vector(w_row, v * lanes, mask=masked(v)) for v in range(vectors)]
            for panel in range(1, across):  # the next panels' row k, panel_stride apart
                later = at(w_row, builder.mul(ir.Constant(index, panel), args[-1]))
                w += [load_vector(later, v * lanes) for v in range(vectors)]
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
            elif packed:  # a strip packed k by k: a[k * PACKED_STRIDE + i]
                a_column = at(A, builder.mul(k, ir.Constant(index, PACKED_STRIDE)))
            else:
                a_column = at(A, k)
            for i in range(rows):
                if packed:
                    place = ir.Constant(index, i)
                else:
                    place = row_places[i] if taps else builder.mul(ir.Constant(index, i), lda)
                value = spread(builder.load(at(a_column, place)))
                for v in range(row_vectors):
                    total = builder.call(fma, [value, w[v], builder.load(sums[i][v])])
                    builder.store(total, sums[i][v])

        def blocked_sums(sums, after_block, empty_block=False):
            """The sums over K in blocks of K_BLOCK: each block's start at zero, then
            ``after_block(block index)`` takes them, so that a long K is not one chain of
            roundings (a 64 x 576 layer of SqueezeNet: 2.3e-6 of the largest output in one
            chain, 1.7e-6 via OpenBLAS). ``empty_block``: a K of zero is one empty block
            (else none)."""
            zeros = ir.Constant(vector, [0.0] * lanes)
            block, one = ir.Constant(index, K_BLOCK), ir.Constant(index, 1)
            blocks = builder.udiv(builder.add(k_len, ir.Constant(index, K_BLOCK - 1)), block)
            if empty_block:
                blocks = builder.select(builder.icmp_signed("<", blocks, one), one, blocks)
            with cgutils.for_range(builder, blocks) as outer:
                k0 = builder.mul(outer.index, block)
                span = builder.sub(k_len, k0)
                span = builder.select(builder.icmp_signed("<", span, block), span, block)
                for row_sums in sums:
                    for part in row_sums:
                        builder.store(zeros, part)
                # K_UNROLL steps an iteration, then the rest one by one: the loop's own
                # counting and pointer steps shared by more multiply-adds
                unroll = ir.Constant(index, K_UNROLL)
                runs = builder.udiv(span, unroll)
                with cgutils.for_range(builder, runs) as inner:
                    first = builder.add(k0, builder.mul(inner.index, unroll))
                    for u in range(K_UNROLL):
                        step(builder.add(first, ir.Constant(index, u)), sums)
                done = builder.add(k0, builder.mul(runs, unroll))
                with cgutils.for_range(builder, builder.sub(builder.add(k0, span), done)) \
                        as inner:
                    step(builder.add(done, inner.index), sums)
                after_block(outer.index)

        def zeroed_sums():
            return [[cgutils.alloca_once_value(builder, ir.Constant(vector, [0.0] * lanes))
                     for _ in range(row_vectors)] for _ in range(rows)]

        def run_into_c():
            """A plain or biased tile's sums over K, each block's added into the tile's place
            in C (the first block's stored there): the totals in C, not in registers, which
            12 rows' sums and totals (48 vectors) overflowed."""
            sums, zeros = zeroed_sums(), ir.Constant(vector, [0.0] * lanes)

            def into_c(block_index):
                first = builder.icmp_signed("==", block_index, ir.Constant(index, 0))

                def added(value, _, offset, v=None):  # 0 + the block's sums, or C's + them
                    held = builder.select(first, zeros, load_vector(C, offset, mask=masked(v)))
                    return builder.fadd(held, value)
                _row_store(builder, sums, C, None, ldc, added, put)
            blocked_sums(sums, into_c, empty_block=True)  # C is written whatever K
            if biased:  # the bias and activation on C's totals, as the tile is stored
                held = [[cgutils.alloca_once_value(builder, load_vector(
                    C, builder.add(builder.mul(ir.Constant(index, i), ldc),
                                   ir.Constant(index, v * lanes)), mask=masked(v)))
                    for v in range(row_vectors)] for i in range(rows)]
                store_tile(held)

        def run_and_store():
            """The sums over K, each block's added to the totals in registers, then the tile
            stored (finished: through the epilogue)."""
            totals = [[cgutils.alloca_once_value(builder, starts[i][v])
                       for v in range(vectors)] for i in range(rows)]
            sums = zeroed_sums()

            def into_totals(_):
                for row_sums, row_totals in zip(sums, totals):
                    for total, part in zip(row_totals, row_sums):
                        builder.store(builder.fadd(builder.load(total), builder.load(part)),
                                      total)
            blocked_sums(sums, into_totals)
            store_tile(totals)

        C = at(data(6, c_arg), c_offset)

        def masked(v):
            return None if masks is None or v is None else masks[v]

        def put(value, pointer, offset, v=None):
            store_vector(value, pointer, offset, mask=masked(v))

        column_bias = []  # a biased tile's bias vectors, loaded as the tile is stored

        def finish(value, adding, offset, v=None):
            if finished:
                value = _epilogue(builder, value, adding, offset, args[14:17], spread,
                                  lambda p, o, w: load_vector(p, o, w, mask=masked(v)))
            elif biased:  # the bias, then the activation's slope and clamp
                value = _epilogue(builder, builder.fadd(value, column_bias[v]), None, offset,
                                  args[12:15], spread, None)
            return value

        if taps:
            def store(*arguments):
                _transposed_store(*arguments, columns=args[17])
        else:
            store = _row_store

        def store_tile(sums):
            if biased:
                bias = at(data(10, args[10]), args[11])
                column_bias.extend(load_vector(bias, v * lanes) for v in range(row_vectors))
            if not finished:
                store(builder, sums, C, None, ldc, finish, put)
                return
            residual = at(data(12, args[12]), c_offset)
            with builder.if_else(args[13]) as (with_residual, without):
                with with_residual:
                    store(builder, sums, C, residual, ldc, finish, put)
                with without:
                    store(builder, sums, C, None, ldc, finish, put)

        if not finished and not taps:
            run_into_c()
            return context.get_dummy_value()
        if taps:
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


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def limited(v, low, high, slope):
    """v times ``slope`` when negative, then clamped to [low, high] by comparisons (NaN
    passes): the epilogue's arithmetic (:func:`_epilogue`) on one value, for the compiled
    loops that finish outputs outside the tile."""
    if v < 0:
        v *= slope
    if v < low:
        v = low
    if v > high:
        v = high
    return v


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
