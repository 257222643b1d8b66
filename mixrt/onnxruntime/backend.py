"""``onnxruntime.backend``: ONNX's backend API as onnxruntime offers it, over
:class:`~mixrt.onnxruntime.InferenceSession`.

``prepare(model, device="CPU", **options)`` takes a path, bytes or an ``onnx.ModelProto``
(no onnx checker first: onnxruntime runs models the checker refuses, an old IR's initializers
not listed as inputs among them); each keyword sets the SessionOptions or RunOptions field of
that name. ``rep.run(inputs)`` takes the inputs in order, one array, or a dict.
"""

from __future__ import annotations

import numpy as np
import onnx

from mixrt.onnxruntime.errors import InvalidArgument
from mixrt.onnxruntime.inference import InferenceSession
from mixrt.onnxruntime.options import RunOptions, SessionOptions
from mixrt.ops.device import gpu_count

_PROVIDERS = {"CPU": ["CPUExecutionProvider"],
              "CUDA": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


class OnnxRuntimeBackendRep:
    """A prepared model: ``run(inputs)`` answers the outputs in the model's order."""

    def __init__(self, session: InferenceSession, run_options: RunOptions | None):
        self._session = session
        self._run_options = run_options

    def run(self, inputs, **kwargs) -> list:
        del kwargs  # onnx's signature; the run's options were given to prepare
        names = [arg.name for arg in self._session.get_inputs()]
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        elif isinstance(inputs, (list, tuple)):
            if len(inputs) != len(names):
                raise InvalidArgument(f"{len(inputs)} inputs given; the model takes "
                                      f"{len(names)}: {names}")
            feeds = dict(zip(names, inputs))
        else:
            feeds = {names[0]: np.asarray(inputs)}
        return self._session.run(None, feeds, self._run_options)


def supports_device(device: str) -> bool:
    kind = str(device).upper().partition(":")[0]
    return kind == "CPU" or (kind == "CUDA" and gpu_count() > 0)


def is_compatible(model, device: str | None = None, **kwargs) -> bool:
    del model, kwargs
    return supports_device(device or "CPU")


def prepare(model, device: str | None = None, **kwargs) -> OnnxRuntimeBackendRep:
    kind = str(device or "CPU").upper().partition(":")[0]
    if kind not in _PROVIDERS:
        raise InvalidArgument(f"device {device!r}: the backend runs on 'CPU' or 'CUDA'")
    options, run_options = _options(kwargs)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    session = InferenceSession(model, options, providers=_PROVIDERS[kind])
    return OnnxRuntimeBackendRep(session, run_options)


def run_model(model, inputs, device: str | None = None, **kwargs) -> list:
    return prepare(model, device, **kwargs).run(inputs)


run = run_model


def _options(kwargs: dict) -> tuple[SessionOptions, RunOptions | None]:
    options, run_options = SessionOptions(), None
    for name, value in kwargs.items():
        if hasattr(options, name):
            setattr(options, name, value)
        elif hasattr(RunOptions(), name):
            run_options = run_options or RunOptions()
            setattr(run_options, name, value)
        else:
            raise InvalidArgument(f"prepare(..., {name}=...): neither SessionOptions nor "
                                  f"RunOptions has a field {name!r}")
    return options, run_options


__all__ = ["OnnxRuntimeBackendRep", "prepare", "run", "run_model", "supports_device",
           "is_compatible"]
