"""Row buckets (runtime/row_buckets.py): a row-wise form's batches past the ladder run at a
few bucket sizes, with the bits a run at their own size gives, and onnxruntime's answer."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.runtime import prepared_forms, row_buckets
from mixrt.runtime.graph import Graph

RNG = np.random.default_rng(12)


def _model(nodes, weights, outputs, opset=17, domains=()) -> bytes:
    graph = helper.make_graph(
        nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        outputs, [numpy_helper.from_array(value, name) for name, value in weights.items()])
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=imports).SerializeToString()


def classifier() -> bytes:
    """A scikit-learn-like MLP: (1, N) intercepts, a Softmax and its ArgMax."""
    weights = {"w1": RNG.standard_normal((8, 40)).astype(np.float32),
               "b1": RNG.standard_normal((1, 40)).astype(np.float32),
               "w2": RNG.standard_normal((40, 5)).astype(np.float32),
               "b2": RNG.standard_normal((1, 5)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["h"]),
             helper.make_node("MatMul", ["h", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["a2"]),
             helper.make_node("Softmax", ["a2"], ["p"], axis=1),
             helper.make_node("ArgMax", ["p"], ["label"], axis=1, keepdims=0)]
    return _model(nodes, weights, [
        helper.make_tensor_value_info("p", TensorProto.FLOAT, ["batch", 5]),
        helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])])


def _ready(data: bytes, rows: int = 1) -> mixrt.Session:
    session = mixrt.Session(data)
    session.run(None, {"x": RNG.standard_normal((rows, 8)).astype(np.float32)})
    session.wait_compiled(600)
    return session


def test_the_grid_steps_by_an_eighth_of_a_doubling_in_strips_of_eight():
    sizes = row_buckets.bucket_sizes(64, 4096)
    assert sizes[0] == 72 and sizes[-1] <= 4096 and sizes == sorted(set(sizes))
    # a doubling's last bucket one row short of it: a bucket keeps its rows' power of two
    assert all(size % 8 == 0 or size + 1 in (128, 256, 512, 1024, 2048, 4096)
               for size in sizes)
    assert all(size.bit_length() == min(b for b in sizes if b >= size).bit_length()
               for size in range(65, 4096))
    assert all(b / a <= 2 ** (1 / 8) + 8 / a for a, b in zip([64] + sizes, sizes))
    assert len(sizes) == pytest.approx(6 * row_buckets.STEPS_PER_DOUBLING, abs=3)


def test_batches_past_the_ladder_run_in_buckets_with_a_direct_runs_bits():
    data = classifier()
    session = _ready(data)
    assert session._row_buckets is not None
    plain = _ready(data)
    plain._row_buckets = None  # every size as it is, on the compiled tier as well
    reference = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    plans = len(session._plans)
    for rows in RNG.integers(65, 3000, 25):
        x = RNG.standard_normal((int(rows), 8)).astype(np.float32)
        got = session.run(None, {"x": x})
        direct = plain.run(None, {"x": x})
        want = reference.run(None, {"x": x})
        for one, two, three in zip(got, direct, want):
            assert one.shape == two.shape == three.shape and one.dtype == two.dtype
            np.testing.assert_allclose(one, two, rtol=row_buckets.ROWS_RTOL, atol=0)
            np.testing.assert_allclose(one, three, rtol=1e-5, atol=1e-6)
    # the buckets the wait ran were planned then: 25 new batch sizes made no plan
    assert len(session._plans) == plans


def test_batch_invariant_kernels_give_a_bucketed_request_a_direct_runs_bits(monkeypatch):
    monkeypatch.setenv("MIXRT_BATCH_INVARIANT", "1")
    data = classifier()
    session, plain = _ready(data), _ready(data)
    assert session._row_buckets is not None
    plain._row_buckets = None
    for rows in RNG.integers(65, 3000, 25):
        x = RNG.standard_normal((int(rows), 8)).astype(np.float32)
        for one, two in zip(session.run(None, {"x": x}), plain.run(None, {"x": x})):
            assert one.shape == two.shape and one.tobytes() == two.tobytes()


def test_a_batch_the_ladder_holds_or_past_the_buckets_runs_as_it_is():
    session = _ready(classifier())
    buckets = session._row_buckets
    calls = []
    real = buckets.run
    buckets.run = lambda feeds, run: calls.append(feeds["x"].shape[0]) or real(feeds, run)
    for rows in (1, 64, buckets.sizes[-1] + 1):
        session.run(None, {"x": np.ones((rows, 8), np.float32)})
    assert buckets.bucket(buckets.sizes[-1] + 1) is None
    # the ladder's sizes take their steady lanes before the buckets are asked
    assert calls == [buckets.sizes[-1] + 1]


def test_an_output_that_is_a_feed_is_the_requests_own():
    weights = {"w": RNG.standard_normal((8, 3)).astype(np.float32)}
    data = _model([helper.make_node("MatMul", ["x", "w"], ["y"]),
                   helper.make_node("Identity", ["x"], ["same"])], weights, [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
        helper.make_tensor_value_info("same", TensorProto.FLOAT, ["batch", 8])])
    session = _ready(data)
    first = RNG.standard_normal((100, 8)).astype(np.float32)
    kept = session.run(None, {"x": first})[1]
    session.run(None, {"x": np.zeros((100, 8), np.float32)})
    np.testing.assert_array_equal(kept, first)


def _graph(nodes, weights) -> Graph:
    return mixrt.Session(_model(nodes, weights, [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opt_level=0).graph


@pytest.mark.parametrize("node, apart", [
    (helper.make_node("ReduceMean", ["x"], ["y"], axes=[1]), True),
    (helper.make_node("ReduceMean", ["x"], ["y"], axes=[0]), False),
    (helper.make_node("ReduceMean", ["x"], ["y"]), False),
    (helper.make_node("Softmax", ["x"], ["y"], axis=0), False),
    (helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0]), False),
    (helper.make_node("Gather", ["table", "ids"], ["y"], axis=0), True),
    (helper.make_node("Gather", ["x", "ids"], ["y"], axis=0), False),
    (helper.make_node("Shape", ["x"], ["y"]), False),
])
def test_nodes_that_read_across_rows_keep_a_form_out(node, apart):
    weights = {"table": RNG.standard_normal((10, 4)).astype(np.float32),
               "ids": np.array([1, 2], np.int64)}
    assert row_buckets.rows_stay_apart(_graph([node], weights)) is apart


def test_a_model_that_mixes_rows_where_the_kinds_do_not_say_is_caught_by_its_check():
    """A Softmax over axis -2 of a (batch, 8) tensor normalises down the batch: nothing
    in its attributes says so, the check's rows do, and the session keeps no buckets."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-2)]
    data = _model(nodes, {}, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                            ["batch", 8])])
    session = _ready(data, rows=3)
    assert session._row_buckets is None
    x = RNG.standard_normal((90, 8)).astype(np.float32)
    reference = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], reference.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-7)


def test_two_groups_or_another_axis_are_not_bucketed():
    session = mixrt.Session(classifier())
    session.run(None, {"x": np.ones((2, 8), np.float32)})
    (form,) = session._trusted_forms.values()
    groups = prepared_forms._free_groups(session.graph, form.signature)
    assert row_buckets.batch_names(form.signature, groups) == ("x",)
    assert row_buckets.batch_names(form.signature, {"b": [("x", 0)], "n": [("x", 1)]}) is None
    assert row_buckets.batch_names(form.signature, {"n": [("x", 1)]}) is None
