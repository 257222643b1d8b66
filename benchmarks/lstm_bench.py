"""Recurrent inference on the CPU: mixrt against onnxruntime and PyTorch on one model.

    python benchmarks/lstm_bench.py [--cell lstm|gru|rnn] [--batch 1 8 64] [--runs 15]
                                    [--rounds 3]

The model is train_bench's sequence classifier (a 2-layer LSTM, GRU or tanh RNN, hidden
256, over 32 steps of 64 features, its last step into 10 classes), exported from PyTorch at
opset 17. Every runtime first computes the same logits as onnxruntime (max abs diff printed),
then each batch is timed in ``--rounds`` rounds that visit the runtimes in turn, ``--runs``
calls a visit; the table gives the median over all rounds. Host arrays in and out, 2
threads each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import mixrt  # noqa: I001  (before NumPy: it picks NumPy's BLAS kernels and thread spin)
import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runners import median_call_ms  # noqa: E402
from train_bench import CACHE, MODELS, export_training  # noqa: E402


def runners(path: Path, threads: int, cell: str) -> dict:
    """name -> run(x) returning the logits as a host array."""
    import torch  # noqa: PLC0415
    torch.set_num_threads(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    theirs = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ours = mixrt.Session(str(path))
    module = MODELS[cell][0]()[0].eval()

    def torch_run(x):
        with torch.inference_mode():
            return module(torch.from_numpy(x)).numpy()
    return {"onnxruntime": lambda x: theirs.run(None, {"x": x})[0],
            "mixrt": lambda x: ours.run(None, {"x": x})[0],
            "torch": torch_run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", choices=("lstm", "gru", "rnn"), default="lstm")
    parser.add_argument("--batch", nargs="*", type=int, default=[1, 8, 64])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    module, shape = MODELS[args.cell][0]()
    path = export_training(module, shape, CACHE / f"train_{args.cell}_op17.onnx")
    run = runners(path, args.threads, args.cell)
    print("| batch | mixrt ms | onnxruntime ms | torch ms | mixrt/ort | torch/ort | "
          "max abs diff vs ort |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batch:
        x = np.random.default_rng(batch).standard_normal((batch,) + shape, dtype=np.float32)
        reference = run["onnxruntime"](x)
        diffs = {name: float(np.abs(f(x) - reference).max()) for name, f in run.items()
                 if name != "onnxruntime"}
        times: dict = {name: [] for name in run}
        for _ in range(args.rounds):
            for name, f in run.items():
                times[name].append(median_call_ms(lambda: f(x), args.runs, warm=3))
        ms = {name: statistics.median(v) for name, v in times.items()}
        ort_ms = ms["onnxruntime"]
        print(f"| {batch} | {ms['mixrt']:.2f} | {ort_ms:.2f} | {ms['torch']:.2f} | "
              f"{ms['mixrt'] / ort_ms:.2f} | {ms['torch'] / ort_ms:.2f} | "
              f"mixrt {diffs['mixrt']:.1e}, torch {diffs['torch']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
