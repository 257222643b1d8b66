"""GridSample and AffineGrid: an image sampled at the points of a grid (bilinear, nearest or
bicubic, with zeros, border or reflection padding), and the grid of an affine transform.
Unlike Resize's (``image.py``), GridSample's taps depend on the grid's values, so they are
computed on the device, per output point and spatial axis. Their gradients are in
``image_sample_grad.py``.
"""

from __future__ import annotations

import itertools

import numpy as np

from mixrt.ops.device import to_host
from mixrt.ops.image.resample import _cubic_kernel
from mixrt.ops.ir.dtypes import FLOATS, accumulation_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, shape_text


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
