"""Loss functions: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick, for every sample position, the (log-)probability of its target class out of the
class axis 1 of an (N, C, d1, ..., dk) input, weigh it by the class weight, and zero the
positions whose target is ``ignore_index``. ``mean`` divides by the total weight of the
positions that count (their number, without weights), like PyTorch.
"""

from __future__ import annotations

from mixrt.ops.dtypes import FLOATS
from mixrt.ops.nn import log_softmax_over, widen
from mixrt.ops.registry import op
from mixrt.ops.types import TensorType

REDUCTIONS = ("none", "sum", "mean")


def _nll(xp, log_prob, target, weight, ignore_index, reduction):
    """The loss of float32-or-wider ``log_prob`` (N, C, ...) against int ``target`` (N, ...)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}; got {reduction!r}")
    ignored = None if ignore_index is None else target == ignore_index
    # ignore_index may lie outside [0, C): point ignored positions at class 0, then drop them
    classes = target if ignored is None else xp.where(ignored, 0, target)
    picked = xp.take_along_axis(log_prob, xp.expand_dims(classes, 1), axis=1)
    picked = xp.squeeze(picked, axis=1)
    sample_weight = (xp.ones(picked.shape, dtype=picked.dtype) if weight is None
                     else widen(weight)[classes])
    if ignored is not None:
        sample_weight = xp.where(ignored, 0, sample_weight).astype(picked.dtype, copy=False)
    loss = -picked * sample_weight
    if reduction == "none":
        return loss
    if reduction == "sum":
        return xp.sum(loss)
    return xp.sum(loss) / xp.sum(sample_weight)


@op("NegativeLogLikelihoodLoss", since=22, dtypes=FLOATS)
@op("NegativeLogLikelihoodLoss", since=13, dtypes=FLOATS)
@op("NegativeLogLikelihoodLoss", since=12, dtypes=FLOATS)
def negative_log_likelihood_loss(xp, input, target, weight=None, *, ignore_index=None,
                                 reduction="mean"):
    loss = _nll(xp, widen(input), target, weight, ignore_index, reduction)
    return xp.asarray(loss).astype(input.dtype, copy=False)


@op("SoftmaxCrossEntropyLoss", since=13, dtypes=FLOATS)
@op("SoftmaxCrossEntropyLoss", since=12, dtypes=FLOATS)
def softmax_cross_entropy_loss(xp, scores, labels, weights=None, *, ignore_index=None,
                               reduction="mean", _outputs=1):
    log_prob = log_softmax_over(xp, widen(scores), (1,))
    loss = xp.asarray(_nll(xp, log_prob, labels, weights, ignore_index, reduction))
    loss = loss.astype(scores.dtype, copy=False)
    if _outputs == 1:
        return loss
    return loss, log_prob.astype(scores.dtype, copy=False)


def _loss_type(input: TensorType, target: TensorType, reduction: str) -> TensorType:
    return TensorType(input.dtype, target.shape if reduction == "none" else ())


@negative_log_likelihood_loss.infer
def _(input: TensorType, target: TensorType, *_, reduction="mean", **__):
    return [_loss_type(input, target, reduction)]


@softmax_cross_entropy_loss.infer
def _(scores: TensorType, labels: TensorType, *_, reduction="mean", **__):
    return [_loss_type(scores, labels, reduction), TensorType(scores.dtype, scores.shape)]

