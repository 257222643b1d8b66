"""Stride-1 convolutions without im2col columns, from shifted copies of the padded image:
one matmul per kernel row over copies shifted along the rows (:class:`_KernelRows`), or
one matmul of every tap's weights against the flat image followed by a sum of shifted
slices (shift-and-add, :func:`_conv_shift_add`). ``conv_cpu.py`` chooses them by the
channel counts and the plane's size (the constants below); the weight gradient
(``conv_grad_cpu.py``) reads kernel rows backwards.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled.workspace import packed, scratch_arrays, workspace
from mixrt.ops.conv.padding_cpu import _padded, _padding

# shift-and-add replaces im2col when input channels are at least this many times the output
# channels, or as many and the output has at least this many pixels (_shift_add_suits)
SHIFT_ADD_RATIO = 2
SHIFT_ADD_PIXELS = 28 * 28
# a stride-1 2-D convolution with more output pixels than this, and no more than
# SHIFT_ADD_RATIO times fewer output than input channels, takes _KernelRows ...
KERNEL_ROWS_PIXELS = 10 * 10
# ... when it has at least this many input channels: each kernel row's product has kw * C
# rows of columns, and with VGG's 3 input channels (K = 9) the three products ran 2.64 ms
# against im2col's one 1.16 ms product (K = 27). At 16 and 24 channels im2col was 5-8%
# faster alone but not inside SqueezeNet (4.33 against 4.27 ms), and it changes the
# rounding there: the ONNX suite's SqueezeNet case drives activations to ~1e10, where one
# ulp between channels decides its softmax
KERNEL_ROWS_CHANNELS = 8


class _KernelRows:
    """A stride-1 2-D convolution as one matmul per kernel row, over copies of the padded
    image shifted along its rows.

    With ``shifted[b, c, r, j] = padded[c, r, j + b*dw]`` (kw copies of the image, each
    already cropped to the output width), the window tap (a, b) of output (i, j) reads
    ``shifted[b, c, i + a*dh, j]``: for a fixed kernel row a, all of its taps for all outputs
    are the contiguous column range starting at ``a*dh*ow`` of ``shifted`` viewed as a
    (kw*C, Hp*ow) matrix. So Y = sum over a of W_a (M, kw*C) times that range: kh matmuls,
    kh - 1 adds, and a copy of kw (not kh*kw) times the image. On ResNet's 56x56 and 28x28
    layers (64 and 128 channels, 2 threads) it took 0.83 and 0.94 of shift-and-add's time,
    and 0.87 of the batched columns' time at 14x14; at 7x7 the batched columns win (a matmul
    per image is too small there), and shift-and-add keeps the layers with far fewer output
    than input channels."""

    def __init__(self, W, dilations, prepacked=None):
        m, c, kh, kw = W.shape
        self.dilations = dilations
        # W_a[m, b*C + c] = W[m, c, a, b]: 256 KB to 9 MB, made once per session node for a
        # constant weight (remade on every call it cost ResNet-50 1.4 ms a run)
        self.weights = packed(prepacked, "kernel_rows", lambda: np.ascontiguousarray(
            W.transpose(2, 0, 3, 1)).reshape(kh, m, kw * c))

    @classmethod
    def suit(cls, X, W, kernel, strides, out_dims, forward=True) -> bool:
        """Whether a convolution suits kernel rows. ``forward``: the forward's choice, which
        also weighs shift-and-add and im2col (channel counts); the weight gradient's
        (ops/conv/conv_grad_cpu.py) looks at the geometry only."""
        if X.ndim != 4 or any(s != 1 for s in strides) or math.prod(kernel) == 1:
            return False
        m, c = W.shape[:2]
        return math.prod(out_dims) > KERNEL_ROWS_PIXELS and (
            not forward or (SHIFT_ADD_RATIO * m > c and c >= KERNEL_ROWS_CHANNELS))

    @classmethod
    def suited(cls, X, W, kernel, strides, dilations, out_dims, prepacked=None):
        if not cls.suit(X, W, kernel, strides, out_dims):
            return None
        return cls(W, dilations, prepacked)

    def conv(self, x, y, begin, end):
        """One image: ``x`` (C, H, W) into ``y`` (M, oh*ow)."""
        kh, m, rows = self.weights.shape
        c, (dh, dw) = x.shape[0], self.dilations
        padded = _padded(x, begin, end)
        hp, wp = padded.shape[1:]
        kw = rows // c
        ow = wp - (kw - 1) * dw
        oh = y.shape[1] // ow
        shifted, partial = scratch_arrays(x.dtype, (kw, c, hp, ow), (m, oh * ow))
        for b in range(kw):
            np.copyto(shifted[b], padded[:, :, b * dw:b * dw + ow])
        flat = shifted.reshape(kw * c, hp * ow)
        for a in range(kh):
            start = a * dh * ow
            np.matmul(self.weights[a], flat[:, start:start + oh * ow],
                      out=y if a == 0 else partial)
            if a:
                y += partial


def _shift_add_suits(x, w, kernel, strides, out_dims) -> bool:
    """Whether a stride-1 2-D convolution costs less as shift-and-add than as im2col: the
    column matrix has ``C * kh * kw`` rows, the shifted partial products ``M * kh * kw``, so
    it pays when the output channels M are fewer than the input channels C (DenseNet's
    128 -> 32 layers: 0.37-0.53x the time), and for M = C on large images (0.81-0.86x at
    56x56 and 28x28). On small images with many channels the per-call reordering of the
    weights costs more than the columns it saves (2.2x slower at 512 channels, 7x7)."""
    if len(kernel) != 2 or any(s != 1 for s in strides) or math.prod(kernel) == 1:
        return False
    m, c = w.shape[0], x.shape[0]
    return SHIFT_ADD_RATIO * m <= c or (m <= c and math.prod(out_dims) >= SHIFT_ADD_PIXELS)


def _conv_shift_add(x, w, y, kernel, dilations, begin, end, out_dims, prepacked=None):
    """Convolution as one matmul of every kernel tap's weights against the zero-padded image,
    its rows laid end to end, then a sum of shifted slices: in that flat layout tap
    ``(dy, dx)`` of output ``(oy, ox)`` reads input element ``(oy + dy) * Wp + ox + dx``, so
    each tap's partial products for all outputs are one contiguous run shifted by
    ``dy * Wp + dx``. No im2col copy; the matmul is (M*kh*kw, C) x (C, Hp*Wp)."""
    (c, height, width), m = x.shape, w.shape[0]
    (kh, kw), (dh, dw) = kernel, dilations
    hp, wp = height + begin[0] + end[0], width + begin[1] + end[1]
    oh, ow = out_dims
    spill = (kw - 1) * dw  # the last tap's run reads this far past the last padded row
    span = hp * wp + spill
    # the padded planes laid end to end, each followed by its spill: a kept zeroed buffer
    # (:func:`_padding`) of which only the image's cells are written
    padding = _padding(x.shape, x.dtype, tuple(begin), tuple(end), spill)
    padding.array[padding.interior] = x
    flat = padding.flat
    taps = packed(prepacked, "shift_add", lambda: np.ascontiguousarray(
        w.reshape(m, c, kh, kw).transpose(2, 3, 0, 1)).reshape(kh * kw * m, c))
    partial = workspace(kh * kw * m * span * x.itemsize)[:kh * kw * m * span * x.itemsize]
    partial = partial.view(x.dtype).reshape(kh * kw * m, span)
    np.matmul(taps, flat, out=partial)
    out = y.reshape(m, oh, ow)
    for tap, (dy, dx) in enumerate((dy, dx) for dy in range(kh) for dx in range(kw)):
        shift = dy * dh * wp + dx * dw
        run = partial[tap * m:(tap + 1) * m, shift:shift + oh * wp].reshape(m, oh, wp)[..., :ow]
        if tap == 0:
            np.copyto(out, run)
        else:
            np.add(out, run, out=out)
