"""Tensors of the Open Inference Protocol (KServe's v2) and a model's inputs and outputs.

A request's input arrives as ``(name, datatype, shape, data)``: JSON data is a flat list, a
binary one (gRPC's ``raw_input_contents``, REST's binary-tensor extension) a ``bytes``
buffer. Each is checked against the session's declared input before it becomes an array,
so that a wrong name, datatype, element count or shape is refused naming the input and what
the model expects, and never reaches a kernel as garbage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mixrt.base.errors import InputError

# the protocol's datatypes and the element type each names (BYTES: a string tensor)
DATATYPES = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
# ONNX's element type names (a NodeArg's "tensor(float)") and the protocol's
ONNX_TO_DATATYPE = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
    "uint64": "UINT64", "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float": "FP32", "double": "FP64", "string": "BYTES",
}


@dataclass(frozen=True)
class TensorSpec:
    """One declared input or output: its protocol datatype and shape, -1 for a dimension
    the model leaves open (a batch, a sequence)."""

    name: str
    datatype: str
    shape: tuple

    @classmethod
    def of(cls, node_arg) -> "TensorSpec":
        """From a session's ``NodeArg``; a non-tensor value (a sequence, a map) is refused:
        the protocol carries tensors only."""
        type_name = node_arg.type
        if not (type_name.startswith("tensor(") and type_name[7:-1] in ONNX_TO_DATATYPE):
            raise InputError(f"'{node_arg.name}' is a {type_name}: the Open Inference "
                             f"Protocol carries tensors of "
                             f"{', '.join(sorted(ONNX_TO_DATATYPE))} only")
        shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node_arg.shape or ())
        return cls(node_arg.name, ONNX_TO_DATATYPE[type_name[7:-1]], shape)

    @property
    def batched(self) -> bool:
        """Whether the first axis is open, so that requests can be joined along it."""
        return len(self.shape) > 0 and self.shape[0] == -1

    def metadata(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def decode(spec: TensorSpec, datatype: str, shape, data) -> np.ndarray:
    """The request input ``(datatype, shape, data)`` given for ``spec``, as an array."""
    shape = _checked_shape(spec, datatype, shape)
    count = math.prod(shape)
    if datatype == "BYTES":
        return _decode_strings(spec, shape, count, data)
    dtype = DATATYPES[datatype]
    if isinstance(data, (bytes, bytearray, memoryview)):
        if len(data) != count * dtype.itemsize:
            raise InputError(f"input '{spec.name}': {len(data)} bytes of binary data for "
                             f"{datatype} of shape {list(shape)}, which takes "
                             f"{count * dtype.itemsize}")
        return np.frombuffer(data, dtype).reshape(shape)
    values = _flat(data)
    if len(values) != count:
        raise InputError(f"input '{spec.name}': {len(values)} values for shape "
                         f"{list(shape)}, which holds {count}")
    try:
        array = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"input '{spec.name}': its data is not {datatype} ({exc})") from None
    return array.reshape(shape)


def _checked_shape(spec: TensorSpec, datatype: str, shape) -> tuple:
    if datatype not in DATATYPES:
        raise InputError(f"input '{spec.name}': unknown datatype {datatype!r}; the protocol's "
                         f"are {', '.join(DATATYPES)}")
    if datatype != spec.datatype:
        raise InputError(f"input '{spec.name}' is {spec.datatype}, the request sent "
                         f"{datatype}")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InputError(f"input '{spec.name}': shape {list(shape)} has a dimension that is "
                         f"not a count")
    shape = tuple(shape)
    if len(shape) != len(spec.shape) or any(
            want not in (-1, got) for want, got in zip(spec.shape, shape)):
        raise InputError(f"input '{spec.name}' takes shape {list(spec.shape)} (-1: any "
                         f"size), the request sent {list(shape)}")
    return shape


def _flat(data) -> list:
    """JSON tensor data, which clients send flat or nested row by row, as one flat list."""
    if not isinstance(data, list) or not data or not isinstance(data[0], list):
        return data if isinstance(data, list) else [data]
    flat: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _decode_strings(spec: TensorSpec, shape: tuple, count: int, data) -> np.ndarray:
    if isinstance(data, (bytes, bytearray, memoryview)):
        items = _unpack_length_prefixed(spec, bytes(data))
    else:
        items = [item.decode("utf-8", "replace") if isinstance(item, bytes) else item
                 for item in _flat(data)]
    if len(items) != count or not all(isinstance(item, (str, bytes)) for item in items):
        raise InputError(f"input '{spec.name}': {len(items)} strings for shape "
                         f"{list(shape)}, which holds {count}")
    return np.array(items, dtype=object).reshape(shape)


def _unpack_length_prefixed(spec: TensorSpec, raw: bytes) -> list:
    """The binary form of a BYTES tensor: each element a 4-byte little-endian length and
    its bytes."""
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise InputError(f"input '{spec.name}': binary BYTES data ends inside a length")
        size = int.from_bytes(raw[offset:offset + 4], "little")
        offset += 4
        if offset + size > len(raw):
            raise InputError(f"input '{spec.name}': an element of {size} bytes runs past the "
                             f"end of its binary data")
        items.append(raw[offset:offset + size].decode("utf-8", "replace"))
        offset += size
    return items


def encode(array: np.ndarray) -> tuple[str, list, object]:
    """An output as ``(datatype, shape, data)``, data a flat list (JSON's form)."""
    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind in "US":
        return "BYTES", list(array.shape), [str(v) for v in array.reshape(-1)]
    datatype = datatype_of(array.dtype)
    return datatype, list(array.shape), array.reshape(-1).tolist()


def encode_binary(array: np.ndarray) -> tuple[str, list, bytes]:
    """An output as ``(datatype, shape, raw bytes)``: little-endian, row-major, strings
    length-prefixed, as the protocol's binary form has them."""
    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind in "US":
        parts = []
        for value in array.reshape(-1):
            encoded = value if isinstance(value, bytes) else str(value).encode("utf-8")
            parts += [len(encoded).to_bytes(4, "little"), encoded]
        return "BYTES", list(array.shape), b"".join(parts)
    datatype = datatype_of(array.dtype)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return datatype, list(array.shape), np.ascontiguousarray(little).tobytes()


def datatype_of(dtype: np.dtype) -> str:
    for name, known in DATATYPES.items():
        if known == dtype and name != "BYTES":
            return name
    raise InputError(f"an output of dtype {dtype} has no Open Inference Protocol datatype")
