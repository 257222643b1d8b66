"""The stepped walk of ops/ml/_jit_trees.py (forests whose branches share one mode, from
STEPPED_FROM_ROWS rows: leaves lead to themselves, every row takes its tree's depth in
steps) and its split between threads (ops/ml/_jit_tree_parts.py on the native worker, or
Python threads) give the NumPy tier's sums bit for bit: missing values on both sides of a
split, unbalanced trees that stop early, row counts around the block, and tables that are
not trees."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu, jit_tier, parallel
from mixrt.ops.ml import forest, forest_walks, ml_trees

FEATURES = 6


def _forest(rng, trees, targets, mode, prefix, depth=6, chain=0):
    """Attributes of random trees whose branches all have ``mode``; ``chain``: each root's
    true side is instead a path ``chain`` nodes long with a leaf beside each, so a tree's
    deepest leaf lies far below most of its leaves."""
    nodes = {k: [] for k in ("treeids", "nodeids", "featureids", "modes", "values",
                             "truenodeids", "falsenodeids", "missing_value_tracks_true")}
    leaves = {k: [] for k in ("treeids", "nodeids", "ids", "weights")}
    for tree in range(trees):
        count = [0]

        def leaf(row, node):
            nodes["modes"][row], nodes["values"][row] = "LEAF", 0.0
            for target in rng.choice(targets, size=rng.integers(1, targets + 1), replace=False):
                leaves["treeids"].append(tree)
                leaves["nodeids"].append(node)
                leaves["ids"].append(int(target))
                leaves["weights"].append(float(np.float32(rng.normal())))

        def grow(level, path=0):
            node = count[0]
            count[0] += 1
            row = len(nodes["nodeids"])
            for key in nodes:
                nodes[key].append(0)
            nodes["treeids"][row], nodes["nodeids"][row] = tree, node
            if (path == 0 and level >= depth) or path == 1 or \
                    (path == 0 and level > 1 and rng.random() < 0.25):
                leaf(row, node)
                return node
            nodes["modes"][row] = mode
            nodes["featureids"][row] = int(rng.integers(FEATURES))
            nodes["values"][row] = float(rng.integers(-4, 5) / 2)  # rows hit it exactly
            nodes["missing_value_tracks_true"][row] = int(rng.random() < 0.5)
            if path:  # along the path: it goes on through the true side, a leaf beside it
                nodes["truenodeids"][row] = grow(level + 1, path - 1)
                nodes["falsenodeids"][row] = grow(level + 1, 1)
            else:
                nodes["truenodeids"][row] = grow(level + 1, chain if level == 0 else 0)
                nodes["falsenodeids"][row] = grow(level + 1)
            return node

        grow(0)
    attrs = {f"nodes_{k}": v for k, v in nodes.items()}
    attrs.update({f"{prefix}{k}": v for k, v in leaves.items()})
    return attrs


def _rows(rng, count, dtype=np.float32):
    x = (rng.integers(-5, 6, size=(count, FEATURES)) / 2).astype(dtype)
    x[rng.random(x.shape) < 0.1] = np.nan
    return x


def _tiers(kernel, x, attrs):
    with jit_tier.using(False):
        expected = kernel(np, x, **attrs, _node={})
    with jit_tier.using(True), parallel.pinned():
        got = kernel(np, x, **attrs, _node={})
    return expected, got


def _equal(got, expected):
    for a, b in zip(got if isinstance(got, tuple) else (got,),
                    expected if isinstance(expected, tuple) else (expected,)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["BRANCH_LEQ", "BRANCH_LT"])
@pytest.mark.parametrize("rows", [2, 3, 4, 5, 63, 64, 65, 200])
def test_regressor_sums_match_the_numpy_tier(mode, rows):
    rng = np.random.default_rng(rows)
    attrs = _forest(rng, 12, 3, mode, "target_")
    attrs.update(n_targets=3, aggregate_function="SUM", base_values=[0.5, -1.0, 2.0])
    expected, got = _tiers(ml_trees.tree_ensemble_regressor, _rows(rng, rows), attrs)
    _equal(got, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_classifier_labels_and_scores_match_the_numpy_tier(dtype):
    rng = np.random.default_rng(5)
    attrs = _forest(rng, 20, 4, "BRANCH_LEQ", "class_")
    attrs.update(classlabels_int64s=[0, 1, 2, 3], post_transform="NONE")
    expected, got = _tiers(ml_trees.tree_ensemble_classifier, _rows(rng, 130, dtype), attrs)
    _equal(got, expected)


def test_unbalanced_trees_stop_early_and_match():
    rng = np.random.default_rng(9)
    attrs = _forest(rng, 6, 2, "BRANCH_LT", "target_", depth=6, chain=30)
    attrs.update(n_targets=2, aggregate_function="AVERAGE")
    state = {}
    with jit_tier.using(True):
        ml_trees.tree_ensemble_regressor(np, _rows(rng, 4), **attrs, _node=state)
    built = next(v for v in _forests(state))
    steps = built._stepped()[0]
    assert steps.size == 6 and (steps < 0).sum() >= 4  # deepest leaf ~30 deep, most ~6
    expected, got = _tiers(ml_trees.tree_ensemble_regressor, _rows(rng, 90), attrs)
    _equal(got, expected)


def _forests(state):
    for value in state.values():
        found = getattr(value, "forest", None)
        if isinstance(found, forest._Forest):
            yield found


def test_a_table_that_is_not_a_set_of_trees_keeps_the_walk_that_stops_at_leaves():
    """Two branches leading to one node (a DAG) is walked as the NumPy tier walks it."""
    attrs = dict(nodes_treeids=[0, 0, 0, 0], nodes_nodeids=[0, 1, 2, 3],
                 nodes_featureids=[0, 1, 0, 0], nodes_modes=["BRANCH_LEQ", "BRANCH_LEQ",
                                                             "LEAF", "LEAF"],
                 nodes_values=[0.0, 0.5, 0.0, 0.0], nodes_truenodeids=[1, 2, 0, 0],
                 nodes_falsenodeids=[2, 3, 0, 0], target_treeids=[0, 0],
                 target_nodeids=[2, 3], target_ids=[0, 0], target_weights=[1.0, 2.0],
                 n_targets=1)
    state = {}
    x = np.array([[-1, 0], [-1, 1], [1, 0], [np.nan, 2]] * 4, np.float32)
    with jit_tier.using(True):
        ml_trees.tree_ensemble_regressor(np, x, **attrs, _node=state)
    assert next(_forests(state))._stepped()[0].size == 0
    expected, got = _tiers(ml_trees.tree_ensemble_regressor, x, attrs)
    _equal(got, expected)


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_split_walk_gives_the_one_thread_bits(native, monkeypatch):
    """Rows enough to split (ops/ml/forest_walks.NATIVE_SPLIT_STEPS), on the native worker or,
    without it, Python threads (forced by lowering THREAD_SPLIT_STEPS)."""
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    monkeypatch.setenv("MIXRT_NATIVE_POOL", native)
    monkeypatch.setattr(forest_walks, "THREAD_SPLIT_STEPS", forest_walks.NATIVE_SPLIT_STEPS)
    rng = np.random.default_rng(13)
    attrs = _forest(rng, 40, 2, "BRANCH_LEQ", "target_", depth=8)
    attrs.update(n_targets=2, aggregate_function="SUM")
    x = _rows(rng, 256)
    expected, got = _tiers(ml_trees.tree_ensemble_regressor, x, attrs)
    _equal(got, expected)
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "1")
    with jit_tier.using(True), parallel.pinned():
        alone = ml_trees.tree_ensemble_regressor(np, x, **attrs, _node={})
    _equal(alone, got)


def test_a_split_walk_is_noted_so_the_plan_wakes_the_workers():
    if jit_cpu.panel_kernels() is None:
        pytest.skip("no native worker pool on this machine (it needs AVX-512)")
    rng = np.random.default_rng(17)
    attrs = _forest(rng, 40, 1, "BRANCH_LT", "target_", depth=8)
    attrs.update(n_targets=1, aggregate_function="SUM")
    with jit_tier.using(True), parallel.pinned():
        if jit_cpu.native_pool() is None:
            pytest.skip("one thread: nothing to split")
        ml_trees.tree_ensemble_regressor(np, _rows(rng, 256), **attrs, _node={})
        assert jit_cpu.native_job_noted()


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_the_numpy_tier_walks_a_large_batch_in_blocks_with_the_same_bits(aggregate,
                                                                          monkeypatch):
    """The NumPy tier's walk of a batch past NUMPY_BLOCK_ROWS, block by block, against the
    same walk in one piece and against the compiled tier."""
    rng = np.random.default_rng(17)
    attrs = _forest(rng, 12, 3, "BRANCH_LEQ", "target_")
    attrs.update(n_targets=3, aggregate_function=aggregate, base_values=[0.5, -1.0, 2.0])
    x = _rows(rng, 700)
    monkeypatch.setattr(forest_walks, "NUMPY_BLOCK_ROWS", 64)
    blocked, compiled = _tiers(ml_trees.tree_ensemble_regressor, x, attrs)
    monkeypatch.setattr(forest_walks, "NUMPY_BLOCK_ROWS", 10**9)
    with jit_tier.using(False):
        whole = ml_trees.tree_ensemble_regressor(np, x, **attrs, _node={})
    _equal(blocked, whole)
    _equal(compiled, whole)
    classes = _forest(rng, 20, 4, "BRANCH_LEQ", "class_")
    classes.update(classlabels_int64s=[0, 1, 2, 3], post_transform="NONE")
    monkeypatch.setattr(forest_walks, "NUMPY_BLOCK_ROWS", 64)
    with jit_tier.using(False):
        labels_blocked = ml_trees.tree_ensemble_classifier(np, x, **classes, _node={})
    monkeypatch.setattr(forest_walks, "NUMPY_BLOCK_ROWS", 10**9)
    with jit_tier.using(False):
        labels_whole = ml_trees.tree_ensemble_classifier(np, x, **classes, _node={})
    _equal(labels_blocked, labels_whole)


@pytest.mark.parametrize("classes, base", [(4, None), (4, [0.1, -0.2, 0.3, 0.0]), (2, None),
                                           (2, [0.25, -0.25])])
@pytest.mark.parametrize("post_transform", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_a_classifier_split_by_rows_scores_each_part_with_one_threads_bits(
        classes, base, post_transform, monkeypatch):
    """Rows enough to split take forest.classify_parts (each part walks and scores its own
    rows): one thread's labels and scores bit for bit, and the NumPy tier's (its exp and
    logistic round apart from the compiled ones by an ulp)."""
    if jit_cpu.panel_kernels() is None:
        pytest.skip("no native worker pool on this machine (it needs AVX-512)")
    rng = np.random.default_rng(classes * 7 + len(post_transform))
    attrs = _forest(rng, 40, classes, "BRANCH_LEQ", "class_", depth=8)
    attrs.update(classlabels_int64s=list(range(classes)), post_transform=post_transform)
    if base is not None:
        attrs["base_values"] = base
    x = _rows(rng, 300)
    taken = []
    split = forest._Forest.classify_parts
    monkeypatch.setattr(forest._Forest, "classify_parts",
                        lambda *a, **k: taken.append(split(*a, **k)) or taken[-1])
    with jit_tier.using(True), parallel.pinned():
        if jit_cpu.native_pool() is None:
            pytest.skip("one thread: nothing to split")
    expected, got = _tiers(ml_trees.tree_ensemble_classifier, x, attrs)
    assert taken == [True]
    np.testing.assert_array_equal(got[0], expected[0])
    if post_transform == "NONE":
        _equal(got, expected)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6, atol=1e-7)
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "1")
    with jit_tier.using(True), parallel.pinned():
        alone = ml_trees.tree_ensemble_classifier(np, x, **attrs, _node={})
    _equal(alone, got)


@pytest.mark.parametrize("classes", [2, 4])
def test_one_rows_split_serves_batches_of_every_size(classes):
    """The split by rows is prepared once per rows' width and number of parts, and each
    call writes its rows' count and the parts' bounds: batches of sizes that come and go
    (a service's) each match the NumPy tier, through the one prepared split."""
    if jit_cpu.panel_kernels() is None:
        pytest.skip("no native worker pool on this machine (it needs AVX-512)")
    rng = np.random.default_rng(classes + 40)
    attrs = _forest(rng, 40, classes, "BRANCH_LEQ", "class_", depth=8)
    attrs.update(classlabels_int64s=list(range(classes)), post_transform="NONE")
    state: dict = {}
    with jit_tier.using(True), parallel.pinned():
        if jit_cpu.native_pool() is None:
            pytest.skip("one thread: nothing to split")
        for rows in (300, 123, 57, 300, 999, 64, 123):
            x = _rows(rng, rows)
            with jit_tier.using(False):
                expected = ml_trees.tree_ensemble_classifier(np, x, **attrs, _node={})
            got = ml_trees.tree_ensemble_classifier(np, x, **attrs, _node=state)
            _equal(got, expected)
    (found,) = _forests(state)
    splits = [key for key in found._split_calls if key[0] == "rows"]
    assert len(splits) == 1
