"""Training step time, mixrt against PyTorch on the CPU, one process run; and the training
memory plan (forward + backward planned together) against naive allocation.

    python benchmarks/train_bench.py [--models mlp resnet18 lstm gru] [--steps 20] [--out FILE.md]
                                     (rnn, a tanh RNN, runs only when asked for)
    python benchmarks/train_bench.py --memory-only        # just the ResNet-50 plan
    python benchmarks/train_bench.py --device gpu --precision float32 float16
                                     [--models mlp resnet18 resnet50] [--no-cuda-graph]

``--device gpu`` runs both on the first CUDA GPU (mixrt ``device="gpu"``: its sessions,
parameters, gradients and optimizer state are there; PyTorch on ``cuda``) and exits with a
message when there is none. ``--precision`` adds mixed-precision rows: mixrt's
``precision=`` against ``torch.autocast`` + ``GradScaler`` (float16) at the same dtype. On a GPU, ``float32`` is exact
float32 in both (PyTorch's cuDNN TF32 off, mixrt's default), and ``tf32`` lets both
convolve in TF32 (PyTorch's default).

Both runtimes train the same model from the same weights: the PyTorch module is exported to
ONNX (the TorchScript exporter, training mode so BatchNormalization uses batch statistics)
and mixrt fine-tunes the imported graph, as a user would. One step = forward, softmax
cross-entropy, backward, SGD with momentum 0.9. Both use 2 threads. The figure is the median
step time after warm-up steps, the two runtimes taking turns in blocks of steps so that both
see the same machine speed; the ratio is mixrt / PyTorch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import mixrt  # noqa: F401,I001  (before NumPy: it picks NumPy's BLAS kernels and thread spin)
import numpy as np

# these timings are of the compiled kernels (warm speed): sessions compile them on their
# first call rather than serving NumPy while a background process builds them
os.environ.setdefault("MIXRT_COMPILE", "foreground")

HERE = Path(__file__).resolve().parent
# progress bars on a terminal only: in a pipe or a log their carriage returns pile up
QUIET = not sys.stderr.isatty()
CACHE = HERE / ".cache"
sys.path.insert(0, str(HERE))


# -- models -------------------------------------------------------------------------------

def torch_mlp(seed: int = 0):
    import torch  # noqa: PLC0415
    torch.manual_seed(seed)
    sizes = (784, 1024, 1024, 10)
    layers = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]), (784,)


def torch_resnet18(seed: int = 0, classes: int = 1000):
    """ResNet-18 v1 (He et al. 2016), written out: torchvision is not installable here."""
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415
    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    stages, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        stages += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    model = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                          nn.MaxPool2d(3, 2, 1), *stages, nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(512, classes))
    return model, (3, 224, 224)


def torch_resnet50(seed: int = 0, classes: int = 1000):
    """ResNet-50 v1.5 (torchvision's: the stride on the 3x3 of each bottleneck), written out."""
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415
    torch.manual_seed(seed)

    def conv_bn(cin, cout, kernel, stride=1):
        return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False),
                nn.BatchNorm2d(cout)]

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            self.body = nn.Sequential(*conv_bn(cin, mid, 1), nn.ReLU(),
                                      *conv_bn(mid, mid, 3, stride), nn.ReLU(),
                                      *conv_bn(mid, mid * 4, 1))
            self.down = None
            if stride != 1 or cin != mid * 4:
                self.down = nn.Sequential(*conv_bn(cin, mid * 4, 1, stride))

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))

    stages, cin = [], 64
    for mid, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for index in range(count):
            stages.append(Bottleneck(cin, mid, stride if index == 0 else 1))
            cin = mid * 4
    model = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                          nn.MaxPool2d(3, 2, 1), *stages, nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(2048, classes))
    return model, (3, 224, 224)


def torch_lstm(seed: int = 0, cell: str = "LSTM"):
    """A sequence classifier: a 2-layer LSTM (hidden 256) over 32 steps of 64 features, the
    last step's state into 10 classes. mixrt trains it through its LSTM backward kernel
    (backpropagation through time), PyTorch through its own. ``cell="GRU"``: the same with
    a GRU (which PyTorch computes, and exports, with the reset after the product)."""
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415
    torch.manual_seed(seed)

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = getattr(nn, cell)(64, 256, num_layers=2, batch_first=True)
            self.out = nn.Linear(256, 10)

        def forward(self, x):
            states, _ = self.lstm(x)
            return self.out(states[:, -1])

    return Classifier(), (32, 64)


def torch_gru(seed: int = 0):
    return torch_lstm(seed, cell="GRU")


def torch_rnn(seed: int = 0):
    return torch_lstm(seed, cell="RNN")


MODELS = {"mlp": (torch_mlp, 256), "resnet18": (torch_resnet18, 32), "lstm": (torch_lstm, 64),
          "gru": (torch_gru, 64), "rnn": (torch_rnn, 64), "resnet50": (torch_resnet50, 32)}
# what runs unless --models names others: the tanh RNN and ResNet-50 (minutes a step on a
# CPU) only when asked for
DEFAULT_MODELS = [m for m in MODELS if m not in ("rnn", "resnet50")]


def export_training(module, sample_shape, path: Path) -> Path:
    if path.exists():
        return path
    import torch  # noqa: PLC0415
    path.parent.mkdir(parents=True, exist_ok=True)
    example = torch.zeros((1,) + sample_shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), str(path), dynamo=False, input_names=["x"],
                          output_names=["y"], opset_version=17,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, dynamic_axes={"x": {0: "batch"},
                                                                   "y": {0: "batch"}})
    return path


# -- one step in each runtime -------------------------------------------------------------

def mixrt_stepper(path: Path, x: np.ndarray, y: np.ndarray, device: str = "cpu",
                  precision: str = "float32", cuda_graph: bool = False):
    from mixrt.gluon import Trainer  # noqa: PLC0415
    from mixrt.module import Module  # noqa: PLC0415
    from mixrt.ops.device import parse_device  # noqa: PLC0415
    model = Module.from_onnx(path, device=device)
    trainer = Trainer(model.params.trainable(), "sgd", {"learning_rate": 0.01,
                                                        "momentum": 0.9})
    # the batch waits on the device, as PyTorch's does (torch_stepper moves it once)
    x, y = parse_device(device).put(x), parse_device(device).put(y)
    if precision == "float32" and not cuda_graph:  # the call the CPU figures have timed
        return lambda: model.train_step(x, y, trainer), model
    return lambda: model.train_step(x, y, trainer, precision=precision,
                                    cuda_graph=cuda_graph), model


def torch_stepper(module, x: np.ndarray, y: np.ndarray, device: str = "cpu",
                  precision: str = "float32"):
    import torch  # noqa: PLC0415
    if device != "cpu" or precision != "float32":
        return _torch_amp_stepper(module, x, y, device, precision)
    module.train()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    data, labels = torch.from_numpy(x), torch.from_numpy(y)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(module(data), labels)
        loss.backward()
        optimizer.step()
    return step


def _torch_amp_stepper(module, x, y, device: str, precision: str):
    """PyTorch's recipe: autocast around forward and loss, GradScaler for float16; on a GPU
    each step waits for the device so the wall clock times the work."""
    import torch  # noqa: PLC0415
    kind = "cuda" if device == "gpu" else "cpu"
    module.to(kind).train()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    data, labels = torch.from_numpy(x).to(kind), torch.from_numpy(y).to(kind)
    loss_fn = torch.nn.CrossEntropyLoss()
    low = precision != "float32"
    scaler = torch.amp.GradScaler(kind, enabled=precision == "float16")
    dtype = getattr(torch, precision)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(kind, dtype=dtype, enabled=low):
            loss = loss_fn(module(data), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if kind == "cuda":
            torch.cuda.synchronize()
    return step


def median_step(step, warmup: int, steps: int, label: str) -> float:
    from tqdm import tqdm  # noqa: PLC0415
    for _ in range(warmup):
        step()
    times = []
    for _ in tqdm(range(steps), desc=label, unit="step", leave=False, disable=QUIET):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def interleaved_medians(ours, theirs, warmup: int, steps: int, label: str,
                        block: int = 5):
    """Median step times, the two runtimes taking turns in blocks of ``block`` steps (the
    first step of each block untimed). This machine's speed drifts over minutes, so each
    runtime must see the same drift; single-step alternation would instead time each one
    while the other's BLAS/OpenMP threads are still spinning down."""
    from tqdm import tqdm  # noqa: PLC0415
    for _ in range(warmup):
        ours()
        theirs()
    mine, other = [], []
    rounds = max(1, -(-steps // block))
    for _ in tqdm(range(rounds), desc=f"{label} (mixrt and PyTorch in turns)", unit="round",
                  leave=False, disable=QUIET):
        for step, times in ((ours, mine), (theirs, other)):
            step()
            for _ in range(block):
                started = time.perf_counter()
                step()
                times.append(time.perf_counter() - started)
    return statistics.median(mine), statistics.median(other)


def training_case(name: str):
    """``name``'s PyTorch module, its ONNX export (training mode) and one batch (x, y)."""
    build, batch = MODELS[name]
    module, sample_shape = build()
    path = export_training(module, sample_shape, CACHE / f"train_{name}_op17.onnx")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + sample_shape).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    return module, path, x, y


def bench(name: str, steps: int, warmup: int, device: str = "cpu",
          precision: str = "float32", cuda_graph: bool = False) -> dict:
    """One row. ``precision`` "tf32": float32 with TF32 convolutions in both runtimes
    (PyTorch's default for cuDNN); "float32" on a GPU is exact float32 in both, PyTorch's
    convolutions' TF32 turned off, so that a row compares the same arithmetic."""
    import torch  # noqa: PLC0415
    from mixrt.ops.conv import cudnn  # noqa: PLC0415
    tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    previous = cudnn.allow_tf32(tf32)
    try:
        return _bench_row(name, steps, warmup, device, precision, cuda_graph)
    finally:
        cudnn.allow_tf32(previous)
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's default


def _bench_row(name: str, steps: int, warmup: int, device: str, precision: str,
               cuda_graph: bool) -> dict:
    import torch  # noqa: PLC0415
    from mixrt.errors import MixrtError  # noqa: PLC0415
    torch.set_num_threads(2)
    module, path, x, y = training_case(name)
    row = {"model": name, "batch": len(x), "precision": precision}
    precision = "float32" if precision == "tf32" else precision
    theirs = torch_stepper(module, x, y, device, precision)
    try:  # a precision mixrt refuses (bfloat16) says so here, before any timing
        ours, model = mixrt_stepper(path, x, y, device, precision, cuda_graph)
        if precision != "float32":
            ours()
    except MixrtError as exc:
        row.update(mixrt_ms=None, torch_ms=median_step(theirs, warmup, steps, name) * 1e3,
                   ratio=None, note=str(exc).split(":")[0])
        return row
    mixrt_s, torch_s = interleaved_medians(ours, theirs, warmup, steps, name)
    row.update(mixrt_ms=mixrt_s * 1e3, torch_ms=torch_s * 1e3, ratio=mixrt_s / torch_s)
    return row


# -- memory ---------------------------------------------------------------------------------

def training_memory(batch: int, mirror=None, device: str = "cpu",
                    precision: str = "float32") -> dict:
    """The ResNet-50 training plan (every parameter trainable) at ``batch``; with
    ``mirror``, those ops' outputs are recomputed in backward. Also the median step time."""
    from mixrt.models.zoo import light_model  # noqa: PLC0415
    from mixrt.module import Module  # noqa: PLC0415
    from mixrt.runtime.training.program import (  # noqa: PLC0415
        TrainingProgram, softmax_cross_entropy)
    from mixrt.runtime.passes import optimize  # noqa: PLC0415
    from mixrt.runtime.session import load_graph  # noqa: PLC0415
    # the zoo's "light" file computes its weights with ConstantOfShape nodes; folding them
    # turns them into initializers, i.e. parameters
    graph = optimize(load_graph(str(light_model("resnet50").path)), 1)
    _symbolic_batch(graph)
    model = Module(graph)
    trainable = [p.name for p in model.params.trainable()]
    program = TrainingProgram(model.to_graph(), softmax_cross_entropy(model.output),
                              trainable, opt_level=1, mirror=mirror, device=device,
                              precision=precision)
    x = np.zeros((batch, 3, 224, 224), np.float32)
    feeds = {model.data_names[0]: x, "label": np.zeros(batch, np.int64)}
    params = model.params.arrays()
    report = program.memory_report(params, feeds)
    report["batch"] = batch
    report["precision"] = precision
    report["step_s"] = median_step(lambda: program.step(params, feeds), 1, 3,
                                   f"resnet50 training b{batch}")
    return report


def _symbolic_batch(graph) -> None:
    """The zoo file declares batch 1; training plans are made for bigger batches."""
    from mixrt.ops.ir.types import TensorType  # noqa: PLC0415
    for value in graph.feed_inputs():
        shape = value.type.shape
        value.type = TensorType(value.type.dtype, ("N",) + tuple(shape[1:]))
    for value in graph.outputs:
        value.type = None
    for node in graph.nodes:  # Reshape targets exported with the batch of 1 spelled out
        if node.op_type == "Reshape" and node.inputs[1] in graph.initializers:
            target = np.array(graph.initializers[node.inputs[1]])
            if target.size and target[0] == 1:
                target[0] = -1
                graph.initializers[node.inputs[1]] = target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--memory-batch", type=int, default=32)
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--precision", nargs="+", default=["float32"],
                        choices=("float32", "tf32", "float16", "bfloat16"),
                        help="tf32: float32 with TF32 convolutions in both runtimes (GPU)")
    # on a GPU mixrt replays each step's forward and backward as a CUDA graph, as a user
    # fine-tuning there would ask it to (train_step(..., cuda_graph=True))
    parser.add_argument("--no-cuda-graph", action="store_true",
                        help="GPU: run mixrt's steps without CUDA graphs")
    args = parser.parse_args(argv)
    if args.device == "gpu" and (reason := gpu_missing()):
        print(f"train_bench: --device gpu needs a CUDA GPU that both CuPy and PyTorch can "
              f"use; {reason}", file=sys.stderr)
        return 2
    if args.device == "cpu" and args.precision == ["float32"]:
        rows = [] if args.memory_only else [bench(m, args.steps, args.warmup)
                                            for m in args.models]
        text = render(rows, training_memory(args.memory_batch))
    else:
        graphs = args.device == "gpu" and not args.no_cuda_graph
        rows = [] if args.memory_only else [
            bench(m, args.steps, args.warmup, args.device, p, graphs)
            for m in args.models for p in args.precision]
        memory = [training_memory(args.memory_batch, device=args.device, precision=p)
                  for p in args.precision if p not in ("bfloat16", "tf32")]
        text = render_mixed(rows, memory, args.device)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


def gpu_missing() -> str | None:
    """Why the GPU runs cannot happen here, or None when they can."""
    from mixrt.errors import DeviceUnavailableError  # noqa: PLC0415
    from mixrt.ops.device import parse_device  # noqa: PLC0415
    try:
        parse_device("gpu")
    except DeviceUnavailableError as exc:
        return f"mixrt: {exc}"
    import torch  # noqa: PLC0415
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device"
    return None


def render(rows: list[dict], memory: dict) -> str:
    lines = ["## Training (CPU, 2 threads, one process run)", ""]
    if rows:
        lines += ["| model | batch | mixrt step ms | PyTorch step ms | mixrt / PyTorch |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['batch']} | {r['mixrt_ms']:.1f} | {r['torch_ms']:.1f} | "
                  f"{r['ratio']:.2f} |" for r in rows]
        lines.append("")
    mib = 2 ** 20
    lines += [f"ResNet-50 training plan (forward + backward, every parameter trainable), batch "
              f"{memory['batch']}: arena {memory['arena_bytes'] / mib:,.0f} MiB, naive "
              f"{memory['naive_bytes'] / mib:,.0f} MiB, lower bound "
              f"{memory['lower_bound_bytes'] / mib:,.0f} MiB; naive / arena "
              f"{memory['naive_bytes'] / memory['arena_bytes']:.2f}.", ""]
    return "\n".join(lines)


def render_mixed(rows: list[dict], memory: list[dict], device: str) -> str:
    """The table with a precision column (GPU runs, or CPU runs asked for a precision)."""
    where = "GPU; parameters and optimizer on the device in both" if device == "gpu" \
        else "CPU, 2 threads"
    lines = [f"## Training ({where}, one process run)", ""]
    if rows:
        lines += ["| model | batch | precision | mixrt step ms | PyTorch step ms | "
                  "mixrt / PyTorch |", "|---|---|---|---|---|---|"]
        lines += [_mixed_row(r) for r in rows]
        lines.append("")
    mib = 2 ** 20
    lines += [f"ResNet-50 training plan ({m['precision']}, every parameter trainable), batch "
              f"{m['batch']}: arena {m['arena_bytes'] / mib:,.0f} MiB, naive "
              f"{m['naive_bytes'] / mib:,.0f} MiB; naive / arena "
              f"{m['naive_bytes'] / m['arena_bytes']:.2f}." for m in memory]
    return "\n".join(lines + [""])


def _mixed_row(row: dict) -> str:
    head = f"| {row['model']} | {row['batch']} | {row['precision']} |"
    if row["mixrt_ms"] is None:
        return f"{head} n/a ({row['note']}) | {row['torch_ms']:.1f} | n/a |"
    return f"{head} {row['mixrt_ms']:.1f} | {row['torch_ms']:.1f} | {row['ratio']:.2f} |"


if __name__ == "__main__":
    raise SystemExit(main())
