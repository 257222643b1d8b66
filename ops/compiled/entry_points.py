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
"""

from __future__ import annotations

from functools import partial


def fixed_call(kernel, *arguments):
    """``go()``: ``kernel(*arguments)``, through the overload compiled for exactly these
    arguments' types where the kernel (a numba dispatcher) has one."""
    entry = _entry(kernel, arguments)
    return partial(kernel if entry is None else entry, *arguments)


def _entry(kernel, arguments: tuple):
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
