"""MXNet 1.x's most-used operator names on NDArrays (``nd.one_hot``, ``nd.softmax``,
``nd.broadcast_add``, ``x.topk(...)``, ...), with MXNet's argument names and defaults (its
layers, ``nd.FullyConnected`` and the rest, are ``mixrt/nd/array_layers.py``'s).

Each is composed of registered ops run through ``mixrt.dispatch`` (so it runs on the
array's device and, under ``autograd.record()``, its gradient flows through the ops' own
gradient definitions). Where MXNet's result differs from the ONNX op's (``round`` rounds half
away from zero, ``one_hot`` of a negative index is all ``off_value``, ``topk`` indices are
float32 by default) the composition follows MXNet. Bad arguments raise ``InputError`` naming
the argument. Conventions of mixrt's NDArray still hold (see its docstring): a reduction over
every axis gives shape ``()``, ``argmax``/``argmin`` give int64 indices.

The names that are NDArray methods in MXNet (``x.split``, ``x.topk``, ``x.pick``, ...) are
attached to ``NDArray`` at import (``METHODS``).

The same functions serve ``hybrid_forward`` (``F.broadcast_add``, ``F.slice_axis``, ...):
``mixrt.sym.mxnet_ops`` calls them on a stand-in for the Symbol being traced, which has the
trace's static shape and dtype and answers ``traced_op`` by adding the op to the graph. The
hooks here (``_invoke``, ``_ints``, ``_made_on``, ``_array``) send every op and constant its
way, so one body serves both and the two cannot drift apart.
"""

from __future__ import annotations

import numpy as np

from mixrt import autograd, dispatch
from mixrt.base.errors import DeviceMismatchError, InputError
from mixrt.nd.ndarray import _ints as _device_ints, NDArray

_INT64_MAX = 2 ** 62  # a Slice bound past any dimension (ONNX clamps it)


# -- helpers -----------------------------------------------------------------------------------

def _op(op_type: str, inputs: list, **attributes):
    return _invoke(op_type, inputs, attributes)


def _invoke(op_type: str, inputs: list, attributes: dict, num_outputs=None, domain=""):
    """Run the op on NDArrays, or add it to the traced graph when an input stands in for a
    traced Symbol (mixrt.sym.mxnet_ops)."""
    for value in inputs:
        if _is_traced(value):
            return value.traced_op(op_type, inputs, attributes, num_outputs, domain)
    return dispatch.invoke(domain, op_type, inputs, attributes, num_outputs)


def _is_traced(value) -> bool:
    return hasattr(value, "traced_op")


def _ints(values, ctx):
    """int64 constants on ``ctx`` (a NumPy array, baked into the graph, while tracing)."""
    if getattr(ctx, "traced", False):
        return np.asarray([int(v) for v in values], dtype=np.int64)
    return _device_ints(values, ctx)


def _array(fn: str, arg: str, value) -> NDArray:
    if not isinstance(value, NDArray) and not _is_traced(value):
        raise InputError(f"{fn}: {arg} must be an NDArray, got {type(value).__name__}")
    return value


def _int(fn: str, arg: str, value, minimum=None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InputError(f"{fn}: {arg} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise InputError(f"{fn}: {arg} must be at least {minimum}, got {value}")
    return int(value)


def _axis(fn: str, axis, ndim: int, arg: str = "axis") -> int:
    axis = _int(fn, arg, axis)
    if not -ndim <= axis < ndim:
        raise InputError(f"{fn}: {arg}={axis} is out of range for an array of {ndim} "
                         f"dimensions (expected {-ndim} <= {arg} < {ndim})")
    return axis % ndim


def _choice(fn: str, arg: str, value, allowed) -> str:
    if value not in allowed:
        raise InputError(f"{fn}: {arg}={value!r} is not one of {list(allowed)}")
    return value


def _dtype(fn: str, arg: str, dtype) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise InputError(f"{fn}: {arg}={dtype!r} is not a dtype") from exc


def _tuple(fn: str, arg: str, value) -> tuple:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),)
    if not isinstance(value, (tuple, list)):
        raise InputError(f"{fn}: {arg} must be an int or a tuple of ints, got {value!r}")
    return tuple(value)


def _index_array(fn: str, arg: str, value, ctx) -> NDArray:
    """An index argument as int64 on ``ctx`` (MXNet's index arrays are usually float32:
    their values index, truncated)."""
    value = _array(fn, arg, value)
    if value.ctx != ctx:
        raise DeviceMismatchError(f"{fn}: {arg} is on {value.ctx}, the data on {ctx}; move "
                                  f"it with .as_in_context({ctx})")
    if value.dtype.kind not in "iufb":
        raise InputError(f"{fn}: {arg} must hold numbers, got {value.dtype}")
    return value if value.dtype == np.int64 else value.astype(np.int64)


def _scalar(value, like: NDArray) -> NDArray:
    return _made_on(like.ctx, "asarray", value, dtype=like.dtype)


def _made_on(ctx, factory: str, *args, **kwargs) -> NDArray:
    """``xp.<factory>(...)`` as an NDArray on ``ctx``, made with its GPU current (a NumPy
    constant while tracing)."""
    if getattr(ctx, "traced", False):
        return getattr(np, factory)(*args, **kwargs)
    with ctx.device.active():
        return NDArray(getattr(ctx.xp, factory)(*args, **kwargs), ctx)


def _clip_or_wrap(fn: str, index: NDArray, size: int, mode: str) -> NDArray:
    if mode == "wrap":
        return _op("Mod", [index, _ints([size], index.ctx).reshape(())], fmod=0)
    low = _ints([0], index.ctx).reshape(())
    high = _ints([size - 1], index.ctx).reshape(())
    return _op("Clip", [index, low, high])


def _softmax(fn, op_type, data, length, axis, temperature, dtype, use_length):
    data = _array(fn, "data", data)
    axis = _axis(fn, axis, data.ndim)
    if temperature is not None and float(temperature) != 1.0:
        if float(temperature) == 0.0:
            raise InputError(f"{fn}: temperature must not be 0")
        data = data / float(temperature)
    if dtype is not None:
        target = _dtype(fn, "dtype", dtype)
        if target not in (np.float16, np.float32, np.float64):
            raise InputError(f"{fn}: dtype must be None, 'float16', 'float32' or 'float64', "
                             f"got {dtype!r}")
        if target != data.dtype:
            data = data.astype(target)
    if not use_length:
        return _op(op_type, [data], axis=axis)
    if length is None:
        raise InputError(f"{fn}: use_length=True needs the length array")
    length = _index_array(fn, "length", length, data.ctx)
    expected = data.shape[:axis] + data.shape[axis + 1:]
    if length.shape != expected:
        raise InputError(f"{fn}: length must have the data's shape without axis {axis}, "
                         f"{expected}, got {length.shape}")
    positions = _made_on(data.ctx, "arange", data.shape[axis], dtype=np.int64).reshape(
        (-1,) + (1,) * (data.ndim - 1 - axis))
    mask = positions < length.expand_dims(axis)
    low = _scalar(-np.inf, data)
    out = _op(op_type, [_op("Where", [mask, data, low])], axis=axis)
    return _op("Where", [mask, out, _scalar(0, data)])


def softmax(data, length=None, axis=-1, temperature=None, dtype=None, use_length=False,
            name=None):
    """MXNet's ``softmax``: ``exp(x / temperature)`` normalised along ``axis``; ``dtype``
    casts the input first; ``use_length=True`` takes only the first ``length`` entries along
    ``axis`` (the others are 0)."""
    return _softmax("softmax", "Softmax", data, length, axis, temperature, dtype, use_length)


def log_softmax(data, axis=-1, temperature=None, dtype=None, use_length=False, length=None,
                name=None):
    """MXNet's ``log_softmax`` (arguments as ``softmax``; with ``use_length`` the masked
    entries are 0 here)."""
    return _softmax("log_softmax", "LogSoftmax", data, length, axis, temperature, dtype,
                    use_length)


def SequenceMask(data, sequence_length=None, use_sequence_length=False, value=0.0, axis=0,
                 name=None):
    """MXNet's ``SequenceMask``: along ``axis`` (0: ``(time, batch, ...)``, 1:
    ``(batch, time, ...)``), the steps at or past each batch entry's ``sequence_length``
    become ``value``. Without ``use_sequence_length`` the data is returned unchanged."""
    fn = "SequenceMask"
    data = _array(fn, "data", data)
    axis = _int(fn, "axis", axis)
    if axis not in (0, 1):
        raise InputError(f"{fn}: axis must be 0 or 1, got {axis}")
    if data.ndim < 2:
        raise InputError(f"{fn}: data must have at least 2 dimensions, got {data.shape}")
    if not use_sequence_length:
        return _op("Identity", [data])
    if sequence_length is None:
        raise InputError(f"{fn}: use_sequence_length=True needs sequence_length")
    lengths = _array(fn, "sequence_length", sequence_length)
    batch = data.shape[1 - axis]
    if lengths.shape != (batch,):
        raise InputError(f"{fn}: sequence_length must have shape (batch,) = ({batch},), got "
                         f"{lengths.shape}")
    steps = _made_on(data.ctx, "arange", data.shape[axis], dtype=np.float64)
    steps = steps.reshape((-1, 1) if axis == 0 else (1, -1))
    lengths = lengths.astype(np.float64).reshape((1, -1) if axis == 0 else (-1, 1))
    mask = steps < lengths
    mask = mask.reshape(mask.shape + (1,) * (data.ndim - 2))
    return _op("Where", [mask, data, _scalar(value, data)])


# -- indexing ----------------------------------------------------------------------------------

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
    outside = _op("Or", [indices < 0, indices >= depth])
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
    return autograd.pause(train_mode=autograd.is_training())


def argmax(data, axis=None, keepdims=False, name=None):
    """Indices of the largest entries along ``axis`` (``None``: the flattened data). int64,
    as ``NDArray.argmax`` (MXNet's are floats)."""
    data = _array("argmax", "data", data)
    if axis is not None:
        axis = _axis("argmax", axis, data.ndim)
    return data.argmax(axis=axis, keepdims=keepdims)


def argmin(data, axis=None, keepdims=False, name=None):
    """Indices of the smallest entries along ``axis`` (``None``: the flattened data). int64,
    as ``NDArray.argmin`` (MXNet's are floats)."""
    data = _array("argmin", "data", data)
    if axis is not None:
        axis = _axis("argmin", axis, data.ndim)
    return data.argmin(axis=axis, keepdims=keepdims)


# -- shapes ------------------------------------------------------------------------------------

def broadcast_to(data, shape, name=None):
    """MXNet's ``broadcast_to``: ``data`` repeated along its length-1 axes to ``shape`` (a 0
    in ``shape`` keeps that dimension)."""
    fn = "broadcast_to"
    data = _array(fn, "data", data)
    shape = _tuple(fn, "shape", shape)
    if len(shape) != data.ndim:
        raise InputError(f"{fn}: shape {shape} must have the data's {data.ndim} dimensions "
                         f"(data {data.shape})")
    target = tuple(d if int(s) == 0 else int(s) for d, s in zip(data.shape, shape))
    for d, s in zip(data.shape, target):
        if d != s and d != 1:
            raise InputError(f"{fn}: cannot broadcast {data.shape} to shape {shape}: only "
                             f"length-1 axes broadcast")
    return _op("Expand", [data, _ints(target, data.ctx)])


def broadcast_like(lhs, rhs, lhs_axes=None, rhs_axes=None, name=None):
    """MXNet's ``broadcast_like``: ``lhs`` broadcast to ``rhs``'s shape (or, with
    ``lhs_axes`` and ``rhs_axes``, those axes of ``lhs`` to the sizes of those of ``rhs``)."""
    fn = "broadcast_like"
    lhs, rhs = _array(fn, "lhs", lhs), _array(fn, "rhs", rhs)
    if (lhs_axes is None) != (rhs_axes is None):
        raise InputError(f"{fn}: lhs_axes and rhs_axes must be given together")
    if lhs_axes is None:
        if lhs.ndim != rhs.ndim:
            raise InputError(f"{fn}: lhs {lhs.shape} and rhs {rhs.shape} must have the same "
                             f"number of dimensions")
        return broadcast_to(lhs, rhs.shape)
    lhs_axes, rhs_axes = _tuple(fn, "lhs_axes", lhs_axes), _tuple(fn, "rhs_axes", rhs_axes)
    if len(lhs_axes) != len(rhs_axes):
        raise InputError(f"{fn}: lhs_axes {lhs_axes} and rhs_axes {rhs_axes} must have the "
                         f"same length")
    target = list(lhs.shape)
    for la, ra in zip(lhs_axes, rhs_axes):
        target[_axis(fn, la, lhs.ndim, "lhs_axes")] = rhs.shape[_axis(fn, ra, rhs.ndim,
                                                                      "rhs_axes")]
    return broadcast_to(lhs, tuple(target))


def broadcast_axis(data, axis=(), size=(), name=None):
    """MXNet's ``broadcast_axis`` (``broadcast_axes``): the length-1 ``axis`` of ``data``
    repeated to ``size``."""
    fn = "broadcast_axis"
    data = _array(fn, "data", data)
    axis, size = _tuple(fn, "axis", axis), _tuple(fn, "size", size)
    if len(axis) != len(size):
        raise InputError(f"{fn}: axis {axis} and size {size} must have the same length")
    target = list(data.shape)
    for a, s in zip(axis, size):
        target[_axis(fn, a, data.ndim)] = _int(fn, "size", s, 1)
    return broadcast_to(data, tuple(target))


def _broadcast(fn: str, op_type: str, compare: bool = False):
    def function(lhs, rhs, name=None):
        lhs, rhs = _array(fn, "lhs", lhs), _array(fn, "rhs", rhs)
        if lhs.ndim != rhs.ndim:
            raise InputError(f"{fn}: lhs {lhs.shape} and rhs {rhs.shape} must have the same "
                             f"number of dimensions")
        for a, b in zip(lhs.shape, rhs.shape):
            if a != b and 1 not in (a, b):
                raise InputError(f"{fn}: shapes {lhs.shape} and {rhs.shape} do not "
                                 f"broadcast (only length-1 axes do)")
        if op_type == "NotEqual":
            out = _op("Not", [_op("Equal", [lhs, rhs])])
        elif op_type == "Mod":
            out = lhs % rhs
        else:
            out = _op(op_type, [lhs, rhs])
        return out.astype(lhs.dtype) if compare else out
    function.__name__ = function.__qualname__ = fn
    function.__doc__ = (f"MXNet's ``{fn}``: ``{op_type}`` of ``lhs`` and ``rhs`` with "
                        f"length-1 axes broadcast (both of the same rank)"
                        + ("; 0/1 in lhs's dtype, as MXNet." if compare else "."))
    return function


_BROADCASTS = {"add": ("Add", False), "plus": ("Add", False), "sub": ("Sub", False),
               "minus": ("Sub", False), "mul": ("Mul", False), "div": ("Div", False),
               "mod": ("Mod", False), "power": ("Pow", False), "maximum": ("Max", False),
               "minimum": ("Min", False), "equal": ("Equal", True),
               "not_equal": ("NotEqual", True), "greater": ("Greater", True),
               "greater_equal": ("GreaterOrEqual", True), "lesser": ("Less", True),
               "lesser_equal": ("LessOrEqual", True)}
for _name, (_op_type, _compare) in _BROADCASTS.items():
    globals()[f"broadcast_{_name}"] = _broadcast(f"broadcast_{_name}", _op_type, _compare)


def tile(data, reps, name=None):
    """MXNet's ``tile``: ``data`` repeated ``reps`` times per axis (fewer reps than axes
    count from the last axis; more reps than axes add leading axes)."""
    fn = "tile"
    data = _array(fn, "data", data)
    reps = tuple(_int(fn, "reps", r, 0) for r in _tuple(fn, "reps", reps))
    if len(reps) > data.ndim:
        data = data.reshape((1,) * (len(reps) - data.ndim) + data.shape)
    reps = (1,) * (data.ndim - len(reps)) + reps
    return _op("Tile", [data, _ints(reps, data.ctx)])


def repeat(data, repeats, axis=None, name=None):
    """MXNet's ``repeat``: each entry repeated ``repeats`` times along ``axis`` (``None``:
    the flattened data)."""
    fn = "repeat"
    data = _array(fn, "data", data)
    repeats = _int(fn, "repeats", repeats, 0)
    if axis is None:
        data, axis = data.reshape(-1), 0
    axis = _axis(fn, axis, data.ndim)
    expanded = data.expand_dims(axis + 1)
    reps = [1] * expanded.ndim
    reps[axis + 1] = repeats
    tiled = _op("Tile", [expanded, _ints(reps, data.ctx)])
    shape = data.shape[:axis] + (data.shape[axis] * repeats,) + data.shape[axis + 1:]
    return tiled.reshape(shape)


# -- products and norms ------------------------------------------------------------------------

def dot(lhs, rhs, transpose_a=False, transpose_b=False, forward_stype=None, name=None):
    """MXNet's ``dot``: for 2-D arrays the matrix product; for N-D, the last axis of ``lhs``
    with the first of ``rhs`` (``transpose_a``/``transpose_b`` reverse all of an array's
    axes first). Two vectors give a 0-d array (MXNet: shape (1,))."""
    fn = "dot"
    lhs, rhs = _array(fn, "lhs", lhs), _array(fn, "rhs", rhs)
    if lhs.ndim == 0 or rhs.ndim == 0:
        raise InputError(f"{fn}: lhs {lhs.shape} and rhs {rhs.shape} must have at least one "
                         f"dimension")
    if transpose_a and lhs.ndim > 1:
        lhs = lhs.transpose(*reversed(range(lhs.ndim)))
    if transpose_b and rhs.ndim > 1:
        rhs = rhs.transpose(*reversed(range(rhs.ndim)))
    if lhs.shape[-1] != rhs.shape[0]:
        raise InputError(f"{fn}: lhs's last axis ({lhs.shape}) must match rhs's first "
                         f"({rhs.shape})" + (" after transpose_a/transpose_b"
                                             if transpose_a or transpose_b else ""))
    if lhs.ndim <= 2 and rhs.ndim <= 2:
        return _op("MatMul", [lhs, rhs])
    out_shape = lhs.shape[:-1] + rhs.shape[1:]
    flat = _op("MatMul", [lhs.reshape(-1, lhs.shape[-1]), rhs.reshape(rhs.shape[0], -1)])
    return flat.reshape(out_shape)


def batch_dot(lhs, rhs, transpose_a=False, transpose_b=False, forward_stype=None, name=None):
    """MXNet's ``batch_dot``: matrix products of ``lhs[i]`` and ``rhs[i]`` (3-D or more,
    the same leading axes); ``transpose_a``/``transpose_b`` swap each matrix's two axes."""
    fn = "batch_dot"
    lhs, rhs = _array(fn, "lhs", lhs), _array(fn, "rhs", rhs)
    if lhs.ndim < 3 or rhs.ndim != lhs.ndim:
        raise InputError(f"{fn}: lhs and rhs must both be 3-D or more, of one rank; got "
                         f"{lhs.shape} and {rhs.shape}")

    def swap(x):
        perm = list(range(x.ndim))
        perm[-2:] = perm[-1], perm[-2]
        return x.transpose(*perm)

    a = swap(lhs) if transpose_a else lhs
    b = swap(rhs) if transpose_b else rhs
    if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise InputError(f"{fn}: cannot multiply batches of {a.shape[-2:]} and "
                         f"{b.shape[-2:]} matrices (lhs {lhs.shape}, rhs {rhs.shape}, "
                         f"transpose_a={transpose_a}, transpose_b={transpose_b})")
    return _op("MatMul", [a, b])


def norm(data, ord=2, axis=None, out_dtype=None, keepdims=False, name=None):  # noqa: A002
    """MXNet's ``norm``: the L1 (``ord=1``) or L2 (``ord=2``) norm over ``axis`` (an int or
    a tuple; ``None``: every axis, a 0-d result unless ``keepdims``)."""
    fn = "norm"
    data = _array(fn, "data", data)
    if ord not in (1, 2):
        raise InputError(f"{fn}: ord must be 1 or 2, got {ord!r}")
    attributes = {"keepdims": int(bool(keepdims))}
    inputs = [data]
    if axis is not None:
        axes = [_axis(fn, a, data.ndim) for a in _tuple(fn, "axis", axis)]
        inputs.append(_ints(axes, data.ctx))
    out = _op("ReduceL1" if ord == 1 else "ReduceL2", inputs, **attributes)
    if out_dtype is not None:
        out = out.astype(_dtype(fn, "out_dtype", out_dtype))
    return out


# -- elementwise -------------------------------------------------------------------------------

def _unary(fn: str, op_type: str, doc: str):
    def function(data, name=None):
        return _op(op_type, [_array(fn, "data", data)])
    function.__name__ = function.__qualname__ = fn
    function.__doc__ = doc
    return function


sign = _unary("sign", "Sign", "MXNet's ``sign``: -1, 0 or 1 (gradient 0).")
floor = _unary("floor", "Floor", "MXNet's ``floor`` (gradient 0).")
ceil = _unary("ceil", "Ceil", "MXNet's ``ceil`` (gradient 0).")
abs = _unary("abs", "Abs", "MXNet's ``abs``.")  # noqa: A001 (MXNet's name)


def rint(data, name=None):
    """MXNet's ``rint``: to the nearest integer, halves downwards (``rint(2.5)`` is 2,
    ``rint(-2.5)`` is -3; ``round`` takes halves away from zero). Gradient 0."""
    return _op("Ceil", [_array("rint", "data", data) - 0.5])


def round(data, name=None):  # noqa: A001 (MXNet's name)
    """MXNet's ``round``: to the nearest integer, halves away from zero (``round(2.5)`` is
    3, ``round(-0.5)`` is -1; ``rint`` rounds halves down). Gradient 0."""
    data = _array("round", "data", data)
    return _op("Mul", [_op("Sign", [data]),
                       _op("Floor", [_op("Abs", [data]) + 0.5])])


def fix(data, name=None):
    """MXNet's ``fix``: towards zero (gradient 0)."""
    data = _array("fix", "data", data)
    return _op("Mul", [_op("Sign", [data]), _op("Floor", [_op("Abs", [data])])])


trunc = fix


def BlockGrad(data, name=None):
    """MXNet's ``BlockGrad`` (``stop_gradient``): the same values, with no gradient flowing
    back through it."""
    data = _array("BlockGrad", "data", data)
    if _is_traced(data):  # a graph has no pause: mixrt's BlockGrad op has a zero gradient
        return _invoke("BlockGrad", [data], {}, domain="mixrt")
    with _paused():
        return _op("Identity", [data])


stop_gradient = BlockGrad


FUNCTIONS = ["softmax", "log_softmax", "SequenceMask", "one_hot", "pick", "take", "split", "slice_axis",
             "slice", "flip", "reverse", "topk", "sort", "argsort", "argmax", "argmin",
             "broadcast_to", "broadcast_like", "broadcast_axis",
             *(f"broadcast_{n}" for n in _BROADCASTS), "tile", "repeat", "dot", "batch_dot",
             "norm", "abs", "sign", "floor", "ceil", "rint", "round", "fix", "trunc",
             "BlockGrad", "stop_gradient"]

# NDArray methods in MXNet (x.topk(k=2) is topk(x, k=2))
METHODS = ["split", "topk", "pick", "one_hot", "take", "slice_axis", "slice", "broadcast_to",
           "broadcast_like", "broadcast_axis", "norm", "tile", "repeat", "flip", "sort",
           "argsort", "abs", "sign", "floor", "ceil", "round", "rint", "fix", "trunc", "softmax",
           "log_softmax"]


def _softmax_method(self, axis=-1, length=None, temperature=None, dtype=None,
                    use_length=False):
    """``x.softmax(axis)``: MXNet's ``softmax`` with ``axis`` first (as mixrt's method had
    it), ``temperature``, ``dtype`` and ``length``/``use_length`` by name."""
    return softmax(self, length, axis, temperature, dtype, use_length)


def _log_softmax_method(self, axis=-1, length=None, temperature=None, dtype=None,
                        use_length=False):
    """``x.log_softmax(axis)``: MXNet's ``log_softmax``, ``axis`` first."""
    return log_softmax(self, axis, temperature, dtype, use_length, length)


def _attach_methods() -> None:
    own = {"softmax": _softmax_method, "log_softmax": _log_softmax_method}
    for method in METHODS:
        setattr(NDArray, method, own.get(method) or globals()[method])


_attach_methods()
