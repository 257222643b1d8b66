"""NumPy ``out=`` paths of the shape and index ops whose copies carry many bytes (Expand,
ScatterElements, Concat and Transpose) or whose checks cost more than their copy (Gather of
a few indices), written into the arena view the executor hands them
(the rules: ``ops/compiled/out_arrays.py``). Signatures are the generic kernels' plus
``out``.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled.out_arrays import into
from mixrt.ops.compiled.bound_calls import binds
from mixrt.ops.ir.types import normalize_axis
from mixrt.ops.shape.index import _slice_index, gather, scatter_elements, slice_
from mixrt.ops.shape.shape import concat, expand, host_ints, transpose


@expand.fast("cpu")
def expand_cpu(xp, input, shape, *, out=None):
    """One broadcasting copy into ``out``: ``np.array`` of the zero-stride view took 55 us
    for Llama's grouped key heads (1, 2, 1, 64, 64) -> (1, 2, 2, 64, 64), copyto 7."""
    target = np.broadcast_shapes(input.shape, tuple(host_ints(shape)))
    if out is None:
        out = np.empty(target, input.dtype)
    elif out.shape != target or out.dtype != input.dtype or np.may_share_memory(out, input):
        return into(out, expand(xp, input, shape))
    np.copyto(out, np.broadcast_to(input, target))
    return out


@binds(expand_cpu)
def _bind_expand(args, out, attributes):
    """One broadcasting copy into ``out``. A static output means the plan knew the target
    shape, so the shape input holds the same numbers on every run of the arena."""
    input, shape = args
    if out is None or not isinstance(input, np.ndarray) or out.dtype != input.dtype \
            or np.may_share_memory(out, input) \
            or out.shape != np.broadcast_shapes(input.shape, tuple(host_ints(shape))):
        return None
    copyto = np.copyto

    def call(input, shape):
        copyto(out, input)
        return out
    return call


@scatter_elements.fast("cpu")
def scatter_elements_cpu(xp, data, indices, updates, *, axis=0, reduction="none", out=None):
    """Plain ScatterElements (no reduction) as one flat assignment at linear offsets: the
    generic tuple of broadcast index grids cost ~4.5 ns an element (Faster R-CNN's RoI
    features, (150, 256, 7, 7), 8 ms a call). An index past either end raises IndexError,
    as the generic kernel's fancy assignment does."""
    if reduction != "none" or data.ndim == 0 or indices.shape != updates.shape \
            or indices.ndim != data.ndim or not isinstance(data, np.ndarray) \
            or any(n > d for n, d in zip(indices.shape, data.shape)):
        return into(out, scatter_elements(xp, data, indices, updates, axis=axis,
                                           reduction=reduction))
    axis = normalize_axis(axis, data.ndim)
    length = data.shape[axis]
    along = indices.astype(np.int64, copy=True)
    if along.size and (along.min() < -length or along.max() >= length):
        bad = int(along.min()) if along.min() < -length else int(along.max())
        raise IndexError(f"index {bad} is out of bounds for axis {axis} of size {length}; "
                         f"expected every index within [-{length}, {length})")
    along[along < 0] += length
    strides = [int(np.prod(data.shape[i + 1:], dtype=np.int64)) for i in range(data.ndim)]
    along *= strides[axis]
    for dim, (count, stride) in enumerate(zip(indices.shape, strides)):
        if dim != axis and count > 1:
            along += (np.arange(count, dtype=np.int64) * stride).reshape(
                (1,) * dim + (count,) + (1,) * (data.ndim - dim - 1))
    result = out if out is not None and out.shape == data.shape and out.dtype == data.dtype \
        and out.flags.c_contiguous and not np.may_share_memory(out, updates) else None
    if result is None:
        result = np.array(data, order="C")
    elif result is not data:
        np.copyto(result, data)
    result.reshape(-1)[along.reshape(-1)] = updates.reshape(-1)
    return into(out, result)


# indices up to which Gather takes np.take's checked form (it buffers the result when it
# checks, a copy that costs more than the generic kernel's checks only for many rows)
TAKE_INDICES = 64


@gather.fast("cpu")
def gather_cpu(xp, data, indices, *, axis=0, out=None):
    """A few indices (a decoder step's token, a classifier's columns) through ``np.take``
    straight into ``out``: it counts a negative index from the end and raises IndexError
    for one outside [-dim, dim), as ONNX asks, where the generic kernel's wrap (a cast, a
    min and a where) took ~3 of a token embedding's ~4 us."""
    if not (isinstance(data, np.ndarray) and isinstance(indices, np.ndarray)
            and indices.dtype.kind in "iu" and indices.size <= TAKE_INDICES):
        return into(out, gather(xp, data, indices, axis=axis))
    axis = normalize_axis(axis, data.ndim)
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
    if out is None or out.shape != shape or out.dtype != data.dtype \
            or np.may_share_memory(out, data):
        return into(out, np.asarray(np.take(data, indices, axis=axis)))
    return np.take(data, indices, axis=axis, out=out)


@concat.fast("cpu")
def concat_cpu(xp, *inputs, axis=None, out=None):
    if out is None or not all(isinstance(x, np.ndarray) and x.dtype == out.dtype
                              for x in inputs):
        return into(out, concat(xp, *inputs, axis=axis))
    axis = normalize_axis(1 if axis is None else axis, out.ndim)
    if in_place(inputs, out, axis):
        return out
    return np.concatenate(inputs, axis=axis, out=out)


def in_place(inputs, out: np.ndarray, axis: int) -> bool:
    """Whether the inputs already are their parts of ``out``: every dim of ``out`` before
    ``axis`` 1, and the inputs C-contiguous, one after another from its first byte to its
    last, which is then their concatenation (the plan lays a Concat's inputs so where it
    can: ``runtime/concat_in_place.concat_composites``)."""
    if not out.flags.c_contiguous or math.prod(out.shape[:axis]) != 1:
        return False
    start = at = out.__array_interface__["data"][0]
    for x in inputs:
        if not x.flags.c_contiguous or x.__array_interface__["data"][0] != at:
            return False
        at += x.nbytes
    return at == start + out.nbytes


@slice_.fast("cpu")
def slice_cpu(xp, data, starts, ends, axes=None, steps=None, *, out=None):
    """The generic kernel's view, copied into ``out`` where the plan gives one (the run
    loop copied it there after the kernel: the same bytes, one step fewer)."""
    return into(out, slice_(xp, data, starts, ends, axes, steps))


@transpose.fast("cpu")
def transpose_cpu(xp, data, *, perm=None, out=None):
    if out is None:
        return transpose(xp, data, perm=perm)
    np.copyto(out, np.transpose(data, perm))
    return out


# their planned calls, bound once per arena (ops/compiled/bound_calls.py)

@binds(transpose_cpu, feeds=True)
def bind_transpose(args, out, attributes):
    perm = attributes.get("perm")

    def call(data):
        np.copyto(out, np.transpose(data, perm))
        return out
    return call


@binds(gather_cpu, feeds=True)
def bind_gather(args, out, attributes):
    """``np.take`` into ``out`` where ``gather_cpu`` takes it (indices are checked by it on
    every call, as ONNX asks)."""
    data, indices = args
    if not (isinstance(data, np.ndarray) and isinstance(indices, np.ndarray)
            and indices.dtype.kind in "iu" and indices.size <= TAKE_INDICES):
        return None
    axis = normalize_axis(attributes.get("axis", 0), data.ndim)
    if out.shape != data.shape[:axis] + indices.shape + data.shape[axis + 1:] \
            or out.dtype != data.dtype or np.may_share_memory(out, data):
        return None
    return lambda data, indices: np.take(data, indices, axis=axis, out=out)


@binds(concat_cpu, feeds=True)
def bind_concat(args, out, attributes):
    """``np.concatenate`` into ``out`` where ``concat_cpu`` takes it (a ShuffleNet's 16
    channel joins took ~5 us each through the kernel, mostly its checks)."""
    if not all(isinstance(x, np.ndarray) and x.dtype == out.dtype for x in args):
        return None
    axis = attributes.get("axis")
    axis = normalize_axis(1 if axis is None else axis, out.ndim)
    if in_place(args, out, axis):
        # the producers write there on every run: a bound call's inputs are the arena's
        # views, made once per arena, and a feed is never inside an arena slot
        return lambda *inputs: out
    return lambda *inputs: np.concatenate(inputs, axis=axis, out=out)


@binds(slice_cpu)
def bind_slice(args, out, attributes):
    """The copy of the slice the kernel takes, its index worked out once from the starts,
    ends, axes and steps of the bind, which are constants or values a graph computes (a
    ShuffleNet's 26 channel halves: ~7 us a call through the kernel, host_ints and the index
    each time). A call whose numbers differ from those takes the kernel."""
    data, params = args[0], args[1:]
    if not isinstance(data, np.ndarray) or out.dtype != data.dtype \
            or not all(p is None or isinstance(p, np.ndarray) for p in params):
        return None
    starts, ends, axes, steps = (tuple(params) + (None, None))[:4]
    index = _slice_index(data.shape, host_ints(starts), host_ints(ends),
                         None if axes is None else host_ints(axes),
                         None if steps is None else host_ints(steps))
    if data[index].shape != out.shape or np.may_share_memory(out, data):
        return None
    settled = _numbers(params)

    def call(data, *params):
        if _numbers(params) != settled:
            return slice_cpu(np, data, *params, out=out)
        np.copyto(out, data[index])
        return out
    return call


def _numbers(params) -> tuple:
    return tuple(None if p is None else p.tobytes() for p in params)
