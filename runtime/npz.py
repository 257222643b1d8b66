"""Reading and writing .npz and .npy files safely.

Checkpoints, parameter files and CLI inputs are files a user hands us. np.load trusts them
too much: a damaged zip raises BadZipFile, EOFError or struct.error, a member that is not
.npy comes back as raw bytes, and a 100-byte file whose header claims a 400 GiB array makes
it allocate that. These readers check every member's header against the bytes present before
reading, and end every failure in a ModelLoadError naming file and member. ``write_npz``
writes atomically and refuses dtypes an .npy header cannot record.
"""

from __future__ import annotations

import lzma
import math
import os
import stat
import struct
import zipfile
import zlib
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from mixrt.base.errors import InputError, ModelLoadError

_BROKEN_FILE = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error, lzma.LZMAError,
                NotImplementedError, RuntimeError, struct.error, OverflowError, MemoryError)
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}


def read_npz(path, what: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` archive (what ``write_npz``/``numpy.savez`` write), by
    name; ``what`` says what the file is for the error messages ("checkpoint", ...)."""
    where = f"{what} {_file_name(path)!r}"
    try:
        _check_regular(path, where)
        with zipfile.ZipFile(path) as archive:
            return {key: _member(archive, info, f"{where}: array {key!r}")
                    for key, info in _npy_members(archive, where).items()}
    except _BROKEN_FILE as exc:  # the archive itself: missing, a folder, not a zip, cut short
        raise ModelLoadError(f"{where} cannot be read as an .npz archive "
                             f"({type(exc).__name__}: {exc})") from exc


def _npy_members(archive: zipfile.ZipFile, where: str) -> dict:
    members = {}
    for info in archive.infolist():
        key = info.filename[:-len(".npy")]
        if not info.filename.endswith(".npy") or info.is_dir():
            raise ModelLoadError(f"{where}: member {info.filename!r} is not an array; an "
                                 f".npz holds only NAME.npy members")
        if key in members:  # np.load would silently keep the last one
            raise ModelLoadError(f"{where}: array {key!r} is stored twice")
        members[key] = info
    return members


def _member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> np.ndarray:
    try:
        with archive.open(info) as handle:
            return _read_npy(handle, info.file_size, where)
    except _BROKEN_FILE as exc:  # bad CRC, truncated or undecompressable data
        raise ModelLoadError(f"{where} is damaged ({type(exc).__name__}: {exc})") from exc


def read_npy(path, what: str) -> np.ndarray:
    """The array of one ``.npy`` file, checked as ``read_npz`` checks its members."""
    where = f"{what} {_file_name(path)!r}"
    try:
        _check_regular(path, where)
        with open(path, "rb") as handle:
            return _read_npy(handle, os.fstat(handle.fileno()).st_size, where)
    except _BROKEN_FILE as exc:
        raise ModelLoadError(f"{where} cannot be read as an .npy array "
                             f"({type(exc).__name__}: {exc})") from exc


def _read_npy(handle, size: int, where: str) -> np.ndarray:
    """The array in ``handle`` (``size`` bytes in all), its header checked before its data
    is allocated or read."""
    version = np.lib.format.read_magic(handle)
    if version not in _HEADER_READERS:
        raise ModelLoadError(f"{where}: .npy format version {version} is not supported")
    shape, _fortran, dtype = _HEADER_READERS[version](handle)
    if any(d < 0 for d in shape) or (dtype.itemsize == 0 and math.prod(shape)):
        raise ModelLoadError(f"{where}: a {dtype} array of shape {shape} cannot exist")
    if dtype.hasobject:
        raise ModelLoadError(f"{where}: dtype {dtype} holds Python objects, which would need "
                             f"pickle; mixrt reads only plain arrays")
    needed, present = math.prod(shape) * dtype.itemsize, size - handle.tell()
    if needed != present:
        raise ModelLoadError(f"{where}: a {dtype} array of shape {shape} needs {needed} bytes "
                             f"of data, the file holds {present}")
    handle.seek(0)
    return np.lib.format.read_array(handle, allow_pickle=False)


def write_npz(path, arrays: Mapping, what: str) -> None:
    """``arrays`` as an ``.npz`` at exactly ``path`` (numpy.savez appends ".npz" to a name
    without it, which the matching load then misses), written to a temporary file first so
    a crash never leaves half a checkpoint in place. A dtype the .npy header cannot record
    (bfloat16 reads back as raw 2-byte voids) is refused rather than saved unreadable."""
    arrays = {key: np.asarray(value) for key, value in arrays.items()}
    for key, array in arrays.items():
        recorded = np.lib.format.descr_to_dtype(np.lib.format.dtype_to_descr(array.dtype))
        if array.dtype.hasobject or recorded != array.dtype:
            raise InputError(f"{what}: array {key!r} has dtype {array.dtype}, which an .npy "
                             f"file cannot record; cast it (to float32, say) before saving")
    if hasattr(path, "write"):
        _write_members(path, arrays)
        return
    partial = f"{os.fspath(path)}.partial"
    try:
        _write_members(partial, arrays)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _write_members(target, arrays: dict) -> None:
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, array in arrays.items():
            with archive.open(f"{key}.npy", "w", force_zip64=True) as handle:
                np.lib.format.write_array(handle, array, allow_pickle=False)


def _check_regular(path, where: str) -> None:
    """Opening a FIFO blocks and /dev/zero never ends: only regular files are read (a file
    object passed instead of a path is the caller's choice)."""
    if isinstance(path, (str, os.PathLike)) and not stat.S_ISREG(os.stat(path).st_mode):
        raise ModelLoadError(f"{where} is not a regular file")


def _file_name(path) -> str:
    return os.fspath(path) if isinstance(path, (str, os.PathLike)) else repr(path)


# -- arrays NumPy's .npy header cannot name -----------------------------------------------

def storable(array) -> tuple[np.ndarray, str | None]:
    """``array`` in a form an .npy file records without pickle, and the dtype to restore on
    reading (None: stored as it is). Strings held as Python objects become a fixed-width
    unicode array; types NumPy's header cannot name (bfloat16, float8, int4 from
    ml_dtypes) travel as raw bytes of their width."""
    array = np.asarray(array)
    if array.dtype.hasobject:
        return array.astype(np.str_), "object"
    recorded = np.lib.format.descr_to_dtype(np.lib.format.dtype_to_descr(array.dtype))
    if recorded != array.dtype:
        raw = np.dtype(f"V{array.dtype.itemsize}")  # same width, so 0-d arrays view too
        contiguous = array if array.flags.c_contiguous else array.copy()
        return contiguous.view(raw), array.dtype.name
    return array, None


def restored(array: np.ndarray, dtype: str | None) -> np.ndarray:
    """The array ``storable`` stored, as it was."""
    if dtype is None:
        return array
    if dtype == "object":
        return array.astype(object)
    return array.view(np.dtype(getattr(ml_dtypes, dtype)))
