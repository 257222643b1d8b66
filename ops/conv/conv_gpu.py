"""Conv and its gradient on a GPU through cuDNN (``cudnn.py``), registered beside the generic
im2col kernels, which stay where cuDNN cannot take a convolution: cuDNN absent, mixed
operand dtypes, more than three spatial axes, an empty tensor.

ONNX says more than cuDNN takes, so a convolution is brought to cuDNN's form first:

* **Pads.** cuDNN pads each axis by one amount on both sides; ONNX's begin and end pads may
  differ (SAME_UPPER with an even input and stride 2). The common part goes to cuDNN and the
  rest is padded into the input beforehand; the data gradient is cropped back.
* **1-D.** cuDNN's tensors have at least two spatial axes: a 1-D convolution runs as a 2-D
  one whose second axis has size 1.
"""

from __future__ import annotations

import functools
import math

from mixrt.ops.conv import cudnn
from mixrt.ops.conv.conv import conv, conv_geometry, crop_spatial, pad_spatial, work_dtype
from mixrt.ops.conv.conv_grad import _bias_grad, conv_grad

MAX_SPATIAL_AXES = 3  # cuDNN's convolutions take 4-D and 5-D tensors


@functools.lru_cache(maxsize=1024)
def _layout(x_shape: tuple, w_shape: tuple, kernel: tuple, strides: tuple, dilations: tuple,
            group: int, begin: tuple, end: tuple, out: tuple):
    """(cuDNN's geometry, the pads put into the input beforehand (begin, end), whether the
    convolution is a 1-D one run as 2-D)."""
    common = tuple(min(b, e) for b, e in zip(begin, end))
    extra_begin = tuple(b - c for b, c in zip(begin, common))
    extra_end = tuple(e - c for e, c in zip(end, common))
    padded = tuple(i + b + e for i, b, e in zip(x_shape[2:], extra_begin, extra_end))
    flat = len(kernel) == 1
    tail = (1,) if flat else ()
    geometry = cudnn.Geometry(
        x_shape=tuple(x_shape[:2]) + padded + tail,
        w_shape=tuple(w_shape[:2]) + tuple(kernel) + tail,
        y_shape=(x_shape[0], w_shape[0]) + tuple(out) + tail,
        pads=common + (0,) * flat, strides=tuple(strides) + tail,
        dilations=tuple(dilations) + tail, group=group)
    return geometry, extra_begin, extra_end, flat


def _cudnn_layout(X, W, B, attributes: dict):
    """The layout above when cuDNN takes this convolution, else None."""
    if X.dtype != W.dtype or (B is not None and B.dtype != X.dtype) \
            or not cudnn.supports(X.dtype) or not 1 <= X.ndim - 2 <= MAX_SPATIAL_AXES \
            or X.size == 0 or W.size == 0 or not cudnn.available():
        return None
    kernel, strides, dilations, group, begin, end, out = conv_geometry(X, W, **attributes)
    if min(out) <= 0:
        return None
    return _layout(tuple(X.shape), tuple(W.shape), tuple(kernel), tuple(strides),
                   tuple(dilations), group, tuple(begin), tuple(end), tuple(out))


def _attributes(auto_pad, dilations, group, kernel_shape, pads, strides) -> dict:
    return dict(auto_pad=auto_pad, dilations=dilations, group=group,
                kernel_shape=kernel_shape, pads=pads, strides=strides)


def _as_cudnn_input(xp, X, layout):
    geometry, extra_begin, extra_end, _ = layout
    x = pad_spatial(xp, X, extra_begin, extra_end)
    return xp.ascontiguousarray(x).reshape(geometry.x_shape)


@conv.fast("gpu")
def conv_gpu(xp, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
             kernel_shape=None, pads=None, strides=None, out=None):
    """cuDNN's forward convolution into ``out`` (the arena's view) when given, then the bias
    added in place."""
    attributes = _attributes(auto_pad, dilations, group, kernel_shape, pads, strides)
    layout = _cudnn_layout(X, W, B, attributes)
    if layout is None:
        return conv(xp, X, W, B, **attributes)
    geometry = layout[0]
    into = out if out is not None and out.flags.c_contiguous else None
    y = cudnn.forward(xp, _as_cudnn_input(xp, X, layout),
                      xp.ascontiguousarray(W).reshape(geometry.w_shape), geometry,
                      out=None if into is None else into.reshape(geometry.y_shape))
    y = into if into is not None else y.reshape(geometry.y_shape[:X.ndim])
    if B is not None:
        y += B.reshape((1, -1) + (1,) * (X.ndim - 2))
    return y


def _writable(out, like, shape: tuple):
    """``out`` as cuDNN's operand of ``shape`` where it can write there (a contiguous array
    of ``like``'s shape and dtype, ``shape`` being that one with no pads added), else None."""
    if out is None or out.shape != like.shape or out.dtype != like.dtype \
            or not out.flags.c_contiguous or math.prod(shape) != out.size:
        return None
    return out.reshape(shape)


@conv_grad.fast("gpu")
def conv_grad_gpu(xp, dY, X, W, *, auto_pad="NOTSET", dilations=None, group=1,
                  kernel_shape=None, pads=None, strides=None, input_grad=1, weight_grad=1,
                  bias_grad=0, out=None):
    """Those of dX (cuDNN's data gradient), dW (its filter gradient) and dB whose flag is
    set, in that order; the first written by cuDNN into ``out`` (the arena's view of it)
    when given, rather than copied there by the run loop."""
    attributes = _attributes(auto_pad, dilations, group, kernel_shape, pads, strides)
    layout = _cudnn_layout(X, W, None, attributes) if dY.dtype == X.dtype else None
    if layout is None:
        return conv_grad(xp, dY, X, W, **attributes, input_grad=input_grad,
                         weight_grad=weight_grad, bias_grad=bias_grad)
    geometry, extra_begin, _, _ = layout
    dy = xp.ascontiguousarray(dY).reshape(geometry.y_shape)
    grads = []
    if input_grad:
        into = _writable(out, X, geometry.x_shape)
        dx = cudnn.data_gradient(xp, dy, xp.ascontiguousarray(W).reshape(geometry.w_shape),
                                 geometry, out=into)
        if into is not None:
            grads.append(out)
            out = None
        dx = dx.reshape(geometry.x_shape[:X.ndim])
        if any(d != x for d, x in zip(dx.shape, X.shape)):  # the pads put into the input
            dx = xp.ascontiguousarray(crop_spatial(xp, dx, extra_begin, X.shape[2:]))
        if not grads:
            grads.append(dx)
    if weight_grad:
        into = _writable(out, W, geometry.w_shape) if not grads else None
        dw = cudnn.filter_gradient(xp, dy, _as_cudnn_input(xp, X, layout), geometry, out=into)
        grads.append(out if into is not None else dw.reshape(W.shape))
    if bias_grad:
        grads.append(_bias_grad(dY, work_dtype(dY.dtype)))
    return grads[0] if len(grads) == 1 else tuple(grads)
