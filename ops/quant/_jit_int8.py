"""The 8-bit integer product, emitted as LLVM IR around AVX-512 VNNI's ``vpdpbusd``: the
exact int32 sums of unsigned activation codes times signed weight codes (``ops/quant/int8_cpu.py``
prepares both and applies the zero points).

``vpdpbusd`` multiplies the 4 unsigned bytes of each 32-bit lane of one operand by the 4
signed bytes of the other and adds the four products to the lane's int32 sum, without
saturating: 64 multiply-adds an instruction where a float32 FMA does 16. The tile holds up
to eight activation rows by two vectors of 16 columns (sixteen int32 accumulators in
registers, as the float tile of ``ops/panels/_jit_tile.py``); for each group of four k it loads the
two weight vectors once and broadcasts each row's four bytes.

Layouts: activations ``a`` flat uint8, row ``i`` at ``a_offset + i * lda`` with its K codes
padded with zeros to ``4 * k_groups``; the weight's panels flat int8, panel ``p`` at
``p * k_groups * PANEL_BYTES``, each group of four k one PANEL_BYTES record of 32 columns x 4
codes (column-major within the group: column j's four codes are bytes 4j..4j+3); ``c`` flat
int32, row ``i`` of the tile at ``c_offset + i * ldc``. Sums of up to 2**31 are exact: K up to
~66,000 codes of 8 bits.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, float32, njit, types, uint64
from numba.core import cgutils
from numba.extending import intrinsic

from mixrt.ops.compiled.first_use import first_use_cfunc
from mixrt.ops.panels._jit_atomics import void_pointer_like as _pointer_like

STRIP_ROWS = 8  # activation rows of one tile
PANEL_COLUMNS = 32  # two vectors of 16 int32 lanes
PANEL_BYTES = PANEL_COLUMNS * 4  # one group of four k of a panel

_jit = njit(nogil=True, cache=True, boundscheck=False)


def _make_tile(rows: int):
    @intrinsic
    def tile(typingctx, a, a_offset, lda, panels, panel_offset, c, c_offset, ldc, k_groups):
        sig = types.void(a, types.intp, types.intp, panels, types.intp, c, types.intp,
                         types.intp, types.intp)
        return sig, _tile_codegen(rows)
    return tile


def _tile_codegen(rows: int):
    def codegen(context, builder, signature, args):
        (a_arg, a_offset, lda, panels_arg, panel_offset, c_arg, c_offset, ldc,
         k_groups) = args
        i32, index = ir.IntType(32), ir.IntType(64)
        lanes = ir.VectorType(i32, 16)

        def data(position, value):
            return context.make_array(signature.args[position])(context, builder, value).data

        def at(pointer, offset):
            return builder.gep(pointer, [offset if isinstance(offset, ir.Value)
                                         else ir.Constant(index, offset)])

        def spread(value):
            undefined = ir.Constant(lanes, ir.Undefined)
            return builder.shuffle_vector(
                builder.insert_element(undefined, value, ir.Constant(i32, 0)), undefined,
                ir.Constant(ir.VectorType(i32, 16), [0] * 16))

        dot = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(lanes, [lanes] * 3), "llvm.x86.avx512.vpdpbusd.512")
        A = at(data(0, a_arg), a_offset)
        W = at(data(3, panels_arg), panel_offset)
        C = at(data(5, c_arg), c_offset)
        zero = ir.Constant(lanes, [0] * 16)
        # the sums live in allocas that LLVM promotes to registers (mem2reg)
        sums = [[cgutils.alloca_once_value(builder, zero) for _ in range(2)]
                for _ in range(rows)]
        with cgutils.for_range(builder, k_groups) as loop:
            group = loop.index
            record = at(W, builder.mul(group, ir.Constant(index, PANEL_BYTES)))
            weights = [builder.load(builder.bitcast(at(record, 64 * v), lanes.as_pointer()),
                                    align=1) for v in range(2)]
            column = builder.mul(group, ir.Constant(index, 4))
            for i in range(rows):
                row = builder.add(builder.mul(ir.Constant(index, i), lda), column)
                codes = builder.load(builder.bitcast(at(A, row), i32.as_pointer()), align=1)
                codes = spread(codes)
                for v in range(2):
                    builder.store(builder.call(dot, [builder.load(sums[i][v]), codes,
                                                     weights[v]]), sums[i][v])
        for i in range(rows):
            row = builder.mul(ir.Constant(index, i), ldc)
            for v in range(2):
                target = at(C, builder.add(row, ir.Constant(index, 16 * v)))
                builder.store(builder.load(sums[i][v]),
                              builder.bitcast(target, lanes.as_pointer()), align=4)
        return context.get_dummy_value()
    return codegen


_tile1, _tile2, _tile3, _tile4, _tile5, _tile6, _tile7, _tile8 = \
    (_make_tile(rows) for rows in range(1, STRIP_ROWS + 1))


@_jit
def _tile(rows, a, a_offset, lda, panels, panel_offset, c, c_offset, ldc, k_groups):
    """The tile for 1..8 rows (each row count is its own unrolled kernel)."""
    if rows == 8:
        _tile8(a, a_offset, lda, panels, panel_offset, c, c_offset, ldc, k_groups)
    elif rows == 7:
        _tile7(a, a_offset, lda, panels, panel_offset, c, c_offset, ldc, k_groups)
    elif rows == 6:
        _tile6(a, a_offset, lda, panels, panel_offset, c, c_offset, ldc, k_groups)
    elif rows == 5:
        _tile5(a, a_offset, lda, panels, panel_offset, c, c_offset, ldc, k_groups)
    elif rows == 4:
        _tile4(a, a_offset, lda, panels, panel_offset, c, c_offset, ldc, k_groups)
    elif rows == 3:
        _tile3(a, a_offset, lda, panels, panel_offset, c, c_offset, ldc, k_groups)
    elif rows == 2:
        _tile2(a, a_offset, lda, panels, panel_offset, c, c_offset, ldc, k_groups)
    else:
        _tile1(a, a_offset, lda, panels, panel_offset, c, c_offset, ldc, k_groups)


@_jit
def product(a, rows, lda, panels, k_groups, c, ldc, p0, p1):
    """c[:rows, 32 p0 : 32 p1] = the exact int32 sums of a's codes times panels p0..p1 (the
    layouts of the module's docstring; ``a`` and ``c`` flat)."""
    for p in range(p0, p1):
        offset = p * k_groups * PANEL_BYTES
        for s in range(0, rows, STRIP_ROWS):
            _tile(min(STRIP_ROWS, rows - s), a, s * lda, lda, panels, offset, c,
                  s * ldc + p * PANEL_COLUMNS, ldc, k_groups)


# -- split over the native pool ------------------------------------------------------------
#
# ``product_part`` is a ``cfunc`` the native pool's worker calls through its address
# (``_jit_native_pool.native_for``): args[0] the int64 words (rows, lda, k_groups, ldc,
# panels, parts, then each array's size), args[1:] the codes, the panels and the sums.

PART_SIGNATURE = types.void(types.CPointer(types.voidptr), types.int64)
HEAD = 6  # words before the sizes


@_jit
def _product_part(args, part):
    words = carray(args[0], (HEAD + 3,), np.int64)
    rows, lda, k_groups, ldc, count, parts = (words[0], words[1], words[2], words[3],
                                              words[4], words[5])
    codes = carray(_pointer_like(args[1], np.uint8(0)), (words[HEAD],))
    panels = carray(_pointer_like(args[2], np.int8(0)), (words[HEAD + 1],))
    sums = carray(_pointer_like(args[3], np.int32(0)), (words[HEAD + 2],))
    product(codes, rows, lda, panels, k_groups, sums, ldc, count * part // parts,
            count * (part + 1) // parts)


@first_use_cfunc(PART_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def product_part(args, part):
    _product_part(args, part)


# -- the float output stage ------------------------------------------------------------------

@_jit
def to_float(sums, ldc, codes, lda, k, a_zero, shift, b_zero, b_zeros, multiplier, bias,
             biased, out):
    """out[i, j] = float32(sum_k (a - a_zero)(b - b_zero[j])) * multiplier[j] (+ bias[j])
    from the raw sums (flat, rows ldc apart) in one pass: ``shift[j]`` = a_zero * (column
    j's code sum), and where ``b_zeros`` (some b_zero is nonzero) each row's code sum r
    takes b_zero[j] * (r - k a_zero) off too, in int32 (exact: every term is a sum of 8-bit
    products); then the conversion, product and sum in float32, as NumPy's passes make
    them (the bias added after the product's rounding). Offsets are unsigned: with signed
    ones numba's check for negative indices kept the loops from vectorizing (BERT's 64 x
    1024 output: 39 -> 11 us)."""
    rows, n = out.shape
    flat = out.reshape(-1)
    for i in range(rows):
        row, at = uint64(i * ldc), uint64(i * n)
        if b_zeros:
            row_sum = np.int32(0)
            for t in range(k):
                row_sum += np.int32(codes[uint64(i * lda + t)])
            r = row_sum - np.int32(k) * np.int32(a_zero)
            for j in range(n):
                u = uint64(j)
                flat[at + u] = float32(sums[row + u] - shift[u] - b_zero[u] * r) * multiplier[u]
            if biased:
                for j in range(n):
                    flat[at + uint64(j)] += bias[uint64(j)]
        elif biased:
            for j in range(n):
                u = uint64(j)
                flat[at + u] = float32(sums[row + u] - shift[u]) * multiplier[u] + bias[u]
        else:
            for j in range(n):
                u = uint64(j)
                flat[at + u] = float32(sums[row + u] - shift[u]) * multiplier[u]
