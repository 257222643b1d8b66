"""Convolutions: Conv, ConvTranspose, DeformConv and Col2Im.

All of them are built from two primitives over the spatial axes of an NC... tensor:

* ``sliding_windows`` - a zero-copy strided view ``(N, C, *kernel, *out)`` of a padded input,
  so Conv is one im2col copy plus one matmul per group (BLAS does the work);
* ``fold`` - the adjoint: scatter-add a ``(N, C, *kernel, *in)`` column tensor back into an
  image, one strided slice add per kernel offset (ConvTranspose, Col2Im).

The window geometry (``windows.py``) and ``pad_spatial`` are shared with pool.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from mixrt.ops.conv.windows import (auto_pad_name, inferred_out_dims, spatial_attrs,
                                     window_geometry)
from mixrt.ops.device import to_host
from mixrt.ops.ir.dtypes import ALL, FLOATS
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, conflicting, fits, require_shape, shape_text

# -- window geometry (the attributes, pads and output sizes: windows.py) ---------------------


def pad_spatial(xp, x, begin, end, value=0):
    """``x`` padded on its trailing ``len(begin)`` axes with a constant (no copy if no pad)."""
    if not any(begin) and not any(end):
        return x
    lead = [(0, 0)] * (x.ndim - len(begin))
    return xp.pad(x, lead + list(zip(begin, end)), mode="constant", constant_values=value)


def _as_strided(xp):
    # the array module's own as_strided (NumPy and CuPy keep it in different places)
    if xp.__name__ == "cupy":
        import cupy.lib.stride_tricks as tricks
    else:
        tricks = np.lib.stride_tricks
    return tricks.as_strided


def strided_span(start: int, step: int, count: int) -> slice:
    """The slice of ``count`` positions ``step`` apart from ``start``: where one tap of every
    window lies along an axis. Empty where ``count`` is 0 (``start - step + 1`` as a stop
    would count from the end of the axis and take positions that are not there)."""
    return slice(start, start + (count - 1) * step + 1 if count else start, step)


def sliding_windows(xp, x, kernel, strides, dilations, out):
    """A read-only view ``(*lead, *kernel, *out)`` of windows over the trailing spatial axes
    of ``x``; ``x`` must be padded enough for every window to fit."""
    nd = len(kernel)
    lead, lead_strides = x.shape[:-nd], x.strides[:-nd]
    step = x.strides[-nd:]
    shape = tuple(lead) + tuple(kernel) + tuple(out)
    byte_strides = (tuple(lead_strides) + tuple(t * d for t, d in zip(step, dilations))
                 + tuple(t * s for t, s in zip(step, strides)))
    return _as_strided(xp)(x, shape=shape, strides=byte_strides)


def fold(xp, cols, strides, dilations, full_dims):
    """Scatter-add ``cols`` ``(*lead, *kernel, *in)`` into zeros ``(*lead, *full_dims)``:
    the adjoint of ``sliding_windows``. Window positions past ``full_dims`` are dropped."""
    nd = len(full_dims)
    lead = cols.shape[:-2 * nd]
    kernel, in_dims = cols.shape[-2 * nd:-nd], cols.shape[-nd:]
    image = xp.zeros(tuple(lead) + tuple(full_dims), dtype=cols.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        target, source = [], []
        for o, d, s, n, full in zip(offset, dilations, strides, in_dims, full_dims):
            start = o * d
            count = min(n, max(0, -(-(full - start) // s)))  # positions that land inside
            target.append(strided_span(start, s, count))
            source.append(slice(0, count))
        lead_index = (Ellipsis,)
        image[lead_index + tuple(target)] += cols[lead_index + offset + tuple(source)]
    return image


def crop_spatial(xp, x, begin, sizes):
    """``x[..., begin:begin+size]`` per spatial axis, zero-filled where that runs past ``x``
    (either side); used where output_shape asks for more than the computed image."""
    nd = len(begin)
    dims = x.shape[-nd:]
    if all(0 <= b and b + n <= d for b, n, d in zip(begin, sizes, dims)):
        return x[(Ellipsis,) + tuple(slice(b, b + n) for b, n in zip(begin, sizes))]
    out = xp.zeros(x.shape[:-nd] + tuple(sizes), dtype=x.dtype)
    src, dst = [], []
    for b, n, d in zip(begin, sizes, dims):
        lo, hi = max(b, 0), min(b + n, d)
        hi = max(hi, lo)
        src.append(slice(lo, hi))
        dst.append(slice(lo - b, hi - b))
    out[(Ellipsis,) + tuple(dst)] = x[(Ellipsis,) + tuple(src)]
    return out


def work_dtype(dtype):
    """The dtype to accumulate in: float16/bfloat16 go through float32 (NumPy has no fast
    half-precision matmul, and float32 sums are what other runtimes produce)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f" and dtype.itemsize >= 4:
        return dtype
    if dtype.kind in "iub":
        return dtype
    return np.dtype(np.float32)


# -- Conv -----------------------------------------------------------------------------------

@op("Conv", since=22, dtypes=FLOATS)
@op("Conv", since=11, dtypes=FLOATS)
@op("Conv", since=1, dtypes=FLOATS)
def conv(xp, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    """N-D grouped convolution by im2col: one strided copy, one matmul per group."""
    out_dtype = X.dtype
    dtype = _common_work_dtype(X.dtype, W.dtype)
    X, W = X.astype(dtype, copy=False), W.astype(dtype, copy=False)
    nd = X.ndim - 2
    kernel, strides, dilations, group, begin, end, out = conv_geometry(
        X, W, auto_pad, dilations, group, kernel_shape, pads, strides)
    (n, c), m = X.shape[:2], W.shape[0]
    weights = W.reshape(group, m // group, W.shape[1] * math.prod(kernel))
    cols_bytes = c * math.prod(kernel) * math.prod(out) * dtype.itemsize
    chunk = max(1, _COLS_BUDGET // max(cols_bytes, 1))  # bound im2col memory on big batches
    if chunk >= n:
        Y = xp.matmul(weights, _im2col(xp, X, kernel, strides, dilations, begin, end, out,
                                       group))
    else:
        Y = xp.empty((n, group, m // group, math.prod(out)), dtype=dtype)
        for start in range(0, n, chunk):
            cols = _im2col(xp, X[start:start + chunk], kernel, strides, dilations, begin, end,
                           out, group)
            xp.matmul(weights, cols, out=Y[start:start + chunk])
    Y = Y.reshape((n, m) + tuple(out))
    if B is not None:
        Y += B.astype(dtype, copy=False).reshape((1, m) + (1,) * nd)
    return Y.astype(out_dtype, copy=False)


_COLS_BUDGET = 256 << 20  # bytes of im2col columns built at once


def conv_geometry(X, W, auto_pad, dilations, group, kernel_shape, pads, strides):
    """(kernel, strides, dilations, group, pad begin, pad end, output dims) of a Conv, with
    the channel and group counts checked (shared with the CPU fast path)."""
    kernel, strides, dilations = spatial_attrs(X.ndim - 2, kernel_shape or W.shape[2:],
                                               strides, dilations)
    group = int(group)
    c, m = X.shape[1], W.shape[0]
    if c != W.shape[1] * group or m % group:
        raise ValueError(f"Conv: X has {c} channels and W shape {tuple(W.shape)}, "
                         f"which do not match group={group}")
    begin, end, out = window_geometry(X.shape[2:], kernel, strides, dilations, pads, auto_pad)
    return kernel, strides, dilations, group, begin, end, out


def _common_work_dtype(*dtypes):
    try:
        common = np.result_type(*dtypes)
    except TypeError:  # e.g. bfloat16 with float16: no NumPy promotion rule
        common = np.dtype(np.float32)
    return work_dtype(common)


def _im2col(xp, X, kernel, strides, dilations, begin, end, out, group):
    """(N, G, C/G * prod(kernel), prod(out)) columns of X's windows."""
    n, c = X.shape[:2]
    rows = c // group * math.prod(kernel)
    length = math.prod(out)
    if all(k == 1 for k in kernel) and not any(begin) and not any(end):
        # 1x1 kernels need no window copy, only a (possibly strided) subsample
        X = X[(Ellipsis,) + tuple(strided_span(0, s, o) for o, s in zip(out, strides))]
        return xp.ascontiguousarray(X).reshape(n, group, rows, length)
    padded = pad_spatial(xp, X, begin, end)
    windows = sliding_windows(xp, padded, kernel, strides, dilations, out)
    return windows.reshape(n, group, rows, length)


def _require_conv_channels(X, W, B, group) -> None:
    """X's channels are W's input channels times group, W's output channels split into
    the groups, and a bias holds one value per output channel (where the dims are static)."""
    if X.shape is None or W is None or W.shape is None or len(X.shape) < 2:
        return
    if len(W.shape) != len(X.shape):
        raise ValueError(f"Conv: W {shape_text(W.shape)} must have X's rank "
                         f"({len(X.shape)}, X {shape_text(X.shape)})")
    group = int(group)
    per_group = W.shape[1] * group if isinstance(W.shape[1], int) else None
    outputs = W.shape[0]
    if conflicting(X.shape[1], per_group) or (isinstance(outputs, int) and outputs % group):
        raise ValueError(f"Conv: X {shape_text(X.shape)} has {X.shape[1]} channels and W "
                         f"{shape_text(W.shape)}, which do not match group={group}")
    require_shape("Conv's bias B", B, (outputs,))


def _conv_infer(X, W, B=None, *, auto_pad="NOTSET", dilations=None, kernel_shape=None,
                pads=None, strides=None, group=1, **_):
    if X.shape is None:
        return [TensorType(X.dtype, None)]
    _require_conv_channels(X, W, B, group)
    channels = None if W is None or W.shape is None else W.shape[0]
    if kernel_shape and W is not None and W.shape is not None and (
            len(kernel_shape) != len(W.shape) - 2
            or any(conflicting(k, w) for k, w in zip(kernel_shape, W.shape[2:]))):
        raise ValueError(f"Conv: W {shape_text(W.shape)} does not match kernel_shape "
                         f"{list(kernel_shape)} (W's spatial dims are the kernel's)")
    kernel = kernel_shape or (None if W is None or W.shape is None else W.shape[2:])
    out = inferred_out_dims(X.shape[2:], kernel, strides, dilations, pads, auto_pad)
    spatial = out if out is not None else [None] * (len(X.shape) - 2)
    return [TensorType(X.dtype, (X.shape[0], channels, *spatial))]


conv.infer(_conv_infer)


# -- ConvTranspose --------------------------------------------------------------------------

def convtranspose_geometry(in_dims, kernel, strides, dilations, pads, auto_pad,
                           output_padding, output_shape):
    """(begin pads, output sizes) of a transposed convolution along each spatial axis."""
    nd = len(in_dims)
    auto_pad = auto_pad_name(auto_pad)
    output_padding = [0] * nd if not output_padding else [int(p) for p in output_padding]
    full = [s * (i - 1) + (k - 1) * d + 1 + p
            for i, k, s, d, p in zip(in_dims, kernel, strides, dilations, output_padding)]
    if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape:
            out = [int(o) for o in output_shape][-nd:]
        else:
            out = [i * s for i, s in zip(in_dims, strides)]
        total = [f - o for f, o in zip(full, out)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        return begin, out
    if auto_pad == "VALID" or not pads:
        pads = [0] * (2 * nd)
    begin, end = [int(p) for p in pads[:nd]], [int(p) for p in pads[nd:]]
    return begin, [f - b - e for f, b, e in zip(full, begin, end)]


@op("ConvTranspose", since=22, dtypes=FLOATS)
@op("ConvTranspose", since=11, dtypes=FLOATS)
@op("ConvTranspose", since=1, dtypes=FLOATS)
def conv_transpose(xp, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    """Columns = W^T @ X per group, then fold them into the (cropped) output image."""
    out_dtype = X.dtype
    dtype = work_dtype(X.dtype)
    X, W = X.astype(dtype, copy=False), W.astype(dtype, copy=False)
    nd = X.ndim - 2
    kernel, strides, dilations = spatial_attrs(nd, kernel_shape or W.shape[2:], strides,
                                               dilations)
    group = int(group)
    (n, c), in_dims = X.shape[:2], tuple(X.shape[2:])
    m_per_group = W.shape[1]
    m = m_per_group * group
    begin, out = convtranspose_geometry(in_dims, kernel, strides, dilations, pads, auto_pad,
                                        output_padding, output_shape)
    k_size = math.prod(kernel)
    w = W.reshape(group, c // group, m_per_group * k_size).transpose(0, 2, 1)
    x = X.reshape(n, group, c // group, math.prod(in_dims))
    cols = xp.matmul(w, x).reshape((n, m) + tuple(kernel) + in_dims)
    full = [s * (i - 1) + (k - 1) * d + 1 for i, k, s, d in zip(in_dims, kernel, strides,
                                                                   dilations)]
    image = fold(xp, cols, strides, dilations, full)
    Y = crop_spatial(xp, image, begin, out)
    if B is not None:
        Y = Y + B.astype(dtype, copy=False).reshape((1, m) + (1,) * nd)
    return xp.ascontiguousarray(Y.astype(out_dtype, copy=False))


@conv_transpose.infer
def _(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
      output_padding=None, output_shape=None, pads=None, strides=None, **_):
    if X.shape is None:
        return [TensorType(X.dtype, None)]
    _require_transposed_weight(X, W, kernel_shape)
    nd = len(X.shape) - 2
    known_w = W is not None and W.shape is not None
    channels = W.shape[1] * int(group) if known_w and isinstance(W.shape[1], int) else None
    kernel = kernel_shape or (W.shape[2:] if known_w else None)
    in_dims = X.shape[2:]
    spatial = [None] * nd
    if kernel is not None and all(isinstance(k, int) for k in kernel):
        kernel, st, dil = spatial_attrs(nd, kernel, strides, dilations)
        known = [d if isinstance(d, int) else 1 for d in in_dims]
        _, out = convtranspose_geometry(known, kernel, st, dil, pads, auto_pad,
                                        output_padding, output_shape)
        spatial = [o if isinstance(d, int) or output_shape else None
                   for o, d in zip(out, in_dims)]
    return [TensorType(X.dtype, (X.shape[0], channels, *spatial))]


def _require_transposed_weight(X, W, kernel_shape) -> None:
    """ConvTranspose's W (C, M / group, k1, ...): X's rank, X's C channels, and the
    kernel_shape attribute's dims where it is given (a ValueError otherwise)."""
    if W is None or W.shape is None:
        return
    w, x = W.shape, X.shape
    if len(w) != len(x) or conflicting(w[0], x[1]):
        raise ValueError(f"ConvTranspose: W {shape_text(w)} does not fit X {shape_text(x)}: "
                         f"expected X's rank and X's {x[1]} channels first")
    if kernel_shape and (len(kernel_shape) != len(w) - 2
                         or any(conflicting(k, d) for k, d in zip(kernel_shape, w[2:]))):
        raise ValueError(f"ConvTranspose: W {shape_text(w)} does not match kernel_shape "
                         f"{list(kernel_shape)} (W's spatial dims are the kernel's)")


# -- Col2Im ---------------------------------------------------------------------------------

@op("Col2Im", since=18, dtypes=ALL)
def col2im(xp, input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """Fold (N, C*prod(block), L) blocks back into an (N, C, *image_shape) image."""
    image_dims = [int(v) for v in np.asarray(to_host(image_shape)).reshape(-1)]
    block = [int(v) for v in np.asarray(to_host(block_shape)).reshape(-1)]
    nd = len(image_dims)
    kernel, strides, dilations = spatial_attrs(nd, block, strides, dilations)
    begin, end, blocks = window_geometry(image_dims, kernel, strides, dilations, pads)
    n, ck, length = input.shape
    if length != math.prod(blocks) or ck % math.prod(kernel):
        raise ValueError(f"Col2Im: input shape {tuple(input.shape)} does not match "
                         f"{math.prod(blocks)} blocks of {kernel}")
    c = ck // math.prod(kernel)
    dtype = work_dtype(input.dtype)
    cols = input.astype(dtype, copy=False).reshape((n, c) + tuple(kernel) + tuple(blocks))
    padded = [i + b + e for i, b, e in zip(image_dims, begin, end)]
    image = fold(xp, cols, strides, dilations, padded)
    image = crop_spatial(xp, image, begin, image_dims)
    return xp.ascontiguousarray(image.astype(input.dtype, copy=False))


@col2im.infer
def _(input, image_shape, block_shape, **_):
    channels = None
    spatial = None
    if image_shape is not None and image_shape.value is not None:
        spatial = [int(v) for v in np.asarray(image_shape.value).reshape(-1)]
    if (block_shape is not None and block_shape.value is not None and input.shape is not None
            and isinstance(input.shape[1], int)):
        channels = input.shape[1] // int(np.prod(np.asarray(block_shape.value)))
    if spatial is None:
        rank = None
        if image_shape is not None and image_shape.shape and isinstance(image_shape.shape[0],
                                                                          int):
            rank = image_shape.shape[0]
        if rank is None:
            return [TensorType(input.dtype, None)]
        spatial = [None] * rank
    batch = None if input.shape is None else input.shape[0]
    return [TensorType(input.dtype, (batch, channels, *spatial))]


# -- DeformConv -----------------------------------------------------------------------------

@op("DeformConv", since=22, dtypes=FLOATS)
@op("DeformConv", since=19, dtypes=FLOATS)
def deform_conv(xp, X, W, offset, B=None, mask=None, *, dilations=None, group=1,
                kernel_shape=None, offset_group=1, pads=None, strides=None):
    """Convolution whose kernel taps sample X at learned fractional offsets (multilinear
    interpolation, zero outside the image), each tap optionally scaled by ``mask``."""
    out_dtype = X.dtype
    dtype = work_dtype(X.dtype)
    X, W, offset = (a.astype(dtype, copy=False) for a in (X, W, offset))
    where = DeformGeometry.of(X.shape, W.shape, kernel_shape, strides, dilations, pads,
                              group, offset_group)
    n, m = X.shape[0], W.shape[0]
    sampled = _sample_multilinear(xp, where.grouped_image(X), where.positions(xp, offset),
                                  where.in_dims)  # (N, OG, C/OG, K*L)
    if mask is not None:
        sampled = sampled * where.grouped_mask(mask.astype(dtype, copy=False))
    cols = where.columns(sampled)
    Y = xp.matmul(W.reshape(where.group, m // where.group, -1), cols)
    Y = Y.reshape((n, m) + tuple(where.out))
    if B is not None:
        Y += B.astype(dtype, copy=False).reshape((1, m) + (1,) * len(where.out))
    return Y.astype(out_dtype, copy=False)


@dataclass(frozen=True)
class DeformGeometry:
    """Where a DeformConv's kernel taps sit before their offsets, and how its tensors are
    grouped: the image and offsets by ``offset_group``, the columns by ``group``."""
    in_dims: tuple
    kernel: list
    strides: list
    dilations: list
    begin: list
    out: list
    group: int
    offset_group: int

    @classmethod
    def of(cls, x_shape, w_shape, kernel_shape, strides, dilations, pads, group, offset_group):
        nd = len(x_shape) - 2
        kernel, strides, dilations = spatial_attrs(nd, kernel_shape or w_shape[2:], strides,
                                                   dilations)
        in_dims = tuple(int(d) for d in x_shape[2:])
        begin, _, out = window_geometry(in_dims, kernel, strides, dilations, pads)
        return cls(in_dims, kernel, strides, dilations, begin, out, int(group),
                   int(offset_group))

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    @property
    def length(self) -> int:
        return math.prod(self.out)

    def positions(self, xp, offset) -> list:
        """The sampling coordinate along each axis, (N, OG, K, L) each: the tap's place
        plus its offset (offset channels are laid out (offset_group, *kernel, axis))."""
        nd = len(self.kernel)
        shifts = offset.reshape((offset.shape[0], self.offset_group, self.taps, nd,
                                 self.length))
        return [_tap_positions(xp, a, self.kernel, self.strides, self.dilations, self.begin,
                               self.out, offset.dtype) + shifts[:, :, :, a] for a in range(nd)]

    def grouped_image(self, X):
        return X.reshape(X.shape[0], self.offset_group, X.shape[1] // self.offset_group, -1)

    def grouped_mask(self, mask):
        return mask.reshape(mask.shape[0], self.offset_group, 1, self.taps * self.length)

    def columns(self, sampled):
        """(N, OG, C/OG, K*L) samples as the (N, G, C/G*K, L) columns W multiplies."""
        n, channels = sampled.shape[0], sampled.shape[1] * sampled.shape[2]
        return sampled.reshape(n, self.group, channels // self.group * self.taps, self.length)


def _tap_positions(xp, axis, kernel, strides, dilations, begin, out, dtype):
    """Undeformed input coordinate along ``axis`` of every (kernel tap, output position),
    shaped (K, L) in row-major tap and position order."""
    tap = xp.arange(kernel[axis], dtype=dtype) * dilations[axis]
    pos = xp.arange(out[axis], dtype=dtype) * strides[axis] - begin[axis]
    k_shape = [1] * len(kernel)
    k_shape[axis] = kernel[axis]
    o_shape = [1] * len(out)
    o_shape[axis] = out[axis]
    grid = tap.reshape(k_shape + [1] * len(out)) + pos.reshape([1] * len(kernel) + o_shape)
    grid = xp.broadcast_to(grid, tuple(kernel) + tuple(out))
    return grid.reshape(math.prod(kernel), math.prod(out))


def _sample_multilinear(xp, images, positions, in_dims):
    """Sample ``images`` (N, G, Cg, prod(in_dims)) at fractional ``positions`` (one
    (N, G, K, L) array per axis): sum over the 2**nd surrounding grid points."""
    result = None
    for corner in multilinear_corners(xp, positions, in_dims):
        term = gather_corner(xp, images, corner) * corner.weight
        result = term if result is None else result + term
    return result


@dataclass
class Corner:
    """One of the 2**nd grid points around each sampling position: its flat index into
    the image (clipped into it) and its weight (zero where the point lies outside), both
    (N, G, 1, K*L); with slopes, the weight's derivative along each axis."""
    index: object
    weight: object
    slopes: list | None = None


def multilinear_corners(xp, positions, in_dims, slopes: bool = False):
    """The corners of multilinear interpolation at ``positions`` (one (N, G, K, L) array
    per axis), one by one: each weight is the product over axes of 1 - |p - corner|."""
    n, g = positions[0].shape[:2]
    floors = [xp.floor(p) for p in positions]
    for bits in itertools.product((0, 1), repeat=len(in_dims)):
        factors, flat, inside = [], 0, True
        for p, f, bit, size in zip(positions, floors, bits, in_dims):
            idx = f + bit
            factors.append(1 - xp.abs(p - idx))
            inside = inside & (idx >= 0) & (idx <= size - 1)
            flat = flat * size + xp.clip(idx, 0, size - 1).astype(np.int64)
        shaped = lambda a: xp.where(inside, a, 0).reshape(n, g, 1, -1)  # noqa: E731
        corner = Corner(flat.reshape(n, g, 1, -1), shaped(math.prod(factors)))
        if slopes:  # d|p - corner|/dp is -1 below the corner (bit 1), +1 above it (bit 0)
            corner.slopes = [shaped((1 if bit else -1) * math.prod(factors[:a] + factors[a + 1:]))
                             for a, bit in enumerate(bits)]
        yield corner


def gather_corner(xp, images, corner: Corner):
    """The image values (N, G, Cg, K*L) at a corner's grid points."""
    n, g, cg, _ = images.shape
    index = xp.broadcast_to(corner.index, (n, g, cg, corner.index.shape[-1]))
    return xp.take_along_axis(images, index, axis=3)


@deform_conv.infer
def _(X, W, offset=None, B=None, mask=None, *, dilations=None, group=1, kernel_shape=None,
      offset_group=1, pads=None, strides=None, **_):
    """Conv's output type; offset must be (N, offset_group x 2 x taps, *out) and mask
    (N, offset_group x taps, *out) for the kernel's taps and the output's dims (a ValueError
    naming them otherwise)."""
    (y,) = _conv_infer(X, W, B, kernel_shape=kernel_shape, dilations=dilations, pads=pads,
                       strides=strides, group=group)
    kernel = kernel_shape or (None if W is None or W.shape is None else W.shape[2:])
    if y.shape is None or kernel is None or not all(isinstance(k, int) for k in kernel):
        return [y]
    taps = int(offset_group) * math.prod(kernel)
    for name, value_type, channels, per in (
            ("offset", offset, taps * len(kernel), "offset_group x spatial axes x taps"),
            ("mask", mask, taps, "offset_group x taps")):
        expected = (y.shape[0], channels, *y.shape[2:])
        shape = None if value_type is None else value_type.shape
        if shape is not None and not fits(shape, expected):
            raise ValueError(f"DeformConv: {name} has shape {shape_text(shape)}; expected "
                             f"{shape_text(expected)} (batch, {per}, the output's dims)")
    return [y]
