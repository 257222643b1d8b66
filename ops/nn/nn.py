"""Neural-network layers: matrix products (MatMul, Gemm, Einsum), the softmax family and
dropout. The normalizations are in ``norm.py``.

Half-precision inputs (float16, bfloat16, float8) are computed in float32 and the result cast
back, both for accuracy and because NumPy has no fast (or, for bfloat16 einsum, any) kernels
for them (float16 softmax excepted, see ``_softmax_operand``).
"""

from __future__ import annotations

from collections import Counter
from math import prod

import numpy as np

from mixrt.ops.ir.dtypes import FLOAT8, FLOATS, NUMERIC, compute_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.random.random import unseeded_generator
from mixrt.ops.ir.types import (TensorType, broadcast_shapes, conflicting, normalize_axis,
                                same_as_input, shape_text)

_MATMUL_TYPES = FLOATS | {"int32", "int64", "uint32", "uint64"}


def widen(x):
    """``x`` in its compute dtype (no copy when it already is)."""
    return x.astype(compute_dtype(x.dtype), copy=False)


def _matmul_operand(xp, x):
    # cuBLAS multiplies float16 natively (accumulating in float32); NumPy has no float16 BLAS.
    if x.dtype == np.float16 and xp.__name__ != "numpy":
        return x
    return widen(x)


def _matmul(xp, a, b):
    return xp.matmul(_matmul_operand(xp, a), _matmul_operand(xp, b))


# -- MatMul, Gemm, Einsum ----------------------------------------------------------------------

@op("MatMul", since=13, dtypes=_MATMUL_TYPES)
@op("MatMul", since=9, dtypes=_MATMUL_TYPES)
@op("MatMul", since=1, dtypes=FLOATS)
def mat_mul(xp, A, B):
    return xp.asarray(_matmul(xp, A, B)).astype(A.dtype, copy=False)


@mat_mul.infer
def _(A: TensorType, B: TensorType, **_):
    return [TensorType(A.dtype, matmul_shape(A.shape, B.shape))]


def matmul_shape(a, b):
    """numpy.matmul's output shape: 1-D operands gain, then lose, a unit dimension."""
    if a is None or b is None:
        return None
    a_vector, b_vector = len(a) == 1, len(b) == 1
    a = (1,) + tuple(a) if a_vector else tuple(a)
    b = tuple(b) + (1,) if b_vector else tuple(b)
    if conflicting(a[-1], b[-2]):
        raise ValueError(f"MatMul operands {shape_text(a[1:] if a_vector else a)} and "
                         f"{shape_text(b[:-1] if b_vector else b)} do not share an inner dim "
                         f"({a[-1]} against {b[-2]})")
    batch = broadcast_shapes(a[:-2], b[:-2])
    rows = () if a_vector else (a[-2],)
    cols = () if b_vector else (b[-1],)
    return batch + rows + cols


@op("Gemm", since=13, dtypes=_MATMUL_TYPES)
@op("Gemm", since=11, dtypes=_MATMUL_TYPES)
@op("Gemm", since=9, dtypes=_MATMUL_TYPES)
@op("Gemm", since=7, dtypes=FLOATS)
def gemm(xp, A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    y = _matmul(xp, A.T if transA else A, B.T if transB else B)
    if alpha != 1.0:
        y = y * alpha
    if C is not None and beta != 0.0:
        y = y + widen(C) * beta if beta != 1.0 else y + widen(C)
    return y.astype(A.dtype, copy=False)


@op("Gemm", since=6, dtypes=FLOATS)
@op("Gemm", since=1, dtypes=FLOATS)
def gemm_6(xp, A, B, C, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    # ``broadcast`` only allowed C to broadcast; NumPy broadcasting covers both settings.
    return gemm(xp, A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB)


def _infer_gemm(A: TensorType, B: TensorType, C=None, *, transA=0, transB=0, **_):
    if A.shape is None or B.shape is None:
        return [TensorType(A.dtype, None)]
    for name, operand in (("A", A), ("B", B)):
        if len(operand.shape) != 2:
            raise ValueError(f"Gemm's {name} must be 2-D; got {shape_text(operand.shape)}")
    rows, inner_a = A.shape[::-1] if transA else A.shape
    inner_b, cols = B.shape[::-1] if transB else B.shape
    if conflicting(inner_a, inner_b):
        raise ValueError(f"Gemm's A {shape_text(A.shape)} (transA={transA}) and B "
                         f"{shape_text(B.shape)} (transB={transB}) do not share an inner dim")
    if isinstance(C, TensorType) and C.shape is not None:
        broadcast_shapes((rows, cols), C.shape)
    return [TensorType(A.dtype, (rows, cols))]


gemm.infer(_infer_gemm)
gemm_6.infer(_infer_gemm)


@op("Einsum", since=28, dtypes=NUMERIC)
@op("Einsum", since=12, dtypes=NUMERIC)
def einsum(xp, *inputs, equation=None):
    if equation is None:
        raise ValueError("Einsum needs the 'equation' attribute")
    result = xp.einsum(equation.replace(" ", ""), *(widen(x) for x in inputs))
    return xp.asarray(result).astype(inputs[0].dtype, copy=False)


@einsum.infer
def _(*inputs: TensorType, equation=None, **_):
    shapes = [t.shape for t in inputs]
    return [TensorType(inputs[0].dtype, einsum_shape(equation or "", shapes))]


def einsum_shape(equation: str, shapes) -> tuple | None:
    """The output shape of an einsum ``equation`` (explicit or implicit form, with ellipsis)."""
    if any(s is None for s in shapes):
        return None
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"Einsum equation {equation!r} has {len(terms)} operand terms "
                         f"but the node has {len(shapes)} inputs")
    sizes: dict[str, object] = {}
    ellipsis: tuple = ()
    for term, shape in zip(terms, shapes):
        labels = term.replace("...", ".")
        ellipsis_rank = len(shape) - (len(labels) - labels.count("."))
        if ellipsis_rank < 0 or ("." not in labels and ellipsis_rank):
            raise ValueError(f"Einsum {equation!r}: the term {term!r} does not fit an operand "
                             f"of shape {shape_text(shape)} ({len(shape)} axes)")
        position = 0
        for label in labels:
            if label == ".":
                ellipsis = broadcast_shapes(ellipsis, shape[position:position + ellipsis_rank])
                position += ellipsis_rank
                continue
            known = sizes.get(label)
            if known in (None, 1):  # a size-1 label broadcasts against others
                sizes[label] = shape[position]
            elif shape[position] != 1 and conflicting(known, shape[position]):
                raise ValueError(f"Einsum {equation!r}: label {label!r} is {known} long in one "
                                 f"operand and {shape[position]} in another (operand shapes "
                                 f"{', '.join(shape_text(s) for s in shapes)})")
            position += 1
    if not arrow:  # implicit output: the ellipsis, then labels seen once, in ASCII order
        counts = Counter(c for c in lhs if c.isalpha())
        rhs = ("..." if "..." in lhs else "") + "".join(
            sorted(c for c, n in counts.items() if n == 1))
    shape = []
    for label in rhs.replace("...", "."):
        shape.extend(ellipsis) if label == "." else shape.append(sizes.get(label))
    return tuple(shape)


# -- Softmax, LogSoftmax, Hardmax ---------------------------------------------------------------
# Up to opset 12 these coerce the input to 2-D at ``axis`` (default 1): the normalization runs
# over all trailing axes together. From 13 they normalize along the single ``axis`` (default -1).

def _trailing_axes(axis: int, rank: int) -> tuple:
    return tuple(range(normalize_axis(axis, rank), rank))


def _softmax_operand(x):
    # float16 stays float16: the ONNX reference (and the conformance data made with it)
    # computes half-precision softmax in NumPy float16, and widening then rounding once
    # differs from it by an ulp. Only bfloat16/float8, which NumPy sums poorly, are widened.
    return x if x.dtype == np.float16 else widen(x)


def _softmax(xp, x, axes):
    operand = _softmax_operand(x)
    exps = xp.exp(operand - xp.max(operand, axis=axes, keepdims=True))
    return (exps / xp.sum(exps, axis=axes, keepdims=True)).astype(x.dtype, copy=False)


def log_softmax_over(xp, x, axes):
    operand = _softmax_operand(x)
    shifted = operand - xp.max(operand, axis=axes, keepdims=True)
    log_total = xp.log(xp.sum(xp.exp(shifted), axis=axes, keepdims=True))
    return (shifted - log_total).astype(x.dtype, copy=False)


def _hardmax(xp, x, axis: int):
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    axis = normalize_axis(axis, x.ndim)
    winner = xp.argmax(x, axis=axis, keepdims=True)
    positions = xp.arange(x.shape[axis]).reshape(
        [-1 if i == axis else 1 for i in range(x.ndim)])
    return (positions == winner).astype(x.dtype)


@op("Softmax", since=11, dtypes=FLOATS)
@op("Softmax", since=1, dtypes=FLOATS)
def softmax_coerced(xp, input, *, axis=1):
    return _softmax(xp, input, _trailing_axes(axis, input.ndim))


@op("Softmax", since=13, dtypes=FLOATS)
def softmax(xp, input, *, axis=-1):
    return _softmax(xp, input, (normalize_axis(axis, input.ndim),))


@op("LogSoftmax", since=11, dtypes=FLOATS)
@op("LogSoftmax", since=1, dtypes=FLOATS)
def log_softmax_coerced(xp, input, *, axis=1):
    return log_softmax_over(xp, input, _trailing_axes(axis, input.ndim))


@op("LogSoftmax", since=13, dtypes=FLOATS)
def log_softmax(xp, input, *, axis=-1):
    return log_softmax_over(xp, input, (normalize_axis(axis, input.ndim),))


@op("Hardmax", since=11, dtypes=FLOATS)
@op("Hardmax", since=1, dtypes=FLOATS)
def hardmax_coerced(xp, input, *, axis=1):
    axis = normalize_axis(axis, input.ndim)
    rows = prod(input.shape[:axis])
    flat = input.reshape(rows, -1) if rows else input.reshape(0, prod(input.shape[axis:]))
    return _hardmax(xp, flat, 1).reshape(input.shape)


@op("Hardmax", since=13, dtypes=FLOATS)
def hardmax(xp, input, *, axis=-1):
    return _hardmax(xp, input, axis)


for _handle in (softmax_coerced, softmax, log_softmax_coerced, log_softmax, hardmax_coerced,
                hardmax):
    _handle.infer(same_as_input)


# -- Dropout -----------------------------------------------------------------------------------

def _keep_mask(xp, shape, ratio: float, seed):
    """True where an element survives. The same seed gives the same mask (the ONNX tests'
    generator: NumPy's legacy RandomState, uniform in [0, 1), kept where >= ratio). Without
    a seed the mask comes from the stream ``mixrt.random.seed`` reseeds (CuPy's on a GPU)."""
    # a branch, not a kernel: the device only picks the random stream (same distribution)
    if seed is not None:  # drawn on the host, so a seed means one mask on every device
        keep = np.random.RandomState(seed).uniform(0.0, 1.0, shape) >= ratio
        return keep if xp is np else xp.asarray(keep)
    if xp is np:
        return unseeded_generator().random(shape, dtype=np.float32) >= np.float32(ratio)
    return xp.random.random(shape, dtype=xp.float32) >= ratio


def _dropout(xp, data, ratio: float, training: bool, seed, outputs: int, mask_dtype):
    if not training or ratio == 0.0:
        output = data
        mask = xp.ones(data.shape, dtype=mask_dtype) if outputs > 1 else None
    else:
        keep = _keep_mask(xp, data.shape, ratio, seed)
        output = (widen(data) * keep * (1.0 / (1.0 - ratio))).astype(data.dtype, copy=False)
        mask = keep.astype(mask_dtype, copy=False)
    return (output, mask) if outputs > 1 else output


@op("Dropout", since=6, dtypes=FLOATS, random=True)
def dropout_6(xp, data, *, ratio=0.5, is_test=0, _outputs=1):
    # Exported models of this era carry is_test=0 even for inference; like opset 7..11
    # Dropout, which has no switch at all, it runs in inference mode.
    return _dropout(xp, data, ratio, False, None, _outputs, data.dtype)


@op("Dropout", since=7, dtypes=FLOATS, random=True)
def dropout_7(xp, data, *, ratio=0.5, _outputs=1):
    # Opset 6..9's mask is typed like the data; 10 made it bool.
    return _dropout(xp, data, ratio, False, None, _outputs, data.dtype)


@op("Dropout", since=10, dtypes=FLOATS, random=True)
def dropout_10(xp, data, *, ratio=0.5, _outputs=1):
    return _dropout(xp, data, ratio, False, None, _outputs, bool)


@op("Dropout", since=22, dtypes=FLOATS | FLOAT8, random=True)
@op("Dropout", since=13, dtypes=FLOATS, random=True)
@op("Dropout", since=12, dtypes=FLOATS, random=True)
def dropout(xp, data, ratio=None, training_mode=None, *, seed=None, _outputs=1):
    ratio = 0.5 if ratio is None else float(ratio)
    training = training_mode is not None and bool(training_mode)
    return _dropout(xp, data, ratio, training, seed, _outputs, bool)


def _infer_typed_mask(data: TensorType, *_, **__):
    return [TensorType(data.dtype, data.shape), TensorType(data.dtype, data.shape)]


dropout_6.infer(_infer_typed_mask)
dropout_7.infer(_infer_typed_mask)


def _infer_bool_mask(data: TensorType, *_, **__):
    return [TensorType(data.dtype, data.shape), TensorType(np.dtype(bool), data.shape)]


dropout_10.infer(_infer_bool_mask)
dropout.infer(_infer_bool_mask)
