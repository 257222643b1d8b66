"""Image operators: Resize/Upsample and NonMaxSuppression. GridSample and AffineGrid are in
``grid_sample.py``; the per-axis resampling Resize builds on is in ``resample.py``.

Resize is a separable interpolation: for every resized axis we build, on the host, a small
table of source indices and weights ("taps") per output position (:func:`resize_taps`, from
the 1-D tables of ``resample.py``), then gather and weight on the device. The tables are tiny
(output length x a few taps), so building them with NumPy costs nothing next to the data they
are applied to.

ImageDecoder is not registered: it needs an image decoding library (Pillow), which mixrt does
not depend on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixrt.ops.image import nms_cpu
from mixrt.ops.ir.dtypes import NUMERIC, accumulation_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, normalize_axis, shape_text
from mixrt.ops.device import to_host
from mixrt.ops.image.resample import (_apply_taps, _cheapest_gather_order, _filter_taps,
                                      _nearest_index, _nearest_index_as_onnxruntime,
                                      _source_coords)
# not used here: the gradients (image_grad.py, image_sample_grad.py) read them from here
from mixrt.ops.image.resample import _cubic_kernel, weighted_takes  # noqa: F401
from mixrt.ops.image.grid_sample import _GRID_MODES, _base_positions  # noqa: F401
from mixrt.ops.image.grid_sample import _pad_coords, _reflect, _unnormalize  # noqa: F401
from mixrt.ops.image.grid_sample import affine_grid, grid_sample  # noqa: F401


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
