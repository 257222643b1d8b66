"""Where mixrt's GPU time goes, per op type: inference runs and training steps.

    python benchmarks/profile_gpu.py [--infer bert_encoder:1 densenet121:8 ...]
                                     [--train resnet18 mlp] [--runs 5] [--kernels]

A GPU kernel returns before the device has done its work, so wall time around a kernel call
measures only its launch. Here every kernel call (``runtime.run_loop._call``, through which
sessions and training steps run each node) is followed by a device synchronize, and the time
from the call to the end of the synchronize is charged to the node's op type: the sum is the
device time of the nodes plus one launch and one synchronize each. The plain, unsynchronized
wall time of the same run is printed beside it; what the per-op sum does not cover (the
optimizer's updates, copies in and out, Python between nodes) shows as "outside the nodes".
With ``--kernels`` each case is instead traced by PyTorch's profiler (CUPTI sees every kernel
in the process, CuPy's, cuBLAS's and cuDNN's alike), training steps replayed as CUDA graphs:
the GPU time per kernel name against the run's wall time says whether the device or the
host is the bottleneck, and which kernels to take down first.
A diagnosis tool for a GPU machine, not the benchmark (run_all.py and train_bench.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import mixrt  # noqa: I001  (before NumPy, as every benchmark)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class SyncedTimer:
    """While entered, charges each kernel call plus a device synchronize to its op type."""

    def __init__(self):
        from mixrt.runtime import run_loop  # noqa: PLC0415
        self._run_loop = run_loop
        self._plain = run_loop._call
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def __enter__(self):
        import cupy  # noqa: PLC0415

        def timed_call(step, xp, args, attributes):
            started = time.perf_counter()
            result = self._plain(step, xp, args, attributes)
            if xp is cupy:
                cupy.cuda.get_current_stream().synchronize()
            self.seconds[step.node.op_type] += time.perf_counter() - started
            self.calls[step.node.op_type] += 1
            return result

        self._run_loop._call = timed_call
        return self

    def __exit__(self, *exc):
        self._run_loop._call = self._plain
        return False

    def reset(self):
        self.seconds.clear()
        self.calls.clear()


def wall_and_ops(run, runs: int) -> tuple[float, float, dict, dict]:
    """Median plain wall time of ``run()``, median synced wall time, and per op type the
    median synced seconds and calls per run."""
    import cupy  # noqa: PLC0415

    def synced():
        run()
        cupy.cuda.get_current_stream().synchronize()

    for _ in range(2):  # warm-up: plans, kernel compiles
        synced()
    plain = []
    for _ in range(runs):
        started = time.perf_counter()
        synced()
        plain.append(time.perf_counter() - started)
    per_run, timed_walls = [], []
    with SyncedTimer() as timer:
        for _ in range(runs):
            timer.reset()
            started = time.perf_counter()
            synced()
            timed_walls.append(time.perf_counter() - started)
            per_run.append((dict(timer.seconds), dict(timer.calls)))
    ops = {op for seconds, _ in per_run for op in seconds}
    seconds = {op: statistics.median(s.get(op, 0.0) for s, _ in per_run) for op in ops}
    calls = per_run[-1][1]
    return statistics.median(plain), statistics.median(timed_walls), seconds, calls


def report(title: str, plain: float, timed: float, seconds: dict, calls: dict,
           top: int = 12) -> str:
    in_nodes = sum(seconds.values())
    lines = [f"### {title}", "",
             f"plain run {plain * 1e3:.2f} ms; synchronized after every node "
             f"{timed * 1e3:.2f} ms, of which the nodes {in_nodes * 1e3:.2f} ms "
             f"({sum(calls.values())} calls) and outside the nodes "
             f"{(timed - in_nodes) * 1e3:.2f} ms", "",
             "| op | ms | calls | us per call | share of the synchronized run |",
             "|---|---|---|---|---|"]
    for op in sorted(seconds, key=lambda o: -seconds[o])[:top]:
        n = calls.get(op, 0)
        lines.append(f"| {op} | {seconds[op] * 1e3:.2f} | {n} | "
                     f"{seconds[op] / max(n, 1) * 1e6:.0f} | {seconds[op] / timed:.0%} |")
    return "\n".join(lines) + "\n"


def infer_case(spec: str, runs: int) -> str:
    from profile_ops import model_and_feeds  # noqa: PLC0415
    name, _, batch = spec.partition(":")
    path, feeds = model_and_feeds(name, int(batch or 1))
    session = mixrt.Session(str(path), device="gpu")
    return report(f"{name}, batch {batch or 1}, inference",
                  *wall_and_ops(lambda: session.run(None, feeds), runs))


def train_case(name: str, runs: int, precision: str) -> str:
    from train_bench import mixrt_stepper, training_case  # noqa: PLC0415
    _, path, x, y = training_case(name)
    step, _ = mixrt_stepper(path, x, y, "gpu", precision)
    return report(f"{name}, batch {len(x)}, training step ({precision})",
                  *wall_and_ops(step, runs))


def kernel_table(title: str, run, runs: int, top: int = 20) -> str:
    """GPU time per kernel name over ``runs`` runs of ``run``, traced through CUPTI."""
    import cupy  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415
    for _ in range(3):  # warm-up: plans, kernel compiles, graph capture
        run()
    cupy.cuda.get_current_stream().synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        started = time.perf_counter()
        for _ in range(runs):
            run()
        cupy.cuda.get_current_stream().synchronize()
        wall = (time.perf_counter() - started) / runs
    gpu, calls = defaultdict(float), defaultdict(int)
    for event in trace.events():
        if event.device_type.name == "CUDA":
            gpu[event.name] += event.device_time / runs  # microseconds
            calls[event.name] += 1
    busy = sum(gpu.values())
    lines = [f"### {title}: kernels", "",
             f"wall {wall * 1e3:.2f} ms a run; GPU kernels {busy / 1e3:.2f} ms "
             f"({sum(calls.values()) // runs} a run)", "",
             "| kernel | ms a run | calls a run | share of kernel time |", "|---|---|---|---|"]
    for name in sorted(gpu, key=lambda n: -gpu[n])[:top]:
        lines.append(f"| {name[:90]} | {gpu[name] / 1e3:.3f} | {calls[name] // runs} | "
                     f"{gpu[name] / max(busy, 1e-9):.0%} |")
    return "\n".join(lines) + "\n"


def host_table(title: str, run, runs: int, top: int = 25) -> str:
    """Where the host's time goes over ``runs`` runs of ``run`` (cProfile, by own time): what
    a replayed step spends outside the device."""
    import cProfile  # noqa: PLC0415
    import io  # noqa: PLC0415
    import pstats  # noqa: PLC0415
    for _ in range(3):
        run()
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for _ in range(runs):
        run()
    profiler.disable()
    wall = (time.perf_counter() - started) / runs
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return f"### {title}: host, {wall * 1e3:.2f} ms a run under cProfile\n\n{text.getvalue()}"


def kernel_cases(args) -> None:
    from profile_ops import model_and_feeds  # noqa: PLC0415
    from train_bench import mixrt_stepper, torch_stepper, training_case  # noqa: PLC0415
    for spec in args.infer:
        name, _, batch = spec.partition(":")
        path, feeds = model_and_feeds(name, int(batch or 1))
        session = mixrt.Session(str(path), device="gpu")
        print(kernel_table(f"{name}, batch {batch or 1}, inference",
                           lambda: session.run(None, feeds), args.runs), flush=True)
    for name in args.train:
        module, path, x, y = training_case(name)
        step, _ = mixrt_stepper(path, x, y, "gpu", args.precision, cuda_graph=True)
        title = f"{name}, batch {len(x)}, training step ({args.precision})"
        print(kernel_table(f"mixrt {title}", step, args.runs), flush=True)
        if args.host:
            print(host_table(f"mixrt {title}", step, args.runs), flush=True)
        theirs = torch_stepper(module, x, y, "gpu", args.precision)
        print(kernel_table(f"PyTorch {title}", theirs, args.runs), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--infer", nargs="*", default=["bert_encoder:1", "densenet121:8"],
                        help="MODEL:BATCH, MODEL as profile_ops.py takes it")
    parser.add_argument("--train", nargs="*", default=["resnet18"])
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kernels", action="store_true",
                        help="GPU time per kernel (PyTorch's profiler) instead of per op")
    parser.add_argument("--host", action="store_true",
                        help="with --kernels: also the host's time per function (cProfile)")
    args = parser.parse_args(argv)
    from mixrt.ops.device import gpu_available  # noqa: PLC0415
    if not gpu_available():
        print("profile_gpu: no CUDA GPU (or no CuPy) here")
        return 2
    if args.kernels:
        kernel_cases(args)
        return 0
    for spec in args.infer:
        print(infer_case(spec, args.runs), flush=True)
    for name in args.train:
        print(train_case(name, args.runs, args.precision), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
