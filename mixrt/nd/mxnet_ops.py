"""MXNet 1.x's most-used operator names on NDArrays (``nd.one_hot``, ``nd.softmax``,
``nd.broadcast_add``, ``x.topk(...)``, ...), with MXNet's argument names and defaults (its
layers, ``nd.FullyConnected`` and the rest, are ``mixrt/nd/array_layers.py``'s).

Each is composed of registered ops run through ``mixrt.dispatch`` (so it runs on the
array's device and, under ``autograd.record()``, its gradient flows through the ops' own
gradient definitions). Where MXNet's result differs from the ONNX op's (``round`` rounds half
away from zero, ``one_hot`` of a negative index is all ``off_value``, ``topk`` indices are
float32 by default) the composition follows MXNet. Bad arguments raise ``InputError`` naming
the argument. As in MXNet (see NDArray's docstring), a reduction over every axis gives
shape ``(1,)`` and ``argmax``/``argmin`` give indices as floats of the data's dtype.

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

from mixrt.base.errors import InputError
from mixrt.nd.mxnet_args import (_array, _axis, _dtype, _index_array, _int, _invoke,
                                 _is_traced, _ints, _made_on, _op, _scalar, _tuple)
from mixrt.nd.mxnet_indexing import (_paused, argmax, argmin, argsort, flip,  # noqa: F401
                                     one_hot, pick, reverse, slice, slice_axis, sort, split,
                                     take, topk)  # (in FUNCTIONS and METHODS below)
from mixrt.nd import mxnet_math as _math, mxnet_shape as _shape
from mixrt.nd.ndarray import NDArray


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
    mask = _op("Less", [positions, length.expand_dims(axis)])  # bool, for Where
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


def softmin(data, axis=-1, temperature=None, dtype=None, use_length=False, length=None,
            name=None):
    """MXNet's ``softmin``: ``softmax`` of ``-data`` (the smallest entries weigh most)."""
    data = _array("softmin", "data", data)
    return softmax(_op("Neg", [data]), length, axis, temperature, dtype, use_length)


def softmax_cross_entropy(data, label, name=None):
    """MXNet's ``softmax_cross_entropy``: the cross entropy of ``softmax(data)`` (2-D,
    classes on axis 1) at the integer ``label`` of each row, summed: shape ``(1,)``."""
    fn = "softmax_cross_entropy"
    data = _array(fn, "data", data)
    if data.ndim != 2:
        raise InputError(f"{fn}: data must be 2-D (batch, classes), got {data.shape}")
    picked = pick(_op("LogSoftmax", [data], axis=1), label, axis=1)
    return _op("Neg", [picked]).sum(axis=0, keepdims=True)


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
    mask = _op("Less", [steps, lengths])  # bool, for Where
    mask = mask.reshape(mask.shape + (1,) * (data.ndim - 2))
    return _op("Where", [mask, data, _scalar(value, data)])


# -- indexing ----------------------------------------------------------------------------------

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
    if not lhs_axes:
        raise InputError(f"{fn}: lhs_axes and rhs_axes must name at least one axis")
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
    def function(lhs, rhs, name=None, **ignored):
        # MXNet's broadcast operators have no parameters and take any keyword given
        # (CosineEmbeddingLoss passes axis=1) without effect; so do these
        del ignored
        lhs, rhs = _array(fn, "lhs", lhs), _array(fn, "rhs", rhs)
        _math.check_broadcastable(fn, lhs, rhs)
        if op_type == "NotEqual":
            out = _op("Not", [_op("Equal", [lhs, rhs])])
        elif op_type == "Mod":
            out = lhs % rhs
        else:
            out = _op(op_type, [lhs, rhs])
        return out.astype(lhs.dtype) if compare else out
    function.__name__ = function.__qualname__ = fn
    function.__doc__ = (f"MXNet's ``{fn}``: ``{op_type}`` of ``lhs`` and ``rhs`` with "
                        f"length-1 axes broadcast (shapes aligned at their last axes)"
                        + ("; 0/1 in lhs's dtype, as MXNet." if compare else ".")
                        + " Other keywords are taken and ignored, as MXNet's are.")
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
    axes first). Two vectors give shape ``(1,)``, as MXNet."""
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
    if lhs.ndim == 1 and rhs.ndim == 1:
        return _op("MatMul", [lhs, rhs]).reshape((1,))
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
    a tuple; ``None``: every axis, shape ``(1,)`` unless ``keepdims``)."""
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
    if out.ndim == 0:
        out = out.reshape((1,))  # MXNet has no 0-d results
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


def _integers_unchanged(function):
    """A rounding function that gives integer data back as it is (a copy), as MXNet's do;
    ONNX's rounding ops take floats only."""
    def rounding(data, name=None):
        data = _array(function.__name__, "data", data)
        if data.dtype.kind in "iub":
            return _op("Identity", [data])
        return function(data)
    rounding.__name__ = rounding.__qualname__ = function.__name__
    rounding.__doc__ = function.__doc__
    return rounding


sign = _unary("sign", "Sign", "MXNet's ``sign``: -1, 0 or 1 (gradient 0).")
floor = _integers_unchanged(_unary("floor", "Floor", "MXNet's ``floor`` (gradient 0)."))
ceil = _integers_unchanged(_unary("ceil", "Ceil", "MXNet's ``ceil`` (gradient 0)."))
abs = _unary("abs", "Abs", "MXNet's ``abs``.")  # noqa: A001 (MXNet's name)


@_integers_unchanged
def rint(data, name=None):
    """MXNet's ``rint``: to the nearest integer, halves downwards (``rint(2.5)`` is 2,
    ``rint(-2.5)`` is -3; ``round`` takes halves away from zero). Gradient 0."""
    return _op("Ceil", [_array("rint", "data", data) - 0.5])


@_integers_unchanged
def round(data, name=None):  # noqa: A001 (MXNet's name)
    """MXNet's ``round``: to the nearest integer, halves away from zero (``round(2.5)`` is
    3, ``round(-0.5)`` is -1; ``rint`` rounds halves down). Gradient 0."""
    data = _array("round", "data", data)
    return _op("Mul", [_op("Sign", [data]),
                       _op("Floor", [_op("Abs", [data]) + 0.5])])


@_integers_unchanged
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


broadcast_axes = broadcast_axis  # MXNet's other names
SliceChannel = split


FUNCTIONS = ["softmax", "log_softmax", "softmin", "softmax_cross_entropy", "SliceChannel",
             "SequenceMask", "one_hot", "pick", "take",
             "split", "slice_axis", "slice", "flip", "reverse", "topk", "sort", "argsort",
             "argmax", "argmin", "broadcast_to", "broadcast_like", "broadcast_axis",
             "broadcast_axes",
             *(f"broadcast_{n}" for n in _BROADCASTS), "tile", "repeat", "dot", "batch_dot",
             "norm", "abs", "sign", "floor", "ceil", "rint", "round", "fix", "trunc",
             "BlockGrad", "stop_gradient"]

# NDArray methods in MXNet (x.topk(k=2) is topk(x, k=2))
METHODS = ["split", "topk", "pick", "one_hot", "take", "slice_axis", "slice", "broadcast_to",
           "broadcast_like", "broadcast_axis", "broadcast_axes", "norm", "tile", "repeat", "flip", "sort",
           "argsort", "abs", "sign", "floor", "ceil", "round", "rint", "fix", "trunc", "softmax",
           "log_softmax", "softmin"]

# MXNet's elementwise math and binary names (mxnet_math.py) and shape names
# (mxnet_shape.py): functions here (so mixrt.sym traces them too) and methods
for _module in (_math, _shape):
    globals().update({_name: getattr(_module, _name) for _name in _module.FUNCTIONS})
    FUNCTIONS += _module.FUNCTIONS
    METHODS += _module.METHODS


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
