"""The engine's ``mxnet_*`` kinds, one made from each optimizer definition that has an
engine step (``definition.py``): what a parameter server rebuilds from the spec that
``mixrt.optimizer``'s optimizer of that name sends, so that it steps as the worker's process
does. The gradient's rescale and clip happen inside MXNet's rule, in MXNet's order, and
every hyper-parameter is rounded to a C float as MXNet's operators take it (a float64
weight computes in double with those values)."""

from __future__ import annotations

from mixrt.ops.device import array_module
from mixrt.runtime.training.optimizer_base import Optimizer, _key


class MXNetKind(Optimizer):
    """The base of the kinds ``engine_kind(definition)`` makes: the definition's
    hyper-parameters kept as attributes (checked against their ranges), its state slots,
    its step and its multi-tensor GPU step."""

    definition = None  # set on each kind made

    def __init__(self, **params):
        self.__dict__.update(self.definition.take_hyper(self._owner, params))
        super().__init__(**params)

    def hyper_params(self) -> dict:
        return {hyper.name: getattr(self, hyper.name) for hyper in self.definition.hyper}

    def state_slots(self) -> tuple[str, ...]:
        return tuple(self.definition.slots(self.hyper_params()))

    def update(self, key, weight, grad, state: dict) -> None:
        key = _key(key)
        self._check(key, weight, grad, state)
        lr, wd, t = self._advance(key)
        weight[...] = self.definition.step(self, array_module(weight), weight, grad, state,
                                           lr, wd, t)

    def _updates_many(self) -> bool:
        return self.definition.step_many is not None and self.definition.takes_many(self)

    def _apply_many(self, xp, weights, grads, states, lrs, wds, counts) -> bool:
        return self.definition.step_many(self, xp, weights, grads, states, lrs, wds, counts)


def engine_kind(definition) -> type[MXNetKind]:
    """The kind ``mxnet_<definition.name>`` (``MXNetSgd``, ``MXNetAdam``, ...)."""
    title = "".join(part.capitalize() for part in definition.name.split("_"))
    return type(f"MXNet{title}", (MXNetKind,), {
        "name": definition.engine_name, "definition": definition,
        "default_learning_rate": definition.default_learning_rate,
        "__doc__": f"MXNet's {definition.name} as an engine kind (runtime/training/"
                   f"optimizers/{definition.name}.py).",
        "__module__": __name__})


__all__ = ["MXNetKind", "engine_kind"]
