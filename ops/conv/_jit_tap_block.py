"""A block of a grouped convolution's flat output row summed tap by tap in vector registers:
the inner kernel of ``ops/conv/jit_grouped_blocks.py``'s modules, emitted as LLVM IR.

``tap_block(ps, k0, offsets, ws, wbase, taps, bias, dst)`` computes, for the BLOCK_VECTORS
vectors of cells from ``k0`` on (``tap_vector``: for one vector), ``bias + ws[wbase] *
ps[offsets[0] + k] + ws[wbase + 1] * ps[offsets[1] + k] + ...`` over ``taps`` taps and
stores it at ``ps[dst + k]``. Each sum is the flat form's (``jit_depthwise.flat_source``):
the taps in order, each product rounded and then added, no fused multiply-add, so the same
bits. Its sums stay in registers across the taps, whose offsets and weights are read from
arrays: one module serves every image size. Written as numba loops, the taps outside and
the cells inside, each tap's pass stored and loaded its partial sums again (RegNet's
440x7x7 layer, one thread, 345 us against the flat form's 122; here 93).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

VECTOR_BYTES = 64
BLOCK_VECTORS = 4  # independent sums, so that each addition's latency overlaps the others'


def block_cells(itemsize: int) -> int:
    """The cells :func:`tap_block` computes; :func:`tap_vector` computes one vector's."""
    return BLOCK_VECTORS * VECTOR_BYTES // itemsize


def _make(vectors: int):
    """The kernel over ``vectors`` vectors of cells (see the module's docstring)."""

    @intrinsic
    def tap_cells(typingctx, ps, k0, offsets, ws, wbase, taps, bias, dst):
        sig = types.void(ps, types.intp, offsets, ws, types.intp, types.intp, bias,
                         types.intp)
        return sig, _codegen(vectors)

    return tap_cells


def _codegen(vectors: int):
    def codegen(context, builder, signature, args):
        ps_arg, k0, offsets_arg, ws_arg, wbase, taps, bias, dst = args
        scalar = context.get_value_type(signature.args[0].dtype)
        itemsize = 4 if isinstance(scalar, ir.FloatType) else 8
        lanes = VECTOR_BYTES // itemsize
        vector = ir.VectorType(scalar, lanes)
        index = ir.IntType(64)

        def data(position, value):
            return context.make_array(signature.args[position])(context, builder, value).data

        def spread(value):
            undefined = ir.Constant(vector, ir.Undefined)
            first = builder.insert_element(undefined, value, ir.Constant(ir.IntType(32), 0))
            return builder.shuffle_vector(first, undefined, ir.Constant(
                ir.VectorType(ir.IntType(32), lanes), [0] * lanes))

        def cells(at, v):  # the v-th vector of cells from cell ``at``
            cell = builder.gep(cells_base, [builder.add(at, ir.Constant(index, v * lanes))])
            return builder.bitcast(cell, vector.as_pointer())

        cells_base, offsets, weights = data(0, ps_arg), data(2, offsets_arg), data(3, ws_arg)
        # the sums live in allocas that LLVM promotes to registers (mem2reg)
        sums = [cgutils.alloca_once_value(builder, spread(bias)) for _ in range(vectors)]
        with cgutils.for_range(builder, taps) as loop:
            tap = loop.index
            weight = spread(builder.load(builder.gep(weights, [builder.add(wbase, tap)])))
            at = builder.add(builder.load(builder.gep(offsets, [tap])), k0)
            for v, total in enumerate(sums):
                value = builder.load(cells(at, v), align=itemsize)
                builder.store(builder.fadd(builder.load(total), builder.fmul(weight, value)),
                              total)
        for v, total in enumerate(sums):
            builder.store(builder.load(total), cells(builder.add(dst, k0), v), align=itemsize)
        return context.get_dummy_value()

    return codegen


# a block of BLOCK_VECTORS vectors, its four sums overlapping their additions' latency; and
# one vector, for the row's last cells (a 6 x 2 output's flat row is 24 cells, which blocks
# of 64 would have computed almost three times over)
tap_block, tap_vector = _make(BLOCK_VECTORS), _make(1)
