"""Image, signal, linalg and random kernels on cases the ONNX backend suite covers thinly:
Resize on integer data, odd scales and the pre-11 versions, GridSample cubic padding and
N-d inputs, NMS thresholds, DFT options at both opsets, window edge cases, seeded random
ops, and shape inference. Interpolation is checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mixrt.ops.image import image
from mixrt.ops.nn import linalg
from mixrt.ops.random import random
from mixrt.ops.signal import signal
from mixrt.ops.ir.types import TensorType, tensor

rng = np.random.default_rng(0)


def run_ort(op_type, inputs, opset, out_dtype=TensorProto.FLOAT, **attrs):
    """One node in onnxruntime; ``inputs`` is a list of (name, array or None)."""
    node = helper.make_node(op_type, [n if a is not None else "" for n, a in inputs], ["y"],
                            **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs if a is not None],
        [helper.make_tensor_value_info("y", out_dtype, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=9)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {n: a for n, a in inputs if a is not None})[0]


def f32(*values):
    return np.array(values, dtype=np.float32)


def i64(*values):
    return np.array(values, dtype=np.int64)


# -- Resize ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,coord", [
    ("linear", "half_pixel"), ("linear", "pytorch_half_pixel"), ("cubic", "half_pixel"),
    ("cubic", "asymmetric"), ("nearest", "asymmetric"), ("linear", "half_pixel_symmetric"),
])
def test_resize_odd_scales_match_onnxruntime(mode, coord):
    x = rng.standard_normal((1, 2, 7, 5)).astype(np.float32)
    scales = f32(1, 1, 0.7, 1.9)
    attrs = dict(mode=mode, coordinate_transformation_mode=coord)
    ours = image.resize(np, x, None, scales, None, **attrs)
    theirs = run_ort("Resize", [("x", x), ("roi", None), ("scales", scales)], 19, **attrs)
    assert ours.shape == theirs.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_resize_cubic_antialias_sizes_matches_onnxruntime():
    x = rng.standard_normal((1, 1, 12, 9)).astype(np.float32)
    sizes = i64(1, 1, 5, 4)
    attrs = dict(mode="cubic", antialias=1)
    ours = image.resize(np, x, None, None, sizes, **attrs)
    theirs = run_ort("Resize", [("x", x), ("roi", None), ("scales", None), ("sizes", sizes)],
                     19, **attrs)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_resize_integer_input_keeps_dtype_and_rounds():
    x = np.array([[0, 10, 255]], dtype=np.uint8)
    nearest = image.resize(np, x, None, f32(1, 2), None)
    assert nearest.dtype == np.uint8 and nearest.tolist() == [[0, 0, 10, 10, 255, 255]]
    linear = image.resize(np, x, None, f32(1, 2), None, mode="linear")
    assert linear.dtype == np.uint8
    assert linear.tolist() == [[0, 2, 8, 71, 194, 255]]  # 2.5 -> 2, 8 rounded to even


def test_resize_10_and_upsample_use_floor_nearest():
    x = f32(1, 2, 3).reshape(1, 3)
    expected = [[1, 1, 1, 2, 2, 2, 3, 3]]  # output i reads input floor(i / 2.7)
    assert image.upsample(np, x, f32(1, 2.7)).tolist() == expected
    assert image.upsample_7(np, x, scales=[1.0, 2.7]).tolist() == expected


def test_resize_linear_asymmetric_upsample_7():
    x = f32(0, 10).reshape(1, 2)
    y = image.upsample_7(np, x, mode="linear", scales=[1.0, 2.0])
    np.testing.assert_allclose(y, [[0, 5, 10, 10]])


def test_resize_align_corners_with_scales_uses_unrounded_length():
    # The ONNX reference (and the backend suite) divide by in * scale - 1, not out - 1;
    # onnxruntime uses the integer output length here.
    x = f32(1, 2, 3, 4).reshape(1, 4)
    y = image.resize(np, x, None, f32(1, 0.6), None, mode="linear",
                     coordinate_transformation_mode="align_corners")
    np.testing.assert_allclose(y, [[1, 1 + 3 / 1.4]], rtol=1e-6)


def test_resize_axes_subset_with_negative_axis():
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    y = image.resize(np, x, None, f32(2), None, axes=[-1], mode="nearest")
    assert y.shape == (2, 3, 8)
    np.testing.assert_array_equal(y[..., ::2], x)


def test_resize_requires_exactly_one_of_scales_and_sizes():
    with pytest.raises(ValueError, match="exactly one"):
        image.resize(np, np.zeros((2, 2), np.float32), None, None, None)


def test_resize_infer_with_constant_sizes():
    x = tensor(np.float32, ("N", 3, 10, 10))
    sizes = TensorType(np.dtype(np.int64), (2,), i64(5, 7))
    (out,) = image._infer_resize(x, None, None, sizes, axes=[2, 3])
    assert out.shape == ("N", 3, 5, 7)
    (unknown,) = image._infer_resize(x, None, tensor(np.float32, (4,)), None)
    assert unknown.shape == (None, None, None, None)


# -- GridSample / AffineGrid --------------------------------------------------------------------

@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_gridsample_cubic_padding_matches_onnxruntime(padding_mode, align_corners):
    x = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
    grid = rng.uniform(-1.6, 1.6, (1, 3, 6, 2)).astype(np.float32)
    attrs = dict(mode="cubic", padding_mode=padding_mode, align_corners=align_corners)
    ours = image.grid_sample(np, x, grid, **attrs)
    theirs = run_ort("GridSample", [("x", x), ("grid", grid)], 20, **attrs)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_gridsample_3d_reflection_matches_onnxruntime(mode):
    x = rng.standard_normal((2, 1, 3, 4, 5)).astype(np.float32)
    grid = rng.uniform(-1.8, 1.8, (2, 2, 3, 2, 3)).astype(np.float32)
    attrs = dict(mode=mode, padding_mode="reflection")
    ours = image.grid_sample(np, x, grid, **attrs)
    theirs = run_ort("GridSample", [("x", x), ("grid", grid)], 20, **attrs)
    assert ours.shape == (2, 1, 2, 3, 2)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_gridsample_16_accepts_bilinear_name():
    x = rng.standard_normal((1, 1, 3, 3)).astype(np.float32)
    grid = np.zeros((1, 1, 1, 2), np.float32)
    assert image.grid_sample(np, x, grid, mode="bilinear").item() == pytest.approx(x[0, 0, 1, 1])


def test_affine_grid_identity_reproduces_input_through_gridsample():
    x = rng.standard_normal((1, 1, 4, 6)).astype(np.float32)
    theta = f32(1, 0, 0, 0, 1, 0).reshape(1, 2, 3)
    grid = image.affine_grid(np, theta, i64(1, 1, 4, 6))
    assert grid.shape == (1, 4, 6, 2) and grid.dtype == np.float32
    np.testing.assert_allclose(image.grid_sample(np, x, grid), x, atol=1e-6)


def test_affine_grid_single_pixel_is_centre():
    grid = image.affine_grid(np, f32(1, 0, 0, 0, 1, 0).reshape(1, 2, 3), i64(1, 1, 1, 1),
                             align_corners=1)
    np.testing.assert_array_equal(grid, np.zeros((1, 1, 1, 2)))


# -- NonMaxSuppression ---------------------------------------------------------------------------

def test_nms_score_threshold_and_missing_limit():
    boxes = f32(0, 0, 1, 1, 0, 5, 1, 6, 0, 10, 1, 11).reshape(1, 3, 4)
    scores = f32(0.9, 0.5, 0.3).reshape(1, 1, 3)
    kept = image.non_max_suppression(np, boxes, scores, i64(10), f32(0.5), f32(0.5))
    assert kept.dtype == np.int64 and kept.tolist() == [[0, 0, 0], [0, 0, 1]]
    assert image.non_max_suppression(np, boxes, scores).shape == (0, 3)


# -- DFT / STFT ---------------------------------------------------------------------------------

def test_dft_20_axis_input_and_length_padding():
    x = rng.standard_normal((2, 5, 3, 1)).astype(np.float32)
    y = signal.dft(np, x, i64(8), i64(1))
    expected = np.fft.fft(x[..., 0], n=8, axis=1)
    assert y.shape == (2, 8, 3, 2) and y.dtype == np.float32
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], expected, rtol=1e-4, atol=1e-5)


def test_dft_17_negative_axis_truncation_and_inverse():
    z = rng.standard_normal((3, 6)) + 1j * rng.standard_normal((3, 6))
    x = np.stack([z.real, z.imag], axis=-1)  # float64 stays float64
    y = signal.dft_17(np, x, i64(4), axis=-2, inverse=1)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], np.fft.ifft(z, n=4, axis=-1))


def test_dft_irfft_default_length_roundtrip():
    signal_in = rng.standard_normal((1, 8, 1)).astype(np.float32)
    spectrum = signal.dft(np, signal_in, None, i64(1), onesided=1)
    assert spectrum.shape == (1, 5, 2)
    back = signal.dft(np, spectrum, None, i64(1), inverse=1, onesided=1)
    assert back.shape == (1, 8, 1)
    np.testing.assert_allclose(back, signal_in, atol=1e-5)


def test_dft_infer_shapes():
    x = tensor(np.float32, (2, 16, 1))
    (full,) = signal._infer_dft_17(x, None, axis=1)
    (half,) = signal._infer_dft(x, None, TensorType(np.dtype(np.int64), (), i64(1)), onesided=1)
    assert full.shape == (2, 16, 2) and half.shape == (2, 9, 2)


def test_stft_frame_length_without_window_two_sided():
    x = rng.standard_normal((1, 20, 1)).astype(np.float32)
    y = signal.stft(np, x, i64(4), None, i64(8), onesided=0)
    assert y.shape == (1, 4, 8, 2)
    expected = np.fft.fft(x[0, 4:12, 0])
    np.testing.assert_allclose(y[0, 1, :, 0] + 1j * y[0, 1, :, 1], expected, atol=1e-5)


# -- windows and mel ---------------------------------------------------------------------------

def test_windows_match_numpy_symmetric_and_dtype():
    np.testing.assert_allclose(signal.hann_window(np, i64(9), periodic=0), np.hanning(9),
                               atol=1e-6)
    np.testing.assert_allclose(signal.blackman_window(np, i64(9), periodic=0),
                               np.blackman(9), atol=1e-6)
    periodic = signal.hann_window(np, i64(8), output_datatype=TensorProto.DOUBLE)
    assert periodic.dtype == np.float64
    np.testing.assert_allclose(periodic, np.hanning(9)[:8])


def test_mel_weight_matrix_shape_and_dtype():
    m = signal.mel_weight_matrix(np, i64(10), i64(64), i64(16000), f32(20), f32(8000),
                                 output_datatype=TensorProto.DOUBLE)
    assert m.shape == (33, 10) and m.dtype == np.float64
    assert m.max() == 1.0 and m.min() == 0.0


# -- Det -------------------------------------------------------------------------------------

def test_det_batched_float16():
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float16)
    y = linalg.det(np, x)
    assert y.shape == (2, 3) and y.dtype == np.float16
    np.testing.assert_allclose(y, np.linalg.det(x.astype(np.float32)), rtol=1e-2, atol=1e-2)


# -- random ------------------------------------------------------------------------------------

def test_seeded_random_ops_are_deterministic_and_typed():
    a = random.random_normal(np, shape=[3, 4], seed=1.0, dtype=TensorProto.DOUBLE)
    b = random.random_normal(np, shape=[3, 4], seed=1.0, dtype=TensorProto.DOUBLE)
    assert a.dtype == np.float64 and a.shape == (3, 4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, random.random_normal(np, shape=[3, 4], seed=1.5,
                                                       dtype=TensorProto.DOUBLE))
    u = random.random_uniform_like(np, np.zeros((50,), np.float16), low=2.0, high=3.0)
    assert u.dtype == np.float16 and ((u >= 2) & (u <= 3)).all()


def test_bernoulli_extremes_and_dtype():
    p = f32(0, 1, 0, 1)
    assert random.bernoulli(np, p).tolist() == [0, 1, 0, 1]
    assert random.bernoulli(np, p, dtype=TensorProto.BOOL).dtype == np.bool_


def test_multinomial_follows_log_probabilities():
    logits = np.log(np.array([[1e-9, 1.0, 1e-9], [0.5, 0.0 + 1e-12, 0.5]], np.float32))
    draws = random.multinomial(np, logits, sample_size=200, seed=3.0)
    assert draws.shape == (2, 200) and draws.dtype == np.int32
    assert (draws[0] == 1).all()
    assert set(np.unique(draws[1])) == {0, 2}
