"""cupy.cuda on the fake: devices (a current one per thread), streams that run everything at
once, no capture."""

from __future__ import annotations

import contextlib
import time

from cupy._core import _current, current_device
from cupy.cuda import runtime  # noqa: F401


class Device:
    def __init__(self, device=None):
        self.id = current_device() if device is None else int(device)
        if not 0 <= self.id < runtime.getDeviceCount():
            raise runtime.CUDARuntimeError(f"cudaErrorInvalidDevice: device {self.id}")

    def use(self):
        _current.device = self.id

    def synchronize(self):
        pass

    @property
    def compute_capability(self):
        return "90"

    @property
    def mem_info(self):
        return runtime.memGetInfo()

    def __enter__(self):
        self._previous = current_device()
        self.use()
        return self

    def __exit__(self, *exc):
        _current.device = self._previous

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


class Stream:
    null = None

    def __init__(self, null=False, non_blocking=False, ptr=None):
        self.ptr = 0 if null else id(self)
        self._stack = []

    def __enter__(self):
        self._stack.append(get_current_stream())
        _current.stream = self
        return self

    def __exit__(self, *exc):
        _current.stream = self._stack.pop()

    def synchronize(self):
        pass

    def use(self):
        _current.stream = self
        return self

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event):
        pass

    def begin_capture(self, mode=None):
        raise NotImplementedError("fake CuPy cannot capture CUDA graphs")

    def end_capture(self):
        raise NotImplementedError("fake CuPy cannot capture CUDA graphs")

    def is_capturing(self):
        return False


Stream.null = Stream(null=True)


def get_current_stream(device_id=None):
    return getattr(_current, "stream", Stream.null)


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.time = None

    def record(self, stream=None):
        self.time = time.perf_counter()

    def synchronize(self):
        pass

    @property
    def done(self):
        return True


def get_elapsed_time(start, end):
    return (end.time - start.time) * 1e3


class MemoryPool:
    _default = None

    def __init__(self, allocator=None):
        self._used = 0

    def malloc(self, size):
        raise NotImplementedError("fake CuPy has no device memory to allocate from")

    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def free_bytes(self):
        return 0

    def free_all_blocks(self, stream=None):
        pass

    def set_limit(self, size=None, fraction=None):
        pass

    def get_limit(self):
        return 0


MemoryPool._default = MemoryPool()


@contextlib.contextmanager
def using_allocator(allocator=None):
    yield


class Graph:
    def launch(self, stream=None):
        raise NotImplementedError("fake CuPy has no CUDA graphs")
