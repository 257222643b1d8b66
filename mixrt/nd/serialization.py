"""``nd.save``, ``nd.load`` and ``nd.load_frombuffer`` in MXNet's own binary NDArray-list
format, so that ``.params`` files written by MXNet 1.x load here and files written here load
in MXNet. No pickle: the bytes are read with ``struct`` and ``numpy.frombuffer``.

The layout (little-endian), as MXNet 1.x writes it::

    uint64 0x112 (the list magic), uint64 0 (reserved)
    uint64 n, then n array records
    uint64 m (0, or n: the names of a dict), then m times: uint64 length, UTF-8 bytes

    array record, version 2 (magic 0xF993FAC9) or 3 (0xF993FACA, NumPy shape semantics):
      uint32 magic, int32 storage type (0 dense, 1 row_sparse, 2 csr)
      [sparse: the storage shape]
      shape: uint32 ndim, ndim x int64
      int32 device type (1 cpu, 2 gpu, 3 cpu_pinned, 5 cpu_shared), int32 device id
      int32 dtype code (0 float32, 1 float64, 2 float16, 3 uint8, 4 int32, 5 int8,
                        6 int64, 7 bool; 8-11 int16, uint16, uint32, uint64)
      [sparse: per auxiliary array (csr: indptr, indices; row_sparse: indices)
               int32 dtype code and its shape]
      the values, C order; [sparse: the auxiliary arrays' values]

Older records: version 1 (0xF993FAC8) has no storage type; the first, unversioned one starts
with its uint32 ndim and has uint32 dimensions. A version-2 record of ndim 0 is MXNet's empty
array when nothing follows; MXNet 1.9 also writes 0-d arrays that way (with their device,
dtype and value after), which it cannot read back: here those load as 0-d arrays. mixrt
writes version 2, and version 3 for arrays MXNet 1.x's legacy shapes cannot hold (0-d, or a
dimension of 0), which MXNet reads under ``mx.util.np_shape(True)``.

Sparse records are parsed; making arrays of them needs a builder per storage type
(``SPARSE_BUILDERS``), which mixrt's sparse storage will register.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from mixrt.base import MXNET_DTYPE_CODES
from mixrt.base.errors import InputError, ModelLoadError
from mixrt.context import Context, num_gpus
from mixrt.nd.ndarray import NDArray

LIST_MAGIC = 0x112
V1_MAGIC, V2_MAGIC, V3_MAGIC = 0xF993FAC8, 0xF993FAC9, 0xF993FACA
DTYPES = {code: name for name, code in MXNET_DTYPE_CODES.items()}  # mshadow's TypeFlag
CODES = {np.dtype(name): code for code, name in DTYPES.items()}
STORAGE_TYPES = {0: "default", 1: "row_sparse", 2: "csr"}
AUX_ARRAYS = {"default": 0, "row_sparse": 1, "csr": 2}
DEVICE_TYPES = {1: "cpu", 2: "gpu", 3: "cpu_pinned", 5: "cpu_shared"}
MAX_NDIM = 32  # MXNet's own limit on dimensions

# storage type -> fn(record) -> array; mixrt's sparse arrays register theirs here
SPARSE_BUILDERS: dict = {}


class FileMissingError(ModelLoadError, FileNotFoundError):
    """``nd.load`` of a path that does not exist; a ``FileNotFoundError`` too."""


# -- reading ---------------------------------------------------------------------------------

class _Reader:
    """Bounds-checked reads from the bytes of one file; every failure names the file,
    the offset and what was expected there."""

    def __init__(self, buffer, source: str):
        self.buffer = memoryview(buffer).cast("B")
        self.offset = 0
        self.source = source

    def error(self, message: str) -> ModelLoadError:
        return ModelLoadError(f"{self.source}: not a valid MXNet NDArray file: {message} "
                              f"(at byte {self.offset} of {len(self.buffer)})")

    def take(self, count: int, what: str) -> memoryview:
        left = len(self.buffer) - self.offset
        if count > left:
            raise self.error(f"truncated: {what} needs {count} bytes, {left} left")
        piece = self.buffer[self.offset:self.offset + count]
        self.offset += count
        return piece

    def number(self, fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def peek_u32(self):
        if len(self.buffer) - self.offset < 4:
            return None
        return struct.unpack_from("<I", self.buffer, self.offset)[0]

    def shape(self, what: str, wide: bool = True, ndim=None) -> tuple:
        if ndim is None:
            ndim = self.number("I", f"{what}'s number of dimensions")
        if ndim > MAX_NDIM:
            raise self.error(f"{what} has {ndim} dimensions (at most {MAX_NDIM})")
        dims = [self.number("q" if wide else "I", f"{what}'s dimension {i}")
                for i in range(ndim)]
        if any(d < 0 for d in dims):
            raise self.error(f"{what} has a negative dimension: {dims}")
        return tuple(dims)

    def values(self, dtype: np.dtype, shape: tuple, what: str) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        raw = self.take(count * dtype.itemsize, f"{what}'s {count} values of {dtype}")
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)

    def dtype(self, what: str) -> np.dtype:
        code = self.number("i", f"{what}'s dtype")
        if code not in DTYPES:
            raise self.error(f"{what} has dtype code {code}, which is none of "
                             f"{sorted(DTYPES)} ({', '.join(DTYPES.values())})")
        return np.dtype(DTYPES[code])

    def device(self, what: str) -> tuple:
        kind = self.number("i", f"{what}'s device type")
        index = self.number("i", f"{what}'s device id")
        if kind not in DEVICE_TYPES:
            raise self.error(f"{what} has device type {kind}, which is none of "
                             f"{sorted(DEVICE_TYPES)}")
        return DEVICE_TYPES[kind], index


def _parse(buffer, source: str):
    reader = _Reader(buffer, source)
    magic = reader.number("Q", "the list magic")
    if magic != LIST_MAGIC:
        raise reader.error(f"the file starts with {magic:#x}, not MXNet's {LIST_MAGIC:#x}")
    reader.number("Q", "the reserved word")
    count = reader.number("Q", "the number of arrays")
    arrays = [_record(reader, f"array {i}") for i in range(_bounded(reader, count, 4))]
    names = [_name(reader, i) for i in range(_bounded(reader, reader.number(
        "Q", "the number of names"), 8))]
    if names and len(names) != len(arrays):
        raise reader.error(f"{len(names)} names for {len(arrays)} arrays")
    if reader.offset != len(reader.buffer):
        raise reader.error(f"{len(reader.buffer) - reader.offset} bytes follow the names")
    return dict(zip(names, arrays)) if names else arrays


def _bounded(reader: _Reader, count: int, least_bytes: int) -> int:
    """``count``, refused where the bytes left cannot hold that many entries."""
    if count * least_bytes > len(reader.buffer) - reader.offset:
        raise reader.error(f"it claims {count} entries, more than the bytes left can hold")
    return count


def _name(reader: _Reader, index: int) -> str:
    length = reader.number("Q", f"the length of name {index}")
    raw = bytes(reader.take(length, f"name {index}"))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise reader.error(f"name {index} is not UTF-8: {exc}") from exc


def _record(reader: _Reader, what: str):
    magic = reader.number("I", f"{what}'s magic")
    if magic in (V2_MAGIC, V3_MAGIC):
        return _versioned(reader, what, magic)
    if magic == V1_MAGIC:
        return _legacy(reader, what, reader.shape(what))
    if magic > MAX_NDIM:
        raise reader.error(f"{what} starts with {magic:#x}, which is no NDArray record "
                           f"magic ({V1_MAGIC:#x}, {V2_MAGIC:#x}, {V3_MAGIC:#x})")
    return _legacy(reader, what, reader.shape(what, wide=False, ndim=magic))


def _legacy(reader: _Reader, what: str, shape: tuple):
    """Versions 0 and 1: shape, device, dtype, values; an ndim of 0 is an empty array."""
    if not shape:
        raise reader.error(f"{what} is MXNet's empty array (no shape), which mixrt does "
                           f"not represent")
    device = reader.device(what)
    dtype = reader.dtype(what)
    return _dense(reader.values(dtype, shape, what), device)


def _versioned(reader: _Reader, what: str, magic: int):
    code = reader.number("i", f"{what}'s storage type")
    if code not in STORAGE_TYPES:
        raise reader.error(f"{what} has storage type {code}, which is none of "
                           f"{STORAGE_TYPES}")
    stype = STORAGE_TYPES[code]
    storage_shape = reader.shape(f"{what}'s storage") if stype != "default" else None
    shape = reader.shape(what)
    if not shape and magic == V2_MAGIC and reader.peek_u32() not in DEVICE_TYPES:
        raise reader.error(f"{what} is MXNet's empty array (no shape), which mixrt does "
                           f"not represent")
    device = reader.device(what)
    dtype = reader.dtype(what)
    if stype == "default":
        return _dense(reader.values(dtype, shape, what), device)
    return _sparse(reader, what, stype, shape, storage_shape, device, dtype)


def _sparse(reader: _Reader, what: str, stype: str, shape, storage_shape, device, dtype):
    aux = [(reader.dtype(f"{what}'s aux {i}"), reader.shape(f"{what}'s aux {i}"))
           for i in range(AUX_ARRAYS[stype])]
    # the stored values' shape follows from the indices (MXNet may save a storage shape of
    # 0 when the array was still being computed): nnz for csr, rows x the rest otherwise
    stored = aux[-1][1][:1] + (shape[1:] if stype == "row_sparse" else ())
    record = {"stype": stype, "shape": shape, "device": device, "storage_shape": storage_shape,
              "data": reader.values(dtype, stored, what),
              "aux": [reader.values(t, s, f"{what}'s aux {i}")
                      for i, (t, s) in enumerate(aux)]}
    builder = SPARSE_BUILDERS.get(stype)
    if builder is None:
        raise ModelLoadError(f"{reader.source}: {what} has {stype} storage, which mixrt "
                             f"cannot load yet (dense arrays only)")
    return builder(record)


def _dense(values: np.ndarray, device: tuple) -> NDArray:
    """An NDArray of ``values`` on the saved GPU when this machine has it, else the CPU
    (MXNet would fail to load a GPU array without that GPU)."""
    kind, index = device
    if kind == "gpu" and index < num_gpus():
        ctx = Context("gpu", index)
        with ctx.device.active():
            return NDArray(ctx.device.put(values), ctx)
    return NDArray(values, Context("cpu", 0))  # values owns its memory (astype copied)


def load(fname):
    """The arrays of an MXNet NDArray file: a list, or a dict where it was saved with
    names (MXNet's ``nd.load``)."""
    path = os.fspath(fname)
    try:
        with open(path, "rb") as handle:
            buffer = handle.read()
    except FileNotFoundError as exc:
        raise FileMissingError(f"nd.load: no file {path!r}") from exc
    return _parse(buffer, path)


def load_frombuffer(buf):
    """``load`` of the bytes of such a file (MXNet's ``nd.load_frombuffer``)."""
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise InputError(f"load_frombuffer: buf must be bytes, got {type(buf).__name__}")
    return _parse(buf, "nd.load_frombuffer's buffer")


# -- writing ---------------------------------------------------------------------------------

def save(fname, data) -> None:
    """Write ``data`` (an NDArray, a list of NDArrays, or a dict of names to NDArrays) to
    ``fname`` in MXNet's NDArray file format (MXNet's ``nd.save``)."""
    payload = to_bytes(data)
    with open(os.fspath(fname), "wb") as handle:
        handle.write(payload)


def to_bytes(data) -> bytes:
    """The bytes ``save`` writes for ``data``."""
    names, arrays = _entries(data)
    parts = [struct.pack("<QQQ", LIST_MAGIC, 0, len(arrays))]
    parts += [array_record(a) for a in arrays]
    parts.append(struct.pack("<Q", len(names)))
    for name in names:
        encoded = name.encode("utf-8")
        parts.append(struct.pack("<Q", len(encoded)) + encoded)
    return b"".join(parts)


def _entries(data) -> tuple[list, list]:
    if isinstance(data, NDArray):
        return [], [data]
    if isinstance(data, dict):
        for key, value in data.items():
            if not isinstance(key, str) or not isinstance(value, NDArray):
                raise InputError(f"save: data must map str names to NDArrays; got "
                                 f"{type(key).__name__} -> {type(value).__name__}")
        return list(data), list(data.values())
    if isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            if not isinstance(value, NDArray):
                raise InputError(f"save: data[{index}] must be an NDArray, got "
                                 f"{type(value).__name__}")
        return [], list(data)
    raise InputError(f"save: data must be an NDArray, a list of NDArrays or a dict of str "
                     f"to NDArray, got {type(data).__name__}")


def array_record(array: NDArray) -> bytes:
    """One dense array as a version-2 record (version 3 where MXNet's legacy shapes cannot
    hold its shape)."""
    host = np.asarray(array.asnumpy(), order="C")  # (ascontiguousarray makes 0-d 1-d)
    if host.dtype not in CODES:
        raise InputError(f"save: MXNet's file format has no {host.dtype} (it has "
                         f"{', '.join(DTYPES.values())})")
    magic = V3_MAGIC if host.ndim == 0 or 0 in host.shape else V2_MAGIC
    device_type = 2 if array.ctx.device.kind == "gpu" else 1
    header = struct.pack(f"<IiI{host.ndim}q", magic, 0, host.ndim, *host.shape)
    header += struct.pack("<iii", device_type, array.ctx.device_id, CODES[host.dtype])
    return header + host.astype(host.dtype.newbyteorder("<"), copy=False).tobytes()


def array_from_record(buf, source: str = "an NDArray record") -> NDArray:
    """The array of one record (``array_record``'s bytes, MXNet's raw-bytes form)."""
    reader = _Reader(buf, source)
    array = _record(reader, "the array")
    if reader.offset != len(reader.buffer):
        raise reader.error(f"{len(reader.buffer) - reader.offset} bytes follow the array")
    return array


# -- pickling: MXNet's state, {"handle": one record} -----------------------------------------

def _getstate(self) -> dict:
    return {"handle": array_record(self)}


def _setstate(self, state: dict) -> None:
    array = array_from_record(state["handle"], "a pickled NDArray")
    NDArray.__init__(self, array._data, array.ctx)


NDArray.__getstate__ = _getstate
NDArray.__setstate__ = _setstate

FUNCTIONS = ["save", "load", "load_frombuffer"]
