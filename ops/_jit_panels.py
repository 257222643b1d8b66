"""Compiled products against a weight packed into column panels (``ops/matmul_cpu.py``).

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

Every sum is the plain sequence ``fma(a[i, k], w[k, j], sum)`` over k: no reassociation, so
NaNs and infinities propagate as in any product.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

VECTOR_BYTES = 64
PANEL_VECTORS = 2  # vectors across a panel: 32 floats or 16 doubles
STRIP_ROWS = 8  # activation rows of one tile: 16 sums in registers, 2 panel vectors, a broadcast
ROW_BLOCK = 256  # rows taken through all of a thread's panels before the next rows

_jit = njit(nogil=True, cache=True, boundscheck=False)


def _make_tile(rows: int):
    """The tile kernel for ``rows`` activation rows: ``c[i, j] = sum_k a[i, k] * w[k, j]``
    for i < rows and the panel's columns j. Arguments: flat ``a`` and its offset and row
    stride, flat ``panels`` and the panel's offset and row stride (the panel's width when it
    is packed, a row of the matrix when the panel is read in place), flat ``c`` and its
    offset and row stride, and K."""

    @intrinsic
    def tile(typingctx, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len):
        sig = types.void(a, types.intp, types.intp, panels, types.intp, types.intp, c,
                         types.intp, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            (a_arg, a_offset, lda, panels_arg, panel_offset, ldw, c_arg, c_offset, ldc,
             k_len) = args
            scalar = context.get_value_type(signature.args[0].dtype)
            itemsize = 4 if isinstance(scalar, ir.FloatType) else 8
            lanes = VECTOR_BYTES // itemsize
            vector = ir.VectorType(scalar, lanes)
            index = ir.IntType(64)

            def data(position, value):
                return context.make_array(signature.args[position])(context, builder,
                                                                    value).data
            A = builder.gep(data(0, a_arg), [a_offset])
            W = builder.gep(data(3, panels_arg), [panel_offset])
            C = builder.gep(data(6, c_arg), [c_offset])
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vector, [vector] * 3),
                f"llvm.fma.v{lanes}{'f32' if lanes == 16 else 'f64'}")
            zeros = ir.Constant(vector, [0.0] * lanes)
            # the sums live in allocas that LLVM promotes to registers (mem2reg)
            sums = [[cgutils.alloca_once_value(builder, zeros) for _ in range(PANEL_VECTORS)]
                    for _ in range(rows)]
            splat = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
            undefined = ir.Constant(vector, ir.Undefined)
            with cgutils.for_range(builder, k_len) as loop:
                k = loop.index
                w_row = builder.gep(W, [builder.mul(k, ldw)])
                w = [builder.load(builder.bitcast(
                    builder.gep(w_row, [ir.Constant(index, v * lanes)]), vector.as_pointer()),
                    align=itemsize) for v in range(PANEL_VECTORS)]
                a_column = builder.gep(A, [k])
                for i in range(rows):
                    row_start = builder.mul(ir.Constant(index, i), lda)
                    value = builder.load(builder.gep(a_column, [row_start]))
                    broadcast = builder.shuffle_vector(
                        builder.insert_element(undefined, value, ir.Constant(ir.IntType(32), 0)),
                        undefined, splat)
                    for v in range(PANEL_VECTORS):
                        total = builder.call(fma, [broadcast, w[v], builder.load(sums[i][v])])
                        builder.store(total, sums[i][v])
            for i in range(rows):
                c_row = builder.gep(C, [builder.mul(ir.Constant(index, i), ldc)])
                for v in range(PANEL_VECTORS):
                    target = builder.bitcast(
                        builder.gep(c_row, [ir.Constant(index, v * lanes)]), vector.as_pointer())
                    builder.store(builder.load(sums[i][v]), target, align=itemsize)
            return context.get_dummy_value()

        return sig, codegen

    return tile


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
