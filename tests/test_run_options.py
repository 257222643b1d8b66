"""A run's limits (``mixrt.RunOptions``): a timeout, and ``terminate`` set from another
thread, end a run with RunTerminated naming the node it stopped in; the session then runs
as before."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from helpers import loop_model
from mixrt.errors import ExecutionError, RunTerminated


def _loop_model() -> bytes:
    return loop_model().SerializeToString()


def _chain_model(count: int = 60, size: int = 384) -> bytes:
    """``count`` products by a (size, size) matrix in a row: a run of many heavy nodes (any
    number of rows)."""
    weight = numpy_helper.from_array(
        np.eye(size, dtype=np.float32) * np.float32(0.999), "w")
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", "w"], [f"h{i + 1}"],
                              name=f"product{i}") for i in range(count)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", size])],
        [helper.make_tensor_value_info(f"h{count}", TensorProto.FLOAT, ["n", size])],
        [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                             ).SerializeToString()


def _loop_feeds(trips: int) -> dict:
    return {"trips": np.array(trips, np.int64), "x": np.zeros(4, np.float32)}


def test_a_timeout_ends_a_run_whose_request_asks_for_hours_and_the_session_runs_on():
    session = mixrt.Session(_loop_model())
    np.testing.assert_array_equal(session.run(None, _loop_feeds(3))[0], [3, 3, 3, 3])
    started = time.perf_counter()
    with pytest.raises(RunTerminated, match=r"timeout of 0\.2 s") as stopped:
        session.run(None, _loop_feeds(10**9), mixrt.RunOptions(timeout=0.2))
    # in the Loop, between its iterations, or in its body, inside the Loop
    assert "node 'repeat' (ai.onnx::Loop)" in str(stopped.value)
    assert time.perf_counter() - started < 2.0
    np.testing.assert_array_equal(session.run(None, _loop_feeds(5))[0], [5, 5, 5, 5])
    limited = session.run(None, _loop_feeds(7), mixrt.RunOptions(timeout=30))
    np.testing.assert_array_equal(limited[0], [7, 7, 7, 7])


def test_terminate_set_from_another_thread_ends_the_run():
    session = mixrt.Session(_loop_model())
    options = mixrt.RunOptions()
    ended: list = []

    def serve():
        try:
            session.run(None, _loop_feeds(10**9), options)
        except RunTerminated as error:
            ended.append(error)

    worker = threading.Thread(target=serve)
    worker.start()
    time.sleep(0.2)
    options.terminate = True
    worker.join(5)
    assert not worker.is_alive()
    assert ended and "terminate was set" in str(ended[0])
    np.testing.assert_array_equal(session.run(None, _loop_feeds(2))[0], [2, 2, 2, 2])


def test_a_run_of_many_nodes_stops_between_them_naming_the_node():
    session = mixrt.Session(_chain_model())
    x = np.ones((384, 384), np.float32)
    expected = session.run(None, {"x": x})[0]
    for _ in range(3):  # the steady lane and its bound calls check too
        with pytest.raises(RunTerminated, match=r"node 'product\d+' \(ai.onnx::MatMul\)"):
            session.run(None, {"x": x}, mixrt.RunOptions(timeout=0.002))
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected)
    np.testing.assert_array_equal(
        session.run(None, {"x": x}, mixrt.RunOptions(timeout=60))[0], expected)


def test_a_run_terminated_before_it_starts_runs_no_node():
    session = mixrt.Session(_loop_model())
    with pytest.raises(RunTerminated, match="before its first node.*terminate"):
        session.run(None, _loop_feeds(1), mixrt.RunOptions(terminate=True))


def test_a_limited_run_of_a_new_shape_is_not_taken_for_inference_failing():
    """A form planned from shape inference is trusted until a run of its plan fails; a run
    that reached its limit says nothing of inference."""
    session = mixrt.Session(_chain_model(count=40, size=256))
    session.run(None, {"x": np.ones((256, 256), np.float32)})
    session.run(None, {"x": np.ones((128, 256), np.float32)})  # (its form trusted)
    discoveries = []
    discover = session._discover
    session._discover = lambda *args: discoveries.append(args) or discover(*args)
    taller = np.ones((512, 256), np.float32)
    with pytest.raises(RunTerminated):
        session.run(None, {"x": taller}, mixrt.RunOptions(timeout=0.001))
    assert not discoveries and session._distrusted_forms == set()
    assert session.run(None, {"x": taller})[0].shape == (512, 256)


def test_run_terminated_is_an_execution_error_and_bad_options_are_refused():
    assert issubclass(RunTerminated, ExecutionError)
    with pytest.raises(ValueError, match="timeout"):
        mixrt.RunOptions(timeout=0)
    session = mixrt.Session(_loop_model())
    with pytest.raises(TypeError, match="RunOptions"):
        session.run(None, _loop_feeds(1), {"timeout": 1})


def _forest_model(trees: int = 120, depth: int = 8, features: int = 8) -> bytes:
    """A regressor of ``trees`` full trees of ``depth`` (every branch on feature 0..7)."""
    ids, nodes, features_of, values, modes, true_ids, false_ids = [], [], [], [], [], [], []
    targets = {"ids": [], "nodes": [], "weights": []}
    inner = 2 ** depth - 1
    for tree in range(trees):
        for node in range(2 * inner + 1):
            ids.append(tree)
            nodes.append(node)
            leaf = node >= inner
            modes.append("LEAF" if leaf else "BRANCH_LEQ")
            features_of.append(0 if leaf else (node + tree) % features)
            values.append(0.0 if leaf else float((node * 7 + tree) % 5) / 5 - 0.4)
            true_ids.append(0 if leaf else 2 * node + 1)
            false_ids.append(0 if leaf else 2 * node + 2)
            if leaf:
                targets["ids"].append(tree)
                targets["nodes"].append(node)
                targets["weights"].append(float(node % 3))
    node = helper.make_node(
        "TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", name="forest",
        n_targets=1, nodes_treeids=ids, nodes_nodeids=nodes, nodes_featureids=features_of,
        nodes_values=values, nodes_modes=modes, nodes_truenodeids=true_ids,
        nodes_falsenodeids=false_ids, target_treeids=targets["ids"],
        target_nodeids=targets["nodes"], target_ids=[0] * len(targets["ids"]),
        target_weights=targets["weights"], aggregate_function="SUM")
    graph = helper.make_graph(
        [node], "forest", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])])
    return helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]).SerializeToString()


def test_a_forest_walk_over_a_huge_batch_stops_between_blocks_of_rows():
    session = mixrt.Session(_forest_model())
    rng = np.random.default_rng(0)
    few = rng.standard_normal((64, 8)).astype(np.float32)
    session.wait_compiled()
    expected = session.run(None, {"x": few})[0]
    np.testing.assert_array_equal(
        session.run(None, {"x": few}, mixrt.RunOptions(timeout=30))[0], expected)
    many = rng.standard_normal((1_000_000, 8)).astype(np.float32)
    started = time.perf_counter()
    with pytest.raises(RunTerminated, match="node 'forest'"):
        session.run(None, {"x": many}, mixrt.RunOptions(timeout=0.05))
    assert time.perf_counter() - started < 1.5
    np.testing.assert_array_equal(session.run(None, {"x": few})[0], expected)
