"""Gradients of Col2Im and DeformConv (conv.py).

* Col2Im folds columns into an image, so its gradient is the unfolding, im2col: the
  windows of the padded gradient image, read as columns (``Col2ImGrad``). That is linear,
  and its own gradient is Col2Im again, so second order comes for free.
* DeformConv samples X at learned fractional positions (multilinear interpolation), scales
  each sample by the mask, and multiplies the columns with W. ``DeformConvGrad`` walks the
  same interpolation corners backwards: dW is dY times the columns; the columns' gradient
  is W^T dY; dX scatters it onto the corners' pixels by their weights (a bincount, CuPy's
  too); the offsets' gradient is it times the pixel values times the weights' slopes; the
  mask's is it times the unmasked samples. It has no gradient of its own (second order
  through DeformConv is an error naming the node).

Every kernel takes ``xp`` and works on NumPy and CuPy alike.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.conv import conv as cv
from mixrt.ops.conv.conv_grad import forwarded, optional_input
from mixrt.ops.training.grad_support import MIXRT
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import to_host

COL2IM_ATTRIBUTES = ("dilations", "pads", "strides")
DEFORM_ATTRIBUTES = ("dilations", "group", "kernel_shape", "offset_group", "pads", "strides")


# -- Col2Im -------------------------------------------------------------------------------

@op("Col2ImGrad", since=1, domain=MIXRT)
def col2im_grad(xp, dY, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """im2col of ``dY`` (N, C, *image_shape): the (N, C*prod(block), L) columns Col2Im
    would fold into it."""
    image_dims = [int(v) for v in np.asarray(to_host(image_shape)).reshape(-1)]
    block = [int(v) for v in np.asarray(to_host(block_shape)).reshape(-1)]
    kernel, strides, dilations = cv.spatial_attrs(len(image_dims), block, strides, dilations)
    begin, end, blocks = cv.window_geometry(image_dims, kernel, strides, dilations, pads)
    padded = cv.pad_spatial(xp, dY, begin, end)
    windows = cv.sliding_windows(xp, padded, kernel, strides, dilations, blocks)
    n, c = dY.shape[:2]
    return xp.ascontiguousarray(windows).reshape(n, c * math.prod(kernel), math.prod(blocks))


@col2im_grad.infer
def _(dY, image_shape, block_shape, **_):
    channels = None
    if dY.shape is not None and block_shape is not None and block_shape.value is not None \
            and isinstance(dY.shape[1], int):
        channels = dY.shape[1] * int(np.prod(np.asarray(block_shape.value)))
    batch = None if dY.shape is None else dY.shape[0]
    return [TensorType(dY.dtype, (batch, channels, None))]


@cv.col2im.grad
def _(b, node, dy):
    image_shape, block_shape = node.inputs[1:3]
    columns = b.emit("Col2ImGrad", dy[0], image_shape, block_shape, domain=MIXRT,
                     **forwarded(node, COL2IM_ATTRIBUTES))
    return [columns, None, None]


@col2im_grad.grad
def _(b, node, dy):
    # linear in dY: its adjoint is the fold, Col2Im itself
    dY, image_shape, block_shape = node.inputs
    folded = b.emit("Col2Im", dy[0], image_shape, block_shape, opset=18,
                    **forwarded(node, COL2IM_ATTRIBUTES))
    return [folded, None, None]


# -- DeformConv ---------------------------------------------------------------------------

@op("DeformConvGrad", since=1, domain=MIXRT)
def deform_conv_grad(xp, dY, X, W, offset, mask=None, *, dilations=None, group=1,
                     kernel_shape=None, offset_group=1, pads=None, strides=None, input_grad=1,
                     offset_grad=1, mask_grad=0, weight_grad=0, bias_grad=0):
    """Those of dX, d offset, d mask, dW and dB of DeformConv whose flag is set, in that
    order."""
    out_dtype, dtype = X.dtype, cv.work_dtype(X.dtype)
    X, W, offset, dY = (a.astype(dtype, copy=False) for a in (X, W, offset, dY))
    where = cv.DeformGeometry.of(X.shape, W.shape, kernel_shape, strides, dilations, pads,
                                 group, offset_group)
    images = where.grouped_image(X)  # (N, OG, C/OG, P)
    masks = None if mask is None else where.grouped_mask(mask.astype(dtype, copy=False))
    corners = list(cv.multilinear_corners(xp, where.positions(xp, offset), where.in_dims,
                                          slopes=bool(offset_grad)))
    values = [cv.gather_corner(xp, images, corner) for corner in corners]
    sampled = sum(v * corner.weight for v, corner in zip(values, corners))
    n, m = dY.shape[:2]
    dy = dY.reshape(n, where.group, m // where.group, where.length)
    grads = []
    if input_grad or offset_grad or (mask_grad and mask is not None):
        # the data side: the columns' gradient W^T dY (the weight-side node skips it)
        w = W.reshape(where.group, m // where.group, -1)
        d_columns = xp.matmul(w.swapaxes(-1, -2), dy).reshape(sampled.shape)
        d_sampled = d_columns if masks is None else d_columns * masks
        if input_grad:
            grads.append(_scatter_to_image(xp, d_sampled, corners, images.shape)
                         .reshape(X.shape))
        if offset_grad:
            grads.append(_offset_grad(xp, d_sampled, corners, values, where)
                         .reshape(offset.shape))
        if mask_grad and mask is not None:
            grads.append((d_columns * sampled).sum(axis=2).reshape(mask.shape))
    if weight_grad:
        masked = sampled if masks is None else sampled * masks
        columns = where.columns(masked)
        grads.append(xp.matmul(dy, columns.swapaxes(-1, -2)).sum(axis=0).reshape(W.shape))
    if bias_grad:
        grads.append(dY.sum(axis=(0,) + tuple(range(2, dY.ndim))))
    grads = [g.astype(out_dtype, copy=False) for g in grads]
    return grads[0] if len(grads) == 1 else tuple(grads)


def _scatter_to_image(xp, d_sampled, corners, image_shape):
    """dX: each sample's gradient added onto its corners' pixels, by their weights."""
    n, g, cg, pixels = image_shape
    size = n * g * cg * pixels
    base = (xp.arange(n * g * cg, dtype=np.int64) * pixels).reshape(n, g, cg, 1)
    total = xp.zeros(size, dtype=d_sampled.dtype)
    for corner in corners:
        index = (base + corner.index).reshape(-1)
        weights = (d_sampled * corner.weight).reshape(-1)
        total += xp.bincount(index, weights=weights, minlength=size).astype(
            d_sampled.dtype, copy=False)
    return total


def _offset_grad(xp, d_sampled, corners, values, where):
    """d offset, laid out as the offsets are: (N, OG, K, axis, L)."""
    nd = len(where.kernel)
    n, g = d_sampled.shape[:2]
    per_axis = [0] * nd
    for corner, value in zip(corners, values):
        along = (d_sampled * value).sum(axis=2)  # (N, OG, K*L): over the group's channels
        for a in range(nd):
            per_axis[a] = per_axis[a] + along * corner.slopes[a][:, :, 0]
    return xp.stack([p.reshape(n, g, where.taps, where.length) for p in per_axis], axis=3)


@deform_conv_grad.infer
def _(dY, X, W, offset, mask=None, *, input_grad=1, offset_grad=1, mask_grad=0,
      weight_grad=0, bias_grad=0, **_):
    types = []
    if input_grad:
        types.append(TensorType(X.dtype, X.shape))
    if offset_grad:
        types.append(TensorType(X.dtype, offset.shape))
    if mask_grad and mask is not None:
        types.append(TensorType(X.dtype, mask.shape))
    if weight_grad:
        types.append(TensorType(X.dtype, W.shape))
    if bias_grad:
        types.append(TensorType(X.dtype, None if W.shape is None else (W.shape[0],)))
    return types


@cv.deform_conv.grad
def _(b, node, dy):
    """Two backward nodes, so that dead-node elimination drops the one a training graph
    does not need: the data side (dX, d offset, d mask) and the weight side (dW, dB)."""
    x, w, offset = node.inputs[:3]
    bias, mask = optional_input(node, 3), optional_input(node, 4)
    attributes = forwarded(node, DEFORM_ATTRIBUTES)
    data = b.emit("DeformConvGrad", dy[0], x, w, offset, mask, domain=MIXRT,
                  mask_grad=int(mask is not None), outputs=3 if mask else 2, **attributes)
    weights = b.emit("DeformConvGrad", dy[0], x, w, offset, mask, domain=MIXRT, input_grad=0,
                     offset_grad=0, weight_grad=1, bias_grad=int(bias is not None),
                     outputs=2 if bias else 1, **attributes)
    d_x, d_offset = data[:2]
    d_mask = data[2] if mask else None
    d_w, d_bias = (weights if bias else (weights, None))
    return [d_x, d_w, d_offset, d_bias, d_mask][:len(node.inputs)]
