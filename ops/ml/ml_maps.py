"""The ``ai.onnx.ml`` operators that make or read maps: ZipMap (a classifier's probabilities
as one {label: probability} dict per row, every skl2onnx classifier's default output),
DictVectorizer and CastMap (dict inputs to a row of features).

A map is a host Python dict and a sequence of maps a list of them, as onnxruntime's and onnx's
Python APIs hand them over (``ops/ir/types.MapType``). Session converts a fed dict's keys to int
or str and its values to NumPy scalars of the declared type, so the kernels here read the
value type off the values. Maps never enter the arena or a GPU: these kernels work on the
host and put numeric outputs on ``xp``'s device.
"""

from __future__ import annotations

import re

import numpy as np

from mixrt.ops.ml.ml import ML
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import MapType, SequenceType, tensor
from mixrt.ops.device import to_host


# -- ZipMap -------------------------------------------------------------------------------

@op("ZipMap", since=1, domain=ML, dtypes=frozenset({"float32"}))
def zip_map(xp, X, *, classlabels_int64s=None, classlabels_strings=None):
    """One dict per row of X ([N, classes], or [classes] as one row): label -> value. Keys
    are in sorted order and a repeated label keeps its last column, as onnxruntime's
    std::map does; values are Python floats, as onnxruntime returns them."""
    keys = _keys("ZipMap", int64s=classlabels_int64s, strings=classlabels_strings,
                 prefix="classlabels_").tolist()  # Python ints and strs, as dict keys
    data = to_host(X)
    if data.ndim not in (1, 2):
        raise ValueError(f"ZipMap takes a 1-D or 2-D input, got shape {list(data.shape)}")
    rows = data.reshape(1, -1) if data.ndim == 1 else data
    if rows.shape[1] != len(keys):
        raise ValueError(f"the input has {rows.shape[1]} columns but classlabels_* lists "
                         f"{len(keys)} labels")
    last_column = {key: column for column, key in enumerate(keys)}
    ordered = sorted(last_column)
    values = rows[:, [last_column[key] for key in ordered]].astype(np.float32).tolist()
    return [dict(zip(ordered, row)) for row in values]


@zip_map.infer
def _(X, *, classlabels_int64s=None, classlabels_strings=None, **_):
    key = object if classlabels_strings is not None else np.int64
    return [SequenceType(MapType(np.dtype(key), tensor(np.float32)))]


# -- DictVectorizer -----------------------------------------------------------------------

@op("DictVectorizer", since=1, domain=ML)
def dict_vectorizer(xp, X, *, int64_vocabulary=None, string_vocabulary=None):
    """[1, vocabulary]: the map's value for each vocabulary key, 0 ("" for strings) where it
    has none; keys outside the vocabulary are ignored (onnxruntime; onnx's reference raises).
    A list of maps gives one row each, as onnx's reference allows."""
    vocabulary = _keys("DictVectorizer", int64s=int64_vocabulary, strings=string_vocabulary,
                       prefix="", suffix="_vocabulary").tolist()
    attribute = "string_vocabulary" if string_vocabulary is not None else "int64_vocabulary"
    maps = X if isinstance(X, list) else [X]
    if not all(isinstance(m, dict) for m in maps):
        raise ValueError(f"DictVectorizer takes a map (a dict) or a list of them, got "
                         f"{type(X).__name__}")
    for m in maps:
        _check_key_kinds(m, strings=string_vocabulary is not None, attribute=attribute)
    dtype = _value_dtype([v for m in maps for v in m.values()])
    empty = "" if dtype == np.dtype(object) else 0
    out = np.empty((len(maps), len(vocabulary)), dtype=dtype)
    for row, m in enumerate(maps):
        out[row] = [m.get(key, empty) for key in vocabulary]
    return out if dtype == np.dtype(object) else xp.asarray(out)


@dict_vectorizer.infer
def _(X, *, int64_vocabulary=None, string_vocabulary=None, **_):
    size = len(int64_vocabulary if int64_vocabulary is not None else string_vocabulary or [])
    if isinstance(X, SequenceType):
        value, rows = getattr(X.element, "value", None), None
    else:
        value, rows = getattr(X, "value", None), 1
    return [tensor(getattr(value, "dtype", None), (rows, size))]


def _value_dtype(values) -> np.dtype:
    """The dtype of a map's values: NumPy scalars (what Session makes of a fed map) say it;
    plain Python values read as ONNX's usual types (str string, int int64, float float)."""
    if any(isinstance(v, str) for v in values):
        return np.dtype(object)
    typed = [v.dtype for v in values if isinstance(v, np.generic)]
    if typed:
        return np.result_type(*typed)
    if values and all(isinstance(v, (int, np.integer)) for v in values):
        return np.dtype(np.int64)
    return np.dtype(np.float32)


def _check_key_kinds(m: dict, *, strings: bool, attribute: str) -> None:
    """The map's keys are of the vocabulary's kind (onnxruntime has no kernel otherwise)."""
    def fits(key) -> bool:
        if strings:
            return isinstance(key, str)
        return isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_))
    wrong = next((k for k in m if not fits(k)), None)
    if wrong is not None:
        raise ValueError(f"map key {wrong!r} is not a {'string' if strings else 'int64'}, "
                         f"as {attribute} needs")


# -- CastMap ------------------------------------------------------------------------------

_CAST_TO = {"TO_FLOAT": np.float32, "TO_INT64": np.int64, "TO_STRING": object}
# what SPARSE writes where the map has no key (onnxruntime's choices, "0.f" included)
_PADDING = {"TO_FLOAT": 0.0, "TO_INT64": 0, "TO_STRING": "0.f"}


@op("CastMap", since=1, domain=ML)
def cast_map(xp, X, *, cast_to="TO_FLOAT", map_form="DENSE", max_map=1):
    """A map int64 -> string|float as one row [1, n], in key order: DENSE holds the map's
    values (n = its size); SPARSE has max_map columns, column k the value of key k, or a pad
    (0, or "0.f" for strings, as onnxruntime pads). Strings parse as C's stof/stoll parse
    them (a leading number; "2.5" is 2 as int64), floats truncate to int64 and print as
    "%f" does ("2.500000")."""
    cast_to, map_form = _text(cast_to), _text(map_form)
    if cast_to not in _CAST_TO:
        raise ValueError(f"cast_to must be one of {', '.join(_CAST_TO)}, got {cast_to!r}")
    if map_form not in ("DENSE", "SPARSE"):
        raise ValueError(f"map_form must be DENSE or SPARSE, got {map_form!r}")
    if map_form == "SPARSE" and max_map <= 0:
        raise ValueError(f"max_map must be > 0 when map_form is SPARSE, got {max_map}")
    if not isinstance(X, dict):
        raise ValueError(f"CastMap takes a map (a dict), got {type(X).__name__}")
    items = sorted(X.items())
    if map_form == "DENSE":
        cells = [_cast(value, cast_to) for _, value in items]
    else:
        if items and items[0][0] < 0:
            raise ValueError(f"SPARSE CastMap: key {items[0][0]} is negative")
        by_key = dict(items)
        cells = [_cast(by_key[k], cast_to) if k in by_key else _PADDING[cast_to]
                 for k in range(max_map)]
    out = np.empty((1, len(cells)), dtype=_CAST_TO[cast_to])
    out[0, :] = cells
    return out if cast_to == "TO_STRING" else xp.asarray(out)


@cast_map.infer
def _(X, *, cast_to="TO_FLOAT", map_form="DENSE", max_map=1, **_):
    width = max_map if _text(map_form) == "SPARSE" else None
    return [tensor(_CAST_TO.get(_text(cast_to), np.float32), (1, width))]


_FLOAT_PREFIX = re.compile(r"\s*[+-]?(inf(inity)?|nan|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)",
                           re.IGNORECASE)
_INT_PREFIX = re.compile(r"\s*[+-]?\d+")


def _cast(value, cast_to: str):
    if isinstance(value, str):
        if cast_to == "TO_STRING":
            return value
        prefix = (_FLOAT_PREFIX if cast_to == "TO_FLOAT" else _INT_PREFIX).match(value)
        if prefix is None:
            raise ValueError(f"map value {value!r} does not start with a number")
        return float(prefix[0]) if cast_to == "TO_FLOAT" else int(prefix[0])
    number = float(np.float32(value))
    if cast_to == "TO_STRING":
        return "%f" % number
    return int(number) if cast_to == "TO_INT64" else number  # int() truncates toward 0


# -- helpers ------------------------------------------------------------------------------

def _keys(op_name: str, *, int64s, strings, prefix: str, suffix: str = "") -> np.ndarray:
    """The one key list an op declares (``{prefix}int64s{suffix}`` or the strings one)."""
    ints_name, strings_name = f"{prefix}int64{'s' if not suffix else ''}{suffix}", \
        f"{prefix}string{'s' if not suffix else ''}{suffix}"
    if (int64s is None) == (strings is None):
        raise ValueError(f"{op_name} needs exactly one of {ints_name} and {strings_name}")
    if strings is not None:
        return np.array([_text(s) for s in strings], dtype=object)
    return np.asarray(int64s, dtype=np.int64).reshape(-1)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
