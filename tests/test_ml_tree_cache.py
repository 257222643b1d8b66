"""Tree ensembles built once per node and walked by the compiled kernel (ops/ml/_jit_trees.py):
the compiled and NumPy walks agree exactly on random forests using every node mode and
missing values, and nodes or sessions with different forests keep their own."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.ops.compiled import jit_tier
from mixrt.ops.ml import forest, ml_trees

MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
FEATURES = 5


def _random_forest(rng, trees, outputs, prefix, depth=5):
    """(tree id, node id) attributes of random trees; every mode, missing-value tracking on
    some nodes, splits from a small grid so BRANCH_EQ/NEQ hit."""
    nodes = {k: [] for k in ("treeids", "nodeids", "featureids", "modes", "values",
                             "truenodeids", "falsenodeids", "missing_value_tracks_true")}
    leaves = {k: [] for k in ("treeids", "nodeids", "ids", "weights")}
    for tree in range(trees):
        count = [0]

        def grow(level):
            node = count[0]
            count[0] += 1
            row = len(nodes["nodeids"])
            for key in nodes:
                nodes[key].append(0)
            nodes["treeids"][row], nodes["nodeids"][row] = tree, node
            if level == depth or (level > 1 and rng.random() < 0.2):
                nodes["modes"][row], nodes["values"][row] = "LEAF", 0.0
                for target in rng.choice(outputs, size=rng.integers(1, outputs + 1),
                                         replace=False):
                    leaves["treeids"].append(tree)
                    leaves["nodeids"].append(node)
                    leaves["ids"].append(int(target))
                    leaves["weights"].append(float(np.float32(rng.normal())))
                return node
            nodes["modes"][row] = MODES[rng.integers(len(MODES))]
            nodes["featureids"][row] = int(rng.integers(FEATURES))
            nodes["values"][row] = float(rng.integers(-4, 5) / 2)
            nodes["missing_value_tracks_true"][row] = int(rng.random() < 0.5)
            nodes["truenodeids"][row] = grow(level + 1)
            nodes["falsenodeids"][row] = grow(level + 1)
            return node

        grow(0)
    attrs = {f"nodes_{k}": v for k, v in nodes.items()}
    attrs.update({f"{prefix}{k}": v for k, v in leaves.items()})
    return attrs


def _rows(rng, count, dtype=np.float32):
    x = (rng.integers(-5, 6, size=(count, FEATURES)) / 2).astype(dtype)
    x[rng.random(x.shape) < 0.15] = np.nan
    return x


def _both_tiers(kernel, x, attrs):
    with jit_tier.using(False):
        numpy_tier = kernel(np, x, **attrs, _node={})
    node_state = {}
    with jit_tier.using(True):
        compiled = kernel(np, x, **attrs, _node=node_state)
        again = kernel(np, x, **attrs, _node=node_state)  # from the node's cached forest
    assert "model" in node_state
    return numpy_tier, compiled, again


@pytest.mark.parametrize("classes, dtype", [(3, np.float32), (2, np.float32), (4, np.float64)])
def test_classifier_tiers_agree_to_the_last_bits(classes, dtype):
    rng = np.random.default_rng(classes)
    attrs = _random_forest(rng, 7, classes, "class_")
    attrs["classlabels_int64s"] = list(range(classes))
    x = _rows(rng, 300, dtype)
    for post_transform in ("NONE", "LOGISTIC", "SOFTMAX"):
        results = _both_tiers(ml_trees.tree_ensemble_classifier, x,
                              dict(attrs, post_transform=post_transform))
        for (label, scores) in results[1:]:
            np.testing.assert_array_equal(label, results[0][0])
            if post_transform == "NONE":
                np.testing.assert_array_equal(scores, results[0][1])
            else:  # the compiled scores' exp is libm's expf, NumPy's its own SIMD one
                np.testing.assert_array_max_ulp(scores, results[0][1], maxulp=4)


@pytest.mark.parametrize("function", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_regressor_tiers_agree_exactly(function):
    rng = np.random.default_rng(7)
    attrs = _random_forest(rng, 9, 2, "target_")
    attrs.update(n_targets=2, aggregate_function=function, base_values=[0.25, -1.0])
    x = _rows(rng, 200)
    numpy_tier, compiled, again = _both_tiers(ml_trees.tree_ensemble_regressor, x, attrs)
    np.testing.assert_array_equal(compiled, numpy_tier)
    np.testing.assert_array_equal(again, numpy_tier)


def test_tree_ensemble_5_member_nodes_agree():
    """Opset 5: a BRANCH_MEMBER root (set {1, 3}), then a BRANCH_LT node tracking NaNs."""
    attrs = dict(
        nodes_featureids=[0, 1], nodes_modes=np.array([6, 1], np.uint8),
        nodes_splits=np.array([0.0, 0.5]), nodes_truenodeids=[0, 2],
        nodes_trueleafs=[1, 1], nodes_falsenodeids=[1, 1], nodes_falseleafs=[0, 1],
        nodes_missing_value_tracks_true=[0, 1], membership_values=np.array([1.0, 3.0, np.nan]),
        tree_roots=[0], leaf_targetids=[0, 1, 0], leaf_weights=np.array([1.0, 2.0, 3.0]),
        n_targets=2, aggregate_function=1, post_transform=0)
    x = np.array([[1, 0], [3, 9], [2, 0], [2, 9], [2, np.nan], [np.nan, 0]], np.float32)
    numpy_tier, compiled, again = _both_tiers(forest.tree_ensemble, x, attrs)
    np.testing.assert_array_equal(numpy_tier, [[1, 0], [1, 0], [3, 0], [0, 2], [3, 0], [3, 0]])
    np.testing.assert_array_equal(compiled, numpy_tier)
    np.testing.assert_array_equal(again, numpy_tier)


def _regressor_node(name, attrs, output):
    return helper.make_node("TreeEnsembleRegressor", ["x"], [output], name=name,
                            domain="ai.onnx.ml", **attrs)


def _model(nodes, outputs):
    graph = helper.make_graph(
        nodes, "forests", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, FEATURES])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])


def test_two_nodes_and_two_sessions_keep_their_own_forests(tmp_path):
    rng = np.random.default_rng(11)
    forests = [dict(_random_forest(rng, 5, 1, "target_"), n_targets=1) for _ in range(2)]
    both = _model([_regressor_node(f"f{i}", a, f"y{i}") for i, a in enumerate(forests)],
                  ["y0", "y1"])
    single = _model([_regressor_node("f", forests[1], "y")], ["y"])
    paths = []
    for name, model in (("both", both), ("single", single)):
        paths.append(tmp_path / f"{name}.onnx")
        paths[-1].write_bytes(model.SerializeToString())
    x = np.nan_to_num(_rows(rng, 50), nan=0.25)
    sessions = [mixrt.Session(str(p)) for p in paths]
    references = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                  for p in paths]
    for _ in range(2):  # the second round runs from the nodes' cached forests
        for session, reference in zip(sessions, references):
            for got, expected in zip(session.run(None, {"x": x}),
                                     reference.run(None, {"x": x})):
                np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    y0, y1 = sessions[0].run(None, {"x": x})
    assert not np.allclose(y0, y1)


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("post_transform", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_a_requests_walk_and_scores_in_one_call_give_the_two_calls_bits(
        classes, post_transform, monkeypatch):
    """ops/ml/_jit_trees.classify_two / classify_many (a few rows: walk and scores in one
    compiled call) against forest_sums then the scores as separate calls."""
    rng = np.random.default_rng(classes)
    attrs = _random_forest(rng, 7, classes, "class_")
    attrs.update(classlabels_int64s=list(range(classes)), post_transform=post_transform)
    x = _rows(rng, 40)
    with jit_tier.using(True):
        one_call = ml_trees.tree_ensemble_classifier(np, x, **attrs, _node={})
        monkeypatch.setattr(forest._Forest, "walks_alone", lambda self, rows: False)
        two_calls = ml_trees.tree_ensemble_classifier(np, x, **attrs, _node={})
    np.testing.assert_array_equal(one_call[0], two_calls[0])
    np.testing.assert_array_equal(one_call[1], two_calls[1])


# -- a request's path (ops/ml/tree_requests.py) ------------------------------------------------

def _through_request(kernel, x, attrs, monkeypatch, request_class):
    """(the answer a node's request gives on its second call, the general path's answer on
    a node whose request declines, how many calls the request answered)."""
    answered = []
    call = request_class.__call__

    def counted(self, X):
        answer = call(self, X)
        answered.append(answer is not None)
        return answer

    monkeypatch.setattr(request_class, "__call__", counted)
    node_state = {}
    with jit_tier.using(True):
        kernel(np, x, **attrs, _node=node_state)  # makes the request
        through = kernel(np, x, **attrs, _node=node_state)
        monkeypatch.setattr(request_class, "__call__", lambda self, X: None)
        general = kernel(np, x, **attrs, _node={})
        kernel(np, x, **attrs, _node=node_state)
    return through, general, sum(answered)


LABELS = {"indices": lambda n: {"classlabels_int64s": list(range(n))},
          "other ints": lambda n: {"classlabels_int64s": [10 * k + 3 for k in range(n)]},
          "strings": lambda n: {"classlabels_strings": [f"c{k}" for k in range(n)]}}


@pytest.mark.parametrize("labels", sorted(LABELS))
@pytest.mark.parametrize("classes, binary_weights", [(2, False), (2, True), (3, False)])
@pytest.mark.parametrize("rows", [1, 6])
def test_a_classifiers_request_gives_the_general_paths_answer(labels, classes, binary_weights,
                                                              rows, monkeypatch):
    from mixrt.ops.ml.tree_requests import ClassifierRequest
    rng = np.random.default_rng(classes + rows)
    attrs = _random_forest(rng, 6, classes, "class_")
    if binary_weights:  # every weight for one class: the converters' binary case
        attrs["class_ids"] = [1] * len(attrs["class_ids"])
    attrs.update(LABELS[labels](classes), post_transform="LOGISTIC")
    x = _rows(rng, rows)
    through, general, answered = _through_request(ml_trees.tree_ensemble_classifier, x, attrs,
                                                  monkeypatch, ClassifierRequest)
    assert answered == 1
    np.testing.assert_array_equal(through[0], general[0])
    assert through[0].dtype == general[0].dtype
    np.testing.assert_array_equal(through[1], general[1])


@pytest.mark.parametrize("function", ["SUM", "AVERAGE"])
@pytest.mark.parametrize("base", [None, [0.5], [0.25, -1.0]])
def test_a_regressors_request_gives_the_general_paths_bits(function, base, monkeypatch):
    from mixrt.ops.ml.tree_requests import RegressorRequest
    rng = np.random.default_rng(3)
    attrs = dict(_random_forest(rng, 9, 2, "target_"), n_targets=2, aggregate_function=function)
    if base is not None:
        attrs["base_values"] = base
    x = _rows(rng, 3)
    through, general, answered = _through_request(ml_trees.tree_ensemble_regressor, x, attrs,
                                                  monkeypatch, RegressorRequest)
    assert answered == 1
    assert through.dtype == general.dtype == np.float32
    np.testing.assert_array_equal(through, general)


def test_a_request_declines_rows_it_does_not_walk_as_they_are():
    """float64, a strided view, one row as a vector, too few columns, the NumPy tier: each
    goes the general way (which answers or refuses as before)."""
    rng = np.random.default_rng(5)
    attrs = dict(_random_forest(rng, 4, 3, "class_"), classlabels_int64s=[0, 1, 2],
                 post_transform="SOFTMAX")
    node_state = {}
    x = _rows(rng, 4)
    with jit_tier.using(True):
        ml_trees.tree_ensemble_classifier(np, x, **attrs, _node=node_state)
    request = node_state["model"].request
    assert request is not None and request(x) is not None
    for declined in (x.astype(np.float64), np.asfortranarray(np.repeat(x, 2, axis=1))[:, ::2],
                     x[0], np.ascontiguousarray(x[:, :2])):
        assert request(declined) is None
    with jit_tier.using(False):
        assert request(x) is None
    wide = np.repeat(x, 2, axis=1)[:, ::2]
    with jit_tier.using(True):
        label, scores = ml_trees.tree_ensemble_classifier(np, wide, **attrs, _node=node_state)
    np.testing.assert_array_equal(label, ml_trees.tree_ensemble_classifier(
        np, x, **attrs, _node=node_state)[0])


def test_min_and_max_regressors_make_no_request():
    rng = np.random.default_rng(9)
    attrs = dict(_random_forest(rng, 4, 1, "target_"), n_targets=1, aggregate_function="MAX")
    node_state = {}
    with jit_tier.using(True):
        for _ in range(2):
            ml_trees.tree_ensemble_regressor(np, _rows(rng, 2), **attrs, _node=node_state)
    assert node_state["model"].request is None
