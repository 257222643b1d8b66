"""mixrt: an embeddable inference and training runtime with ONNX as its interchange format.

    import mixrt
    session = mixrt.Session("model.onnx", device="cpu")      # or mixrt.load(...)
    outputs = session.run(None, {"input": array})
"""

from __future__ import annotations

import os
import sys


# whether NumPy (and so its OpenBLAS) was loaded before mixrt: then the BLAS policy
# (runtime/blas_policy.py) re-tunes the loaded library instead of setting its environment
_NUMPY_FIRST = "numpy" in sys.modules

from mixrt.runtime import blas_policy  # noqa: E402  (loads neither NumPy nor OpenBLAS)

blas_policy.before_numpy()

from mixrt import errors  # noqa: E402,F401

if _NUMPY_FIRST:
    blas_policy.after_numpy(stacklevel=2)
from mixrt.base.errors import MXNetError  # noqa: E402,F401  (MXNet's top-level name)
from mixrt.context import Context, cpu, current_context, gpu  # noqa: E402
from mixrt.runtime.format import is_mxr, load_mxr  # noqa: E402
from mixrt.base.run_options import RunOptions  # noqa: E402
from mixrt.runtime.session import NodeArg, Session, register_loader  # noqa: E402

__version__ = "0.1.0"


def _is_onnx_source(source) -> bool:
    from mixrt.importers.proto import is_model_proto  # noqa: PLC0415  (protobuf: on first load)
    return isinstance(source, (bytes, bytearray, memoryview, str, os.PathLike)) or \
        is_model_proto(source)


def _import_onnx(source):
    from mixrt.importers.onnx import import_model  # noqa: PLC0415  (protobuf: on first load)
    return import_model(source)


register_loader(_is_onnx_source, _import_onnx)
register_loader(is_mxr, load_mxr)  # tried first: .mxr files are recognised by content


def load(model, device: str = "cpu", **options) -> Session:
    """A :class:`Session` for ``model`` (a path, bytes, an onnx.ModelProto or a Graph)."""
    return Session(model, device=device, **options)


# submodules reachable as attributes of ``mixrt`` without importing each (``mixrt.sym``,
# ``mixrt.random.seed``), loaded on first use so that ``import mixrt`` stays light
_LAZY_SUBMODULES = frozenset({"sym", "random", "initializer", "init", "optimizer",
                              "lr_scheduler", "gluon", "io", "metric", "module", "models",
                              "model", "callback", "kv", "nd", "autograd", "context",
                              "profiler", "viz", "test_utils", "util", "numpy",
                              "name", "attribute", "operator", "engine", "image",
                              "rnn", "monitor", "contrib"})

# MXNet's other names for the same modules (``mx.ndarray`` is ``mx.nd``, ``mx.mod`` is
# ``mx.module``): code written against MXNet finds them under its own dotted paths
_MXNET_SYNONYMS = {"ndarray": "nd", "symbol": "sym", "mod": "module", "rnd": "random",
                   "visualization": "viz", "np": "numpy", "mon": "monitor"}


# MXNet's top-level switches of NumPy semantics, which live in mixrt.util
_UTIL_NAMES = frozenset({"np_shape", "is_np_shape", "is_np_array", "use_np", "np_array",
                         "set_np_shape", "use_np_shape", "use_np_array"})


def __getattr__(name: str):
    if name == "AttrScope":  # MXNet's top-level name for mixrt.attribute.AttrScope
        import importlib  # noqa: PLC0415
        return importlib.import_module("mixrt.attribute").AttrScope
    if name in _UTIL_NAMES:
        import importlib  # noqa: PLC0415
        return getattr(importlib.import_module("mixrt.util"), name)
    name = _MXNET_SYNONYMS.get(name, name)
    if name in _LAZY_SUBMODULES:
        import importlib  # noqa: PLC0415
        return importlib.import_module(f"mixrt.{name}")
    raise AttributeError(f"module 'mixrt' has no attribute {name!r}")


__all__ = ["Session", "NodeArg", "RunOptions", "load", "errors", "cpu", "gpu", "Context", "current_context",
           "MXNetError", "__version__"]
