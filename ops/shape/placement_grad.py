"""Gradients of the ops that place elements (Compress, ReverseSequence, CenterCropPad,
TensorScatter, MaxUnpool, EyeLike), of SwiGLU and of CumProd.

The placement ops are linear in their data input, so each gradient is the adjoint placement,
written with ops that have gradients of their own (so these differentiate again):

* Compress keeps the slices whose condition is true: Gather at NonZero(condition), whose
  adjoint is GatherGrad (a scatter-add of dY back into zeros).
* ReverseSequence is a permutation that is its own inverse.
* CenterCropPad crops or pads each axis symmetrically; cropping dY back to X's size (or
  padding it) with the same op is exactly the transpose: the window it keeps is the window
  the forward wrote.
* TensorScatter overwrites a run of positions of the cache with ``update``: the cache's
  gradient is dY with those positions zeroed (TensorScatter of zeros), the update's is dY
  read at those positions (GatherElements).
* MaxUnpool writes X at the flat positions I: dX reads dY at them (Gather on the flattened
  dY). When I repeats a position (windows that overlap), the forward keeps the last write
  only, so dX is zero for the writes that were overwritten (mixrt::MaxUnpoolKept marks the
  survivors, by the forward's own rule).
* EyeLike only reads its input's shape: nothing flows back.

SwiGLU gets an expansion (Swish(A) B written with Sigmoid and Mul), which is both its
gradient and its second derivative. CumProd has a backward kernel (CumProdGrad): its
gradient is a reverse scan that is exact when X holds zeros, which dividing by X is not; the
kernel has no gradient, so a second derivative through CumProd is a GradientError.
"""

from __future__ import annotations

from mixrt.ops.attention import attention
from mixrt.ops.pool import pool
from mixrt.ops.reduce import reduce
from mixrt.ops.shape import index, layout, shape
from mixrt.ops.conv.conv_grad import forwarded
from mixrt.ops.ir.dtypes import NUMERIC
from mixrt.ops.training.grad_support import MIXRT
from mixrt.ops.ir.registry import op
from mixrt.ops.shape.shape_grad import input_or_none, reshape_like, shape_of, zeros_like
from mixrt.ops.ir.types import TensorType, normalize_axis


def _axis_length(b, name: str, axis: int) -> str:
    """``name``'s length along ``axis`` as a one-element int64 tensor."""
    static = b.shape(name)
    if static is not None:
        return b.ints([static[axis]])
    return b.emit("Shape", name, start=axis, end=axis + 1)


# -- Compress --------------------------------------------------------------------------------

def _compress_grad(b, node, dy):
    data, condition = node.inputs[:2]
    axis = node.attributes.get("axis")
    like = data if axis is not None else b.emit("Reshape", data, b.ints([-1]))
    axis = 0 if axis is None else normalize_axis(int(axis), b.known_rank(node, data))
    # the condition may be shorter or longer than the axis: only its first entries count
    length = _axis_length(b, like, axis)
    within = b.emit("Slice", condition, b.ints([0]), length, b.ints([0]))
    kept = b.emit("Reshape", b.emit("NonZero", within), b.ints([-1]))
    grad = b.emit("GatherGrad", dy[0], like, kept, domain=MIXRT, axis=axis)
    return [grad if like == data else reshape_like(b, grad, data), None]


index.compress.grad(_compress_grad)


# -- ReverseSequence, CenterCropPad -------------------------------------------------------------

@layout.reversesequence.grad
def _(b, node, dy):
    return [b.emit("ReverseSequence", dy[0], node.inputs[1],
                   **forwarded(node, ("batch_axis", "time_axis"))), None]


@layout.center_crop_pad.grad
def _(b, node, dy):
    data = node.inputs[0]
    axes = node.attributes.get("axes")
    sizes = shape_of(b, data)
    if axes is not None:
        rank = b.known_rank(node, data)
        sizes = b.emit("Gather", sizes, b.ints([normalize_axis(int(a), rank) for a in axes]))
    return [b.emit("CenterCropPad", dy[0], sizes, opset=18, **forwarded(node, ("axes",))),
            None]


# -- TensorScatter ------------------------------------------------------------------------------

def _written_positions(b, node, update: str, axis: int, rank: int) -> str:
    """For every element of ``update``, the index along ``axis`` of the cache it was
    written to, shaped like ``update`` (GatherElements' index)."""
    cache, write_indices = node.inputs[0], input_or_none(node, 2)
    steps = b.emit("Range", b.ints(0), b.emit("Squeeze", _axis_length(b, update, axis)),
                   b.ints(1))
    at_axis = [1] * rank
    at_axis[axis] = -1
    positions = b.emit("Reshape", steps, b.ints(at_axis))
    if write_indices is not None:
        starts = b.emit("Cast", write_indices, to=7)  # int64
        starts = b.emit("Reshape", starts, b.ints([-1] + [1] * (rank - 1)))
        positions = b.emit("Add", positions, starts)
    if node.attributes.get("mode", "linear") == "circular":
        positions = b.emit("Mod", positions, _axis_length(b, cache, axis))
    return b.emit("Expand", positions, shape_of(b, update))


@index.tensor_scatter.grad
def _(b, node, dy):
    cache, update = node.inputs[:2]
    rank = b.known_rank(node, cache)
    axis = normalize_axis(int(node.attributes.get("axis", -2)), rank)
    attributes = forwarded(node, ("mode", "axis"))
    d_cache = b.emit("TensorScatter", dy[0], zeros_like(b, update), *node.inputs[2:3],
                     opset=24, **attributes)
    positions = _written_positions(b, node, update, axis, rank)
    d_update = b.emit("GatherElements", dy[0], positions, axis=axis)
    return [d_cache, d_update, None]


# -- MaxUnpool, EyeLike -----------------------------------------------------------------------

@pool.max_unpool.grad
def _(b, node, dy):
    flat = b.emit("Reshape", dy[0], b.ints([-1]))
    indices = b.emit("Cast", node.inputs[1], to=7)  # int64
    read = b.emit("Gather", flat, indices, axis=0)
    kept = b.emit("MaxUnpoolKept", indices, domain=MIXRT)
    return [b.emit("Where", kept, read, b.constant(0.0, like=dy[0])), None, None]


@shape.eyelike.grad
def _(b, node, dy):
    return [None]


# -- SwiGLU -----------------------------------------------------------------------------------

@attention.swiglu.expansion
def _(b, node):
    a, gate_input = node.inputs[:2]
    alpha = float(node.attributes.get("alpha", 1.0))
    scaled = a if alpha == 1.0 else b.mul(a, b.constant(alpha, like=a))
    swish = b.mul(a, b.emit("Sigmoid", scaled))
    return [b.mul(swish, gate_input)]


# -- CumProd ----------------------------------------------------------------------------------

@op("CumProdGrad", since=1, domain=MIXRT, dtypes=NUMERIC)
def cum_prod_grad(xp, dY, X, axis, *, exclusive=0, reverse=0):
    """dX of CumProd, exact where X holds zeros.

    Along the scan (taken forward: ``reverse`` flips it first), Y_j = prod_{k in K_j} x_k
    with K_j = {k <= j} ({k < j} when exclusive). So

        dX_i = P_i S_i,  P_i = prod_{k < i} x_k,  S_i = sum_{j >= i'} dY_j prod_{i < k <= j'} x_k

    (j' = j, i' = i inclusive; j' = j - 1, i' = i + 1 exclusive): P is an exclusive
    cumulative product and S a reverse recurrence, S_i = dY_i + x_{i+1} S_{i+1}, neither
    of which divides by x."""
    axis = normalize_axis(reduce._axes_from_input(axis)[0], X.ndim)
    x, dy = xp.moveaxis(X, axis, -1), xp.moveaxis(dY, axis, -1)
    if reverse:
        x, dy = x[..., ::-1], dy[..., ::-1]
    if exclusive:  # Y_j = prod_{k < j}: dY_j reaches x_i for i < j, i.e. dY shifted by one
        dy = xp.concatenate([dy[..., 1:], xp.zeros_like(dy[..., :1])], axis=-1)
    ones = xp.ones_like(x[..., :1])
    before = xp.cumprod(xp.concatenate([ones, x[..., :-1]], axis=-1), axis=-1)
    tail = xp.empty_like(dy)
    tail[..., -1] = dy[..., -1]
    for i in range(x.shape[-1] - 2, -1, -1):
        tail[..., i] = dy[..., i] + x[..., i + 1] * tail[..., i + 1]
    grad = before * tail
    if reverse:
        grad = grad[..., ::-1]
    return xp.ascontiguousarray(xp.moveaxis(grad, -1, axis))


@cum_prod_grad.infer
def _(dY, X, axis, **_):
    return [TensorType(X.dtype, X.shape)]


@reduce.cum_prod.grad
def _(b, node, dy):
    x, axis = node.inputs[:2]
    return [b.emit("CumProdGrad", dy[0], x, axis, domain=MIXRT,
                   **forwarded(node, ("exclusive", "reverse"))), None]
