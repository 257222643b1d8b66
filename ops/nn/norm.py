"""The normalizations: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LRN, LpNormalization and MeanVarianceNormalization.

Half-precision inputs are computed in float32 and the result cast back. ``stash_type`` (an
ONNX element type, default 1 = float32) is the precision a normalization computes its
statistics in; the normalized values are cast back to the input's type before the affine
step.
"""

from __future__ import annotations

from math import prod

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS, to_numpy_dtype
from mixrt.ops.ir.registry import IN_PLACE, op
from mixrt.ops.ir.types import (TensorType, broadcast_shapes, normalize_axis, require_shape,
                                same_as_input, without_value)
from mixrt.ops.nn.nn import _trailing_axes, widen

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
    # a branch, not a GPU kernel: both sums are the same sum; the normalizations and their
    # gradients share this helper
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
    if xp is np:  # the same statistics; on a GPU through axes_sum's reduction order
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


@op("BatchNormalization", since=7, dtypes=FLOATS, memory=IN_PLACE)
def batch_normalization_7(xp, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9,
                          spatial=1, _outputs=1):
    # Before opset 14 training mode is signalled by asking for more than Y.
    if _outputs > 1:
        return _batch_norm_training(xp, X, scale, B, mean, var, epsilon, momentum)[:_outputs]
    # spatial=0: statistics per activation, shaped (C, D1, ..., Dk)
    shape = (-1,) + (1,) * (X.ndim - 2) if spatial else X.shape[1:]
    return _batch_norm(xp, X, scale, B, mean, var, epsilon, shape)


@op("BatchNormalization", since=6, dtypes=FLOATS, memory=IN_PLACE)
def batch_normalization_6(xp, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9,
                          spatial=1, is_test=0, _outputs=1):
    # is_test only forbade the training outputs; asking for them is what selects training.
    return batch_normalization_7(xp, X, scale, B, mean, var, epsilon=epsilon,
                                 momentum=momentum, spatial=spatial, _outputs=_outputs)


@op("BatchNormalization", since=9, dtypes=FLOATS, memory=IN_PLACE)
def batch_normalization_9(xp, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9,
                          _outputs=1):
    return batch_normalization_7(xp, X, scale, B, mean, var, epsilon=epsilon,
                                 momentum=momentum, _outputs=_outputs)


@op("BatchNormalization", since=15, dtypes=FLOATS, memory=IN_PLACE)
@op("BatchNormalization", since=14, dtypes=FLOATS, memory=IN_PLACE)
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

@op("LRN", since=13, dtypes=FLOATS, memory=IN_PLACE)
@op("LRN", since=1, dtypes=FLOATS, memory=IN_PLACE)
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
