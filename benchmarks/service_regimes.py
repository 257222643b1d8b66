"""Latency as a service meets it: mixrt against onnxruntime, each runtime alone in its own
fresh process, on models drawn at random for every run.

    python benchmarks/service_regimes.py                   # 9 models, 7 regimes and sizes-again: ~20 min
    python benchmarks/service_regimes.py --quick           # 3 small models: ~1.5 min
    python benchmarks/service_regimes.py --seed 1234 --models bert cnn1 --regimes hot new-shape
    python benchmarks/service_regimes.py --write --out /tmp/service.json
    python benchmarks/service_regimes.py --rounds 2       # each model's children twice, in turn: ~40 min

A service does not call its model in a hot loop at one shape: requests come paced, between
other work, next to other processes, and nearly each with a new shape. Regimes (p50 and p99
of the call's time over N requests): ``hot`` (back to back, one shape), ``paced-1ms``,
``paced-10ms``, ``paced-100ms`` (a request every 1, 10, 100 ms), ``interleaved`` (~0.3 ms
of NumPy and Python between calls), ``busy-neighbour`` (every 10 ms, another process
spinning on one core), ``new-shape`` (every 10 ms, a new random shape each). Beside them,
outside the targets, ``sizes-again``: the new-shape regime's shapes, each run twice before
its timed request, which takes the new-shape ratio apart into what a shape's first sight
costs each runtime and the kernels' speed at those shapes.

The models (``_service_models.py``): a BERT encoder, a GPT-2 decoder, DistilBERT or RoBERTa,
two torchvision CNNs, an MLP, a random forest or decision tree, XGBoost or LightGBM, and a
scaled logistic regression, their sizes and shapes drawn from wide ranges under ``--seed``
(printed first; default: from the clock), so that no grid exists to tune to. Per model the
parent runs three children (``_service_children.py``), one after another: onnxruntime alone,
then mixrt alone on empty caches (fresh ``MIXRT_CACHE_DIR`` and ``NUMBA_CACHE_DIR``, the
same N per regime as onnxruntime's), then the agreement check of both outputs at one drawn
shape. With ``--rounds N`` the first two run N times in turn and each regime's requests are
pooled over the rounds, so that a drift of this host between two children (small models'
ratios moved up to 2x between runs of one build) lands on both runtimes, not their ratio.
The parent builds and orchestrates; it never imports mixrt or onnxruntime.

Output: a table per regime, the geometric means and worst model, and the issue's targets
(geomean p50 <= 1.2x, p99 <= 1.5x, no model above 2x) per regime; ``--write`` puts them in
``BENCHMARKS.md`` (section "Service regimes (CPU)"), ``--out`` the raw results as JSON. On
a terminal, one line per (model, runtime, regime) as it ends; otherwise only the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _service_models as models  # noqa: E402
import _service_report as report  # noqa: E402
from _kv_processes import BenchError, Child  # noqa: E402
from _kv_report import machine  # noqa: E402
from cold_start import _commit, _today, write  # noqa: E402

ROOT = HERE.parent
CHILD = HERE / "_service_children.py"
LINE_TIMEOUT_S = 1500.0  # the first line waits for the compiled tier (600 s at most)


def _say(text: str) -> None:
    if sys.stdout.isatty():
        print(text, flush=True)


# -- the children ------------------------------------------------------------------------------

def _child_env(caches: Path | None) -> dict:
    """This environment, with mixrt's and numba's caches in ``caches`` (empty at first).
    Without PYTHONDONTWRITEBYTECODE, which some images set: the children import from
    byte-compiled modules, as an installed package does."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONUNBUFFERED"] = "1"
    if caches is not None:
        env.update(MIXRT_CACHE_DIR=str(caches / "mixrt"), NUMBA_CACHE_DIR=str(caches / "numba"))
    return env


def run_child(name: str, arguments: list[str], env: dict, logs: Path, label: str,
              python: str = sys.executable) -> dict:
    """One child to its end: its regime lines as progress, its last line as the result; a
    crash, a hang or a missing result is a ``failure`` the tables show."""
    child = Child(name, [python, str(CHILD), *arguments], env, logs)
    try:
        while True:
            line = child.readline(time.monotonic() + LINE_TIMEOUT_S)
            record = json.loads(line) if line.startswith("{") else {}
            if "regime" in record:
                _say(f"{label:28s} {name.split(':')[-1]:12s} {record['regime']:15s} "
                     f"N {record['n']:3d}  p50 {record['p50_ms']:8.3f} ms  "
                     f"p99 {record['p99_ms']:8.3f} ms")
            if "result" in record:
                return record["result"]
    except BenchError as error:  # its message names _kv_processes' timeout, not this one
        hung = child.popen.poll() is None
        message = f"no line within {LINE_TIMEOUT_S:.0f} s{child.tail()}" if hung else str(error)
        return {"failure": message.replace("\n", " ")[:600]}
    finally:
        child.stop()


def measure(drawn, spec_path: Path, regimes, quick: bool, logs: Path,
            mixrt_python: str = sys.executable, rounds: int = 1) -> dict:
    """onnxruntime alone, then mixrt alone on empty caches with the same requests per
    regime (``rounds`` times in turn, pooled: ``report.merged_rounds``), then the agreement
    check; each a fresh process (mixrt's under ``mixrt_python``: another build's
    environment, to compare builds on one draw)."""
    common = ["--spec", str(spec_path), "--regimes", *regimes] + (["--quick"] if quick else [])
    found = {"label": drawn.label, "slot": drawn.slot, "kind": drawn.kind,
             "sizes": drawn.sizes(), "config": drawn.config, "hot": drawn.hot}
    timed: dict = {"onnxruntime": [], "mixrt": []}
    for round_ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="service-regimes-caches-") as folder:
            caches = Path(folder)
            timed["onnxruntime"].append(run_child(
                f"{drawn.slot}:onnxruntime", ["time", "--runtime", "onnxruntime", *common],
                _child_env(None), logs, drawn.label))
            counts = timed["onnxruntime"][-1].get("requests")
            same = ["--requests", json.dumps(counts)] if counts else []
            timed["mixrt"].append(run_child(
                f"{drawn.slot}:mixrt", ["time", "--runtime", "mixrt", *common, *same],
                _child_env(caches), logs, drawn.label, mixrt_python))
            if round_ == rounds - 1:  # once, on the last mixrt child's caches
                found["agreement"] = run_child(
                    f"{drawn.slot}:compare", ["compare", "--spec", str(spec_path)],
                    _child_env(caches), logs, drawn.label, mixrt_python)
    found.update((runtime, report.merged_rounds(results)) for runtime, results in timed.items())
    agreement = found["agreement"]
    verdict = {True: "yes", False: "NO"}.get(agreement.get("agrees"), "not checked")
    _say(f"{drawn.label:28s} agrees with onnxruntime: {verdict} "
         f"({agreement.get('detail') or agreement.get('failure')})")
    return found


# -- the run -----------------------------------------------------------------------------------

def prepare(slots, seed: int, quick: bool) -> list[tuple]:
    """Every model drawn, then built (or found in the cache), with its spec file for the
    children: all before any timing, so no export runs beside a timed child."""
    prepared = []
    for slot in slots:
        drawn = models.draw(slot, seed, quick)
        started = time.perf_counter()
        path = models.build(drawn, seed)
        spec_path = path.with_suffix(".spec.json")
        spec_path.write_text(json.dumps(models.spec(drawn, path)))
        _say(f"{drawn.label:28s} built in {time.perf_counter() - started:5.1f} s: "
             f"{drawn.sizes()}")
        prepared.append((drawn, spec_path))
    return prepared


def _versions(rows: list[dict]) -> str:
    found = {}
    for row in rows:
        for part in ("onnxruntime", "mixrt", "agreement"):
            found.update((row.get(part) or {}).get("versions", {}))
    return ", ".join(f"{name} {found[name]}" for name in ("mixrt", "numpy", "onnxruntime")
                     if name in found)


def _environment() -> str:
    settings = {k: v for k, v in os.environ.items()
                if k.startswith(("MIXRT_", "OPENBLAS_", "OMP_")) and not k.endswith("CACHE_DIR")}
    if not settings:
        return "No MIXRT_, OPENBLAS_ or OMP_ variables set."
    return "Set: " + ", ".join(f"`{k}={v}`" for k, v in sorted(settings.items())) + "."


def _revision() -> str:
    """HEAD, and whether the tracked files differ from it (the numbers are the tree's)."""
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                             cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return _commit() + (" + local changes" if changed else "")


def load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def meta(argv: list[str], minutes: float, rows: list[dict], loads: tuple) -> dict:
    return {"date": _today(), "commit": _revision(), "machine": machine(),
            "cores": os.cpu_count(), "versions": _versions(rows), "minutes": minutes,
            "command": " ".join(["python benchmarks/service_regimes.py", *argv]),
            "environment": _environment(), "load_average": loads}


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, help="draws models, shapes and requests "
                                                 "(default: from the clock; printed first)")
    parser.add_argument("--models", nargs="+", choices=models.SLOTS, metavar="MODEL",
                        help=f"a subset of {', '.join(models.SLOTS)}")
    every = report.REGIMES + report.DIAGNOSTIC
    parser.add_argument("--regimes", nargs="+", choices=every, default=every,
                        metavar="REGIME", help=f"a subset of {', '.join(every)}")
    parser.add_argument("--quick", action="store_true",
                        help=f"{', '.join(models.QUICK_SLOTS)} at small sizes, 20 requests a "
                             "regime (10 at 100 ms apart): a smoke run of a minute or two")
    parser.add_argument("--write", action="store_true",
                        help="write the section into BENCHMARKS.md")
    parser.add_argument("--markdown", type=Path, default=ROOT / "BENCHMARKS.md",
                        help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="the raw results (every request's time), JSON")
    parser.add_argument("--rounds", type=int, default=1, metavar="N",
                        help="each model's onnxruntime and mixrt children N times in turn, "
                             "their requests pooled per regime: a drift of the host between "
                             "two children then lands on both runtimes (N times as long)")
    parser.add_argument("--mixrt-python", default=sys.executable, metavar="PYTHON",
                        help="the interpreter mixrt's children run under (another build's "
                             "environment, e.g. a clone of an older commit installed in a "
                             "venv of its own; it needs onnxruntime too)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % 2 ** 31
    print(f"seed {seed} (python benchmarks/service_regimes.py --seed {seed} repeats this "
          "run's models, shapes and requests)", flush=True)
    started, load_before = time.perf_counter(), load_average()
    slots = args.models or (models.QUICK_SLOTS if args.quick else models.SLOTS)
    regimes = [r for r in report.REGIMES + report.DIAGNOSTIC if r in args.regimes]
    prepared = prepare(slots, seed, args.quick)
    logs = models.CACHE / str(seed) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rows = [measure(drawn, spec_path, regimes, args.quick, logs, args.mixrt_python,
                    max(1, args.rounds)) for drawn, spec_path in prepared]
    if "--seed" not in argv:
        argv += ["--seed", str(seed)]
    results = {"seed": seed, "quick": args.quick, "regimes": regimes, "models": rows,
               "rounds": max(1, args.rounds),
               "meta": meta(argv, (time.perf_counter() - started) / 60, rows,
                            (load_before, load_average()))}
    print(report.tables(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    if args.write:
        write(report.section(results), args.markdown, report.BEGIN, report.END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
