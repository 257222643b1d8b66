"""Losses as hybridizable blocks, with MXNet's semantics: ``loss(pred, label)`` gives one
value per sample, the mean over every axis but ``batch_axis``, after multiplying by
``sample_weight`` (broadcast against the elementwise loss) and by the scalar ``weight``.

    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with autograd.record():
        loss = loss_fn(net(x), y)        # shape (batch,)
    loss.backward()

Every loss is written without shapes (ONNX's Reshape, Shape and reductions over the axes
after the batch axis), so it also takes Symbols whose shapes are unknown until a Module
binds them: ``Loss()(sym_output, sym_label)``.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt import dispatch
from mixrt.base.errors import InputError
from mixrt.gluon.hybrid import static_shape, HybridBlock
from mixrt.sym import Symbol
from mixrt.sym.symbol import call_op

_INT64, _FLOAT = 7, 1  # ONNX TensorProto data types, for Cast


class Loss(HybridBlock):
    """The base: ``weight`` (a number or None) scales the loss; ``batch_axis`` is the axis
    kept. Subclasses compute the elementwise loss in ``hybrid_forward`` and finish with
    :meth:`_weighted_mean` (or :meth:`_weighted` and their own reduction)."""

    def __init__(self, weight=None, batch_axis: int = 0, **kwargs):
        if weight is not None and (isinstance(weight, bool) or
                                   not isinstance(weight, (int, float))):
            raise InputError(f"{type(self).__name__}: weight must be a number or None, got "
                             f"{weight!r} (per-sample weights go in sample_weight)")
        super().__init__(**kwargs)
        self._weight, self._batch_axis = weight, int(batch_axis)

    def forward(self, pred, label, sample_weight=None):
        return self._call_given(pred, label, sample_weight)

    def _call_given(self, *args):
        """``hybrid_forward`` with the arguments given (None: left out). A traced call
        takes arrays only, and keys its traces by their shapes: trailing absent arguments
        are dropped, and a pattern with a gap (an absent one before a given one) is traced
        by a block of its own, so two patterns never share a trace."""
        given = tuple(arg is not None for arg in args)
        count = max(i + 1 for i, present in enumerate(given) if present)
        if all(given[:count]):
            return HybridBlock.forward(self, *args[:count])
        # a child per pattern, so hybridize() and friends reach it: "given_0101"
        name = "given_" + "".join(str(int(present)) for present in given)
        call = self._children.get(name)
        if call is None:
            call = self.register_child(_GappedCall(self, given), name)
        return call(*[arg for arg in args if arg is not None])

    def _weighted(self, F, loss, sample_weight=None, weight=None):
        """``loss * sample_weight * weight`` (``weight``: this loss's unless given)."""
        if sample_weight is not None:
            loss = F.Mul(loss, sample_weight)
        weight = self._weight if weight is None else weight
        return loss if weight is None else loss * float(weight)

    def _weighted_mean(self, F, loss, sample_weight=None, weight=None):
        loss = self._weighted(F, loss, sample_weight, weight)
        return _reduce_all_but(F, F.ReduceMean, loss, self._batch_axis)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_axis={self._batch_axis}, w={self._weight})"


class _GappedCall(HybridBlock):
    """``loss.hybrid_forward`` for one pattern of given optional inputs with a gap."""

    def __init__(self, loss: Loss, given: tuple):
        super().__init__(prefix=loss.prefix)
        object.__setattr__(self, "_loss", loss)  # not a child: the loss owns this block
        self._given = given
        self.hybridize(loss._active)

    def hybrid_forward(self, F, *arrays):
        supplied = iter(arrays)
        args = [next(supplied) if present else None for present in self._given]
        return self._loss.hybrid_forward(F, *args)


# -- shape-free helpers: F is mixrt.nd or mixrt.sym ------------------------------------------

def _reduce_all_but(F, reduce, loss, batch_axis: int):
    """MXNet's ``reduce(loss, axis=batch_axis, exclude=True)`` for a loss of any rank:
    the axes after the batch axis are merged into one, then it and those before go."""
    if batch_axis < 0:  # counted from the end: needs the rank
        batch_axis += len(static_shape(loss))
    merged = F.Reshape(loss, np.array([0] * (batch_axis + 1) + [-1], dtype=np.int64))
    axes = np.array([*range(batch_axis), batch_axis + 1], dtype=np.int64)
    return reduce(merged, axes, keepdims=0)


def _reshape_like(F, x, like):
    """``x`` in ``like``'s shape (MXNet accepts (N,) labels for (N, 1) predictions)."""
    return F.Reshape(x, F.Shape(like))


def _pick(F, values, index, axis: int):
    """MXNet's ``pick(values, index, axis, keepdims=True)``: ``index`` holds one position
    along ``axis`` per row, in any shape of as many elements."""
    # the shape of values with 1 along axis, read off one slice of it: symbolic shape
    # inference knows a Slice's shape where it cannot follow arithmetic on shape values
    first = F.Slice(values, np.array([0], dtype=np.int64), np.array([1], dtype=np.int64),
                    np.array([axis], dtype=np.int64))
    index = F.Reshape(F.Cast(index, to=_INT64), F.Shape(first))
    return F.GatherElements(values, index, axis=axis)


def _indicator(F, x, value: float, test: str = "Equal"):
    """1 where ``x == value`` (``test="Greater"``: ``x > value``), else 0, in ``x``'s
    dtype."""
    compare = getattr(F, test)
    return F.CastLike(compare(x, F.CastLike(np.array(value, dtype=np.float32), x)), x)


def _mixrt_op(F, op_type: str, inputs: list, attributes: dict):
    """A ``mixrt``-domain op on NDArrays now, or added to the traced graph."""
    if any(isinstance(x, Symbol) for x in inputs):
        return call_op("mixrt", op_type, inputs, attributes)
    return dispatch.invoke("mixrt", op_type, inputs, attributes)


# -- regression ------------------------------------------------------------------------------

class L2Loss(Loss):
    """``weight / 2 * (label - pred)^2``."""

    def __init__(self, weight: float = 1.0, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        diff = _reshape_like(F, label, pred) - pred
        weight = 1.0 if self._weight is None else self._weight
        return self._weighted_mean(F, diff * diff, sample_weight, weight / 2)


class L1Loss(Loss):
    """``weight * |label - pred|``."""

    def __init__(self, weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        return self._weighted_mean(F, F.Abs(_reshape_like(F, label, pred) - pred),
                                   sample_weight)


class HuberLoss(Loss):
    """``0.5 / rho * d^2`` where ``|d| <= rho``, ``|d| - 0.5 * rho`` beyond
    (``d = label - pred``): L2 near zero, L1 for outliers."""

    def __init__(self, rho: float = 1.0, weight=None, batch_axis: int = 0, **kwargs):
        if rho <= 0:
            raise InputError(f"HuberLoss: rho must be > 0, got {rho}")
        super().__init__(weight, batch_axis, **kwargs)
        self._rho = float(rho)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        distance = F.Abs(_reshape_like(F, label, pred) - pred)
        loss = F.Where(distance > self._rho, distance - 0.5 * self._rho,
                       (0.5 / self._rho) * distance * distance)
        return self._weighted_mean(F, loss, sample_weight)


class PoissonNLLLoss(Loss):
    """The negative log-likelihood of ``target`` counts under Poisson distributions of
    rate ``exp(pred)`` (``from_logits``) or ``pred``: ``exp(pred) - target * pred``, or
    ``pred - target * log(pred + epsilon)``; ``compute_full`` adds Stirling's
    approximation of ``log(target!)`` where ``target > 1``. As in MXNet, the result is the
    mean over every element, shape (1,)."""

    def __init__(self, weight=None, from_logits: bool = True, batch_axis: int = 0,
                 compute_full: bool = False, epsilon: float = 1e-08, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._from_logits, self._compute_full = bool(from_logits), bool(compute_full)
        self._epsilon = float(epsilon)

    def forward(self, pred, target, sample_weight=None, epsilon=None):
        # a hybridized loss keeps its traces, which hold epsilon: it is the constructor's
        if epsilon is not None and float(epsilon) != self._epsilon:
            raise InputError(f"PoissonNLLLoss: epsilon={epsilon} differs from the "
                             f"constructor's {self._epsilon}; give it to the constructor")
        return self._call_given(pred, target, sample_weight)

    def hybrid_forward(self, F, pred, target, sample_weight=None):
        target = _reshape_like(F, target, pred)
        if self._from_logits:
            loss = F.Exp(pred) - target * pred
        else:
            loss = pred - target * F.Log(pred + self._epsilon)
        if self._compute_full:
            # counted where target > 1 only; computed at max(target, 1), never log(0)
            safe = F.Max(target, F.CastLike(np.array(1.0, dtype=np.float32), target))
            stirling = safe * F.Log(safe) - safe + 0.5 * F.Log(2 * math.pi * safe)
            loss = loss + stirling * _indicator(F, target, 1.0, test="Greater")
        loss = self._weighted(F, loss, sample_weight)
        return F.Reshape(F.ReduceMean(loss, keepdims=0), np.array([1], dtype=np.int64))


# -- classification --------------------------------------------------------------------------

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
        log_prob = pred if self._from_logits else F.LogSoftmax(pred, axis=self._axis)
        if self._sparse_label:
            loss = -_pick(F, log_prob, label, self._axis)
        else:
            loss = -F.ReduceSum(log_prob * _reshape_like(F, label, pred),
                                np.array([self._axis], dtype=np.int64), keepdims=1)
        return self._weighted_mean(F, loss, sample_weight)


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
        return self._call_given(pred, label, sample_weight, pos_weight)

    def hybrid_forward(self, F, pred, label, sample_weight=None, pos_weight=None):
        label = _reshape_like(F, label, pred)
        if self._from_sigmoid:
            eps = 1e-12
            positive = F.Log(pred + eps) * label
            if pos_weight is not None:
                positive = F.Mul(positive, pos_weight)
            loss = -(positive + F.Log(1.0 - pred + eps) * (1.0 - label))
        else:
            loss = _logistic(F, pred, label, pos_weight)
        return self._weighted_mean(F, loss, sample_weight)


SigmoidBCELoss = SigmoidBinaryCrossEntropyLoss


def _logistic(F, pred, label, pos_weight=None):
    """``-z log(sigmoid(x)) * w - (1 - z) log(1 - sigmoid(x))`` from the logits ``x``,
    never overflowing: ``log(1 + exp(-|x|))`` is bounded."""
    soft = F.Softplus(-F.Abs(pred))
    if pos_weight is None:
        return F.Relu(pred) - pred * label + soft
    # (1 - z) x + (1 + (w - 1) z) (log(1 + exp(-|x|)) + max(-x, 0))
    scale = 1.0 + F.Mul(pos_weight - 1.0, label)
    return pred - pred * label + scale * (soft + F.Relu(-pred))


class LogisticLoss(Loss):
    """``log(1 + exp(-pred * label))`` for labels in {-1, 1} (``label_format='signed'``)
    or {0, 1} (``'binary'``), computed without overflow."""

    def __init__(self, weight=None, batch_axis: int = 0, label_format: str = "signed",
                 **kwargs):
        if label_format not in ("signed", "binary"):
            raise InputError(f"LogisticLoss: label_format must be 'signed' or 'binary', "
                             f"got {label_format!r}")
        super().__init__(weight, batch_axis, **kwargs)
        self._label_format = label_format

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        label = _reshape_like(F, label, pred)
        if self._label_format == "signed":
            label = (label + 1.0) / 2.0
        return self._weighted_mean(F, _logistic(F, pred, label), sample_weight)


class KLDivLoss(Loss):
    """``label * (log(label) - pred)`` summed over every axis but the batch axis (as
    MXNet does): the Kullback-Leibler divergence of ``label`` from the distribution whose
    log-probabilities are ``pred`` (``from_logits=False``: ``pred`` holds unnormalized
    scores, turned into log-probabilities over ``axis``)."""

    def __init__(self, from_logits: bool = True, axis: int = -1, weight=None,
                 batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._from_logits, self._axis = bool(from_logits), int(axis)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        if not self._from_logits:
            pred = F.LogSoftmax(pred, axis=self._axis)
        loss = self._weighted(F, label * (F.Log(label + 1e-12) - pred), sample_weight)
        return _reduce_all_but(F, F.ReduceSum, loss, self._batch_axis)


class HingeLoss(Loss):
    """``max(0, margin - pred * label)`` for labels in {-1, 1}."""

    def __init__(self, margin: float = 1.0, weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._margin = float(margin)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        loss = F.Relu(self._margin - pred * _reshape_like(F, label, pred))
        return self._weighted_mean(F, loss, sample_weight)


class SquaredHingeLoss(HingeLoss):
    """``max(0, margin - pred * label)^2`` for labels in {-1, 1}: the soft-margin SVM's."""

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        hinge = F.Relu(self._margin - pred * _reshape_like(F, label, pred))
        return self._weighted_mean(F, hinge * hinge, sample_weight)


# -- sequences -------------------------------------------------------------------------------

class CTCLoss(Loss):
    """Connectionist Temporal Classification (``mixrt::CTCLoss``, MXNet's ``ctc_loss``):
    the negative log-likelihood of each label sequence under the per-step class scores
    ``pred`` (before softmax; ``layout`` 'NTC' or 'TNC'). The last class, C - 1, is the
    blank; labels (``label_layout`` 'NT' or 'TN') are padded with -1 unless
    ``label_lengths`` is given; ``pred_lengths`` gives each sequence's steps. Output: (N,)."""

    def __init__(self, layout: str = "NTC", label_layout: str = "NT", weight=None,
                 **kwargs):
        if layout not in ("NTC", "TNC"):
            raise InputError(f"CTCLoss: layout must be 'NTC' or 'TNC', got {layout!r}")
        if label_layout not in ("NT", "TN"):
            raise InputError(f"CTCLoss: label_layout must be 'NT' or 'TN', got "
                             f"{label_layout!r}")
        super().__init__(weight, label_layout.find("N"), **kwargs)
        self._layout, self._label_layout = layout, label_layout

    def forward(self, pred, label, pred_lengths=None, label_lengths=None,
                sample_weight=None):
        return self._call_given(pred, label, pred_lengths, label_lengths, sample_weight)

    def hybrid_forward(self, F, pred, label, pred_lengths=None, label_lengths=None,
                       sample_weight=None):
        if self._layout == "NTC":
            pred = F.Transpose(pred, perm=[1, 0, 2])
        if self._label_layout == "TN":
            label = F.Transpose(label, perm=[1, 0])
        loss = _mixrt_op(F, "CTCLoss", [pred, label, pred_lengths, label_lengths],
                         {"blank_label": "last"})
        return self._weighted(F, loss, sample_weight)


# -- embeddings ------------------------------------------------------------------------------

class TripletLoss(Loss):
    """``max(|positive - pred|^2 - |negative - pred|^2 + margin, 0)``, the squared
    distances summed over every axis but the batch axis."""

    def __init__(self, margin: float = 1.0, weight=None, batch_axis: int = 0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._margin = float(margin)

    def forward(self, pred, positive, negative):
        return self._call_given(pred, positive, negative)

    def hybrid_forward(self, F, pred, positive, negative):
        to_positive = _reshape_like(F, positive, pred) - pred
        to_negative = _reshape_like(F, negative, pred) - pred
        gap = _reduce_all_but(F, F.ReduceSum, to_positive * to_positive -
                              to_negative * to_negative, self._batch_axis)
        return self._weighted(F, F.Relu(gap + self._margin))


class CosineEmbeddingLoss(Loss):
    """``1 - cos(input1, input2)`` where ``label`` is 1, ``max(0, cos - margin)`` where it
    is -1; the cosine over the last axis. Output (N, 1), as MXNet's."""

    def __init__(self, weight=None, batch_axis: int = 0, margin: float = 0.0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._margin = float(margin)

    def forward(self, input1, input2, label, sample_weight=None):
        return self._call_given(input1, input2, label, sample_weight)

    def hybrid_forward(self, F, input1, input2, label, sample_weight=None):
        input1 = _reshape_like(F, input1, input2)
        label = F.Reshape(label, np.array([-1, 1], dtype=np.int64))
        cosine = _cosine_similarity(F, input1, input2)
        similar = (1.0 - cosine) * _indicator(F, label, 1.0)
        dissimilar = F.Relu(_indicator(F, label, -1.0) * (cosine - self._margin))
        return self._weighted(F, similar + dissimilar, sample_weight)


def _cosine_similarity(F, x, y):
    """(rows, 1): the cosine of each pair of rows along the last axis (norms kept from
    zero by 1e-12)."""
    last = np.array([-1], dtype=np.int64)
    column = np.array([-1, 1], dtype=np.int64)
    norms = F.ReduceL2(x, last, keepdims=1) * F.ReduceL2(y, last, keepdims=1)
    dots = F.ReduceSum(x * y, last, keepdims=1)
    return F.Reshape(dots, column) / F.Max(F.Reshape(norms, column),
                                           F.CastLike(np.array(1e-12, np.float32), norms))


class SDMLLoss(Loss):
    """Batchwise Smoothed Deep Metric Learning (Bonadiman et al. 2019): row i of ``x1``
    and of ``x2`` (N, D) form a pair, every other row of ``x2`` a negative for it. The
    loss of row i is the KL divergence of the smoothed identity (1 - s on the diagonal,
    s / (N - 1) elsewhere; s = ``smoothing_parameter``) from ``softmax(-distances)``,
    the squared Euclidean distances to every row of ``x2``."""

    def __init__(self, smoothing_parameter: float = 0.3, weight=1.0, batch_axis: int = 0,
                 **kwargs):
        if not 0 <= smoothing_parameter < 1:
            raise InputError(f"SDMLLoss: smoothing_parameter must be in [0, 1), got "
                             f"{smoothing_parameter}")
        super().__init__(weight, batch_axis, **kwargs)
        self.smoothing_parameter = float(smoothing_parameter)

    def forward(self, x1, x2):
        return self._call_given(x1, x2)

    def hybrid_forward(self, F, x1, x2):
        rows = np.array([1], dtype=np.int64)
        difference = F.Unsqueeze(x1, rows) - F.Unsqueeze(x2, np.array([0], dtype=np.int64))
        distances = F.ReduceSum(difference * difference, np.array([2], dtype=np.int64),
                                keepdims=0)
        log_prob = F.LogSoftmax(-distances, axis=1)
        gold = F.EyeLike(distances)
        others = F.ReduceSum(gold, keepdims=0) - 1.0  # N - 1
        smoothing = self.smoothing_parameter
        labels = gold * (1.0 - smoothing) + (1.0 - gold) * (smoothing / others)
        loss = labels * (F.Log(labels + 1e-12) - log_prob)
        return self._weighted(F, F.ReduceSum(loss, rows, keepdims=0))


__all__ = ["Loss", "L2Loss", "L1Loss", "SoftmaxCrossEntropyLoss", "SoftmaxCELoss",
           "SigmoidBinaryCrossEntropyLoss", "SigmoidBCELoss", "KLDivLoss", "HuberLoss",
           "HingeLoss", "SquaredHingeLoss", "LogisticLoss", "CTCLoss", "TripletLoss",
           "PoissonNLLLoss", "CosineEmbeddingLoss", "SDMLLoss"]
