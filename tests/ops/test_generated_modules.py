"""Generated kernel modules (ops/compiled/generated.py): their bytecode is kept beside them
even where the process writes none, and never outlives the source it was compiled from."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import py_compile
import sys

import pytest

from mixrt.ops.compiled import generated

PREFIX = "mixrt_test"


def _source(value: str) -> str:
    """A module without numba: what is tested is how it is imported."""
    return f"VALUE = {value!r}\n\n\ndef run():\n    return VALUE\n"


@pytest.fixture
def no_bytecode_writes(tmp_path, monkeypatch):
    """A cache of its own, and a process that writes no bytecode (PYTHONDONTWRITEBYTECODE)."""
    monkeypatch.setenv("MIXRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    generated.kernel_module.cache_clear()
    yield tmp_path
    generated.kernel_module.cache_clear()


def _imported_again(text: str):
    sys.modules.pop(generated.module_name(text, PREFIX), None)
    generated.kernel_module.cache_clear()
    return generated.kernel_module(text, PREFIX)


def _bytecode_path(cache, text: str) -> str:
    source = cache / "jit" / f"{generated.module_name(text, PREFIX)}.py"
    return importlib.util.cache_from_source(str(source))


def test_the_bytecode_is_kept_and_read_where_the_process_writes_none(no_bytecode_writes,
                                                                       monkeypatch):
    text = _source("kept")
    assert generated.kernel_module(text, PREFIX).run() == "kept"
    assert os.path.exists(_bytecode_path(no_bytecode_writes, text))

    def compiled_again(*args, **kwargs):
        raise AssertionError("the source was compiled again")
    monkeypatch.setattr(importlib.machinery.SourceFileLoader, "source_to_code",
                        compiled_again)
    assert _imported_again(text).run() == "kept"


def test_a_rewritten_source_is_not_run_from_the_bytecode_of_what_it_replaced(
        no_bytecode_writes):
    text = _source("kept")
    generated.kernel_module(text, PREFIX)
    source = no_bytecode_writes / "jit" / f"{generated.module_name(text, PREFIX)}.py"
    # damaged to contents of the same size, and compiled as they were (in the same second
    # and size, a timestamped bytecode cannot tell the two apart)
    stat = source.stat()
    source.write_text(text.replace("kept", "evil"))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    py_compile.compile(str(source), cfile=_bytecode_path(no_bytecode_writes, text),
                       doraise=True)
    assert _imported_again(text).run() == "kept"
    assert source.read_text() == text
