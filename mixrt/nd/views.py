"""Which indexing keys give views, MXNet 1.x's rule: a key made of integers, slices, ``None``
and ``...`` whose selection is one contiguous run of the array's memory (``x[1]``,
``x[1:3]``, ``x[1, 2:4]`` of a 2-D array, ``x[:]``) shares the array's memory; anything else
(a step, a column, an index array, an empty selection) is a copy. The shapes are NumPy's,
except that a selection of one element by integers has shape ``(1,)`` (MXNet has no 0-d
results from indexing).
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import DeviceMismatchError, InputError


def _is_basic_part(part) -> bool:
    if part is None or part is Ellipsis or isinstance(part, slice):
        return True
    return isinstance(part, (int, np.integer)) and not isinstance(part, (bool, np.bool_))


def is_basic(key) -> bool:
    """Whether ``key`` is basic indexing (integers, slices, None, ...), NumPy's sense."""
    parts = key if isinstance(key, tuple) else (key,)
    return all(_is_basic_part(p) for p in parts)


def mxnet_key(key, ndim: int):
    """``key`` as a tuple, with a trailing ``None`` where integers pick a single element, so
    that the result has shape ``(1,)`` as in MXNet; other keys as they are."""
    if not is_basic(key):
        return key
    parts = key if isinstance(key, tuple) else (key,)
    integers = [p for p in parts if p is not Ellipsis]
    if ndim > 0 and len(integers) == ndim and not any(
            p is None or isinstance(p, slice) for p in integers):
        return parts + (None,)  # every axis picked by an integer: NumPy's result is 0-d
    return parts


def basic_view(raw, key):
    """``raw[key]`` sharing ``raw``'s memory where MXNet gives a view, else None (a copy is
    to be made). ``key`` is already ``mxnet_key``'s."""
    if not is_basic(key) or raw.ndim == 0 or not raw.flags.c_contiguous:
        return None
    view = raw[key]
    if view.size == 0 or not view.flags.c_contiguous:
        return None
    return view


def slice_is_contiguous(key, shape: tuple) -> bool:
    """Whether ``array[key]`` (slices only) of a C-ordered array of ``shape`` is one
    contiguous run, by NumPy's rule (length-1 and empty selections count as contiguous)."""
    parts = key if isinstance(key, tuple) else (key,)
    lengths, strides = [], []
    for axis, size in enumerate(shape):
        start, stop, step = (parts[axis] if axis < len(parts) else slice(None)).indices(size)
        lengths.append(len(range(start, stop, step)))
        strides.append(step * int(np.prod(shape[axis + 1:], dtype=np.int64)))
    if 0 in lengths:
        return True
    expected = 1
    for length, stride in zip(reversed(lengths), reversed(strides)):
        if length != 1:
            if stride != expected:
                return False
            expected *= length
    return True


# -- keys and values as the indexing code takes them ------------------------------------------

def raw_key(key, ctx):
    """``key`` with NDArrays as their data. As in MXNet, index arrays hold integers by
    value: floats (``nd.array``'s default) are truncated and booleans are 0/1 (a mask
    picks rows 0 and 1, it does not select)."""
    if hasattr(key, "_read") and hasattr(key, "ctx"):  # an NDArray
        if key.ctx != ctx:
            raise DeviceMismatchError(f"indexing: the index is on {key.ctx}, the array on "
                                      f"{ctx}; move it with .as_in_context({ctx})")
        return _integer_index(key._read())
    if isinstance(key, tuple):
        return tuple(raw_key(k, ctx) for k in key)
    if isinstance(key, (bool, np.bool_)):
        return int(key)
    if isinstance(key, np.ndarray):
        return _integer_index(key)
    return key


def _integer_index(raw):
    return raw.astype(np.int64) if raw.dtype.kind in "fb" else raw


def assign_into(xp, target, key, value) -> None:
    """``target[key] = value``; a one-element value also fills a single element, as in
    MXNet (NumPy 2 refuses ``x[0] = array([5.0])``)."""
    try:
        target[key] = value
    except (TypeError, ValueError):
        value = xp.asarray(value)
        if value.size != 1:
            raise
        target[key] = value.reshape(())


def region(begin, end, step) -> tuple:
    """MXNet's (begin, end, step) tuples over the first axes as a key of slices."""
    if len(begin) != len(end) or (step and len(step) != len(begin)):
        raise InputError(f"slice_assign: begin {begin}, end {end} and step {step} must have "
                         f"one entry per axis")
    steps = step or (None,) * len(begin)
    return tuple(slice(b, e, s) for b, e, s in zip(begin, end, steps))


class IndexInputError(InputError, IndexError):
    """An index out of range or of a kind NDArray does not take; an ``IndexError`` too, as
    Python and MXNet raise."""


def index_error(exc, what: str, key, shape) -> InputError:
    kind = IndexInputError if isinstance(exc, IndexError) else InputError
    return kind(f"{what}: key {key!r} on an array of shape {shape}: {exc}")
