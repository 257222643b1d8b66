"""mixrt against onnxruntime on the 9 light zoo models, in one process, same inputs.

    python benchmarks/bench_zoo.py [--repeat 7] [--warmup 2] [--out BENCHMARKS.md]

Each model is timed with ``Session.run`` after warm-up runs; we report the median (and the
spread, as min..max) of ``--repeat`` runs. Both runtimes get the same ramp input the onnx
backend test uses, and mixrt's output is checked against onnxruntime's before timing, so a
fast wrong answer cannot look good. Ratios are mixrt / onnxruntime (lower is better for mixrt).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnxruntime as ort

import mixrt
from mixrt.models.zoo import LIGHT_MODELS, light_model

ROOT = Path(__file__).resolve().parent.parent


def time_runs(run, warmup: int, repeat: int) -> list[float]:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


def bench_model(name: str, warmup: int, repeat: int, threads: int) -> dict:
    zoo = light_model(name)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    reference = ort.InferenceSession(str(zoo.path), options, providers=["CPUExecutionProvider"])
    ours = mixrt.Session(str(zoo.path))
    expected = reference.run(None, zoo.inputs)
    got = ours.run(None, zoo.inputs)
    error = max(float(np.max(np.abs(g.astype(np.float64) - e))) for g, e in zip(got, expected))
    ort_times = time_runs(lambda: reference.run(None, zoo.inputs), warmup, repeat)
    mixrt_times = time_runs(lambda: ours.run(None, zoo.inputs), warmup, repeat)
    return {"model": name, "ort": ort_times, "mixrt": mixrt_times, "max_abs_err": error,
            "ratio": statistics.median(mixrt_times) / statistics.median(ort_times)}


def _ms(times) -> str:
    return f"{statistics.median(times) * 1e3:.1f} ({min(times) * 1e3:.0f}..{max(times) * 1e3:.0f})"


def write_markdown(rows, args, path: Path) -> None:
    geomean = math.exp(statistics.mean(math.log(r["ratio"]) for r in rows))
    lines = [
        "## Zoo models: mixrt vs onnxruntime (CPU, batch 1)",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by "
        f"`python benchmarks/bench_zoo.py` in one process: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__}, "
        f"onnxruntime {ort.__version__} ({args.threads} intra-op threads), "
        f"median of {args.repeat} runs after {args.warmup} warm-up runs (min..max in brackets).",
        "",
        "| model | mixrt ms | onnxruntime ms | ratio mixrt/ort | max abs diff |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {_ms(r['mixrt'])} | {_ms(r['ort'])} | "
                     f"{r['ratio']:.2f} | {r['max_abs_err']:.1e} |")
    lines += ["", f"Geometric mean of the ratios: **{geomean:.2f}**.", ""]
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    marker = "## Zoo models: mixrt vs onnxruntime (CPU, batch 1)"
    if marker in text:
        head, _, tail = text.partition(marker)
        rest = tail.split("\n## ", 1)
        text = head + ("\n## " + rest[1] if len(rest) > 1 else "")
    path.write_text(text.rstrip() + "\n\n" + "\n".join(lines))
    print(f"geometric mean ratio {geomean:.2f}; written to {path}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--models", nargs="*", default=list(LIGHT_MODELS))
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    rows = []
    for index, name in enumerate(args.models, 1):
        row = bench_model(name, args.warmup, args.repeat, args.threads)
        rows.append(row)
        print(f"[{index}/{len(args.models)}] {name:14} mixrt {_ms(row['mixrt'])} ms  "
              f"ort {_ms(row['ort'])} ms  ratio {row['ratio']:.2f}", flush=True)
    write_markdown(rows, args, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
