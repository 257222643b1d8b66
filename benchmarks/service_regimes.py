"""Latency as a service meets it: mixrt against onnxruntime, each runtime alone in its own
fresh process, on models drawn at random for every run.

    python benchmarks/service_regimes.py                   # 9 models, 7 regimes and sizes-again: ~20 min
    python benchmarks/service_regimes.py --quick           # 3 small models: ~1.5 min
    python benchmarks/service_regimes.py --seed 1234 --models bert cnn1 --regimes hot new-shape
    python benchmarks/service_regimes.py --write --out /tmp/service.json
    python benchmarks/service_regimes.py --rounds 2       # each model's children twice: ~45 min

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
parent starts two children (``_service_children.py``): onnxruntime's, then mixrt's on empty
caches (fresh ``MIXRT_CACHE_DIR`` and ``NUMBA_CACHE_DIR``, the same N per regime as
onnxruntime's). Once both are ready they take turns: each regime's requests in ``--blocks``
blocks a runtime (default 4), alternating between the two processes, only one working at a
time. This host's speed drifts (a process's Python and NumPy ran up to 2x slower for
stretches of tens of milliseconds and more, whichever runtime ran; small models' ratios
moved up to 4x between runs when each runtime's regime ran whole, one process after the
other), and alternating blocks puts a drift on both runtimes rather than in their ratio.
Then the agreement check of both outputs at one drawn shape. With ``--rounds N`` all this
runs N times with fresh children and each regime's requests are pooled over the rounds.
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
BLOCKS = 4  # each regime's requests, per runtime, in this many blocks alternating between them
PLACEMENT_TRIES, FAR_WAIT_S = 3, 2.0  # a pair of blocks timed on far cores is timed again
ONCE = ("new-shape", "sizes-again")  # what a block of them met stays met: timed once


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


def start_child(name: str, arguments: list[str], env: dict, logs: Path,
                python: str = sys.executable) -> tuple[Child, dict]:
    """A ``serve`` child (``_service_children.py``) once it is ready: loaded, its first run
    and mixrt's compiled tier behind it; its ``ready`` record."""
    child = Child(name, [python, str(CHILD), "serve", *arguments], env, logs)
    try:
        return child, answer(child, "ready")
    except BenchError:
        child.stop()
        raise


def answer(child: Child, word: str) -> dict:
    """The child's next JSON record of kind ``word`` (lines a library printed skipped). A
    child still running without one after LINE_TIMEOUT_S raises a BenchError that says so
    (``Child.readline``'s own names _kv_processes' timeout, not this one)."""
    try:
        while True:
            line = child.readline(time.monotonic() + LINE_TIMEOUT_S)
            record = json.loads(line) if line.startswith("{") else {}
            if word in record:
                return record[word]
    except BenchError:
        if child.popen.poll() is None:
            raise BenchError(f"{child.name}: no line within {LINE_TIMEOUT_S:.0f} s"
                             f"{child.tail()}") from None
        raise


def block(child: Child, regime: str, first: int, count: int) -> dict:
    child.send(json.dumps({"regime": regime, "first": first, "count": count}) + "\n")
    return answer(child, "block")


def blocks_of(count: int, blocks: int) -> list[tuple[int, int]]:
    """``count`` requests as up to ``blocks`` runs of consecutive ones: (first, how many)."""
    sizes = [count // blocks + (index < count % blocks) for index in range(blocks)]
    firsts = [sum(sizes[:index]) for index in range(blocks)]
    return [(first, size) for first, size in zip(firsts, sizes) if size]


def regime_in_blocks(children: dict, regime: str, count: int, blocks: int) -> dict:
    """``count`` requests of ``regime`` per runtime, in blocks alternating between the two
    children, the first runtime of a pair alternating too; a pair timed on far cores is timed
    again (up to PLACEMENT_TRIES times, FAR_WAIT_S apart), except where the requests leave
    state behind (:data:`ONCE`). Each runtime's blocks pooled (``report.pooled``)."""
    kept: dict = {runtime: [] for runtime in children}
    order = list(children)
    for index, (first, size) in enumerate(blocks_of(count, blocks)):
        tries = 1 if regime in ONCE else PLACEMENT_TRIES
        for attempt in range(1, tries + 1):
            pair = {runtime: block(children[runtime], regime, first, size)
                    for runtime in (order if index % 2 == 0 else order[::-1])}
            if attempt == tries or all(found["placement"] == "near" for found in pair.values()):
                break
            time.sleep(FAR_WAIT_S)
        for runtime, found in pair.items():
            kept[runtime].append(dict(found, attempts=attempt))
    return {runtime: report.pooled(parts) for runtime, parts in kept.items()}


def lockstep(drawn, common: list[str], caches: Path, logs: Path, mixrt_python: str,
             regimes, blocks: int) -> dict:
    """onnxruntime's child, then mixrt's on empty caches with the same requests per regime,
    both started and ready, then every regime's blocks alternating between them
    (:func:`regime_in_blocks`): each runtime's result, or its ``failure`` (a crash, a hang)."""
    results: dict = {"onnxruntime": None, "mixrt": None}
    children: dict = {}
    current = "starting"  # what the children were doing, for a failure's message
    try:
        children["onnxruntime"], results["onnxruntime"] = start_child(
            f"{drawn.slot}:onnxruntime", ["--runtime", "onnxruntime", *common],
            _child_env(None), logs)
        counts = results["onnxruntime"]["requests"]
        children["mixrt"], results["mixrt"] = start_child(
            f"{drawn.slot}:mixrt", ["--runtime", "mixrt", *common,
                                    "--requests", json.dumps(counts)],
            _child_env(caches), logs, mixrt_python)
        for found in results.values():
            found["regimes"] = {}
        for regime in regimes:
            current = regime
            timed = regime_in_blocks(children, regime, counts[regime], blocks)
            for runtime, found in timed.items():
                results[runtime]["regimes"][regime] = found
                _say(f"{drawn.label:28s} {runtime:12s} {regime:15s} N {found['n']:3d}  "
                     f"p50 {found['p50_ms']:8.3f} ms  p99 {found['p99_ms']:8.3f} ms")
        for child in children.values():
            child.send(json.dumps({"end": True}) + "\n")
            answer(child, "result")
    except BenchError as error:  # it names the child (answer)
        message = f"{current}: {error}".replace("\n", " ")[:600]
        results = {runtime: {"failure": message} for runtime in results}
    finally:
        for child in children.values():
            child.stop()
    return results


def measure(drawn, spec_path: Path, regimes, quick: bool, logs: Path,
            mixrt_python: str = sys.executable, rounds: int = 1, blocks: int = BLOCKS) -> dict:
    """Both runtimes in lock step (:func:`lockstep`), ``rounds`` times with fresh children
    and caches (pooled: ``report.merged_rounds``), then the agreement check; each a fresh
    process (mixrt's under ``mixrt_python``: another build's environment, to compare builds
    on one draw)."""
    common = ["--spec", str(spec_path), "--regimes", *regimes] + (["--quick"] if quick else [])
    found = {"label": drawn.label, "slot": drawn.slot, "kind": drawn.kind,
             "sizes": drawn.sizes(), "config": drawn.config, "hot": drawn.hot,
             "new_shapes": json.loads(spec_path.read_text())["new_shapes"]}
    timed: dict = {"onnxruntime": [], "mixrt": []}
    for round_ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="service-regimes-caches-") as folder:
            caches = Path(folder)
            for runtime, result in lockstep(drawn, common, caches, logs, mixrt_python,
                                            regimes, blocks).items():
                timed[runtime].append(result)
            if round_ == rounds - 1:  # once, on the last mixrt child's caches
                found["agreement"] = compare(drawn, spec_path, caches, logs, mixrt_python)
    found.update((runtime, report.merged_rounds(results)) for runtime, results in timed.items())
    agreement = found["agreement"]
    verdict = {True: "yes", False: "NO"}.get(agreement.get("agrees"), "not checked")
    _say(f"{drawn.label:28s} agrees with onnxruntime: {verdict} "
         f"({agreement.get('detail') or agreement.get('failure')})")
    return found


def compare(drawn, spec_path: Path, caches: Path, logs: Path, mixrt_python: str) -> dict:
    """The agreement check's child to its end: its result, or its ``failure``."""
    child = Child(f"{drawn.slot}:compare",
                  [mixrt_python, str(CHILD), "compare", "--spec", str(spec_path)],
                  _child_env(caches), logs)
    try:
        return answer(child, "result")
    except BenchError as error:
        return {"failure": str(error).replace("\n", " ")[:600]}
    finally:
        child.stop()


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
    parser.add_argument("--blocks", type=int, default=BLOCKS, metavar="N",
                        help="each regime's requests in N blocks a runtime, alternating "
                             f"between the two runtimes' processes (default {BLOCKS})")
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
                    max(1, args.rounds), max(1, args.blocks)) for drawn, spec_path in prepared]
    if "--seed" not in argv:
        argv += ["--seed", str(seed)]
    results = {"seed": seed, "quick": args.quick, "regimes": regimes, "models": rows,
               "rounds": max(1, args.rounds), "blocks": max(1, args.blocks),
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
