"""Gluon training step time: mixrt imperative and hybridized against PyTorch eager (and MXNet
1.9.1's Gluon when a Python with it is given), on the CPU, in one run.

    python benchmarks/gluon_bench.py [--model mlp|lstm] [--steps 30] [--blocks 3]
                                     [--mxnet-python PATH] [--out FILE.md]

The default model is the training issue's MLP, 784-1024-1024-10 with ReLU, batch 256, softmax
cross-entropy, SGD with momentum 0.9, all from the same initial weights. ``--model lstm`` is
a ``gluon.rnn.LSTM`` (2 layers, hidden 256, batch-first) over 32 steps of 128 features, batch
64, its last step into a Dense(10), against ``torch.nn.LSTM`` + Linear with the same weights
(MXNet's column is the MLP's only). One step = forward
under autograd.record(), the loss, backward, Trainer.step (PyTorch: zero_grad, forward,
loss, backward, optimizer.step). The runtimes take turns in blocks of steps so that all see
the same machine speed; the figure is the median step time and the ratio is against PyTorch
eager. MXNet runs in its own process (``--mxnet-python``: a virtualenv with mxnet==1.9.1
and numpy<1.24, which mxnet needs), turn by turn with the others.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mixrt  # noqa: F401,I001  (before NumPy: it picks NumPy's BLAS kernels and thread spin)
import numpy as np
from tqdm import tqdm

# these timings are of the compiled kernels (warm speed): sessions compile them on their
# first call rather than serving NumPy while a background process builds them
os.environ.setdefault("MIXRT_COMPILE", "foreground")

SIZES = (784, 1024, 1024, 10)
BATCH = 256
LR, MOMENTUM = 0.01, 0.9


def initial_weights(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(0, (2.0 / a) ** 0.5, (b, a)).astype(np.float32),
             np.zeros(b, np.float32)) for a, b in zip(SIZES, SIZES[1:])]


def batch(seed: int = 1):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(BATCH, SIZES[0])).astype(np.float32),
            rng.integers(0, SIZES[-1], BATCH).astype(np.int64))


# -- the runtimes: each returns a step() closure ---------------------------------------------

# the recurrent model: (batch, steps, features) -> LSTM(hidden) x 2 -> last step -> Dense(10)
LSTM_SHAPE, LSTM_HIDDEN, LSTM_LAYERS = (64, 32, 128), 256, 2


def lstm_batch(seed: int = 1):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=LSTM_SHAPE).astype(np.float32),
            rng.integers(0, 10, LSTM_SHAPE[0]).astype(np.int64))


def mixrt_lstm_net():
    import mixrt as mx  # noqa: PLC0415
    from mixrt.gluon import HybridBlock, nn, rnn  # noqa: PLC0415

    class LastStep(HybridBlock):
        def __init__(self):
            super().__init__()
            self.lstm = rnn.LSTM(LSTM_HIDDEN, num_layers=LSTM_LAYERS, layout="NTC",
                                 input_size=LSTM_SHAPE[2])
            self.out = nn.Dense(10, in_units=LSTM_HIDDEN)

        def hybrid_forward(self, F, x):
            last = np.array(LSTM_SHAPE[1] - 1, dtype=np.int64)
            return self.out(F.Gather(self.lstm(x), last, axis=1))

    mx.random.seed(0)
    net = LastStep()
    net.initialize(mx.initializer.Uniform(1 / LSTM_HIDDEN ** 0.5))
    return net


def torch_lstm_twin(net):
    """torch.nn.LSTM + Linear holding ``net``'s weights (same gate order, PyTorch's names)."""
    import torch  # noqa: PLC0415

    class LastStep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(LSTM_SHAPE[2], LSTM_HIDDEN, LSTM_LAYERS, batch_first=True)
            self.out = torch.nn.Linear(LSTM_HIDDEN, 10)

        def forward(self, x):
            return self.out(self.lstm(x)[0][:, -1])

    model = LastStep()
    with torch.no_grad():
        for name, param in net.lstm.collect_params().items():
            layer, link, kind = name[len(net.lstm.prefix):].split("_")
            torch_name = f"{kind}_{link[0]}{link[-1]}_l{layer[1:]}"
            model.lstm.get_parameter(torch_name).copy_(torch.from_numpy(
                param.data().asnumpy()))
        model.out.weight.copy_(torch.from_numpy(net.out.weight.data().asnumpy()))
        model.out.bias.copy_(torch.from_numpy(net.out.bias.data().asnumpy()))
    return model


def mixrt_step(hybridize: bool, model: str = "mlp"):
    from mixrt import gluon  # noqa: PLC0415
    if model == "lstm":
        return _mixrt_train_step(mixrt_lstm_net(), lstm_batch(), hybridize)
    net = gluon.nn.HybridSequential()
    for index, (w, _) in enumerate(initial_weights()):
        last = index == len(SIZES) - 2
        net.add(gluon.nn.Dense(w.shape[0], in_units=w.shape[1],
                               activation=None if last else "relu"))
    net.initialize()
    for dense, (w, b) in zip(net, initial_weights()):
        dense.weight.set_data(w)
        dense.bias.set_data(b)
    return _mixrt_train_step(net, batch(), hybridize)


def _mixrt_train_step(net, data, hybridize: bool):
    from mixrt import autograd, gluon, nd  # noqa: PLC0415
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    if hybridize:
        net.hybridize()
        loss_fn.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": LR, "momentum": MOMENTUM})
    x, y = (nd.array(a) for a in data)

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
        return loss
    return step


def torch_step(model: str = "mlp"):
    import torch  # noqa: PLC0415
    torch.set_num_threads(2)
    if model == "lstm":
        return _torch_train_step(torch_lstm_twin(mixrt_lstm_net()), lstm_batch())
    layers = []
    for w, b in initial_weights():
        linear = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w))
            linear.bias.copy_(torch.from_numpy(b))
        layers += [linear, torch.nn.ReLU()]
    return _torch_train_step(torch.nn.Sequential(*layers[:-1]), batch())


def _torch_train_step(model, data):
    import torch  # noqa: PLC0415
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = (torch.from_numpy(a) for a in data)

    def step():
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return step


MXNET_WORKER = r"""
import json, sys, time
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
hybridize = sys.argv[1] == "1"
weights = json.loads(sys.stdin.readline())
net = gluon.nn.HybridSequential()
for i, (rows, cols) in enumerate(weights["shapes"]):
    net.add(gluon.nn.Dense(rows, in_units=cols, activation=None if i == 2 else "relu"))
net.initialize()
arrays = np.load(weights["path"])
for i, dense in enumerate(net):
    dense.weight.set_data(mx.nd.array(arrays[f"w{i}"]))
    dense.bias.set_data(mx.nd.array(arrays[f"b{i}"]))
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
if hybridize:
    net.hybridize(static_alloc=True, static_shape=True)
    loss_fn.hybridize(static_alloc=True, static_shape=True)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": %r, "momentum": %r})
x = mx.nd.array(arrays["x"]); y = mx.nd.array(arrays["y"])
def step():
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(%d)
    mx.nd.waitall()
for line in sys.stdin:
    count = int(line)
    times = []
    for _ in range(count):
        started = time.perf_counter(); step(); times.append(time.perf_counter() - started)
    print(json.dumps(times), flush=True)
""" % (LR, MOMENTUM, BATCH)


class MXNetWorker:
    """MXNet's Gluon in a child process, fed block sizes over a pipe, answering step times."""

    def __init__(self, python: str, hybridize: bool, workdir: Path):
        path = workdir / "gluon_bench_weights.npz"
        arrays = {}
        for i, (w, b) in enumerate(initial_weights()):
            arrays[f"w{i}"], arrays[f"b{i}"] = w, b
        arrays["x"], arrays["y"] = batch()
        np.savez(path, **arrays)
        env = {"OMP_NUM_THREADS": "2", "MXNET_CPU_WORKER_NTHREADS": "2", "PATH": "/usr/bin"}
        self.process = subprocess.Popen(
            [python, "-c", MXNET_WORKER, "1" if hybridize else "0"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env)
        shapes = [list(w.shape) for w, _ in initial_weights()]
        self._send(json.dumps({"shapes": shapes, "path": str(path)}))

    def _send(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def run(self, count: int) -> list[float]:
        self._send(str(count))
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


# -- measuring ------------------------------------------------------------------------------

def measure(runners: dict, steps: int, blocks: int, warmup: int = 3) -> dict:
    times = {name: [] for name in runners}
    for name, runner in runners.items():
        run_block(runner, warmup)
    per_block = max(1, steps // blocks)
    # a bar on a terminal only: in a pipe or a log its carriage returns pile up
    with tqdm(total=per_block * blocks * len(runners), desc="steps", unit="step",
              disable=not sys.stderr.isatty()) as bar:
        for _ in range(blocks):
            for name, runner in runners.items():
                times[name] += run_block(runner, per_block)
                bar.update(per_block)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def run_block(runner, count: int) -> list[float]:
    if isinstance(runner, MXNetWorker):
        return runner.run(count)
    times = []
    for _ in range(count):
        started = time.perf_counter()
        runner()
        times.append(time.perf_counter() - started)
    return times


def report(medians: dict, args) -> str:
    torch_ms = medians["pytorch eager"]
    what = (f"MLP 784-1024-1024-10, batch {BATCH}" if args.model == "mlp" else
            f"gluon.rnn.LSTM {LSTM_LAYERS}x{LSTM_HIDDEN} over (N, T, C) = {LSTM_SHAPE}, last "
            f"step into Dense(10)")
    lines = [f"Measured {time.strftime('%Y-%m-%d')} by `python benchmarks/gluon_bench.py "
             f"--model {args.model} --steps {args.steps} --blocks {args.blocks}`, one run; "
             f"{what}, SGD momentum {MOMENTUM}; 2 threads each; median step time, the "
             f"runtimes taking turns in blocks of steps.", "",
             "| runtime | step ms | / PyTorch eager | target |", "|---|---|---|---|"]
    targets = {"mixrt imperative": 1.3, "mixrt hybridized": 1.2} if args.model == "mlp" else {}
    for name, value in medians.items():
        ratio = value / torch_ms
        target = targets.get(name)
        verdict = "" if target is None else \
            f"≤ {target} ({'holds' if ratio <= target else 'fails'})"
        lines.append(f"| {name} | {value:.2f} | {ratio:.2f} | {verdict} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("mlp", "lstm"), default="mlp")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--mxnet-python", help="a Python with mxnet==1.9.1 installed")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    check_same_start(args.model)
    runners = {"mixrt imperative": mixrt_step(False, args.model),
               "mixrt hybridized": mixrt_step(True, args.model),
               "pytorch eager": torch_step(args.model)}
    workers = []
    if args.mxnet_python and args.model == "mlp":
        cache = Path(__file__).resolve().parent / ".cache"
        cache.mkdir(exist_ok=True)
        for hybrid in (False, True):
            worker = MXNetWorker(args.mxnet_python, hybrid, cache)
            workers.append(worker)
            runners[f"mxnet 1.9.1 {'hybridized' if hybrid else 'imperative'}"] = worker
    try:
        table = report(measure(runners, args.steps, args.blocks), args)
    finally:
        for worker in workers:
            worker.close()
    print(table)
    if args.out:
        args.out.write_text(table)


def check_same_start(model: str) -> None:
    """The runtimes must compute the same first loss from the same weights."""
    first = {"mixrt imperative": float(mixrt_step(False, model)().mean().asscalar()),
             "mixrt hybridized": float(mixrt_step(True, model)().mean().asscalar()),
             "pytorch eager": float(torch_step(model)().item())}
    reference = first["pytorch eager"]
    for name, value in first.items():
        if abs(value - reference) > 1e-4 * max(1.0, abs(reference)):
            raise SystemExit(f"{name} computes a first loss of {value}, PyTorch {reference}: "
                             f"the runtimes do not train the same model")
    print("first loss, all runtimes:", reference)


if __name__ == "__main__":
    main()
