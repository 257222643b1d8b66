"""The arenas a plan's runs take (``runtime/executor.py`` makes the plans): one buffer per
arena with a ready-made view for every slot, pooled per plan.

Arenas are pooled per plan: a run takes one, and returns it when done, so concurrent runs of
one session each get their own. On the host, a session's arenas of every plan lie on one
buffer, its :class:`ArenaMemory`, taken by one run at a time; a run that finds it taken (a
second thread) gets an arena of its own. A service that sends a new shape per request
touched fresh pages with every new plan (the kernel zeroes each on its first write: ~0.5 ms
of a small BERT's new length, more of a CNN's tens of MB) and kept one arena per plan it
held; now the memory is warm and held once.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np

from mixrt.ops.device import aligned_empty
from mixrt.runtime.executor import ExecutionPlan, Slot, Slots


class ArenaMemory:
    """A session's host memory for the arenas of all its plans (one run at a time on it):
    one buffer, made larger when a plan needs more (the arenas on the smaller one keep it,
    and its token, until their plans go)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.current: SharedBuffer | None = None

    def buffer_for(self, nbytes: int) -> "SharedBuffer":
        with self._lock:
            current = self.current
            if current is None or current.buffer.size < nbytes:
                # a quarter to spare: a service's lengths grow a few at a time at first
                size = nbytes if current is None else max(nbytes, current.buffer.size * 5 // 4)
                current = self.current = SharedBuffer(aligned_empty(size))
            return current


class SharedBuffer:
    """A buffer arenas of several plans lie on, and the token a run holds while on it:
    ``free`` holds one item while no run is on the buffer, and a run takes it with one
    ``list.pop`` (atomic, as the arenas' pool's), which a request 10 ms after the last
    takes faster than a lock's try and release, cold."""

    __slots__ = ("buffer", "free")

    def __init__(self, buffer: np.ndarray):
        self.buffer = buffer
        self.free = [True]

    def take(self) -> bool:
        """Hold the buffer, where no run does (never waits)."""
        try:
            return self.free.pop()
        except IndexError:
            return False

    def give_back(self) -> None:
        self.free.append(True)


class Arena:
    """One buffer and, for every slot, a ready-made view into it; and the plan's steps as
    :func:`execute` calls them with this arena (made on its first run). ``shared``: the
    :class:`SharedBuffer` its buffer is the start of (held while a run uses it), or None
    for a buffer of its own."""

    def __init__(self, plan: ExecutionPlan, xp, shared: SharedBuffer | None = None):
        size = max(plan.arena_bytes, 1)
        self.shared = shared
        # the planner aligns offsets within the arena; on the host the arena itself must
        # start aligned for them to be (CuPy's allocations already are)
        if shared is not None:
            self.buffer = shared.buffer[:size]
        else:
            self.buffer = aligned_empty(size) if xp is np else xp.empty(size, dtype=np.uint8)
        self.views = _views(self.buffer, plan.slots)
        self.calls: list | None = None
        # (tier, thread, native pool, scratch generation) -> the calls with bound steps
        # (runtime/run_loop.bind_calls)
        self.bound: dict = {}
        # the keys of bound -> the runs each made unbound (run_loop.BIND_AT_RUN binds)
        self.ran: dict = {}
        # (thread, jit_tier.CHANGES, native pool key, key, bound calls) of the last run
        # that took bound calls on this arena (runtime/steady_run.settled_calls)
        self.settled: tuple | None = None


def _views(buffer, slots) -> dict:
    """Every slot's array on ``buffer``. On the host, each made in one call from the slot's
    kept tuple (slicing, viewing and reshaping a Slot took ~1.3 us a slot, over twice as
    long: ~0.1 ms of a small BERT's new length, 0.2 of a 5-layer RoBERTa's)."""
    if buffer.__class__ is np.ndarray and isinstance(slots, Slots):
        make = np.ndarray
        return {name: make(shape, dtype, buffer, offset)
                for name, (offset, shape, dtype, _) in slots.tuples()}
    return {name: _view(buffer, slot) for name, slot in slots.items()}


def _view(buffer, slot: Slot):
    return buffer[slot.offset:slot.offset + slot.nbytes].view(slot.dtype).reshape(slot.shape)


def acquire(plan: ExecutionPlan, xp, memory: ArenaMemory | None = None) -> Arena:
    """An idle arena of ``plan`` for one run (:func:`release` gives it back). With
    ``memory`` (a CPU session's), one on its shared buffer where that is free, else one
    with a buffer of its own; without, only one of its own (a run whose outputs stay
    arena memory the caller holds on to, ``Session.run_on_device(lent=True)``)."""
    plan.used = next(_USES)
    # list.pop and list.append are atomic: two runs never take one arena
    try:
        arena = plan.pool.pop()
    except IndexError:
        arena = None
    if arena is not None:
        shared = arena.shared
        if shared is None or memory is not None and shared.take():
            return arena
        plan.pool.append(arena)  # on a buffer that another run holds now (or may not)
        return _own_arena(plan, xp)
    if memory is None:
        return Arena(plan, xp)
    shared = memory.buffer_for(max(plan.arena_bytes, 1))
    if shared.take():
        return Arena(plan, xp, shared)
    return Arena(plan, xp)


_USES = itertools.count(1)


def trim_idle_calls(plans, keep: int, memory: ArenaMemory | None = None,
                    keep_buffers: int | None = None) -> None:
    """Drop the prepared and bound calls (``Arena.calls``, ``Arena.bound``) of the idle
    arenas of all but the ``keep`` most recently run of ``plans``; a run made again of
    one prepares them again (~0.1 ms a small BERT) and binds from its second run. They
    are most of what a kept plan holds for the cycle collector (a 5-layer RoBERTa's ~680
    tracked objects a plan, ~400 of them its calls), and a service sending a new shape per
    request keeps hundreds of plans: every full collection walked them all (45-75 ms a
    pass, the new-shape stream's p99, 2026-11-27, before a ready session's objects were
    frozen out of the passes, ``runtime/collector.py``). A plan ``wait_compiled`` made is
    spared (``ExecutionPlan.prepared``): its calls were made to serve its size's first
    request, and the settling after the wait took them out of the collector's way (a
    ladder's batch of one, trimmed after 190 requests of other sizes, was bound again:
    2.2 ms). With ``memory`` (a CPU session's), the idle arenas not on its current buffer
    of all but the ``keep_buffers`` most recently run (``keep`` where not given) go too:
    buffers of their own (a concurrent or lent run's) and buffers it has outgrown, which
    is all the memory a CPU session's kept plans hold (:func:`shared_plan_bytes`)."""
    ranked = sorted((plan for plan in plans if not plan.prepared),
                    key=lambda plan: plan.used, reverse=True)
    current = None if memory is None else memory.current
    keep_buffers = keep if keep_buffers is None else keep_buffers
    for rank, plan in enumerate(ranked[min(keep, keep_buffers):], min(keep, keep_buffers)):
        for arena in list(plan.pool):
            if memory is not None and arena.shared is not current and rank >= keep_buffers:
                _taken_out(plan, arena)
            elif arena.calls is not None and rank >= keep:
                arena.calls = None
                arena.bound.clear()
                arena.settled = None
                arena.ran.clear()


def _taken_out(plan: ExecutionPlan, arena: Arena) -> bool:
    """Take ``arena`` out of its plan's pool; False where another run took it meanwhile."""
    try:
        plan.pool.remove(arena)
    except ValueError:
        return False
    return True


def plan_bytes(plan: ExecutionPlan) -> int:
    """What a kept plan holds where its arenas have buffers of their own (a GPU session's):
    its arena (one per concurrent run; most runs take one)."""
    return max(plan.arena_bytes, 1)


def shared_plan_bytes(plan: ExecutionPlan) -> int:
    """What a kept plan of a CPU session holds of its own: nothing, its arenas lying on the
    session's one buffer. Counted by their arenas' sizes, MobileNetV2 at a service's image
    sizes (arenas of 4-25 MB) kept 18 plans within 256 MB and planned again nearly every
    shape it had met (65 plans over 60 requests, 2026-12-02). The arenas a concurrent or
    lent run made with buffers of their own, and those left on a buffer the session has
    since outgrown, go once the plan is no longer among the most recently run
    (:func:`trim_idle_calls`; the few plans ``wait_compiled`` made keep theirs)."""
    return 1


def _own_arena(plan: ExecutionPlan, xp) -> Arena:
    """An idle arena of ``plan`` with a buffer of its own, or a new one."""
    for arena in list(plan.pool):
        if arena.shared is None and _taken_out(plan, arena):
            return arena
    return Arena(plan, xp)


def release(plan: ExecutionPlan, arena: Arena) -> None:
    if arena.shared is None:  # taken last: a run on the shared buffer comes first
        plan.pool.insert(0, arena)
        return
    arena.shared.give_back()
    plan.pool.append(arena)
