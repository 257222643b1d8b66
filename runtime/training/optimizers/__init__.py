"""MXNet's optimizers, one file each: a module of this package that defines ``DEFINITION``
(``definition.Definition``) is an optimizer, found here by its file alone. From each
definition come the engine's ``mxnet_<name>`` kind (``engine_kind.py``; what a parameter
server rebuilds from a spec), the nd update operators ``mixrt.optimizer_ops`` offers, and
the state and spec of MXNet's class of that name in ``mixrt/optimizers/``.

``definition.py`` and ``engine_kind.py`` are the machinery; every other module is one
optimizer.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from mixrt.runtime.training.optimizers.engine_kind import engine_kind

_MACHINERY = {"definition", "engine_kind"}


@functools.lru_cache(maxsize=None)
def definitions() -> dict:
    """Every optimizer definition of this package, by MXNet's name."""
    found = {}
    for module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
        if module in _MACHINERY:
            continue
        definition = importlib.import_module(f"{__name__}.{module}").DEFINITION
        found[definition.name] = definition
    return found


def definition(name: str):
    """The definition of MXNet's optimizer ``name`` (``"sgd"``, ``"adam"``, ...)."""
    return definitions()[name]


@functools.lru_cache(maxsize=None)
def engine_kinds() -> dict:
    """The engine kinds made from the definitions with an engine step, by spec name."""
    return {d.engine_name: engine_kind(d) for d in definitions().values() if d.step}


__all__ = ["definitions", "definition", "engine_kinds"]
