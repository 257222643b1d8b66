"""Traditional-ML operators of the ``ai.onnx.ml`` domain (the opsets of that domain, not the
default one): label encoding, tree ensembles and the small feature transforms sklearn
converters emit.

String tensors are NumPy object arrays, so a kernel that reads or writes strings works on the
host; numeric paths use ``xp``.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.ir.node_state import cached as _cached
from mixrt.ops.ir.node_state import prepared
from mixrt.ops.compiled.parallel import parallel_for, row_parts
from mixrt.ops.ir.registry import op
from mixrt.ops.device import to_host
from mixrt.ops.ir.types import TensorType, same_as_input, tensor

ML = "ai.onnx.ml"
_NUMBERS = frozenset({"float32", "float64", "int64", "int32"})


# -- LabelEncoder -----------------------------------------------------------------------

def _encode(xp, X, keys, values, default):
    """Map each element of X through keys -> values (the last of repeated keys wins; a NaN
    key matches any NaN); elements without a key become ``default``."""
    keys, values = np.asarray(keys), np.asarray(values)
    if X.dtype == object or values.dtype == object:
        return _encode_on_host(xp, X, keys, values, default)
    last = len(keys) - 1 - np.unique(keys[::-1], return_index=True)[1]  # sorted by key
    sorted_keys, sorted_values = xp.asarray(keys[last]), xp.asarray(values[last])
    data = X.astype(sorted_keys.dtype) if X.dtype != sorted_keys.dtype else X
    if not len(last):
        return xp.full(X.shape, default, dtype=values.dtype)
    at = xp.clip(xp.searchsorted(sorted_keys, data), 0, len(last) - 1)
    found = sorted_keys[at] == data
    fill = xp.asarray(default, dtype=values.dtype)
    out = xp.where(found, sorted_values[at], fill)
    nan_keys = np.flatnonzero(np.isnan(keys)) if keys.dtype.kind == "f" else []
    if len(nan_keys):
        out = xp.where(xp.isnan(data), xp.asarray(values[nan_keys[-1]]), out)
    return out.astype(values.dtype, copy=False)


def _encode_on_host(xp, X, keys, values, default):
    data = to_host(X)
    if keys.dtype.kind == "f":  # compare numbers as the keys' type, as the numeric path does
        data = data.astype(keys.dtype)
    table = dict(zip(keys.tolist(), values.tolist()))
    nan_value = next((v for k, v in zip(keys.tolist()[::-1], values.tolist()[::-1])
                      if isinstance(k, float) and k != k), None)
    mapped = [nan_value if nan_value is not None and isinstance(x, float) and x != x
              else table.get(x, default) for x in data.reshape(-1).tolist()]
    out = np.empty(len(mapped), dtype=values.dtype)
    out[:] = mapped
    out = out.reshape(data.shape)
    return out if out.dtype == object else xp.asarray(out)


def _pick(kind: str, **candidates):
    """The one ``keys_*``/``values_*`` attribute that is set, as an array."""
    chosen = [(name, v) for name, v in candidates.items() if v is not None]
    if len(chosen) != 1:
        raise ValueError(f"LabelEncoder needs exactly one of {', '.join(candidates)}; "
                         f"got {[name for name, _ in chosen] or 'none'}")
    name, value = chosen[0]
    dtypes = {"strings": object, "int64s": np.int64, "floats": np.float32}
    suffix = name.rsplit("_", 1)[1]
    return np.asarray(value) if suffix == "tensor" else np.asarray(value, dtype=dtypes[suffix])


def _default_for(values: np.ndarray, default_float, default_int64, default_string):
    if values.dtype == object:
        return default_string
    if values.dtype.kind == "f":
        return default_float
    return default_int64


@op("LabelEncoder", since=4, domain=ML)
def label_encoder_4(xp, X, *, default_float=-0.0, default_int64=-1, default_string="_Unused",
                    default_tensor=None, keys_floats=None, keys_int64s=None, keys_strings=None,
                    keys_tensor=None, values_floats=None, values_int64s=None,
                    values_strings=None, values_tensor=None):
    keys = _pick("keys", keys_floats=keys_floats, keys_int64s=keys_int64s,
                 keys_strings=keys_strings, keys_tensor=keys_tensor)
    values = _pick("values", values_floats=values_floats, values_int64s=values_int64s,
                   values_strings=values_strings, values_tensor=values_tensor)
    if default_tensor is not None:
        default = np.asarray(default_tensor).reshape(-1)[0]
    elif values_tensor is not None:  # the spec's per-type defaults for a values tensor
        default = "_Unused" if values.dtype == object else -0.0 if values.dtype.kind == "f" else -1
    else:
        default = _default_for(values, default_float, default_int64, default_string)
    return _encode(xp, X, keys, values, default)


@op("LabelEncoder", since=2, domain=ML)
def label_encoder_2(xp, X, *, default_float=-0.0, default_int64=-1, default_string="_Unused",
                    keys_floats=None, keys_int64s=None, keys_strings=None, values_floats=None,
                    values_int64s=None, values_strings=None):
    keys = _pick("keys", keys_floats=keys_floats, keys_int64s=keys_int64s,
                 keys_strings=keys_strings)
    values = _pick("values", values_floats=values_floats, values_int64s=values_int64s,
                   values_strings=values_strings)
    return _encode(xp, X, keys, values,
                   _default_for(values, default_float, default_int64, default_string))


@op("LabelEncoder", since=1, domain=ML)
def label_encoder_1(xp, X, *, classes_strings=None, default_int64=-1, default_string="_Unused"):
    """Version 1 maps strings to their position in classes_strings, or positions back."""
    classes = np.asarray(classes_strings or [], dtype=object)
    positions = np.arange(len(classes), dtype=np.int64)
    if X.dtype == object:
        return _encode(xp, X, classes, positions, default_int64)
    return _encode(xp, X, positions, classes, default_string)


def _label_encoder_type(X, *, values_floats=None, values_int64s=None, values_strings=None,
                        values_tensor=None, classes_strings=None, **_):
    if classes_strings is not None:
        dtype = np.int64 if X.dtype == np.dtype(object) else object
    elif values_tensor is not None:
        dtype = np.asarray(values_tensor).dtype
    else:
        dtype = (object if values_strings is not None else
                 np.int64 if values_int64s is not None else np.float32)
    return [tensor(dtype, X.shape)]


for _kernel in (label_encoder_1, label_encoder_2, label_encoder_4):
    _kernel.infer(_label_encoder_type)



@op("CategoryMapper", since=1, domain=ML)
def category_mapper(xp, X, *, cats_int64s=None, cats_strings=None, default_int64=-1,
                    default_string="_Unused"):
    """strings -> int64 or int64 -> strings through the parallel cats_* lists."""
    strings = np.asarray(cats_strings or [], dtype=object)
    ints = np.asarray(cats_int64s or [], dtype=np.int64)
    if X.dtype == object:
        return _encode(xp, X, strings, ints, default_int64)
    return _encode(xp, X, ints, strings, default_string)


@category_mapper.infer
def _(X, **_):
    return [tensor(np.int64 if X.dtype == np.dtype(object) else object, X.shape)]

# -- small feature transforms -----------------------------------------------------------

@op("Binarizer", since=1, domain=ML, dtypes=FLOATS | frozenset({"int64", "int32"}))
def binarizer(xp, X, *, threshold=0.0):
    return (X > threshold).astype(X.dtype)


binarizer.infer(same_as_input)


@op("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(xp, X, Y):
    """Select Y's indices along the last axis; a 1-D X is treated as one row, [1, len(Y)]."""
    indices = Y.reshape(-1)
    if X.dtype == object:
        picked = np.take(X, to_host(indices), axis=-1)
    else:
        picked = xp.take(X, indices, axis=-1)
    return picked.reshape(1, -1) if X.ndim == 1 else picked


@array_feature_extractor.infer
def _(X, Y, **_):
    count = None if Y.shape is None or None in Y.shape else int(np.prod(Y.shape))
    if X.shape is None:
        return [TensorType(X.dtype, None)]
    return [TensorType(X.dtype, (1, count) if len(X.shape) == 1 else (*X.shape[:-1], count))]


def _rows(X):
    """ML ops see [C] as a single row [1, C]."""
    return X.reshape(1, -1) if X.ndim == 1 else X


@op("Normalizer", since=1, domain=ML, dtypes=_NUMBERS)
def normalizer(xp, X, *, norm="MAX"):
    if norm not in _NORMS:
        raise ValueError(f"Normalizer norm must be one of MAX, L1, L2, got {norm!r}")
    rows = _rows(X).astype(np.float32)
    kernels = _ml_kernels(xp, rows)
    if kernels is not None:
        kernels.normalize_rows(rows, _NORMS.index(norm), rows)  # rows is the op's own copy
        return rows.reshape(X.shape)
    if norm == "MAX":
        scale = rows.max(axis=1, keepdims=True)
    elif norm == "L1":
        scale = xp.abs(rows).sum(axis=1, keepdims=True)
    else:
        scale = xp.sqrt((rows * rows).sum(axis=1, keepdims=True))
    # onnxruntime leaves a row whose norm is 0 as it is (an empty document's tf-idf row)
    scale = xp.where(scale == 0, np.float32(1), scale)
    return (rows / scale).reshape(X.shape)


_NORMS = ("MAX", "L1", "L2")  # ops/ml/_jit_ml.py's codes


def _ml_kernels(xp, rows):
    """ops/ml/_jit_ml.py for float32 rows [N, F] (F > 0, contiguous) on the host with the
    compiled tier on, else None."""
    if xp is not np or rows.dtype != np.float32 or not rows.shape[1] \
            or not rows.flags.c_contiguous or not jit_cpu.enabled():
        return None
    return jit_cpu.load("mixrt.ops.ml._jit_ml")


def _float32_like_input(X, *_, **__):
    return [tensor(np.float32, X.shape)]


normalizer.infer(_float32_like_input)


@op("Scaler", since=1, domain=ML, dtypes=_NUMBERS)
def scaler(xp, X, *, offset=None, scale=None, _node=None):
    return prepared(_node, lambda: _Scaler(offset, scale)).run(xp, X)


class _Scaler:
    def __init__(self, offset, scale):
        self.offset = np.asarray(offset if offset is not None else [0.0], dtype=np.float32)
        self.scale = np.asarray(scale if scale is not None else [1.0], dtype=np.float32)

    def run(self, xp, X):
        rows = _rows(X).astype(np.float32, copy=False)
        width = rows.shape[1]
        kernels = _ml_kernels(xp, rows)
        if kernels is not None and (len(self.offset) == width or len(self.offset) == 1) \
                and (len(self.scale) == width or len(self.scale) == 1):
            out = np.empty(rows.shape, np.float32)
            kernels.scale_columns(rows, self.offset, self.scale, out)
            return out.reshape(X.shape)
        return (X.astype(np.float32, copy=False) - xp.asarray(self.offset)) \
            * xp.asarray(self.scale)


scaler.infer(_float32_like_input)


@op("OneHotEncoder", since=1, domain=ML)
def one_hot_encoder(xp, X, *, cats_int64s=None, cats_strings=None, zeros=1):
    if (cats_int64s is None) == (cats_strings is None):
        raise ValueError("OneHotEncoder needs exactly one of cats_int64s and cats_strings")
    if cats_strings is not None:
        data = to_host(X)
        cats = np.asarray(cats_strings, dtype=object)
        hits = xp.asarray(data[..., None] == cats[None, :])
    else:
        hits = X.astype(np.int64)[..., None] == xp.asarray(cats_int64s, dtype=np.int64)
    if not zeros and not bool(hits.any(axis=-1).all()):
        raise ValueError("OneHotEncoder: an input value is not among the categories and "
                         "zeros=0 forbids an all-zero row")
    return hits.astype(np.float32)


@one_hot_encoder.infer
def _(X, *, cats_int64s=None, cats_strings=None, **_):
    count = len(cats_int64s if cats_int64s is not None else cats_strings or [])
    return [tensor(np.float32, None if X.shape is None else (*X.shape, count))]


@op("Imputer", since=1, domain=ML, dtypes=frozenset({"float32", "float64", "int64", "int32"}))
def imputer(xp, X, *, imputed_value_floats=None, imputed_value_int64s=None,
            replaced_value_float=0.0, replaced_value_int64=0):
    if X.dtype.kind == "f":
        imputed = xp.asarray(imputed_value_floats, dtype=X.dtype)
        missing = (xp.isnan(X) if np.isnan(replaced_value_float)
                   else X == X.dtype.type(replaced_value_float))
    else:
        imputed = xp.asarray(imputed_value_int64s, dtype=X.dtype)
        missing = X == replaced_value_int64
    return xp.where(missing, imputed, X)  # one value, or one per column (the last axis)


imputer.infer(same_as_input)


@op("FeatureVectorizer", since=1, domain=ML)
def feature_vectorizer(xp, *X, inputdimensions=None):
    """Concatenate inputs as float32 columns; each contributes exactly inputdimensions[i]
    columns (truncated or zero-padded)."""
    dims = list(inputdimensions or [])
    parts = []
    for x, width in zip(X, dims):
        cols = _rows(x).astype(np.float32)
        cols = cols.reshape(cols.shape[0], -1)[:, :width]
        if cols.shape[1] < width:
            cols = xp.concatenate(
                [cols, xp.zeros((cols.shape[0], width - cols.shape[1]), np.float32)], axis=1)
        parts.append(cols)
    return xp.concatenate(parts, axis=1)


@feature_vectorizer.infer
def _(*X, inputdimensions=None, **_):
    batch = X[0].shape[0] if X[0].shape is not None and len(X[0].shape) > 1 else None
    return [tensor(np.float32, (batch, int(sum(inputdimensions or []))))]


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
        self._compiled = {}  # features -> (weights [C, F], intercepts [C], binary) or None

    def run(self, xp, X):
        rows = _rows(X).astype(np.float32, copy=False)
        kernels = _ml_kernels(xp, rows) if self.transform is not None else None
        tables = self._tables(rows.shape[1]) if kernels is not None else None
        if tables is None:
            return self._numpy(xp, rows)
        weights, intercepts, binary = tables
        chosen = np.empty(rows.shape[0], np.int64)
        scores = np.empty((rows.shape[0], 2 if binary else len(weights)), np.float32)
        kernels.linear_classify(rows, weights, intercepts, self.transform, binary, chosen,
                                scores)
        return self._label(np, chosen), scores

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
                if len(intercepts) >= len(weights):
                    tables = (np.ascontiguousarray(weights), intercepts, binary)
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


# the LinearClassifier post-transforms ops/ml/_jit_ml.py computes
_LINEAR_TRANSFORMS = {"NONE": 0, "LOGISTIC": 1, "SOFTMAX": 2}


def _linear_constants(coefficients, intercepts):
    """A linear model's coefficients and intercepts (or None) as float32 arrays, made once
    per node: converting the attribute lists was most of a small model's run."""
    return (np.asarray(coefficients, dtype=np.float32).reshape(-1),
            None if intercepts is None else np.asarray(intercepts, dtype=np.float32))


@linear_classifier.infer
def _(X, *, classlabels_ints=None, classlabels_strings=None, **_):
    batch = X.shape[0] if X.shape is not None and len(X.shape) > 1 else 1
    label = object if classlabels_strings is not None else np.int64
    return [tensor(label, (batch,)), tensor(np.float32, (batch, None))]

# -- score post-transforms --------------------------------------------------------------

_POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def _probit(xp, p):
    """sqrt(2) * erfinv(2p - 1) through Winitzki's approximation of erfinv (a = 0.147), in
    float32: onnxruntime computes PROBIT so, and so does onnx's reference (the exact normal
    quantile differs from both by up to ~2e-4). p = 0 and 1 give -inf and inf."""
    dtype = p.dtype if p.dtype.kind == "f" else np.float32
    x = (2 * p.astype(np.float32) - 1).astype(np.float32)
    sign = xp.where(x < 0, np.float32(-1), np.float32(1))
    log = xp.log((1 - x) * (1 + x))
    a = np.float32(0.147)
    v = np.float32(2) / (np.float32(np.pi) * a) + np.float32(0.5) * log
    v3 = -v + xp.sqrt(v * v - np.float32(1) / a * log)
    return (np.float32(np.sqrt(2)) * sign * xp.sqrt(v3)).astype(dtype)


def post_transform_scores(xp, scores, post_transform):
    """Apply an ML post_transform (its name, or the int code TreeEnsemble uses) per row."""
    name = _POST_TRANSFORMS[post_transform] if isinstance(post_transform, int) else post_transform
    name = name.decode() if isinstance(name, bytes) else name
    if name == "NONE":
        return scores
    if name == "LOGISTIC":
        return 1 / (1 + xp.exp(-scores))
    if name == "SOFTMAX":
        shifted = xp.exp(scores - scores.max(axis=1, keepdims=True))
        return shifted / shifted.sum(axis=1, keepdims=True)
    if name == "SOFTMAX_ZERO":  # a (near) zero score stays zero and takes no share of the mass
        nonzero = xp.abs(scores) > 1e-7
        shifted = xp.where(nonzero, xp.exp(scores - scores.max(axis=1, keepdims=True)), 0)
        total = shifted.sum(axis=1, keepdims=True)
        # an all-zero row has no mass to share out: it becomes 0.5 everywhere, as onnx's
        # reference does (onnxruntime returns NaN there)
        share = shifted / xp.where(total == 0, 1, total)
        return xp.where(total == 0, scores.dtype.type(0.5), share)
    if name == "PROBIT":
        return _probit(xp, scores)
    raise ValueError(f"post_transform must be one of {_POST_TRANSFORMS}, got {post_transform!r}")


# -- tree ensembles ---------------------------------------------------------------------
#
# Every encoding is first turned into one flat table: interior nodes and leaves share the
# index space, a leaf's mode is _LEAF, and each leaf's contribution to the targets is a row
# of `weights` (with `hit` saying which targets it touches, for MIN/MAX).

_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
          "BRANCH_MEMBER", "LEAF")
_MEMBER, _LEAF = 6, 7
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
# a rough count of node visits per tree and row, for splitting a batch over threads
_STEPS_PER_TREE = 16


class _Forest:
    def __init__(self, *, roots, features, splits, modes, true_next, false_next, tracks_true,
                 members, weights, hit):
        self.roots = np.asarray(roots, dtype=np.int64)
        self.features = np.asarray(features, dtype=np.int64)
        self.splits = np.asarray(splits, dtype=np.float64)
        self.modes = np.asarray(modes, dtype=np.int64)
        self.true_next = np.asarray(true_next, dtype=np.int64)
        self.false_next = np.asarray(false_next, dtype=np.int64)
        self.tracks_true = np.asarray(tracks_true, dtype=bool)
        self.members = members  # [node count, widest set], NaN-padded; row i for node i
        self.weights = weights  # [node count, targets]
        self.hit = hit
        self._sparse = {}  # precision -> the leaves' weights as the compiled walk reads them
        self._compilable = self._tables_in_range()
        self._feature_range = None  # (lowest, highest) feature an interior node reads
        self._packed = None  # the node records (_records)
        self._tables = {}  # precision -> every table the compiled walk reads, in its order

    def _tables_in_range(self) -> bool:
        """Can the compiled walk (which does not check bounds) follow this table? Else the
        NumPy walk runs it, and raises where it always did."""
        count = len(self.modes)
        links = np.concatenate([self.roots, self.true_next, self.false_next])
        same_length = all(len(table) == count for table in (
            self.features, self.splits, self.true_next, self.false_next, self.tracks_true,
            self.members, self.weights))
        small = count < 2**31 and (not self.features.size or np.abs(self.features).max() < 2**31)
        return bool(count and same_length and small and links.min() >= 0
                    and links.max() < count)

    def _fits(self, width: int) -> bool:
        """Do the interior nodes' features index rows of ``width`` columns?"""
        if self._feature_range is None:
            interior = self.features[self.modes != _LEAF]
            self._feature_range = ((int(interior.min()), int(interior.max())) if interior.size
                                   else (0, -1))
        low, high = self._feature_range
        return low >= 0 and high < width

    def sums(self, xp, X, precision):
        """Each target's summed leaf weights [N, targets] in ``precision``, added tree by
        tree (onnxruntime's order), and whether any reached leaf weighs that target."""
        kernels = self._kernels(xp, X)
        if kernels is None:
            return _leaf_sums(xp, self, self.leaves(xp, X), precision)
        return self.compiled_sums(kernels, X, precision)

    def compiled_sums(self, kernels, X, precision):
        """:meth:`sums` through ``kernels`` (ops/ml/_jit_trees.py; :meth:`_kernels` said they
        may walk X)."""
        total = np.zeros((X.shape[0], self.weights.shape[1]), dtype=precision)
        reached = np.zeros(total.shape, dtype=bool)
        self._walk(kernels.forest_sums, X, precision, total, reached)
        return total, reached

    def aggregate_rows(self, xp, X, function):
        """``aggregate`` of the leaves X's rows reach, walked by the compiled kernels where
        they can run."""
        function = _aggregate_name(function)
        kernels = self._kernels(xp, X)
        if kernels is None:
            return self.aggregate(xp, self.leaves(xp, X), function)
        if function in ("SUM", "AVERAGE"):
            total = np.zeros((X.shape[0], self.weights.shape[1]))
            reached = np.zeros(total.shape, dtype=bool)
            self._walk(kernels.forest_sums, X, np.float64, total, reached)
            return total / len(self.roots) if function == "AVERAGE" else total
        start = np.inf if function == "MIN" else -np.inf
        best = np.full((X.shape[0], self.weights.shape[1]), start)
        self._walk(kernels.forest_extremes, X, np.float64, best, function == "MAX")
        return np.where(np.isinf(best), 0.0, best)

    def _kernels(self, xp, X):
        """ops/ml/_jit_trees.py where it may run on X (host arrays, the compiled tier on, a
        table it can walk safely), else None."""
        if xp is not np or not self._compilable or not len(self.roots) \
                or not self._fits(X.shape[1]) or not jit_cpu.enabled():
            return None
        return jit_cpu.load("mixrt.ops.ml._jit_trees")

    def walk_inputs(self, X, precision):
        """(X as the compiled walk reads it, the tables it walks in ``precision``)."""
        native = X.dtype in (np.float32, np.float64)
        data = X if native and X.flags.c_contiguous \
            else np.ascontiguousarray(X, dtype=X.dtype if native else np.float64)
        tables = self._tables.get(precision)
        if tables is None:
            tables = self._tables[precision] = (self.roots, *self._records(), self.members,
                                                self._uniform_mode(),
                                                *self._leaf_table(precision))
        return data, tables

    def _uniform_mode(self) -> int:
        """BRANCH_LEQ (0) or BRANCH_LT (1) when every branch has that mode (the compiled
        walk then compares without choosing the mode), else -1."""
        branch_modes = set(self.modes[self.modes != _LEAF].tolist())
        return branch_modes.pop() if branch_modes in ({0}, {1}) else -1

    def walks_alone(self, rows: int) -> bool:
        """Is a walk of ``rows`` rows one call on the calling thread (not split)?"""
        return rows == 1 or len(row_parts(rows, len(self.roots) * _STEPS_PER_TREE)) == 1

    def _walk(self, kernel, X, precision, *outputs):
        """kernel(rows, start, stop, tables..., outputs...) over row ranges, in parallel
        for large batches."""
        data, tables = self.walk_inputs(X, precision)
        rows = X.shape[0]
        parts = ((0, rows),) if rows == 1 else row_parts(rows, len(self.roots) * _STEPS_PER_TREE)
        if len(parts) == 1:  # a request's few rows: the call itself, no hand-out (~2 us)
            kernel(data, 0, rows, *tables, *outputs)
            return
        parallel_for(parts, lambda start, stop: kernel(data, start, stop, *tables, *outputs))

    def _records(self):
        """The nodes as 24-byte records, two flat views of one buffer: float64 (the split
        at 3 i) and int32 (feature, mode | missing-tracks-true << 8, true and false child at
        6 i + 2..5)."""
        if self._packed is None:
            splits = np.zeros((len(self.modes), 3))
            links = splits.view(np.int32)
            splits[:, 0] = self.splits
            links[:, 2] = self.features
            links[:, 3] = self.modes | (self.tracks_true.astype(np.int64) << 8)
            links[:, 4], links[:, 5] = self.true_next, self.false_next
            self._packed = (splits.reshape(-1), links.reshape(-1))
        return self._packed

    def _leaf_table(self, precision):
        """The leaves' weights, sparse: node i's entries are [start[i], start[i + 1]) of
        (targets, values), the dense table's hit entries in ``precision``."""
        key = np.dtype(precision)
        if key not in self._sparse:
            nodes, targets = np.nonzero(self.hit)
            start = np.zeros(len(self.modes) + 1, dtype=np.int64)
            np.cumsum(np.bincount(nodes, minlength=len(self.modes)), out=start[1:])
            values = np.ascontiguousarray(self.weights[nodes, targets], dtype=precision)
            self._sparse[key] = (start, targets.astype(np.int64), values)
        return self._sparse[key]

    def leaves(self, xp, X):
        """The leaf each sample reaches in each tree: [N, trees]."""
        table = {name: xp.asarray(getattr(self, name)) for name in (
            "features", "splits", "modes", "true_next", "false_next", "tracks_true", "members")}
        data = X.astype(np.float64)
        node = xp.broadcast_to(xp.asarray(self.roots), (X.shape[0], len(self.roots))).copy()
        for _ in range(len(self.modes)):  # a path never visits a node twice
            mode = table["modes"][node]
            interior = mode != _LEAF
            if not bool(interior.any()):
                break
            x = xp.take_along_axis(data, table["features"][node], axis=1)
            go_true = _compare(xp, x, table["splits"][node], mode)
            is_member = (x[..., None] == table["members"][node]).any(axis=-1)
            go_true = xp.where(mode == _MEMBER, is_member, go_true)
            # a NaN takes the true branch when its node tracks missing values there, else
            # whatever the comparison says (false, but true for BRANCH_NEQ): onnxruntime and
            # onnx's TreeEnsemble-5 reference do so; the opset-1/3 text would send it false
            go_true = go_true | (xp.isnan(x) & table["tracks_true"][node])
            following = xp.where(go_true, table["true_next"][node], table["false_next"][node])
            node = xp.where(interior, following, node)
        return node

    def aggregate(self, xp, leaves, function: str):
        function = _aggregate_name(function)
        weights, hit = xp.asarray(self.weights), xp.asarray(self.hit)
        if function in ("SUM", "AVERAGE"):
            total = weights[leaves[:, 0]].copy()
            for t in range(1, leaves.shape[1]):
                total += weights[leaves[:, t]]
            return total / leaves.shape[1] if function == "AVERAGE" else total
        pick = xp.minimum if function == "MIN" else xp.maximum
        start = np.inf if function == "MIN" else -np.inf
        best = xp.full((leaves.shape[0], weights.shape[1]), start)
        for t in range(leaves.shape[1]):
            best = xp.where(hit[leaves[:, t]], pick(best, weights[leaves[:, t]]), best)
        return xp.where(xp.isinf(best), 0.0, best)  # a target no leaf reached scores 0


def _aggregate_name(function) -> str:
    function = function.decode() if isinstance(function, bytes) else function
    if function not in _AGGREGATES:
        raise ValueError(f"aggregate_function must be one of {', '.join(_AGGREGATES)}, "
                         f"got {function!r}")
    return function


def _leaf_sums(xp, forest, leaves, precision):
    """The NumPy tier of ``_Forest.sums``: dense weight rows gathered and added tree by
    tree."""
    weights = xp.asarray(forest.weights.astype(precision))
    hit = xp.asarray(forest.hit)
    total = xp.zeros((leaves.shape[0], weights.shape[1]), dtype=precision)
    reached = xp.zeros(total.shape, dtype=bool)
    for tree in range(leaves.shape[1]):
        total += weights[leaves[:, tree]]
        reached |= hit[leaves[:, tree]]
    return total, reached


def _compare(xp, x, split, mode):
    tests = [x <= split, x < split, x >= split, x > split, x == split, x != split]
    result = xp.zeros(x.shape, dtype=bool)
    for code, test in enumerate(tests):
        result = xp.where(mode == code, test, result)
    return result


def _member_table(modes, membership_values):
    """One NaN-padded row of members per node; the sets, NaN-separated in
    membership_values, belong to the BRANCH_MEMBER nodes in order."""
    sets, current = [], []
    for v in (np.asarray(membership_values, dtype=np.float64).tolist()
              if membership_values is not None else []):
        if v != v:
            sets.append(current)
            current = []
        else:
            current.append(v)
    if current:
        sets.append(current)
    table = np.full((len(modes), max([len(s) for s in sets] + [1])), np.nan)
    member_nodes = [i for i, m in enumerate(modes) if m == _MEMBER]
    for node, members in zip(member_nodes, sets):
        table[node, :len(members)] = members
    return table


def _forest_v5(*, leaf_targetids, leaf_weights, membership_values, n_targets, nodes_falseleafs,
               nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true,
               nodes_modes, nodes_splits, nodes_trueleafs, nodes_truenodeids, tree_roots):
    n_nodes, n_leaves = len(nodes_featureids), len(leaf_targetids)
    targets = int(n_targets) if n_targets is not None else int(max(leaf_targetids)) + 1
    modes = np.asarray(nodes_modes).reshape(-1).astype(np.int64).tolist() + [_LEAF] * n_leaves

    def next_positions(ids, to_leaf):  # leaves are numbered after the interior nodes
        return [n_nodes + i if leaf else i for i, leaf in zip(ids, to_leaf)] + [0] * n_leaves

    weights = np.zeros((n_nodes + n_leaves, targets))
    hit = np.zeros(weights.shape, dtype=bool)
    leaf_rows = n_nodes + np.arange(n_leaves)
    np.add.at(weights, (leaf_rows, np.asarray(leaf_targetids)),
              np.asarray(leaf_weights, dtype=np.float64).reshape(-1))
    hit[leaf_rows, np.asarray(leaf_targetids)] = True
    tracks = list(nodes_missing_value_tracks_true or [0] * n_nodes) + [0] * n_leaves
    return _Forest(
        roots=tree_roots, features=list(nodes_featureids) + [0] * n_leaves,
        splits=np.asarray(nodes_splits, dtype=np.float64).reshape(-1).tolist() + [0] * n_leaves,
        modes=modes, true_next=next_positions(nodes_truenodeids, nodes_trueleafs),
        false_next=next_positions(nodes_falsenodeids, nodes_falseleafs), tracks_true=tracks,
        members=_member_table(modes, membership_values), weights=weights, hit=hit)


@op("TreeEnsemble", since=5, domain=ML, dtypes=frozenset({"float16", "float32", "float64"}))
def tree_ensemble(xp, X, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None,
                  membership_values=None, n_targets=None, nodes_falseleafs=None,
                  nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                  nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                  nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0,
                  tree_roots=None, _node=None):
    forest = _cached(_node, lambda: _forest_v5(
        leaf_targetids=leaf_targetids, leaf_weights=leaf_weights,
        membership_values=membership_values, n_targets=n_targets,
        nodes_falseleafs=nodes_falseleafs, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_splits=nodes_splits, nodes_trueleafs=nodes_trueleafs,
        nodes_truenodeids=nodes_truenodeids, tree_roots=tree_roots))
    scores = forest.aggregate_rows(xp, _rows(X), _AGGREGATES[aggregate_function])
    return post_transform_scores(xp, scores, post_transform).astype(X.dtype)


@tree_ensemble.infer
def _(X, *, n_targets=None, leaf_targetids=None, **_):
    if n_targets is None and leaf_targetids is not None:
        n_targets = int(max(leaf_targetids)) + 1
    batch = X.shape[0] if X.shape is not None and len(X.shape) > 1 else None
    return [TensorType(X.dtype, (batch, n_targets))]


def _forest_from_node_ids(*, treeids, nodeids, featureids, modes, values, truenodeids,
                          falsenodeids, missing_tracks_true, leaf_treeids, leaf_nodeids,
                          leaf_ids, leaf_weights, n_outputs, leaf_prefix="target_"):
    """The (tree id, node id) encoding of TreeEnsembleRegressor/Classifier: node ids restart
    at 0 (the root) in every tree, and a leaf may feed several targets/classes (its weights
    are the ``leaf_prefix`` attributes: target_* or class_*). Inconsistent attributes raise a
    ValueError naming the attribute."""
    _same_lengths("nodes_", treeids=treeids, nodeids=nodeids, featureids=featureids,
                  modes=modes, values=values, truenodeids=truenodeids,
                  falsenodeids=falsenodeids)
    if missing_tracks_true:
        _same_lengths("nodes_", treeids=treeids, missing_value_tracks_true=missing_tracks_true)
    _same_lengths(leaf_prefix, treeids=leaf_treeids, nodeids=leaf_nodeids, ids=leaf_ids,
                  weights=leaf_weights)
    position = {}
    for i, key in enumerate(zip(treeids, nodeids)):
        if position.setdefault(key, i) != i:
            raise ValueError(f"nodes_nodeids: node {key[1]} appears twice in tree {key[0]}")
    codes = _mode_codes(modes)

    def at(tree, node, attribute):
        if (tree, node) not in position:
            raise ValueError(f"{attribute}: tree {tree} has no node {node}")
        return position[tree, node]

    def next_positions(children, attribute):
        return [at(t, c, attribute) if code != _LEAF else i
                for i, (t, c, code) in enumerate(zip(treeids, children, codes))]

    ids = np.asarray(leaf_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= n_outputs):
        raise ValueError(f"{leaf_prefix}ids: {int(ids.min() if ids.min() < 0 else ids.max())} "
                         f"is out of range for {n_outputs} output(s)")
    weights = np.zeros((len(codes), n_outputs))
    hit = np.zeros(weights.shape, dtype=bool)
    rows = [at(t, n, f"{leaf_prefix}nodeids") for t, n in zip(leaf_treeids, leaf_nodeids)]
    values_at_leaves = np.asarray([] if leaf_weights is None else leaf_weights, np.float64)
    np.add.at(weights, (rows, ids), values_at_leaves.reshape(-1))
    hit[rows, ids] = True
    return _Forest(
        roots=[at(t, 0, "nodes_nodeids") for t in dict.fromkeys(treeids)],
        features=featureids, splits=np.asarray(values, dtype=np.float64).reshape(-1),
        modes=codes, true_next=next_positions(truenodeids, "nodes_truenodeids"),
        false_next=next_positions(falsenodeids, "nodes_falsenodeids"),
        tracks_true=missing_tracks_true or [0] * len(codes),
        members=np.full((len(codes), 1), np.nan), weights=weights, hit=hit)


def _same_lengths(prefix: str, **lists) -> None:
    """Parallel attribute lists (``nodes_*``, ``class_*``, ...) must have one length."""
    lengths = {f"{prefix}{name}": len(np.asarray(v).reshape(-1)) if v is not None else 0
               for name, v in lists.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise ValueError(f"{prefix}* attributes must have one length: {listed}")


def _mode_codes(modes) -> list[int]:
    """nodes_modes as codes; BRANCH_MEMBER exists only in TreeEnsemble-5."""
    codes = []
    for mode in modes:
        name = mode.decode() if isinstance(mode, bytes) else mode
        if name not in _MODES or name == "BRANCH_MEMBER":
            allowed = ", ".join(m for m in _MODES if m != "BRANCH_MEMBER")
            raise ValueError(f"nodes_modes: unknown mode {name!r}; expected one of {allowed}")
        codes.append(_MODES.index(name))
    return codes


def _either(listed, as_tensor):
    return as_tensor if as_tensor is not None else listed


