"""The distance Scan skl2onnx writes for nearest-neighbours models, fused into one
PairwiseSquaredDistances node (runtime/passes/fuse_scan_distances.py, ops/ml/distances.py):
same results as the Scan and as onnxruntime, the Scan gone, and an export that unfolds it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.exporters.onnx import export_model


def distance_scan_model(opset: int = 17, root: bool = False, rows_first: bool = True,
                        training_rows: int = 37, features: int = 5, last: str = "",
                        combine: str = "Sub", directions: tuple = ()) -> bytes:
    """X [N, features] against the constant R [training_rows, features] through a Scan whose
    body subtracts a row and sums the squares, then the nearest distances by TopK."""
    sub_inputs = ["state_in", "row"] if rows_first else ["row", "state_in"]
    body_nodes = [helper.make_node("Identity", ["state_in"], ["state_out"]),
                  helper.make_node(combine, sub_inputs, ["difference"]),
                  _sum_of_squares(opset),
                  helper.make_node(last or ("Sqrt" if root else "Identity"), ["sums"],
                                   ["step_out"])]
    if opset >= 18:
        body_nodes.insert(0, helper.make_node("Constant", [], ["columns"],
                                              value=numpy_helper.from_array(np.array([1]))))
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [None, features]),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [features])],
        [helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [None, features]),
         helper.make_tensor_value_info("step_out", TensorProto.FLOAT, None)])
    rng = np.random.default_rng(3)
    training = rng.standard_normal((training_rows, features)).astype(np.float32)
    scan_attributes = {"scan_input_directions": list(directions)} if directions else {}
    nodes = [helper.make_node("Scan", ["X", "R"], ["final", "distances"], body=body,
                              num_scan_inputs=1, **scan_attributes),
             helper.make_node("Transpose", ["distances"], ["by_row"], perm=[1, 0]),
             helper.make_node("TopK", ["by_row", "k"], ["nearest", "which"], largest=0)]
    graph = helper.make_graph(
        nodes, "knn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("nearest", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("which", TensorProto.INT64, None),
         helper.make_tensor_value_info("final", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(training, "R"),
         numpy_helper.from_array(np.array([3], np.int64), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8).SerializeToString()  # what onnxruntime reads


def _sum_of_squares(opset: int):
    """ReduceSumSquare over axis 1; from opset 18 its axes are an input (a body constant)."""
    if opset < 18:
        return helper.make_node("ReduceSumSquare", ["difference"], ["sums"], axes=[1],
                                keepdims=0)
    return helper.make_node("ReduceSumSquare", ["difference", "columns"], ["sums"], keepdims=0)


def feeds(rows: int, features: int = 5) -> dict:
    x = np.random.default_rng(rows).standard_normal((rows, features)).astype(np.float32)
    return {"X": x}


def onnxruntime_outputs(model: bytes, inputs: dict) -> list:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, inputs)


@pytest.mark.parametrize("root", [False, True])
@pytest.mark.parametrize("rows_first", [True, False])
@pytest.mark.parametrize("rows, opset", [(1, 17), (4, 18), (300, 17)])
def test_fused_scan_matches_the_scan_and_onnxruntime(root, rows_first, rows, opset):
    model = distance_scan_model(opset=opset, root=root, rows_first=rows_first)
    fused = mixrt.Session(model)
    assert [n.op_type for n in fused.graph.nodes].count("PairwiseSquaredDistances") == 1
    assert "Scan" not in [n.op_type for n in fused.graph.nodes]
    inputs = feeds(rows)
    ours = fused.run(None, inputs)
    unfused = mixrt.Session(model, opt_level=1).run(None, inputs)
    theirs = onnxruntime_outputs(model, inputs)
    for mine, plain, reference in zip(ours, unfused, theirs):
        np.testing.assert_allclose(mine, plain, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ours[1], theirs[1])  # the same neighbours


def test_a_training_row_equal_to_the_input_is_at_distance_zero():
    model = distance_scan_model(root=True)
    session = mixrt.Session(model)
    training = session.graph.initializers["R"]
    nearest, which, _ = session.run(None, {"X": training[[5, 9]]})
    np.testing.assert_array_equal(nearest[:, 0], 0)
    np.testing.assert_array_equal(which[:, 0], [5, 9])


@pytest.mark.parametrize("change", [dict(last="Abs"), dict(combine="Add"),
                                    dict(directions=(1,))])
def test_other_scans_stay_scans(change):
    session = mixrt.Session(distance_scan_model(**change))
    assert "Scan" in [n.op_type for n in session.graph.nodes]
    inputs = feeds(3)
    for mine, reference in zip(session.run(None, inputs),
                               onnxruntime_outputs(distance_scan_model(**change), inputs)):
        np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [11, 17, 18])
@pytest.mark.parametrize("root", [False, True])
def test_the_fused_node_exports_as_standard_ops(opset, root):
    model = distance_scan_model(opset=opset, root=root)
    session = mixrt.Session(model)
    exported = export_model(session.graph).SerializeToString()
    inputs = feeds(6)
    for mine, reference in zip(onnxruntime_outputs(exported, inputs),
                               onnxruntime_outputs(model, inputs)):
        np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_compiled_distances_agree_with_the_numpy_form(dtype, monkeypatch):
    """ops/ml/_jit_distances.py (one loop per distance, the threads splitting R's rows)
    against the blocks of differences: the dtype's rounding apart, and 0 exactly 0."""
    from mixrt.ops.ml import distances
    generator = np.random.default_rng(3)
    x = generator.standard_normal((301, 37)).astype(dtype)
    r = np.concatenate([generator.standard_normal((150, 37)).astype(dtype), x[[4, 200]]])
    compiled = distances.pairwise_squared_distances(np, x, r)
    assert distances._compiled(np, x, r) is not None
    monkeypatch.setattr(distances, "_compiled", lambda *args: None)
    plain = distances.pairwise_squared_distances(np, x, r)
    assert compiled.dtype == plain.dtype == dtype and compiled.shape == (152, 301)
    np.testing.assert_allclose(compiled, plain, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert compiled[150, 4] == 0 and compiled[151, 200] == 0


def test_empty_sides_give_empty_distances():
    from mixrt.ops.ml import distances
    x, r = np.ones((3, 4), np.float32), np.ones((0, 4), np.float32)
    assert distances.pairwise_squared_distances(np, x, r).shape == (0, 3)
    assert distances.pairwise_squared_distances(np, r, x).shape == (3, 0)
