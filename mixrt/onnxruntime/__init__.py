"""onnxruntime's Python API over mixrt: ``import mixrt.onnxruntime as ort``.

A service written for onnxruntime changes its import and nothing else::

    import mixrt.onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 2
    session = ort.InferenceSession("model.onnx", options,
                                   providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    outputs = session.run(None, {"input": batch})

Each option is honoured or named in an ``OnnxruntimeOptionWarning`` (or refused) where mixrt
has nothing that does what it asks; ``docs/onnxruntime-api.md`` lists what maps, what warns
and what is refused. ``compat/onnxruntime`` installs the ``onnxruntime`` import name as an
alias of this module, for code that cannot change its imports.
"""

from __future__ import annotations

import mixrt
from mixrt.base.errors import OnnxruntimeOptionWarning
from mixrt.onnxruntime import errors as _errors
from mixrt.onnxruntime.errors import (EPFail, Fail, InvalidArgument, InvalidGraph,
                                      InvalidProtobuf, ModelLoaded, NoModel, NoSuchFile,
                                      NotImplemented, RuntimeException, Terminated)
from mixrt.onnxruntime.inference import (InferenceSession, OrtEpAssignedNode,
                                         OrtEpAssignedSubgraph, OrtEpDevice)
from mixrt.onnxruntime.iobinding import IOBinding
from mixrt.onnxruntime.log import (set_default_logger_callback, set_default_logger_severity,
                                   set_default_logger_verbosity)
from mixrt.onnxruntime.model_source import ModelMetadata
from mixrt.onnxruntime.options import (ExecutionMode, ExecutionOrder, GraphOptimizationLevel,
                                       RunOptions, SessionOptions)
from mixrt.onnxruntime.values import (OrtAllocatorType, OrtDevice, OrtDeviceMemoryType,
                                      OrtMemoryInfo, OrtMemoryInfoDeviceType, OrtMemType,
                                      OrtValue, OrtValueVector)
from mixrt.ops.device import gpu_count
from mixrt.ops.random.random import reseed
from mixrt.runtime.onnxruntime_surface import NodeArg
from mixrt.runtime.providers import ALL_PROVIDERS, available_providers

# the onnxruntime release whose Python API this module follows
__version__ = "1.31.1"
version = __version__
EngineError = _errors.EngineError  # onnxruntime's name; mixrt.errors has its own EngineError


def get_available_providers() -> list[str]:
    return available_providers()


def get_all_providers() -> list[str]:
    return list(ALL_PROVIDERS)


def get_device() -> str:
    return "GPU" if gpu_count() > 0 else "CPU"


def get_version_string() -> str:
    return __version__


def get_build_info() -> str:
    return f"mixrt {mixrt.__version__} Build Info: onnxruntime Python API {__version__}"


def set_seed(seed: int) -> None:
    """Seed the random operators that have no seed attribute (RandomNormal, Multinomial...)."""
    reseed(int(seed))


def enable_telemetry_events() -> None:
    """mixrt sends no telemetry; there is nothing to turn on or off."""


def disable_telemetry_events() -> None:
    """mixrt sends no telemetry; there is nothing to turn on or off."""


__all__ = [
    "InferenceSession", "SessionOptions", "RunOptions", "GraphOptimizationLevel",
    "ExecutionMode", "ExecutionOrder", "IOBinding", "ModelMetadata", "NodeArg", "OrtValue",
    "OrtValueVector", "OrtDevice", "OrtMemoryInfo", "OrtMemType", "OrtAllocatorType",
    "OrtDeviceMemoryType", "OrtMemoryInfoDeviceType", "OrtEpDevice", "OrtEpAssignedNode",
    "OrtEpAssignedSubgraph", "OnnxruntimeOptionWarning", "Fail", "InvalidArgument",
    "NoSuchFile", "NoModel", "EngineError", "RuntimeException", "InvalidProtobuf",
    "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail", "Terminated",
    "get_available_providers", "get_all_providers", "get_device", "get_version_string",
    "get_build_info", "set_seed", "set_default_logger_severity",
    "set_default_logger_verbosity", "set_default_logger_callback", "enable_telemetry_events",
    "disable_telemetry_events", "__version__",
]
