"""Making NDArrays, with MXNet 1.x's names, arguments and defaults: ``array``, ``zeros``,
``ones``, ``full``, ``empty``, ``arange``, ``linspace``, ``eye``, ``zeros_like``,
``ones_like``, ``identity``, ``from_numpy``.

MXNet's default dtype is float32 everywhere: ``nd.array`` of float64 (or int, or bool) NumPy
data makes float32, unless ``dtype`` says otherwise or the source is an NDArray (which keeps
its dtype). Where ``out=`` is given, the values are written into it and it is returned.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from mixrt.base.errors import InputError
from mixrt.context import as_context
from mixrt.nd.mxnet_args import _dtype, _into
from mixrt.nd.ndarray import NDArray, sparse_module
from mixrt.runtime import profiler as _profiler

DEFAULT_DTYPE = np.dtype(np.float32)  # MXNet's mx_real_t


def array(source_array, ctx=None, dtype=None) -> NDArray:
    """An NDArray holding a copy of ``source_array`` (an NDArray, NumPy array, list or
    number): float32 unless ``dtype`` is given, or the dtype of an NDArray source."""
    if isinstance(source_array, NDArray) and source_array.stype != "default":
        return sparse_module().array(source_array, ctx=ctx, dtype=dtype)  # keeps its storage
    if isinstance(source_array, NDArray):
        dtype = source_array.dtype if dtype is None else dtype
        source_array = source_array.asnumpy()
    elif hasattr(source_array, "__dlpack__") and not isinstance(source_array, np.ndarray):
        source_array = np.asarray(source_array)
    dtype = DEFAULT_DTYPE if dtype is None else _dtype("array", "dtype", dtype)
    try:
        host = np.array(source_array, copy=True)
    except (TypeError, ValueError) as exc:  # ragged lists, strings
        raise InputError(f"array: cannot make an array of {type(source_array).__name__} "
                         f"{str(source_array)[:60]}: {exc}") from exc
    if host.dtype.kind not in "biufc":
        raise InputError(f"array: {host.dtype} data is not numbers")
    with np.errstate(invalid="ignore", over="ignore"):  # C's casts, as MXNet's: -2 -> 254
        return _placed(host.astype(dtype, copy=False), ctx)


def _placed(host: np.ndarray, ctx) -> NDArray:
    ctx = as_context(ctx)
    if ctx.device.kind == "cpu":
        return NDArray(host, ctx)
    with ctx.device.active():
        return NDArray(ctx.device.put(host), ctx)


def from_numpy(ndarray, zero_copy: bool = True) -> NDArray:
    """An NDArray of a NumPy array's dtype; with ``zero_copy`` it shares the array's
    memory (which must be C-contiguous) and the NumPy array becomes read-only, as MXNet's
    does."""
    if not isinstance(ndarray, np.ndarray):
        raise InputError(f"from_numpy: ndarray must be a NumPy array, got "
                         f"{type(ndarray).__name__}")
    if zero_copy:
        if not ndarray.flags.c_contiguous:
            raise NotContiguousError("from_numpy: zero_copy needs a C-contiguous array; "
                                     "pass np.ascontiguousarray(x) or zero_copy=False")
        shared = np.asarray(_WritableMemory(ndarray))
        ndarray.flags.writeable = False  # as MXNet: the NDArray owns the memory now
        return NDArray(shared, as_context("cpu"))
    return NDArray(np.array(ndarray, copy=True), as_context("cpu"))


class _WritableMemory:
    """The memory of a NumPy array, offered writable (the array itself is made read-only,
    perhaps by an earlier ``from_numpy``); holds the array so the memory lives on."""

    def __init__(self, array: np.ndarray):
        self.array = array
        self.__array_interface__ = dict(array.__array_interface__,
                                        data=(array.__array_interface__["data"][0], False))


class NotContiguousError(InputError, ValueError):
    """``from_numpy(zero_copy=True)`` of an array that is not C-contiguous; a ``ValueError``
    too, as MXNet raises."""


def _shape(fn: str, shape) -> tuple:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{fn}: shape must be an int or a tuple of ints, got "
                         f"{shape!r}") from exc
    if any(d < 0 for d in shape):
        raise InputError(f"{fn}: shape {shape} has a negative dimension")
    return shape


def _filled(fn: str, fill, shape, ctx, dtype, out) -> NDArray:
    shape = _shape(fn, shape)
    if out is not None:
        ctx = out.ctx if ctx is None else ctx
        dtype = out.dtype if dtype is None else dtype
    dtype = DEFAULT_DTYPE if dtype is None else _dtype(fn, "dtype", dtype)
    ctx = as_context(ctx)
    prof = _profiler.current()
    started = time.perf_counter() if prof is not None else 0.0
    with ctx.device.active():  # a GPU array is made on the current GPU
        made = NDArray(ctx.xp.full(shape, fill, dtype=dtype), ctx)
    if prof is not None:  # an op in MXNet (_zeros, _ones, _full), so profiled as one
        prof.imperative(f"_{fn}", started, [], [made._read()])
    return _into(fn, out, made)


def zeros(shape, ctx=None, dtype=None, out=None, **kwargs) -> NDArray:
    """An array of zeros (float32 unless ``dtype``); ``stype='row_sparse'`` or ``'csr'``
    makes a sparse one with nothing stored (``nd.sparse.zeros``)."""
    stype = _stype_of("zeros", kwargs)
    if stype != "default":
        made = sparse_module().zeros(stype, shape, ctx=ctx, dtype=dtype)
        return _into("zeros", out, made)
    return _filled("zeros", 0, shape, ctx, dtype, out)


def ones(shape, ctx=None, dtype=None, out=None, **kwargs) -> NDArray:
    _dense_only("ones", kwargs)
    return _filled("ones", 1, shape, ctx, dtype, out)


def full(shape, val, ctx=None, dtype=None, out=None) -> NDArray:
    """An array of ``val`` (cast to ``dtype``, float32 by default)."""
    return _filled("full", val, shape, ctx, dtype, out)


def empty(shape, ctx=None, dtype=None, stype=None) -> NDArray:
    """An array whose values are not set (float32 unless ``dtype``); a sparse ``stype``
    gives one with nothing stored."""
    if stype not in (None, "default"):
        return sparse_module().empty(stype, shape, ctx=ctx, dtype=dtype)
    shape = _shape("empty", shape)
    dtype = DEFAULT_DTYPE if dtype is None else _dtype("empty", "dtype", dtype)
    ctx = as_context(ctx)
    with ctx.device.active():
        return NDArray(ctx.xp.empty(shape, dtype=dtype), ctx)


def _stype_of(fn: str, kwargs: dict) -> str:
    """The storage type a creation function is asked for (MXNet's ``stype=``)."""
    stype = kwargs.pop("stype", None)
    kwargs.pop("name", None)
    if kwargs:
        raise InputError(f"{fn}: unknown arguments {sorted(kwargs)}")
    stype = "default" if stype is None else stype
    if stype not in ("default", "row_sparse", "csr"):
        raise InputError(f"{fn}: stype must be 'default', 'row_sparse' or 'csr', got "
                         f"{stype!r}")
    return stype


def _dense_only(fn: str, kwargs: dict) -> None:
    """MXNet's functions that make only dense arrays take ``stype='default'`` too."""
    stype = _stype_of(fn, kwargs)
    if stype != "default":
        raise InputError(f"{fn}: stype={stype!r}: {fn} makes dense arrays only; make one "
                         f"and convert it with tostype({stype!r})")




def arange(start, stop=None, step=1.0, repeat=1, infer_range=None, ctx=None,
           dtype=None) -> NDArray:
    """Evenly spaced values in ``[start, stop)`` (``stop=None``: ``[0, start)``), each
    repeated ``repeat`` times. As MXNet, the count is ``ceil((stop - start) / step)`` and
    value ``i`` is ``start + i * step`` computed in ``dtype`` (float32 by default), so
    ``arange(1, 2, 0.3)`` ends at float32's 1.9000001."""
    if infer_range is not None:
        warnings.warn("arange: infer_range is deprecated in MXNet and ignored here",
                      DeprecationWarning, stacklevel=2)
    if stop is None:
        start, stop = 0, start
    repeat = _positive("arange", "repeat", repeat)
    if step == 0:
        raise InputError("arange: step must not be 0")
    dtype = DEFAULT_DTYPE if dtype is None else _dtype("arange", "dtype", dtype)
    count = max(int(np.ceil((float(stop) - float(start)) / float(step))), 0)
    host = _cast(start, dtype) + np.arange(count).astype(dtype) * _cast(step, dtype)
    host = host.astype(dtype, copy=False)
    return _placed(np.repeat(host, repeat) if repeat > 1 else host, ctx)


def _cast(value, dtype: np.dtype):
    """A Python number in ``dtype`` (C's truncation for integer types, as MXNet's)."""
    return np.array(value).astype(dtype)[()]


def _positive(fn: str, arg: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{fn}: {arg} must be a positive int, got {value!r}")
    return int(value)


def linspace(start, stop, num, endpoint=True, ctx=None, dtype=None) -> NDArray:
    """``num`` evenly spaced values from ``start`` to ``stop`` (included unless
    ``endpoint=False``), ``start + i * step`` computed in float64, then cast to ``dtype``
    (float32 by default; an integer dtype truncates, as NumPy's)."""
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num < 0:
        raise InputError(f"linspace: num must be a non-negative int, got {num!r}")
    dtype = DEFAULT_DTYPE if dtype is None else _dtype("linspace", "dtype", dtype)
    intervals = num - 1 if endpoint else num
    step = (float(stop) - float(start)) / intervals if intervals > 0 else 0.0
    host = float(start) + np.arange(num) * step  # in float64, then cast (MXNet's, NumPy's)
    return _placed(host.astype(dtype), ctx)


def eye(N, M=0, k=0, ctx=None, dtype=None, **kwargs) -> NDArray:
    """A 2-D array with ones on diagonal ``k`` (``M=0``: square)."""
    kwargs.pop("name", None)
    if kwargs:
        raise InputError(f"eye: unknown arguments {sorted(kwargs)}")
    dtype = DEFAULT_DTYPE if dtype is None else _dtype("eye", "dtype", dtype)
    rows = _shape("eye", N)[0]
    cols = rows if not M else _shape("eye", M)[0]
    return _placed(np.eye(rows, cols, int(k), dtype=dtype), ctx)


def zeros_like(data, out=None, name=None) -> NDArray:
    """Zeros of ``data``'s shape, dtype and context."""
    return _into("zeros_like", out, _like("zeros_like", data).zeros_like())


def ones_like(data, out=None, name=None) -> NDArray:
    """Ones of ``data``'s shape, dtype and context."""
    return _into("ones_like", out, _like("ones_like", data).ones_like())


def identity(data, out=None, name=None) -> NDArray:
    """A copy of ``data`` (MXNet's ``identity``, ``_copy``); gradient one."""
    return _into("identity", out, _like("identity", data).copy())


def _like(fn: str, data) -> NDArray:
    if not isinstance(data, NDArray):
        raise InputError(f"{fn}: data must be an NDArray, got {type(data).__name__}")
    return data


FUNCTIONS = ["array", "zeros", "ones", "full", "empty", "arange", "linspace", "eye",
             "zeros_like", "ones_like", "identity", "from_numpy"]
