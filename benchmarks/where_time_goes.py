"""Where mixrt's time goes on one case: per-op kernel time from its own profiler.

``Session(..., profile=path)`` records one Chrome-trace event per kernel and one per run
(``runtime/profiler.py``). We run the case a few times, split the kernel events by the run
they fall in, and take per-op medians; run time minus kernel time is what the executor
itself costs (Python dispatch, arena bookkeeping). onnxruntime's own profiler gives its
per-op figures for the same input, for scale. Sessions without a profiler fall back to
timing each kernel from outside (``profile_ops.py``).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import mixrt
from cases import Case
from profile_ops import mixrt_profile, ort_profile

# these timings are of the compiled kernels (warm speed): sessions compile them on their
# first call rather than serving NumPy while a background process builds them
os.environ.setdefault("MIXRT_COMPILE", "foreground")

RUNS = 7


@dataclass
class Profile:
    model: str
    batch: int
    run_ms: float  # median wall time of a profiled run
    kernel_ms: float  # median total kernel time per run
    ops: dict[str, tuple[float, int]]  # op -> (median ms per run, nodes)
    ort_run_ms: float
    ort_ops: dict[str, tuple[float, int]]
    source: str  # "mixrt profiler" or "kernel wrapping"


def profile_case(case: Case, opt_level: int, threads: int, runs: int = RUNS) -> Profile:
    with np.errstate(all="ignore"):
        measured = _with_profiler(case, opt_level, runs)
        source = "mixrt profiler"
        if measured is None:
            per_op, walls = mixrt_profile(case.path, case.feeds, runs, opt_level)
            per_op = {op: (t * 1e3, n) for op, (t, n) in per_op.items()}
            measured = (statistics.median(walls) * 1e3, per_op)
            source = "kernel wrapping"
    run_ms, ops = measured
    ort_ops, ort_walls = ort_profile(case.path, case.feeds, runs, threads)
    return Profile(case.model, case.batch, run_ms, sum(t for t, _ in ops.values()), ops,
                   statistics.median(ort_walls) * 1e3,
                   {op: (t * 1e3, n) for op, (t, n) in ort_ops.items()}, source)


def _with_profiler(case: Case, opt_level: int, runs: int):
    trace = Path(tempfile.mkdtemp()) / "trace.json"
    session = mixrt.Session(str(case.path), opt_level=opt_level, profile=str(trace))
    if getattr(session, "end_profiling", None) is None:
        return None
    for _ in range(runs + 1):  # the first run of a shape plans (and is not profiled)
        session.run(None, case.feeds)
    path = session.end_profiling()
    if not path:
        return None
    events = json.loads(Path(path).read_text())["traceEvents"]
    os.unlink(path)
    return _per_run(events)


def _per_run(events: list[dict]) -> tuple[float, dict] | None:
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "session" and e.get("name") == "run")
    if not spans:
        return None
    per_run = [defaultdict(float) for _ in spans]
    nodes: dict[str, set] = defaultdict(set)
    for event in events:
        if event.get("cat") != "kernel":
            continue
        op = event["args"].get("op", "?")
        nodes[op].add(event["name"])
        for index, (start, end) in enumerate(spans):
            if start <= event["ts"] <= end:
                per_run[index][op] += event["dur"] / 1e3
                break
    ops = {op: (statistics.median(run.get(op, 0.0) for run in per_run), len(names))
           for op, names in nodes.items()}
    return statistics.median((end - start) / 1e3 for start, end in spans), ops
