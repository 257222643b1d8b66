"""MobileNet v1 (Howard et al., 2017) and v2 (Sandler et al., 2018) as MXNet 1.x's Gluon
model zoo builds them, at a width ``multiplier``: depthwise separable convolutions (v1),
inverted residual bottlenecks with ReLU6 and linear outputs (v2)."""

from __future__ import annotations

from mixrt.base.errors import InputError
from mixrt.gluon import nn
from mixrt.gluon.hybrid import HybridBlock
from mixrt.gluon.model_zoo.model_store import load_pretrained

__all__ = ["MobileNet", "MobileNetV2", "RELU6", "LinearBottleneck", "get_mobilenet",
           "get_mobilenet_v2", "mobilenet1_0", "mobilenet0_75", "mobilenet0_5",
           "mobilenet0_25", "mobilenet_v2_1_0", "mobilenet_v2_0_75", "mobilenet_v2_0_5",
           "mobilenet_v2_0_25"]


class RELU6(HybridBlock):
    """min(max(x, 0), 6)."""

    def hybrid_forward(self, F, x):
        return F.clip(x, 0.0, 6.0, name="relu6")


def _add_conv(out, channels: int = 1, kernel: int = 1, stride: int = 1, pad: int = 0,
              num_group: int = 1, active: bool = True, relu6: bool = False) -> None:
    """Convolution (no bias), BatchNorm, and ReLU or ReLU6 unless not ``active``."""
    out.add(nn.Conv2D(channels, kernel, stride, pad, groups=num_group, use_bias=False),
            nn.BatchNorm(scale=True))
    if active:
        out.add(RELU6() if relu6 else nn.Activation("relu"))


def _add_conv_dw(out, dw_channels: int, channels: int, stride: int,
                 relu6: bool = False) -> None:
    """A depthwise 3x3 convolution then a pointwise one to ``channels``."""
    _add_conv(out, channels=dw_channels, kernel=3, stride=stride, pad=1,
              num_group=dw_channels, relu6=relu6)
    _add_conv(out, channels=channels, relu6=relu6)


class LinearBottleneck(HybridBlock):
    """Expand by ``t`` (1x1, ReLU6), depthwise 3x3 (``stride``, ReLU6), project linearly to
    ``channels``; the input is added back when the shape is unchanged."""

    def __init__(self, in_channels: int, channels: int, t: int, stride: int, **kwargs):
        super().__init__(**kwargs)
        self.use_shortcut = stride == 1 and in_channels == channels
        with self.name_scope():
            self.out = nn.HybridSequential()
            _add_conv(self.out, in_channels * t, relu6=True)
            _add_conv(self.out, in_channels * t, kernel=3, stride=stride, pad=1,
                      num_group=in_channels * t, relu6=True)
            _add_conv(self.out, channels, active=False, relu6=True)

    def hybrid_forward(self, F, x):
        out = self.out(x)
        return F.elemwise_add(out, x) if self.use_shortcut else out


def _scaled(widths, multiplier: float) -> list:
    return [int(width * multiplier) for width in widths]


class MobileNet(HybridBlock):
    """MobileNet v1: a strided 3x3 stem, 13 depthwise separable convolutions, global
    average pooling and a Dense(``classes``) classifier named ``output``."""

    _DEPTHWISE = [32, 64] + [128] * 2 + [256] * 2 + [512] * 6 + [1024]
    _POINTWISE = [64] + [128] * 2 + [256] * 2 + [512] * 6 + [1024] * 2
    _STRIDES = [1, 2] * 3 + [1] * 5 + [2, 1]

    def __init__(self, multiplier: float = 1.0, classes: int = 1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            with self.features.name_scope():
                _add_conv(self.features, channels=int(32 * multiplier), kernel=3, pad=1,
                          stride=2)
                for dw_channels, channels, stride in zip(
                        _scaled(self._DEPTHWISE, multiplier),
                        _scaled(self._POINTWISE, multiplier), self._STRIDES):
                    _add_conv_dw(self.features, dw_channels=dw_channels, channels=channels,
                                 stride=stride)
                self.features.add(nn.GlobalAvgPool2D(), nn.Flatten())
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


class MobileNetV2(HybridBlock):
    """MobileNet v2: a strided 3x3 stem, 17 linear bottlenecks, a 1x1 convolution to 1280
    channels (more above multiplier 1), global average pooling, and a 1x1 convolution to
    ``classes`` flattened (``output``)."""

    _IN = [32] + [16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3 + [160] * 3
    _OUT = [16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3 + [160] * 3 + [320]
    _EXPANSIONS = [1] + [6] * 16
    _STRIDES = [1, 2] * 2 + [1, 1, 2] + [1] * 6 + [2] + [1] * 3

    def __init__(self, multiplier: float = 1.0, classes: int = 1000, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="features_")
            with self.features.name_scope():
                _add_conv(self.features, int(32 * multiplier), kernel=3, stride=2, pad=1,
                          relu6=True)
                for in_channels, channels, t, stride in zip(
                        _scaled(self._IN, multiplier), _scaled(self._OUT, multiplier),
                        self._EXPANSIONS, self._STRIDES):
                    self.features.add(LinearBottleneck(in_channels=in_channels,
                                                       channels=channels, t=t, stride=stride))
                last = int(1280 * multiplier) if multiplier > 1.0 else 1280
                _add_conv(self.features, last, relu6=True)
                self.features.add(nn.GlobalAvgPool2D())
            self.output = nn.HybridSequential(prefix="output_")
            with self.output.name_scope():
                self.output.add(nn.Conv2D(classes, 1, use_bias=False, prefix="pred_"),
                                nn.Flatten())

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def _suffix(multiplier: float) -> str:
    """MXNet's file names: 1.0 and 0.5 with one decimal, 0.75 and 0.25 with two."""
    text = f"{multiplier:.2f}"
    return text[:-1] if text in ("1.00", "0.50") else text


def _check_multiplier(multiplier) -> None:
    if not multiplier > 0:
        raise InputError(f"MobileNet: multiplier must be positive, got {multiplier!r}")


def get_mobilenet(multiplier: float, pretrained: bool = False, ctx=None,
                  root: str | None = None, **kwargs):
    """MobileNet v1 at width ``multiplier``; ``kwargs`` go to the network."""
    _check_multiplier(multiplier)
    net = MobileNet(multiplier, **kwargs)
    if pretrained:
        load_pretrained(net, f"mobilenet{_suffix(multiplier)}", ctx, root)
    return net


def get_mobilenet_v2(multiplier: float, pretrained: bool = False, ctx=None,
                     root: str | None = None, **kwargs):
    """MobileNet v2 at width ``multiplier``; ``kwargs`` go to the network."""
    _check_multiplier(multiplier)
    net = MobileNetV2(multiplier, **kwargs)
    if pretrained:
        load_pretrained(net, f"mobilenetv2_{_suffix(multiplier)}", ctx, root)
    return net


def _named(build, multiplier: float, name: str):
    def named(**kwargs):
        return build(multiplier, **kwargs)
    named.__name__ = name
    named.__doc__ = f"{build.__name__}({multiplier}, ...)."
    return named


mobilenet1_0 = _named(get_mobilenet, 1.0, "mobilenet1_0")
mobilenet0_75 = _named(get_mobilenet, 0.75, "mobilenet0_75")
mobilenet0_5 = _named(get_mobilenet, 0.5, "mobilenet0_5")
mobilenet0_25 = _named(get_mobilenet, 0.25, "mobilenet0_25")
mobilenet_v2_1_0 = _named(get_mobilenet_v2, 1.0, "mobilenet_v2_1_0")
mobilenet_v2_0_75 = _named(get_mobilenet_v2, 0.75, "mobilenet_v2_0_75")
mobilenet_v2_0_5 = _named(get_mobilenet_v2, 0.5, "mobilenet_v2_0_5")
mobilenet_v2_0_25 = _named(get_mobilenet_v2, 0.25, "mobilenet_v2_0_25")
