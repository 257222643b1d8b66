"""Resize's forward on both of its paths (ops/image/resample.py): the banded matrix product (NumPy,
finite input) and the tap-by-tap loop (CuPy, non-finite input, wide windows); and nearest's
gathers, run in the cheapest axis order and as repeats at integer scales.

Each path is forced by monkeypatching its threshold and checked two ways: against a direct
evaluation of the per-axis tap tables (``resize_taps``: gather, weight, sum, as the forward
did before), to float rounding, and against the ONNX reference evaluator, to the spec.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from mixrt.ops.image import image, resample
from mixrt.ops.ir.dtypes import accumulation_dtype


@pytest.fixture(params=["band", "band_small_blocks", "taps"])
def path(request, monkeypatch):
    if request.param == "taps":
        monkeypatch.setattr(resample, "_BAND_INPUTS_PER_TAP", 0)  # every window too wide
    else:
        monkeypatch.setattr(resample, "_BAND_INPUTS_PER_TAP", 10 ** 9)
        if request.param == "band_small_blocks":  # several blocks, a partial last one
            monkeypatch.setattr(resample, "_BAND_OUTPUTS", 3)
    return request.param


def _by_tables(x, roi, scales, sizes, axes=None, *, extrapolation_value=0.0, **options):
    """The forward evaluated straight from its tables, one gather per axis."""
    compute = accumulation_dtype(x.dtype)
    y, inside = x, None
    for taps in image.resize_taps(x.shape, roi, scales, sizes, axes, **options):
        moved = np.moveaxis(y, taps.axis, -1)
        if taps.weights is None:
            y = moved[..., taps.idx[:, 0]]
        else:
            y = (moved[..., taps.idx].astype(compute) * taps.weights.astype(compute)).sum(-1)
        y = np.moveaxis(y, -1, taps.axis)
        if taps.inside is not None:
            shape = [1] * x.ndim
            shape[taps.axis] = taps.out_len
            here = taps.inside.reshape(shape)
            inside = here if inside is None else inside & here
    if inside is not None:
        y = np.where(inside, y, np.asarray(extrapolation_value, dtype=y.dtype))
    return image._cast_result(np, y, x.dtype)


def _reference(x, roi, scales, sizes, **attrs):
    names = ["x", "roi" if roi is not None else "", "scales" if scales is not None else "",
             "sizes" if sizes is not None else ""]
    node = helper.make_node("Resize", [n for n in names if n] and names, ["y"], **attrs)
    feeds = {"x": x}
    for name, value in (("roi", roi), ("scales", scales), ("sizes", sizes)):
        if value is not None:
            feeds[name] = value
    graph = helper.make_graph(
        [node], "resize",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in feeds.items()],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    return ReferenceEvaluator(model).run(None, feeds)[0]


def _f32(*v):
    return np.array(v, dtype=np.float32)


CROP = "tf_crop_and_resize"
# (scales or sizes, attributes): upsampling, downsampling, odd factors, one axis unchanged
FLOAT_CASES = [
    (_f32(1, 1, 2, 2), dict(mode="linear")),
    (_f32(1, 1, 2.5, 1.7), dict(mode="linear", coordinate_transformation_mode="align_corners")),
    (_f32(1, 1, 0.6, 1.5), dict(mode="linear", coordinate_transformation_mode="asymmetric")),
    (_f32(1, 1, 1.8, 0.5), dict(mode="linear",
                                coordinate_transformation_mode="pytorch_half_pixel")),
    (_f32(1, 1, 1.3, 2.2), dict(mode="linear",
                                coordinate_transformation_mode="half_pixel_symmetric")),
    (_f32(1, 1, 2, 3), dict(mode="cubic")),
    (_f32(1, 1, 0.7, 1.4), dict(mode="cubic", exclude_outside=1)),
    (_f32(1, 1, 1.6, 0.8), dict(mode="cubic", cubic_coeff_a=-0.5,
                                coordinate_transformation_mode="align_corners")),
    (_f32(1, 1, 0.5, 0.4), dict(mode="linear", antialias=1)),
    (_f32(1, 1, 0.6, 0.3), dict(mode="cubic", antialias=1)),
    (_f32(1, 1, 0.45, 2), dict(mode="cubic", antialias=1, exclude_outside=1)),
    (_f32(1, 1, 0.3, 0.7), dict(mode="linear")),  # downsampling without antialias: wide windows
    (_f32(1, 1, 2.4, 0.6), dict(mode="nearest")),
    (_f32(1, 1, 1.5, 3), dict(mode="nearest", nearest_mode="ceil",
                              coordinate_transformation_mode="asymmetric")),
    (np.array([2, 3, 5, 23], np.int64), dict(mode="linear", extrapolation_value=-7.0,
                                             coordinate_transformation_mode=CROP)),
    (np.array([2, 3, 11, 6], np.int64), dict(mode="cubic", extrapolation_value=2.5,
                                             coordinate_transformation_mode=CROP)),
    (np.array([2, 3, 9, 13], np.int64), dict(mode="nearest", extrapolation_value=1.5,
                                             coordinate_transformation_mode=CROP)),
]
CROP_ROI = _f32(0, 0, -0.2, 0.3, 1, 1, 1.3, 0.9)  # reaches outside the input on axis 2


def _inputs(spec, attrs):
    """(roi, scales, sizes) for a case."""
    crop = attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize"
    roi = CROP_ROI if crop else None
    return (roi, None, spec) if spec.dtype == np.int64 else (roi, spec, None)


def _case_id(case):
    spec, attrs = case
    return "-".join([str(v) for v in attrs.values()] + [str(spec.tolist())])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", FLOAT_CASES, ids=_case_id)
def test_forward_matches_tables_and_reference(case, dtype, path):
    spec, attrs = case
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 14)).astype(dtype)
    roi, scales, sizes = _inputs(spec, attrs)
    ours = image.resize(np, x, roi, scales, sizes, **attrs)
    assert ours.dtype == dtype and ours.flags.c_contiguous
    rtol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(ours, _by_tables(x, roi, scales, sizes, **attrs),
                               rtol=rtol, atol=rtol)
    if dtype == np.float32:
        np.testing.assert_allclose(ours, _reference(x, roi, scales, sizes, **attrs),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [dict(mode="linear"), dict(mode="cubic", antialias=1),
                                   dict(mode="nearest")], ids=str)
def test_float16_accumulates_in_float32(attrs, path):
    x = np.random.default_rng(1).standard_normal((1, 2, 12, 10)).astype(np.float16)
    scales = _f32(1, 1, 0.7, 1.9)
    ours = image.resize(np, x, None, scales, None, **attrs)
    assert ours.dtype == np.float16
    np.testing.assert_array_equal(ours, _by_tables(x, None, scales, None, **attrs))


@pytest.mark.parametrize("attrs", [dict(mode="linear"), dict(mode="cubic"),
                                   dict(mode="linear", antialias=1), dict(mode="nearest")],
                         ids=str)
def test_uint8_rounds_and_saturates(attrs, path):
    x = np.random.default_rng(2).integers(0, 256, (1, 3, 10, 11), dtype=np.uint8)
    x[0, 0, :, :3] = 255  # cubic overshoots past 255 here: saturated
    scales = _f32(1, 1, 1.7, 0.6)
    ours = image.resize(np, x, None, scales, None, **attrs)
    assert ours.dtype == np.uint8
    # rounding of a sum that lands on .5 may go either way with the order of the adds
    np.testing.assert_allclose(ours.astype(int), _by_tables(x, None, scales, None, **attrs),
                               atol=1)
    if attrs["mode"] == "nearest":  # a gather: exact, whatever the path
        np.testing.assert_array_equal(ours, _reference(x, None, scales, None, **attrs))


def test_nearest_keeps_large_integers_exact(path):
    x = (np.arange(24, dtype=np.int64) + 2 ** 60).reshape(1, 2, 3, 4)
    y = image.resize(np, x, None, _f32(1, 1, 2, 1.5), None, mode="nearest")
    assert y.dtype == np.int64 and int(y.min()) == 2 ** 60 and int(y.max()) == 2 ** 60 + 23


@pytest.mark.parametrize("attrs", [dict(mode="linear"), dict(mode="cubic")], ids=str)
def test_non_finite_input_stays_in_its_taps(attrs, path):
    """A product over a window would turn every output of the window NaN (0 * inf): the
    forward must fall back to the taps and agree with them exactly."""
    x = np.random.default_rng(3).standard_normal((1, 1, 8, 30)).astype(np.float32)
    x[0, 0, 2, 3] = np.inf
    x[0, 0, 6, 25] = np.nan
    scales = _f32(1, 1, 2, 2)
    ours = image.resize(np, x, None, scales, None, **attrs)
    np.testing.assert_allclose(ours, _by_tables(x, None, scales, None, **attrs), rtol=1e-6)
    assert np.isfinite(ours).mean() > 0.8


def test_axes_subset_and_unit_dims(path):
    x = np.random.default_rng(4).standard_normal((3, 7, 1, 5)).astype(np.float32)
    for axes, scales in (([1], _f32(2.5)), ([-1, 0], _f32(1.6, 0.7)), ([2], _f32(3))):
        ours = image.resize(np, x, None, scales, None, axes=axes, mode="linear")
        np.testing.assert_allclose(
            ours, _by_tables(x, None, scales, None, axes, mode="linear"), rtol=1e-6, atol=1e-6)


NEAREST_CASES = [  # (input shape, scales): integer upscales (repeats), shrinks, mixtures
    ((1, 3, 8, 8), _f32(1, 1, 2, 2)),
    ((2, 3, 10, 12), _f32(1, 1, 0.5, 0.5)),
    ((2, 3, 10, 12), _f32(1, 1, 3, 0.4)),
    ((2, 4, 6, 5), _f32(1, 2, 0.5, 3)),
    ((3, 4, 5, 6), _f32(2, 0.5, 1.5, 2)),
    ((2, 3, 4, 5, 6), _f32(1, 1, 2, 0.5, 3)),
    ((1, 1, 7, 9), _f32(1, 1, 1, 4)),
]


@pytest.mark.parametrize("shape, scales", NEAREST_CASES, ids=str)
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "floor", "ceil"])
def test_nearest_in_any_axis_order_is_the_same_gather(shape, scales, nearest_mode):
    x = np.arange(np.prod(shape), dtype=np.int64).reshape(shape)
    attrs = dict(mode="nearest", nearest_mode=nearest_mode,
                 coordinate_transformation_mode="asymmetric")
    ours = image.resize(np, x, None, scales, None, **attrs)
    np.testing.assert_array_equal(ours, _by_tables(x, None, scales, None, **attrs))
    assert ours.dtype == np.int64 and ours.flags.c_contiguous
    floats = x.astype(np.float32)
    np.testing.assert_array_equal(image.resize(np, floats, None, scales, None, **attrs),
                                  _reference(floats, None, scales, None, **attrs))


def test_nearest_gathers_columns_last_when_shrinking_and_first_when_growing():
    def order(shape, scales):
        tables = image.resize_taps(shape, None, _f32(*scales), None, mode="nearest")
        return [taps.axis for taps in resample._cheapest_gather_order(tables, shape)]

    assert order((1, 3, 224, 224), (1, 1, 2, 2)) == [3, 2]
    assert order((1, 3, 224, 224), (1, 1, 0.5, 0.5)) == [2, 3]
    assert order((1, 3, 224, 224), (1, 1, 2, 0.5)) == [3, 2]  # shrink first
    assert order((4, 3, 8, 8), (0.5, 1, 2, 1)) == [0, 2]


def test_an_integer_upscale_is_a_repeat_and_others_are_not():
    assert resample._repeat_factor(np.arange(12) // 3, 4) == 3
    assert resample._repeat_factor(np.arange(5), 5) == 1
    assert resample._repeat_factor(np.array([0, 0, 1, 1, 1, 2]), 3) is None
    assert resample._repeat_factor(np.arange(6) // 2, 4) is None
    assert resample._repeat_factor(np.zeros(0, np.int64), 0) is None


@pytest.mark.gpu
def test_on_cupy_the_taps_run():
    cupy = pytest.importorskip("cupy")
    x = np.random.default_rng(5).standard_normal((1, 2, 6, 7)).astype(np.float32)
    scales = _f32(1, 1, 1.5, 0.6)
    for attrs in (dict(mode="linear"), dict(mode="cubic", antialias=1), dict(mode="nearest")):
        ours = image.resize(cupy, cupy.asarray(x), None, scales, None, **attrs)
        assert isinstance(ours, cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(ours),
                                   _by_tables(x, None, scales, None, **attrs),
                                   rtol=1e-6, atol=1e-6)
