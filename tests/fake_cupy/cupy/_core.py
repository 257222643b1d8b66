"""The fake CuPy's array: a NumPy array held on the "device", with CuPy's rules.

CuPy's rules kept here, because breaking them is what the fake is for:
* no implicit conversion to NumPy (``np.asarray(x)`` is a TypeError; ``x.get()`` copies);
* a NumPy array mixed into device arithmetic or a device function is a TypeError;
* indexing and reductions return 0-d device arrays, never NumPy scalars;
* ``x[...] = numpy_array`` and ``cupy.asarray(numpy_array)`` copy host to device;
* an array lives on the device that was current when it was made (a view, on its base's);
  work that launches a kernel needs every array on the current device, which is per thread
  (``cupy.cuda.Device(i)`` as a context, or ``.use()``); ``copy()``, ``cupy.asarray`` and
  ``cupy.array`` copy from any device to the current one, ``get()`` reads from any.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as _np

DTYPE_CHARS = frozenset("?bhilqBHILQefdFD")  # CuPy 13's (no bfloat16)
_current = threading.local()  # per thread: .device and .stream (cupy.cuda sets them)
HOST_MIX = ("Unsupported type <class 'numpy.ndarray'>: a NumPy array mixed into device "
            "work (fake CuPy)")


# the device a thread starts on: 0 as in CuPy, unless a test run makes it another GPU so that
# work mixrt runs without making its own GPU current fails (FAKE_CUPY_START_DEVICE)
_START_DEVICE = int(os.environ.get("FAKE_CUPY_START_DEVICE", "0"))


# device-to-host reads so far, each a wait for the device on a real GPU: tests count them
_host_reads = [0]


def host_reads() -> int:
    return _host_reads[0]


def current_device() -> int:
    return getattr(_current, "device", _START_DEVICE)


def check_devices(operands) -> None:
    """As CuPy's kernel launch between devices without peer access (with it, CuPy warns and
    reads across): every device array must be on the current device."""
    current = current_device()
    for array in _arrays(operands):
        if array._device != current:
            raise ValueError(f"The device where the array resides ({array._device}) is "
                             f"different from the current device ({current}). Peer access "
                             f"is unavailable between these devices.")


def _arrays(values):
    for value in values:
        if isinstance(value, ndarray):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _arrays(value)
        elif isinstance(value, dict):
            yield from _arrays(value.values())


def result_of(result, operands, writes: bool = False):
    """NumPy's ``result`` of work on ``operands``, as CuPy would give it: a view of an operand
    stays on that array's device (no kernel ran); anything else ran as a kernel on the
    current device, which every operand must be on (``writes``: the work wrote into one)."""
    if isinstance(result, (list, tuple)):  # split's views, divmod's two results
        parts = [result_of(r, operands, writes) for r in result]
        # CuPy's linalg.svd gives a plain tuple where NumPy's gives an SVDResult
        return parts if isinstance(result, list) else tuple(parts)
    if not writes and isinstance(result, _np.ndarray):
        for array in _arrays(operands):
            if _np.may_share_memory(result, array._host):
                return wrap(result, array._device)
    check_devices(operands)
    return wrap(result)


class MemoryPointer:
    def __init__(self, host):
        self.ptr = host.__array_interface__["data"][0]


class ndarray:
    """A device array (fake): its values live in ``_host``."""

    __slots__ = ("_host", "_device", "__weakref__")
    __hash__ = None
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        self._host = _np.empty(shape, dtype=dtype, order=order)
        self._device = current_device()
        _BASES.setdefault(id(self._host), self)

    # -- what CuPy adds to an array --------------------------------------------------------

    def get(self, stream=None, order="C", out=None):
        _host_reads[0] += 1
        if out is not None:
            out[...] = self._host
            return out
        return _np.array(self._host, copy=True)

    def set(self, array, stream=None):
        if not self._host.flags.c_contiguous:
            raise RuntimeError("Cannot set to non-contiguous array")
        if _np.dtype(array.dtype) != self._host.dtype or array.shape != self._host.shape:
            raise ValueError("set: the host array's dtype and shape must match")
        self._host[...] = array

    def copy(self, order="C"):
        """To the current device, from any (CuPy's copy does that)."""
        return wrap(self._host.copy(order=order))

    @property
    def data(self):
        return MemoryPointer(self._host)

    @property
    def base(self):
        """As CuPy's: the array a view hangs from (None for one that owns its memory), one
        object however often it is asked: a new wrapper each time would hide from mixrt's
        ``shares_buffer`` that two views share memory."""
        host = self._host.base
        if not isinstance(host, _np.ndarray):
            return None
        base = _BASES.get(id(host))
        if base is None:
            base = _BASES[id(host)] = wrap(host, self._device)
        return base

    @property
    def device(self):
        from cupy.cuda import Device  # noqa: PLC0415
        return Device(self._device)

    @property
    def __cuda_array_interface__(self):
        face = dict(self._host.__array_interface__)
        face["version"] = 3
        face.pop("descr", None)
        return face

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        result = getattr(ufunc, method)(*unwrap_args(inputs), **unwrap_kwargs(kwargs))
        return result_of(result, (inputs, kwargs), writes="out" in kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return result_of(func(*unwrap_args(args), **unwrap_kwargs(kwargs)), (args, kwargs),
                         writes="out" in kwargs)

    def __dlpack__(self, *args, **kwargs):
        return self._host.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return (2, self._device)  # kDLCUDA

    # -- NumPy's array, delegated ----------------------------------------------------------

    def __getattr__(self, name):
        if name.startswith("__"):  # __array_interface__ and the like: CuPy has none
            raise AttributeError(name)
        value = getattr(self._host, name)
        if callable(value):
            return on_device(value, owner=self)
        return result_of(value, (self,)) if isinstance(value, _np.ndarray) else value

    def __getitem__(self, key):
        return result_of(self._host[wrapped_index(unwrap_index(key), self._host.shape)],
                         (self, key))

    def __setitem__(self, key, value):
        check_devices((self, key, value))
        self._host[wrapped_index(unwrap_index(key), self._host.shape)] = \
            value._host if isinstance(value, ndarray) else value

    def __len__(self):
        return len(self._host)

    def __iter__(self):
        return (wrap(row, self._device) for row in self._host)

    def __bool__(self):
        _host_reads[0] += 1
        return bool(self._host)

    def __float__(self):
        _host_reads[0] += 1
        return float(self._host)

    def __int__(self):
        _host_reads[0] += 1
        return int(self._host)

    def __complex__(self):
        _host_reads[0] += 1
        return complex(self._host)

    def item(self):
        _host_reads[0] += 1
        return self._host.item()

    def tolist(self):
        _host_reads[0] += 1
        return self._host.tolist()

    def __repr__(self):
        return repr(self._host)

    def __str__(self):
        return str(self._host)

    def __format__(self, spec):
        return format(self._host.item() if self._host.ndim == 0 else self._host, spec)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()


def _binary(name):
    def operator(self, other):
        if isinstance(other, _np.ndarray):
            raise TypeError(HOST_MIX)
        check_devices((self, other))
        result = getattr(self._host, name)(other._host if isinstance(other, ndarray) else other)
        return result if result is NotImplemented else wrap(result)
    return operator


def _inplace(name):
    def operator(self, other):
        if isinstance(other, _np.ndarray):
            raise TypeError(HOST_MIX)
        check_devices((self, other))
        getattr(self._host, name)(other._host if isinstance(other, ndarray) else other)
        return self
    return operator


def _unary(name):
    def operator(self):
        check_devices((self,))
        return wrap(getattr(self._host, name)())
    return operator


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
              "or", "xor", "lshift", "rshift"):
    setattr(ndarray, f"__{_name}__", _binary(f"__{_name}__"))
    setattr(ndarray, f"__r{_name}__", _binary(f"__r{_name}__"))
    setattr(ndarray, f"__i{_name}__", _inplace(f"__i{_name}__"))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(ndarray, f"__{_name}__", _binary(f"__{_name}__"))
for _name in ("neg", "pos", "abs", "invert"):
    setattr(ndarray, f"__{_name}__", _unary(f"__{_name}__"))


def on_device(function, owner=None):
    """``function`` (NumPy's; a method of ``owner``'s host array) taking and giving device
    arrays."""
    def wrapped(*args, **kwargs):
        operands = (owner, args, kwargs) if owner is not None else (args, kwargs)
        result = function(*unwrap_args(args), **unwrap_kwargs(kwargs))
        if result is None:  # it wrote in place (fill, copyto, sort, ...): a kernel ran
            check_devices(operands)
            return None
        return result_of(result, operands, writes="out" in kwargs)
    wrapped.__name__ = getattr(function, "__name__", "function")
    return wrapped


# the first wrapper of each host array, while something holds it (it holds the host array,
# so the id is not reused meanwhile): a view's ``base``, as CuPy's is the array it was made from
_BASES: "weakref.WeakValueDictionary[int, ndarray]" = weakref.WeakValueDictionary()


def wrap(value, device=None):
    """NumPy results as device values: arrays and NumPy scalars become device arrays, on
    ``device`` (default: the current one)."""
    if isinstance(value, ndarray):
        return value
    if isinstance(value, _np.ndarray):
        if value.dtype.char not in DTYPE_CHARS:  # as CuPy: no strings, float8, int4, ...
            raise ValueError(f"Unsupported dtype {value.dtype}")
        array = object.__new__(ndarray)
        array._host = value
        array._device = current_device() if device is None else device
        _BASES.setdefault(id(value), array)  # the first wrapper of a host array is its base
        return array
    if isinstance(value, _np.generic):
        return wrap(_np.asarray(value), device)
    if isinstance(value, tuple):
        return tuple(wrap(v, device) for v in value)
    if isinstance(value, list):
        return [wrap(v, device) for v in value]
    return value


def unwrap_args(values):
    return [unwrap(v) for v in values]


def unwrap_kwargs(kwargs):
    return {k: unwrap(v) for k, v in kwargs.items()}


def unwrap(value):
    """Device arrays to their host values; a NumPy array here is a TypeError, as in CuPy."""
    if isinstance(value, ndarray):
        return value._host
    if isinstance(value, _np.ndarray):
        raise TypeError(HOST_MIX)
    if isinstance(value, (list, tuple)):
        return type(value)(unwrap(v) for v in value)
    return value


def wrapped_index(key, shape):
    """CuPy wraps out-of-bounds integer-array indices around their axis where NumPy raises:
    so does the fake, for keys of integer arrays and slices (no Ellipsis or newaxis)."""
    parts = key if isinstance(key, tuple) else (key,)
    if not any(isinstance(k, _np.ndarray) and k.dtype.kind in "iu" for k in parts) \
            or any(k is Ellipsis or k is None for k in parts) or len(parts) > len(shape):
        return key
    wrapped = tuple(k % shape[axis] if isinstance(k, _np.ndarray) and k.dtype.kind in "iu"
                    and shape[axis] else k for axis, k in enumerate(parts))
    return wrapped if isinstance(key, tuple) else wrapped[0]


def unwrap_index(key):
    """Indices may be device arrays or NumPy arrays (CuPy copies those over)."""
    if isinstance(key, ndarray):
        return key._host
    if isinstance(key, tuple):
        return tuple(unwrap_index(k) for k in key)
    return key
