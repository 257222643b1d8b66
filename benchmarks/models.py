"""The two benchmark models built with PyTorch: a BERT-base-shaped encoder and an MLP.

    python benchmarks/models.py [--check]      # export both (cached), optionally verify

The zoo models are convolutional; these two cover what services mostly run today: dense
layers and attention. Both are built from seeded random weights in eval mode and exported
with torch's TorchScript exporter (``dynamo=False``) with a symbolic batch axis, so one .onnx
serves batch 1 and batch 8. Exports are cached in ``benchmarks/.cache/`` (gitignored; the
encoder is ~340 MB of weights) and rebuilt when missing.

The encoder takes float embeddings ``(batch, 128, 768)``, not token ids: the embedding lookup
is one Gather and would only add noise, while every one of the 12 layers is what we measure.
It has no attention mask (every position attends to every other), like a packed batch.

torch is a benchmark-only dependency (``pip install torch==2.13.0``); mixrt never imports it.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CACHE = Path(__file__).resolve().parent / ".cache"
OPSET = 17


@dataclass(frozen=True)
class BertShape:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    ffn: int = 3072
    seq: int = 128


@dataclass(frozen=True)
class MlpShape:
    sizes: tuple[int, ...] = (784, 2048, 2048, 10)


@dataclass
class TorchModel:
    """A benchmark model: its exported file, the torch module it came from, and its input."""

    name: str
    path: Path
    module: object  # torch.nn.Module, eval mode
    input_name: str
    make_input: object  # batch -> np.ndarray (float32, deterministic)

    def feeds(self, batch: int) -> dict[str, np.ndarray]:
        return {self.input_name: self.make_input(batch)}


# -- module definitions (torch imported lazily: importing this file must not need it) -----

def _encoder_layer_class():
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415

    class EncoderLayer(nn.Module):
        """Post-LayerNorm BERT layer written out op by op, so the export is plain MatMul,
        Softmax, Erf and LayerNormalization rather than torch's fused fast path."""

        def __init__(self, shape: BertShape):
            super().__init__()
            self.heads, self.head_dim = shape.heads, shape.hidden // shape.heads
            # separate projections as in BERT itself (one fused qkv Linear would export as
            # Slice/Shape/Mod arithmetic that no BERT checkpoint has)
            self.query = nn.Linear(shape.hidden, shape.hidden)
            self.key = nn.Linear(shape.hidden, shape.hidden)
            self.value = nn.Linear(shape.hidden, shape.hidden)
            self.proj = nn.Linear(shape.hidden, shape.hidden)
            self.norm1 = nn.LayerNorm(shape.hidden, eps=1e-12)
            self.up = nn.Linear(shape.hidden, shape.ffn)
            self.down = nn.Linear(shape.ffn, shape.hidden)
            self.norm2 = nn.LayerNorm(shape.hidden, eps=1e-12)

        def forward(self, x):
            # split heads the way BERT's own code does (view to size()[:-1] + (heads, dim)),
            # so the export carries the same Shape/Slice/Concat arithmetic real exports do
            split = x.size()[:-1] + (self.heads, self.head_dim)
            q, k, v = (proj(x).view(split).transpose(1, 2)
                       for proj in (self.query, self.key, self.value))
            scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(self.head_dim))
            context = torch.softmax(scores, dim=-1) @ v
            x = self.norm1(x + self.proj(context.transpose(1, 2).flatten(2)))
            ffn = self.down(nn.functional.gelu(self.up(x)))
            return self.norm2(x + ffn)

    return EncoderLayer


def build_bert(shape: BertShape = BertShape(), seed: int = 0):
    import torch  # noqa: PLC0415
    torch.manual_seed(seed)
    layer = _encoder_layer_class()
    module = torch.nn.Sequential(*(layer(shape) for _ in range(shape.layers)))
    return module.eval()


def build_mlp(shape: MlpShape = MlpShape(), seed: int = 0):
    import torch  # noqa: PLC0415
    torch.manual_seed(seed)
    layers = []
    for fan_in, fan_out in zip(shape.sizes, shape.sizes[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).eval()  # logits: no ReLU after the last layer


# -- inputs: deterministic, different per batch row so a batch bug cannot hide ----------

def _ramp(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape, dtype=np.float32)


def bert_input(batch: int, shape: BertShape = BertShape(), seed: int = 1) -> np.ndarray:
    return _ramp((batch, shape.seq, shape.hidden), seed)


def mlp_input(batch: int, shape: MlpShape = MlpShape(), seed: int = 1) -> np.ndarray:
    return _ramp((batch, shape.sizes[0]), seed)


# -- export --------------------------------------------------------------------------------

def export(module, example: np.ndarray, path: Path) -> Path:
    """Export ``module`` to ``path`` (opset 17, batch axis symbolic) unless it is cached."""
    if path.exists():
        return path
    import torch  # noqa: PLC0415
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with torch.inference_mode(), warnings.catch_warnings():
        # the TorchScript exporter is deprecated but still the one that gives plain opset-17
        # graphs without onnxscript; its deprecation notice is noise here
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, (torch.from_numpy(example),), str(partial), dynamo=False,
                          input_names=["x"], output_names=["y"], opset_version=OPSET,
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    partial.replace(path)  # a killed export never leaves a half-written cache entry
    return path


def bert_model(shape: BertShape = BertShape()) -> TorchModel:
    module = build_bert(shape)
    name = f"bert_l{shape.layers}_h{shape.hidden}_s{shape.seq}_op{OPSET}.onnx"
    path = export(module, bert_input(1, shape), CACHE / name)
    return TorchModel("bert_encoder", path, module, "x", lambda b: bert_input(b, shape))


def mlp_model(shape: MlpShape = MlpShape()) -> TorchModel:
    module = build_mlp(shape)
    name = "mlp_" + "-".join(map(str, shape.sizes)) + f"_op{OPSET}.onnx"
    path = export(module, mlp_input(1, shape), CACHE / name)
    return TorchModel("mlp", path, module, "x", lambda b: mlp_input(b, shape))


TORCH_MODELS = {"mlp": mlp_model, "bert_encoder": bert_model}


def torch_outputs(model: TorchModel, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import torch  # noqa: PLC0415
    with torch.inference_mode():
        out = model.module(torch.from_numpy(feeds[model.input_name]))
    return [out.numpy()]


# -- self-check ---------------------------------------------------------------------------

def check(model: TorchModel, batch: int) -> dict[str, float]:
    """Max abs error of mixrt and onnxruntime against torch on one deterministic input."""
    import onnxruntime as ort  # noqa: PLC0415

    import mixrt  # noqa: PLC0415
    feeds = model.feeds(batch)
    expected = torch_outputs(model, feeds)[0]
    ort_out = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"]) \
        .run(None, feeds)[0]
    ours = mixrt.Session(str(model.path)).run(None, feeds)[0]
    return {"mixrt_vs_torch": float(np.max(np.abs(ours - expected))),
            "ort_vs_torch": float(np.max(np.abs(ort_out - expected))),
            "mixrt_vs_ort": float(np.max(np.abs(ours - ort_out)))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare mixrt, ort and torch")
    parser.add_argument("--models", nargs="*", default=list(TORCH_MODELS))
    args = parser.parse_args(argv)
    for name in args.models:
        model = TORCH_MODELS[name]()
        print(f"{name}: {model.path} ({model.path.stat().st_size / 2**20:.1f} MiB)")
        if args.check:
            for batch in (1, 8):
                errors = ", ".join(f"{k} {v:.2e}" for k, v in check(model, batch).items())
                print(f"  batch {batch}: max abs err {errors}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
