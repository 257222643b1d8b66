"""MXNet's ``Pooling``: max, avg, sum and lp pooling with MXNet's window rules.

MXNet's windows start at ``i * stride - pad``; ``pooling_convention="full"`` adds windows
until the last one reaches past the data's end (the output size rounded up). Where MXNet and
ONNX's pools agree (the "valid" convention with every pad smaller than the kernel, the
common case) the layer is one ONNX pool with its ``pads``. Otherwise the padding is written
out (``Pad``, ``stride - 1`` more at the far end for "full", enough for the last window
whatever the data's size) and a plain pool runs over it, which gives MXNet's values where
ONNX's differ: a window wholly in the padding gives the dtype's lowest value (max) or 0, an
average divides by the part of its window inside the padded data (``count_include_pad``,
the default) or inside the data.
"""

from __future__ import annotations

import math

import numpy as np

POOL_TYPES = ("max", "avg", "sum", "lp")
CONVENTIONS = ("valid", "full")
_FLOAT = 1  # onnx.TensorProto.FLOAT


def Pooling(frontend, data=None, kernel=(), pool_type="max", global_pool=False,
            pooling_convention="valid", stride=(), pad=(), p_value=None,
            count_include_pad=None, layout=None, name=None, **unknown):
    """Max, average, sum or lp pooling (``(sum x^p)^(1/p)`` for ``p_value`` 1, 2 or 3,
    signed as MXNet's: no absolute value) over channels-first data (1 to 3 spatial axes).
    ``stride`` defaults to 1 and ``pad`` to 0; ``pooling_convention="full"`` rounds the
    output size up; ``count_include_pad`` (default True) makes an average divide by its
    window's part inside the padded data, pads included; ``global_pool`` pools each whole
    map (``kernel``, ``stride`` and ``pad`` ignored). MXNet's ``"same"`` convention is not
    supported."""
    layer = frontend("Pooling", name, unknown)
    pool_type = layer.choice("pool_type", pool_type, POOL_TYPES)
    convention = layer.choice("pooling_convention", pooling_convention, CONVENTIONS)
    if pool_type == "lp" and p_value not in (1, 2, 3):
        raise layer.error(f"pool_type='lp' needs p_value 1, 2 or 3, got {p_value!r}")
    include_pad = True if count_include_pad is None else layer.flag("count_include_pad",
                                                                    count_include_pad)
    if layer.flag("global_pool", global_pool):
        return _global_pool(layer, layer.data(data), pool_type, p_value)
    kernel = layer.kernel(kernel)
    layer.layout(layout, len(kernel))
    stride = layer.shape("stride", stride, length=len(kernel), default=1, minimum=1)
    pad = layer.shape("pad", pad, length=len(kernel), default=0)
    data = layer.data(data)
    sizes = layer.spatial_data(data, len(kernel))
    if sizes is not None and any(k > s + 2 * p for s, k, p in zip(sizes, kernel, pad)):
        raise layer.error(f"kernel={kernel} is larger than the padded data {tuple(sizes)} "
                          f"(pad={pad})")
    windows = _Windows(kernel, stride, pad, convention == "full")
    if pool_type == "max":
        return _max_pool(layer, data, windows)
    return _summed_pool(layer, data, windows, pool_type, p_value, include_pad)


class _Windows:
    """The windows along each spatial axis, and whether ONNX's pool attributes give them."""

    def __init__(self, kernel: tuple, stride: tuple, pad: tuple, full: bool):
        self.kernel, self.stride, self.pad, self.full = kernel, stride, pad, full
        # a window wholly in the padding needs a pad as large as the kernel, or "full"
        self.onnx_agrees = not full and all(p < k for p, k in zip(pad, kernel))
        self.size = math.prod(kernel)

    def attributes(self, with_pads: bool) -> dict:
        pads = list(self.pad) * 2 if with_pads else [0] * (2 * len(self.kernel))
        return {"kernel_shape": list(self.kernel), "strides": list(self.stride), "pads": pads}

    def extra(self) -> list:
        """More padding at the far end: ``stride - 1`` for "full" (a floor-mode pool then
        makes the ceil-mode count of windows, and no window reads past it), else none."""
        return [s - 1 if self.full else 0 for s in self.stride]

    def padded(self, layer, value, fill, role: str, extra_fill=None):
        """``value`` with each axis padded as MXNet's windows see it, filled with ``fill``
        (the far end's extra with ``extra_fill``, where that differs)."""
        zeros = [0] * len(self.pad)
        if extra_fill is None or not any(self.extra()):
            ends = [p + e for p, e in zip(self.pad, self.extra())]
            return _pad(layer, value, self.pad, ends, fill, role)
        value = _pad(layer, value, self.pad, self.pad, fill, f"{role}_inner")
        return _pad(layer, value, zeros, self.extra(), extra_fill, role)


def _pad(layer, value, begins, ends, fill, role: str):
    pads = layer.ints([0, 0, *begins, 0, 0, *ends])
    return layer.node("Pad", [value, pads, layer.scalar(fill, value, f"{role}_fill")], role,
                      mode="constant")


def _lowest(layer, data) -> float:
    """The dtype's lowest value, MXNet's max over nothing (float32's where the dtype is
    not known yet)."""
    dtype = layer.known_dtype(data) or np.dtype(np.float32)
    return float((np.finfo if dtype.kind == "f" else np.iinfo)(dtype).min)


def _max_pool(layer, data, windows: _Windows):
    if windows.onnx_agrees:
        return layer.node("MaxPool", [data], **windows.attributes(with_pads=True))
    padded = windows.padded(layer, data, _lowest(layer, data), "padded")
    return layer.node("MaxPool", [padded], **windows.attributes(with_pads=False))


def _summed_pool(layer, data, windows: _Windows, pool_type, p_value, include_pad):
    """avg, sum and lp pooling from one ``AveragePool``."""
    powered = _powered(layer, data, pool_type, p_value)
    final = None if pool_type == "avg" else "average"  # the layer's output node, or not
    if windows.onnx_agrees:
        means = layer.node("AveragePool", [powered], final, count_include_pad=int(
            include_pad or pool_type != "avg"), **windows.attributes(with_pads=True))
        if pool_type == "avg":
            return means
    else:  # over zeros written out, the average is always the window's sum / its size
        means = layer.node("AveragePool", [windows.padded(layer, powered, 0.0, "padded")],
                           "average", **windows.attributes(with_pads=False))
        if pool_type == "avg":
            return layer.node("Mul", [means, _average_factor(layer, data, windows,
                                                             include_pad)])
    return _rooted(layer, means, layer.scalar(windows.size, data, "size"), pool_type,
                   p_value)


def _powered(layer, data, pool_type, p_value):
    if pool_type != "lp" or p_value == 1:
        return data
    square = layer.node("Mul", [data, data], "square")
    return square if p_value == 2 else layer.node("Mul", [square, data], "cube")


def _rooted(layer, means, count, pool_type, p_value):
    """The layer's output from the windows' means (of ``x ** p_value`` for lp) and the
    number of entries each averages: their sums, or the sums' p-th roots."""
    if pool_type == "sum" or p_value == 1:
        return layer.node("Mul", [means, count])
    sums = layer.node("Mul", [means, count], "sum")
    if p_value == 2:
        return layer.node("Sqrt", [sums])
    cube_root = layer.node("Pow", [layer.node("Abs", [sums], "magnitude"),
                                   layer.scalar(1.0 / 3.0, sums, "third")], "cube_root")
    return layer.node("Mul", [layer.node("Sign", [sums], "sign"), cube_root])


def _average_factor(layer, data, windows: _Windows, include_pad: bool):
    """``size / count`` per window (0 where it counts nothing), in the data's dtype: count
    is how much of the window lies in the padded data (``include_pad``) or in the data,
    found by pooling a map of ones over the data's spatial shape."""
    # ones of shape (1, 1, *spatial), made from the data so that shape inference follows
    # (x > x is false everywhere, NaN included)
    first = layer.node("Slice", [data, layer.ints([0, 0]), layer.ints([1, 1]),
                                 layer.ints([0, 1])], "first_map")
    never = layer.node("Greater", [first, first], "never")
    ones = layer.node("Cast", [layer.node("Not", [never], "always")], "ones", to=_FLOAT)
    inside = windows.padded(layer, ones, 1.0 if include_pad else 0.0, "ones_padded",
                            extra_fill=0.0)
    counts = layer.node("AveragePool", [inside], "counts", **windows.attributes(False))
    size = layer.scalar(1.0, counts, "one")  # counts are fractions of the window here
    some = layer.node("Greater", [counts, layer.scalar(0.0, counts, "zero")], "counted")
    factor = layer.node("Div", [size, layer.node("Max", [counts, layer.scalar(
        1.0 / windows.size, counts, "least")], "at_least_one")], "inverse")
    kept = layer.node("Where", [some, factor, layer.scalar(0.0, counts, "none")], "factor")
    return layer.node("CastLike", [kept, data], "factor_cast")


def _global_pool(layer, data, pool_type: str, p_value):
    if pool_type == "max":
        return layer.node("GlobalMaxPool", [data])
    powered = _powered(layer, data, pool_type, p_value)
    if pool_type == "avg":
        return layer.node("GlobalAveragePool", [powered])
    means = layer.node("GlobalAveragePool", [powered], "average")
    # the sum: the average times the number of pooled elements (the data's rank may not be
    # known here, so no ReduceSum over "every axis after the channels")
    sizes = layer.node("Shape", [data], "spatial_shape", start=2)
    count = layer.node("ReduceProd", [sizes], "count", keepdims=0)
    return _rooted(layer, means, layer.node("CastLike", [count, data], "size"), pool_type,
                   p_value)
