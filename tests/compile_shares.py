"""Each xdist worker of a whole-suite run compiles its share of the large compiled drivers
first, from the recorded list the wheel's prebuild reads (``ops/compiled/kernels.json``).

Numba compiles a kernel on its first call, and ``ops/compiled/jit_cache.py`` makes a process
that needs a kernel another process is compiling wait for it and load it. The suite's two
workers both meet the same few large drivers early (the direct convolution's and the panel
products' native drivers, 10-40 s each to compile on a 2-core machine), so one compiled
while the other waited: 145-170 worker-seconds idle in a run (2026-12-04, tools/suite_costs.py,
the zoo's first model waiting 52 s). Dealt out before the first test, each worker compiles
different drivers at the same time and loads the others' from the cache.

Only where it pays: a run of at least :data:`WHOLE_SUITE` tests over two or more workers with
the compiled kernels on. A run of a few files compiles only what its tests call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

WHOLE_SUITE = 5000
# the drivers whose compiles were the longest waits (qualified names in kernels.json)
DRIVERS = (
    "mixrt.ops.panels._jit_dense._worker_product",
    "mixrt.ops.panels._jit_conv_direct._worker_parts",
    "mixrt.ops.panels._jit_dense.native_product",
    "mixrt.ops.panels._jit_conv_direct.native_conv",
    "mixrt.ops.panels._jit_dense.pixel_rows_conv",
    "mixrt.ops.panels._jit_dense.native_packed_product",
    "mixrt.ops.panels._jit_attention._worker_attention",
    "mixrt.ops.panels._jit_dense.panel_product",
    "mixrt.ops.panels._jit_conv_direct.native_conv_images",
    "mixrt.ops.panels._jit_dense.batched_product",
)


def worker_share() -> tuple[int, int] | None:
    """(this worker's index, the number of workers) under xdist, else None."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not name.startswith("gw") or count < 2:
        return None
    return int(name[2:]), count


def compile_share(tests: int) -> list[str]:
    """Compile this worker's share of :data:`DRIVERS`' recorded signatures; the names of
    those compiled (or loaded: a cache that has them makes this cheap)."""
    share = worker_share()
    if share is None or tests < WHOLE_SUITE or os.environ.get("MIXRT_JIT") == "0":
        return []
    index, count = share
    from mixrt.ops.compiled import _prebuild, prebuilt  # noqa: PLC0415
    from mixrt.ops.compiled.jit_cache import guard_damaged_entries  # noqa: PLC0415
    level = prebuilt.host_level()
    if level is None:
        return []
    guard_damaged_entries()
    done = []
    for entry in _entries(level)[index::count]:
        _prebuild.compile_entry(entry)
        done.append(f"{entry['module']}.{entry['qualname']}")
    return done


def _entries(level: str) -> list[dict]:
    """The drivers' entries for this CPU's level, heaviest driver first (each worker's share
    then holds about as many of the long compiles)."""
    recorded = Path(__file__).resolve().parent.parent / "ops" / "compiled" / "kernels.json"
    from mixrt.ops.compiled import prebuilt  # noqa: PLC0415
    rank = {name: i for i, name in enumerate(DRIVERS)}
    entries = [entry for entry in json.loads(recorded.read_text())["kernels"]
               if f"{entry['module']}.{entry['qualname']}" in rank
               and prebuilt.builds_entry(level, entry)]
    return sorted(entries, key=lambda e: rank[f"{e['module']}.{e['qualname']}"])
