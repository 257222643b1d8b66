"""ResNet v1 (He et al., 2015) and v2 (pre-activation, He et al., 2016) as MXNet 1.x's
Gluon model zoo builds them: the same blocks, prefixes and parameter names (``stage1_``
... ``stage4_`` hold the residual units; ``thumbnail`` swaps the 7x7 stem and its pooling
for one 3x3 convolution, for 32x32 images)."""

from __future__ import annotations

from mixrt.base.errors import InputError
from mixrt.gluon import nn
from mixrt.gluon.hybrid import HybridBlock
from mixrt.gluon.model_zoo.model_store import load_pretrained

__all__ = ["ResNetV1", "ResNetV2", "BasicBlockV1", "BasicBlockV2", "BottleneckV1",
           "BottleneckV2", "resnet18_v1", "resnet34_v1", "resnet50_v1", "resnet101_v1",
           "resnet152_v1", "resnet18_v2", "resnet34_v2", "resnet50_v2", "resnet101_v2",
           "resnet152_v2", "get_resnet"]


def _conv3x3(channels: int, stride: int, in_channels: int):
    return nn.Conv2D(channels, kernel_size=3, strides=stride, padding=1, use_bias=False,
                     in_channels=in_channels)


def _projection(channels: int, stride: int, in_channels: int):
    """The 1x1 strided convolution that brings the shortcut to the unit's output shape."""
    return nn.Conv2D(channels, kernel_size=1, strides=stride, use_bias=False,
                     in_channels=in_channels)


class _ResidualV1(HybridBlock):
    """A v1 residual unit: ``relu(shortcut + body(x))``, the shortcut a strided 1x1
    projection with BatchNorm where the shape changes (``downsample``), else ``x``. The
    subclass makes ``body`` first, so the parameters are named in MXNet's order."""

    def _add_shortcut(self, channels: int, stride: int, downsample: bool,
                      in_channels: int) -> None:
        self.downsample = None
        if downsample:
            self.downsample = nn.HybridSequential(prefix="")
            self.downsample.add(_projection(channels, stride, in_channels), nn.BatchNorm())

    def hybrid_forward(self, F, x):
        shortcut = self.downsample(x) if self.downsample is not None else x
        return F.Activation(shortcut + self.body(x), act_type="relu")


class BasicBlockV1(_ResidualV1):
    """Two 3x3 convolutions with BatchNorm; ReLU after adding the shortcut."""

    def __init__(self, channels: int, stride: int, downsample: bool = False,
                 in_channels: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.body = nn.HybridSequential(prefix="")
        self.body.add(_conv3x3(channels, stride, in_channels), nn.BatchNorm(),
                      nn.Activation("relu"), _conv3x3(channels, 1, channels), nn.BatchNorm())
        self._add_shortcut(channels, stride, downsample, in_channels)


class BottleneckV1(_ResidualV1):
    """1x1 (to channels/4), 3x3, 1x1 (back to channels) convolutions with BatchNorm; ReLU
    after adding the shortcut. The stride is the first convolution's, as in MXNet's v1."""

    def __init__(self, channels: int, stride: int, downsample: bool = False,
                 in_channels: int = 0, **kwargs):
        super().__init__(**kwargs)
        inner = channels // 4
        self.body = nn.HybridSequential(prefix="")
        self.body.add(nn.Conv2D(inner, kernel_size=1, strides=stride), nn.BatchNorm(),
                      nn.Activation("relu"), _conv3x3(inner, 1, inner), nn.BatchNorm(),
                      nn.Activation("relu"), nn.Conv2D(channels, kernel_size=1, strides=1),
                      nn.BatchNorm())
        self._add_shortcut(channels, stride, downsample, in_channels)


class BasicBlockV2(HybridBlock):
    """BatchNorm and ReLU before each of two 3x3 convolutions; the shortcut is added
    unactivated (projected from the first activation when the shape changes)."""

    def __init__(self, channels: int, stride: int, downsample: bool = False,
                 in_channels: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.bn1 = nn.BatchNorm()
        self.conv1 = _conv3x3(channels, stride, in_channels)
        self.bn2 = nn.BatchNorm()
        self.conv2 = _conv3x3(channels, 1, channels)
        self.downsample = _projection(channels, stride, in_channels) if downsample else None

    def hybrid_forward(self, F, x):
        shortcut = x
        x = F.Activation(self.bn1(x), act_type="relu")
        if self.downsample is not None:
            shortcut = self.downsample(x)
        x = self.conv1(x)
        x = self.conv2(F.Activation(self.bn2(x), act_type="relu"))
        return x + shortcut


class BottleneckV2(HybridBlock):
    """Pre-activation 1x1, 3x3 (strided), 1x1 convolutions; the shortcut added unactivated."""

    def __init__(self, channels: int, stride: int, downsample: bool = False,
                 in_channels: int = 0, **kwargs):
        super().__init__(**kwargs)
        inner = channels // 4
        self.bn1 = nn.BatchNorm()
        self.conv1 = nn.Conv2D(inner, kernel_size=1, strides=1, use_bias=False)
        self.bn2 = nn.BatchNorm()
        self.conv2 = _conv3x3(inner, stride, inner)
        self.bn3 = nn.BatchNorm()
        self.conv3 = nn.Conv2D(channels, kernel_size=1, strides=1, use_bias=False)
        self.downsample = _projection(channels, stride, in_channels) if downsample else None

    def hybrid_forward(self, F, x):
        shortcut = x
        x = F.Activation(self.bn1(x), act_type="relu")
        if self.downsample is not None:
            shortcut = self.downsample(x)
        x = self.conv1(x)
        x = self.conv2(F.Activation(self.bn2(x), act_type="relu"))
        x = self.conv3(F.Activation(self.bn3(x), act_type="relu"))
        return x + shortcut


def _stem(features, channels: int, thumbnail: bool) -> None:
    if thumbnail:
        features.add(_conv3x3(channels, 1, 0))
        return
    features.add(nn.Conv2D(channels, 7, 2, 3, use_bias=False), nn.BatchNorm(),
                 nn.Activation("relu"), nn.MaxPool2D(3, 2, 1))


def _stage(block, units: int, channels: int, stride: int, index: int, in_channels: int):
    """``units`` residual units under the prefix ``stage<index>_``; the first one strides
    and projects its shortcut when the width changes."""
    stage = nn.HybridSequential(prefix=f"stage{index}_")
    with stage.name_scope():
        stage.add(block(channels, stride, channels != in_channels, in_channels=in_channels,
                        prefix=""))
        for _ in range(units - 1):
            stage.add(block(channels, 1, False, in_channels=channels, prefix=""))
    return stage


def _check_depths(layers, channels) -> None:
    if len(layers) != len(channels) - 1:
        raise InputError(f"ResNet: channels gives the stem's width and one per stage, so "
                         f"len(channels) must be len(layers) + 1 = {len(layers) + 1}, "
                         f"got {len(channels)}")


class ResNetV1(HybridBlock):
    """``block`` (BasicBlockV1 or BottleneckV1) units, ``layers[i]`` in stage i+1 of width
    ``channels[i + 1]`` (``channels[0]`` the stem's), global average pooling, and a
    Dense(``classes``) classifier named ``output``."""

    def __init__(self, block, layers, channels, classes: int = 1000,
                 thumbnail: bool = False, **kwargs):
        super().__init__(**kwargs)
        _check_depths(layers, channels)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            _stem(self.features, channels[0], thumbnail)
            for i, units in enumerate(layers):
                self.features.add(_stage(block, units, channels[i + 1], 1 if i == 0 else 2,
                                         i + 1, channels[i]))
            self.features.add(nn.GlobalAvgPool2D())
            self.output = nn.Dense(classes, in_units=channels[-1])

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


class ResNetV2(HybridBlock):
    """Pre-activation ResNet: the input normalized by a BatchNorm without scale or
    shift, ``block`` (BasicBlockV2 or BottleneckV2) units per stage, a final BatchNorm
    and ReLU, global average pooling, Flatten, and Dense(``classes``) named ``output``."""

    def __init__(self, block, layers, channels, classes: int = 1000,
                 thumbnail: bool = False, **kwargs):
        super().__init__(**kwargs)
        _check_depths(layers, channels)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(nn.BatchNorm(scale=False, center=False))
            _stem(self.features, channels[0], thumbnail)
            for i, units in enumerate(layers):
                self.features.add(_stage(block, units, channels[i + 1], 1 if i == 0 else 2,
                                         i + 1, channels[i]))
            self.features.add(nn.BatchNorm(), nn.Activation("relu"), nn.GlobalAvgPool2D(),
                              nn.Flatten())
            self.output = nn.Dense(classes, in_units=channels[-1])

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


# depth -> (unit kind, units per stage, stem width then each stage's width)
RESNET_SPEC = {18: ("basic", (2, 2, 2, 2), (64, 64, 128, 256, 512)),
               34: ("basic", (3, 4, 6, 3), (64, 64, 128, 256, 512)),
               50: ("bottleneck", (3, 4, 6, 3), (64, 256, 512, 1024, 2048)),
               101: ("bottleneck", (3, 4, 23, 3), (64, 256, 512, 1024, 2048)),
               152: ("bottleneck", (3, 8, 36, 3), (64, 256, 512, 1024, 2048))}
_NETS = {1: ResNetV1, 2: ResNetV2}
_UNITS = {(1, "basic"): BasicBlockV1, (1, "bottleneck"): BottleneckV1,
          (2, "basic"): BasicBlockV2, (2, "bottleneck"): BottleneckV2}


def get_resnet(version: int, num_layers: int, pretrained: bool = False, ctx=None,
               root: str | None = None, **kwargs):
    """ResNet ``version`` (1 or 2) of depth ``num_layers`` (18, 34, 50, 101 or 152);
    ``kwargs`` go to the network (``classes``, ``thumbnail``, ``prefix``)."""
    if num_layers not in RESNET_SPEC:
        raise InputError(f"get_resnet: num_layers must be one of {sorted(RESNET_SPEC)}, "
                         f"got {num_layers!r}")
    if version not in _NETS:
        raise InputError(f"get_resnet: version must be 1 or 2, got {version!r}")
    kind, layers, channels = RESNET_SPEC[num_layers]
    net = _NETS[version](_UNITS[version, kind], layers, channels, **kwargs)
    if pretrained:
        load_pretrained(net, f"resnet{num_layers}_v{version}", ctx, root)
    return net


def _named(version: int, depth: int):
    def build(**kwargs):
        return get_resnet(version, depth, **kwargs)
    build.__name__ = f"resnet{depth}_v{version}"
    build.__doc__ = f"ResNet-{depth} v{version} (see ``get_resnet`` for the arguments)."
    return build


resnet18_v1, resnet34_v1, resnet50_v1, resnet101_v1, resnet152_v1 = (
    _named(1, depth) for depth in (18, 34, 50, 101, 152))
resnet18_v2, resnet34_v2, resnet50_v2, resnet101_v2, resnet152_v2 = (
    _named(2, depth) for depth in (18, 34, 50, 101, 152))
