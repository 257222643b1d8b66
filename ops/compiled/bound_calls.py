"""Bound calls: a node's CPU kernel call settled once for an arena, then made as one call.

In a planned CPU run every node gets the same arrays each time (its output and most inputs
are views the arena made once, its weights the session's constants) and the same shapes, so
the route its kernel picks among its forms (the BLAS, the packed panels, a compiled loop,
NumPy's ufuncs) is the same on every run. Yet each call checked the dtypes, contiguity and
aliasing again and walked the routes to it: 5-15 us of Python a node, which at small shapes
is most of a run (a 2-layer BERT with hidden 64 over 16 tokens: ~6 us a node, the products
themselves ~2). onnxruntime makes that choice once, when it creates its kernels.

After an arena's first run in a tier, on a thread (``runtime/run_loop.bind_calls``), each
step whose kernel has a *binder* here, whose output has its static view and whose inputs are
stable (constants, or values the plan makes in views of a known layout), gets its binder's
closure: ``call(*inputs) -> out``, the route the kernel took, with nothing left to decide.
A binder sees the arrays of that first run (layouts only: values other than constants change
from run to run) and returns None where it cannot promise the kernel's own arithmetic; the
step then keeps the kernel. Closures are kept per arena and per (tier, thread, native pool,
scratch generation), so one may hold the thread's scratch buffers and pool as a replay does
(``ops/compiled/replay.py``).

Two kinds of binder:

* :func:`binds_replay`: kernels that record their call as the node's replay. Their bound call
  is that recorded action, without the replay's per-call check of every array.
* :func:`binds`: a function of its own that returns the closure (the small products of
  ``ops/nn/bound_products.py``).
"""

from __future__ import annotations

import operator
import threading
from typing import Callable

from mixrt.ops.compiled import jit_cpu, replay

_BINDERS: dict[Callable, Callable] = {}  # a kernel's binder of its own
_REPLAYS: dict[Callable, Callable] = {}  # a kernel's binder through its replay
# kernels whose bound call may read a feed (binds(feeds=...)): the input positions it reads
# as given, or ALL_INPUTS
_TAKES_FEEDS: dict = {}
ALL_INPUTS = None
_SEVERAL: set = set()  # kernels whose binder takes several outputs' views (binds(several=True))
_FRESH: set = set()  # kernels whose bound call makes its outputs (binds(fresh=True))
_SILENT: set = set()  # kernels whose bound call raises no NumPy warning (binds(silent=True))
_ANY_INPUTS: set = set()  # kernels whose bound call reads any input as given (any_inputs)


def binds(*kernels: Callable, feeds: bool | tuple = False, several: bool = False,
          fresh: bool = False, silent: bool = False, any_inputs: bool = False) -> Callable:
    """Register ``binder(args, out, attributes) -> call | None`` for these CPU kernels.

    ``feeds``: the closure reads its inputs as it is given them on each call (it keeps no
    input's address, no layout of it beyond C order), so a step whose input is a feed may
    be bound too: a run takes such bound calls only while every feed is C-contiguous and
    aligned, as when they were bound (``runtime/run_loop.run_host_calls``). A model's first
    node reads the feeds: a scikit-learn pipeline's Scaler, an encoder's embedding Gather.
    A tuple of input positions says which inputs the closure reads as given (a product's
    activation, not its weight, which a binder may pack once).

    ``several``: the kernel's step has several outputs, and its binder takes the tuple of
    their views as ``out`` (DynamicQuantizeLinear); other binders are asked only for steps
    of one output.

    ``fresh``: the binder is asked for steps whose outputs have no view in the arena (a
    graph output the kernel makes, as a classifier's label and scores), with ``out`` None;
    its closure makes new arrays on every call, as the kernel does, and returns them (a
    tuple for several outputs). What it settles once is the route: a scikit-learn
    classifier's one-row call spent ~1.3 us of its ~2.7 in the kernel's checks and lookups.
    Its closure keeps no native pool (it may ask for one as it runs): a plan of that one
    call alone is run as the call without asking the pool's settings
    (``runtime/steady_run.OneCall``).

    ``silent``: the closure calls no NumPy ufunc (compiled kernels, ``np.dot``, allocation,
    reshapes and indexing only), so it raises no floating-point warning whatever NumPy's
    error state: a steady run whose every step is such a call does not enter NumPy's
    quiet state (``runtime/steady_run.py``; a context variable set and reset, ~15 us of a
    request 10 ms after the last, cold).

    ``any_inputs``: the closure reads every input as it is given it, of any layout and made
    by any step, so a step whose inputs an earlier step makes anew on each run (a string
    kernel's object arrays, which no arena holds) is bound too. The string kernels of a
    TF-IDF pipeline read only their inputs' values (``tolist``): each made its outputs
    fresh, so none of them was bound, and the pipeline's one-document run took every step's
    full route (~34 us against onnxruntime's ~11, 2026-12-04)."""
    def register(binder: Callable) -> Callable:
        for kernel in kernels:
            _BINDERS[kernel] = binder
            if feeds:
                _TAKES_FEEDS[kernel] = ALL_INPUTS if feeds is True else frozenset(feeds)
            if several:
                _SEVERAL.add(kernel)
            if fresh:
                _FRESH.add(kernel)
            if silent:
                _SILENT.add(kernel)
            if any_inputs:
                _ANY_INPUTS.add(kernel)
        return binder
    return register


def binds_fresh(kernel: Callable) -> bool:
    """Does ``kernel``'s binder bind steps whose outputs have no view (:func:`binds`
    ``fresh``)?"""
    return kernel in _FRESH


def binds_silent(kernel: Callable) -> bool:
    """Does ``kernel``'s bound call raise no NumPy warning (:func:`binds` ``silent``)?"""
    return kernel in _SILENT


def silent_call(kernel: Callable, bound: Callable) -> bool:
    """Does the bound call ``bound`` of ``kernel`` raise no NumPy warning: its kernel's
    binder says so for all its calls (:func:`binds` ``silent``), or its replay was recorded
    as compiled calls alone (``replay.record``'s ``silent``, which :func:`binds_replay`
    hands on)?"""
    return kernel in _SILENT or getattr(bound, "silent", False)


def binds_several(kernel: Callable) -> bool:
    """Does ``kernel``'s binder take several outputs' views (:func:`binds` ``several``)?"""
    return kernel in _SEVERAL


def reads_any_input(kernel: Callable) -> bool:
    """Does ``kernel``'s bound call read any input as given (:func:`binds` ``any_inputs``)?"""
    return kernel in _ANY_INPUTS


def reads_feed_at(kernel: Callable, position: int) -> bool:
    """May ``kernel``'s bound call read a feed as its input ``position``?"""
    positions = _TAKES_FEEDS.get(kernel, ())
    return positions is ALL_INPUTS or position in positions


def binds_replay(kernel: Callable, arrange: Callable, state: str = "_node") -> None:
    """``kernel`` keeps its call as a replay in its ``state`` attribute (``_node`` or
    ``_prepacked``), on the arrays ``arrange(args, out)``: its bound call is that action."""
    def binder(args, out, attributes):
        found = (attributes.get(state) or {}).get(replay.KEY)
        if found is None or found.thread != threading.get_ident() \
                or found.pool is not jit_cpu.loaded_native_pool() \
                or found.scratch != jit_cpu.scratch_generation():
            return None
        arrays = arrange(args, out)
        if len(arrays) != len(found.refs) or found.refs[-1]() is not out:
            return None  # recorded for another arena's output (or another route)
        action = found.action
        bound_to = getattr(action, "bound_to", None)
        with_out = getattr(action, "with_out", None)
        # a product on a feed (a new array each run) is bound on its input alone, below
        go = None if bound_to is None or with_out is not None and not _in_arena(
            args[0], out) else bound_to(arrays)
        if go is not None:
            # the call on these very arrays, its arguments made once (a direct
            # convolution's: ops/conv/conv_direct_cpu._Prepared); a run that passes
            # others (a feed read as given) takes the action
            return _OnArrays(go, tuple(args), action, arrange, out, found.silent)
        if with_out is not None and arrays[0] is args[0]:
            # a call on its first input alone, into this output (a panel product's,
            # ops/nn/panel_calls.PanelAction): no arguments to arrange, no view of the
            # output made again (~26 us of a product's ~78 in a request 10 ms after the
            # last, cold)
            return _OnFirst(with_out(out), out, found.silent)
        return _Arranged(action, arrange, out, found.silent)
    _REPLAYS[kernel] = binder


# A bound step's call as one object with slots: a plan keeps one per bound step, and as a
# closure with an attribute dict and its cells it was ~8 objects for the cycle collector to
# walk (a 6-layer BERT after 150 new lengths: ~1,000 of them; 2026-12-05).

class _OnArrays:
    """The recorded call on the arrays it was bound to (``go()``), where a run passes those
    very arrays; else the action on the arrays arranged."""

    __slots__ = ("go", "known", "action", "arrange", "out", "silent")

    def __init__(self, go, known: tuple, action, arrange, out, silent: bool):
        self.go, self.known, self.action, self.arrange = go, known, action, arrange
        self.out, self.silent = out, silent

    def __call__(self, *args):
        known = self.known
        if len(args) == len(known) and all(map(operator.is_, args, known)):
            self.go()
        else:
            self.action(*self.arrange(args, self.out))
        return self.out


class _OnFirst:
    """A call on the step's first input alone, into its output (``into_out(A)``)."""

    __slots__ = ("into_out", "out", "silent")

    def __init__(self, into_out, out, silent: bool):
        self.into_out, self.out, self.silent = into_out, out, silent

    def __call__(self, *args):
        self.into_out(args[0])
        return self.out


class _Arranged:
    """The recorded action on the step's arrays as ``arrange`` lays them out."""

    __slots__ = ("action", "arrange", "out", "silent")

    def __init__(self, action, arrange, out, silent: bool):
        self.action, self.arrange, self.out, self.silent = action, arrange, out, silent

    def __call__(self, *args):
        self.action(*self.arrange(args, self.out))
        return self.out


def _in_arena(array, out) -> bool:
    """Is ``array`` a view of the same memory as ``out`` (an arena's), so the same array on
    every run of the bound list, unlike a feed?"""
    base = getattr(array, "base", None)
    return base is not None and base is out.base


def replay_binder(kernel: Callable) -> Callable:
    """The binder through ``kernel``'s replay (a binder of its own hands the routes that
    record one to it); one that binds nothing where the kernel keeps no replay."""
    return _REPLAYS.get(kernel, _nothing)


def _nothing(args, out, attributes):
    return None


def binder_for(kernel: Callable) -> Callable | None:
    """The kernel's binder of its own, else the one through its replay, else None."""
    return _BINDERS.get(kernel) or _REPLAYS.get(kernel)


def padded(args, count: int) -> tuple:
    """``args`` with the absent trailing optional inputs as None, ``count`` in all."""
    return tuple(args) + (None,) * (count - len(args))
