"""ImageScaler: the per-channel scale and shift that WinML's exports put before their first
convolution, an operator the spec has since dropped (see docs/conformance.md).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import same_as_input


@op("ImageScaler", since=1, dtypes=FLOATS)
def image_scaler(xp, input, *, bias=None, scale=1.0):
    """ImageScaler, an experimental operator of ai.onnx opsets 1-9 that the spec has since
    dropped and onnxruntime still runs (WinML's style-transfer and SqueezeNet exports put it
    before their first convolution): ``input * scale + bias[c]`` over NCHW images, one bias
    value per channel, in the input's dtype."""
    if input.ndim != 4:
        raise ValueError(f"ImageScaler takes NCHW images (4 dimensions), not shape "
                         f"{tuple(input.shape)}")
    channels = input.shape[1]
    bias = list(bias or ())
    if len(bias) != channels:
        raise ValueError(f"ImageScaler has {len(bias)} bias values for {channels} channels "
                         f"(one per channel expected)")
    shift = xp.asarray(np.asarray(bias, input.dtype).reshape(1, channels, 1, 1))
    return input * input.dtype.type(scale) + shift


image_scaler.infer(same_as_input)
