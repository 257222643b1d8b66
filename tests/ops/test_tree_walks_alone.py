"""A forest's walk in a run that leaves the native workers asleep
(ops/compiled/worker_wakes.runs_alone): every part would be its caller's, so the walk is not
split, by rows or by trees, and the request path takes the rows in one call; the bits are
those of the split walk and of the NumPy tier."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu, jit_tier, parallel, worker_wakes
from mixrt.ops.ml import forest_walks, ml_trees, tree_requests, tree_split_calls

from test_tree_split_by_trees import _equal
from test_tree_stepped_walk import _forest, _rows


@pytest.fixture
def parts_handed_out(monkeypatch):
    """Every walk of two parts' rows or more split by rows, of fewer by trees; counts the
    jobs handed to the native pool; skips where there is none."""
    with jit_tier.using(True), parallel.pinned():
        if jit_cpu.panel_kernels() is None or jit_cpu.native_pool() is None:
            pytest.skip("no native worker pool on this machine (one thread, or no AVX-512)")
    monkeypatch.setattr(forest_walks, "NATIVE_SPLIT_STEPS", 1)
    monkeypatch.setattr(forest_walks, "TREE_SPLIT_STEPS", 1)
    jobs = []
    handed = forest_walks._run_parts

    def counted(*args):
        jobs.append(1)
        return handed(*args)
    monkeypatch.setattr(forest_walks, "_run_parts", counted)
    prepared = tree_split_calls.RowsSplitCall.__call__  # a classifier's split by rows

    def counted_prepared(self, *args):
        jobs.append(1)
        return prepared(self, *args)
    monkeypatch.setattr(tree_split_calls.RowsSplitCall, "__call__", counted_prepared)
    return jobs


@pytest.fixture
def run_alone(monkeypatch):
    """A way to run as a run that leaves the workers asleep does, on this thread."""
    def alone(flag: bool):
        monkeypatch.setattr(worker_wakes._this_run, "alone", flag, raising=False)
    yield alone
    worker_wakes._this_run.alone = False


def _twice(kernel, x, attrs):
    """The kernel's answer on a fresh node state and again (the second on its request path
    where it takes the rows), compiled, in a run's pinned block."""
    state = {}
    with jit_tier.using(True), parallel.pinned():
        first = kernel(np, x, **attrs, _node=state)
        again = kernel(np, x, **attrs, _node=state)
    return first, again, state


def _kind(rng, kind: str, **regressor):
    """(the kernel, a 40-tree forest's attributes of depth 7): a 3-class classifier with
    a logistic transform, or a 2-target regressor (SUM unless ``regressor`` says)."""
    if kind == "classifier":
        attrs = _forest(rng, 40, 3, "BRANCH_LEQ", "class_", depth=7)
        attrs.update(classlabels_int64s=[0, 1, 2], post_transform="LOGISTIC")
        return ml_trees.tree_ensemble_classifier, attrs
    attrs = _forest(rng, 40, 2, "BRANCH_LT", "target_", depth=7)
    attrs.update(n_targets=2, aggregate_function="SUM")
    attrs.update(regressor)
    return ml_trees.tree_ensemble_regressor, attrs


@pytest.mark.parametrize("rows", [3, 16, 40])
@pytest.mark.parametrize("kind", ["classifier", "regressor"])
def test_a_walk_in_a_run_alone_is_one_call_with_the_split_walks_bits(parts_handed_out,
                                                                      run_alone, rows, kind):
    kernel, attrs = _kind(rng := np.random.default_rng(rows), kind)
    x = _rows(rng, rows)
    with jit_tier.using(False):
        expected = kernel(np, x, **attrs, _node={})

    split = _twice(kernel, x, attrs)
    assert parts_handed_out or rows < 2 * forest_walks.SPLIT_ROWS  # by trees: split_sums
    handed = len(parts_handed_out)
    run_alone(True)
    alone, again, state = _twice(kernel, x, attrs)
    assert len(parts_handed_out) == handed  # nothing handed to the workers
    for answer in (split[1], alone, again):  # the compiled walks: the same bits
        _equal(answer, split[0])
    for got, want in zip(alone, expected):  # the NumPy tier's logistic: within an ulp
        np.testing.assert_allclose(got, want, rtol=1e-6)
    request = next(v.request for v in state.values() if getattr(v, "request", None))
    assert request.takes_now(x) and not request.takes(x) or rows <= request.most_rows
    run_alone(False)
    assert not request.takes_now(x) or rows <= request.most_rows


def test_a_few_rows_in_a_run_alone_are_not_split_by_trees(parts_handed_out, run_alone,
                                                          monkeypatch):
    split = []
    prepared = forest_walks._Forest.split_sums

    def counted(self, *args):
        sums = prepared(self, *args)
        split.append(sums is not None)
        return sums
    monkeypatch.setattr(forest_walks._Forest, "split_sums", counted)
    rng = np.random.default_rng(5)
    attrs = _forest(rng, 40, 3, "BRANCH_LEQ", "class_", depth=7)
    attrs.update(classlabels_int64s=[0, 1, 2], post_transform="NONE")
    x = _rows(rng, 2)
    together = _twice(ml_trees.tree_ensemble_classifier, x, attrs)
    assert split and all(split)  # split by trees in a run that woke the workers
    split.clear()
    run_alone(True)
    alone = _twice(ml_trees.tree_ensemble_classifier, x, attrs)
    assert split and not any(split)  # not in a run alone
    for got, want in zip(alone[:2], together[:2]):
        _equal(got, want)


def test_the_request_path_asks_the_run_only_past_its_own_rows(monkeypatch):
    """A bound call is made for what :meth:`takes` says of every run; only the rows past
    it ask the run in progress."""
    asked = []
    monkeypatch.setattr(tree_requests, "runs_alone", lambda: asked.append(1) or True)
    request = object.__new__(tree_requests.ClassifierRequest)
    request.width, request.most_rows, request.most_rows_alone = 3, 7, 100
    x = np.zeros((50, 3), np.float32)
    with jit_tier.using(True):
        assert not request.takes(x) and asked == []
        assert request.takes_now(x) and asked == [1]
        assert request.takes_now(x[:5]) and request.takes(x[:5])
        assert not request.takes_now(np.zeros((101, 3), np.float32))


@pytest.mark.parametrize("rows", [16, 40, 150])
@pytest.mark.parametrize("kind", ["classifier", "regressor"])
def test_rows_past_the_one_call_have_a_bound_call_with_the_general_paths_bits(
        parts_handed_out, run_alone, rows, kind):
    """More rows than any run answers in one call are bound too: the bound call answers
    them as the run in progress takes them, split in a run that woke the workers, in one
    call in a run alone, with the bits of the node's own path either way."""
    kernel, attrs = _kind(rng := np.random.default_rng(rows + 7), kind,
                          aggregate_function="AVERAGE", base_values=[0.25, -1.5])
    x = _rows(rng, rows)
    first, _, state = _twice(kernel, x, attrs)
    request = next(v.request for v in state.values() if getattr(v, "request", None))
    request.most_rows = request.most_rows_alone = 8  # these rows: past the one call
    assert not request.takes(x) and request.takes_any_count(x)
    bound = ml_trees.bind_tree_request((x,), None, {"_node": state})
    assert bound == request.any_rows
    handed = len(parts_handed_out)
    with jit_tier.using(True), parallel.pinned():
        woken = bound(x)
    assert len(parts_handed_out) > handed  # split between the threads
    handed = len(parts_handed_out)
    run_alone(True)
    with jit_tier.using(True), parallel.pinned():
        alone = bound(x)  # the general path's, which a run alone does not split either
        request.most_rows_alone = rows
        in_one_call = bound(x)  # the request's one call
    assert len(parts_handed_out) == handed  # nothing handed to the sleeping workers
    for answer in (woken, alone, in_one_call):
        _equal(answer, first)


@pytest.mark.parametrize("rows", [16, 40])
@pytest.mark.parametrize("kind", ["classifier", "regressor"])
def test_a_split_by_rows_is_kept_for_its_batch_shape(parts_handed_out, run_alone, monkeypatch,
                                                      rows, kind):
    """A request's bound call of rows past its one call keeps the split by rows it made
    for that batch shape: later calls of the shape, with any values, answer through it
    alone (no checks of the general path) with the general path's bits; a run alone does
    not take it, nor does another shape."""
    kernel, attrs = _kind(rng := np.random.default_rng(rows + 3), kind)
    x = _rows(rng, rows)
    _, _, state = _twice(kernel, x, attrs)
    request = next(v.request for v in state.values() if getattr(v, "request", None))
    request.most_rows = request.most_rows_alone = 8  # these rows: past the one call
    bound = ml_trees.bind_tree_request((x,), None, {"_node": state})
    general = []
    went = type(request)._split_or_one_call
    monkeypatch.setattr(type(request), "_split_or_one_call",
                        lambda self, X: general.append(X.shape) or went(self, X))
    others = [_rows(rng, rows) for _ in range(3)]
    with jit_tier.using(True), parallel.pinned():
        answers = [bound(rows_now) for rows_now in [x, *others]]
        assert general == [x.shape]  # the first made the split; the others took it
        handed = len(parts_handed_out)
        shorter = bound(x[:-1])  # another batch shape: its own split
        assert general == [x.shape, x[:-1].shape] and len(parts_handed_out) == handed + 1
        run_alone(True)
        alone = bound(x)  # not split in a run alone: the general path
        assert general[-1] == x.shape and len(parts_handed_out) == handed + 1
        request.splits.clear()
        unsplit = bound(x[:-1])  # the general path's one call
    with jit_tier.using(False):
        expected = [kernel(np, rows_now, **attrs, _node={}) for rows_now in [x, *others]]
    for answer, want in zip(answers, expected):
        for got, value in zip(answer if kind == "classifier" else (answer,),
                              want if kind == "classifier" else (want,)):
            np.testing.assert_allclose(got, value, rtol=1e-6)
    _equal(alone, answers[0])
    _equal(shorter, unsplit)


def test_rows_a_request_cannot_take_have_no_bound_call():
    rng = np.random.default_rng(3)
    attrs = _forest(rng, 20, 2, "BRANCH_LEQ", "class_", depth=5)
    attrs.update(classlabels_int64s=[0, 1], post_transform="LOGISTIC")
    x = _rows(rng, 30)
    _, _, state = _twice(ml_trees.tree_ensemble_classifier, x, attrs)
    for rows in (x.astype(np.float64), np.asfortranarray(x), x[:, :1]):
        assert ml_trees.bind_tree_request((rows,), None, {"_node": state}) is None


@pytest.mark.parametrize("kind", ["classifier", "regressor"])
def test_rows_past_the_one_call_take_it_where_the_splits_kernels_are_in_no_cache(
        monkeypatch, kind):
    """A bound call made on made-up rows with the workers asleep (a row bucket's) never
    called the split walk's kernels: where one is in no cache, the rows take the one call
    (the same bits) instead of compiling in the request, and the split is not tried again
    for SPLIT_RECHECK_S."""
    monkeypatch.setenv("MIXRT_COMPILE", "background")
    kernel, attrs = _kind(rng := np.random.default_rng(41), kind)
    x = _rows(rng, 60)
    first, _, state = _twice(kernel, x, attrs)
    request = next(v.request for v in state.values() if getattr(v, "request", None))
    request.most_rows = request.most_rows_alone = 8  # these rows: past the one call
    tried, split = [], type(request).past_one_call

    def in_no_cache(self, rows):
        tried.append(jit_tier.compile_misses() is not None)  # inside loading_only
        raise jit_tier.CompileForbidden("the split walk's kernel is in no cache")
    monkeypatch.setattr(type(request), "past_one_call", in_no_cache)
    with jit_tier.using(True), parallel.pinned():
        answers = [request.any_rows(x) for _ in range(3)]
    assert tried == [True]
    for answer in answers:
        _equal(answer, first)
    now = tree_requests.time.monotonic()
    monkeypatch.setattr(tree_requests.time, "monotonic",
                        lambda: now + tree_requests.SPLIT_RECHECK_S + 1)
    monkeypatch.setattr(type(request), "past_one_call", split)
    with jit_tier.using(True), parallel.pinned():
        _equal(request.any_rows(x), first)  # loaded by now: split again
