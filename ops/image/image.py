"""Image operators: Resize/Upsample, GridSample, AffineGrid, NonMaxSuppression.

Resize and GridSample are separable interpolations: for every resized axis we build, on the
host, a small table of source indices and weights ("taps") per output position, then gather
and weight on the device. The tables are tiny (output length x a few taps), so building them
with NumPy costs nothing next to the data they are applied to.

ImageDecoder is not registered: it needs an image decoding library (Pillow), which mixrt does
not depend on.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from mixrt.ops.image import nms_cpu
from mixrt.ops.ir.dtypes import FLOATS, NUMERIC, accumulation_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, normalize_axis, shape_text
from mixrt.ops.device import to_host

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _present(a):
    """ONNX passes "not given" for scales/sizes/roi either as a missing input or as empty."""
    return a is not None and a.size > 0


def _cast_result(xp, y, dtype):
    """Interpolated values back to the input dtype; integers are rounded and saturated."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        y = xp.clip(xp.rint(y), info.min, info.max)
    return y.astype(dtype, copy=False)


# -- 1-D resampling tables -----------------------------------------------------------------

def _source_coords(out_len, in_len, scale, coord_mode, roi_start=0.0, roi_end=1.0):
    """Where each output position samples the input, in input pixel coordinates.

    ``resized`` is the output length before flooring (in_len * scale): with scales given, the
    modes that divide by the output length use this exact value, not the integer length.
    """
    i = np.arange(out_len, dtype=np.float64)
    resized = in_len * scale
    if coord_mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if coord_mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / resized)
        return offset + (i + 0.5) / scale - 0.5
    if coord_mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if resized > 1 else np.zeros(out_len)
    if coord_mode == "align_corners":
        return i * (in_len - 1) / (resized - 1) if resized > 1 else np.zeros(out_len)
    if coord_mode == "asymmetric":
        return i / scale
    if coord_mode == "tf_half_pixel_for_nn":
        # Resize-11's, dropped from the spec at 13; onnxruntime computes it at any opset, in
        # float32, whose rounding decides the nearest pixel where a coordinate is near an
        # integer (8.5 / 1.7f is 5.0, 4.9999995 in float64), so here too
        half, scale32 = np.float32(0.5), np.float32(scale)
        return ((i.astype(np.float32) + half) / scale32).astype(np.float64)
    if coord_mode == "tf_crop_and_resize":
        if resized > 1:
            step = (roi_end - roi_start) * (in_len - 1) / (resized - 1)
            return roi_start * (in_len - 1) + i * step
        return np.full(out_len, 0.5 * (roi_start + roi_end) * (in_len - 1))
    raise ValueError(f"Resize: coordinate_transformation_mode {coord_mode!r} is not one of "
                     f"{', '.join(_COORD_MODES)}")


def _nearest_index(x, nearest_mode):
    if nearest_mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if nearest_mode == "floor":
        return np.floor(x)
    if nearest_mode == "ceil":
        return np.ceil(x)
    raise ValueError(f"nearest_mode {nearest_mode!r} is not one of {', '.join(_NEAREST_MODES)}")


# onnxruntime takes a tf_half_pixel_for_nn coordinate within this of a half as a tie: measured
# on onnxruntime 1.31 over about a thousand lengths, scales and nearest modes, 4.5 / 0.6f =
# 7.4999995 goes up under round_prefer_ceil and 19.5 / 2.6f = 7.5000005 down under
# round_prefer_floor, while 27.499998 is no tie; floor and ceil take the coordinate as it is
_ONNXRUNTIME_TIE = 1e-6


def _nearest_index_as_onnxruntime(x, nearest_mode):
    if nearest_mode in ("round_prefer_floor", "round_prefer_ceil"):
        half = np.floor(x) + 0.5
        x = np.where(np.abs(x - half) <= _ONNXRUNTIME_TIE, half, x)
    return _nearest_index(x, nearest_mode)


def _linear_kernel(d, _a):
    return np.maximum(0.0, 1.0 - np.abs(d))


def _cubic_kernel(d, a, xp=np):
    """Keys' cubic convolution kernel with coefficient ``a``."""
    d = xp.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return xp.where(d <= 1, near, xp.where(d < 2, far, 0.0))


_KERNELS = {"linear": (_linear_kernel, 1), "cubic": (_cubic_kernel, 2)}


def _filter_taps(x, in_len, mode, *, scale=1.0, cubic_a=-0.75, antialias=False,
                 exclude_outside=False):
    """Indices (out, k) and weights (out, k) of a linear/cubic filter centred at ``x``.

    With antialiasing the filter is stretched by 1/scale when downsampling, so more input
    pixels contribute. Taps beyond the edge reuse the edge pixel unless ``exclude_outside``.
    """
    kernel, radius = _KERNELS[mode]
    stretch = min(scale, 1.0) if antialias else 1.0
    reach = math.ceil(radius / stretch)
    offsets = np.arange(1 - reach, reach + 1)
    base = np.floor(x)
    idx = base[:, None].astype(np.int64) + offsets
    weights = kernel((offsets - (x - base)[:, None]) * stretch, cubic_a)
    if exclude_outside:
        weights = np.where((idx < 0) | (idx >= in_len), 0.0, weights)
    if antialias or exclude_outside:
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1), weights


# On NumPy a resized axis is applied as a banded matrix product: the outputs are taken in
# blocks of _BAND_OUTPUTS, and each block is a small dense (block x window) matrix times the
# window of inputs its taps read, one BLAS call per block. That beats gathering tap by tap
# (a take per tap, then a multiply and an add over the whole output) several times over,
# along the last axis most (where a take gathers single elements). Small blocks keep every
# call under OpenBLAS's threading threshold: measured (2 cores, OpenBLAS) the product with
# the whole (out x in) matrix was both slower and, with the cores contended, erratic. When
# the windows are wide next to the taps (downsampling without antialias) the taps win, and
# they run instead. A product multiplies every input of its window, zero weights included,
# so a non-finite input would spoil outputs that never read it: the product runs only when
# the input is all finite (one sum tells), which on CuPy would cost a host synchronisation
# per axis, so there the taps always run.
_BAND_OUTPUTS = 16
_BAND_INPUTS_PER_TAP = 16  # measured: at 0.3x linear (27 per tap) the taps were 2x faster


def _apply_taps(xp, x, axis, idx, weights, compute_dtype):
    """Resample ``x`` along ``axis``: out[..., j, ...] = sum_t w[j, t] * x[..., idx[j, t], ...]."""
    if weights is None:  # nearest: a pure gather keeps integer data exact
        times = _repeat_factor(idx[:, 0], x.shape[axis])
        if times is not None:  # an integer upscale: each input k times (no index array read)
            return xp.repeat(x, times, axis=axis)
        return xp.take(x, xp.asarray(idx[:, 0]), axis=axis)
    x = x.astype(compute_dtype, copy=False)
    if xp is np and x.size and idx.size:
        bands = _bands(idx, weights)
        with np.errstate(over="ignore", invalid="ignore"):  # inf or nan: not finite, quietly
            finite = bands is not None and np.isfinite(x.sum())
        if finite:
            return _banded_product(x, axis, idx.shape[0], bands)
    return weighted_takes(xp, x, axis, idx, weights)


def _repeat_factor(idx, in_len: int) -> int | None:
    """k when the gather takes each input k times in order (nearest at an integer scale)."""
    out_len = idx.shape[0]
    if in_len == 0 or out_len % in_len:
        return None
    times = out_len // in_len
    return times if np.array_equal(idx, np.arange(out_len) // times) else None


# Nearest taps are exact gathers, so they may run in any order, and the order matters: a
# take along the last axis gathers single elements, and per output element costs about four
# times a take along an outer axis, which copies contiguous runs (measured on (1,3,224,224):
# x2 nearest took 0.33 ms rows first, 0.19 ms columns first; x0.5 took 0.016 ms rows first,
# 0.027 ms columns first). The order with the least modelled cost runs: axes that shrink go
# early, and the last axis goes while the array is smallest.
_LAST_AXIS_GATHER_COST = 4.0
_MAX_ORDERED_AXES = 4  # 24 orders; more resized axes keep the axis order


def _cheapest_gather_order(tables: list, shape) -> list:
    if not 1 < len(tables) <= _MAX_ORDERED_AXES:
        return tables

    def cost(order) -> float:
        size, total = 1.0, 0.0
        for taps in order:
            size *= taps.out_len / max(shape[taps.axis], 1)
            total += size * (_LAST_AXIS_GATHER_COST if taps.axis == len(shape) - 1 else 1.0)
        return total

    return list(min(itertools.permutations(tables), key=cost))


def weighted_takes(xp, x, axis: int, idx, weights):
    """sum_t weights[:, t] * x.take(idx[:, t], axis), tap by tap in ``x``'s dtype: one gather
    of the output's size per tap (Resize's forward, and its gradient's transposed taps)."""
    shape = [1] * x.ndim
    shape[axis] = idx.shape[0]
    total = None
    for t in range(idx.shape[1]):
        term = xp.take(x, xp.asarray(idx[:, t]), axis=axis)
        term *= xp.asarray(weights[:, t].reshape(shape), dtype=x.dtype)
        if total is None:
            total = term
        else:
            total += term
    return total


def _bands(idx, weights):
    """The table in blocks of _BAND_OUTPUTS outputs: each block's first input and window
    length, and a (blocks, _BAND_OUTPUTS, widest window) array of their matrices (taps onto
    the same input summed); None when a window is too wide for the product to pay."""
    out_len, depth = idx.shape
    blocks = -(-out_len // _BAND_OUTPUTS)
    padded = np.pad(idx, ((0, blocks * _BAND_OUTPUTS - out_len), (0, 0)), mode="edge")
    per_block = padded.reshape(blocks, -1)
    low = per_block.min(axis=1)
    width = per_block.max(axis=1) - low + 1
    if width.max() > _BAND_INPUTS_PER_TAP * depth:
        return None
    rows = np.arange(out_len)
    block = rows // _BAND_OUTPUTS
    matrices = np.zeros((blocks, _BAND_OUTPUTS, int(width.max())))
    np.add.at(matrices, (block[:, None], (rows % _BAND_OUTPUTS)[:, None],
                         idx - low[block][:, None]), weights)
    return low, width, matrices


def _banded_product(x, axis, out_len, bands):
    """The banded matrix of ``bands`` applied to the NumPy array ``x`` along ``axis``, into a
    C-contiguous result of ``x``'s dtype."""
    low, width, matrices = bands
    matrices = matrices.astype(x.dtype)
    before, after = x.shape[:axis], x.shape[axis + 1:]
    lead, trail = math.prod(before), math.prod(after)
    source = np.ascontiguousarray(x).reshape(lead, x.shape[axis], trail)
    y = np.empty((lead, out_len, trail), dtype=x.dtype)
    for k, (start, length) in enumerate(zip(low.tolist(), width.tolist())):
        first = k * _BAND_OUTPUTS
        count = min(_BAND_OUTPUTS, out_len - first)
        matrix = matrices[k, :count, :length]
        if trail == 1:  # the last axis: rows of inputs times the block's transposed matrix
            np.matmul(source[:, start:start + length, 0], matrix.T,
                      out=y[:, first:first + count, 0])
        else:
            np.matmul(matrix, source[:, start:start + length],
                      out=y[:, first:first + count])
    return y.reshape(before + (out_len,) + after)


# -- Resize ----------------------------------------------------------------------------------

def _output_sizes(in_sizes, scales, sizes, policy):
    """(output sizes, scale factors) along the resized axes. Like onnxruntime, the output
    length from scales ignores the region of interest (the spec's formula scales it)."""
    in_sizes = np.asarray(in_sizes, dtype=np.float64)
    if sizes is not None:
        sizes = sizes.astype(np.int64)
        if policy == "stretch":
            return sizes, sizes / in_sizes
        ratios = sizes / in_sizes
        if policy not in ("not_larger", "not_smaller"):
            raise ValueError(f"Resize: keep_aspect_ratio_policy {policy!r} is not one of "
                             "stretch, not_larger, not_smaller")
        scale = ratios.min() if policy == "not_larger" else ratios.max()
        out = np.floor(scale * in_sizes + 0.5).astype(np.int64)
        return out, np.full(len(in_sizes), scale)
    scales = scales.astype(np.float64)
    return np.floor(in_sizes * scales).astype(np.int64), scales


@dataclass(frozen=True)
class AxisTaps:
    """How Resize resamples one axis: output ``j`` is ``sum_t weights[j, t] *
    input[idx[j, t]]`` (weights None: nearest, one tap of weight 1). ``inside`` (only for
    tf_crop_and_resize) marks the outputs sampled inside the input; the others take
    extrapolation_value."""

    axis: int
    out_len: int
    idx: np.ndarray
    weights: np.ndarray | None
    inside: np.ndarray | None


def resize_taps(shape, roi, scales, sizes, axes=None, *, mode="nearest",
                coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
                exclude_outside=0, nearest_mode="round_prefer_floor", antialias=0,
                keep_aspect_ratio_policy="stretch") -> list[AxisTaps]:
    """The tables of a Resize of an input of ``shape``, one per axis it changes, in the order
    they are applied; Resize's forward and its gradient (image_grad.py) both read them."""
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    roi, scales, sizes = (to_host(v) if _present(v) else None for v in (roi, scales, sizes))
    if (scales is None) == (sizes is None):
        raise ValueError("Resize needs exactly one of 'scales' and 'sizes'")
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"Resize: mode {mode!r} is not one of nearest, linear, cubic")
    in_sizes = [shape[a] for a in axes]
    crop = coordinate_transformation_mode == "tf_crop_and_resize"
    if roi is None:
        roi = np.concatenate([np.zeros(len(axes)), np.ones(len(axes))])
    roi = roi.astype(np.float64)
    out_sizes, factors = _output_sizes(in_sizes, scales, sizes, keep_aspect_ratio_policy)
    tables = []
    for k, axis in enumerate(axes):
        in_len, out_len, scale = in_sizes[k], int(out_sizes[k]), float(factors[k])
        if out_len == in_len and scale == 1.0 and not crop:
            continue
        coords = _source_coords(out_len, in_len, scale, coordinate_transformation_mode,
                                roi[k], roi[k + len(axes)])
        if mode == "nearest":
            rounding = _nearest_index_as_onnxruntime \
                if coordinate_transformation_mode == "tf_half_pixel_for_nn" else _nearest_index
            idx = np.clip(rounding(coords, nearest_mode), 0, in_len - 1)
            idx, weights = idx.astype(np.int64)[:, None], None
        else:
            idx, weights = _filter_taps(coords, in_len, mode, scale=scale, cubic_a=cubic_coeff_a,
                                        antialias=bool(antialias),
                                        exclude_outside=bool(exclude_outside))
        inside = (coords >= 0) & (coords <= in_len - 1) if crop else None
        tables.append(AxisTaps(axis, out_len, idx, weights, inside))
    return tables


def _resize(xp, X, roi, scales, sizes, axes=None, *, extrapolation_value=0.0, **options):
    compute_dtype = accumulation_dtype(X.dtype)
    y, inside = X, None
    tables = resize_taps(X.shape, roi, scales, sizes, axes, **options)
    if all(taps.weights is None for taps in tables):
        tables = _cheapest_gather_order(tables, X.shape)
    for taps in tables:
        y = _apply_taps(xp, y, taps.axis, taps.idx, taps.weights, compute_dtype)
        if taps.inside is not None:  # points sampled outside the input take extrapolation_value
            shape = [1] * X.ndim
            shape[taps.axis] = taps.out_len
            axis_inside = xp.asarray(taps.inside.reshape(shape))
            inside = axis_inside if inside is None else inside & axis_inside
    if inside is not None:
        y = xp.where(inside, y, xp.asarray(extrapolation_value, dtype=y.dtype))
    if y.dtype == X.dtype:  # nearest gathers (or nothing resized): no rounding, which
        return y            # would go through float64 and lose int64 beyond 2**53
    return _cast_result(xp, y, X.dtype)


@op("Resize", since=19, dtypes=NUMERIC)
@op("Resize", since=18, dtypes=NUMERIC)
def resize(xp, X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    return _resize(xp, X, roi, scales, sizes, axes, mode=mode,
                   coordinate_transformation_mode=coordinate_transformation_mode,
                   cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   extrapolation_value=extrapolation_value, nearest_mode=nearest_mode,
                   antialias=antialias, keep_aspect_ratio_policy=keep_aspect_ratio_policy)


@op("Resize", since=13, dtypes=NUMERIC)
@op("Resize", since=11, dtypes=NUMERIC)
def resize_11(xp, X, roi=None, scales=None, sizes=None, *,
              coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
              exclude_outside=0, extrapolation_value=0.0, mode="nearest",
              nearest_mode="round_prefer_floor"):
    return _resize(xp, X, roi, scales, sizes, mode=mode,
                   coordinate_transformation_mode=coordinate_transformation_mode,
                   cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   extrapolation_value=extrapolation_value, nearest_mode=nearest_mode)


@op("Resize", since=10, dtypes=NUMERIC)
@op("Upsample", since=9, dtypes=NUMERIC)
def upsample(xp, X, scales, *, mode="nearest"):
    """Before opset 11 both ops map output i to input i / scale and nearest takes the floor."""
    if mode == "bilinear":
        mode = "linear"
    return _resize(xp, X, None, scales, None, mode=mode,
                   coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@op("Upsample", since=7, dtypes=NUMERIC)
def upsample_7(xp, X, *, mode="nearest", scales=None):
    if scales is None:
        raise ValueError("Upsample-7 requires the 'scales' attribute")
    return upsample(xp, X, np.asarray(scales, dtype=np.float32), mode=mode)


@resize.infer
def _infer_resize(X, roi=None, scales=None, sizes=None, *, axes=None,
                  keep_aspect_ratio_policy="stretch", **_):
    if X.shape is None:
        return [TensorType(X.dtype, None)]
    rank = len(X.shape)
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    _require_one_per_axis(X, axes, scales, sizes)
    given = [None if t is None or t.value is None else np.asarray(t.value)
             for t in (scales, sizes)]
    shape = list(X.shape)
    known_inputs = all(isinstance(X.shape[a], int) for a in axes)
    if known_inputs and any(v is not None and v.size for v in given):
        scale_v, size_v = (v if v is not None and v.size else None for v in given)
        out, _ = _output_sizes([X.shape[a] for a in axes], scale_v, size_v,
                               keep_aspect_ratio_policy)
        for a, n in zip(axes, out):
            shape[a] = int(n)
    else:
        for a in axes:
            shape[a] = None
    return [TensorType(X.dtype, tuple(shape))]


def _require_one_per_axis(X, axes, scales, sizes) -> None:
    """Non-empty scales or sizes hold one value per resized axis (a ValueError otherwise)."""
    whole = axes == list(range(len(X.shape)))
    per = f"axis of X {shape_text(X.shape)}" if whole else f"axis in axes {axes}"
    for name, value_type in (("scales", scales), ("sizes", sizes)):
        shape = None if value_type is None else value_type.shape
        length = shape[0] if shape is not None and len(shape) == 1 else None
        if isinstance(length, int) and length and length != len(axes):
            raise ValueError(f"Resize: {name} holds {length} values; expected {len(axes)}, "
                             f"one per {per}")


resize_11.infer(_infer_resize)


@upsample.infer
def _infer_upsample(X, scales=None, **_):
    return _infer_resize(X, None, scales, None)


@upsample_7.infer
def _infer_upsample_7(X, *, scales=None, **_):
    if X.shape is None or scales is None or not all(isinstance(d, int) for d in X.shape):
        return [TensorType(X.dtype, None if X.shape is None else (None,) * len(X.shape))]
    # the kernel reads the scales as float32: 10 x 0.7 is 10 x 0.699999988, which floors to 6
    out, _ = _output_sizes(list(X.shape), np.asarray(scales, dtype=np.float32), None, "stretch")
    return [TensorType(X.dtype, tuple(int(n) for n in out))]


# -- GridSample ------------------------------------------------------------------------------

_GRID_MODES = {"linear": "linear", "bilinear": "linear", "nearest": "nearest",
               "cubic": "cubic", "bicubic": "cubic"}


def _unnormalize(xp, g, size, align_corners):
    """Grid values in [-1, 1] to pixel coordinates along one spatial axis."""
    if align_corners:
        return (g + 1) / 2 * (size - 1)
    return ((g + 1) * size - 1) / 2


def _reflect(xp, x, low, high):
    """Fold ``x`` into [low, high] by mirroring at the bounds as often as needed."""
    span = high - low
    if span <= 0:
        return xp.zeros_like(x)
    distance = xp.abs(x - low)
    flips = xp.floor(distance / span)
    extra = distance - flips * span
    return xp.where(flips % 2 == 0, low + extra, high - extra)


def _pad_coords(xp, x, size, padding_mode, align_corners):
    """Move out-of-range coordinates back in, per padding_mode ("zeros" leaves them)."""
    if padding_mode == "border":
        return xp.clip(x, 0, size - 1)
    if padding_mode == "reflection":
        low, high = (0, size - 1) if align_corners else (-0.5, size - 0.5)
        return xp.clip(_reflect(xp, x, low, high), 0, size - 1)
    if padding_mode == "zeros":
        return x
    raise ValueError(f"GridSample: padding_mode {padding_mode!r} is not one of "
                     "zeros, border, reflection")


def _grid_taps(xp, coord, size, mode, padding_mode, align_corners):
    """(index, weight) pairs along one spatial axis; weight is 0 where the tap is outside."""
    x = _unnormalize(xp, coord, size, align_corners)
    if mode == "cubic":  # the taps, not the centre, are padded (as PyTorch does)
        base = xp.floor(x)
        t = x - base
        taps = []
        for offset in (-1, 0, 1, 2):
            idx = _pad_coords(xp, base + offset, size, padding_mode, align_corners)
            weight = _cubic_kernel(offset - t, -0.75, xp)  # PyTorch's fixed coefficient
            taps.append((idx, weight))
    else:
        x = _pad_coords(xp, x, size, padding_mode, align_corners)
        if mode == "nearest":
            taps = [(xp.rint(x), xp.ones_like(x))]
        else:
            base = xp.floor(x)
            t = x - base
            taps = [(base, 1 - t), (base + 1, t)]
    result = []
    for idx, weight in taps:
        inside = (idx >= 0) & (idx <= size - 1)
        result.append((xp.clip(idx, 0, size - 1).astype(np.int64), xp.where(inside, weight, 0)))
    return result


@op("GridSample", since=22, dtypes=FLOATS)
@op("GridSample", since=20, dtypes=FLOATS)
@op("GridSample", since=16, dtypes=FLOATS)
def grid_sample(xp, X, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    if mode not in _GRID_MODES:
        raise ValueError(f"GridSample: mode {mode!r} is not one of linear, nearest, cubic")
    mode = _GRID_MODES[mode]
    n, c, *spatial = X.shape
    out_spatial = grid.shape[1:-1]
    compute_dtype = accumulation_dtype(X.dtype)
    grid = grid.astype(compute_dtype, copy=False)
    # grid's last axis lists coordinates innermost-first: grid[..., 0] indexes the last axis.
    per_axis = [_grid_taps(xp, grid[..., len(spatial) - 1 - d], size, mode, padding_mode,
                           align_corners)
                for d, size in enumerate(spatial)]
    strides = [int(np.prod(spatial[d + 1:])) for d in range(len(spatial))]
    pixels = xp.moveaxis(X.reshape(n, c, -1), 1, -1).astype(compute_dtype, copy=False)
    batch = xp.arange(n).reshape((n,) + (1,) * len(out_spatial))
    y = xp.zeros((n, *out_spatial, c), dtype=compute_dtype)
    for combo in itertools.product(*per_axis):
        flat = sum(idx * stride for (idx, _), stride in zip(combo, strides))
        weight = combo[0][1]
        for _, w in combo[1:]:
            weight = weight * w
        y += pixels[batch, flat] * weight[..., None].astype(compute_dtype, copy=False)
    return xp.moveaxis(y, -1, 1).astype(X.dtype, copy=False)


@grid_sample.infer
def _infer_grid_sample(X, grid, **_):
    if X.shape is None or grid.shape is None:
        return [TensorType(X.dtype, None)]
    return [TensorType(X.dtype, (X.shape[0], X.shape[1], *grid.shape[1:-1]))]


# -- AffineGrid ------------------------------------------------------------------------------

def _base_positions(xp, size, align_corners, dtype):
    """Evenly spaced positions in [-1, 1] along one axis of length ``size``."""
    i = xp.arange(size, dtype=dtype)
    if align_corners:
        return i * 2 / (size - 1) - 1 if size > 1 else xp.zeros(1, dtype=dtype)
    return (2 * i + 1) / size - 1


@op("AffineGrid", since=20, dtypes=FLOATS)
def affine_grid(xp, theta, size, *, align_corners=0):
    n, _c, *spatial = (int(v) for v in to_host(size))
    dtype = accumulation_dtype(theta.dtype)
    axes = [_base_positions(xp, s, align_corners, dtype) for s in spatial]
    # Homogeneous positions [x, y, (z,) 1] with x along the last (innermost) spatial axis.
    mesh = xp.meshgrid(*axes, indexing="ij")[::-1]
    points = xp.stack([*mesh, xp.ones_like(mesh[0])], axis=-1).reshape(-1, len(spatial) + 1)
    grid = xp.einsum("pk,nrk->npr", points, theta.astype(dtype, copy=False))
    return grid.reshape(n, *spatial, len(spatial)).astype(theta.dtype, copy=False)


@affine_grid.infer
def _infer_affine_grid(theta, size, **_):
    if size.value is None:
        return [TensorType(theta.dtype, None)]
    n, _c, *spatial = (int(v) for v in np.asarray(size.value))
    expected = (n, len(spatial), len(spatial) + 1)  # (N, 2, 3) or (N, 3, 4)
    if theta.shape is not None and (len(theta.shape) != 3 or any(
            isinstance(d, int) and d != e for d, e in zip(theta.shape, expected))):
        raise ValueError(f"AffineGrid: theta has shape {shape_text(theta.shape)}; expected "
                         f"{shape_text(expected)} for size {[n, _c, *spatial]}")
    return [TensorType(theta.dtype, (n, *spatial, len(spatial)))]


# -- NonMaxSuppression -----------------------------------------------------------------------

@op("NonMaxSuppression", since=11)
@op("NonMaxSuppression", since=10)
def non_max_suppression(xp, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box=0):
    # Greedy selection is sequential and data-dependent: it runs on the host.
    boxes, scores = to_host(boxes), to_host(scores)
    limit = 0 if not _present(max_output_boxes_per_class) else int(
        to_host(max_output_boxes_per_class).reshape(-1)[0])
    iou = 0.0 if not _present(iou_threshold) else float(to_host(iou_threshold).reshape(-1)[0])
    min_score = None if not _present(score_threshold) else float(
        to_host(score_threshold).reshape(-1)[0])
    selected = nms_cpu.select_all(nms_cpu.corners(boxes, center_point_box), scores, limit,
                                  iou, min_score)
    return xp.asarray(selected)


@non_max_suppression.infer
def _infer_nms(*_, **__):
    return [TensorType(np.dtype(np.int64), (None, 3))]


# -- inputs read on the host only (OpHandle.reads_on_host) ------------------------------------

resize.reads_on_host(1, 2, 3)
resize_11.reads_on_host(1, 2, 3)
upsample.reads_on_host(1)
