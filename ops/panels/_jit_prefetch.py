"""Cache-line hints for the compiled kernels: ask for lines a kernel reads next while it works
on others (a panel's lines ahead of its tiles, ``_jit_dense.py`` and ``_jit_conv_direct.py``).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

LINE_BYTES = 64  # a cache line

_jit = njit(nogil=True, cache=True, boundscheck=False)


@intrinsic
def prefetch(typingctx, array, offset):
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
def prefetch_run(array, start, count):
    """The cache lines of ``count`` elements of flat ``array`` from ``start``."""
    step = max(1, LINE_BYTES // array.itemsize)
    for offset in range(start, start + count, step):
        prefetch(array, offset)
