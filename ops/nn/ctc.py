"""``mixrt::CTCLoss``: MXNet's ``ctc_loss``, the Connectionist Temporal Classification loss
(Graves et al., ICML 2006) of unnormalized scores ``data`` (T, N, C) against label
sequences ``label`` (N, L); one negative log-likelihood per sequence, shape (N,).

The softmax over the C classes is part of the op, so its gradient is with respect to the
scores: ``softmax - occupancy`` (the posterior probability that step t emits class k).
``blank_label``: ``"first"`` (class 0 is the blank; labels are 1..C-1, padded with 0) or
``"last"`` (class C-1 is the blank; labels are 0..C-2, padded with -1). Without
``label_lengths`` a label ends at its first padding value; without ``data_lengths`` every
sequence has all T steps. Both recursions run in log space over the batch at once.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.nn.nn import log_softmax_over, widen

BLANK_POSITIONS = ("first", "last")
_NEG_INF = -np.inf


@op("CTCLoss", domain=MIXRT, dtypes=FLOATS)
def ctc_loss(xp, data, label, data_lengths=None, label_lengths=None, *,
             blank_label="first"):
    """The loss of each of the N sequences (see the module docstring)."""
    problem = _Problem(xp, data, label, data_lengths, label_lengths, blank_label)
    alpha = problem.forward_variables()
    return (-problem.log_likelihood(alpha)).astype(data.dtype)


@op("CTCLossGrad", domain=MIXRT, dtypes=FLOATS)
def ctc_loss_grad(xp, data, label, data_lengths=None, label_lengths=None, dY=None, *,
                  blank_label="first"):
    """d loss / d data, scaled per sequence by the incoming gradient ``dY`` (N,)."""
    problem = _Problem(xp, data, label, data_lengths, label_lengths, blank_label)
    alpha, beta = problem.forward_variables(), problem.backward_variables()
    log_p = problem.log_likelihood(alpha)
    # log of the probability mass of the paths through (t, s), divided by the whole
    through = alpha + beta - problem.emitted - log_p[None, :, None]
    # summed over the positions s of each class (a class may sit at several): one-hot
    # positions by class, so NumPy and CuPy run the same contraction
    classes = problem.log_probs.shape[2]
    one_hot = (problem.extended[:, :, None] == xp.arange(classes)[None, None, :])
    occupancy = xp.einsum("tns,nsc->tnc", xp.exp(through), one_hot.astype(np.float64))
    grad = xp.exp(problem.log_probs) - occupancy
    grad *= problem.active_steps()[:, :, None]
    grad *= xp.asarray(dY, dtype=np.float64)[None, :, None]
    return grad.astype(data.dtype)


class _Problem:
    """One batch's CTC lattice: log-probabilities, the blank-interleaved labels and the
    lengths (everything float64, arrays of ``xp``)."""

    def __init__(self, xp, data, label, data_lengths, label_lengths, blank_label):
        if blank_label not in BLANK_POSITIONS:
            raise ValueError(f"CTCLoss: blank_label must be one of {BLANK_POSITIONS}, got "
                             f"{blank_label!r}")
        if data.ndim != 3 or label.ndim != 2 or label.shape[0] != data.shape[1]:
            raise ValueError(f"CTCLoss: expected data (T, N, C) and label (N, L), got data "
                             f"{tuple(data.shape)} and label {tuple(label.shape)}")
        self.xp = xp
        self.steps, self.batch, classes = data.shape
        self.log_probs = log_softmax_over(xp, widen(data).astype(np.float64), (2,))
        self.blank = 0 if blank_label == "first" else classes - 1
        labels = xp.asarray(label).astype(np.int64)
        self.label_lengths = self._label_lengths(labels, label_lengths, blank_label)
        self.data_lengths = self._data_lengths(data_lengths)
        self.extended, self.can_skip = self._extended(labels, classes)
        self.ext_lengths = 2 * self.label_lengths + 1
        rows = xp.arange(self.batch)[None, :, None]
        self.emitted = self.log_probs[xp.arange(self.steps)[:, None, None], rows,
                                      self.extended[None, :, :]]

    def _label_lengths(self, labels, given, blank_label):
        xp = self.xp
        if given is not None:
            lengths = xp.asarray(given).astype(np.int64).reshape(-1)
        else:  # up to the first padding value
            padding = labels == (0 if blank_label == "first" else -1)
            padded = padding.any(axis=1)
            lengths = xp.where(padded, padding.argmax(axis=1), labels.shape[1])
        if lengths.shape != (self.batch,) or bool((lengths < 0).any()) or \
                bool((lengths > labels.shape[1]).any()):
            raise ValueError(f"CTCLoss: label_lengths must be N={self.batch} lengths in "
                             f"[0, {labels.shape[1]}], got {lengths.tolist()}")
        return lengths

    def _data_lengths(self, given):
        xp = self.xp
        if given is None:
            return xp.full((self.batch,), self.steps, dtype=np.int64)
        lengths = xp.asarray(given).astype(np.int64).reshape(-1)
        if lengths.shape != (self.batch,) or bool((lengths < 1).any()) or \
                bool((lengths > self.steps).any()):
            raise ValueError(f"CTCLoss: data_lengths must be N={self.batch} lengths in "
                             f"[1, {self.steps}], got {lengths.tolist()}")
        return lengths

    def _extended(self, labels, classes):
        """(N, 2L+1) classes: blank, l1, blank, l2, ..., blank (the blank past each
        sequence's end too), and where a step may skip the blank before it."""
        xp = self.xp
        positions = xp.arange(labels.shape[1])[None, :]
        valid = positions < self.label_lengths[:, None]
        used = labels[valid]
        if used.size and (int(used.min()) < 0 or int(used.max()) >= classes):
            raise ValueError(f"CTCLoss: a label lies outside [0, {classes}) for data of "
                             f"{classes} classes")
        extended = xp.full((self.batch, 2 * labels.shape[1] + 1), self.blank, dtype=np.int64)
        extended[:, 1::2] = xp.where(valid, labels, self.blank)
        can_skip = xp.zeros(extended.shape, dtype=bool)
        can_skip[:, 2:] = (extended[:, 2:] != self.blank) & \
            (extended[:, 2:] != extended[:, :-2])
        return extended, can_skip

    def active_steps(self):
        """(T, N): 1 where step t lies within sequence n's data."""
        return (self.xp.arange(self.steps)[:, None] < self.data_lengths[None, :]).astype(
            np.float64)

    def forward_variables(self):
        """alpha (T, N, S): log-probability of the label prefixes ending at (t, s)."""
        xp = self.xp
        alpha = xp.full(self.emitted.shape, _NEG_INF)
        alpha[0, :, :2] = self.emitted[0, :, :2]
        alpha[0, :, 1] = xp.where(self.ext_lengths > 1, alpha[0, :, 1], _NEG_INF)
        for t in range(1, self.steps):
            previous = alpha[t - 1]
            alpha[t] = _logsumexp3(xp, previous, _shifted(xp, previous, 1),
                                   xp.where(self.can_skip, _shifted(xp, previous, 2),
                                            _NEG_INF)) + self.emitted[t]
        return alpha

    def backward_variables(self):
        """beta (T, N, S): log-probability of the label suffixes from (t, s), each
        sequence starting at its own last step."""
        xp = self.xp
        beta = xp.full(self.emitted.shape, _NEG_INF)
        positions = xp.arange(self.emitted.shape[2])[None, :]
        last = self.ext_lengths[:, None]
        ends = (positions == last - 1) | (positions == last - 2)
        for t in range(self.steps - 1, -1, -1):
            start = (self.data_lengths == t + 1)[:, None] & ends
            following = beta[t + 1] if t + 1 < self.steps else beta[t]
            skip_next = _shifted(xp, self.can_skip, -2, fill=False)
            recursion = _logsumexp3(xp, following, _shifted(xp, following, -1),
                                    xp.where(skip_next, _shifted(xp, following, -2),
                                             _NEG_INF))
            inside = (t + 1 < self.data_lengths)[:, None]
            beta[t] = xp.where(start, 0.0, xp.where(inside, recursion, _NEG_INF)) + \
                self.emitted[t]
        return beta

    def log_likelihood(self, alpha):
        """(N,) log p(label | data): the paths that end at the last label or the blank
        after it, at each sequence's last step."""
        xp = self.xp
        final = alpha[self.data_lengths - 1, xp.arange(self.batch)]  # (N, S)
        last = self.ext_lengths
        end_blank = xp.take_along_axis(final, (last - 1)[:, None], axis=1)[:, 0]
        end_label = xp.take_along_axis(final, xp.maximum(last - 2, 0)[:, None], axis=1)[:, 0]
        end_label = xp.where(last > 1, end_label, _NEG_INF)
        return xp.logaddexp(end_blank, end_label)


def _shifted(xp, values, by: int, fill=_NEG_INF):
    """``values`` moved ``by`` places along its last axis, ``fill`` where nothing came."""
    out = xp.full(values.shape, fill, dtype=values.dtype)
    if by > 0:
        out[..., by:] = values[..., :-by]
    else:
        out[..., :by] = values[..., -by:]
    return out


def _logsumexp3(xp, a, b, c):
    top = xp.maximum(xp.maximum(a, b), c)
    safe = xp.where(xp.isfinite(top), top, 0.0)
    total = xp.exp(a - safe) + xp.exp(b - safe) + xp.exp(c - safe)
    with np.errstate(divide="ignore"):
        return xp.where(xp.isfinite(top), xp.log(total) + safe, _NEG_INF)


@ctc_loss.infer
def _(data: TensorType, label: TensorType, *_, **__):
    batch = None if data.shape is None else (data.shape[1],)
    return [TensorType(data.dtype, batch)]


@ctc_loss_grad.infer
def _(data: TensorType, *_, **__):
    return [TensorType(data.dtype, data.shape)]


@ctc_loss.grad
def _(b, node, dy):
    if dy[0] is None:
        return [None] * len(node.inputs)
    inputs = list(node.inputs) + [""] * (4 - len(node.inputs))
    grad = b.emit("CTCLossGrad", *[name or None for name in inputs], dy[0], domain=MIXRT,
                  **node.attributes)
    return [grad] + [None] * (len(node.inputs) - 1)
