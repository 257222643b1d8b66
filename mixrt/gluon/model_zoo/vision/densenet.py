"""DenseNet (Huang et al., 2016) as MXNet 1.x's Gluon model zoo builds it: dense blocks
(``stage1_`` ... ``stage4_``) whose layers each append ``growth_rate`` channels to their
input, transitions halving channels and resolution between blocks, and a
Dense(``classes``) classifier named ``output``."""

from __future__ import annotations

from mixrt.base.errors import InputError
from mixrt.gluon import nn
from mixrt.gluon.contrib.nn import HybridConcurrent, Identity
from mixrt.gluon.hybrid import HybridBlock
from mixrt.gluon.model_zoo.model_store import load_pretrained

__all__ = ["DenseNet", "densenet121", "densenet161", "densenet169", "densenet201",
           "get_densenet"]


def _dense_layer(growth_rate: int, bn_size: int, dropout: float):
    """BN-ReLU-1x1 conv (bottleneck to ``bn_size * growth_rate``) then BN-ReLU-3x3 conv to
    ``growth_rate`` channels, concatenated after the layer's input."""
    new_features = nn.HybridSequential(prefix="")
    new_features.add(nn.BatchNorm(), nn.Activation("relu"),
                     nn.Conv2D(bn_size * growth_rate, kernel_size=1, use_bias=False),
                     nn.BatchNorm(), nn.Activation("relu"),
                     nn.Conv2D(growth_rate, kernel_size=3, padding=1, use_bias=False))
    if dropout:
        new_features.add(nn.Dropout(dropout))
    out = HybridConcurrent(axis=1, prefix="")
    out.add(Identity(), new_features)
    return out


def _dense_block(layers: int, bn_size: int, growth_rate: int, dropout: float, index: int):
    block = nn.HybridSequential(prefix=f"stage{index}_")
    with block.name_scope():
        for _ in range(layers):
            block.add(_dense_layer(growth_rate, bn_size, dropout))
    return block


def _transition(channels: int):
    out = nn.HybridSequential(prefix="")
    out.add(nn.BatchNorm(), nn.Activation("relu"),
            nn.Conv2D(channels, kernel_size=1, use_bias=False),
            nn.AvgPool2D(pool_size=2, strides=2))
    return out


class DenseNet(HybridBlock):
    """A 7x7 stem of ``num_init_features`` channels, then ``block_config[i]`` dense layers
    in block i; ``bn_size``: the bottleneck's width in multiples of ``growth_rate``."""

    def __init__(self, num_init_features: int, growth_rate: int, block_config,
                 bn_size: int = 4, dropout: float = 0, classes: int = 1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(nn.Conv2D(num_init_features, kernel_size=7, strides=2,
                                        padding=3, use_bias=False),
                              nn.BatchNorm(), nn.Activation("relu"),
                              nn.MaxPool2D(pool_size=3, strides=2, padding=1))
            channels = num_init_features
            for i, layers in enumerate(block_config):
                self.features.add(_dense_block(layers, bn_size, growth_rate, dropout, i + 1))
                channels += layers * growth_rate
                if i != len(block_config) - 1:
                    channels //= 2
                    self.features.add(_transition(channels))
            self.features.add(nn.BatchNorm(), nn.Activation("relu"), nn.AvgPool2D(pool_size=7),
                              nn.Flatten())
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


# depth -> (stem channels, growth rate, layers per dense block)
DENSENET_SPEC = {121: (64, 32, (6, 12, 24, 16)), 161: (96, 48, (6, 12, 36, 24)),
                 169: (64, 32, (6, 12, 32, 32)), 201: (64, 32, (6, 12, 48, 32))}


def get_densenet(num_layers: int, pretrained: bool = False, ctx=None,
                 root: str | None = None, **kwargs):
    """DenseNet of depth ``num_layers`` (121, 161, 169 or 201); ``kwargs`` go to the
    network."""
    if num_layers not in DENSENET_SPEC:
        raise InputError(f"get_densenet: num_layers must be one of {sorted(DENSENET_SPEC)}, "
                         f"got {num_layers!r}")
    net = DenseNet(*DENSENET_SPEC[num_layers], **kwargs)
    if pretrained:
        load_pretrained(net, f"densenet{num_layers}", ctx, root)
    return net


def _named(depth: int):
    def build(**kwargs):
        return get_densenet(depth, **kwargs)
    build.__name__ = f"densenet{depth}"
    build.__doc__ = f"DenseNet-{depth} (see ``get_densenet`` for the arguments)."
    return build


densenet121, densenet161, densenet169, densenet201 = (
    _named(depth) for depth in (121, 161, 169, 201))
