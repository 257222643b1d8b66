"""VGG (Simonyan and Zisserman, 2014), with or without BatchNorm, as MXNet 1.x's Gluon
model zoo builds it: 3x3 convolutions in five groups each closed by a 2x2 max pool, two
4096-unit dense layers with dropout, and a Dense(``classes``) classifier named ``output``.
The initializers are MXNet's: the convolutions' weights Xavier (gaussian, fan out,
magnitude 2), the dense layers' normal, every bias zero."""

from __future__ import annotations

from mixrt.base.errors import InputError
from mixrt.gluon import nn
from mixrt.gluon.hybrid import HybridBlock
from mixrt.gluon.model_zoo.model_store import load_pretrained
from mixrt.initializer import Xavier

__all__ = ["VGG", "vgg11", "vgg13", "vgg16", "vgg19", "vgg11_bn", "vgg13_bn", "vgg16_bn",
           "vgg19_bn", "get_vgg"]


def _dense(units: int, **kwargs):
    return nn.Dense(units, weight_initializer="normal", bias_initializer="zeros", **kwargs)


class VGG(HybridBlock):
    """``layers[i]`` convolutions of ``filters[i]`` channels in group i."""

    def __init__(self, layers, filters, classes: int = 1000, batch_norm: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        if len(layers) != len(filters):
            raise InputError(f"VGG: layers and filters give one entry per group; got "
                             f"{len(layers)} and {len(filters)}")
        with self.name_scope():
            self.features = self._features(layers, filters, batch_norm)
            self.features.add(_dense(4096, activation="relu"), nn.Dropout(rate=0.5),
                              _dense(4096, activation="relu"), nn.Dropout(rate=0.5))
            self.output = _dense(classes)

    @staticmethod
    def _features(layers, filters, batch_norm: bool):
        features = nn.HybridSequential(prefix="")
        with features.name_scope():
            for count, channels in zip(layers, filters):
                for _ in range(count):
                    features.add(nn.Conv2D(channels, kernel_size=3, padding=1,
                                           weight_initializer=Xavier(rnd_type="gaussian",
                                                                     factor_type="out",
                                                                     magnitude=2),
                                           bias_initializer="zeros"))
                    if batch_norm:
                        features.add(nn.BatchNorm())
                    features.add(nn.Activation("relu"))
                features.add(nn.MaxPool2D(strides=2))
        return features

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


# depth -> (convolutions per group, each group's channels)
VGG_SPEC = {11: ((1, 1, 2, 2, 2), (64, 128, 256, 512, 512)),
            13: ((2, 2, 2, 2, 2), (64, 128, 256, 512, 512)),
            16: ((2, 2, 3, 3, 3), (64, 128, 256, 512, 512)),
            19: ((2, 2, 4, 4, 4), (64, 128, 256, 512, 512))}


def get_vgg(num_layers: int, pretrained: bool = False, ctx=None, root: str | None = None,
            **kwargs):
    """VGG of depth ``num_layers`` (11, 13, 16 or 19); ``batch_norm=True`` adds BatchNorm
    after every convolution; other ``kwargs`` go to the network."""
    if num_layers not in VGG_SPEC:
        raise InputError(f"get_vgg: num_layers must be one of {sorted(VGG_SPEC)}, got "
                         f"{num_layers!r}")
    layers, filters = VGG_SPEC[num_layers]
    net = VGG(layers, filters, **kwargs)
    if pretrained:
        suffix = "_bn" if kwargs.get("batch_norm") else ""
        load_pretrained(net, f"vgg{num_layers}{suffix}", ctx, root)
    return net


def _named(depth: int, batch_norm: bool):
    def build(**kwargs):
        if batch_norm:
            kwargs["batch_norm"] = True
        return get_vgg(depth, **kwargs)
    build.__name__ = f"vgg{depth}{'_bn' if batch_norm else ''}"
    build.__doc__ = (f"VGG-{depth}{' with BatchNorm' if batch_norm else ''} (see "
                     f"``get_vgg`` for the arguments).")
    return build


vgg11, vgg13, vgg16, vgg19 = (_named(depth, False) for depth in (11, 13, 16, 19))
vgg11_bn, vgg13_bn, vgg16_bn, vgg19_bn = (_named(depth, True) for depth in (11, 13, 16, 19))
