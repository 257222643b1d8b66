"""Convolutions through cuDNN on a GPU: forward, data gradient and weight gradient, grouped
and depthwise ones included (``conv_gpu.py`` registers them).

cuDNN is reached through ctypes, as ``runtime/cublas_capture.py`` reaches cuBLAS, over its
descriptor-based convolution calls (deprecated in cuDNN 9 but kept, beside the graph API).
CuPy 14 has no cuDNN binding of its own; NVIDIA's cudnn-frontend Python package is a compiled
wheel per CUDA and Python version whose graphs take framework tensors; these calls take
descriptors and device pointers, which any CuPy array gives, and a CUDA-graph capture records
them as it records any other work on its stream.

A *plan* is made once per convolution (device, dtype, shapes, pads, strides, dilations,
groups, math mode) and kept: its descriptors and, per direction as first asked for, the
algorithm that cuDNN's heuristics rank first among those whose workspace fits
``WORKSPACE_LIMIT``. Each call takes that workspace from the memory pool the run allocates
from (a CUDA graph's private pool while it records), so no workspace outlives its call.

Precision: float16 and bfloat16 convolve with float32 accumulation (the convolution's
compute type) on tensor cores; float32 keeps full float32 products unless TF32 is allowed
(``allow_tf32(True)`` or ``MIXRT_ALLOW_TF32=1``, as ``CUPY_TF32=1`` allows it in CuPy's
products); float64 runs in float64.

Where cuDNN cannot be loaded or started (``base/cuda_libraries.py`` finds it), or
``MIXRT_CUDNN=0`` turns it off, the convolutions keep their im2col + cuBLAS path and a
RuntimeWarning says so, once a process.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np

from mixrt.base import cuda_libraries


# cudnnDataType_t of each operand dtype, by name (bfloat16 is not a NumPy dtype)
_DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 9}
_NCHW = 0                        # cudnnTensorFormat_t
_CROSS_CORRELATION = 1           # cudnnConvolutionMode_t: ONNX's Conv does not flip its kernel
_DEFAULT_MATH, _TENSOR_OP_MATH, _FMA_MATH = 0, 1, 3  # cudnnMathType_t
_SUCCESS = 0
# the most workspace one call may take; cuDNN's fastest algorithms for big layers want a
# few hundred MB at most, and an algorithm over the limit yields to the next one ranked
WORKSPACE_LIMIT = 1 << 30
PLANS_KEPT = 512                 # a workload of ever-changing shapes keeps this many
_ALGORITHMS_ASKED = 16           # more than any direction has (8, 6 and 7 in cuDNN 9)


class CudnnError(RuntimeError):
    """A cuDNN call failed, or cuDNN cannot be loaded."""


class _Perf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t: one layout for all three."""

    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int),
                ("mathType", ctypes.c_int), ("reserved", ctypes.c_int * 3)]


# -- the settings ------------------------------------------------------------------------------

_tf32 = [os.environ.get("MIXRT_ALLOW_TF32") == "1"]


def allow_tf32(allowed: bool) -> bool:
    """Let float32 convolutions use TF32 tensor cores (10-bit mantissa products, float32
    sums); returns the previous setting. Off by default: results then match float32's."""
    previous, _tf32[0] = _tf32[0], bool(allowed)
    return previous


def tf32_allowed() -> bool:
    return _tf32[0]


# -- the library -------------------------------------------------------------------------------

_loaded: list = []         # [library] once loaded, [None] once it failed
_load_lock = threading.Lock()
_said_absent: list = []


def available() -> bool:
    """Whether convolutions go through cuDNN; the first time it cannot, a RuntimeWarning
    says why (once a process)."""
    try:
        library()
    except CudnnError as exc:
        if not _said_absent:
            _said_absent.append(True)
            warnings.warn(f"GPU convolutions run as im2col + cuBLAS products, without cuDNN: "
                          f"{exc}", RuntimeWarning, stacklevel=3)
        return False
    return True


def library():
    """libcudnn, loaded once (a CudnnError when it cannot be, or is turned off)."""
    if not _loaded:
        with _load_lock:
            if not _loaded:
                _loaded.append(_load())
    if isinstance(_loaded[0], CudnnError):
        raise _loaded[0]
    return _loaded[0]


def use_library(found) -> list:
    """Put ``found`` (a loaded library, an object that stands in for one, a CudnnError to act
    as if none loads, or None to load again on next use) in place of the library, giving
    back every plan and handle made with the one before; returns what was there, for
    :func:`restore_library`. Tests use it."""
    previous = list(_loaded)
    restore_library([] if found is None else [found])
    return previous


def restore_library(previous: list) -> None:
    _plan_for.cache_clear()  # the plans' descriptors go back to the library that made them
    _local.__dict__.clear()
    _loaded[:] = previous


def _load():
    found, why = cuda_libraries.cudnn()
    if found is None:
        return CudnnError(why)
    _declare(found)
    return found


def _declare(found) -> None:
    p, i, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    ints, perf = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_Perf)
    signatures = {
        "cudnnCreate": [ctypes.POINTER(p)], "cudnnSetStream": [p, p],
        "cudnnCreateTensorDescriptor": [ctypes.POINTER(p)],
        "cudnnSetTensorNdDescriptor": [p, i, i, ints, ints],
        "cudnnDestroyTensorDescriptor": [p],
        "cudnnCreateFilterDescriptor": [ctypes.POINTER(p)],
        "cudnnSetFilterNdDescriptor": [p, i, i, i, ints],
        "cudnnDestroyFilterDescriptor": [p],
        "cudnnCreateConvolutionDescriptor": [ctypes.POINTER(p)],
        "cudnnSetConvolutionNdDescriptor": [p, i, ints, ints, ints, i, i],
        "cudnnSetConvolutionGroupCount": [p, i], "cudnnSetConvolutionMathType": [p, i],
        "cudnnDestroyConvolutionDescriptor": [p],
        "cudnnGetConvolutionForwardAlgorithm_v7": [p, p, p, p, p, i, ints, perf],
        "cudnnGetConvolutionBackwardDataAlgorithm_v7": [p, p, p, p, p, i, ints, perf],
        "cudnnGetConvolutionBackwardFilterAlgorithm_v7": [p, p, p, p, p, i, ints, perf],
        "cudnnConvolutionForward": [p, p, p, p, p, p, p, i, p, size, p, p, p],
        "cudnnConvolutionBackwardData": [p, p, p, p, p, p, p, i, p, size, p, p, p],
        "cudnnConvolutionBackwardFilter": [p, p, p, p, p, p, p, i, p, size, p, p, p],
    }
    for name, argtypes in signatures.items():
        getattr(found, name).argtypes = argtypes


def _check(status: int, what: str) -> None:
    if status != _SUCCESS:
        describe = getattr(library(), "cudnnGetErrorString", None)
        text = describe(status).decode() if describe is not None else "a cuDNN error"
        raise CudnnError(f"{what} returned status {status} ({text})")


def _call(name: str, *args) -> None:
    _check(getattr(library(), name)(*args), name)


def _created(kind: str) -> int:
    handle = ctypes.c_void_p()
    _call(f"cudnnCreate{kind}", ctypes.byref(handle))
    return handle.value


# -- handles: one per thread and device, since a handle carries the stream it launches on --

_local = threading.local()


def _handle(xp) -> int:
    """This thread's handle on the current device, pointed at the current stream."""
    device = xp.cuda.Device().id
    handles = _local.__dict__.setdefault("handles", {})
    handle = handles.get(device)
    if handle is None:
        handle = handles[device] = _created("")
    _call("cudnnSetStream", handle, xp.cuda.get_current_stream().ptr)
    return handle


# -- plans ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    """A convolution as cuDNN takes it: N-D (N >= 2) with one pad a side on every axis."""

    x_shape: tuple
    w_shape: tuple
    y_shape: tuple
    pads: tuple
    strides: tuple
    dilations: tuple
    group: int


@dataclass
class _Plan:
    data_type: int
    math: int
    x: int
    w: int
    y: int
    geometry: Geometry
    convolutions: dict = field(default_factory=dict)  # math type -> its descriptor
    chosen: dict = field(default_factory=dict)        # direction -> (algo, bytes, descriptor)

    def operands(self, direction: str) -> tuple:
        """The descriptors of the two operands and the result, in the order the calls of
        ``direction`` take them."""
        return {"forward": (self.x, self.w, self.y), "data": (self.w, self.y, self.x),
                "filter": (self.x, self.y, self.w)}[direction]

    def __del__(self):  # an evicted plan gives its descriptors back
        try:
            _call("cudnnDestroyTensorDescriptor", self.x)
            _call("cudnnDestroyFilterDescriptor", self.w)
            _call("cudnnDestroyTensorDescriptor", self.y)
            for descriptor in self.convolutions.values():
                _call("cudnnDestroyConvolutionDescriptor", descriptor)
        except Exception:  # noqa: BLE001,S110  (at exit the library may be gone)
            pass


def supports(dtype) -> bool:
    return np.dtype(dtype).name in _DATA_TYPES


def _plan(xp, dtype, geometry: Geometry) -> _Plan:
    name = np.dtype(dtype).name
    return _plan_for(xp.cuda.Device().id, name, _math_type(name), geometry)


@functools.lru_cache(maxsize=PLANS_KEPT)
def _plan_for(device: int, dtype_name: str, math: int, geometry: Geometry) -> _Plan:
    """A plan per device, dtype, math mode and geometry (the device keys it because
    cuDNN's choice depends on the GPU)."""
    data_type = _DATA_TYPES[dtype_name]
    return _Plan(data_type, math, _tensor(data_type, geometry.x_shape),
                 _filter(data_type, geometry.w_shape), _tensor(data_type, geometry.y_shape),
                 geometry)


def _math_type(name: str) -> int:
    if name in ("float16", "bfloat16"):
        return _TENSOR_OP_MATH
    if name == "float32" and not _tf32[0]:
        return _FMA_MATH  # cuDNN's default math would let Ampere and later use TF32
    return _DEFAULT_MATH


def _ints(values) -> ctypes.Array:
    return (ctypes.c_int * len(values))(*values)


def _tensor(data_type: int, shape: tuple) -> int:
    descriptor = _created("TensorDescriptor")
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    _call("cudnnSetTensorNdDescriptor", descriptor, data_type, len(shape), _ints(shape),
          _ints(strides[::-1]))
    return descriptor


def _filter(data_type: int, shape: tuple) -> int:
    descriptor = _created("FilterDescriptor")
    _call("cudnnSetFilterNdDescriptor", descriptor, data_type, _NCHW, len(shape), _ints(shape))
    return descriptor


def _convolution(plan: _Plan, math: int) -> int:
    descriptor = plan.convolutions.get(math)
    if descriptor is None:
        g = plan.geometry
        descriptor = _created("ConvolutionDescriptor")
        # the products accumulate in float32 for every float type but float64
        compute = _DATA_TYPES["float64"] if plan.data_type == 1 else _DATA_TYPES["float32"]
        _call("cudnnSetConvolutionNdDescriptor", descriptor, len(g.pads), _ints(g.pads),
              _ints(g.strides), _ints(g.dilations), _CROSS_CORRELATION, compute)
        _call("cudnnSetConvolutionGroupCount", descriptor, g.group)
        _call("cudnnSetConvolutionMathType", descriptor, math)
        plan.convolutions[math] = descriptor
    return descriptor


_QUERIES = {"forward": "cudnnGetConvolutionForwardAlgorithm_v7",
            "data": "cudnnGetConvolutionBackwardDataAlgorithm_v7",
            "filter": "cudnnGetConvolutionBackwardFilterAlgorithm_v7"}


def _chosen(handle: int, plan: _Plan, direction: str) -> tuple:
    """(algorithm, workspace bytes, convolution descriptor) for ``direction``: cuDNN's
    heuristics' best-ranked algorithm that works, fits the workspace limit and keeps the
    plan's math (so float32 without TF32 never gets a tensor-core algorithm); chosen once."""
    found = plan.chosen.get(direction)
    if found is not None:
        return found
    operands = plan.operands(direction)
    requested = _convolution(plan, plan.math)
    results, count = (_Perf * _ALGORITHMS_ASKED)(), ctypes.c_int()
    _call(_QUERIES[direction], handle, operands[0], operands[1], requested, operands[2],
          _ALGORITHMS_ASKED, ctypes.byref(count), results)
    for perf in results[:count.value]:
        if perf.status == _SUCCESS and perf.memory <= WORKSPACE_LIMIT \
                and _math_keeps(plan.math, perf.mathType):
            found = (perf.algo, perf.memory, _convolution(plan, perf.mathType))
            plan.chosen[direction] = found
            return found
    raise CudnnError(f"cuDNN has no {direction} algorithm for a convolution of {plan.geometry} "
                     f"within {WORKSPACE_LIMIT >> 20} MiB of workspace")


def _math_keeps(requested: int, offered: int) -> bool:
    if requested == _FMA_MATH:
        return offered == _FMA_MATH
    return True


# -- the three convolutions ------------------------------------------------------------------

def forward(xp, x, w, geometry: Geometry, out=None):
    """y = conv(x, w) (no bias), into ``out`` when given (a contiguous array of y's shape)."""
    y = out if out is not None else xp.empty(geometry.y_shape, dtype=x.dtype)
    _run(xp, "forward", geometry, x.dtype, (x, w), y)
    return y


def data_gradient(xp, dy, w, geometry: Geometry, out=None):
    """dx of y = conv(x, w) given dy."""
    dx = out if out is not None else xp.empty(geometry.x_shape, dtype=dy.dtype)
    _run(xp, "data", geometry, dy.dtype, (w, dy), dx)
    return dx


def filter_gradient(xp, dy, x, geometry: Geometry, out=None):
    """dw of y = conv(x, w) given dy."""
    dw = out if out is not None else xp.empty(geometry.w_shape, dtype=dy.dtype)
    _run(xp, "filter", geometry, dy.dtype, (x, dy), dw)
    return dw


_LAUNCHES = {"forward": "cudnnConvolutionForward", "data": "cudnnConvolutionBackwardData",
             "filter": "cudnnConvolutionBackwardFilter"}


def _run(xp, direction: str, geometry: Geometry, dtype, operands: tuple, result) -> None:
    plan = _plan(xp, dtype, geometry)
    handle = _handle(xp)
    algorithm, workspace_bytes, descriptor = _chosen(handle, plan, direction)
    first, second = (xp.ascontiguousarray(a) for a in operands)
    workspace = xp.empty(workspace_bytes, dtype=np.uint8) if workspace_bytes else None
    scalar = ctypes.c_double if plan.data_type == _DATA_TYPES["float64"] else ctypes.c_float
    alpha, beta = scalar(1.0), scalar(0.0)
    descriptors = plan.operands(direction)
    _call(_LAUNCHES[direction], handle, ctypes.byref(alpha),
          descriptors[0], first.data.ptr, descriptors[1], second.data.ptr, descriptor,
          algorithm, workspace.data.ptr if workspace is not None else None, workspace_bytes,
          ctypes.byref(beta), descriptors[2], result.data.ptr)
