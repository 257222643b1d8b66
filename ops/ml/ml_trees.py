"""The tree ensembles of ``ai.onnx.ml``: TreeEnsembleClassifier and TreeEnsembleRegressor
(opsets 1 and 3: scikit-learn's trees, forests and gradient boosting, LightGBM, XGBoost);
TreeEnsemble (opset 5) lives in ``ops/ml/forest.py``, with its encoding into the forest.

A node's forest (``forest_walks._Forest``: flat node arrays and leaf weights) is built from its
attributes once, on its first call, and kept in the node's ``_node`` dict with the checks of
its attributes done; a call without one (a kernel called directly) builds it each time.
The compiled tier walks each row down each tree (``ops/ml/_jit_trees.py``); the NumPy tier walks
the whole batch at once, level by level. Either way class scores are summed tree by tree in
the precision onnxruntime sums them in (float32, float64 for float64 inputs), so a score on
a decision threshold (a forest's 0.5) falls on the side onnxruntime's does. The compiled
tier also turns the sums into labels and scores (``ops/ml/_jit_trees.two_class_scores``,
``many_class_scores``) for NONE, LOGISTIC and SOFTMAX, with the NumPy forms' arithmetic:
labels identical, scores within a few ulp (libm's expf against NumPy's).

The outputs follow onnxruntime, which users compare with, where it departs from the spec's
text (each departure is marked "onnxruntime:" below). Two classes are the intricate case:
converters store a binary model either as one score per class or as one score (the second
class's, or a margin) from which onnxruntime derives two columns.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.bound_calls import binds
from mixrt.ops.ir.node_state import prepared
from mixrt.ops.ml.forest import _aggregate_name, _either, _forest_from_node_ids
from mixrt.ops.ml.tree_requests import ClassifierRequest, regressor_request
from mixrt.ops.ml.ml import (_NUMBERS, ML, _POST_TRANSFORMS, _probit, _rows,
                             post_transform_scores)
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import tensor
from mixrt.ops.device import to_host


@op("TreeEnsembleClassifier", since=3, domain=ML, dtypes=_NUMBERS)
@op("TreeEnsembleClassifier", since=1, domain=ML, dtypes=_NUMBERS)
def tree_ensemble_classifier(
        xp, X, *, base_values=None, base_values_as_tensor=None, class_ids=None,
        class_nodeids=None, class_treeids=None, class_weights=None,
        class_weights_as_tensor=None, classlabels_int64s=None, classlabels_strings=None,
        nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
        nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None, nodes_modes=None,
        nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
        nodes_values_as_tensor=None, post_transform="NONE", _node=None):
    """(label [N], scores [N, classes]). Version 1 has no *_as_tensor attributes; the binder
    rejects attributes a kernel does not take, so accepting them here is harmless."""
    model = prepared(_node, lambda: _Classifier(
        base_values=_either(base_values, base_values_as_tensor), class_ids=class_ids,
        class_nodeids=class_nodeids, class_treeids=class_treeids,
        class_weights=_either(class_weights, class_weights_as_tensor),
        classlabels_int64s=classlabels_int64s, classlabels_strings=classlabels_strings,
        nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids,
        nodes_values=_either(nodes_values, nodes_values_as_tensor),
        post_transform=post_transform))
    return model.run(xp, X)


class _Classifier:
    """A TreeEnsembleClassifier node's forest, labels and checked attributes."""

    def __init__(self, *, base_values, class_ids, class_nodeids, class_treeids, class_weights,
                 classlabels_int64s, classlabels_strings, nodes_falsenodeids, nodes_featureids,
                 nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids,
                 nodes_truenodeids, nodes_values, post_transform):
        self.labels = labels = class_labels(classlabels_int64s, classlabels_strings)
        _check_post_transform(post_transform)
        self.post_transform = post_transform
        self.forest = _forest_from_node_ids(
            treeids=nodes_treeids, nodeids=nodes_nodeids, featureids=nodes_featureids,
            modes=nodes_modes, values=nodes_values, truenodeids=nodes_truenodeids,
            falsenodeids=nodes_falsenodeids, missing_tracks_true=nodes_missing_value_tracks_true,
            leaf_treeids=class_treeids, leaf_nodeids=class_nodeids, leaf_ids=class_ids,
            leaf_weights=class_weights, n_outputs=len(labels), leaf_prefix="class_")
        base = np.asarray([] if base_values is None else base_values, np.float64).reshape(-1)
        if len(base) not in (0, len(labels)) and (len(labels) > 2 or len(base) > 2):
            # onnxruntime refuses these too (two classes may have one base value)
            raise ValueError(f"base_values has {len(base)} values; {len(labels)} classes take "
                             f"0 or {len(labels)}")
        if len(labels) == 1 and len(base) == 2:  # onnxruntime writes two scores into one column
            raise ValueError("base_values has 2 values for a single class (classlabels has 1)")
        self.base = {np.dtype(p): base.astype(p) for p in (np.float32, np.float64)}
        # the compiled scores' post-transform code (None: the NumPy forms finish the scores)
        self.transform = COMPILED_TRANSFORMS.get(_name(post_transform)) \
            if len(self.labels) >= 2 else None
        ids = np.asarray(class_ids if class_ids is not None else [], np.int64)
        self.binary_case = len(set(ids.tolist())) == 1  # every weight is for the same class
        self.all_positive = bool((np.asarray(class_weights if class_weights is not None else [],
                                             np.float64) >= 0).all())
        self.request = None  # ops/ml/tree_requests.py, made on the first compiled run

    def run(self, xp, X):
        request = self.request
        if request is not None and X.__class__ is np.ndarray:
            answer = request(X)  # None: not rows it takes as they are
            if answer is not None:
                return answer
        precision = np.float64 if X.dtype == np.float64 else np.float32
        rows = _rows(X)
        kernels = self.forest._kernels(xp, rows)
        if kernels is not None and self.transform is not None:  # a request's usual path
            if self.request is None:
                self.request = ClassifierRequest(kernels, self)
            return self.compiled_rows(kernels, rows, precision)
        raw, has = self.forest.sums(xp, rows, precision)
        labels, base, post_transform = self.labels, self.base[np.dtype(precision)], \
            self.post_transform
        kernels = _compiled_scores(xp, raw, post_transform, len(labels))
        if kernels is not None:
            return self._compiled(kernels, raw, has, base)
        if len(labels) > 2:
            chosen, scores = _multiclass(xp, raw, has, base, post_transform)
            return label_values(xp, labels, chosen), scores
        if len(labels) == 1:
            return _one_class(xp, labels, raw[:, 0], base, post_transform)
        return _two_classes(xp, labels, raw, has, base, post_transform, self.binary_case,
                            self.all_positive)

    def compiled_rows(self, kernels, X, precision):
        """:meth:`run`'s labels and scores of the rows X (2-D) through the compiled kernels
        alone, where they may walk X and compute its scores (``transform``): split between
        threads, or in one call. It calls no NumPy ufunc (a request's bound call of rows
        past its one call answers with it: ``tree_requests._Request.any_rows``)."""
        answer = self._by_parts(X, precision)  # rows split: each part scores its own
        if answer is not None:
            return answer
        if self.forest.walks_alone(X.shape[0]):
            return self._one_call(kernels, X, precision)
        raw, has = self.forest.compiled_sums(kernels, X, precision)
        return self._compiled(kernels, raw, has, self.base[np.dtype(precision)])

    def _one_call(self, kernels, X, precision):
        """The walk and _compiled's scores in one compiled call (a request's few rows)."""
        data, tables = self.forest.walk_inputs(X, precision)
        rows, labels, base = X.shape[0], self.labels, self.base[np.dtype(precision)]
        scores = np.empty((rows, max(2, len(labels))), np.float32)
        if len(labels) > 2:
            chosen = np.empty(rows, np.int64)
            kernels.classify_many(data, *tables, base, self.transform, chosen, scores)
            return label_values(np, labels, chosen), scores
        positive = np.empty(rows, np.int64)
        kernels.classify_two(data, *tables, self.forest.weights.shape[1], base,
                             self.binary_case, self.all_positive, self.transform, positive,
                             scores)
        if self.binary_case or labels.dtype == object:
            return label_values(np, labels, positive), scores
        return positive, scores

    def _by_parts(self, X, precision):
        """_one_call's answer with the rows split between threads, each part walking and
        scoring its own rows (``forest.classify_parts``); None where they are not split."""
        rows, labels = X.shape[0], self.labels
        many = len(labels) > 2
        scores = np.empty((rows, max(2, len(labels))), np.float32)
        chosen = np.empty(rows, np.int64)
        targets = scores.shape[1] if many else self.forest.weights.shape[1]
        finish = (targets, many, self.transform, self.binary_case, self.all_positive)
        if not self.forest.classify_parts(X, precision, finish, self.base[np.dtype(precision)],
                                          chosen, scores):
            return None
        if many or self.binary_case or labels.dtype == object:
            return label_values(np, labels, chosen), scores
        return chosen, scores

    def _compiled(self, kernels, raw, has, base):
        """run's scores and labels through ops/ml/_jit_trees.py (the same arithmetic)."""
        transform = self.transform
        rows, labels = raw.shape[0], self.labels
        if len(labels) > 2:
            chosen = np.empty(rows, np.int64)
            scores = np.empty((rows, len(labels)), np.float32)
            kernels.many_class_scores(raw, has, base, transform, chosen, scores)
            return label_values(np, labels, chosen), scores
        positive = np.empty(rows, np.int64)
        scores = np.empty((rows, 2), np.float32)
        kernels.two_class_scores(raw, has, base, self.binary_case, self.all_positive,
                                 transform, positive, scores)
        if self.binary_case or labels.dtype == object:
            return label_values(np, labels, positive), scores
        return positive, scores


# the post-transforms ops/ml/_jit_trees.py computes (its codes); PROBIT and SOFTMAX_ZERO, which
# converters seldom write, stay with the NumPy forms
COMPILED_TRANSFORMS = {"NONE": 0, "LOGISTIC": 1, "SOFTMAX": 2}


def _compiled_scores(xp, raw, post_transform, classes: int):
    """ops/ml/_jit_trees.py when it may finish this classifier's scores, else None."""
    # an inner step's compiled loop on host arrays, not the op's kernel: the steps around it
    # are the same on every device
    if xp is not np or classes < 2 or _name(post_transform) not in COMPILED_TRANSFORMS \
            or not jit_cpu.enabled():
        return None
    return jit_cpu.load("mixrt.ops.ml._jit_trees")


@tree_ensemble_classifier.infer
def _(X, *, classlabels_int64s=None, classlabels_strings=None, **_):
    batch = (X.shape[0] if len(X.shape) > 1 else 1) if X.shape is not None else None
    count = len(classlabels_strings if classlabels_strings is not None else
                classlabels_int64s or [])
    label = object if classlabels_strings is not None else np.int64
    return [tensor(label, (batch,)), tensor(np.float32, (batch, count))]


# -- shared with SVMClassifier ------------------------------------------------------------

def class_labels(ints, strings) -> np.ndarray:
    """The one label list a classifier declares, as an int64 or object array."""
    if (ints is None) == (strings is None):
        raise ValueError("a classifier needs exactly one of classlabels_int64s/classlabels_ints "
                         "and classlabels_strings")
    labels = (np.asarray(strings, dtype=object) if strings is not None
              else np.asarray(ints, dtype=np.int64)).reshape(-1)
    if labels.dtype == object:
        labels = np.array([v.decode() if isinstance(v, bytes) else v for v in labels.tolist()],
                          dtype=object)
    if not len(labels):
        raise ValueError("classlabels are empty: a classifier needs at least one class")
    return labels


def label_values(xp, labels: np.ndarray, chosen):
    """labels[chosen] (chosen: indices [N]); string labels on the host."""
    if labels.dtype == object:
        return labels[to_host(chosen).astype(np.int64)]
    return xp.asarray(labels)[chosen]


def _check_post_transform(post_transform) -> None:
    name = post_transform.decode() if isinstance(post_transform, bytes) else post_transform
    if name not in _POST_TRANSFORMS:
        raise ValueError(f"post_transform must be one of {', '.join(_POST_TRANSFORMS)}, "
                         f"got {post_transform!r}")


# -- scores -------------------------------------------------------------------------------

def _multiclass(xp, raw, has, base, post_transform):
    """More than two classes: base values are added (a class they reach counts as scored),
    the label is the best class among those scored (the first on ties), and the scores are
    post-transformed, an unscored class reading 0."""
    if len(base):
        raw = raw.copy()
        raw[:, :len(base)] += xp.asarray(base)
        has = has.copy()
        has[:, :len(base)] = True
    chosen = xp.argmax(xp.where(has, raw, -np.inf), axis=1)
    scores = xp.where(has, raw, 0).astype(np.float32)
    return chosen, post_transform_scores(xp, scores, post_transform).astype(np.float32)


def _one_class(xp, labels, raw, base, post_transform):
    """A single class: onnxruntime scores it as one margin s (plus base_values[0]) and labels
    a row 1 when s > 0, else 0, whatever the declared label."""
    if labels.dtype == object:
        raise ValueError("classlabels_strings has a single class, which onnxruntime "
                         "labels by index 1 or 0: give two classes or int64 labels")
    score = raw + base[0] if len(base) == 1 else raw
    label = (score > 0).astype(np.int64)
    if _name(post_transform) == "PROBIT":
        score = _probit(xp, score)
    return label, score.astype(np.float32).reshape(-1, 1)


def _two_classes(xp, labels, raw, has, base, post_transform, binary_case, all_positive):
    """Two classes, as onnxruntime's classifier aggregator does it row by row:

    * base_values (0, 1 or 2 of them) shift the scores: with two, a row scored for class 1
      gets s1 = base[1] + s0 and s0 = -s1 (onnxruntime reuses s0 there, not s1);
    * a row with no class-1 score keeps one score, s = s0, else both;
    * the label: when every weight is for one class ("binary case"), class 1 when the
      positive score exceeds 0.5 (all weights >= 0) or 0 (some negative), else class 0;
      otherwise label *value* 1 when it exceeds 0, else 0 (onnxruntime: not labels[1], so an
      int label list [3, 7] yields 1 and 0);
    * two scores are post-transformed as a row; one score s becomes [-s, s] (some weight
      negative, or no binary case) or [1 - s, s] (all weights >= 0), [logistic(-s),
      logistic(s)] under LOGISTIC, [probit(s), unwritten] under PROBIT.
    """
    s0, s1 = raw[:, 0], raw[:, 1]
    h0, h1 = has[:, 0], has[:, 1]
    pair = h1  # rows that keep both scores
    if len(base) == 2:
        shifted = base[1] + s0
        s1, s0 = xp.where(h1, shifted, s1 + base[1]), xp.where(h1, -shifted, s0 + base[0])
        pair = xp.ones(h1.shape, dtype=bool)
    elif len(base) == 1:
        s0 = s0 + base[0]
    read0 = xp.where(h0, s0, 0)
    # most models keep one form for every row: the other is not computed (a batch of one
    # spent half its time on it)
    some_pair = bool(pair.any())
    positive_score = xp.where(pair & h1, s1, read0) if some_pair else read0
    if binary_case:
        positive = positive_score > (0.5 if all_positive else 0)
        label = label_values(xp, labels, positive.astype(np.int64))
        mirrored = not all_positive
    else:
        positive = (positive_score > 0).astype(np.int64)
        label = labels[to_host(positive)] if labels.dtype == object else positive
        mirrored = not len(base) == 1  # onnxruntime: writes one score only otherwise
    if some_pair:
        read1 = xp.where(h1, s1, 0)
        both = post_transform_scores(xp, xp.stack([read0, read1], axis=1).astype(np.float32),
                                     post_transform)
        if bool(pair.all()):
            return label, both.astype(np.float32, copy=False)
    single = _single_score_columns(xp, read0.astype(np.float32), post_transform, mirrored,
                                   binary_case)
    scores = xp.where(pair[:, None], both, single) if some_pair else single
    return label, scores.astype(np.float32, copy=False)


def _single_score_columns(xp, s, post_transform, mirrored, binary_case):
    """The two columns onnxruntime derives from one binary score s (see _two_classes);
    NaN marks the column it leaves unwritten."""
    name = _name(post_transform)
    if name == "PROBIT":
        return xp.stack([_probit(xp, s), _unwritten(xp, s)], axis=1)
    if not binary_case and not mirrored:
        return xp.stack([s, _unwritten(xp, s)], axis=1)
    if name == "LOGISTIC":
        return _logistic(xp, xp.stack([-s, s], axis=1))
    if mirrored:
        return xp.stack([-s, s], axis=1)
    return xp.stack([1 - s, s], axis=1)


def _unwritten(xp, s):
    return xp.full(s.shape, np.nan, dtype=np.float32)


def _logistic(xp, s):
    return (1 / (1 + xp.exp(-s))).astype(np.float32)


def _name(post_transform) -> str:
    return post_transform.decode() if isinstance(post_transform, bytes) else post_transform


# -- regressors ---------------------------------------------------------------------------

@op("TreeEnsembleRegressor", since=3, domain=ML, dtypes=_NUMBERS)
@op("TreeEnsembleRegressor", since=1, domain=ML, dtypes=_NUMBERS)
def tree_ensemble_regressor(xp, X, *, aggregate_function="SUM", base_values=None,
                            base_values_as_tensor=None, n_targets=None, nodes_falsenodeids=None,
                            nodes_featureids=None, nodes_hitrates=None,
                            nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None,
                            nodes_modes=None, nodes_nodeids=None, nodes_treeids=None,
                            nodes_truenodeids=None, nodes_values=None,
                            nodes_values_as_tensor=None, post_transform="NONE", target_ids=None,
                            target_nodeids=None, target_treeids=None, target_weights=None,
                            target_weights_as_tensor=None, _node=None):
    """Version 1 has no *_as_tensor attributes; accepting them is harmless, the binder only
    rejects attributes a kernel does not take. Scores are summed in float64."""
    def build():
        outputs = int(n_targets) if n_targets is not None else int(max(target_ids)) + 1
        forest = _forest_from_node_ids(
            treeids=nodes_treeids, nodeids=nodes_nodeids, featureids=nodes_featureids,
            modes=nodes_modes, values=_either(nodes_values, nodes_values_as_tensor),
            truenodeids=nodes_truenodeids, falsenodeids=nodes_falsenodeids,
            missing_tracks_true=nodes_missing_value_tracks_true, leaf_treeids=target_treeids,
            leaf_nodeids=target_nodeids, leaf_ids=target_ids,
            leaf_weights=_either(target_weights, target_weights_as_tensor), n_outputs=outputs)
        base = _either(base_values, base_values_as_tensor)
        return _Regressor(forest, _aggregate_name(aggregate_function),
                          None if base is None else np.asarray(base, dtype=np.float64),
                          post_transform)

    return prepared(_node, build).run(xp, X)


class _Regressor:
    """A TreeEnsembleRegressor node's forest and checked attributes."""

    def __init__(self, forest, function: str, base, post_transform):
        self.forest, self.function, self.base = forest, function, base
        self.post_transform = post_transform
        self.request = False  # ops/ml/tree_requests.py: None where it cannot answer

    def run(self, xp, X):
        request = self.request
        if request and X.__class__ is np.ndarray:
            answer = request(X)  # None: not rows it takes as they are
            if answer is not None:
                return answer
        rows = _rows(X)
        if request is False and xp is np:
            kernels = self.forest._kernels(xp, rows)
            if kernels is not None:
                self.request = regressor_request(kernels, self)
        scores = self.forest.aggregate_rows(xp, rows, self.function)
        if self.base is not None:
            scores = scores + xp.asarray(self.base)
        return post_transform_scores(xp, scores, self.post_transform).astype(np.float32)


@binds(tree_ensemble_classifier.fn, tree_ensemble_regressor.fn, feeds=True, fresh=True,
       silent=True)
def bind_tree_request(args, out, attributes):
    """The node's request path (ops/ml/tree_requests.py) where it takes these rows: what it
    checks of them is fixed for the bound call (the dtype, shape and layout of a bound run's
    inputs; the tier, by the bound list's key), so the call is its answer alone, without the
    node's dispatch to the model and the request's checks. Rows of that kind past the
    request's one call get its ``any_rows``: the run in progress says how they are walked."""
    (X,), model = args, (attributes.get("_node") or {}).get("model")
    request = getattr(model, "request", None)
    if not request or X.__class__ is not np.ndarray:
        return None
    if request.takes(X):
        return request.answer
    # more rows than it answers in one call in every run: answered as the run goes (in one
    # call where the run leaves the workers asleep, else split), still a bound call
    return request.any_rows if request.takes_any_count(X) else None


@tree_ensemble_regressor.infer
def _(X, *, n_targets=None, target_ids=None, **_):
    if n_targets is None and target_ids is not None:
        n_targets = int(max(target_ids)) + 1
    batch = X.shape[0] if X.shape is not None and len(X.shape) > 1 else None
    return [tensor(np.float32, (batch, n_targets))]

