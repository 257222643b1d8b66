"""A panel product's call (``matmul_cpu._call_at``) as its node's replay and as the bound
call an arena keeps: on its first input alone, into one output's rows view made once, or
on those very arrays through its kernel's overload entry.
"""

from __future__ import annotations

from mixrt.ops.compiled.entry_points import fixed_call


def product_call(into, rows: int, n: int, kernel, arguments):
    """``call(A, out)`` from ``into(target)``, the call into ``target`` (``out`` as rows);
    ``call.with_out(out)`` is the call on A alone into that one ``out``, its rows view made
    once, and ``call.bound_to(A, out)`` the call on those very arrays, ``kernel`` on
    ``arguments(A, target)`` through its overload's entry (``entry_points.fixed_call``):
    what a bound call takes (``panel_action``). numba's typing of a product's eight
    arguments was ~1 us of a 349-34-34-264 MLP's ~3.5 us a product back to back."""
    def call(A, out):
        return into(out.reshape(rows, n))(A)
    call.with_out = lambda out: into(out.reshape(rows, n))
    call.bound_to = lambda A, out: fixed_call(kernel, *arguments(A, out.reshape(rows, n)))
    return call


def rows_of(A, rows: int, k: int):
    """A as (rows, k): itself where it is already two-dimensional (its last axis is k), so
    that a bound call makes no view of it (a reshape is ~13 us of a request 10 ms after
    the last, cold; ``ndim`` less)."""
    return A if A.ndim == 2 else A.reshape(rows, k)


def panel_action(call):
    """A panel product's call as its node's replay, ``action(A, ..., out)``; with
    ``action.with_out(out)`` and ``action.bound_to(arrays)`` where the call has them
    (``bound_calls.binds_replay`` binds the second where A is the arena's, the first where
    it is a feed: one call, without the replay's argument shuffle)."""
    def action(*arrays):
        return call(arrays[0], arrays[-1])
    with_out = getattr(call, "with_out", None)
    if with_out is not None:
        action.with_out = with_out
        action.bound_to = lambda arrays: call.bound_to(arrays[0], arrays[-1])
    return action
