"""ops/elementwise/simd_cpu.py: constant operands with a real inner stride, and the ReLU/Clip
built on them keeping ONNX semantics (NaN propagates, low > high gives high)."""

import numpy as np

from mixrt.ops.elementwise.simd_cpu import clip_, filled, relu_


def test_filled_is_read_only_and_broadcast_free_on_the_last_axis():
    like = np.empty((3, 4, 5), np.float32)
    value = filled(2.5, like)
    assert value.shape == like.shape and value.dtype == like.dtype
    assert value.strides[-1] == like.itemsize and not value.flags.writeable
    assert np.all(value == 2.5)
    longer = filled(2.5, np.empty((2, 5000), np.float32))  # the cached row grows
    assert np.all(longer == 2.5)


def test_relu_keeps_nan_and_zeroes_negatives_in_place_on_a_strided_view():
    block = np.array([[-1.0, np.nan, 3.0, -np.inf, np.inf, -0.5]] * 3, np.float32)
    view = block[:, :4]
    relu_(view, view)
    np.testing.assert_array_equal(view[0], [0.0, np.nan, 3.0, 0.0])
    assert block[0, 5] == -0.5  # outside the view: untouched


def test_clip_semantics():
    x = np.array([-5.0, 0.5, 5.0, np.nan], np.float64)
    np.testing.assert_array_equal(clip_(x, -1, 1, np.empty_like(x)), [-1.0, 0.5, 1.0, np.nan])
    np.testing.assert_array_equal(clip_(x, 2, 1, np.empty_like(x))[:3], [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(clip_(x, None, 0, np.empty_like(x))[:3], [-5.0, 0.0, 0.0])
    np.testing.assert_array_equal(clip_(x, None, None, np.empty_like(x))[:3], x[:3])
