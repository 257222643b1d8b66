"""Devices: the CPU through NumPy, NVIDIA GPUs through CuPy.

Kernels receive the array module of their device (``xp``), so one definition serves both.
CuPy is optional: importing mixrt never requires it, and asking for a GPU without it is a
:class:`DeviceUnavailableError` that says how to get one.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import re
from dataclasses import dataclass

import numpy as np

from mixrt.base.errors import DeviceUnavailableError

_DEVICE_PATTERN = re.compile(r"^(cpu|gpu|cuda)(?::(\d+))?$")
# the dtypes a CuPy array holds (CuPy's own list): bool, the integers, float16/32/64 and
# complex. Not strings (object), nor ml_dtypes' float8, int4 and the like; bfloat16 from
# CuPy 14 on
GPU_TYPE_CHARS = frozenset("?bhilqBHILQefdFD")


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" | "gpu"
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"

    @property
    def xp(self):
        """The array module whose kernels run on this device. On a GPU its kernels and new
        arrays go to CuPy's current device: work for this one runs inside :meth:`active`
        (which device is current is the calling thread's own business, so mixrt never
        changes it for good)."""
        if self.kind == "cpu":
            return np
        return _cupy()

    def active(self):
        """A context in which this device is CuPy's current one, for the thread that enters
        it (CuPy's current device is per thread, and arrays, kernels and streams go to it);
        nothing on the CPU."""
        if self.kind == "cpu":
            return contextlib.nullcontext()
        return _cupy().cuda.Device(self.index)

    def put(self, array, what: str = "an array"):
        """Move a host or device array onto this device (``what`` names it in the error
        raised for a dtype the GPU cannot hold)."""
        if self.kind == "cpu":
            return to_host(array)
        dtype = getattr(array, "dtype", None)
        if dtype is not None and not gpu_holds(dtype):
            raise DeviceUnavailableError(
                f"{what} is {np.dtype(dtype).name}, which a CuPy array cannot hold on "
                f"{self} ({gpu_dtypes_text()}); run this model on the CPU")
        with _cupy().cuda.Device(self.index):
            return _cupy().asarray(array)


CPU = Device("cpu")


def on_own_device(method):
    """A method of an object with a ``device`` attribute, run with that device current, so
    its GPU work and new arrays go there (the caller's current device comes back after)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.device.active():
            return method(self, *args, **kwargs)
    return run


def parse_device(spec: "str | Device") -> Device:
    """``"cpu"``, ``"gpu"``, ``"gpu:1"`` (``"cuda:1"`` too) or a ``mixrt.Context``
    (``mixrt.gpu(1)``) -> Device, checking it exists."""
    if isinstance(spec, Device):
        return spec
    named = getattr(spec, "device", None)  # a Context names its Device; check it as a string
    text = str(named) if isinstance(named, Device) else spec
    device = device_named(text)
    if device.kind == "gpu":
        _check_present(text, device.index)
    return device


def device_named(spec: str) -> Device:
    """The Device ``spec`` names, present on this machine or not (``mixrt check
    --registry-only`` asks the registry about a GPU from a CPU-only machine)."""
    match = _DEVICE_PATTERN.match(str(spec).strip().lower())
    if not match:
        raise DeviceUnavailableError(
            f"device {spec!r} is not understood; expected 'cpu', 'gpu' or 'gpu:N'")
    kind, index = match.group(1), int(match.group(2) or 0)
    return CPU if kind == "cpu" else Device("gpu", index)


def _check_present(spec, index: int) -> None:
    count = gpu_count()
    if count == 0:
        raise DeviceUnavailableError(
            f"device {spec!r} was requested but no CUDA GPU is usable here "
            f"({_gpu_absence_reason()}); install mixrt[gpu] on a machine with an NVIDIA GPU "
            f"or use device='cpu'")
    if index >= count:
        raise DeviceUnavailableError(
            f"device {spec!r} was requested but this machine has {count} GPU(s): "
            f"gpu:0..gpu:{count - 1}")


@functools.lru_cache(maxsize=1)
def _cupy_import():
    try:
        import cupy  # noqa: PLC0415  (optional dependency)
    except Exception as exc:  # ImportError, or CUDA libraries missing at import
        return None, f"CuPy is not importable: {exc}"
    return cupy, None


def _cupy():
    cupy, reason = _cupy_import()
    if cupy is None:
        raise DeviceUnavailableError(reason)
    return cupy


@functools.lru_cache(maxsize=1)
def gpu_count() -> int:
    cupy, _ = _cupy_import()
    if cupy is None:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def gpu_holds(dtype) -> bool:
    """Whether a CuPy array can hold ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype.char in GPU_TYPE_CHARS:
        return True
    return dtype.name == "bfloat16" and _cupy_major() >= 14


def gpu_dtypes_text() -> str:
    bfloat16 = ", bfloat16" if _cupy_major() >= 14 else ""
    return f"it holds bool, integers, float16/32/64{bfloat16} and complex"


def _cupy_major() -> int:
    cupy, _ = _cupy_import()
    try:
        return int(str(getattr(cupy, "__version__", "0")).split(".")[0])
    except ValueError:
        return 0


def gpu_available() -> bool:
    return gpu_count() > 0


def _gpu_absence_reason() -> str:
    cupy, reason = _cupy_import()
    return reason if cupy is None else "CuPy sees no CUDA device"


def device_kind(xp) -> str:
    """The kind of device whose registered kernels (``Kernel.for_device``) run on ``xp``'s
    arrays: "cpu" for NumPy, "gpu" for CuPy."""
    return "cpu" if xp is np else "gpu"


def array_module(array):
    """numpy or cupy, whichever owns ``array``."""
    if isinstance(array, np.ndarray) or np.isscalar(array):
        return np
    cupy, _ = _cupy_import()
    if cupy is not None and isinstance(array, cupy.ndarray):
        return cupy
    return np


# bytes on which host buffers start: a cache line, and an AVX-512 vector. OpenBLAS's sgemm
# read a (768, 3072) weight starting 48 bytes past such a boundary (where NumPy's allocator
# put every initializer of the BERT-shaped encoder) in 1666 us, aligned in 1461
ALIGNMENT = 64


def aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` of uninitialized host memory (uint8) starting on an :data:`ALIGNMENT`
    boundary; from :data:`OWN_PAGES_FROM` bytes a private anonymous mapping of its own
    (:func:`own_pages`)."""
    if nbytes >= OWN_PAGES_FROM and _MAPS_PRIVATE:
        return own_pages(nbytes)
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes]


# NumPy asks the kernel for transparent huge pages on every array from 4 MiB, and where its
# defrag setting is ``madvise`` (Ubuntu's default) a fault on such memory may compact memory
# first: a session's arena grown for a service's first large image took that in its kernels,
# MobileNetV2's first 4 x 192 x 224 batch 41.5 ms against 20.8 without (onnxruntime 7.6),
# its first 2 x 224 x 352 33.5 against 19.1 (2026-12-04). Its arenas, scratch and aligned
# copies from that size are mappings of their own on the system's pages, zeroed as the
# kernel faults them in; their runs took the same time either way.
OWN_PAGES_FROM = 4 << 20
_MAPS_PRIVATE = hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")


def own_pages(nbytes: int) -> np.ndarray:
    """``nbytes`` of zeroed host memory (uint8), page-aligned, a private anonymous mapping
    unmapped when the last array on it goes."""
    region = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(region, np.uint8, count=nbytes)


def aligned(array):
    """``array`` itself when it is not a NumPy array, is empty or starts on an
    :data:`ALIGNMENT` boundary; otherwise a copy that does (read-only if ``array`` was)."""
    if not isinstance(array, np.ndarray) or array.size == 0 \
            or array.ctypes.data % ALIGNMENT == 0 or array.dtype.hasobject:
        return array
    copy = aligned_empty(array.nbytes).view(array.dtype).reshape(array.shape)
    copy[...] = array
    copy.flags.writeable = array.flags.writeable
    return copy


def add_at(xp, target, index, values) -> None:
    """``target[index] += values`` with repeated indices each adding (NumPy's
    ``add.at``); CuPy's ufuncs have ``at`` only from v13, ``cupyx.scatter_add`` before."""
    at = getattr(xp.add, "at", None)
    if at is not None:
        at(target, index, values)
    else:
        import cupyx  # noqa: PLC0415  (GPU only)
        cupyx.scatter_add(target, index, values)


def to_host(value):
    """A NumPy copy of a device array (sequences element-wise); host arrays pass through."""
    if isinstance(value, list):
        return [to_host(v) for v in value]
    if value is None or isinstance(value, np.ndarray):
        return value
    if hasattr(value, "get"):
        return value.get()
    return np.asarray(value)
