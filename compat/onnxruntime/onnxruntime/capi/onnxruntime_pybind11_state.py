"""``onnxruntime.capi.onnxruntime_pybind11_state``: where services import onnxruntime's
exception classes from (``Fail``, ``InvalidArgument``...), and its value classes."""

from mixrt.onnxruntime import *  # noqa: F401,F403
from mixrt.onnxruntime.errors import *  # noqa: F401,F403
from mixrt.onnxruntime.values import OrtValueVector, is_dlpack_uint8_tensor  # noqa: F401
