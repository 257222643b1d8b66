"""Pooling: MaxPool, AveragePool, LpPool, their Global forms, MaxUnpool, MaxRoiPool, RoiAlign.

A window reduction walks the kernel offsets and combines one strided slice of the padded
input per offset (``xp.maximum``/``xp.add`` over whole output-sized arrays), which beats a
reduction over a 2N-d strided view for the small kernels CNNs use. Window geometry
(pads, ceil_mode, auto_pad) is shared with conv.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from mixrt.ops.conv.conv import pad_spatial, sliding_windows, strided_span, work_dtype
from mixrt.ops.conv.windows import inferred_out_dims, spatial_attrs, window_geometry
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.compiled.parallel import parallel_rows
from mixrt.ops.ir.registry import SHRINKING_IN_PLACE, op
from mixrt.ops.ir.types import TensorType, fits, shape_text
from mixrt.ops.device import to_host

MAXPOOL_TYPES = FLOATS | {"int8", "uint8"}
_LOOP_LIMIT = 400  # kernels with more taps than this reduce over a strided view instead


@dataclass(frozen=True)
class _Windows:
    kernel: list
    strides: list
    dilations: list
    begin: list  # pads before each spatial axis
    end: list  # pads after, as declared (counted by count_include_pad)
    extra: list  # padding past ``end`` that ceil_mode windows reach into
    out: list

    def padded(self, xp, X, value):
        ends = [e + x for e, x in zip(self.end, self.extra)]
        return pad_spatial(xp, X, self.begin, ends, value)

    def taps(self, xp, padded):
        """Every kernel offset and the output-shaped strided slice of ``padded`` it sees."""
        for offset in itertools.product(*(range(k) for k in self.kernel)):
            index = tuple(strided_span(o * d, s, n) for o, d, s, n in
                          zip(offset, self.dilations, self.strides, self.out))
            yield offset, padded[(Ellipsis,) + index]


def _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    if kernel_shape is None:
        raise ValueError("pooling needs the kernel_shape attribute")
    nd = X.ndim - 2
    kernel, strides, dilations = spatial_attrs(nd, kernel_shape, strides, dilations)
    in_dims = X.shape[2:]
    begin, end, out = window_geometry(in_dims, kernel, strides, dilations, pads, auto_pad,
                                      bool(ceil_mode))
    extra = [max(0, (o - 1) * s + (k - 1) * d + 1 - (i + b + e))
             for o, s, k, d, i, b, e in zip(out, strides, kernel, dilations, in_dims, begin,
                                             end)]
    return _Windows(kernel, strides, dilations, begin, end, extra, out)


def _reduce_windows(xp, padded, w, ufunc):
    """Combine every window of ``padded`` with ``ufunc`` (maximum or add)."""
    if math.prod(w.kernel) > _LOOP_LIMIT:
        view = sliding_windows(xp, padded, w.kernel, w.strides, w.dilations, w.out)
        axes = tuple(range(padded.ndim - len(w.kernel), padded.ndim))
        # the array's own max/sum: CuPy's ufuncs have no reduce before v13
        return view.max(axis=axes) if ufunc is xp.maximum else view.sum(axis=axes)
    result = None
    for _, part in w.taps(xp, padded):
        if result is None:
            result = part.copy()
        else:
            ufunc(result, part, out=result)
    return result


def _lowest(dtype):
    dtype = np.dtype(dtype)
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _pool_infer(X, *, kernel_shape=None, strides=None, dilations=None, pads=None,
                auto_pad="NOTSET", ceil_mode=0, **_):
    if X.shape is None:
        return [TensorType(X.dtype, None)]
    out = inferred_out_dims(X.shape[2:], kernel_shape, strides, dilations, pads, auto_pad,
                            bool(ceil_mode))
    return [TensorType(X.dtype, (*X.shape[:2], *(out or [None] * (len(X.shape) - 2))))]


# -- MaxPool --------------------------------------------------------------------------------

@op("MaxPool", since=22, dtypes=MAXPOOL_TYPES, memory=SHRINKING_IN_PLACE)
@op("MaxPool", since=12, dtypes=MAXPOOL_TYPES, memory=SHRINKING_IN_PLACE)
@op("MaxPool", since=11, dtypes=FLOATS, memory=SHRINKING_IN_PLACE)
@op("MaxPool", since=10, dtypes=FLOATS, memory=SHRINKING_IN_PLACE)
@op("MaxPool", since=8, dtypes=FLOATS, memory=SHRINKING_IN_PLACE)
@op("MaxPool", since=1, dtypes=FLOATS, memory=SHRINKING_IN_PLACE)
def max_pool(xp, X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
             pads=None, storage_order=0, strides=None, _outputs=1):
    """Max over each window (pads never win); Indices (opset 8+) only when asked for."""
    w = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    padded = w.padded(xp, X, _lowest(X.dtype))
    if _outputs < 2:
        return _reduce_windows(xp, padded, w, xp.maximum)
    return _max_with_indices(xp, X, padded, w, storage_order)


def _max_with_indices(xp, X, padded, w, storage_order):
    """Max and the flat index (over N, C and the unpadded spatial dims, row- or column-major
    spatially) of the first maximal element of each window."""
    best, best_tap = None, None
    for tap, (offset, part) in enumerate(w.taps(xp, padded)):
        if best is None:
            best, best_tap = part.copy(), xp.zeros(part.shape, dtype=np.int32)
            continue
        better = part > best
        best = xp.where(better, part, best)
        best_tap = xp.where(better, np.int32(tap), best_tap)
    in_dims = X.shape[2:]
    nd = len(in_dims)
    taps = np.array(list(itertools.product(*(range(k) for k in w.kernel))), dtype=np.int64)
    taps = xp.asarray(taps)[best_tap.astype(np.int64)]  # (*out_shape, nd)
    coords = []
    for axis in range(nd):
        shape = [1] * (X.ndim)
        shape[2 + axis] = w.out[axis]
        start = xp.arange(w.out[axis], dtype=np.int64) * w.strides[axis] - w.begin[axis]
        coords.append(start.reshape(shape) + taps[..., axis] * w.dilations[axis])
    order = range(nd) if not storage_order else reversed(range(nd))
    flat = xp.zeros(best.shape, dtype=np.int64)
    for axis in order:
        flat = flat * in_dims[axis] + coords[axis]
    n, c = X.shape[:2]
    plane = xp.arange(n * c, dtype=np.int64).reshape(n, c, *([1] * nd)) * math.prod(in_dims)
    return best, flat + plane


@max_pool.infer
def _(X, **attrs):
    y = _pool_infer(X, **attrs)[0]
    return [y, TensorType(np.dtype(np.int64), y.shape)]


# -- AveragePool and LpPool -----------------------------------------------------------------

@op("AveragePool", since=22, dtypes=FLOATS, memory=SHRINKING_IN_PLACE)
@op("AveragePool", since=19, dtypes=FLOATS, memory=SHRINKING_IN_PLACE)
@op("AveragePool", since=11, dtypes=FLOATS, memory=SHRINKING_IN_PLACE)
@op("AveragePool", since=10, dtypes=FLOATS, memory=SHRINKING_IN_PLACE)
@op("AveragePool", since=7, dtypes=FLOATS, memory=SHRINKING_IN_PLACE)
@op("AveragePool", since=1, dtypes=FLOATS, memory=SHRINKING_IN_PLACE)
def average_pool(xp, X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0,
                 dilations=None, kernel_shape=None, pads=None, strides=None):
    w = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    dtype = work_dtype(X.dtype)
    total = _reduce_windows(xp, w.padded(xp, X.astype(dtype, copy=False), 0), w, xp.add)
    total /= _window_counts(xp, X.shape[2:], w, bool(count_include_pad), dtype)
    return total.astype(X.dtype, copy=False)


def _window_counts(xp, in_dims, w, include_pad, dtype):
    """How many elements each window averages: the ones inside the input, plus the declared
    pads when ``include_pad``; never the ceil_mode overhang."""
    if not any(w.extra) and (include_pad or not (any(w.begin) or any(w.end))):
        return dtype.type(math.prod(w.kernel))
    inside = xp.ones(tuple(in_dims), dtype=dtype)
    if include_pad:
        inside = pad_spatial(xp, inside, w.begin, w.end, 1)
        counted = _Windows(w.kernel, w.strides, w.dilations, [0] * len(in_dims),
                           [0] * len(in_dims), w.extra, w.out)
    else:
        counted = w
    return _reduce_windows(xp, counted.padded(xp, inside, 0), counted, xp.add)


@op("LpPool", since=22, dtypes=FLOATS)
@op("LpPool", since=18, dtypes=FLOATS)
@op("LpPool", since=11, dtypes=FLOATS)
@op("LpPool", since=2, dtypes=FLOATS)
@op("LpPool", since=1, dtypes=FLOATS)
def lp_pool(xp, X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
            p=2, pads=None, strides=None):
    w = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    dtype = work_dtype(X.dtype)
    powered = _abs_power(xp, X.astype(dtype, copy=False), p)
    total = _reduce_windows(xp, w.padded(xp, powered, 0), w, xp.add)
    return _root(xp, total, p).astype(X.dtype, copy=False)


def _abs_power(xp, x, p):
    p = float(p)
    return xp.abs(x) if p == 1 else x * x if p == 2 else xp.abs(x) ** x.dtype.type(p)


def _root(xp, total, p):
    p = float(p)
    return total if p == 1 else xp.sqrt(total) if p == 2 else total ** total.dtype.type(1 / p)


average_pool.infer(_pool_infer)
lp_pool.infer(_pool_infer)


# -- Global pools ---------------------------------------------------------------------------

def _spatial_axes(X):
    return tuple(range(2, X.ndim))


@op("GlobalAveragePool", since=22, dtypes=FLOATS)
@op("GlobalAveragePool", since=1, dtypes=FLOATS)
def global_average_pool(xp, X):
    dtype = work_dtype(X.dtype)
    mean = xp.mean(X, axis=_spatial_axes(X), keepdims=True, dtype=dtype)
    return mean.astype(X.dtype, copy=False)


@op("GlobalMaxPool", since=22, dtypes=FLOATS)
@op("GlobalMaxPool", since=1, dtypes=FLOATS)
def global_max_pool(xp, X):
    return xp.max(X, axis=_spatial_axes(X), keepdims=True)


@op("GlobalLpPool", since=22, dtypes=FLOATS)
@op("GlobalLpPool", since=2, dtypes=FLOATS)
@op("GlobalLpPool", since=1, dtypes=FLOATS)
def global_lp_pool(xp, X, *, p=2):
    dtype = work_dtype(X.dtype)
    powered = _abs_power(xp, X.astype(dtype, copy=False), p)
    total = xp.sum(powered, axis=_spatial_axes(X), keepdims=True)
    return _root(xp, total, p).astype(X.dtype, copy=False)


def _global_infer(X, **_):
    if X.shape is None:
        return [TensorType(X.dtype, None)]
    return [TensorType(X.dtype, (*X.shape[:2], *[1] * (len(X.shape) - 2)))]


for _global in (global_average_pool, global_max_pool, global_lp_pool):
    _global.infer(_global_infer)


# -- MaxUnpool ------------------------------------------------------------------------------

def _unpooled_dims(in_dims, kernel_shape, strides, pads):
    nd = len(in_dims)
    kernel, strides, _ = spatial_attrs(nd, kernel_shape, strides)
    pads = [0] * (2 * nd) if not pads else [int(p) for p in pads]
    return [(i - 1) * s - pads[a] - pads[nd + a] + k
            for a, (i, s, k) in enumerate(zip(in_dims, strides, kernel))]


@op("MaxUnpool", since=22, dtypes=FLOATS)
@op("MaxUnpool", since=11, dtypes=FLOATS)
@op("MaxUnpool", since=9, dtypes=FLOATS)
def max_unpool(xp, X, I, output_shape=None, *, kernel_shape=None, pads=None, strides=None):
    """Scatter X to the flat positions in I of a zero tensor (MaxPool's Indices layout)."""
    if kernel_shape is None:
        raise ValueError("MaxUnpool needs the kernel_shape attribute")
    if output_shape is not None:
        shape = tuple(int(v) for v in np.asarray(to_host(output_shape)).reshape(-1))
    else:
        shape = tuple(X.shape[:2]) + tuple(_unpooled_dims(X.shape[2:], kernel_shape, strides,
                                                          pads))
    Y = xp.zeros(math.prod(shape), dtype=X.dtype)
    flat = I.reshape(-1).astype(np.int64, copy=False)
    values = X.reshape(-1)
    kept = surviving_writes(xp, flat)
    if kept is None:
        Y[flat] = values
    else:
        Y[flat[kept]] = values[kept]
    return Y.reshape(shape)


def surviving_writes(xp, flat):
    """Where overlapping MaxPool windows picked one position twice, I repeats it; which
    write lands is then up to the scatter (undefined on a GPU). We keep the last in
    flat order, as onnxruntime's loop does, and say so: a boolean mask of the writes that
    survive, or None when no position repeats (the common case, checked in O(n))."""
    if flat.size == 0:
        return None
    written = xp.zeros(int(flat.max()) + 1, dtype=np.int8)
    written[flat] = 1
    if int(written.sum()) == flat.size:
        return None
    order = xp.argsort(flat, kind="stable")
    ordered = flat[order]
    last_of_position = xp.concatenate([ordered[1:] != ordered[:-1], xp.ones(1, dtype=bool)])
    kept = xp.zeros(flat.size, dtype=bool)
    kept[order[last_of_position]] = True
    return kept


@op("MaxUnpoolKept", since=1, domain="mixrt")
def max_unpool_kept(xp, I):
    """The mask of I's writes that MaxUnpool keeps (see surviving_writes), shaped as I."""
    kept = surviving_writes(xp, I.reshape(-1).astype(np.int64, copy=False))
    return xp.ones(I.shape, dtype=bool) if kept is None else kept.reshape(I.shape)


@max_unpool_kept.infer
def _(I, **_):
    return [TensorType(np.dtype(bool), I.shape)]


@max_unpool.infer
def _(X, I, output_shape=None, *, kernel_shape=None, pads=None, strides=None, **_):
    if X.shape is not None and I.shape is not None and not fits(I.shape, X.shape):
        raise ValueError(f"MaxUnpool: the indices I have shape {shape_text(I.shape)}; expected "
                         f"X's {shape_text(X.shape)}, one index per value")
    if output_shape is not None:
        if output_shape.value is not None:
            dims = [int(v) for v in np.asarray(output_shape.value).reshape(-1)]
            return [TensorType(X.dtype, tuple(dims))]
        rank = X.rank
        return [TensorType(X.dtype, None if rank is None else (None,) * rank)]
    if X.shape is None:
        return [TensorType(X.dtype, None)]
    spatial = X.shape[2:]
    if all(isinstance(d, int) for d in spatial):
        spatial = _unpooled_dims(spatial, kernel_shape, strides, pads)
    else:
        spatial = [None] * len(spatial)
    return [TensorType(X.dtype, (*X.shape[:2], *spatial))]


# -- RoI pooling ----------------------------------------------------------------------------

@op("MaxRoiPool", since=22, dtypes=FLOATS)
@op("MaxRoiPool", since=1, dtypes=FLOATS)
def max_roi_pool(xp, X, rois, *, pooled_shape=None, spatial_scale=1.0):
    """Max over each of pooled_shape bins of each RoI (batch, x1, y1, x2, y2), with the RoI
    corners rounded to the feature-map grid as in Fast R-CNN."""
    if pooled_shape is None:
        raise ValueError("MaxRoiPool needs the pooled_shape attribute")
    pooled_h, pooled_w = (int(v) for v in pooled_shape)
    channels, height, width = X.shape[1:]
    boxes = np.asarray(to_host(rois), dtype=np.float64)
    Y = xp.zeros((len(boxes), channels, pooled_h, pooled_w), dtype=X.dtype)
    for r, (batch, x1, y1, x2, y2) in enumerate(boxes):
        start_w, start_h, end_w, end_h = (_round_half_away(v * spatial_scale)
                                          for v in (x1, y1, x2, y2))
        bin_h = max(end_h - start_h + 1, 1) / pooled_h
        bin_w = max(end_w - start_w + 1, 1) / pooled_w
        for ph, pw in itertools.product(range(pooled_h), range(pooled_w)):
            h0 = min(max(math.floor(ph * bin_h) + start_h, 0), height)
            h1 = min(max(math.ceil((ph + 1) * bin_h) + start_h, 0), height)
            w0 = min(max(math.floor(pw * bin_w) + start_w, 0), width)
            w1 = min(max(math.ceil((pw + 1) * bin_w) + start_w, 0), width)
            if h1 > h0 and w1 > w0:
                Y[r, :, ph, pw] = X[int(batch), :, h0:h1, w0:w1].max(axis=(1, 2))
    return Y


def _round_half_away(value):
    """C's round(): halves go away from zero (Python's round() goes to even)."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


@max_roi_pool.infer
def _(X, rois, *, pooled_shape=None, **_):
    count = None if rois.shape is None else rois.shape[0]
    channels = None if X.shape is None else X.shape[1]
    return [TensorType(X.dtype, (count, channels, *[int(v) for v in pooled_shape]))]


@op("RoiAlign", since=22, dtypes=FLOATS)
@op("RoiAlign", since=16, dtypes=FLOATS)
def roi_align(xp, X, rois, batch_indices, *, coordinate_transformation_mode="half_pixel",
              mode="avg", output_height=1, output_width=1, sampling_ratio=0,
              spatial_scale=1.0):
    """Average (or max) of bilinear samples on a regular grid inside each output bin."""
    if mode not in ("avg", "max"):
        raise ValueError(f"RoiAlign mode must be 'avg' or 'max'; got {mode!r}")
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ValueError("RoiAlign coordinate_transformation_mode must be 'half_pixel' or "
                         f"'output_half_pixel'; got {coordinate_transformation_mode!r}")
    half_pixel = coordinate_transformation_mode == "half_pixel"
    dtype = work_dtype(X.dtype)
    boxes = np.asarray(to_host(rois), dtype=np.float64) * spatial_scale
    batches = np.asarray(to_host(batch_indices)).astype(np.int64).reshape(-1)
    out = (int(output_height), int(output_width))
    starts = boxes[:, [1, 0]] - (0.5 if half_pixel else 0.0)  # (y, x) per RoI
    sizes = boxes[:, [3, 2]] - boxes[:, [1, 0]]
    if not half_pixel:  # the legacy mode never lets an RoI shrink below one pixel
        sizes = np.maximum(sizes, 1.0)
    grids = _sample_grids(sizes, out, sampling_ratio)
    kernels = _roi_kernels(xp)
    if kernels is not None and len(boxes):
        return _roi_align_compiled(kernels, X, dtype, batches, starts, sizes, grids, out, mode)
    results = []
    for start, size, grid, batch in zip(starts, sizes, grids, batches):
        image = X[int(batch)].astype(dtype, copy=False)
        results.append(_roi_bins(xp, image, start, size / np.array(out), out, list(grid),
                                 mode))
    if not results:
        return xp.zeros((0, X.shape[1]) + out, dtype=X.dtype)
    return xp.stack(results).astype(X.dtype, copy=False)


def _sample_grids(sizes, out, sampling_ratio):
    """Samples per bin along y and x of each RoI: sampling_ratio, else ceil(size / bins)."""
    if sampling_ratio > 0:
        return np.full((len(sizes), 2), int(sampling_ratio), dtype=np.int64)
    return np.maximum(np.ceil(sizes / np.array(out)), 1).astype(np.int64)




def _roi_kernels(xp):
    """ops/image/_jit_roi.py where it may run (host arrays, the compiled tier on), else None."""
    # an inner step's compiled loop, not RoiAlign's kernel: its steps around it are shared
    if xp is not np or not jit_cpu.enabled():
        return None
    return jit_cpu.load("mixrt.ops.image._jit_roi")


def _roi_align_compiled(kernels, X, dtype, batches, starts, sizes, grids, out, mode):
    """Every RoI in one compiled call, with the NumPy form's taps and weights."""
    bin_sizes = sizes / np.array(out)
    axes = []
    for a in range(2):  # per RoI, padded to the largest grid (the kernel reads grids[r])
        widest = int(grids[:, a].max())
        steps = (np.arange(out[a])[:, None, None] * grids[:, a] + np.arange(widest)[None, :, None]
                 + 0.5).transpose(2, 0, 1).reshape(len(grids), -1)
        steps = np.where(np.arange(widest)[None, :].repeat(out[a], 0).reshape(-1) <
                         grids[:, a, None], steps, 0.5)
        coords = starts[:, a, None] + steps * bin_sizes[:, a, None] / grids[:, a, None]
        axes.append(_linear_taps(coords, X.shape[2 + a]))
    (y_lo, y_hi, y_wlo, y_whi), (x_lo, x_hi, x_wlo, x_whi) = axes
    weights = np.stack([(wy[:, :, None] * wx[:, None, :]).astype(dtype)
                        for wy in (y_wlo, y_whi) for wx in (x_wlo, x_whi)], axis=1)
    images = np.ascontiguousarray(X, dtype=dtype)
    result = np.empty((len(grids), X.shape[1]) + out, dtype=dtype)
    rows, cols = np.stack([y_lo, y_hi], axis=1), np.stack([x_lo, x_hi], axis=1)

    def part(start, stop):  # RoIs [start, stop): the kernel releases the GIL
        kernels.roi_align(images, batches[start:stop], rows[start:stop], cols[start:stop],
                          weights[start:stop], grids[start:stop], mode == "avg",
                          result[start:stop])
    # a RoI's work: every channel of every bin's samples (its grid, four taps each)
    parallel_rows(len(grids), X.shape[1] * int(np.prod(out)) * int(grids.prod(axis=1).max()
                                                                  if len(grids) else 1) * 4,
                  part)
    return result.astype(X.dtype, copy=False)


@op("RoiAlign", since=10, dtypes=FLOATS)
def roi_align_10(xp, X, rois, batch_indices, *, mode="avg", output_height=1, output_width=1,
                 sampling_ratio=0, spatial_scale=1.0):
    """Opset 10 had no coordinate_transformation_mode: it always behaved as
    'output_half_pixel' (no half-pixel shift)."""
    return roi_align(xp, X, rois, batch_indices,
                     coordinate_transformation_mode="output_half_pixel", mode=mode,
                     output_height=output_height, output_width=output_width,
                     sampling_ratio=sampling_ratio, spatial_scale=spatial_scale)


def _roi_bins(xp, image, start, bin_size, out, grid, mode):
    """(C, out_h, out_w) pooled bins of one RoI of ``image`` (C, H, W)."""
    channels = image.shape[0]
    axes = []
    for a in range(2):  # y then x: sample coordinates, then bilinear taps along that axis
        steps = (np.arange(out[a])[:, None] * grid[a] + np.arange(grid[a])[None, :] + 0.5)
        coords = start[a] + steps.reshape(-1) * bin_size[a] / grid[a]
        axes.append(_linear_taps(coords, image.shape[1 + a]))
    (y_lo, y_hi, y_wlo, y_whi), (x_lo, x_hi, x_wlo, x_whi) = axes
    corners = []
    for ys, wy in ((y_lo, y_wlo), (y_hi, y_whi)):
        for xs, wx in ((x_lo, x_wlo), (x_hi, x_whi)):
            weight = xp.asarray((wy[:, None] * wx[None, :]).astype(image.dtype))
            values = image[:, xp.asarray(ys)[:, None], xp.asarray(xs)[None, :]]
            corners.append(values * weight)
    if mode == "avg":
        samples = corners[0] + corners[1] + corners[2] + corners[3]
    else:  # ORT's max mode: the largest weighted corner of each sample
        samples = xp.maximum(xp.maximum(corners[0], corners[1]),
                             xp.maximum(corners[2], corners[3]))
    samples = samples.reshape(channels, out[0], grid[0], out[1], grid[1])
    if mode == "avg":
        return samples.mean(axis=(2, 4))
    return samples.max(axis=(2, 4))


def _linear_taps(coords, size):
    """Low/high neighbour indices and their weights for linear interpolation along one axis;
    samples more than one pixel outside the image get zero weight, nearer ones are clamped."""
    outside = (coords < -1.0) | (coords > size)
    coords = np.clip(coords, 0.0, None)
    low = np.floor(coords).astype(np.int64)
    at_edge = low >= size - 1
    low = np.where(at_edge, size - 1, low)
    high = np.where(at_edge, size - 1, low + 1)
    coords = np.where(at_edge, low, coords)
    w_high = coords - low
    w_low = 1.0 - w_high
    w_low[outside] = 0.0
    w_high[outside] = 0.0
    return low, high, w_low, w_high


@roi_align_10.infer
@roi_align.infer
def _(X, rois, batch_indices=None, *, output_height=1, output_width=1, **_):
    count = None if rois.shape is None else rois.shape[0]
    channels = None if X.shape is None else X.shape[1]
    return [TensorType(X.dtype, (count, channels, int(output_height), int(output_width)))]
