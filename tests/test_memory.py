"""The memory planner: exact offsets on hand-made cases (TFLite's style), the in-place rule,
validation, plan checking, and property tests over random lifetimes for every strategy."""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixrt.errors import GraphError
from mixrt.runtime.memory import (
    STRATEGIES, MemoryPlan, TensorLife, align, check_plan, lower_bound, plan_memory,
)
from mixrt.runtime.memory_report import format_report, plan_report
from mixrt.runtime.plan_plot import draw_plan

T = TensorLife
KIB = 1024


def offsets(lives, strategy, candidates=(), alignment=64):
    plan = plan_memory(lives, strategy, candidates, alignment)
    check_plan(plan)
    return plan.offsets, plan.arena_bytes


# -- exact offsets -------------------------------------------------------------------------

CHAIN = [T("a", 1024, 0, 1), T("b", 2048, 1, 2), T("c", 512, 2, 3)]


def test_chain_naive_is_a_running_sum():
    assert offsets(CHAIN, "naive") == ({"a": 0, "b": 1024, "c": 3072}, 3584)


def test_chain_inplace_without_candidates_is_naive():
    assert offsets(CHAIN, "inplace") == ({"a": 0, "b": 1024, "c": 3072}, 3584)


def test_chain_sharing_reuses_the_dead_block():
    assert offsets(CHAIN, "sharing") == ({"a": 0, "b": 1024, "c": 0}, 3072)


def test_chain_greedy_places_biggest_first():
    assert offsets(CHAIN, "greedy") == ({"a": 2048, "b": 0, "c": 2048}, 3072)


# A and C die after step 1, leaving a 4 KiB hole at 0 and a 2 KiB hole at 7 KiB for E, F, G
HOLES = [T("A", 4096, 0, 1), T("B", 3072, 0, 9), T("C", 2048, 0, 1), T("D", 1536, 0, 9),
         T("E", 1024, 2, 9), T("F", 512, 2, 9), T("G", 512, 2, 9)]


def test_greedy_takes_the_smallest_gap_that_fits():
    placed, arena = offsets(HOLES, "greedy")
    assert placed == {"A": 0, "B": 4096, "C": 7168, "D": 9216,
                      "E": 7168, "F": 8192, "G": 8704}  # G fills the last 512 exactly
    assert arena == lower_bound(HOLES) == 10752


def test_sharing_takes_the_best_fitting_free_block_then_opens_one():
    placed, arena = offsets(HOLES, "sharing")
    # E takes C's 2 KiB block, F A's 4 KiB block, nothing is left for G
    assert placed == {"A": 0, "B": 4096, "C": 7168, "D": 9216,
                      "E": 7168, "F": 0, "G": 10752}
    assert arena == 11264


def test_sharing_grows_a_free_block_rather_than_opening_one():
    lives = [T("small", 1024, 0, 0), T("big", 4096, 1, 1)]
    assert offsets(lives, "sharing") == ({"small": 0, "big": 0}, 4096)


def test_sizes_round_up_to_the_alignment():
    lives = [T("a", 1, 0, 1), T("b", 65, 0, 1), T("c", 64, 0, 1)]
    assert offsets(lives, "naive") == ({"a": 0, "b": 64, "c": 192}, 256)
    assert offsets(lives, "naive", alignment=1) == ({"a": 0, "b": 1, "c": 66}, 130)
    assert align(0) == 0 and align(1) == 64 and align(128) == 128


def test_zero_size_tensors_take_no_room():
    lives = [T("a", 1024, 0, 1), T("empty", 0, 0, 1), T("b", 1024, 0, 1)]
    for strategy in STRATEGIES:
        placed, arena = offsets(lives, strategy)
        assert arena == 2048 and placed["empty"] % 64 == 0


def test_lower_bound_counts_tensors_read_at_the_step_they_are_written():
    lives = [T("x", 1024, 0, 2), T("unused", 4096, 1, 1)]
    assert lower_bound(lives) == 5120
    assert plan_memory(lives, "greedy").arena_bytes == 5120


def test_empty_schedule():
    for strategy in STRATEGIES:
        plan = plan_memory([], strategy)
        check_plan(plan)
        assert (plan.arena_bytes, plan.naive_bytes, plan.lower_bound_bytes) == (0, 0, 0)


# -- in place ------------------------------------------------------------------------------

# x -> relu -> y -> relu -> z, with w written beside z at step 1
INPLACE_CHAIN = [T("x", 1024, -1, 0), T("y", 1024, 0, 1), T("z", 512, 1, 2),
                 T("w", 1024, 1, 2)]


def test_inplace_chain_shares_one_offset():
    plan = plan_memory(INPLACE_CHAIN, "inplace", [("x", "y"), ("y", "z")])
    check_plan(plan)
    assert plan.inplace == [("x", "y"), ("y", "z")]
    assert plan.offsets == {"x": 0, "y": 0, "z": 0, "w": 1024}
    assert plan.arena_bytes == 2048 and plan.naive_bytes == 3584


@pytest.mark.parametrize("strategy", ["sharing", "greedy"])
def test_inplace_chain_under_sharing_strategies(strategy):
    plan = plan_memory(INPLACE_CHAIN, strategy, [("x", "y"), ("y", "z")])
    check_plan(plan)
    assert plan.offsets["x"] == plan.offsets["y"] == plan.offsets["z"]
    assert plan.arena_bytes == 2048
    assert plan.lower_bound_bytes == 2560  # in place beats the bound of separate buffers


def test_naive_ignores_inplace_candidates():
    plan = plan_memory(INPLACE_CHAIN, "naive", [("x", "y")])
    assert plan.inplace == [] and plan.arena_bytes == plan.naive_bytes


@pytest.mark.parametrize("lives, candidates, why", [
    ([T("a", 512, 0, 1), T("b", 1024, 1, 2)], [("a", "b")], "output bigger than input"),
    ([T("a", 1024, 0, 3), T("b", 1024, 1, 2)], [("a", "b")], "input read after the write"),
    ([T("a", 1024, 1, 1), T("b", 1024, 1, 2)], [("a", "b")], "input made at the same step"),
    ([T("a", 1024, 0, 1)], [("a", "weight"), ("weight", "a")], "tensor not planned"),
    ([T("a", 1024, 0, 1)], [("a", "a")], "a tensor over itself"),
])
def test_inplace_rule_rejects(lives, candidates, why):
    for strategy in STRATEGIES:
        plan = plan_memory(lives, strategy, candidates)
        assert plan.inplace == [], why
        check_plan(plan)


def test_an_input_is_written_over_by_one_output_only():
    lives = [T("a", 1024, 0, 1), T("b", 1024, 1, 2), T("c", 1024, 1, 2)]
    plan = plan_memory(lives, "inplace", [("a", "b"), ("a", "c")])
    assert plan.inplace == [("a", "b")]
    assert plan.offsets == {"a": 0, "b": 0, "c": 1024}


def test_an_output_is_written_over_one_input_only():
    lives = [T("a", 1024, 0, 1), T("b", 1024, 0, 1), T("c", 1024, 1, 2)]
    plan = plan_memory(lives, "inplace", [("a", "c"), ("b", "c")])
    assert plan.inplace == [("a", "c")]
    assert plan.offsets == {"a": 0, "b": 1024, "c": 0}


# -- validation ----------------------------------------------------------------------------

def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="naive, inplace, sharing, greedy"):
        plan_memory(CHAIN, "best")


@pytest.mark.parametrize("alignment", [0, -64, 1.5, True])
def test_bad_alignment(alignment):
    with pytest.raises(ValueError, match="alignment"):
        plan_memory(CHAIN, "greedy", alignment=alignment)


@pytest.mark.parametrize("lives, message", [
    ([T("a", 64, 0, 1), T("a", 64, 2, 3)], "'a' is listed twice"),
    ([T("a", 64, 3, 2)], "'a' is last read at step 2 before it is written at step 3"),
    ([T("a", -1, 0, 1)], "'a' has size -1"),
    ([T("a", 1.5, 0, 1)], "'a' has size 1.5, expected an integer"),
    ([T("a", 64, True, 1)], "'a' has first True"),
    ([T("", 64, 0, 1)], "expected a non-empty string"),
    ([("a", 64, 0, 1)], "expected a TensorLife"),
])
def test_bad_lifetimes_are_named(lives, message):
    with pytest.raises(GraphError, match=message):
        plan_memory(lives, "greedy")


def test_numpy_integers_are_accepted_and_stored_as_int():
    import numpy as np
    plan = plan_memory([T("a", np.int64(100), np.int32(0), np.int64(1))], "greedy")
    assert type(plan.lifetimes[0].size) is int and plan.arena_bytes == 128


# -- check_plan ----------------------------------------------------------------------------

def tampered(plan: MemoryPlan, **changes) -> MemoryPlan:
    return dataclasses.replace(plan, **changes)


def test_check_plan_rejects_overlapping_live_tensors():
    plan = plan_memory(HOLES, "greedy")
    with pytest.raises(GraphError, match="'B'.*'E'|'E'.*'B'"):
        check_plan(tampered(plan, offsets={**plan.offsets, "E": 4096}))


def test_check_plan_allows_overlap_of_tensors_that_are_never_alive_together():
    plan = plan_memory(HOLES, "greedy")
    check_plan(tampered(plan, offsets={**plan.offsets, "F": 0, "G": 512}))  # A's old place


@pytest.mark.parametrize("change, message", [
    (dict(offsets={"a": 0, "b": 1024}), "3 tensors but 2 offsets"),
    (dict(offsets={"a": 0, "b": 1024, "c": 32}), "'c' .* not 64-byte aligned"),
    (dict(offsets={"a": 0, "b": 1024, "c": 4096}), "inside the 3584-byte arena"),
    (dict(offsets={"a": 0, "b": 1024, "c": -64}), "offset -64"),
    (dict(offsets={"a": 0, "b": 1024, "c": "0"}), "expected an integer"),
    (dict(arena_bytes=-1), "arena size"),
    (dict(strategy="magic"), "unknown strategy 'magic'"),
    (dict(alignment=0), "alignment"),
    (dict(inplace=[("a", "zz")]), "does not name two planned tensors"),
    (dict(inplace=[("a", "b")]), "'b' may not be written over 'a'"),
    (dict(lifetimes=[T("a", 1024, 0, 1), T("b", 2048, 1, 2), T("c", 512, 3, 2)]),
     "'c' is last read at step 2 before"),
])
def test_check_plan_names_what_is_wrong(change, message):
    plan = plan_memory(CHAIN, "naive")
    with pytest.raises(GraphError, match=message):
        check_plan(tampered(plan, **change))


def test_check_plan_wants_inplace_pairs_at_one_offset():
    plan = plan_memory(INPLACE_CHAIN, "inplace", [("x", "y")])
    with pytest.raises(GraphError, match="has offsets 0 and 1024, expected one"):
        check_plan(tampered(plan, offsets={**plan.offsets, "y": 1024}))
    with pytest.raises(GraphError, match="already in another pair"):
        check_plan(tampered(plan, inplace=[("x", "y"), ("x", "y")]))


def test_check_plan_sees_a_newcomer_overlap_the_tail_of_an_inplace_input():
    # y is written over x (smaller); v, written at the same step, takes x's tail
    lives = [T("x", 2048, 0, 1), T("y", 1024, 1, 2), T("v", 1024, 1, 2)]
    plan = plan_memory(lives, "inplace", [("x", "y")])
    check_plan(plan)
    with pytest.raises(GraphError, match="'x'.*'v'"):
        check_plan(tampered(plan, offsets={**plan.offsets, "v": 1024}))


# -- reports and pictures ------------------------------------------------------------------

def test_plan_report_keys_and_ratios():
    report = plan_report(plan_memory(HOLES, "greedy"))
    assert report == {"strategy": "greedy", "arena_bytes": 10752, "naive_bytes": 12800,
                      "lower_bound_bytes": 10752, "tensors": 7, "inplace": 0,
                      "ratio_to_lower_bound": 1.0, "naive_over_arena": 1.1905}
    text = format_report(plan_memory(HOLES, "sharing"))
    assert "sharing" in text and "arena" in text and "(11264 bytes)" in text


def test_draw_plan_writes_a_png(tmp_path):
    plan = plan_memory(INPLACE_CHAIN, "greedy", [("x", "y"), ("y", "z")])
    path = draw_plan(plan, tmp_path / "plan.png")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    empty = draw_plan(plan_memory([], "greedy"), tmp_path / "empty.png", title="nothing")
    assert empty.stat().st_size > 0


# -- properties ----------------------------------------------------------------------------

SIZES = st.sampled_from([0, 1, 63, 64, 65, 100, 256, 1000, 4096, 5000])


@st.composite
def schedules(draw):
    count = draw(st.integers(0, 24))
    lives = []
    for i in range(count):
        first = draw(st.integers(-1, 16))
        lives.append(T(f"t{i}", draw(SIZES), first, first + draw(st.integers(0, 8))))
    names = [life.name for life in lives]
    candidates = draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names)),
                               max_size=16)) if names else []
    return lives, candidates


def brute_force_conflicts(lives, placed, pairs):
    """Every pair alive at one step sharing a byte that is not an in-place pair: O(n^2)."""
    allowed = {frozenset(pair) for pair in pairs}
    found = []
    for i, a in enumerate(lives):
        for b in lives[i + 1:]:
            if a.size and b.size and a.first <= b.last and b.first <= a.last \
                    and placed[a.name] < placed[b.name] + b.size \
                    and placed[b.name] < placed[a.name] + a.size \
                    and frozenset((a.name, b.name)) not in allowed:
                found.append((a.name, b.name))
    return found


def assert_candidates_honoured_when_allowed(by_name, candidates, honoured):
    """A refused candidate broke the rule or reused a tensor an earlier pair took."""
    sources, targets = {a for a, _ in honoured}, {b for _, b in honoured}
    for source, target in candidates:
        if (source, target) in honoured:
            continue
        a, b = by_name[source], by_name[target]
        allowed = a.last == b.first and a.first < b.first and b.size <= a.size
        assert not allowed or source in sources or target in targets


@settings(max_examples=200, deadline=None)
@given(schedules(), st.sampled_from([1, 64]))
def test_every_strategy_gives_a_valid_plan(schedule, alignment):
    lives, candidates = schedule
    by_name = {life.name: life for life in lives}
    for strategy in STRATEGIES:
        plan = plan_memory(lives, strategy, candidates, alignment)
        check_plan(plan)
        assert brute_force_conflicts(lives, plan.offsets, plan.inplace) == []
        for source, target in plan.inplace:
            assert (source, target) in candidates
            assert by_name[source].last == by_name[target].first
            assert by_name[target].size <= by_name[source].size
            assert plan.offsets[source] == plan.offsets[target]
        if strategy != "naive":
            assert_candidates_honoured_when_allowed(by_name, candidates, plan.inplace)
        assert all(o % alignment == 0 for o in plan.offsets.values())
        assert all(plan.offsets[l.name] + align(l.size, alignment) <= plan.arena_bytes
                   for l in lives)
        assert plan.naive_bytes == sum(align(l.size, alignment) for l in lives)
        assert plan.arena_bytes <= plan.naive_bytes
        if not plan.inplace:  # in-place writes may beat the bound of separate buffers
            assert plan.arena_bytes >= plan.lower_bound_bytes
    naive = plan_memory(lives, "naive", candidates, alignment)
    assert naive.arena_bytes == naive.naive_bytes and naive.inplace == []
    inplace = plan_memory(lives, "inplace", candidates, alignment).arena_bytes
    for strategy in ("sharing", "greedy"):  # sharing never needs more than separate groups
        assert plan_memory(lives, strategy, candidates, alignment).arena_bytes <= inplace


@settings(max_examples=200, deadline=None)
@given(schedules(), st.lists(st.integers(0, 8), min_size=24, max_size=24))
def test_check_plan_agrees_with_brute_force(schedule, slots):
    """Random (aligned) offsets: check_plan must raise exactly when some pair conflicts."""
    lives, _ = schedule
    placed = {life.name: slot * 1024 for life, slot in zip(lives, slots)}
    plan = MemoryPlan("greedy", 16 * 1024, 0, 0, placed, lives)
    if brute_force_conflicts(lives, placed, []):
        with pytest.raises(GraphError, match="share arena bytes"):
            check_plan(plan)
    else:
        check_plan(plan)


def test_planning_is_deterministic():
    rng = random.Random(7)
    lives = [T(f"t{i}", rng.choice([64, 640, 6400]), i, i + rng.randint(0, 20))
             for i in range(200)]
    for strategy in STRATEGIES:
        assert plan_memory(lives, strategy).offsets == plan_memory(lives, strategy).offsets


def test_planning_and_checking_thousands_of_tensors_is_fast():
    # a DenseNet-shaped schedule: short-lived tensors, some living across a whole block
    rng = random.Random(3)
    lives = [T(f"t{i}", rng.choice([50_176, 200_704, 802_816]) * rng.randint(1, 4), i,
               i + (rng.randint(30, 120) if i % 10 == 0 else rng.randint(1, 3)))
             for i in range(3000)]
    candidates = [(f"t{i}", f"t{i + 1}") for i in range(0, 2999, 2)]
    started = time.perf_counter()
    plan = plan_memory(lives, "greedy", candidates)
    check_plan(plan)
    elapsed = time.perf_counter() - started
    assert elapsed < 2.0, f"planning 3000 tensors took {elapsed:.2f} s"
    assert plan.arena_bytes <= 1.05 * plan.lower_bound_bytes


@pytest.mark.parametrize("seed", range(6))
def test_the_scanned_gap_search_places_as_the_vectorized_one(seed, monkeypatch):
    """_best_gap's Python scan (few live blocks) and its NumPy form give the same offsets."""
    from mixrt.runtime import memory
    rng = np.random.default_rng(seed)
    lives = []
    for i in range(300):
        first = int(rng.integers(0, 200))
        lives.append(TensorLife(f"t{i}", int(rng.choice([64, 256, 1000, 4096, 40000])),
                                first, first + int(rng.integers(0, 30))))
    scanned = plan_memory(lives, "greedy")
    monkeypatch.setattr(memory, "SCANNED_BLOCKS", -1)
    vectorized = plan_memory(lives, "greedy")
    assert scanned.offsets == vectorized.offsets
    assert scanned.arena_bytes == vectorized.arena_bytes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 30), st.integers(0, 12)),
                min_size=1, max_size=90),
       st.randoms(use_true_random=False))
def test_greedy_placement_by_neighbours_equals_the_queried_one(spans, rng):
    """The placement that scans each group's overlapping neighbours gives the offsets of the
    one that queries every placed group with NumPy, for any order (size 0 included)."""
    from mixrt.runtime import memory  # noqa: PLC0415
    groups = [memory._Group([i], first, first + length, memory.align(size))
              for i, (size, first, length) in enumerate(spans)]
    order = list(range(len(groups)))
    rng.shuffle(order)
    queried = memory._place_greedy_queried(groups, order)
    assert memory._place_greedy_in(groups, order) == queried  # as placement chooses
    listed = memory.NEIGHBOURS_PER_GROUP
    try:  # and by neighbours however densely they overlap
        memory.NEIGHBOURS_PER_GROUP = len(groups)
        memory._overlapping.cache_clear()  # the lists are kept by lifetimes: made again
        assert memory._place_greedy_in(groups, order) == queried
    finally:
        memory.NEIGHBOURS_PER_GROUP = listed


def test_new_sizes_over_the_same_lifetimes_reuse_the_neighbour_lists():
    """A form's new shapes keep its lifetimes and change only sizes: the overlapping
    neighbours are worked out once, and each placement is the one worked out afresh."""
    from mixrt.runtime import memory  # noqa: PLC0415
    spans = [(0, 2), (1, 3), (2, 5), (4, 6), (5, 7), (0, 7)]

    def lives(scale):
        return [T(f"t{i}", (i % 3 + 1) * scale * KIB, first, last)
                for i, (first, last) in enumerate(spans)]
    memory._overlapping.cache_clear()
    kept = [plan_memory(lives(scale), "greedy") for scale in (1, 3, 7)]
    assert memory._overlapping.cache_info().misses == 1
    for scale, plan in zip((1, 3, 7), kept):
        check_plan(plan)
        memory._overlapping.cache_clear()
        assert plan_memory(lives(scale), "greedy").offsets == plan.offsets
