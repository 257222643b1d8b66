"""mixrt's operators, one package per family, all registered in :data:`REGISTRY`.

The families (``ops/conv/``, ``ops/nn/``, ``ops/attention/``, ...) each hold their operators'
definitions, shape rules and gradients, then their CPU kernels registered beside them.
Below them sit layers the families share: ``ops/ir/`` (the registry, value types and
dtypes) with the device layer (``device.py``, ``device_checks.py``), then ``ops/compiled/``
(the compiled-kernel machinery and thread pools) and ``ops/panels/`` (the packed-panel
kernels and their native worker pool). None of them imports a family, and nothing in
``ops/`` imports the runtime (``tests/test_layers.py``).

Importing this package imports every public module of every package in it, sorted by
dotted name so that registration order is stable, which registers their kernels. A new
operator goes into its family's package; a new family is a new package; nothing else to
edit.
"""

import importlib
import pkgutil

from mixrt.ops.ir.registry import REGISTRY, Kernel, op

for _module in sorted(m.name for m in pkgutil.walk_packages(__path__, f"{__name__}.")):
    if not _module.rsplit(".", 1)[-1].startswith("_"):
        importlib.import_module(_module)

__all__ = ["REGISTRY", "Kernel", "op"]
