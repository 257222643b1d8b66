"""What a session accepts as a feed: Python data turned into arrays of the declared dtype,
maps with their keys and values converted as onnxruntime converts them, each tensor checked
against its declared type and shape (symbolic dimensions consistent across inputs), and the
signature a memory plan is cached under.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError
from mixrt.ops.ir.dtypes import ONNX_TYPE_NAMES, to_onnx_type
from mixrt.ops.ir.types import MapType, TensorType


def python_feed(name: str, value, expected) -> np.ndarray:
    """A tensor fed as Python data (a nested list, a tuple, a number), as an array of the
    input's declared dtype: ``[[1.0, 2.0]]`` feeds a float32 input as NumPy's float64 would
    not. A conversion that would change values (floats into an integer input, a number too
    large for the dtype) or a ragged list is refused, naming the input."""
    kind = type(value).__name__
    try:
        natural = np.asarray(value)
    except ValueError as exc:  # ragged nesting
        raise InputError(f"input {name!r} was fed a {kind} that is not a rectangular array "
                         f"({exc})") from exc
    wanted = getattr(expected, "dtype", None) if isinstance(expected, TensorType) else None
    if wanted is None or wanted == np.dtype(object) or natural.dtype == object:
        return natural
    if not np.can_cast(natural.dtype, wanted, "same_kind"):
        raise InputError(f"input {name!r} expects {type_name(wanted)} and was fed a {kind} "
                         f"of {natural.dtype} values, which that dtype cannot hold unchanged")
    try:
        return np.asarray(value, dtype=wanted)
    except (OverflowError, ValueError) as exc:
        raise InputError(f"input {name!r} expects {type_name(wanted)}; the {kind} fed "
                         f"holds a value it cannot: {exc}") from exc


def map_feed(name: str, value, expected: MapType) -> dict:
    """A fed dict with its keys and values converted to the map's declared types (as
    onnxruntime converts them): int or str keys, NumPy scalars of the value dtype (str for
    strings), so kernels know the value type (DictVectorizer's output dtype is it)."""
    if not isinstance(value, dict):
        raise InputError(f"input {name!r} is a map ({expected}); feed a dict, got "
                         f"{type(value).__name__}")
    key_dtype = expected.key
    value_dtype = getattr(expected.value, "dtype", None)
    try:
        return {_map_key(k, key_dtype): _map_item(v, value_dtype) for k, v in value.items()}
    except (TypeError, ValueError) as exc:
        raise InputError(f"input {name!r} is a map ({expected}): {exc}") from None


def _map_key(key, dtype):
    if dtype is None:
        return key
    if dtype == np.dtype(object):
        if not isinstance(key, (str, bytes, np.str_)):
            raise TypeError(f"key {key!r} is not a string")
        return as_text(key)
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer)):
        raise TypeError(f"key {key!r} is not an integer")
    return int(key)


def _map_item(item, dtype):
    if dtype is None:
        return item
    if dtype == np.dtype(object):
        if not isinstance(item, (str, bytes, np.str_)):
            raise TypeError(f"value {item!r} is not a string")
        return as_text(item)
    if isinstance(item, (str, bytes)):
        raise TypeError(f"value {item!r} is not a number")
    return np.dtype(dtype).type(item)


def check_tensor(name: str, array, expected: TensorType, symbols: dict) -> None:
    dtype = np.dtype(array.dtype)
    if expected.dtype is not None and dtype != expected.dtype:
        if not (expected.dtype == np.dtype(object) and dtype.kind in "US"):
            raise InputError(f"input {name!r} expects dtype {type_name(expected.dtype)}, "
                             f"got {type_name(dtype)}")
    if expected.shape is None:
        return
    shape = tuple(array.shape)
    if len(shape) != len(expected.shape):
        raise InputError(f"input {name!r} expects rank {len(expected.shape)} "
                         f"(shape {_shape_text(expected.shape)}), got rank {len(shape)} "
                         f"(shape {list(shape)})")
    for axis, (want, got) in enumerate(zip(expected.shape, shape)):
        if isinstance(want, int) and want != got:
            raise InputError(f"input {name!r} expects dimension {axis} to be {want} "
                             f"(shape {_shape_text(expected.shape)}), got {got} "
                             f"(shape {list(shape)})")
        if isinstance(want, str):
            seen = symbols.setdefault(want, (name, got))
            if seen[1] != got:
                raise InputError(f"input {name!r} has {want!r}={got} on axis {axis}, but "
                                 f"input {seen[0]!r} fixed {want!r}={seen[1]}")


def unicode_text(value) -> bool:
    """A NumPy str array (dtype U): its ``astype(object)`` holds the ``str`` objects
    :func:`as_text` makes of its items."""
    return value.__class__ is np.ndarray and value.dtype.kind == "U"


def as_text(item) -> str:
    return item.decode("utf-8") if isinstance(item, bytes) else str(item)


def type_name(dtype) -> str:
    try:
        return ONNX_TYPE_NAMES[to_onnx_type(dtype)]
    except KeyError:
        return np.dtype(dtype).name


def _shape_text(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def feed_signature(feeds: dict) -> tuple:
    """What a memory plan depends on: each feed's shape and dtype (sequences by element)."""
    return tuple((name, _value_signature(value)) for name, value in sorted(feeds.items()))


def signature_form(signature: tuple) -> tuple:
    """A feed signature without its sizes: each feed's rank and dtype (a map's key count and
    a sequence's length stay, as what is made from them may be planned by them)."""
    return tuple((name, _value_form(part)) for name, part in signature)


def feed_elements(signature: tuple) -> int:
    """The elements of a signature's tensor feeds, all together (a run's size, as a
    measure of its work among the signatures of one form)."""
    total = 0
    for _, part in signature:
        if part is not None and part[0] not in ("map", "seq"):
            count = 1
            for size in part[0]:
                count *= size
            total += count
    return total


def _value_form(part):
    if part is None or part[0] == "map":
        return part
    if part[0] == "seq":
        return ("seq",) + tuple(_value_form(p) for p in part[1:])
    shape, dtype = part
    return (len(shape), dtype)


def _value_signature(value):
    if value is None:
        return None
    if isinstance(value, dict):  # a map: its size sizes what is made from it (CastMap)
        return ("map", len(value))
    if isinstance(value, list):
        return ("seq",) + tuple(_value_signature(v) for v in value)
    return (tuple(value.shape), np.dtype(value.dtype).str)
