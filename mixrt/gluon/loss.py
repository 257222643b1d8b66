"""Losses as hybridizable blocks, with MXNet's semantics: ``loss(pred, label)`` gives one
value per sample, the mean over every axis but ``batch_axis``, after multiplying by
``sample_weight`` (broadcast against the elementwise loss) and by the scalar ``weight``.

    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with autograd.record():
        loss = loss_fn(net(x), y)        # shape (batch,)
    loss.backward()
"""

from __future__ import annotations

import numpy as np

from mixrt import nd
from mixrt.base.errors import InputError
from mixrt.gluon.hybrid import static_shape, HybridBlock
from mixrt.sym import constant, Symbol


class Loss(HybridBlock):
    """The base: ``weight`` (a number or None) scales the loss; ``batch_axis`` is the axis
    kept. Subclasses compute the elementwise loss in ``hybrid_forward`` and finish with
    :meth:`_reduce`."""

    def __init__(self, weight=None, batch_axis: int = 0, **kwargs):
        if weight is not None and not isinstance(weight, (int, float)):
            raise InputError(f"{type(self).__name__}: weight must be a number or None, got "
                             f"{weight!r} (per-sample weights go in sample_weight)")
        super().__init__(**kwargs)
        self._weight, self._batch_axis = weight, int(batch_axis)

    def forward(self, pred, label, sample_weight=None):
        # a traced call takes arrays only: leave an absent sample_weight out
        if sample_weight is None:
            return super().forward(pred, label)
        return super().forward(pred, label, sample_weight)

    def _reduce(self, loss, sample_weight=None, weight=None):
        """Weighting, then the mean over every axis but the batch axis."""
        if sample_weight is not None:
            loss = loss * sample_weight
        weight = self._weight if weight is None else weight
        if weight is not None and weight != 1:
            loss = loss * float(weight)
        rank = len(static_shape(loss))
        axes = [a for a in range(rank) if a != self._batch_axis % max(rank, 1)]
        return loss.mean(axis=axes) if axes else loss

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_axis={self._batch_axis}, w={self._weight})"


def _one_like(pred):
    """A one-element 1 that broadcasts against anything, for ``pred``'s kind of array."""
    if isinstance(pred, Symbol):
        return constant(np.ones(1, np.float32))
    return nd.ones((1,), ctx=pred.ctx, dtype=pred.dtype)


def _like(label, pred):
    """``label`` in ``pred``'s shape (MXNet accepts (N,) labels for (N, 1) predictions)."""
    return label.reshape(static_shape(pred))


class L2Loss(Loss):
    """``weight / 2 * (label - pred)^2``."""

    def __init__(self, weight: float = 1.0, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        diff = _like(label, pred) - pred
        weight = 1.0 if self._weight is None else self._weight
        return self._reduce(diff * diff, sample_weight, weight / 2)


class L1Loss(Loss):
    """``weight * |label - pred|``."""

    def __init__(self, weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        return self._reduce(F.Abs(_like(label, pred) - pred), sample_weight)


class SoftmaxCrossEntropyLoss(Loss):
    """``-sum(label * log_softmax(pred))`` over ``axis``. ``sparse_label``: labels are class
    indices (one fewer axis than ``pred``, or size 1 there) instead of distributions;
    ``from_logits``: ``pred`` already holds log-probabilities."""

    def __init__(self, axis: int = -1, sparse_label: bool = True, from_logits: bool = False,
                 weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._axis, self._sparse_label = int(axis), bool(sparse_label)
        self._from_logits = bool(from_logits)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        shape = static_shape(pred)
        axis = self._axis % len(shape)
        log_prob = pred if self._from_logits else F.LogSoftmax(pred, axis=axis)
        if self._sparse_label:
            index_shape = list(shape)
            index_shape[axis] = 1
            index = label.astype(np.int64).reshape(index_shape)
            loss = -F.GatherElements(log_prob, index, axis=axis)
        else:
            loss = -(log_prob * _like(label, pred)).sum(axis=axis, keepdims=True)
        return self._reduce(loss, sample_weight)


SoftmaxCELoss = SoftmaxCrossEntropyLoss


class SigmoidBinaryCrossEntropyLoss(Loss):
    """Binary cross-entropy of ``sigmoid(pred)`` against ``label`` in [0, 1], computed from
    the logits without overflow: ``max(x, 0) - x * z + log(1 + exp(-|x|))``.
    ``from_sigmoid``: ``pred`` already holds probabilities. ``pos_weight`` (a call
    argument) scales the positive term."""

    def __init__(self, from_sigmoid: bool = False, weight=None, batch_axis: int = 0,
                 **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._from_sigmoid = bool(from_sigmoid)

    def forward(self, pred, label, sample_weight=None, pos_weight=None):
        if pos_weight is None:
            return super().forward(pred, label, sample_weight)
        if sample_weight is None:  # inputs are positional: a weight of one keeps the order
            sample_weight = _one_like(pred)
        return HybridBlock.forward(self, pred, label, sample_weight, pos_weight)

    def hybrid_forward(self, F, pred, label, sample_weight=None, pos_weight=None):
        label = _like(label, pred)
        if self._from_sigmoid:
            eps = 1e-12
            positive, negative = F.Log(pred + eps) * label, F.Log(1.0 - pred + eps) * \
                (1.0 - label)
            if pos_weight is not None:
                positive = positive * pos_weight
            return self._reduce(-(positive + negative), sample_weight)
        soft = F.Softplus(-F.Abs(pred))  # log(1 + exp(-|x|)), never overflows
        if pos_weight is None:
            loss = F.Relu(pred) - pred * label + soft
        else:  # (1 - z) x + (1 + (w - 1) z) log(1 + exp(-x)), the last term kept stable
            scale = 1.0 + (pos_weight - 1.0) * label
            loss = pred - pred * label + scale * (soft + F.Relu(-pred))
        return self._reduce(loss, sample_weight)


SigmoidBCELoss = SigmoidBinaryCrossEntropyLoss


class KLDivLoss(Loss):
    """``label * (log(label) - pred)``: the Kullback-Leibler divergence of ``label`` from
    the distribution whose log-probabilities are ``pred`` (``from_logits=False``: ``pred``
    holds unnormalized scores, turned into log-probabilities over ``axis``)."""

    def __init__(self, from_logits: bool = True, axis: int = -1, weight=None,
                 batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._from_logits, self._axis = bool(from_logits), int(axis)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        if not self._from_logits:
            pred = F.LogSoftmax(pred, axis=self._axis % len(static_shape(pred)))
        loss = label * (F.Log(label + 1e-12) - pred)
        return self._reduce(loss, sample_weight)


class HuberLoss(Loss):
    """``0.5 / rho * d^2`` where ``|d| <= rho``, ``|d| - 0.5 * rho`` beyond
    (``d = label - pred``): L2 near zero, L1 for outliers."""

    def __init__(self, rho: float = 1.0, weight=None, batch_axis: int = 0, **kwargs):
        if rho <= 0:
            raise InputError(f"HuberLoss: rho must be > 0, got {rho}")
        super().__init__(weight, batch_axis, **kwargs)
        self._rho = float(rho)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        distance = F.Abs(_like(label, pred) - pred)
        loss = F.Where(distance > self._rho, distance - 0.5 * self._rho,
                       (0.5 / self._rho) * distance * distance)
        return self._reduce(loss, sample_weight)


class HingeLoss(Loss):
    """``max(0, margin - pred * label)`` for labels in {-1, 1}."""

    def __init__(self, margin: float = 1.0, weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._margin = float(margin)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        loss = F.Relu(self._margin - pred * _like(label, pred))
        return self._reduce(loss, sample_weight)


__all__ = ["Loss", "L2Loss", "L1Loss", "SoftmaxCrossEntropyLoss", "SoftmaxCELoss",
           "SigmoidBinaryCrossEntropyLoss", "SigmoidBCELoss", "KLDivLoss", "HuberLoss",
           "HingeLoss"]
