"""MXNet-style classes made for the optimizer definitions no class here is written for: adding
an optimizer is one file of ``runtime/training/optimizers/``, and ``mixrt.optimizer.create``
(a Trainer's, a Module's ``init_optimizer``) finds it by its name as it finds MXNet's.

A made class takes ``learning_rate`` (the definition's default) and the definition's
hyper-parameters by name, with their defaults and ranges, besides MXNet's common arguments;
its state is a tuple of the slots' arrays; each update runs the definition's first nd
operator (with ``lr``, ``wd`` and, where the operator declares it, the update count ``t``),
or, without one, its engine step on the arrays' data.
"""

from __future__ import annotations

from mixrt.ops.device import array_module
from mixrt.optimizers.base import Optimizer
from mixrt.runtime.training.optimizers import definitions


def made_class(definition) -> type:
    """The MXNet-style class of ``definition``, named after it (``my_rule`` -> MyRule)."""
    title = "".join(part.capitalize() for part in definition.name.split("_"))
    owner = f"optimizer {definition.name!r}"

    def __init__(self, learning_rate=definition.default_learning_rate, **kwargs):
        hyper = definition.take_hyper(owner, kwargs)
        Optimizer.__init__(self, learning_rate=learning_rate, **kwargs)
        self.__dict__.update(hyper)

    return type(title, (Optimizer,), {
        "__init__": __init__, "update": _update, "definition": definition,
        "__doc__": f"The optimizer of runtime/training/optimizers/{definition.name}.py, "
                   f"made from its definition.", "__module__": __name__})


def _update(self, index, weight, grad, state):
    self._update_count(index)
    lr, wd = self._get_lr(index), self._get_wd(index)
    t = self._index_update_count[index]
    if self.definition.operators:
        self._apply_operator(self.definition.operators[0].name, weight, grad, state, lr=lr,
                             wd=wd, t=t)
        return
    slots = self.definition.slots(self.engine_hyper())
    states = dict(zip(slots, (array._write() for array in state or ())))
    w = weight._write()
    w[...] = self.definition.step(self, array_module(w), w, grad._read(), states, lr, wd, t)


def register_made(registry) -> list:
    """A made class for each definition ``registry`` has no class for, registered under the
    definition's name; returns them."""
    made = [made_class(d) for name, d in definitions().items() if name not in registry]
    for klass in made:
        registry.register(klass)
        registry.alias(klass.definition.name)(klass)
    return made


__all__ = ["made_class", "register_made"]
