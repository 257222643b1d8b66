"""numba's disk cache shared by processes that compile at the same time (the suite's workers,
a service's workers started together on an empty cache): every entry must hold the code of
the signature its index names (``ops/compiled/jit_cache.py``, "concurrent writers")."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("numba")

WRITERS = 4
ENTRIES_EACH = 40

_SAVER = textwrap.dedent("""
    import os, sys, time
    from mixrt.ops.compiled.jit_cache import guard_damaged_entries
    guard_damaged_entries()
    from numba.core.caching import IndexDataCacheFile
    folder, writer, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    start = float(sys.argv[4])
    entries = IndexDataCacheFile(folder, "kernel", ("stamp", 1))
    while time.time() < start:
        pass
    for entry in range(count):
        key = f"writer {writer} entry {entry}"
        entries.save(key, {"key": key})
""")


def _start_together(script: str, arguments: list[list[str]], env=None) -> None:
    start = time.time() + 2.0  # every child imported and waiting before the first saves
    children = [subprocess.Popen([sys.executable, "-c", script, *args, str(start)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for args in arguments]
    for child in children:
        output = child.communicate(timeout=120)[0]
        assert child.returncode == 0, output


def test_entries_saved_by_processes_at_once_each_hold_their_own_data(tmp_path):
    _start_together(_SAVER, [[str(tmp_path), str(w), str(ENTRIES_EACH)] for w in range(WRITERS)])
    from mixrt.ops.compiled.jit_cache import guard_damaged_entries
    guard_damaged_entries()
    from numba.core.caching import IndexDataCacheFile
    entries = IndexDataCacheFile(str(tmp_path), "kernel", ("stamp", 1))
    wrong = []
    for writer in range(WRITERS):
        for entry in range(ENTRIES_EACH):
            key = f"writer {writer} entry {entry}"
            loaded = entries.load(key)
            if loaded is not None and loaded["key"] != key:
                wrong.append((key, loaded["key"]))
    assert not wrong, f"{len(wrong)} index entries name another key's data, e.g. {wrong[:3]}"


_KERNEL = textwrap.dedent('''
    from numba import njit

    @njit(cache=True)
    def scaled(values, factor):
        return values * factor
''')

_COMPILER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from mixrt.ops.compiled.jit_cache import guard_damaged_entries
    guard_damaged_entries()
    import numpy as np
    import kernel_under_test as k
    dtypes = sys.argv[2].split(",")
    start = float(sys.argv[3])
    while time.time() < start:
        pass
    for name in dtypes:
        values = np.arange(3, dtype=name)
        assert (k.scaled(values, 2) == values * 2).all()
""")

_CHECKER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from mixrt.ops.compiled.jit_cache import guard_damaged_entries
    guard_damaged_entries()
    import numpy as np
    import kernel_under_test as k
    for name in sys.argv[2].split(","):
        values = np.arange(3, dtype=name)
        assert (k.scaled(values, 2) == values * 2).all(), name
    print(len(k.scaled.stats.cache_hits))
""")


def test_signatures_compiled_by_processes_at_once_load_as_themselves(tmp_path):
    (tmp_path / "kernel_under_test.py").write_text(_KERNEL)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    groups = ["float32,int8", "float64,uint8", "int32,int16", "int64,uint16"]
    _start_together(_COMPILER, [[str(tmp_path), group] for group in groups], env=env)
    every = ",".join(groups)
    checked = subprocess.run([sys.executable, "-c", _CHECKER, str(tmp_path), every], env=env,
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    assert int(checked.stdout.split()[-1]) >= 1  # the cache was read, not only rebuilt


# -- one compile of a kernel at a time -------------------------------------------------------------

_SLOW_COMPILER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from mixrt.ops.compiled.jit_cache import guard_damaged_entries
    guard_damaged_entries()
    import numpy as np
    import kernel_under_test as k
    compile_once = k.scaled._compiler.compile

    def slow_compile(*args, **kwargs):  # the turn is held from here until the entry is saved
        Path(sys.argv[2]).write_text("compiling")
        time.sleep(float(sys.argv[3]))
        return compile_once(*args, **kwargs)
    k.scaled._compiler.compile = slow_compile
    values = np.arange(3, dtype=np.float32)
    assert (k.scaled(values, 2) == values * 2).all()
    stats = k.scaled.stats
    print(json.dumps({"misses": sum(stats.cache_misses.values()),
                      "hits": sum(stats.cache_hits.values())}))
""")


def test_a_process_waits_for_anothers_compile_of_a_kernel_and_loads_it(tmp_path):
    """The second process meets the kernel while the first compiles it: it waits for the
    first one's turn, then loads what the first saved, compiling nothing."""
    (tmp_path / "kernel_under_test.py").write_text(_KERNEL)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    signal = tmp_path / "first is compiling"
    first = subprocess.Popen([sys.executable, "-c", _SLOW_COMPILER, str(tmp_path), str(signal),
                              "6"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.monotonic() + 60
    while not signal.exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "-c", _SLOW_COMPILER, str(tmp_path),
                             str(tmp_path / "second is compiling"), "0"], env=env,
                            capture_output=True, text=True, timeout=120)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, (err, second.stderr)
    assert json.loads(out.splitlines()[-1]) == {"misses": 1, "hits": 0}
    assert json.loads(second.stdout.splitlines()[-1]) == {"misses": 0, "hits": 1}
    assert not (tmp_path / "second is compiling").exists()


def test_a_turn_held_past_the_wait_is_not_waited_for(tmp_path, monkeypatch):
    """A process whose compile raised keeps its turn until it ends: another one waits at
    most COMPILE_WAIT seconds and then compiles itself."""
    import fcntl

    from mixrt.ops.compiled import jit_cache
    index = str(tmp_path / "kernel.nbi")
    holder = os.open(index + ".compiling", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another descriptor: flock sees another holder
    monkeypatch.setattr(jit_cache, "COMPILE_WAIT", 0.3)
    turns = jit_cache._CompileTurns()
    started = time.monotonic()
    turns.take(index)
    assert 0.3 <= time.monotonic() - started < 5 and index not in turns._held
    os.close(holder)
    turns.take(index)  # free now: taken at once, and given back
    assert index in turns._held
    turns.give_back(index)
    assert index not in turns._held
