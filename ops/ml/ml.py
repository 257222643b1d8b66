"""Traditional-ML operators of the ``ai.onnx.ml`` domain (the opsets of that domain, not the
default one): label encoding, the small feature transforms sklearn converters emit, the
linear models, and the score post-transforms they share with the tree ensembles
(``forest.py``, ``ml_trees.py``) and the SVMs (``ml_svm.py``).

String tensors are NumPy object arrays, so a kernel that reads or writes strings works on the
host; numeric paths use ``xp``.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.bound_calls import binds
from mixrt.ops.compiled.out_arrays import into
from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.ir.node_state import prepared
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
def normalizer(xp, X, *, norm="MAX", out=None):
    """Each row divided by its norm; the compiled kernel writes into ``out`` (the arena's
    float32 view of the output, where the run has one): copying a one-row result there
    cost as much as computing it."""
    if norm not in _NORMS:
        raise ValueError(f"Normalizer norm must be one of MAX, L1, L2, got {norm!r}")
    rows = _rows(X).astype(np.float32, copy=False)
    kernels = _ml_kernels(xp, rows)
    if kernels is not None:
        target = np.empty(rows.shape, np.float32) if out is None else out.reshape(rows.shape)
        kernels.normalize_rows(rows, _NORMS.index(norm), target)
        return target.reshape(X.shape)
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
    # an inner step's compiled loop on host arrays, not the op's kernel: the steps around it
    # are the same on every device
    if xp is not np or rows.dtype != np.float32 or not rows.shape[1] \
            or not rows.flags.c_contiguous or not jit_cpu.enabled():
        return None
    return jit_cpu.load("mixrt.ops.ml._jit_ml")


def _float32_like_input(X, *_, **__):
    return [tensor(np.float32, X.shape)]


normalizer.infer(_float32_like_input)


@binds(normalizer.fn, feeds=True, silent=True)  # its planned call, bound once per arena (bound_calls)
def bind_normalizer(args, out, attributes):
    """The compiled rows' kernel into ``out`` where the kernel takes it (float32 rows
    [N, F], contiguous), without its checks: a TF-IDF pipeline's one-document run spent
    ~3 us in the node, ~1 of it in the kernel."""
    (X,), norm = args, attributes.get("norm", "MAX")
    rows = _rows(X)
    if norm not in _NORMS or X.ndim > 2 or X.dtype != np.float32 or out.dtype != np.float32 \
            or out.size != rows.size or not out.flags.c_contiguous \
            or np.may_share_memory(out, X) or _ml_kernels(np, rows) is None:
        return None
    kernel, code, target = _ml_kernels(np, rows).normalize_rows, _NORMS.index(norm), \
        out.reshape(rows.shape)

    def call(X):
        kernel(_rows(X), code, target)
        return out
    return call


@op("Scaler", since=1, domain=ML, dtypes=_NUMBERS)
def scaler(xp, X, *, offset=None, scale=None, _node=None, out=None):
    """(X - offset) * scale; into ``out`` (the arena's view of the output, where the run has
    one), so that its planned call can be bound (:func:`bind_scaler`)."""
    return prepared(_node, lambda: _Scaler(offset, scale)).run(xp, X, out)


class _Scaler:
    def __init__(self, offset, scale):
        self.offset = np.asarray(offset if offset is not None else [0.0], dtype=np.float32)
        self.scale = np.asarray(scale if scale is not None else [1.0], dtype=np.float32)

    def fits(self, width: int) -> bool:
        """Does the compiled kernel take rows of ``width`` (offset and scale one value or
        one per column)?"""
        return len(self.offset) in (width, 1) and len(self.scale) in (width, 1)

    def run(self, xp, X, out=None):
        rows = _rows(X).astype(np.float32, copy=False)
        kernels = _ml_kernels(xp, rows)
        if kernels is not None and self.fits(rows.shape[1]):
            target = out if _float32_rows_view(out, rows) else np.empty(X.shape, np.float32)
            kernels.scale_columns(rows, self.offset, self.scale, target.reshape(rows.shape))
            return target
        result = (X.astype(np.float32, copy=False) - xp.asarray(self.offset)) \
            * xp.asarray(self.scale)
        return result if out is None else into(out, result)


def _float32_rows_view(out, rows) -> bool:
    """Is ``out`` a contiguous float32 array of ``rows``'s size (the kernel's target)?"""
    return out is not None and out.dtype == np.float32 and out.size == rows.size \
        and out.flags.c_contiguous


@binds(scaler.fn, feeds=True, silent=True)  # its planned call, bound once per arena (bound_calls)
def bind_scaler(args, out, attributes):
    """The compiled kernel into ``out`` where the node's model takes these arrays, without
    its checks (a scikit-learn pipeline's StandardScaler at one row: ~3 us a run)."""
    (X,), model = args, (attributes.get("_node") or {}).get("model")
    if model is None or X.ndim > 2 or X.dtype != np.float32 \
            or not model.fits(_rows(X).shape[1]) or not _float32_rows_view(out, _rows(X)) \
            or _ml_kernels(np, _rows(X)) is None:
        return None
    kernel, offset, scale = _ml_kernels(np, _rows(X)).scale_columns, model.offset, model.scale
    target = out.reshape(_rows(X).shape)

    def call(X):
        kernel(_rows(X), offset, scale, target)
        return out
    return call


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
