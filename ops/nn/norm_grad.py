"""Gradients of the normalizations (nn.py): BatchNormalization (inference and training),
LayerNormalization, InstanceNormalization, GroupNormalization, LRN and LpNormalization.

The statistics-based ones share one identity. With x^ = (x - mean) inv_std over some axes and
g = dY times the per-element scale,

    dX = inv_std (g - mean(g) - x^ mean(g x^))

(the two means are the paths through the batch mean and variance), while the scale and bias
gradients are sums of dY x^ and dY over the axes their parameter is shared along. The
kernels recompute the statistics from X (one reduction) rather than keep the forward's, so
no forward node has to output more than the model asked for.
See runtime/passes/autodiff.py for the calling convention.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.nn import nn
from mixrt.ops.nn import norm
from mixrt.ops.ir.dtypes import compute_dtype, to_numpy_dtype
from mixrt.ops.conv.conv_grad import forwarded, optional_input
from mixrt.ops.training.grad_support import MIXRT, sum_to_shape
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, normalize_axis


def _standardized_backward(xp, g, x_hat, inv_std, axes):
    """dX of x -> x^ over ``axes`` given g = d loss / d x^."""
    mean_g = norm.axes_mean(xp, g, axes, keepdims=True)
    mean_gx = norm.axes_mean(xp, g * x_hat, axes, keepdims=True)
    return inv_std * (g - mean_g - x_hat * mean_gx)


def _cast(grads, likes):
    """Each gradient in its input's dtype (``likes`` are the inputs, in order)."""
    return tuple(g.astype(like.dtype, copy=False) for g, like in zip(grads, likes))


def _statistics_dtype(X, stash_type):
    """Where a backward recomputes the statistics: X's compute dtype, or the forward's
    stash_type when that is wider (float32 X with stash_type double: x * x of a large x
    overflows float32, and the forward did not)."""
    widened = compute_dtype(X.dtype)
    if stash_type is None:
        return widened
    return np.promote_types(widened, to_numpy_dtype(stash_type))


def _like_x(dY, X, *_, **__):
    return [TensorType(X.dtype, X.shape)]


# -- BatchNormalization -------------------------------------------------------------------

@op("BatchNormalizationGrad", since=1, domain=MIXRT)
def batch_norm_grad(xp, dY, X, scale, mean=None, var=None, *, epsilon=1e-5, spatial=1,
                    training_mode=0, _outputs=3):
    """dX, dscale, dB (and in inference mode d mean, d var: the first _outputs of them).

    Training mode normalizes with the batch's own statistics, so dX flows through them;
    inference mode is an affine map of X with the running statistics as constants."""
    x, dy = nn.widen(X), nn.widen(dY)
    per_activation = not spatial and not training_mode  # spatial=0: stats per (C, D1, ...)
    axes = (0,) if per_activation else norm.channel_axes(X.ndim)
    shape = (1,) + tuple(X.shape[1:]) if per_activation else (1, -1) + (1,) * (X.ndim - 2)
    if training_mode:
        x_hat, _, inv_std = norm._standardize(xp, x, axes, epsilon)
    else:
        inv_std = 1.0 / xp.sqrt(nn.widen(var).reshape(shape) + epsilon)
        x_hat = (x - nn.widen(mean).reshape(shape)) * inv_std
    gamma = nn.widen(scale).reshape(shape)
    d_bias = norm.axes_sum(xp, dy, axes, keepdims=True)
    d_scale = norm.axes_sum(xp, dy * x_hat, axes, keepdims=True)
    if training_mode:
        dx = _standardized_backward(xp, dy * gamma, x_hat, inv_std, axes)
        grads = (dx, d_scale.reshape(scale.shape), d_bias.reshape(scale.shape))
        return _cast(grads, (X, scale, scale))[:_outputs]
    d_mean = -d_bias * gamma * inv_std
    d_var = -0.5 * d_scale * gamma * inv_std * inv_std
    grads = (dy * gamma * inv_std, d_scale, d_bias, d_mean, d_var)
    grads = grads[:1] + tuple(g.reshape(scale.shape) for g in grads[1:])
    return _cast(grads, (X, scale, scale, mean, var))[:_outputs]


@batch_norm_grad.infer
def _(dY, X, scale, mean=None, var=None, *, _outputs=3, **_):
    likes = (X, scale, scale, mean, var)[:_outputs]
    return [TensorType(t.dtype, t.shape) for t in likes]


def _batch_norm_gradient(b, node, dy, training: bool, spatial: int = 1):
    """Running mean and var outputs only feed the next step's statistics: not differentiable.
    Neither are the statistics inputs in training mode (the batch's replace them)."""
    if dy[0] is None:
        return []
    x, scale, _, mean, var = node.inputs[:5]
    attributes = forwarded(node, ("epsilon",))
    if training:
        return [*b.emit("BatchNormalizationGrad", dy[0], x, scale, domain=MIXRT, outputs=3,
                        training_mode=1, **attributes), None, None]
    return list(b.emit("BatchNormalizationGrad", dy[0], x, scale, mean, var, domain=MIXRT,
                       outputs=5, spatial=spatial, **attributes))


def _batch_norm_by_outputs(b, node, dy):
    """Before opset 14 training mode is asking for more outputs than Y (as the forward)."""
    return _batch_norm_gradient(b, node, dy, training=len(node.outputs) > 1,
                                spatial=int(node.attributes.get("spatial", 1)))


for _legacy in (norm.batch_normalization_6, norm.batch_normalization_7,
                norm.batch_normalization_9):
    _legacy.grad(_batch_norm_by_outputs)


@norm.batch_normalization.grad
def _(b, node, dy):
    return _batch_norm_gradient(b, node, dy,
                                training=bool(node.attributes.get("training_mode", 0)))


# -- LayerNormalization -------------------------------------------------------------------

@op("LayerNormalizationGrad", since=1, domain=MIXRT)
def layer_norm_grad(xp, dY, X, Scale, B=None, dMean=None, dInvStdDev=None, *, axis=-1,
                    epsilon=1e-5, stash_type=None, _outputs=2):
    """dX, dScale (and dB when B is given), each reduced to its input's shape. dY may be
    missing when only the Mean/InvStdDev outputs were used; their gradients add to dX.
    Computes in X's widened dtype, or the forward's stash_type where that is wider."""
    dtype = _statistics_dtype(X, stash_type)
    x = X.astype(dtype, copy=False)
    axes = tuple(range(normalize_axis(axis, X.ndim), X.ndim))
    x_hat, _, inv_std = norm._standardize(xp, x, axes, epsilon)
    dy = xp.zeros(x.shape, dtype=dtype) if dY is None else dY.astype(dtype, copy=False)
    dx = _standardized_backward(xp, dy * Scale.astype(dtype, copy=False), x_hat, inv_std,
                                axes)
    count = x.size // inv_std.size
    if dMean is not None:
        dx = dx + dMean.astype(dtype, copy=False) / count
    if dInvStdDev is not None:  # d inv_std / dx = -inv_std^2 x^ / count
        dx = dx - dInvStdDev.astype(dtype, copy=False) * inv_std * inv_std * x_hat / count
    grads = (dx, sum_to_shape(xp, dy * x_hat, Scale.shape))
    if B is not None:
        grads += (sum_to_shape(xp, dy, B.shape),)
    return _cast(grads, (X, Scale, B))[:_outputs]


@layer_norm_grad.infer
def _(dY, X, Scale, B=None, *_, _outputs=2, **__):
    return [TensorType(t.dtype, t.shape) for t in (X, Scale, B)[:_outputs]]


@norm.layer_normalization.grad
def _(b, node, dy):
    x, scale = node.inputs[:2]
    bias = optional_input(node, 2)
    d_mean, d_inv_std = (dy[k] if len(dy) > k else None for k in (1, 2))
    grads = b.emit("LayerNormalizationGrad", dy[0], x, scale, bias, d_mean, d_inv_std,
                   domain=MIXRT, outputs=3 if bias else 2,
                   **forwarded(node, ("axis", "epsilon", "stash_type")))
    return list(grads)


# -- InstanceNormalization and GroupNormalization -----------------------------------------

def _grouped_backward(xp, dY, X, scale, groups: int, epsilon, stash_type=None):
    """dX and the per-channel d scale, d bias of a normalization over each (instance, group
    of channels) with a per-channel affine (InstanceNormalization: a group per channel)."""
    n, c = X.shape[:2]
    shape = (n, groups, c // groups, -1)
    dtype = _statistics_dtype(X, stash_type)
    x, dy = (t.astype(dtype, copy=False).reshape(shape) for t in (X, dY))
    x_hat, _, inv_std = norm._standardize(xp, x, (2, 3), epsilon)
    gamma = scale.astype(dtype, copy=False).reshape(1, groups, c // groups, 1)
    dx = _standardized_backward(xp, dy * gamma, x_hat, inv_std, (2, 3))
    d_scale = (dy * x_hat).sum(axis=(0, 3)).reshape(c)
    return dx.reshape(X.shape), d_scale, dy.sum(axis=(0, 3)).reshape(c)


@op("InstanceNormalizationGrad", since=1, domain=MIXRT)
def instance_norm_grad(xp, dY, X, scale, *, epsilon=1e-5):
    """dX, dscale, dB of InstanceNormalization."""
    grads = _grouped_backward(xp, dY, X, scale, X.shape[1], epsilon)
    return _cast(grads, (X, scale, scale))


@instance_norm_grad.infer
def _(dY, X, scale, **_):
    return [TensorType(t.dtype, t.shape) for t in (X, scale, scale)]


@norm.instance_normalization.grad
def _(b, node, dy):
    x, scale = node.inputs[:2]
    return list(b.emit("InstanceNormalizationGrad", dy[0], x, scale, domain=MIXRT, outputs=3,
                       **forwarded(node, ("epsilon",))))


@op("GroupNormalizationGrad", since=1, domain=MIXRT)
def group_norm_grad(xp, dY, X, scale, *, num_groups=None, epsilon=1e-5, per_group=0,
                    stash_type=None):
    """dX, dscale, dbias of GroupNormalization; ``per_group`` for opset 18, whose scale and
    bias hold one value per group (spread over its channels by the forward)."""
    groups = int(num_groups)
    per_channel = xp.repeat(scale, X.shape[1] // groups) if per_group else scale
    dx, d_scale, d_bias = _grouped_backward(xp, dY, X, per_channel, groups, epsilon,
                                            stash_type)
    if per_group:
        d_scale, d_bias = (g.reshape(groups, -1).sum(axis=1) for g in (d_scale, d_bias))
    return _cast((dx, d_scale, d_bias), (X, scale, scale))


@group_norm_grad.infer
def _(dY, X, scale, **_):
    return [TensorType(t.dtype, t.shape) for t in (X, scale, scale)]


def _group_norm_gradient(per_group: int):
    def grad(b, node, dy):
        x, scale = node.inputs[:2]
        return list(b.emit("GroupNormalizationGrad", dy[0], x, scale, domain=MIXRT,
                           outputs=3, per_group=per_group,
                           **forwarded(node, ("num_groups", "epsilon", "stash_type"))))
    return grad


norm.group_normalization_18.grad(_group_norm_gradient(1))
norm.group_normalization.grad(_group_norm_gradient(0))


# -- LRN and LpNormalization --------------------------------------------------------------

def _channel_window_sum(xp, values, before: int, after: int):
    """Sum over channels c - before .. c + after of ``values`` (N, C, ...), zeros outside."""
    channels = values.shape[1]
    padding = [(0, 0), (before, after)] + [(0, 0)] * (values.ndim - 2)
    padded = xp.pad(values, padding)
    return sum(padded[:, k:k + channels] for k in range(before + after + 1))


@op("LRNGrad", since=1, domain=MIXRT)
def lrn_grad(xp, dY, X, *, size=None, alpha=1e-4, beta=0.75, bias=1.0):
    """dX of y = x d^-beta with d = bias + alpha/size * (window sum of x^2): the direct term
    plus, through each d that x's square entered, -2 alpha beta / size x dY x d^(-beta-1)
    summed over the windows holding x (the forward window mirrored)."""
    size = int(size)
    before = (size - 1) // 2
    after = size - 1 - before
    x, dy = nn.widen(X), nn.widen(dY)
    d = bias + (alpha / size) * _channel_window_sum(xp, x * x, before, after)
    through_d = _channel_window_sum(xp, dy * x * d ** (-beta - 1), after, before)
    dx = dy * d ** -beta - (2 * alpha * beta / size) * x * through_d
    return dx.astype(X.dtype, copy=False)


@norm.lrn.grad
def _(b, node, dy):
    return [b.emit("LRNGrad", dy[0], node.inputs[0], domain=MIXRT,
                   **forwarded(node, ("size", "alpha", "beta", "bias")))]


@op("LpNormalizationGrad", since=1, domain=MIXRT)
def lp_normalization_grad(xp, dY, X, *, axis=-1, p=2):
    """dX of y = x / ||x||_p along ``axis``: (dY - d||x||/dx sum(dY y)) / ||x||, where
    d||x||/dx is y for p=2 and sign(x) for p=1. An all-zero slice (divided by 1 in the
    forward) passes dY through."""
    x, dy = nn.widen(X), nn.widen(dY)
    length = norm.lp_norm(xp, x, axis, p)
    y = x / length
    direction = y if p == 2 else xp.sign(x)
    dx = (dy - direction * xp.sum(dy * y, axis=axis, keepdims=True)) / length
    return dx.astype(X.dtype, copy=False)


for _unary in (lrn_grad, lp_normalization_grad):
    _unary.infer(_like_x)


@norm.lp_normalization.grad
def _(b, node, dy):
    return [b.emit("LpNormalizationGrad", dy[0], node.inputs[0], domain=MIXRT,
                   **forwarded(node, ("axis", "p")))]
