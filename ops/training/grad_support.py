"""Backward-only kernels that many gradients share (the ``mixrt`` domain).

They exist because the ONNX operator set has no single op for them and spelling them out of
Shape/ReduceSum/Reshape nodes would cost several kernels and host round trips per gradient.
"""

from __future__ import annotations

import dataclasses

from mixrt.ops.ir.dtypes import compute_dtype
from mixrt.ops.ir.registry import VIEW, op
from mixrt.ops.ir.types import TensorType

MIXRT = "mixrt"


def sum_to_shape(xp, grad, shape: tuple):
    """``grad`` summed over the axes along which an input of ``shape`` was broadcast."""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        extra + i for i, size in enumerate(shape) if size == 1 and grad.shape[extra + i] != 1)
    summed = grad.sum(axis=axes, keepdims=True) if axes else grad
    return summed.reshape(shape)


@op("SumToShapeOf", since=1, domain=MIXRT)
def sum_to_shape_of(xp, grad, like):
    """The gradient of every broadcasting op: ``grad`` reduced to ``like``'s shape."""
    # ascontiguousarray returns at least 1-d: reshape back so a 0-d input gets a 0-d gradient
    return xp.ascontiguousarray(sum_to_shape(xp, grad, like.shape)).reshape(like.shape)


def shaped_like_second(grad: TensorType, like: TensorType, *_, **__) -> list[TensorType]:
    """The infer function of backward kernels whose result is the gradient's dtype in the
    shape of the forward input passed second (SumToShapeOf, GatherGrad, SliceGrad, ...)."""
    return [TensorType(grad.dtype, like.shape)]


sum_to_shape_of.infer(shaped_like_second)


@sum_to_shape_of.grad
def _(b, node, dy):
    # linear in grad: its adjoint spreads the summed gradient back over the broadcast shape
    return [b.emit("Expand", dy[0], b.emit("Shape", node.inputs[0])), None]


@op("BlockGrad", since=1, domain=MIXRT, memory=VIEW)
def block_grad(xp, input):
    """Its input, unchanged; no gradient flows back through it (MXNet's BlockGrad, a
    framework's stop_gradient): how a symbol exposes a value, such as the logits beside a
    loss, without differentiating it. Exports as ONNX Identity."""
    return input


@block_grad.infer
def _(input, **_):
    return [input]


@block_grad.grad
def _(b, node, dy):
    return [None]


# -- expansions in their forward's precision ------------------------------------------------

def widened(expand):
    """``expand`` (an ``@op.expansion``) run on the node's first input cast to its compute
    dtype (float32 for half-precision floats) and its outputs cast back to that input's
    dtype: the precision the forwards that widen compute in. Written in float16 alone, an
    expansion's x * x overflows from |x| = 256 and its gradient comes out as zeros or NaN."""
    def expand_widened(b, node):
        x = node.inputs[0]
        dtype = b.dtype(x)
        if dtype is None or compute_dtype(dtype) == dtype:
            return expand(b, node)
        wide = dataclasses.replace(node, inputs=[b.cast(x, compute_dtype(dtype)),
                                                 *node.inputs[1:]])
        outputs = expand(b, wide)
        return None if outputs is None else [b.cast(y, dtype) for y in outputs]
    return expand_widened
