"""Type conversion: Cast, CastLike and BitCast.

``cast_array`` is the one conversion routine (QuantizeLinear uses it too). NumPy's and
ml_dtypes' ``astype`` already do most of what ONNX asks; the exceptions handled here are

* float8 targets clamp to the largest finite value when ``saturate`` is set (the default),
  where ``astype`` gives inf/NaN;
* float8e8m0 rounds by ``round_mode`` (``up`` by default), where ``astype`` rounds to nearest;
* int4/uint4/int2/uint2 from floats truncate and then wrap like the other integer targets;
* strings are parsed and printed on the host (object arrays cannot live on a GPU).

The narrow ml_dtypes types exist only in NumPy, so their conversions run on the CPU.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from mixrt.ops.ir.dtypes import ONNX_TYPE_NAMES, to_numpy_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType

_NARROW_FLOATS = frozenset(np.dtype(t) for t in (
    ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float8_e8m0fnu,
    ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn))
_NARROW_INTS = frozenset(np.dtype(t) for t in (
    ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2))
# the float8 types whose overflow behaviour ``saturate`` selects
SATURATING_FLOAT8 = frozenset(np.dtype(t) for t in (
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e5m2fnuz))
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
STRING = np.dtype(object)
ROUND_MODES = ("up", "down", "nearest")

_ONNX_CODES_BY_NAME = {name.upper(): code for code, name in ONNX_TYPE_NAMES.items()}


def target_dtype(to) -> np.dtype:
    """The dtype named by a Cast ``to`` attribute: a TensorProto code, or (opset 1) a name."""
    if to is None:
        raise ValueError("Cast requires the 'to' attribute")
    if isinstance(to, (str, bytes)):
        name = to.decode() if isinstance(to, bytes) else to
        if name.upper() not in _ONNX_CODES_BY_NAME:
            raise ValueError(f"Cast: unknown type name {name!r}; expected one of "
                             f"{', '.join(sorted(_ONNX_CODES_BY_NAME))}")
        to = _ONNX_CODES_BY_NAME[name.upper()]
    try:
        return to_numpy_dtype(int(to))
    except KeyError:
        raise ValueError(f"Cast: unknown ONNX element type {to}; expected one of "
                         f"{sorted(ONNX_TYPE_NAMES)}") from None


def bit_width(dtype) -> int:
    """Bits per element as ONNX counts them (int4 is 4 bits, though ml_dtypes stores a byte)."""
    dtype = np.dtype(dtype)
    return _NARROW_BITS.get(dtype.name, dtype.itemsize * 8)


_NARROW_BITS = {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "float4_e2m1fn": 4,
                "float6_e2m3fn": 6, "float6_e3m2fn": 6}


# -- conversion --------------------------------------------------------------------------------

def cast_array(xp, x, dtype, *, saturate=1, round_mode="up"):
    """``x`` converted to ``dtype`` by the ONNX Cast rules."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x.copy()
    if dtype == STRING:
        return _to_strings(x)
    if x.dtype == STRING:
        return xp.asarray(cast_array(np, _parse_strings(x, dtype), dtype,
                                     saturate=saturate, round_mode=round_mode))
    x = _widen(x)
    with np.errstate(invalid="ignore", over="ignore"):
        if dtype == E8M0:
            return _to_e8m0(xp, x, saturate=saturate, round_mode=round_mode)
        if dtype in SATURATING_FLOAT8 and saturate:
            return _clip_to_finite(xp, x, dtype).astype(dtype)
        if dtype in _NARROW_INTS and x.dtype.kind == "f":
            # truncate, then keep the low bits as every other integer target does
            x = x.astype(np.int64)
        return x.astype(dtype)


def _widen(x):
    """The ml_dtypes narrow types as float32/int8, which hold every value exactly and which
    every target converts from (ml_dtypes lacks some narrow-to-narrow casts)."""
    if x.dtype in _NARROW_FLOATS:
        return x.astype(np.float32)
    if x.dtype in _NARROW_INTS:
        return x.astype(np.int8)
    return x


def _clip_to_finite(xp, x, dtype):
    """Out-of-range values (infinities included) clamped to the target's largest finite value;
    NaN stays NaN. Clamping before rounding gives the same result as after."""
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    limit = float(ml_dtypes.finfo(dtype).max)
    return xp.clip(x, -limit, limit)


def _to_e8m0(xp, x, *, saturate, round_mode):
    """float8e8m0 (a bare power-of-two exponent, bias 127, 0xFF = NaN) by ``round_mode``.

    Negative inputs are undefined in the spec; their magnitude is used."""
    if round_mode not in ROUND_MODES:
        raise ValueError(f"Cast: round_mode must be one of {ROUND_MODES}, got {round_mode!r}")
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    elif x.dtype.itemsize < 4:
        x = x.astype(np.float32)
    magnitude = xp.abs(x)
    # magnitude = mantissa * 2**exponent with mantissa in [0.5, 1)
    mantissa, exponent = xp.frexp(magnitude)
    if round_mode == "up":
        power = exponent - (mantissa == 0.5)  # exact powers of two stay, others go up
    elif round_mode == "down":
        power = exponent - 1
    else:  # nearest, ties up: the midpoint of [2**(e-1), 2**e) is mantissa 0.75
        power = exponent - (mantissa < 0.75)
    biased = power.astype(np.int32) + 127
    too_large = (biased > 254) | xp.isinf(magnitude)
    if round_mode == "up":
        biased = xp.maximum(biased, 0)  # rounding up never leaves the range at the small end
    too_small = (biased < 0) | (magnitude == 0)
    if saturate:
        biased = xp.where(too_large, 254, xp.where(too_small, 0, biased))
    else:
        biased = xp.where(too_large | too_small, 255, biased)
    biased = xp.where(xp.isnan(magnitude), 255, biased)
    return biased.astype(np.uint8).view(E8M0)


# -- strings -----------------------------------------------------------------------------------

_SPECIAL_STRINGS = {"nan": math.nan, "+nan": math.nan, "-nan": math.nan, "inf": math.inf,
                    "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
                    "+infinity": math.inf, "-infinity": -math.inf, "true": 1, "false": 0}


def _parse_number(text):
    """An int when the text is an integer literal (exact beyond 2**53), else a float."""
    if isinstance(text, bytes):
        text = text.decode()
    text = str(text).strip()
    special = _SPECIAL_STRINGS.get(text.lower())
    if special is not None:
        return special
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"Cast: cannot convert the string {text!r} to a number") from None


def _parse_strings(x, dtype):
    """Host array of parsed numbers, in a dtype from which ``cast_array`` reaches ``dtype``:
    exact 64-bit integers for integer targets (decimals truncated), float64 otherwise."""
    x = np.asarray(x, dtype=object)
    values = [_parse_number(s) for s in x.ravel()]
    if _is_integer(dtype):
        ints = [int(v) if isinstance(v, int) or math.isfinite(v) else 0 for v in values]
        if all(-2**63 <= v < 2**63 for v in ints):
            return np.array(ints, dtype=np.int64).reshape(x.shape)
        # keep the low 64 bits, as integer casts do
        return np.array([v & (2**64 - 1) for v in ints], dtype=np.uint64).reshape(x.shape)
    return np.array([float(v) for v in values], dtype=np.float64).reshape(x.shape)


def _is_integer(dtype) -> bool:
    return dtype.kind in "iu" or dtype in _NARROW_INTS


def _format_number(value) -> str:
    """Plain text for one NumPy scalar: the shortest digits that read back as the same value
    of its type; "NaN", "INF" and "-INF" as Cast parses them."""
    if isinstance(value, np.bool_):
        return "1" if value else "0"
    if _is_integer(value.dtype):
        return str(int(value))
    if value.dtype.kind == "c":
        return str(value)
    as_float = float(value)
    if math.isnan(as_float):
        return "NaN"
    if math.isinf(as_float):
        return "INF" if as_float > 0 else "-INF"
    return str(value)


def _to_strings(x):
    """Object array of str; string tensors live on the host, so GPU data is copied here."""
    host = x.get() if hasattr(x, "get") else np.asarray(x)
    texts = [_format_number(v) for v in host.ravel()]
    return np.array(texts, dtype=object).reshape(host.shape)


# -- Cast, CastLike ------------------------------------------------------------------------------

@op("Cast", since=6)
@op("Cast", since=1)
def cast(xp, input, *, to=None):
    return cast_array(xp, input, target_dtype(to))


@op("Cast", since=28)
@op("Cast", since=25)
@op("Cast", since=24)
def cast_24(xp, input, *, to=None, saturate=1, round_mode="up"):
    return cast_array(xp, input, target_dtype(to), saturate=saturate, round_mode=round_mode)


@op("Cast", since=23)
@op("Cast", since=21)
@op("Cast", since=19)
def cast_19(xp, input, *, to=None, saturate=1):
    return cast_array(xp, input, target_dtype(to), saturate=saturate)


# opsets 9 and 13 only widened the type lists, which one kernel covers
@op("Cast", since=13)
@op("Cast", since=9)
def cast_9(xp, input, *, to=None):
    return cast_array(xp, input, target_dtype(to))


def _cast_infer(input, *, to=None, **_):
    return [TensorType(target_dtype(to), input.shape)]


for _handle in (cast, cast_9, cast_19, cast_24):
    _handle.infer(_cast_infer)


@op("CastLike", since=25)
@op("CastLike", since=24)
def castlike_24(xp, input, target_type, *, saturate=1, round_mode="up"):
    return cast_array(xp, input, target_type.dtype, saturate=saturate, round_mode=round_mode)


@op("CastLike", since=23)
@op("CastLike", since=21)
@op("CastLike", since=19)
def castlike_19(xp, input, target_type, *, saturate=1):
    return cast_array(xp, input, target_type.dtype, saturate=saturate)


@op("CastLike", since=15)
def castlike(xp, input, target_type):
    return cast_array(xp, input, target_type.dtype)


def _castlike_infer(input, target_type, **_):
    return [TensorType(target_type.dtype, input.shape)]


for _handle in (castlike, castlike_19, castlike_24):
    _handle.infer(_castlike_infer)


# -- BitCast -------------------------------------------------------------------------------------

@op("BitCast", since=26)
def bitcast(xp, input, *, to=None):
    """The same bits read as another type of the same width (little endian, as NumPy stores)."""
    dtype = target_dtype(to)
    if dtype == STRING or input.dtype == STRING:
        raise ValueError("BitCast does not accept string tensors")
    if bit_width(dtype) != bit_width(input.dtype):
        raise ValueError(f"BitCast: {input.dtype.name} has {bit_width(input.dtype)} bits but "
                         f"{dtype.name} has {bit_width(dtype)}; the widths must match")
    if dtype.itemsize == 1 and bit_width(dtype) < 8:
        # narrow types keep their bits in the low end of a byte; drop anything above
        bits = input.view(np.uint8) & np.uint8((1 << bit_width(dtype)) - 1)
        return bits.view(dtype)
    return xp.ascontiguousarray(input).view(dtype).reshape(input.shape)


bitcast.infer(_cast_infer)
