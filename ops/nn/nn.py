"""Neural-network layers: matrix products, the softmax family, dropout and the normalizations
(BatchNormalization, InstanceNormalization, LayerNormalization, GroupNormalization,
RMSNormalization, LRN, LpNormalization, MeanVarianceNormalization).

Half-precision inputs (float16, bfloat16, float8) are computed in float32 and the result cast
back, both for accuracy and because NumPy has no fast (or, for bfloat16 einsum, any) kernels
for them (float16 softmax excepted, see ``_softmax_operand``). ``stash_type`` (an ONNX element type, default 1 = float32) is the precision a
normalization computes its statistics in; the normalized values are cast back to the input's
type before the affine step.
"""

from __future__ import annotations

from collections import Counter
from math import prod

import numpy as np

from mixrt.ops.ir.dtypes import (FLOAT8, FLOATS, NUMERIC, compute_dtype,
                               to_numpy_dtype)
from mixrt.ops.ir.registry import op
from mixrt.ops.random.random import unseeded_generator
from mixrt.ops.ir.types import TensorType, broadcast_shapes, conflicting, normalize_axis, \
    require_shape, same_as_input, shape_text, without_value

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


@op("Dropout", since=6, dtypes=FLOATS)
def dropout_6(xp, data, *, ratio=0.5, is_test=0, _outputs=1):
    # Exported models of this era carry is_test=0 even for inference; like opset 7..11
    # Dropout, which has no switch at all, it runs in inference mode.
    return _dropout(xp, data, ratio, False, None, _outputs, data.dtype)


@op("Dropout", since=7, dtypes=FLOATS)
def dropout_7(xp, data, *, ratio=0.5, _outputs=1):
    # Opset 6..9's mask is typed like the data; 10 made it bool.
    return _dropout(xp, data, ratio, False, None, _outputs, data.dtype)


@op("Dropout", since=10, dtypes=FLOATS)
def dropout_10(xp, data, *, ratio=0.5, _outputs=1):
    return _dropout(xp, data, ratio, False, None, _outputs, bool)


@op("Dropout", since=22, dtypes=FLOATS | FLOAT8)
@op("Dropout", since=13, dtypes=FLOATS)
@op("Dropout", since=12, dtypes=FLOATS)
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


# -- normalizations ---------------------------------------------------------------------------

def _per_channel(param, rank: int):
    """A (C,) parameter shaped to broadcast over (N, C, D1, ..., Dk)."""
    return param.reshape((-1,) + (1,) * (rank - 2))


def axes_sum(xp, x, axes, keepdims=False):
    """``x.sum(axis=axes)``. On a GPU, a (N, C, ...) array summed over every axis but the
    channels' is summed over its contiguous spatial axis first (N * C sums) and over the batch
    second: CuPy reduces over axes that are not innermost with one thread block per output, 64
    blocks for 64 channels, and ResNet-18's training BatchNormalization took 1.9 ms a call at
    batch 32 on an H200 that way."""
    axes = tuple(axes)
    if xp is np or x.ndim < 3 or axes != channel_axes(x.ndim):
        return x.sum(axis=axes, keepdims=keepdims)
    batch, channels = x.shape[:2]
    total = x.reshape(batch, channels, -1).sum(axis=2).sum(axis=0)
    return total.reshape((1, channels) + (1,) * (x.ndim - 2)) if keepdims else total


def axes_mean(xp, x, axes, keepdims=False):
    """``x.mean(axis=axes)``, on a GPU through :func:`axes_sum`."""
    if xp is np:
        return x.mean(axis=tuple(axes), keepdims=keepdims)
    count = prod(x.shape[a] for a in axes)
    return axes_sum(xp, x, axes, keepdims) / max(count, 1)


def channel_axes(rank: int) -> tuple:
    """A (N, C, ...) array's axes but the channels'."""
    return (0,) + tuple(range(2, rank))


def _standardize(xp, x, axes, epsilon):
    """(x - mean) / sqrt(var + epsilon) over ``axes``; also returns mean and 1/std."""
    mean = axes_mean(xp, x, axes, keepdims=True)
    centered = x - mean
    variance = axes_mean(xp, centered * centered, axes, keepdims=True)
    inv_std = 1.0 / xp.sqrt(variance + epsilon)
    return centered * inv_std, mean, inv_std


# -- BatchNormalization ------------------------------------------------------------------------

def _batch_norm(xp, X, scale, B, mean, var, epsilon, param_shape):
    x = widen(X)
    inv_std = 1.0 / xp.sqrt(widen(var).reshape(param_shape) + epsilon)
    y = (x - widen(mean).reshape(param_shape)) * inv_std * widen(scale).reshape(param_shape)
    return (y + widen(B).reshape(param_shape)).astype(X.dtype, copy=False)


def _batch_statistics(xp, X):
    """Per-channel mean and population variance of a (N, C, ...) batch."""
    axes = channel_axes(X.ndim)
    x = widen(X)
    if xp is np:
        return xp.mean(x, axis=axes), xp.var(x, axis=axes)
    mean = axes_mean(xp, x, axes, keepdims=True)
    centered = x - mean
    return mean.reshape(-1), axes_mean(xp, centered * centered, axes)


def _running(previous, current, momentum):
    return (previous * momentum + current * (1.0 - momentum)).astype(previous.dtype, copy=False)


def _batch_norm_training(xp, X, scale, B, mean, var, epsilon, momentum):
    """Normalize with the batch's statistics; return Y, the updated running mean and var,
    and the batch mean and var."""
    batch_mean, batch_var = _batch_statistics(xp, X)
    shape = (-1,) + (1,) * (X.ndim - 2)
    y = _batch_norm(xp, X, scale, B, batch_mean, batch_var, epsilon, shape)
    return (y, _running(mean, batch_mean, momentum), _running(var, batch_var, momentum),
            batch_mean.astype(mean.dtype), batch_var.astype(var.dtype))


@op("BatchNormalization", since=7, dtypes=FLOATS)
def batch_normalization_7(xp, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9,
                          spatial=1, _outputs=1):
    # Before opset 14 training mode is signalled by asking for more than Y.
    if _outputs > 1:
        return _batch_norm_training(xp, X, scale, B, mean, var, epsilon, momentum)[:_outputs]
    # spatial=0: statistics per activation, shaped (C, D1, ..., Dk)
    shape = (-1,) + (1,) * (X.ndim - 2) if spatial else X.shape[1:]
    return _batch_norm(xp, X, scale, B, mean, var, epsilon, shape)


@op("BatchNormalization", since=6, dtypes=FLOATS)
def batch_normalization_6(xp, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9,
                          spatial=1, is_test=0, _outputs=1):
    # is_test only forbade the training outputs; asking for them is what selects training.
    return batch_normalization_7(xp, X, scale, B, mean, var, epsilon=epsilon,
                                 momentum=momentum, spatial=spatial, _outputs=_outputs)


@op("BatchNormalization", since=9, dtypes=FLOATS)
def batch_normalization_9(xp, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9,
                          _outputs=1):
    return batch_normalization_7(xp, X, scale, B, mean, var, epsilon=epsilon,
                                 momentum=momentum, _outputs=_outputs)


@op("BatchNormalization", since=15, dtypes=FLOATS)
@op("BatchNormalization", since=14, dtypes=FLOATS)
def batch_normalization(xp, X, scale, B, input_mean, input_var, *, epsilon=1e-5,
                        momentum=0.9, training_mode=0, _outputs=1):
    if training_mode:
        outputs = _batch_norm_training(xp, X, scale, B, input_mean, input_var, epsilon,
                                       momentum)
        return outputs[0] if _outputs == 1 else outputs[:_outputs]
    shape = (-1,) + (1,) * (X.ndim - 2)
    y = _batch_norm(xp, X, scale, B, input_mean, input_var, epsilon, shape)
    return y if _outputs == 1 else (y, input_mean, input_var)[:_outputs]


def _infer_batch_norm(X: TensorType, scale, B, mean: TensorType, var: TensorType, *,
                      spatial=1, **_):
    if spatial and X.shape is not None and len(X.shape) >= 2:  # spatial=0: per activation
        for name, param in (("scale", scale), ("B", B), ("mean", mean), ("var", var)):
            require_shape(f"BatchNormalization's {name}", param, (X.shape[1],))
    # the statistics outputs keep the inputs' types, not their values: in training mode
    # they are the updated running and the batch statistics
    mean, var = without_value(mean), without_value(var)
    return [TensorType(X.dtype, X.shape), mean, var, mean, var]


for _handle in (batch_normalization_6, batch_normalization_7, batch_normalization_9,
                batch_normalization):
    _handle.infer(_infer_batch_norm)


# -- Instance, Layer, Group and RMS normalization ------------------------------------------------

@op("InstanceNormalization", since=22, dtypes=FLOATS)
@op("InstanceNormalization", since=6, dtypes=FLOATS)
def instance_normalization(xp, input, scale, B, *, epsilon=1e-5):
    normalized, _, _ = _standardize(xp, widen(input), tuple(range(2, input.ndim)), epsilon)
    y = normalized * _per_channel(widen(scale), input.ndim) + _per_channel(widen(B), input.ndim)
    return y.astype(input.dtype, copy=False)


@instance_normalization.infer
def _(input: TensorType, scale, B, **_):
    _require_per_channel("InstanceNormalization", input, scale, B)
    return same_as_input(input)


def _require_per_channel(op_type: str, X: TensorType, *params, count=None) -> None:
    """Each of ``params`` (scale, bias) holds one value per channel of X, or ``count``."""
    if X.shape is None or len(X.shape) < 2:
        return
    expected = (X.shape[1] if count is None else count,)
    for name, param in zip(("scale", "bias"), params):
        require_shape(f"{op_type}'s {name}", param, expected)


@op("LayerNormalization", since=17, dtypes=FLOATS)
@op("LayerNormalization", since=1, dtypes=FLOATS)  # onnxruntime's, older exporters write it
def layer_normalization(xp, X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1,
                        _outputs=1):
    stash = to_numpy_dtype(stash_type)
    normalized, mean, inv_std = _standardize(
        xp, X.astype(stash, copy=False), _trailing_axes(axis, X.ndim), epsilon)
    y = normalized.astype(X.dtype, copy=False) * Scale
    if B is not None:
        y = y + B
    y = y.astype(X.dtype, copy=False)
    if _outputs == 1:
        return y
    return (y, mean.astype(stash, copy=False), inv_std.astype(stash, copy=False))[:_outputs]


@layer_normalization.infer
def _(X: TensorType, Scale=None, B=None, *_, axis=-1, stash_type=1, **__):
    stats_shape = None
    if X.shape is not None:
        start = normalize_axis(axis, len(X.shape))
        stats_shape = tuple(X.shape[:start]) + (1,) * (len(X.shape) - start)
        for param in (Scale, B):  # the kernel multiplies and adds them to X's shape
            if isinstance(param, TensorType) and param.shape is not None:
                broadcast_shapes(X.shape, param.shape)
    stash = to_numpy_dtype(stash_type)
    return [TensorType(X.dtype, X.shape), TensorType(stash, stats_shape),
            TensorType(stash, stats_shape)]


def _group_norm(xp, X, scale, bias, num_groups, epsilon, stash):
    """Normalize each group of channels of each instance; scale/bias are per channel."""
    if num_groups is None:
        raise ValueError("GroupNormalization needs the 'num_groups' attribute")
    grouped = X.astype(stash, copy=False).reshape(X.shape[0], num_groups, -1)
    normalized, _, _ = _standardize(xp, grouped, (2,), epsilon)
    normalized = normalized.reshape(X.shape).astype(X.dtype, copy=False)
    y = normalized * _per_channel(scale, X.ndim) + _per_channel(bias, X.ndim)
    return y.astype(X.dtype, copy=False)


@op("GroupNormalization", since=18, dtypes=FLOATS)
def group_normalization_18(xp, X, scale, bias, *, num_groups=None, epsilon=1e-5):
    # Opset 18 gives scale and bias per group; spread them over each group's channels.
    channels_per_group = X.shape[1] // num_groups
    return _group_norm(xp, X, xp.repeat(scale, channels_per_group),
                       xp.repeat(bias, channels_per_group), num_groups, epsilon,
                       widen(X).dtype)


@op("GroupNormalization", since=21, dtypes=FLOATS)
def group_normalization(xp, X, scale, bias, *, num_groups=None, epsilon=1e-5, stash_type=1):
    return _group_norm(xp, X, scale, bias, num_groups, epsilon, to_numpy_dtype(stash_type))


def _require_groups(X: TensorType, num_groups) -> None:
    if num_groups is None:
        raise ValueError("GroupNormalization needs the 'num_groups' attribute")
    channels = None if X.shape is None or len(X.shape) < 2 else X.shape[1]
    if isinstance(channels, int) and (num_groups <= 0 or channels % num_groups):
        raise ValueError(f"GroupNormalization: {channels} channels do not split into "
                         f"num_groups={num_groups}")


@group_normalization_18.infer
def _(X: TensorType, scale, bias, *, num_groups=None, **_):
    _require_groups(X, num_groups)
    _require_per_channel("GroupNormalization-18", X, scale, bias, count=num_groups)
    return same_as_input(X)


@group_normalization.infer
def _(X: TensorType, scale, bias, *, num_groups=None, **_):
    _require_groups(X, num_groups)
    _require_per_channel("GroupNormalization-21", X, scale, bias)
    return same_as_input(X)


@op("RMSNormalization", since=23, dtypes=FLOATS)
def rms_normalization(xp, X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    x = X.astype(to_numpy_dtype(stash_type), copy=False)
    mean_square = xp.mean(x * x, axis=_trailing_axes(axis, X.ndim), keepdims=True)
    normalized = (x / xp.sqrt(mean_square + epsilon)).astype(X.dtype, copy=False)
    return (normalized * scale).astype(scale.dtype, copy=False)


@rms_normalization.infer
def _(X: TensorType, scale: TensorType, **_):
    if X.shape is not None and scale.shape is not None:
        broadcast_shapes(X.shape, scale.shape)  # the kernel multiplies it to X's shape
    return [TensorType(scale.dtype, X.shape)]


# -- LRN, LpNormalization, MeanVarianceNormalization -------------------------------------------

@op("LRN", since=13, dtypes=FLOATS)
@op("LRN", since=1, dtypes=FLOATS)
def lrn(xp, X, *, size=None, alpha=1e-4, beta=0.75, bias=1.0):
    """Each element divided by a power of the sum of squares over ``size`` nearby channels."""
    if size is None:
        raise ValueError("LRN needs the 'size' attribute")
    x = widen(X)
    before = (size - 1) // 2  # the window is [c - floor((size-1)/2), c + ceil((size-1)/2)]
    padding = [(0, 0), (before, size - 1 - before)] + [(0, 0)] * (X.ndim - 2)
    squares = xp.pad(x * x, padding)
    channels = X.shape[1]
    square_sum = sum(squares[:, k:k + channels] for k in range(size))
    return (x / (bias + (alpha / size) * square_sum) ** beta).astype(X.dtype, copy=False)


@op("LpNormalization", since=22, dtypes=FLOATS)
@op("LpNormalization", since=1, dtypes=FLOATS)
def lp_normalization(xp, input, *, axis=-1, p=2):
    x = widen(input)
    return (x / lp_norm(xp, x, axis, p)).astype(input.dtype, copy=False)


def lp_norm(xp, x, axis, p):
    """||x||_p along ``axis`` (kept), with an all-zero slice's 0 replaced by 1: dividing its
    zeros by 1 keeps them zero (the forward and its gradient share this)."""
    if p == 1:
        norm = xp.sum(xp.abs(x), axis=axis, keepdims=True)
    elif p == 2:
        norm = xp.sqrt(xp.sum(x * x, axis=axis, keepdims=True))
    else:
        raise ValueError(f"LpNormalization supports p=1 or p=2, got p={p}")
    return xp.where(norm == 0, 1, norm)


@op("MeanVarianceNormalization", since=13, dtypes=FLOATS)
@op("MeanVarianceNormalization", since=9, dtypes=FLOATS)
def mean_variance_normalization(xp, X, *, axes=(0, 2, 3)):
    x = widen(X)
    axes = tuple(normalize_axis(a, X.ndim) for a in axes)
    mean = xp.mean(x, axis=axes, keepdims=True)
    variance = xp.mean(x * x, axis=axes, keepdims=True) - mean * mean
    # E[x^2] - E[x]^2 can round below zero; the spec's 1e-9 keeps the divisor positive
    std = xp.sqrt(xp.maximum(variance, 0))
    return ((x - mean) / (std + 1e-9)).astype(X.dtype, copy=False)


for _handle in (lrn, lp_normalization, mean_variance_normalization):
    _handle.infer(same_as_input)
