"""The argument checks and op hooks that MXNet's operator names on NDArrays share
(``mxnet_ops.py``, ``mxnet_indexing.py``, ``array_layers.py``).

``_invoke``, ``_ints``, ``_made_on`` and ``_array`` send every op and constant its way: run
on NDArrays through ``mixrt.dispatch``, or added to the graph when an input stands in for a
traced Symbol (``mixrt.sym.mxnet_ops``), so one body serves both.
"""

from __future__ import annotations

import numpy as np

from mixrt import dispatch
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


def _out_for(fn: str, out, result: NDArray) -> NDArray | None:
    """MXNet's ``out=`` checked against ``result``: an NDArray of its shape, or None when no
    ``out`` was given."""
    if out is None:
        return None
    if not isinstance(out, NDArray):
        raise InputError(f"{fn}: out must be an NDArray, got {type(out).__name__}")
    if out.shape != result.shape:
        raise InputError(f"{fn}: out has shape {out.shape}, the result {result.shape}")
    return out


def _into(fn: str, out, result: NDArray) -> NDArray:
    """MXNet's ``out=``: ``result`` written into ``out`` (moved to its context first), which
    is returned; without ``out``, ``result`` itself."""
    if _out_for(fn, out, result) is None:
        return result
    out[:] = result if out.ctx == result.ctx else result.as_in_context(out.ctx)
    return out


def _int(fn: str, arg: str, value, minimum=None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InputError(f"{fn}: {arg} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise InputError(f"{fn}: {arg} must be at least {minimum}, got {value}")
    return int(value)


class AxisError(InputError, ValueError):
    """An axis out of range or named twice; a ``ValueError`` too, as NumPy's and MXNet's
    Python functions raise."""


def _axis(fn: str, axis, ndim: int, arg: str = "axis") -> int:
    axis = _int(fn, arg, axis)
    if not -ndim <= axis < ndim:
        raise AxisError(f"{fn}: {arg}={axis} is out of range for an array of {ndim} "
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
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return tuple(value.tolist())
    if isinstance(value, range):
        return tuple(value)
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
