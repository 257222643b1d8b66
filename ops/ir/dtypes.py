"""ONNX element types and their NumPy dtypes.

The narrow floating and integer types ONNX defines (bfloat16, the float8 family, int4, ...)
come from ``ml_dtypes``, the same package onnx itself uses, so an array read from a model file
has exactly the dtype our kernels see.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

# ONNX TensorProto.DataType value -> NumPy dtype. Strings are object arrays of ``str``.
_ONNX_TO_NUMPY = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    8: np.dtype(object),
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
    14: np.dtype(np.complex64),
    15: np.dtype(np.complex128),
    16: np.dtype(ml_dtypes.bfloat16),
    17: np.dtype(ml_dtypes.float8_e4m3fn),
    18: np.dtype(ml_dtypes.float8_e4m3fnuz),
    19: np.dtype(ml_dtypes.float8_e5m2),
    20: np.dtype(ml_dtypes.float8_e5m2fnuz),
    21: np.dtype(ml_dtypes.uint4),
    22: np.dtype(ml_dtypes.int4),
    23: np.dtype(ml_dtypes.float4_e2m1fn),
    24: np.dtype(ml_dtypes.float8_e8m0fnu),
    25: np.dtype(ml_dtypes.uint2),
    26: np.dtype(ml_dtypes.int2),
    27: np.dtype(ml_dtypes.float6_e2m3fn),
    28: np.dtype(ml_dtypes.float6_e3m2fn),
}
_NUMPY_TO_ONNX = {dtype: code for code, dtype in _ONNX_TO_NUMPY.items()}

ONNX_TYPE_NAMES = {
    1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "string", 9: "bool", 10: "float16", 11: "double", 12: "uint32", 13: "uint64",
    14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8e4m3fn",
    18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz", 21: "uint4", 22: "int4",
    23: "float4e2m1", 24: "float8e8m0", 25: "uint2", 26: "int2", 27: "float6e2m3",
    28: "float6e3m2",
}

# Groups used by dtype constraints (``@op(..., dtypes=FLOATS)``). Names are NumPy's.
FLOATS = frozenset({"float16", "float32", "float64", "bfloat16"})
SIGNED_INTS = frozenset({"int8", "int16", "int32", "int64"})
UNSIGNED_INTS = frozenset({"uint8", "uint16", "uint32", "uint64"})
INTS = SIGNED_INTS | UNSIGNED_INTS
NUMERIC = FLOATS | INTS
BOOL = frozenset({"bool"})
STRING = frozenset({"object"})
FLOAT8 = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                    "float8_e8m0fnu"})
SMALL_INTS = frozenset({"int4", "uint4", "int2", "uint2"})
ALL = None  # no constraint


def to_numpy_dtype(onnx_type: int) -> np.dtype:
    """The NumPy dtype of an ONNX element type; KeyError for an unknown code."""
    return _ONNX_TO_NUMPY[int(onnx_type)]


def to_onnx_type(dtype) -> int:
    """The ONNX element type of a NumPy dtype; KeyError when ONNX has none."""
    return _NUMPY_TO_ONNX[np.dtype(dtype)]


def is_known_onnx_type(onnx_type: int) -> bool:
    return int(onnx_type) in _ONNX_TO_NUMPY


def dtype_name(dtype) -> str:
    """The name used in dtype constraints and error messages ("float32", "object", ...)."""
    return np.dtype(dtype).name


def compute_dtype(dtype) -> np.dtype:
    """The dtype elementwise math on ``dtype`` runs in: float32 for floats narrower than
    that (float16, bfloat16, float8, ...), ``dtype`` itself otherwise."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if is_float(dtype) and dtype.itemsize < 4 else dtype


def sortable(xp, x):
    """``x`` in a dtype the array module can sort. CuPy's sorts (Thrust) have no bfloat16;
    float32 holds every bfloat16 exactly, so on a GPU a bfloat16 array sorts as float32
    and the caller casts the values it returns back. NumPy sorts bfloat16 itself."""
    if xp is not np and x.dtype == _BFLOAT16:
        return x.astype(np.float32)
    return x


def accumulation_dtype(dtype) -> np.dtype:
    """Where long accumulations (recurrences, interpolation) run: float64 stays float64,
    every other type runs in float32."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def is_float(dtype) -> bool:
    """True for every floating type, the ml_dtypes ones included."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype in _ML_FLOATS


_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_ML_FLOATS = frozenset(np.dtype(t) for t in (
    ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn,
    ml_dtypes.float8_e8m0fnu, ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn))

# the dtypes mixrt's fused kernels take. NumPy has no fast half-precision arithmetic, and the
# unfused ops compute narrow floats in float32; fusing them would change more than rounding,
# so only these are fused.
FUSED_DTYPES = frozenset({"float32", "float64"})
