"""The normalizations written in ops that have gradients (``@op.expansion``), for gradients
of gradients.

Their first-order backward is a fused kernel (norm_grad.py: one pass, statistics recomputed
from X) that has no gradient of its own. When a backward is to be differentiated again
(``autograd.grad(..., create_graph=True)``, ``gradient_graph(differentiable_backward=True)``)
autodiff instead differentiates the forward as written here: ReduceMean, Sub, Mul, Sqrt and
Reciprocal, whose gradients are ordinary ops again. RMSNormalization and
MeanVarianceNormalization have no fused kernel: their expansion is their first-order gradient.

Each expansion computes in the precision its forward does (``_computed_in``): the stash_type
for the statistics of LayerNormalization, GroupNormalization-21 and RMSNormalization, float32
for half-precision inputs elsewhere. Written in X's own dtype a float16 RMSNormalization's
x * x overflows from |x| = 256 and its gradient comes out as zeros. They return one name per
forward output (None for the running statistics, which carry no gradient).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.nn import norm
from mixrt.ops.conv.conv_grad import optional_input
from mixrt.ops.ir.dtypes import compute_dtype, to_numpy_dtype
from mixrt.ops.training.grad_support import widened
from mixrt.ops.ir.types import normalize_axis


def _computed_in(b, x: str, precision=None):
    """The precision the forward computes ``x``'s normalization in: ``precision`` (a
    stash_type's dtype) when given, else float32 for half-precision inputs; None when the
    dtype of ``x`` is unknown (the expansion then stays in whatever dtype it has)."""
    if b.dtype(x) is None:
        return None
    return np.dtype(precision) if precision is not None else compute_dtype(b.dtype(x))


def _stash(node):
    return to_numpy_dtype(int(node.attributes.get("stash_type", 1)))


def _standardized(b, x: str, axes: list[int], epsilon: float):
    """(x^, mean, 1/std) of ``x`` over ``axes`` (kept as size-1 dims), as norm._standardize."""
    mean = b.emit("ReduceMean", x, axes=axes, keepdims=1)
    centered = b.emit("Sub", x, mean)
    variance = b.emit("ReduceMean", b.mul(centered, centered), axes=axes, keepdims=1)
    inv_std = _inverse_root(b, variance, epsilon)
    return b.mul(centered, inv_std), mean, inv_std


def _inverse_root(b, value: str, epsilon: float) -> str:
    """1 / sqrt(value + epsilon)."""
    shifted = b.emit("Add", value, b.constant(epsilon, like=value))
    return b.emit("Reciprocal", b.emit("Sqrt", shifted))


def _affine(b, normalized: str, scale: str, bias: str | None, shape: list[int] | None) -> str:
    """normalized * scale + bias, the parameters reshaped to ``shape`` first when given."""
    if shape is not None:
        scale = b.emit("Reshape", scale, b.ints(shape))
        bias = None if bias is None else b.emit("Reshape", bias, b.ints(shape))
    y = b.mul(normalized, scale)
    return y if bias is None else b.emit("Add", y, bias)


def _per_channel(rank: int) -> list[int]:
    """A (C,) parameter's shape broadcasting over (N, C, D1, ...)."""
    return [-1] + [1] * (rank - 2)


def _epsilon(node) -> float:
    return float(node.attributes.get("epsilon", 1e-5))


# -- BatchNormalization -------------------------------------------------------------------

def _batch_norm(b, node, training: bool, spatial: int = 1):
    x = node.inputs[0]
    precision = _computed_in(b, x)
    x, scale, bias, mean, var = (b.cast(v, precision) for v in node.inputs[:5])
    rank = b.known_rank(node, x)
    if training:
        axes = [0] + list(range(2, rank))
        normalized, _, _ = _standardized(b, x, axes, _epsilon(node))
        y = _affine(b, normalized, scale, bias, _per_channel(rank))
        return [b.cast(y, b.dtype(node.inputs[0]))] + [None] * (len(node.outputs) - 1)
    # inference: an affine map of X with the running statistics as inputs that have gradients
    shape = _per_channel(rank) if spatial else None  # spatial=0: (C, D1, ...) broadcasts as is
    if shape is not None:
        mean, var = (b.emit("Reshape", v, b.ints(shape)) for v in (mean, var))
    normalized = b.mul(b.emit("Sub", x, mean), _inverse_root(b, var, _epsilon(node)))
    y = _affine(b, normalized, scale, bias, shape)
    return [b.cast(y, b.dtype(node.inputs[0]))] + [None] * (len(node.outputs) - 1)


def _batch_norm_by_outputs(b, node):
    return _batch_norm(b, node, training=len(node.outputs) > 1,
                       spatial=int(node.attributes.get("spatial", 1)))


for _legacy in (norm.batch_normalization_6, norm.batch_normalization_7,
                norm.batch_normalization_9):
    _legacy.expansion(_batch_norm_by_outputs)


@norm.batch_normalization.expansion
def _(b, node):
    return _batch_norm(b, node, training=bool(node.attributes.get("training_mode", 0)))


# -- LayerNormalization, InstanceNormalization, GroupNormalization -------------------------

@norm.layer_normalization.expansion
def _(b, node):
    """Statistics in the stash_type, the normalized values cast back to X's dtype before the
    affine step, as the forward does."""
    x, scale = node.inputs[:2]
    rank = b.known_rank(node, x)
    axes = list(range(normalize_axis(int(node.attributes.get("axis", -1)), rank), rank))
    stash = _computed_in(b, x, _stash(node))
    normalized, mean, inv_std = _standardized(b, b.cast(x, stash), axes, _epsilon(node))
    normalized = b.cast(normalized, b.dtype(x))
    y = _affine(b, normalized, scale, optional_input(node, 2), None)
    return [y, mean, inv_std][:len(node.outputs)]


@norm.instance_normalization.expansion
def _(b, node):
    x = node.inputs[0]
    precision = _computed_in(b, x)
    wide, scale, bias = (b.cast(v, precision) for v in node.inputs[:3])
    rank = b.known_rank(node, x)
    normalized, _, _ = _standardized(b, wide, list(range(2, rank)), _epsilon(node))
    y = _affine(b, normalized, scale, bias, _per_channel(rank))
    return [b.cast(y, b.dtype(x))]


def _group_norm(per_group: bool):
    """Normalized as (N, G, -1) in the stash precision (opset 21's stash_type, X's widened
    dtype at opset 18) and cast back to X's dtype; then the per-group parameters (opset 18)
    applied there, or the per-channel ones (opset 21) after the reshape back."""
    def expand(b, node):
        x, scale, bias = node.inputs[:3]
        groups = int(node.attributes["num_groups"])
        stash = _computed_in(b, x, None if per_group else _stash(node))
        grouped = b.emit("Reshape", b.cast(x, stash), b.ints([0, groups, -1]))
        normalized, _, _ = _standardized(b, grouped, [2], _epsilon(node))
        normalized = b.cast(normalized, b.dtype(x))
        if per_group:
            y = _affine(b, normalized, scale, bias, [groups, 1])
            return [b.emit("Reshape", y, b.emit("Shape", x))]
        normalized = b.emit("Reshape", normalized, b.emit("Shape", x))
        return [_affine(b, normalized, scale, bias, _per_channel(b.known_rank(node, x)))]
    return expand


norm.group_normalization_18.expansion(_group_norm(per_group=True))
norm.group_normalization.expansion(_group_norm(per_group=False))


# -- LRN and LpNormalization --------------------------------------------------------------

@norm.lrn.expansion
@widened
def _(b, node):
    """y = x (bias + alpha / size * the sum of x^2 over the ``size`` channels around)^-beta:
    the channel window is ``size`` slices of the zero-padded squares, summed."""
    x = node.inputs[0]
    size = int(node.attributes["size"])
    alpha, beta, bias = (float(node.attributes.get(k, d)) for k, d in
                         (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    rank = b.known_rank(node, x)
    before = (size - 1) // 2
    pads = [0] * (2 * rank)
    pads[1], pads[rank + 1] = before, size - 1 - before
    padded = b.emit("Pad", b.mul(x, x), b.ints(pads))
    windows = []
    for k in range(size):
        end = k - (size - 1) if k < size - 1 else 2**62  # the padded axis' end, less the rest
        windows.append(b.emit("Slice", padded, b.ints([k]), b.ints([end]), b.ints([1])))
    total = b.accumulate(windows)
    d = b.emit("Add", b.mul(total, b.constant(alpha / size, like=x)), b.constant(bias, like=x))
    return [b.mul(x, b.emit("Pow", d, b.constant(-beta, like=x)))]


@norm.lp_normalization.expansion
@widened
def _(b, node):
    """x / ||x||_p along ``axis``; an all-zero slice is divided by 1, replaced before the
    square root so that no infinite derivative meets the zero that masks it."""
    p = int(node.attributes.get("p", 2))
    if p not in (1, 2):
        return None
    x = node.inputs[0]
    axes = b.ints([int(node.attributes.get("axis", -1))])
    summed = b.emit("ReduceSum", b.mul(x, x) if p == 2 else b.emit("Abs", x), axes,
                    keepdims=1)
    one = b.constant(1.0, like=x)
    safe = b.emit("Where", b.emit("Equal", summed, b.constant(0.0, like=x)), one, summed)
    norm = b.emit("Sqrt", safe) if p == 2 else safe
    return [b.emit("Div", x, norm)]


# -- RMSNormalization and MeanVarianceNormalization: no fused gradient, the expansion is it -

@norm.rms_normalization.expansion
def _(b, node):
    """x / sqrt(mean(x^2) + epsilon) over the trailing axes from ``axis``, in the
    stash_type, cast back to X's dtype; times scale, in the scale's dtype as the forward
    returns it."""
    x, scale = node.inputs[:2]
    rank = b.known_rank(node, x)
    axes = list(range(normalize_axis(int(node.attributes.get("axis", -1)), rank), rank))
    stashed = b.cast(x, _computed_in(b, x, _stash(node)))
    mean_square = b.emit("ReduceMean", b.mul(stashed, stashed), axes=axes, keepdims=1)
    normalized = b.mul(stashed, _inverse_root(b, mean_square, _epsilon(node)))
    normalized = b.cast(b.cast(normalized, b.dtype(x)), b.dtype(scale))
    return [b.mul(normalized, scale)]


@norm.mean_variance_normalization.expansion
@widened
def _(b, node):
    """(x - mean) / (std + 1e-9) over ``axes`` (default N, H, W), the variance taken as the
    mean square of the centred values (what the forward's E[x^2] - E[x]^2 computes)."""
    x = node.inputs[0]
    axes = [int(a) for a in node.attributes.get("axes", (0, 2, 3))]
    centered = b.emit("Sub", x, b.emit("ReduceMean", x, axes=axes, keepdims=1))
    variance = b.emit("ReduceMean", b.mul(centered, centered), axes=axes, keepdims=1)
    std = b.emit("Add", b.emit("Sqrt", variance), b.constant(1e-9, like=x))
    return [b.emit("Div", centered, std)]
