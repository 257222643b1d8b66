"""The compiled parts of ``ops/conv/grouped_cpu.py``: one (image, group) each, a BLAS product
through its address and the epilogue over the group's rows. Kept apart so that numba loads
only when a grouped convolution first runs here."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from mixrt.ops.compiled.first_use import first_use_cfunc

_SIGNATURE = types.void(types.CPointer(types.voidptr), types.int64)
_jit = njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
ROW_MAJOR, NO_TRANS = 101, 111


def _make_gemm(bits: int):
    """An intrinsic calling ``cblas_?gemm`` at an address with ``bits``-wide integers:
    ``c = a @ b`` (row-major, no transposes, alpha 1, beta 0) of m x k by k x n, each
    operand an int64 address and its leading dimension."""
    @intrinsic
    def gemm(typingctx, fn, m, n, k, a, lda, b, ldb, c, ldc, zero):
        def codegen(context, builder, signature, args):
            i32, integer = ir.IntType(32), ir.IntType(bits)
            real = context.get_value_type(signature.args[-1])
            pointer = real.as_pointer()
            function = ir.FunctionType(ir.VoidType(), [
                i32, i32, i32, integer, integer, integer, real, pointer, integer, pointer,
                integer, real, pointer, integer])
            target = builder.inttoptr(args[0], function.as_pointer())

            def whole(value):
                return builder.trunc(value, integer) if bits < 64 else value
            builder.call(target, [
                ir.Constant(i32, ROW_MAJOR), ir.Constant(i32, NO_TRANS),
                ir.Constant(i32, NO_TRANS), whole(args[1]), whole(args[2]), whole(args[3]),
                ir.Constant(real, 1.0), builder.inttoptr(args[4], pointer), whole(args[5]),
                builder.inttoptr(args[6], pointer), whole(args[7]), ir.Constant(real, 0.0),
                builder.inttoptr(args[8], pointer), whole(args[9])])
            return context.get_dummy_value()
        return types.void(types.int64, types.int64, types.int64, types.int64, types.int64,
                          types.int64, types.int64, types.int64, types.int64, types.int64,
                          zero), codegen
    return gemm


_gemm64, _gemm32 = _make_gemm(64), _make_gemm(32)


@_jit
def _group(words, x, w, bias, residual, limits, y, index):
    """Part ``index``: image index // groups, group index % groups."""
    at = 1 + 6  # past the length word and the six arrays' sizes (then the image count)
    groups, channels, rows, length = words[at + 1], words[at + 2], words[at + 3], words[at + 4]
    has_residual, gemm, wide = words[at + 5] != 0, words[at + 6], words[at + 7] != 0
    image, group = index // groups, index % groups
    first = image * rows * groups + group * rows  # the group's first output row
    itemsize = x.itemsize
    a = w.ctypes.data + group * rows * channels * itemsize
    b = x.ctypes.data + (image * groups + group) * channels * length * itemsize
    c = y.ctypes.data + first * length * itemsize
    zero = y.dtype.type(0)
    if wide:
        _gemm64(gemm, rows, length, channels, a, channels, b, length, c, length, zero)
    else:
        _gemm32(gemm, rows, length, channels, a, channels, b, length, c, length, zero)
    low, high, slope = limits[0], limits[1], limits[2]
    for r in range(rows):
        shift = bias[group * rows + r]
        row = y[(first + r) * length:(first + r + 1) * length]
        if has_residual:  # two loops: a test inside one kept LLVM from vectorizing it
            added = residual[(first + r) * length:(first + r + 1) * length]
            for q in range(length):
                row[q] = _finished(row[q] + shift + added[q], zero, low, high, slope)
        else:
            for q in range(length):
                row[q] = _finished(row[q] + shift, zero, low, high, slope)


@njit(inline="always")
def _finished(v, zero, low, high, slope):
    """The slope below zero, then the clamp (comparisons: a NaN passes through)."""
    v = v * slope if v < zero else v
    v = low if v < low else v
    return high if v > high else v


@_jit
def _words(args):
    return carray(args[0], (carray(args[0], (1,), np.int64)[0],), np.int64)


@first_use_cfunc(_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def part_f(args, index):
    words = _words(args)
    _group(words, carray(args[1], (words[1],), np.float32),
           carray(args[2], (words[2],), np.float32), carray(args[3], (words[3],), np.float32),
           carray(args[4], (words[4],), np.float32), carray(args[5], (words[5],), np.float32),
           carray(args[6], (words[6],), np.float32), index)


@first_use_cfunc(_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def part_d(args, index):
    words = _words(args)
    _group(words, carray(args[1], (words[1],), np.float64),
           carray(args[2], (words[2],), np.float64), carray(args[3], (words[3],), np.float64),
           carray(args[4], (words[4],), np.float64), carray(args[5], (words[5],), np.float64),
           carray(args[6], (words[6],), np.float64), index)
