"""Loss functions: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick, for every sample position, the (log-)probability of its target class out of the
class axis 1 of an (N, C, d1, ..., dk) input, weigh it by the class weight, and zero the
positions whose target is ``ignore_index``. ``mean`` divides by the total weight of the
positions that count (their number, without weights), like PyTorch.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops import device_checks
from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.nn.nn import log_softmax_over, widen
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, conflicting, fits, shape_text

REDUCTIONS = ("none", "sum", "mean")


def _nll(xp, log_prob, target, weight, ignore_index, reduction):
    """The loss of float32-or-wider ``log_prob`` (N, C, ...) against int ``target`` (N, ...)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}; got {reduction!r}")
    ignored = None if ignore_index is None else target == ignore_index
    # ignore_index may lie outside [0, C): point ignored positions at class 0, then drop them
    classes = target if ignored is None else xp.where(ignored, 0, target)
    _check_classes(xp, classes, log_prob.shape[1])
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


def _check_classes(xp, classes, count: int) -> None:
    """A target class outside [0, C) (and not ignore_index) is the caller's error, named,
    rather than an index error from the pick. In a GPU run the check is deferred to the
    run's end (ops/device_checks.py): reading it back here would stop the run until the
    GPU caught up, twice a training step, and no CUDA graph could record the step."""
    if xp is not np and device_checks.deferring():
        device_checks.expect_false(((classes < 0) | (classes >= count)).any(),
                                   f"every target class in [0, {count}) (or ignore_index)")
        return
    if classes.size and (int(classes.min()) < 0 or int(classes.max()) >= count):
        bad = classes[(classes < 0) | (classes >= count)].reshape(-1)[:4]
        raise ValueError(f"the target holds class {', '.join(str(int(v)) for v in bad)}, "
                         f"outside [0, {count}) for an input of {count} classes (and not "
                         "ignore_index)")


def _loss_type(op_type: str, input: TensorType, target: TensorType, weight,
               reduction: str) -> TensorType:
    """The loss's type; operands whose shapes do not fit are refused: input (N, C, d1..dk),
    target (N, d1..dk), weight (C,)."""
    x, t = input.shape, target.shape
    if x is not None and len(x) < 2:
        raise ValueError(f"{op_type}: the input has shape {shape_text(x)}; expected (N, C, "
                         "d1, ..., dk), at least 2 axes")
    if x is not None and t is not None and not fits(t, x[:1] + x[2:]):
        raise ValueError(f"{op_type}: the target has shape {shape_text(t)}; expected "
                         f"{shape_text(x[:1] + x[2:])} (the input {shape_text(x)} without its "
                         "class axis 1)")
    w = None if weight is None else weight.shape
    if x is not None and w is not None and (len(w) != 1 or conflicting(w[0], x[1])):
        raise ValueError(f"{op_type}: the weight has shape {shape_text(w)}; expected "
                         f"({x[1]},), one per class of the input {shape_text(x)}")
    return TensorType(input.dtype, target.shape if reduction == "none" else ())


@negative_log_likelihood_loss.infer
def _(input: TensorType, target: TensorType, weight=None, *, reduction="mean", **__):
    return [_loss_type("NegativeLogLikelihoodLoss", input, target, weight, reduction)]


@softmax_cross_entropy_loss.infer
def _(scores: TensorType, labels: TensorType, weights=None, *, reduction="mean", **__):
    return [_loss_type("SoftmaxCrossEntropyLoss", scores, labels, weights, reduction),
            TensorType(scores.dtype, scores.shape)]

