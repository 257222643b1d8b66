"""MXNet's ``mx.contrib``: the APIs MXNet 1.x kept beside its stable ones. Here:
``mixrt.contrib.autograd``, the first imperative autograd API (``train_section``,
``mark_variables``, ``grad_and_loss``), over :mod:`mixrt.autograd`; ``contrib.nd`` and
``contrib.sym`` (also ``ndarray``, ``symbol``) are ``mixrt.nd.contrib`` and
``mixrt.sym.contrib``.

MXNet imports ``autograd`` with the package, so ``mx.contrib.autograd.grad_and_loss`` works
without importing the submodule first; so does it here.
"""

from __future__ import annotations

import importlib

from mixrt.contrib import autograd  # noqa: F401  (mx.contrib.autograd, as MXNet imports it)

# MXNet's contrib.nd/contrib.sym: the contrib operators of mx.nd and mx.sym, loaded on first
# use (mixrt.sym is the heavier import)
_OPERATOR_MODULES = {"nd": "mixrt.nd.contrib", "ndarray": "mixrt.nd.contrib",
                     "sym": "mixrt.sym.contrib", "symbol": "mixrt.sym.contrib"}


def __getattr__(name: str):
    if name in _OPERATOR_MODULES:
        return importlib.import_module(_OPERATOR_MODULES[name])
    raise AttributeError(f"module 'mixrt.contrib' has no attribute {name!r}")


__all__ = ["autograd"]
