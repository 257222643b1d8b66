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
# Triton's model configuration names the datatypes by its DataType enum (TYPE_FP32 = 11)
CONFIG_TYPES = {"BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6,
                "INT16": 7, "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12,
                "BYTES": 13}
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
    if isinstance(data, np.ndarray):  # decoded already (KServe's InferInput.as_numpy)
        if data.size != count:
            raise InputError(f"input '{spec.name}': {data.size} values for shape "
                             f"{list(shape)}, which holds {count}")
        data = data.reshape(-1).tolist() if datatype == "BYTES" \
            else np.ascontiguousarray(data).tobytes()
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
        # read as JSON wrote them first, so that 1.5 for INT32, null for FP32 or "x" for
        # BOOL is refused rather than truncated, read as NaN or as true
        written = np.asarray(values) if values else np.zeros(0, dtype)
        if dtype.kind in "iu" and written.dtype.kind not in "iu" \
                and all(type(v) is int for v in values):  # past int64: NumPy made floats
            written = np.array(values, dtype=dtype)
        if written.dtype.kind not in _JSON_KINDS[dtype.kind]:
            raise TypeError(f"{written.dtype.kind!r} values")
        array = written.astype(dtype)
        if dtype.kind in "iu" and not np.array_equal(array, written):
            raise OverflowError(f"a value outside {datatype}'s range")
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"input '{spec.name}': its data is not {datatype} "
                         f"({_described(exc)})") from None
    return array.reshape(shape)


# the kinds of array NumPy makes of JSON values that each kind of datatype accepts: integers
# take integers only, floats integers or floats, booleans booleans
_JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


def _described(exc: Exception) -> str:
    text = str(exc)
    return {"'O' values": "null, strings or mixed nesting",
            "'U' values": "strings", "'f' values": "fractions",
            "'b' values": "booleans"}.get(text, text)


def _checked_shape(spec: TensorSpec, datatype: str, shape) -> tuple:
    if datatype not in DATATYPES:
        raise InputError(f"input '{spec.name}': unknown datatype {datatype!r}; the protocol's "
                         f"are {', '.join(DATATYPES)}")
    if datatype != spec.datatype:
        raise InputError(f"input '{spec.name}' is {spec.datatype}, the request sent "
                         f"{datatype}")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
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
        items = [_text(spec, item) if isinstance(item, bytes) else item
                 for item in _flat(data)]
    if not all(isinstance(item, str) for item in items):
        raise InputError(f"input '{spec.name}' is BYTES: its data must be strings")
    if len(items) != count:
        raise InputError(f"input '{spec.name}': {len(items)} strings for shape "
                         f"{list(shape)}, which holds {count}")
    return np.array(items, dtype=object).reshape(shape)


def _text(spec: TensorSpec, raw: bytes) -> str:
    """A BYTES element as the model's string tensor holds it: UTF-8 text (bytes that are
    not are refused, not altered)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"input '{spec.name}': an element is not UTF-8 text ({exc.reason} "
                         f"at byte {exc.start})") from None


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
        items.append(_text(spec, raw[offset:offset + size]))
        offset += size
    return items


def encode(array: np.ndarray) -> tuple[str, list, object]:
    """An output as ``(datatype, shape, data)``, data a flat list (JSON's form)."""
    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind in "US":
        return "BYTES", list(array.shape), [
            v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)
            for v in array.reshape(-1)]
    datatype = datatype_of(array.dtype.newbyteorder("="))
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
    datatype = datatype_of(array.dtype.newbyteorder("="))
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return datatype, list(array.shape), np.ascontiguousarray(little).tobytes()


def datatype_of(dtype: np.dtype) -> str:
    for name, known in DATATYPES.items():
        if known == dtype and name != "BYTES":
            return name
    raise InputError(f"an output of dtype {dtype} has no Open Inference Protocol datatype")
