"""A plan's choice, for runs that find the native workers asleep, between waking them and
running alone (ops/compiled/worker_wakes.py), on a pool and a clock of the test's own: each
way timed on the runs that took it, the faster kept, the other tried now and then, long
runs always waking, runs that find the workers awake using them untimed, and so do the runs
of a back-to-back stream after a run that left them asleep."""

import threading

import numpy as np

import pytest

from mixrt.ops.compiled import worker_wakes
from mixrt.ops.compiled.worker_wakes import (LEARN, RETRY_EVERY, SPIN_SECONDS,
                                             TRY_ALONE_BELOW_S, WakeChoice)

PACED_S = 10e-3  # between two requests of a service: the workers are asleep by the next


class FakePool:
    """The pool's side as ``_jit_native_pool.run_starts`` answers it, the caller's CPU
    ``cpu``, on the test's ``clock``: after a run that used them, the workers spin
    SPIN_SECONDS before they sleep (``sleeping`` False: they never sleep)."""

    def __init__(self, clock):
        self.sleeping, self.calls, self.cpu = True, [], 0
        self._clock, self._spins_until = clock, 0.0

    def run_starts(self, wake_if_asleep, placed_off=worker_wakes.NO_CPU_CHECK):
        if placed_off != worker_wakes.NO_CPU_CHECK and self.cpu != placed_off:
            self.calls.append("caller moved")
            return worker_wakes.CALLER_MOVED
        asleep = self.sleeping and self._clock[0] >= self._spins_until
        if not asleep or wake_if_asleep:
            self.calls.append("run_begins")
            return worker_wakes.WOKEN if asleep else worker_wakes.FOUND_AWAKE
        self.calls.append("alone_begins")
        return worker_wakes.LEFT_ASLEEP

    def run_ends(self):
        self.calls.append("run_ends")
        self._spins_until = self._clock[0] + SPIN_SECONDS

    def alone_begins(self):
        self.calls.append("alone_begins")

    def alone_ends(self):
        self.calls.append("alone_ends")


@pytest.fixture(autouse=True)
def own_run_state(monkeypatch):
    """What a test's runs say of themselves (runs_alone, run_pool) stays the test's: a run
    begun here without its end must not reach another test's kernels."""
    monkeypatch.setattr(worker_wakes, "_this_run", threading.local())


@pytest.fixture
def machine(monkeypatch):
    """The pool every run finds, and a clock each run advances by its way's cost."""
    clock = [0.0]
    pool = FakePool(clock)
    monkeypatch.setattr(worker_wakes.jit_cpu, "loaded_native_pool", lambda: pool)
    monkeypatch.setattr(worker_wakes.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(worker_wakes, "_stream_until", [0.0])  # no stream of an earlier test
    return pool, clock


def _runs(choice, machine, count, woken_s, alone_s, gap_s=PACED_S):
    """``count`` runs ``gap_s`` apart (end to start), each costing ``woken_s`` or ``alone_s``
    by the way it took: the ways."""
    pool, clock = machine
    ways = []
    for _ in range(count):
        clock[0] += gap_s
        token = choice.begins()
        woken = token[1]
        clock[0] += woken_s if woken or woken is None else alone_s
        choice.ends(token)
        ways.append(woken)
    return ways


def test_short_runs_that_gain_less_than_the_wake_run_alone(machine):
    choice = WakeChoice()
    ways = _runs(choice, machine, 3 * RETRY_EVERY, woken_s=100e-6, alone_s=70e-6)
    assert ways[:LEARN] == [True] * LEARN  # woken first, as before
    assert ways[LEARN:2 * LEARN] == [False] * LEARN  # then tried alone
    assert ways[2 * LEARN:].count(True) == 3  # then only the retries wake them
    assert machine[0].calls.count("alone_begins") == machine[0].calls.count("alone_ends")
    assert machine[0].calls.count("run_begins") == machine[0].calls.count("run_ends")


def test_runs_that_gain_more_than_the_wake_keep_waking(machine):
    ways = _runs(WakeChoice(), machine, 3 * RETRY_EVERY, woken_s=60e-6, alone_s=90e-6)
    assert ways[LEARN:2 * LEARN] == [False] * LEARN
    assert ways[2 * LEARN:].count(False) == 3  # only the retries run alone


def test_long_runs_never_try_running_alone(machine):
    ways = _runs(WakeChoice(), machine, 40, woken_s=2 * TRY_ALONE_BELOW_S, alone_s=1e-6)
    assert ways == [True] * 40
    assert "alone_begins" not in machine[0].calls


def test_a_change_of_load_is_noticed_by_the_retries(machine):
    choice = WakeChoice()
    _runs(choice, machine, 40, woken_s=100e-6, alone_s=70e-6)  # alone is faster ...
    ways = _runs(choice, machine, 2 * RETRY_EVERY, woken_s=100e-6, alone_s=300e-6)  # ... not now
    assert ways[:4] == [False] * 4  # its median moves once half its kept times are new
    assert ways[4:].count(False) == 2  # then only the retries run alone


def test_runs_that_find_the_workers_awake_use_them_and_are_not_timed(machine):
    pool, _ = machine
    pool.sleeping = False
    choice = WakeChoice()
    ways = _runs(choice, machine, 10, woken_s=100e-6, alone_s=1e-6)
    assert ways == [None] * 10 and pool.calls == ["run_begins", "run_ends"] * 10
    assert choice.state() == {"woken": [], "alone": [], "asleep_runs": 0}


def test_a_stream_of_runs_after_one_alone_wakes_the_workers_untimed(machine):
    """Back to back, a run that ran alone leaves the next one finding the workers asleep;
    had it woken them, they would still be spinning, so the stream wakes them and learns
    nothing from it (its runs are not the paced ones the choice is between)."""
    pool, _ = machine
    choice = WakeChoice()
    _runs(choice, machine, 40, woken_s=100e-6, alone_s=70e-6)  # paced: learnt to run alone
    learnt = choice.state()
    machine[1][0] += PACED_S  # a pause, then the stream
    ways = _runs(choice, machine, 20, woken_s=60e-6, alone_s=70e-6, gap_s=SPIN_SECONDS / 2)
    assert ways[0] is False  # the stream's first run found them asleep after a pause
    assert ways[1:] == [None] * 19  # the next woke them, the rest found them spinning
    assert choice.state()["alone"] == pytest.approx(learnt["alone"][1:] + [70e-6])  # one more
    assert choice.state()["asleep_runs"] == learnt["asleep_runs"] + 1
    assert pool.calls.count("alone_begins") == pool.calls.count("alone_ends")
    assert pool.calls.count("run_begins") == pool.calls.count("run_ends")
    # paced again, the choice learnt stands
    assert _runs(choice, machine, 5, woken_s=100e-6, alone_s=70e-6) == [False] * 5


def test_a_run_past_the_spin_after_one_alone_is_paced(machine):
    choice = WakeChoice()
    _runs(choice, machine, 40, woken_s=100e-6, alone_s=70e-6)
    ways = _runs(choice, machine, 10, woken_s=100e-6, alone_s=70e-6, gap_s=2 * SPIN_SECONDS)
    assert ways == [False] * 10


def test_a_run_alone_says_so_while_it_runs(machine):
    """Its kernels ask (``runs_alone``) whether to split their work at all."""
    choice = WakeChoice()
    seen = []
    for _ in range(2 * LEARN):
        machine[1][0] += PACED_S
        token = choice.begins()
        seen.append((token[1], worker_wakes.runs_alone(), worker_wakes.run_pool() is not None))
        machine[1][0] += 100e-6
        choice.ends(token)
        assert not worker_wakes.runs_alone()
    assert seen == [(True, False, True)] * LEARN + [(False, True, False)] * LEARN


def test_a_run_that_uses_the_workers_names_their_pool_while_it_runs(machine):
    pool, clock = machine
    choice = WakeChoice()
    for found_awake in (False, True):
        pool.sleeping = not found_awake
        clock[0] += PACED_S
        token = choice.begins()
        assert worker_wakes.run_pool() is pool and not worker_wakes.runs_alone()
        choice.ends(token)
        assert worker_wakes.run_pool() is None


def test_no_pool_loaded_means_no_token(monkeypatch):
    monkeypatch.setattr(worker_wakes.jit_cpu, "loaded_native_pool", lambda: None)
    assert WakeChoice().begins() is None


def test_a_pool_the_caller_keeps_is_not_looked_up(monkeypatch):
    pool = FakePool([0.0])
    monkeypatch.setattr(worker_wakes.jit_cpu, "loaded_native_pool", lambda: None)
    token = WakeChoice().begins(pool)
    assert token[0] is pool and token[1] is True and pool.calls == ["run_begins"]


def test_a_caller_on_another_cpu_places_the_workers_before_they_start(machine, monkeypatch):
    pool, _ = machine
    placed = []
    monkeypatch.setattr(worker_wakes.placement, "keep_off_caller", lambda: placed.append(1))
    pool.cpu = 1
    token = WakeChoice().begins(pool, placed_off=0)
    assert placed == [1] and pool.calls == ["caller moved", "run_begins"] and token[1] is True
    token = WakeChoice().begins(pool, placed_off=1)  # where it was: nothing to place
    assert placed == [1] and pool.calls[-1] == "run_begins"


def test_the_answers_are_the_native_pools():
    pytest.importorskip("numba")
    from mixrt.ops.panels import _jit_native_pool as native
    assert worker_wakes.SPIN_SECONDS == native.SPIN_SECONDS
    assert (worker_wakes.FOUND_AWAKE, worker_wakes.WOKEN, worker_wakes.LEFT_ASLEEP,
            worker_wakes.CALLER_MOVED, worker_wakes.NO_CPU_CHECK) == (
        native.FOUND_AWAKE, native.WOKEN, native.LEFT_ASLEEP, native.CALLER_MOVED,
        native.NO_CPU_CHECK)


def test_a_forms_new_plans_start_from_what_its_plans_settled(machine):
    """A service's new size is a new plan: it starts from what the form's plans settled on
    for runs of its work (alone up to the most work of a plan that ran faster alone, woken
    from the least of one that ran faster woken), and learns for itself in between."""
    form = worker_wakes.FormWakes()
    small = WakeChoice()
    small.join(form, 1000)
    _runs(small, machine, 2 * LEARN + 1, woken_s=100e-6, alone_s=70e-6)  # settles alone
    assert form.alone_up_to == 1000 and form.woken_from is None
    smaller = WakeChoice()
    smaller.join(form, 400)
    assert _runs(smaller, machine, 10, woken_s=100e-6, alone_s=70e-6) == [False] * 10
    large = WakeChoice()
    large.join(form, 50_000)  # past what ran alone: its own learning, woken first
    ways = _runs(large, machine, 2 * LEARN + 1, woken_s=60e-6, alone_s=90e-6)
    assert ways[:LEARN] == [True] * LEARN and ways[LEARN:2 * LEARN] == [False] * LEARN
    assert form.woken_from == 50_000
    larger = WakeChoice()
    larger.join(form, 80_000)
    assert _runs(larger, machine, 10, woken_s=60e-6, alone_s=90e-6) == [True] * 10
    between = WakeChoice()
    between.join(form, 20_000)
    assert _runs(between, machine, LEARN, woken_s=60e-6, alone_s=90e-6) == [True] * LEARN


def test_a_plan_on_its_forms_verdict_still_tries_the_other_way_now_and_then(machine):
    form = worker_wakes.FormWakes()
    form.settled(1000, woken=False)
    choice = WakeChoice()
    choice.join(form, 10)
    ways = _runs(choice, machine, 2 * RETRY_EVERY, woken_s=100e-6, alone_s=70e-6)
    assert ways.count(True) == 2  # the retries
    long_runs = WakeChoice()  # a plan that runs long wakes them, and says so
    long_runs.join(form, 5000)
    _runs(long_runs, machine, LEARN, woken_s=2 * TRY_ALONE_BELOW_S, alone_s=1e-6)
    assert form.woken_from == 5000


def test_a_plan_made_before_its_form_settled_takes_the_verdict_once_there(machine):
    """A service's first requests make many plans before any has learnt: each takes the
    form's verdict at its next run that finds the workers asleep."""
    form = worker_wakes.FormWakes()
    early = WakeChoice()
    early.join(form, 10)
    assert _runs(early, machine, 1, woken_s=100e-6, alone_s=70e-6) == [True]  # learning
    form.settled(100, woken=False)
    assert _runs(early, machine, 5, woken_s=100e-6, alone_s=70e-6) == [False] * 5


def test_a_signatures_feed_elements():
    from mixrt.runtime.feeds import feed_elements, feed_signature
    signature = feed_signature({"x": np.zeros((3, 5), np.float32), "n": np.zeros((), np.int64),
                                "m": {"a": 1.0}, "s": [np.zeros(4)]})
    assert feed_elements(signature) == 16
