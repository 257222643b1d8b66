"""mixrt's operators: one module per family, all registered in :data:`REGISTRY`.

Importing this package imports every module in it (sorted by name, so registration order is
stable), which registers its kernels. A new family is a new module; nothing else to edit.
"""

import importlib
import pkgutil

from mixrt.ops.registry import REGISTRY, Kernel, op

_INFRASTRUCTURE = {"registry", "types", "dtypes"}

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in _INFRASTRUCTURE and not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")

__all__ = ["REGISTRY", "Kernel", "op"]
