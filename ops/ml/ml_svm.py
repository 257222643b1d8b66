"""SVMClassifier and SVMRegressor (``ai.onnx.ml`` opset 1): scikit-learn's SVC, NuSVC, SVR,
NuSVR and OneClassSVM as skl2onnx converts them.

Everything is computed in float32, as onnxruntime does (its kernels cast any input to float
first), with the one-vs-one decision values summed in float64 as it sums them, so a vote on
the boundary goes the same way. Where onnxruntime departs from the spec's text, the outputs
follow onnxruntime (users compare with it); each departure is marked "onnxruntime:".
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.ir.node_state import cached as _cached
from mixrt.ops.ml.ml import _NUMBERS, ML, _probit, _rows, post_transform_scores
from mixrt.ops.ml.ml_trees import _check_post_transform, _name, class_labels, label_values
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import tensor

_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")
# rows of the RBF kernel computed at once: bounds the [rows, vectors, features] difference
_RBF_ELEMENTS = 1 << 22


@op("SVMClassifier", since=1, domain=ML, dtypes=_NUMBERS)
def svm_classifier(xp, X, *, classlabels_ints=None, classlabels_strings=None,
                   coefficients=None, kernel_params=None, kernel_type="LINEAR",
                   post_transform="NONE", prob_a=None, prob_b=None, rho=None,
                   support_vectors=None, vectors_per_class=None, _node=None):
    """(label [N], scores). Support vectors given (libsvm's SVC): one-vs-one decision values
    vote for the label, and the scores are the decision values [N, pairs] ([N, 2] for two
    classes), or with prob_a/prob_b, class probabilities [N, classes] from Platt-scaled
    pairwise probabilities coupled as libsvm couples them. No support vectors (liblinear):
    one linear score per class, the label the best one."""
    model = _cached(_node, lambda: _Classifier(
        classlabels_ints=classlabels_ints, classlabels_strings=classlabels_strings,
        coefficients=coefficients, kernel_params=kernel_params, kernel_type=kernel_type,
        post_transform=post_transform, prob_a=prob_a, prob_b=prob_b, rho=rho,
        support_vectors=support_vectors, vectors_per_class=vectors_per_class))
    rows = _rows(X).astype(np.float32)
    labels, post_transform = model.labels, model.post_transform
    if model.vectors is None:
        return _linear_classifier(xp, rows, labels, model.coefficients, model.rho,
                                  post_transform, have_proba=bool(len(model.prob_a)))
    if rows.shape[1] != model.vectors.shape[1]:
        raise ValueError(f"support_vectors has {model.vectors.size} values, not "
                         f"{len(model.vectors)} vectors of the input's {rows.shape[1]} "
                         f"features")
    compiled = _compiled(xp) if rows.flags.c_contiguous else None
    if compiled is not None:
        decisions, votes = model.compiled_one_vs_one(compiled, rows)
    else:
        kernels = _kernel_matrix(xp, rows, xp.asarray(model.vectors), model.kernel)
        decisions, votes = _one_vs_one(xp, kernels, model, len(labels))
    label = label_values(xp, labels, xp.argmax(votes, axis=1))  # the first of tied classes
    if len(model.prob_a):
        if compiled is not None:
            probabilities = model.compiled_probabilities(compiled, decisions)
        else:
            probabilities = _coupled_probabilities(xp, decisions, model.prob_a, model.prob_b,
                                                   len(labels))
        return label, post_transform_scores(xp, probabilities, post_transform).astype(np.float32)
    if model.pairs > 1:
        return label, post_transform_scores(xp, decisions, post_transform).astype(np.float32)
    return label, _binary_decision_columns(xp, decisions[:, 0], post_transform)


class _Classifier:
    """An SVMClassifier's attributes checked and converted once: a session's node keeps one
    (``_node``), so a run reads arrays instead of converting long attribute lists."""

    def __init__(self, *, classlabels_ints, classlabels_strings, coefficients, kernel_params,
                 kernel_type, post_transform, prob_a, prob_b, rho, support_vectors,
                 vectors_per_class):
        self.labels = class_labels(classlabels_ints, classlabels_strings)
        _check_post_transform(post_transform)
        self.post_transform = post_transform
        self.kernel = _kernel_spec(kernel_type, kernel_params)
        self.coefficients = _floats("coefficients", coefficients, required=True)
        self.rho = _floats("rho", rho, required=True)
        self.prob_a, self.prob_b = _floats("prob_a", prob_a), _floats("prob_b", prob_b)
        if len(self.prob_a) != len(self.prob_b):
            raise ValueError(f"prob_a has {len(self.prob_a)} values but prob_b has "
                             f"{len(self.prob_b)}")
        counts = np.asarray(vectors_per_class if vectors_per_class is not None else [],
                            np.int64)
        classes = len(self.labels)
        self.pairs = classes * (classes - 1) // 2
        self.vectors = None
        if counts.sum() == 0:
            return
        _check_svc(self.labels, counts, self.coefficients, self.rho, self.prob_a, self.pairs)
        values = _floats("support_vectors", support_vectors)
        if len(values) % int(counts.sum()):
            raise ValueError(f"support_vectors has {len(values)} values, not a whole number "
                             f"of {int(counts.sum())} vectors")
        self.vectors = values.reshape(int(counts.sum()), -1)
        # ops/ml/_jit_svm.one_vs_one reads the vectors a feature at a time: [F, V]
        self.by_feature = np.ascontiguousarray(self.vectors.T)
        self.pair_weights, self.first_of_pair, self.second_of_pair = _pair_weights(
            counts, self.coefficients, classes)
        # what ops/ml/_jit_svm.one_vs_one reads: each class's first vector and count, and the
        # dual coefficients [classes - 1, vectors]
        self.counts = counts
        self.starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.dual = np.ascontiguousarray(
            self.coefficients[:(classes - 1) * len(self.vectors)].reshape(classes - 1, -1))

    def compiled_one_vs_one(self, kernels, rows):
        """_kernel_matrix and _one_vs_one's (decisions, votes) by ops/ml/_jit_svm.py."""
        name, gamma, coef0, degree = self.kernel
        decisions = np.empty((rows.shape[0], self.pairs), np.float32)
        votes = np.empty((rows.shape[0], len(self.labels)), np.int64)
        kernels.one_vs_one(rows, self.by_feature, _KERNELS.index(name), gamma, coef0, degree,
                           self.starts, self.counts, self.dual, self.rho,
                           np.empty(len(self.vectors), np.float32), decisions, votes)
        return decisions, votes

    def compiled_probabilities(self, kernels, decisions):
        """_coupled_probabilities by ops/ml/_jit_svm.py."""
        classes = len(self.labels)
        q = np.empty((decisions.shape[0], classes, classes), np.float32)
        p = np.empty((decisions.shape[0], classes), np.float32)
        kernels.coupled_probabilities(decisions, self.prob_a, self.prob_b, q, p)
        return p


@svm_classifier.infer
def _(X, *, classlabels_ints=None, classlabels_strings=None, vectors_per_class=None,
      prob_a=None, **_):
    batch = (X.shape[0] if len(X.shape) > 1 else 1) if X.shape is not None else None
    classes = len(classlabels_strings if classlabels_strings is not None else
                  classlabels_ints or [])
    width = classes
    if vectors_per_class is not None and sum(vectors_per_class) > 0 and not prob_a:
        width = classes * (classes - 1) // 2 if classes > 2 else 2
    label = object if classlabels_strings is not None else np.int64
    return [tensor(label, (batch,)), tensor(np.float32, (batch, width))]


@op("SVMRegressor", since=1, domain=ML, dtypes=_NUMBERS)
def svm_regressor(xp, X, *, coefficients=None, kernel_params=None, kernel_type="LINEAR",
                  n_supports=0, one_class=0, post_transform="NONE", rho=None,
                  support_vectors=None):
    """[N, 1]: sum_v coefficient_v * K(x, vector_v) + rho[0] (n_supports > 0), else
    x . coefficients + rho[0]; one_class makes it the sign, +1 or -1.

    onnxruntime: post_transform is accepted but not applied (onnx's reference implements
    only NONE), so it is checked and then ignored here too."""
    _check_post_transform(post_transform)
    kernel = _kernel_spec(kernel_type, kernel_params)
    coefficients = _floats("coefficients", coefficients, required=True)
    rho = _floats("rho", rho, required=True)
    rows = _rows(X).astype(np.float32)
    if n_supports > 0:
        if len(coefficients) < n_supports:
            raise ValueError(f"coefficients has {len(coefficients)} values for n_supports="
                             f"{n_supports} support vectors")
        vectors = _support_vectors(support_vectors, int(n_supports), rows.shape[1])
        kernels = _kernel_matrix(xp, rows, xp.asarray(vectors), kernel)
        scores = kernels @ xp.asarray(coefficients[:n_supports]) + rho[0]
    else:  # liblinear: the coefficients are the weights, the kernel plays no part
        if len(coefficients) != rows.shape[1]:
            raise ValueError(f"coefficients has {len(coefficients)} values for "
                             f"{rows.shape[1]} features")
        scores = rows @ xp.asarray(coefficients) + rho[0]
    if one_class:
        scores = xp.where(scores > 0, np.float32(1), np.float32(-1))
    return scores.astype(np.float32).reshape(-1, 1)


@svm_regressor.infer
def _(X, **_):
    batch = (X.shape[0] if len(X.shape) > 1 else 1) if X.shape is not None else None
    return [tensor(np.float32, (batch, 1))]


# -- attributes ---------------------------------------------------------------------------

def _floats(name: str, values, required: bool = False) -> np.ndarray:
    array = np.asarray(values if values is not None else [], np.float32).reshape(-1)
    if required and not len(array):
        raise ValueError(f"{name} is required and must not be empty")
    return array


def _kernel_spec(kernel_type, kernel_params) -> tuple:
    """(kernel name, gamma, coef0, degree); absent kernel_params are zeros, as onnxruntime
    reads them."""
    name = _name(kernel_type)
    if name not in _KERNELS:
        raise ValueError(f"kernel_type must be one of {', '.join(_KERNELS)}, got "
                         f"{kernel_type!r}")
    params = _floats("kernel_params", kernel_params)
    if len(params) not in (0, 3):
        raise ValueError(f"kernel_params must hold gamma, coef0 and degree; got "
                         f"{len(params)} value(s)")
    gamma, coef0, degree = params if len(params) else np.zeros(3, np.float32)
    return name, gamma, coef0, degree


def _check_svc(labels, counts, coefficients, rho, prob_a, pairs) -> None:
    if len(counts) != len(labels):
        raise ValueError(f"vectors_per_class has {len(counts)} entries for {len(labels)} "
                         f"classes")
    if len(labels) < 2:
        raise ValueError("an SVMClassifier with support vectors needs at least two classes")
    vectors = int(counts.sum())
    if len(coefficients) < (len(labels) - 1) * vectors:
        raise ValueError(f"coefficients has {len(coefficients)} values; {len(labels)} "
                         f"classes and {vectors} support vectors take "
                         f"{(len(labels) - 1) * vectors}")
    if len(rho) < pairs:
        raise ValueError(f"rho has {len(rho)} values; {len(labels)} classes take {pairs}")
    if len(prob_a) and len(prob_a) < pairs:
        raise ValueError(f"prob_a has {len(prob_a)} values; {len(labels)} classes take "
                         f"{pairs}")


def _support_vectors(support_vectors, count: int, features: int) -> np.ndarray:
    vectors = _floats("support_vectors", support_vectors)
    if len(vectors) != count * features:
        raise ValueError(f"support_vectors has {len(vectors)} values, not {count} vectors "
                         f"of the input's {features} features")
    return vectors.reshape(count, features)


# -- kernels and decisions ----------------------------------------------------------------

def _kernel_matrix(xp, rows, vectors, kernel):
    """K(row, vector) for every pair, [N, vectors], in float32."""
    name, gamma, coef0, degree = kernel
    if name == "RBF":
        return _rbf(xp, rows, vectors, gamma)
    dot = rows @ vectors.T
    if name == "LINEAR":
        return dot
    dot = gamma * dot + coef0
    if name == "POLY":
        return dot ** degree
    return xp.tanh(dot)  # SIGMOID


def _rbf(xp, rows, vectors, gamma):
    """exp(-gamma |row - vector|^2) from the differences themselves (not |a|^2 + |b|^2 -
    2 a.b, whose cancellation onnxruntime's results do not have), a slab of rows at a time."""
    step = max(1, _RBF_ELEMENTS // max(1, vectors.shape[0] * vectors.shape[1]))
    slabs = []
    for start in range(0, rows.shape[0], step):
        difference = rows[start:start + step, None, :] - vectors[None, :, :]
        slabs.append(xp.exp(-gamma * (difference * difference).sum(axis=2)))
    if not slabs:
        return xp.zeros((0, vectors.shape[0]), np.float32)
    return xp.concatenate(slabs, axis=0).astype(np.float32)


def _pair_weights(counts, coefficients, classes: int):
    """For every class pair i < j (libsvm's order), the dual coefficients that weigh each
    support vector in its decision value [pairs, 2, vectors]: row 0 holds class i's vectors
    weighted by their coefficients against j, row 1 class j's against i, zeros elsewhere.
    Also each pair's first and second class, one-hot [pairs, classes] (a row of wins times
    them counts votes)."""
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    vectors = int(counts.sum())
    dual = coefficients[:(classes - 1) * vectors].reshape(classes - 1, vectors)
    pairs = [(i, j) for i in range(classes - 1) for j in range(i + 1, classes)]
    weights = np.zeros((len(pairs), 2, vectors), np.float32)
    for pair, (i, j) in enumerate(pairs):
        mine = slice(starts[i], starts[i] + counts[i])
        theirs = slice(starts[j], starts[j] + counts[j])
        weights[pair, 0, mine] = dual[j - 1, mine]
        weights[pair, 1, theirs] = dual[i, theirs]
    first, second = (np.eye(classes, dtype=np.int64)[list(side)] for side in zip(*pairs))
    return weights, first, second


# rows of products [rows, pairs, 2, vectors] formed at once in _one_vs_one
_PRODUCT_ELEMENTS = 1 << 22


def _one_vs_one(xp, kernels, model, classes: int):
    """libsvm's decision value of every class pair i < j, [N, pairs] float32, and each
    class's votes [N, classes] (i wins a pair when its value is > 0, else j). Products are
    float32, the sums over each class's vectors float64, as onnxruntime sums them (the
    zero weights of the other classes add nothing)."""
    weights = xp.asarray(model.pair_weights)
    step = max(1, _PRODUCT_ELEMENTS // max(1, weights.size))
    totals = []
    for start in range(0, kernels.shape[0], step):
        products = kernels[start:start + step, None, None, :] * weights[None]
        sides = products.astype(np.float64).sum(axis=3)
        totals.append(sides[:, :, 0] + sides[:, :, 1] + model.rho[:model.pairs]
                      .astype(np.float64))
    total = xp.concatenate(totals, axis=0) if totals else xp.zeros((0, model.pairs))
    first_wins = (total > 0).astype(np.int64)
    votes = (first_wins @ xp.asarray(model.first_of_pair)
             + (1 - first_wins) @ xp.asarray(model.second_of_pair))
    return total.astype(np.float32), votes


def _binary_decision_columns(xp, decision, post_transform):
    """Two classes without probabilities: onnxruntime writes the decision value d as
    [-d, d] (post_transform NONE), [logistic(-d), logistic(d)] (LOGISTIC) or [1 - d, d]
    (SOFTMAX, SOFTMAX_ZERO: not applied), and under PROBIT only probit(d) in the first
    column (NaN marks the second, which it leaves unwritten)."""
    name = _name(post_transform)
    if name == "PROBIT":
        second = xp.full(decision.shape, np.nan, dtype=np.float32)
        return xp.stack([_probit(xp, decision), second], axis=1).astype(np.float32)
    if name == "LOGISTIC":
        return xp.stack([_logistic(xp, -decision), _logistic(xp, decision)], axis=1)
    first = -decision if name == "NONE" else 1 - decision
    return xp.stack([first, decision], axis=1).astype(np.float32)


def _linear_classifier(xp, rows, labels, coefficients, rho, post_transform, have_proba):
    """liblinear's form: score_c = x . w_c + rho[0] (one intercept for all classes, as
    onnxruntime reads rho)."""
    classes = len(labels)
    if len(coefficients) % classes or len(coefficients) // classes != rows.shape[1]:
        raise ValueError(f"coefficients has {len(coefficients)} values, not {classes} "
                         f"classes x {rows.shape[1]} features")
    weights = xp.asarray(coefficients.reshape(classes, -1))
    scores = (rows @ weights.T + rho[0]).astype(np.float32)
    best = xp.argmax(scores, axis=1)
    if classes == 2 and not have_proba:
        # onnxruntime: the second class also wins when the best score is >= 0.5 with all
        # weights non-negative, or > 0 with some negative
        top = scores.max(axis=1)
        positive = bool((coefficients >= 0).all())
        second = (top >= 0.5) if positive else (top > 0)
        best = xp.where(second, 1, best)
    label = label_values(xp, labels, best)
    if classes == 1:
        return label, (_probit(xp, scores) if _name(post_transform) == "PROBIT" else scores)
    return label, post_transform_scores(xp, scores, post_transform).astype(np.float32)


# -- probabilities ------------------------------------------------------------------------

def _coupled_probabilities(xp, decisions, prob_a, prob_b, classes: int):
    """Class probabilities [N, classes]: each pair's decision value through its Platt
    sigmoid (clipped to [1e-7, 1 - 1e-7]), coupled by libsvm's iterative method (Wu, Lin and
    Weng 2004) in float32 as onnxruntime runs it, every row at once."""
    pairs = decisions.shape[1]
    value = decisions * prob_a[:pairs] + prob_b[:pairs]
    probability = xp.clip(1 - _logistic(xp, value), np.float32(1e-7), np.float32(1 - 1e-7))
    first, second = np.triu_indices(classes, 1)  # libsvm's pair order: (0,1), (0,2), ...
    r = xp.zeros((decisions.shape[0], classes, classes), np.float32)
    r[:, first, second] = probability
    r[:, second, first] = 1 - probability
    return _couple(xp, r, classes)


def _logistic(xp, value):
    """onnxruntime's ComputeLogistic, computed from -|v| so exp never overflows."""
    v = (1 / (1 + xp.exp(-xp.abs(value)))).astype(np.float32)
    return xp.where(value < 0, 1 - v, v)


def _couple(xp, r, k: int):
    """Solve min_p p'Qp, sum p = 1 with Q[t,t] = sum_{j != t} r[j,t]^2 and Q[t,j] =
    -r[j,t] r[t,j], by libsvm's coordinate updates: at most 100 sweeps, a row stopping once
    every |(Qp)_t - p'Qp| < 0.005 / k (rows that stopped keep their p)."""
    rows = r.shape[0]
    q = -(xp.swapaxes(r, 1, 2) * r)  # Q[t, j] = -r[j, t] r[t, j]
    diagonal = xp.zeros((rows, k), np.float32)
    squares = r * r
    for j in range(k):  # Q[t, t] summed over j in order (r[t, t] is 0, adding nothing)
        diagonal = diagonal + squares[:, j, :]
    index = np.arange(k)
    q[:, index, index] = diagonal
    p = xp.full((rows, k), np.float32(1) / np.float32(k), dtype=np.float32)
    kernels = _compiled(xp)
    if kernels is not None:
        kernels.couple(np.ascontiguousarray(q), p)
        return p
    eps = np.float32(0.005) / np.float32(k)
    running = xp.ones(rows, dtype=bool)
    for _ in range(100):
        qp = _sequential_dot(q, p, k)
        pqp = _sequential_sum(p * qp, k)
        error = xp.abs(qp - pqp[:, None]).max(axis=1)
        running = running & ~(error < eps)
        if not bool(running.any()):
            break
        p = xp.where(running[:, None], _sweep(xp, q, p, qp, pqp, k), p)
    return p




def _compiled(xp):
    """ops/ml/_jit_svm.py where it may run (host arrays, the compiled tier on), else None."""
    # an inner step's compiled loop on host arrays, not the op's kernel: the steps around it
    # are the same on every device
    if xp is not np or not jit_cpu.enabled():
        return None
    return jit_cpu.load("mixrt.ops.ml._jit_svm")


def _sweep(xp, q, p, qp, pqp, k: int):
    """One pass of coordinate updates over t = 0..k-1 (each reuses the previous ones)."""
    p, qp = p.copy(), qp.copy()
    for t in range(k):
        diff = (-qp[:, t] + pqp) / q[:, t, t]
        p[:, t] += diff
        scale = (1 + diff)[:, None]
        pqp = (pqp + diff * (diff * q[:, t, t] + 2 * qp[:, t])) / (1 + diff) / (1 + diff)
        qp = (qp + diff[:, None] * q[:, t, :]) / scale
        p = p / scale
    return p


def _sequential_dot(q, p, k: int):
    """Q p row by row, each sum accumulated left to right in float32 (onnxruntime's order:
    the stopping test compares against a small eps, so the rounding should agree)."""
    total = q[:, :, 0] * p[:, None, 0]
    for j in range(1, k):
        total = total + q[:, :, j] * p[:, None, j]
    return total


def _sequential_sum(values, k: int):
    total = values[:, 0]
    for j in range(1, k):
        total = total + values[:, j]
    return total
