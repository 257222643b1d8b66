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
each of those cold (docs/execution.md, "Settled calls"). Where that settled run is one
silent call that reads the one feed and makes every output anew (a lone tree ensemble or
linear classifier, as scikit-learn exports them), the call is the whole run
(:class:`OneCall`): no arena, no environment, no loop.
"""

from __future__ import annotations

from threading import get_ident
from typing import Callable

import numpy as np

from mixrt.base import placement, run_options
from mixrt.ops.compiled import jit_cpu, jit_tier, parallel
from mixrt.ops.compiled.bound_calls import binds_fresh, silent_call
from mixrt.ops.elementwise.elementwise import quiet_enter, quiet_exit
from mixrt.runtime.arenas import Arena, ArenaMemory, acquire, release
from mixrt.runtime.executor import ExecutionPlan
from mixrt.runtime.run_loop import bound_key, each_call, feeds_in_order, run_bound, run_host_calls


class SteadyRun:
    """A planned CPU run of feeds whose :func:`~mixrt.runtime.session_feeds.feed_key` is ``key``.

    ``start``: the environment every run starts from (initializers and ``plan.frozen``);
    ``take_outputs(env)``: the run's outputs as ``Session.run`` returns them; ``texts``: the
    feeds given as NumPy unicode text, which the run takes as object strings."""

    __slots__ = ("key", "plan", "_start", "_take_outputs", "_texts", "_memory", "_pools",
                 "_one", "_judged", "_idle")

    def __init__(self, key: tuple, plan: ExecutionPlan, start: dict,
                 take_outputs: Callable[[dict], list], texts: tuple = (),
                 memory: ArenaMemory | None = None):
        self.key, self.plan = key, plan
        self._start, self._take_outputs = start, take_outputs
        self._texts = texts  # feeds of NumPy unicode text, run as object strings
        self._memory = memory  # the session's (arenas.ArenaMemory)
        self._pools: dict = {}  # (tier, native pool settings) -> the loaded native pool
        self._one: OneCall | None = None  # the settled run as its one call, where it is one
        self._judged = None  # the arena's settled calls _one was asked of
        self._idle = 0  # settled runs in a row that woke the workers and gave them no job

    def run(self, feeds: dict) -> list:
        """The run of ``feeds`` (the BLAS gate admits it). As Session._gated_run: IEEE
        results without NumPy's warnings; entered as calls rather than ``with`` blocks,
        ~0.5 us of a one-node model's ~4."""
        one = self._one
        if one is not None:
            outputs = one.run(feeds, self._take_outputs, self.plan)
            if outputs is not None:
                return outputs
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
            settled = arena.settled
            if settled is not self._judged and settled is not None and settled[4] is bound \
                    and settled[5] == ALL_SILENT:
                # asked as the arena's calls settle, and again whenever they settle anew
                # (another thread, a change of tier or scratch buffers, other settings)
                self._judged = settled
                self._one = OneCall.of(plan, bound, settled, self._texts, self._take_outputs,
                                       env)
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
            # (a run that left them asleep, its kernels taking every part, says nothing)
            pool = self._pools.get((key[0], key[2])) if workers is None \
                else workers[0] if workers[1] is not False else None
            published = None if pool is None else pool.published()
            try:
                run_bound(bound, env, arena.buffer)
            finally:
                if workers is not None:
                    self.plan.wake_choice.ends(workers)
            if pool is not None:
                self._judge_workers(pool.published() != published)
        finally:
            if quiet is not None:
                quiet_exit(quiet)

    def _judge_workers(self, used: bool) -> None:
        """After a settled run: whether its kernels handed the workers a job (``used``)
        decides whether the plan's runs wake them as they begin. IDLE_RUNS runs in a row
        that woke them for nothing stop it (a forest's few rows whose walk the clock keeps
        whole on one thread, ``ops/ml/tree_requests.py``: the run then may be its one call,
        :class:`OneCall`); one that handed them a job takes it up again."""
        plan = self.plan
        if used:
            self._idle = 0
            plan.wakes_workers = True
        elif plan.wakes_workers:
            self._idle += 1
            if self._idle >= IDLE_RUNS:
                self._idle = 0
                plan.wakes_workers = False

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


# settled runs in a row that wake the workers and hand them no job, after which a plan's
# runs stop waking them (SteadyRun._judge_workers)
IDLE_RUNS = 16


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
        if form[0] >= 0 and not silent_call(call[0].fn, form[-1]):
            silent = False
    return ALL_SILENT if silent else ALL_BOUND


class OneCall:
    """A settled run that is one bound call (:meth:`of`), made as that call alone: the feed
    handed to it as given, its fresh outputs taken as the run's. It holds while the arena's
    settled calls would (:func:`settled_calls`: the same thread, no change of a tier or
    scratch buffers, the feed in order) and no run limit is set; otherwise the lane runs as
    before. The native pool's settings are not asked (~13 us of a request 10 ms after the
    last, cold): a fresh binder's closure keeps no pool (``bound_calls.binds(fresh)``).
    A lone decision tree's request (depth 4, 1-15 rows) 10 ms after the last, alternating
    with the lane in one process: 121 / 134 / 121 us -> 86 / 100 / 89 (three processes,
    2026-11-29)."""

    __slots__ = ("_call", "_feed", "_outputs", "_as_made", "_ident", "_changes")

    def __init__(self, call, feed: str, outputs: tuple, as_made: bool, settled: tuple):
        self._call, self._feed, self._outputs, self._as_made = call, feed, outputs, as_made
        self._ident, self._changes = settled[0], settled[1]

    @classmethod
    def of(cls, plan: ExecutionPlan, bound: list, settled, texts: tuple, take_outputs,
           env: dict) -> "OneCall | None":
        """The settled run of ``bound`` (all silent) as one call, where it is one: a plan of
        one feed (not text) and one step, bound, that reads that feed and makes each of its
        outputs anew (``binds(fresh=True)``, no view of the arena), the run's outputs all
        among them (``take_outputs`` answers from them alone; *as made* where it answers
        them as they are, in their order). None otherwise."""
        if settled is None or settled[4] is not bound or texts or plan.host_args \
                or len(plan.signature) != 1 or len(bound) != 1:
            return None
        step, inputs, _, placed, form = bound[0]
        feed = plan.signature[0][0]
        if form is None or form[0] != 1 or form[1] != feed or form[6] is None \
                or tuple(inputs) != (feed,) or not binds_fresh(step.fn) \
                or any(view is not None for _, view, _ in placed):
            return None
        outputs = tuple(name for name, _, _ in placed)
        made = [env.get(name) for name in outputs]
        try:
            taken = take_outputs({name: env[name] for name in outputs if name})
        except KeyError:  # an output the step does not make (a feed, a constant)
            return None
        as_made = len(taken) == len(made) and all(a is b for a, b in zip(taken, made))
        return cls(form[6], feed, outputs, as_made, settled)

    def run(self, feeds: dict, take_outputs, plan: ExecutionPlan) -> list | None:
        """The run's outputs, or None where the call does not hold now (the lane then runs,
        and answers any error as it would)."""
        if get_ident() != self._ident or jit_tier.CHANGES[0] != self._changes \
                or plan.wakes_workers or run_options.current() is not None:
            return None
        value = feeds.get(self._feed)
        flags = getattr(value, "flags", None)
        if flags is None or not (flags.c_contiguous and flags.aligned):
            return None
        try:
            made = self._call(value)
        except Exception:  # noqa: BLE001  (the lane runs it again and says what is wrong)
            return None
        if made.__class__ is not tuple:
            made = (made,)
        if self._as_made:  # a fresh binder's outputs are new arrays: the run's as they are
            return list(made)
        return take_outputs({name: found for name, found in zip(self._outputs, made) if name})
