"""Gradients of matrix products, the softmax family, dropout and the losses (nn.py, loss.py).
See runtime/passes/autodiff.py for the calling convention."""

from __future__ import annotations

from mixrt.ops.nn import loss, nn
from mixrt.ops.conv.conv_grad import optional_input
from mixrt.ops.training.grad_support import MIXRT
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType


# -- MatMul and Gemm ----------------------------------------------------------------------------

def _swap_last(b, name: str, rank: int) -> str:
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return b.emit("Transpose", name, perm=perm)


@nn.mat_mul.grad
def _(b, node, dy):
    """dA = dY B^T, dB = A^T dY (over the trailing two axes), each summed over the batch
    axes it was broadcast along. A 1-D operand is a row (A) or column (B) vector."""
    (a, c), grad = node.inputs, dy[0]
    rank_a, rank_c = b.known_rank(node, a), b.known_rank(node, c)
    if rank_a == rank_c == 1:  # a dot product
        return [b.mul(grad, c), b.mul(grad, a)]
    a2 = b.emit("Unsqueeze", a, b.ints([0])) if rank_a == 1 else a
    c2 = b.emit("Unsqueeze", c, b.ints([1])) if rank_c == 1 else c
    if rank_a == 1:
        grad = b.emit("Unsqueeze", grad, b.ints([-2]))
    if rank_c == 1:
        grad = b.emit("Unsqueeze", grad, b.ints([-1]))
    da = b.emit("MatMul", grad, _swap_last(b, c2, max(rank_c, 2)))
    dc = b.emit("MatMul", _swap_last(b, a2, max(rank_a, 2)), grad)
    return [b.sum_to(_as_vector(b, da, rank_a, -2), a),
            b.sum_to(_as_vector(b, dc, rank_c, -1), c)]


def _as_vector(b, grad: str, rank: int, unit_axis: int) -> str:
    """Undo the Unsqueeze of a 1-D operand (its unit axis is -2 for A, -1 for B); the
    caller's sum_to then sums away any batch axes."""
    if rank != 1:
        return grad
    return b.emit("Squeeze", grad, b.ints([unit_axis]))


@nn.gemm.grad
def _(b, node, dy):
    """Y = alpha A' B' + beta C with A' = A or A^T and B' = B or B^T; dA' = alpha dY B'^T and
    dB' = alpha A'^T dY, each written as one Gemm with the transposes folded into flags."""
    a, c = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    alpha = float(node.attributes.get("alpha", 1.0))
    beta = float(node.attributes.get("beta", 1.0))
    trans_a = int(node.attributes.get("transA", 0))
    trans_b = int(node.attributes.get("transB", 0))
    grad = dy[0]
    if not trans_a:
        da = b.emit("Gemm", grad, c, alpha=alpha, transB=1 - trans_b)
    else:
        da = b.emit("Gemm", c, grad, alpha=alpha, transA=trans_b, transB=1)
    if not trans_b:
        dc = b.emit("Gemm", a, grad, alpha=alpha, transA=1 - trans_a)
    else:
        dc = b.emit("Gemm", grad, a, alpha=alpha, transA=1, transB=trans_a)
    grads = [da, dc]
    if bias is not None:
        scaled = grad if beta == 1.0 else b.mul(grad, b.constant(beta, like=grad))
        grads.append(b.sum_to(scaled, bias))
    return grads


# -- the softmax family ---------------------------------------------------------------------------

def _softmax_axes(b, node, *, default: int, coerced: bool) -> list[int]:
    rank = b.known_rank(node, node.inputs[0])
    axis = int(node.attributes.get("axis", default))
    axis = axis + rank if axis < 0 else axis
    return list(range(axis, rank)) if coerced else [axis]


def _softmax_backward(b, y: str, grad: str, axes: list[int]) -> str:
    """dX = y (dY - sum(dY y))."""
    dot = b.emit("ReduceSum", b.mul(grad, y), b.ints(axes), keepdims=1)
    return b.mul(y, b.emit("Sub", grad, dot))


def _log_softmax_backward(b, y: str, grad: str, axes: list[int]) -> str:
    """dX = dY - exp(y) sum(dY)."""
    total = b.emit("ReduceSum", grad, b.ints(axes), keepdims=1)
    return b.emit("Sub", grad, b.mul(b.emit("Exp", y), total))


@nn.softmax.grad
def _(b, node, dy):
    return [_softmax_backward(b, node.outputs[0], dy[0],
                              _softmax_axes(b, node, default=-1, coerced=False))]


@nn.softmax_coerced.grad
def _(b, node, dy):
    return [_softmax_backward(b, node.outputs[0], dy[0],
                              _softmax_axes(b, node, default=1, coerced=True))]


@nn.log_softmax.grad
def _(b, node, dy):
    return [_log_softmax_backward(b, node.outputs[0], dy[0],
                                  _softmax_axes(b, node, default=-1, coerced=False))]


@nn.log_softmax_coerced.grad
def _(b, node, dy):
    return [_log_softmax_backward(b, node.outputs[0], dy[0],
                                  _softmax_axes(b, node, default=1, coerced=True))]


# -- Dropout --------------------------------------------------------------------------------------

def _identity_grad(b, node, dy):
    return [dy[0]]


for _inference_only in (nn.dropout_6, nn.dropout_7, nn.dropout_10):
    _inference_only.grad(_identity_grad)


@nn.dropout.grad
def _(b, node, dy):
    """dX = dY * mask / (1 - ratio) in training mode, dY otherwise. The mask is the forward's
    second output; when the model did not ask for it, the forward node is made to produce it."""
    training = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if training is None:
        return [dy[0]]
    mask = b.forward_output(node, 1, "dropout_mask")
    x = node.inputs[0]
    one = b.constant(1.0, like=x)
    ratio = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else \
        b.constant(0.5, like=x)
    if b.dtype(ratio) != b.dtype(x):
        ratio = b.emit("CastLike", ratio, x)
    scale = b.emit("Where", training, b.emit("Div", one, b.emit("Sub", one, ratio)), one)
    kept = b.emit("CastLike", mask, x)
    return [b.mul(dy[0], b.mul(kept, scale))]


# -- losses ---------------------------------------------------------------------------------------

@op("NegativeLogLikelihoodLossGrad", since=1, domain=MIXRT)
def nll_loss_grad(xp, dloss, input, target, weight=None, *, ignore_index=None,
                  reduction="mean"):
    """d loss / d input of NegativeLogLikelihoodLoss: -weight of the target class at the
    target position (zero elsewhere and at ignored positions), scaled as the reduction was."""
    ignored = None if ignore_index is None else target == ignore_index
    classes = target if ignored is None else xp.where(ignored, 0, target)
    sample_weight = (xp.ones(classes.shape, dtype=input.dtype) if weight is None
                     else weight.astype(input.dtype)[classes])
    if ignored is not None:
        sample_weight = xp.where(ignored, 0, sample_weight).astype(input.dtype)
    if reduction == "mean":  # 0 where every position is ignored; chosen on the device,
        total = sample_weight.sum()  # since a branch on it would wait for the GPU
        nonzero = total != 0
        scale = xp.where(nonzero, dloss / xp.where(nonzero, total, 1), 0)
        sample_weight = sample_weight * scale.astype(sample_weight.dtype, copy=False)
    else:  # "sum": dloss is a scalar; "none": one dloss per position
        sample_weight = sample_weight * dloss
    grad = xp.zeros(input.shape, dtype=input.dtype)
    # grad[n, classes[n, d...], d...] = -w[n, d...], by an open grid (CuPy 13 has no
    # put_along_axis); each position is written once
    grid = [xp.arange(size).reshape([-1 if axis == at else 1 for at in range(classes.ndim)])
            for axis, size in enumerate(classes.shape)]
    grad[(grid[0], classes, *grid[1:])] = (-sample_weight).astype(input.dtype)
    return grad


@nll_loss_grad.grad
def _(b, node, dd):
    """Linear in dloss and independent of the input's values (it gives only the shape): the
    adjoint of dloss -> dX is the loss itself applied to the incoming gradient, with the
    same target, weights and reduction."""
    target, weight = node.inputs[2], optional_input(node, 3)
    attributes = {k: v for k, v in node.attributes.items()
                  if k in ("ignore_index", "reduction")}
    return [b.emit("NegativeLogLikelihoodLoss", dd[0], target, weight, **attributes),
            None, None, None]


@nll_loss_grad.infer
def _(dloss: TensorType, input: TensorType, *_, **__):
    return [TensorType(input.dtype, input.shape)]


def _loss_attributes(node) -> dict:
    return {key: node.attributes[key] for key in ("ignore_index", "reduction")
            if key in node.attributes}


@loss.negative_log_likelihood_loss.grad
def _(b, node, dy):
    x, target = node.inputs[0], node.inputs[1]
    weight = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    return [b.emit("NegativeLogLikelihoodLossGrad", dy[0], x, target, weight, domain=MIXRT,
                   **_loss_attributes(node))]


@loss.softmax_cross_entropy_loss.grad
def _(b, node, dy):
    """The loss is NLL of log_softmax(scores) over axis 1: the NLL gradient (plus whatever
    reaches the log_prob output) through log_softmax's backward."""
    labels = node.inputs[1]
    weights = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    log_prob = b.forward_output(node, 1, "log_prob")
    parts = []
    if dy[0] is not None:
        parts.append(b.emit("NegativeLogLikelihoodLossGrad", dy[0], log_prob, labels, weights,
                            domain=MIXRT, **_loss_attributes(node)))
    if len(dy) > 1 and dy[1] is not None:
        parts.append(dy[1])
    return [_log_softmax_backward(b, log_prob, b.accumulate(parts), [1])]
