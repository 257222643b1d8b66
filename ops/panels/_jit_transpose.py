"""Transposes in registers: a block of up to ``lanes`` x ``lanes`` values (``lanes`` = one
64-byte vector: 16 floats, 8 doubles) loaded as vectors, transposed by shuffles and stored
as vectors, emitted as LLVM IR as the tile of ``_jit_tile.py`` is.

A 1x1 convolution over small planes multiplies its pixels as rows
(``ops/conv/pointwise_rows.py``): each call writes its input (N, C, P) as (N, P, C), and
numba's loop of one value at a time, each stored a row apart, was a quarter of a band's
time: 5 images of 576 channels at 6 x 8, one thread, 344 us a call where its product alone
took 237 (perf: 24% of the samples in that loop). In blocks, 40.6 -> 16.3 us for that
transpose alone (floats; 54 -> 33 for doubles).

The transpose is the classic one in log2(lanes) steps: at step b (1, 2, 4, ...) each pair of
rows i, i + b (i's bit b clear) swaps its off-diagonal b x b blocks, lanes by two-vector
shuffles. A block at an edge (fewer rows or columns) is loaded and stored under masks: it
reads and writes nothing outside its rows and columns. Values are moved, never computed:
NaN payloads and signed zeros come through as they were.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

VECTOR_BYTES = 64
_jit = njit(nogil=True, cache=True, boundscheck=False)


@intrinsic
def _block(typingctx, source, s_offset, s_stride, target, t_offset, t_stride, rows, columns):
    """``target[t_offset + j * t_stride + i] = source[s_offset + i * s_stride + j]`` for
    i < ``rows``, j < ``columns`` (each at most lanes), flat arrays of one dtype."""
    sig = types.void(source, types.intp, types.intp, target, types.intp, types.intp,
                     types.intp, types.intp)

    def codegen(context, builder, signature, args):
        source_arg, s_offset, s_stride, target_arg, t_offset, t_stride, rows, columns = args
        scalar = context.get_value_type(signature.args[0].dtype)
        itemsize = 4 if isinstance(scalar, ir.FloatType) else 8
        lanes = VECTOR_BYTES // itemsize
        vector = ir.VectorType(scalar, lanes)
        index, i32 = ir.IntType(64), ir.IntType(32)
        mask_type = ir.VectorType(ir.IntType(1), lanes)
        kind = f"v{lanes}{'f32' if lanes == 16 else 'f64'}"
        masked_load = _intrinsic_fn(builder, f"llvm.masked.load.{kind}.p0", vector,
                                    [vector.as_pointer(), i32, mask_type, vector])
        masked_store = _intrinsic_fn(builder, f"llvm.masked.store.{kind}.p0", ir.VoidType(),
                                     [vector, vector.as_pointer(), i32, mask_type])
        S = context.make_array(signature.args[0])(context, builder, source_arg).data
        T = context.make_array(signature.args[3])(context, builder, target_arg).data
        alignment = ir.Constant(i32, itemsize)
        zeros = ir.Constant(vector, [0.0] * lanes)

        def lanes_below(count):
            """The mask of the lanes below ``count``."""
            spread = builder.insert_element(ir.Constant(ir.VectorType(index, lanes),
                                                        ir.Undefined), count,
                                            ir.Constant(i32, 0))
            spread = builder.shuffle_vector(spread, spread,
                                            ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))
            return builder.icmp_signed("<", ir.Constant(ir.VectorType(index, lanes),
                                                        list(range(lanes))), spread)

        def address(base, offset, stride, line):
            at = builder.add(offset, builder.mul(stride, ir.Constant(index, line)))
            return builder.bitcast(builder.gep(base, [at]), vector.as_pointer())

        in_columns, in_rows = lanes_below(columns), lanes_below(rows)
        loaded = []
        for i in range(lanes):  # a row past ``rows`` loads nothing (an all-false mask)
            present = builder.icmp_signed(">", rows, ir.Constant(index, i))
            mask = builder.select(present, in_columns, ir.Constant(mask_type, [0] * lanes))
            loaded.append(builder.call(masked_load, [address(S, s_offset, s_stride, i),
                                                     alignment, mask, zeros]))
        step = 1
        while step < lanes:
            loaded = _swap_blocks(builder, loaded, step, lanes)
            step *= 2
        for j in range(lanes):  # a column past ``columns`` stores nothing
            present = builder.icmp_signed(">", columns, ir.Constant(index, j))
            mask = builder.select(present, in_rows, ir.Constant(mask_type, [0] * lanes))
            builder.call(masked_store, [loaded[j], address(T, t_offset, t_stride, j),
                                        alignment, mask])
        return context.get_dummy_value()

    return sig, codegen


def _intrinsic_fn(builder, name, returns, arguments):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(returns, arguments),
                                          name)


def _swap_blocks(builder, rows, step, lanes):
    """One step of the transpose: rows i and i + ``step`` (i's bit ``step`` clear) swap
    their off-diagonal ``step`` x ``step`` blocks."""
    def select(indices):
        return ir.Constant(ir.VectorType(ir.IntType(32), lanes), indices)

    low = select([j if not j & step else lanes + j - step for j in range(lanes)])
    high = select([j + step if not j & step else lanes + j for j in range(lanes)])
    swapped = list(rows)
    for i in range(lanes):
        if i & step:
            continue
        swapped[i] = builder.shuffle_vector(rows[i], rows[i + step], low)
        swapped[i + step] = builder.shuffle_vector(rows[i], rows[i + step], high)
    return swapped


@_jit
def transpose(source, s_offset, s_stride, target, t_offset, t_stride, rows, columns):
    """``target[t_offset + j * t_stride + i] = source[s_offset + i * s_stride + j]`` for
    i < ``rows``, j < ``columns``, in blocks of lanes x lanes: flat arrays of one dtype."""
    lanes = VECTOR_BYTES // source.itemsize
    for i0 in range(0, rows, lanes):
        height = min(lanes, rows - i0)
        for j0 in range(0, columns, lanes):
            _block(source, s_offset + i0 * s_stride + j0, s_stride, target,
                   t_offset + j0 * t_stride + i0, t_stride, height, min(lanes, columns - j0))
