"""The optimizers, one file each, found here by their files alone.

A module that defines ``DEFINITION`` (``definition.Definition``) is one of MXNet's
optimizers: its rules, hyper-parameters, state slots, engine step, GPU launch and nd
operators. From it come the engine's ``mxnet_<name>`` kind (``engine_kind.py``; what a
parameter server rebuilds from a spec), the nd update operators ``mixrt.optimizer_ops``
offers, and the state and spec of MXNet's class of that name in ``mixrt/optimizers/``.

A module that defines ``KINDS`` holds engine kinds written as classes, with their GPU
launches: the ``torch_*`` modules, PyTorch's rules (``sgd``, ``adam``, ``adamw``,
``rmsprop``, ``adagrad``, ``lamb``).

``definition.py`` and ``engine_kind.py`` are the machinery; every other module is an
optimizer.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from mixrt.runtime.training.optimizers.engine_kind import engine_kind

_MACHINERY = {"definition", "engine_kind"}


@functools.lru_cache(maxsize=None)
def _modules() -> tuple:
    """Every optimizer module of this package, in the order of their names."""
    return tuple(importlib.import_module(f"{__name__}.{name}")
                 for name in sorted(info.name for info in pkgutil.iter_modules(__path__))
                 if name not in _MACHINERY)


@functools.lru_cache(maxsize=None)
def definitions() -> dict:
    """Every definition of MXNet's optimizers here, by MXNet's name."""
    found = (module.DEFINITION for module in _modules() if hasattr(module, "DEFINITION"))
    return {definition.name: definition for definition in found}


@functools.lru_cache(maxsize=None)
def engine_kinds() -> dict:
    """Every engine kind by its spec name: those written as classes (a module's ``KINDS``),
    then one made from each definition with an engine step."""
    kinds = {kind.name: kind for module in _modules() for kind in getattr(module, "KINDS", ())}
    kinds.update({d.engine_name: engine_kind(d) for d in definitions().values() if d.step})
    return kinds


__all__ = ["definitions", "engine_kinds"]
