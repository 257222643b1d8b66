"""Write tests/data/torch_exports/: small PyTorch models as PyTorch's two ONNX exporters write
them, with seeded inputs and PyTorch's own outputs (tests/test_torch_exports.py checks mixrt
against both PyTorch and onnxruntime on them).

Most ONNX models people bring to mixrt come from ``torch.onnx.export``. Its graphs have
patterns that hand-built test graphs lack. The TorchScript exporter writes Shape → Gather →
Concat → Reshape chains, LSTM with its weights reordered, and masked softmax through Where.
The torch.export exporter writes opset 18+ and its own decompositions. The models here are
tiny, so the files stay small enough to commit; their weights are PyTorch's seeded defaults.

Needs PyTorch and, for the torch.export exporter, onnxscript, neither of which mixrt
depends on:

    pip install torch onnxscript && python tools/export_torch_models.py
"""

from __future__ import annotations

import io
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "torch_exports"


# -- the models ---------------------------------------------------------------------------------

class MobileNetish(nn.Module):
    """MobileNet V2/V3 blocks: ReLU6 (Clip), depthwise convolution, an inverted residual,
    squeeze-and-excitation with Hardsigmoid, Hardswish, global pooling and a dense head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU6())
        self.expand = nn.Sequential(nn.Conv2d(8, 24, 1, bias=False), nn.BatchNorm2d(24),
                                    nn.ReLU6())
        self.depthwise = nn.Sequential(nn.Conv2d(24, 24, 3, 1, 1, groups=24, bias=False),
                                       nn.BatchNorm2d(24), nn.Hardswish())
        self.squeeze = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(24, 6, 1), nn.ReLU(),
                                     nn.Conv2d(6, 24, 1), nn.Hardsigmoid())
        self.project = nn.Sequential(nn.Conv2d(24, 8, 1, bias=False), nn.BatchNorm2d(8))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
                                  nn.Linear(8, 10))

    def forward(self, x):
        x = self.stem(x)
        h = self.depthwise(self.expand(x))
        x = x + self.project(h * self.squeeze(h))
        return self.head(x)


class UNetish(nn.Module):
    """An encoder-decoder: max pooling, a transposed convolution, skip concatenation and
    both interpolation modes (Resize nearest and bilinear, half-pixel)."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, padding=1)
        self.bottom = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.fuse = nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, x):
        skip = F.relu(self.down(x))
        bottom = F.relu(self.bottom(F.max_pool2d(skip, 2)))
        x = self.fuse(torch.cat([self.up(bottom), skip], dim=1))
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        return torch.sigmoid(F.interpolate(x, scale_factor=0.5, mode="nearest"))


class LSTMClassifier(nn.Module):
    """Token ids → embedding → two bidirectional LSTM layers → the last step → classes."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.lstm = nn.LSTM(16, 12, num_layers=2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(24, 5)

    def forward(self, tokens):
        states, _ = self.lstm(self.embed(tokens))
        return self.out(states[:, -1])


class GRUTagger(nn.Module):
    """A GRU over a sequence, a tag per step, log-probabilities."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 12, batch_first=True)
        self.tag = nn.Linear(12, 4)

    def forward(self, x):
        states, _ = self.gru(x)
        return F.log_softmax(self.tag(states), dim=-1)


class TinyViT(nn.Module):
    """Patches by a strided convolution, a class token, learned positions, two pre-norm
    transformer encoder layers with GELU, and a head on the class token."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 4, stride=4)
        self.cls = nn.Parameter(torch.randn(1, 1, 32) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 17, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


class MaskedAttention(nn.Module):
    """Attention written out by hand with a key padding mask (masked_fill with -inf, so a
    fully masked row would be NaN: the inputs keep one key per row) and positions from
    ``arange(seq)``, so the sequence length stays dynamic."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.position = nn.Embedding(32, 16)
        self.out = nn.Linear(16, 16)

    def forward(self, x, mask):
        x = x + self.position(torch.arange(x.shape[1]))
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / 4.0
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        return self.out(torch.softmax(scores, dim=-1) @ v)


class GrabBag(nn.Module):
    """Operators exporters spell in more than one way: cumsum, topk, gather, argmax, where,
    clamp, pow, rsqrt, einsum, group and instance norm, pixel shuffle, reflect padding, a
    dilated 1-D convolution, ceil-mode average pooling without padding counted, variance,
    and the tanh GELU, SiLU, Mish and Softplus activations."""

    def __init__(self):
        super().__init__()
        self.group = nn.GroupNorm(2, 8)
        self.instance = nn.InstanceNorm2d(8, affine=True)
        self.conv1d = nn.Conv1d(8, 8, 3, dilation=2, padding=2)
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, x):  # x: (2, 8, 6, 6)
        y = self.instance(self.group(x))
        y = F.pad(y, (1, 1, 1, 1), mode="reflect")
        y = F.avg_pool2d(y, 3, stride=2, ceil_mode=True, count_include_pad=False)
        seq = self.conv1d(y.flatten(2))
        values, indices = seq.topk(3, dim=-1)
        picked = torch.gather(seq, 2, indices)
        mixed = torch.einsum("bcs,bds->bcd", seq, seq) * torch.rsqrt(
            seq.var(dim=-1, keepdim=True) + 1e-3)
        shuffled = self.shuffle(x[:, :, :4, :4])
        summary = torch.cat([values.flatten(1), picked.flatten(1), mixed.flatten(1),
                             shuffled.flatten(1),
                             seq.cumsum(-1).flatten(1)], dim=1)
        summary = torch.where(summary > 0, F.gelu(summary, approximate="tanh"),
                              F.silu(summary)) + F.mish(summary) + F.softplus(summary)
        best = summary.argmax(dim=1, keepdim=True).float()
        return summary.clamp(-3.0, 3.0).pow(2), best


class DynamicReshape(nn.Module):
    """Shapes read at run time: a view by x's own size, expand, repeat along a dynamic
    axis, and a mean over a flattened range."""

    def forward(self, x):  # x: (batch, seq, 8)
        batch, seq = x.shape[0], x.shape[1]
        heads = x.view(batch, seq, 2, 4).transpose(1, 2)
        scale = torch.arange(1, seq + 1, dtype=x.dtype).view(1, 1, seq, 1)
        y = (heads * scale).reshape(batch, -1)
        return y.unsqueeze(1).expand(batch, 2, y.shape[1]).mean(dim=1), x.repeat(1, 2, 1)


# -- one case per (model, exporter) --------------------------------------------------------------

def _cases():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (2, 7), generator=g)
    mask = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    return {
        "mobilenetish": (MobileNetish, {"x": torch.randn(2, 3, 32, 32, generator=g)},
                         {"x": {0: "batch"}}),
        "unetish": (UNetish, {"x": torch.randn(1, 3, 16, 16, generator=g)}, {}),
        "lstm_classifier": (LSTMClassifier, {"tokens": tokens}, {"tokens": {0: "batch"}}),
        "gru_tagger": (GRUTagger, {"x": torch.randn(2, 6, 8, generator=g)},
                       {"x": {0: "batch", 1: "seq"}}),
        "tiny_vit": (TinyViT, {"x": torch.randn(2, 3, 16, 16, generator=g)},
                     {"x": {0: "batch"}}),
        "masked_attention": (MaskedAttention, {"x": torch.randn(2, 5, 16, generator=g),
                                               "mask": mask},
                             {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}),
        "grab_bag": (GrabBag, {"x": torch.randn(2, 8, 6, 6, generator=g)}, {}),
        "dynamic_reshape": (DynamicReshape, {"x": torch.randn(3, 5, 8, generator=g)},
                            {"x": {0: "batch", 1: "seq"}}),
    }


def _model(make) -> nn.Module:
    torch.manual_seed(1)
    model = make()
    for module in model.modules():  # running statistics a trained model would have
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 1.5)
    return model.eval()


def _export(model, inputs: dict, dynamic: dict, exporter: str) -> bytes:
    args = tuple(inputs.values())
    names = list(inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buffer = io.BytesIO()
            torch.onnx.export(model, args, buffer, dynamo=False, opset_version=17,
                              input_names=names, dynamic_axes=dynamic or None,
                              do_constant_folding=True)
            return buffer.getvalue()
        shapes = {name: {axis: torch.export.Dim.AUTO for axis in axes}
                  for name, axes in dynamic.items()} or None
        program = torch.onnx.export(model, args, dynamo=True, input_names=names,
                                    dynamic_shapes=shapes, optimize=True, verbose=False)
        return program.model_proto.SerializeToString()


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    made, failed = [], {}
    for name, (make, inputs, dynamic) in _cases().items():
        model = _model(make)
        with torch.no_grad():
            expected = model(*inputs.values())
        expected = expected if isinstance(expected, tuple) else (expected,)
        for exporter in ("torchscript", "dynamo"):
            stem = f"{name}.{exporter}"
            try:
                data = _export(model, inputs, dynamic, exporter)
                onnx.checker.check_model(onnx.load_from_string(data), full_check=True)
            except Exception as exc:  # noqa: BLE001 (an exporter's limits, recorded)
                failed[stem] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                continue
            (OUT / f"{stem}.onnx").write_bytes(data)
            arrays = {f"input:{k}": v.numpy() for k, v in inputs.items()}
            arrays.update({f"output:{i}": v.numpy() for i, v in enumerate(expected)})
            np.savez(OUT / f"{stem}.npz", **arrays)
            made.append(stem)
            print(f"{stem}: {len(data) / 1024:.0f} KB")
    (OUT / "MANIFEST.json").write_text(json.dumps(
        {"torch": torch.__version__, "made": made, "exporter_failures": failed}, indent=1)
        + "\n")
    for stem, why in failed.items():
        print(f"{stem}: not exported ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
