"""``mxnet.numpy`` (``mx.np``), MXNet's NumPy-compatible array API, which mixrt does not have.

MXNet 1.x code imports it beside the legacy API it mostly runs on (``import mxnet.numpy as
_mx_np`` at the top of a file, used only under ``use_np``), so the module is importable;
every name asked of it fails with an AttributeError that says what is missing and what to
use instead. ``mixrt.util`` refuses the NumPy-semantics scopes the same way.
"""


def __getattr__(name: str):
    if name.startswith("__"):  # the import system's own probes (__path__, __file__, ...)
        raise AttributeError(f"module 'mixrt.numpy' has no attribute {name!r}")
    raise AttributeError(f"module 'mixrt.numpy' has no attribute {name!r}: mixrt does not "
                         f"provide MXNet's NumPy-compatible array API (mx.np); mixrt.nd has "
                         f"the NDArray API")
