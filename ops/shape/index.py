"""Index operators: gather, scatter, slice, select and sort-like ops.

ONNX indices may be negative (counting from the end of their axis); every kernel normalises
them before indexing, since NumPy and CuPy fancy indexing would otherwise wrap silently only
for some of them.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.ir.dtypes import NUMERIC, sortable
from mixrt.ops.ir.registry import op
from mixrt.ops.shape.shape import const_ints, host_ints, host_scalar, typed, unknown_dims
from mixrt.ops.ir.types import normalize_axis, reduced_shape, same_as_input
from mixrt.ops import device_checks
from mixrt.ops.shape import top_k_select

INT64 = np.dtype(np.int64)


def _wrap(xp, indices, dim):
    """Negative indices count from the end of an axis of length ``dim``. On the CPU an index
    outside [-dim, dim) then raises where it is used; CuPy would wrap it around, so on the
    GPU the run checks it when it ends (ops/device_checks.py)."""
    indices = indices.astype(np.int64)
    # a branch, not a kernel: only where an out-of-range index is reported differs
    if xp is not np and indices.size:
        device_checks.expect_false(((indices < -dim) | (indices >= dim)).any(),
                                   f"every index within [-{dim}, {dim}) on its axis")
    elif indices.size and indices.min() < -dim:  # NumPy would count it from the end again
        raise IndexError(f"index {int(indices.min())} is out of bounds for an axis of size "
                         f"{dim}; expected every index within [-{dim}, {dim})")
    return xp.where(indices < 0, indices + dim, indices)


def _open_grid(xp, shape):
    """Index arrays that address every position of ``shape`` by broadcasting (like
    ``np.ogrid``): the i-th has ``shape[i]`` elements on axis i and 1 elsewhere."""
    rank = len(shape)
    return [xp.arange(n).reshape((1,) * i + (n,) + (1,) * (rank - i - 1))
            for i, n in enumerate(shape)]


def _elements_index(xp, data, indices, axis):
    """The fancy index that addresses data[..., indices[i], ...] along ``axis`` for every
    position i of ``indices`` (GatherElements/ScatterElements)."""
    grid = _open_grid(xp, indices.shape)
    grid[axis] = _wrap(xp, indices, data.shape[axis])
    return tuple(grid)


# -- Gather family ------------------------------------------------------------------------

@op("Gather", since=13)
@op("Gather", since=11)
@op("Gather", since=1)
def gather(xp, data, indices, *, axis=0):
    axis = normalize_axis(axis, data.ndim)
    # xp.asarray: taking a 0-d index from a vector yields a scalar, not an array.
    return xp.asarray(xp.take(data, _wrap(xp, indices, data.shape[axis]), axis=axis))


@gather.infer
def _(data, indices, *, axis=0, **_):
    if data.shape is None or indices.shape is None:
        return [typed(data.dtype, None)]
    axis = normalize_axis(axis, len(data.shape))
    return [typed(data.dtype, data.shape[:axis] + indices.shape + data.shape[axis + 1:])]


@op("GatherElements", since=13)
@op("GatherElements", since=11)
def gather_elements(xp, data, indices, *, axis=0):
    axis = normalize_axis(axis, data.ndim)
    return data[_elements_index(xp, data, indices, axis)]


@gather_elements.infer
def _(data, indices, **_):
    return [typed(data.dtype, indices.shape)]


def _gather_nd_index(xp, data, indices, batch_dims):
    """Flatten the batch dims and return (data, index tuple, output shape) such that
    ``data[index]`` reshaped to the output shape is GatherND/ScatterND's selection."""
    batch_shape = data.shape[:batch_dims]
    batch = int(np.prod(batch_shape))
    depth = indices.shape[-1]
    flat_data = data.reshape((batch,) + data.shape[batch_dims:])
    flat_indices = indices.reshape(batch, -1, depth)
    index = [xp.arange(batch)[:, None]]
    for j in range(depth):
        index.append(_wrap(xp, flat_indices[..., j], data.shape[batch_dims + j]))
    out_shape = indices.shape[:-1] + data.shape[batch_dims + depth:]
    return flat_data, tuple(index), out_shape


@op("GatherND", since=12)
@op("GatherND", since=11)
def gather_nd(xp, data, indices, *, batch_dims=0):
    flat_data, index, out_shape = _gather_nd_index(xp, data, indices, batch_dims)
    selected = flat_data[index]
    if len(index) == 1:  # empty index tuples select whole slices, once per index row
        rows = int(np.prod(indices.shape[batch_dims:-1]))
        selected = xp.broadcast_to(selected, (selected.shape[0], rows) + selected.shape[2:])
    return selected.reshape(out_shape)


@gather_nd.infer
def _(data, indices, *, batch_dims=0, **_):
    if data.shape is None or indices.shape is None or not isinstance(indices.shape[-1], int):
        return [typed(data.dtype, None)]
    depth = indices.shape[-1]
    return [typed(data.dtype, indices.shape[:-1] + data.shape[batch_dims + depth:])]


# -- Scatter family -----------------------------------------------------------------------

_REDUCTIONS = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


def _scatter(xp, data, index, updates, reduction):
    """A copy of data with updates written (or reduced into) at ``index``."""
    if reduction != "none" and reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {('none', *_REDUCTIONS)}, got {reduction!r}")
    out = data.copy()
    if reduction == "none":
        out[index] = updates
    elif xp.__name__ == "numpy":  # the same reduction; CuPy lacks most ufuncs' ``at``
        getattr(np, _REDUCTIONS[reduction]).at(out, index, updates)
    else:
        _reduce_in_rounds(xp, out, index, updates, getattr(xp, _REDUCTIONS[reduction]))
    return out


def _reduce_in_rounds(xp, out, index, updates, ufunc):
    """Scatter-reduce without ``ufunc.at`` (CuPy has it only for some ufuncs): duplicate
    targets are split into rounds in which every target appears once, so each round is a
    plain gather-combine-scatter."""
    shape = np.broadcast_shapes(*(i.shape for i in index))
    index = [xp.broadcast_to(i, shape).reshape(-1) for i in index]
    updates = updates.reshape((len(index[0]),) + updates.shape[len(shape):])
    linear = xp.ravel_multi_index(index, out.shape[:len(index)])
    order = xp.argsort(linear, kind="stable")
    sorted_linear = linear[order]
    # How many earlier updates hit the same target: position minus the target's first one.
    group_start = xp.searchsorted(sorted_linear, sorted_linear, side="left")
    occurrence = xp.empty_like(order)
    occurrence[order] = xp.arange(len(order)) - group_start
    for round_ in range(int(occurrence.max()) + 1 if len(order) else 0):
        chosen = xp.nonzero(occurrence == round_)[0]
        at = tuple(i[chosen] for i in index)
        out[at] = ufunc(out[at], updates[chosen])


@op("ScatterElements", since=18)
@op("ScatterElements", since=16)
@op("ScatterElements", since=13)
@op("ScatterElements", since=11)
def scatter_elements(xp, data, indices, updates, *, axis=0, reduction="none"):
    axis = normalize_axis(axis, data.ndim)
    return _scatter(xp, data, _elements_index(xp, data, indices, axis), updates, reduction)


@op("Scatter", since=11)
@op("Scatter", since=9)
def scatter(xp, data, indices, updates, *, axis=0):
    # Deprecated in opset 11 in favour of ScatterElements, which it equals.
    return scatter_elements(xp, data, indices, updates, axis=axis)


@op("ScatterND", since=18)
@op("ScatterND", since=16)
@op("ScatterND", since=11)
def scatter_nd(xp, data, indices, updates, *, reduction="none"):
    depth = indices.shape[-1]
    index = tuple(_wrap(xp, indices[..., j], data.shape[j]) for j in range(depth))
    return _scatter(xp, data, index, updates, reduction)


for handle in (scatter_elements, scatter, scatter_nd):
    handle.infer(same_as_input)


@op("TensorScatter", since=24)
def tensor_scatter(xp, past_cache, update, write_indices=None, *, mode="linear", axis=-2):
    if mode not in ("linear", "circular"):
        raise ValueError(f"TensorScatter mode must be 'linear' or 'circular', got {mode!r}")
    axis = normalize_axis(axis, past_cache.ndim)
    if axis == 0:
        raise ValueError("TensorScatter axis cannot be 0, the batch axis")
    batch, capacity, length = past_cache.shape[0], past_cache.shape[axis], update.shape[axis]
    starts = (xp.zeros(batch, np.int64) if write_indices is None
              else write_indices.astype(np.int64))
    shape_at_axis = (1,) * (axis - 1) + (length,) + (1,) * (update.ndim - axis - 1)
    positions = starts.reshape((batch,) + (1,) * (update.ndim - 1)) + \
        xp.arange(length).reshape((1,) + shape_at_axis)
    if mode == "circular":
        positions = positions % capacity
    grid = _open_grid(xp, update.shape)
    grid[axis] = positions
    out = past_cache.copy()
    out[tuple(grid)] = update
    return out


tensor_scatter.infer(same_as_input)


# -- Slice --------------------------------------------------------------------------------

def _slice_bounds(dim, start, end, step):
    """ONNX's clamping: negative bounds count from the end, then clamp to the axis (to
    [-1, dim-1] going backwards, where -1 means 'before the first element')."""
    if step == 0:
        raise ValueError("Slice steps cannot be 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, -1), dim - 1), min(max(end, -1), dim - 1)


def _slice_index(shape, starts, ends, axes, steps):
    rank = len(shape)
    axes = range(len(starts)) if axes is None else [normalize_axis(a, rank) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * rank
    for axis, start, end, step in zip(axes, starts, ends, steps):
        start, end = _slice_bounds(shape[axis], start, end, step)
        # A backward end of -1 means 'through index 0', which Python spells None.
        index[axis] = slice(start, None if end < 0 else end, step)
    return tuple(index)


@op("Slice", since=1)
def slice_1(xp, data, *, starts=None, ends=None, axes=None):
    return data[_slice_index(data.shape, starts, ends, axes, None)]


@op("Slice", since=13)
@op("Slice", since=11)
@op("Slice", since=10)
def slice_(xp, data, starts, ends, axes=None, steps=None):
    optional = [None if t is None else host_ints(t) for t in (axes, steps)]
    return data[_slice_index(data.shape, host_ints(starts), host_ints(ends), *optional)]


def _infer_slice(data, starts, ends, axes, steps):
    if data.shape is None or starts is None or ends is None:
        return [typed(data.dtype, unknown_dims(data.rank))]
    rank = len(data.shape)
    axes = list(range(len(starts))) if axes is None else [normalize_axis(a, rank) for a in axes]
    shape = list(data.shape)
    for i, axis in enumerate(axes):
        shape[axis] = None
    if all(isinstance(data.shape[a], int) for a in axes):
        index = _slice_index(data.shape, starts, ends, axes, steps)
        shape = [len(range(*s.indices(d))) if isinstance(d, int) else d
                 for s, d in zip(index, data.shape)]
    return [typed(data.dtype, shape)]


@slice_1.infer
def _(data, *, starts=None, ends=None, axes=None, **_):
    return _infer_slice(data, starts, ends, axes, None)


@slice_.infer
def _(data, starts, ends, axes=None, steps=None, **_):
    if any(t is not None and t.value is None for t in (axes, steps)):
        return [typed(data.dtype, unknown_dims(data.rank))]
    return _infer_slice(data, const_ints(starts), const_ints(ends), const_ints(axes),
                        const_ints(steps))


# -- Compress, NonZero, Unique ------------------------------------------------------------

@op("Compress", since=11)
@op("Compress", since=9)
def compress(xp, input, condition, *, axis=None):
    if axis is None:
        input, axis = input.reshape(-1), 0
    axis = normalize_axis(axis, input.ndim)
    # The condition may be shorter than the axis; the missing entries count as False.
    kept = xp.nonzero(condition[:input.shape[axis]])[0]
    return xp.take(input, kept, axis=axis)


@compress.infer
def _(input, condition, *, axis=None, **_):
    return [typed(input.dtype, _with_unknown_axis(input.shape, axis))]


def _with_unknown_axis(shape, axis):
    """``shape`` with the length along ``axis`` unknown (flattened when axis is None)."""
    if axis is None or shape is None:
        return (None,) if axis is None else None
    shape = list(shape)
    shape[normalize_axis(axis, len(shape))] = None
    return shape


@op("NonZero", since=13)
@op("NonZero", since=9)
def nonzero(xp, X):
    if X.ndim == 0:  # a scalar is treated as a one-element vector
        X = X.reshape(1)
    return xp.stack(xp.nonzero(X)).astype(np.int64).reshape(X.ndim, -1)


@nonzero.infer
def _(X, **_):
    return [typed(INT64, (None if X.rank is None else max(X.rank, 1), None))]


@op("Unique", since=11)
def unique(xp, X, *, axis=None, sorted=1, _outputs=4):
    if axis is not None:
        axis = normalize_axis(axis, X.ndim)
    values, first, inverse, counts = xp.unique(
        sortable(xp, X), return_index=True, return_inverse=True, return_counts=True,
        axis=axis)
    values = values.astype(X.dtype, copy=False)
    inverse = inverse.reshape(-1)
    if not sorted:
        # Reorder the sorted uniques by where each first occurs in X.
        order = xp.argsort(first, kind="stable")
        rank = xp.empty_like(order)
        rank[order] = xp.arange(len(order))
        values = xp.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    outputs = (values, first.astype(np.int64), inverse.astype(np.int64),
               counts.astype(np.int64))
    return outputs[:_outputs]


@unique.infer
def _(X, *, axis=None, **_):
    if X.shape is None:
        scanned = None
    elif axis is None:
        scanned = math.prod(X.shape) if all(isinstance(d, int) for d in X.shape) else None
    else:
        scanned = X.shape[normalize_axis(axis, len(X.shape))]
    return [typed(X.dtype, _with_unknown_axis(X.shape, axis)), typed(INT64, (None,)),
            typed(INT64, (scanned,)), typed(INT64, (None,))]


# -- TopK, ArgMax, ArgMin -------------------------------------------------------------------

def _checked_k(k, length, axis):
    """k as TopK may take it: 0..length entries of the axis (``length`` None: not known)."""
    if k < 0:
        raise ValueError(f"TopK's k is {k}; expected k >= 0")
    if length is not None and k > length:
        raise ValueError(f"TopK's k is {k}, more than the {length} entries of axis {axis}; "
                         f"expected k <= {length}")
    return k


def _top_k(xp, X, k, axis, largest):
    """Indices of the k largest (or smallest) entries along ``axis``, sorted, ties broken
    by the smaller index first."""
    axis = normalize_axis(axis, X.ndim)
    _checked_k(k, X.shape[axis], axis)
    if xp is np:
        rows = np.moveaxis(X, axis, -1)
        if top_k_select.suits(rows, k):  # k of a long axis: selected, not sorted
            found = top_k_select.top_k_indices(
                rows, k, bool(largest), lambda part: _sorted_top_k(np, part, k, 1, largest))
            indices = np.moveaxis(found, -1, axis)
            return np.take_along_axis(X, indices, axis=axis), indices
    indices = _sorted_top_k(xp, X, k, axis, largest)
    return xp.take_along_axis(X, indices, axis=axis), indices


def _sorted_top_k(xp, X, k, axis, largest):
    """The indices of TopK by a stable sort of the whole axis."""
    keys = sortable(xp, X)
    if largest:
        # Stable-sort the reversed axis ascending, then read it backwards: values descend
        # and equal values come out in ascending original index. (Negating X would not
        # work for unsigned types.)
        n = X.shape[axis]
        order = xp.argsort(xp.flip(keys, axis), axis=axis, kind="stable")
        order = (n - 1) - xp.flip(order, axis)
    else:
        order = xp.argsort(keys, axis=axis, kind="stable")
    return xp.take(order, xp.arange(k), axis=axis).astype(np.int64)


@op("TopK", since=1, dtypes=NUMERIC)
def top_k_1(xp, X, *, axis=-1, k=None):
    return _top_k(xp, X, k, axis, True)


@op("TopK", since=10, dtypes=NUMERIC)
def top_k_10(xp, X, K, *, axis=-1):
    return _top_k(xp, X, int(host_scalar(K)), axis, True)


@op("TopK", since=24, dtypes=NUMERIC)
@op("TopK", since=11, dtypes=NUMERIC)
def top_k(xp, X, K, *, axis=-1, largest=1, sorted=1):
    # Unsorted output may be in any order, so the sorted order serves both.
    return _top_k(xp, X, int(host_scalar(K)), axis, largest)


def _infer_top_k(X, k, axis):
    if X.shape is None:
        if k is not None:
            _checked_k(k, None, axis)
        return [typed(X.dtype, None), typed(INT64, None)]
    shape = list(X.shape)
    axis = normalize_axis(axis, len(shape))
    if k is not None:
        _checked_k(k, shape[axis] if isinstance(shape[axis], int) else None, axis)
    shape[axis] = k
    return [typed(X.dtype, shape), typed(INT64, shape)]


@top_k_1.infer
def _(X, *, axis=-1, k=None, **_):
    return _infer_top_k(X, k, axis)


def _infer_top_k_input(X, K, *, axis=-1, **_):
    k = const_ints(K)
    return _infer_top_k(X, None if k is None else k[0], axis)


top_k_10.infer(_infer_top_k_input)
top_k.infer(_infer_top_k_input)


def _arg_extreme(xp, method, data, axis, keepdims, select_last_index):
    """data's ``argmax``/``argmin`` (``method``) along ``axis``, int64; one array method
    call (NumPy's module functions and expand_dims were ~3 us of a classifier's last node)."""
    axis = normalize_axis(axis, data.ndim)
    if select_last_index:  # the first hit in the reversed axis is the last in the original
        flipped = xp.flip(data, axis)
        result = (data.shape[axis] - 1) - getattr(flipped, method)(axis=axis,
                                                                 keepdims=bool(keepdims))
    else:
        result = getattr(data, method)(axis=axis, keepdims=bool(keepdims))
    return xp.asarray(result, dtype=np.int64)  # reducing a vector yields a scalar


@op("ArgMax", since=12, dtypes=NUMERIC)
@op("ArgMax", since=1, dtypes=NUMERIC)
def argmax(xp, data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg_extreme(xp, "argmax", data, axis, keepdims, select_last_index)


@op("ArgMin", since=12, dtypes=NUMERIC)
@op("ArgMin", since=1, dtypes=NUMERIC)
def argmin(xp, data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg_extreme(xp, "argmin", data, axis, keepdims, select_last_index)


def _infer_arg(data, *, axis=0, keepdims=1, **_):
    return [typed(INT64, reduced_shape(data.shape, [axis], keepdims))]


argmax.infer(_infer_arg)
argmin.infer(_infer_arg)


# -- inputs read on the host only (OpHandle.reads_on_host) ------------------------------------

slice_.reads_on_host(1, 2, 3, 4)
top_k_10.reads_on_host(1)
top_k.reads_on_host(1)
