"""ResNet v1 (He et al. 2016, "Deep Residual Learning"), written with mixrt.sym.

ResNet-18/34 stack basic blocks (two 3x3 convolutions); ResNet-50/101/152 bottlenecks (1x1,
3x3, 1x1 with 4x expansion), the stride on the first 1x1 as in the paper's v1. Every
convolution is followed by BatchNormalization; the shortcut is a 1x1 projection where the
shape changes. Parameter counts equal the reference implementations' (ResNet-18 11,689,512,
ResNet-50 25,557,032, running statistics not counted).
"""

from __future__ import annotations

from mixrt import sym
from mixrt.models.layers import batch_norm, conv2d, dense, max_pool

SPECS = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)),
         50: ("bottleneck", (3, 4, 6, 3)), 101: ("bottleneck", (3, 4, 23, 3)),
         152: ("bottleneck", (3, 8, 36, 3))}
WIDTHS = (64, 128, 256, 512)


def resnet(depth: int = 18, classes: int = 1000, in_channels: int = 3, *,
           data: str = "data"):
    """data (N, in_channels, H, W) -> logits (N, classes)."""
    if depth not in SPECS:
        raise ValueError(f"resnet: depth {depth} is not one of {sorted(SPECS)}")
    kind, counts = SPECS[depth]
    x = sym.Variable(data, shape=(None, in_channels, None, None))
    x = _conv_bn(x, in_channels, 64, 7, "conv0", stride=2, pad=3)
    x = max_pool(x, 3, 2, "pool0", pad=1)
    width = 64
    for stage, (count, mid) in enumerate(zip(counts, WIDTHS)):
        for index in range(count):
            stride = 2 if index == 0 and stage > 0 else 1
            with sym.prefix(f"stage{stage + 1}_unit{index + 1}_"):
                x, width = (_basic if kind == "basic" else _bottleneck)(x, width, mid, stride)
    x = sym.GlobalAveragePool(x, name="pool1")
    x = sym.Flatten(x, axis=1, name="flatten")
    return dense(x, width, classes, "fc")


def _conv_bn(x, cin, cout, kernel, name, *, stride=1, pad=0, relu=True):
    x = conv2d(x, cin, cout, kernel, name, stride=stride, pad=pad)
    x = batch_norm(x, cout, f"{name}_bn")
    return sym.Relu(x, name=f"{name}_relu") if relu else x


def _shortcut(x, cin, cout, stride):
    if cin == cout and stride == 1:
        return x
    return _conv_bn(x, cin, cout, 1, "downsample", stride=stride, relu=False)


def _basic(x, cin, cout, stride):
    y = _conv_bn(x, cin, cout, 3, "conv1", stride=stride, pad=1)
    y = _conv_bn(y, cout, cout, 3, "conv2", pad=1, relu=False)
    return sym.Relu(sym.Add(y, _shortcut(x, cin, cout, stride), name="add"), name="relu"), cout


def _bottleneck(x, cin, mid, stride):
    cout = mid * 4
    y = _conv_bn(x, cin, mid, 1, "conv1", stride=stride)
    y = _conv_bn(y, mid, mid, 3, "conv2", pad=1)
    y = _conv_bn(y, mid, cout, 1, "conv3", relu=False)
    return sym.Relu(sym.Add(y, _shortcut(x, cin, cout, stride), name="add"), name="relu"), cout
