"""Gradients of the ten Reduce* ops (reduce.py), in both axes conventions, through one
backward kernel: dY is re-expanded over the reduced axes and weighted by the reduction's
derivative, which for most reductions reads the forward input X and output Y. Ties in
ReduceMax/ReduceMin share the gradient equally (PyTorch's amax/amin rule).
See runtime/passes/autodiff.py for the calling convention."""

from __future__ import annotations

import numpy as np

from mixrt.errors import GradientError
from mixrt.ops import reduce as red
from mixrt.ops.dtypes import to_onnx_type
from mixrt.ops.grad_support import MIXRT
from mixrt.ops.registry import op
from mixrt.ops.types import TensorType, normalize_axis


def _expanded(xp, dY, Y, X, axes, keepdims):
    """dY and Y reshaped with the reduced axes kept as 1s, so they broadcast against X."""
    kept = tuple(1 if i in axes else size for i, size in enumerate(X.shape))
    if not keepdims:
        dY, Y = dY.reshape(kept), Y.reshape(kept)
    return dY, Y


def _local_derivative(xp, reduction: str, X, Y, axes):
    """d Y / d X for each element (Y broadcast over the reduced axes)."""
    if reduction == "ReduceSum":
        return None
    if reduction == "ReduceMean":
        count = int(np.prod([X.shape[a] for a in axes])) if axes else 1
        return X.dtype.type(1.0 / count)
    if reduction in ("ReduceMax", "ReduceMin"):
        hit = (X == Y).astype(X.dtype)
        return hit / hit.sum(axis=axes, keepdims=True)
    if reduction == "ReduceProd":
        return Y / X
    if reduction == "ReduceL1":
        return xp.sign(X)
    if reduction == "ReduceL2":
        return X / Y
    if reduction == "ReduceLogSum":
        return 1 / xp.exp(Y)
    if reduction == "ReduceLogSumExp":
        return xp.exp(X - Y)
    if reduction == "ReduceSumSquare":
        return 2 * X
    raise ValueError(f"no gradient for {reduction}")


@op("ReduceGrad", since=1, domain=MIXRT)
def reduce_grad(xp, dY, X, Y, axes=None, *, reduction="ReduceSum", axes_attribute=None,
                keepdims=1, noop_with_empty_axes=0):
    """d loss / d X of ``reduction`` given d loss / d Y; axes come from the forward's
    attribute (``axes_attribute``) or its axes input (``axes``)."""
    listed = axes_attribute if axes is None else [int(a) for a in axes.reshape(-1).tolist()]
    if not listed and noop_with_empty_axes:  # the forward returned X itself
        return dY
    axes = tuple(range(X.ndim)) if not listed else tuple(sorted(
        {normalize_axis(int(a), X.ndim) for a in listed}))
    dY, Y = _expanded(xp, dY, Y, X, axes, keepdims)
    local = _local_derivative(xp, reduction, X, Y, axes)
    grad = xp.broadcast_to(dY, X.shape)
    if local is not None:
        grad = grad * local
    return xp.ascontiguousarray(grad, dtype=X.dtype).reshape(X.shape)  # 0-d stays 0-d


@reduce_grad.infer
def _(dY: TensorType, X: TensorType, *_, **__):
    return [TensorType(X.dtype, X.shape)]


@reduce_grad.grad
def _(b, node, dy):
    """ReduceGrad of ReduceSum or ReduceMean is linear in dY (X and Y give only shapes), so
    its gradient in dY is the reduction again: what differentiating a gradient (autograd's
    create_graph) needs. The other reductions' local derivatives depend on X; their second
    order is not defined here."""
    reduction = node.attributes.get("reduction", "ReduceSum")
    if reduction not in ("ReduceSum", "ReduceMean"):
        raise GradientError(f"the gradient of {reduction}'s gradient is not defined (only "
                            f"ReduceSum's and ReduceMean's are)", op_type=reduction)
    axes = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] else None
    if axes is None and node.attributes.get("axes_attribute"):
        axes = b.ints(node.attributes["axes_attribute"])
    summed = b.emit("ReduceSum", dy[0], axes, keepdims=node.attributes.get("keepdims", 1),
                    noop_with_empty_axes=node.attributes.get("noop_with_empty_axes", 0))
    if reduction == "ReduceMean":
        summed = b.mul(summed, _size_ratio(b, node.inputs[2], node.inputs[1]))
    return [summed, None, None, None]


def _size_ratio(b, part: str, whole: str) -> str:
    """size(part) / size(whole) in ``whole``'s dtype (1 / the count a mean divides by)."""
    to = to_onnx_type(b.dtype(whole) or np.dtype(np.float64))
    sizes = [b.emit("Cast", b.emit("Size", name), to=to) for name in (part, whole)]
    return b.emit("Div", *sizes)


def _reduction_grad(op_type: str, axes_as_input: bool):
    def grad(b, node, dy):
        x, y = node.inputs[0], node.outputs[0]
        axes = node.inputs[1] if axes_as_input and len(node.inputs) > 1 else None
        attributes = {key: node.attributes[key] for key in ("keepdims", "noop_with_empty_axes")
                      if key in node.attributes}
        if not axes_as_input and node.attributes.get("axes") is not None:
            attributes["axes_attribute"] = list(node.attributes["axes"])
        return [b.emit("ReduceGrad", dy[0], x, y, axes or None, domain=MIXRT,
                       reduction=op_type, **attributes)]
    return grad


for _reduction in red.REDUCTIONS:
    _snake = red._snake(_reduction.op_type)
    getattr(red, _snake).grad(_reduction_grad(_reduction.op_type, False))
    getattr(red, _snake + "_axes_input").grad(_reduction_grad(_reduction.op_type, True))
