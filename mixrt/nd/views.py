"""Which indexing keys give views, MXNet 1.x's rule: a key made of integers, slices, ``None``
and ``...`` whose selection is one contiguous run of the array's memory (``x[1]``,
``x[1:3]``, ``x[1, 2:4]`` of a 2-D array, ``x[:]``) shares the array's memory; anything else
(a step, a column, an index array, an empty selection) is a copy. The shapes are NumPy's,
except that a selection of one element by integers has shape ``(1,)`` (MXNet has no 0-d
results from indexing).
"""

from __future__ import annotations

import numpy as np


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
    integers = sum(1 for p in parts if _is_basic_part(p) and not (
        p is None or p is Ellipsis or isinstance(p, slice)))
    others = [p for p in parts if p is not None and p is not Ellipsis]
    if ndim > 0 and integers == ndim and len(others) == integers:
        return parts + (None,)
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
