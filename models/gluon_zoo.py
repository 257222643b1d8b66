"""The model zoo as Gluon HybridBlocks built from ``mixrt.gluon.nn``: the same networks
as the ``mixrt.sym`` zoo beside it (``mlp``, ``lenet``, ``resnet``, ``transformer``), so they
run imperatively, hybridize, train with autograd and export to ONNX.

    net = get_model("resnet18_v1", classes=10, thumbnail=True)
    net.initialize(mixrt.initializer.Xavier())
    net.hybridize()

Every layer is given its input width, so parameter shapes are known before the first call
(``count_parameters`` works on a fresh network, without running it).
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.base.errors import InputError
from mixrt.gluon import HybridBlock, nn


def count_parameters(block) -> int:
    """Trainable values (BatchNorm's running statistics are state, not parameters)."""
    return sum(int(np.prod(p.shape)) for p in block.collect_params().values()
               if p.grad_req != "null")


class MLP(HybridBlock):
    """(N, in_units...) -> Dense + ReLU per hidden width -> Dense(classes) logits."""

    def __init__(self, hidden=(1024, 1024), classes: int = 10, in_units: int = 0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            width = in_units
            for units in hidden:
                self.features.add(nn.Dense(units, activation="relu", in_units=width))
                width = units
            self.output = nn.Dense(classes, in_units=width)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


class LeNet(HybridBlock):
    """Two 5x5 convolutions (6, 16 channels) with ReLU and 2x2 max pooling, then dense
    layers of 120 and 84 units; ``padding`` 2 keeps small inputs from vanishing."""

    def __init__(self, classes: int = 10, in_channels: int = 1, padding: int = 0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            for channels, cin in ((6, in_channels), (16, 6)):
                self.features.add(nn.Conv2D(channels, 5, padding=padding, activation="relu",
                                            in_channels=cin),
                                  nn.MaxPool2D(2, 2))
            self.features.add(nn.Flatten(), nn.Dense(120, activation="relu"),
                              nn.Dense(84, activation="relu", in_units=120))
            self.output = nn.Dense(classes, in_units=84)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


# -- ResNet v1 --------------------------------------------------------------------------------

RESNET_SPECS = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)),
                50: ("bottleneck", (3, 4, 6, 3)), 101: ("bottleneck", (3, 4, 23, 3)),
                152: ("bottleneck", (3, 8, 36, 3))}
RESNET_WIDTHS = (64, 128, 256, 512)


def _conv_bn(channels, kernel, in_channels, stride=1, relu=True):
    """Conv (no bias: the BatchNorm's beta is the shift) + BatchNorm (+ ReLU)."""
    layers = [nn.Conv2D(channels, kernel, strides=stride, padding=kernel // 2,
                        use_bias=False, in_channels=in_channels),
              nn.BatchNorm(in_channels=channels)]
    if relu:
        layers.append(nn.Activation("relu"))
    return layers


class _Residual(HybridBlock):
    """``relu(body(x) + shortcut(x))``; the shortcut is a strided 1x1 conv + BatchNorm
    where the shape changes."""

    expansion = 1

    def __init__(self, in_channels: int, mid: int, stride: int, **kwargs):
        super().__init__(**kwargs)
        out = mid * self.expansion
        with self.name_scope():
            self.body = nn.HybridSequential(prefix="")
            self.body.add(*self._body_layers(in_channels, mid, stride))
            self.downsample = None
            if stride != 1 or in_channels != out:
                self.downsample = nn.HybridSequential(prefix="")
                self.downsample.add(*_conv_bn(out, 1, in_channels, stride, relu=False))

    def hybrid_forward(self, F, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.Relu(self.body(x) + shortcut)


class BasicBlockV1(_Residual):
    """Two 3x3 convolutions (ResNet-18/34)."""

    def _body_layers(self, cin, mid, stride):
        return [*_conv_bn(mid, 3, cin, stride), *_conv_bn(mid, 3, mid, relu=False)]


class BottleneckV1(_Residual):
    """1x1 reduce, 3x3, 1x1 expand by 4 (ResNet-50+). The stride sits on the 3x3, as in
    torchvision; the parameter count does not depend on where it sits."""

    expansion = 4

    def _body_layers(self, cin, mid, stride):
        return [*_conv_bn(mid, 1, cin), *_conv_bn(mid, 3, mid, stride),
                *_conv_bn(mid * 4, 1, mid, relu=False)]


class ResNetV1(HybridBlock):
    """ResNet v1 (He et al. 2016) with BatchNorm after every convolution. ``thumbnail``:
    a 3x3 stride-1 stem and no max pooling, for 32x32 inputs (CIFAR)."""

    def __init__(self, depth: int = 18, classes: int = 1000, thumbnail: bool = False,
                 in_channels: int = 3, **kwargs):
        if depth not in RESNET_SPECS:
            raise InputError(f"ResNetV1: depth {depth} is not one of {sorted(RESNET_SPECS)}")
        super().__init__(**kwargs)
        kind, counts = RESNET_SPECS[depth]
        unit = BasicBlockV1 if kind == "basic" else BottleneckV1
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            if thumbnail:
                self.features.add(*_conv_bn(64, 3, in_channels))
            else:
                self.features.add(*_conv_bn(64, 7, in_channels, stride=2),
                                  nn.MaxPool2D(3, 2, padding=1))
            width = 64
            for stage, (count, mid) in enumerate(zip(counts, RESNET_WIDTHS)):
                for index in range(count):
                    stride = 2 if index == 0 and stage > 0 else 1
                    self.features.add(unit(width, mid, stride,
                                           prefix=f"stage{stage + 1}_unit{index + 1}_"))
                    width = mid * unit.expansion
            self.features.add(nn.GlobalAvgPool2D(), nn.Flatten())
            self.output = nn.Dense(classes, in_units=width)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


# -- Transformer encoder ------------------------------------------------------------------------

class MultiHeadAttention(HybridBlock):
    """Scaled dot-product self-attention over (N, S, hidden) with ``heads`` heads."""

    def __init__(self, hidden: int, heads: int, dropout: float = 0.0, **kwargs):
        if hidden % heads:
            raise InputError(f"MultiHeadAttention: hidden {hidden} is not divisible by heads "
                             f"{heads}")
        super().__init__(**kwargs)
        self._hidden, self._heads = hidden, heads
        with self.name_scope():
            self.query, self.key, self.value, self.proj = (
                nn.Dense(hidden, flatten=False, in_units=hidden, prefix=f"{name}_")
                for name in ("query", "key", "value", "out"))
            self.dropout = nn.Dropout(dropout)

    def hybrid_forward(self, F, x):
        head_dim = self._hidden // self._heads

        def split_heads(layer):  # (N, S, hidden) -> (N, heads, S, head_dim)
            return F.Transpose(layer(x).reshape((0, 0, self._heads, head_dim)),
                               perm=[0, 2, 1, 3])

        query, key, value = split_heads(self.query), split_heads(self.key), \
            split_heads(self.value)
        scores = F.MatMul(query, F.Transpose(key, perm=[0, 1, 3, 2])) * \
            (1.0 / math.sqrt(head_dim))
        weights = self.dropout(F.Softmax(scores, axis=-1))
        context = F.Transpose(F.MatMul(weights, value), perm=[0, 2, 1, 3])
        return self.proj(context.reshape((0, 0, self._hidden)))


class EncoderLayer(HybridBlock):
    """Post-norm (BERT's layout): attention and a GELU feed-forward block, each added
    back to its input and layer-normalized."""

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.attention = MultiHeadAttention(hidden, heads, dropout, prefix="attention_")
            self.attention_norm = nn.LayerNorm(in_channels=hidden, prefix="attention_norm_")
            self.ffn = nn.HybridSequential(prefix="ffn_")
            with self.ffn.name_scope():
                self.ffn.add(nn.Dense(ffn, flatten=False, in_units=hidden), nn.GELU(),
                             nn.Dense(hidden, flatten=False, in_units=ffn),
                             nn.Dropout(dropout))
            self.ffn_norm = nn.LayerNorm(in_channels=hidden, prefix="ffn_norm_")

    def hybrid_forward(self, F, x):
        x = self.attention_norm(x + self.attention(x))
        return self.ffn_norm(x + self.ffn(x))


class TransformerEncoder(HybridBlock):
    """(N, S, hidden) features -> (N, S, hidden) through ``layers`` encoder layers."""

    def __init__(self, layers: int = 2, hidden: int = 64, heads: int = 4,
                 ffn: int | None = None, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.layers = nn.HybridSequential(prefix="")
            for index in range(layers):
                self.layers.add(EncoderLayer(hidden, heads, ffn or 4 * hidden, dropout,
                                             prefix=f"layer{index}_"))

    def hybrid_forward(self, F, x):
        return self.layers(x)


# -- by name ------------------------------------------------------------------------------------

def _resnet(depth):
    return lambda **kwargs: ResNetV1(depth, **kwargs)


_MODELS = {"mlp": MLP, "lenet": LeNet, "resnet18_v1": _resnet(18),
           "resnet34_v1": _resnet(34), "resnet50_v1": _resnet(50),
           "transformer_encoder": TransformerEncoder}


def get_model(name: str, **kwargs) -> HybridBlock:
    """A zoo network by name (uninitialized): see ``_MODELS`` for the names."""
    if name not in _MODELS:
        raise InputError(f"get_model: unknown model {name!r}; valid names: "
                         f"{', '.join(sorted(_MODELS))}")
    return _MODELS[name](**kwargs)
