"""``onnxruntime.capi._pybind_state``: onnxruntime's C classes by their C names."""

from onnxruntime.capi.onnxruntime_pybind11_state import *  # noqa: F401,F403
from onnxruntime.capi.onnxruntime_pybind11_state import (  # noqa: F401
    OrtValueVector, is_dlpack_uint8_tensor)
