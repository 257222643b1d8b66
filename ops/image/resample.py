"""Resampling along one axis, which Resize (``image.py``) and its gradient
(``image_grad.py``) do once per resized axis and GridSample's cubic taps (``grid_sample.py``)
share: the 1-D tables of source indices and weights ("taps") each output position reads (the
coordinate transformation, nearest rounding, the linear and cubic filters), and their
application to an array along one axis, as gathers or, on NumPy, as a banded matrix product.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


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


# -- applying them along an axis ------------------------------------------------------------

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
