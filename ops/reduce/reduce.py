"""Reductions over axes (ReduceSum, ReduceMax, ...) and running scans (CumSum, CumProd).

Every Reduce* op exists in two calling conventions: ``axes`` as an attribute (opset 1..12 for
ReduceSum, 1..17 for the others) and ``axes`` as an optional int64 input with
``noop_with_empty_axes`` (ReduceSum-13, the others from 18). Empty or absent axes mean "every
axis", unless ``noop_with_empty_axes`` makes them mean "reduce over no axis": the input
with only the elementwise part applied (ReduceSumSquare gives x^2, ReduceL1 |x|, ReduceLogSum
log x; the rest give x), as onnxruntime and the ONNX reference compute it.

A reduction over an empty set of elements (an axis of size 0) gives the operation's identity:
0 for sums, 1 for products, -inf for max and log-sum(-exp), +inf for min.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from mixrt.ops.ir.dtypes import BOOL, FLOATS, NUMERIC
from mixrt.ops.elementwise.elementwise import quiet
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, normalize_axis, reduced_shape, same_as_input



def _wide_float(dtype) -> np.dtype:
    """Where floats are accumulated: half types in float32 (precision), ints in float64."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iub":
        return np.dtype(np.float64)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def _sum_dtype(dtype) -> np.dtype:
    """Sums keep integer types (NumPy would widen int32 to int64); half floats use float32."""
    dtype = np.dtype(dtype)
    return dtype if dtype.kind in "iu" else _wide_float(dtype)


def _sum(xp, x, axes, keepdims):
    return xp.sum(x, axis=axes, keepdims=keepdims, dtype=_sum_dtype(x.dtype))


def _sum_square(xp, x, axes, keepdims):
    x = x.astype(_sum_dtype(x.dtype), copy=False)
    return xp.sum(x * x, axis=axes, keepdims=keepdims)


def _mean(xp, x, axes, keepdims):
    return xp.mean(x, axis=axes, keepdims=keepdims, dtype=_wide_float(x.dtype))


def _prod(xp, x, axes, keepdims):
    return xp.prod(x, axis=axes, keepdims=keepdims, dtype=_sum_dtype(x.dtype))


def _max(xp, x, axes, keepdims):
    return xp.max(x, axis=axes, keepdims=keepdims)


def _min(xp, x, axes, keepdims):
    return xp.min(x, axis=axes, keepdims=keepdims)


def _l1(xp, x, axes, keepdims):
    return _sum(xp, xp.abs(x), axes, keepdims)


def _l2(xp, x, axes, keepdims):
    x = x.astype(_wide_float(x.dtype), copy=False)
    return xp.sqrt(xp.sum(x * x, axis=axes, keepdims=keepdims))


def _log_sum(xp, x, axes, keepdims):
    with quiet(xp):  # log(0) = -inf is the specified result for an all-zero slice
        return xp.log(xp.sum(x, axis=axes, keepdims=keepdims, dtype=_wide_float(x.dtype)))


def _log_sum_exp(xp, x, axes, keepdims):
    x = x.astype(_wide_float(x.dtype), copy=False)
    peak = xp.max(x, axis=axes, keepdims=True)
    # An all -inf (or inf) slice would give inf - inf = nan; shift such slices by 0 instead.
    peak = xp.where(xp.isfinite(peak), peak, 0)
    total = xp.sum(xp.exp(x - peak), axis=axes, keepdims=True)
    with quiet(xp):  # an all -inf slice sums to 0, and log(0) = -inf is the right answer
        result = xp.log(total) + peak
    return result if keepdims else xp.squeeze(result, axis=axes)


def _lowest(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _highest(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max if dtype.kind in "iu" else np.inf


@dataclass(frozen=True)
class Reduction:
    op_type: str
    compute: Callable  # (xp, x, axes: tuple, keepdims: bool) -> array
    empty: Callable  # dtype -> the value of a reduction over no elements


REDUCTIONS = (
    Reduction("ReduceSum", _sum, lambda dtype: 0),
    Reduction("ReduceMean", _mean, lambda dtype: np.nan),
    Reduction("ReduceMax", _max, _lowest),
    Reduction("ReduceMin", _min, _highest),
    Reduction("ReduceProd", _prod, lambda dtype: 1),
    Reduction("ReduceL1", _l1, lambda dtype: 0),
    Reduction("ReduceL2", _l2, lambda dtype: 0),
    Reduction("ReduceLogSum", _log_sum, lambda dtype: -np.inf),
    Reduction("ReduceLogSumExp", _log_sum_exp, lambda dtype: -np.inf),
    Reduction("ReduceSumSquare", _sum_square, lambda dtype: 0),
)


def _reduce(xp, reduction: Reduction, data, axes, keepdims):
    """``reduction`` over ``axes`` (None or empty: all axes), in data's dtype."""
    rank = data.ndim
    axes = tuple(range(rank)) if not axes else tuple(sorted(
        {normalize_axis(int(a), rank) for a in axes}))
    keepdims = bool(keepdims)
    if any(data.shape[a] == 0 for a in axes):
        shape = reduced_shape(data.shape, axes, keepdims)
        return xp.full(shape, reduction.empty(data.dtype), dtype=data.dtype)
    result = reduction.compute(xp, data, axes, keepdims)
    return xp.asarray(result).astype(data.dtype, copy=False)


def _axes_from_input(axes) -> list[int]:
    # Axes decide the output shape, so they are read on the host (a handful of int64s).
    return [] if axes is None else [int(a) for a in axes.reshape(-1).tolist()]


# -- kernel factories: one pair of calling conventions per reduction ---------------------------

def _with_axes_attribute(reduction: Reduction):
    def kernel(xp, data, *, axes=None, keepdims=1):
        return _reduce(xp, reduction, data, axes, keepdims)

    kernel.__name__ = kernel.__qualname__ = _snake(reduction.op_type)
    return kernel


def _with_axes_input(reduction: Reduction):
    def kernel(xp, data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        axes = _axes_from_input(axes)
        if not axes and noop_with_empty_axes:
            return xp.asarray(reduction.compute(xp, data, (), True)).astype(data.dtype,
                                                                            copy=False)
        return _reduce(xp, reduction, data, axes, keepdims)

    kernel.__name__ = kernel.__qualname__ = _snake(reduction.op_type) + "_axes_input"
    return kernel


def _snake(op_type: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in op_type).lstrip("_")


def _infer_axes_attribute(data: TensorType, *, axes=None, keepdims=1, **_):
    return [TensorType(data.dtype, reduced_shape(data.shape, axes, keepdims))]


def _infer_axes_input(data: TensorType, axes: TensorType | None = None, *, keepdims=1,
                      noop_with_empty_axes=0, **_):
    if axes is not None and axes.value is None:  # axes only known at run time
        shape = None
        if keepdims and data.shape is not None:
            shape = (None,) * len(data.shape)
        return [TensorType(data.dtype, shape)]
    axes = [] if axes is None else [int(a) for a in np.asarray(axes.value).reshape(-1)]
    if not axes and noop_with_empty_axes:
        return [TensorType(data.dtype, data.shape)]
    return [TensorType(data.dtype, reduced_shape(data.shape, axes, keepdims))]


# Per op: the first opset taking axes as an input, and the dtypes of each version (the kernels
# compute every numeric type; the spec adds bool to ReduceMax/Min at 20 and drops ints from the
# log reductions at 28).
_VERSIONS = {
    "ReduceSum": (13, {1: NUMERIC, 11: NUMERIC, 13: NUMERIC}),
    "ReduceMax": (18, {1: NUMERIC, 11: NUMERIC, 12: NUMERIC, 13: NUMERIC, 18: NUMERIC,
                       20: NUMERIC | BOOL}),
    "ReduceMin": (18, {1: NUMERIC, 11: NUMERIC, 12: NUMERIC, 13: NUMERIC, 18: NUMERIC,
                       20: NUMERIC | BOOL}),
    "ReduceLogSum": (18, {1: NUMERIC, 11: NUMERIC, 13: NUMERIC, 18: NUMERIC, 28: FLOATS}),
    "ReduceLogSumExp": (18, {1: NUMERIC, 11: NUMERIC, 13: NUMERIC, 18: NUMERIC, 28: FLOATS}),
}
_DEFAULT_VERSIONS = (18, {1: NUMERIC, 11: NUMERIC, 13: NUMERIC, 18: NUMERIC})


def _register(reduction: Reduction) -> None:
    input_since, versions = _VERSIONS.get(reduction.op_type, _DEFAULT_VERSIONS)
    with_attribute = _with_axes_attribute(reduction)
    with_input = _with_axes_input(reduction)
    for since, dtypes in versions.items():
        if since < input_since:
            with_attribute = op(reduction.op_type, since=since, dtypes=dtypes)(with_attribute)
        else:
            with_input = op(reduction.op_type, since=since, dtypes=dtypes)(with_input)
    with_attribute.infer(_infer_axes_attribute)
    with_input.infer(_infer_axes_input)
    with_input.reads_on_host(1)  # the axes
    # module-level names (reduce_sum, reduce_sum_axes_input, ...) for tests and tracebacks
    globals()[with_attribute.__name__] = with_attribute
    globals()[with_input.__name__] = with_input


for _reduction in REDUCTIONS:
    _register(_reduction)


# -- scans -------------------------------------------------------------------------------------

def _scan(xp, x, axis, *, exclusive, reverse, accumulate, identity):
    """An inclusive or exclusive, forward or backward running ``accumulate`` along ``axis``."""
    axis = normalize_axis(_axes_from_input(axis)[0], x.ndim)
    work = xp.moveaxis(x, axis, -1)
    if reverse:
        work = work[..., ::-1]
    if exclusive:  # an exclusive scan is the inclusive scan of the input shifted by one
        start = xp.full(work.shape[:-1] + (1,), identity, dtype=work.dtype)
        work = xp.concatenate([start, work[..., :-1]], axis=-1)
    result = accumulate(work, axis=-1, dtype=_sum_dtype(x.dtype)).astype(x.dtype, copy=False)
    if reverse:
        result = result[..., ::-1]
    return xp.ascontiguousarray(xp.moveaxis(result, -1, axis))


@op("CumSum", since=14, dtypes=NUMERIC)
@op("CumSum", since=11, dtypes=NUMERIC)
def cum_sum(xp, x, axis, *, exclusive=0, reverse=0):
    return _scan(xp, x, axis, exclusive=exclusive, reverse=reverse, accumulate=xp.cumsum,
                 identity=0)


@op("CumProd", since=26, dtypes=NUMERIC)
def cum_prod(xp, x, axis, *, exclusive=0, reverse=0):
    return _scan(xp, x, axis, exclusive=exclusive, reverse=reverse, accumulate=xp.cumprod,
                 identity=1)


cum_sum.infer(same_as_input)
cum_prod.infer(same_as_input)


cum_sum.reads_on_host(1)  # the axis
cum_prod.reads_on_host(1)
