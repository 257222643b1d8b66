"""The models the serving benchmarks serve (``serve_bench.py``, ``serve_memory.py``): exported
once with torch's TorchScript exporter (opset 17, the batch axis symbolic), compiled with
``mixrt compile``, and cached under ``benchmarks/.cache/serve/``.

* ``resnet50``: torchvision's ResNet-50 with random (seeded) weights, input ``x``
  (batch, 3, 224, 224) float32, output ``y`` (batch, 1000);
* ``bert``: a transformers ``BertModel`` from a small config (hidden 256, 4 layers, 4 heads,
  intermediate 1024, 64 tokens), inputs ``input_ids`` and ``attention_mask`` (batch, 64)
  int64, outputs ``last_hidden_state`` (batch, 64, 256) and ``pooler_output`` (batch, 256);
* ``bert_dynseq`` (:data:`SEQUENCE_VARIANTS`): the same weights with the sequence axis
  symbolic too (``sequence``: 1 to the 512 positions), for requests of any length; a
  variant beside ``bert``, so that ``bert``'s graph, and the figures taken on it, stay as they
  were.

Each request the benchmarks send carries one row (:func:`request_feeds`).
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache" / "serve"
OPSET = 17
MAX_IR_VERSION = 10  # what the onnxruntime and onnx of this venv read without complaint
BERT = {"hidden": 256, "layers": 4, "heads": 4, "intermediate": 1024, "seq": 64,
        "vocab": 30522}


@dataclass(frozen=True)
class ServeModel:
    name: str
    onnx: Path
    mxr: Path
    inputs: dict  # name -> (shape past the batch axis, numpy dtype, triton datatype)
    max_length: int = 0  # where the sequence axis (None in inputs) is symbolic: its longest


def _seeded_torch():
    import torch  # noqa: PLC0415
    torch.manual_seed(0)
    return torch


def _export(module, args: tuple, path: Path, inputs: list, outputs: list,
            sequence_of: tuple = ()) -> None:
    """Export with the batch axis symbolic, and axis 1 of the names in ``sequence_of``."""
    torch = _seeded_torch()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    axes = {name: {0: "batch", **({1: "sequence"} if name in sequence_of else {})}
            for name in inputs + outputs}
    with torch.inference_mode(), warnings.catch_warnings():
        # the TorchScript exporter is deprecated, but gives plain opset-17 graphs
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(partial), dynamo=False,
                          opset_version=OPSET, input_names=inputs, output_names=outputs,
                          dynamic_axes=axes)
    import onnx  # noqa: PLC0415
    model = onnx.load(str(partial))
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
        onnx.save(model, str(partial))
    partial.replace(path)  # a killed export never leaves a half-written cache entry


def _compile(onnx_path: Path, mxr: Path) -> None:
    if mxr.exists() and mxr.stat().st_mtime >= onnx_path.stat().st_mtime:
        return
    partial = mxr.with_suffix(".partial.mxr")
    subprocess.run([sys.executable, "-m", "mixrt", "compile", str(onnx_path), "-o",
                    str(partial)], check=True, stdout=subprocess.DEVNULL)
    partial.replace(mxr)


def resnet50() -> ServeModel:
    onnx_path = CACHE / f"resnet50_op{OPSET}.onnx"
    if not onnx_path.exists():
        torch = _seeded_torch()
        import torchvision  # noqa: PLC0415
        module = torchvision.models.resnet50(weights=None)
        _export(module, (torch.randn(1, 3, 224, 224),), onnx_path, ["x"], ["y"])
    model = ServeModel("resnet50", onnx_path, onnx_path.with_suffix(".mxr"),
                       {"x": ((3, 224, 224), np.float32, "FP32")})
    _compile(model.onnx, model.mxr)
    return model


def bert() -> ServeModel:
    return _bert(symbolic_sequence=False)


def bert_dynseq() -> ServeModel:
    return _bert(symbolic_sequence=True)


def _bert(symbolic_sequence: bool) -> ServeModel:
    b = BERT
    positions = max(512, b["seq"])
    length = "dynseq" if symbolic_sequence else f"s{b['seq']}"
    stem = f"bert_h{b['hidden']}_l{b['layers']}_a{b['heads']}_{length}_op{OPSET}"
    onnx_path = CACHE / f"{stem}.onnx"
    if not onnx_path.exists():
        torch = _seeded_torch()
        import transformers  # noqa: PLC0415
        config = transformers.BertConfig(
            vocab_size=b["vocab"], hidden_size=b["hidden"], num_hidden_layers=b["layers"],
            num_attention_heads=b["heads"], intermediate_size=b["intermediate"],
            max_position_embeddings=positions, attn_implementation="eager")
        bert_module = transformers.BertModel(config).eval()

        class Encoder(torch.nn.Module):  # plain tuple out, no ModelOutput
            def __init__(self):
                super().__init__()
                self.bert = bert_module

            def forward(self, input_ids, attention_mask):
                out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                                return_dict=True)
                return out.last_hidden_state, out.pooler_output

        ids = torch.randint(0, b["vocab"], (1, b["seq"]), dtype=torch.int64)
        mask = torch.ones((1, b["seq"]), dtype=torch.int64)
        _export(Encoder(), (ids, mask), onnx_path, ["input_ids", "attention_mask"],
                ["last_hidden_state", "pooler_output"],
                sequence_of=("input_ids", "attention_mask", "last_hidden_state")
                if symbolic_sequence else ())
    sequence = None if symbolic_sequence else b["seq"]
    model = ServeModel("bert_dynseq" if symbolic_sequence else "bert", onnx_path,
                       onnx_path.with_suffix(".mxr"),
                       {"input_ids": ((sequence,), np.int64, "INT64"),
                        "attention_mask": ((sequence,), np.int64, "INT64")},
                       max_length=positions if symbolic_sequence else 0)
    _compile(model.onnx, model.mxr)
    return model


MODELS = {"resnet50": resnet50, "bert": bert}
SEQUENCE_VARIANTS = {"bert": bert_dynseq}  # a model of MODELS with its sequence axis symbolic


def request_feeds(model: ServeModel, rows: int = 1, seed: int = 0,
                  length: int = BERT["seq"]) -> dict:
    """One request's inputs: ``rows`` rows of seeded data (token ids below the vocabulary
    size, an attention mask with the last quarter of each row padded), ``length`` long on a
    symbolic sequence axis."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (shape, dtype, _) in model.inputs.items():
        full = (rows, *(length if size is None else size for size in shape))
        if name == "input_ids":
            feeds[name] = rng.integers(0, BERT["vocab"], full).astype(dtype)
        elif name == "attention_mask":
            mask = np.ones(full, dtype)
            mask[:, full[1] * 3 // 4:] = 0
            feeds[name] = mask
        else:
            feeds[name] = rng.standard_normal(full).astype(dtype)
    return feeds
