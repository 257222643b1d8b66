"""service_regimes.py's child: one runtime in a fresh process, timed as a service meets it
block by block at its parent's word, or (``compare``) both runtimes' outputs side by side
once the timing is over.

    python benchmarks/_service_children.py serve --runtime mixrt --spec SPEC.json
        [--regimes hot new-shape] [--requests '{"hot": 3}'] [--quick]
    python benchmarks/_service_children.py compare --spec SPEC.json

SPEC.json names the model and how to feed it: ``path``; ``inputs``, each a ``name``, a
``dtype``, a ``kind`` (tokens, mask, types, uniform, normal) and its ``axes`` (ints, or the
names of drawn axes: batch, sequence, height, width); ``hot`` and ``compare``, the axes of
the fixed shape and of the agreement check; ``new_shapes``, the axes of each request of the
new-shape regime; ``seed``. ``serve`` answers on stdout as JSON lines: ``{"ready": ...}``
once the runtime is loaded and compiled, then ``{"block": ...}`` for each command line on
stdin (``{"regime": "hot", "first": 0, "count": 50}``: that many requests of the regime, the
new shapes from the ``first``-th on) until ``{"end": true}``, then ``{"result": ...}``.
Nothing crosses the process boundary but JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kv_processes import _die_with_parent  # noqa: E402
from _service_report import DIAGNOSTIC, REGIMES  # noqa: E402

CHEAP_MS = 20.0  # a model slower than this a request gets fewer requests per regime
REQUESTS, FEWEST, PACED_100MS = 200, 60, 40
QUICK_REQUESTS, QUICK_PACED_100MS = 20, 10
WARM_RUNS = 5  # untimed, after the first run (and mixrt's compiled tier): what a probe sees
SETTLE_S = 0.2  # a pause before each regime: onnxruntime's workers spin on after a run
PROBE_SETTLE_S = 0.05  # before the probe after a regime, for the same reason
OTHER_WORK_ROWS = 12_000  # sorted between interleaved calls: ~0.3 ms on the 2-core machine


def _runtime_before_numpy() -> None:
    """mixrt before NumPy, as a service that imports it first: its BLAS policy then sets
    OpenBLAS's environment instead of restarting the loaded library. Only in the process that
    runs mixrt; onnxruntime's process never imports it."""
    if __name__ == "__main__" and ("compare" in sys.argv[1:2] or "mixrt" in sys.argv):
        import mixrt  # noqa: F401,PLC0415


_runtime_before_numpy()
import numpy as np  # noqa: E402
from _placement import hand_off_ns, placement  # noqa: E402  (NumPy)


# -- feeds -------------------------------------------------------------------------------------

def make_feeds(inputs: list[dict], axes: dict, rng: np.random.Generator) -> dict:
    return {spec["name"]: _feed(spec, [axes[a] if isinstance(a, str) else a
                                       for a in spec["axes"]], rng) for spec in inputs}


def _feed(spec: dict, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    kind, dtype = spec["kind"], np.dtype(spec["dtype"])
    if kind == "tokens":
        return rng.integers(3, spec["high"], size=shape).astype(dtype)
    if kind == "mask":  # a padded tail in the last row, so the masks do something
        mask = np.ones(shape, dtype)
        mask[-1, shape[1] - max(1, shape[1] // 8):] = 0
        return mask
    if kind == "types":  # the second half of each row is the second segment
        return np.broadcast_to(np.arange(shape[1]) >= shape[1] // 2, shape).astype(dtype)
    if kind == "uniform":
        return rng.random(shape, dtype=np.float32).astype(dtype)
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


# -- the runtimes ------------------------------------------------------------------------------

def open_session(runtime: str, path: str):
    if runtime == "mixrt":
        import mixrt  # noqa: PLC0415
        return mixrt.Session(path)
    import onnxruntime as ort  # noqa: PLC0415
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def versions(runtime: str) -> dict:
    found = {"numpy": np.__version__}
    if runtime in ("mixrt", "both"):
        import mixrt  # noqa: PLC0415
        found["mixrt"] = mixrt.__version__
    if runtime in ("onnxruntime", "both"):
        import onnxruntime  # noqa: PLC0415
        found["onnxruntime"] = onnxruntime.__version__
    return found


def wait_compiled(session) -> tuple[float, bool]:
    """Seconds until mixrt's compiled kernels are in for every shape run so far (0 and True
    for onnxruntime, which has one tier)."""
    if not hasattr(session, "wait_compiled"):
        return 0.0, True
    started = time.perf_counter()
    done = session.wait_compiled(timeout=600)
    return time.perf_counter() - started, bool(done)


def timer(session):
    """A call that runs ``session`` once and returns the seconds of the call only."""
    def call(feeds: dict) -> float:
        started = time.perf_counter()
        session.run(None, feeds)
        return time.perf_counter() - started
    return call


# -- the regimes -------------------------------------------------------------------------------
# Each takes the timed call, the hot feeds, the new-shape feeds (made on demand, outside the
# timed call) and how many requests, and returns each call's seconds.

def _sleep_until(due: float) -> None:
    left = due - time.perf_counter()
    if left > 0:
        time.sleep(left)


def _at_intervals(call, feeds_of, n: int, interval: float) -> list[float]:
    """A request every ``interval`` seconds, start to start, or right after the last when it
    took longer. A request's feeds are made in the gap before it, as a service's arrive."""
    times, due = [], time.perf_counter()
    for index in range(n):
        feeds = feeds_of(index)
        _sleep_until(due)
        due = time.perf_counter() + interval
        times.append(call(feeds))
    return times


def hot(call, feeds, new_feeds, n):
    return [call(feeds) for _ in range(n)]


def paced(interval: float):
    def regime(call, feeds, new_feeds, n):
        return _at_intervals(call, lambda _: feeds, n, interval)
    return regime


def interleaved(call, feeds, new_feeds, n):
    """The service's own work between calls: it takes the caches and, for a runtime whose
    threads spin after a run, the cores."""
    rng, times = np.random.default_rng(0), []
    for _ in range(n):
        np.sort(rng.random(OTHER_WORK_ROWS))
        sum(i * i for i in range(1000))
        times.append(call(feeds))
    return times


def busy_neighbour(call, feeds, new_feeds, n):
    """Requests every 10 ms while another process spins on one core (it dies with this
    process, should this one be killed first)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                               preexec_fn=_die_with_parent)
    try:
        time.sleep(0.2)  # spinning before the first request
        return _at_intervals(call, lambda _: feeds, n, 0.010)
    finally:
        spinner.kill()
        spinner.wait()


def new_shape(call, feeds, new_feeds, n):
    return _at_intervals(call, new_feeds, n, 0.010)


def sizes_again(call, feeds, new_feeds, n):
    """The new-shape regime's shapes, each run three times (untimed, 10 ms apart) before
    its timed request 10 ms later: the runtime's speed at those shapes once it has met them
    (mixrt binds a shape's calls in its third run, ``runtime/run_loop.BIND_AT_RUN``)."""
    times = []
    for index in range(n):
        shaped = new_feeds(index)
        for _ in range(4):  # the last one timed
            time.sleep(0.010)
            took = call(shaped)
        times.append(took)
    return times


RUN = {"hot": hot, "paced-1ms": paced(0.001), "paced-10ms": paced(0.010),
       "paced-100ms": paced(0.100), "interleaved": interleaved,
       "busy-neighbour": busy_neighbour, "new-shape": new_shape, "sizes-again": sizes_again}
assert set(RUN) == set(REGIMES + DIAGNOSTIC)


def request_counts(probe_ms: float, regimes, quick: bool) -> dict:
    """Requests per regime: 200 for a model at most 20 ms a request, fewer (down to 60) for a
    slower one, so that a regime takes about as long as 200 of 20 ms; 40 at 100 ms apart."""
    if quick:
        return {r: QUICK_PACED_100MS if r == "paced-100ms" else QUICK_REQUESTS for r in regimes}
    many = REQUESTS if probe_ms <= CHEAP_MS else \
        max(FEWEST, int(REQUESTS * CHEAP_MS / probe_ms))
    return {r: PACED_100MS if r == "paced-100ms" else many for r in regimes}


def summary(times: list[float]) -> dict:
    ms = np.asarray(times) * 1e3
    p50, p99 = np.percentile(ms, [50, 99])
    return {"n": len(times), "p50_ms": float(p50), "p99_ms": float(p99),
            "times_ms": [round(float(t), 4) for t in ms]}


# -- one runtime, every regime -----------------------------------------------------------------

def start(runtime: str, spec: dict) -> tuple:
    """Load, the first run, mixrt's compiled tier, then a few untimed runs whose median
    says how slow a request is; returns the session, the timed call, the hot feeds and
    what it found."""
    result = {"runtime": runtime, "versions": versions(runtime)}
    started = time.perf_counter()
    session = open_session(runtime, spec["path"])
    result["load_s"] = time.perf_counter() - started
    feeds = make_feeds(spec["inputs"], spec["hot"], np.random.default_rng(spec["seed"]))
    call = timer(session)
    result["first_run_s"] = call(feeds)
    result["compiled_wait_s"], result["compiled"] = wait_compiled(session)
    result["probe_ms"] = sorted(call(feeds) for _ in range(WARM_RUNS))[WARM_RUNS // 2] * 1e3
    return session, call, feeds, result


def serve_blocks(spec: dict, runtime: str, regimes, counts: dict | None, quick: bool,
                 emit, commands) -> dict:
    """The runtime started (:func:`start`), ``{"ready": ...}`` said, then one block of
    requests per command line from the parent, ``{"regime", "first", "count"}``, each
    answered ``{"block": ...}`` (:func:`timed_block`), until ``{"end": true}``. The parent
    alternates two such children, one per runtime, block by block (``service_regimes.py``):
    each runs alone, and a drift of the host lands on both."""
    session, call, feeds, result = start(runtime, spec)
    result["requests"] = {**request_counts(result["probe_ms"], regimes, quick),
                          **(counts or {})}
    emit({"ready": result})
    shapes, shapes_rng = spec["new_shapes"], np.random.default_rng(spec["seed"] + 1)

    def new_feeds(index: int) -> dict:  # as many shapes as the most requests; more start over
        return make_feeds(spec["inputs"], shapes[index % len(shapes)], shapes_rng)

    for line in commands:
        command = json.loads(line)
        if command.get("end"):
            break
        regime, first, count = command["regime"], command["first"], command["count"]
        emit({"block": timed_block(
            lambda: RUN[regime](call, feeds, lambda index: new_feeds(first + index), count),
            lambda: wait_compiled(session)[0])})
    return result


def timed_block(run, wait) -> dict:
    """One block of a regime's requests between two probes of the cores' placement
    (``_placement.py``), after a compile the last block started has ended and a pause in
    which the other runtime's spinning workers go to sleep; and a compile this block started
    waited for after it (untimed), so that none runs beside the other runtime's next block."""
    waited = wait()
    time.sleep(SETTLE_S)
    before, children = hand_off_ns(), compile_children()
    found = summary(run())
    time.sleep(PROBE_SETTLE_S)
    after = hand_off_ns()
    found.update(compile_wait_before_s=waited, compile_wait_after_s=wait(),
                 compile_children=compile_children() - children,
                 hand_off_ns=[round(before), round(after)],
                 placement=placement(max(before, after)))
    return found


def compile_children() -> int:
    """Compile processes mixrt's background compiler started in this process so far (0
    where mixrt is not loaded): a block's own, beside its requests, show in its results."""
    tiers = sys.modules.get("mixrt.runtime.kernel_tiers")
    if tiers is None or not tiers._compiler:
        return 0
    return tiers._compiler[0][1].children


# -- both runtimes' outputs, after the timing --------------------------------------------------

def compare(spec: dict) -> dict:
    """mixrt's outputs (compiled tier) against onnxruntime's on the same feeds at the
    ``compare`` axes: floats allclose (rtol 1e-3, atol 1e-4), everything else equal."""
    feeds = make_feeds(spec["inputs"], spec["compare"], np.random.default_rng(spec["seed"] + 2))
    ours = open_session("mixrt", spec["path"])
    ours.run(None, feeds)
    wait_compiled(ours)
    got = [np.asarray(value) for value in ours.run(None, feeds)]
    reference = open_session("onnxruntime", spec["path"])
    expected = reference.run(None, feeds)
    names = [output.name for output in reference.get_outputs()]
    return {"axes": spec["compare"], "versions": versions("both"),
            **agreement(got, expected, names)}


def agreement(got, expected, names) -> dict:
    if len(got) != len(expected):
        return {"agrees": False, "detail": f"{len(got)} outputs, onnxruntime {len(expected)}"}
    worst = 0.0
    for mine, theirs, name in zip(got, expected, names):
        if mine.shape != theirs.shape:
            return {"agrees": False, "detail": f"{name}: shape {mine.shape}, "
                                               f"onnxruntime {theirs.shape}"}
        if theirs.dtype.kind in "fc":
            if not np.allclose(mine, theirs, rtol=1e-3, atol=1e-4):
                return {"agrees": False, "detail": f"{name}: max abs diff "
                                                   f"{_max_diff(mine, theirs):.2g}"}
            worst = max(worst, _max_diff(mine, theirs))
        elif not np.array_equal(mine, theirs):
            wrong = int(np.sum(mine != theirs))
            return {"agrees": False, "detail": f"{name}: {wrong} of {theirs.size} differ"}
    return {"agrees": True, "detail": f"max abs diff {worst:.1g}"}


def _max_diff(mine, theirs) -> float:
    if not theirs.size:
        return 0.0
    return float(np.max(np.abs(mine.astype(np.float64) - theirs.astype(np.float64))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("serve", "compare"))
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--runtime", choices=("mixrt", "onnxruntime"))
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES + DIAGNOSTIC),
                        choices=REGIMES + DIAGNOSTIC)
    parser.add_argument("--requests", type=json.loads, help="JSON: requests per regime")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text())

    def emit(record: dict) -> None:
        print(json.dumps(record), flush=True)

    if args.mode == "compare":
        emit({"result": compare(spec)})
    else:
        emit({"result": serve_blocks(spec, args.runtime, args.regimes, args.requests,
                                     args.quick, emit, sys.stdin)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
