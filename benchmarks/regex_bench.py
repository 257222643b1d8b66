"""Regular expressions on the CPU: mixrt against onnxruntime, RegexFullMatch and Tokenizer.

    python benchmarks/regex_bench.py [--runs N]

Two tables. Hostile patterns (nested quantifiers that send a backtracking engine down every
path) over texts of 1 MB that fail at their last character, one text per run. Then
tokenization as a TF-IDF pipeline does it: 64 documents of ~225 words, each pattern as
Tokenizer's ``tokenexp``. Both runtimes run the same one-node models in this process,
host arrays in and out, median of ``--runs`` timed runs after two untimed; the outputs are
compared.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import mixrt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runners import median_call_ms  # noqa: E402

HOSTILE = ["(a+)+$", "(a|aa)+$", "(a|a?)+$", "(.*a){12}$", "(x+x+)+y", "(\\w+\\s?)+$"]
TOKENS = ["[a-zA-Z0-9_]+", "\\b\\w\\w+\\b", "\\w+", "[a-z]+(?:'[a-z]+)?", "\\pL+",
          "[^\\s,.]+"]
MEGABYTE = 1 << 20
WORDS = "the quick brown fox jumps over the lazy dog's back, and runs".split()


def _model(node, output_type) -> bytes:
    graph = helper.make_graph(
        [node], "regex", [helper.make_tensor_value_info("x", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("y", output_type, None)])
    return helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    ).SerializeToString()


def full_match(pattern: str) -> bytes:
    return _model(helper.make_node("RegexFullMatch", ["x"], ["y"], pattern=pattern),
                  TensorProto.BOOL)


def tokenizer(pattern: str) -> bytes:
    return _model(helper.make_node("Tokenizer", ["x"], ["y"], domain="com.microsoft",
                                   mark=0, mincharnum=1, pad_value="#", tokenexp=pattern),
                  TensorProto.STRING)


def texts(*values) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def documents(count: int, words: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return texts(*(" ".join(rng.choice(WORDS, words)) for _ in range(count)))


def timed(model: bytes, feeds: dict, runs: int) -> tuple[float, float, bool]:
    """(mixrt ms, onnxruntime ms, same outputs)."""
    ours = mixrt.Session(model)
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    same = ours.run(None, feeds)[0].tolist() == theirs.run(None, feeds)[0].tolist()
    return (median_call_ms(lambda: ours.run(None, feeds), runs, warm=2),
            median_call_ms(lambda: theirs.run(None, feeds), runs, warm=2), same)


def _cell(pattern: str) -> str:
    """A pattern inside a Markdown table cell (its | would end the cell)."""
    return pattern.replace("|", "\\|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    hostile = texts("a" * MEGABYTE + "!")
    print("| hostile pattern, 1 MB text | op | mixrt ms | onnxruntime ms | same answer |")
    print("|---|---|---:|---:|---|")
    for pattern in HOSTILE:
        for name, make in (("RegexFullMatch", full_match), ("Tokenizer", tokenizer)):
            ours, theirs, same = timed(make(pattern), {"x": hostile}, args.runs)
            print(f"| `{_cell(pattern)}` | {name} | {ours:.2f} | {theirs:.2f} | "
                  f"{'yes' if same else 'NO'} |")
    docs = documents(64, 225)
    print()
    print("| tokenexp, 64 documents of 225 words | mixrt ms | onnxruntime ms | mixrt/ort "
          "| same tokens |")
    print("|---|---:|---:|---:|---|")
    for pattern in TOKENS:
        ours, theirs, same = timed(tokenizer(pattern), {"x": docs}, args.runs)
        print(f"| `{_cell(pattern)}` | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f} | "
              f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
