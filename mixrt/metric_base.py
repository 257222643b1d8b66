"""What every metric of ``mixrt.metric`` shares: the ``EvalMetric`` base class with its local
and global tallies, the registry and ``create``, ``CompositeEvalMetric`` and ``CustomMetric``
(MXNet's ``mx.metric`` names; ``mixrt.metric`` is the public module)."""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np

from mixrt.base.errors import InputError, ShapeError
from mixrt.ops.device import to_host
from mixrt.registry import Registry


class MetricShapeError(ShapeError, ValueError):
    """Labels and predictions that do not pair up (MXNet raises ValueError)."""


def as_host(array) -> np.ndarray:
    """An NDArray, CuPy or NumPy array (or nested list) as a NumPy array."""
    if hasattr(array, "asnumpy"):
        return array.asnumpy()
    return np.asarray(to_host(array)) if hasattr(array, "shape") else np.asarray(array)


def check_label_shapes(labels, preds, wrap: bool = False, shape: bool = False):
    """MXNet's check: as many labels as predictions (or, with ``shape``, equal shapes);
    with ``wrap`` a single array becomes a list of one."""
    found = (np.shape(labels), np.shape(preds)) if shape else (len(labels), len(preds))
    if found[0] != found[1]:
        raise MetricShapeError(f"Shape of labels {found[0]} does not match shape of "
                               f"predictions {found[1]}")
    if wrap:
        labels, preds = _listed(labels), _listed(preds)
    return labels, preds


def _listed(value):
    return [value] if hasattr(value, "shape") else value


class EvalMetric:
    """Base class: a name, output and label names for ``update_dict``, and two tallies."""

    def __init__(self, name, output_names=None, label_names=None, **kwargs):
        self.name = str(name)
        self.output_names = output_names
        self.label_names = label_names
        self._has_global_stats = kwargs.pop("has_global_stats", False)
        self._kwargs = kwargs
        self.reset()

    def __str__(self) -> str:
        return f"EvalMetric: {dict(self.get_name_value())}"

    def get_config(self) -> dict:
        """The metric's arguments; ``create(config)`` rebuilds it."""
        config = self._kwargs.copy()
        config.update({"metric": type(self).__name__, "name": self.name,
                       "output_names": self.output_names, "label_names": self.label_names})
        return config

    def update_dict(self, label: dict, pred: dict) -> None:
        """``update`` with the arrays ``label_names``/``output_names`` pick (all of them,
        in order, when those are None)."""
        preds = [pred[name] for name in self.output_names] if self.output_names is not None \
            else list(pred.values())
        labels = [label[name] for name in self.label_names] if self.label_names is not None \
            else list(label.values())
        self.update(labels, preds)

    def update(self, labels, preds) -> None:
        raise NotImplementedError(f"{type(self).__name__} defines no update")

    def _add(self, value, count) -> None:
        """Add to both tallies."""
        self.sum_metric += value
        self.global_sum_metric += value
        self.num_inst += count
        self.global_num_inst += count

    def reset(self) -> None:
        self.num_inst = 0
        self.sum_metric = 0.0
        self.global_num_inst = 0
        self.global_sum_metric = 0.0

    def reset_local(self) -> None:
        self.num_inst = 0
        self.sum_metric = 0.0

    def get(self):
        return self.name, mean_of(self.sum_metric, self.num_inst)

    def get_global(self):
        if not self._has_global_stats:
            return self.get()
        return self.name, mean_of(self.global_sum_metric, self.global_num_inst)

    def get_name_value(self) -> list:
        return _pairs(*self.get())

    def get_global_name_value(self) -> list:
        return _pairs(*self.get_global()) if self._has_global_stats else self.get_name_value()


def mean_of(total, count):
    """``total / count`` as MXNet 1.x computes it: in float64 (its tallies are float64
    scalars under NumPy 1.x's promotion), NaN for no instances. A scalar comes back as a
    Python float, the type MXNet documents for a metric's value, so it compares equal to
    the same number in any float dtype under NumPy 2's promotion too."""
    if count == 0:
        return float("nan")
    if np.ndim(total) == 0:
        return float(total) / count
    return np.asarray(total, dtype=np.float64) / count


def _pairs(name, value) -> list:
    names = name if isinstance(name, list) else [name]
    values = value if isinstance(value, list) else [value]
    return list(zip(names, values))


# -- the registry ---------------------------------------------------------------------------

_REGISTRY = Registry(None, lambda name, known: InputError(
    f"unknown metric {name!r}; registered: {known}"))
register = _REGISTRY.register  # a metric class under its lower-cased name
alias = _REGISTRY.alias  # ... and under more names


def create(metric, *args, **kwargs) -> EvalMetric:
    """A metric from a name or alias, a callable ``feval(label, pred)``, a list of any of
    these (a composite), a metric (returned as is), or a ``get_config()`` dict or its JSON."""
    if isinstance(metric, EvalMetric):
        return metric
    if callable(metric) and not isinstance(metric, type):  # a feval(label, pred)
        return CustomMetric(metric, *args, **kwargs)
    if isinstance(metric, list):
        composite = CompositeEvalMetric()
        for child in metric:
            composite.add(create(child, *args, **kwargs))
        return composite
    if isinstance(metric, str) and metric.lstrip().startswith(("{", "[")):
        return create(json.loads(metric), *args, **kwargs)
    if isinstance(metric, dict):
        config = dict(metric)
        return create(config.pop("metric"), *args, **{**config, **kwargs})
    return _REGISTRY.find(metric)(*args, **kwargs)


@register
@alias("composite")
class CompositeEvalMetric(EvalMetric):
    """Several metrics updated together; ``get`` returns lists of names and values."""

    def __init__(self, metrics=None, name="composite", output_names=None, label_names=None):
        super().__init__(name, output_names=output_names, label_names=label_names,
                         has_global_stats=True)
        self.metrics = [create(m) for m in (metrics or [])]

    def add(self, metric) -> None:
        self.metrics.append(create(metric))

    def get_metric(self, index):
        """The ``index``-th child (MXNet returns, not raises, a ValueError past the end)."""
        try:
            return self.metrics[index]
        except IndexError:
            return ValueError(f"Metric index {index} is out of range 0 and {len(self.metrics)}")

    def update_dict(self, labels, preds) -> None:
        if self.label_names is not None:
            labels = OrderedDict(i for i in labels.items() if i[0] in self.label_names)
        if self.output_names is not None:
            preds = OrderedDict(i for i in preds.items() if i[0] in self.output_names)
        for metric in self.metrics:
            metric.update_dict(labels, preds)

    def update(self, labels, preds) -> None:
        for metric in self.metrics:
            metric.update(labels, preds)

    def reset(self) -> None:
        for metric in getattr(self, "metrics", ()):
            metric.reset()

    def reset_local(self) -> None:
        for metric in self.metrics:
            metric.reset_local()

    def get(self):
        return _joined(metric.get() for metric in self.metrics)

    def get_global(self):
        return _joined(metric.get_global() for metric in self.metrics)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"metrics": [m.get_config() for m in self.metrics]})
        return config


def _joined(results) -> tuple[list, list]:
    names, values = [], []
    for name, value in results:
        names.extend(name if isinstance(name, list) else [name])
        values.extend(value if isinstance(value, list) else [value])
    return names, values



@register
class CustomMetric(EvalMetric):
    """A metric from ``feval(label, pred)`` on NumPy arrays, which returns a value (one
    instance) or ``(sum, count)``."""

    def __init__(self, feval, name=None, allow_extra_outputs=False, output_names=None,
                 label_names=None):
        if name is None:
            name = feval.__name__
            if "<" in name:
                name = f"custom({name})"
        super().__init__(name, feval=feval, allow_extra_outputs=allow_extra_outputs,
                         output_names=output_names, label_names=label_names,
                         has_global_stats=True)
        self._feval = feval
        self._allow_extra_outputs = allow_extra_outputs

    def update(self, labels, preds) -> None:
        if not self._allow_extra_outputs:
            labels, preds = check_label_shapes(labels, preds, True)
        for pred, label in zip(preds, labels):
            result = self._feval(as_host(label), as_host(pred))
            if isinstance(result, tuple):
                self._add(*result)
            else:
                self._add(result, 1)

    def get_config(self) -> dict:
        raise NotImplementedError("CustomMetric cannot be serialized")


def np_metric(numpy_feval, name=None, allow_extra_outputs=False) -> CustomMetric:
    """MXNet's ``mx.metric.np``: a CustomMetric from a function of NumPy arrays."""
    def feval(label, pred):
        return numpy_feval(label, pred)
    feval.__name__ = numpy_feval.__name__
    return CustomMetric(feval, name, allow_extra_outputs)
