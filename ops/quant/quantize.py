"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the
integer/quantized matmuls and convolutions.

Integer products go through float BLAS (cuBLAS on a GPU), where NumPy's integer matmul does
not, and stay exact (:func:`exact_integer_product`): on the CPU, 8-bit codes less their zero
points (at most 255 in magnitude) multiply in float32, where every product and every partial
sum below 2**24 is an exact integer whatever order BLAS adds in, because every partial sum of
a row times a column is bounded by the row's sum of |a| times the largest |b|. When that bound
reaches 2**24, K is cut into chunks short enough to keep each chunk's sums below it, and the
chunks' exact sums are added in float64. A constant B is centered and converted to float32
once per session (its ``_prepacked`` dict). On a GPU the product is float64 throughout, where
every sum of fewer than 2**20 such products is exact.

The exact sum is then requantized as onnxruntime's MlasRequantizeOutput does, which decides
the codes its QLinearConv and QLinearMatMul give: the sum converted to float32 once, times the
float32 multiplier ``x_scale * w_scale / y_scale`` (formed in that order, each step rounded to
float32), rounded half to even, shifted by the zero point and saturated. The same steps in
float64 land on the other side of .5 for a few outputs per layer (requantize_sum).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from mixrt.ops.elementwise.cast import cast_array
from mixrt.ops.ir.dtypes import to_numpy_dtype
from mixrt.ops.nn.matmul_cpu import dense_product
from mixrt.ops.nn.nn import matmul_shape
from mixrt.ops.ir.registry import CONSTANT_INPUTS, REGISTRY, op
from mixrt.ops.ir.types import TensorType, fits, normalize_axis, shape_text
from mixrt.ops.conv.conv import conv

# x of QuantizeLinear; x of DequantizeLinear (every quantized type of every version)
QUANTIZE_INPUTS = frozenset({"float32", "float16", "bfloat16", "int32"})
QUANTIZED = frozenset({
    "int8", "uint8", "int16", "uint16", "int32", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "int4", "uint4", "float4_e2m1fn", "int2", "uint2",
    "float6_e2m3fn", "float6_e3m2fn"})
INT8S = frozenset({"int8", "uint8"})
QLINEAR_MATMUL_21 = INT8S | frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                                       "float8_e5m2fnuz"})
_NARROW_INTS = frozenset(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4,
                                               ml_dtypes.int2, ml_dtypes.uint2))


# -- shared pieces -----------------------------------------------------------------------------

def integer_range(dtype) -> tuple[int, int]:
    dtype = np.dtype(dtype)
    info = ml_dtypes.iinfo(dtype) if dtype in _NARROW_INTS else np.iinfo(dtype)
    return int(info.min), int(info.max)


def _is_integer(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind in "iu" or dtype in _NARROW_INTS


def _arithmetic_dtype(dtype) -> np.dtype:
    """The float type to divide or multiply in for a scale of ``dtype`` (float8e8m0 and
    integer scales are not arithmetic types; they are computed in float32)."""
    dtype = np.dtype(dtype)
    if dtype.name in ("float16", "float32", "float64", "bfloat16"):
        return dtype
    return np.dtype(np.float32)


def _as_float(x, dtype=np.float64):
    """Any numeric array as floats: integers exactly, narrow floats through float32."""
    if x.dtype != dtype and not (x.dtype.kind in "iuf" or x.dtype == np.bool_):
        x = x.astype(np.float32)
    return x.astype(dtype, copy=False)


def expand_param(xp, param, x_shape, axis, block_size=0):
    """A scale or zero point reshaped to broadcast against ``x``: a scalar (per tensor), a 1-D
    tensor along ``axis`` (per axis), or same rank as x with ``axis`` divided in blocks."""
    if param is None:
        return None
    rank = len(x_shape)
    if block_size and block_size > 0:
        if param.ndim != rank:
            raise ValueError(f"blocked quantization needs a scale of rank {rank}, got shape "
                             f"{tuple(param.shape)}")
        axis = normalize_axis(axis, rank)
        param = xp.repeat(param, block_size, axis=axis)
        return param[(slice(None),) * axis + (slice(0, x_shape[axis]),)]
    if param.ndim == 0 or param.size == 1:
        return param.reshape(())
    if param.ndim == 1:
        axis = normalize_axis(axis, rank)
        if param.shape[0] != x_shape[axis]:
            raise ValueError(f"per-axis scale of length {param.shape[0]} does not match "
                             f"axis {axis} of the input shape {tuple(x_shape)}")
        return param.reshape((1,) * axis + (-1,) + (1,) * (rank - axis - 1))
    return param  # already the input's rank


def saturate_to(xp, values, dtype, *, saturate=1):
    """Real-valued quantized results (scaled, zero point added) stored as ``dtype``:
    integers round half to even and clamp to the type's range; float types cast by the
    Cast rules (``saturate`` applies to float8)."""
    dtype = np.dtype(dtype)
    if not _is_integer(dtype):
        return cast_array(xp, values, dtype, saturate=saturate)
    low, high = integer_range(dtype)
    return xp.clip(xp.rint(values), low, high).astype(dtype)


def output_multiplier(x_scale, w_scale, y_scale):
    """x_scale * w_scale / y_scale in float32, multiplied first and each step rounded, as
    onnxruntime forms the requantization scale (``w_scale`` may be one per output channel,
    shaped by the caller)."""
    return (_as_float(x_scale, np.float32) * _as_float(w_scale, np.float32)) \
        / _as_float(y_scale, np.float32)


def requantize_sum(xp, total, multiplier, zero_point):
    """The codes of an exact integer sum (floats or int32, the bias included) as
    onnxruntime's MlasRequantizeOutput computes them: float32(total) * multiplier, rounded
    half to even, plus the zero point, saturated to the zero point's type."""
    values = total.astype(np.float32) * multiplier
    return saturate_to(xp, xp.rint(values) + _as_float(zero_point, np.float32),
                       zero_point.dtype)


def _quantized_dtype(zero_point, output_dtype) -> np.dtype:
    if zero_point is not None:
        if output_dtype and to_numpy_dtype(output_dtype) != zero_point.dtype:
            raise ValueError(f"QuantizeLinear: output_dtype {to_numpy_dtype(output_dtype).name} "
                             f"differs from the zero point's type {zero_point.dtype.name}")
        return zero_point.dtype
    return to_numpy_dtype(output_dtype) if output_dtype else np.dtype(np.uint8)


# -- QuantizeLinear ----------------------------------------------------------------------------

def quantize_linear(xp, x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                    output_dtype=0, precision=0):
    """y = saturate(round(x / y_scale) + y_zero_point), the division in ``precision``
    (default: the scale's type)."""
    out_dtype = _quantized_dtype(y_zero_point, output_dtype)
    work = to_numpy_dtype(precision) if precision else _arithmetic_dtype(y_scale.dtype)
    scale = expand_param(xp, y_scale, x.shape, axis, block_size)
    scaled = _as_float(x, work) / _as_float(scale, work)
    if _is_integer(out_dtype):
        # round in the working precision's value, then add the integer zero point exactly
        values = xp.rint(_as_float(scaled))
        if y_zero_point is not None:
            values = values + _as_float(expand_param(xp, y_zero_point, x.shape, axis,
                                                     block_size))
        return saturate_to(xp, values, out_dtype)
    if y_zero_point is not None:
        zero = expand_param(xp, y_zero_point, x.shape, axis, block_size)
        scaled = scaled + _as_float(zero, scaled.dtype)
    return saturate_to(xp, scaled, out_dtype, saturate=saturate)


@op("QuantizeLinear", since=10, dtypes=QUANTIZE_INPUTS)
def quantize_linear_10(xp, x, y_scale, y_zero_point=None):
    return quantize_linear(xp, x, y_scale, y_zero_point)


@op("QuantizeLinear", since=13, dtypes=QUANTIZE_INPUTS)
def quantize_linear_13(xp, x, y_scale, y_zero_point=None, *, axis=1):
    return quantize_linear(xp, x, y_scale, y_zero_point, axis=axis)


@op("QuantizeLinear", since=19, dtypes=QUANTIZE_INPUTS)
def quantize_linear_19(xp, x, y_scale, y_zero_point=None, *, axis=1, saturate=1):
    return quantize_linear(xp, x, y_scale, y_zero_point, axis=axis, saturate=saturate)


@op("QuantizeLinear", since=21, dtypes=QUANTIZE_INPUTS)
def quantize_linear_21(xp, x, y_scale, y_zero_point=None, *, axis=1, saturate=1,
                       block_size=0, output_dtype=0):
    return quantize_linear(xp, x, y_scale, y_zero_point, axis=axis, saturate=saturate,
                           block_size=block_size, output_dtype=output_dtype)


# 24 added float8e8m0 scales, 25 int2/uint2 and 28 float6 outputs: same kernel
@op("QuantizeLinear", since=28, dtypes=QUANTIZE_INPUTS)
@op("QuantizeLinear", since=25, dtypes=QUANTIZE_INPUTS)
@op("QuantizeLinear", since=24, dtypes=QUANTIZE_INPUTS)
@op("QuantizeLinear", since=23, dtypes=QUANTIZE_INPUTS)
def quantize_linear_23(xp, x, y_scale, y_zero_point=None, *, axis=1, saturate=1,
                       block_size=0, output_dtype=0, precision=0):
    return quantize_linear(xp, x, y_scale, y_zero_point, axis=axis, saturate=saturate,
                           block_size=block_size, output_dtype=output_dtype,
                           precision=precision)


def require_param_shapes(op_type, x, params, axis=1, block_size=0) -> None:
    """Each (name, type) of ``params`` (a scale, a zero point) fits ``x`` as expand_param
    reads it: one value, one per entry of ``axis``, or with ``block_size`` x's rank with
    ``axis`` in blocks of ``block_size`` (ceil(x / block_size) of them); a ValueError naming
    the parameter otherwise."""
    if x.shape is None:
        return
    rank = len(x.shape)
    if not -rank <= axis < rank:
        return  # expand_param names the axis
    axis = axis % rank
    along = x.shape[axis]
    for name, param in params:
        shape = None if param is None else param.shape
        if shape is None or (not block_size and all(d == 1 for d in shape)):
            continue  # unknown, or one value per tensor: (), (1,), (1, 1)
        if block_size and block_size > 0:
            blocks = -(-along // block_size) if isinstance(along, int) else None
            expected = x.shape[:axis] + (blocks,) + x.shape[axis + 1:]
            why = f"x's shape with axis {axis} in blocks of {block_size}"
        else:
            expected, why = (along,), f"one value, or one per entry of x's axis {axis}"
        if not fits(shape, expected):
            raise ValueError(f"{op_type}: {name} has shape {shape_text(shape)}; expected "
                             f"{shape_text(expected)} ({why}, x {shape_text(x.shape)})")


def _quantize_infer(x, y_scale, y_zero_point=None, *, output_dtype=0, axis=1, block_size=0,
                    **_):
    require_param_shapes("QuantizeLinear", x, (("y_scale", y_scale),
                                               ("y_zero_point", y_zero_point)),
                         axis, block_size)
    dtype = y_zero_point.dtype if y_zero_point is not None and y_zero_point.dtype else (
        to_numpy_dtype(output_dtype) if output_dtype else np.dtype(np.uint8))
    return [TensorType(dtype, x.shape)]


for _handle in (quantize_linear_10, quantize_linear_13, quantize_linear_19, quantize_linear_21,
                quantize_linear_23):
    _handle.infer(_quantize_infer)


# -- DequantizeLinear --------------------------------------------------------------------------

def _dequantized_dtype(scale_dtype, output_dtype) -> np.dtype:
    if output_dtype:
        return to_numpy_dtype(output_dtype)
    scale_dtype = np.dtype(scale_dtype)
    return scale_dtype if scale_dtype.name in ("float16", "float32", "float64", "bfloat16") \
        else np.dtype(np.float32)


def dequantize_linear(xp, x, x_scale, x_zero_point=None, *, axis=1, block_size=0,
                      output_dtype=0):
    """y = (x - x_zero_point) * x_scale, returned in ``output_dtype`` (default: the scale's)."""
    out_dtype = _dequantized_dtype(x_scale.dtype, output_dtype)
    work = np.dtype(np.float64) if out_dtype == np.float64 else np.dtype(np.float32)
    if _is_integer(x.dtype):
        # subtract in integers so int32 inputs stay exact before the multiply
        centered = x.astype(np.int64)
        if x_zero_point is not None:
            zero = expand_param(xp, x_zero_point, x.shape, axis, block_size)
            centered = centered - zero.astype(np.int64)
        centered = centered.astype(work)
    else:
        centered = _as_float(x, work)
        if x_zero_point is not None:
            zero = expand_param(xp, x_zero_point, x.shape, axis, block_size)
            centered = centered - _as_float(zero, work)
    scale = _as_float(expand_param(xp, x_scale, x.shape, axis, block_size), work)
    return (centered * scale).astype(out_dtype)


@op("DequantizeLinear", since=10, dtypes=QUANTIZED)
def dequantize_linear_10(xp, x, x_scale, x_zero_point=None):
    return dequantize_linear(xp, x, x_scale, x_zero_point)


# 19 added float8 inputs: same kernel
@op("DequantizeLinear", since=19, dtypes=QUANTIZED)
@op("DequantizeLinear", since=13, dtypes=QUANTIZED)
def dequantize_linear_13(xp, x, x_scale, x_zero_point=None, *, axis=1):
    return dequantize_linear(xp, x, x_scale, x_zero_point, axis=axis)


@op("DequantizeLinear", since=21, dtypes=QUANTIZED)
def dequantize_linear_21(xp, x, x_scale, x_zero_point=None, *, axis=1, block_size=0):
    return dequantize_linear(xp, x, x_scale, x_zero_point, axis=axis, block_size=block_size)


@op("DequantizeLinear", since=28, dtypes=QUANTIZED)
@op("DequantizeLinear", since=25, dtypes=QUANTIZED)
@op("DequantizeLinear", since=24, dtypes=QUANTIZED)
@op("DequantizeLinear", since=23, dtypes=QUANTIZED)
def dequantize_linear_23(xp, x, x_scale, x_zero_point=None, *, axis=1, block_size=0,
                         output_dtype=0):
    return dequantize_linear(xp, x, x_scale, x_zero_point, axis=axis, block_size=block_size,
                             output_dtype=output_dtype)


def _dequantize_infer(x, x_scale, x_zero_point=None, *, output_dtype=0, axis=1,
                      block_size=0, **_):
    require_param_shapes("DequantizeLinear", x, (("x_scale", x_scale),
                                                 ("x_zero_point", x_zero_point)),
                         axis, block_size)
    if not output_dtype and x_scale.dtype is None:
        return [TensorType(None, x.shape)]
    return [TensorType(_dequantized_dtype(x_scale.dtype, output_dtype), x.shape)]


for _handle in (dequantize_linear_10, dequantize_linear_13, dequantize_linear_21,
                dequantize_linear_23):
    _handle.infer(_dequantize_infer)


# -- DynamicQuantizeLinear ---------------------------------------------------------------------

@op("DynamicQuantizeLinear", since=11, dtypes=frozenset({"float32"}))
def dynamic_quantize_linear(xp, x):
    """uint8 quantization over the range of x widened to hold 0: (y, y_scale, y_zero_point)."""
    x = x.astype(np.float32, copy=False)
    low = xp.minimum(xp.min(x), np.float32(0)) if x.size else xp.asarray(np.float32(0))
    high = xp.maximum(xp.max(x), np.float32(0)) if x.size else xp.asarray(np.float32(0))
    scale = ((high - low) / np.float32(255)).astype(np.float32)
    # an all-zero x has scale 0; dividing by 1 instead quantizes it to the zero point 0
    safe = xp.where(scale == 0, np.float32(1), scale)
    zero_point = xp.clip(xp.rint(-low / safe), 0, 255)
    y = xp.clip(xp.rint(x / safe) + zero_point, 0, 255).astype(np.uint8)
    return y, xp.asarray(scale, dtype=np.float32), xp.asarray(zero_point.astype(np.uint8))


@dynamic_quantize_linear.infer
def _(x, **_):
    return [TensorType(np.dtype(np.uint8), x.shape), TensorType(np.dtype(np.float32), ()),
            TensorType(np.dtype(np.uint8), ())]


# -- integer and quantized matmul --------------------------------------------------------------

def _centered(x, zero_point, *, per_row=False, dtype=np.float64):
    """x - zero_point as floats (exact for 8-bit codes in float32 too). A 1-D per-row zero
    point of a matrix becomes a column."""
    x = _as_float(x, dtype)
    if zero_point is None:
        return x
    zero = _as_float(zero_point, dtype)
    if per_row and zero.ndim == 1 and zero.size > 1 and x.ndim >= 2:
        zero = zero.reshape(-1, 1)
    return x - zero


def _per_row(param, a_ndim):
    """A per-row scale of a matrix shaped to broadcast against its rows."""
    param = _as_float(param)
    if param.ndim == 1 and param.size > 1 and a_ndim >= 2:
        return param.reshape(-1, 1)
    return param


_F32_EXACT = float(2 ** 24)  # integers up to here (and every sum staying below) are exact


def exact_integer_product(xp, a, b, b_bound=None, prepacked=None, a_bound=None):
    """a @ b for float operands holding integers of magnitude < 2**16, exactly: float32 (or
    float64) values that are the integer sums. ``b_bound``: max |b| when the caller knows
    it; ``a_bound``: a bound on |a| known from its codes' range (then a product that cannot
    reach 2**24 skips reading a's row sums); ``prepacked``: the node's dict when b is a
    constant of the session (the dense product keeps its packed panels there; fused
    multiply-adds of integers whose sums stay below 2**24 are exact too)."""
    # a helper of the integer products, not a kernel: the same exact sums; on the host in
    # float32 with packed panels where they cannot round, on a GPU in float64
    if xp is not np or a.ndim < 2 or b.ndim < 2:
        return xp.matmul(a.astype(np.float64), b.astype(np.float64))
    a, b = a.astype(np.float32, copy=False), b.astype(np.float32, copy=False)
    if b_bound is None:
        b_bound = float(np.abs(b).max()) if b.size else 0.0
    if a_bound is not None and a.shape[-1] * a_bound * b_bound < _F32_EXACT:
        row_sums = None  # no row can sum past 2**24
    else:
        row_sums = np.abs(a).sum(axis=-1, dtype=np.float64)
    if row_sums is None or not row_sums.size or float(row_sums.max()) * b_bound < _F32_EXACT:
        if b.ndim != 2:
            return np.matmul(a, b)
        out = np.empty((*a.shape[:-1], b.shape[1]), np.float32)
        return dense_product(np.ascontiguousarray(a), b, out, prepacked)
    chunk = max(1, int((_F32_EXACT - 1) // (float(np.abs(a).max()) * b_bound)))
    total = None
    for start in range(0, a.shape[-1], chunk):
        part = np.matmul(a[..., start:start + chunk], b[..., start:start + chunk, :])
        total = part.astype(np.float64) if total is None else np.add(total, part, out=total)
    return total


def _constant_dict(_prepacked, b_zero_point, b_zero_index=3):
    """The node's dict when B (and its zero point) are constants of the session, else None."""
    needed = {1} if b_zero_point is None else {1, b_zero_index}
    if _prepacked is None or not needed <= _prepacked.get(CONSTANT_INPUTS, frozenset()):
        return None
    return _prepacked


def centered_weight(xp, B, zero_point, _prepacked, constant_inputs, center):
    """(B less its zero point as float32, max |that|), kept in ``_prepacked`` when B and its
    zero point are constants of the session; ``center(B, zero_point)`` centers it."""
    # a helper, not a kernel: the kept copy and its bound serve the host's float32 product
    # (exact_integer_product); a GPU multiplies in float64 and needs neither
    constant = _prepacked is not None and xp is np and constant_inputs <= \
        _prepacked.get(CONSTANT_INPUTS, frozenset())
    if constant and "centered_weight" in _prepacked:
        return _prepacked["centered_weight"]
    weight = center(B, zero_point)
    if xp is np:
        weight = np.ascontiguousarray(weight, dtype=np.float32)
    bound = float(xp.abs(weight).max()) if xp is np and weight.size else None
    if constant:
        _prepacked["centered_weight"] = (weight, bound)
    return weight, bound


@op("MatMulInteger", since=10, dtypes=INT8S)
def matmul_integer(xp, A, B, a_zero_point=None, b_zero_point=None, *, _prepacked=None):
    """(A - a_zero_point)(B - b_zero_point) in int32: the codes less their zero points in
    float64, whose sums of 8-bit products are exact, on any device. The CPU's VNNI and
    float32 products are registered beside it (``ops/quant/quantize_cpu.py``)."""
    product = xp.matmul(_centered(A, a_zero_point, per_row=True), _centered(B, b_zero_point))
    return product.astype(np.int32)


def _matmul_shape(a, b):
    """MatMul's output shape (ops/nn/nn.matmul_shape, which refuses operands without a common
    inner dim); None when either shape is unknown or a scalar."""
    if a.shape is None or b.shape is None or len(a.shape) < 1 or len(b.shape) < 1:
        return None
    return matmul_shape(a.shape, b.shape)


@matmul_integer.infer
def _(A, B, a_zero_point=None, b_zero_point=None, **__):
    shape = _matmul_shape(A, B)
    rows = None if A.shape is None or len(A.shape) < 2 else A.shape[-2]
    columns = None if B.shape is None or len(B.shape) < 2 else B.shape[-1]
    _require_per("MatMulInteger", "a_zero_point", a_zero_point, rows, "row of A")
    _require_per("MatMulInteger", "b_zero_point", b_zero_point, columns, "column of B")
    return [TensorType(np.dtype(np.int32), shape)]


@op("QLinearMatMul", since=21, dtypes=QLINEAR_MATMUL_21)
@op("QLinearMatMul", since=10, dtypes=INT8S)
def qlinear_matmul(xp, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                   y_zero_point):
    """Quantized matmul: the exact integer product rescaled by a_scale * b_scale / y_scale
    (in float32 for 8-bit outputs, as onnxruntime does; float8 outputs in float64)."""
    accumulated = xp.matmul(_centered(a, a_zero_point, per_row=True),
                            _centered(b, b_zero_point))
    if _is_integer(y_zero_point.dtype):
        return requantize_sum(xp, accumulated,
                              output_multiplier(_per_row(a_scale, a.ndim), b_scale, y_scale),
                              y_zero_point)
    real = accumulated * _per_row(a_scale, a.ndim) * _as_float(b_scale)
    return saturate_to(xp, real / _as_float(y_scale) + _as_float(y_zero_point),
                       y_zero_point.dtype)


@qlinear_matmul.infer
def _(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, **_):
    """The product's type; a's scale and zero point must be one value or one per row of a,
    b's and y's one value or one per column of b (a ValueError naming them otherwise)."""
    shape = _matmul_shape(a, b)
    rows = None if a.shape is None or len(a.shape) < 2 else a.shape[-2]
    columns = None if b.shape is None or len(b.shape) < 2 else b.shape[-1]
    for name, param, count, of in (("a_scale", a_scale, rows, "row of a"),
                                   ("a_zero_point", a_zero_point, rows, "row of a"),
                                   ("b_scale", b_scale, columns, "column of b"),
                                   ("b_zero_point", b_zero_point, columns, "column of b"),
                                   ("y_scale", y_scale, columns, "column of b"),
                                   ("y_zero_point", y_zero_point, columns, "column of b")):
        _require_per("QLinearMatMul", name, param, count, of)
    return [TensorType(y_zero_point.dtype, shape)]


def _require_per(op_type, name, param, count, of) -> None:
    """A 1-D ``param`` holds one value or ``count`` values, one per ``of`` (a ValueError
    otherwise); other ranks (a batched B's zero points) are left to the kernel."""
    size = None if param is None or param.shape is None else param.shape
    if size is None or len(size) != 1 or not isinstance(size[0], int) or size[0] == 1 \
            or not isinstance(count, int) or size[0] == count:
        return
    expected = "one value" if count == 1 else f"one value or ({count},), one per {of}"
    raise ValueError(f"{op_type}: {name} has shape {shape_text(size)}; expected {expected}")


# -- integer and quantized convolution ---------------------------------------------------------

def _per_channel(param, ndim):
    """A per-output-channel parameter shaped (M, 1, ...) for a rank-``ndim`` weight."""
    param = _as_float(param)
    if param.ndim == 1 and param.size > 1:
        return param.reshape((-1,) + (1,) * (ndim - 1))
    return param.reshape(()) if param.size == 1 else param


def _integer_conv(xp, x, w, x_zero_point, w_zero_point, attrs):
    """conv(x - x_zero_point, w - w_zero_point) in float64 (exact). Padding adds zeros to the
    centered input, i.e. pads x with its zero point."""

    x = _centered(x, x_zero_point)
    w = _as_float(w)
    if w_zero_point is not None:
        w = w - _per_channel(w_zero_point, w.ndim)
    return conv(xp, x, w, **attrs)


@op("ConvInteger", since=10, dtypes=INT8S)
def conv_integer(xp, x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET",
                 dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides)
    return _integer_conv(xp, x, w, x_zero_point, w_zero_point, attrs).astype(np.int32)


@op("QLinearConv", since=10, dtypes=INT8S)
def qlinear_conv(xp, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                 B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 pads=None, strides=None):
    """Quantized conv: the exact integer conv plus the int32 bias B (scale x_scale * w_scale),
    requantized by x_scale * w_scale / y_scale per output channel in float32."""
    attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides)
    accumulated = _integer_conv(xp, x, w, x_zero_point, w_zero_point, attrs)
    channel_shape = (1, -1) + (1,) * (accumulated.ndim - 2)
    if B is not None:
        accumulated = accumulated + _as_float(B).reshape(channel_shape)
    return requantize_sum(xp, accumulated, conv_multiplier(x_scale, w_scale, y_scale,
                                                           accumulated.ndim),
                          y_zero_point.reshape(()))


def conv_multiplier(x_scale, w_scale, y_scale, ndim):
    """QLinearConv's float32 requantization scale, one per output channel shaped
    (1, M, 1, ...) for a rank-``ndim`` output when w_scale has one per channel."""
    w_scale = w_scale.reshape((1, -1) + (1,) * (ndim - 2) if w_scale.size > 1 else ())
    return output_multiplier(x_scale.reshape(()), w_scale, y_scale.reshape(()))


def _conv_shape(x, w, attrs):
    """Conv's output shape, from Conv's own infer function (found through the registry)."""
    conv_infer = REGISTRY.find("", "Conv", 11).infer_fn
    return conv_infer(x, w, **attrs)[0].shape


@conv_integer.infer
def _(x, w, x_zero_point=None, w_zero_point=None, **attrs):
    _require_per("ConvInteger", "x_zero_point", x_zero_point, 1, "tensor")
    channels = None if w.shape is None else w.shape[0]
    _require_per("ConvInteger", "w_zero_point", w_zero_point, channels, "output channel of w")
    return [TensorType(np.dtype(np.int32), _conv_shape(x, w, attrs))]


@qlinear_conv.infer
def _(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None,
      **attrs):
    channels = None if w.shape is None else w.shape[0]
    for name, param in (("w_scale", w_scale), ("w_zero_point", w_zero_point)):
        _require_per("QLinearConv", name, param, channels, "output channel of w")
    return [TensorType(y_zero_point.dtype, _conv_shape(x, w, attrs))]
