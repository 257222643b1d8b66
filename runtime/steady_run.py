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
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from mixrt.base import placement
from mixrt.ops.compiled import jit_cpu, parallel
from mixrt.ops.elementwise.elementwise import quiet_enter, quiet_exit
from mixrt.runtime.arenas import ArenaMemory, acquire, release
from mixrt.runtime.executor import ExecutionPlan
from mixrt.runtime.run_loop import (ALL_SILENT, SOME_UNBOUND, run_bound, run_host_calls,
                                   settled_calls)


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
        """Settled calls, every step bound (``run_loop.settled_calls``): their settings were
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
