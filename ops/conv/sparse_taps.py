"""Dilated convolutions whose taps mostly read padding, one product per tap over the outputs
it reaches.

DeepLabV3's atrous pyramid runs a 3x3 convolution of dilation 12 over a 14x14 map padded by
12: of each output's nine taps, the centre one reads the image and the other eight mostly
read zeros (``drop_dead_conv_taps`` removes a tap only when no output reaches the image
through it; here the outputs on a 2-wide border do). The direct kernel computed all nine
over the padding: 4.8 ms for 960 -> 256 channels, where onnxruntime took 0.67. Here each
tap is one product of its (M, C) weight with the image's positions it reads, added into
the rectangle of outputs that read them: the centre tap all of them, the others 2 x 14 or
2 x 2, a fifth of the multiply-adds. Then the bias, a residual and the piecewise activation
(``conv_direct_cpu.activation_limits``), as the direct kernel's epilogue applies them.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled.workspace import packed

# the share of (output, tap) pairs that read the image below which the taps go one by one
MAX_COVERAGE = 0.5


def tap_ranges(geometry, image: tuple) -> list[tuple]:
    """Per tap (a, b) that reaches the image from some output: (a, b, rows, columns), the
    output ranges [first, stop) along each axis whose input lies inside ``image`` (H, W)."""
    kernel, strides, dilations, _, begin, _, out_dims = geometry
    ranges = []
    for a in range(kernel[0]):
        rows = _reached(a * dilations[0] - begin[0], strides[0], image[0], out_dims[0])
        for b in range(kernel[1]):
            columns = _reached(b * dilations[1] - begin[1], strides[1], image[1], out_dims[1])
            if rows[1] > rows[0] and columns[1] > columns[0]:
                ranges.append((a, b, rows, columns))
    return ranges


def _reached(shift: int, stride: int, size: int, outputs: int) -> tuple[int, int]:
    """The outputs i in [0, outputs) whose input i * stride + shift lies in [0, size)."""
    first = max(0, -(shift // stride))  # the ceiling of -shift / stride
    stop = min(outputs, (size - 1 - shift) // stride + 1)
    return first, max(first, stop)


def suits(X, W, group, geometry, out) -> bool:
    """A 2-D convolution of one group, dilated, native floats, whose taps reach the image
    from under MAX_COVERAGE of the (output, tap) pairs."""
    kernel, _, dilations, _, _, _, out_dims = geometry
    if X.ndim != 4 or int(group) != 1 or max(dilations) == 1 or X.dtype != W.dtype \
            or X.dtype not in (np.float32, np.float64) or not isinstance(X, np.ndarray) \
            or (out is not None and (out.dtype != X.dtype or np.may_share_memory(out, X))):
        return False
    reached = sum((r[1] - r[0]) * (c[1] - c[0]) for _, _, r, c in tap_ranges(geometry,
                                                                             X.shape[2:]))
    return reached < MAX_COVERAGE * math.prod(kernel) * math.prod(out_dims)


def conv(X, W, B, Z, limits, out, geometry, prepacked):
    """``out`` = limits(Conv(X, W, B) + Z), tap by tap (:func:`suits`); ``prepacked``: the
    node's dict, where each tap's (M, C) weight is kept once made, or None. None, nothing
    written, when W is not all finite: the spec's zero padding times an infinite weight is
    NaN, which skipping the padded taps would lose (the direct kernel keeps it)."""
    kernel, strides, dilations, _, begin, _, out_dims = geometry
    n, m = X.shape[0], W.shape[0]
    ranges = tap_ranges(geometry, X.shape[2:])
    # kept per set of reaching taps: another input size (or the pads) may reach others
    key = ("sparse taps", W.shape, tuple((a, b) for a, b, _, _ in ranges))
    weights = packed(prepacked, key, lambda: _tap_weights(W, ranges)) \
        if prepacked is not None else _tap_weights(W, ranges)
    if not weights:
        return None
    if out is None:
        out = np.empty((n, m) + tuple(out_dims), X.dtype)
    out[...] = 0
    for image in range(n):
        for weight, (a, b, (i0, i1), (j0, j1)) in zip(weights, ranges):
            r0 = i0 * strides[0] + a * dilations[0] - begin[0]
            c0 = j0 * strides[1] + b * dilations[1] - begin[1]
            taken = X[image, :, r0:r0 + (i1 - i0 - 1) * strides[0] + 1:strides[0],
                      c0:c0 + (j1 - j0 - 1) * strides[1] + 1:strides[1]]
            columns = np.ascontiguousarray(taken).reshape(taken.shape[0], -1)
            out[image, :, i0:i1, j0:j1] += (weight @ columns).reshape(m, i1 - i0, j1 - j0)
    if B is not None:
        out += B.reshape(1, m, 1, 1)
    if Z is not None:
        out += Z
    return _limited(out, limits)


def _tap_weights(W, ranges) -> list:
    """Each reaching tap's (M, C) weight, contiguous; empty when W is not all finite."""
    if not np.isfinite(W).all():
        return []
    return [np.ascontiguousarray(W[:, :, a, b]) for a, b, _, _ in ranges]


def _limited(y, limits):
    """The direct kernel's epilogue: values below zero times ``slope``, then clamped to
    [low, high] by comparisons (NaN passes through both)."""
    slope, low, high = limits
    if slope != 1.0:
        np.multiply(y, y.dtype.type(slope), out=y, where=y < 0)
    if low != -math.inf:
        np.copyto(y, y.dtype.type(low), where=y < low)
    if high != math.inf:
        np.copyto(y, y.dtype.type(high), where=y > high)
    return y
