"""Gradients of the convolutions and pools (conv.py, pool.py).

Both are built from conv.py's two window primitives, used the other way round:

* Conv's dW multiplies dY with the im2col columns of the padded input (``sliding_windows``),
  and its dX multiplies W^T with dY and scatters those columns back into an image (``fold``,
  one strided slice add per kernel tap);
* ConvTranspose is Conv's adjoint, so its dX *is* a Conv of the uncropped dY and its dW is
  Conv's dW with the roles of image and gradient swapped;
* a pool's dX adds, for each kernel tap, an output-shaped slice into the padded input's
  gradient, then crops the padding away.

Every kernel takes ``xp`` and works on NumPy and CuPy alike; none loops over pixels.
See runtime/passes/autodiff.py for the calling convention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mixrt.base.errors import GradientError
from mixrt.ops.conv import conv as cv
from mixrt.ops.conv.windows import CONV_ATTRIBUTES
from mixrt.ops.pool import pool
from mixrt.ops.training.grad_support import MIXRT, widened
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType

CONV_TRANSPOSE_ATTRIBUTES = CONV_ATTRIBUTES + ("output_padding", "output_shape")
POOL_ATTRIBUTES = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")
_COLUMNS_BUDGET = 256 << 20  # bytes of im2col columns built at once (as the forward does)


def forwarded(node, names) -> dict:
    """The forward node's attributes among ``names`` (absent ones keep the kernel's default)."""
    return {key: node.attributes[key] for key in names if key in node.attributes}


def optional_input(node, index: int) -> str | None:
    return node.inputs[index] if len(node.inputs) > index and node.inputs[index] else None


def _selected(grads: list):
    """One array, or a tuple when the node asked for several gradients."""
    return grads[0] if len(grads) == 1 else tuple(grads)


# -- the two window products behind every convolution gradient -----------------------------

@dataclass(frozen=True)
class _Taps:
    """Where a convolution's windows sit: one value per spatial axis."""

    kernel: list
    strides: list
    dilations: list
    group: int
    out: list  # windows along each axis


def _batch_parts(n: int, bytes_per_sample: int):
    """Slices of the batch whose columns fit in the budget (bounds memory on big batches)."""
    step = max(1, _COLUMNS_BUDGET // max(bytes_per_sample, 1))
    for start in range(0, n, step):
        yield slice(start, min(start + step, n))


def _weight_grad(xp, dy, image, taps: _Taps):
    """dW (G, M/G, C/G * prod(kernel)) of a convolution of the padded ``image`` (N, C, ...)
    whose output gradient is ``dy`` (N, G, M/G, L): one matmul per batch part over columns
    laid out (G, C/G * K, N * L), so the batch folds into the product's inner axis."""
    nd = len(taps.kernel)
    (n, c), g = image.shape[:2], taps.group
    rows, length = c // g * math.prod(taps.kernel), math.prod(taps.out)
    dw = xp.zeros((g, dy.shape[2], rows), dtype=dy.dtype)
    for part in _batch_parts(n, rows * g * length * dy.dtype.itemsize):
        windows = cv.sliding_windows(xp, image[part], taps.kernel, taps.strides,
                                     taps.dilations, taps.out)
        count = windows.shape[0]
        windows = windows.reshape((count, g, c // g) + windows.shape[2:])
        order = (1, 2) + tuple(range(3, 3 + nd)) + (0,) + tuple(range(3 + nd, 3 + 2 * nd))
        cols = windows.transpose(order).reshape(g, rows, count * length)
        grads = dy[part].transpose(1, 2, 0, 3).reshape(g, dy.shape[2], count * length)
        dw += xp.matmul(grads, cols.transpose(0, 2, 1))
    return dw


def _input_grad(xp, dy, W, x_shape, taps: _Taps, begin, end):
    """dX (N, C, *in) of a convolution: columns W^T dY per group, folded back onto the padded
    image one kernel tap at a time, then cropped to the unpadded input."""
    (n, c), in_dims, g = x_shape[:2], tuple(x_shape[2:]), taps.group
    weights_t = W.reshape(g, W.shape[0] // g, -1).transpose(0, 2, 1)  # (G, C/G*K, M/G)
    padded = [i + b + e for i, b, e in zip(in_dims, begin, end)]
    crop = (Ellipsis,) + tuple(slice(b, b + i) for b, i in zip(begin, in_dims))
    col_shape = (c,) + tuple(taps.kernel) + tuple(taps.out)
    dx = xp.empty((n, c) + in_dims, dtype=dy.dtype)
    for part in _batch_parts(n, math.prod(col_shape) * dy.dtype.itemsize):
        cols = xp.matmul(weights_t, dy[part])  # (n', G, C/G*K, L)
        cols = cols.reshape((cols.shape[0],) + col_shape)
        dx[part] = cv.fold(xp, cols, taps.strides, taps.dilations, padded)[crop]
    return dx


def _bias_grad(dY, dtype):
    """dY summed over all but its channel axis, accumulated in ``dtype`` (float32 for a
    half-precision dY) and given back in dY's dtype."""
    axes = (0,) + tuple(range(2, dY.ndim))
    return dY.sum(axis=axes, dtype=dtype).astype(dY.dtype, copy=False)


# -- Conv ---------------------------------------------------------------------------------

@op("ConvGrad", since=1, domain=MIXRT)
def conv_grad(xp, dY, X, W, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
              pads=None, strides=None, input_grad=1, weight_grad=1, bias_grad=0):
    """Those of dX, dW and dB of Conv whose flag is set, in that order."""
    dtype = cv.work_dtype(np.result_type(X.dtype, W.dtype))
    kernel, strides, dilations, group, begin, end, out = cv.conv_geometry(
        X, W, auto_pad, dilations, group, kernel_shape, pads, strides)
    taps = _Taps(kernel, strides, dilations, group, out)
    n, m = dY.shape[:2]
    dy = dY.astype(dtype, copy=False).reshape(n, group, m // group, math.prod(out))
    grads = []
    if input_grad:
        dx = _input_grad(xp, dy, W.astype(dtype, copy=False), X.shape, taps, begin, end)
        grads.append(dx.astype(X.dtype, copy=False))
    if weight_grad:
        image = cv.pad_spatial(xp, X.astype(dtype, copy=False), begin, end)
        dw = _weight_grad(xp, dy, image, taps).reshape(W.shape)
        grads.append(dw.astype(W.dtype, copy=False))
    if bias_grad:
        grads.append(_bias_grad(dY, dtype))
    return _selected(grads)


def _flagged_types(X, W, out_channels, input_grad, weight_grad, bias_grad):
    types = []
    if input_grad:
        types.append(TensorType(X.dtype, X.shape))
    if weight_grad:
        types.append(TensorType(W.dtype, W.shape))
    if bias_grad:
        types.append(TensorType(X.dtype, (out_channels,)))
    return types


@conv_grad.infer
def _(dY, X, W, *, input_grad=1, weight_grad=1, bias_grad=0, **_):
    channels = None if W.shape is None else W.shape[0]
    return _flagged_types(X, W, channels, input_grad, weight_grad, bias_grad)


def _conv_family_grad(op_type: str, attribute_names):
    """dX from one backward node and dW (with dB) from another, so that dead-node elimination
    drops whichever the training graph does not need (a first layer's dX, frozen weights)."""
    def grad(b, node, dy):
        x, w = node.inputs[:2]
        bias = optional_input(node, 2)
        attributes = forwarded(node, attribute_names)
        dx = b.emit(op_type, dy[0], x, w, domain=MIXRT, input_grad=1, weight_grad=0,
                    **attributes)
        weight_grads = b.emit(op_type, dy[0], x, w, domain=MIXRT, input_grad=0,
                              weight_grad=1, bias_grad=int(bias is not None),
                              outputs=2 if bias else 1, **attributes)
        if bias is None:
            return [dx, weight_grads]
        return [dx, *weight_grads]
    return grad


cv.conv.grad(_conv_family_grad("ConvGrad", CONV_ATTRIBUTES))


def _conv_family_second_order(forward: str, attribute_names):
    """The gradient of Conv's (or ConvTranspose's) gradient kernel, for autograd's
    create_graph (a gradient penalty on a CNN). dX is bilinear in (dY, W), dW in (dY, X) and
    dB linear in dY, so with incoming ddX, ddW, ddB: d/d dY = F(ddX, W) + F(X, ddW) + ddB per
    channel, F the forward; d/dX is the input gradient of F with weights ddW; d/dW the
    weight gradient of F fed ddX."""
    kernel = forward + "Grad"

    def grad(b, node, dd):
        dy, x, w = node.inputs[:3]
        flags = [node.attributes.get(k, d) for k, d in
                 (("input_grad", 1), ("weight_grad", 1), ("bias_grad", 0))]
        incoming = iter(dd)
        dd_x, dd_w, dd_b = (next(incoming) if flag else None for flag in flags)
        attributes = forwarded(node, attribute_names)
        to_dy, to_x, to_w = [], None, None
        if dd_x is not None:
            to_dy.append(b.emit(forward, dd_x, w, **attributes))
            to_w = b.emit(kernel, dy, dd_x, w, domain=MIXRT, input_grad=0, weight_grad=1,
                          **attributes)
        if dd_w is not None:
            to_dy.append(b.emit(forward, x, dd_w, **attributes))
            to_x = b.emit(kernel, dy, x, dd_w, domain=MIXRT, input_grad=1, weight_grad=0,
                          **attributes)
        if dd_b is not None:
            rank = b.known_rank(node, dy)
            channels = b.emit("Reshape", dd_b, b.ints([-1] + [1] * (rank - 2)))
            to_dy.append(b.emit("Expand", channels, b.emit("Shape", dy)))
        return [b.accumulate(to_dy), to_x, to_w]
    return grad


conv_grad.grad(_conv_family_second_order("Conv", CONV_ATTRIBUTES))


# -- ConvTranspose ------------------------------------------------------------------------

@op("ConvTransposeGrad", since=1, domain=MIXRT)
def conv_transpose_grad(xp, dY, X, W, *, auto_pad="NOTSET", dilations=None, group=1,
                        kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                        strides=None, input_grad=1, weight_grad=1, bias_grad=0):
    """Those of dX, dW and dB of ConvTranspose whose flag is set, in that order.

    The forward scatters W^T X into a full image and crops it; undoing the crop puts dY back
    in that full image, and the rest is Conv's own backward read the other way: dX is the
    Conv of it with W (no flip: W's (C, M/G, ...) layout is Conv's), dW is Conv's dW with X
    as the output gradient."""
    dtype = cv.work_dtype(np.result_type(X.dtype, W.dtype))
    nd, group = X.ndim - 2, int(group)
    kernel, strides, dilations = cv.spatial_attrs(nd, kernel_shape or W.shape[2:], strides,
                                                  dilations)
    in_dims = list(X.shape[2:])
    begin, _ = cv.convtranspose_geometry(in_dims, kernel, strides, dilations, pads, auto_pad,
                                         output_padding, output_shape)
    full = [s * (i - 1) + (k - 1) * d + 1
            for i, k, s, d in zip(in_dims, kernel, strides, dilations)]
    full_grad = cv.crop_spatial(xp, dY.astype(dtype, copy=False), [-b for b in begin], full)
    grads = []
    if input_grad:
        dx = cv.conv(xp, full_grad, W.astype(dtype, copy=False), dilations=dilations,
                     group=group, kernel_shape=kernel, strides=strides)
        grads.append(dx.astype(X.dtype, copy=False))
    if weight_grad:
        taps = _Taps(kernel, strides, dilations, group, in_dims)
        n, c = X.shape[:2]
        as_output_grad = X.astype(dtype, copy=False).reshape(n, group, c // group, -1)
        dw = _weight_grad(xp, as_output_grad, full_grad, taps).reshape(W.shape)
        grads.append(dw.astype(W.dtype, copy=False))
    if bias_grad:
        grads.append(_bias_grad(dY, dtype))
    return _selected(grads)


@conv_transpose_grad.infer
def _(dY, X, W, *, group=1, input_grad=1, weight_grad=1, bias_grad=0, **_):
    channels = None
    if W.shape is not None and isinstance(W.shape[1], int):
        channels = W.shape[1] * int(group)
    return _flagged_types(X, W, channels, input_grad, weight_grad, bias_grad)


cv.conv_transpose.grad(_conv_family_grad("ConvTransposeGrad", CONV_TRANSPOSE_ATTRIBUTES))
conv_transpose_grad.grad(_conv_family_second_order("ConvTranspose", CONV_TRANSPOSE_ATTRIBUTES))


# -- windowed pools -----------------------------------------------------------------------

def _padded_zeros(xp, X, windows, dtype):
    """Zeros shaped like X padded as the forward padded it (ceil_mode overhang included)."""
    spatial = tuple(i + b + e + x for i, b, e, x in
                    zip(X.shape[2:], windows.begin, windows.end, windows.extra))
    return xp.zeros(tuple(X.shape[:2]) + spatial, dtype=dtype)


def _unpadded(image, windows, in_dims):
    return image[(Ellipsis,) + tuple(slice(b, b + i) for b, i in zip(windows.begin, in_dims))]


@op("MaxPoolGrad", since=1, domain=MIXRT)
def max_pool_grad(xp, dY, X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None,
                  kernel_shape=None, pads=None, strides=None):
    """dX of MaxPool: each window's dY goes to its first maximal element in row-major tap
    order (PyTorch's rule). The winners are found again from X rather than by comparing with
    the forward's Y, which a recomputed (mirrored) or differently fused X need not match to
    the last bit."""
    windows = pool._windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    padded = windows.padded(xp, X, pool._lowest(X.dtype))
    winner = _first_max_taps(xp, windows.taps(xp, padded))
    image = _padded_zeros(xp, X, windows, dY.dtype)
    for tap, (_, target) in enumerate(windows.taps(xp, image)):
        target += dY * (winner == tap)
    return xp.ascontiguousarray(_unpadded(image, windows, X.shape[2:]))


def _first_max_taps(xp, taps):
    """For each window, the index of the first tap holding its maximum (later taps must be
    strictly larger to win)."""
    best = winner = None
    for tap, (_, seen) in enumerate(taps):
        if best is None:
            best, winner = seen.copy(), xp.zeros(seen.shape, dtype=np.int32)
            continue
        better = seen > best
        winner = xp.where(better, np.int32(tap), winner)
        xp.maximum(best, seen, out=best)
    return winner


@op("AveragePoolGrad", since=1, domain=MIXRT)
def average_pool_grad(xp, dY, X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0,
                      dilations=None, kernel_shape=None, pads=None, strides=None):
    """dX of AveragePool: each window's dY / count, added back over the window's taps."""
    windows = pool._windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    dtype = cv.work_dtype(X.dtype)
    counts = pool._window_counts(xp, X.shape[2:], windows, bool(count_include_pad), dtype)
    share = dY.astype(dtype, copy=False) / counts
    image = _padded_zeros(xp, X, windows, dtype)
    for _, target in windows.taps(xp, image):
        target += share
    return xp.ascontiguousarray(_unpadded(image, windows, X.shape[2:]).astype(X.dtype, copy=False))


@op("LpPoolGrad", since=1, domain=MIXRT)
def lp_pool_grad(xp, dY, X, Y, *, auto_pad="NOTSET", ceil_mode=0, dilations=None,
                 kernel_shape=None, p=2, pads=None, strides=None):
    """dX of LpPool, y = (sum |x|^p)^(1/p): dx = sum over windows of dy y^(1-p), times
    sign(x) |x|^(p-1)."""
    windows = pool._windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    dtype = cv.work_dtype(X.dtype)
    x = X.astype(dtype, copy=False)
    per_window = _over_root(xp, dY.astype(dtype, copy=False), Y.astype(dtype, copy=False), p)
    image = _padded_zeros(xp, X, windows, dtype)
    for _, target in windows.taps(xp, image):
        target += per_window
    dx = _unpadded(image, windows, X.shape[2:]) * _signed_power(xp, x, p)
    return xp.ascontiguousarray(dx.astype(X.dtype, copy=False))


def _over_root(xp, dy, y, p):
    """dy * y^(1-p), zero where the window was all zeros (no direction to move in)."""
    p = float(p)
    if p == 1:
        return dy
    safe = xp.where(y == 0, 1, y)
    return xp.where(y == 0, 0, dy * safe ** (1 - p))


def _signed_power(xp, x, p):
    """d |x|^p / dx / p: sign(x) |x|^(p-1)."""
    p = float(p)
    if p == 1:
        return xp.sign(x)
    if p == 2:
        return x
    return xp.sign(x) * xp.abs(x) ** (p - 1)


def _like_x(dY, X, *_, **__):
    return [TensorType(X.dtype, X.shape)]


for _pool_grad in (max_pool_grad, average_pool_grad, lp_pool_grad):
    _pool_grad.infer(_like_x)


@pool.max_pool.grad
def _(b, node, dy):
    """The Indices output (opset 8+) is integer positions: no gradient flows through it."""
    if dy[0] is None:
        return [None]
    return [b.emit("MaxPoolGrad", dy[0], node.inputs[0], domain=MIXRT,
                   **forwarded(node, POOL_ATTRIBUTES))]


@pool.average_pool.grad
def _(b, node, dy):
    return [b.emit("AveragePoolGrad", dy[0], node.inputs[0], domain=MIXRT,
                   **forwarded(node, POOL_ATTRIBUTES + ("count_include_pad",)))]


# The pool gradients are linear in dY, so their own gradients (what create_graph needs) are
# their adjoints: AveragePool of the incoming gradient, and for MaxPool the incoming
# gradient read at each window's winner (MaxPool's Indices are flat NCHW positions).

@max_pool_grad.grad
def _(b, node, dd):
    _, winners = b.emit("MaxPool", node.inputs[1], outputs=2,
                        **forwarded(node, POOL_ATTRIBUTES))
    flat = b.emit("Reshape", dd[0], b.ints([-1]))
    return [b.emit("Gather", flat, winners, axis=0), None]


@average_pool_grad.grad
def _(b, node, dd):
    return [b.emit("AveragePool", dd[0],
                   **forwarded(node, POOL_ATTRIBUTES + ("count_include_pad",))), None]


@pool.lp_pool.grad
def _(b, node, dy):
    return [b.emit("LpPoolGrad", dy[0], node.inputs[0], node.outputs[0], domain=MIXRT,
                   **forwarded(node, POOL_ATTRIBUTES + ("p",)))]


@pool.lp_pool.expansion
@widened
def _(b, node):
    """(window sum of |x|^p)^(1/p): the window sum is AveragePool (opset 19, which dilates)
    counting the zero padding, times the window size. ceil_mode windows keep the fused
    LpPoolGrad: AveragePool does not count their overhang as padding."""
    attributes = forwarded(node, POOL_ATTRIBUTES)
    if attributes.get("ceil_mode", 0):
        return None
    x = node.inputs[0]
    p = float(node.attributes.get("p", 2))
    powered = b.emit("Abs", x) if p == 1 else b.mul(x, x) if p == 2 else \
        b.emit("Pow", b.emit("Abs", x), b.constant(p, like=x))
    mean = b.emit("AveragePool", powered, count_include_pad=1, opset=19, **attributes)
    total = b.mul(mean, b.constant(float(math.prod(attributes["kernel_shape"])), like=x))
    if p == 1:
        return [total]
    return [b.emit("Sqrt", total) if p == 2 else
            b.emit("Pow", total, b.constant(1 / p, like=x))]


# -- global pools -------------------------------------------------------------------------

GLOBAL_REDUCTIONS = ("average", "max", "lp")


@op("GlobalPoolGrad", since=1, domain=MIXRT)
def global_pool_grad(xp, dY, X, Y, *, reduction="average", p=2):
    """dX of GlobalAveragePool, GlobalMaxPool (the first maximum of each plane takes it all,
    as MaxPool's rule) or GlobalLpPool."""
    if reduction not in GLOBAL_REDUCTIONS:
        raise ValueError(f"GlobalPoolGrad reduction must be one of {GLOBAL_REDUCTIONS}; "
                         f"got {reduction!r}")
    dtype = cv.work_dtype(X.dtype)
    n, c = X.shape[:2]
    size = math.prod(X.shape[2:])
    x = X.astype(dtype, copy=False).reshape(n, c, size)
    dy = dY.astype(dtype, copy=False).reshape(n, c, 1)
    if reduction == "average":
        dx = xp.broadcast_to(dy / dtype.type(size), x.shape)
    elif reduction == "max":
        first = xp.argmax(x, axis=2)[..., None]
        dx = dy * (xp.arange(size)[None, None, :] == first)
    else:
        y = Y.astype(dtype, copy=False).reshape(n, c, 1)
        dx = _over_root(xp, dy, y, p) * _signed_power(xp, x, p)
    return xp.ascontiguousarray(dx.reshape(X.shape).astype(X.dtype, copy=False))


global_pool_grad.infer(_like_x)


def _global_pool_gradient(reduction: str):
    def grad(b, node, dy):
        return [b.emit("GlobalPoolGrad", dy[0], node.inputs[0], node.outputs[0],
                       domain=MIXRT, reduction=reduction, **forwarded(node, ("p",)))]
    return grad


@global_pool_grad.grad
def _(b, node, dd):
    """Linear in dY for the average (its adjoint: GlobalAveragePool) and the max (the
    incoming gradient read at each plane's first maximum). GlobalLpPool's second order goes
    through its expansion instead (see global_lp_pool below)."""
    x = node.inputs[1]
    reduction = node.attributes.get("reduction", "average")
    if reduction == "average":
        return [b.emit("GlobalAveragePool", dd[0]), None, None]
    if reduction != "max":
        raise GradientError(f"node {node.label!r}: GlobalPoolGrad of {reduction!r} has no "
                            f"gradient; differentiate with differentiable_backward=True",
                            node=node.label, op_type=node.op_type)
    planes = b.ints([0, 0, -1])
    first = b.emit("ArgMax", b.emit("Reshape", x, planes), axis=2, keepdims=1)
    read = b.emit("GatherElements", b.emit("Reshape", dd[0], planes), first, axis=2)
    return [b.emit("Reshape", read, b.emit("Shape", node.inputs[0])), None, None]


@pool.global_lp_pool.expansion
@widened
def _(b, node):
    """(sum over each plane of |x|^p)^(1/p), in ops that have gradients."""
    x = node.inputs[0]
    p = float(node.attributes.get("p", 2))
    powered = b.mul(x, x) if p == 2 else b.emit("Pow", b.emit("Abs", x),
                                                b.constant(p, like=x))
    spatial = b.ints(list(range(2, b.known_rank(node, x))))
    summed = b.emit("ReduceSum", powered, spatial, keepdims=1)
    return [b.emit("Sqrt", summed) if p == 2 else
            b.emit("Pow", summed, b.constant(1 / p, like=x))]


pool.global_average_pool.grad(_global_pool_gradient("average"))
pool.global_max_pool.grad(_global_pool_gradient("max"))
pool.global_lp_pool.grad(_global_pool_gradient("lp"))
