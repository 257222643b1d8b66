"""LeNet (LeCun et al. 1998) in its modern form, written with mixrt.sym: two 5x5
convolutions with ReLU and 2x2 max pooling, then two hidden dense layers."""

from __future__ import annotations

from mixrt import sym
from mixrt.models.layers import conv2d, dense, max_pool


def lenet(in_channels: int = 1, size: int = 28, classes: int = 10, *, pad: int = 0,
          data: str = "data"):
    """data (N, in_channels, size, size) -> logits (N, classes). ``pad`` 2 keeps small
    inputs (the 8x8 digits) from shrinking below the second pooling."""
    x = sym.Variable(data, shape=(None, in_channels, size, size))
    side = size
    for i, channels in enumerate((6, 16)):
        x = conv2d(x, in_channels if i == 0 else 6, channels, 5, f"conv{i + 1}", pad=pad,
                   bias=True)
        x = max_pool(sym.Relu(x, name=f"relu{i + 1}"), 2, 2, f"pool{i + 1}")
        side = (side + 2 * pad - 4) // 2
    if side < 1:
        raise ValueError(f"lenet: input size {size} with pad {pad} leaves nothing after the "
                         f"second pooling; use pad=2 or a larger input")
    x = sym.Flatten(x, axis=1, name="flatten")
    x = sym.Relu(dense(x, 16 * side * side, 120, "fc1"), name="relu3")
    x = sym.Relu(dense(x, 120, 84, "fc2"), name="relu4")
    return dense(x, 84, classes, "fc3")
