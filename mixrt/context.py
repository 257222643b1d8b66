"""Contexts: where an NDArray lives, in MXNet's spelling (``mixrt.cpu()``, ``mixrt.gpu(0)``).

A Context is a thin, hashable name for a :class:`mixrt.ops.device.Device`; the kernels
only ever see the device's array module (``xp``). ``with mixrt.gpu(0):`` makes it the default
for arrays created without ``ctx=``, per thread.

MXNet's two other host kinds are names too: ``cpu_pinned`` (page-locked memory for faster
copies to a GPU) and ``cpu_shared`` (shared memory, which MXNet's DataLoader workers hand
batches through). Both are host memory to mixrt: NumPy arrays on the CPU device, as
``cpu(i)`` for every ``i`` is; the Context keeps its kind so that it compares and prints as
MXNet's does (``cpu_shared(0) != cpu(0)``).
"""

from __future__ import annotations

import threading
import warnings

from mixrt.base.errors import DeviceUnavailableError, InputError
from mixrt.ops.device import Device, gpu_count, parse_device

# MXNet's device type ids (``Context.devtype2str``), which its C API and files use
_TYPE_IDS = {"cpu": 1, "gpu": 2, "cpu_pinned": 3, "cpu_shared": 5}
_KINDS = tuple(_TYPE_IDS)


class _ContextType(type):
    @property
    def default_ctx(cls) -> "Context":
        """MXNet's deprecated class-level spelling of :func:`current_context`."""
        warnings.warn("Context.default_ctx has been deprecated. Please use "
                      "mixrt.context.current_context() instead.", DeprecationWarning,
                      stacklevel=2)
        return current_context()


class Context(metaclass=_ContextType):
    __slots__ = ("device_type", "device_id", "device", "_previous")

    # MXNet's class-level tables between its device type ids and kinds (code reading a
    # context out of MXNet's files and C API structures looks kinds up here)
    devtype2str = {type_id: kind for kind, type_id in _TYPE_IDS.items()}
    devstr2type = dict(_TYPE_IDS)

    def __init__(self, device_type: str = "cpu", device_id: int = 0):
        if isinstance(device_type, Context):
            device_type, device_id = device_type.device_type, device_type.device_id
        if device_type not in _KINDS:
            raise InputError(f"context type must be one of {_KINDS}, got {device_type!r}")
        self.device_type, self.device_id = device_type, int(device_id)
        is_gpu = device_type == "gpu"
        self.device = Device("gpu" if is_gpu else "cpu", self.device_id if is_gpu else 0)
        self._previous = None

    @property
    def device_typeid(self) -> int:
        """MXNet's number for the kind (1 cpu, 2 gpu, 3 cpu_pinned, 5 cpu_shared)."""
        return _TYPE_IDS[self.device_type]

    @property
    def xp(self):
        return self.device.xp

    def __eq__(self, other) -> bool:
        return isinstance(other, Context) and (self.device_type, self.device_id) == \
            (other.device_type, other.device_id)

    def __hash__(self) -> int:
        return hash((self.device_type, self.device_id))

    def __repr__(self) -> str:
        return f"{self.device_type}({self.device_id})"

    __str__ = __repr__

    def __enter__(self) -> "Context":
        if self.device_type == "gpu":
            parse_device(f"gpu:{self.device_id}")  # a clear error now, not at the first op
        self._previous = current_context()
        _state.context = self
        return self

    def __exit__(self, *_exc) -> None:
        _state.context, self._previous = self._previous, None


class _State(threading.local):
    context: Context | None = None


_state = _State()


def cpu(device_id: int = 0) -> Context:
    return Context("cpu", device_id)


def gpu(device_id: int = 0) -> Context:
    return Context("gpu", device_id)


def cpu_pinned(device_id: int = 0) -> Context:
    """MXNet's page-locked host memory; host memory to mixrt."""
    return Context("cpu_pinned", device_id)


def cpu_shared(device_id: int = 0) -> Context:
    """MXNet's shared host memory (DataLoader workers' batches); host memory to mixrt."""
    return Context("cpu_shared", device_id)


def current_context() -> Context:
    return _state.context or _CPU


_CPU = Context("cpu", 0)


def as_context(ctx) -> Context:
    """A Context from a Context, a Device, ``"cpu"``/``"gpu:1"`` or None (the current one)."""
    if ctx is None:
        return current_context()
    if isinstance(ctx, Context):
        return ctx
    device = ctx if isinstance(ctx, Device) else parse_device(ctx)
    return Context(device.kind, device.index)


def num_gpus() -> int:
    return gpu_count()


def gpu_memory_info(device_id: int = 0) -> tuple[int, int]:
    """(free bytes, total bytes) of GPU ``device_id``, as the CUDA driver reports them."""
    parse_device(f"gpu:{device_id}")  # raises DeviceUnavailableError naming what is missing
    import cupy  # noqa: PLC0415  (present: parse_device checked)
    try:
        with cupy.cuda.Device(device_id):
            free, total = cupy.cuda.runtime.memGetInfo()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise DeviceUnavailableError(f"gpu({device_id}): memory query failed: {exc}") from exc
    return int(free), int(total)
