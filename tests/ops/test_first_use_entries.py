"""C entry points compiled on first use (ops/compiled/first_use.py): nothing compiled where one
is declared, compiled once where its address is first read, refused like any kernel where a
run may only load, and compiled by the wheel's prebuild from its record."""

import ctypes
import importlib
import sys
import types as pytypes

import numpy as np
import pytest

from mixrt.ops.compiled import jit_tier
from mixrt.ops.compiled.first_use import FirstUseEntry, first_use_cfunc
from mixrt.ops.compiled.jit_cache import guard_damaged_entries

numba = pytest.importorskip("numba")
SIGNATURE = numba.types.int64(numba.types.int64)


def _declared(offset: int, cache: bool):
    """A fresh entry of SIGNATURE that returns its argument plus ``offset``."""
    namespace: dict = {}
    exec(f"def plus(x):\n    return x + {offset}\n", namespace)  # noqa: S102 (a test's body)
    return first_use_cfunc(SIGNATURE, nopython=True, cache=cache)(namespace["plus"])


def test_an_entry_compiles_where_its_address_is_first_read_and_once():
    entry = _declared(7, cache=False)
    assert isinstance(entry, FirstUseEntry) and "not compiled yet" in repr(entry)
    assert entry._compiled is None
    address = entry.address
    assert address and entry.address == address and "(compiled)" in repr(entry)
    compiled = entry._compiled
    assert entry.compile() is compiled  # not again
    assert ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(address)(5) == 12
    assert entry(5) == 12  # the cfunc's own call, through the entry


def test_where_a_run_may_only_load_a_missing_entry_is_refused_then_compiled_outside():
    guard_damaged_entries()
    entry = _declared(11, cache=False)
    with jit_tier.loading_only() as misses:
        with pytest.raises(jit_tier.CompileForbidden):
            entry.address  # noqa: B018  (the read is what compiles)
    assert len(misses) == 1 and entry._compiled is None
    assert ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(entry.address)(1) == 12


def test_a_kernel_file_declares_its_part_entries_without_compiling_them():
    recurrent = importlib.import_module("mixrt.ops.rnn._jit_recurrent")
    names = [f"{cell}_part_{kind}" for cell in ("lstm", "gru", "rnn") for kind in "fd"]
    assert all(isinstance(getattr(recurrent, name), FirstUseEntry) for name in names)
    # the name a loaded entry is recorded under (its body's) is the attribute that holds it
    assert all(getattr(recurrent, name).__qualname__ == name for name in names)


def test_the_prebuild_compiles_a_recorded_first_use_entry(monkeypatch):
    from mixrt.ops.compiled import _prebuild  # noqa: PLC0415
    module = pytypes.ModuleType("mixrt_test_first_use")
    module.plus = _declared(int(np.random.default_rng().integers(1 << 30)), cache=False)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    _prebuild.compile_entry({"module": module.__name__, "qualname": "plus", "cfunc": True,
                             "args": []})
    assert module.plus._compiled is not None
