"""Whether a run that finds the native workers asleep wakes them: learned per plan from the
times of its own runs.

A run whose kernels split their work over the native workers (``ExecutionPlan
.wakes_workers``) wakes them as it begins. Back to back they are still spinning from the
last run, and the split is nearly free; a service's requests come paced, between other
work, and find them asleep (they spin 1 ms after a run, ``_jit_native_pool.py``). Waking
one then costs the caller the futex call (12-16 us in a virtual machine) and the worker
10-15 us more before it takes a part, more on a busy host; a run that gains less than that
from its split is faster on its caller alone. Which one a plan's runs are is not a
property of its shapes alone (the wake's cost is the machine's, a neighbour's load comes
and goes), so each plan times both, on the runs that found the workers asleep:

* its first such runs wake them (as every run did before 2026-11-28), and their times are
  kept;
* where those runs are short enough that a wake may matter (under ``TRY_ALONE_BELOW_S``:
  a wake is 2-5% of a 1 ms run, while a run on one thread may take up to twice as long),
  the next few run alone: the workers stay asleep (``Pool.alone_begins``) and the kernels
  take every part of their jobs on the calling thread;
* then each such run takes whichever kept the lower median of its last ``RECENT`` times,
  and every ``RETRY_EVERY``-th the other one, so a change of load is noticed (seldom
  enough not to be a p99: at one in 16, a 64-row MLP's p99 with 0.3 ms of other work
  between requests went 218 -> 247 us, its runs alone the slower way).

Runs that find the workers awake use them, as before, and are not timed; so do runs that
begin within ``SPIN_SECONDS`` of the end of a run that left them asleep. Such a run is one of
a stream of back-to-back runs, whose runs would have found the workers still spinning had
the first of them woken them: without this, once a plan had learnt to run alone on paced
requests, every run of a later stream of requests ran alone too (each found the workers
asleep, as the run before left them), and timed alone in a stream against woken after a
pause (the first run after one is slow on any runtime: cold caches, a core clocked down),
running alone kept winning. A 274-tree random forest's 14 rows back to back, in blocks of
50 after 0.3 s pauses: 0.22 ms a run from the second block on, 0.12 in the first
(onnxruntime 0.15); an MLP's 8 rows 0.07-0.09 against 0.05 (2026-11-30). A 42-101-911-13
MLP at 16 rows (2 cores, 2026-11-28): back to back 51-63 us with the workers, 65 on one
thread; with 0.3 ms of other work between requests 81-106 us waking them, 71 without.
"""

from __future__ import annotations

import threading
import time

from mixrt.base import placement
from mixrt.ops.compiled import jit_cpu

TRY_ALONE_BELOW_S = 1e-3  # woken runs slower than this never try running alone
LEARN = 3  # times of each way before the two are compared
RECENT = 8  # times kept of each way
RETRY_EVERY = 128  # asleep-found runs between tries of the way not taken (under 1%: a p99)

AWAKE = None  # a run that found the workers awake (or some of them): not timed
# what the pool's run_starts answers (ops/panels/_jit_native_pool.py, not imported here: it
# loads numba)
FOUND_AWAKE, WOKEN, LEFT_ASLEEP, CALLER_MOVED = 0, 1, 2, 3
NO_CPU_CHECK = -1
# a worker's spin after a run before it sleeps (_jit_native_pool.SPIN_SECONDS): a run that
# begins this soon after one that ran alone would have found woken workers still spinning
SPIN_SECONDS = 1e-3
# until when a run that begins is one of a stream of back-to-back runs (process-wide, as the
# pool and its workers are): the end of the last run that ran alone, plus SPIN_SECONDS
_stream_until = [0.0]
# the run in progress on a thread: whether it leaves the workers asleep (runs_alone), and
# the pool whose workers it uses (run_pool)
_this_run = threading.local()


def runs_alone() -> bool:
    """Does the run in progress on this thread leave the native workers asleep? Its
    kernels then take every part of their jobs themselves, so a kernel that would split
    its work in Python before handing the parts out (a forest's walk: the parts' words
    and addresses, ~40 us of a request 10 ms after the last) gains nothing from the split
    and walks in one call instead."""
    return getattr(_this_run, "alone", False)


def run_pool():
    """The native pool whose workers the run in progress on this thread uses (it found
    them awake or woke them), or None (no planned run, or one alone). A kernel that splits
    its work in Python takes it from here rather than looking it up (``jit_cpu
    .native_pool``: the settings, the tier, the process, ~30 us of a request 10 ms after
    the last, cold)."""
    return getattr(_this_run, "pool", None)


class FormWakes:
    """What the plans of one form (a session's feeds' ranks and dtypes: one model at every
    size) settled on, by each plan's work (its arena's bytes and its feeds' elements): the
    most work of a plan that runs faster alone, the least of one that runs faster woken. A
    service sending a new size per request makes a plan per size, and each learnt for
    itself: three runs woken, three alone, before it could choose, where most sizes came two
    or three times in all (a 92-tree LightGBM over batches of 1-60: 63 sizes in 200
    requests, and every run woke the workers). A new plan starts from its form's verdict for
    runs of its work, where the form has one (runs alone for work up to a plan that settled
    alone, wakes them for work from one that settled woken): the smaller the run, the less
    a split gains against the wake. That LightGBM, two sessions alternating in one process
    over those sizes: 0.396 -> 0.385 ms a request (2026-11-30)."""

    __slots__ = ("alone_up_to", "woken_from")

    def __init__(self):
        self.alone_up_to, self.woken_from = -1, None

    def prior(self, work: int):
        """The way a plan of ``work`` starts with: False (alone), True (woken), or None
        (its own learning)."""
        if work <= self.alone_up_to:
            return False
        if self.woken_from is not None and work >= self.woken_from:
            return True
        return None

    def settled(self, work: int, woken: bool) -> None:
        if woken:
            self.woken_from = work if self.woken_from is None else min(self.woken_from, work)
        else:
            self.alone_up_to = max(self.alone_up_to, work)


# bytes of values and constants under which a run does not wake the native threads as it starts
# (ops/compiled/jit_cpu.native_pool): such small models' kernels seldom split their work, and one
# that does wakes them itself (a worker then joins 10-15 us late). Once a process had loaded them,
# the wake cost a one-node model's run ~9 us (20 -> 11 us: the system call, then a worker spinning
# ~45 us beside it)
WAKE_BYTES = 1 << 18


def sizable(*groups) -> bool:
    """Whether the arrays in ``groups`` hold WAKE_BYTES together."""
    total = 0
    for group in groups:
        for value in group:
            total += getattr(value, "nbytes", 0)
            if total >= WAKE_BYTES:
                return True
    return False


def join_form(forms: dict, form, plan, feed_elements: int) -> None:
    """``plan`` (an ``ExecutionPlan``) joins ``form``'s :class:`FormWakes` in ``forms`` (a
    session's table, form -> its FormWakes); its work, its arena's bytes and its feeds'
    elements (a forest's plans have no arena)."""
    found = forms.get(form)
    if found is None:
        found = forms.setdefault(form, FormWakes())
    plan.wake_choice.join(found, plan.arena_bytes + feed_elements)


class WakeChoice:
    """One plan's times of its runs that found the workers asleep, woken or not."""

    __slots__ = ("_woken", "_alone", "_asleep_runs", "_choice", "_retries", "_form", "_work",
                 "_prior")

    def __init__(self):
        self._woken: list[float] = []
        self._alone: list[float] = []
        self._asleep_runs = 0
        # what the next asleep-found run does, settled as each time comes in (two sorts a
        # run were ~5 us of a paced request's start), and whether every RETRY_EVERY-th
        # takes the other way
        self._choice, self._retries = True, False
        self._form, self._work, self._prior = None, 0, None

    def join(self, form: FormWakes, work: int) -> None:
        """The plan is one of ``form``'s, of ``work``: until it has timed both ways itself,
        it takes what the form's plans settled on for runs of its work (:class:`FormWakes`),
        and it tells the form what it settles on."""
        self._form, self._work = form, work
        self._take_prior()

    def _take_prior(self) -> None:
        """The form's verdict, where it has one and this plan is still learning (its own
        times of both ways decide once it has them)."""
        if self._prior is None and self._form is not None \
                and (len(self._woken) < LEARN or len(self._alone) < LEARN):
            self._prior = self._form.prior(self._work)
            if self._prior is not None:
                self._choice, self._retries = self._prior, True

    def begins(self, pool=None, placed_off: int = NO_CPU_CHECK):
        """The workers' side of a run that may split its kernels: a token for :meth:`ends`,
        or None when no native pool is loaded. ``pool``: the loaded pool where the caller
        knows it (the steady lane keeps it), else looked up. ``placed_off``: the CPU the
        workers were kept off (``placement.placed_off``), for the start to check the
        caller's against, placing them again where it moved; by default not checked
        (the caller placed them)."""
        if pool is None:
            pool = jit_cpu.loaded_native_pool()
            if pool is None:
                return None
        started = time.perf_counter()  # the wake's own cost counts
        in_stream = started < _stream_until[0]
        how = pool.run_starts(in_stream or self._wakes_if_asleep(), placed_off)
        if how == CALLER_MOVED:
            placement.keep_off_caller()
            how = pool.run_starts(in_stream or self._wakes_if_asleep(), NO_CPU_CHECK)
        if how == FOUND_AWAKE or in_stream:  # a stream's run: untimed, as if found awake
            _this_run.pool = pool
            return pool, AWAKE, 0.0
        self._asleep_runs += 1
        if how == WOKEN:
            _this_run.pool = pool
        else:
            _this_run.alone = True
        return pool, how == WOKEN, started

    def ends(self, token) -> None:
        pool, woken, started = token
        if woken is False:
            _this_run.alone = False
            pool.alone_ends()
        else:
            _this_run.pool = None
            pool.run_ends()
        if woken is not AWAKE:
            ended = time.perf_counter()
            if woken is False:
                _stream_until[0] = ended + SPIN_SECONDS
            self._record(self._woken if woken else self._alone, ended - started)

    def _wakes_if_asleep(self) -> bool:
        """Does the next run that finds the workers asleep wake them?"""
        if self._prior is None and self._form is not None:  # (settled since it joined?)
            self._take_prior()
        if self._retries and (self._asleep_runs + 1) % RETRY_EVERY == 0:
            return not self._choice
        return self._choice

    def _record(self, times: list, seconds: float) -> None:
        times.append(seconds)
        if len(times) > RECENT:
            del times[0]
        woken, alone = self._woken, self._alone
        if self._prior is not None and (len(woken) < LEARN or len(alone) < LEARN):
            # the form's verdict until this plan has timed both ways (its retries)
            self._choice, self._retries = self._prior, True
            return
        if len(woken) < LEARN:  # woken first
            self._choice, self._retries = True, False
            return
        if len(alone) < LEARN:  # then alone, where a wake may matter
            self._choice, self._retries = _median(woken) >= TRY_ALONE_BELOW_S, False
            if not self._choice:
                return
        else:  # then the lower median, the other way now and then
            self._choice, self._retries = _median(woken) <= _median(alone), True
        if self._form is not None:
            self._form.settled(self._work, self._choice)

    def state(self) -> dict:
        """What the plan learned (for tests and benchmarks): the kept times of each way."""
        return {"woken": list(self._woken), "alone": list(self._alone),
                "asleep_runs": self._asleep_runs}


def _median(times: list) -> float:
    return sorted(times)[len(times) // 2]
