"""Softmax over rows as vector IR: the max, exp(x - max) stored and summed, then each times
1 / sum, in the CPU's own vector width. ``ops/nn/row_kernels.py``'s Softmax rows and the fused
attention heads (``ops/panels/_jit_attention.py``) both use it.

numba's exp is a scalar libm call, and NumPy's float32 exp ran 2.3 ns an element on an AMD
EPYC Zen 3 (a (2, 4, 128, 128) Softmax took 558 us against onnxruntime's 67, 2026-11-25).
exp(x) = 2^n e^r with n = rint(x / ln 2) and r = x - n ln 2 in [-ln2/2, ln2/2], ln 2 split in
two so that n * ln2_hi is exact (Cody and Waite); e^r is its Taylor polynomial, of degree 7
for float32 (truncation 5e-9, under half an ulp) and 13 for float64 (4e-18); 2^n is written
into the exponent bits. Below the log of the smallest normal the result is 0 (a masked -inf
score weighs exactly nothing); above ``high`` x is clamped (a softmax argument is at most 0);
NaN stays NaN.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from mixrt.ops.compiled import jit_cpu

_jit = njit(nogil=True, cache=True, boundscheck=False)


VECTOR_BYTES = jit_cpu.vector_bytes()  # the CPU's widest float vector

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


@intrinsic
def _softmax_block(typingctx, flat, first, count, n):
    """Rows ``first`` to ``first + count`` (count <= the vector's lanes) of ``n`` columns
    (n <= lanes) in flat ``flat`` replaced by their softmax, a row in each lane: column j of
    the rows gathered into one vector (the columns up to ``n`` only), the max, exp(x - max)
    and 1 / sum computed down the columns. :func:`_softmax_row` spends a row's time on its one masked vector and two
    reductions across its lanes (a 10-class softmax: ~46 ns a row on a Zen 4 core). The
    arithmetic is a row's there, lane by lane: the same exp, and the sum of the columns in
    the tree its reduction across lanes adds them in (the columns past ``n`` zeros there as
    here), so each row has the same bits either way."""
    sig = types.void(flat, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        scalar = context.get_value_type(signature.args[0].dtype)
        itemsize = 4 if isinstance(scalar, ir.FloatType) else 8
        lanes = VECTOR_BYTES // itemsize
        vector, index, i32 = ir.VectorType(scalar, lanes), ir.IntType(64), ir.IntType(32)
        pointers = ir.VectorType(scalar.as_pointer(), lanes)
        mask_type = ir.VectorType(ir.IntType(1), lanes)
        kind = f"v{lanes}{'f32' if itemsize == 4 else 'f64'}.v{lanes}p0"
        gather = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            vector, [pointers, i32, mask_type, vector]), f"llvm.masked.gather.{kind}")
        scatter = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.VoidType(), [vector, pointers, i32, mask_type]), f"llvm.masked.scatter.{kind}")
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        first, count, n = args[1], args[2], args[3]
        lane_ids = ir.Constant(ir.VectorType(index, lanes), list(range(lanes)))
        rows_ok = builder.icmp_signed("<", lane_ids, _spread_value(builder, count, lanes))
        # each lane's row start, in elements past the data (rows past count read nothing)
        starts = builder.mul(builder.add(lane_ids, _spread_value(builder, first, lanes)),
                             _spread_value(builder, n, lanes))
        base = _spread_value(builder, builder.ptrtoint(data, index), lanes)
        width = ir.Constant(ir.VectorType(index, lanes), [itemsize] * lanes)

        def spread(number):
            return ir.Constant(vector, [number] * lanes)

        # column j is read, raised and written only where j < n (a branch each), and reads
        # as zeros in the sum past n, as the row form's masked lanes do
        columns = [cgutils.alloca_once_value(builder, spread(float("-inf")))
                   for _ in range(lanes)]
        exps = [cgutils.alloca_once_value(builder, spread(0.0)) for _ in range(lanes)]
        largest = cgutils.alloca_once_value(builder, spread(float("-inf")))
        masks, addresses = [], []
        for j in range(lanes):
            column_ok = builder.icmp_signed("<", ir.Constant(index, j), n)
            mask = builder.and_(rows_ok, _spread_value(builder, column_ok, lanes))
            offsets = builder.add(starts, ir.Constant(ir.VectorType(index, lanes), [j] * lanes))
            address = builder.inttoptr(builder.add(base, builder.mul(offsets, width)), pointers)
            masks.append((column_ok, mask))
            addresses.append(address)
            with builder.if_then(column_ok, likely=True):
                value = builder.call(gather, [address, ir.Constant(i32, itemsize), mask,
                                              spread(float("-inf"))])
                builder.store(value, columns[j])
                held = builder.load(largest)
                builder.store(builder.select(builder.fcmp_ordered(">", value, held), value,
                                             held), largest)
        shift = builder.load(largest)
        for j in range(lanes):
            column_ok, mask = masks[j]
            with builder.if_then(column_ok, likely=True):
                e = _exp_codegen(builder, builder.fsub(builder.load(columns[j]), shift),
                                 itemsize)
                builder.store(builder.select(mask, e, spread(0.0)), exps[j])
        parts = [builder.load(e) for e in exps]
        while len(parts) > 1:  # the row form's tree across its lanes
            parts = [builder.fadd(a, b) for a, b in zip(parts[::2], parts[1::2])]
        inverse = builder.fdiv(spread(1.0), parts[0])
        for j in range(lanes):
            column_ok, mask = masks[j]
            with builder.if_then(column_ok, likely=True):
                builder.call(scatter, [builder.fmul(builder.load(exps[j]), inverse),
                                       addresses[j], ir.Constant(i32, itemsize), mask])
        return context.get_dummy_value()

    return sig, codegen


@_jit
def softmax_rows(x, rows, n):
    """Softmax of each of ``rows`` rows of ``n`` in flat ``x``, in place (the vector IR of
    :func:`_softmax_row`; rows no longer than a vector a block of rows at a time,
    :func:`_softmax_block`, with the same bits)."""
    lanes = VECTOR_BYTES // x.itemsize
    if n > lanes or n < 1:
        for r in range(rows):
            _softmax_row(x, r * n, n)
        return
    for first in range(0, rows, lanes):
        _softmax_block(x, first, min(lanes, rows - first), n)
