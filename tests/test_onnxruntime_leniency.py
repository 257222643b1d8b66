"""What onnxruntime loads beyond the spec (importers/onnxruntime_leniency.py and
docs/conformance.md, "What onnxruntime runs beyond the spec"), each case on a model built
here the way the exporter wrote it, against what onnxruntime does with the same model:

* an ai.onnx.ml node whose domain the opset_import leaves out runs at ai.onnx.ml 5, one
  warning; an op whose attributes changed since (LabelEncoder's first form) is refused, by
  both;
* a Constant defined twice with one value loads, one warning; with two values it is refused,
  where onnxruntime would use the last for every use;
* Resize's tf_half_pixel_for_nn computes as onnxruntime computes it, at opset 11 and (one
  warning) after the spec dropped it;
* LayerNormalization ignores an attribute no schema has (onnxruntime's tests misspell
  epsilon "epsion"), one warning naming the default kept, and ``mixrt check`` passes with
  that warning; an unknown attribute on another op is refused, by both;
* LinearClassifier matches onnxruntime on scikit-learn's iris exports, and refuses rows with
  fewer features than its coefficients have per class, which onnxruntime would weigh with
  the wrong coefficients.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.errors import ExecutionError, GraphError, UnsupportedOperatorError
from mixrt.importers.onnx import import_model
from mixrt.importers.onnxruntime_leniency import (DroppedModeWarning, IgnoredAttributeWarning,
                                                   RepeatedConstantWarning,
                                                   UndeclaredDomainWarning)

IR_VERSION = 7
ML = "ai.onnx.ml"


def _model(nodes, inputs, outputs, opsets, initializers=()):
    graph = helper.make_graph(nodes, "leniency", inputs, outputs, list(initializers))
    return helper.make_model(graph, ir_version=IR_VERSION,
                             opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _onnxruntime(model, feeds: dict) -> list:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _refused_by_onnxruntime(model) -> str:
    with pytest.raises(Exception) as caught:
        _onnxruntime(model, {})
    return str(caught.value)


def _mixrt(model, feeds: dict, warning=None) -> list:
    """mixrt's outputs (a first run and a planned one, which must agree), loading with
    exactly one warning of class ``warning`` (or none of the leniency warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = mixrt.Session(model)
    lenient = [w for w in caught if issubclass(w.category, Warning)
               and w.category.__module__.endswith("onnxruntime_leniency")]
    assert [w.category for w in lenient] == ([warning] if warning else []), \
        [str(w.message) for w in lenient]
    first = session.run(None, feeds)
    again = session.run(None, feeds)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    return first, (str(lenient[0].message) if lenient else "")


def _float(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _any(name, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, None)


# -- 1. an undeclared ai.onnx.ml domain ---------------------------------------------------

def _classifier_nodes():
    coefficients = np.random.default_rng(1).standard_normal(12).round(3).tolist()
    return [helper.make_node("Scaler", ["x"], ["scaled"], domain=ML, name="scale",
                             offset=[5.8, 3.0, 3.7, 1.2], scale=[1.2, 2.3, 0.6, 1.3]),
            helper.make_node("LinearClassifier", ["scaled"], ["label", "scores"], domain=ML,
                             name="classify", classlabels_ints=[0, 1, 2],
                             coefficients=coefficients, intercepts=[0.1, -0.2, 0.3],
                             post_transform="SOFTMAX"),
            helper.make_node("ZipMap", ["scores"], ["probabilities"], domain=ML,
                             classlabels_int64s=[0, 1, 2])]


def _classifier_model(opsets=(("", 9),)):
    probabilities = helper.make_value_info("probabilities", helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64,
                                   helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    return _model(_classifier_nodes(), [_float("x", [None, 4])],
                  [_any("label", TensorProto.INT64), probabilities], opsets)


IRIS_ROWS = np.array([[5.1, 3.5, 1.4, 0.2], [6.2, 2.9, 4.3, 1.3], [7.7, 3.0, 6.1, 2.3]],
                     np.float32)


def test_an_undeclared_ai_onnx_ml_domain_runs_at_version_5_with_one_warning():
    model = _classifier_model()
    theirs = _onnxruntime(model, {"x": IRIS_ROWS})
    (label, probabilities), message = _mixrt(model, {"x": IRIS_ROWS}, UndeclaredDomainWarning)
    assert "'scale'" in message and "'ai.onnx.ml'" in message and "version 5" in message
    np.testing.assert_array_equal(label, theirs[0])
    for mine, their in zip(probabilities, theirs[1]):
        assert mine.keys() == their.keys()
        np.testing.assert_allclose([mine[k] for k in mine], [their[k] for k in mine],
                                   rtol=1e-6)
    with pytest.warns(UndeclaredDomainWarning):
        assert import_model(model).opsets[ML] == 5


def test_onnxruntime_takes_an_undeclared_ai_onnx_ml_at_version_5(tmp_path):
    """What the version above follows: onnxruntime adds the domain at its latest version,
    whatever the model's ai.onnx opset or IR version, and writes it so."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "as_onnxruntime_reads_it.onnx")
    ort.InferenceSession(_classifier_model().SerializeToString(), options,
                         providers=["CPUExecutionProvider"])
    read = onnx.load(options.optimized_model_filepath)
    assert {o.domain: o.version for o in read.opset_import}[ML] == 5


def test_a_declared_ai_onnx_ml_domain_gives_no_warning():
    _mixrt(_classifier_model(opsets=(("", 9), (ML, 1))), {"x": IRIS_ROWS})


def test_labelencoders_first_form_in_an_undeclared_domain_is_refused_as_onnxruntime_does():
    """At version 5 LabelEncoder has keys and values, not classes_strings: onnxruntime
    refuses the node, and so does mixrt, naming the attribute."""
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain=ML, name="encode",
                            classes_strings=["a", "b"], default_int64=-1)
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.STRING, [None])],
                   [_any("y", TensorProto.INT64)], [("", 9)])
    assert "classes_strings" in _refused_by_onnxruntime(model)
    with pytest.warns(UndeclaredDomainWarning), \
            pytest.raises(UnsupportedOperatorError, match=r"'encode'.*classes_strings"):
        mixrt.Session(model)


# -- 2. a constant defined twice ----------------------------------------------------------

def _constant(name, values, node_name):
    return helper.make_node("Constant", [], [name], name=node_name,
                            value=numpy_helper.from_array(np.array(values, np.float32)))


def _constants_model(nodes, initializers=()):
    return _model(nodes, [_float("x", [2])], [_any("y")], [("", 11)], initializers)


X2 = np.array([1.0, -2.0], np.float32)


def test_a_constant_defined_twice_with_one_value_loads_with_one_warning():
    model = _constants_model([_constant("c", [1, 2], "first"),
                              helper.make_node("Add", ["x", "c"], ["t"]),
                              _constant("c", [1, 2], "second"),
                              _constant("c", [1, 2], "third"),
                              helper.make_node("Mul", ["t", "c"], ["y"])])
    (y,), message = _mixrt(model, {"x": X2}, RepeatedConstantWarning)
    assert "'first'" in message and "'second'" in message
    np.testing.assert_array_equal(y, _onnxruntime(model, {"x": X2})[0])


def test_a_constant_node_repeating_an_initializer_loads_with_one_warning():
    model = _constants_model([_constant("c", [1, 2], "again"),
                              helper.make_node("Add", ["x", "c"], ["y"])],
                             [numpy_helper.from_array(np.array([1, 2], np.float32), "c")])
    (y,), message = _mixrt(model, {"x": X2}, RepeatedConstantWarning)
    assert "initializer" in message and "'again'" in message
    np.testing.assert_array_equal(y, _onnxruntime(model, {"x": X2})[0])


def test_a_constant_defined_twice_with_two_values_is_refused_naming_both():
    """onnxruntime keeps the last definition for every use, the Add before it too, which no
    reading of the node order gives: mixrt refuses the model."""
    model = _constants_model([_constant("c", [1, 2], "first"),
                              helper.make_node("Add", ["x", "c"], ["t"]),
                              _constant("c", [10, 20], "second"),
                              helper.make_node("Add", ["t", "c"], ["y"])])
    np.testing.assert_array_equal(_onnxruntime(model, {"x": X2})[0], X2 + 2 * np.array([10, 20], np.float32))
    with pytest.raises(GraphError, match=r"'c'.*'first'.*'second'.*different value"):
        mixrt.Session(model)


def test_an_initializer_given_twice_loads_with_one_value_and_is_refused_with_two():
    twice = [numpy_helper.from_array(np.array([1, 2], np.float32), "c")] * 2
    model = _constants_model([helper.make_node("Add", ["x", "c"], ["y"])], twice)
    (y,), _ = _mixrt(model, {"x": X2}, RepeatedConstantWarning)
    np.testing.assert_array_equal(y, _onnxruntime(model, {"x": X2})[0])
    different = [twice[0], numpy_helper.from_array(np.array([3, 4], np.float32), "c")]
    with pytest.raises(GraphError, match=r"initializer 'c'.*different values"):
        mixrt.Session(_constants_model([helper.make_node("Add", ["x", "c"], ["y"])],
                                       different))


def test_another_node_defining_a_name_twice_is_refused_by_both():
    model = _constants_model([helper.make_node("Add", ["x", "x"], ["t"]),
                              helper.make_node("Mul", ["x", "x"], ["t"]),
                              helper.make_node("Add", ["t", "x"], ["y"])])
    assert "Duplicate definition" in _refused_by_onnxruntime(model)
    with pytest.raises(GraphError, match="'t'"):
        mixrt.Session(model)


# -- 3. Resize's tf_half_pixel_for_nn -----------------------------------------------------

def _resize_model(opset, mode, nearest_mode, scales=None, sizes=None, shape=(2, 3, 7, 9)):
    initializers = [numpy_helper.from_array(np.array([], np.float32), "roi"),
                    numpy_helper.from_array(np.array(scales or [], np.float32), "scales")]
    inputs = ["x", "roi", "scales"]
    if sizes is not None:
        initializers.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        inputs.append("sizes")
    node = helper.make_node("Resize", inputs, ["y"], name="resize", mode=mode,
                            coordinate_transformation_mode="tf_half_pixel_for_nn",
                            nearest_mode=nearest_mode)
    return _model([node], [_float("x", list(shape))], [_any("y")], [("", opset)],
                  initializers)


# 0.6 and 2.6 put coordinates one float32 step from a half (4.5 / 0.6f, 19.5 / 2.6f), 1.7 one
# exactly on an integer (8.5 / 1.7f); 1.1 keeps the 7 rows 7 long and moves them
RESIZES = [dict(scales=[1, 1, 2, 3]), dict(scales=[1, 1, 0.5, 0.6]),
           dict(scales=[1, 1, 0.6, 2.6]), dict(scales=[1, 1, 1.7, 0.34]),
           dict(scales=[1, 1, 1 / 3, 2.5]), dict(scales=[1, 1, 1.1, 1.9]),
           dict(sizes=[2, 3, 14, 4]), dict(sizes=[2, 3, 3, 27]), dict(sizes=[2, 3, 10, 13])]


@pytest.mark.parametrize("resize", RESIZES, ids=lambda r: str(r))
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor",
                                          "ceil"])
def test_tf_half_pixel_for_nn_nearest_matches_onnxruntime_at_opset_11(resize, nearest_mode):
    model = _resize_model(11, "nearest", nearest_mode, **resize)
    x = np.arange(2 * 3 * 7 * 9, dtype=np.float32).reshape(2, 3, 7, 9)
    (y,), _ = _mixrt(model, {"x": x})
    np.testing.assert_array_equal(y, _onnxruntime(model, {"x": x})[0])


@pytest.mark.parametrize("resize", RESIZES[:3], ids=lambda r: str(r))
def test_tf_half_pixel_for_nn_linear_matches_onnxruntime_at_opset_11(resize):
    model = _resize_model(11, "linear", "round_prefer_floor", **resize)
    x = np.random.default_rng(3).standard_normal((2, 3, 7, 9)).astype(np.float32)
    (y,), _ = _mixrt(model, {"x": x})
    np.testing.assert_allclose(y, _onnxruntime(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [13, 19])
def test_tf_half_pixel_for_nn_after_the_spec_dropped_it_runs_with_one_warning(opset):
    model = _resize_model(opset, "nearest", "round_prefer_ceil", scales=[1, 1, 1.7, 0.6])
    x = np.arange(2 * 3 * 7 * 9, dtype=np.float32).reshape(2, 3, 7, 9)
    (y,), message = _mixrt(model, {"x": x}, DroppedModeWarning)
    assert "'resize'" in message and f"at {opset}" in message
    np.testing.assert_array_equal(y, _onnxruntime(model, {"x": x})[0])


# -- 4. an attribute no schema has --------------------------------------------------------

def _layer_norm_model(opset, op_type="LayerNormalization", **attributes):
    node = helper.make_node(op_type, ["x", "scale", "bias"], ["y"], name="norm", **attributes)
    rng = np.random.default_rng(4)
    initializers = [numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "scale"),
                    numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "bias")]
    shape = [2, 6, 6] if op_type == "LayerNormalization" else [2, 6, 3]
    return _model([node], [_float("x", shape)], [_any("y")], [("", opset)], initializers)


# wide enough a spread that epsilon 0.5 against its default 1e-5 shows in the output
LN_X = np.random.default_rng(5).standard_normal((2, 6, 6)).astype(np.float32)


@pytest.mark.parametrize("opset", [12, 17])
def test_layer_normalization_ignores_a_misspelt_epsilon_as_onnxruntime_does(opset):
    model = _layer_norm_model(opset, axis=-1, epsion=0.5)
    (y,), message = _mixrt(model, {"x": LN_X}, IgnoredAttributeWarning)
    assert "'norm'" in message and "'epsion'" in message
    assert "did you mean 'epsilon'? epsilon keeps its default 1e-05" in message
    theirs = _onnxruntime(model, {"x": LN_X})[0]
    np.testing.assert_allclose(y, theirs, rtol=1e-5, atol=1e-5)
    with_half = _onnxruntime(_layer_norm_model(opset, axis=-1, epsilon=0.5), {"x": LN_X})[0]
    assert not np.allclose(theirs, with_half, atol=1e-3)  # the attribute really is ignored


def test_an_unknown_attribute_beside_the_real_one_is_ignored_without_a_guess():
    model = _layer_norm_model(17, epsilon=0.5, epsion=0.25, colour=1)
    with pytest.warns(IgnoredAttributeWarning) as caught:
        session = mixrt.Session(model)
    messages = sorted(str(w.message) for w in caught
                      if issubclass(w.category, IgnoredAttributeWarning))
    assert len(messages) == 2 and all("did you mean" not in m for m in messages)
    np.testing.assert_allclose(session.run(None, {"x": LN_X})[0],
                               _onnxruntime(model, {"x": LN_X})[0], rtol=1e-5, atol=1e-5)


def test_an_unknown_attribute_on_another_op_is_refused_by_both():
    model = _layer_norm_model(17, op_type="InstanceNormalization", epsion=0.5)
    assert "Unrecognized attribute: epsion" in _refused_by_onnxruntime(model)
    with pytest.raises(UnsupportedOperatorError, match=r"'norm'.*epsion"):
        mixrt.Session(model)


def test_mixrt_check_passes_a_misspelt_layer_normalization_attribute_with_a_warning(tmp_path):
    path = tmp_path / "layer_norm_epsion.onnx"
    onnx.save(_layer_norm_model(17, axis=-1, epsion=0.5), path)
    done = subprocess.run([sys.executable, "-m", "mixrt", "check", str(path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "IgnoredAttributeWarning" in done.stderr and "'epsion'" in done.stderr
    as_json = subprocess.run([sys.executable, "-m", "mixrt", "check", str(path), "--json"],
                             capture_output=True, text=True, timeout=300)
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 0 and report["supported"]
    (warning,) = report["warnings"]
    assert warning["kind"] == "IgnoredAttributeWarning" and "'epsion'" in warning["message"]


# -- 5. LinearClassifier ------------------------------------------------------------------

def _iris_export(features, classes, zipmap, string_labels):
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    x, y = load_iris(return_X_y=True)
    keep = y < classes
    x, y = x[keep][:, :features].astype(np.float32), y[keep]
    if string_labels:
        y = np.array(["setosa", "versicolor", "virginica"])[y]
    model = LogisticRegression(max_iter=500).fit(x, y)
    exported = convert_sklearn(model, initial_types=[("float_input",
                                                      FloatTensorType([None, features]))],
                               target_opset={"": 9, ML: 1},
                               options={id(model): {"zipmap": zipmap}})
    return exported, x[::9]


@pytest.mark.parametrize("features, classes", [(4, 3), (2, 3), (4, 2)])
@pytest.mark.parametrize("zipmap, string_labels", [(False, False), (True, True)])
def test_linear_classifier_matches_onnxruntime_on_iris_exports(features, classes, zipmap,
                                                              string_labels):
    pytest.importorskip("skl2onnx")
    model, rows = _iris_export(features, classes, zipmap, string_labels)
    theirs = _onnxruntime(model, {"float_input": rows})
    mine, _ = _mixrt(model, {"float_input": rows})
    np.testing.assert_array_equal(mine[0], theirs[0])
    if zipmap:
        for a, b in zip(mine[1], theirs[1]):
            np.testing.assert_allclose([a[k] for k in b], [b[k] for k in b], rtol=1e-5,
                                       atol=1e-6)
    else:
        np.testing.assert_allclose(mine[1], theirs[1], rtol=1e-5, atol=1e-6)


def _linear_classifier(declared_features=None):
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain=ML,
                            name="classify", classlabels_ints=[0, 1, 2],
                            coefficients=(np.arange(12) / 10 - 0.3).tolist(),
                            intercepts=[0.1, 0.2, 0.3])
    return _model([node], [_float("x", [None, declared_features])],
                  [_any("label", TensorProto.INT64), _any("scores")], [("", 9), (ML, 1)])


def test_rows_shorter_than_the_coefficients_are_refused_where_onnxruntime_mixes_them():
    """4 features per class, rows of 2: onnxruntime reads the first 6 coefficients as a
    3 x 2 matrix, so class 0 gets two of its own weights and class 1 two of class 0's."""
    model, rows = _linear_classifier(), IRIS_ROWS[:, :2].copy()
    first_six = (np.arange(6) / 10 - 0.3).reshape(3, 2)
    np.testing.assert_allclose(_onnxruntime(model, {"x": rows})[1],
                               rows @ first_six.T + [0.1, 0.2, 0.3], rtol=1e-5)
    session = mixrt.Session(model)
    with pytest.raises(ExecutionError, match=r"'classify'.*rows of 4 features.*have 2"):
        session.run(None, {"x": rows})
    np.testing.assert_allclose(session.run(None, {"x": IRIS_ROWS})[1],
                               _onnxruntime(model, {"x": IRIS_ROWS})[1], rtol=1e-5)
