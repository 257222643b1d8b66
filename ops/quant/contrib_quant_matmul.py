"""onnxruntime's quantized products of the ``com.microsoft`` domain: QGemm,
MatMulIntegerToFloat, DynamicQuantizeMatMul and the weight-only MatMulNBits.

The integer products are exact: 8-bit codes less their zero points, multiplied and summed in
float64 through BLAS (see ``quantize.py``). What follows copies onnxruntime's float32 output
stage, so that quantized outputs match it code for code and float outputs bit for bit in
the cases the tests compare: the exact sum converted to float32 once, times a float32
multiplier formed as onnxruntime forms it (``alpha * a_scale * b_scale [/ y_scale]``), then,
for a quantized output, rounded half to even, shifted by the zero point and saturated.

MatMulNBits dequantizes its packed 2-, 4- or 8-bit weight blocks to float32 and multiplies in
float32, as onnxruntime does with ``accuracy_level`` 0 or 1; higher levels let onnxruntime
quantize A internally, which we do not (the attribute is accepted and ignored).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.quant.contrib_quant import (COM_MICROSOFT, INT8S, as_f32, one_value, requantize,
                                     require_dtype, require_float_scales, require_per_tensor)
from mixrt.ops.device import device_kind
from mixrt.ops.nn.nn import matmul_shape
from mixrt.ops.quant.quantize import dynamic_quantize_linear, expand_param
from mixrt.ops.ir.registry import CONSTANT_INPUTS, REGISTRY, op
from mixrt.ops.ir.types import TensorType, conflicting, shape_text

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def _centered(x, zero_point, dtype=F64):
    """Codes less their zero point as floats (exact); a per-column zero point broadcasts
    along the last axis. One pass: the subtraction casts as it goes."""
    if zero_point is None:
        return x.astype(dtype)
    return np.subtract(x, zero_point.astype(dtype), dtype=dtype) if isinstance(x, np.ndarray) \
        else x.astype(dtype) - zero_point.astype(dtype)


def _per_column(xp, op_type, name, param, b_shape):
    """A scale or zero point of B: one value, or one per column of B (shaped to broadcast
    along the last axis)."""
    try:
        return expand_param(xp, param, b_shape, -1)
    except ValueError as error:
        raise ValueError(f"{op_type}: {name}: {error}") from None


def require_per_column(op_type, columns, **params) -> None:
    """Each named parameter type is one value or one per column (where shapes are known)."""
    for name, param in params.items():
        shape = None if param is None else param.shape
        if shape is None or all(isinstance(d, int) and d == 1 for d in shape):
            continue
        if len(shape) != 1 or conflicting(shape[0], columns):
            raise ValueError(f"{op_type}: {name} has shape {shape_text(shape)}; expected one "
                             f"value or ({columns},), one per column of B")


# -- QGemm -------------------------------------------------------------------------------------

@op("QGemm", since=1, domain=COM_MICROSOFT, dtypes=INT8S)
def qgemm(xp, A, a_scale, a_zero_point, B, b_scale, b_zero_point=None, C=None, y_scale=None,
          y_zero_point=None, *, alpha=1.0, transA=0, transB=0):
    """alpha * A' B' with int32 C added to the integer sum (C's scale is
    a_scale * b_scale / alpha); a float32 output without y_zero_point, else quantized."""
    name = "QGemm"
    A = A.T if transA else A
    B = B.T if transB else B
    a_zero = None if a_zero_point is None else one_value(name, "a_zero_point", a_zero_point)
    b_zero = _per_column(xp, name, "b_zero_point", b_zero_point, B.shape)
    total = xp.matmul(_centered(A, a_zero), _centered(B, b_zero))
    if C is not None:
        total = total + C.astype(F64)
    multiplier = np.float32(alpha) * as_f32(one_value(name, "a_scale", a_scale)) \
        * as_f32(_per_column(xp, name, "b_scale", b_scale, B.shape))
    if y_scale is not None:
        multiplier = multiplier / as_f32(one_value(name, "y_scale", y_scale))
    values = total.astype(F32) * multiplier
    if y_zero_point is None:
        return values
    zero = one_value(name, "y_zero_point", y_zero_point)
    return requantize(xp, values, zero, zero.dtype)


@qgemm.infer
def _(A, a_scale, a_zero_point, B, b_scale, b_zero_point=None, C=None, y_scale=None,
      y_zero_point=None, *, transA=0, transB=0, **_):
    name = "QGemm"
    require_dtype(name, A.dtype, a_zero_point=a_zero_point)
    require_dtype(name, B.dtype, b_zero_point=b_zero_point)
    require_dtype(name, np.dtype(np.int32), C=C)
    require_float_scales(name, a_scale=a_scale, b_scale=b_scale, y_scale=y_scale)
    require_per_tensor(name, a_scale=a_scale, a_zero_point=a_zero_point, y_scale=y_scale,
                       y_zero_point=y_zero_point)
    if y_zero_point is not None and y_scale is None:
        raise ValueError(f"{name}: y_zero_point is given without y_scale")
    gemm_infer = REGISTRY.find("", "Gemm", 13).infer_fn
    shape = gemm_infer(A, B, C, transA=transA, transB=transB)[0].shape
    columns = None if shape is None else shape[1]
    require_per_column(name, columns, b_scale=b_scale, b_zero_point=b_zero_point)
    dtype = F32 if y_zero_point is None else y_zero_point.dtype
    return [TensorType(dtype, shape)]


# -- MatMulIntegerToFloat, DynamicQuantizeMatMul ------------------------------------------------

def product_operands(xp, op_type, A, B, a_scale, b_scale, a_zero_point, b_zero_point,
                     _prepacked, b_zero_index):
    """What both forms of :func:`integer_product_to_float` start from: (a's zero point as
    one value, ``center(B, b_zero_point)``, the inputs that must be constants for B's kept
    copy, the node's dict when they are, the float32 multiplier a_scale * b_scale)."""
    a_zero = None if a_zero_point is None else one_value(op_type, "a_zero_point", a_zero_point)

    def center(weight, zero_point):
        return _centered(weight, _per_column(xp, op_type, "b_zero_point", zero_point,
                                             weight.shape))

    constant_inputs = {1} if b_zero_point is None else {1, b_zero_index}
    constant = _prepacked if _prepacked is not None and constant_inputs <= \
        _prepacked.get(CONSTANT_INPUTS, frozenset()) else None
    multiplier = as_f32(one_value(op_type, "a_scale", a_scale)) \
        * as_f32(_per_column(xp, op_type, "b_scale", b_scale, B.shape))
    return a_zero, center, constant_inputs, constant, multiplier


def integer_product_to_float(xp, op_type, A, B, a_scale, b_scale, a_zero_point, b_zero_point,
                              bias, _prepacked=None, b_zero_index=None):
    """(A - a_zp)(B - b_zp) exactly, converted to float32 and scaled by a_scale * b_scale
    (B's per column), plus the bias: MatMulIntegerToFloat's output, with the product in
    float64 on any device (the CPU's VNNI and float32 products: ``ops/quant/quantize_cpu.py``).
    ``b_zero_index``: the input position of b_zero_point, so that a constant one is folded
    into the kept B."""
    a_zero, center, _, _, multiplier = product_operands(
        xp, op_type, A, B, a_scale, b_scale, a_zero_point, b_zero_point, _prepacked,
        b_zero_index)
    total = xp.matmul(_centered(A, a_zero), center(B, b_zero_point))  # exact in float64
    return output_stage(total.astype(F32) * multiplier, bias, a_scale)


# integer_product_to_float's device forms beside the generic one, as a kernel's fast paths:
# ops/quant/quantize_cpu.py registers the CPU's; QAttention's projection runs the device's
PRODUCT_TO_FLOAT: dict = {}


def device_product_to_float(xp, *args, **kwargs):
    """:func:`integer_product_to_float` through the form registered for xp's device."""
    return PRODUCT_TO_FLOAT.get(device_kind(xp), integer_product_to_float)(xp, *args, **kwargs)


def output_stage(values, bias, a_scale):
    """The scaled product ``values`` (float32, the caller's own) plus the bias, in a_scale's
    dtype."""
    if bias is not None:
        values += as_f32(bias)
    return values.astype(a_scale.dtype, copy=False)


def code_bound(dtype, zero_point) -> float | None:
    """The largest |code - zero_point| an 8-bit tensor of ``dtype`` can hold."""
    if dtype not in (np.uint8, np.int8):
        return None
    info = np.iinfo(dtype)
    zero = 0 if zero_point is None else int(zero_point)
    return float(max(zero - info.min, info.max - zero))


@op("MatMulIntegerToFloat", since=1, domain=COM_MICROSOFT, dtypes=INT8S)
def matmul_integer_to_float(xp, A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None,
                            bias=None, *, _prepacked=None):
    return integer_product_to_float(xp, "MatMulIntegerToFloat", A, B, a_scale, b_scale,
                                     a_zero_point, b_zero_point, bias, _prepacked, 5)


@op("DynamicQuantizeMatMul", since=1, domain=COM_MICROSOFT, dtypes=frozenset({"float32"}))
def dynamic_quantize_matmul(xp, A, B, b_scale, b_zero_point=None, bias=None, *,
                            _prepacked=None):
    """A quantized to uint8 over its own range (DynamicQuantizeLinear), then
    MatMulIntegerToFloat. An all-zero A gets scale 0 here and 1 in onnxruntime: its
    products are 0 either way."""
    codes, scale, zero = dynamic_quantize_linear(xp, A)
    return integer_product_to_float(xp, "DynamicQuantizeMatMul", codes, B, scale, b_scale,
                                     zero, b_zero_point, bias, _prepacked, 3)


def _product_infer(op_type, A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias):
    require_dtype(op_type, A.dtype, a_zero_point=a_zero_point)
    require_dtype(op_type, B.dtype, b_zero_point=b_zero_point)
    require_per_tensor(op_type, a_scale=a_scale, a_zero_point=a_zero_point)
    shape = None if A.shape is None or B.shape is None or not A.shape or not B.shape \
        else matmul_shape(A.shape, B.shape)
    columns = None if B.shape is None or not B.shape else B.shape[-1]
    require_per_column(op_type, columns, b_scale=b_scale, b_zero_point=b_zero_point)
    if bias is not None and bias.shape is not None and \
            (len(bias.shape) != 1 or conflicting(bias.shape[0], columns)):
        raise ValueError(f"{op_type}: bias has shape {shape_text(bias.shape)}; expected "
                         f"({columns},), one per column of B")
    return shape


@matmul_integer_to_float.infer
def _(A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None, **_):
    name = "MatMulIntegerToFloat"
    require_dtype(name, a_scale.dtype, b_scale=b_scale, bias=bias)
    shape = _product_infer(name, A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias)
    return [TensorType(a_scale.dtype, shape)]


@dynamic_quantize_matmul.infer
def _(A, B, b_scale, b_zero_point=None, bias=None, **_):
    name = "DynamicQuantizeMatMul"
    require_float_scales(name, b_scale=b_scale, bias=bias)
    shape = _product_infer(name, A, B, None, b_scale, None, b_zero_point, bias)
    return [TensorType(F32, shape)]


# -- MatMulNBits -------------------------------------------------------------------------------

NBITS = (2, 4, 8)


def _unpack(xp, packed, bits):
    """Codes of ``bits`` bits packed little-end first into the bytes of ``packed`` (the
    first code in the lowest bits): one more axis's worth of values along the last."""
    per_byte = 8 // bits
    shifts = xp.arange(0, 8, bits, dtype=np.uint8)
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)


def _block_zero_points(xp, zero_points, bits, n, blocks):
    """(N, blocks) zero points as float32: packed uint8 codes, floats, or the default
    2**(bits - 1) when absent."""
    if zero_points is None:
        return xp.full((n, blocks), float(1 << (bits - 1)), dtype=F32)
    if zero_points.dtype == np.uint8:
        return _unpack(xp, zero_points.reshape(n, -1), bits)[:, :blocks].astype(F32)
    return as_f32(zero_points.reshape(n, blocks))


def dequantized_weight(xp, B, scales, zero_points, *, K, N, bits, block_size):
    """The (K, N) float32 weight MatMulNBits multiplies by: each block's codes less its
    zero point, times its scale; padding past K dropped."""
    blocks = -(-K // block_size)
    codes = _unpack(xp, B.reshape(N, blocks, -1), bits).astype(F32)
    zero = _block_zero_points(xp, zero_points, bits, N, blocks)
    weight = (codes - zero[..., None]) * as_f32(scales).reshape(N, blocks, 1)
    return weight.reshape(N, blocks * block_size)[:, :K].T


def _nbits_attributes(op_type, K, N, bits, block_size, weight_prepacked) -> None:
    for name, value in (("K", K), ("N", N), ("block_size", block_size)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{op_type}: the {name} attribute is required and must be "
                             f"positive; got {value!r}")
    if bits not in NBITS:
        raise ValueError(f"{op_type}: bits={bits} is not supported; expected one of "
                         f"{', '.join(map(str, NBITS))}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"{op_type}: block_size={block_size}; expected a power of two, "
                         f"16 or more")
    if weight_prepacked:
        raise ValueError(f"{op_type}: weight_prepacked={weight_prepacked} (a GPU kernel's "
                         f"layout) is not supported; expected 0")


@op("MatMulNBits", since=1, domain=COM_MICROSOFT,
    dtypes=frozenset({"float32", "float16", "bfloat16"}))
def matmul_nbits(xp, A, B, scales, zero_points=None, g_idx=None, bias=None, *, K=None, N=None,
                 bits=4, block_size=None, accuracy_level=0, weight_prepacked=0,
                 _prepacked=None):
    """A (..., K) times the dequantized (K, N) weight, plus bias; a constant weight is
    dequantized once per session."""
    del accuracy_level  # how onnxruntime may compute internally; the result's meaning is one
    weight = nbits_weight(xp, B, scales, zero_points, g_idx, _prepacked, K=K, N=N, bits=bits,
                          block_size=block_size, weight_prepacked=weight_prepacked)
    y = xp.matmul(as_f32(A), weight)
    if bias is not None:
        y = y + as_f32(bias)
    return y.astype(A.dtype, copy=False)


def nbits_weight(xp, B, scales, zero_points, g_idx, prepacked, *, K, N, bits, block_size,
                 weight_prepacked):
    """MatMulNBits' attributes checked and its float32 (K, N) weight, kept in ``prepacked``
    (the node's dict) when B, scales and zero_points are the session's constants."""
    name = "MatMulNBits"
    _nbits_attributes(name, K, N, bits, block_size, weight_prepacked)
    if g_idx is not None:
        raise ValueError(f"{name}: the deprecated g_idx input is not supported")
    weight = prepacked.get("weight") if constant_nbits_weight(prepacked, zero_points) else None
    if weight is None:
        weight = dequantized_weight(xp, B, scales, zero_points, K=K, N=N, bits=bits,
                                    block_size=block_size)
        if constant_nbits_weight(prepacked, zero_points):
            weight = prepacked.setdefault("weight", xp.ascontiguousarray(weight))
    return weight


def constant_nbits_weight(prepacked, zero_points) -> bool:
    """Whether MatMulNBits' weight inputs are all the session's constants."""
    weight_inputs = {1, 2} if zero_points is None else {1, 2, 3}
    return prepacked is not None and weight_inputs <= prepacked[CONSTANT_INPUTS]


@matmul_nbits.infer
def _(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K=None, N=None, bits=4,
      block_size=None, weight_prepacked=0, **_):
    name = "MatMulNBits"
    _nbits_attributes(name, K, N, bits, block_size, weight_prepacked)
    if g_idx is not None:
        raise ValueError(f"{name}: the deprecated g_idx input is not supported")
    require_dtype(name, np.dtype(np.uint8), B=B)
    require_dtype(name, A.dtype, scales=scales, bias=bias)
    blocks = -(-K // block_size)
    _require_size(name, "B", B, N * blocks * block_size * bits // 8,
                  f"(N, blocks, block_size * bits / 8) = ({N}, {blocks}, "
                  f"{block_size * bits // 8})")
    _require_size(name, "scales", scales, N * blocks, f"(N, blocks) = ({N}, {blocks})")
    if zero_points is not None and zero_points.dtype is not None:
        packed = np.dtype(zero_points.dtype) == np.uint8
        count = N * -(-blocks * bits // 8) if packed else N * blocks
        _require_size(name, "zero_points", zero_points, count,
                      f"(N, ceil(blocks * bits / 8)) = ({N}, {count // N}) packed"
                      if packed else f"(N, blocks) = ({N}, {blocks})")
    if A.shape is None:
        return [TensorType(A.dtype, None)]
    if not A.shape or conflicting(A.shape[-1], K):
        raise ValueError(f"{name}: A has shape {shape_text(A.shape)}; expected K={K} "
                         f"features on its last axis")
    return [TensorType(A.dtype, (*A.shape[:-1], N))]


def _require_size(op_type, name, value, count, expected) -> None:
    """A known, static shape holds ``count`` elements (onnxruntime also accepts the
    flattened forms of these inputs)."""
    shape = None if value is None else value.shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return
    if int(np.prod(shape, dtype=np.int64)) != count:
        raise ValueError(f"{op_type}: {name} has shape {shape_text(shape)}; expected {expected}")
