"""Atomic operations on int64 (or int32) array words, as LLVM IR (numba has none for the
CPU), and an array's address.

The native worker pool (ops/panels/_jit_panels.py) and the recurrent sequences split between its
threads (ops/rnn/_jit_recurrent.py) synchronize through them. They are intrinsics, compiled into
each caller: numba's disk cache is stamped per source file, so a change here must come with
a change to those files (or a cleared cache) to reach their cached code.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _word(context, builder, signature, args):
    data = context.make_array(signature.args[0])(context, builder, args[0]).data
    return builder.gep(data, [args[1]])


@intrinsic
def load(typingctx, block, index):
    """``block[index]``, read with acquire order (sees what was written before the release
    that wrote it)."""
    def codegen(context, builder, signature, args):
        word = _word(context, builder, signature, args)
        return builder.load_atomic(word, "acquire", word.type.pointee.width // 8)
    return block.dtype(block, types.intp), codegen


@intrinsic
def store(typingctx, block, index, value):
    """``block[index] = value`` with release order (publishes every earlier write)."""
    def codegen(context, builder, signature, args):
        word = _word(context, builder, signature, args)
        builder.store_atomic(args[2], word, "release", word.type.pointee.width // 8)
        return context.get_dummy_value()
    return types.void(block, types.intp, block.dtype), codegen


@intrinsic
def fetch_add(typingctx, block, index, value):
    """Adds ``value`` to ``block[index]`` (sequentially consistent); the old value."""
    def codegen(context, builder, signature, args):
        return builder.atomic_rmw("add", _word(context, builder, signature, args), args[2],
                                  "seq_cst")
    return block.dtype(block, types.intp, block.dtype), codegen


@intrinsic
def compare_swap(typingctx, block, index, expected, value):
    """``block[index] = value`` if it holds ``expected`` (sequentially consistent); whether
    it did."""
    def codegen(context, builder, signature, args):
        pair = builder.cmpxchg(_word(context, builder, signature, args), args[2], args[3],
                               "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)
    return types.boolean(block, types.intp, block.dtype, block.dtype), codegen


@intrinsic
def pause(typingctx):
    """The spin-wait hint (x86 ``pause``): the core stops speculating past the loop."""
    def codegen(context, builder, signature, args):
        builder.call(cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"), [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def address(typingctx, array):
    """The address of ``array``'s first element, as an int64 (for the argument block)."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, ir.IntType(64))
    return types.int64(array), codegen


@intrinsic
def void_pointer_like(typingctx, raw, like):
    """The void pointer ``raw`` (an address a ``cfunc`` was handed) as a pointer to the type
    of the scalar ``like``, for ``carray``."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_data_type(like).as_pointer())
    return types.CPointer(like)(types.voidptr, like), codegen
