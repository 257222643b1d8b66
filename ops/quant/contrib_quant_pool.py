"""onnxruntime's quantized pools of the ``com.microsoft`` domain: QLinearGlobalAveragePool
and QLinearAveragePool, both in NCHW or, with ``channels_last``, NHWC layout.

As in ``contrib_quant.py``, each follows onnxruntime's CPU kernel so that the integer outputs
are the same: the global pool sums the codes exactly in integers and scales the sum once by
``x_scale / (y_scale * size)`` in float32; the windowed pool dequantizes to float32, adds the
window's values one after the other in float32 (row-major over the window, as onnxruntime
loops), divides by the count and quantizes with the zero point added before rounding. A window
that covers the whole unpadded input makes onnxruntime fall back to the global pool's
arithmetic, and so does ours.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from mixrt.ops.quant.contrib_quant import (COM_MICROSOFT, INT8S, as_f32, one_value, requantize,
                                     require_dtype, require_float_scales, require_per_tensor,
                                     zero_point_or_zero)
from mixrt.ops.conv.conv import pad_spatial, strided_span
from mixrt.ops.conv.windows import spatial_attrs, window_geometry
from mixrt.ops.quant.quantize import saturate_to
from mixrt.ops.ir.registry import REGISTRY, op
from mixrt.ops.ir.types import TensorType, shape_text


def _to_channels_first(xp, X, channels_last):
    return xp.moveaxis(X, -1, 1) if channels_last else X


def _from_channels_first(xp, Y, channels_last):
    return xp.ascontiguousarray(xp.moveaxis(Y, 1, -1)) if channels_last else Y


def _require_image(op_type, rank) -> None:
    if rank < 3:
        raise ValueError(f"{op_type}: X has rank {rank}; expected at least 3 (N, C and one "
                         f"or more spatial dims)")


# -- QLinearGlobalAveragePool ------------------------------------------------------------------

def _global_average(xp, X, x_scale, x_zero, y_scale, y_zero):
    """The mean over every axis but the first two of channels-first ``X``, kept as 1s: the
    exact integer sum, less the zero point per element, times x_scale / (y_scale * size)."""
    axes = tuple(range(2, X.ndim))
    size = math.prod(X.shape[2:])
    scale = as_f32(x_scale) / (as_f32(y_scale) * np.float32(size))
    total = X.astype(np.int64).sum(axis=axes, keepdims=True) - x_zero.astype(np.int64) * size
    return requantize(xp, total.astype(np.float32) * scale, y_zero, X.dtype)


@op("QLinearGlobalAveragePool", since=1, domain=COM_MICROSOFT, dtypes=INT8S)
def qlinear_global_average_pool(xp, X, x_scale, x_zero_point, y_scale, y_zero_point=None, *,
                                channels_last=0):
    name = "QLinearGlobalAveragePool"
    _require_image(name, X.ndim)
    pooled = _global_average(
        xp, _to_channels_first(xp, X, channels_last), one_value(name, "x_scale", x_scale),
        zero_point_or_zero(xp, name, "x_zero_point", x_zero_point, X.dtype),
        one_value(name, "y_scale", y_scale),
        zero_point_or_zero(xp, name, "y_zero_point", y_zero_point, X.dtype))
    return _from_channels_first(xp, pooled, channels_last)


def _require_pool_params(op_type, X, x_scale, x_zero_point, y_scale, y_zero_point) -> None:
    if y_scale is None:
        raise ValueError(f"{op_type}: the y_scale input is required")
    require_dtype(op_type, X.dtype, x_zero_point=x_zero_point, y_zero_point=y_zero_point)
    require_float_scales(op_type, x_scale=x_scale, y_scale=y_scale)
    require_per_tensor(op_type, x_scale=x_scale, x_zero_point=x_zero_point, y_scale=y_scale,
                       y_zero_point=y_zero_point)


@qlinear_global_average_pool.infer
def _(X, x_scale, x_zero_point, y_scale, y_zero_point=None, *, channels_last=0, **_):
    name = "QLinearGlobalAveragePool"
    _require_pool_params(name, X, x_scale, x_zero_point, y_scale, y_zero_point)
    if X.shape is None:
        return [TensorType(X.dtype, None)]
    _require_image(name, len(X.shape))
    shape = list(X.shape)
    spatial = range(1, len(shape) - 1) if channels_last else range(2, len(shape))
    for axis in spatial:
        shape[axis] = 1
    return [TensorType(X.dtype, tuple(shape))]


# -- QLinearAveragePool ------------------------------------------------------------------------

def _window_sum(xp, real, kernel, strides, begin, end, out):
    """Each window's float32 sum, its values added one at a time in row-major window order
    (the padding adds zeros, which change no float32 sum)."""
    overhang = [max(0, (o - 1) * s + k - (i + b + e)) for o, s, k, i, b, e in
                zip(out, strides, kernel, real.shape[2:], begin, end)]
    padded = pad_spatial(xp, real, begin, [e + x for e, x in zip(end, overhang)], 0)
    total = None
    for offset in itertools.product(*(range(k) for k in kernel)):
        window = tuple(strided_span(o, s, n) for o, s, n in zip(offset, strides, out))
        part = padded[(Ellipsis,) + window]
        total = part.copy() if total is None else total + part
    return total


def _window_counts(xp, in_dims, kernel, strides, begin, out):
    """How many input elements each window covers (padding and overhang excluded): per
    axis the clipped window length, multiplied across axes."""
    counts = xp.ones((), dtype=np.float32)
    for axis, (size, k, s, b, n) in enumerate(zip(in_dims, kernel, strides, begin, out)):
        starts = xp.arange(n) * s - b
        length = xp.minimum(starts + k, size) - xp.maximum(starts, 0)
        shape = [1] * len(in_dims)
        shape[axis] = n
        counts = counts * length.astype(np.float32).reshape(shape)
    return counts


def _average_pool(xp, X, x_scale, x_zero, y_scale, y_zero, attrs):
    nd = X.ndim - 2
    kernel, strides, _ = spatial_attrs(nd, attrs["kernel_shape"], attrs["strides"])
    in_dims = list(X.shape[2:])
    begin, end, out = window_geometry(in_dims, kernel, strides, [1] * nd, attrs["pads"],
                                      attrs["auto_pad"], bool(attrs["ceil_mode"]))
    if kernel == in_dims and not any(begin) and not any(end):
        return _global_average(xp, X, x_scale, x_zero, y_scale, y_zero)
    real = as_f32(x_scale) * (X.astype(np.int32) - x_zero.astype(np.int32)).astype(np.float32)
    total = _window_sum(xp, real, kernel, strides, begin, end, out)
    counts = np.float32(math.prod(kernel)) if attrs["count_include_pad"] else \
        _window_counts(xp, in_dims, kernel, strides, begin, out)
    mean = total / counts
    # onnxruntime adds the zero point before rounding here (its quantize_value)
    return saturate_to(xp, xp.rint(mean / as_f32(y_scale) + as_f32(y_zero)), X.dtype)


@op("QLinearAveragePool", since=1, domain=COM_MICROSOFT, dtypes=INT8S)
def qlinear_average_pool(xp, X, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *,
                         auto_pad="NOTSET", ceil_mode=0, channels_last=0, count_include_pad=0,
                         kernel_shape=None, pads=None, strides=None):
    """AveragePool of the dequantized input, quantized; ``count_include_pad`` divides by
    the kernel's size (ceil_mode's overhang included, as onnxruntime does)."""
    name = "QLinearAveragePool"
    _require_image(name, X.ndim)
    if kernel_shape is None:
        raise ValueError(f"{name}: the kernel_shape attribute is required")
    attrs = dict(auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                 kernel_shape=kernel_shape, pads=pads, strides=strides)
    pooled = _average_pool(
        xp, _to_channels_first(xp, X, channels_last), one_value(name, "x_scale", x_scale),
        zero_point_or_zero(xp, name, "x_zero_point", x_zero_point, X.dtype),
        one_value(name, "y_scale", y_scale),
        zero_point_or_zero(xp, name, "y_zero_point", y_zero_point, X.dtype), attrs)
    return _from_channels_first(xp, pooled, channels_last)


@qlinear_average_pool.infer
def _(X, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *, channels_last=0,
      kernel_shape=None, **attrs):
    name = "QLinearAveragePool"
    _require_pool_params(name, X, x_scale, x_zero_point, y_scale, y_zero_point)
    if kernel_shape is None:
        raise ValueError(f"{name}: the kernel_shape attribute is required")
    if X.shape is None:
        return [TensorType(X.dtype, None)]
    _require_image(name, len(X.shape))
    if len(kernel_shape) != len(X.shape) - 2:
        raise ValueError(f"{name}: kernel_shape {list(kernel_shape)} does not fit X "
                         f"{shape_text(X.shape)} ({len(X.shape) - 2} spatial dims)")
    shape = tuple(X.shape)
    if channels_last:
        shape = (shape[0], shape[-1], *shape[1:-1])
    attrs.pop("count_include_pad", None)
    average_infer = REGISTRY.find("", "AveragePool", 19).infer_fn
    pooled = average_infer(TensorType(X.dtype, shape), kernel_shape=kernel_shape,
                           **attrs)[0].shape
    if channels_last and pooled is not None:
        pooled = (pooled[0], *pooled[2:], pooled[1])
    return [TensorType(X.dtype, pooled)]
