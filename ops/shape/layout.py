"""Layout operators: ops that move elements to new positions by a fixed rule (block
rearrangements, triangles, one-hot, padding and centred crops, sequence reversal)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from mixrt.ops.ir.dtypes import NUMERIC
from mixrt.ops.ir.registry import op
from mixrt.ops.shape.shape import const_ints, host_ints, host_scalar, typed, unknown_dims, zero_of
from mixrt.ops.ir.types import conflicting, normalize_axis, same_as_input, shape_text

# -- Trilu ------------------------------------------------------------------------------

@op("Trilu", since=14)
def trilu(xp, input, k=None, *, upper=1):
    diagonal = 0 if k is None else int(host_scalar(k))
    rows, cols = input.shape[-2:]
    offset = xp.arange(cols)[None, :] - xp.arange(rows)[:, None]  # column minus row
    keep = offset >= diagonal if upper else offset <= diagonal
    return xp.where(keep, input, zero_of(input.dtype))


trilu.infer(same_as_input)


# -- OneHot -----------------------------------------------------------------------------

@op("OneHot", since=11, dtypes=NUMERIC)
@op("OneHot", since=9, dtypes=NUMERIC)
def onehot(xp, indices, depth, values, *, axis=-1):
    depth = int(host_scalar(depth))
    axis = normalize_axis(axis, indices.ndim + 1)
    positions = indices.astype(np.int64)
    positions = xp.where(positions < 0, positions + depth, positions)  # -depth..-1 wrap
    classes = xp.arange(depth).reshape((depth,) + (1,) * (indices.ndim - axis))
    hot = xp.expand_dims(positions, axis) == classes  # out-of-range rows stay all-off
    # CuPy's where promotes two bfloat16 scalars to float32; the spec keeps values' type
    return xp.where(hot, values[1], values[0]).astype(values.dtype, copy=False)


@onehot.infer
def _(indices, depth, values, *, axis=-1, **_):
    if indices.shape is None:
        return [typed(values.dtype, None)]
    size = const_ints(depth)
    shape = list(indices.shape)
    shape.insert(normalize_axis(axis, len(shape) + 1), None if size is None else size[0])
    return [typed(values.dtype, shape)]


# -- DepthToSpace, SpaceToDepth -----------------------------------------------------------

MODES = ("DCR", "CRD")


def _check_mode(mode):
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


@op("DepthToSpace", since=11)
@op("DepthToSpace", since=1)
def depthtospace(xp, input, *, blocksize=None, mode="DCR"):
    _check_mode(mode)
    b, c, h, w = input.shape
    bs = blocksize
    if mode == "DCR":  # channels are (block row, block col, depth)
        x = input.reshape(b, bs, bs, c // bs**2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:  # CRD: channels are (depth, block row, block col)
        x = input.reshape(b, c // bs**2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return x.reshape(b, c // bs**2, h * bs, w * bs)


@op("SpaceToDepth", since=28)
@op("SpaceToDepth", since=1)
def spacetodepth(xp, input, *, blocksize=None, mode="DCR"):
    _check_mode(mode)
    b, c, h, w = input.shape
    bs = blocksize
    x = input.reshape(b, c, h // bs, bs, w // bs, bs)
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return x.transpose(order).reshape(b, c * bs**2, h // bs, w // bs)


def _block_shape(input, channel_scale, spatial_scale):
    """[N, C, H, W] with C multiplied and H, W multiplied by the given factors (a factor
    below 1 divides)."""
    if input.shape is None:
        return typed(input.dtype, (None,) * 4)

    def scaled(d, factor):
        return None if not isinstance(d, int) else int(d * factor)

    b, c, h, w = input.shape
    return typed(input.dtype, (b, scaled(c, channel_scale), scaled(h, spatial_scale),
                               scaled(w, spatial_scale)))


def _require_blocks(op_type, input, axes, divisor, what) -> None:
    """The ``axes`` of a 4-D input split into whole blocks of ``divisor`` (a ValueError
    naming the input's shape otherwise)."""
    shape = input.shape
    if shape is None:
        return
    if len(shape) != 4:
        raise ValueError(f"{op_type}: the input has shape {shape_text(shape)}; expected 4 "
                         "axes (N, C, H, W)")
    if any(isinstance(shape[a], int) and shape[a] % divisor for a in axes):
        raise ValueError(f"{op_type}: the input has shape {shape_text(shape)}; {what} must be "
                         f"multiples of {divisor}")


@depthtospace.infer
def _(input, *, blocksize=1, **_):
    _require_blocks("DepthToSpace", input, (1,), blocksize**2, "its channels")
    return [_block_shape(input, Fraction(1, blocksize**2), blocksize)]


@spacetodepth.infer
def _(input, *, blocksize=1, **_):
    _require_blocks("SpaceToDepth", input, (2, 3), blocksize,
                    f"its height and width (blocksize={blocksize})")
    return [_block_shape(input, blocksize**2, Fraction(1, blocksize))]


# -- Pad ------------------------------------------------------------------------------

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad(xp, X, pads, mode, value, axes=None):
    """Pad (or, for negative pads, crop) X. ``pads`` is ONNX's [begins..., ends...] over
    ``axes`` (all axes when None)."""
    if mode not in PAD_MODES:
        raise ValueError(f"Pad mode must be one of {PAD_MODES}, got {mode!r}")
    axes = range(X.ndim) if axes is None else [normalize_axis(a, X.ndim) for a in axes]
    axes = list(axes)
    if len(pads) != 2 * len(axes):
        raise ValueError(f"Pad expects {2 * len(axes)} pad values, got {len(pads)}")
    before, after = [0] * X.ndim, [0] * X.ndim
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + len(axes)]
    # Negative pads crop; do that first so the padding modes see the cropped edges.
    X = X[tuple(slice(-min(b, 0), d + min(e, 0)) for b, e, d in zip(before, after, X.shape))]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(before, after)]
    if mode != "constant":
        return xp.pad(X, widths, mode=mode)
    out_shape = [d + b + e for d, (b, e) in zip(X.shape, widths)]
    out = xp.empty(tuple(out_shape), dtype=X.dtype)
    out[...] = value if value is not None else zero_of(X.dtype)
    out[tuple(slice(b, b + d) for d, (b, _) in zip(X.shape, widths))] = X
    return out


@op("Pad", since=1)
def pad_1(xp, data, *, mode="constant", paddings=None, value=0.0):
    return _pad(xp, data, paddings, mode, data.dtype.type(value))


@op("Pad", since=2)
def pad_2(xp, data, *, mode="constant", pads=None, value=0.0):
    return _pad(xp, data, pads, mode, data.dtype.type(value))


@op("Pad", since=19)
@op("Pad", since=18)
@op("Pad", since=11)
def pad(xp, data, pads, constant_value=None, axes=None, *, mode="constant"):
    if constant_value is not None:
        constant_value = constant_value.reshape(())  # 0-d or one-element; stays on device
    return _pad(xp, data, host_ints(pads), mode, constant_value,
                None if axes is None else host_ints(axes))


def _infer_pad(data, pads, axes=None):
    if data.shape is None or pads is None:
        return [typed(data.dtype, unknown_dims(data.rank))]
    rank = len(data.shape)
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    shape = list(data.shape)
    for i, a in enumerate(axes):
        d = shape[a]
        shape[a] = d + pads[i] + pads[i + len(axes)] if isinstance(d, int) else None
    return [typed(data.dtype, shape)]


@pad_1.infer
def _(data, *, paddings=None, **_):
    return _infer_pad(data, paddings)


@pad_2.infer
def _(data, *, pads=None, **_):
    return _infer_pad(data, pads)


@pad.infer
def _(data, pads, constant_value=None, axes=None, **_):
    if axes is not None and axes.value is None:
        return [typed(data.dtype, unknown_dims(data.rank))]
    return _infer_pad(data, const_ints(pads), const_ints(axes))


# -- CenterCropPad --------------------------------------------------------------------------

@op("CenterCropPad", since=18)
def center_crop_pad(xp, input_data, shape, *, axes=None):
    rank = input_data.ndim
    axes = range(rank) if axes is None else [normalize_axis(a, rank) for a in axes]
    target = list(input_data.shape)
    for a, size in zip(axes, host_ints(shape)):
        target[a] = size
    source, dest = [], []
    for have, want in zip(input_data.shape, target):
        # Crop windows start rounded down; the odd padding pixel goes to the right.
        crop, padding = max(have - want, 0) // 2, max(want - have, 0) // 2
        kept = min(have, want)
        source.append(slice(crop, crop + kept))
        dest.append(slice(padding, padding + kept))
    out = xp.full(tuple(target), zero_of(input_data.dtype), dtype=input_data.dtype)
    out[tuple(dest)] = input_data[tuple(source)]
    return out


@center_crop_pad.infer
def _(input_data, shape, *, axes=None, **_):
    sizes = const_ints(shape)
    if input_data.shape is None or sizes is None:
        return [typed(input_data.dtype, unknown_dims(input_data.rank))]
    rank = len(input_data.shape)
    out = list(input_data.shape)
    for a, size in zip(range(rank) if axes is None else axes, sizes):
        out[normalize_axis(a, rank)] = size
    return [typed(input_data.dtype, out)]


# -- ReverseSequence --------------------------------------------------------------------------

@op("ReverseSequence", since=10)
def reversesequence(xp, input, sequence_lens, *, batch_axis=1, time_axis=0):
    x = xp.moveaxis(input, (batch_axis, time_axis), (0, 1))  # -> [batch, time, ...]
    steps = xp.arange(x.shape[1])[None, :]
    lengths = sequence_lens.astype(np.int64)[:, None]
    # Within each sequence's length, time t reads from length-1-t; past it, from t.
    source = xp.where(steps < lengths, lengths - 1 - steps, steps)
    source = source.reshape(source.shape + (1,) * (x.ndim - 2))
    gathered = xp.take_along_axis(x, xp.broadcast_to(source, x.shape), axis=1)
    return xp.moveaxis(gathered, (0, 1), (batch_axis, time_axis))


@reversesequence.infer
def _(input, sequence_lens, *, batch_axis=1, time_axis=0, **_):
    """The input's type; sequence_lens must hold one length per batch entry."""
    shape, lengths = input.shape, sequence_lens.shape
    if shape is not None and lengths is not None and (
            len(lengths) != 1 or conflicting(lengths[0], shape[batch_axis])):
        raise ValueError(f"ReverseSequence: sequence_lens has shape {shape_text(lengths)}; "
                         f"expected ({shape[batch_axis]},), one length per entry of the input "
                         f"{shape_text(shape)}'s batch axis {batch_axis}")
    return same_as_input(input)


# -- inputs read on the host only (OpHandle.reads_on_host) ------------------------------------

pad.reads_on_host(1, 3)  # pads and axes; the constant value stays on the device
