"""One calling convention for the three runtimes the benchmarks compare, and the timer.

A runner is ``feeds -> list of host NumPy arrays``: every runtime is timed from host input to
host output, so a GPU runner's figure includes its copies both ways (what a service pays),
and a CPU runner cannot hide work behind a lazy result.

GPU runners are made only when the runtime really reaches a CUDA device: onnxruntime-gpu
lists CUDAExecutionProvider even on a machine without a GPU, so we build a session and check
which provider it kept.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

# these timings are of the compiled kernels (warm speed): sessions compile them on their
# first call rather than serving NumPy while a background process builds them
os.environ.setdefault("MIXRT_COMPILE", "foreground")

Feeds = dict[str, np.ndarray]


@dataclass
class Runner:
    runtime: str  # "mixrt", "onnxruntime", "torch"
    device: str  # "cpu" or "gpu"
    run: Callable[[Feeds], list[np.ndarray]]
    session: object = None  # the underlying session/module, for memory plans and profiles


# -- timing ---------------------------------------------------------------------------------

SETTLE_SECONDS = 0.2  # outlasts onnxruntime's post-run spin (recovered after 50 ms, measured)
WARM_SECONDS = 0.1  # outlasts the cores' ramp after the pause (~30 ms, measured)


def time_interleaved(runners: list[Runner], feeds: Feeds, repeat: int, rounds: int
                     ) -> dict[str, list[float]]:
    """``repeat`` timed runs per runner, in ``rounds`` rounds that visit every runner in turn.

    The machine is shared, so a burst of someone else's work would land on whichever runtime
    happened to be running; spreading each runtime's runs over the whole measurement makes
    the ratio fair. Each visit starts with untimed runs (below), so caches are warm again
    after the other runtimes ran.

    Before each visit the process sleeps ``SETTLE_SECONDS``: onnxruntime's worker threads keep
    spinning for tens of milliseconds after a run returns (their spin loop is 2**20 pauses), and
    a spinning worker takes a core from whichever runtime runs next. Without the pause mixrt's
    SqueezeNet took 8.7 ms right after onnxruntime and 5.2 ms after an idle gap (NOTES.md §12).
    A service runs one runtime, so each is timed after the other's threads have gone quiet;
    within a visit the runs stay back to back, as a busy service's requests are.

    The pause has its own cost: this VM's cores come back from idle slowly, and the first
    ~30 ms of work after it ran up to 2x slower (ShuffleNet: 9-10 ms runs, then 4.2 ms for
    mixrt; 2.2 then 1.4 ms for onnxruntime). So each visit warms up with untimed runs for
    ``WARM_SECONDS`` (at least one run) before its timed runs.
    """
    times: dict[str, list[float]] = {key(r): [] for r in runners}
    per_round = [repeat // rounds + (i < repeat % rounds) for i in range(rounds)]
    for count in per_round:
        for runner in runners:
            time.sleep(SETTLE_SECONDS)
            _warm_up(runner, feeds)
            for _ in range(count):
                started = time.perf_counter()
                runner.run(feeds)
                times[key(runner)].append(time.perf_counter() - started)
    return times


def _warm_up(runner: Runner, feeds: Feeds) -> None:
    started = time.perf_counter()
    runner.run(feeds)
    while time.perf_counter() - started < WARM_SECONDS:
        runner.run(feeds)


def key(runner: Runner) -> str:
    return f"{runner.runtime}/{runner.device}"


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def median_call_ms(fn, runs: int, warm: int = 1) -> float:
    """Median wall time of ``runs`` calls of ``fn``, after ``warm`` untimed ones (the
    single-kernel benchmarks, which time one runtime at a time)."""
    return median_ms(call_seconds(fn, runs, warm))


def call_seconds(fn, runs: int, warm: int = 1) -> list[float]:
    """The wall times of ``runs`` calls of ``fn``, after ``warm`` untimed ones."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


# -- onnxruntime ----------------------------------------------------------------------------

def ort_runner(path, threads: int, device: str = "cpu") -> Runner | None:
    import onnxruntime as ort  # noqa: PLC0415
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # the light models' unused initializers are warned about
    providers = ["CPUExecutionProvider"]
    if device == "gpu":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return None
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    try:
        source = path if isinstance(path, bytes) else str(path)
        session = ort.InferenceSession(source, options, providers=providers)
    except Exception:  # noqa: BLE001  (no CUDA runtime: the GPU column is simply absent)
        if device == "gpu":
            return None
        raise
    if device == "gpu" and "CUDAExecutionProvider" not in session.get_providers():
        return None
    return Runner("onnxruntime", device, lambda feeds: session.run(None, feeds), session)


def ort_reaches_cuda() -> bool:
    """onnxruntime-gpu lists its CUDA provider without a GPU; only a session tells."""
    import onnx  # noqa: PLC0415
    from onnx import TensorProto, helper  # noqa: PLC0415
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    import onnxruntime as ort  # noqa: PLC0415
    ort.set_default_logger_severity(4)  # a missing CUDA library is the answer, not an error
    try:
        return ort_runner(model.SerializeToString(), 1, "gpu") is not None
    finally:
        ort.set_default_logger_severity(3)


# -- mixrt ----------------------------------------------------------------------------------

def mixrt_runner(path, opt_level: int, device: str = "cpu") -> Runner | None:
    import mixrt  # noqa: PLC0415
    from mixrt.errors import DeviceUnavailableError  # noqa: PLC0415
    try:
        # on the GPU each signature's run is replayed as a CUDA graph (static shapes here)
        session = mixrt.Session(str(path), device="gpu:0" if device == "gpu" else "cpu",
                                opt_level=opt_level, cuda_graph=device == "gpu")
    except DeviceUnavailableError:
        return None
    return Runner("mixrt", device, lambda feeds: session.run(None, feeds), session)


# -- PyTorch --------------------------------------------------------------------------------

def torch_available(device: str = "cpu") -> bool:
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return False
    return device == "cpu" or torch.cuda.is_available()


def torch_runner(module, input_name: str, threads: int, device: str = "cpu") -> Runner | None:
    if module is None or not torch_available(device):
        return None
    import torch  # noqa: PLC0415
    torch.set_num_threads(threads)
    target = torch.device("cuda" if device == "gpu" else "cpu")
    # .to() moves a module in place; the CPU runner keeps the original
    placed = copy.deepcopy(module).to(target) if device == "gpu" else module

    def run(feeds: Feeds) -> list[np.ndarray]:
        with torch.inference_mode():
            out = placed(torch.from_numpy(feeds[input_name]).to(target))
            # a module of several outputs (onnx2torch's twin of a zoo model that has two)
            # returns them as a list, in the graph's order
            outs = out if isinstance(out, (list, tuple)) else [out]
            return [o.cpu().numpy() for o in outs]  # .cpu() waits for the GPU, as the others do

    return Runner("torch", device, run, placed)


# -- agreement ------------------------------------------------------------------------------

def max_abs_error(got: list[np.ndarray], expected: list[np.ndarray]) -> float:
    if len(got) != len(expected):
        return float("inf")
    worst = 0.0
    for g, e in zip(got, expected):
        if np.shape(g) != np.shape(e):
            return float("inf")
        if np.size(e):
            worst = max(worst, float(np.max(np.abs(np.asarray(g, np.float64) - e))))
    return worst


def agrees(error: float, expected: list[np.ndarray], rtol: float = 1e-3) -> bool:
    """Within ``rtol`` of the largest reference magnitude (at least 1): float32 runtimes
    that sum in different orders differ by ~1e-6 here; a real bug is far above 1e-3."""
    scale = max([1.0] + [float(np.max(np.abs(e))) for e in expected if np.size(e)])
    return error <= rtol * scale
