"""ONNX's protobuf messages (ModelProto, TensorProto, ...) built with protobuf alone.

Importing the ``onnx`` package costs ~45 ms of CPU and its schema registry ~12 ms more: most of
what loading a small model took. Loading needs neither. The messages come from onnx-ml.proto's
compiled descriptor (``onnx-ml.desc``, written by ``tools/onnx_tables.py`` from the installed
onnx), added to a pool of our own so that they never clash with onnx's classes when a program
imports both; the wire format is the same, so a file parses alike with either.

A model handed over as onnx's own ``ModelProto`` keeps its classes: the importer only reads
fields, and what it builds beside a message it builds with that message's own classes
(``sibling``), so the two families never meet in one message.
"""

from __future__ import annotations

import functools
from pathlib import Path

from google.protobuf import descriptor_pool, message_factory

DESCRIPTOR_FILE = Path(__file__).resolve().parent / "onnx-ml.desc"
PACKAGE = "onnx"


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(DESCRIPTOR_FILE.read_bytes())
    return pool


@functools.cache
def message(name: str):
    """Our class of the ONNX message ``name`` (``"ModelProto"``, ``"TensorProto"``, ...)."""
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"{PACKAGE}.{name}"))


def sibling(instance, name: str):
    """The class of the ONNX message ``name`` in the same family as ``instance`` (ours, or
    onnx's for a message the caller made with onnx)."""
    pool = instance.DESCRIPTOR.file.pool
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))


def is_model_proto(value) -> bool:
    """Whether ``value`` is an ONNX ModelProto, ours or onnx's (without importing onnx)."""
    descriptor = getattr(value, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", None) == f"{PACKAGE}.ModelProto"


def tensor_type(type_class, elem_type: int, shape) -> object:
    """A TypeProto (of ``type_class``) for a tensor of ``elem_type``; ``shape`` None leaves
    the shape unset, and a None or negative dimension is left unknown."""
    made = type_class()
    tensor = made.tensor_type
    tensor.elem_type = int(elem_type)
    if shape is not None:
        dims = tensor.shape.dim
        tensor.shape.SetInParent()  # a scalar's shape is set and empty, not missing
        for size in shape:
            dim = dims.add()
            if isinstance(size, str):
                dim.dim_param = size
            elif size is not None and int(size) >= 0:
                dim.dim_value = int(size)
    return made
