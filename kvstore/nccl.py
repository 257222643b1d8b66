"""The ``nccl`` kind: one process driving several GPUs of a machine (MXNet's ``kvstore='nccl'``).

    kv = NCCLStore()                       # mixrt.kv.create("nccl")
    kv.init("w", weight_on_gpu0)           # the store keeps a copy on that GPU
    kv.push("w", [grad_gpu0, grad_gpu1])   # one CuPy array per GPU: NCCL all-reduce (sum)
    kv.pull("w", out=[w_gpu0, w_gpu1])     # the stored value, broadcast to each GPU
                                           # (a NumPy `out` gets a host copy)

A push all-reduces the per-device arrays in one NCCL group (``groupStart``/``groupEnd``),
each device's reduce on that device's current CUDA stream, into scratch buffers the store
owns (the caller's arrays are only read). Then, as every kind does (``kvstore/base.py``), the
updater runs on the stored weight's GPU with the summed gradient, or without one the stored
value becomes the sum. Communicators are made once per tuple of devices with
``NcclCommunicator.initAll`` and kept until ``close``. Work is only queued: ordering follows
each device's current stream, and where data crosses devices outside NCCL the store makes
the receiving stream wait on a CUDA event of the sending one, so the caller synchronizes as
with any CuPy work (``.get()``, ``Stream.synchronize``).

NCCL wants one array per device, so a push of two arrays on one GPU is refused; dtypes are
float16/32/64 and int32/64. Gradient compression is refused (MXNet does not compress on
``nccl`` either). CuPy is imported lazily: this module imports without it, and constructing
the store without CuPy, without a GPU or without NCCL raises DeviceUnavailableError.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import DeviceUnavailableError, KVStoreError
from mixrt.kvstore.base import KVStore, check_like, copy_into, key_value_pairs, require_out
from mixrt.ops.device import gpu_count

# numpy dtype name -> the cupy.cuda.nccl constant of the same type
_NCCL_TYPES = {
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
    "int32": "NCCL_INT32",
    "int64": "NCCL_INT64",
}

_ALTERNATIVE = "use kind 'local' or 'device' instead"


def load_cupy_nccl():
    """``(cupy, cupy.cuda.nccl)``, or DeviceUnavailableError saying what is missing."""
    try:
        import cupy  # noqa: PLC0415  (optional dependency)
    except Exception as exc:  # ImportError, or CUDA libraries missing at import
        raise DeviceUnavailableError(
            f"the 'nccl' KVStore needs CuPy and NVIDIA GPUs, but CuPy is not importable "
            f"({type(exc).__name__}: {exc}); install mixrt[gpu] on a machine with NVIDIA "
            f"GPUs, or {_ALTERNATIVE}") from None
    if gpu_count() == 0:
        raise DeviceUnavailableError(
            f"the 'nccl' KVStore needs NVIDIA GPUs, but CuPy sees no CUDA device here; "
            f"{_ALTERNATIVE}")
    try:
        from cupy.cuda import nccl  # noqa: PLC0415
    except Exception as exc:
        raise DeviceUnavailableError(
            f"the 'nccl' KVStore needs CuPy's NCCL bindings, which do not import "
            f"({type(exc).__name__}: {exc}); {_ALTERNATIVE}") from None
    if not getattr(nccl, "available", False):
        raise DeviceUnavailableError(
            "the 'nccl' KVStore needs NCCL, but this CuPy was built or installed without "
            "it (cupy.cuda.nccl.available is False); install NCCL for your CUDA version "
            "(e.g. `python -m cupyx.tools.install_library --library nccl --cuda 12.x`), "
            f"or {_ALTERNATIVE}")
    return cupy, nccl


class NCCLStore(KVStore):
    type = "nccl"

    def __init__(self):
        super().__init__()
        self._cupy, self._nccl = load_cupy_nccl()
        self._store: dict[str, object] = {}
        self._scratch: dict[tuple[str, int], object] = {}  # (key, device) -> sum buffer
        self._comms: dict[tuple[int, ...], list] = {}      # devices -> communicators

    # -- data ---------------------------------------------------------------------------

    def init(self, key, value) -> None:
        cupy = self._cupy
        for name, arrays in key_value_pairs(key, value, "init"):
            if name in self._store:
                raise KVStoreError(f"init: key {name!r} is already initialized")
            self._require_gpu_arrays(name, arrays, "init")
            first = arrays[0]
            self._nccl_type(name, first.dtype, "init")
            with cupy.cuda.Device(first.device.id):
                # C order: NCCL moves flat element counts, so every buffer shares one layout
                self._store[name] = cupy.array(first, copy=True, order="C")

    def push(self, key, value, priority: int = 0) -> None:
        cupy = self._cupy
        for name, arrays in key_value_pairs(key, value, "push"):
            stored = self._stored(name, "push")
            self._require_gpu_arrays(name, arrays, "push")
            for array in arrays:
                check_like(name, stored, array, "push")
            devices = tuple(int(a.device.id) for a in arrays)
            if len(set(devices)) != len(devices):
                raise KVStoreError(
                    f"push key {name!r}: arrays on GPUs {list(devices)}; NCCL reduces one "
                    f"array per device, so sum the arrays of one GPU before pushing (or use "
                    f"kind 'device', which accepts any list)")
            total = self._all_reduce(name, arrays, devices, stored)
            home = stored.device.id
            with cupy.cuda.Device(home):
                self._apply(name, total, stored)

    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True):
        # sparse outs are filled as dense ones here (only the local kinds skip them)
        require_out(out)
        cupy = self._cupy
        for name, arrays in key_value_pairs(key, out, "pull"):
            stored = self._stored(name, "pull")
            for array in arrays:
                check_like(name, stored, array, "pull")
            on_gpu = [a for a in arrays if isinstance(a, cupy.ndarray)]
            devices = tuple(int(a.device.id) for a in on_gpu)
            if len(on_gpu) > 1 and len(set(devices)) == len(devices) \
                    and stored.device.id in devices \
                    and all(a.flags.c_contiguous for a in on_gpu):
                self._broadcast(name, stored, on_gpu, devices)
            else:
                for array in on_gpu:
                    self._copy(array, stored)
            for array in arrays:
                if not isinstance(array, cupy.ndarray):
                    copy_into(array, stored)  # a host copy (blocks until it is there)
        return out

    def set_gradient_compression(self, params: dict) -> None:
        raise KVStoreError("gradient compression is not available on the 'nccl' store "
                           "(MXNet does not compress on nccl either); use kind 'device' or "
                           "a 'dist_*' kind to compress gradients")

    def close(self) -> None:
        """Destroy the NCCL communicators and drop the scratch buffers."""
        for comms in self._comms.values():
            for comm in comms:
                comm.destroy()
        self._comms.clear()
        self._scratch.clear()

    # -- NCCL ---------------------------------------------------------------------------

    def _all_reduce(self, name: str, arrays: list, devices: tuple, stored):
        """The sum of ``arrays`` (one per device) on the stored value's GPU, in a buffer of
        the store; every ``arrays[i]`` is only read."""
        cupy, nccl = self._cupy, self._nccl
        datatype = self._nccl_type(name, stored.dtype, "push")
        sends, receives = [], []
        for array, device in zip(arrays, devices):
            with cupy.cuda.Device(device):
                sends.append(array if array.flags.c_contiguous
                             else cupy.ascontiguousarray(array))
            receives.append(self._scratch_on(name, device, stored))
        if stored.size:
            comms = self._communicators(devices)
            self._grouped(
                f"push key {name!r}: NCCL all-reduce over GPUs {list(devices)}",
                [(device, lambda comm, stream, s=send, r=recv: comm.allReduce(
                    s.data.ptr, r.data.ptr, r.size, datatype, nccl.NCCL_SUM, stream.ptr))
                 for device, send, recv in zip(devices, sends, receives)], comms)
        home = stored.device.id
        if home in devices:
            return receives[devices.index(home)]
        total = self._scratch_on(name, home, stored)
        self._copy(total, receives[0])
        return total

    def _broadcast(self, name: str, stored, outs: list, devices: tuple) -> None:
        """NCCL broadcast of ``stored`` into ``outs`` (C-contiguous, one per device, one of
        them on the stored value's GPU)."""
        datatype = self._nccl_type(name, stored.dtype, "pull")
        if not stored.size:
            return
        root = devices.index(stored.device.id)
        comms = self._communicators(devices)
        self._grouped(
            f"pull key {name!r}: NCCL broadcast to GPUs {list(devices)}",
            [(device, lambda comm, stream, o=out, rank=rank: comm.broadcast(
                stored.data.ptr if rank == root else o.data.ptr, o.data.ptr, o.size,
                datatype, root, stream.ptr))
             for rank, (device, out) in enumerate(zip(devices, outs))], comms)

    def _grouped(self, what: str, calls: list, comms: list) -> None:
        """``call(comm, stream)`` for each ``(device, call)`` in one NCCL group, each on its
        device's current stream (rank i of ``comms`` is ``calls[i]``'s device)."""
        cupy, nccl = self._cupy, self._nccl
        try:
            nccl.groupStart()
            try:
                for comm, (device, call) in zip(comms, calls):
                    with cupy.cuda.Device(device):
                        call(comm, cupy.cuda.get_current_stream())
            finally:
                nccl.groupEnd()
        except nccl.NcclError as exc:
            raise KVStoreError(f"{what} failed: {exc}") from exc

    def _communicators(self, devices: tuple) -> list:
        comms = self._comms.get(devices)
        if comms is None:
            try:
                comms = self._nccl.NcclCommunicator.initAll(list(devices))
            except self._nccl.NcclError as exc:
                raise KVStoreError(f"could not create NCCL communicators for GPUs "
                                   f"{list(devices)}: {exc}") from exc
            self._comms[devices] = comms
        return comms

    def _scratch_on(self, name: str, device: int, like):
        buffer = self._scratch.get((name, device))
        if buffer is None:
            with self._cupy.cuda.Device(device):
                buffer = self._cupy.empty(like.shape, like.dtype)
            self._scratch[(name, device)] = buffer
        return buffer

    # -- copies between GPUs ------------------------------------------------------------

    def _copy(self, dst, src) -> None:
        """``dst[...] = src`` (``src`` C-contiguous, any GPU) on ``dst``'s current stream,
        after the work queued so far on ``src``'s; ``src`` may be written again (on its
        stream) only after the copy has read it."""
        cupy = self._cupy
        source, target = src.device.id, dst.device.id
        if source != target:
            self._order(source, target)
        with cupy.cuda.Device(target):
            stream = cupy.cuda.get_current_stream()
            if dst.flags.c_contiguous:
                dst.data.copy_from_device_async(src.data, src.nbytes, stream)
            else:
                staged = cupy.empty(dst.shape, dst.dtype)
                staged.data.copy_from_device_async(src.data, src.nbytes, stream)
                dst[...] = staged
        if source != target:
            self._order(target, source)

    def _order(self, before: int, after: int) -> None:
        """Work queued next on GPU ``after``'s current stream waits for what GPU
        ``before``'s current stream holds now (a CUDA event)."""
        cupy = self._cupy
        with cupy.cuda.Device(before):
            event = cupy.cuda.Event(disable_timing=True)
            event.record(cupy.cuda.get_current_stream())
        with cupy.cuda.Device(after):
            cupy.cuda.get_current_stream().wait_event(event)

    # -- checks -------------------------------------------------------------------------

    def _require_gpu_arrays(self, name: str, arrays: list, what: str) -> None:
        for array in arrays:
            if not isinstance(array, self._cupy.ndarray):
                raise KVStoreError(
                    f"{what} key {name!r}: the 'nccl' store needs GPU arrays (CuPy), got "
                    f"{type(array).__module__}.{type(array).__name__}; {_ALTERNATIVE} for "
                    f"host arrays")

    def _nccl_type(self, name: str, dtype, what: str) -> int:
        dtype = np.dtype(dtype)
        if dtype.name not in _NCCL_TYPES:
            raise KVStoreError(f"{what} key {name!r}: dtype {dtype} is not reduced by the "
                               f"'nccl' store; supported: {sorted(_NCCL_TYPES)}")
        return int(getattr(self._nccl, _NCCL_TYPES[dtype.name]))

    def _stored(self, name: str, what: str):
        if name not in self._store:
            raise KVStoreError(f"{what}: key {name!r} was never initialized (call init "
                               f"first); initialized keys: {sorted(self._store)[:20]}")
        return self._store[name]
