"""A block's parameter files: ``save_parameters``/``load_parameters`` and the deprecated
``save_params``/``load_params``, in MXNet 1.x's ``.params`` format (``nd.save``).

MXNet names the values of ``save_parameters`` by their path of attribute names
(``encoder.0.weight``), so any block of the same structure loads them, whatever its name
prefix; files without a dotted name (``save_params``, ``ParameterDict.save``, exports with
``arg:``/``aux:`` keys) are matched by parameter name relative to the block's prefix. mixrt's
earlier ``.npz`` parameter files (a zip archive) are read too. Loading checks the whole file
before it changes anything.
"""

from __future__ import annotations

import os
import stat

import numpy as np

from mixrt.base.errors import InputError, ModelLoadError
from mixrt.nd import serialization
from mixrt.runtime.npz import read_npz

DTYPE_SOURCES = ("current", "saved")
_ZIP_MAGIC = b"PK\x03\x04"


# -- saving ------------------------------------------------------------------------------------

def save(block, filename, deduplicate: bool) -> None:
    params = block._collect_params_with_prefix()
    if deduplicate:  # one name per parameter: the last path reaching it, as MXNet keeps
        by_param = {id(param): (name, param) for name, param in params.items()}
        params = dict(by_param.values())
    _write(filename, params)


def save_prefixed(block, filename) -> None:
    """``save_params``: the parameters by name, less the block's prefix."""
    _write(filename, {block._relative(name): param
                      for name, param in block.collect_params().items()})


def _write(filename, params: dict) -> None:
    for key, param in params.items():
        if np.dtype(param.dtype) not in serialization.CODES:
            raise InputError(f"save_parameters {str(filename)!r}: parameter {key!r} has "
                             f"dtype {param.dtype}, which MXNet's .params format cannot "
                             f"record; cast the block (to float32, say) before saving")
    serialization.save(filename, {key: param.data() for key, param in params.items()})


# -- loading -----------------------------------------------------------------------------------

def load(block, filename, ctx, allow_missing: bool, ignore_extra: bool, cast_dtype: bool,
         dtype_source: str) -> None:
    if dtype_source not in DTYPE_SOURCES:
        raise InputError(f"load_parameters: dtype_source must be one of {DTYPE_SOURCES}, "
                         f"got {dtype_source!r}")
    where = f"parameter file {str(filename)!r}"
    stored = _read(filename, where)
    names = block._collect_params_with_prefix()
    if not any("." in key for key in stored) and not set(stored) <= set(names):
        names = _prefixed_names(block)  # save_params' names, or an MXNet checkpoint's
    _check_names(names, stored, where, allow_missing, ignore_extra)
    loaded = [(names[key], _fitting(names[key], value, f"{where}: parameter {key!r}",
                                    cast_dtype, dtype_source))
              for key, value in stored.items() if key in names]
    for param, value in loaded:
        _assign(param, value, ctx, cast_dtype and dtype_source == "saved")


def _prefixed_names(block) -> dict:
    found = block.collect_params()
    names = {block._relative(name): param for name, param in found.items()}
    if len(names) != len(found):  # "x" and "<prefix>x" would collide in the file
        raise InputError(f"block {block.name!r}: two parameters share a name relative to "
                         f"its prefix {block.prefix!r}: {list(found)}")
    return names


def _read(filename, where: str) -> dict:
    """The file's arrays by name (``arg:``/``aux:`` of MXNet's checkpoints dropped)."""
    path = os.fspath(filename)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read forever
            raise ModelLoadError(f"{where} is not a regular file")
        with open(path, "rb") as handle:
            is_zip = handle.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC
    except OSError as exc:
        raise ModelLoadError(f"{where} cannot be read ({type(exc).__name__}: {exc})") from exc
    if is_zip:
        return read_npz(filename, "parameter file")
    try:
        arrays = serialization.load(path)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{where} cannot be read as an .npz archive or in MXNet's "
                             f".params format ({exc})") from exc
    if not isinstance(arrays, dict):
        raise ModelLoadError(f"{where} holds {len(arrays)} unnamed arrays; a parameter file "
                             f"names each (nd.save of a dict)")
    return {_without_kind(key): value.asnumpy() for key, value in arrays.items()}


def _without_kind(key: str) -> str:
    return key[4:] if key.startswith(("arg:", "aux:")) else key


def _check_names(names: dict, stored: dict, where: str, allow_missing: bool,
                 ignore_extra: bool) -> None:
    if not allow_missing:
        found = {id(names[key]) for key in stored if key in names}
        missing = sorted(key for key, param in names.items() if id(param) not in found)
        if missing:
            raise InputError(f"{where}: no values for parameters {missing} (pass "
                             f"allow_missing=True to keep their current values)")
    extra = sorted(set(stored) - set(names))
    if extra and not ignore_extra:
        raise InputError(f"{where}: values for parameters the block does not have: "
                         f"{extra} (pass ignore_extra=True to skip them)")


def _fitting(param, value: np.ndarray, where: str, cast_dtype: bool,
             dtype_source: str) -> np.ndarray:
    """``value`` when it can become ``param``'s value (a 0 in the parameter's shape is a
    dimension not known yet); an InputError naming it otherwise."""
    shape = param.shape
    if shape is not None and (len(shape) != value.ndim or any(
            known not in (0, None) and known != got for known, got in zip(shape, value.shape))):
        raise InputError(f"{where} has shape {value.shape}; the parameter's is {shape}")
    if value.dtype == param.dtype:
        return value
    if not cast_dtype or value.dtype.kind not in "biuf":
        raise InputError(f"{where} is {value.dtype}; the parameter is {param.dtype} (pass "
                         f"cast_dtype=True to convert numeric values)")
    return value if dtype_source == "saved" else value.astype(param.dtype)


def _assign(param, value: np.ndarray, ctx, take_dtype: bool) -> None:
    if take_dtype and value.dtype != param.dtype:
        param.cast(value.dtype)
    if not param.is_initialized():
        param.initialize(ctx=ctx)
    param.set_data(value)
