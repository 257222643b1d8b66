"""The lane a CPU session's repeated request takes.

A service calls ``Session.run(None, feeds)`` again and again with feeds of the same names,
shapes and dtypes. After the first such run, what ``Session._run`` works out on every call
is settled: the output names, the feeds' signature and its plan, the kernel tier (compiled),
no CUDA graph, no profiler of the session's own. :class:`SteadyRun` keeps those answers, and
the environment the plan starts from (the initializers and the plan's frozen values, one
dict copied per run instead of two merged), so such a run is the arena, the kernels and the
outputs. ``Session.run`` takes the lane when the feeds' key matches and no profiler records
(``mixrt.profiler`` may start at any time); anything else takes the full path, which sets up
the lane again for the feeds it last saw. A one-node model's run: ~1.5 us of ~8 less.

A run whose arena's last run took bound calls takes them again while nothing they were
bound under can have changed (:func:`settled_calls`), and then enters no pinned block, nor
NumPy's quiet error state where every call is silent: a request paced 10 ms apart meets
each of those cold (docs/execution.md, "Settled calls").
"""

from __future__ import annotations

from threading import get_ident
from typing import Callable

import numpy as np

from mixrt.base import placement
from mixrt.ops.compiled import jit_cpu, jit_tier, parallel
from mixrt.ops.compiled.bound_calls import binds_silent
from mixrt.ops.elementwise.elementwise import quiet_enter, quiet_exit
from mixrt.runtime.arenas import Arena, ArenaMemory, acquire, release
from mixrt.runtime.executor import ExecutionPlan
from mixrt.runtime.run_loop import bound_key, each_call, feeds_in_order, run_bound, run_host_calls


class SteadyRun:
    """A planned CPU run of feeds whose :func:`~mixrt.runtime.session_feeds.feed_key` is ``key``.

    ``start``: the environment every run starts from (initializers and ``plan.frozen``);
    ``take_outputs(env)``: the run's outputs as ``Session.run`` returns them; ``texts``: the
    feeds given as NumPy unicode text, which the run takes as object strings."""

    __slots__ = ("key", "plan", "_start", "_take_outputs", "_texts", "_memory", "_pools")

    def __init__(self, key: tuple, plan: ExecutionPlan, start: dict,
                 take_outputs: Callable[[dict], list], texts: tuple = (),
                 memory: ArenaMemory | None = None):
        self.key, self.plan = key, plan
        self._start, self._take_outputs = start, take_outputs
        self._texts = texts  # feeds of NumPy unicode text, run as object strings
        self._memory = memory  # the session's (arenas.ArenaMemory)
        self._pools: dict = {}  # (tier, native pool settings) -> the loaded native pool

    def run(self, feeds: dict) -> list:
        """The run of ``feeds`` (the BLAS gate admits it). As Session._gated_run: IEEE
        results without NumPy's warnings; entered as calls rather than ``with`` blocks,
        ~0.5 us of a one-node model's ~4."""
        plan = self.plan
        arena = acquire(plan, np, self._memory)
        try:
            env = self._start.copy()
            env.update(feeds)
            for name in self._texts:  # as Session._checked_feed converts them
                env[name] = feeds[name].astype(object)
            key, bound, made_of = settled_calls(arena, plan, env)
            if made_of == SOME_UNBOUND:
                self._run_pinned(bound, env, arena, key)
            else:
                self._run_settled(bound, env, arena, key, made_of)
            return self._take_outputs(env)
        finally:
            release(plan, arena)

    def _run_settled(self, bound: list, env: dict, arena, key: tuple, made_of: int) -> None:
        """Settled calls, every step bound (:func:`settled_calls`): their settings were
        read as they were bound, and the plan learnt whether to wake the workers in the
        runs before, so no ``parallel.pinned`` block is entered (its thread-local, ~10 us
        of a request 10 ms after the last, cold); where every call is silent, no NumPy
        quiet error state either (a context variable set and reset, ~15 us cold)."""
        quiet = None if made_of == ALL_SILENT else quiet_enter()
        try:
            # up by the first kernel, spinning until the run ends, unless asleep and
            # faster left so
            workers = self._workers_begin(key) if self.plan.wakes_workers else None
            try:
                run_bound(bound, env, arena.buffer)
            finally:
                if workers is not None:
                    self.plan.wake_choice.ends(workers)
        finally:
            if quiet is not None:
                quiet_exit(quiet)

    def _run_pinned(self, bound, env: dict, arena, key: tuple) -> None:
        """The kernels' calls in NumPy's quiet error state and a ``parallel.pinned`` block
        (their settings read once), the workers woken as the run begins where the plan
        learnt to, and learning it."""
        plan = self.plan
        quiet = quiet_enter()
        parallel.pin()
        try:
            workers = self._workers_begin(key) if plan.wakes_workers else None
            try:
                if bound is not None:
                    run_bound(bound, env, arena.buffer)
                else:
                    run_host_calls(arena, plan, env, key)
            finally:
                if workers is not None:
                    plan.wake_choice.ends(workers)
            if not plan.wakes_workers and jit_cpu.native_job_noted():
                plan.wakes_workers = True  # the next run wakes them as it begins
        finally:
            parallel.unpin()
            quiet_exit(quiet)

    def _workers_begin(self, key: tuple):
        """The workers' side of the run's start (``plan.wake_choice``), the pool this
        lane keeps for the run's tier and settings (looked up, it was ~50 us of a request
        10 ms after the last); the caller's CPU is checked in the same compiled call, and
        the workers kept off it where it moved (``base/placement.py``). Where these
        settings have no pool, the plan stops waking workers (with one thread, a MLP's
        run looked for the pool at every run, ~450 us a request 10 ms apart)."""
        found = (key[0], key[2])
        pool = self._pools.get(found)
        if pool is None:
            pool = jit_cpu.loaded_native_pool()
            if pool is None:  # no native pool (yet): OpenBLAS's threads may want placing
                placement.keep_off_caller()
                if jit_cpu.panel_kernels_loaded():
                    # none for these settings (one thread, MIXRT_NATIVE_POOL=0): nothing
                    # to wake, and the run may be unpinned; a run under other settings
                    # learns again (its calls are not settled then)
                    self.plan.wakes_workers = False
                return None
            self._pools[found] = pool
        return self.plan.wake_choice.begins(pool, placement.placed_off())


def settled_calls(arena: Arena, plan: ExecutionPlan, env: dict) -> tuple:
    """(:func:`bound_key` of this run, the arena's bound calls for it or None, what they
    are made of where they are *settled*, else :data:`SOME_UNBOUND`), for the steady
    lane.

    Settled: this thread's last run on the arena took the same bound calls, and nothing
    they were bound under can have changed since (the same thread, no thread's tier or
    scratch buffers changed, ``jit_tier.CHANGES``; the native pool's settings as they
    were; the feeds in order). That run's key and calls are taken without the key's
    thread-locals and its lookup (~35 us of a request 10 ms after the last, cold)."""
    changes = jit_tier.CHANGES[0]  # read first: a change made meanwhile is seen next time
    settled = arena.settled
    if settled is not None and settled[0] == get_ident() and settled[1] == changes \
            and settled[2] == jit_cpu.native_pool_key() and feeds_in_order(plan, env):
        return settled[3], settled[4], settled[5]
    key = bound_key(plan, env)
    bound = arena.bound.get(key)
    if bound is not None and key[-1]:
        arena.settled = (key[1], changes, key[2], key, bound, _made_of(bound))
    return key, bound, SOME_UNBOUND


# what a settled bound list is made of (settled_calls' third answer)
SOME_UNBOUND = 0  # a step calls its kernel's own route
ALL_BOUND = 1  # every step a bound call, a segment of them, or a known-shape reshape
ALL_SILENT = 2  # and every bound call raises no NumPy warning (bound_calls.binds(silent))


def _made_of(calls: list) -> int:
    """:data:`SOME_UNBOUND`, :data:`ALL_BOUND` or :data:`ALL_SILENT` for ``calls``. An
    unbound step's route may read settings through ``parallel.pinned``."""
    silent = True
    for call in each_call(calls):
        form = call[4]
        if form is None or form[0] >= 0 and form[-1] is None:
            return SOME_UNBOUND
        if form[0] >= 0 and not binds_silent(call[0].fn):
            silent = False
    return ALL_SILENT if silent else ALL_BOUND
