"""QuantizeLinear, DequantizeLinear and QLinearConv on the CPU: per-tensor float32 <-> 8-bit
through the compiled loops of ``ops/quant/_jit_quantize.py``, QLinearConv through the float
convolution's fast path (below), every other form through ``ops/quant/quantize.py``. The integer
products (MatMulInteger, MatMulIntegerToFloat, DynamicQuantizeMatMul) multiply the 8-bit codes
as they are where ``ops/quant/int8_cpu.py`` takes them (VNNI), else in float32 where no sum can
round (``quantize.exact_integer_product``), the end of this module.

Per tensor (one scale, one zero point), float32 values, int8/uint8 codes, no blocks: what
onnxruntime's static quantizer writes around every QDQ operator, where the NumPy forms cost
2-3 ns an element against the compiled loop's fraction of one.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.compiled.bound_calls import binds, padded
from mixrt.ops.compiled.out_arrays import into, native
from mixrt.ops.nn import matmul_cpu
from mixrt.ops.quant import int8_cpu
from mixrt.ops.quant.contrib_quant import (as_f32, contrib_dequantize_linear,
                                           contrib_quantize_linear)
from mixrt.ops.quant.contrib_quant_matmul import (PRODUCT_TO_FLOAT, _centered as centered_codes,
                                                  code_bound, constant_nbits_weight,
                                                  dynamic_quantize_matmul,
                                                  matmul_integer_to_float, matmul_nbits,
                                                  nbits_weight, output_stage,
                                                  product_operands)
from mixrt.ops.conv.conv_cpu import EXACT_SUMS, conv_cpu as _float_conv
from mixrt.ops.quant.quantize import (_centered, _constant_dict, centered_weight,
                                      conv_multiplier, dequantize_linear, dequantize_linear_10,
                                      dequantize_linear_13, dequantize_linear_21,
                                      dequantize_linear_23, dynamic_quantize_linear,
                                      exact_integer_product, integer_range, matmul_integer,
                                      qlinear_conv, quantize_linear, quantize_linear_10,
                                      quantize_linear_13, quantize_linear_19, quantize_linear_21,
                                      quantize_linear_23)

EIGHT_BITS = (np.dtype(np.int8), np.dtype(np.uint8))
FLOAT32 = np.dtype(np.float32)


def quantize_cpu(xp, x, y_scale, y_zero_point=None, *, out=None, **attributes):
    codes = _code_dtype(y_zero_point, attributes)
    kernels = None if x.dtype != FLOAT32 else \
        _kernels(xp, x, y_scale, y_zero_point, attributes, codes)
    if kernels is None:
        return _into(out, quantize_linear(xp, x, y_scale, y_zero_point, **attributes))
    y = _target(out, x.shape, codes)
    low, high = integer_range(codes)
    kernels.quantize(np.ascontiguousarray(x).reshape(-1), FLOAT32.type(y_scale.reshape(-1)[0]),
                     _zero(y_zero_point), float(low), float(high), y.reshape(-1))
    return _into(out, y)


def dequantize_cpu(xp, x, x_scale, x_zero_point=None, *, out=None, **attributes):
    kernels = None
    if x.dtype in EIGHT_BITS and x_scale.dtype == FLOAT32 \
            and attributes.get("output_dtype", 0) in (0, 1):
        kernels = _kernels(xp, x, x_scale, x_zero_point, attributes, x.dtype)
    if kernels is None:
        return _into(out, dequantize_linear(xp, x, x_scale, x_zero_point, **attributes))
    y = _target(out, x.shape, FLOAT32)
    kernels.dequantize(np.ascontiguousarray(x).reshape(-1),
                       FLOAT32.type(x_scale.reshape(-1)[0]), _zero(x_zero_point), y.reshape(-1))
    return _into(out, y)


def _code_dtype(zero_point, attributes) -> np.dtype | None:
    if zero_point is not None:
        return zero_point.dtype
    return None if attributes.get("output_dtype", 0) else np.dtype(np.uint8)


def _kernels(xp, values, scale, zero_point, attributes, codes):
    """ops/quant/_jit_quantize.py when this call is the per-tensor 8-bit case it covers."""
    if xp is not np or codes not in EIGHT_BITS or attributes.get("block_size", 0) \
            or attributes.get("precision", 0) not in (0, 1) or not jit_cpu.enabled():
        return None
    if not isinstance(values, np.ndarray) or scale.size != 1 or scale.dtype != FLOAT32 \
            or (values.dtype != FLOAT32 and values.dtype not in EIGHT_BITS):
        return None
    if zero_point is not None and (zero_point.size != 1 or zero_point.dtype != codes):
        return None
    return jit_cpu.load("mixrt.ops.quant._jit_quantize")


def _zero(zero_point) -> int:
    return 0 if zero_point is None else int(zero_point.reshape(-1)[0])


def _target(out, shape, dtype):
    """``out`` when the loop can write it directly, else a new array."""
    if out is not None and out.shape == tuple(shape) and out.dtype == dtype \
            and out.flags.c_contiguous:
        return out
    return np.empty(shape, dtype)


def _into(out, result):
    if out is None or out is result:
        return result
    np.copyto(out, result)
    return out


for _handle in (quantize_linear_10, quantize_linear_13, quantize_linear_19, quantize_linear_21,
                quantize_linear_23):
    _handle.fast("cpu")(quantize_cpu)
for _handle in (dequantize_linear_10, dequantize_linear_13, dequantize_linear_21,
                dequantize_linear_23, contrib_dequantize_linear):
    _handle.fast("cpu")(dequantize_cpu)


@contrib_quantize_linear.fast("cpu")
def contrib_quantize_cpu(xp, x, y_scale, y_zero_point=None, *, axis=1, out=None):
    """com.microsoft QuantizeLinear: the standard one with the division in float32."""
    return quantize_cpu(xp, x, y_scale, y_zero_point, axis=axis, precision=1, out=out)


# -- DynamicQuantizeLinear ---------------------------------------------------------------------

def dynamic_quantize_cpu(xp, x):
    """DynamicQuantizeLinear as one compiled call (the range, then the codes:
    ``_jit_quantize.dynamic_quantize``) with the NumPy form's float32 arithmetic; a NaN or
    infinite value takes the NumPy form. Dynamically quantized BERT spent ~70 us a call in
    the NumPy form's five passes, ~11 in three calls with the scalar steps in Python, 5.6 now
    (16 x 768 values)."""
    if xp is not np or x.dtype != FLOAT32 or not x.size or not jit_cpu.enabled():
        return dynamic_quantize_linear(xp, x)
    kernels = jit_cpu.load("mixrt.ops.quant._jit_quantize")
    codes = np.empty(x.shape, np.uint8)
    done, scale, zero = kernels.dynamic_quantize(np.ascontiguousarray(x).reshape(-1),
                                                 codes.reshape(-1))
    if not done:
        return dynamic_quantize_linear(xp, x)
    return codes, np.asarray(scale, dtype=np.float32), np.asarray(zero, dtype=np.uint8)


dynamic_quantize_linear.fast("cpu")(dynamic_quantize_cpu)


@binds(dynamic_quantize_cpu, feeds=True, several=True)  # it reads its input as given
def _bind_dynamic_quantize(args, out, attributes):
    """The compiled call into the step's three views (``out``: the codes', the scale's and the
    zero point's), the NumPy form where a value is NaN or infinite, as the kernel does:
    unbound, each of a quantized BERT's 17 calls made its outputs and had them copied into
    the arena (~12 us a call)."""
    (x,) = args
    if not isinstance(out, tuple) or len(out) != 3 or x.dtype != FLOAT32 or not x.size \
            or not jit_cpu.enabled():
        return None
    codes, scale, zero = out
    if codes.dtype != np.uint8 or codes.shape != x.shape or not codes.flags.c_contiguous \
            or scale.dtype != FLOAT32 or zero.dtype != np.uint8 or scale.size != 1 \
            or zero.size != 1:
        return None
    quantize = jit_cpu.load("mixrt.ops.quant._jit_quantize").dynamic_quantize
    flat = codes.reshape(-1)

    def call(x):
        done, value, point = quantize(np.ascontiguousarray(x).reshape(-1), flat)
        if not done:
            made, value, point = dynamic_quantize_linear(np, x)
            np.copyto(codes, made)
        scale[...] = value
        zero[...] = point
        return out
    return call


# -- QLinearConv -------------------------------------------------------------------------------
#
# The generic kernel centres the weights again on every call and convolves in float64 through
# NumPy's im2col (a batched matmul of 1x9 rows for a depthwise layer): a QOperator MobileNetV3
# spent 74 of its ~70-ms run there. Here the centred weights are made once per node and the
# convolution is the CPU fast path's (ops/conv/conv_cpu.py), in float32 where no sum can
# round, else in float64; either way every sum of 8-bit products is the exact integer in any
# order, and the requantization is the generic kernel's float32 one, so the result is the
# generic kernel's exactly.
#
# float32 holds every integer up to 2^24: where the largest code less its zero point, times
# the largest sum of one output channel's centred weights, stays within it (and the bias
# too), every product and partial sum is exact (no Winograd, whose transforms round:
# conv_cpu.EXACT_SUMS). Then the codes are centred in one compiled pass and the sums
# requantized in another (_jit_quantize.requantize_channels), where the float64 route took
# nine NumPy passes: the QOperator MobileNetV3-large's 1x1 16 -> 64 layer over 2 x 320 x 456
# took 18.3 ms of its ~150-ms run, its stride-2 depthwise layer after it 17.2 (2026-12-04).
FLOAT32_EXACT = 1 << 24


def qlinear_conv_cpu(xp, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                     y_zero_point, B=None, *, out=None, _node=None, **attributes):
    state = _conv_state(xp, _node, w, w_zero_point, x_scale, x_zero_point, y_scale)
    if state is None:
        return _into(out, qlinear_conv(xp, x, x_scale, x_zero_point, w, w_scale, w_zero_point,
                                       y_scale, y_zero_point, B, **attributes))
    multiplier = conv_multiplier(x_scale, w_scale, y_scale, x.ndim)
    if _float32_suits(state, x, x_zero_point, y_zero_point, B, multiplier):
        return _float32_conv(state, x, x_zero_point, y_zero_point, B, multiplier, out,
                             attributes)
    centered = x.astype(np.float64)
    centered -= _zero(x_zero_point)
    accumulated = _float_conv(np, centered, state["weights"], None, **attributes,
                              _prepacked=state["packed"], _node=state["node"])
    channels = (1, -1) + (1,) * (accumulated.ndim - 2)
    if B is not None:
        accumulated += B.astype(np.float64).reshape(channels)
    # the generic kernel's float32 requantization (quantize.requantize_sum), in place
    values = accumulated.astype(np.float32)
    values *= multiplier
    np.rint(values, out=values)
    values += np.float32(_zero(y_zero_point))
    low, high = integer_range(y_zero_point.dtype)
    np.clip(values, low, high, out=values)
    return _into(out, values.astype(y_zero_point.dtype))


def _float32_suits(state, x, x_zero_point, y_zero_point, B, multiplier) -> bool:
    """Whether this call's sums are exact in float32 (the module's note) and its codes
    within the compiled passes' reach."""
    if x.dtype not in EIGHT_BITS or y_zero_point.dtype not in EIGHT_BITS or x.ndim < 3 \
            or not jit_cpu.enabled() or not np.all(np.isfinite(multiplier)):
        return False
    low, high = integer_range(x.dtype)
    zero = _zero(x_zero_point)
    largest_code = max(abs(low - zero), abs(high - zero))
    if largest_code * state["weight_sums"] > FLOAT32_EXACT:
        return False
    return B is None or _bias_exact(state, B)


def _bias_exact(state, B) -> bool:
    """Whether every bias value is an exact float32 integer (within 2^24); asked once for
    a constant bias (the same array on every call), not on every run."""
    if state.get("bias") is not B:
        state["bias"] = B
        state["bias_exact"] = float(np.abs(B).max(initial=0)) <= FLOAT32_EXACT
    return state["bias_exact"]


def _float32_conv(state, x, x_zero_point, y_zero_point, B, multiplier, out, attributes):
    kernels = jit_cpu.load("mixrt.ops.quant._jit_quantize")
    centered = np.empty(x.shape, np.float32)
    kernels.dequantize(np.ascontiguousarray(x).reshape(-1), np.float32(1), _zero(x_zero_point),
                       centered.reshape(-1))
    packed = state.setdefault("packed32", {EXACT_SUMS: True})
    total = _float_conv(np, centered, state["weights32"], None, **attributes,
                        _prepacked=packed, _node=state.setdefault("node32", {}))
    n, m = total.shape[:2]
    bias = np.zeros(m, np.float32) if B is None else B.astype(np.float32).reshape(m)
    # a copy either way: one argument type for the kernel (a broadcast view is read-only)
    scales = np.array(np.broadcast_to(multiplier.reshape(-1), (m,)), np.float32)
    y = _target(out, total.shape, y_zero_point.dtype)
    low, high = integer_range(y_zero_point.dtype)
    kernels.requantize_channels(np.ascontiguousarray(total).reshape(n, m, -1), bias, scales,
                                _zero(y_zero_point), float(low), float(high),
                                y.reshape(n, m, -1))
    return _into(out, y)


def _conv_state(xp, node, w, w_zero_point, x_scale, x_zero_point, y_scale):
    """The node's centred weights in float64 and float32 and the largest sum of one output
    channel's centred weights' magnitudes (made on its first call), when this call is the
    per-tensor-input case with a constant weight; else None."""
    if xp is not np or node is None or x_scale.size != 1 or y_scale.size != 1 \
            or (x_zero_point is not None and x_zero_point.size != 1):
        return None
    state = node.get("qlinear_conv")
    if state is None or state["w"] is not w:
        weights = w.astype(np.float64)
        if w_zero_point is not None:
            zero = w_zero_point.astype(np.float64)
            weights -= zero.reshape((-1,) + (1,) * (w.ndim - 1)) if zero.size > 1 else zero
        sums = np.abs(weights).reshape(weights.shape[0], -1).sum(axis=1)
        state = node["qlinear_conv"] = {
            "w": w, "weights": weights, "packed": {}, "node": {},
            "weights32": weights.astype(np.float32),
            "weight_sums": float(sums.max(initial=0.0))}
    return state


qlinear_conv.fast("cpu")(qlinear_conv_cpu)


# -- the integer products ----------------------------------------------------------------------

@matmul_integer.fast("cpu")
def matmul_integer_cpu(xp, A, B, a_zero_point=None, b_zero_point=None, *, _prepacked=None):
    """The codes multiplied as they are (VNNI) for a constant B and one a_zero_point, else
    less their zero points in float32 with B's centred copy kept for a constant B."""
    constant = _constant_dict(_prepacked, b_zero_point)
    if constant is not None and (a_zero_point is None or a_zero_point.size == 1):
        product = int8_cpu.integer_product(
            A, None if a_zero_point is None else a_zero_point.reshape(()), B, b_zero_point,
            constant)
        if product is not None:
            return product
    weight, bound = centered_weight(np, B, b_zero_point, _prepacked,
                                    {1} if b_zero_point is None else {1, 3}, _centered)
    product = exact_integer_product(np, _centered(A, a_zero_point, per_row=True,
                                                  dtype=np.float32), weight, bound, constant)
    return product.astype(np.int32)


def integer_product_to_float_cpu(xp, op_type, A, B, a_scale, b_scale, a_zero_point,
                                 b_zero_point, bias, prepacked=None, b_zero_index=None):
    """``contrib_quant_matmul.integer_product_to_float`` on the CPU: the codes multiplied as
    they are (VNNI) with the output stage in one pass, else the exact float32 product scaled
    in place."""
    a_zero, center, constant_inputs, constant, multiplier = product_operands(
        np, op_type, A, B, a_scale, b_scale, a_zero_point, b_zero_point, prepacked,
        b_zero_index)
    if a_scale.dtype == FLOAT32 and multiplier.size in (1, B.shape[-1]):
        values = int8_cpu.integer_product_to_float(
            A, a_zero, B, b_zero_point, multiplier, None if bias is None else as_f32(bias),
            constant)
        if values is not None:
            return values
    weight, bound = centered_weight(np, B, b_zero_point, prepacked, constant_inputs, center)
    total = exact_integer_product(np, centered_codes(A, a_zero, FLOAT32), weight, bound,
                                  constant, a_bound=code_bound(A.dtype, a_zero))
    if total.dtype == FLOAT32 and multiplier.dtype == FLOAT32:  # the same, in place
        values = total  # the product's own new array: scaled and shifted in place
        values *= multiplier
    else:
        values = total.astype(FLOAT32) * multiplier
    return output_stage(values, bias, a_scale)


PRODUCT_TO_FLOAT["cpu"] = integer_product_to_float_cpu


@matmul_integer_to_float.fast("cpu")
def matmul_integer_to_float_cpu(xp, A, B, a_scale, b_scale, a_zero_point=None,
                                b_zero_point=None, bias=None, *, _prepacked=None, out=None):
    return into(out, integer_product_to_float_cpu(
        np, "MatMulIntegerToFloat", A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias,
        _prepacked, 5))


@binds(matmul_integer_to_float_cpu)
def _bind_integer_to_float(args, out, attributes):
    """The VNNI route with its output stage, where the kernel takes it for these operands
    (``int8_cpu.bound_product_to_float``): the same checks, asked once."""
    A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias = padded(args, 7)
    prepacked = attributes.get("_prepacked")
    _, _, _, constant, multiplier = product_operands(
        np, "MatMulIntegerToFloat", A, B, a_scale, b_scale, a_zero_point, b_zero_point,
        prepacked, 5)
    if constant is None or a_scale.dtype != FLOAT32 or multiplier.size not in (1, B.shape[-1]) \
            or (a_zero_point is not None and a_zero_point.size != 1) or a_scale.size != 1 \
            or b_scale.size not in (1, B.shape[-1]):
        return None
    product = int8_cpu.bound_product_to_float(
        A, B, b_zero_point, as_f32(b_scale), None if bias is None else as_f32(bias), constant,
        out)
    if product is None:
        return None

    def call(A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
        return product(A, a_scale, None if a_zero_point is None else a_zero_point.reshape(()))
    return call


@dynamic_quantize_matmul.fast("cpu")
def dynamic_quantize_matmul_cpu(xp, A, B, b_scale, b_zero_point=None, bias=None, *,
                                _prepacked=None):
    codes, scale, zero = dynamic_quantize_cpu(np, A)  # the compiled call (NumPy's without)
    return integer_product_to_float_cpu(np, "DynamicQuantizeMatMul", codes, B, scale, b_scale,
                                        zero, b_zero_point, bias, _prepacked, 3)


# -- MatMulNBits -------------------------------------------------------------------------------

@matmul_nbits.fast("cpu")
def matmul_nbits_cpu(xp, A, B, scales, zero_points=None, g_idx=None, bias=None, *, K=None,
                     N=None, bits=4, block_size=None, accuracy_level=0, weight_prepacked=0,
                     out=None, _prepacked=None):
    """The dequantized weight (made once for a constant one) through the float products of a
    MatMul against a constant (``ops/nn/matmul_cpu.py``): the packed panels split with the
    native worker, the bias added in each tile, the call replayed. Through NumPy's matmul
    and OpenBLAS's own threads, a 4-bit Llama ran its products at 2.1x onnxruntime's time
    where the float32 export's took 1.3x."""
    arrays = (A, B, scales, zero_points, g_idx, bias, out)
    if out is not None and replay.replayed(_prepacked, arrays):
        return out
    weight = nbits_weight(np, B, scales, zero_points, g_idx, _prepacked, K=K, N=N, bits=bits,
                          block_size=block_size, weight_prepacked=weight_prepacked)
    if out is None or not native(A, weight, bias, out) or A.ndim < 2:
        return into(out, matmul_nbits(np, A, B, scales, zero_points, g_idx, bias, K=K, N=N,
                                      bits=bits, block_size=block_size,
                                      _prepacked=_prepacked))
    # panels kept with the node only for a weight that is its own for the session
    packed = _prepacked if constant_nbits_weight(_prepacked, zero_points) else None
    if bias is not None and matmul_cpu.biased_panel_product(A, weight, bias, out, packed,
                                                            _prepacked, arrays):
        return out
    if matmul_cpu.one_row_blas(A, weight, out):
        np.matmul(A, weight, out=out)
    else:
        matmul_cpu.dense_product(A, weight, out, packed, _prepacked, arrays)
    if bias is not None:  # after the whole product, as the generic kernel adds it
        out += bias
        replay.forget(_prepacked)  # a recorded panel call would leave the bias out
    return out
