"""Write tests/data/sklearn_exports/: small scikit-learn models as skl2onnx converts them,
with inputs and onnxruntime's outputs (tests/test_sklearn_exports.py checks mixrt against
them, and against onnxruntime run again).

These are the models CI-gate users bring: classifiers end in a ZipMap (their probabilities
as a sequence of {label: probability} maps) unless converted with zipmap off, and
tree ensembles, SVMs and DictVectorizer pipelines use the ``ai.onnx.ml`` operators. Each
estimator is fitted on one of scikit-learn's bundled datasets (no download) and kept small
(few and shallow trees, a data subset) so the files stay small enough to commit.

Needs scikit-learn and skl2onnx, which mixrt does not depend on:

    pip install scikit-learn skl2onnx && python tools/export_sklearn_models.py

Each ``<name>.npz`` is pickle-free: run r's tensor inputs are ``r{r}:input:{name}``; a map
input (DictVectorizer) is ``r{r}:input:{name}:keys`` and ``...:values``; output i is
``r{r}:output:{i}``, and a sequence of maps (ZipMap) is ``r{r}:output:{i}:keys`` and
``...:values``, [maps, keys] each (every map of a ZipMap has the same keys). Strings are
stored as NumPy unicode arrays. MANIFEST.json lists what was made, what did not convert and
why, and each model's estimator, dataset and ``ai.onnx.ml`` operators.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import sklearn
import skl2onnx
import skl2onnx.common._container as skl2onnx_container
from skl2onnx import to_onnx
from sklearn import datasets
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import (ExtraTreesClassifier, GradientBoostingClassifier,
                              GradientBoostingRegressor, HistGradientBoostingClassifier,
                              RandomForestClassifier)
from sklearn.feature_extraction import DictVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.naive_bayes import GaussianNB
from sklearn.neighbors import KNeighborsClassifier
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn.svm import SVC, SVR, LinearSVC, NuSVR
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "sklearn_exports"
ROWS = 24  # test rows per model


# -- skl2onnx 1.20 with scikit-learn 1.9 ----------------------------------------------------

def _plain_ints(value):
    if isinstance(value, list):
        return [int(v) if isinstance(v, (bool, np.bool_, np.integer)) else v for v in value]
    return value


def _make_node_with_plain_ints(*args, _make_node=skl2onnx_container.make_node, **attrs):
    """HistGradientBoosting's converter hands nodes_missing_value_tracks_true over as a mix
    of Python bools and NumPy ints, which protobuf's int list refuses; make them ints."""
    return _make_node(*args, **{k: _plain_ints(v) for k, v in attrs.items()})


skl2onnx_container.make_node = _make_node_with_plain_ints


# -- data -----------------------------------------------------------------------------------

def _data():
    iris = datasets.load_iris()
    cancer = datasets.load_breast_cancer()
    diabetes = datasets.load_diabetes()
    digits = datasets.load_digits()
    keep = np.arange(0, len(digits.target), 5)  # a fifth of digits, all ten classes
    return {
        "iris": (iris.data.astype(np.float32), iris.target),
        "iris_names": (iris.data.astype(np.float32), iris.target_names[iris.target]),
        "cancer": (cancer.data.astype(np.float32), cancer.target),
        "diabetes": (diabetes.data.astype(np.float32), diabetes.target),
        "digits": (digits.data[keep].astype(np.float32), digits.target[keep]),
    }


def _test_rows(X: np.ndarray, seed: int, missing: bool = False) -> np.ndarray:
    """ROWS rows: dataset rows plus small noise (off the training points, some near the
    splits), NaN in some cells when the model handles missing values."""
    rng = np.random.default_rng(seed)
    rows = X[rng.choice(len(X), ROWS, replace=False)]
    rows = rows + rng.normal(0, 0.05, rows.shape).astype(np.float32) * rows.std(axis=0)
    if missing:
        rows[rng.random(rows.shape) < 0.1] = np.nan
    return rows.astype(np.float32)


# -- the models -----------------------------------------------------------------------------

def _classifiers():
    """name -> (estimator, dataset, options). Each is converted with zipmap on and off."""
    return {
        "logreg_iris": (LogisticRegression(max_iter=500), "iris", {}),
        "scaled_logreg_cancer": (make_pipeline(StandardScaler(),
                                               LogisticRegression(max_iter=500)), "cancer", {}),
        "tree_iris": (DecisionTreeClassifier(max_depth=3, random_state=0), "iris", {}),
        "tree_cancer": (DecisionTreeClassifier(max_depth=3, random_state=0), "cancer", {}),
        "tree_iris_names": (DecisionTreeClassifier(max_depth=3, random_state=0),
                            "iris_names", {}),
        "tree_iris_ml3": (DecisionTreeClassifier(max_depth=3, random_state=0), "iris",
                          {"ml3": True}),
        "forest_iris": (RandomForestClassifier(n_estimators=4, max_depth=3, random_state=0),
                        "iris", {}),
        "forest_digits": (RandomForestClassifier(n_estimators=4, max_depth=4, random_state=0),
                          "digits", {}),
        "forest_cancer_double": (RandomForestClassifier(n_estimators=3, max_depth=3,
                                                        random_state=0), "cancer",
                                 {"double": True, "ml3": True}),
        "extra_trees_iris": (ExtraTreesClassifier(n_estimators=4, max_depth=3, random_state=0),
                             "iris", {}),
        "gboost_iris": (GradientBoostingClassifier(n_estimators=4, max_depth=2, random_state=0),
                        "iris", {}),
        "gboost_cancer": (GradientBoostingClassifier(n_estimators=4, max_depth=2,
                                                     random_state=0), "cancer", {}),
        "hist_gboost_iris": (HistGradientBoostingClassifier(max_iter=4, max_depth=3,
                                                            random_state=0), "iris",
                             {"missing": True}),
        "hist_gboost_cancer": (HistGradientBoostingClassifier(max_iter=4, max_depth=3,
                                                              random_state=0), "cancer",
                               {"missing": True}),
        "svc_linear_iris": (SVC(kernel="linear"), "iris", {}),
        "svc_rbf_iris_proba": (SVC(kernel="rbf", probability=True, random_state=0), "iris", {}),
        "svc_poly_iris": (SVC(kernel="poly", degree=3), "iris", {}),
        "svc_rbf_cancer": (make_pipeline(StandardScaler(), SVC(kernel="rbf")), "cancer", {}),
        "svc_poly_cancer_proba": (make_pipeline(StandardScaler(), SVC(
            kernel="poly", degree=2, probability=True, random_state=0)), "cancer", {}),
        "svc_sigmoid_iris_names": (SVC(kernel="sigmoid", gamma=0.05), "iris_names", {}),
        "linear_svc_iris": (LinearSVC(random_state=0), "iris", {}),
        "knn_iris": (KNeighborsClassifier(n_neighbors=3), "iris", {}),
        "naive_bayes_iris": (GaussianNB(), "iris", {}),
        "mlp_iris": (MLPClassifier(hidden_layer_sizes=(8,), max_iter=400, random_state=0),
                     "iris", {}),
        "onehot_logreg_iris": (None, "iris", {}),  # made by _onehot_case
    }


def _regressors():
    return {
        "tree_regressor_diabetes": (DecisionTreeRegressor(max_depth=4, random_state=0),
                                    "diabetes", {}),
        "gboost_regressor_diabetes": (GradientBoostingRegressor(n_estimators=5, max_depth=3,
                                                                random_state=0),
                                      "diabetes", {}),
        "svr_diabetes": (SVR(kernel="rbf", C=50.0), "diabetes", {}),
        "nusvr_diabetes": (NuSVR(kernel="poly", degree=2, C=50.0), "diabetes", {}),
    }


def _dict_rows(X: np.ndarray, names) -> list[dict]:
    return [{name: float(v) for name, v in zip(names, row) if v > 1.0} for row in X]


# -- conversion -----------------------------------------------------------------------------

def _convert(estimator, X: np.ndarray, options: dict, zipmap: bool) -> onnx.ModelProto:
    sample = X[:1].astype(np.float64 if options.get("double") else np.float32)
    conversion = {} if zipmap else {"zipmap": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn 1.9 deprecates SVC's probA_/probB_
        model = to_onnx(estimator, sample, target_opset={"": 17, "ai.onnx.ml": 1},
                        options={id(_final(estimator)): conversion} if conversion else None)
    return _as_ml_opset_3(model, options.get("double", False)) if options.get("ml3") else model


# the TreeEnsembleClassifier attributes opset 3 may give as double tensors (*_as_tensor)
_DOUBLE_ATTRIBUTES = ("nodes_values", "class_weights", "base_values", "nodes_hitrates")


def _as_ml_opset_3(model: onnx.ModelProto, as_tensors: bool) -> onnx.ModelProto:
    """The model at ai.onnx.ml opset 3 (skl2onnx writes opset 1 classifiers), its tree
    ensemble's float lists as double ``*_as_tensor`` attributes when ``as_tensors`` (what
    onnxmltools writes for a float64 model; onnxruntime reads them for float64 inputs)."""
    for opset in model.opset_import:
        if opset.domain == "ai.onnx.ml":
            opset.version = 3
    for node in model.graph.node:
        if node.op_type != "TreeEnsembleClassifier" or not as_tensors:
            continue
        kept = []
        for attribute in node.attribute:
            if attribute.name in _DOUBLE_ATTRIBUTES:
                values = np.array(onnx.helper.get_attribute_value(attribute), np.float64)
                kept.append(onnx.helper.make_attribute(
                    f"{attribute.name}_as_tensor",
                    onnx.numpy_helper.from_array(values, f"{attribute.name}_as_tensor")))
            else:
                kept.append(attribute)
        del node.attribute[:]
        node.attribute.extend(kept)
    return model


def _final(estimator):
    return estimator.steps[-1][1] if hasattr(estimator, "steps") else estimator


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _store_output(arrays: dict, prefix: str, value) -> None:
    if isinstance(value, list):  # a ZipMap's sequence of maps
        keys = list(value[0]) if value else []
        arrays[f"{prefix}:keys"] = np.array([keys for _ in value]).reshape(len(value), -1)
        arrays[f"{prefix}:values"] = np.array([[m[k] for k in keys] for m in value],
                                              np.float64).reshape(len(value), -1)
    else:
        arrays[prefix] = value.astype(str) if value.dtype == object else value


def _store_feed(arrays: dict, prefix: str, value) -> None:
    if isinstance(value, dict):
        arrays[f"{prefix}:keys"] = np.array(list(value), dtype=str)
        arrays[f"{prefix}:values"] = np.array(list(value.values()), np.float32)
    else:
        arrays[prefix] = value


def _write(name: str, model: onnx.ModelProto, runs: list[dict], info: dict) -> dict:
    onnx.checker.check_model(model, full_check=True)
    arrays = {}
    for r, feeds in enumerate(runs):
        for input_name, value in feeds.items():
            _store_feed(arrays, f"r{r}:input:{input_name}", value)
        for i, value in enumerate(_onnxruntime(model, feeds)):
            _store_output(arrays, f"r{r}:output:{i}", value)
    (OUT / f"{name}.onnx").write_bytes(model.SerializeToString())
    np.savez_compressed(OUT / f"{name}.npz", **arrays)
    ml_ops = sorted({n.op_type for n in model.graph.node if n.domain == "ai.onnx.ml"})
    print(f"{name}: {model.ByteSize() / 1024:.1f} KB, {', '.join(ml_ops) or 'no ml ops'}")
    return {**info, "runs": len(runs), "ml_ops": ml_ops}


def _fit(estimator, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of the small iteration counts
        return estimator.fit(X, y)


def _estimator_cases(data):
    seed = 0
    for kind, cases in (("classifier", _classifiers()), ("regressor", _regressors())):
        for name, (estimator, dataset, options) in cases.items():
            seed += 1
            X, y = data[dataset]
            if name == "onehot_logreg_iris":
                estimator, X = _onehot_case(X, y)
            else:
                _fit(estimator, X.astype(np.float64) if options.get("double") else X, y)
            rows = _test_rows(X, seed, options.get("missing", False))
            if options.get("double"):
                rows = rows.astype(np.float64)
            info = {"estimator": type(_final(estimator)).__name__, "dataset": dataset,
                    "pipeline": [type(s).__name__ for _, s in getattr(estimator, "steps", [])]}
            # LinearSVC has no probabilities, so no ZipMap to turn off
            with_zipmap = kind == "classifier" and not isinstance(_final(estimator), LinearSVC)
            for zipmap in ((True, False) if with_zipmap else (True,)):
                stem = name if zipmap else f"{name}.nozipmap"
                yield stem, estimator, rows, options, zipmap, {**info, "zipmap": zipmap and
                                                               with_zipmap}


def _onehot_case(X, y):
    """Column 3 binned (rounded petal width) one-hot encoded, the rest passed through."""
    binned = X.copy()
    binned[:, 3] = np.round(binned[:, 3])
    transform = ColumnTransformer([("petal", OneHotEncoder(handle_unknown="ignore"), [3])],
                                  remainder="passthrough")
    return _fit(make_pipeline(transform, LogisticRegression(max_iter=500)), binned, y), binned


def _dict_cases(data):
    """DictVectorizer pipelines: a map(string, float) input, one map per run (onnxruntime
    takes a single map there)."""
    X, y = data["iris"]
    names = ["sepal length", "sepal width", "petal length", "petal width"]
    rows = _dict_rows(X, names)
    for name, final in (("dict_tree_iris", DecisionTreeClassifier(max_depth=3,
                                                                  random_state=0)),
                        ("dict_logreg_iris", LogisticRegression(max_iter=500))):
        model = make_pipeline(DictVectorizer(sparse=False), final)
        _fit(model, rows, y)
        runs = [rows[i] for i in (0, 60, 120, 7, 77)]
        info = {"estimator": type(final).__name__, "dataset": "iris as dicts",
                "pipeline": ["DictVectorizer", type(final).__name__]}
        for zipmap in (True, False):
            stem = name if zipmap else f"{name}.nozipmap"
            yield stem, model, runs, info, zipmap


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for stale in list(OUT.glob("*.onnx")) + list(OUT.glob("*.npz")):
        stale.unlink()
    data = _data()
    made, failed = {}, {}
    for stem, estimator, rows, options, zipmap, info in _estimator_cases(data):
        try:
            model = _convert(estimator, rows, options, zipmap)
            made[stem] = _write(stem, model, [{model.graph.input[0].name: rows}], info)
        except Exception as exc:  # noqa: BLE001 (a converter's limits, recorded)
            failed[stem] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    for stem, estimator, runs, info, zipmap in _dict_cases(data):
        try:
            from skl2onnx.common.data_types import DictionaryType, FloatTensorType, \
                StringTensorType  # noqa: PLC0415
            model = skl2onnx.convert_sklearn(
                estimator, initial_types=[("input", DictionaryType(StringTensorType([]),
                                                                   FloatTensorType([])))],
                target_opset={"": 17, "ai.onnx.ml": 1},
                options=None if zipmap else {id(_final(estimator)): {"zipmap": False}})
            made[stem] = _write(stem, model, [{"input": run} for run in runs],
                                {**info, "zipmap": zipmap})
        except Exception as exc:  # noqa: BLE001
            failed[stem] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    (OUT / "MANIFEST.json").write_text(json.dumps(
        {"sklearn": sklearn.__version__, "skl2onnx": skl2onnx.__version__,
         "onnxruntime": ort.__version__, "made": made, "conversion_failures": failed},
        indent=1) + "\n")
    for stem, why in failed.items():
        print(f"{stem}: not converted ({why})")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"{len(made)} models, {total / 1024:.0f} KB in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
