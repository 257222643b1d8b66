"""numba's disk cache shared by processes that compile at the same time (the suite's workers,
a service's workers started together on an empty cache): every entry must hold the code of
the signature its index names (``ops/compiled/jit_cache.py``, "concurrent writers")."""

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
