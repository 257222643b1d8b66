"""Resize forward on the CPU: mixrt against onnxruntime on one-node Resize-19 models.

    python benchmarks/resize_bench.py [--runs N]

Each case is a one-node model (float32, scales given, X the only feed); both runtimes run it
in this process, host arrays in and out, median of ``--runs`` timed runs after two untimed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import mixrt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runners import median_call_ms  # noqa: E402

# (label, input shape, scales, attributes)
CASES = [
    ("(1,3,224,224)->448 linear", (1, 3, 224, 224), (1, 1, 2, 2), dict(mode="linear")),
    ("(1,3,224,224)->448 cubic", (1, 3, 224, 224), (1, 1, 2, 2), dict(mode="cubic")),
    ("(1,3,224,224)->448 nearest", (1, 3, 224, 224), (1, 1, 2, 2), dict(mode="nearest")),
    ("(1,64,56,56) x2 linear", (1, 64, 56, 56), (1, 1, 2, 2), dict(mode="linear")),
    ("(8,3,64,64) x0.5 linear antialias", (8, 3, 64, 64), (1, 1, 0.5, 0.5),
     dict(mode="linear", antialias=1)),
]


def one_node_model(shape, scales, attributes) -> onnx.ModelProto:
    node = helper.make_node("Resize", ["X", "", "scales"], ["Y"], **attributes)
    graph = helper.make_graph(
        [node], "resize", [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("scales", TensorProto.FLOAT, [len(scales)], scales)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)],
                             ir_version=9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| case | mixrt ms | onnxruntime ms | mixrt/ort | max abs diff |")
    print("|---|---|---|---|---|")
    for label, shape, scales, attributes in CASES:
        model = one_node_model(shape, scales, attributes).SerializeToString()
        x = rng.standard_normal(shape, dtype=np.float32)
        ours = mixrt.Session(model)
        theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        diff = float(np.abs(ours.run(None, {"X": x})[0] - theirs.run(None, {"X": x})[0]).max())
        a = median_call_ms(lambda: ours.run(None, {"X": x}), args.runs, warm=2)
        b = median_call_ms(lambda: theirs.run(None, {"X": x}), args.runs, warm=2)
        print(f"| {label} | {a:.2f} | {b:.2f} | {a / b:.2f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
