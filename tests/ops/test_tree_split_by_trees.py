"""A few rows' walk of a large forest split by its trees between this thread and the native
worker (ops/ml/forest_walks.tree_parts, ops/ml/_jit_tree_leaves.py): every walk a batch may
take, on the request path and the general one, gives the NumPy tier's bits and the bits of
the same walk on one thread."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu, jit_tier, parallel
from mixrt.ops.ml import forest_walks, ml_trees, walk_choice

from test_tree_stepped_walk import _forest, _rows


@pytest.fixture
def split_counts(monkeypatch):
    """Splits every walk of fewer than two parts' rows (TREE_SPLIT_STEPS lowered), counting
    the walks split by trees; skips where there is no native worker to split with."""
    with jit_tier.using(True), parallel.pinned():
        if jit_cpu.panel_kernels() is None or jit_cpu.native_pool() is None:
            pytest.skip("no native worker pool on this machine (one thread, or no AVX-512)")
    monkeypatch.setattr(forest_walks, "TREE_SPLIT_STEPS", 1)
    counts = []
    prepared = forest_walks._Forest.split_sums

    def counted(self, *args):  # the request path's and the general path's
        sums = prepared(self, *args)
        counts.append(sums is not None)
        return sums
    monkeypatch.setattr(forest_walks._Forest, "split_sums", counted)
    return counts


def _three_ways(monkeypatch, kernel, x, attrs):
    """(NumPy tier, compiled and split by trees, compiled on one thread); the compiled
    calls made twice on one node state, so the second takes the node's request path."""
    with jit_tier.using(False):
        expected = kernel(np, x, **attrs, _node={})
    answers = []
    for steps in (1, 1 << 60):
        monkeypatch.setattr(forest_walks, "TREE_SPLIT_STEPS", steps)
        state = {}
        with jit_tier.using(True), parallel.pinned():
            first = kernel(np, x, **attrs, _node=state)
            again = kernel(np, x, **attrs, _node=state)
        _equal(again, first)
        answers.append(first)
    return expected, answers[0], answers[1]


def _equal(got, expected):
    for a, b in zip(got if isinstance(got, tuple) else (got,),
                    expected if isinstance(expected, tuple) else (expected,)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["BRANCH_LEQ", "BRANCH_LT"])
@pytest.mark.parametrize("index", [0, 1, 2, 3])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7])
def test_each_walk_split_by_trees_gives_the_one_thread_bits(split_counts, monkeypatch, mode,
                                                            index, rows):
    """The stepped walk, the one in step, and the branching ones over depth-first tables
    (row by row, tree by tree), with missing values on both sides of a split."""
    monkeypatch.setattr(walk_choice.WalkChoice, "next", lambda self: (index, False))
    rng = np.random.default_rng(rows * 10 + index)
    attrs = _forest(rng, 30, 4, mode, "class_", depth=7)
    attrs.update(classlabels_int64s=[0, 1, 2, 3], post_transform="NONE")
    expected, split, alone = _three_ways(monkeypatch, ml_trees.tree_ensemble_classifier,
                                         _rows(rng, rows), attrs)
    _equal(split, expected)
    _equal(alone, split)
    assert any(split_counts)


@pytest.mark.parametrize("rows", [1, 4, 6])
@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE"])
def test_a_regressors_request_split_by_trees_gives_the_one_thread_bits(split_counts,
                                                                       monkeypatch, rows,
                                                                       aggregate):
    rng = np.random.default_rng(rows)
    attrs = _forest(rng, 40, 3, "BRANCH_LT", "target_", depth=8)
    attrs.update(n_targets=3, aggregate_function=aggregate, base_values=[0.5, -1.0, 2.0])
    expected, split, alone = _three_ways(monkeypatch, ml_trees.tree_ensemble_regressor,
                                         _rows(rng, rows), attrs)
    _equal(split, expected)
    _equal(alone, split)
    assert any(split_counts)


def test_two_classes_and_float64_rows_split_by_trees(split_counts, monkeypatch):
    rng = np.random.default_rng(23)
    attrs = _forest(rng, 25, 1, "BRANCH_LEQ", "class_", depth=6)
    for transform in ("NONE", "LOGISTIC"):
        attrs.update(classlabels_int64s=[0, 1], post_transform=transform)
        for dtype in (np.float32, np.float64):
            expected, split, alone = _three_ways(
                monkeypatch, ml_trees.tree_ensemble_classifier, _rows(rng, 3, dtype), attrs)
            if transform == "NONE":  # (the tiers' logistic functions differ in the last bit)
                _equal(split, expected)
            _equal(alone, split)
    assert any(split_counts)


def test_a_forest_of_mixed_modes_splits_its_general_walk(split_counts, monkeypatch):
    """Branches of several modes: no stepped or depth-first tables, the walk that stops at
    each leaf in both parts."""
    rng = np.random.default_rng(29)
    attrs = _forest(rng, 30, 2, "BRANCH_LEQ", "target_", depth=6)
    attrs["nodes_modes"] = [mode if mode == "LEAF" else rng.choice(["BRANCH_LEQ", "BRANCH_GT"])
                            for mode in attrs["nodes_modes"]]
    attrs.update(n_targets=2, aggregate_function="SUM")
    expected, split, alone = _three_ways(monkeypatch, ml_trees.tree_ensemble_regressor,
                                         _rows(rng, 2), attrs)
    _equal(split, expected)
    _equal(alone, split)
    assert any(split_counts)


def test_a_walk_splits_by_trees_only_where_rows_are_few_and_the_forest_large(monkeypatch):
    with jit_tier.using(True), parallel.pinned():
        if jit_cpu.native_pool() is None:
            pytest.skip("one thread: nothing to split")
        rng = np.random.default_rng(31)
        attrs = _forest(rng, 60, 1, "BRANCH_LEQ", "target_", depth=8)
        attrs.update(n_targets=1, aggregate_function="SUM")
        state = {}
        ml_trees.tree_ensemble_regressor(np, _rows(rng, 2), **attrs, _node=state)
        built = next(v.forest for v in state.values() if hasattr(v, "forest"))
        steps = built._steps_per_row()
        monkeypatch.setattr(forest_walks, "TREE_SPLIT_STEPS", steps * 3)
        assert built.tree_parts(2)[1] is None  # 2 rows: too little work
        native, bounds = built.tree_parts(3)
        assert native is not None and bounds[0] == 0 and bounds[-1] == 60
        assert len(bounds) == native.workers + 2  # a part per thread, trees in order
        assert built.tree_parts(2 * forest_walks.SPLIT_ROWS)[1] is None  # split by rows


def _classifier_batches(seed: int, count: int):
    """A 30-tree, 4-class forest's attributes, ``count`` batches of 3 rows, and the NumPy
    tier's answer to each."""
    rng = np.random.default_rng(seed)
    attrs = _forest(rng, 30, 4, "BRANCH_LEQ", "class_", depth=7)
    attrs.update(classlabels_int64s=[0, 1, 2, 3], post_transform="NONE")
    batches = [_rows(rng, 3) for _ in range(count)]
    with jit_tier.using(False):
        expected = [ml_trees.tree_ensemble_classifier(np, x, **attrs, _node={})
                    for x in batches]
    return attrs, batches, expected


def test_a_prepared_split_call_answers_each_new_batch_and_each_thread(split_counts,
                                                                      monkeypatch):
    """The request path's split call is prepared once per thread and batch shape
    (ops/ml/tree_split_calls.py): later batches of that shape, and two threads calling one
    node at once, each get their own rows' answers. (The clock's choice between the split
    and the whole walk pinned to the split's first walk.)"""
    import threading  # noqa: PLC0415
    monkeypatch.setattr(walk_choice.WalkChoice, "next", lambda self: (0, False))
    attrs, batches, expected = _classifier_batches(37, 12)
    state, found, errors = {}, {}, []

    def calls(caller, order):
        # keyed by the caller's label, not its thread's ident: a thread that has ended may
        # hand its ident to the next one started
        try:
            with jit_tier.using(True), parallel.pinned():
                for index in order:
                    found[(caller, index)] = ml_trees.tree_ensemble_classifier(
                        np, batches[index], **attrs, _node=state)
        except Exception as error:  # noqa: BLE001  (raised below, in the test's thread)
            errors.append(error)
    calls("alone", range(12))  # one thread, batch after batch
    threads = [threading.Thread(target=calls, args=(caller, order))
               for caller, order in (("forward", range(12)),
                                     ("backward", reversed(range(12))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # (the node's first call makes its request path, and takes the general one's walk)
    assert not errors and len(found) == 36 and sum(split_counts) >= 35
    for (_, index), got in found.items():
        _equal(got, expected[index])


def test_a_request_path_readies_its_split_at_its_first_run_without_teaching_the_plan(
        monkeypatch):
    """A node whose requests of a few rows are split by trees walks one such request, on
    zeros, as its first compiled run makes its request path, so the split's kernels load
    then rather than at a service's first such request; and that made-up split is not
    noted as the run's native job (a plan of rows that are not split would learn from it
    to wake the workers at the start of every run)."""
    with jit_tier.using(True), parallel.pinned():
        if jit_cpu.panel_kernels() is None or jit_cpu.native_pool() is None:
            pytest.skip("no native worker pool on this machine (one thread, or no AVX-512)")
    rng = np.random.default_rng(41)
    attrs = _forest(rng, 40, 4, "BRANCH_LEQ", "class_", depth=7)
    attrs.update(classlabels_int64s=[0, 1, 2, 3], post_transform="NONE")
    state = {}
    with jit_tier.using(False):  # the node and its forest, without the compiled path
        ml_trees.tree_ensemble_classifier(np, _rows(rng, 1), **attrs, _node=state)
    built = next(v.forest for v in state.values() if hasattr(v, "forest"))
    monkeypatch.setattr(forest_walks, "TREE_SPLIT_STEPS", 2 * built._steps_per_row() + 1)
    assert built.tree_split_rows() == 3
    split = []
    prepared = forest_walks._Forest.split_sums

    def counted(self, data, *args):
        sums = prepared(self, data, *args)
        split.append((data.shape[0], sums is not None))
        return sums
    monkeypatch.setattr(forest_walks._Forest, "split_sums", counted)
    one = _rows(rng, 1)
    with jit_tier.using(True), parallel.pinned():
        got = ml_trees.tree_ensemble_classifier(np, one, **attrs, _node=state)
        assert not jit_cpu.native_job_noted()
    assert split == [(3, True)]  # the made-up request; the row itself is walked alone
    with jit_tier.using(False):
        _equal(got, ml_trees.tree_ensemble_classifier(np, one, **attrs, _node={}))


@pytest.mark.parametrize("slow", ["split", "whole"])
def test_the_clock_keeps_the_split_only_where_it_is_faster(split_counts, monkeypatch, slow):
    """A request's few rows that the forest may split by trees are timed split and whole
    (each walk both ways, ``tree_requests._walk_or_split``): the faster way is kept, and
    either way gives the NumPy tier's bits. The split made slower here by a sleep in its
    path, or the whole walk by the clock it is timed on."""
    import time  # noqa: PLC0415
    attrs, batches, expected = _classifier_batches(41, 6)
    if slow == "split":
        split_sums = forest_walks._Forest.split_sums
        monkeypatch.setattr(forest_walks._Forest, "split_sums",
                            lambda self, *args: time.sleep(0.002) or split_sums(self, *args))
    state = {}
    with jit_tier.using(True), parallel.pinned():
        ml_trees.tree_ensemble_classifier(np, batches[0], **attrs, _node=state)
        request = next(v for v in state.values() if hasattr(v, "request")).request
        assert request.split_choices is not None  # the forest may split 3 rows by trees
        if slow == "whole":  # a clock on which a split call takes a tenth of a whole one
            reads = [0]

            def clock():
                reads[0] += 1
                return 1_000_000 * reads[0] - 900_000 * len(split_counts)
            monkeypatch.setattr(walk_choice, "clock", clock)
        for call in range(60):  # 2 ways x the walks x SAMPLES timed, then the kept way
            index = call % len(batches)
            _equal(ml_trees.tree_ensemble_classifier(np, batches[index], **attrs,
                                                     _node=state), expected[index])
        before = sum(split_counts)
        for index in range(len(batches)):
            ml_trees.tree_ensemble_classifier(np, batches[index], **attrs, _node=state)
    splits = sum(split_counts) - before
    assert splits == (0 if slow == "split" else len(batches))
