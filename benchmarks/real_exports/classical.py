"""Classical ML: scikit-learn through skl2onnx, LightGBM and XGBoost through onnxmltools.

Each estimator is fitted on a dataset bundled with scikit-learn (no download), or, for the
text pipeline, on sentences drawn from a fixed word list. Classifiers are converted with
``zipmap=False`` (probabilities as one tensor, which is what a service wants to read); the
ZipMap form is covered by the test suite's skl2onnx models. The feeds are one row, a
service's single request.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .common import Recipe, rng, version

WORDS = ("the model runs fast on every core while the cache stays warm and the service "
         "answers each request with scores for labels users trust over many days of traffic "
         "from clients near and far").split()


def _data(kind: str):
    from sklearn import datasets  # noqa: PLC0415
    loader = {"digits": datasets.load_digits, "cancer": datasets.load_breast_cancer,
              "diabetes": datasets.load_diabetes}[kind]
    x, y = loader(return_X_y=True)
    return x.astype(np.float32), y


def _sentences(count: int, offset: int) -> np.ndarray:
    generator = rng(offset)
    lengths = generator.integers(3, 12, size=count)
    return np.array([" ".join(generator.choice(WORDS, size=n)) for n in lengths])


def _save(model, path: Path) -> None:
    path.write_bytes(model.SerializeToString())


def _sklearn(make, data: str):
    def build(path: Path) -> dict[str, np.ndarray]:
        from skl2onnx import to_onnx  # noqa: PLC0415
        x, y = _data(data)
        estimator = make().fit(x, y)
        options = {"zipmap": False} if hasattr(estimator, "predict_proba") else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = to_onnx(estimator, x[:1], options=options, target_opset=17)
        _save(model, path)
        return {model.graph.input[0].name: x[:1]}
    return build


def _text_pipeline(path: Path) -> dict[str, np.ndarray]:
    from skl2onnx import to_onnx  # noqa: PLC0415
    from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: PLC0415
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415
    from sklearn.pipeline import make_pipeline  # noqa: PLC0415
    text = _sentences(200, 30)
    labels = np.array(["warm" in s or "fast" in s for s in text], dtype=np.int64)
    pipeline = make_pipeline(TfidfVectorizer(), LogisticRegression()).fit(text, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # skl2onnx writes the StringNormalizer's locale as en_US.UTF-8, which onnxruntime
        # refuses to load on a machine without that locale (a bare container); "C" lowercases
        # the same ASCII text
        options = {TfidfVectorizer: {"locale": "C"}, LogisticRegression: {"zipmap": False}}
        model = to_onnx(pipeline, text[:1].reshape(-1, 1), options=options, target_opset=17)
    _save(model, path)
    return {model.graph.input[0].name: _sentences(1, 31).reshape(1, 1)}


def _onnxmltools(make, data: str, library: str):
    def build(path: Path) -> dict[str, np.ndarray]:
        import onnxmltools  # noqa: PLC0415
        from onnxmltools.convert.common.data_types import FloatTensorType  # noqa: PLC0415
        x, y = _data(data)
        estimator = make().fit(x, y)
        types = [("input", FloatTensorType([None, x.shape[1]]))]
        convert = {"lightgbm": onnxmltools.convert_lightgbm,
                   "xgboost": onnxmltools.convert_xgboost}[library]
        extra = {"zipmap": False} if library == "lightgbm" and hasattr(
            estimator, "predict_proba") else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # onnxmltools converts these at opset 15 at most
            model = convert(estimator, initial_types=types, target_opset=15, **extra)
        _save(model, path)
        return {"input": x[:1]}
    return build


def _estimators():
    from sklearn import ensemble, linear_model, neighbors, neural_network, pipeline  # noqa
    from sklearn import preprocessing, svm, tree  # noqa: PLC0415
    return {
        "sk_logreg_scaled": (lambda: pipeline.make_pipeline(
            preprocessing.StandardScaler(), linear_model.LogisticRegression(max_iter=500)),
            "cancer"),
        "sk_decision_tree": (lambda: tree.DecisionTreeClassifier(max_depth=8,
                                                                 random_state=0), "digits"),
        "sk_random_forest": (lambda: ensemble.RandomForestClassifier(
            n_estimators=100, max_depth=10, random_state=0), "digits"),
        "sk_gradient_boosting": (lambda: ensemble.GradientBoostingClassifier(
            n_estimators=50, max_depth=3, random_state=0), "cancer"),
        "sk_extra_trees_regressor": (lambda: ensemble.ExtraTreesRegressor(
            n_estimators=100, max_depth=8, random_state=0), "diabetes"),
        "sk_svc_rbf": (lambda: svm.SVC(probability=True, random_state=0), "digits"),
        "sk_mlp": (lambda: neural_network.MLPClassifier(hidden_layer_sizes=(64, 32),
                                                        max_iter=300, random_state=0),
                   "digits"),
        "sk_knn": (lambda: neighbors.KNeighborsClassifier(n_neighbors=5), "digits"),
    }


def _boosters():
    import lightgbm  # noqa: PLC0415
    import xgboost  # noqa: PLC0415
    quiet = {"verbose": -1}
    return {
        "lgbm_classifier": (lambda: lightgbm.LGBMClassifier(n_estimators=100, **quiet),
                            "cancer", "lightgbm"),
        "lgbm_multiclass": (lambda: lightgbm.LGBMClassifier(n_estimators=50, **quiet),
                            "digits", "lightgbm"),
        "lgbm_regressor": (lambda: lightgbm.LGBMRegressor(n_estimators=100, **quiet),
                           "diabetes", "lightgbm"),
        "xgb_classifier": (lambda: xgboost.XGBClassifier(n_estimators=100, max_depth=4),
                           "cancer", "xgboost"),
        "xgb_regressor": (lambda: xgboost.XGBRegressor(n_estimators=100, max_depth=4),
                          "diabetes", "xgboost"),
    }


class _Lazy(dict):
    """The recipes, listed without importing scikit-learn, LightGBM or XGBoost until one is
    built (a run over other families does not need them installed)."""

    NAMES = ("sk_logreg_scaled", "sk_decision_tree", "sk_random_forest", "sk_gradient_boosting",
             "sk_extra_trees_regressor", "sk_svc_rbf", "sk_mlp",
             "sk_knn", "sk_tfidf_logreg", "lgbm_classifier", "lgbm_multiclass",
             "lgbm_regressor", "xgb_classifier", "xgb_regressor")

    def __init__(self):
        super().__init__((name, None) for name in self.NAMES)

    def __getitem__(self, name):
        if super().__getitem__(name) is None:
            self.update(_recipes())
        return super().__getitem__(name)

    def items(self):
        return ((name, self[name]) for name in self.NAMES)


def _recipes() -> dict[str, Recipe]:
    skl = f"skl2onnx {version('skl2onnx')} (scikit-learn {version('scikit-learn')})"
    recipes = {name: Recipe("classical", skl, _sklearn(make, data))
               for name, (make, data) in _estimators().items()}
    recipes["sk_tfidf_logreg"] = Recipe("classical", skl, _text_pipeline)
    for name, (make, data, library) in _boosters().items():
        tool = f"onnxmltools {version('onnxmltools')} ({library} {version(library)})"
        recipes[name] = Recipe("classical", tool, _onnxmltools(make, data, library))
    return recipes


BUILDERS = _Lazy()


def dataset_of(name: str) -> np.ndarray:
    """The rows the estimator ``name`` was fitted on."""
    known = {**{k: v[1] for k, v in _estimators().items()},
             **{k: v[1] for k, v in _boosters().items()}}
    return _data(known[name])[0]


def build_with_trees(name: str, trees: int, path: Path) -> dict[str, np.ndarray]:
    """The tree ensemble ``name`` (of _estimators or _boosters) with ``trees`` estimators,
    built as its recipe builds it (the sweep draws the count per run)."""
    if name in _estimators():
        make, data = _estimators()[name]
        return _sklearn(lambda: make().set_params(n_estimators=trees), data)(path)
    make, data, library = _boosters()[name]
    return _onnxmltools(lambda: make().set_params(n_estimators=trees), data, library)(path)
