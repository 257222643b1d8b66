"""Where mixrt's time goes, per op type, next to onnxruntime's own per-op profile.

    python benchmarks/profile_ops.py [MODEL ...] [--batch 1] [--runs 5] [--opt-level N]

MODEL is a light zoo name, ``mlp`` or ``bert_encoder``. Every kernel of one Session is
wrapped in a timer (the wrapper replaces ``BoundNode.fn``; nothing else changes), the model
runs ``--runs`` times after one warm-up, and the table sums time per op type. onnxruntime's
figures come from its built-in profiler (``enable_profiling``), so both columns are kernel
time as each runtime itself sees it. This is a diagnosis tool, not the benchmark: the
wrapping adds about a microsecond per node.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import mixrt  # noqa: I001  (before NumPy: it picks NumPy's BLAS kernels and thread spin)
import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import TORCH_MODELS  # noqa: E402

# these timings are of the compiled kernels (warm speed): sessions compile them on their
# first call rather than serving NumPy while a background process builds them
os.environ.setdefault("MIXRT_COMPILE", "foreground")


def model_and_feeds(name: str, batch: int) -> tuple[Path, dict]:
    if name in TORCH_MODELS:
        model = TORCH_MODELS[name]()
        return model.path, model.feeds(batch)
    from cases import make_case  # noqa: PLC0415  (the zoo models with random weights)
    case = make_case(name, batch)
    return case.path, case.feeds


def _timed(fn, op_type: str, current: dict):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        result = fn(*args, **kwargs)
        current[op_type] = current.get(op_type, 0.0) + time.perf_counter() - started
        return result
    return wrapper


def _median_per_op(per_run: list[dict], counts: dict) -> dict:
    """op -> (median seconds per run, nodes per run); medians because the machine is shared
    and one descheduled run would otherwise dominate a mean."""
    ops = set().union(*per_run) if per_run else set()
    return {op: (statistics.median(run.get(op, 0.0) for run in per_run), counts.get(op, 0))
            for op in ops}


def mixrt_profile(path: Path, feeds: dict, runs: int, opt_level) -> tuple[dict, list[float]]:
    """Per-op-type seconds per run, and the wall time of each run."""
    options = {} if opt_level is None else {"opt_level": opt_level}
    session = mixrt.Session(str(path), **options)
    session.run(None, feeds)  # warm-up, untimed
    current: dict[str, float] = {}
    counts: dict[str, int] = defaultdict(int)
    for step in session._bound.nodes:  # private on purpose: a throwaway diagnosis hook
        step.fn = _timed(step.fn, step.node.op_type, current)
        counts[step.node.op_type] += 1
    walls, per_run = [], []
    for _ in range(runs):
        current.clear()
        started = time.perf_counter()
        session.run(None, feeds)
        walls.append(time.perf_counter() - started)
        per_run.append(dict(current))
    return _median_per_op(per_run, counts), walls


def ort_profile(path: Path, feeds: dict, runs: int, threads: int) -> tuple[dict, list[float]]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(None, feeds)
        walls.append(time.perf_counter() - started)
    events = json.loads(Path(session.end_profiling()).read_text())
    return _ort_per_op(events, runs), walls


def _ort_per_op(events: list[dict], runs: int) -> dict:
    """Split onnxruntime's kernel events by the ``model_run`` they fall in (skipping the
    warm-up run) and take per-op medians, as for mixrt."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    spans = spans[-runs:]
    per_run = [defaultdict(float) for _ in spans]
    nodes: dict[str, set] = defaultdict(set)
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        op = event["args"].get("op_name", "?")
        nodes[op].add(event["name"])
        for index, (start, end) in enumerate(spans):
            if start <= event["ts"] <= end:
                per_run[index][op] += event["dur"] * 1e-6
                break
    return _median_per_op(per_run, {op: len(names) for op, names in nodes.items()})


def report(name: str, batch: int, ours: tuple, theirs: tuple) -> str:
    (mix_ops, mix_walls), (ort_ops, ort_walls) = ours, theirs
    mix_wall, ort_wall = statistics.median(mix_walls), statistics.median(ort_walls)
    in_kernels = sum(t for t, _ in mix_ops.values())
    lines = [f"### {name}, batch {batch}",
             "",
             f"mixrt run {mix_wall * 1e3:.1f} ms (in kernels {in_kernels * 1e3:.1f} ms, "
             f"{in_kernels / mix_wall:.0%}); onnxruntime run {ort_wall * 1e3:.1f} ms; "
             f"ratio {mix_wall / ort_wall:.2f}",
             "",
             "| op | mixrt ms | nodes | share | ort ms | ort nodes |",
             "|---|---|---|---|---|---|"]
    ops = sorted(set(mix_ops) | set(ort_ops), key=lambda o: -mix_ops.get(o, (0, 0))[0])
    for op in ops:
        t, n = mix_ops.get(op, (0.0, 0))
        ot, on = ort_ops.get(op, (0.0, 0))
        lines.append(f"| {op} | {t * 1e3:.2f} | {n} | {t / mix_wall:.0%} | {ot * 1e3:.2f} | {on} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["bert_encoder"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--opt-level", type=int, default=None,
                        help="passed to Session when given (default: Session's own default)")
    args = parser.parse_args(argv)
    for name in args.models:
        path, feeds = model_and_feeds(name, args.batch)
        with np.errstate(all="ignore"):
            ours = mixrt_profile(path, feeds, args.runs, args.opt_level)
        theirs = ort_profile(path, feeds, args.runs, args.threads)
        print(report(name, args.batch, ours, theirs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
