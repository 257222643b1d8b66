"""Gradients of the activations (activation.py). Most are written from the forward's output
(Relu, Sigmoid, Tanh), so the backward pass keeps one tensor alive per activation, not two.
See runtime/passes/autodiff.py for the calling convention."""

from __future__ import annotations

from mixrt.ops import activation as act
from mixrt.ops.grad_support import MIXRT
from mixrt.ops.registry import op
from mixrt.ops.types import TensorType


@op("ReluGrad", since=1, domain=MIXRT)
def relu_grad(xp, dY, Y):
    """dX of Relu from its output: dY where the output is positive, else 0."""
    return xp.where(Y > 0, dY, xp.zeros((), dtype=dY.dtype))


@relu_grad.infer
def _(dY: TensorType, Y: TensorType, **_):
    return [TensorType(dY.dtype, dY.shape)]


@act.relu.grad
def _(b, node, dy):
    return [b.emit("ReluGrad", dy[0], node.outputs[0], domain=MIXRT)]


@act.sigmoid.grad
def _(b, node, dy):
    """d sigmoid = y (1 - y) dx."""
    y = node.outputs[0]
    one_minus = b.emit("Sub", b.constant(1.0, like=y), y)
    return [b.mul(dy[0], b.mul(y, one_minus))]


@act.tanh.grad
def _(b, node, dy):
    """d tanh = (1 - y^2) dx."""
    y = node.outputs[0]
    return [b.mul(dy[0], b.emit("Sub", b.constant(1.0, like=y), b.mul(y, y)))]
