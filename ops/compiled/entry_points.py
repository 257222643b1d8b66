"""A compiled kernel's call on arguments fixed ahead of it, through numba's entry for
exactly their types.

A numba dispatcher types each argument at every call to pick the compiled overload: cheap
warm (~0.1 us for a product's eight), but a request paced 10 ms after the last meets it
cold, and its typing walks each array's type again: a panel product's call of eight
arguments took 18.3 us through the dispatcher and 14.4 through its entry, 10 ms apart
(2026-12-05). A prepared call (a bound convolution's native calls, a replay's part
handed to the native pool) passes the same arrays every time, so the overload is found
once, as the call is prepared, and called straight. Where none was compiled for exactly
those types the call goes through the dispatcher, which picks or compiles one as before.

Finding the overload types the arguments through numba's Python ``typeof``, 7-70 us an
array cold (the native pool's block, its first argument, up to 67): a run that prepares
its calls afresh (a new length's first sights: GPT-2's three heavy elementwise passes a
run, ~120 us of its ~2.4 ms, 2026-12-05) paid more for it than the dispatcher it skips.
The entries are kept by what fixes an argument's numba type (an array's dtype, rank,
layout, flags; a Python or NumPy scalar's class), read in well under a microsecond.
"""

from __future__ import annotations

from functools import partial

import numpy as np

# numba's int64 (the type of a Python int it takes without a wider one)
_INT64 = range(-(2 ** 63), 2 ** 63)
# (kernel, the arguments' kinds) -> (overloads compiled when found, entry or None)
_entries: dict = {}


def fixed_call(kernel, *arguments):
    """``go()``: ``kernel(*arguments)``, through the overload compiled for exactly these
    arguments' types where the kernel (a numba dispatcher) has one."""
    entry = _entry(kernel, arguments)
    return partial(kernel if entry is None else entry, *arguments)


def _entry(kernel, arguments: tuple):
    """The entry of ``kernel``'s overload for these arguments' types, or None; kept by
    their kinds (:func:`_kind`), and looked for again once the kernel compiled another."""
    overloads = getattr(kernel, "overloads", None)
    if overloads is None:  # not a dispatcher: called as it is
        return None
    kinds = tuple(_kind(argument) for argument in arguments)
    if None in kinds:
        return _typed_entry(kernel, arguments)
    key, compiled = (kernel, kinds), len(overloads)
    kept = _entries.get(key)
    if kept is None or kept[0] != compiled:
        kept = _entries[key] = (compiled, _typed_entry(kernel, arguments))
    return kept[1]


def _kind(argument):
    """What fixes ``argument``'s numba type, or None where this does not know it."""
    cls = argument.__class__
    if cls is np.ndarray:
        flags = argument.flags
        layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
        return (argument.dtype, argument.ndim, layout, flags.writeable, flags.aligned)
    if cls is int:
        return int if argument in _INT64 else None
    if cls is float or cls is bool or cls in _NUMPY_SCALARS:
        return cls  # a NumPy scalar's numba type is its dtype's (a bias or limit of float32)
    return None


_NUMPY_SCALARS = frozenset((np.float32, np.float64, np.int32, np.int64, np.bool_))


def _typed_entry(kernel, arguments: tuple):
    overloads = getattr(kernel, "overloads", None)
    typeof = getattr(kernel, "typeof_pyval", None)
    if overloads is None or typeof is None:
        return None
    try:
        signature = tuple(typeof(argument) for argument in arguments)
    except Exception:  # noqa: BLE001  (a type numba does not know: its dispatcher says so)
        return None
    found = overloads.get(signature)
    return None if found is None else getattr(found, "entry_point", None)
