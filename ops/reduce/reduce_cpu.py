"""ReduceMean on the CPU over an input's trailing axes (a CNN's spatial mean, as
torchvision's ShuffleNetV2 and EfficientNet-style heads write ``x.mean([2, 3])``) as one
compiled pass over rows, the global average pool's (``ops/pool/plane_pools.whole_plane_call``):
NumPy's reduction over small inner axes pays ~60 ns a row (1 x 1024 x 3 x 3: ~70 us, the
pass ~2). CumSum's plain scan (forward, inclusive, in the input's own integer or float
dtype) as one ``np.cumsum`` into the plan's view. Anything else is the generic kernel's.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled.bound_calls import binds
from mixrt.ops.compiled.out_arrays import into
from mixrt.ops.ir.types import normalize_axis, reduced_shape
from mixrt.ops.pool import plane_pools
from mixrt.ops.reduce.reduce import (_axes_from_input, _sum_dtype, cum_sum, reduce_mean,
                                     reduce_mean_axes_input)


def _rows_call(data, axes, keepdims, out):
    """(the output, a call of data writing it) where ``axes`` are data's last ones and the
    compiled pass applies, else None; ``out``: the plan's view or None (a new array)."""
    if not isinstance(data, np.ndarray) or data.ndim < 2 or not axes:
        return None
    rank = data.ndim
    chosen = sorted({normalize_axis(int(a), rank) for a in axes})
    if chosen != list(range(chosen[0], rank)) or chosen[0] == 0:
        return None
    shape = reduced_shape(data.shape, tuple(chosen), bool(keepdims))
    if out is None:
        out = np.empty(shape, data.dtype)
    elif out.shape != shape or out.dtype != data.dtype or np.may_share_memory(out, data):
        return None
    # the pass reads (N, C, rest) planes: leading axes merged into one row index
    leading = int(np.prod(data.shape[:chosen[0]]))
    rows = data.reshape(leading, 1, -1)
    call = plane_pools.whole_plane_call(rows, out.reshape(leading, 1), False)
    if call is None:
        return None
    return out, lambda data: call(data.reshape(leading, 1, -1))


@reduce_mean.fast("cpu")
def reduce_mean_cpu(xp, data, *, axes=None, keepdims=1, out=None):
    found = _rows_call(data, axes, keepdims, out)
    if found is None:
        return into(out, reduce_mean(xp, data, axes=axes, keepdims=keepdims))
    result, call = found
    call(data)
    return result


@reduce_mean_axes_input.fast("cpu")
def reduce_mean_axes_input_cpu(xp, data, axes=None, *, keepdims=1, noop_with_empty_axes=0,
                               out=None):
    found = _rows_call(data, _axes_from_input(axes), keepdims, out)
    if found is None:
        return into(out, reduce_mean_axes_input(xp, data, axes, keepdims=keepdims,
                                                noop_with_empty_axes=noop_with_empty_axes))
    result, call = found
    call(data)
    return result


# their planned calls, bound once per arena (ops/compiled/bound_calls.py)

@binds(reduce_mean_cpu, feeds=True)
def bind_reduce_mean(args, out, attributes):
    return _bound(args[0], attributes.get("axes"), attributes.get("keepdims", 1), out)


@binds(reduce_mean_axes_input_cpu)
def bind_reduce_mean_axes_input(args, out, attributes):
    """Bound where the axes are those of the bind (a constant, as exporters write them);
    a call with other axes takes the kernel."""
    axes = args[1] if len(args) > 1 else None
    if axes is None:
        return None
    call = _bound(args[0], _axes_from_input(axes), attributes.get("keepdims", 1), out)
    if call is None:
        return None
    noop = attributes.get("noop_with_empty_axes", 0)
    keepdims = attributes.get("keepdims", 1)
    return _while_settled(axes, call, lambda data, axes: reduce_mean_axes_input_cpu(
        np, data, axes, keepdims=keepdims, noop_with_empty_axes=noop, out=out))


def _while_settled(value, call, kernel):
    """``call(x)`` for a bound step whose second input is ``value`` at the bind (axes a
    constant holds, as exporters write them), ``kernel(x, other)`` for a call with another
    (which only a graph that computes it can bring)."""
    settled = np.asarray(value).tobytes()

    def checked(x, value):
        if value.tobytes() != settled:
            return kernel(x, value)
        return call(x)
    return checked


def _bound(data, axes, keepdims, out):
    found = _rows_call(data, axes, keepdims, out)
    if found is None or found[0] is not out:
        return None
    _, reduce = found

    def call(data):
        reduce(data)
        return out
    return call


# -- CumSum ----------------------------------------------------------------------------------------
#
# RoBERTa's exports (and XLM-R's, Longformer's) number their positions by a CumSum of the
# attention mask over its (batch, length) tokens: the generic scan's axis moves, copies and
# casts took ~125-145 us of every run, bound or not, against ~4 us hot for one np.cumsum.

def _plain_scan(x, axis, exclusive, reverse, out) -> int | None:
    """The axis of a scan ``np.cumsum`` writes into ``out`` as the generic kernel would
    (forward, inclusive, summed in x's own dtype, apart from x), else None."""
    if exclusive or reverse or out is None or out.__class__ is not np.ndarray \
            or x.__class__ is not np.ndarray or x.ndim == 0 or out.shape != x.shape \
            or out.dtype != x.dtype or _sum_dtype(x.dtype) != x.dtype \
            or np.may_share_memory(out, x):
        return None
    return normalize_axis(_axes_from_input(axis)[0], x.ndim)


@cum_sum.fast("cpu")
def cum_sum_cpu(xp, x, axis, *, exclusive=0, reverse=0, out=None):
    along = _plain_scan(x, axis, exclusive, reverse, out)
    if along is None:
        return into(out, cum_sum(xp, x, axis, exclusive=exclusive, reverse=reverse))
    return np.cumsum(x, axis=along, out=out)


@binds(cum_sum_cpu)
def bind_cum_sum(args, out, attributes):
    """Bound where the axis is the bind's (a constant, as exporters write it); a call with
    another takes the kernel."""
    x, axis = args[0], args[1]
    along = _plain_scan(x, axis, attributes.get("exclusive", 0), attributes.get("reverse", 0),
                        out)
    if along is None:
        return None
    cumsum = np.cumsum
    return _while_settled(axis, lambda x: cumsum(x, axis=along, out=out),
                          lambda x, axis: cum_sum_cpu(np, x, axis, out=out))
