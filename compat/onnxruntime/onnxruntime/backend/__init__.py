"""``onnxruntime.backend``: ONNX's backend API as onnxruntime offers it, served by mixrt
(``mixrt.onnxruntime.backend``)."""

from mixrt.onnxruntime.backend import *  # noqa: F401,F403
from mixrt.onnxruntime.backend import (  # noqa: F401
    OnnxRuntimeBackendRep, is_compatible, prepare, run, run_model, supports_device)
