"""Gradients of the arithmetic ops (elementwise.py): each returns, per input, the name of
d loss / d input built from backward nodes, reduced to the input's shape where it broadcast.
See runtime/passes/autodiff.py for the calling convention."""

from __future__ import annotations

from mixrt.ops.elementwise import elementwise as ew


@ew.add.grad
def _(b, node, dy):
    a, c = node.inputs
    return [b.sum_to(dy[0], a), b.sum_to(dy[0], c)]


@ew.sub.grad
def _(b, node, dy):
    a, c = node.inputs
    return [b.sum_to(dy[0], a), b.sum_to(b.neg(dy[0]), c)]


@ew.mul.grad
def _(b, node, dy):
    a, c = node.inputs
    return [b.sum_to(b.mul(dy[0], c), a), b.sum_to(b.mul(dy[0], a), c)]


@ew.div.grad
def _(b, node, dy):
    """d(a/c) = da / c - a dc / c^2 = (da - y dc) / c."""
    (a, c), y = node.inputs, node.outputs[0]
    da = b.emit("Div", dy[0], c)
    return [b.sum_to(da, a), b.sum_to(b.neg(b.mul(da, y)), c)]


@ew.neg.grad
def _(b, node, dy):
    return [b.neg(dy[0])]


@ew.exp.grad
def _(b, node, dy):
    return [b.mul(dy[0], node.outputs[0])]


@ew.log.grad
def _(b, node, dy):
    return [b.emit("Div", dy[0], node.inputs[0])]


@ew.sqrt.grad
def _(b, node, dy):
    """d sqrt(x) = dx / (2 sqrt(x))."""
    y = node.outputs[0]
    return [b.emit("Div", dy[0], b.mul(y, b.constant(2.0, like=y)))]


@ew.reciprocal.grad
def _(b, node, dy):
    """d (1/x) = -dx / x^2 = -dx y^2."""
    y = node.outputs[0]
    return [b.neg(b.mul(dy[0], b.mul(y, y)))]


@ew.abs_.grad
def _(b, node, dy):
    return [b.mul(dy[0], b.emit("Sign", node.inputs[0]))]


@ew.pow_.grad
def _(b, node, dy):
    """d x^p = p x^(p-1) dx; d/dp x^p = x^p log x (only asked for when p is a variable)."""
    (x, p), y = node.inputs, node.outputs[0]
    p_in_x = b.emit("Cast", p, to=_onnx_type(b, x)) if b.dtype(p) != b.dtype(x) else p
    one = b.constant(1.0, like=x)
    dx = b.mul(dy[0], b.mul(p_in_x, b.emit("Pow", x, b.emit("Sub", p_in_x, one))))
    dp = None
    if b.differentiable(p):
        log_x = b.emit("Log", x)
        dp = b.sum_to(b.mul(dy[0], b.mul(y, log_x)), p)
    return [b.sum_to(dx, x), dp]


@ew.sum_.grad
def _(b, node, dy):
    return [b.sum_to(dy[0], name) for name in node.inputs]


@ew.mean.grad
def _(b, node, dy):
    share = b.mul(dy[0], b.constant(1.0 / len(node.inputs), like=node.outputs[0]))
    return [b.sum_to(share, name) for name in node.inputs]


def _onnx_type(b, name: str) -> int:
    from onnx.helper import np_dtype_to_tensor_dtype  # noqa: PLC0415
    return int(np_dtype_to_tensor_dtype(b.dtype(name)))
