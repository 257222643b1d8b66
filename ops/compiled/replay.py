"""A node's last CPU call (a convolution, a pool, a FusedElementwise chain), replayed when
the next one passes the very same arrays.

In a planned run a node gets the same array objects every time: its input and output are
views the arena made once, its weight and bias the session's constants. Yet each call
checked them all again (contiguity, dtypes, aliasing, the route among the CPU forms), looked
up its geometry, layout and kit, and made the arguments of its native call: 8-14 us of
Python a convolution, on ShuffleNet's 48 more than their BLAS time. A kernel that finished
its call through one compiled call records here what that call needs beyond the arrays; the
next call with the same arrays goes straight to it.

The arrays are held weakly (a replay never keeps an arena alive) and compared by identity:
the same object has the same shape, dtype, strides and memory (numpy will not resize an
array another one references), and only its values may differ, which the native call reads
afresh. An input that is a new object each run, a view a Reshape made of the same arena
bytes (ShuffleNet's channel shuffle before each depthwise conv), matches when its address,
shape, strides and dtype are the recorded ones: the call's addresses are then that live
array's. A replay is also tied to its thread (kits and scratch are per thread) and to the
native pool the run pinned, and lapses when the thread's scratch buffers are reallocated
(its kit would hold an old one). Whatever does not match takes the full path, which
records again: two threads calling one node in turn simply both take it.

A record keeps those addresses and layouts only for a node that needs them, and only of
the arrays that need them: the positions at which the node's call came with its recorded
output but another input object (``DRIFTS`` in its dict holds them); other nodes and
positions are matched by identity alone. Reading an array's address costs ~2.5 us, and a
service's new shape recorded every node's call once, its inputs and output new arena
views, never to be replayed: ~20 records, 5 layouts each, a 2-layer BERT's new length
(2026-11-27). A GPT-2's products, whose activation alone is a view made anew, took four
layouts a record (its weight, bias and output too) until 2026-11-29.

An arena's first run of its plan records only where the process's arenas come back
(:func:`first_run`): a replay pays only from the same arena's next run, which a service's
new shape, sent once, never has, and recording was ~11 us a node then, cold (a GPT-2's 50
at each new length, ~0.6 ms of ~12), plus the objects the collector then walked. Where
few come back, a plan run again records in its second run, and its calls are bound later
(``runtime/run_loop.py``, BIND_AT_RUN) from what it recorded; where most do (a service
whose lengths recur), its second run would take the full route again instead of the
replay, so the first records as before. The estimate counts an arena's second run; until
2026-12-05 it did so only where that run's thread or tier differed from its first, so a
service's first runs never recorded.
"""

from __future__ import annotations

import threading
import weakref

from mixrt.ops.compiled import jit_cpu

KEY = ("replay",)  # its place in a node's dict (in prepacked ones string keys name layouts)
# present: the node's calls come with inputs made anew, at the positions it holds (a set)
DRIFTS = ("replay", "drifts")


_runs = threading.local()  # ``first``: this thread runs an arena's plan for the first time
# the share of first runs whose arena ran again, a moving estimate over the process's
# latest ~1 / RETURN_WEIGHT first runs; from RECORD_FROM_SHARE a first run records (at
# that share the records a second run replays cost about what the first runs pay for them)
RETURN_WEIGHT = 1 / 16
RECORD_FROM_SHARE = 0.5
_returns = [0.0]


def arena_returned() -> None:
    """An arena's second run: its plan's size came back (for :func:`first_run`)."""
    _returns[0] = min(1.0, _returns[0] + RETURN_WEIGHT)


def first_run(run, *args) -> None:
    """An arena's first run of its plan, ``run(*args)``: where few arenas come back, with
    nothing recorded on this thread meanwhile (a node's earlier replay is dropped
    instead). (Threads racing on the estimate only blur it.)"""
    share = _returns[0]
    _returns[0] = share * (1.0 - RETURN_WEIGHT)
    if share >= RECORD_FROM_SHARE:  # most come back: their second runs replay these
        run(*args)
        return
    was = getattr(_runs, "first", False)
    _runs.first = True
    try:
        run(*args)
    finally:
        _runs.first = was


class Replay:
    __slots__ = ("thread", "pool", "scratch", "refs", "layouts", "action", "silent")

    def __init__(self, arrays: tuple, action, drifting=None, silent: bool = False):
        self.thread = threading.get_ident()
        # the pool as loaded: a replay is tied to it, but does not load it (a model whose
        # kernels never split has no use for the workers)
        self.pool = jit_cpu.loaded_native_pool()
        self.scratch = jit_cpu.scratch_generation()
        self.refs = tuple(None if a is None else weakref.ref(a) for a in arrays)
        # None: matched by identity only, until the node shows an input made anew; else
        # the layout of each array at a drifting position (None elsewhere: by identity)
        self.layouts = None if not drifting else tuple(
            None if a is None or index not in drifting else _layout(a)
            for index, a in enumerate(arrays))
        self.action = action
        self.silent = silent  # the action calls no NumPy ufunc (record's ``silent``)


def _layout(array) -> tuple:
    return array.ctypes.data, array.shape, array.strides, array.dtype.str


def replayed(prepacked: dict | None, arrays: tuple) -> bool:
    """Whether the recorded call of this node ran again on ``arrays`` (all the call's array
    arguments, in the order recorded, the output last)."""
    found = None if prepacked is None else prepacked.get(KEY)
    if found is None:
        return False
    refs, layouts = found.refs, found.layouts
    last = refs[-1]
    if layouts is None and last is not None and last() is not arrays[-1]:
        # another output: another shape's arena view, a new shape's first call (asked
        # first: the thread, pool and scratch lookups were ~1.5 us of its ~3 cold miss)
        return False
    if found.thread != threading.get_ident() or found.pool is not jit_cpu.loaded_native_pool() \
            or found.scratch != jit_cpu.scratch_generation():
        return False
    for index, (ref, array) in enumerate(zip(refs, arrays)):
        if ref is None:
            if array is not None:
                return False
        elif ref() is not array:
            known = None if layouts is None else layouts[index]
            if known is None:
                # the same output, another input object: a view made anew each run, which
                # the next record keeps by its layout (another output: another shape's)
                if refs[-1] is not None and refs[-1]() is arrays[-1]:
                    _drifts_at(prepacked, refs, arrays)
                return False
            if array is None or _layout(array) != known:
                return False
    found.action(*arrays)
    return True


def _drifts_at(prepacked: dict, refs: tuple, arrays: tuple) -> None:
    """Note in the node's dict the positions whose array is not the recorded one (the next
    record keeps their layouts)."""
    drifting = prepacked.get(DRIFTS)
    if drifting is None:
        drifting = prepacked[DRIFTS] = set()
    drifting.update(index for index, (ref, array) in enumerate(zip(refs, arrays))
                    if ref is not None and ref() is not array)


def record(prepacked: dict | None, arrays: tuple, action, silent: bool = False) -> None:
    """Keep ``action(*arrays)`` as the node's call on these very arrays (the caller checks
    that ``out``, the last, was given: a call that made its own output is not replayed);
    with the layouts of those at the positions where the node has shown an input made anew
    (``DRIFTS``). ``silent``: the action is compiled calls only (no NumPy ufunc, so no
    floating-point warning whatever NumPy's error state), which its bound call then says
    (``bound_calls.binds_replay``)."""
    if prepacked is None:
        return
    if getattr(_runs, "first", False):
        prepacked.pop(KEY, None)  # not kept: made for arrays of another shape
        return
    prepacked[KEY] = Replay(arrays, action, prepacked.get(DRIFTS), silent)


def forget(prepacked: dict | None) -> None:
    """Drop the recorded call (a call that took another route)."""
    if prepacked is not None:
        prepacked.pop(KEY, None)
