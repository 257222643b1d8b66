"""mixrt: an embeddable inference and training runtime with ONNX as its interchange format."""

from mixrt import errors  # noqa: F401

__version__ = "0.1.0"
