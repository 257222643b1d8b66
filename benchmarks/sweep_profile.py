"""Where a run's time goes at one point of the shape sweep, on the path a service's runs take.

    python benchmarks/sweep_profile.py MODEL POINT [--top 25] [--runs 200]

MODEL and POINT are a sweep model and one of its points (``benchmarks/real_exports/sweeps.py``:
``sweep_tv_shufflenet_v2_x1_0 b1_96``, ``q_bert_dynamic b1_s16``). mixrt runs the model until
its compiled tier is in and its calls are bound, then times every step of the planned run as
the run loop makes it (bound call or kernel: ``runtime/run_loop._run_host_calls`` is wrapped
for the timed runs only, ~0.1 us a step), beside runs nobody times; onnxruntime's own
profiler gives its per-node times (2 intra-op threads). The printout: each runtime's run,
mixrt's time in its steps against the run (the rest is the run's floor and the gaps between
steps), per op type (time, steps, of which bound), and the slowest steps with their output
shapes. ``profile_ops.py`` wraps every kernel instead, which takes steps off their bound
calls: this one shows what a run costs as a service meets it.

onnxruntime's profiler slows its runs (its per-node events): its per-node figures are for
scale; its run time is taken without the profiler.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
CACHES = HERE / ".cache" / "real_exports_sweep" / "caches"  # the sweep's, so nothing compiles again
os.environ.setdefault("MIXRT_CACHE_DIR", str(CACHES / "mixrt"))
os.environ.setdefault("NUMBA_CACHE_DIR", str(CACHES / "numba"))

import mixrt  # noqa: E402  (before NumPy, as an application imports it)
from mixrt.runtime import run_loop  # noqa: E402

WARM_RUNS = 30  # after the compiled tier is in: the bound lists are made by then


def _mixrt(path: str, feeds: dict, runs: int) -> tuple[float, dict]:
    """(median run, {(label, op, bound): median us}) of mixrt's planned runs."""
    session = mixrt.Session(path)
    session.run(None, feeds)
    session.wait_compiled()
    for _ in range(WARM_RUNS):
        session.run(None, feeds)
    plain = _median_run(lambda: session.run(None, feeds), runs)
    steps: dict = defaultdict(list)
    shapes: dict = {}
    original = run_loop._run_host_calls

    def timed(calls, env, buffer):
        clock = time.perf_counter_ns
        for call in run_loop.each_call(calls):  # a segment's steps one by one
            started = clock()
            original((call,), env, buffer)
            elapsed = clock() - started
            step, form = call[0], call[4]
            key = (step.label, step.node.op_type, form is not None and form[6] is not None)
            steps[key].append(elapsed)
            shapes[key] = getattr(env.get(step.node.outputs[0]) if step.node.outputs else None,
                                  "shape", None)

    run_loop._run_host_calls = timed
    try:
        for _ in range(runs):
            session.run(None, feeds)
    finally:
        run_loop._run_host_calls = original
    return plain, {key: (statistics.median(times) / 1e3, shapes[key])
                   for key, times in steps.items()}


def _median_run(run, count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _onnxruntime(path: str, feeds: dict, runs: int) -> tuple[float, dict, dict]:
    """(median run without the profiler, {node: median us} and {op: us a run} with it)."""
    import onnxruntime as ort  # noqa: PLC0415
    ort.set_default_logger_severity(3)
    plain_options = ort.SessionOptions()
    plain_options.intra_op_num_threads = 2
    plain = ort.InferenceSession(path, plain_options, providers=["CPUExecutionProvider"])
    for _ in range(WARM_RUNS):
        plain.run(None, feeds)
    run = _median_run(lambda: plain.run(None, feeds), runs)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    profiled = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        profiled.run(None, feeds)
    events = json.loads(Path(profiled.end_profiling()).read_text())
    nodes, ops = defaultdict(list), {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            name = event["name"][:-len("_kernel_time")]
            nodes[name].append(event["dur"])
            ops[name] = event["args"].get("op_name", "?")
    medians = {name: statistics.median(times) for name, times in nodes.items()}
    by_op: dict = defaultdict(float)
    for name, us in medians.items():
        by_op[ops[name]] += us
    return run, medians, dict(by_op)


def report(name: str, label: str, ours: tuple, theirs: tuple, top: int) -> str:
    (run, steps), (ort_run, ort_nodes, ort_ops) = ours, theirs
    in_steps = sum(us for us, _ in steps.values())
    lines = [f"{name} {label}: mixrt {run * 1e3:.3f} ms a run, {in_steps / 1e3:.3f} in its "
             f"{len(steps)} steps ({in_steps / (run * 1e6):.0%}); onnxruntime "
             f"{ort_run * 1e3:.3f} ms; ratio {run / ort_run:.2f}", "",
             "| op | mixrt us | steps | bound | onnxruntime us (profiled) |",
             "|---|---|---|---|---|"]
    per_op: dict = defaultdict(lambda: [0.0, 0, 0])
    for (_, op, bound), (us, _) in steps.items():
        per_op[op][0] += us
        per_op[op][1] += 1
        per_op[op][2] += bound
    for op, (us, count, bound) in sorted(per_op.items(), key=lambda item: -item[1][0]):
        theirs_us = ort_ops.get(op)
        lines.append(f"| {op} | {us:.1f} | {count} | {bound} | "
                     f"{'' if theirs_us is None else f'{theirs_us:.1f}'} |")
    lines += ["", f"The {top} slowest steps:", "",
              "| us | bound | op | node | output | onnxruntime us |", "|---|---|---|---|---|---|"]
    slowest = sorted(steps.items(), key=lambda item: -item[1][0])[:top]
    for (label_, op, bound), (us, shape) in slowest:
        theirs_us = ort_nodes.get(label_)
        lines.append(f"| {us:.1f} | {'yes' if bound else 'no'} | {op} | {label_} | {shape} | "
                     f"{'' if theirs_us is None else f'{theirs_us:.1f}'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a sweep model (benchmarks/real_exports/sweeps.py)")
    parser.add_argument("point", help="one of its points, e.g. b1_96, b2_s16, past128, b64")
    parser.add_argument("--top", type=int, default=25, help="slowest steps listed")
    parser.add_argument("--runs", type=int, default=200, help="timed runs per runtime")
    args = parser.parse_args(argv)
    from real_exports import sweeps  # noqa: PLC0415
    from real_exports.common import ensure  # noqa: PLC0415
    model = sweeps.MODELS[args.model]
    feeds = model.feeds(model.point(args.point))
    path = str(ensure(model.name, model.recipe).model)
    ours = _mixrt(path, feeds, args.runs)
    theirs = _onnxruntime(path, feeds, args.runs)
    print(report(args.model, args.point, ours, theirs, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
