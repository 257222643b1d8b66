"""mixrt: an embeddable inference and training runtime with ONNX as its interchange format.

    import mixrt
    session = mixrt.Session("model.onnx", device="cpu")      # or mixrt.load(...)
    outputs = session.run(None, {"input": array})
"""

from __future__ import annotations

import os

from mixrt import errors  # noqa: F401
from mixrt.runtime.session import NodeArg, Session, register_loader

__version__ = "0.1.0"


def _is_onnx_source(source) -> bool:
    import onnx  # noqa: PLC0415  (onnx is heavy; import only when a model is loaded)
    if isinstance(source, (bytes, bytearray, memoryview, onnx.ModelProto)):
        return True
    return isinstance(source, (str, os.PathLike))


def _import_onnx(source):
    from mixrt.importers.onnx import import_model  # noqa: PLC0415
    return import_model(source)


register_loader(_is_onnx_source, _import_onnx)


def load(model, device: str = "cpu", **options) -> Session:
    """A :class:`Session` for ``model`` (a path, bytes, an onnx.ModelProto or a Graph)."""
    return Session(model, device=device, **options)


__all__ = ["Session", "NodeArg", "load", "errors", "__version__"]
