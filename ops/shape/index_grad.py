"""Gradients of the gather and scatter ops (index.py). A gather's gradient is a scatter-add:
an element read several times (repeated indices, which may be negative) receives the sum of
the gradients of every copy. Slice's gradient is in shape_grad.py with the other ops that
move elements. See runtime/passes/autodiff.py for the calling convention.
"""

from __future__ import annotations

from mixrt.base.errors import GradientError
from mixrt.ops.shape import index
from mixrt.ops.training.grad_support import MIXRT, shaped_like_second
from mixrt.ops.ir.registry import op
from mixrt.ops.shape.shape_grad import zeros_like
from mixrt.ops.ir.types import normalize_axis
from mixrt.ops.device import add_at


# -- Gather -----------------------------------------------------------------------------------

@op("GatherGrad", since=1, domain=MIXRT)
def gather_grad(xp, dY, like, indices, *, axis=0):
    """dX of Gather: zeros shaped like X with every slice of dY added at its index. The
    gathered axis is moved to the front, so each index addresses one row of the sum."""
    axis = normalize_axis(axis, like.ndim)
    length = like.shape[axis]
    rows = index._wrap(xp, indices, length).reshape(-1)
    before, after = like.shape[:axis], like.shape[axis + 1:]
    updates = xp.moveaxis(dY.reshape(before + (rows.size,) + after), axis, 0)
    summed = xp.zeros((length,) + before + after, dtype=dY.dtype)
    add_at(xp, summed, rows, updates)  # unlike +=, accumulates repeated indices
    return xp.ascontiguousarray(xp.moveaxis(summed, 0, axis))


gather_grad.infer(shaped_like_second)


@gather_grad.grad
def _(b, node, dd):
    """Linear in dY: its adjoint gathers again."""
    axis = int(node.attributes.get("axis", 0))
    return [b.emit("Gather", dd[0], node.inputs[2], axis=axis), None, None]


@index.gather.grad
def _(b, node, dy):
    data, indices = node.inputs
    axis = int(node.attributes.get("axis", 0))
    return [b.emit("GatherGrad", dy[0], data, indices, domain=MIXRT, axis=axis), None]


@index.gather_elements.grad
def _(b, node, dy):
    """ScatterElements with reduction="add" is exactly GatherElements' scatter-add."""
    data, indices = node.inputs
    axis = int(node.attributes.get("axis", 0))
    return [b.emit("ScatterElements", zeros_like(b, data), indices, dy[0], axis=axis,
                   reduction="add"), None]


# -- TopK -------------------------------------------------------------------------------------

def _top_k_grad(b, node, dy):
    """The values' gradient added back at the positions they were taken from (the Indices
    output, integers, carries none)."""
    if dy[0] is None:
        return [None] * len(node.inputs)
    x, indices = node.inputs[0], b.forward_output(node, 1, "top_k_indices")
    axis = int(node.attributes.get("axis", -1))
    scattered = b.emit("ScatterElements", zeros_like(b, x), indices, dy[0], axis=axis,
                       reduction="add")
    return [scattered] + [None] * (len(node.inputs) - 1)


for _top_k in (index.top_k_1, index.top_k_10, index.top_k):
    _top_k.grad(_top_k_grad)


# -- GatherND ---------------------------------------------------------------------------------

@op("GatherNDGrad", since=1, domain=MIXRT)
def gather_nd_grad(xp, dY, like, indices, *, batch_dims=0):
    """dX of GatherND, through the forward's own index computation. A kernel because
    ScatterND, the standard scatter-add, has no batch dims."""
    grad = xp.zeros(like.shape, dtype=dY.dtype)
    flat, where, _ = index._gather_nd_index(xp, grad, indices, batch_dims)
    updates = dY.reshape((flat.shape[0], -1) + flat.shape[1 + indices.shape[-1]:])
    add_at(xp, flat, where, updates)  # flat is a view of grad
    return grad


gather_nd_grad.infer(shaped_like_second)


@gather_nd_grad.grad
def _(b, node, dd):
    batch_dims = int(node.attributes.get("batch_dims", 0))
    return [b.emit("GatherND", dd[0], node.inputs[2], batch_dims=batch_dims), None, None]


@index.gather_nd.grad
def _(b, node, dy):
    data, indices = node.inputs
    batch_dims = int(node.attributes.get("batch_dims", 0))
    return [b.emit("GatherNDGrad", dy[0], data, indices, domain=MIXRT,
                   batch_dims=batch_dims), None]


# -- ScatterElements, Scatter, ScatterND ------------------------------------------------------
# With reduction "none" a written position forgets its old value (dData is 0 there) and each
# update receives the gradient of the position it was written to, duplicates included, as in
# PyTorch's scatter. With "add" data passes dY through unchanged. The other reductions
# (mul, max, min) have no gradient here.

def _check_reduction(node) -> str:
    reduction = node.attributes.get("reduction", "none")
    if reduction not in ("none", "add"):
        raise GradientError(f"node {node.label!r}: {node.op_type} with reduction "
                            f"{reduction!r} has no gradient; the reductions that have one: "
                            f"none, add", node=node.label, op_type=node.op_type)
    return reduction


def _scatter_elements_grad(b, node, dy):
    data, indices, updates = node.inputs
    axis = int(node.attributes.get("axis", 0))
    d_data = dy[0]
    if _check_reduction(node) == "none":
        d_data = b.emit("ScatterElements", dy[0], indices, zeros_like(b, updates), axis=axis)
    return [d_data, None, b.emit("GatherElements", dy[0], indices, axis=axis)]


index.scatter_elements.grad(_scatter_elements_grad)
index.scatter.grad(_scatter_elements_grad)


@index.scatter_nd.grad
def _(b, node, dy):
    data, indices, updates = node.inputs
    d_data = dy[0]
    if _check_reduction(node) == "none":
        d_data = b.emit("ScatterND", dy[0], indices, zeros_like(b, updates))
    return [d_data, None, b.emit("GatherND", dy[0], indices)]

