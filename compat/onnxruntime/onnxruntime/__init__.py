"""The ``onnxruntime`` import name, served by mixrt: ``mixrt.onnxruntime`` under the name
code written for onnxruntime imports. Nothing of onnxruntime's own is here."""

from mixrt.onnxruntime import *  # noqa: F401,F403
from mixrt.onnxruntime import __all__, __version__  # noqa: F401

from onnxruntime import capi  # noqa: E402,F401  (onnxruntime.capi, as code reaches it)
