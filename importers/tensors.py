"""A TensorProto's values as a NumPy array, without importing onnx for the common forms.

Exporters store weights as little-endian ``raw_data`` and small constants in the typed
fields (``float_data``, ``int64_data``, ...; skl2onnx writes its coefficients so); those are
read here directly. What remains (the packed sub-byte types, float8 and complex numbers in
the typed fields, any tensor on a big-endian machine) goes to ``onnx.numpy_helper``, which
reads every form the spec allows.
"""

from __future__ import annotations

import sys

import numpy as np

from mixrt.ops.ir.dtypes import to_numpy_dtype

STRING = 8
# element types whose raw_data is one element per itemsize bytes, read as it lies
_PLAIN_RAW = frozenset({1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 24})
# element type -> the typed field that holds it, where the field's values convert directly
_TYPED_FIELD = {1: "float_data", 11: "double_data", 6: "int32_data", 7: "int64_data",
                2: "int32_data", 3: "int32_data", 12: "uint64_data", 13: "uint64_data"}
# each typed field's own element type, read as that before the cast to the tensor's: NumPy
# guessed float64 for protobuf 6's uint64 container past 2^63 (a UINT64 tensor's large
# values came out 0), where protobuf 7's container told it uint64
_FIELD_DTYPE = {"float_data": np.float32, "double_data": np.float64, "int32_data": np.int32,
                "int64_data": np.int64, "uint64_data": np.uint64}
# element types stored as bit patterns in int32_data: the width of each pattern
_BITS_IN_INT32 = {4: np.uint16, 5: np.uint16, 10: np.uint16, 16: np.uint16, 9: np.uint8}


def to_array(tensor) -> np.ndarray:
    """The tensor's values (not its external data: the caller reads that); ValueError,
    TypeError or UnicodeDecodeError for values that do not fit the declared type and shape."""
    if tensor.HasField("segment"):
        raise ValueError("tensor segments are not supported")
    code, dims = int(tensor.data_type), tuple(tensor.dims)
    dtype = to_numpy_dtype(code)
    if code == STRING:
        texts = [raw.decode("utf-8") for raw in tensor.string_data]
        return np.asarray(texts, dtype=object).reshape(dims)
    little_endian = sys.byteorder == "little"
    if tensor.HasField("raw_data") and code in _PLAIN_RAW and little_endian:
        return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(dims)
    if not tensor.HasField("raw_data") and little_endian:
        if code in _TYPED_FIELD:
            field = _TYPED_FIELD[code]
            values = np.fromiter(getattr(tensor, field), dtype=_FIELD_DTYPE[field])
            return values.astype(dtype).reshape(dims)
        if code in _BITS_IN_INT32:
            bits = np.asarray(tensor.int32_data, dtype=np.int32).view(np.uint32)
            return bits.astype(_BITS_IN_INT32[code]).view(dtype).reshape(dims)
    from onnx import numpy_helper  # noqa: PLC0415  (the rare forms: onnx reads them all)
    return numpy_helper.to_array(tensor)
