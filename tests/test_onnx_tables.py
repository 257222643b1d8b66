"""Loading a model without the onnx package: the tables shipped for it (tools/onnx_tables.py)
are what the installed onnx says, a TensorProto reads as onnx.numpy_helper reads it in every
storage form, and a fresh process loads and runs models with onnx never imported."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, defs, helper, numpy_helper

import mixrt
from mixrt.importers import proto
from mixrt.importers.tensors import to_array
from mixrt.ops.ir import onnx_schemas
from mixrt.runtime.session import Session

sys.path.insert(0, str(onnx_schemas.TABLE.parents[2] / "tools"))
import onnx_tables  # noqa: E402


def test_the_shipped_tables_are_what_the_installed_onnx_says():
    assert onnx_tables.DESCRIPTOR.read_bytes() == onnx_tables.descriptor_bytes(), \
        "run python tools/onnx_tables.py"
    assert onnx_tables.SCHEMAS.read_text() == onnx_tables.schema_text(), \
        "run python tools/onnx_tables.py"
    assert onnx_schemas.onnx_version() == onnx.__version__


def test_every_schema_in_force_matches_onnx_defs():
    checked = 0
    for schema in defs.get_all_schemas_with_history():
        for version in (schema.since_version, schema.since_version + 1):
            reference = defs.get_schema(schema.name, version, schema.domain)
            got = onnx_schemas.get_schema(schema.name, version, schema.domain)
            assert got.since_version == reference.since_version
            assert [(f.name, f.type_str, f.option, f.is_homogeneous) for f in got.inputs] == \
                [(f.name, f.type_str, int(f.option), f.is_homogeneous) for f in reference.inputs]
            assert got.type_constraints == {c.type_param_str: frozenset(c.allowed_type_strs)
                                            for c in reference.type_constraints}
            checked += 1
    assert checked > 1000
    assert onnx_schemas.get_schema("Add", 0) is None  # before the op existed
    assert onnx_schemas.get_schema("NoSuchOp", 13) is None
    assert onnx_schemas.get_schema("Add", 13, "no.such.domain") is None


def _tensors():
    """(label, TensorProto) in every storage form exporters write."""
    rng = np.random.default_rng(0)
    made = []
    for dtype in (np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16,
                  np.int32, np.int64, np.uint32, np.uint64, np.bool_, np.complex64):
        values = (rng.standard_normal((2, 3)) * 50).astype(dtype)
        made.append((f"{np.dtype(dtype).name} raw", numpy_helper.from_array(values, "t")))
        typed = helper.make_tensor("t", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                   values.shape, values.ravel().tolist(), raw=False)
        made.append((f"{np.dtype(dtype).name} typed", typed))
    made.append(("string", helper.make_tensor("t", TensorProto.STRING, [2],
                                              ["héllo".encode(), b""])))
    made.append(("empty", numpy_helper.from_array(np.zeros((0, 4), np.float32), "t")))
    made.append(("scalar", helper.make_tensor("t", TensorProto.INT64, [], [7])))
    for code in (TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.INT4,
                 TensorProto.UINT4):
        for raw in (True, False):
            made.append((f"{code} raw={raw}", helper.make_tensor(
                "t", code, [5], [0.5, -1.0, 2.0, 0.0, 1.5] if code < 21 else [1, 2, 3, 4, 5],
                raw=False) if not raw else helper.make_tensor(
                "t", code, [5], [0.5, -1.0, 2.0, 0.0, 1.5] if code < 21 else [1, 2, 3, 4, 5])))
    return made


@pytest.mark.parametrize("label, tensor", _tensors(), ids=[t[0] for t in _tensors()])
def test_a_tensor_reads_as_numpy_helper_reads_it(label, tensor):
    ours = proto.message("TensorProto").FromString(tensor.SerializeToString())
    got, expected = to_array(ours), numpy_helper.to_array(tensor)
    assert got.dtype == expected.dtype and got.shape == expected.shape, label
    if expected.dtype == object:
        assert got.tolist() == expected.tolist()
    else:
        as_bytes = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in (got, expected)]
        np.testing.assert_array_equal(*as_bytes, label)


def test_a_tensor_whose_values_do_not_fit_its_shape_is_refused_by_the_loader():
    tensor = helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0])
    del tensor.float_data[-1]  # three values for a 2x2 shape
    node = helper.make_node("Add", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 2])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 2])], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(mixrt.errors.ModelLoadError, match="'w'"):
        Session(model.SerializeToString())


def _schema_function_model():
    """A model of one MeanVarianceNormalization, an op with a function body in its schema."""
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=[0, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_callers_model_proto_loads_unchanged_and_matches_the_file(monkeypatch):
    """Every standard op has a kernel, so the expansion is forced: the loader is told
    MeanVarianceNormalization has none, and expands its schema's body (onnx's classes) into
    the graph of either family."""
    from mixrt.importers import onnx as importer  # noqa: PLC0415
    has_kernel = importer._has_kernel
    monkeypatch.setattr(importer, "_has_kernel", lambda domain, op_type, opset:
                        op_type != "MeanVarianceNormalization" and
                        has_kernel(domain, op_type, opset))
    model = _schema_function_model()
    before = model.SerializeToString()
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    from_object = Session(model).run(None, {"x": x})[0]
    from_bytes = Session(before).run(None, {"x": x})[0]
    assert model.SerializeToString() == before  # the caller's message was not touched
    graph = importer.import_model(before)
    assert "MeanVarianceNormalization" not in {node.op_type for node in graph.nodes}
    expected = (x - x.mean()) / x.std()
    np.testing.assert_allclose(from_object, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(from_bytes, expected, rtol=1e-4, atol=1e-5)


def test_model_local_functions_expand_in_either_family():
    body = helper.make_node("Mul", ["a", "a"], ["b"])
    function = helper.make_function("local", "Square", ["a"], ["b"], [body],
                                    [helper.make_opsetid("", 18)])
    call = helper.make_node("Square", ["x"], ["y"], domain="local")
    graph = helper.make_graph([call], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, functions=[function], opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("local", 1)])
    x = np.array([1.0, -2.0, 3.0], np.float32)
    for source in (model, model.SerializeToString()):
        np.testing.assert_array_equal(Session(source).run(None, {"x": x})[0], x * x)


LOAD_WITHOUT_ONNX = """
import json, sys
import numpy as np
import mixrt
from mixrt.runtime.format import save_mxr
session = mixrt.Session(sys.argv[1])
x = np.ones((2, 3), np.float32)
first = session.run(None, {"x": x})[0]
save_mxr(session.graph, sys.argv[2]) if len(sys.argv) > 2 else None
print(json.dumps({"onnx": "onnx" in sys.modules, "sum": float(first.sum())}))
"""


def test_a_fresh_process_loads_and_runs_a_model_without_importing_onnx(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 3])])
    path = tmp_path / "relu.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)]).SerializeToString())
    done = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_ONNX, str(path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"onnx": False, "sum": 6.0}
