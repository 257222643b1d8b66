"""mixrt.nd: imperative arrays on a device (the MXNet paper's shallow embedding, §2.2).

    from mixrt import nd, autograd
    x = nd.array([[1.0, 2.0], [3.0, 4.0]], ctx=mixrt.cpu())
    y = nd.Gemm(x, w, b, transB=1)        # any registered op, as sym has it
    z = (x @ x.T + 1).relu()              # operators and methods
    z.asnumpy()

Every registered operator is a function here with the same arguments as its ``mixrt.sym``
twin (the ONNX default domain at the top level, other domains under ``nd.mixrt``, ``nd.ml``,
...), plus the creation functions below and MXNet's everyday names (``dot``, ``relu``, ...).
Arrays on different devices never meet silently: ``DeviceMismatchError``.
"""

from __future__ import annotations

import numpy as np

import mixrt.ops  # noqa: F401  (registers every kernel)
from mixrt import autograd as _autograd, dispatch
from mixrt.context import as_context
from mixrt.base.errors import InputError
from mixrt.nd.ndarray import NDArray
from mixrt.op_specs import generate, install

_autograd._connect_dispatcher()

OPERATORS = install(globals(), generate(dispatch.make_function))


# -- making arrays --------------------------------------------------------------------------

def array(source, ctx=None, dtype=None) -> NDArray:
    """An NDArray holding a copy of ``source`` (NumPy keeps its dtype; lists and numbers
    become float32, as in MXNet, unless ``dtype`` says otherwise)."""
    ctx = as_context(ctx)
    if isinstance(source, NDArray):
        source = source.asnumpy()
    elif hasattr(source, "__dlpack__") and not isinstance(source, np.ndarray):
        source = np.asarray(source)
    if dtype is None and not isinstance(source, (np.ndarray, np.generic)):
        dtype = np.float32
    try:
        host = np.array(source, dtype=dtype, copy=True)
    except (TypeError, ValueError) as exc:  # ragged lists, strings, unknown dtypes
        raise InputError(f"array: cannot make an array of {type(source).__name__} "
                         f"{str(source)[:60]}: {exc}") from exc
    if host.dtype.kind not in "biufc":
        raise InputError(f"array: {host.dtype} data is not numbers")
    return NDArray(ctx.device.put(host) if ctx.device.kind != "cpu" else host, ctx)


def _shape(shape) -> tuple:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(int(d) < 0 for d in shape):
        raise InputError(f"shape {shape} has a negative dimension")
    return shape


def _filled(fill, shape, ctx, dtype) -> NDArray:
    ctx = as_context(ctx)
    shape = _shape(shape)
    with ctx.device.active():  # a GPU array is made on the current GPU
        return NDArray(ctx.xp.full(shape, fill, dtype=np.dtype(dtype or np.float32)), ctx)


def zeros(shape, ctx=None, dtype=None) -> NDArray:
    return _filled(0, shape, ctx, dtype)


def ones(shape, ctx=None, dtype=None) -> NDArray:
    return _filled(1, shape, ctx, dtype)


def full(shape, val, ctx=None, dtype=None) -> NDArray:
    return _filled(val, shape, ctx, dtype)


def empty(shape, ctx=None, dtype=None) -> NDArray:
    ctx = as_context(ctx)
    shape = _shape(shape)
    with ctx.device.active():
        return NDArray(ctx.xp.empty(shape, dtype=np.dtype(dtype or np.float32)), ctx)


def arange(start, stop=None, step=1.0, ctx=None, dtype=None) -> NDArray:
    ctx = as_context(ctx)
    with ctx.device.active():
        return NDArray(ctx.xp.arange(start, stop, step, dtype=np.dtype(dtype or np.float32)),
                       ctx)


def zeros_like(other: NDArray) -> NDArray:
    return other.zeros_like()


def ones_like(other: NDArray) -> NDArray:
    return other.ones_like()


def from_dlpack(source) -> NDArray:
    """An NDArray sharing ``source``'s memory (a NumPy, CuPy or PyTorch tensor, anything
    with ``__dlpack__``): no copy, on the device the producer says it lives on."""
    device_type, device_id = source.__dlpack_device__()
    if int(device_type) == 1:  # kDLCPU
        return NDArray(np.from_dlpack(source), as_context("cpu"))
    if int(device_type) in (2, 13):  # kDLCUDA, kDLCUDAManaged
        import cupy  # noqa: PLC0415
        return NDArray(cupy.from_dlpack(source), as_context(f"gpu:{int(device_id)}"))
    raise InputError(f"from_dlpack: device type {device_type} is neither the CPU nor CUDA")


def to_dlpack_for_read(array: NDArray):
    return array.__dlpack__()


def waitall() -> None:
    """Wait for every piece of engine work pushed so far (and raise the first failure)."""
    get_engine().wait_all()


# -- MXNet's everyday names (shared with mixrt.sym: mixrt/array_methods.py) ---------------------

from mixrt.array_methods import (clip, concat, dot, exp, expand_dims, flatten,  # noqa: E402
                                 log, log_softmax, max, maximum, mean, min, minimum, relu,
                                 sigmoid, softmax, sqrt, square, squeeze, stack, sum,
                                 tanh, transpose)
from mixrt.array_methods import where as _where  # noqa: E402
from mixrt.nd import mxnet_ops as _mx  # noqa: E402  (MXNet's operator names; attaches methods)
globals().update({_name: getattr(_mx, _name) for _name in _mx.FUNCTIONS})
from mixrt.nd import array_layers as _layers  # noqa: E402  (MXNet's layer operators)
from mixrt.runtime.engine import get_engine
globals().update({_name: getattr(_layers, _name)
                  for _name in _layers.FUNCTIONS + _layers.EXTENDED})


def reshape(data, shape, reverse: bool = False) -> NDArray:
    """MXNet's ``nd.reshape``, special codes and ``reverse`` included (``NDArray.reshape``)."""
    return data.reshape(shape, reverse=reverse)


def where(condition, x, y):
    """``x`` where ``condition`` is non-zero, else ``y``. As in MXNet, a 1-D condition
    beside higher-rank ``x`` and ``y`` picks whole rows (its length is their first
    dimension); other shapes broadcast, NumPy's way."""
    if isinstance(condition, NDArray) and condition.ndim == 1:
        like = next((v for v in (x, y) if isinstance(v, NDArray)), None)
        if like is not None and like.ndim > 1:
            if condition.shape[0] != like.shape[0]:
                raise InputError(f"where: a 1-D condition of length {condition.shape[0]} "
                                 f"picks rows, and x has {like.shape[0]} (shape {like.shape})")
            condition = condition.reshape((-1,) + (1,) * (like.ndim - 1))
    if isinstance(condition, NDArray) and condition.dtype != np.bool_:
        condition = condition != 0  # MXNet's numeric conditions; ONNX's Where takes bool
    return _where(condition, x, y)


__all__ = ["NDArray", "array", "zeros", "ones", "full", "empty", "arange", "zeros_like",
           "ones_like", "from_dlpack", "waitall", "dot", "concat", "stack", "where",
           *OPERATORS, *_mx.FUNCTIONS, *_layers.FUNCTIONS]
