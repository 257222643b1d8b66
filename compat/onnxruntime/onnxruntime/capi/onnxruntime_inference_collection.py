"""``onnxruntime.capi.onnxruntime_inference_collection``: onnxruntime's Python classes."""

from mixrt.onnxruntime import *  # noqa: F401,F403
from mixrt.onnxruntime.inference import check_and_normalize_provider_args  # noqa: F401
