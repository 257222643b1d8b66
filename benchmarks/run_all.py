"""mixrt against onnxruntime and PyTorch, every benchmark in one process run.

    python benchmarks/run_all.py [--quick] [--models M ...] [--batch 1 8] [--out BENCHMARKS.md]

For each model (the 9 light zoo models, an MLP, a BERT-base-shaped encoder) and batch size,
the runtimes are built on the same .onnx file, their outputs are compared with onnxruntime's
before anything is timed, and then each is timed for ``--repeat`` runs, interleaved so that
noise from the shared machine falls on all of them alike (``runners.time_interleaved``). We
report medians. A runtime whose output disagrees is still timed but marked, and left out of
the geometric means: a fast wrong answer must not look good.

Beside latency: mixrt's memory plan per case (arena, lower bound, naive), the throughput of
one Session called from 8 threads against serial calls, where mixrt's time goes (its own
profiler, per op), and, where CUDA is present, the GPU columns. All of it goes into the
generated block of ``--out``; text outside that block is kept.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# PyTorch's OpenMP workers spin while they wait for each other; on this shared 2-core
# machine a spinning worker whose partner was descheduled made batch-8 MLP runs 6-15x slower
# than with one thread. Passive waiting measures PyTorch, not the neighbours. It must be set
# before torch loads; export OMP_WAIT_POLICY to choose otherwise.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# mixrt before anything that loads NumPy: its BLAS policy (AVX-512 OpenBLAS kernels, see
# docs/cpu-kernels.md) can only act before OpenBLAS is loaded, as in a service that does
# `import mixrt` first
import mixrt  # noqa: E402,F401

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402
from cases import Case, all_models, make_case, zoo_torch_twin  # noqa: E402
from runners import (Runner, agrees, key, max_abs_error, median_ms, mixrt_runner,  # noqa: E402
                     ort_reaches_cuda, ort_runner, time_interleaved, torch_available,
                     torch_runner)
from threads import measure_threads  # noqa: E402
from where_time_goes import profile_case  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QUICK_MODELS = ["squeezenet", "resnet50", "mlp", "bert_encoder"]


@dataclass
class Row:
    """One model at one batch size on one device."""

    model: str
    batch: int
    device: str
    skipped: str = ""
    times: dict[str, list[float]] = field(default_factory=dict)  # runner key -> seconds
    errors: dict[str, float] = field(default_factory=dict)  # runner key -> max abs vs ort
    wrong: set[str] = field(default_factory=set)  # runner keys whose output disagrees
    memory: object = None  # mixrt MemoryPlan, when the session can report one
    imported_naive: int | None = None  # naive bytes of the graph as imported (opt_level 0)
    cuda_graph: str = ""  # GPU: whether mixrt's timed runs were CUDA-graph replays, or why not

    def ms(self, runtime: str) -> float | None:
        times = self.times.get(f"{runtime}/{self.device}")
        return median_ms(times) if times else None

    def ratio(self, runtime: str) -> float | None:
        ours, theirs = self.ms(runtime), self.ms("onnxruntime")
        return ours / theirs if ours and theirs else None


# -- one case ---------------------------------------------------------------------------------

def build_runners(case: Case, device: str, args) -> list[Runner]:
    runners = [ort_runner(case.path, args.threads, device),
               mixrt_runner(case.path, args.opt_level, device)]
    module = case.torch_module
    if module is None and device == "gpu" and torch_available("gpu"):  # ort may lack CUDA
        module = zoo_torch_twin(case)
    if module is not None:
        runners.append(torch_runner(module, case.input_name or next(iter(case.feeds)),
                                    args.threads, device))
    return [r for r in runners if r is not None]


def bench_case(case: Case, device: str, args) -> Row:
    row = Row(case.model, case.batch, device)
    runners = build_runners(case, device, args)
    if not any(r.runtime != "onnxruntime" for r in runners):
        row.skipped = f"no runtime besides onnxruntime reaches {device}"
        return row
    outputs, failures = {}, []
    for runner in runners:
        try:
            outputs[key(runner)] = runner.run(case.feeds)
        except Exception as exc:  # noqa: BLE001  (reported in the table, not raised)
            failures.append(f"{runner.runtime} failed: {type(exc).__name__}: "
                            f"{str(exc)[:100]}")
    if failures and f"onnxruntime/{device}" not in outputs and case.batch > 1:
        row.skipped = "fixed batch (onnxruntime rejects it)"
        return row
    if failures:  # a runtime that cannot run the case is a finding, not a footnote
        row.skipped = "; ".join(failures)
        return row
    # without onnxruntime's CUDA provider, the GPU runtimes are still checked against its
    # CPU output (and shown without a ratio)
    reference = outputs.get(f"onnxruntime/{device}") or \
        ort_runner(case.path, args.threads).run(case.feeds)
    for name, got in outputs.items():
        if not name.startswith("onnxruntime"):
            row.errors[name] = max_abs_error(got, reference)
            if not agrees(row.errors[name], reference):
                row.wrong.add(name)
    row.times = time_interleaved(runners, case.feeds, args.repeat, args.rounds)
    row.cuda_graph = _cuda_graph_status(runners)
    row.memory = _memory_plan(runners, case.feeds)
    if row.memory is not None:
        row.imported_naive = _imported_naive(case)
    return row


def _cuda_graph_status(runners: list[Runner]) -> str:
    """For a GPU session with cuda_graph=True: "replayed", or why its runs were not."""
    session = next((r.session for r in runners if r.runtime == "mixrt"), None)
    captures = getattr(session, "_captures", None)
    if captures is None:
        return ""
    if captures.failed:
        return "not captured (" + "; ".join(sorted(set(captures.failed.values())))[:160] + ")"
    return "replayed" if captures.runs else "never captured"


def _memory_plan(runners: list[Runner], feeds):
    session = next((r.session for r in runners if r.runtime == "mixrt"), None)
    if session is None or not hasattr(session, "memory_plan"):
        return None  # sessions before the arena executor cannot say
    return session.memory_plan(feeds)


def _imported_naive(case) -> int:
    """Naive allocation of the model as imported (every op's output its own buffer, as in
    the MXNet paper's baseline), from an opt_level 0 session's plan."""
    return mixrt.Session(str(case.path), opt_level=0).memory_plan(case.feeds).naive_bytes


def _progress(index: int, total: int, row: Row) -> None:
    label = f"[{index}/{total}] {row.model:14} b{row.batch} {row.device}"
    if row.skipped:
        print(f"{label}  skipped: {row.skipped}", flush=True)
        return
    parts = [f"{k.split('/')[0]} {median_ms(v):8.2f} ms" for k, v in row.times.items()]
    ratio = row.ratio("mixrt")
    tail = f"  mixrt/ort {ratio:.2f}" if ratio else ""
    flags = f"  DISAGREES: {sorted(row.wrong)}" if row.wrong else ""
    print(f"{label}  " + "  ".join(parts) + tail + flags, flush=True)


# -- whole run --------------------------------------------------------------------------------

def gpu_present() -> bool:
    """Whether any runtime here reaches a CUDA device (checked once, cheaply, before
    building GPU sessions for every case)."""
    try:
        import cupy  # noqa: PLC0415
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return True
    except Exception:  # noqa: BLE001  (no cupy, no driver, no device: all mean "no")
        pass
    return torch_available("gpu") or ort_reaches_cuda()


def run_latency(args, device: str) -> list[Row]:
    plan = [(name, batch) for name in args.models for batch in args.batch]
    rows = []
    for index, (name, batch) in enumerate(plan, 1):
        row = bench_case(make_case(name, batch), device, args)
        rows.append(row)
        _progress(index, len(plan), row)
    return rows


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"fewer repeats, models {QUICK_MODELS} unless --models is given")
    parser.add_argument("--models", nargs="*", default=None, help=f"from {all_models()}")
    parser.add_argument("--batch", nargs="*", type=int, default=[1, 8])
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per runtime")
    parser.add_argument("--rounds", type=int, default=None, help="interleaving rounds")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (ort, torch)")
    parser.add_argument("--opt-level", type=int, default=2)
    parser.add_argument("--thread-model", default="squeezenet")
    parser.add_argument("--thread-calls", type=int, default=None, help="run calls per thread")
    parser.add_argument("--profile-models", nargs="*", default=["resnet50", "bert_encoder"])
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU section")
    parser.add_argument("--gpu-only", action="store_true",
                        help="only the GPU section, into its own block of --out (the CPU "
                             "figures, from the 2-core machine, stay as they are)")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    args.models = args.models or (QUICK_MODELS if args.quick else all_models())
    args.repeat = args.repeat or (5 if args.quick else 15)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.thread_calls = args.thread_calls or (10 if args.quick else 50)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import onnxruntime  # noqa: PLC0415
    onnxruntime.set_default_logger_severity(3)  # the zoo's unused-initializer warnings
    started = time.perf_counter()
    args.load_before = os.getloadavg()
    if args.gpu_only:
        return gpu_only(args, started)
    if args.load_before[0] > (os.cpu_count() or 1):
        print(f"warning: load average {args.load_before[0]:.1f} on {os.cpu_count()} cores; "
              "other processes will distort these timings (see benchmarks/NOTES.md)",
              flush=True)
    print(f"CPU latency: {len(args.models)} models x batch {args.batch}", flush=True)
    rows = run_latency(args, "cpu")
    print(f"threads: {args.thread_model}, 8 x {args.thread_calls} calls", flush=True)
    threads = measure_threads(args.thread_model, args.thread_calls, args.opt_level,
                              args.threads)
    profiles = []
    for name in args.profile_models:
        print(f"where the time goes: {name}", flush=True)
        profiles.append(profile_case(make_case(name, 1), args.opt_level, args.threads))
    gpu_rows = []
    if not args.no_gpu and gpu_present():
        print("GPU latency", flush=True)
        gpu_rows = run_latency(args, "gpu")
    args.load_after = os.getloadavg()
    text = report.render(args, rows, threads, profiles, gpu_rows,
                         elapsed=time.perf_counter() - started)
    report.write(args.out, text)
    geo = report.geomean([r.ratio("mixrt") for r in rows if r.batch == 1
                          and r.model in report.LIGHT and "mixrt/cpu" not in r.wrong])
    if geo:
        print(f"geometric mean mixrt/ort, light zoo batch 1: {geo:.2f}")
    print(f"written to {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


def gpu_only(args, started: float) -> int:
    if not gpu_present():
        print("run_all --gpu-only: no runtime here reaches a CUDA device", flush=True)
        return 1
    print(f"GPU latency: {len(args.models)} models x batch {args.batch}", flush=True)
    gpu_rows = run_latency(args, "gpu")
    report.write(args.out, report.render_gpu(args, gpu_rows,
                                             elapsed=time.perf_counter() - started),
                 report.GPU_BEGIN, report.GPU_END)
    print(f"written to {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
