"""Where the test suite's time goes: a pytest plugin that records, per test, its wall time,
its process's CPU time, the CPU time of the child processes it waited for, and the time numba
spent compiling under it (outermost compiles, turns waited on another process's compile
included), the same compiles summed by compiled function, and a summary of what it wrote.

    PYTHONPATH=tools SUITE_COSTS=/tmp/costs pytest -n 2 -p suite_costs   # every process writes
    python tools/suite_costs.py /tmp/costs                               # the summary

Each process (xdist's workers and the process that hands out the tests) writes
``<worker>.json`` into ``SUITE_COSTS`` as it ends. docs/conformance.md, "Running the suite",
holds what it found. Measure with empty caches (``MIXRT_CACHE_DIR``, ``NUMBA_CACHE_DIR``), as
CI runs: a warm cache hides the compiles.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

_FIELDS = ("wall", "cpu", "children", "compile")
_tests: dict = defaultdict(lambda: dict.fromkeys(_FIELDS, 0.0))
_compiling = {"depth": 0, "since": 0.0, "test": None, "what": ""}
_functions: dict = defaultdict(lambda: {"compiles": 0, "seconds": 0.0})  # outermost compiles


def _cpu(who) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def pytest_configure(config):
    from numba.core import event  # noqa: PLC0415 (only where the plugin is asked for)

    class Compiles(event.Listener):
        def on_start(self, ev):
            if _compiling["depth"] == 0:
                _compiling["since"] = time.perf_counter()
                _compiling["what"] = _compiled_name(ev.data.get("dispatcher"))
            _compiling["depth"] += 1

        def on_end(self, ev):
            _compiling["depth"] -= 1
            if _compiling["depth"] > 0:
                return
            took = time.perf_counter() - _compiling["since"]
            _functions[_compiling["what"]]["compiles"] += 1
            _functions[_compiling["what"]]["seconds"] += took
            if _compiling["test"]:
                _tests[_compiling["test"]]["compile"] += took

    event.register("numba:compile", Compiles())


def _compiled_name(dispatcher) -> str:
    """A compiled function's module and name; a generated module's name (``mixrt_pool_<its
    source's hash>``) loses the hash, so that the compiles of its kind add up under one."""
    func = getattr(dispatcher, "py_func", None)
    if func is None:
        return "?"
    module = re.sub(r"_[0-9a-f]{6,}.*$", "_*", str(func.__module__))
    return f"{module}.{func.__qualname__}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _compiling["test"] = item.nodeid
    start = time.perf_counter(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    yield
    record = _tests[item.nodeid]
    record["wall"] += time.perf_counter() - start[0]
    record["cpu"] += _cpu(resource.RUSAGE_SELF) - start[1]
    record["children"] += _cpu(resource.RUSAGE_CHILDREN) - start[2]
    _compiling["test"] = None


def pytest_unconfigure(config):
    folder = Path(os.environ.get("SUITE_COSTS", "suite_costs"))
    folder.mkdir(parents=True, exist_ok=True)
    name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    (folder / f"{name}.json").write_text(json.dumps(
        {"process_cpu": _cpu(resource.RUSAGE_SELF), "tests": _tests, "functions": _functions}))


def summary(folder: Path, top: int = 25) -> str:
    """The processes' own CPU, the totals, and the files and tests that cost most."""
    tests, lines = {}, []
    functions = defaultdict(lambda: {"compiles": 0, "seconds": 0.0})
    for path in sorted(folder.glob("*.json")):
        written = json.loads(path.read_text())
        lines.append(f"{path.stem}: {written['process_cpu']:.1f} CPU-s in all")
        tests.update(written["tests"])
        for name, record in written.get("functions", {}).items():
            functions[name]["compiles"] += record["compiles"]
            functions[name]["seconds"] += record["seconds"]
    totals = {field: sum(t[field] for t in tests.values()) for field in _FIELDS}
    lines.append(f"{len(tests)} tests: " + ", ".join(f"{k} {v:.0f} s" for k, v in totals.items()))
    files = defaultdict(lambda: dict.fromkeys(_FIELDS, 0.0))
    for nodeid, record in tests.items():
        for field in _FIELDS:
            files[nodeid.split("::")[0]][field] += record[field]
    lines.append(f"\n{'file':70s} {'wall':>7s} {'cpu':>7s} {'child':>7s} {'compile':>7s}")
    lines += [_row(name, record) for name, record in _costliest(files, top)]
    lines.append(f"\n{'test':70s} {'wall':>7s} {'cpu':>7s} {'child':>7s} {'compile':>7s}")
    lines += [_row(name, record) for name, record in _costliest(tests, top)]
    lines.append(f"\n{'compiled function':70s} {'times':>7s} {'seconds':>7s}")
    lines += [f"{name[-70:]:70s} {r['compiles']:7d} {r['seconds']:7.1f}" for name, r in
              sorted(functions.items(), key=lambda kv: -kv[1]["seconds"])[:top]]
    return "\n".join(lines)


def _costliest(records: dict, top: int) -> list:
    return sorted(records.items(), key=lambda kv: -(kv[1]["cpu"] + kv[1]["children"]))[:top]


def _row(name: str, record: dict) -> str:
    return f"{name[-70:]:70s} " + " ".join(f"{record[f]:7.1f}" for f in _FIELDS)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1] if len(sys.argv) > 1 else "suite_costs")))
