"""mixrt against onnxruntime on models as today's exporters write them.

    python benchmarks/real_exports_bench.py [--models NAME ...] [--families hf vision ...]
                                            [--out BENCHMARKS.md] [--budget 1.0]

The set (``benchmarks/real_exports/``, 57 models) is built first from the exporters' own
packages with seeded random weights; builds are cached in ``benchmarks/.cache/real_exports``.
The exporters are benchmark dependencies (``pip install -e ".[bench]"``), never mixrt's.

Each model is then measured in a fresh process, as a service meets it: the time to load
(``Session(...)`` against ``InferenceSession(...)``), the first run, a comparison of every
output with onnxruntime's, and the median latency at batch 1 once mixrt's compiled tier is in
(``Session.wait_compiled``), the two runtimes taking turns (``runners.time_interleaved``). A
child that crashes, hangs past ``--timeout`` or raises is a row that says so, and the next
model goes on. Ratios are mixrt / onnxruntime (lower is better); a model whose outputs
disagree is left out of the geometric mean.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mixrt  # noqa: F401,I001  (before NumPy: mixrt picks NumPy's BLAS kernels)
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from real_exports import classical, hf, quantized, vision  # noqa: E402
from real_exports.common import ensure  # noqa: E402

ROOT = HERE.parent
FAMILIES = {"hf": hf, "vision": vision, "quantized": quantized, "classical": classical}
# how far apart the two runtimes' outputs may be, relative to the largest reference value:
# float32 runtimes summing in different orders differ by ~1e-6; half precision and integer
# rounding (a quantized value one step off) by up to a few 1e-3
TOLERANCE = {"float16": 2e-2, "quantized": 2e-2}
DEFAULT_TOLERANCE = 1e-3


def all_recipes(families) -> dict:
    recipes = {}
    for family in families:
        recipes.update(FAMILIES[family].BUILDERS.items())
    return recipes


# -- one model, in its own process -------------------------------------------------------------

def _outputs(result) -> list[np.ndarray]:
    return [np.asarray(value) for value in result]


def compare(got: list[np.ndarray], expected: list[np.ndarray], rtol: float) -> dict:
    """Worst difference over the outputs, and whether it is within tolerance; integer and
    string outputs must be equal."""
    if len(got) != len(expected):
        return {"match": False, "error": f"{len(got)} outputs, onnxruntime gave {len(expected)}"}
    worst, scale = 0.0, 1.0
    for mine, theirs in zip(got, expected):
        if mine.shape != theirs.shape:
            return {"match": False, "error": f"shape {mine.shape}, onnxruntime {theirs.shape}"}
        if theirs.dtype.kind in "fc":
            if theirs.size:
                diff = np.abs(mine.astype(np.float64) - theirs.astype(np.float64))
                worst = max(worst, float(np.nanmax(diff)))
                scale = max(scale, float(np.nanmax(np.abs(theirs))))
        elif not np.array_equal(mine, theirs):
            return {"match": False, "error": f"{theirs.dtype} output differs"}
    return {"match": worst <= rtol * scale, "error": worst}


def _timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def measure_one(name: str, budget: float) -> dict:
    import onnxruntime as ort  # noqa: PLC0415
    built = ensure(name, all_recipes(FAMILIES)[name])
    feeds = built.load_feeds()
    row = {"name": name, "family": built.family, "exporter": built.exporter}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    reference, row["ort_load_s"] = _timed(lambda: ort.InferenceSession(
        str(built.model), options, providers=["CPUExecutionProvider"]))
    expected, row["ort_first_s"] = _timed(lambda: _outputs(reference.run(None, feeds)))
    try:
        session, row["mixrt_load_s"] = _timed(lambda: mixrt.Session(str(built.model)))
        got, row["mixrt_first_s"] = _timed(lambda: _outputs(session.run(None, feeds)))
    except Exception as error:  # noqa: BLE001  (the row reports it; the set goes on)
        row["failure"] = f"{type(error).__module__}.{type(error).__name__}: {error}"[:400]
        return row
    row.update(compare(got, expected, TOLERANCE.get(built.family, DEFAULT_TOLERANCE)))
    session.wait_compiled(timeout=600)
    # imported only now: ``runners`` sets MIXRT_COMPILE=foreground for the sessions made
    # after it (its timings are of compiled kernels), which would have made the load and the
    # first run above compile in the foreground instead of serving as a service's do
    from runners import Runner, median_ms, time_interleaved  # noqa: PLC0415
    runners = [Runner("mixrt", "cpu", lambda f: session.run(None, f), session),
               Runner("onnxruntime", "cpu", lambda f: reference.run(None, f), reference)]
    _, once = _timed(lambda: session.run(None, feeds))
    repeat = int(min(200, max(5, budget / max(once, 1e-5))))
    times = time_interleaved(runners, feeds, repeat, rounds=3)
    row["mixrt_ms"] = median_ms(times["mixrt/cpu"])
    row["ort_ms"] = median_ms(times["onnxruntime/cpu"])
    return row


# -- the whole set -----------------------------------------------------------------------------

def _child_environment() -> dict:
    """The children import as an installed package does: from byte-compiled modules. With
    PYTHONDONTWRITEBYTECODE set (some container images set it), every lazily imported module would
    be compiled from source inside the timed load, ~20 ms no installed copy pays."""
    environment = dict(os.environ)
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    return environment


def run_child(name: str, budget: float, timeout: float) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--one", name,
               "--budget", str(budget)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=_child_environment())
    except subprocess.TimeoutExpired:
        return {"name": name, "failure": f"no answer within {timeout:.0f} s (hang)"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {"name": name, "failure": f"exit {done.returncode}: " + " | ".join(tail)[:400]}


def _progress(names):
    if sys.stderr.isatty():
        from tqdm import tqdm  # noqa: PLC0415
        return tqdm(names, desc="real exports", unit="model")
    return names


def measure_all(names, budget: float, timeout: float) -> list[dict]:
    rows = []
    for name in _progress(names):
        row = run_child(name, budget, timeout)
        rows.append(row)
        if not sys.stderr.isatty():
            print(f"{name}: {summary(row)}", file=sys.stderr, flush=True)
    return rows


def summary(row: dict) -> str:
    if "failure" in row:
        return f"FAILED {row['failure']}"
    ratio = row["mixrt_ms"] / row["ort_ms"]
    return (f"{'match' if row['match'] else 'MISMATCH'}, {row['mixrt_ms']:.3g} ms against "
            f"{row['ort_ms']:.3g} ({ratio:.2f}x), load {row['mixrt_load_s']:.2f} s against "
            f"{row['ort_load_s']:.2f}")


def build_all(names, recipes) -> None:
    for name in _progress(names):
        ensure(name, recipes[name])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*")
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--budget", type=float, default=1.0,
                        help="seconds of timed runs per runtime and model (5 to 200 runs)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, help="write the table into this Markdown file")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one, args.budget)), flush=True)
        return 0
    recipes = all_recipes(args.families)
    names = args.models or list(recipes)
    started = time.time()
    build_all(names, recipes)
    rows = measure_all(names, args.budget, args.timeout)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    import real_exports_report  # noqa: PLC0415
    text = real_exports_report.render(rows, argv if argv is not None else sys.argv[1:],
                                      time.time() - started)
    if args.out:
        real_exports_report.write(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    sys.exit(main())
