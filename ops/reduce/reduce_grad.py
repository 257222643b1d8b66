"""Gradients of the ten Reduce* ops (reduce.py), in both axes conventions, through one
backward kernel: dY is re-expanded over the reduced axes and weighted by the reduction's
derivative, which for most reductions reads the forward input X and output Y. Ties in
ReduceMax/ReduceMin share the gradient equally (PyTorch's amax/amin rule).
See runtime/passes/autodiff.py for the calling convention."""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import GradientError
from mixrt.ops.reduce import reduce as red
from mixrt.ops.ir.dtypes import to_onnx_type
from mixrt.ops.training.grad_support import MIXRT, widened
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, normalize_axis


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
    if not listed and noop_with_empty_axes:  # reduced over no axis: elementwise
        axes = ()
    else:
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
    """ReduceGrad is linear in dY: dX = dY re-expanded times a weight w, so its gradient in
    dY sums the incoming gradient times w over the reduced axes again (what differentiating
    a gradient, autograd's create_graph, needs). Where w does not move with X (Sum and Mean:
    constant; Max and Min: the ties' equal shares) that is all of it; ReduceProd's w = Y / X
    adds paths through X and Y. The other reductions are differentiated twice through their
    expansions below."""
    reduction = node.attributes.get("reduction", "ReduceSum")
    if reduction == "ReduceProd":
        return _product_second_order(b, node, dy[0])
    if reduction not in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"):
        raise GradientError(f"the gradient of {reduction}'s gradient is defined through its "
                            f"expansion (differentiable_backward=True)", op_type=reduction)
    incoming = dd = dy[0]
    if reduction in ("ReduceMax", "ReduceMin"):  # w is ReduceGrad of ones
        weights = b.emit("ReduceGrad", b.ones_like(node.inputs[0]), *node.inputs[1:],
                         domain=MIXRT, **node.attributes)
        incoming = b.mul(dd, weights)
    summed = _summed(b, node, incoming)
    if reduction == "ReduceMean":
        summed = b.mul(summed, _size_ratio(b, node.inputs[2], node.inputs[1]))
    return [summed, None, None, None]


def _product_second_order(b, node, dd: str) -> list:
    """dX = dY Y / X (dY and Y spread over the reduced axes, here by ReduceGrad of
    ReduceSum): linear in dY, and in Y; -dY Y / X^2 in X."""
    d_y, x, y = node.inputs[:3]
    rest = node.inputs[3:]
    attributes = {**node.attributes, "reduction": "ReduceSum"}

    def spread(value: str) -> str:
        return b.emit("ReduceGrad", value, x, y, *rest, domain=MIXRT, **attributes)

    over_x = b.emit("Div", dd, x)
    spread_dy, spread_y = spread(d_y), spread(y)
    to_x = b.neg(b.emit("Div", b.mul(over_x, b.mul(spread_dy, spread_y)), x))
    return [_summed(b, node, b.mul(over_x, spread_y)), to_x,
            _summed(b, node, b.mul(over_x, spread_dy)), None]


def _reduced_axes(b, node) -> str | None:
    """The axes a Reduce* node (or the ReduceGrad of one) reduces, as an int64 value: its
    axes input, or its axes attribute; None for all of them."""
    position, attribute = (3, "axes_attribute") if node.op_type == "ReduceGrad" else (1, "axes")
    if len(node.inputs) > position and node.inputs[position]:
        return node.inputs[position]
    listed = node.attributes.get(attribute)
    return b.ints(listed) if listed else None


def _summed(b, node, x: str, keepdims=None) -> str:
    """ReduceSum of ``x`` over the node's axes, with its keepdims (unless given) and
    noop_with_empty_axes."""
    attributes = _reduce_attributes(node)
    if keepdims is not None:
        attributes["keepdims"] = keepdims
    return b.emit("ReduceSum", x, _reduced_axes(b, node), **attributes)


def _reduce_attributes(node) -> dict:
    return {"keepdims": node.attributes.get("keepdims", 1),
            "noop_with_empty_axes": node.attributes.get("noop_with_empty_axes", 0)}


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


# -- the reductions whose gradient weight moves with X, in ops that have gradients ----------

def _peak(b, node, x: str, keepdims) -> str:
    """The slice maxima as a constant (BlockGrad): LogSumExp's shift, whose own derivative
    cancels exactly."""
    attributes = {**_reduce_attributes(node), "keepdims": keepdims}
    peak = b.emit("ReduceMax", x, _reduced_axes(b, node), opset=18, **attributes)
    return b.emit("BlockGrad", peak, domain=MIXRT)


def _square(b, x: str) -> str:
    return b.mul(x, x)


def _log_sum_exp(b, node):
    x = node.inputs[0]
    peak = _peak(b, node, x, keepdims=1)
    shifted = b.emit("Exp", b.emit("Sub", x, peak))
    if not node.attributes.get("keepdims", 1):
        peak = _peak(b, node, x, keepdims=0)
    return [b.emit("Add", b.emit("Log", _summed(b, node, shifted)), peak)]


_EXPANSIONS = {
    "ReduceSumSquare": lambda b, node: [_summed(b, node, _square(b, node.inputs[0]))],
    "ReduceL1": lambda b, node: [_summed(b, node, b.emit("Abs", node.inputs[0]))],
    "ReduceL2": lambda b, node: [b.emit("Sqrt", _summed(b, node, _square(b, node.inputs[0])))],
    "ReduceLogSum": lambda b, node: [b.emit("Log", _summed(b, node, node.inputs[0]))],
    "ReduceLogSumExp": _log_sum_exp,
}
for _op_type, _expand in _EXPANSIONS.items():
    _snake = red._snake(_op_type)
    getattr(red, _snake).expansion(widened(_expand))  # the forwards sum in float32
    getattr(red, _snake + "_axes_input").expansion(widened(_expand))


# -- CumSum -------------------------------------------------------------------------------

@red.cum_sum.grad
def _(b, node, dy):
    """Each input element reaches the outputs after it (before it, reversed): the gradient
    is the scan of dY the other way, as exclusive as the forward."""
    attributes = {"exclusive": node.attributes.get("exclusive", 0),
                  "reverse": 1 - int(node.attributes.get("reverse", 0))}
    return [b.emit("CumSum", dy[0], node.inputs[1], **attributes), None]
