"""Reading tensors stored outside the model file, without trusting the model.

An external-data entry names a file (``location``), an ``offset`` and a ``length``. A hostile
model can point those anywhere, so before reading a byte:

* the model must have come from a file (bytes in memory have no folder to resolve against);
* the location must be a plain relative path: no absolute path, drive, ``..`` part or NUL;
* the resolved path (symlinks followed) must still lie inside the model's folder and be a
  regular file;
* offset and length must be non-negative integers and ``offset + length`` must not pass the
  file's size (Python integers cannot overflow, and we compare before seeking);
* the byte count must equal what the tensor's dtype and shape require.

Any violation is a :class:`ModelLoadError` that names the tensor.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np

from mixrt.base.errors import ModelLoadError
from mixrt.importers.tensors import STRING, to_array
from mixrt.ops.ir.dtypes import to_numpy_dtype

_PACKED_BITS = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2}  # int4/uint4/float4, int2/uint2


def read_external_tensor(tensor, base_dir: Path | None) -> np.ndarray:
    name = tensor.name or "<unnamed>"
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location")
    if not location:
        raise ModelLoadError(f"tensor {name!r} is marked external but has no 'location'")
    if base_dir is None:
        raise ModelLoadError(f"tensor {name!r} stores its data in {location!r}, but the model "
                             f"was not loaded from a file; load it by path so external data "
                             f"can be found beside it")
    path = _safe_path(name, location, base_dir)
    offset = _non_negative_int(name, entries, "offset", default=0)
    size = path.stat().st_size
    length = _non_negative_int(name, entries, "length", default=None)
    if length is None:
        length = size - offset
    if offset > size or length > size - offset:
        raise ModelLoadError(f"tensor {name!r}: offset {offset} + length {length} runs past "
                             f"the end of {location!r} ({size} bytes)")
    expected = _expected_bytes(tensor)
    if expected is not None and length != expected:
        raise ModelLoadError(f"tensor {name!r}: {location!r} holds {length} bytes for it, "
                             f"but its dtype and shape {list(tensor.dims)} need {expected}")
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(length)
    if len(data) != length:
        raise ModelLoadError(f"tensor {name!r}: {location!r} ended early ({len(data)} of "
                             f"{length} bytes)")
    inline = type(tensor)()  # ours or onnx's, as the model's
    inline.CopyFrom(tensor)
    del inline.external_data[:]
    inline.data_location = 0  # TensorProto.DEFAULT
    inline.raw_data = data
    try:
        return to_array(inline)
    except Exception as exc:
        raise ModelLoadError(f"tensor {name!r}: external bytes do not form a tensor of shape "
                             f"{list(tensor.dims)} ({exc})") from exc


def _safe_path(name: str, location: str, base_dir: Path) -> Path:
    if "\x00" in location:
        raise ModelLoadError(f"tensor {name!r}: external location contains a NUL byte")
    posix, windows = PurePosixPath(location), PureWindowsPath(location)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or location.startswith("\\"):
        raise ModelLoadError(f"tensor {name!r}: external location {location!r} is absolute; "
                             f"it must be a path relative to the model's folder")
    if ".." in posix.parts or ".." in windows.parts:
        raise ModelLoadError(f"tensor {name!r}: external location {location!r} climbs out "
                             f"with '..'; it must stay inside the model's folder")
    root = base_dir.resolve()
    try:
        resolved = (root / location).resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise ModelLoadError(f"tensor {name!r}: external data file {location!r} not found "
                             f"beside the model in {root}") from exc
    if resolved != root and root not in resolved.parents:
        raise ModelLoadError(f"tensor {name!r}: external location {location!r} resolves to "
                             f"{resolved}, outside the model's folder {root} (a symlink?)")
    if not resolved.is_file():
        raise ModelLoadError(f"tensor {name!r}: external location {location!r} is not a "
                             f"regular file")
    if not os.access(resolved, os.R_OK):
        raise ModelLoadError(f"tensor {name!r}: external data file {location!r} is not "
                             f"readable")
    return resolved


def _non_negative_int(name: str, entries: dict, key: str, default):
    raw = entries.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ModelLoadError(f"tensor {name!r}: external-data {key} {raw!r} is not an "
                             f"integer") from exc
    if value < 0:
        raise ModelLoadError(f"tensor {name!r}: external-data {key} {value} is negative")
    return value


def _expected_bytes(tensor) -> int | None:
    count = 1
    for dim in tensor.dims:
        count *= int(dim)
    if tensor.data_type == STRING:
        return None  # strings are never stored as raw bytes; to_array will reject them
    bits = _PACKED_BITS.get(tensor.data_type)
    if bits is not None:
        return (count * bits + 7) // 8
    itemsize = to_numpy_dtype(tensor.data_type).itemsize
    return count * itemsize
