"""A generated kernel's native part entries (ops/panels/native_parts.py): each one's module
takes the generated module's own functions, so the ``run`` an entry calls is the overload the
module compiled for Python's calls, not a second copy; the kernel records name that module,
and the wheel's prebuild builds the entry from its record in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from mixrt.ops.compiled import recorded_kernels
from mixrt.ops.conv import jit_depthwise
from mixrt.ops.conv.depthwise_common import activation_constants
from mixrt.ops.panels import native_parts

CHANNELS, SIDE = 8, 12


def _rows_module_called_from_python():
    """A depthwise row form's module, its ``run`` compiled by one call from Python (a 3x2
    kernel, which no other test's module shares: its overloads are this file's alone)."""
    rows = jit_depthwise._compiled((3, 2), (1, 1), (1, 1), "Relu")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((CHANNELS, SIDE, SIDE)).astype(np.float32)
    weights = rng.standard_normal((CHANNELS, 6)).astype(np.float32)
    bias = rng.standard_normal(CHANNELS).astype(np.float32)
    out = np.empty((CHANNELS, SIDE, SIDE), np.float32)
    constants = activation_constants("Relu", [], np.float32)
    rows.run(x, weights, bias, out, constants, 1, CHANNELS, 1, 0, 0, CHANNELS,
             np.empty((SIDE + 2, SIDE + 1), np.float32))
    return rows


def test_a_part_entry_calls_its_modules_own_run_compiled_once():
    rows = _rows_module_called_from_python()
    assert len(rows.run.overloads) == 1
    entry = native_parts.part_entry(rows, "f")
    assert entry.address
    part_module = sys.modules[entry._pyfunc.__module__]
    assert part_module.MAIN_MODULE == rows.__name__
    assert part_module.run is rows.run  # the module's dispatcher, not a copy
    # the carray arguments are typed as the Python call's arrays: no second overload
    assert len(rows.run.overloads) == 1


def test_a_part_entrys_record_names_its_module_and_the_build_makes_it(tmp_path):
    """The record of an entry's module carries the generated module it imports from; a
    fresh process with empty caches builds the entry from that record alone."""
    records = tmp_path / "kernels.jsonl"
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from test_part_entries import _rows_module_called_from_python\n"
        "from mixrt.ops.panels import native_parts\n"
        "native_parts.part_entry(_rows_module_called_from_python(), 'f').address\n")
    here = os.path.dirname(__file__)
    env = dict(os.environ, MIXRT_CACHE_DIR=str(tmp_path / "a" / "mixrt"),
               NUMBA_CACHE_DIR=str(tmp_path / "a" / "numba"),
               **{recorded_kernels.RECORD: str(records)})
    subprocess.run([sys.executable, "-c", script, here], env=env, check=True, timeout=600)
    entries = recorded_kernels.read_lines(records)
    parts = [e for e in entries if e.get("cfunc") and "_part_f_" in e["module"]]
    assert len(parts) == 1, entries
    part = parts[0]
    assert part["main"]["module"].startswith("mixrt_depthwise_")
    assert "from " + part["main"]["module"] + " import *" in part["source"]
    build = ("import json, sys\n"
             "from mixrt.ops.compiled import _prebuild\n"
             "entry = json.loads(sys.argv[1])\n"
             "_prebuild.compile_entry(entry)\n"
             "module = sys.modules[entry['module']]\n"
             "print(module.part_f.address != 0, module.run is sys.modules["
             "entry['main']['module']].run)\n")
    fresh = dict(os.environ, MIXRT_CACHE_DIR=str(tmp_path / "b" / "mixrt"),
                 NUMBA_CACHE_DIR=str(tmp_path / "b" / "numba"))
    fresh.pop(recorded_kernels.RECORD, None)
    done = subprocess.run([sys.executable, "-c", build, json.dumps(part)], env=fresh,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]


def test_the_committed_kernel_list_names_each_generated_module_by_its_source():
    """What the wheel's build compiles (``ops/compiled/kernels.json``): every generated
    module's recorded source hashes to its recorded name, a part entry's module's and the
    module it imports from alike, and a part entry's module imports from that one; so the
    build makes the modules a run asks for, under the names it asks them by."""
    from pathlib import Path  # noqa: PLC0415

    from mixrt.ops.compiled.generated import module_name  # noqa: PLC0415

    listed = Path(recorded_kernels.__file__).with_name("kernels.json")
    entries = json.loads(listed.read_text())["kernels"]
    generated = [e for e in entries if "source" in e]
    assert generated
    for entry in generated:
        for named in (entry, entry.get("main")):
            if named is not None:
                prefix = named["module"].rsplit("_", 1)[0]
                assert module_name(named["source"], prefix) == named["module"]
        if "_part_" in entry["module"]:
            main = entry["main"]["module"]
            assert native_parts.PART_HEAD.format(name=main) in entry["source"]


def test_a_nodes_constant_weight_and_bias_are_the_same_views_at_every_call():
    """A depthwise node's read-only weight and bias come back as the same two views (their
    addresses kept with them); a writeable weight, which may change between calls, or
    one copied to another dtype is made anew, and so is a bias of zeros for a writeable W."""
    from mixrt.ops.conv.depthwise_common import weight_and_bias
    W = np.arange(18, dtype=np.float32).reshape(2, 1, 3, 3)
    B = np.ones(2, np.float32)
    W.flags.writeable = B.flags.writeable = False
    first = weight_and_bias(W, B, W.dtype, 2)
    again = weight_and_bias(W, B, W.dtype, 2)
    assert first[0] is again[0] and first[1] is again[1]
    assert np.shares_memory(first[0], W) and first[0].shape == (2, 9)
    assert weight_and_bias(W, B, np.dtype(np.float64), 2)[0].dtype == np.float64
    assert weight_and_bias(W, B, np.dtype(np.float64), 2)[0] \
        is not weight_and_bias(W, B, np.dtype(np.float64), 2)[0]  # a copy: not kept
    varying = np.array(W)  # writeable: made anew, so a change is read
    assert weight_and_bias(varying, None, W.dtype, 2)[0] \
        is not weight_and_bias(varying, None, W.dtype, 2)[0]
    assert not weight_and_bias(varying, None, W.dtype, 2)[1].any()


def test_a_read_only_arrays_address_is_kept_with_the_array():
    W = np.arange(8, dtype=np.float32)
    W.flags.writeable = False
    out = np.zeros(3, np.uint64)
    native_parts._typed_addresses(out, (np.zeros(1, np.int64), W, W[2:]))
    assert int(out[1]) == W.ctypes.data and int(out[2]) == W[2:].ctypes.data
    assert native_parts._read_only_address(W) == W.ctypes.data
    other = np.arange(8, dtype=np.float32)  # another array, maybe at a dead one's id
    other.flags.writeable = False
    assert native_parts._read_only_address(other) == other.ctypes.data
