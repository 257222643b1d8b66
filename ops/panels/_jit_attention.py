"""Fused attention heads (``ops/attention/fused_attention.py``) on the packed-panel tile, with the
softmax as vector IR, and their split over the native worker pool; the same softmax serves
``ops/nn/nn_cpu.py``'s Softmax rows (:func:`softmax_rows`). Compiled so that a head's scores
stay in L1 between the two products and no transposed copy of Q, K or V is made.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from mixrt.ops.panels._jit_native_pool import (
    ATT_BATCH, ATT_BOUNDS, ATT_HAS_MASK, ATT_HEADS, ATT_K, ATT_KEY_COUNT, ATT_KEYS, ATT_MASK,
    ATT_MASK_STRIDES, ATT_OUT, ATT_Q, ATT_QUERIES, ATT_SCALE, ATT_SCORES, ATT_SIZE, ATT_SPILL,
    ATT_V, ATT_VALUE_SIZE, ATT_VALUES, ATTENTION_JOB, BLOCK_WORDS, ITEMSIZE, JOB,
    JOB_SIGNATURE, PARTS, begin, claim, finish, get1, get2, get3, publish, put, register_job)
from mixrt.ops.panels._jit_tile import STRIP_ROWS, VECTOR_BYTES, _tile

_jit = njit(nogil=True, cache=True, boundscheck=False)


# -- attention ---------------------------------------------------------------------------------
#
# ``ops/attention/fused_attention.py``'s heads. Q, K, V and the output stay in the (batch, seq,
# heads, size) layout the dense layers use: a head is a column band of each row, read and written
# with the row stride, so the transposes the unfused graph copies through never happen. Per (batch,
# head) pair, K's head is packed transposed into panels (size x 32 keys) and V's into panels of its
# columns (keys x 32); then each strip of up to eight queries gets its scores from the tile into an
# (8, keys) scratch that stays in L1, turns them into probabilities in place (scaled, masked,
# softmax), and multiplies them by V's panels straight into the output.
#
# The softmax is vector IR (:func:`_softmax_row`): numba's exp is a scalar libm call, and its
# loops keep a running max scalar. exp(x) = 2^n e^r with n = rint(x / ln 2) and r = x - n ln 2
# in [-ln2/2, ln2/2], ln 2 split in two so that n * ln2_hi is exact (Cody and Waite); e^r is
# its Taylor polynomial, of degree 7 for float32 (truncation 5e-9, under half an ulp) and 13
# for float64 (4e-18); 2^n is written into the exponent bits. Below the log of the smallest
# normal the result is 0 (a masked -inf score weighs exactly nothing); above ``high`` x is
# clamped (a softmax argument is at most 0); NaN stays NaN.

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


@_jit
def softmax_rows(x, rows, n):
    """Softmax of each of ``rows`` rows of ``n`` in flat ``x``, in place (the vector IR of
    :func:`_softmax_row`)."""
    for r in range(rows):
        _softmax_row(x, r * n, n)


@_jit
def _pack_columns(m, panels, width):
    """The columns of ``m`` (rows, columns; any strides) in ``panels`` (P, rows, width):
    [p, r, c] = m[r, p * width + c], zero past the last column. Attention packs K's head
    transposed (size x keys) and V's head (keys x size) this way."""
    rows, columns = m.shape
    for p in range(panels.shape[0]):
        for r in range(rows):
            for c in range(width):
                at = p * width + c
                panels[p, r, c] = m[r, at] if at < columns else 0


@_jit
def _scale_and_mask(flat, start, keys, scale, mask, at, step, has_mask):
    """A row of scores times ``scale``, plus the mask's row (``mask[at + j * step]``): the
    unfused Mul, then Add."""
    if has_mask:
        for j in range(keys):
            flat[np.uint64(start + j)] = flat[np.uint64(start + j)] * scale + mask[at + j * step]
    elif scale != 1:
        for j in range(keys):
            flat[np.uint64(start + j)] *= scale


@_jit
def attention(q, k, v, mask, mask_strides, has_mask, out, scale, pair0, pair1, row0, row1,
              key_panels, value_panels, scores, spill):
    """``out[b, i, h] = softmax(scale * q[b, i, h] . k[b, :, h] + mask[b, h, i]) @ v[b, :, h]``
    for the (batch, head) pairs pair0..pair1 (pair = b * heads + h) and query rows
    row0..row1. ``q``, ``k``, ``v`` and ``out`` are C-contiguous (batch, seq, heads, size);
    the mask (batch, heads, queries, keys) is read at ``mask[b * strides[0] + h * strides[1]
    + i * strides[2] + j * strides[3]]`` (a broadcast mask has zero strides). Scratch:
    ``key_panels`` (ceil(keys / width), size, width), ``value_panels`` (ceil(v size /
    width), keys, width), ``scores`` (STRIP_ROWS, ceil(keys / width) * width), ``spill``
    (STRIP_ROWS, width)."""
    heads, size = q.shape[2], q.shape[3]
    keys, value_size = k.shape[1], v.shape[3]
    width = spill.shape[1]
    lda, ldo, lds = heads * size, heads * value_size, scores.shape[1]
    flat_scores, flat_out = scores.reshape(-1), out.reshape(-1)
    for pair in range(pair0, pair1):
        b, h = pair // heads, pair % heads
        _pack_columns(k[b, :, h, :].T, key_panels, width)
        _pack_columns(v[b, :, h, :], value_panels, width)
        for s in range(row0, row1, STRIP_ROWS):
            count = min(STRIP_ROWS, row1 - s)
            q_at = (b * q.shape[1] + s) * lda + h * size
            for p in range(key_panels.shape[0]):
                _tile(count, q, q_at, lda, key_panels, p * size * width, width, scores,
                      p * width, lds, size)
            for r in range(count):
                at = b * mask_strides[0] + h * mask_strides[1] + (s + r) * mask_strides[2]
                _scale_and_mask(flat_scores, r * lds, keys, scale, mask, at, mask_strides[3],
                                has_mask)
                _softmax_row(flat_scores, r * lds, keys)
            out_at = (b * out.shape[1] + s) * ldo + h * value_size
            for p in range(value_panels.shape[0]):
                column = p * width
                panel_at = p * keys * width
                if column + width <= value_size:
                    _tile(count, scores, 0, lds, value_panels, panel_at, width, out,
                          out_at + column, ldo, keys)
                    continue
                _tile(count, scores, 0, lds, value_panels, panel_at, width, spill, 0, width,
                      keys)
                for r in range(count):
                    for c in range(value_size - column):
                        flat_out[out_at + r * ldo + column + c] = spill[r, c]


# -- split between threads in native code (see ops/panels/_jit_native_pool.py, JOB) --------------

@_jit
def native_attention(block, parts, bounds, q, k, v, mask, mask_strides, has_mask, out, scale,
                     scratch, worker_scratch):
    """:func:`attention` over the parts ``bounds[p]`` = (pair0, pair1, row0, row1), taken by
    this thread and the pool's worker. ``scratch``: (key_panels, value_panels, scores,
    spill), one set per thread."""
    keys_, values_, scores_, spill_ = scratch
    sequence = begin(block) if parts > 1 else -1
    if sequence < 0:
        for part in range(parts):
            attention(q, k, v, mask, mask_strides, has_mask, out, scale, bounds[part, 0],
                      bounds[part, 1], bounds[part, 2], bounds[part, 3], keys_, values_,
                      scores_, spill_)
        return
    block[JOB] = ATTENTION_JOB
    put(block, ATT_Q, q.reshape(-1))
    put(block, ATT_K, k.reshape(-1))
    put(block, ATT_V, v.reshape(-1))
    put(block, ATT_OUT, out.reshape(-1))
    put(block, ATT_MASK, mask)
    put(block, ATT_MASK_STRIDES, mask_strides)
    put(block, ATT_BOUNDS, bounds)
    put(block, ATT_KEYS, worker_scratch[0])
    put(block, ATT_VALUES, worker_scratch[1])
    put(block, ATT_SCORES, worker_scratch[2])
    put(block, ATT_SPILL, worker_scratch[3])
    block[ATT_BATCH], block[ATT_QUERIES], block[ATT_HEADS], block[ATT_SIZE] = q.shape
    block[ATT_KEY_COUNT], block[ATT_VALUE_SIZE] = k.shape[1], v.shape[3]
    block[ATT_HAS_MASK] = has_mask
    held_scale = np.empty(1, q.dtype)  # in the dtype, so both threads scale alike
    held_scale[0] = scale
    put(block, ATT_SCALE, held_scale)
    block[ITEMSIZE], block[PARTS] = q.itemsize, parts
    publish(block, sequence)
    part = claim(block, parts)
    while part >= 0:
        attention(q, k, v, mask, mask_strides, has_mask, out, scale, bounds[part, 0],
                  bounds[part, 1], bounds[part, 2], bounds[part, 3], keys_, values_, scores_,
                  spill_)
        part = claim(block, parts)
    finish(block)


@_jit
def _worker_attention(block, zero):
    batch, queries, heads = block[ATT_BATCH], block[ATT_QUERIES], block[ATT_HEADS]
    size, keys, value_size = block[ATT_SIZE], block[ATT_KEY_COUNT], block[ATT_VALUE_SIZE]
    q = get1(block, ATT_Q, zero).reshape((batch, queries, heads, size))
    k = get1(block, ATT_K, zero).reshape((batch, keys, heads, size))
    v = get1(block, ATT_V, zero).reshape((batch, keys, heads, value_size))
    out = get1(block, ATT_OUT, zero).reshape((batch, queries, heads, value_size))
    mask, mask_strides = get1(block, ATT_MASK, zero), get1(block, ATT_MASK_STRIDES, np.int64(0))
    bounds = get2(block, ATT_BOUNDS, np.int64(0))
    keys_, values_ = get3(block, ATT_KEYS, zero), get3(block, ATT_VALUES, zero)
    scores_, spill_ = get2(block, ATT_SCORES, zero), get2(block, ATT_SPILL, zero)
    scale = get1(block, ATT_SCALE, zero)[0]
    has_mask = block[ATT_HAS_MASK] != 0
    parts = block[PARTS]
    part = claim(block, parts)
    while part >= 0:
        attention(q, k, v, mask, mask_strides, has_mask, out, scale, bounds[part, 0],
                  bounds[part, 1], bounds[part, 2], bounds[part, 3], keys_, values_, scores_,
                  spill_)
        part = claim(block, parts)


# the worker's side, in each dtype, through the pool's job table (_jit_native_pool.register_job)
@cfunc(JOB_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def _attention_job_f(raw, unused):
    _worker_attention(carray(raw, (BLOCK_WORDS,)), np.float32(0))


@cfunc(JOB_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def _attention_job_d(raw, unused):
    _worker_attention(carray(raw, (BLOCK_WORDS,)), np.float64(0))


register_job(ATTENTION_JOB, _attention_job_f, _attention_job_d)
