"""MXNet's evaluation metrics (``mx.metric``): the same classes, names, aliases, arguments and
values.

    acc = mixrt.metric.create("acc")
    acc.update(labels=[nd.array([0, 1])], preds=[nd.array([[0.9, 0.1], [0.2, 0.8]])])
    acc.get()                       # ("accuracy", 1.0)

``update(labels, preds)`` takes lists of arrays (NDArrays, NumPy or CuPy arrays) or a single
array each. Every metric keeps a local and a global tally: ``reset_local`` clears the
local one (``get``), ``reset`` both (``get_global``). Regression metrics average per batch
(``num_inst`` counts batches), as MXNet's do; classification metrics per sample.
``create`` takes a registered name or alias (case-insensitive), a callable (a
``CustomMetric``), a list (a ``CompositeEvalMetric``), a metric, or a config dict.
"""

from __future__ import annotations

import math

import numpy  # not "np": mx.metric.np is a function of its own, defined last

from mixrt.base.errors import InputError, ShapeError
from mixrt.metric_base import (CompositeEvalMetric, CustomMetric, EvalMetric,  # noqa: F401
                               alias, as_host, check_label_shapes, create, np_metric,
                               register)
from mixrt.metric_values import (MAE, MSE, RMSE, Caffe, CrossEntropy, Loss,  # noqa: F401
                                 NegativeLogLikelihood, PearsonCorrelation, Perplexity, Torch)


# -- classification ----------------------------------------------------------------------------

@register
@alias("acc")
class Accuracy(EvalMetric):
    """Share of predictions equal to the label; scores are reduced by arg-max along
    ``axis`` where their shape differs from the label's."""

    def __init__(self, axis=1, name="accuracy", output_names=None, label_names=None):
        super().__init__(name, axis=axis, output_names=output_names, label_names=label_names,
                         has_global_stats=True)
        self.axis = axis

    def update(self, labels, preds) -> None:
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            label, pred = as_host(label), as_host(pred)
            if pred.shape != label.shape:
                pred = pred.argmax(axis=self.axis)
            pred, label = pred.astype(numpy.int32).ravel(), label.astype(numpy.int32).ravel()
            check_label_shapes(label, pred)
            self._add((pred == label).sum(), len(pred))


@register
@alias("top_k_accuracy", "top_k_acc")
class TopKAccuracy(EvalMetric):
    """Share of samples whose label is among the ``top_k`` highest scores."""

    def __init__(self, top_k=1, name="top_k_accuracy", output_names=None, label_names=None):
        super().__init__(name, top_k=top_k, output_names=output_names,
                         label_names=label_names, has_global_stats=True)
        self.top_k = top_k
        if self.top_k <= 1:
            raise InputError("Please use Accuracy if top_k is no more than 1")
        self.name += f"_{self.top_k}"

    def update(self, labels, preds) -> None:
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            scores = as_host(pred).astype(numpy.float32)
            if scores.ndim > 2:
                raise ShapeError(f"TopKAccuracy: predictions should be no more than 2 dims, "
                                 f"got shape {scores.shape}")
            ranked = numpy.argpartition(scores, -self.top_k)
            label = as_host(label).astype(numpy.int32)
            check_label_shapes(label, ranked)
            if ranked.ndim == 1:
                correct = (ranked.ravel() == label.ravel()).sum()
                self.sum_metric += correct  # MXNet counts it locally only
            else:
                classes = ranked.shape[1]
                correct = sum((ranked[:, classes - 1 - j].ravel() == label.ravel()).sum()
                              for j in range(min(classes, self.top_k)))
                self.sum_metric += correct
                self.global_sum_metric += correct
            self.num_inst += ranked.shape[0]
            self.global_num_inst += ranked.shape[0]


class _BinaryCounts:
    """True/false positives/negatives of a two-class problem, local and global."""

    def __init__(self):
        self.reset_stats()

    def update_binary_stats(self, label, pred) -> None:
        pred, label = as_host(pred), as_host(label).astype(numpy.int32)
        predicted = pred.argmax(axis=1)
        check_label_shapes(label, pred)
        if len(numpy.unique(label)) > 2:
            raise InputError(f"{type(self).__name__} currently only supports binary "
                             f"classification.")
        positive, truth = predicted == 1, label == 1
        counts = {"tp": (positive & truth).sum(), "fp": (positive & ~truth).sum(),
                  "fn": (~positive & truth).sum(), "tn": (~positive & ~truth).sum()}
        for key, value in counts.items():
            self.local[key] += value
            self.total[key] += value

    def reset_stats(self) -> None:
        self.local = dict.fromkeys(("tp", "fp", "fn", "tn"), 0)
        self.total = dict(self.local)

    def local_reset_stats(self) -> None:
        self.local = dict.fromkeys(("tp", "fp", "fn", "tn"), 0)

    def examples(self, use_global: bool = False) -> int:
        return sum((self.total if use_global else self.local).values())

    def fscore(self, use_global: bool = False) -> float:
        c = self.total if use_global else self.local
        precision = float(c["tp"]) / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] > 0 else 0.0
        recall = float(c["tp"]) / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] > 0 else 0.0
        if precision + recall > 0:
            return 2 * precision * recall / (precision + recall)
        return 0.0

    def matthewscc(self, use_global: bool = False) -> float:
        c = self.total if use_global else self.local
        if not self.examples(use_global):
            return 0.0
        tp, fp, fn, tn = (float(c[k]) for k in ("tp", "fp", "fn", "tn"))
        denominator = 1.0
        for term in (tp + fp, tp + fn, tn + fp, tn + fn):
            if term != 0.0:  # a zero margin counts as 1, as in MXNet
                denominator *= term
        return (tp * tn - fp * fn) / math.sqrt(denominator)


class _BinaryMetric(EvalMetric):
    """F1 and MCC: one score per batch averaged ('macro'), or over all samples ('micro')."""

    def __init__(self, name, output_names, label_names, average):
        self.average = average
        self._counts = _BinaryCounts()
        super().__init__(name, output_names=output_names, label_names=label_names,
                         has_global_stats=True)

    def _score(self, use_global: bool) -> float:
        raise NotImplementedError

    def update(self, labels, preds) -> None:
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            self._counts.update_binary_stats(label, pred)
        if self.average == "macro":
            self._add_separately(self._score(False), self._score(True), 1)
            self._counts.reset_stats()
        else:
            self.sum_metric = self._score(False) * self._counts.examples()
            self.global_sum_metric = self._score(True) * self._counts.examples(True)
            self.num_inst = self._counts.examples()
            self.global_num_inst = self._counts.examples(True)

    def _add_separately(self, local, total, count) -> None:
        self.sum_metric += local
        self.global_sum_metric += total
        self.num_inst += count
        self.global_num_inst += count

    def reset(self) -> None:
        super().reset()
        self._counts.reset_stats()

    def reset_local(self) -> None:
        super().reset_local()
        self._counts.local_reset_stats()


@register
class F1(_BinaryMetric):
    """F1 score of a binary classifier (class 1 is the positive class)."""

    def __init__(self, name="f1", output_names=None, label_names=None, average="macro"):
        super().__init__(name, output_names, label_names, average)

    def _score(self, use_global):
        return self._counts.fscore(use_global)


@register
class MCC(_BinaryMetric):
    """Matthews correlation coefficient of a binary classifier."""

    def __init__(self, name="mcc", output_names=None, label_names=None, average="macro"):
        super().__init__(name, output_names, label_names, average)

    def _score(self, use_global):
        return self._counts.matthewscc(use_global)

    def reset(self) -> None:
        super().reset()
        self.num_inst = self.global_num_inst = 0.0  # MXNet's MCC counts in floats

    def reset_local(self) -> None:
        super().reset_local()
        self.num_inst = 0.0


@register
class PCC(EvalMetric):
    """Pearson correlation of the multi-class confusion matrix (MCC for k classes); it
    grows as new classes appear."""

    def __init__(self, name="pcc", output_names=None, label_names=None,
                 has_global_stats=True):
        self.k = 2
        super().__init__(name=name, output_names=output_names, label_names=label_names,
                         has_global_stats=has_global_stats)

    def _grow(self, extra: int) -> None:
        self.lcm = numpy.pad(self.lcm, ((0, extra), (0, extra)))
        self.gcm = numpy.pad(self.gcm, ((0, extra), (0, extra)))
        self.k += extra

    @staticmethod
    def _calc_mcc(matrix) -> float:
        n = matrix.sum()
        x, y = matrix.sum(axis=1), matrix.sum(axis=0)
        cov_xx, cov_yy = numpy.sum(x * (n - x)), numpy.sum(y * (n - y))
        if cov_xx == 0 or cov_yy == 0:
            return float("nan")
        cov_xy = numpy.sum(matrix.diagonal() * n - x * y)
        return cov_xy / (cov_xx * cov_yy) ** 0.5

    def update(self, labels, preds) -> None:
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            label, pred = as_host(label).astype(numpy.int32), as_host(pred)
            pred = pred.argmax(axis=1) if pred.shape != label.shape else pred.astype(numpy.int32)
            n = max(pred.max(), label.max())
            if n >= self.k:
                self._grow(int(n) + 1 - self.k)
            batch = numpy.zeros((self.k, self.k))
            numpy.add.at(batch, (pred.ravel(), label.ravel()), 1)
            self.lcm += batch
            self.gcm += batch
        self.num_inst += 1
        self.global_num_inst += 1

    @property
    def sum_metric(self):  # derived from the confusion matrix
        return self._calc_mcc(self.lcm) * self.num_inst

    @property
    def global_sum_metric(self):
        return self._calc_mcc(self.gcm) * self.global_num_inst

    def reset(self) -> None:
        self.global_num_inst = 0.0
        self.gcm = numpy.zeros((self.k, self.k))
        self.reset_local()

    def reset_local(self) -> None:
        self.num_inst = 0.0
        self.lcm = numpy.zeros((self.k, self.k))


np = np_metric  # MXNet's mx.metric.np(numpy_feval)

__all__ = ["EvalMetric", "CompositeEvalMetric", "Accuracy", "TopKAccuracy", "F1", "MCC",
           "PCC", "Perplexity", "MAE", "MSE", "RMSE", "CrossEntropy", "NegativeLogLikelihood",
           "PearsonCorrelation", "Loss", "Torch", "Caffe", "CustomMetric", "create", "register",
           "alias", "check_label_shapes", "np"]
