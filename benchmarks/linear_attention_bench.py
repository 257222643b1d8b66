"""LinearAttention prefill on the CPU: mixrt's chunked kernel against the token-by-token
recurrence (the spec's formula, which mixrt ran before) in NumPy and, where installed, in
PyTorch eager. onnxruntime has no LinearAttention (opset 27), so it has no column.

    python benchmarks/linear_attention_bench.py [--runs N] [--steps T]

gated_delta, 16 heads of d_k = d_v = 128, batch 1, float32: a decay per head (Gated
DeltaNet's) and per key channel. Each runtime is timed in this process, median of --runs
timed runs after one untimed; the outputs are compared with the NumPy recurrence's first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import mixrt
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runners import median_call_ms  # noqa: E402

HEADS, SIZE = 16, 128
NAMES = ["query", "key", "value", "past_state", "decay", "beta"]


def inputs(steps: int, per_key: bool) -> dict:
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((1, steps, HEADS, SIZE))
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    return {"query": rng.standard_normal((1, steps, HEADS * SIZE)),
            "key": keys.reshape(1, steps, -1),
            "value": rng.standard_normal((1, steps, HEADS * SIZE)),
            "past_state": 0.1 * rng.standard_normal((1, HEADS, SIZE, SIZE)),
            "decay": -rng.uniform(0.01, 0.5, (1, steps, HEADS * (SIZE if per_key else 1))),
            "beta": rng.uniform(0.1, 1.0, (1, steps, HEADS))}


def mixrt_session(feeds: dict) -> mixrt.Session:
    graph = Graph(name="linear_attention", opsets={"": 27})
    graph.inputs = [Value(n, TensorType(np.dtype(np.float32), feeds[n].shape)) for n in NAMES]
    graph.nodes = [Node("LinearAttention", NAMES, ["y", "state"], name="mix", opset=27,
                        attributes={"q_num_heads": HEADS, "kv_num_heads": HEADS})]
    graph.outputs = [Value("y"), Value("state")]
    return mixrt.Session(graph)


def recurrence(xp, feeds: dict):
    """The spec's recurrence, one token at a time (``xp``: numpy or torch)."""
    steps = feeds["query"].shape[1]
    q, k, v = (feeds[n].reshape(1, steps, HEADS, SIZE) for n in ("query", "key", "value"))
    g = feeds["decay"].reshape(1, steps, HEADS, -1)
    b = feeds["beta"].reshape(1, steps, HEADS, 1)
    state, outputs = feeds["past_state"], []
    for t in range(steps):
        decayed = xp.exp(g[:, t])[..., None] * state
        read = (k[:, t][..., None, :] @ decayed)[..., 0, :]
        written = b[:, t] * (v[:, t] - read)
        state = decayed + k[:, t][..., :, None] * written[..., None, :]
        outputs.append((q[:, t][..., None, :] @ state)[..., 0, :] / SIZE ** 0.5)
    return xp.stack(outputs, 1).reshape(1, steps, -1), state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1024)
    args = parser.parse_args()
    try:
        import torch
        torch.set_num_threads(2)
    except ImportError:
        torch = None
    print("| decay | mixrt chunked ms | NumPy token loop ms | PyTorch token loop ms | "
          "NumPy / mixrt | max abs diff |")
    print("|---|---|---|---|---|---|")
    for per_key in (False, True):
        feeds = {n: a.astype(np.float32) for n, a in inputs(args.steps, per_key).items()}
        session = mixrt_session(feeds)
        reference = recurrence(np, feeds)[0]
        diff = float(np.abs(session.run(["y"], feeds)[0] - reference).max())
        mixrt_ms = median_call_ms(lambda: session.run(None, feeds), args.runs)
        numpy_ms = median_call_ms(lambda: recurrence(np, feeds), args.runs)
        torch_ms = "–"
        if torch is not None:
            tensors = {n: torch.from_numpy(a) for n, a in feeds.items()}
            with torch.inference_mode():
                torch_ms = f"{median_call_ms(lambda: recurrence(torch, tensors), args.runs):.1f}"
        print(f"| {'per key' if per_key else 'per head'} | {mixrt_ms:.1f} | {numpy_ms:.1f} | "
              f"{torch_ms} | {numpy_ms / mixrt_ms:.2f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
