"""SqueezeNet 1.0 and 1.1 (Iandola et al., 2016) as MXNet 1.x's Gluon model zoo builds
them: fire modules (a 1x1 squeeze, then 1x1 and 3x3 expansions joined along channels),
and a classifier of a 1x1 convolution to ``classes`` channels averaged over 13x13."""

from __future__ import annotations

from mixrt.base.errors import InputError
from mixrt.gluon import nn
from mixrt.gluon.contrib.nn import HybridConcurrent
from mixrt.gluon.hybrid import HybridBlock
from mixrt.gluon.model_zoo.model_store import load_pretrained

__all__ = ["SqueezeNet", "squeezenet1_0", "squeezenet1_1", "get_squeezenet"]


def _conv_relu(channels: int, kernel: int, padding: int = 0):
    out = nn.HybridSequential(prefix="")
    out.add(nn.Conv2D(channels, kernel, padding=padding), nn.Activation("relu"))
    return out


def _fire(squeeze: int, expand1x1: int, expand3x3: int):
    # built in this order so that the convolutions are numbered as in MXNet
    out = nn.HybridSequential(prefix="")
    out.add(_conv_relu(squeeze, 1))
    expand = HybridConcurrent(axis=1, prefix="")
    expand.add(_conv_relu(expand1x1, 1), _conv_relu(expand3x3, 3, 1))
    out.add(expand)
    return out


def _pool():
    return nn.MaxPool2D(pool_size=3, strides=2, ceil_mode=True)


# version -> the stem (channels, kernel), then "pool" or a fire module's three widths
_LAYOUTS = {
    "1.0": ((96, 7), (_pool, (16, 64, 64), (16, 64, 64), (32, 128, 128), _pool,
                      (32, 128, 128), (48, 192, 192), (48, 192, 192), (64, 256, 256), _pool,
                      (64, 256, 256))),
    "1.1": ((64, 3), (_pool, (16, 64, 64), (16, 64, 64), _pool, (32, 128, 128),
                      (32, 128, 128), _pool, (48, 192, 192), (48, 192, 192), (64, 256, 256),
                      (64, 256, 256))),
}


class SqueezeNet(HybridBlock):
    """SqueezeNet ``version`` ``'1.0'`` or ``'1.1'`` (1.1: a 3x3 stem and earlier pools,
    the same accuracy for 2.4x less computation)."""

    def __init__(self, version: str, classes: int = 1000, **kwargs):
        super().__init__(**kwargs)
        if version not in _LAYOUTS:
            raise InputError(f"SqueezeNet: version must be one of {sorted(_LAYOUTS)}, got "
                             f"{version!r}")
        (stem_channels, stem_kernel), layers = _LAYOUTS[version]
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(nn.Conv2D(stem_channels, kernel_size=stem_kernel, strides=2),
                              nn.Activation("relu"))
            for layer in layers:
                self.features.add(layer() if callable(layer) else _fire(*layer))
            self.features.add(nn.Dropout(0.5))
            self.output = nn.HybridSequential(prefix="")
            self.output.add(nn.Conv2D(classes, kernel_size=1), nn.Activation("relu"),
                            nn.AvgPool2D(13), nn.Flatten())

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def get_squeezenet(version: str, pretrained: bool = False, ctx=None,
                   root: str | None = None, **kwargs):
    """SqueezeNet ``version`` (``'1.0'`` or ``'1.1'``); ``kwargs`` go to the network."""
    net = SqueezeNet(version, **kwargs)
    if pretrained:
        load_pretrained(net, f"squeezenet{version}", ctx, root)
    return net


def squeezenet1_0(**kwargs):
    """SqueezeNet 1.0 (see ``get_squeezenet`` for the arguments)."""
    return get_squeezenet("1.0", **kwargs)


def squeezenet1_1(**kwargs):
    """SqueezeNet 1.1 (see ``get_squeezenet`` for the arguments)."""
    return get_squeezenet("1.1", **kwargs)
