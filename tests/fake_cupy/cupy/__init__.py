"""A NumPy-backed stand-in for CuPy, for tests only: it lets the suite drive mixrt's GPU code
paths (``device="gpu"``, the device KVStore kinds, ``mixrt.gpu(0)``) on a machine without a
GPU, so that the Python around the kernels (which module a value comes from, where host
and device meet, the CUDA stream and device bookkeeping) runs before a GPU does.

It is put first on ``sys.path`` by ``tests/test_gpu_paths_on_fake_cupy.py`` only. Arrays
follow CuPy's rules (``_core.py``); kernels are NumPy's. What it cannot stand in for is
refused loudly: CUDA C beyond the subset mixrt generates for ``ElementwiseKernel``
and reductions beyond sums (``_kernels.py``), RawKernels but mixrt's multi-tensor optimizer
updates (``_raw.py``), CUDA graph capture and NCCL.
"""

from __future__ import annotations

import functools

import numpy as _np

from cupy import cuda, random  # noqa: F401
from cupy._core import check_devices, current_device, ndarray, on_device, result_of, \
    unwrap, wrap
from cupy._kernels import ElementwiseKernel, ReductionKernel  # noqa: F401
from cupy._raw import RawKernel  # noqa: F401

__all__ = ["ElementwiseKernel", "ReductionKernel", "cuda", "ndarray", "random"]
__version__ = "0.0-fake"
IS_FAKE = True


def asarray(a, dtype=None, order=None, *, blocking=False):
    """An array already on the current device, in ``dtype``, as it is; anything else (host
    values, another device's array) copied to the current device."""
    if isinstance(a, ndarray) and (dtype is None or _np.dtype(dtype) == a.dtype) \
            and a._device == current_device():
        return a
    return wrap(_np.array(a._host if isinstance(a, ndarray) else a, dtype=dtype,
                          order=order or "K", copy=True))


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    host = obj._host if isinstance(obj, ndarray) else obj
    return wrap(_np.array(host, dtype=dtype, copy=True, order=order, ndmin=ndmin))


def ascontiguousarray(a, dtype=None):
    return result_of(_np.ascontiguousarray(unwrap(a), dtype=dtype), (a,))


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    if isinstance(a, ndarray):
        return a.get(out=out)
    return _np.asarray(a)


def get_array_module(*args):
    import sys  # noqa: PLC0415
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else _np


def from_dlpack(x):
    if isinstance(x, ndarray):
        return x
    kind, index = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else (1, 0)
    if kind != 2:
        raise TypeError("fake CuPy: from_dlpack takes device (kDLCUDA) tensors only")
    return wrap(_np.from_dlpack(x), int(index))  # the producer's memory, on its device


def take(a, indices, axis=None, out=None):
    """CuPy's take wraps out-of-range indices around (it has no mode argument)."""
    check_devices((a, indices))
    return wrap(_np.take(unwrap(a), unwrap(indices), axis=axis, mode="wrap"))


def get_default_memory_pool():
    return cuda.MemoryPool._default


def get_default_pinned_memory_pool():
    return cuda.MemoryPool._default


class RawModule:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("fake CuPy cannot compile CUDA C")


def fuse(*args, **kwargs):
    raise NotImplementedError("fake CuPy cannot fuse kernels")


# NumPy 2's functions and types that CuPy 13.6 does not have (read off its module): code
# that reaches them through ``xp`` would fail on a real GPU, so the fake refuses them too
MISSING_IN_CUPY13 = frozenset({
    "acos", "acosh", "apply_over_axes", "asin", "asinh", "asmatrix", "astype", "atan", "atan2",
    "atanh", "bitwise_count", "bitwise_invert", "bitwise_left_shift", "bitwise_right_shift",
    "block", "bmat", "bool", "busday_count", "busday_offset", "busdaycalendar", "bytes_",
    "character", "clongdouble", "complex256", "concat", "cumulative_prod", "cumulative_sum",
    "datetime64", "datetime_as_string", "datetime_data", "einsum_path", "errstate", "flexible",
    "float128", "frompyfunc", "fromregex", "geomspace", "get_include", "getbufsize", "geterr",
    "geterrcall", "histogram_bin_edges", "info", "insert", "is_busday", "isdtype", "isnat",
    "long", "longdouble", "matrix", "matrix_transpose", "matvec", "memmap", "nanpercentile",
    "nanquantile", "ndenumerate", "nditer", "nested_iters", "object_", "permute_dims",
    "polyder", "polydiv", "polyint", "pow", "put_along_axis", "recarray", "record",
    "setbufsize", "seterr", "seterrcall", "show_runtime", "spacing", "str_", "test",
    "timedelta64", "trapezoid", "ulong", "unique_all", "unique_counts", "unique_inverse",
    "unique_values", "unstack", "vecdot", "vecmat", "void",
})


@functools.lru_cache(maxsize=None)  # one object per name, as a module attribute is
def __getattr__(name):
    """NumPy's functions and constants, taking and giving device arrays."""
    if name in MISSING_IN_CUPY13:
        raise AttributeError(f"module 'cupy' has no attribute {name!r} (CuPy 13 lacks it)")
    value = getattr(_np, name)
    if isinstance(value, type) or not callable(value):
        return value
    return on_device(value)
