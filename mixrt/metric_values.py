"""MXNet's metrics of values and probabilities: MAE, MSE, RMSE, CrossEntropy,
NegativeLogLikelihood, Perplexity, PearsonCorrelation, Loss (Torch, Caffe), with MXNet's
names, aliases and arithmetic (``mixrt.metric`` is the public module).

MAE, MSE, RMSE and macro PearsonCorrelation take one value per batch and average the batches;
the probability metrics sum over samples.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.base.errors import ShapeError
from mixrt.metric_base import EvalMetric, alias, as_host, check_label_shapes, register


def _columns(array: np.ndarray) -> np.ndarray:
    """A 1-D label or prediction as a column, as MXNet's regression metrics shape them."""
    return array.reshape(array.shape[0], 1) if array.ndim == 1 else array


class _PerBatch(EvalMetric):
    """A regression metric: ``value(label, pred)`` per batch, averaged over batches."""

    def __init__(self, name, output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names,
                         has_global_stats=True)

    def update(self, labels, preds) -> None:
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            self._add(self.value(_columns(as_host(label)), _columns(as_host(pred))), 1)

    @staticmethod
    def value(label, pred):
        raise NotImplementedError


@register
class MAE(_PerBatch):
    """Mean absolute error."""

    def __init__(self, name="mae", output_names=None, label_names=None):
        super().__init__(name, output_names, label_names)

    @staticmethod
    def value(label, pred):
        return np.abs(label - pred).mean()


@register
class MSE(_PerBatch):
    """Mean squared error."""

    def __init__(self, name="mse", output_names=None, label_names=None):
        super().__init__(name, output_names, label_names)

    @staticmethod
    def value(label, pred):
        return ((label - pred) ** 2.0).mean()


@register
class RMSE(_PerBatch):
    """Root mean squared error (of each batch, then averaged)."""

    def __init__(self, name="rmse", output_names=None, label_names=None):
        super().__init__(name, output_names, label_names)

    @staticmethod
    def value(label, pred):
        return np.sqrt(((label - pred) ** 2.0).mean())


class _LabelProbability(EvalMetric):
    """Sum of ``-log(p[label] + eps)`` over samples, ``pred`` holding probabilities."""

    def __init__(self, eps, name, output_names, label_names):
        super().__init__(name, eps=eps, output_names=output_names, label_names=label_names,
                         has_global_stats=True)
        self.eps = eps

    def update(self, labels, preds) -> None:
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            label, pred = as_host(label).ravel(), as_host(pred)
            if label.shape[0] != pred.shape[0]:
                raise ShapeError(f"{type(self).__name__}: {label.shape[0]} labels for "
                                 f"{pred.shape[0]} predictions")
            chosen = pred[np.arange(label.shape[0], dtype=np.int64), np.int64(label)]
            self._add((-np.log(chosen + self.eps)).sum(), label.shape[0])


@register
@alias("ce")
class CrossEntropy(_LabelProbability):
    """Cross entropy of the label under predicted probabilities (not scores)."""

    def __init__(self, eps=1e-12, name="cross-entropy", output_names=None, label_names=None):
        super().__init__(eps, name, output_names, label_names)


@register
@alias("nll_loss")
class NegativeLogLikelihood(_LabelProbability):
    """Negative log-likelihood of the label under predicted probabilities."""

    def __init__(self, eps=1e-12, name="nll-loss", output_names=None, label_names=None):
        super().__init__(eps, name, output_names, label_names)


@register
class Perplexity(EvalMetric):
    """``exp`` of the mean negative log-probability of the labels, leaving out those equal
    to ``ignore_label``; probabilities along ``axis``."""

    def __init__(self, ignore_label, axis=-1, name="perplexity", output_names=None,
                 label_names=None):
        super().__init__(name, ignore_label=ignore_label, output_names=output_names,
                         label_names=label_names, has_global_stats=True)
        self.ignore_label = ignore_label
        self.axis = axis

    def update(self, labels, preds) -> None:
        check_label_shapes(labels, preds)
        loss, count = 0.0, 0
        for label, pred in zip(labels, preds):
            label, pred = as_host(label), as_host(pred)
            if label.size != pred.size / pred.shape[-1]:
                raise ShapeError(f"shape mismatch: {label.shape} vs. {pred.shape}")
            label = label.reshape(label.size).astype(np.int32)
            classes = pred.shape[self.axis]
            rows = np.moveaxis(pred, self.axis, -1).reshape(label.size, classes)
            index = np.clip(label, 0, classes - 1).reshape(-1, 1)  # pick's 'clip' mode
            picked = np.take_along_axis(rows, index, axis=1)[:, 0]
            if self.ignore_label is not None:
                ignore = (label == self.ignore_label).astype(picked.dtype)
                count -= float(ignore.sum())  # MXNet's count turns float here
                picked = picked * (1 - ignore) + ignore
            loss -= float(np.log(np.maximum(picked.dtype.type(1e-10), picked)).sum(
                dtype=picked.dtype))
            count += picked.size
        self._add(loss, count)

    def get(self):
        if self.num_inst == 0:
            return self.name, float("nan")
        return self.name, math.exp(self.sum_metric / self.num_inst)

    def get_global(self):
        if self.global_num_inst == 0:
            return self.name, float("nan")
        return self.name, math.exp(self.global_sum_metric / self.global_num_inst)


@register
@alias("pearsonr")
class PearsonCorrelation(EvalMetric):
    """Pearson's r of predictions and labels: per batch and averaged ('macro'), or over
    everything seen, from running means and sums of squares ('micro')."""

    def __init__(self, name="pearsonr", output_names=None, label_names=None, average="macro"):
        self.average = average
        super().__init__(name, output_names=output_names, label_names=label_names,
                         has_global_stats=True)

    def reset(self) -> None:
        super().reset()
        if self.average == "micro":
            self.reset_micro()

    def reset_micro(self) -> None:
        self._sse_p = self._mean_p = self._sse_l = self._mean_l = 0
        self._pred_nums = self._label_nums = 0
        self._conv = 0

    @staticmethod
    def update_variance(new_values, count, mean, m_2):
        """Welford's update of (count, mean, sum of squared deviations) by a batch."""
        count += len(new_values)
        delta = new_values - mean
        mean += np.sum(delta / count)
        m_2 += np.sum(delta * (new_values - mean))
        return count, mean, m_2

    def update_cov(self, label, pred) -> None:
        self._conv = self._conv + np.sum((label - self._mean_l) * (pred - self._mean_p))

    def update(self, labels, preds) -> None:
        labels, preds = check_label_shapes(labels, preds, True)
        for label, pred in zip(labels, preds):
            check_label_shapes(label, pred, False, True)
            label = as_host(label).ravel().astype(np.float64)
            pred = as_host(pred).ravel().astype(np.float64)
            if self.average == "macro":
                self._add(np.corrcoef(pred, label)[0, 1], 1)
                continue
            self.num_inst += 1
            self.global_num_inst += 1
            self._label_nums, self._mean_l, self._sse_l = self.update_variance(
                label, self._label_nums, self._mean_l, self._sse_l)
            self.update_cov(label, pred)
            self._pred_nums, self._mean_p, self._sse_p = self.update_variance(
                pred, self._pred_nums, self._mean_p, self._sse_p)

    def get(self):
        if self.num_inst == 0:
            return self.name, float("nan")
        if self.average == "macro":
            return self.name, self.sum_metric / self.num_inst
        n = self._label_nums
        spread = np.sqrt(self._sse_p / (n - 1)) * np.sqrt(self._sse_l / (n - 1))
        return self.name, self._conv / ((n - 1) * spread)


@register
class Loss(EvalMetric):
    """The mean of the predictions themselves (a loss the network outputs); labels are
    ignored."""

    def __init__(self, name="loss", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names,
                         has_global_stats=True)

    def update(self, _, preds) -> None:
        for pred in [preds] if hasattr(preds, "shape") else preds:
            pred = as_host(pred)
            self._add(float(pred.sum(dtype=pred.dtype)), pred.size)


@register
class Torch(Loss):
    """MXNet's name for Loss over a Torch module's output."""

    def __init__(self, name="torch", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names)


@register
class Caffe(Loss):
    """MXNet's name for Loss over a Caffe operator's output."""

    def __init__(self, name="caffe", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names)


__all__ = ["MAE", "MSE", "RMSE", "CrossEntropy", "NegativeLogLikelihood", "Perplexity",
           "PearsonCorrelation", "Loss", "Torch", "Caffe"]
