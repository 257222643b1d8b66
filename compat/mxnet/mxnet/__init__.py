"""``mxnet``, an alias of :mod:`mixrt` module for module, for code written against MXNet 1.x.

``import mxnet.gluon.nn`` gives the module object ``mixrt.gluon.nn`` itself (one module,
two names in ``sys.modules``), so ``mxnet.nd is mixrt.nd`` and a class is the same class
under both names. Nothing is defined here but the version: every MXNet name lives in mixrt's
own module under the same dotted path, and a name mixrt lacks fails as it would in mixrt.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

import mixrt

_REAL = "mixrt"

# the MXNet release whose API mixrt follows, then what actually serves it (a PEP 440 local
# version label): MXNet-era libraries compare ``mx.__version__`` with a minimum through
# packaging.version or LooseVersion, and both read this as 1.9.1
__version__ = f"1.9.1+mixrt.{mixrt.__version__}"


def _real_child(parent: types.ModuleType, child: str, alias: str) -> types.ModuleType:
    """The module ``child`` of the real module ``parent``: a submodule, or a module that
    ``parent`` names under an MXNet synonym (``mixrt.ndarray`` is ``mixrt.nd``)."""
    full_name = f"{parent.__name__}.{child}"
    try:
        return importlib.import_module(full_name)
    except ModuleNotFoundError as missing:
        if missing.name != full_name:
            raise  # the module exists but something it imports does not
        found = getattr(parent, child, None)
        if isinstance(found, types.ModuleType):
            return found
        raise ModuleNotFoundError(f"No module named {alias!r}: mixrt has no module "
                                  f"{full_name!r}", name=alias) from None


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system an already-loaded mixrt module; it keeps its own name,
    spec and file, so tracebacks and pickling name the real module."""

    def __init__(self, module: types.ModuleType):
        self.module = module
        self.real_spec = module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        # executed once already, as a mixrt module; the import system has just set its
        # __spec__ to the alias's, which would make importlib.reload load it as mxnet.*
        module.__spec__ = self.real_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``mxnet.a.b`` to the module its parent ``mxnet.a`` really is, plus ``b``."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        parent_alias, _, child = fullname.rpartition(".")
        parent = sys.modules.get(parent_alias) or importlib.import_module(parent_alias)
        real_parent = mixrt if parent is sys.modules[__name__] else parent
        module = _real_child(real_parent, child, fullname)
        is_package = hasattr(module, "__path__")
        return importlib.util.spec_from_loader(fullname, _AliasLoader(module),
                                               is_package=is_package)


def __getattr__(name: str):
    return getattr(mixrt, name)


def __dir__():
    return sorted(set(dir(mixrt)) | {"__version__"})


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())
