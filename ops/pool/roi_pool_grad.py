"""Gradients of RoiAlign (10, 16, 22) and MaxRoiPool.

Both are linear in X given where they sample, and the sampling depends only on rois (read on
the host), so rois and batch_indices get no gradient (as in torchvision and Detectron).
RoiAlign's avg mode averages bilinear samples, which is separable: per RoI the output is
``Ay X Ax^T`` with ``Ay`` (out_h x H) and ``Ax`` (out_w x W) the averaged tap weights, so dX
is ``Ay^T dY Ax`` over the rows and columns the RoI touches. Max mode (onnxruntime's
definition: the largest of the bilinear-weighted corner values of all samples in a bin)
passes dY, times the chosen corner's weight, to that corner's pixel; MaxRoiPool passes dY to
each bin's argmax (an empty bin outputs 0 and passes nothing). Those choices are "routes":
one flat index into X and one weight per output element.

Each backward kernel is linear in dY with an adjoint that reads X only for its routes:
RoiAlignRouted / MaxRoiPoolRouted apply the forward's routes, chosen on X, to another tensor
(in avg mode RoiAlignRouted is RoiAlign itself). Grad and Routed are each other's gradient,
so they differentiate to any order; X gets no second-order gradient through the choice of
a maximum, which is piecewise constant.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from mixrt.ops.conv.conv_grad import forwarded
from mixrt.ops.device import to_host
from mixrt.ops.ir.dtypes import accumulation_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.pool import pool
from mixrt.ops.training.grad_support import MIXRT, shaped_like_second

# -- RoiAlign ---------------------------------------------------------------------------------

_ROI_ALIGN_ATTRIBUTES = ("coordinate_transformation_mode", "mode", "output_height",
                         "output_width", "sampling_ratio", "spatial_scale")


@dataclass
class _RoiSamples:
    """Where one RoI's bins sample (see pool.roi_align): per axis (y, x), the taps of every
    sample (pool._linear_taps: low, high, low weight, high weight), samples bin by bin."""

    batch: int
    out: tuple
    grid: tuple
    taps: list


def _roi_samples(X_shape, rois, batch_indices, coordinate_transformation_mode="half_pixel",
                 output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0,
                 **_) -> list[_RoiSamples]:
    """pool.roi_align's sampling geometry, per RoI, on the host."""
    half_pixel = coordinate_transformation_mode == "half_pixel"
    boxes = np.asarray(to_host(rois), dtype=np.float64) * spatial_scale
    batches = np.asarray(to_host(batch_indices)).astype(np.int64).reshape(-1)
    out = (int(output_height), int(output_width))
    result = []
    for box, batch in zip(boxes, batches):
        start = box[[1, 0]] - (0.5 if half_pixel else 0.0)
        size = box[[3, 2]] - box[[1, 0]]
        if not half_pixel:
            size = np.maximum(size, 1.0)
        grid = [int(sampling_ratio) if sampling_ratio > 0 else max(math.ceil(s / o), 1)
                for s, o in zip(size, out)]
        bin_size = size / np.array(out)
        taps = []
        for a in range(2):
            steps = np.arange(out[a])[:, None] * grid[a] + np.arange(grid[a])[None, :] + 0.5
            coords = start[a] + steps.reshape(-1) * bin_size[a] / grid[a]
            taps.append(pool._linear_taps(coords, X_shape[2 + a]))
        result.append(_RoiSamples(int(batch), out, tuple(grid), taps))
    return result


def _averaging_matrix(taps, out_len: int, grid: int, in_len: int) -> np.ndarray:
    """(out_len, in_len): each bin's mean of its samples' bilinear weights along one axis."""
    low, high, w_low, w_high = taps
    bins = np.repeat(np.arange(out_len), grid)
    matrix = np.zeros((out_len, in_len))
    np.add.at(matrix, (bins, low), w_low / grid)
    np.add.at(matrix, (bins, high), w_high / grid)
    return matrix


def _touched(matrix: np.ndarray) -> slice | None:
    """The columns a matrix reads, as one slice (None when it reads none)."""
    columns = np.flatnonzero(matrix.any(axis=0))
    return None if columns.size == 0 else slice(int(columns[0]), int(columns[-1]) + 1)


def _roi_align_avg_grad(xp, dY, X, samples: list[_RoiSamples], dtype):
    """sum over RoIs of Ay^T dY Ax, added into the rows and columns each RoI touches."""
    dX = xp.zeros(X.shape, dtype=dtype)
    for r, roi in enumerate(samples):
        ay, ax = (_averaging_matrix(roi.taps[a], roi.out[a], roi.grid[a], X.shape[2 + a])
                  for a in range(2))
        rows, columns = _touched(ay), _touched(ax)
        if rows is None or columns is None:
            continue
        ay = xp.asarray(ay[:, rows], dtype=dtype)
        ax = xp.asarray(ax[:, columns], dtype=dtype)
        spread = xp.matmul(ay.T, xp.matmul(dY[r].astype(dtype, copy=False), ax))
        dX[roi.batch, :, rows, columns] += spread
    return dX


@dataclass
class _Routes:
    """Where each output element of a max pooling came from: a flat index into X and the
    weight it was read with (0 where nothing was read), both shaped like the output."""

    index: object
    weight: object

    def back(self, xp, dY, like_shape, dtype):
        """dY added into an X-shaped array at the routes."""
        size = math.prod(like_shape)
        values = (dY.astype(dtype, copy=False) * self.weight).reshape(-1)
        return xp.bincount(self.index.reshape(-1), weights=values, minlength=size).astype(
            dtype, copy=False).reshape(like_shape)

    def read(self, V, dtype):
        """V read at the routes: the max pooling with X's choices applied to V."""
        return V.astype(dtype, copy=False).reshape(-1)[self.index] * self.weight


def _roi_align_max_routes(xp, X, samples: list[_RoiSamples], out: tuple, dtype) -> _Routes:
    """For each (RoI, channel, bin), the pixel and weight of the largest weighted corner
    over all samples in the bin (onnxruntime's max mode; the first one on ties)."""
    n, channels, height, width = X.shape
    plane = height * width
    indices, weights = [], []
    for roi in samples:
        oh, ow = roi.out
        (y_lo, y_hi, wy_lo, wy_hi), (x_lo, x_hi, wx_lo, wx_hi) = roi.taps
        pixels, taps = [], []
        for ys, wy in ((y_lo, wy_lo), (y_hi, wy_hi)):  # the forward's corner order
            for xs, wx in ((x_lo, wx_lo), (x_hi, wx_hi)):
                pixels.append(ys[:, None] * width + xs[None, :])
                taps.append(wy[:, None] * wx[None, :])
        pixels = xp.asarray(_by_bin(pixels, roi))
        taps = xp.asarray(_by_bin(taps, roi), dtype=dtype)
        image_ = X[roi.batch].astype(dtype, copy=False).reshape(channels, plane)
        values = image_[:, pixels] * taps  # (C, bins, candidates)
        choice = values.argmax(axis=-1)
        bins = xp.arange(oh * ow)[None, :]
        offset = (roi.batch * channels + xp.arange(channels)[:, None]) * plane
        indices.append((pixels[bins, choice] + offset).reshape(channels, oh, ow))
        weights.append(taps[bins, choice].reshape(channels, oh, ow))
    if not indices:  # no RoIs: nothing is routed
        empty = (0, channels) + out
        return _Routes(xp.zeros(empty, dtype=np.int64), xp.zeros(empty, dtype=dtype))
    return _Routes(xp.stack(indices), xp.stack(weights))


def _by_bin(corners: list, roi: _RoiSamples) -> np.ndarray:
    """The four (Ny, Nx) corner tables as (bins, 4 x samples per bin): each bin's
    candidates in a row."""
    (oh, ow), (gy, gx) = roi.out, roi.grid
    table = np.stack(corners).reshape(4, oh, gy, ow, gx)
    return table.transpose(1, 3, 0, 2, 4).reshape(oh * ow, -1)


@op("RoiAlignGrad", since=1, domain=MIXRT)
def roi_align_grad(xp, dY, X, rois, batch_indices, *,
                   coordinate_transformation_mode="half_pixel", mode="avg", output_height=1,
                   output_width=1, sampling_ratio=0, spatial_scale=1.0):
    """dX of RoiAlign (opset 16's attributes; opset 10 is output_half_pixel) whose output
    gradient is ``dY``; X's values are read only in max mode, to find the chosen corners."""
    samples = _roi_samples(X.shape, rois, batch_indices, coordinate_transformation_mode,
                           output_height, output_width, sampling_ratio, spatial_scale)
    dtype = accumulation_dtype(X.dtype)
    if mode == "avg":
        dX = _roi_align_avg_grad(xp, dY, X, samples, dtype)
    elif mode == "max":
        routes = _roi_align_max_routes(xp, X, samples, dY.shape[2:], dtype)
        dX = routes.back(xp, dY, X.shape, dtype)
    else:
        raise ValueError(f"RoiAlign mode must be 'avg' or 'max'; got {mode!r}")
    return dX.astype(X.dtype, copy=False)


roi_align_grad.infer(shaped_like_second)


@op("RoiAlignRouted", since=1, domain=MIXRT)
def roi_align_routed(xp, V, X, rois, batch_indices, *,
                     coordinate_transformation_mode="half_pixel", mode="avg",
                     output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    """RoiAlign of V, in max mode with the corners chosen on X: the adjoint of
    RoiAlignGrad (in avg mode X is not read and this is RoiAlign of V)."""
    attributes = dict(coordinate_transformation_mode=coordinate_transformation_mode,
                      mode=mode, output_height=output_height, output_width=output_width,
                      sampling_ratio=sampling_ratio, spatial_scale=spatial_scale)
    if mode != "max":
        return pool.roi_align(xp, V, rois, batch_indices, **attributes)
    samples = _roi_samples(X.shape, rois, batch_indices, **attributes)
    dtype = accumulation_dtype(V.dtype)
    routes = _roi_align_max_routes(xp, X, samples, (int(output_height), int(output_width)),
                                   dtype)
    return routes.read(V, dtype).astype(V.dtype, copy=False)


@roi_align_routed.infer
def _(V, X, rois, batch_indices=None, *, output_height=1, output_width=1, **_):
    count = None if rois.shape is None else rois.shape[0]
    channels = None if V.shape is None else V.shape[1]
    return [TensorType(V.dtype, (count, channels, int(output_height), int(output_width)))]


def _roi_align_backward(b, node, dy, **fixed):
    x, rois, batch_indices = node.inputs[:3]
    if dy[0] is None or not b.differentiable(x):
        return [None, None, None]
    attributes = {**forwarded(node, _ROI_ALIGN_ATTRIBUTES), **fixed}
    return [b.emit("RoiAlignGrad", dy[0], x, rois, batch_indices, domain=MIXRT, **attributes),
            None, None]


pool.roi_align.grad(_roi_align_backward)


@pool.roi_align_10.grad
def _(b, node, dy):
    return _roi_align_backward(b, node, dy,
                               coordinate_transformation_mode="output_half_pixel")


def _routed_adjoint(partner: str, attributes: tuple, routing_inputs: int):
    """The gradient of a kernel linear in its first input whose adjoint is ``partner``
    with the same routing inputs (the RoIs, batch indices) and attributes."""
    def grad(b, node, dd):
        routing = node.inputs[1:1 + routing_inputs]
        return [b.emit(partner, dd[0], *routing, domain=MIXRT,
                       **forwarded(node, attributes))] + [None] * routing_inputs
    return grad


# RoiAlignGrad reads dd where the forward read X; RoiAlignRouted scatters it back
roi_align_grad.grad(_routed_adjoint("RoiAlignRouted", _ROI_ALIGN_ATTRIBUTES, 3))
roi_align_routed.grad(_routed_adjoint("RoiAlignGrad", _ROI_ALIGN_ATTRIBUTES, 3))


# -- MaxRoiPool -------------------------------------------------------------------------------

def _max_roi_bins(box, spatial_scale, pooled, height, width):
    """pool.max_roi_pool's bins of one RoI: (ph, pw, h0, h1, w0, w1) of each non-empty one."""
    _batch, x1, y1, x2, y2 = box
    start_w, start_h, end_w, end_h = (pool._round_half_away(v * spatial_scale)
                                      for v in (x1, y1, x2, y2))
    bin_h = max(end_h - start_h + 1, 1) / pooled[0]
    bin_w = max(end_w - start_w + 1, 1) / pooled[1]
    for ph, pw in itertools.product(range(pooled[0]), range(pooled[1])):
        h0 = min(max(math.floor(ph * bin_h) + start_h, 0), height)
        h1 = min(max(math.ceil((ph + 1) * bin_h) + start_h, 0), height)
        w0 = min(max(math.floor(pw * bin_w) + start_w, 0), width)
        w1 = min(max(math.ceil((pw + 1) * bin_w) + start_w, 0), width)
        if h1 > h0 and w1 > w0:
            yield ph, pw, h0, h1, w0, w1


def _max_roi_routes(xp, X, rois, pooled_shape, spatial_scale, dtype) -> _Routes:
    """Each (RoI, channel, bin)'s argmax in X (the first on ties); empty bins weigh 0."""
    if pooled_shape is None:
        raise ValueError("MaxRoiPool needs the pooled_shape attribute")
    pooled = tuple(int(v) for v in pooled_shape)
    n, channels, height, width = X.shape
    boxes = np.asarray(to_host(rois), dtype=np.float64)
    index = xp.zeros((len(boxes), channels) + pooled, dtype=np.int64)
    weight = xp.zeros((len(boxes), 1) + pooled, dtype=dtype)
    for r, box in enumerate(boxes):
        batch = int(box[0])
        for ph, pw, h0, h1, w0, w1 in _max_roi_bins(box, spatial_scale, pooled, height, width):
            window = X[batch, :, h0:h1, w0:w1].reshape(channels, -1)
            best = window.argmax(axis=1)
            rows, columns = h0 + best // (w1 - w0), w0 + best % (w1 - w0)
            index[r, :, ph, pw] = ((batch * channels + xp.arange(channels)) * height
                                   + rows) * width + columns
            weight[r, 0, ph, pw] = 1
    return _Routes(index, weight)


@op("MaxRoiPoolGrad", since=1, domain=MIXRT)
def max_roi_pool_grad(xp, dY, X, rois, *, pooled_shape=None, spatial_scale=1.0):
    """dX of MaxRoiPool: dY added at each bin's argmax."""
    dtype = accumulation_dtype(X.dtype)
    routes = _max_roi_routes(xp, X, rois, pooled_shape, spatial_scale, dtype)
    return routes.back(xp, dY, X.shape, dtype).astype(X.dtype, copy=False)


max_roi_pool_grad.infer(shaped_like_second)


@op("MaxRoiPoolRouted", since=1, domain=MIXRT)
def max_roi_pool_routed(xp, V, X, rois, *, pooled_shape=None, spatial_scale=1.0):
    """V read at the argmaxes MaxRoiPool finds in X: the adjoint of MaxRoiPoolGrad."""
    dtype = accumulation_dtype(V.dtype)
    routes = _max_roi_routes(xp, X, rois, pooled_shape, spatial_scale, dtype)
    return routes.read(V, dtype).astype(V.dtype, copy=False)


@max_roi_pool_routed.infer
def _(V, X, rois, *, pooled_shape=None, **_):
    count = None if rois.shape is None else rois.shape[0]
    channels = None if V.shape is None else V.shape[1]
    return [TensorType(V.dtype, (count, channels, *[int(v) for v in pooled_shape]))]


_MAX_ROI_ATTRIBUTES = ("pooled_shape", "spatial_scale")


@pool.max_roi_pool.grad
def _(b, node, dy):
    x, rois = node.inputs[:2]
    if dy[0] is None or not b.differentiable(x):
        return [None, None]
    return [b.emit("MaxRoiPoolGrad", dy[0], x, rois, domain=MIXRT,
                   **forwarded(node, _MAX_ROI_ATTRIBUTES)), None]


max_roi_pool_grad.grad(_routed_adjoint("MaxRoiPoolRouted", _MAX_ROI_ATTRIBUTES, 2))
max_roi_pool_routed.grad(_routed_adjoint("MaxRoiPoolGrad", _MAX_ROI_ATTRIBUTES, 2))
