"""What onnxruntime's own test models found missing, each checked against onnxruntime:

* a dimension declared ``dim_value: -1`` is unknown, not a size of -1 (0 stays 0);
* a Loop body may declare its iteration number and condition as [1] tensors;
* TopK with k past its axis' length (or negative) is a typed error naming the node and k;
* nodes of the com.microsoft domain run where the opset_import forgets the domain, as
  version 1, with a warning; other undeclared domains stay an error.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.errors import ExecutionError, GraphError, ModelLoadError
from mixrt.exporters.onnx import export_model
from mixrt.importers.onnx import UndeclaredDomainWarning, import_model
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.format import load_mxr, save_mxr
from mixrt.runtime.passes.infer import infer_types, without_body_declarations

IR_VERSION = 8  # onnxruntime reads IR versions up to its own; onnx writes its newest


def _model(nodes, inputs, outputs, initializers=(), opsets=(("", 17),)) -> bytes:
    graph = helper.make_graph(nodes, "gaps", inputs, outputs, list(initializers))
    model = helper.make_model(graph, ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    return model.SerializeToString()


def _onnxruntime(model: bytes, feeds: dict) -> list:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _same(expected: list, found: list) -> None:
    assert len(expected) == len(found)
    for want, got in zip(expected, found):
        assert np.asarray(got).shape == np.asarray(want).shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def _value(name: str, elem_type: int, dims: list) -> onnx.ValueInfoProto:
    """A value declared with ``dims`` exactly as written, ints as dim_value (also negative
    ones, which onnx.helper would refuse), strings as dim_param, None as neither."""
    value = helper.make_tensor_value_info(name, elem_type, [None] * len(dims))
    for dim, declared in zip(value.type.tensor_type.shape.dim, dims):
        if isinstance(declared, int):
            dim.dim_value = declared
        elif isinstance(declared, str):
            dim.dim_param = declared
    return value


# -- dim_value: -1 ------------------------------------------------------------------------------

def _relu_model(dims: list) -> bytes:
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                  [_value("x", TensorProto.FLOAT, dims)], [_value("y", TensorProto.FLOAT, dims)])


def test_a_dim_of_minus_one_is_unknown_and_runs_every_batch_as_onnxruntime_does():
    model = _relu_model([-1, 3])
    session = mixrt.Session(model)
    assert session.get_inputs()[0].shape == [None, 3]
    assert session.get_outputs()[0].shape == [None, 3]
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 3)).astype(np.float32)
        _same(_onnxruntime(model, {"x": x}), session.run(None, {"x": x}))


def test_every_negative_dim_is_unknown_and_zero_is_an_empty_dim():
    graph = import_model(_model(
        [helper.make_node("Relu", ["x"], ["y"])], [_value("x", TensorProto.FLOAT, [-7, 0, 2])],
        [_value("y", TensorProto.FLOAT, [-1, 0, 2])]))
    assert graph.inputs[0].type.shape == (None, 0, 2)
    assert graph.outputs[0].type.shape == (None, 0, 2)
    empty = np.zeros((4, 0, 2), np.float32)
    assert mixrt.Session(graph).run(None, {"x": empty})[0].shape == (4, 0, 2)


def test_a_dim_of_minus_one_in_value_info_is_unknown():
    inputs = [_value("x", TensorProto.FLOAT, ["N", 3])]
    outputs = [_value("z", TensorProto.FLOAT, ["N", 3])]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]),
                               helper.make_node("Neg", ["y"], ["z"])], "g", inputs, outputs,
                              value_info=[_value("y", TensorProto.FLOAT, [-1, 3])])
    model = helper.make_model(graph, ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid("", 17)])
    assert import_model(model).value_types["y"].shape == (None, 3)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    bytes_ = model.SerializeToString()
    _same(_onnxruntime(bytes_, {"x": x}), mixrt.Session(bytes_).run(None, {"x": x}))


def test_a_negative_dim_in_an_mxr_file_reads_as_unknown(tmp_path):
    graph = import_model(_relu_model(["N", 3]))
    graph.inputs[0].type = TensorType(np.dtype(np.float32), (-1, 3))  # as an old file has it
    save_mxr(graph, tmp_path / "m.mxr")
    assert load_mxr(tmp_path / "m.mxr").inputs[0].type.shape == (None, 3)


# -- Loop with [1]-shaped counters ----------------------------------------------------------

def _counting_loop(iteration_dims: list, cond_dims: list, trips: int = 4) -> bytes:
    """s <- s + i for i < trips, scanning out i (as float) and the cond the body got."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_seen"]),
         helper.make_node("Cast", ["i"], ["i_float"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["s_in", "i_float"], ["s_out"])],
        "body",
        [_value("i", TensorProto.INT64, iteration_dims),
         _value("cond_in", TensorProto.BOOL, cond_dims),
         _value("s_in", TensorProto.FLOAT, [2])],
        [_value("cond_out", TensorProto.BOOL, cond_dims),
         _value("s_out", TensorProto.FLOAT, [2]),
         _value("i_float", TensorProto.FLOAT, iteration_dims),
         _value("cond_seen", TensorProto.BOOL, cond_dims)])
    return _model(
        [helper.make_node("Loop", ["M", "", "s0"], ["s_final", "i_scan", "cond_scan"],
                          name="loop", body=body)],
        [_value("s0", TensorProto.FLOAT, [2])],
        [_value("s_final", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("i_scan", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("cond_scan", TensorProto.BOOL, None)],
        [numpy_helper.from_array(np.array(trips, np.int64), "M")])


@pytest.mark.parametrize("iteration_dims, cond_dims", [([1], []), ([1], [1]), ([], [1]),
                                                       ([], [])])
def test_a_loop_body_gets_its_counters_in_the_rank_it_declares(iteration_dims, cond_dims):
    model = _counting_loop(iteration_dims, cond_dims)
    s0 = np.array([1, 2], np.float32)
    expected = _onnxruntime(model, {"s0": s0})
    found = mixrt.Session(model).run(None, {"s0": s0})
    _same(expected, found)
    assert found[1].shape == (4, *([1] if iteration_dims else []))
    assert found[2].shape == (4, *([1] if cond_dims else []))


def test_a_loop_body_with_a_vector_iteration_number_is_typed_so_at_plan_time():
    graph = import_model(_counting_loop([1], [1]))
    # a session types its plan from the feeds, with body declarations dropped but these
    planned = infer_types(without_body_declarations(graph))
    assert planned["i_scan"].shape == (4, 1)
    assert planned["cond_scan"].shape == (4, 1)
    assert planned["s_final"].shape == (2,)


def test_a_loop_of_no_iterations_with_vector_counters_matches_onnxruntime():
    model = _counting_loop([1], [1], trips=0)
    s0 = np.array([1, 2], np.float32)
    found = mixrt.Session(model).run(None, {"s0": s0})
    _same(_onnxruntime(model, {"s0": s0}), found)


# -- TopK with k past its axis ----------------------------------------------------------------

def _top_k(x_dims: list, k: int | None, opset: int = 17) -> bytes:
    """TopK over axis 1; k an initializer, or a graph input where ``k`` is None."""
    inputs = [_value("x", TensorProto.FLOAT, x_dims)]
    initializers = []
    if k is None:
        inputs.append(_value("K", TensorProto.INT64, [1]))
    else:
        initializers.append(numpy_helper.from_array(np.array([k], np.int64), "K"))
    return _model([helper.make_node("TopK", ["x", "K"], ["values", "indices"], name="pick",
                                    axis=1)],
                  inputs, [helper.make_tensor_value_info("values", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("indices", TensorProto.INT64, None)],
                  initializers, opsets=(("", opset),))


X = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)


def test_top_k_of_every_entry_matches_onnxruntime():
    model = _top_k([2, 5], 5)
    _same(_onnxruntime(model, {"x": X}), mixrt.Session(model).run(None, {"x": X}))


def test_top_k_past_a_known_axis_is_refused_at_load_naming_node_k_and_length():
    with pytest.raises(GraphError, match=r"node 'pick'.*k is 7.*5 entries of axis 1"):
        mixrt.Session(_top_k([2, 5], 7))


@pytest.mark.parametrize("x_dims, k", [(["N", 5], 7), ([2, 5], None), (["N", "C"], 7)])
def test_top_k_past_its_axis_at_run_time_is_an_execution_error_naming_node_and_k(x_dims, k):
    feeds = {"x": X} if k is not None else {"x": X, "K": np.array([7], np.int64)}
    with pytest.raises(ExecutionError, match=r"node 'pick'.*k is 7.*5 entries of axis 1"):
        mixrt.Session(_top_k(x_dims, k)).run(None, feeds)


def test_negative_k_is_refused_naming_the_node():
    with pytest.raises(GraphError, match=r"node 'pick'.*k is -1; expected k >= 0"):
        mixrt.Session(_top_k([2, 5], -1))
    with pytest.raises(ExecutionError, match=r"node 'pick'.*k is -2; expected k >= 0"):
        mixrt.Session(_top_k([2, 5], None)).run(None, {"x": X, "K": np.array([-2], np.int64)})


def test_top_k_1_checks_its_k_attribute_too():
    model = _model([helper.make_node("TopK", ["x"], ["v", "i"], name="old", axis=1, k=6)],
                   [_value("x", TensorProto.FLOAT, ["N", 5])],
                   [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
                    helper.make_tensor_value_info("i", TensorProto.INT64, None)],
                   opsets=(("", 9),))
    with pytest.raises(ExecutionError, match=r"node 'old'.*k is 6.*5 entries"):
        mixrt.Session(model).run(None, {"x": X})


# -- com.microsoft without an opset_import entry ---------------------------------------------

def _gelu_model(opsets=(("", 17),), domain="com.microsoft") -> bytes:
    """Gelu in com.microsoft, inside an If branch too (the first node that uses the domain
    is the one the warning names)."""
    branch = helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["inner"], name="gelu_in_branch", domain=domain)],
        "branch", [], [helper.make_tensor_value_info("inner", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Gelu", ["x"], ["g"], name="gelu", domain=domain),
             helper.make_node("ReduceSum", ["g"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["picked"], then_branch=branch,
                              else_branch=branch)]
    return _model(nodes, [_value("x", TensorProto.FLOAT, ["N", 4])],
                  [_value("g", TensorProto.FLOAT, ["N", 4]),
                   helper.make_tensor_value_info("picked", TensorProto.FLOAT, None)],
                  [numpy_helper.from_array(np.array(0, np.float32), "zero")], opsets)


GELU_X = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)


def test_an_undeclared_com_microsoft_domain_runs_at_version_1_with_a_warning():
    model = _gelu_model()
    with pytest.warns(UndeclaredDomainWarning, match=r"node 'gelu'.*'com.microsoft'.*1"):
        session = mixrt.Session(model)
    _same(_onnxruntime(model, {"x": GELU_X}), session.run(None, {"x": GELU_X}))


def test_an_undeclared_com_microsoft_domain_is_recorded_so_files_round_trip(tmp_path):
    model = _gelu_model()
    with pytest.warns(UndeclaredDomainWarning):
        graph = import_model(model)
    assert graph.opsets["com.microsoft"] == 1
    expected = _onnxruntime(model, {"x": GELU_X})
    save_mxr(graph, tmp_path / "gelu.mxr")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UndeclaredDomainWarning)  # the file declares it now
        loaded = mixrt.Session(str(tmp_path / "gelu.mxr"))
    _same(expected, loaded.run(None, {"x": GELU_X}))
    exported = export_model(graph)
    assert {o.domain: o.version for o in exported.opset_import}["com.microsoft"] == 1
    exported.ir_version = IR_VERSION
    _same(expected, _onnxruntime(exported.SerializeToString(), {"x": GELU_X}))


def test_a_declared_com_microsoft_domain_gives_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UndeclaredDomainWarning)
        mixrt.Session(_gelu_model(opsets=(("", 17), ("com.microsoft", 1))))


def test_other_undeclared_domains_stay_an_error():
    with pytest.raises(ModelLoadError, match=r"'gelu'.*domain 'com.example'.*opset_import"):
        import_model(_gelu_model(domain="com.example"))
