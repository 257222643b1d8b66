"""Evaluation metrics with MXNet's interface: ``update(labels, preds)``, ``get()``,
``reset()``; ``create("acc")`` by name. Padded samples (a DataBatch's ``pad``) are excluded by
the caller passing only the real rows."""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError


class EvalMetric:
    name = "metric"

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.total, self.count = 0.0, 0

    def get(self) -> tuple[str, float]:
        return self.name, (self.total / self.count if self.count else float("nan"))

    def update(self, labels, preds) -> None:
        raise NotImplementedError


class Accuracy(EvalMetric):
    """Share of samples whose arg-max class (axis 1 of the scores) is the label."""
    name = "accuracy"

    def update(self, labels, preds) -> None:
        labels, preds = np.asarray(labels), np.asarray(preds)
        chosen = preds.argmax(axis=1) if preds.ndim > labels.ndim else preds
        self.total += float((chosen.reshape(labels.shape) == labels).sum())
        self.count += labels.size


class TopKAccuracy(EvalMetric):
    def __init__(self, top_k: int = 5):
        self.top_k = int(top_k)
        self.name = f"top_{self.top_k}_accuracy"
        super().__init__()

    def update(self, labels, preds) -> None:
        labels, preds = np.asarray(labels), np.asarray(preds)
        best = np.argsort(-preds, axis=1)[:, :self.top_k]
        self.total += float((best == labels.reshape(-1, 1)).any(axis=1).sum())
        self.count += labels.size


class CrossEntropy(EvalMetric):
    """Mean negative log-probability of the label under softmax(scores)."""
    name = "cross_entropy"

    def update(self, labels, preds) -> None:
        labels, scores = np.asarray(labels).astype(np.int64), np.asarray(preds, np.float64)
        shifted = scores - scores.max(axis=1, keepdims=True)
        log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        self.total += float(-log_prob[np.arange(len(labels)), labels].sum())
        self.count += len(labels)


class MSE(EvalMetric):
    name = "mse"

    def update(self, labels, preds) -> None:
        diff = np.asarray(preds, np.float64) - np.asarray(labels, np.float64).reshape(
            np.shape(preds))
        self.total += float((diff * diff).sum())
        self.count += diff.size


class MAE(EvalMetric):
    name = "mae"

    def update(self, labels, preds) -> None:
        diff = np.asarray(preds, np.float64) - np.asarray(labels, np.float64).reshape(
            np.shape(preds))
        self.total += float(np.abs(diff).sum())
        self.count += diff.size


METRICS = {"acc": Accuracy, "accuracy": Accuracy, "top_k_accuracy": TopKAccuracy,
           "ce": CrossEntropy, "cross_entropy": CrossEntropy, "mse": MSE, "mae": MAE}


def create(metric) -> EvalMetric:
    """A metric from a name (``"acc"``, ``"ce"``, ``"mse"``, ...) or an EvalMetric."""
    if isinstance(metric, EvalMetric):
        return metric
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}; choose one of {sorted(METRICS)}")
    return METRICS[metric]()
