"""The walk a forest's batch takes, chosen by the clock (ops/ml/walk_choice.py): the faster
of the two after SAMPLES timed calls of each, timed again every RETUNE_CALLS calls; and
either walk, kept or being timed, gives the NumPy tier's sums bit for bit."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_tier, parallel
from mixrt.ops.ml import ml_trees, walk_choice
from test_tree_stepped_walk import _forest, _rows


def _timed_round(choice, stepped_ns, walked_ns):
    """Calls until the choice keeps a walk, each taking the given time; the walks tried."""
    tried = []
    while choice.kept is None:
        stepped, timing = choice.next()
        assert timing
        tried.append(stepped)
        choice.timed(stepped, stepped_ns if stepped else walked_ns)
    return tried


@pytest.mark.parametrize("stepped_ns, walked_ns, kept", [(100, 300, True), (300, 100, False),
                                                         (200, 200, True)])
def test_the_faster_walk_is_kept_after_both_are_timed(stepped_ns, walked_ns, kept):
    choice = walk_choice.WalkChoice()
    tried = _timed_round(choice, stepped_ns, walked_ns)
    assert tried.count(True) == tried.count(False) == walk_choice.SAMPLES
    assert tried[:2] == [True, False]  # they alternate, so a burst of load hits both
    assert choice.kept is kept
    assert choice.next() == (kept, False)  # kept: no more timing


def test_one_slow_sample_does_not_decide():
    """The fastest call of each walk counts: another process's interruption of one call
    says nothing about the walk."""
    choice = walk_choice.WalkChoice()
    times = {True: [100, 5000, 100], False: [150, 150, 150]}
    while choice.kept is None:
        stepped, _ = choice.next()
        choice.timed(stepped, times[stepped].pop(0))
    assert choice.kept is True


def test_the_walks_are_timed_again_as_traffic_changes():
    choice = walk_choice.WalkChoice()
    _timed_round(choice, 100, 300)
    calls = walk_choice.SAMPLES * 2
    while (calls + 1) % walk_choice.RETUNE_CALLS:
        assert choice.next() == (True, False)
        calls += 1
    stepped, timing = choice.next()  # the next round begins
    assert timing and choice.kept is None
    choice.timed(stepped, 300)
    _timed_round(choice, 300, 100)
    assert choice.kept is False


def test_a_forest_keeps_choices_for_a_bounded_number_of_batch_sizes():
    choices = walk_choice.WalkChoices()
    for rows in range(walk_choice.MOST_SIZES):
        assert choices.for_rows(rows + 4) is not None
    assert choices.for_rows(10_000) is None
    assert choices.for_rows(4) is choices.for_rows(4)


@pytest.mark.parametrize("mode", ["BRANCH_LEQ", "BRANCH_LT"])
@pytest.mark.parametrize("rows", [8, 64, 200])  # fewer take the request path
def test_every_call_while_timing_and_after_gives_the_numpy_tiers_sums(mode, rows):
    rng = np.random.default_rng(rows + 11)
    attrs = _forest(rng, 16, 3, mode, "target_")
    attrs.update(n_targets=3, aggregate_function="SUM", base_values=[0.5, -1.0, 2.0])
    x = _rows(rng, rows)
    with jit_tier.using(False):
        expected = ml_trees.tree_ensemble_regressor(np, x, **attrs, _node={})
    state: dict = {}
    with jit_tier.using(True), parallel.pinned():
        for _ in range(2 * walk_choice.SAMPLES + 3):
            got = ml_trees.tree_ensemble_regressor(np, x, **attrs, _node=state)
            np.testing.assert_array_equal(got, expected)
    forest = next(v.forest for v in state.values() if hasattr(v, "forest"))
    assert forest._choices.for_rows(rows).kept is not None


@pytest.mark.parametrize("stepped", [True, False])
def test_either_kept_walk_gives_the_numpy_tiers_scores(monkeypatch, stepped):
    monkeypatch.setattr(walk_choice.WalkChoice, "next", lambda self: (stepped, False))
    rng = np.random.default_rng(3)
    attrs = _forest(rng, 20, 4, "BRANCH_LEQ", "class_")
    attrs.update(classlabels_int64s=[0, 1, 2, 3], post_transform="NONE")
    x = _rows(rng, 130)
    with jit_tier.using(False):
        expected = ml_trees.tree_ensemble_classifier(np, x, **attrs, _node={})
    with jit_tier.using(True), parallel.pinned():
        got = ml_trees.tree_ensemble_classifier(np, x, **attrs, _node={})
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
