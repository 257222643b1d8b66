"""The linear models of the ``ai.onnx.ml`` domain: LinearRegressor, and LinearClassifier with
its compiled scores and label (``ops/ml/_jit_ml.py``), their products through NumPy's BLAS for
many rows. The shared pieces (rows, the compiled module, the score post-transforms) are
``ml.py``'s.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.settings import batch_invariant
from mixrt.ops.compiled.bound_calls import binds
from mixrt.ops.device import to_host
from mixrt.ops.ir.node_state import cached as _cached
from mixrt.ops.ir.node_state import prepared
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import tensor
from mixrt.ops.ml.ml import _NUMBERS, ML, _ml_kernels, _rows, post_transform_scores


@op("LinearRegressor", since=1, domain=ML, dtypes=_NUMBERS)
def linear_regressor(xp, X, *, coefficients=None, intercepts=None, post_transform="NONE",
                     targets=1, _node=None):
    weights, intercepts = _cached(_node, lambda: _linear_constants(coefficients, intercepts))
    rows = _rows(X).astype(np.float32, copy=False)
    scores = rows @ xp.asarray(weights).reshape(targets, -1).T
    if intercepts is not None:
        scores = scores + xp.asarray(intercepts)
    return post_transform_scores(xp, scores, post_transform)


@linear_regressor.infer
def _(X, *, targets=1, **_):
    batch = X.shape[0] if X.shape is not None and len(X.shape) > 1 else 1
    return [tensor(np.float32, (batch, targets))]



@op("LinearClassifier", since=1, domain=ML, dtypes=_NUMBERS)
def linear_classifier(xp, X, *, classlabels_ints=None, classlabels_strings=None,
                      coefficients=None, intercepts=None, multi_class=0, post_transform="NONE",
                      _node=None):
    """Scores X @ W.T + b, label = the best-scoring class. With one row of coefficients and
    two labels the model is binary: s is the second class's score, the label is the second
    class when s > 0, and the scores are [1 - p, p] with p = s after LOGISTIC if asked (the
    other transforms leave s as it is), as onnxruntime does."""
    return prepared(_node, lambda: _LinearClassifier(
        classlabels_ints, classlabels_strings, coefficients, intercepts,
        post_transform)).run(xp, X)


class _LinearClassifier:
    def __init__(self, classlabels_ints, classlabels_strings, coefficients, intercepts,
                 post_transform):
        labels = classlabels_strings if classlabels_strings is not None else classlabels_ints
        if labels is None:
            raise ValueError("LinearClassifier needs classlabels_ints or classlabels_strings")
        self.strings = classlabels_strings is not None
        self.labels = np.asarray(classlabels_strings, dtype=object) if self.strings \
            else np.asarray(classlabels_ints, dtype=np.int64)
        self.weights, self.intercepts = _linear_constants(coefficients, intercepts)
        self.post_transform = post_transform
        # what ops/ml/_jit_ml.py computes: its transform code, None where NumPy finishes
        self.transform = _LINEAR_TRANSFORMS.get(
            post_transform.decode() if isinstance(post_transform, bytes) else post_transform)
        self._compiled = {}  # features -> (weights [F, C], intercepts [C], binary) or None

    def run(self, xp, X):
        rows = _rows(X).astype(np.float32, copy=False)
        self._require_width(rows.shape[1])
        kernels = _ml_kernels(xp, rows) if self.transform is not None else None
        tables = self._tables(rows.shape[1]) if kernels is not None else None
        if tables is None:
            return self._numpy(xp, rows)
        weights, intercepts, binary = tables
        chosen = np.empty(rows.shape[0], np.int64)
        scores = np.empty((rows.shape[0], 2 if binary else weights.shape[1]), np.float32)
        kernels.linear_classify(rows, weights, intercepts, self.transform, binary, chosen,
                                scores, _products(rows, weights, _by_blas(rows)))
        return self._label(np, chosen), scores

    def _require_width(self, features: int) -> None:
        """Rows must have as many features as each class has coefficients. onnxruntime
        counts the classes by the intercepts and reads the first classes * features
        coefficients as the weights of shorter rows: weights of other features and classes,
        a silent wrong answer, so such rows are refused here."""
        classes = len(self.intercepts) if self.intercepts is not None else None
        if not classes or self.weights.size == classes * features:
            return
        if self.weights.size % classes:
            raise ValueError(f"LinearClassifier has {self.weights.size} coefficients, which "
                             f"do not split into its {classes} classes (one intercept each)")
        raise ValueError(f"LinearClassifier takes rows of {self.weights.size // classes} "
                         f"features ({self.weights.size} coefficients for {classes} classes); "
                         f"the input's rows have {features}")

    def _tables(self, features: int):
        """The compiled kernel's weights for rows of ``features`` columns, or None where
        the coefficients do not make whole rows of that width (NumPy then raises)."""
        if features not in self._compiled:
            tables = None
            if features and self.weights.size % features == 0 and self.weights.size:
                weights = self.weights.reshape(-1, features)
                intercepts = self.intercepts if self.intercepts is not None \
                    else np.zeros(len(weights), np.float32)
                binary = len(weights) == 1 and len(self.labels) == 2
                if len(intercepts) >= len(weights):  # the kernel reads the weights [F, C]
                    tables = (np.ascontiguousarray(weights.T), intercepts, binary)
            self._compiled[features] = tables
        return self._compiled[features]

    def _numpy(self, xp, rows):
        weights = xp.asarray(self.weights).reshape(-1, rows.shape[1])
        scores = rows @ weights.T
        if self.intercepts is not None:
            scores = scores + xp.asarray(self.intercepts)
        if weights.shape[0] == 1 and len(self.labels) == 2:
            positive = scores[:, 0] > 0
            p = post_transform_scores(xp, scores, "LOGISTIC") \
                if self.post_transform == "LOGISTIC" else scores
            scores = xp.concatenate([1 - p, p], axis=1)
            chosen = positive.astype(np.int64)
        else:
            chosen = xp.argmax(scores, axis=1)
            scores = post_transform_scores(xp, scores, self.post_transform)
        return self._label(xp, chosen), scores.astype(np.float32)

    def _label(self, xp, chosen):
        if self.strings:
            return self.labels[to_host(chosen)]
        return xp.asarray(self.labels)[chosen]


@binds(linear_classifier.fn, feeds=True, fresh=True, silent=True)  # bound once per arena (bound_calls)
def bind_linear_classifier(args, out, attributes):
    """The compiled scores and label of float32 rows as ``_LinearClassifier.run`` computes
    them, its tables, kernel and labels settled once: a new label and score array each call
    (they are the graph's outputs). A logistic regression's one-row call: ~2.7 -> ~1.4 us."""
    (X,), model = args, (attributes.get("_node") or {}).get("model")
    if not isinstance(model, _LinearClassifier) or model.transform is None \
            or X.dtype != np.float32 or X.ndim > 2 or not X.flags.c_contiguous:
        return None
    rows = _rows(X)
    kernels = _ml_kernels(np, rows)
    tables = None if kernels is None else model._tables(rows.shape[1])
    if tables is None:
        return None
    kernel, transform, labels = kernels.linear_classify, model.transform, model.labels
    (weights, intercepts, binary), shape = tables, rows.shape
    columns = 2 if binary else weights.shape[1]
    by_blas = _by_blas(rows)

    def call(X):
        chosen = np.empty(shape[0], np.int64)
        scores = np.empty((shape[0], columns), np.float32)
        X = X.reshape(shape)
        kernel(X, weights, intercepts, transform, binary, chosen, scores,
               _products(X, weights, by_blas))
        return labels[chosen], scores
    return call


# rows from which its products are one BLAS product: the compiled sums wait on each other
# class by class, ~0.47 us a row of 126 features into 8 classes against the BLAS's 2.1 us
# for 15 rows (2026-12-05, one thread: rows 1 / 2 / 4 / 8 / 15 1.00 / 1.43 / 2.32 / 4.09 /
# 7.12 us compiled, 1.19 / 1.34 / 1.46 / 1.71 / 2.12 through the BLAS). From 16 until then.
BLAS_ROWS = 2


def _by_blas(rows) -> bool:
    """Does the compiled LinearClassifier take ``rows``' products through the BLAS? (A
    row's sums there may depend on the rows beside it: not under MIXRT_BATCH_INVARIANT.)"""
    return rows.shape[0] >= BLAS_ROWS and rows.flags.c_contiguous and not batch_invariant()


def _products(rows, weights, by_blas: bool):
    """rows @ weights through NumPy's BLAS where ``by_blas``, else no rows of products
    (``_jit_ml.linear_classify`` sums them itself)."""
    return np.dot(rows, weights) if by_blas else _NO_PRODUCTS


_NO_PRODUCTS = np.empty((0, 0), np.float32)


# the LinearClassifier post-transforms ops/ml/_jit_ml.py computes
_LINEAR_TRANSFORMS = {"NONE": 0, "LOGISTIC": 1, "SOFTMAX": 2}


def _linear_constants(coefficients, intercepts):
    """A linear model's coefficients and intercepts (or None) as float32 arrays, made once
    per node: converting the attribute lists was most of a small model's run."""
    return (np.asarray(coefficients, dtype=np.float32).reshape(-1),
            None if intercepts is None else np.asarray(intercepts, dtype=np.float32))


@linear_classifier.infer
def _(X, *, classlabels_ints=None, classlabels_strings=None, coefficients=None,
      intercepts=None, **_):
    batch = X.shape[0] if X.shape is not None and len(X.shape) > 1 else 1
    label = object if classlabels_strings is not None else np.int64
    labels = classlabels_strings if classlabels_strings is not None else classlabels_ints
    return [tensor(label, (batch,)),
            tensor(np.float32, (batch, _score_columns(X, labels, coefficients, intercepts)))]


def _score_columns(X, labels, coefficients, intercepts) -> int | None:
    """The scores' width as ``_LinearClassifier.run`` makes it: one column a class (the
    intercepts count them, or the coefficients over the rows' width), two for a binary
    model of one coefficient row; None where the attributes leave it open. Known, a new
    batch of the model is planned from inference (runtime/inferred_plans.py)."""
    features = X.shape[-1] if X.shape is not None and len(X.shape) > 1 else None
    if intercepts is not None and len(intercepts):
        classes = len(intercepts)
    elif coefficients is not None and isinstance(features, int) and features > 0 \
            and len(coefficients) % features == 0:
        classes = len(coefficients) // features
    else:
        return None
    return 2 if classes == 1 and labels is not None and len(labels) == 2 else classes
