"""scikit-learn models as skl2onnx converts them (tests/data/sklearn_exports, made by
tools/export_sklearn_models.py), and the ``ai.onnx.ml`` operators they need: mixrt must give
onnxruntime's outputs, the reference CI-gate users compare with, at every optimization level.

Classifiers end in ZipMap (a sequence of {label: probability} maps) unless converted with
zipmap off; tree ensembles, SVMs and DictVectorizer pipelines bring the rest. The focused
tests below build single nodes with onnx.helper for the cases converters rarely write
(post transforms, binary encodings, string labels, node modes, missing values, bad
attributes), each compared with onnxruntime run in the test, or with hand values where
onnxruntime's Python API cannot feed the input (maps of strings or doubles)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt import cli
from mixrt.errors import ExecutionError, GraphError, InputError
from mixrt.exporters.coverage import validate
from mixrt.ops.ml import ml_maps, ml_trees
from mixrt.ops.ir.types import MapType, SequenceType, tensor
from mixrt.runtime.passes.typecheck import type_string

DATA = Path(__file__).parent / "data" / "sklearn_exports"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())
CASES = sorted(MANIFEST["made"])
ML = "ai.onnx.ml"


# -- the stored models ------------------------------------------------------------------------

def _runs(stem: str) -> list[tuple[dict, list]]:
    """[(feeds, onnxruntime's outputs)] per stored run, maps rebuilt as dicts."""
    with np.load(DATA / f"{stem}.npz", allow_pickle=False) as stored:
        arrays = {k: stored[k] for k in stored.files}
    runs = []
    for r in range(MANIFEST["made"][stem]["runs"]):
        feeds, outputs = {}, {}
        for key, array in arrays.items():
            run, kind, name, *part = key.split(":")
            if run != f"r{r}":
                continue
            target = feeds if kind == "input" else outputs
            if part:
                target.setdefault(name, {})[part[0]] = array
            else:
                target[name] = array.astype(object) if array.dtype.kind == "U" else array
        feeds = {k: _as_map(v) if isinstance(v, dict) else v for k, v in feeds.items()}
        outputs = [_as_maps(v) if isinstance(v, dict) else v
                   for _, v in sorted(outputs.items(), key=lambda item: int(item[0]))]
        runs.append((feeds, outputs))
    return runs


def _as_map(parts: dict) -> dict:
    return dict(zip(parts["keys"].tolist(), parts["values"].tolist()))


def _as_maps(parts: dict) -> list[dict]:
    return [dict(zip(keys, values)) for keys, values in
            zip(parts["keys"].tolist(), parts["values"].tolist())]


def _assert_same(got, want, what: str) -> None:
    """Labels exactly; probabilities and scores rtol 1e-5, atol 1e-6; maps key for key (in
    onnxruntime's order: sorted)."""
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), what
        for mine, theirs in zip(got, want):
            assert list(mine) == list(theirs), (what, mine, theirs)
            np.testing.assert_allclose(list(mine.values()), list(theirs.values()),
                                       rtol=1e-5, atol=1e-6, err_msg=what)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.dtype.kind in "fc":
        assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=what)
    else:
        assert got.tolist() == want.tolist(), what


def test_the_estimators_users_bring_were_converted():
    made = MANIFEST["made"]
    estimators = {info["estimator"] for info in made.values()}
    assert {"LogisticRegression", "DecisionTreeClassifier", "RandomForestClassifier",
            "HistGradientBoostingClassifier", "GradientBoostingClassifier",
            "ExtraTreesClassifier", "DecisionTreeRegressor", "GradientBoostingRegressor",
            "SVC", "SVR", "NuSVR", "LinearSVC", "KNeighborsClassifier", "GaussianNB",
            "MLPClassifier"} <= estimators
    assert not MANIFEST["conversion_failures"]
    ops = {op for info in made.values() for op in info["ml_ops"]}
    assert {"TreeEnsembleClassifier", "SVMClassifier", "SVMRegressor", "ZipMap",
            "DictVectorizer"} <= ops
    assert sum(info["zipmap"] for info in made.values()) >= 20
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 2 * 2 ** 20


@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize("stem", CASES)
def test_mixrt_gives_onnxruntimes_outputs(stem, opt_level):
    session = mixrt.Session((DATA / f"{stem}.onnx").read_bytes(), opt_level=opt_level)
    for index, (feeds, expected) in enumerate(_runs(stem)):
        got = session.run(None, feeds)
        assert len(got) == len(expected)
        for output, (mine, theirs) in enumerate(zip(got, expected)):
            _assert_same(mine, theirs, f"{stem} run {index} output {output}")


def test_a_planned_run_gives_the_discovery_runs_maps():
    """The second run of a shape goes through the arena plan; maps stay outside it."""
    session = mixrt.Session((DATA / "forest_iris.onnx").read_bytes())
    feeds, expected = _runs("forest_iris")[0]
    first, second = session.run(None, feeds), session.run(None, feeds)
    _assert_same(second[1], expected[1], "planned run")
    assert first[1] == second[1] and first[1] is not second[1]


def test_check_validate_passes_on_a_zipmap_model(capsys):
    path = str(DATA / "gboost_iris.onnx")
    assert cli.main(["check", path, "--validate"]) == 0
    out = capsys.readouterr().out
    assert "output output_probability (1, 3)" in out and "PASS" in out


def test_validate_compares_sequences_of_maps_key_by_key():
    path = DATA / "tree_iris_names.onnx"
    feeds = {"X": _runs("tree_iris_names")[0][0]["X"]}
    report = validate(str(path), feeds, rtol=1e-5, atol=1e-6)
    assert report.ok, report.as_dict()
    assert report.outputs[1].shape == [24, 3]
    from mixrt.exporters.coverage import _compare_maps
    maps = [{"a": 0.25, "b": 0.75}]
    assert _compare_maps("p", maps, [{"a": 0.25, "b": 0.75}], 1e-5, 1e-6).ok
    assert not _compare_maps("p", maps, [{"a": 0.25, "b": 0.7}], 1e-5, 1e-6).ok
    assert not _compare_maps("p", maps, [{"a": 0.25, "c": 0.75}], 1e-5, 1e-6).ok
    assert not _compare_maps("p", maps, maps * 2, 1e-5, 1e-6).ok


# -- maps in the runtime --------------------------------------------------------------------------

def test_map_types_are_spelled_as_onnx_spells_them():
    floats = MapType(np.dtype(np.int64), tensor(np.float32))
    assert type_string(floats) == "map(int64,tensor(float))"
    assert type_string(SequenceType(floats)) == "seq(map(int64,tensor(float)))"
    assert type_string(MapType(np.dtype(object), tensor(np.float64))) == \
        "map(string,tensor(double))"
    assert type_string(MapType(None, tensor(np.float32))) is None
    session = mixrt.Session(str(DATA / "dict_tree_iris.onnx"))
    reference = ort.InferenceSession(str(DATA / "dict_tree_iris.onnx"),
                                     providers=["CPUExecutionProvider"])
    assert [a.type for a in session.get_inputs()] == [a.type for a in reference.get_inputs()]
    assert [a.type for a in session.get_outputs()] == \
        [a.type for a in reference.get_outputs()]


def test_a_map_type_an_op_does_not_take_is_refused_when_loaded():
    """The operand check reads the ai.onnx.ml schemas' map spellings (map(string, float))."""
    strings = _map_model("DictVectorizer", TensorProto.STRING, TensorProto.STRING,
                         string_vocabulary=["a"])
    with pytest.raises(GraphError, match=r"map\(string,tensor\(string\)\); DictVectorizer-1"):
        mixrt.Session(strings)
    mixrt.Session(_map_model("DictVectorizer", TensorProto.STRING, TensorProto.INT64,
                             int64_vocabulary=[1]))  # map(int64, string) is allowed


def test_a_map_feed_is_checked_and_converted():
    session = mixrt.Session(str(DATA / "dict_tree_iris.onnx"))
    with pytest.raises(InputError, match="feed a dict"):
        session.run(None, {"input": [1.0, 2.0]})
    with pytest.raises(InputError, match="not a string"):
        session.run(None, {"input": {3: 1.0}})
    with pytest.raises(InputError, match="not a number"):
        session.run(None, {"input": {"petal width": "wide"}})
    # ints and bytes keys convert as onnxruntime converts them
    label, _ = session.run(None, {"input": {b"petal length": 5, "petal width": 2}})
    assert label.tolist() == [2]


def test_a_map_feed_sizes_the_plan():
    """A DENSE CastMap's width is its map's size: two sizes, two plans, two widths."""
    model = _map_model("CastMap", TensorProto.FLOAT, key=TensorProto.INT64)
    session = mixrt.Session(model)
    assert session.run(None, {"m": {1: 2.0}})[0].shape == (1, 1)
    assert session.run(None, {"m": {1: 2.0, 4: 1.5, 0: 3.0}})[0].tolist() == [[3.0, 2.0, 1.5]]


# -- one node against onnxruntime -----------------------------------------------------------------

def _model(op_type, x, n_outputs, opset=1, **attrs):
    node = helper.make_node(op_type, ["x"], [f"y{i}" for i in range(n_outputs)], domain=ML,
                            **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(
            "x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_outputs)])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid(ML, opset)])


def _both(model, feeds) -> tuple[list, list]:
    ours = mixrt.Session(model).run(None, feeds)
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, feeds)
    return ours, theirs


def _assert_scores(got, want, atol=1e-6):
    """NaN in ours marks a column onnxruntime leaves unwritten (its value is whatever the
    buffer held): only the written ones are compared."""
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    written = ~np.isnan(got)
    np.testing.assert_allclose(got[written], want[written], rtol=1e-5, atol=atol)


def _forest(rng, classes, *, ids=None, signed=True, n_trees=3, depth=2, features=3,
            modes=("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ",
                   "BRANCH_NEQ")):
    """Random complete trees in TreeEnsembleClassifier's encoding; leaves weigh ``ids`` (all
    classes by default), thresholds on a 0.5 grid so EQ/NEQ nodes see equal values."""
    attrs = {k: [] for k in (
        "nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes", "nodes_values",
        "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true",
        "class_treeids", "class_nodeids", "class_ids", "class_weights")}
    for tree in range(n_trees):
        for node in range(2 ** (depth + 1) - 1):
            interior = node < 2 ** depth - 1
            attrs["nodes_treeids"].append(tree)
            attrs["nodes_nodeids"].append(node)
            attrs["nodes_featureids"].append(int(rng.integers(features)) if interior else 0)
            attrs["nodes_modes"].append(str(rng.choice(modes)) if interior else "LEAF")
            attrs["nodes_values"].append(float(rng.integers(-2, 3)) / 2 if interior else 0.0)
            attrs["nodes_truenodeids"].append(2 * node + 1 if interior else 0)
            attrs["nodes_falsenodeids"].append(2 * node + 2 if interior else 0)
            attrs["nodes_missing_value_tracks_true"].append(int(rng.integers(2)))
            for cls in (range(classes) if ids is None else ids) if not interior else ():
                if rng.random() < 0.8:
                    attrs["class_treeids"].append(tree)
                    attrs["class_nodeids"].append(node)
                    attrs["class_ids"].append(cls)
                    weight = rng.standard_normal() if signed else rng.random()
                    attrs["class_weights"].append(float(weight))
    return attrs


def _tree_rows(rng, dtype=np.float32, rows=16):
    x = (rng.integers(-4, 5, (rows, 3)) / 2).astype(dtype)  # on the thresholds' grid
    if dtype != np.int64:
        x[rng.random(x.shape) < 0.15] = np.nan
    return x


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


POST_TRANSFORMS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]


@pytest.mark.parametrize("post_transform", POST_TRANSFORMS)
@pytest.mark.parametrize("encoding", [
    "one class id, weights >= 0", "one class id, signed weights", "class id 1 only",
    "class id 0 only, string labels", "both class ids", "both class ids, string labels",
    "three classes", "four classes, string labels"])
@pytest.mark.parametrize("base", [0, 1, 2])
def test_tree_ensemble_classifier_against_onnxruntime(post_transform, encoding, base):
    rng = np.random.default_rng(_seed((post_transform, encoding, base)))
    classes = 4 if "four" in encoding else 3 if "three" in encoding else 2
    ids = {"one class id, weights >= 0": [0], "one class id, signed weights": [0],
           "class id 1 only": [1], "class id 0 only, string labels": [0]}.get(encoding)
    attrs = _forest(rng, classes, ids=ids, signed="weights >= 0" not in encoding)
    if base and (classes == 2 or base == 2):
        attrs["base_values"] = [float(v) for v in rng.standard_normal(base if classes == 2
                                                                      else classes)]
    if "string" in encoding:
        attrs["classlabels_strings"] = ["ant", "bee", "cat", "dog"][:classes]
    else:
        attrs["classlabels_int64s"] = [7, 3, 11, 5][:classes]
    x = _tree_rows(rng)
    ours, theirs = _both(_model("TreeEnsembleClassifier", x, 2, post_transform=post_transform,
                                **attrs), {"x": x})
    assert ours[0].tolist() == theirs[0].tolist()
    _assert_scores(ours[1], theirs[1])


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_tree_ensemble_classifier_inputs_and_opset_3_tensors(dtype):
    """Opset 3's *_as_tensor attributes (double), other input dtypes, a 1-D input."""
    rng = np.random.default_rng(3)
    attrs = _forest(rng, 3, n_trees=4)
    if dtype == np.float64:
        for name in ("nodes_values", "class_weights"):
            attrs[f"{name}_as_tensor"] = numpy_helper.from_array(
                np.array(attrs.pop(name), np.float64), name)
        attrs["base_values_as_tensor"] = numpy_helper.from_array(
            np.array([0.5, -0.25, 0.125]), "base")
    x = _tree_rows(rng, np.int64 if dtype == np.int32 else dtype).astype(dtype)
    model = _model("TreeEnsembleClassifier", x, 2, opset=3, classlabels_int64s=[0, 1, 2],
                   post_transform="SOFTMAX", **attrs)
    ours, theirs = _both(model, {"x": x})
    assert ours[0].tolist() == theirs[0].tolist()
    _assert_scores(ours[1], theirs[1])
    # a 1-D input is one row (onnxruntime's shape inference refuses it; its kernel agrees)
    node = model.graph.node[0]
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    one_row = ml_trees.tree_ensemble_classifier(np, x[3], **{
        name: numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v
        for name, v in values.items()})
    assert one_row[0].tolist() == ours[0][3:4].tolist()
    np.testing.assert_allclose(one_row[1], ours[1][3:4], rtol=1e-6)


def test_tree_ensemble_classifier_single_class_and_missing_values():
    """One class label: onnxruntime labels by the margin's sign (1 or 0, whatever the
    label); and NaN takes the branch its node tracks, a NEQ comparison's otherwise."""
    rng = np.random.default_rng(5)
    attrs = _forest(rng, 1, modes=("BRANCH_NEQ", "BRANCH_LEQ"))
    x = _tree_rows(rng)
    x[:4] = np.nan
    for post_transform in ("NONE", "PROBIT"):
        ours, theirs = _both(_model("TreeEnsembleClassifier", x, 2, classlabels_int64s=[9],
                                    base_values=[0.25], post_transform=post_transform,
                                    **attrs), {"x": x})
        assert ours[0].tolist() == theirs[0].tolist()
        _assert_scores(ours[1], theirs[1], atol=1e-4 if post_transform == "PROBIT" else 1e-6)


@pytest.mark.parametrize("change, message", [
    (dict(nodes_modes=["BRANCH_LEQ", "LEAF", "BRANCH_SOMETIMES"]), "nodes_modes"),
    (dict(nodes_featureids=[0, 0]), "nodes_featureids has 2"),
    (dict(class_ids=[0, 5]), "class_ids"),
    (dict(nodes_truenodeids=[4, 0, 0]), "nodes_truenodeids: tree 0 has no node 4"),
    (dict(post_transform="SQUASH"), "post_transform"),
    (dict(classlabels_strings=["a", "b"]), "exactly one of"),
    (dict(base_values=[1.0, 2.0, 3.0]), "base_values"),
])
def test_tree_ensemble_classifier_names_a_bad_attribute(change, message):
    attrs = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                 nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.0, 0.0, 0.0],
                 nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
                 class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 1],
                 class_weights=[1.0, 2.0], classlabels_int64s=[0, 1])
    attrs.update(change)
    x = np.zeros((2, 1), np.float32)
    with pytest.raises(ExecutionError, match=message):
        mixrt.Session(_model("TreeEnsembleClassifier", x, 2, **attrs)).run(None, {"x": x})


def _svm(rng, classes, *, linear=False, proba=False, kernel="RBF", features=3):
    attrs = {"kernel_type": kernel,
             "kernel_params": [float(rng.uniform(0.1, 0.8)), float(rng.uniform(-0.5, 0.5)),
                               float(rng.choice([2.0, 3.0]))]}
    if linear:
        attrs["coefficients"] = [float(v) for v in rng.standard_normal(classes * features)]
        attrs["rho"] = [float(rng.standard_normal())]
        return attrs
    counts = [int(rng.integers(1, 4)) for _ in range(classes)]
    pairs = classes * (classes - 1) // 2
    attrs.update(vectors_per_class=counts,
                 support_vectors=[float(v) for v in rng.standard_normal(sum(counts) *
                                                                        features)],
                 coefficients=[float(v) for v in rng.standard_normal((classes - 1) *
                                                                     sum(counts))],
                 rho=[float(v) for v in rng.standard_normal(pairs) * 0.3])
    if proba:
        attrs["prob_a"] = [float(v) for v in rng.uniform(-4, -0.5, pairs)]
        attrs["prob_b"] = [float(v) for v in rng.uniform(-0.5, 0.5, pairs)]
    return attrs


@pytest.mark.parametrize("post_transform", POST_TRANSFORMS)
@pytest.mark.parametrize("form", ["binary", "binary, probabilities, string labels",
                                  "3 classes",
                                  "4 classes, probabilities, string labels",
                                  "liblinear, binary", "liblinear, 3 classes"])
def test_svm_classifier_against_onnxruntime(post_transform, form):
    rng = np.random.default_rng(_seed((post_transform, form)))
    classes = 4 if "4 classes" in form else 3 if "3 classes" in form else 2
    for kernel in ("LINEAR", "POLY", "RBF", "SIGMOID"):
        attrs = _svm(rng, classes, linear="liblinear" in form,
                     proba="probabilities" in form, kernel=kernel)
        if "string" in form:
            attrs["classlabels_strings"] = ["ant", "bee", "cat", "dog"][:classes]
        else:
            attrs["classlabels_ints"] = [7, 3, 11, 5][:classes]
        x = rng.standard_normal((10, 3)).astype(np.float32)
        ours, theirs = _both(_model("SVMClassifier", x, 2, post_transform=post_transform,
                                    **attrs), {"x": x})
        assert ours[0].tolist() == theirs[0].tolist(), kernel
        # probit near p = 0.5 turns one ulp of p into ~1e-5 (onnxruntime's own columns
        # disagree by as much): compare it more loosely
        _assert_scores(ours[1], theirs[1], atol=1e-4 if post_transform == "PROBIT" else 1e-6)


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("one_class", [0, 1])
def test_svm_regressor_against_onnxruntime(kernel, one_class):
    rng = np.random.default_rng(_seed((kernel, one_class)))
    x = rng.standard_normal((12, 3)).astype(np.float32)
    supported = _svm(rng, 2, kernel=kernel)
    vectors = sum(supported.pop("vectors_per_class"))
    supported.update(n_supports=vectors, coefficients=supported["coefficients"][:vectors],
                     rho=supported["rho"][:1], one_class=one_class)
    linear = dict(kernel_type=kernel, kernel_params=supported["kernel_params"],
                  coefficients=[0.5, -1.0, 2.0], rho=[0.25], one_class=one_class)
    for attrs in (supported, linear):
        ours, theirs = _both(_model("SVMRegressor", x, 1, **attrs), {"x": x})
        assert ours[0].shape == theirs[0].shape == (12, 1)
        np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)


def test_svm_regressor_keeps_onnxruntimes_untransformed_scores():
    x = np.array([[1.0, 2.0, -1.0]], np.float32)
    attrs = dict(coefficients=[0.5, -1.0, 2.0], rho=[0.25], post_transform="LOGISTIC",
                 kernel_params=[0.0, 0.0, 0.0])
    ours, theirs = _both(_model("SVMRegressor", x, 1, **attrs), {"x": x})
    np.testing.assert_allclose(ours[0], theirs[0])
    assert ours[0].item() == pytest.approx(-3.25)


@pytest.mark.parametrize("change, message", [
    (dict(kernel_type="CUBIC"), "kernel_type"),
    (dict(kernel_params=[0.5]), "kernel_params"),
    (dict(vectors_per_class=[1, 1, 1]), "vectors_per_class"),
    (dict(prob_a=[1.0]), "prob_a has 1 values but prob_b has 0"),
    (dict(support_vectors=[1.0, 2.0]), "support_vectors"),
    (dict(rho=None), "rho is required"),
])
def test_svm_classifier_names_a_bad_attribute(change, message):
    attrs = dict(vectors_per_class=[1, 1], support_vectors=[0.0, 1.0, 1.0, 0.0],
                 coefficients=[1.0, -1.0], rho=[0.1], classlabels_ints=[0, 1])
    attrs.update(change)
    attrs = {name: value for name, value in attrs.items() if value is not None}
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(ExecutionError, match=message):
        mixrt.Session(_model("SVMClassifier", x, 2, **attrs)).run(None, {"x": x})


@pytest.mark.parametrize("labels", [dict(classlabels_int64s=[3, 1, 2, 1]),
                                    dict(classlabels_strings=["b", "a", "c", "b"])])
@pytest.mark.parametrize("shape", [(5, 4), (4,)])
def test_zipmap_against_onnxruntime(labels, shape):
    """Keys in sorted order; a repeated label keeps its last column (a std::map)."""
    x = np.random.default_rng(0).random(shape).astype(np.float32)
    key = TensorProto.STRING if "classlabels_strings" in labels else TensorProto.INT64
    node = helper.make_node("ZipMap", ["x"], ["z"], domain=ML, **labels)
    out = helper.make_value_info("z", helper.make_sequence_type_proto(
        helper.make_map_type_proto(key, helper.make_tensor_type_proto(TensorProto.FLOAT, None))))
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], [out]),
        ir_version=10, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ML, 1)])
    (ours,), (theirs,) = _both(model, {"x": x})
    assert ours == theirs and [list(m) for m in ours] == [list(m) for m in theirs]
    assert all(type(v) is float for m in ours for v in m.values())


def _map_model(op_type, value_type, key=TensorProto.STRING, **attrs):
    map_type = helper.make_map_type_proto(key, helper.make_tensor_type_proto(value_type, None))
    node = helper.make_node(op_type, ["m"], ["y"], domain=ML, **attrs)
    return helper.make_model(helper.make_graph(
        [node], "g", [helper.make_value_info("m", map_type)],
        [helper.make_empty_tensor_value_info("y")]),
        ir_version=10, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ML, 1)])


@pytest.mark.parametrize("key, vocabulary, feed", [
    (TensorProto.STRING, dict(string_vocabulary=["a", "b", "c", "a"]),
     {"a": 1, "c": 2.5, "unknown": 3.0}),
    (TensorProto.INT64, dict(int64_vocabulary=[5, 2, 9]), {2: -1.5, 9: 4.0, 11: 1.0}),
])
def test_dict_vectorizer_against_onnxruntime(key, vocabulary, feed):
    (ours,), (theirs,) = _both(_map_model("DictVectorizer", TensorProto.FLOAT, key,
                                          **vocabulary), {"m": feed})
    assert ours.dtype == theirs.dtype == np.float32 and ours.tolist() == theirs.tolist()


def test_dict_vectorizer_value_types_onnxruntime_cannot_feed():
    """onnxruntime's Python API feeds only maps of floats; these follow its C++ kernel."""
    doubles = _map_model("DictVectorizer", TensorProto.DOUBLE, string_vocabulary=["x", "y"])
    (out,) = mixrt.Session(doubles).run(None, {"m": {"y": 0.1}})
    assert out.dtype == np.float64 and out.tolist() == [[0.0, 0.1]]
    strings = _map_model("DictVectorizer", TensorProto.STRING, TensorProto.INT64,
                         int64_vocabulary=[1, 2])
    (out,) = mixrt.Session(strings).run(None, {"m": {2: "two"}})
    assert out.dtype == object and out.tolist() == [["", "two"]]  # absent: an empty string
    rows = ml_maps.dict_vectorizer(np, [{"a": np.int64(1)}, {"b": np.int64(2)}],
                                   string_vocabulary=["a", "b"])  # as onnx's reference does
    assert rows.dtype == np.int64 and rows.tolist() == [[1, 0], [0, 2]]


@pytest.mark.parametrize("cast_to", ["TO_FLOAT", "TO_STRING", "TO_INT64"])
@pytest.mark.parametrize("map_form", ["DENSE", "SPARSE"])
def test_cast_map_against_onnxruntime(cast_to, map_form):
    model = _map_model("CastMap", TensorProto.FLOAT, TensorProto.INT64, cast_to=cast_to,
                       map_form=map_form, max_map=6)
    (ours,), (theirs,) = _both(model, {"m": {3: 2.5, 1: 7.0, 0: -1.75, 9: 1.0}})
    assert ours.dtype == theirs.dtype and ours.tolist() == theirs.tolist()


def test_cast_map_of_strings_parses_as_stof_and_stoll():
    """onnxruntime's Python API cannot feed map(int64, string); its kernel parses a leading
    number (std::stof, std::stoll) and pads SPARSE rows."""
    feed = {2: " 2.5e1x", 0: "-7", 1: "abc"}
    model = _map_model("CastMap", TensorProto.STRING, TensorProto.INT64, cast_to="TO_INT64",
                       map_form="SPARSE", max_map=4)
    with pytest.raises(ExecutionError, match="does not start with a number"):
        mixrt.Session(model).run(None, {"m": feed})
    del feed[1]
    assert mixrt.Session(model).run(None, {"m": feed})[0].tolist() == [[-7, 0, 2, 0]]
    model = _map_model("CastMap", TensorProto.STRING, TensorProto.INT64)
    assert mixrt.Session(model).run(None, {"m": feed})[0].tolist() == [[-7.0, 25.0]]
    for bad, message in ((dict(cast_to="TO_BOOL"), "cast_to"),
                         (dict(map_form="SPARSE", max_map=0), "max_map")):
        with pytest.raises(ExecutionError, match=message):
            mixrt.Session(_map_model("CastMap", TensorProto.FLOAT, TensorProto.INT64,
                                     **bad)).run(None, {"m": {0: 1.0}})


@pytest.mark.parametrize("classes", [2, 3, 10])
def test_svm_probability_coupling_same_bits_in_both_tiers(classes, monkeypatch):
    """libsvm's coupling compiled (ops/ml/_jit_svm.py) and as NumPy sweeps give the same bits."""
    pytest.importorskip("numba")
    from mixrt.ops.compiled import jit_cpu
    from mixrt.ops.ml import ml_svm
    rng = np.random.default_rng(classes)
    pairs = classes * (classes - 1) // 2
    decisions = rng.standard_normal((64, pairs)).astype(np.float32) * 3
    prob_a = rng.uniform(-3, -0.5, pairs).astype(np.float32)
    prob_b = rng.uniform(-0.5, 0.5, pairs).astype(np.float32)
    compiled = ml_svm._coupled_probabilities(np, decisions, prob_a, prob_b, classes)
    monkeypatch.setattr(jit_cpu, "enabled", lambda: False)
    plain = ml_svm._coupled_probabilities(np, decisions, prob_a, prob_b, classes)
    np.testing.assert_array_equal(compiled, plain)


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("proba", [False, True])
def test_svm_decisions_agree_in_both_tiers(kernel, proba, monkeypatch):
    """The compiled kernel values, one-vs-one sums and coupling (ops/ml/_jit_svm.py) against
    the NumPy tier's forms: the same votes and labels, scores to float32 rounding (the
    feature sums are grouped differently)."""
    pytest.importorskip("numba")
    from mixrt.ops.compiled import jit_cpu
    rng = np.random.default_rng(_seed((kernel, proba)))
    attrs = _svm(rng, 6, proba=proba, kernel=kernel, features=40)
    attrs["classlabels_ints"] = list(range(6))
    x = rng.standard_normal((9, 40)).astype(np.float32) * 0.3
    model = _model("SVMClassifier", x, 2, **attrs)
    compiled = mixrt.Session(model).run(None, {"x": x})
    monkeypatch.setattr(jit_cpu, "enabled", lambda: False)
    plain = mixrt.Session(model).run(None, {"x": x})
    assert compiled[0].tolist() == plain[0].tolist()
    np.testing.assert_allclose(compiled[1], plain[1], rtol=1e-5, atol=1e-6)


def _in_both_tiers(model, feeds, monkeypatch) -> tuple[list, list]:
    """The model's outputs with the compiled kernels, then on the NumPy tier."""
    pytest.importorskip("numba")
    from mixrt.ops.compiled import jit_cpu
    compiled = mixrt.Session(model).run(None, feeds)
    with monkeypatch.context() as patch:
        patch.setattr(jit_cpu, "enabled", lambda: False)
        plain = mixrt.Session(model).run(None, feeds)
    return compiled, plain


@pytest.mark.parametrize("post_transform", POST_TRANSFORMS)
@pytest.mark.parametrize("classes, rows_of_weights", [(2, 1), (2, 2), (4, 4)])
def test_linear_classifier_agrees_in_both_tiers_and_with_onnxruntime(
        post_transform, classes, rows_of_weights, monkeypatch):
    """ops/ml/_jit_ml.linear_classify (NONE, LOGISTIC, SOFTMAX; the others stay NumPy) against
    the NumPy form and onnxruntime, a tie and a NaN row included."""
    rng = np.random.default_rng(_seed((post_transform, classes, rows_of_weights)))
    x = rng.standard_normal((7, 5)).astype(np.float32)
    x[3] = 0.0  # every score is the intercept: ties when the intercepts are equal
    x[5, 2] = np.nan
    attrs = dict(coefficients=[float(v) for v in rng.standard_normal(rows_of_weights * 5)],
                 intercepts=[0.25] * rows_of_weights, classlabels_ints=list(range(classes)),
                 post_transform=post_transform)
    model = _model("LinearClassifier", x, 2, **attrs)
    compiled, plain = _in_both_tiers(model, {"x": x}, monkeypatch)
    assert compiled[0].tolist() == plain[0].tolist()
    np.testing.assert_allclose(compiled[1], plain[1], rtol=1e-5, atol=1e-6)
    if post_transform == "PROBIT" and rows_of_weights == 1:
        return  # onnxruntime takes the probit of the raw score there: NaN outside (0, 1)
    clean = np.nan_to_num(x)  # onnxruntime's NaN handling is not what is compared here
    ours, theirs = _both(model, {"x": clean})
    assert ours[0].tolist() == theirs[0].tolist()
    _assert_scores(ours[1], theirs[1], atol=1e-4 if post_transform == "PROBIT" else 1e-6)


@pytest.mark.parametrize("post_transform", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("rows_of_weights", [1, 5])
def test_linear_classifier_of_many_rows_takes_the_blas_and_agrees(post_transform,
                                                                  rows_of_weights, monkeypatch):
    """From ops/ml/ml_linear.BLAS_ROWS rows the compiled LinearClassifier takes its products through
    the BLAS: the same labels and scores (to float32 rounding) as the NumPy tier and
    onnxruntime; under MIXRT_BATCH_INVARIANT each row's scores are the bits of that row
    run alone."""
    from mixrt.ops.ml import ml_linear as ml_ops
    rng = np.random.default_rng(_seed((post_transform, rows_of_weights, "many")))
    x = rng.standard_normal((3 * ml_ops.BLAS_ROWS + 5, 23)).astype(np.float32)
    classes = 2 if rows_of_weights == 1 else rows_of_weights
    attrs = dict(coefficients=[float(v) for v in rng.standard_normal(rows_of_weights * 23)],
                 intercepts=[float(v) for v in rng.standard_normal(rows_of_weights)],
                 classlabels_ints=list(range(classes)), post_transform=post_transform)
    model = _model("LinearClassifier", x, 2, **attrs)
    assert ml_ops._by_blas(x)
    compiled, plain = _in_both_tiers(model, {"x": x}, monkeypatch)
    assert compiled[0].tolist() == plain[0].tolist()
    np.testing.assert_allclose(compiled[1], plain[1], rtol=1e-5, atol=1e-5)
    ours, theirs = _both(model, {"x": x})
    assert ours[0].tolist() == theirs[0].tolist()
    _assert_scores(ours[1], theirs[1], atol=1e-5)
    monkeypatch.setenv("MIXRT_BATCH_INVARIANT", "1")
    assert not ml_ops._by_blas(x)
    joined = mixrt.Session(model).run(None, {"x": x})[1]
    one_row = mixrt.Session(_model("LinearClassifier", x[:1], 2, **attrs))
    alone = np.concatenate([one_row.run(None, {"x": x[i:i + 1]})[1] for i in range(len(x))])
    assert joined.tobytes() == alone.tobytes()


@pytest.mark.parametrize("classes", [1, 3, 10, 17])
def test_linear_classifiers_compiled_sums_are_each_class_summed_in_feature_order(classes):
    """ops/ml/_jit_ml.linear_classify sums a row's classes side by side: each class's score
    is still its products added feature by feature from the first, in float32."""
    pytest.importorskip("numba")
    from mixrt.ops.ml import _jit_ml
    rng = np.random.default_rng(classes)
    rows, weights = (rng.standard_normal((4, 37)).astype(np.float32),
                     rng.standard_normal((37, classes)).astype(np.float32))
    intercepts = rng.standard_normal(classes).astype(np.float32)
    expected = np.zeros((4, classes), np.float32)
    for k in range(37):  # in order, rounded to float32 at every step
        expected = (expected + rows[:, k:k + 1] * weights[k]).astype(np.float32)
    expected = (expected + intercepts).astype(np.float32)
    binary = classes == 1
    chosen = np.empty(4, np.int64)
    scores = np.empty((4, 2 if binary else classes), np.float32)
    _jit_ml.linear_classify(rows, weights, intercepts, 0, binary, chosen, scores,
                            np.empty((0, 0), np.float32))
    if binary:
        assert scores[:, 1].tobytes() == expected[:, 0].tobytes()
    else:
        assert scores.tobytes() == expected.tobytes()
        assert chosen.tolist() == expected.argmax(axis=1).tolist()


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer_agrees_in_both_tiers_and_with_onnxruntime(norm, monkeypatch):
    rng = np.random.default_rng(_seed(norm))
    x = rng.standard_normal((6, 9)).astype(np.float32)
    x[2] = 0.0  # a zero norm leaves the row as it is
    model = _model("Normalizer", x, 1, norm=norm)
    compiled, plain = _in_both_tiers(model, {"x": x}, monkeypatch)
    np.testing.assert_allclose(compiled[0], plain[0], rtol=1e-6, atol=1e-7)
    ours, theirs = _both(model, {"x": x})
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("per_column", [False, True])
def test_scaler_agrees_in_both_tiers_and_with_onnxruntime(per_column, monkeypatch):
    rng = np.random.default_rng(_seed(per_column))
    x = rng.standard_normal((5, 4)).astype(np.float32)
    count = 4 if per_column else 1
    model = _model("Scaler", x, 1, offset=[float(v) for v in rng.standard_normal(count)],
                   scale=[float(v) for v in rng.uniform(0.5, 2, count)])
    compiled, plain = _in_both_tiers(model, {"x": x}, monkeypatch)
    np.testing.assert_array_equal(compiled[0], plain[0])
    ours, theirs = _both(model, {"x": x})
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6)
