"""FusedConv on a GPU: the convolution through cuDNN (``ops/conv/conv_gpu.py``) into the
planned output, then the residual and the activation in place. (The generic kernel calls the
generic Conv, which on a GPU is im2col + cuBLAS.)"""

from __future__ import annotations

from mixrt.ops.conv.conv_gpu import conv_gpu
from mixrt.ops.nn.fused import _activation, _aliases, _into, fused_conv


@fused_conv.fast("gpu")
def fused_conv_gpu(xp, X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, pads=None, strides=None, activation="",
                   activation_params=None, out=None, _prepacked=None):
    """activation(Conv(X, W, B) + Z). The convolution writes into ``out`` unless an in-place
    plan gave ``out`` an input's memory (the residual's, most often), which it must still
    read. (``_prepacked``, which FusedConvPool's bands pass to whichever kernel the device
    has, holds nothing here.)"""
    finish = _activation(activation, activation_params)
    into = None if _aliases(xp, out, X, W, B, Z) else out
    y = conv_gpu(xp, X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides, out=into)
    if Z is not None:
        xp.add(y, Z, out=y)
    return _into(xp, finish(xp, y), out)
