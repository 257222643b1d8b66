"""onnxruntime's quantized operators of the ``com.microsoft`` domain, elementwise part:
QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearConcat,
QLinearWhere and the domain's own QuantizeLinear and DequantizeLinear.
(``contrib_quant_pool.py`` holds the pools, ``contrib_quant_matmul.py`` the products.)

onnxruntime's quantizer writes these ops (``quantize_static`` in QOperator format), and its
CPU kernels define what they compute. Their integer outputs are reproduced exactly, which
means following each kernel's float32 arithmetic step by step rather than the real-valued
formula in the op's description: a result that lands on .5 in exact arithmetic rounds either
way depending on the order of float32 operations.

* QLinearAdd computes ``fixed + a * ratio_a + b * ratio_b`` in float32 with fused
  multiply-adds (onnxruntime's x86-64 AVX2 kernel, and its constant term, are compiled with
  FMA contraction), in an order that depends on which operand its broadcast loop holds
  constant; an FMA is emulated exactly by a float64 multiply-add rounded once to float32
  (an 8-bit integer times a float32 is exact in float64).
* QLinearMul scales the integer product by ``a_scale * b_scale / c_scale`` in float32.
* Both compute a large output once per pair of codes (a 256 x 256 table) and gather.
* QLinearSigmoid, QLinearLeakyRelu, QLinearConcat and QLinearWhere map each of the 256
  input codes through a table: dequantize in float32, apply the function, quantize as
  onnxruntime's MlasQuantizeLinear does (float32 divide, round half to even, saturate).
  onnxruntime's sigmoid is a float32 rational approximation; the table here uses the exact
  sigmoid, and no code came out different over the tables the tests compare.
* QLinearSoftmax follows onnxruntime's table of scaled exponentials and its float32
  running sum, and scales by ``floor(1 / y_scale)`` as it does; the quotient itself is
  taken in float64, which is where onnxruntime 1.32's rounding lands (1.31 took it in
  float32: ties at .5, as two equal codes in a row of two make, then fell a code apart).

Rounding is always half to even and saturation clamps to the integer type's range.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.quant.quantize import dequantize_linear, quantize_linear, saturate_to
from mixrt.ops.ir.registry import REGISTRY, op
from mixrt.ops.ir.types import TensorType, broadcast_shapes, shape_text

COM_MICROSOFT = "com.microsoft"
INT8S = frozenset({"int8", "uint8"})
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


# -- shared pieces -----------------------------------------------------------------------------

def one_value(op_type, name, param):
    """A per-tensor scale or zero point as a 0-d array (a ValueError naming it otherwise)."""
    if param.size != 1:
        raise ValueError(f"{op_type}: {name} has shape {tuple(param.shape)}; expected one "
                         f"value (per-tensor quantization)")
    return param.reshape(())


def zero_point_or_zero(xp, op_type, name, zero_point, dtype):
    """A per-tensor zero point as a 0-d array of ``dtype``; 0 when the input is absent."""
    if zero_point is None:
        return xp.zeros((), dtype=dtype)
    return one_value(op_type, name, zero_point)


def as_f32(value):
    return value.astype(F32, copy=False)


def fma_f32(x, y, addend):
    """float32(x * y + addend) rounded once, as a fused multiply-add computes it: exact in
    float64 for the 8-bit codes and float32 factors it is given."""
    return (x.astype(F64) * y.astype(F64) + addend.astype(F64)).astype(F32)


def requantize(xp, values, zero_point, dtype):
    """float32 ``values`` rounded half to even, shifted by the zero point and saturated to
    ``dtype`` (rounding before the shift, as onnxruntime's kernels do)."""
    return saturate_to(xp, xp.rint(values) + zero_point.astype(F32), dtype)


def codes(xp, dtype):
    """The 256 values of an 8-bit type, in the order of their bit patterns."""
    return xp.arange(256, dtype=np.int32).astype(np.uint8).view(dtype)


def lookup_table(xp, fn, x_scale, x_zero_point, y_scale, y_zero_point, dtype):
    """What each of the 256 input codes maps to: quantize(fn(dequantize(code))), in
    float32, quantizing as MlasQuantizeLinear does."""
    centered = codes(xp, dtype).astype(np.int32) - x_zero_point.astype(np.int32)
    real = fn(as_f32(x_scale) * centered.astype(F32))
    return quantize_linear(xp, real.astype(F32), as_f32(y_scale), y_zero_point)


def apply_table(table, x):
    """Each element of the 8-bit ``x`` replaced by its entry of ``table`` (indexed with
    wide integers: CuPy wraps indices modulo the axis length in the index's own type)."""
    return table[x.view(np.uint8).astype(np.int32)]


def require_per_tensor(op_type, **params) -> None:
    """Each named parameter type has one value when its shape is known (a ValueError
    naming the first that does not)."""
    for name, param in params.items():
        shape = None if param is None else param.shape
        if shape is not None and all(isinstance(d, int) for d in shape) \
                and int(np.prod(shape)) != 1:
            raise ValueError(f"{op_type}: {name} has shape {shape_text(shape)}; expected one "
                             f"value (per-tensor quantization)")


def require_dtype(op_type, dtype, **values) -> None:
    """Each named value type has ``dtype`` where it is known (a ValueError naming it)."""
    for name, value in values.items():
        if value is not None and value.dtype is not None and dtype is not None \
                and np.dtype(value.dtype) != np.dtype(dtype):
            raise ValueError(f"{op_type}: {name} is {np.dtype(value.dtype).name}; expected "
                             f"{np.dtype(dtype).name}")


def require_float_scales(op_type, **scales) -> None:
    require_dtype(op_type, F32, **scales)


# -- QLinearAdd, QLinearMul --------------------------------------------------------------------

def _absorbs_a_first(A, B) -> bool:
    """Whether onnxruntime's broadcast loop sees A as the scalar of each span (A constant
    along the innermost output axis while B varies): it then hands its kernel B as the
    first operand and A as the second, which changes the order of the float32 operations."""
    a_inner = A.shape[-1] if A.ndim else 1
    b_inner = B.shape[-1] if B.ndim else 1
    return a_inner == 1 and b_inner > 1


_PAIR_TABLE_MIN = 1 << 16  # outputs this large look their codes up in a 256 x 256 table


def _pairwise(xp, codes_of, A, B):
    """``codes_of(a, b)`` for every broadcast pair of A's and B's elements. A large output
    computes it once per pair of 8-bit codes and gathers from that table instead: the same
    arithmetic on 65536 pairs, then one indexing pass."""
    if max(A.size, B.size) < _PAIR_TABLE_MIN:
        return codes_of(A, B)
    every = codes(xp, A.dtype)
    table = codes_of(every[:, None], every[None, :]).reshape(-1)
    index = (A.view(np.uint8).astype(np.int32) << 8) | B.view(np.uint8).astype(np.int32)
    return table[index]


def _zero_points(xp, op_type, dtype, *named):
    return [zero_point_or_zero(xp, op_type, name, zero_point, dtype)
            for name, zero_point in named]


@op("QLinearAdd", since=1, domain=COM_MICROSOFT, dtypes=INT8S)
def qlinear_add(xp, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
                C_zero_point=None):
    """C = (A_scale (A - A_zp) + B_scale (B - B_zp)) / C_scale + C_zp, per tensor, with
    NumPy broadcasting."""
    name = "QLinearAdd"
    zero_a, zero_b, zero_c = _zero_points(
        xp, name, A.dtype, ("A_zero_point", A_zero_point), ("B_zero_point", B_zero_point),
        ("C_zero_point", C_zero_point))
    c_scale = as_f32(one_value(name, "C_scale", C_scale))
    ratio_a = as_f32(one_value(name, "A_scale", A_scale)) / c_scale
    ratio_b = as_f32(one_value(name, "B_scale", B_scale)) / c_scale
    # the kernel's constant term zc - (r1 z1 + r2 z2), its first product fused, and its
    # second operand's term added before its first's
    swapped = _absorbs_a_first(A, B)
    terms = [(ratio_a, zero_a), (ratio_b, zero_b)]
    (r1, z1), (r2, z2) = terms[::-1] if swapped else terms
    fixed = as_f32(zero_c) - fma_f32(r1, as_f32(z1), r2 * as_f32(z2))

    def sum_codes(a, b):
        first, second = (b, a) if swapped else (a, b)
        values = fma_f32(first, r1, fma_f32(second, r2, fixed))
        return saturate_to(xp, xp.rint(values), A.dtype)
    return _pairwise(xp, sum_codes, A, B)


@op("QLinearMul", since=1, domain=COM_MICROSOFT, dtypes=INT8S)
def qlinear_mul(xp, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
                C_zero_point=None):
    """C = (A - A_zp)(B - B_zp) A_scale B_scale / C_scale + C_zp, per tensor, with NumPy
    broadcasting. The integer product is exact in float32 (|product| < 2**16)."""
    name = "QLinearMul"
    zero_a, zero_b, zero_c = _zero_points(
        xp, name, A.dtype, ("A_zero_point", A_zero_point), ("B_zero_point", B_zero_point),
        ("C_zero_point", C_zero_point))
    ratio = (as_f32(one_value(name, "A_scale", A_scale))
             * as_f32(one_value(name, "B_scale", B_scale))
             / as_f32(one_value(name, "C_scale", C_scale)))

    def product_codes(a, b):
        product = (a.astype(np.int32) - zero_a.astype(np.int32)) \
            * (b.astype(np.int32) - zero_b.astype(np.int32))
        values = product.astype(F32) * ratio + as_f32(zero_c)
        return saturate_to(xp, xp.rint(values), A.dtype)
    return _pairwise(xp, product_codes, A, B)


def _infer_binary(op_type):
    def infer(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
              C_zero_point=None, **_):
        require_dtype(op_type, A.dtype, B=B, A_zero_point=A_zero_point,
                      B_zero_point=B_zero_point, C_zero_point=C_zero_point)
        require_float_scales(op_type, A_scale=A_scale, B_scale=B_scale, C_scale=C_scale)
        require_per_tensor(op_type, A_scale=A_scale, A_zero_point=A_zero_point,
                           B_scale=B_scale, B_zero_point=B_zero_point, C_scale=C_scale,
                           C_zero_point=C_zero_point)
        shape = None if A.shape is None or B.shape is None else \
            broadcast_shapes(A.shape, B.shape)
        return [TensorType(A.dtype, shape)]
    return infer


qlinear_add.infer(_infer_binary("QLinearAdd"))
qlinear_mul.infer(_infer_binary("QLinearMul"))


# -- table-driven activations: QLinearSigmoid, QLinearLeakyRelu --------------------------------

def _table_activation(xp, op_type, fn, X, X_scale, X_zero_point, Y_scale, Y_zero_point):
    dtype = X.dtype
    table = lookup_table(
        xp, fn, one_value(op_type, "X_scale", X_scale),
        zero_point_or_zero(xp, op_type, "X_zero_point", X_zero_point, dtype),
        one_value(op_type, "Y_scale", Y_scale),
        zero_point_or_zero(xp, op_type, "Y_zero_point", Y_zero_point, dtype), dtype)
    return apply_table(table, X)


@op("QLinearSigmoid", since=1, domain=COM_MICROSOFT, dtypes=INT8S)
def qlinear_sigmoid(xp, X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None):
    def sigmoid(real):
        return (1.0 / (1.0 + xp.exp(-real.astype(F64)))).astype(F32)
    return _table_activation(xp, "QLinearSigmoid", sigmoid, X, X_scale, X_zero_point,
                             Y_scale, Y_zero_point)


@op("QLinearLeakyRelu", since=1, domain=COM_MICROSOFT, dtypes=INT8S)
def qlinear_leaky_relu(xp, X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None,
                       *, alpha=0.01):
    def leaky_relu(real):
        return xp.where(real >= 0, real, np.float32(alpha) * real)
    return _table_activation(xp, "QLinearLeakyRelu", leaky_relu, X, X_scale, X_zero_point,
                             Y_scale, Y_zero_point)


def _infer_activation(op_type):
    def infer(X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None, **_):
        if Y_scale is None:
            raise ValueError(f"{op_type}: the Y_scale input is required")
        require_dtype(op_type, X.dtype, X_zero_point=X_zero_point, Y_zero_point=Y_zero_point)
        require_float_scales(op_type, X_scale=X_scale, Y_scale=Y_scale)
        require_per_tensor(op_type, X_scale=X_scale, X_zero_point=X_zero_point,
                           Y_scale=Y_scale, Y_zero_point=Y_zero_point)
        return [TensorType(X.dtype, X.shape)]
    return infer


qlinear_sigmoid.infer(_infer_activation("QLinearSigmoid"))
qlinear_leaky_relu.infer(_infer_activation("QLinearLeakyRelu"))


# -- QLinearSoftmax ----------------------------------------------------------------------------

_SOFTMAX_HEADROOM = 5.0  # onnxruntime keeps e**5 below float32's max for the running sum


def _softmax_axis(op_type, axis, opset, rank):
    if opset is None:
        raise ValueError(f"{op_type}: the opset attribute is required")
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"{op_type}: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _softmax_rows(X, axis, opset):
    """X as rows to normalize: before opset 13 everything from ``axis`` on flattens into one
    row (the input coerced to 2-D); from 13 on ``axis`` alone, moved last."""
    if opset < 13:
        return X.reshape(int(np.prod(X.shape[:axis], dtype=np.int64)), -1)
    return X.swapaxes(axis, -1)


def _exp_table(xp, x_scale, row_length):
    """exp((code - 255 + shift) * x_scale) for the 256 codes, float32: the shift puts the
    row's maximum as high as float32 allows while a row's sum stays finite."""
    # onnxruntime takes a float32 logarithm of a float32 quotient: rounding it the same
    # way moves every entry of the table, and with it which quotients land on .5
    largest = np.finfo(np.float32).max / np.float32(row_length)
    shift = max(0.0, float(np.float32(np.log(np.float64(largest)))) - _SOFTMAX_HEADROOM)
    scale = x_scale.astype(F64)
    steps = xp.arange(256, dtype=F64) - 255.0
    return xp.exp((steps + shift / scale) * scale).astype(F32)


@op("QLinearSoftmax", since=1, domain=COM_MICROSOFT, dtypes=INT8S)
def qlinear_softmax(xp, X, X_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *,
                    axis=-1, opset=None):
    """Softmax of the dequantized input, quantized; ``opset`` picks Softmax's axis rule
    (the attribute's default is -1 whatever the opset)."""
    name = "QLinearSoftmax"
    axis = _softmax_axis(name, axis, opset, X.ndim)
    if X.size == 0:
        return X.copy()
    rows = _softmax_rows(X, axis, opset)
    table = _exp_table(xp, one_value(name, "X_scale", X_scale), rows.shape[-1])
    # x_zero_point cancels out: each row is measured from its own maximum
    steps = rows.astype(np.int32) - rows.max(axis=-1, keepdims=True).astype(np.int32) + 255
    exps = table[steps]
    total = xp.cumsum(exps, axis=-1, dtype=F32)[..., -1:]  # a running float32 sum
    multiplier = xp.floor(np.float32(1.0) / as_f32(one_value(name, "y_scale", y_scale)))
    zero = zero_point_or_zero(xp, name, "y_zero_point", y_zero_point, X.dtype)
    shares = exps.astype(F64) * multiplier.astype(F64) / total.astype(F64)
    quantized = requantize(xp, shares, zero, X.dtype)
    if opset < 13:
        return quantized.reshape(X.shape)
    return quantized.swapaxes(axis, -1)


@qlinear_softmax.infer
def _(X, X_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *, axis=-1,
      opset=None, **_):
    name = "QLinearSoftmax"
    if X.shape is not None:
        _softmax_axis(name, axis, opset, len(X.shape))
    if y_scale is None:
        raise ValueError(f"{name}: the y_scale input is required")
    require_dtype(name, X.dtype, x_zero_point=x_zero_point, y_zero_point=y_zero_point)
    require_float_scales(name, X_scale=X_scale, y_scale=y_scale)
    require_per_tensor(name, X_scale=X_scale, x_zero_point=x_zero_point, y_scale=y_scale,
                       y_zero_point=y_zero_point)
    return [TensorType(X.dtype, X.shape)]


# -- QLinearConcat, QLinearWhere ---------------------------------------------------------------

def _requantizer(xp, op_type, which, scale, zero_point, y_scale, y_zero_point):
    """The table taking codes of (scale, zero_point) to codes of (y_scale, y_zero_point)."""
    return lookup_table(xp, lambda real: real, one_value(op_type, f"{which}'s scale", scale),
                        one_value(op_type, f"{which}'s zero point", zero_point),
                        y_scale, y_zero_point, y_zero_point.dtype)


def _triples(op_type, inputs):
    if not inputs or len(inputs) % 3:
        raise ValueError(f"{op_type}: inputs after Y_scale and Y_zero_point come as "
                         f"(tensor, scale, zero point) triples; got {len(inputs)}")
    return [inputs[i:i + 3] for i in range(0, len(inputs), 3)]


@op("QLinearConcat", since=1, domain=COM_MICROSOFT)
def qlinear_concat(xp, Y_scale, Y_zero_point, *inputs, axis=None):
    """Each input requantized to (Y_scale, Y_zero_point), then concatenated on ``axis``."""
    name = "QLinearConcat"
    if axis is None:
        raise ValueError(f"{name}: the axis attribute is required")
    y_scale = one_value(name, "Y_scale", Y_scale)
    y_zero = one_value(name, "Y_zero_point", Y_zero_point)
    parts = [apply_table(_requantizer(xp, name, f"input {i}", scale, zero, y_scale, y_zero), x)
             for i, (x, scale, zero) in enumerate(_triples(name, inputs))]
    return xp.concatenate(parts, axis=axis)


@qlinear_concat.infer
def _(Y_scale, Y_zero_point, *inputs, axis=None, **_):
    name = "QLinearConcat"
    if axis is None:
        raise ValueError(f"{name}: the axis attribute is required")
    triples = _triples(name, inputs)
    require_float_scales(name, Y_scale=Y_scale)
    for i, (x, scale, zero) in enumerate(triples):
        require_dtype(name, Y_zero_point.dtype, **{f"input {i}": x,
                                                   f"input {i}'s zero point": zero})
        require_float_scales(name, **{f"input {i}'s scale": scale})
        require_per_tensor(name, **{f"input {i}'s scale": scale,
                                    f"input {i}'s zero point": zero})
    concat_infer = REGISTRY.find("", "Concat", 13).infer_fn
    shape = concat_infer(*(x for x, _, _ in triples), axis=axis)[0].shape
    return [TensorType(Y_zero_point.dtype, shape)]


@op("QLinearWhere", since=1, domain=COM_MICROSOFT)
def qlinear_where(xp, condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale,
                  z_zero_point):
    """X where condition holds, Y elsewhere, both requantized to (z_scale, z_zero_point)."""
    name = "QLinearWhere"
    z_scale = one_value(name, "z_scale", z_scale)
    z_zero = one_value(name, "z_zero_point", z_zero_point)
    from_x = apply_table(_requantizer(xp, name, "X", x_scale, x_zero_point, z_scale, z_zero), X)
    from_y = apply_table(_requantizer(xp, name, "Y", y_scale, y_zero_point, z_scale, z_zero), Y)
    return xp.where(condition, from_x, from_y)


@qlinear_where.infer
def _(condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale, z_zero_point,
      **_):
    name = "QLinearWhere"
    require_dtype(name, np.dtype(bool), condition=condition)
    require_dtype(name, z_zero_point.dtype, X=X, x_zero_point=x_zero_point, Y=Y,
                  y_zero_point=y_zero_point)
    require_float_scales(name, x_scale=x_scale, y_scale=y_scale, z_scale=z_scale)
    require_per_tensor(name, x_scale=x_scale, x_zero_point=x_zero_point, y_scale=y_scale,
                       y_zero_point=y_zero_point, z_scale=z_scale, z_zero_point=z_zero_point)
    shapes = (condition.shape, X.shape, Y.shape)
    shape = None if any(s is None for s in shapes) else broadcast_shapes(*shapes)
    return [TensorType(z_zero_point.dtype, shape)]


# -- QuantizeLinear, DequantizeLinear of the com.microsoft domain ------------------------------

CONTRIB_QUANTIZED = frozenset({"int8", "uint8", "int16", "uint16", "int4", "uint4"})
_FLOAT = 1  # TensorProto.FLOAT: the division's type for float16 inputs, as onnxruntime


@op("QuantizeLinear", since=1, domain=COM_MICROSOFT, dtypes=frozenset({"float32", "float16"}))
def contrib_quantize_linear(xp, x, y_scale, y_zero_point=None, *, axis=1):
    """The standard QuantizeLinear (per tensor or per ``axis``) to int8, uint8, int16,
    uint16, int4 or uint4; the division happens in float32."""
    return quantize_linear(xp, x, y_scale, y_zero_point, axis=axis, precision=_FLOAT)


@op("DequantizeLinear", since=1, domain=COM_MICROSOFT,
    dtypes=CONTRIB_QUANTIZED | frozenset({"int32"}))
def contrib_dequantize_linear(xp, x, x_scale, x_zero_point=None, *, axis=1):
    """The standard DequantizeLinear (per tensor or per ``axis``), in the scale's type."""
    return dequantize_linear(xp, x, x_scale, x_zero_point, axis=axis)


@contrib_quantize_linear.infer
def _(x, y_scale, y_zero_point=None, *, axis=1, **_):
    if y_zero_point is not None and y_zero_point.dtype is not None \
            and np.dtype(y_zero_point.dtype).name not in CONTRIB_QUANTIZED:
        raise ValueError(f"QuantizeLinear: y_zero_point is {np.dtype(y_zero_point.dtype).name}"
                         f"; expected one of {', '.join(sorted(CONTRIB_QUANTIZED))}")
    return REGISTRY.find("", "QuantizeLinear", 13).infer_fn(x, y_scale, y_zero_point,
                                                             axis=axis)


@contrib_dequantize_linear.infer
def _(x, x_scale, x_zero_point=None, *, axis=1, **_):
    return REGISTRY.find("", "DequantizeLinear", 13).infer_fn(x, x_scale, x_zero_point,
                                                               axis=axis)

