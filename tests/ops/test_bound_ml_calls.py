"""Normalizer's, Scaler's and the classifiers' bound calls (ops/ml/ml.py, ml_trees.py): after a session's first planned run the
node calls the compiled rows' kernel into its output's view without the kernel's checks, and
gives what the kernel gives, run after run, for every norm, a zero row and new values."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.runtime import run_loop


def _session(tmp_path, norm, width):
    """X -> Mul by 2 -> Normalizer -> Mul by 3: Normalizer reads a value in the arena (not
    a feed) and writes one (not a graph output), as in a TF-IDF pipeline."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["doubled"]),
         helper.make_node("Normalizer", ["doubled"], ["normalized"], domain="ai.onnx.ml",
                          norm=norm),
         helper.make_node("Mul", ["normalized", "three"], ["y"])],
        "normalize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("three", TensorProto.FLOAT, [], [3.0])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    path = tmp_path / f"{norm}.onnx"
    path.write_bytes(model.SerializeToString())
    return mixrt.Session(str(path))


def _expected(x, norm):
    rows = 2 * x
    if norm == "MAX":
        scale = rows.max(axis=1, keepdims=True)
    elif norm == "L1":
        scale = np.abs(rows).sum(axis=1, keepdims=True)
    else:
        scale = np.sqrt((rows * rows).sum(axis=1, keepdims=True))
    return rows / np.where(scale == 0, np.float32(1), scale) * np.float32(3)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_bound_normalizer_gives_the_kernels_values_run_after_run(tmp_path, norm):
    session = _session(tmp_path, norm, 31)
    session.wait_compiled()
    rng = np.random.default_rng(3)
    for run in range(6):
        x = rng.random((3, 31), dtype=np.float32) + np.float32(0.1)
        x[1] = 0  # a zero row stays zeros
        (y,) = session.run(None, {"x": x})
        np.testing.assert_allclose(y, _expected(x, norm), rtol=2e-6, atol=0)
    (steady,) = session._steady_runs.values()
    bound = [call for arena in steady.plan.pool for calls in arena.bound.values()
             for call in run_loop.each_call(calls) if call[0].node.op_type == "Normalizer"]
    if mixrt.ops.compiled.jit_cpu.enabled():  # the compiled kernel: the node is bound
        assert bound and all(call[4][-1] is not None for call in bound)


def _scaler_session(tmp_path, offset, scale):
    """X -> Mul by 2 -> Scaler -> Mul by 3, as in a scikit-learn pipeline."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["doubled"]),
         helper.make_node("Scaler", ["doubled"], ["scaled"], domain="ai.onnx.ml",
                          offset=offset, scale=scale),
         helper.make_node("Mul", ["scaled", "three"], ["y"])],
        "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("three", TensorProto.FLOAT, [], [3.0])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    path = tmp_path / "scaler.onnx"
    path.write_bytes(model.SerializeToString())
    return mixrt.Session(str(path))


@pytest.mark.parametrize("offset, scale", [([0.5, -1.0, 2.0, 0.0], [2.0, 0.5, -1.0, 3.0]),
                                           ([0.25], [4.0])])
def test_bound_scaler_gives_the_kernels_values_run_after_run(tmp_path, offset, scale):
    session = _scaler_session(tmp_path, offset, scale)
    session.wait_compiled()
    rng = np.random.default_rng(5)
    for rows in [1] * run_loop.BIND_AT_RUN + [3] * (run_loop.BIND_AT_RUN + 1):
        x = rng.normal(size=(rows, 4)).astype(np.float32)
        (y,) = session.run(None, {"x": x})
        expected = (2 * x - np.float32(offset)) * np.float32(scale) * np.float32(3)
        np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    bound = [call for arena in next(iter(session._steady_runs.values())).plan.pool for calls in arena.bound.values()
             for call in run_loop.each_call(calls) if call[0].node.op_type == "Scaler"]
    if mixrt.ops.compiled.jit_cpu.enabled():
        assert bound and all(call[4][-1] is not None for call in bound)


def test_a_bound_call_reading_a_feed_is_taken_only_for_feeds_in_c_order(tmp_path):
    """Scaler as a pipeline's first node reads the feed: bound while the feeds are
    C-contiguous and aligned (run_loop.feeds_in_order), the kernel's route for a strided
    feed of the same shape, and both give the same values."""
    graph = helper.make_graph(
        [helper.make_node("Scaler", ["x"], ["scaled"], domain="ai.onnx.ml",
                          offset=[0.5, -1.0, 2.0, 0.0], scale=[2.0, 0.5, -1.0, 3.0]),
         helper.make_node("Mul", ["scaled", "three"], ["y"])],
        "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("three", TensorProto.FLOAT, [], [3.0])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    path = tmp_path / "first_scaler.onnx"
    path.write_bytes(model.SerializeToString())
    session = mixrt.Session(str(path))
    session.wait_compiled()
    rng = np.random.default_rng(7)
    offset, scale = np.float32([0.5, -1.0, 2.0, 0.0]), np.float32([2.0, 0.5, -1.0, 3.0])
    for run in range(4 * (run_loop.BIND_AT_RUN + 1)):  # each layout bound, then run bound
        wide = rng.normal(size=(3, 8)).astype(np.float32)
        x = wide[:, ::2] if run % 3 == 2 else np.ascontiguousarray(wide[:, :4])
        (y,) = session.run(None, {"x": x})
        np.testing.assert_allclose(y, (x - offset) * scale * np.float32(3), rtol=1e-6,
                                   atol=1e-6)
    lists = {key[-1]: calls for arena in next(iter(session._steady_runs.values())).plan.pool
             for key, calls in arena.bound.items()}
    scaler = {fed: [c for c in run_loop.each_call(calls) if c[0].node.op_type == "Scaler"][0]
              for fed, calls in lists.items()}
    assert scaler[False][4][-1] is None  # a strided feed: the kernel's own call
    if mixrt.ops.compiled.jit_cpu.enabled():
        assert scaler[True][4][-1] is not None


def _ml_model(tmp_path, node, width, outputs, after=(), name=None):
    """x doubled, then ``node`` (and the nodes ``after`` it), to ``outputs``."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["doubled"]), node, *after], "ml",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in outputs],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    path = tmp_path / f"{name or node.op_type}.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def _bound_op(session, op_type) -> bool:
    return any(call[4] is not None and call[4][-1] is not None
               for arena in next(iter(session._steady_runs.values())).plan.pool for calls in arena.bound.values()
               for call in run_loop.each_call(calls) if call[0].node.op_type == op_type)


def _classifiers():
    """LinearClassifier (binary with string labels, three classes with int labels) and a
    TreeEnsembleClassifier of two stumps: the label and scores are graph outputs, made
    anew on every run (``binds(fresh=True)``)."""
    linear_binary = helper.make_node(
        "LinearClassifier", ["doubled"], ["label", "scores"], domain="ai.onnx.ml",
        classlabels_strings=["no", "yes"], coefficients=[0.5, -1.0, 2.0], intercepts=[0.1],
        post_transform="LOGISTIC")
    linear_three = helper.make_node(
        "LinearClassifier", ["doubled"], ["label", "scores"], domain="ai.onnx.ml",
        classlabels_ints=[4, 7, 9], coefficients=[0.5, -1.0, 2.0, 1.0, 0.0, -0.5, -1.0, 1.0,
                                                  0.25], intercepts=[0.0, 0.1, -0.1],
        post_transform="SOFTMAX")
    trees = helper.make_node(
        "TreeEnsembleClassifier", ["doubled"], ["label", "scores"], domain="ai.onnx.ml",
        classlabels_int64s=[0, 1], nodes_treeids=[0, 0, 0, 1, 1, 1],
        nodes_nodeids=[0, 1, 2, 0, 1, 2], nodes_featureids=[0, 0, 0, 2, 0, 0],
        nodes_values=[0.0, 0.0, 0.0, 0.5, 0.0, 0.0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF", "BRANCH_LT", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 0, 0, 2, 0, 0],
        class_treeids=[0, 0, 1, 1], class_nodeids=[1, 2, 1, 2], class_ids=[1, 1, 1, 1],
        class_weights=[0.1, 0.7, 0.2, 0.4], post_transform="LOGISTIC")
    return [linear_binary, linear_three, trees]


def _assert_bound_like_unbound(path: str, op_type: str, rows_per_run, seed: int,
                               monkeypatch) -> None:
    """Each run of ``path`` equals the same run with bound calls off, and no later run
    writes into the outputs an earlier one handed out; ``op_type``'s step is bound."""
    session, unbound = mixrt.Session(path), mixrt.Session(path)
    session.wait_compiled()
    unbound.wait_compiled()
    rng = np.random.default_rng(seed)
    kept = []
    for rows in rows_per_run:
        x = rng.normal(size=(rows, 3)).astype(np.float32)
        outputs = session.run(None, {"x": x})
        monkeypatch.setattr(run_loop, "BIND", False)
        wanted = unbound.run(None, {"x": x})
        monkeypatch.setattr(run_loop, "BIND", True)
        for found, want in zip(outputs, wanted):
            np.testing.assert_array_equal(found, want)
        kept.append([(output, output.copy()) for output in outputs])
    for outputs in kept:  # no later run wrote into them
        for output, then in outputs:
            np.testing.assert_array_equal(output, then)
    if mixrt.ops.compiled.jit_cpu.enabled():
        assert _bound_op(session, op_type)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_bound_classifiers_make_new_outputs_with_the_kernels_values(tmp_path, index, monkeypatch):
    node = _classifiers()[index]
    path = _ml_model(tmp_path, node, 3, ["label", "scores"])
    _assert_bound_like_unbound(path, node.op_type, (1, 1, 1, 4, 4), 11, monkeypatch)


def _classifier_into_normalizer(tmp_path, node):
    """``node``'s scores read by a Normalizer: an arena slot of their own, beside a label
    made anew (a scikit-learn pipeline's LinearClassifier + Normalizer)."""
    norm = helper.make_node("Normalizer", ["scores"], ["normalized"], domain="ai.onnx.ml",
                            norm="L1")
    return _ml_model(tmp_path, node, 3, ["label", "normalized"], after=(norm,),
                     name=f"{node.op_type}_normalized")


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_bound_classifier_whose_scores_have_a_slot_keeps_the_kernels_values(
        tmp_path, index, monkeypatch):
    node = _classifiers()[index]
    path = _classifier_into_normalizer(tmp_path, node)
    _assert_bound_like_unbound(path, node.op_type, (2, 2, 2, 2, 5, 5, 5), 12, monkeypatch)
