"""Gradients of GridSample (16, 20, 22) and AffineGrid (those of RoiAlign and MaxRoiPool:
``ops/pool/roi_pool_grad.py``).

GridSample
----------
Along each spatial axis d a grid coordinate g is unnormalized to a pixel position
``x = u(g)`` (slope ``s = (size - 1) / 2`` with align_corners, ``size / 2`` without), moved
back into the image by the padding map ``p`` (linear and nearest modes), and read through
a few taps: index ``i_t`` with weight ``w_t(x)``. A sample is the sum over every combination
k of one tap per axis ("corner") of ``W_k X[i_k]`` with ``W_k = prod_d w_d``. So:

* dX is dY scattered back with the weights: ``dX[i_k] += W_k dY`` (an adjoint of a gather);
* dGrid along axis e is ``sum_k dW_k/dg_e <dY, X[i_k]>`` (the channel dot product), where
  ``dW_k/dg_e`` replaces ``w_e`` by its derivative. Tap indices are piecewise constant and
  pass nothing back. The chain through ``u`` and ``p`` multiplies by ``s`` and by ``p'``:
  1 for zeros padding, 0 where border padding clamps (PyTorch's rule: at or beyond either
  edge), +-1 where reflection padding folds the coordinate (the sign flips at each fold) and
  0 where its final clamp holds. Linear weights are ``1 - t`` and ``t`` (t the fractional
  part), so their slopes are -1 and +1. Cubic mode pads the four tap indices, never the
  centre, so only ``s`` enters, with the derivative of Keys' kernel (a = -0.75). Nearest
  weights are constant: dGrid is zero and is not built.

Both run in one backward kernel, GridSampleGrad, whose ``input_grad``/``grid_grad`` flags
pick the outputs; the gradient function emits one node for dX and another for dGrid, so
dead-node elimination drops whichever a graph does not need (a fixed grid, a frozen image).

Second order: dX is linear in dY with adjoint GridSample itself, and its derivative in the
grid is dGrid of GridSampleGrad with ddX in place of X. dGrid is linear in dY and in X, and
its derivative along ddGrid is GridSampleGradGrad (``wrt`` = dY, X or grid): the grid's
directional derivative of GridSample applied to X (for dY), the same weights scattered
with dY (for X), and the Hessian of the weights contracted with ddGrid (for grid: the
second derivative of the cubic kernel along one axis, the product of two first
derivatives across axes). GridSampleGradGrad has no gradient of its own, so a third
derivative through a grid raises GradientError.

AffineGrid
----------
``grid[n, p, r] = sum_k points[p, k] theta[n, r, k]`` with ``points`` the homogeneous base
positions: ``dtheta = sum_p dGrid[n, p, r] points[p, k]`` (AffineGridGrad), whose adjoint is
AffineGrid again, so the pair differentiates to any order.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from mixrt.ops.image import image
from mixrt.ops.conv.conv_grad import forwarded
from mixrt.ops.ir.dtypes import accumulation_dtype
from mixrt.ops.training.grad_support import MIXRT, shaped_like_second
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType

_CUBIC_A = -0.75  # GridSample's fixed Keys coefficient (PyTorch's)


# -- GridSample: taps along one axis, with the derivatives of their weights ------------------

@dataclass
class _Tap:
    """One tap along one spatial axis at every sampled position: the (clamped) index, its
    weight, and the weight's first and second derivatives in the grid coordinate (None where
    they are zero everywhere)."""

    idx: object
    weight: object
    slope: object = None
    curve: object = None


def _unnormalize_slope(size: int, align_corners) -> float:
    """d x / d g of image._unnormalize."""
    return (size - 1) / 2 if align_corners else size / 2


def _padding_slope(xp, x, size: int, padding_mode: str, align_corners):
    """d p(x) / d x of image._pad_coords, PyTorch's choice at the kinks (0 on a clamped
    edge)."""
    if padding_mode == "zeros":
        return xp.ones_like(x)
    if padding_mode == "border":
        return ((x > 0) & (x < size - 1)).astype(x.dtype)
    low, high = (0, size - 1) if align_corners else (-0.5, size - 0.5)
    span = high - low
    if span <= 0:  # a one-pixel axis with align_corners: the forward pins it to 0
        return xp.zeros_like(x)
    folded = image._reflect(xp, x, low, high)
    flips = xp.floor(xp.abs(x - low) / span)
    # mirrored below ``low`` and after every odd number of folds: the coordinate runs back
    sign = xp.where(x < low, -1.0, 1.0) * xp.where(flips % 2 == 0, 1.0, -1.0)
    unclamped = (folded > 0) & (folded < size - 1)
    return (sign * unclamped).astype(x.dtype)


def _cubic_slope(xp, u, a):
    """k'(u) of image._cubic_kernel."""
    d = xp.abs(u)
    near = (3 * (a + 2) * d - 2 * (a + 3)) * d
    far = (3 * a * d - 10 * a) * d + 8 * a
    return xp.sign(u) * xp.where(d <= 1, near, xp.where(d < 2, far, 0.0))


def _cubic_curve(xp, u, a):
    """k''(u) of image._cubic_kernel (even, like the kernel)."""
    d = xp.abs(u)
    return xp.where(d <= 1, 6 * (a + 2) * d - 2 * (a + 3), xp.where(d < 2, 6 * a * d - 10 * a,
                                                                      0.0))


def _axis_taps(xp, coord, size: int, mode: str, padding_mode: str, align_corners) -> list:
    """image._grid_taps' (index, weight) pairs, in its order, with the weights'
    derivatives in ``coord`` (the grid value along this axis)."""
    x = image._unnormalize(xp, coord, size, align_corners)
    scale = _unnormalize_slope(size, align_corners)
    if mode == "cubic":
        base = xp.floor(x)
        t = x - base
        taps = []
        for offset in (-1, 0, 1, 2):
            u = offset - t  # du/dx = -1
            taps.append(_Tap(image._pad_coords(xp, base + offset, size, padding_mode,
                                               align_corners),
                             image._cubic_kernel(u, _CUBIC_A, xp),
                             -scale * _cubic_slope(xp, u, _CUBIC_A),
                             scale * scale * _cubic_curve(xp, u, _CUBIC_A)))
    else:
        padded = image._pad_coords(xp, x, size, padding_mode, align_corners)
        if mode == "nearest":
            taps = [_Tap(xp.rint(padded), xp.ones_like(padded))]
        else:
            slope = scale * _padding_slope(xp, x, size, padding_mode, align_corners)
            base = xp.floor(padded)
            t = padded - base
            taps = [_Tap(base, 1 - t, -slope), _Tap(base + 1, t, slope)]
    return [_inside(xp, tap, size) for tap in taps]


def _inside(xp, tap: _Tap, size: int) -> _Tap:
    """Taps off the image (zeros padding) weigh nothing, and neither do their derivatives."""
    inside = (tap.idx >= 0) & (tap.idx <= size - 1)

    def masked(values):
        return None if values is None else xp.where(inside, values, 0)
    return _Tap(xp.clip(tap.idx, 0, size - 1).astype(np.int64), masked(tap.weight),
                masked(tap.slope), masked(tap.curve))


def _product(factors):
    """The product of arrays, or None (zero) when one of them is None."""
    result = None
    for factor in factors:
        if factor is None:
            return None
        result = factor if result is None else result * factor
    return result


class _Corner:
    """One combination of taps, one per spatial axis (axis order, outermost first)."""

    def __init__(self, taps, strides):
        self.taps = taps
        self.flat = sum(tap.idx * stride for tap, stride in zip(taps, strides))

    def _with(self, replaced: dict):
        return _product([replaced.get(d, tap.weight) for d, tap in enumerate(self.taps)])

    def weight(self):
        return self._with({})

    def slope(self, e: int):
        """d W / d g_e."""
        return self._with({e: self.taps[e].slope})

    def curve(self, e: int, f: int):
        """d^2 W / d g_e d g_f."""
        if e == f:
            return self._with({e: self.taps[e].curve})
        return self._with({e: self.taps[e].slope, f: self.taps[f].slope})


class _Sampler:
    """GridSample's sampling of an image of ``shape`` at ``grid``, channels last: an image is
    read as (N, S, C) pixels (S the flattened spatial positions), dY as (N, P, C) (P the
    flattened grid positions) and the grid as (N, P, D)."""

    def __init__(self, xp, shape, grid, mode, padding_mode, align_corners, dtype):
        self.xp, self.shape, self.dtype = xp, tuple(shape), dtype
        self.mode = image._GRID_MODES.get(mode)
        if self.mode is None:
            raise ValueError(f"GridSample: mode {mode!r} is not one of linear, nearest, cubic")
        n, _c, *spatial = self.shape
        self.rank = len(spatial)
        self.grid_shape = tuple(grid.shape)
        coords = grid.astype(dtype, copy=False).reshape(n, -1, self.rank)
        # grid's last axis lists coordinates innermost-first (see image.grid_sample)
        per_axis = [_axis_taps(xp, coords[..., self.rank - 1 - d], size, self.mode,
                               padding_mode, align_corners)
                    for d, size in enumerate(spatial)]
        strides = [math.prod(spatial[d + 1:]) for d in range(self.rank)]
        self.corners = [_Corner(taps, strides) for taps in itertools.product(*per_axis)]
        self.batch = xp.arange(n).reshape(n, 1)

    def channels_last(self, array):
        n, c = array.shape[:2]
        return self.xp.moveaxis(array.reshape(n, c, -1), 1, -1).astype(self.dtype, copy=False)

    def gather(self, pixels, corner: _Corner):
        return pixels[self.batch, corner.flat]

    def scatter(self, terms):
        """The (N, C, *spatial) image into which each ``(corner, values (N, P, C))`` of
        ``terms`` adds its values at the corner's pixels (a bincount, CuPy's too)."""
        xp = self.xp
        n, c, *spatial = self.shape
        size = math.prod(self.shape)
        total = xp.zeros(size, dtype=self.dtype)
        channels = xp.arange(c)
        for corner, values in terms:
            if values is None:
                continue
            index = ((self.batch * math.prod(spatial) + corner.flat)[..., None] * c
                     + channels).reshape(-1)
            total += xp.bincount(index, weights=values.reshape(-1), minlength=size).astype(
                self.dtype, copy=False)
        return xp.moveaxis(total.reshape(n, -1, c), -1, 1).reshape(self.shape)

    def to_grid(self, terms):
        """The (N, *positions, D) grid-shaped sum over ``(coefficients, dots)`` of
        ``coefficients[e] * dots`` along axis e (stored at grid index D - 1 - e)."""
        n = self.shape[0]
        axes = [None] * self.rank
        for coefficients, dots in terms:
            for e, coefficient in enumerate(coefficients):
                if coefficient is not None:
                    term = coefficient * dots
                    axes[e] = term if axes[e] is None else axes[e] + term
        zeros = self.xp.zeros((n, math.prod(self.grid_shape[1:-1])), dtype=self.dtype)
        columns = [zeros if a is None else a for a in reversed(axes)]
        return self.xp.stack(columns, axis=-1).reshape(self.grid_shape)

    def directional(self, corner: _Corner, direction):
        """d W / d g along ``direction`` (N, P, D): sum_e direction_e dW/dg_e, or None."""
        return self._along([corner.slope(e) for e in range(self.rank)], direction)

    def hessian_along(self, corner: _Corner, direction):
        """sum_e direction_e d^2 W / d g_e d g_f, one entry (or None) per axis f."""
        return [self._along([corner.curve(e, f) for e in range(self.rank)], direction)
                for f in range(self.rank)]

    def _along(self, per_axis: list, direction):
        return _sum(value * direction[..., self.rank - 1 - e]
                    for e, value in enumerate(per_axis) if value is not None)

    def output(self, channels_last):
        """(N, P, C) back to GridSample's (N, C, *positions)."""
        n, c = self.shape[:2]
        return self.xp.moveaxis(channels_last, -1, 1).reshape(n, c, *self.grid_shape[1:-1])


def _sum(terms):
    result = None
    for term in terms:
        result = term if result is None else result + term
    return result


def _dots(a, b):
    """The channel dot product of two (N, P, C) arrays."""
    return (a * b).sum(axis=-1)


def _sampler(xp, X, grid, align_corners, mode, padding_mode):
    return _Sampler(xp, X.shape, grid, mode, padding_mode, align_corners,
                    accumulation_dtype(X.dtype))


@op("GridSampleGrad", since=1, domain=MIXRT)
def grid_sample_grad(xp, dY, X, grid, *, align_corners=0, mode="linear", padding_mode="zeros",
                     input_grad=1, grid_grad=1):
    """dX (when ``input_grad``) and dGrid (when ``grid_grad``) of GridSample(X, grid) whose
    output gradient is ``dY``; X's values are read only for dGrid."""
    sampler = _sampler(xp, X, grid, align_corners, mode, padding_mode)
    dy = sampler.channels_last(dY)
    grads = []
    if input_grad:
        dx = sampler.scatter((c, _times(dy, c.weight())) for c in sampler.corners)
        grads.append(dx.astype(X.dtype, copy=False))
    if grid_grad:
        pixels = sampler.channels_last(X)
        dgrid = sampler.to_grid(([c.slope(e) for e in range(sampler.rank)],
                                 _dots(dy, sampler.gather(pixels, c)))
                                for c in sampler.corners)
        grads.append(dgrid.astype(grid.dtype, copy=False))
    return grads[0] if len(grads) == 1 else tuple(grads)


@grid_sample_grad.infer
def _(dY, X, grid, *, input_grad=1, grid_grad=1, **_):
    return ([TensorType(X.dtype, X.shape)] * bool(input_grad)
            + [TensorType(grid.dtype, grid.shape)] * bool(grid_grad))


@op("GridSampleGradGrad", since=1, domain=MIXRT)
def grid_sample_grad_grad(xp, dY, X, grid, ddGrid, *, wrt="grid", align_corners=0,
                          mode="linear", padding_mode="zeros"):
    """The derivative along ``ddGrid`` of GridSampleGrad's dGrid(dY, X, grid), with respect
    to ``wrt`` (dY, X or grid): the second-order terms only it has."""
    sampler = _sampler(xp, X, grid, align_corners, mode, padding_mode)
    direction = ddGrid.astype(sampler.dtype, copy=False).reshape(X.shape[0], -1, sampler.rank)
    dy = sampler.channels_last(dY)
    if wrt == "X":
        dx = sampler.scatter((c, _times(dy, sampler.directional(c, direction)))
                             for c in sampler.corners)
        return dx.astype(X.dtype, copy=False)
    pixels = sampler.channels_last(X)
    if wrt == "dY":
        total = xp.zeros(dy.shape, dtype=sampler.dtype)
        for corner in sampler.corners:
            along = sampler.directional(corner, direction)
            if along is not None:
                total += sampler.gather(pixels, corner) * along[..., None]
        return sampler.output(total).astype(dY.dtype, copy=False)
    if wrt != "grid":
        raise ValueError(f"GridSampleGradGrad: wrt must be dY, X or grid; got {wrt!r}")
    dgrid = sampler.to_grid((sampler.hessian_along(c, direction),
                             _dots(dy, sampler.gather(pixels, c))) for c in sampler.corners)
    return dgrid.astype(grid.dtype, copy=False)


def _times(values, coefficient):
    return None if coefficient is None else values * coefficient[..., None]


@grid_sample_grad_grad.infer
def _(dY, X, grid, ddGrid, *, wrt="grid", **_):
    like = {"dY": dY, "X": X}.get(wrt, grid)
    return [TensorType(like.dtype, like.shape)]


_GRID_ATTRIBUTES = ("align_corners", "mode", "padding_mode")


def _grid_attributes(node) -> dict:
    """The forward's attributes, mode spelled as opset 20 does (bilinear -> linear)."""
    attributes = forwarded(node, _GRID_ATTRIBUTES)
    if "mode" in attributes:
        attributes["mode"] = image._GRID_MODES.get(attributes["mode"], attributes["mode"])
    return attributes


@image.grid_sample.grad
def _(b, node, dy):
    x, grid = node.inputs[:2]
    if dy[0] is None:
        return [None, None]
    attributes = _grid_attributes(node)
    dx = dgrid = None
    if b.differentiable(x):
        dx = b.emit("GridSampleGrad", dy[0], x, grid, domain=MIXRT, input_grad=1,
                    grid_grad=0, **attributes)
    if b.differentiable(grid) and attributes.get("mode") != "nearest":
        dgrid = b.emit("GridSampleGrad", dy[0], x, grid, domain=MIXRT, input_grad=0,
                       grid_grad=1, **attributes)
    return [dx, dgrid]


@grid_sample_grad.grad
def _(b, node, dd):
    """dX's part: GridSample of ddX (for dY) and dGrid with ddX for X (for the grid); dGrid's
    part: GridSampleGradGrad for each input."""
    dy, x, grid = node.inputs[:3]
    attributes = _grid_attributes(node)
    flags = [node.attributes.get("input_grad", 1), node.attributes.get("grid_grad", 1)]
    incoming = iter(dd)
    dd_x, dd_grid = (next(incoming) if flag else None for flag in flags)
    to_dy, to_x, to_grid = [], [], []
    if dd_x is not None:
        to_dy.append(b.emit("GridSample", dd_x, grid, opset=20, **attributes))
        if attributes.get("mode") != "nearest":
            to_grid.append(b.emit("GridSampleGrad", dy, dd_x, grid, domain=MIXRT,
                                  input_grad=0, grid_grad=1, **attributes))
    if dd_grid is not None and attributes.get("mode") != "nearest":
        for wrt, into in (("dY", to_dy), ("X", to_x), ("grid", to_grid)):
            into.append(b.emit("GridSampleGradGrad", dy, x, grid, dd_grid, domain=MIXRT,
                               wrt=wrt, **attributes))
    return [b.accumulate(to_dy), b.accumulate(to_x), b.accumulate(to_grid)]


# -- AffineGrid -------------------------------------------------------------------------------

def _base_points(xp, spatial, align_corners, dtype):
    """(P, D + 1) homogeneous base positions, innermost axis first, as image.affine_grid
    builds them."""
    axes = [image._base_positions(xp, s, align_corners, dtype) for s in spatial]
    mesh = xp.meshgrid(*axes, indexing="ij")[::-1]
    return xp.stack([*mesh, xp.ones_like(mesh[0])], axis=-1).reshape(-1, len(spatial) + 1)


@op("AffineGridGrad", since=1, domain=MIXRT)
def affine_grid_grad(xp, dGrid, theta, size=None, *, align_corners=0):
    """d theta of AffineGrid(theta, size) whose output gradient is ``dGrid``; ``size`` is
    only carried for this kernel's own gradient (AffineGrid needs it)."""
    n, *spatial, rank = dGrid.shape
    dtype = accumulation_dtype(theta.dtype)
    points = _base_points(xp, spatial, align_corners, dtype)
    flat = dGrid.astype(dtype, copy=False).reshape(n, -1, rank)
    return xp.einsum("npr,pk->nrk", flat, points).astype(theta.dtype, copy=False)


affine_grid_grad.infer(shaped_like_second)


@image.affine_grid.grad
def _(b, node, dy):
    theta, size = node.inputs[:2]
    if dy[0] is None:
        return [None, None]
    return [b.emit("AffineGridGrad", dy[0], theta, size, domain=MIXRT,
                   **forwarded(node, ("align_corners",))), None]


@affine_grid_grad.grad
def _(b, node, dd):
    """Linear in dGrid: its adjoint is AffineGrid."""
    size = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if size is None:
        return [None, None, None]
    return [b.emit("AffineGrid", dd[0], size, opset=20,
                   **forwarded(node, ("align_corners",))), None, None]
