"""MXNet 1.x's reductions on NDArrays: ``sum``, ``mean``, ``max``, ``min``, ``prod``,
``nansum``, ``nanprod`` (with ``axis``, ``keepdims`` and ``exclude``), their ``*_axis``
aliases, ``moments`` and ``argmax_channel``; functions in ``mixrt.nd`` and methods of
NDArray.

As MXNet has no 0-d results, a reduction over every axis gives shape ``(1,)``
(``x.sum()``, ``nd.max(x, axis=())``). ``axis=None`` and ``axis=()`` both mean every axis;
``exclude=True`` reduces over the axes *not* named.

These stay NDArray-only: ``mixrt.sym``'s ``sum``/``mean``/... are ``mixrt/array_methods.py``'s,
whose full reductions keep ONNX's 0-d shape.
"""

from __future__ import annotations

from mixrt.base.errors import InputError
from mixrt.nd.mxnet_args import _array, _axis, _into, _ints, _op, _tuple
from mixrt.nd.mxnet_indexing import argmax
from mixrt.nd.ndarray import NDArray


def _reduced_axes(fn: str, ndim: int, axis, exclude: bool):
    """The axes to reduce, sorted; None for every axis."""
    named = () if axis is None else _tuple(fn, "axis", axis)
    named = sorted({_axis(fn, a, ndim) for a in named})
    if exclude:
        return [a for a in range(ndim) if a not in named]
    return named or None


def _reduce(fn: str, op_type: str, data, axis, keepdims: bool, exclude: bool):
    data = _array(fn, "data", data)
    axes = _reduced_axes(fn, data.ndim, axis, exclude)
    if axes == []:  # exclude named every axis: nothing to reduce
        return _op("Identity", [data])
    inputs = [data] if axes is None else [data, _ints(axes, data.ctx)]
    out = _op(op_type, inputs, keepdims=int(bool(keepdims)))
    return _at_least_1d(out)


def _at_least_1d(out):
    """A 0-d result as shape (1,) (MXNet has no 0-d results): an op where autograd
    recorded the result, else the same data seen as (1,)."""
    if out.ndim != 0:
        return out
    if isinstance(out, NDArray) and out._entry is None:
        return NDArray(out._data.reshape((1,)), out.ctx)
    return out.reshape((1,))


def _reduction(fn: str, op_type: str, what: str):
    def function(data, axis=None, keepdims=False, exclude=False, name=None, out=None,
                 dtype=None):
        result = _reduce(fn, op_type, data, axis, keepdims, exclude)
        return _finished(fn, result, out, dtype)
    function.__name__ = function.__qualname__ = fn
    function.__doc__ = (f"MXNet's ``{fn}``: the {what} over ``axis`` (``None`` or ``()``: "
                        f"every axis, shape ``(1,)``; ``exclude=True``: the other axes).")
    return function


sum = _reduction("sum", "ReduceSum", "sum")  # noqa: A001 (MXNet's names)
mean = _reduction("mean", "ReduceMean", "mean")
max = _reduction("max", "ReduceMax", "largest value")  # noqa: A001
min = _reduction("min", "ReduceMin", "smallest value")  # noqa: A001
prod = _reduction("prod", "ReduceProd", "product")
sum_axis, max_axis, min_axis = sum, max, min


def _finished(fn: str, result, out, dtype):
    """``dtype`` (NumPy's ``np.sum(x, dtype=...)`` passes it) and MXNet's ``out=``."""
    if dtype is not None:
        result = result.astype(dtype)
    return _into(fn, out, result)


def _without_nans(data, fill: float):
    data = _array("nansum", "data", data)
    filler = data.zeros_like() + fill if fill else data.zeros_like()
    return _op("Where", [_op("IsNaN", [data]), filler, data])


def nansum(data, axis=None, keepdims=False, exclude=False, name=None):
    """MXNet's ``nansum``: ``sum`` counting NaN as 0."""
    return _reduce("nansum", "ReduceSum", _without_nans(data, 0.0), axis, keepdims, exclude)


def nanprod(data, axis=None, keepdims=False, exclude=False, name=None):
    """MXNet's ``nanprod``: ``prod`` counting NaN as 1."""
    return _reduce("nanprod", "ReduceProd", _without_nans(data, 1.0), axis, keepdims,
                   exclude)


def moments(data, axes=None, keepdims=False, name=None):
    """MXNet's ``moments``: ``[mean, variance]`` over ``axes`` (required)."""
    fn = "moments"
    data = _array(fn, "data", data)
    if axes is None:
        raise InputError(f"{fn}: axes is required")
    mean_ = _reduce(fn, "ReduceMean", data, axes, True, False)
    centred = data - mean_
    variance = _reduce(fn, "ReduceMean", centred * centred, axes, keepdims, False)
    return [mean_ if keepdims else _reduce(fn, "ReduceMean", data, axes, False, False),
            variance]


def argmax_channel(data, name=None):
    """MXNet's ``argmax_channel``: ``argmax`` along axis 1, as floats of the data's
    dtype."""
    return argmax(_array("argmax_channel", "data", data), axis=1)


FUNCTIONS = ["sum", "mean", "max", "min", "prod", "nansum", "nanprod", "sum_axis",
             "max_axis", "min_axis", "moments", "argmax_channel"]
METHODS = ["sum", "mean", "max", "min", "prod", "nansum", "nanprod", "argmax_channel"]


def _attach_methods() -> None:
    for name in METHODS:
        setattr(NDArray, name, globals()[name])


_attach_methods()
