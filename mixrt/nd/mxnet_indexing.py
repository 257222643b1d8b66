"""MXNet's indexing and ordering names on NDArrays: ``one_hot``, ``pick``, ``take``,
``split``, ``slice_axis``, ``slice``, ``flip``, ``topk``, ``sort``, ``argsort``, ``argmax``,
``argmin`` (``mixrt.nd`` and, traced, ``mixrt.sym`` give them; see ``mxnet_ops.py``).
"""

from __future__ import annotations

from mixrt import tape
from mixrt.base.errors import InputError
from mixrt.nd.mxnet_args import (_INT64_MAX, _array, _axis, _choice, _clip_or_wrap, _dtype,
                                 _index_array, _int, _ints, _invoke, _made_on, _op, _tuple)


def one_hot(indices, depth=None, on_value=1.0, off_value=0.0, dtype="float32", name=None):
    """MXNet's ``one_hot``: a new last axis of length ``depth``, ``on_value`` at each index,
    ``off_value`` elsewhere; an index outside ``[0, depth)`` (negative ones too) gives a row
    of ``off_value``."""
    fn = "one_hot"
    if depth is None:
        raise InputError(f"{fn}: depth is required")
    depth = _int(fn, "depth", depth, 1)
    dtype = _dtype(fn, "dtype", dtype)
    indices = _index_array(fn, "indices", indices, _array(fn, "indices", indices).ctx)
    ctx = indices.ctx
    outside = _op("Or", [_op("Less", [indices, _ints([0], ctx).reshape(())]),
                         _op("GreaterOrEqual", [indices, _ints([depth], ctx).reshape(())])])
    indices = _op("Where", [outside, _ints([depth], ctx).reshape(()), indices])
    # one column more, where the outside indices land, dropped after
    values = _made_on(ctx, "asarray", [off_value, on_value], dtype=dtype)
    out = _op("OneHot", [indices, _ints([depth + 1], ctx), values], axis=-1)
    return slice_axis(out, -1, 0, depth)


def pick(data, index, axis=-1, keepdims=False, mode="clip", name=None):
    """MXNet's ``pick``: ``data``'s entry at ``index`` along ``axis`` (``index`` has the
    data's shape without that axis; ``mode`` clip or wrap for indices out of range;
    ``axis=None`` picks from the flattened data)."""
    fn = "pick"
    data = _array(fn, "data", data)
    _choice(fn, "mode", mode, ("clip", "wrap"))
    index = _index_array(fn, "index", index, data.ctx)
    if axis is None:
        data, axis = data.reshape(-1), 0
        index = index.reshape(-1)[:1] if index.size else index.reshape(-1)
    axis = _axis(fn, axis, data.ndim)
    expected = data.shape[:axis] + data.shape[axis + 1:]
    squeezed = index.shape
    if squeezed != expected:
        if index.shape == data.shape[:axis] + (1,) + data.shape[axis + 1:]:
            squeezed = expected
        else:
            raise InputError(f"{fn}: index must have the data's shape without axis {axis}, "
                             f"{expected}, got {index.shape}")
    index = _clip_or_wrap(fn, index.reshape(squeezed), data.shape[axis], mode)
    out = _op("GatherElements", [data, index.expand_dims(axis)], axis=axis)
    return out if keepdims else out.reshape(expected)


def take(a, indices, axis=0, mode="clip", name=None):
    """MXNet's ``take``: the slices of ``a`` along ``axis`` at ``indices`` (the result's
    shape is ``a.shape[:axis] + indices.shape + a.shape[axis+1:]``); ``mode`` clip, wrap, or
    raise (``InputError`` for an index out of range)."""
    fn = "take"
    a = _array(fn, "a", a)
    _choice(fn, "mode", mode, ("clip", "wrap", "raise"))
    axis = _axis(fn, axis, a.ndim)
    index = _index_array(fn, "indices", indices, a.ctx)
    size = a.shape[axis]
    if mode == "raise":
        raw = index.asnumpy()
        if raw.size and (raw.min() < -size or raw.max() >= size):
            raise InputError(f"{fn}: an index in indices is out of range [{-size}, {size}) "
                             f"for axis {axis} (mode='raise')")
    else:
        index = _clip_or_wrap(fn, index, size, mode)
    return _op("Gather", [a, index], axis=axis)


def split(data, num_outputs=None, axis=1, squeeze_axis=False, name=None):
    """MXNet's ``split`` (``SliceChannel``): ``num_outputs`` equal parts along ``axis`` (a
    list; one NDArray when ``num_outputs`` is 1); ``squeeze_axis`` drops that axis (its
    parts must then be of length 1)."""
    fn = "split"
    data = _array(fn, "data", data)
    if num_outputs is None:
        raise InputError(f"{fn}: num_outputs is required")
    num_outputs = _int(fn, "num_outputs", num_outputs, 1)
    axis = _axis(fn, axis, data.ndim)
    if data.shape[axis] % num_outputs:
        raise InputError(f"{fn}: axis {axis} of length {data.shape[axis]} does not split "
                         f"into num_outputs={num_outputs} equal parts")
    if squeeze_axis and data.shape[axis] != num_outputs:
        raise InputError(f"{fn}: squeeze_axis=True needs num_outputs equal to the length of "
                         f"axis {axis} ({data.shape[axis]}), got {num_outputs}")
    if num_outputs == 1:
        parts = [_op("Identity", [data])]
    else:
        parts = list(_invoke("Split", [data], {"axis": axis, "num_outputs": num_outputs},
                             num_outputs=num_outputs))
    if squeeze_axis:
        parts = [p.reshape(p.shape[:axis] + p.shape[axis + 1:]) for p in parts]
    return parts[0] if num_outputs == 1 else parts


def _slice(data, starts, ends, axes, steps):
    ctx = data.ctx
    return _op("Slice", [data, _ints(starts, ctx), _ints(ends, ctx), _ints(axes, ctx),
                         _ints(steps, ctx)])


def slice_axis(data, axis, begin, end, name=None):
    """MXNet's ``slice_axis``: ``data[..., begin:end, ...]`` along ``axis`` (``end=None``:
    to the end; negative bounds count from the end)."""
    fn = "slice_axis"
    data = _array(fn, "data", data)
    axis = _axis(fn, axis, data.ndim)
    size = data.shape[axis]
    begin = _int(fn, "begin", begin)
    end = size if end is None else _int(fn, "end", end)
    b, e = (begin + size if begin < 0 else begin), (end + size if end < 0 else end)
    if not (0 <= b < e <= size):
        raise InputError(f"{fn}: begin={begin}, end={end} is not a non-empty range of axis "
                         f"{axis} of length {size}")
    return _slice(data, [b], [e], [axis], [1])


def slice(data, begin, end, step=(), name=None):  # noqa: A001 (MXNet's name)
    """MXNet's ``slice``: ``begin``, ``end`` and ``step`` are tuples over the first axes
    (``None`` for the default: the whole axis, or from the end for a negative step)."""
    fn = "slice"
    data = _array(fn, "data", data)
    begin, end, step = (_tuple(fn, "begin", begin), _tuple(fn, "end", end),
                        _tuple(fn, "step", step))
    if len(begin) != len(end):
        raise InputError(f"{fn}: begin {begin} and end {end} must have the same length")
    if len(begin) > data.ndim:
        raise InputError(f"{fn}: begin {begin} has more entries than the data's "
                         f"{data.ndim} dimensions")
    if step and len(step) != len(begin):
        raise InputError(f"{fn}: step {step} must be empty or as long as begin {begin}")
    starts, ends, steps = [], [], []
    for i, (b, e) in enumerate(zip(begin, end)):
        s = 1 if not step or step[i] is None else _int(fn, "step", step[i])
        if s == 0:
            raise InputError(f"{fn}: step must not be 0 (axis {i})")
        size = data.shape[i]
        b = (0 if s > 0 else size - 1) if b is None else _int(fn, "begin", b)
        e = (_INT64_MAX if s > 0 else -_INT64_MAX) if e is None else _int(fn, "end", e)
        starts.append(b)
        ends.append(e)
        steps.append(s)
    if not starts:
        return _op("Identity", [data])
    return _slice(data, starts, ends, list(range(len(starts))), steps)


def flip(data, axis, name=None):
    """MXNet's ``flip`` / ``reverse``: the order along ``axis`` (an int or a tuple)
    reversed."""
    fn = "flip"
    data = _array(fn, "data", data)
    axes = sorted({_axis(fn, a, data.ndim) for a in _tuple(fn, "axis", axis)})
    if not axes:
        return _op("Identity", [data])
    n = len(axes)
    return _slice(data, [-1] * n, [-_INT64_MAX] * n, axes, [-1] * n)


reverse = flip


# -- sorting -----------------------------------------------------------------------------------

def _sort_axis(fn, data, axis):
    if axis is None:
        return data.reshape(-1), 0
    return data, _axis(fn, axis, data.ndim)


def topk(data, axis=-1, k=1, ret_typ="indices", is_ascend=False, dtype="float32", name=None):
    """MXNet's ``topk``: the ``k`` largest (``is_ascend=True``: smallest) entries along
    ``axis`` (``None``: over the flattened data; ``k < 1``: all, a full sort). ``ret_typ``:
    ``indices`` (in ``dtype``, float32 by default, as MXNet), ``value``, ``both``
    (``[value, indices]``), or ``mask`` (1 at the chosen entries, 0 elsewhere, data's
    dtype). The values are differentiable (gathered at the indices)."""
    fn = "topk"
    data = _array(fn, "data", data)
    _choice(fn, "ret_typ", ret_typ, ("value", "indices", "mask", "both"))
    index_dtype = _dtype(fn, "dtype", dtype)
    source, axis = _sort_axis(fn, data, axis)
    size = source.shape[axis]
    k = _int(fn, "k", k)
    if k < 1:
        k = size
    if k > size:
        raise InputError(f"{fn}: k={k} is larger than axis {axis}'s length {size}")
    with _paused():
        _, indices = _invoke("TopK", [source, _ints([k], data.ctx)],
                             {"axis": axis, "largest": int(not is_ascend), "sorted": 1},
                             num_outputs=2)
    if ret_typ == "mask":
        if source is not data:
            raise InputError(f"{fn}: ret_typ='mask' needs an axis, got axis=None")
        zeros = data.zeros_like()
        ones = _made_on(data.ctx, "ones", indices.shape, dtype=data.dtype)
        return _op("ScatterElements", [zeros, indices, ones], axis=axis)
    if ret_typ in ("value", "both"):
        values = _op("GatherElements", [source, indices], axis=axis)
        if ret_typ == "value":
            return values
        return [values, indices.astype(index_dtype)]
    return indices.astype(index_dtype)


def sort(data, axis=-1, is_ascend=True, name=None):
    """MXNet's ``sort`` along ``axis`` (``None``: the flattened data); differentiable."""
    return topk(data, axis=axis, k=0, ret_typ="value", is_ascend=is_ascend)


def argsort(data, axis=-1, is_ascend=True, dtype="float32", name=None):
    """MXNet's ``argsort``: the indices that sort ``data`` along ``axis``, in ``dtype``
    (float32 by default, as MXNet)."""
    return topk(data, axis=axis, k=0, ret_typ="indices", is_ascend=is_ascend, dtype=dtype)


def _paused():
    return tape.pause(train_mode=tape.is_training())


def argmax(data, axis=None, keepdims=False, name=None):
    """Indices of the largest entries along ``axis`` (``None``: the flattened data, shape
    ``(1,)``), as floats of the data's dtype, as MXNet's."""
    return _arg_index("argmax", data, axis, keepdims)


def argmin(data, axis=None, keepdims=False, name=None):
    """Indices of the smallest entries along ``axis``, as ``argmax``."""
    return _arg_index("argmin", data, axis, keepdims)


def _arg_index(fn: str, data, axis, keepdims: bool):
    data = _array(fn, "data", data)
    if axis is not None:
        axis = _axis(fn, axis, data.ndim)
    index = getattr(data, fn)(axis=axis, keepdims=keepdims)
    if axis is None and not keepdims and index.shape != (1,):
        index = index.reshape((1,))
    return index if index.dtype == data.dtype else index.astype(data.dtype)


# -- shapes ------------------------------------------------------------------------------------
