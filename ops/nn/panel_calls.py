"""A panel product's call (``matmul_cpu._call_at``) as its node's replay and as the bound
call an arena keeps: on its first input alone, into one output's rows view made once, or
on those very arrays through its kernel's overload entry.

Each is one object of a class with slots, not closures: a node keeps its product's call
for each of its last few row counts (``matmul_cpu.rows_route``), and a service sending a
new length per request kept them by the thousand, alive until the node forgets them. As
closures they were ~25 objects a call (five functions, their cells and cell tuples) for
the cycle collector to walk: after 100 new lengths a 6-layer BERT's session held ~70,000
such objects outside the frozen ones, about half of them product calls, and the full
passes that walked them (10-27 ms each, every ~90 new shapes) were the new-shape
regime's p99 (2026-12-05).
"""

from __future__ import annotations

from mixrt.ops.compiled.entry_points import fixed_call


def rows_of(A, rows: int, k: int):
    """A as (rows, k): itself where it is already two-dimensional (its last axis is k), so
    that a bound call makes no view of it (a reshape is ~13 us of a request 10 ms after
    the last, cold; ``ndim`` less)."""
    return A if A.ndim == 2 else A.reshape(rows, k)


class ProductCall:
    """``call(A, out)``: ``kernel(*before, A as (rows, k), panels, out as (rows, n),
    *after)``. ``call.with_out(out)`` is the call on A alone into that one ``out``, its rows
    view made once, and ``call.bound_to(A, out)`` the call on those very arrays through the
    kernel's overload entry (``entry_points.fixed_call``): what a bound call takes
    (:func:`panel_action`). numba's typing of a product's eight arguments was ~5 us of a
    349-34-34-264 MLP's product 10 ms after the last, alone (36 -> 31 us)."""

    __slots__ = ("kernel", "before", "panels", "after", "rows", "k", "n")

    def __init__(self, kernel, before: tuple, panels, after: tuple, rows: int, k: int,
                 n: int):
        self.kernel, self.before, self.panels, self.after = kernel, before, panels, after
        self.rows, self.k, self.n = rows, k, n

    def __call__(self, A, out):
        return self.kernel(*self.before, rows_of(A, self.rows, self.k), self.panels,
                           out.reshape(self.rows, self.n), *self.after)

    def with_out(self, out) -> "_Into":
        return _Into(self, out.reshape(self.rows, self.n))

    def bound_to(self, A, out):
        return fixed_call(self.kernel, *self.before, rows_of(A, self.rows, self.k),
                          self.panels, out.reshape(self.rows, self.n), *self.after)


class _Into:
    """A :class:`ProductCall` into one ``target`` (its output's rows view), on A alone: the
    arguments after A made once."""

    __slots__ = ("kernel", "before", "rest", "rows", "k")

    def __init__(self, call: ProductCall, target):
        self.kernel, self.before, self.rows, self.k = call.kernel, call.before, call.rows, call.k
        self.rest = (call.panels, target, *call.after)

    def __call__(self, A):
        return self.kernel(*self.before, rows_of(A, self.rows, self.k), *self.rest)


class PanelAction:
    """A :class:`ProductCall` as its node's replay, ``action(A, ..., out)``, with
    ``with_out(out)`` and ``bound_to(arrays)`` (``bound_calls.binds_replay`` binds the second
    where A is the arena's, the first where it is a feed: one call, without the replay's
    argument shuffle)."""

    __slots__ = ("call",)

    def __init__(self, call: ProductCall):
        self.call = call

    def __call__(self, *arrays):
        return self.call(arrays[0], arrays[-1])

    def with_out(self, out) -> _Into:
        return self.call.with_out(out)

    def bound_to(self, arrays: tuple):
        return self.call.bound_to(arrays[0], arrays[-1])


def panel_action(call):
    """A panel product's call as its node's replay: a :class:`PanelAction` for a
    :class:`ProductCall`; a plain action for another call (the products split over Python
    threads, where the native pool is off), which binds as a replay's arranged call."""
    if isinstance(call, ProductCall):
        return PanelAction(call)

    def action(*arrays):
        return call(arrays[0], arrays[-1])
    return action
