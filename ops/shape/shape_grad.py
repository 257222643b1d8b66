"""Gradients of the shape and layout ops (shape.py, layout.py, index.py's Slice, cast.py,
Where, Einsum): they move, copy or select elements, so each gradient moves dY back to where
the elements came from, summing where one element was copied to several places.

Shapes are taken from the forward tensors at run time (Shape nodes) unless inference knows
them, so the gradients also serve symbolic shapes. Two backward kernels in the mixrt domain,
SliceGrad and PadGrad, write dY into zeros where ONNX would need an index computation of
several nodes (negative steps, clamped bounds, reflected borders).
See runtime/passes/autodiff.py for the calling convention.
"""

from __future__ import annotations

import string

import numpy as np

from mixrt.base.errors import GradientError
from mixrt.ops.elementwise import cast, elementwise
from mixrt.ops.nn import nn
from mixrt.ops.shape import index, layout, shape
from mixrt.ops.ir.dtypes import to_onnx_type
from mixrt.ops.training.grad_support import MIXRT, shaped_like_second
from mixrt.ops.ir.registry import op
from mixrt.ops.shape.shape import host_ints
from mixrt.ops.ir.types import normalize_axis


# -- helpers shared with index_grad.py ------------------------------------------------------

def static_ints(b, name: str | None) -> list[int] | None:
    """The values of an int tensor when inference knows them (initializers, folded shapes)."""
    value_type = b.type(name) if name else None
    if value_type is None or value_type.value is None:
        return None
    return [int(v) for v in np.asarray(value_type.value).reshape(-1)]


def input_or_none(node, position: int) -> str | None:
    """The name of an optional input, None when it is missing."""
    return node.inputs[position] if len(node.inputs) > position and node.inputs[position] \
        else None


def shape_of(b, name: str) -> str:
    """``name``'s shape as an int64 tensor: a constant when static, a Shape node otherwise."""
    static = b.shape(name)
    return b.ints(list(static)) if static is not None else b.emit("Shape", name)


def zeros_like(b, name: str) -> str:
    """Zeros shaped like ``name``, made at run time (never a large constant initializer)."""
    return b.emit("Expand", b.constant(0.0, like=name), shape_of(b, name))


def reshape_like(b, grad: str, like: str) -> str:
    # allowzero: a zero-length dim of the forward input is a real 0, not "copy this dim"
    return b.emit("Reshape", grad, shape_of(b, like), allowzero=1)


# -- ops that only change the shape ---------------------------------------------------------

@shape.identity.grad
def _(b, node, dy):
    return [dy[0]]


def _reshape_back(b, node, dy):
    """Reshape, Flatten, Squeeze and Unsqueeze keep the elements in order: dX is dY in X's
    shape, whatever convention gave the new shape."""
    return [reshape_like(b, dy[0], node.inputs[0])]


for _reshaping in (shape.reshape, shape.reshape_1, shape.flatten, shape.squeeze,
                   shape.squeeze_1, shape.unsqueeze, shape.unsqueeze_1):
    _reshaping.grad(_reshape_back)


@shape.transpose.grad
def _(b, node, dy):
    perm = node.attributes.get("perm")
    if perm is None:  # the default reverses the axes, which is its own inverse
        return [b.emit("Transpose", dy[0])]
    return [b.emit("Transpose", dy[0], perm=[int(p) for p in np.argsort(perm)])]


@shape.expand.grad
def _(b, node, dy):
    return [b.sum_to(dy[0], node.inputs[0])]


# -- Concat and Split -------------------------------------------------------------------------

def _axis_length(b, name: str, axis: int) -> str:
    """A one-element int64 tensor: the length of ``name`` along ``axis``."""
    static = b.shape(name)
    if static is not None:
        return b.ints([static[axis]])
    rank = b.rank(name)
    axis = normalize_axis(axis, rank) if rank is not None else axis
    if axis == -1:
        return b.emit("Shape", name, start=-1)
    return b.emit("Shape", name, start=axis, end=axis + 1)


@shape.concat.grad
def _(b, node, dy):
    """dY split back into pieces as long as the inputs were along the axis."""
    axis = int(node.attributes.get("axis", 1))  # Concat-1's default; later ones require it
    if len(node.inputs) == 1:
        return [dy[0]]
    lengths = [_axis_length(b, name, axis) for name in node.inputs]
    static = [static_ints(b, length) for length in lengths]
    sizes = b.ints([s[0] for s in static]) if all(static) else \
        b.emit("Concat", *lengths, axis=0)
    return list(b.emit("Split", dy[0], sizes, axis=axis, outputs=len(node.inputs)))


def _split_grad(b, node, dy):
    """The outputs' gradients joined again; an output nobody used contributes zeros."""
    parts = [grad if grad is not None else zeros_like(b, out)
             for grad, out in zip(dy, node.outputs)]
    joined = parts[0] if len(parts) == 1 else \
        b.emit("Concat", *parts, axis=int(node.attributes.get("axis", 0)))
    return [joined]


for _splitting in (shape.split, shape.split_2, shape.split_1):
    _splitting.grad(_split_grad)


# -- Slice ------------------------------------------------------------------------------------

@op("SliceGrad", since=1, domain=MIXRT)
def slice_grad(xp, dY, like, starts, ends, axes=None, steps=None):
    """dX of Slice: dY written where the slice read, zeros elsewhere. Reuses the forward's
    own bounds clamping, so every step sign and out-of-range bound agrees with it."""
    optional = [None if t is None else host_ints(t) for t in (axes, steps)]
    grad = xp.zeros(like.shape, dtype=dY.dtype)
    grad[index._slice_index(like.shape, host_ints(starts), host_ints(ends), *optional)] = dY
    return grad


slice_grad.infer(shaped_like_second)


@slice_grad.grad
def _(b, node, dd):
    """Linear in dY: its adjoint reads the slice again."""
    return [b.emit("Slice", dd[0], *node.inputs[2:]), None, None, None, None, None]


@index.slice_.grad
def _(b, node, dy):
    starts, ends = node.inputs[1], node.inputs[2]
    axes, steps = input_or_none(node, 3), input_or_none(node, 4)
    return [b.emit("SliceGrad", dy[0], node.inputs[0], starts, ends, axes, steps,
                   domain=MIXRT)]


@index.slice_1.grad
def _(b, node, dy):
    attributes = node.attributes
    axes = attributes.get("axes")
    return [b.emit("SliceGrad", dy[0], node.inputs[0], b.ints(attributes["starts"]),
                   b.ints(attributes["ends"]), None if axes is None else b.ints(axes),
                   domain=MIXRT)]


# -- Pad --------------------------------------------------------------------------------------

@op("PadGrad", since=1, domain=MIXRT)
def pad_grad(xp, dY, like, pads, axes=None, *, mode="constant"):
    """dX of Pad in any mode: pad the positions of X's elements the way the forward padded
    X (constant padding gets position -1), then add each element of dY into the position it
    was copied from."""
    positions = xp.arange(like.size, dtype=np.int64).reshape(like.shape)
    source = layout._pad(xp, positions, host_ints(pads), mode, np.int64(-1),
                         None if axes is None else host_ints(axes)).reshape(-1)
    copied = source >= 0
    grad = xp.bincount(source[copied], weights=dY.reshape(-1)[copied], minlength=like.size)
    return grad.astype(dY.dtype).reshape(like.shape)


pad_grad.infer(shaped_like_second)


@pad_grad.grad
def _(b, node, dd):
    """Linear in dY: its adjoint copies as the forward Pad did (zeros for constant mode)."""
    pads, axes = node.inputs[2], input_or_none(node, 3)
    mode = node.attributes.get("mode", "constant")
    padded = b.emit("Pad", dd[0], pads, None, axes, mode=mode) if axes else \
        b.emit("Pad", dd[0], pads, mode=mode)
    return [padded, None, None, None]


def _pad_backward(b, node, dy: str, pads: str, axes: str | None, mode: str) -> str:
    """Constant padding is undone by padding dY with the negated pads: that crops what was
    added and puts zeros where a negative pad cropped. The pad value is treated as a
    constant. The copying modes add the copies back with PadGrad."""
    x = node.inputs[0]
    if mode != "constant":
        return b.emit("PadGrad", dy, x, pads, axes, domain=MIXRT, mode=mode)
    known, known_axes = static_ints(b, pads), static_ints(b, axes)
    if known is not None and axes is not None and known_axes is not None \
            and b.rank(x) is not None:
        known, axes = _pads_over_all_axes(known, known_axes, b.rank(x)), None
    negated = b.ints([-p for p in known]) if known is not None else b.emit("Neg", pads)
    # Pad's axes input is opset 18's; pass it only when it could not be folded into the pads
    return b.emit("Pad", dy, negated, None, axes) if axes else b.emit("Pad", dy, negated)


def _pads_over_all_axes(pads: list[int], axes: list[int], rank: int) -> list[int]:
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        axis = normalize_axis(axis, rank)
        full[axis], full[axis + rank] = pads[i], pads[i + len(axes)]
    return full


@layout.pad.grad
def _(b, node, dy):
    mode = node.attributes.get("mode", "constant")
    return [_pad_backward(b, node, dy[0], node.inputs[1], input_or_none(node, 3), mode)]


@layout.pad_2.grad
def _(b, node, dy):
    mode = node.attributes.get("mode", "constant")
    return [_pad_backward(b, node, dy[0], b.ints(node.attributes["pads"]), None, mode)]


@layout.pad_1.grad
def _(b, node, dy):
    mode = node.attributes.get("mode", "constant")
    return [_pad_backward(b, node, dy[0], b.ints(node.attributes["paddings"]), None, mode)]


# -- Trilu ------------------------------------------------------------------------------------

@layout.trilu.grad
def _(b, node, dy):
    """A fixed mask: the gradient keeps the same triangle."""
    k = input_or_none(node, 1)
    return [b.emit("Trilu", dy[0], k, upper=node.attributes.get("upper", 1)), None]


# -- Tile -------------------------------------------------------------------------------------

@shape.tile.grad
def _(b, node, dy):
    """Y viewed as [r0, d0, r1, d1, ...] (r: repeats, d: X's dims) summed over the r axes."""
    x, repeats = node.inputs[0], node.inputs[1]
    rank = b.known_rank(node, x)
    if rank == 0:
        return [dy[0]]
    dims, reps = b.shape(x), static_ints(b, repeats)
    if dims is not None and reps is not None:
        folded = b.ints([n for pair in zip(reps, dims) for n in pair])
    else:
        column = b.ints([1])
        pairs = b.emit("Concat", b.emit("Unsqueeze", repeats, column),
                       b.emit("Unsqueeze", b.emit("Shape", x), column), axis=1)
        folded = b.emit("Reshape", pairs, b.ints([-1]))
    grouped = b.emit("Reshape", dy[0], folded)
    return [b.emit("ReduceSum", grouped, b.ints(list(range(0, 2 * rank, 2))), keepdims=0)]


# -- Cast, CastLike ---------------------------------------------------------------------------

def _cast_back(b, x: str, grad: str) -> str | None:
    """dY converted back to X's float type; integer and bool inputs get no gradient."""
    if not b.differentiable(x):
        return None
    if b.dtype(x) is None:
        return b.emit("CastLike", grad, x)
    if b.dtype(grad) == b.dtype(x):
        return grad
    return b.emit("Cast", grad, to=to_onnx_type(b.dtype(x)))


def _cast_grad(b, node, dy):
    return [_cast_back(b, node.inputs[0], dy[0]), None]


for _casting in (cast.cast, cast.cast_9, cast.cast_19, cast.cast_24,
                 cast.castlike, cast.castlike_19, cast.castlike_24):
    _casting.grad(_cast_grad)


# -- Where ------------------------------------------------------------------------------------

@elementwise.where.grad
def _(b, node, dy):
    """dY goes to X where the condition holds and to Y elsewhere; the condition gets none."""
    condition, x, y = node.inputs
    zero = b.constant(0.0, like=dy[0])
    return [None, b.sum_to(b.emit("Where", condition, dy[0], zero), x),
            b.sum_to(b.emit("Where", condition, zero, dy[0]), y)]


# -- Einsum -----------------------------------------------------------------------------------

@nn.einsum.grad
def _(b, node, dy):
    """dX_i is itself an einsum: dY and the other operands contracted onto X_i's labels.
    A label repeated in X_i (a diagonal) gets an identity matrix to put dY back on the
    diagonal; a label only X_i has (summed away) gets X_i-shaped ones to broadcast over."""
    ranks = [b.rank(name) for name in node.inputs]
    terms, output = _explicit_terms(node, ranks)
    free = iter(c for c in string.ascii_letters if c not in "".join(terms) + output)
    grads = []
    for i, x in enumerate(node.inputs):
        if not b.differentiable(x):
            grads.append(None)
            continue
        operands = [dy[0]] + [name for j, name in enumerate(node.inputs) if j != i]
        op_terms = [output] + [term for j, term in enumerate(terms) if j != i]
        target = _distinct_labels(b, x, terms[i], free, operands, op_terms)
        if any(label not in "".join(op_terms) for label in target):
            operands.append(b.emit("Expand", b.constant(1.0, like=x), shape_of(b, x)))
            op_terms.append(target)
        equation = ",".join(op_terms) + "->" + target
        grads.append(b.sum_to(b.emit("Einsum", *operands, equation=equation), x))
    return grads


def _distinct_labels(b, x: str, term: str, free, operands: list, op_terms: list) -> str:
    """``term`` with each repeat of a label renamed to a fresh one, appending to the operands
    an identity matrix that ties the two labels together."""
    target = ""
    for position, label in enumerate(term):
        if label in target:
            fresh = next(free)
            operands.append(_identity(b, x, position))
            op_terms.append(label + fresh)
            label = fresh
        target += label
    return target


def _identity(b, x: str, axis: int) -> str:
    """The identity matrix as wide as ``x`` along ``axis``, in x's dtype."""
    static = b.shape(x)
    if static is not None:
        return b.constant(np.eye(static[axis]), like=x)
    length = _axis_length(b, x, axis)
    square = b.emit("Expand", b.constant(0.0, like=x), b.emit("Concat", length, length, axis=0))
    return b.emit("EyeLike", square)


def _explicit_terms(node, ranks: list) -> tuple[list[str], str]:
    """The equation's operand terms and output term, the output written out when implicit
    and every ellipsis spelled as letters (right-aligned, as ellipsis dims broadcast)."""
    equation = node.attributes["equation"].replace(" ", "")
    lhs, arrow, output = equation.partition("->")
    terms = lhs.split(",")
    if not arrow:
        singles = sorted(c for c in set(lhs) if c.isalpha() and lhs.count(c) == 1)
        output = ("..." if "..." in lhs else "") + "".join(singles)
    if "..." not in equation:
        return terms, output
    if any(rank is None for rank in ranks):
        raise GradientError(f"node {node.label!r}: the gradient of an Einsum with '...' needs "
                            f"the rank of every operand", node=node.label, op_type="Einsum")
    widths = [rank - (len(term) - 3) if "..." in term else 0
              for term, rank in zip(terms, ranks)]
    unused = [c for c in string.ascii_letters if c not in equation]
    letters = "".join(unused[:max(widths)])
    terms = [term.replace("...", letters[len(letters) - width:])
             for term, width in zip(terms, widths)]
    return terms, output.replace("...", letters)
