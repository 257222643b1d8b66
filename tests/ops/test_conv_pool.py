"""Conv and pooling kernels against onnxruntime on cases the backend suite covers thinly:
groups with dilation, SAME_LOWER, ceil_mode overhang, Indices layouts, big-batch chunking,
half-precision dtypes, RoI ops, and the shape inference rules."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt.ops.conv.conv as conv_ops
from mixrt.ops.conv.conv import col2im, conv, conv_transpose, deform_conv
from mixrt.ops.pool.pool import (average_pool, global_lp_pool, lp_pool, max_pool, max_roi_pool,
                            max_unpool, roi_align)
from mixrt.ops.ir.registry import REGISTRY
from mixrt.ops.ir.types import TensorType

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(7)

_ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
               np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int8): TensorProto.INT8}


def run_ort(op_type, inputs, attrs, opset=22, outputs=1):
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    node = helper.make_node(op_type, names, [f"out{i}" for i in range(outputs)], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, _ONNX_TYPES[a.dtype], a.shape)
         for n, a in zip(names, inputs) if a is not None],
        [helper.make_empty_tensor_value_info(f"out{i}") for i in range(outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {n: a for n, a in zip(names, inputs) if a is not None})


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((2, 6, 9, 11), (4, 3, 3, 2), dict(group=2, dilations=[2, 1], strides=[1, 2],
                                       pads=[1, 0, 2, 1])),
    ((1, 4, 7, 8), (4, 1, 3, 3), dict(group=4, auto_pad="SAME_LOWER", strides=[2, 2])),
    ((1, 3, 10), (5, 3, 4), dict(auto_pad="SAME_UPPER", strides=[3])),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 1), dict(strides=[2, 1, 3], pads=[0, 1, 0, 1, 0, 0])),
    ((2, 8, 6, 6), (6, 8, 1, 1), dict(strides=[2, 2])),
    ((1, 4, 5, 5), (2, 4, 3, 3), dict(auto_pad="VALID")),
])
def test_conv_matches_onnxruntime(x_shape, w_shape, attrs):
    X, W, B = randn(*x_shape), randn(*w_shape), randn(w_shape[0])
    expected = run_ort("Conv", [X, W, B], attrs)[0]
    np.testing.assert_allclose(conv(np, X, W, B, **attrs), expected, rtol=1e-4, atol=1e-5)


def test_conv_chunks_big_batches(monkeypatch):
    X, W = randn(5, 3, 6, 6), randn(4, 3, 3, 3)
    whole = conv(np, X, W, pads=[1, 1, 1, 1])
    monkeypatch.setattr(conv_ops, "_COLS_BUDGET", 1)  # one batch item per im2col
    np.testing.assert_allclose(conv(np, X, W, pads=[1, 1, 1, 1]), whole, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_conv_half_precision_keeps_dtype(dtype):
    X, W = randn(1, 2, 5, 5), randn(3, 2, 3, 3)
    Y = conv(np, X.astype(dtype), W.astype(dtype), pads=[1, 1, 1, 1])
    assert Y.dtype == np.dtype(dtype)
    np.testing.assert_allclose(Y.astype(np.float32), conv(np, X, W, pads=[1, 1, 1, 1]),
                               rtol=0.05, atol=0.1)


@pytest.mark.parametrize("attrs", [
    dict(strides=[2, 3], output_padding=[1, 2], pads=[1, 0, 0, 1]),
    dict(strides=[2, 2], output_shape=[9, 10], group=2),
    dict(strides=[2, 2], auto_pad="SAME_LOWER", dilations=[2, 1]),
    dict(strides=[3, 1], auto_pad="SAME_UPPER"),
])
def test_convtranspose_matches_onnxruntime(attrs):
    X, W, B = randn(1, 4, 4, 5), randn(4, 3, 3, 2), randn(3 * attrs.get("group", 1))
    if attrs.get("group") == 2:
        W = randn(4, 3, 3, 2)
    expected = run_ort("ConvTranspose", [X, W, B], attrs)[0]
    np.testing.assert_allclose(conv_transpose(np, X, W, B, **attrs), expected, rtol=1e-4,
                               atol=1e-5)


def test_col2im_inverts_im2col_counts():
    # folding the windows of an all-ones image counts how many windows cover each pixel
    ones = np.ones((1, 2 * 2 * 3, 3 * 3), dtype=np.float32)
    Y = col2im(np, ones, np.array([4, 5]), np.array([2, 3]), strides=[1, 1],
               dilations=[1, 1], pads=[0, 0, 0, 0])
    expected = np.array([[1, 2, 3, 2, 1], [2, 4, 6, 4, 2], [2, 4, 6, 4, 2], [1, 2, 3, 2, 1]])
    np.testing.assert_array_equal(Y[0, 0], expected)


def test_deform_conv_with_zero_offsets_is_conv():
    X, W, B = randn(2, 4, 6, 7), randn(6, 2, 3, 3), randn(6)
    attrs = dict(group=2, pads=[1, 1, 1, 1], strides=[2, 1], dilations=[1, 2])
    out = conv(np, X, W, B, **attrs)
    offset = np.zeros((2, 2 * 9 * 2) + out.shape[2:], dtype=np.float32)
    Y = deform_conv(np, X, W, offset, B, None, offset_group=2, **attrs)
    np.testing.assert_allclose(Y, out, rtol=1e-5, atol=1e-5)
    mask = np.full((2, 2 * 9) + out.shape[2:], 0.5, dtype=np.float32)
    Y = deform_conv(np, X, W, offset, None, mask, offset_group=2, **attrs)
    np.testing.assert_allclose(Y, 0.5 * conv(np, X, W, **attrs), rtol=1e-5, atol=1e-5)


def test_deform_conv_shifted_by_whole_pixels():
    X, W = randn(1, 1, 5, 5), randn(1, 1, 1, 1)
    offset = np.ones((1, 2, 5, 5), dtype=np.float32)  # every tap one pixel down and right
    Y = deform_conv(np, X, W, offset)
    expected = np.zeros_like(X)
    expected[..., :4, :4] = X[..., 1:, 1:] * W[0, 0, 0, 0]
    np.testing.assert_allclose(Y, expected, rtol=1e-6)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], storage_order=1),
    dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1, dilations=[2, 1]),
    dict(kernel_shape=[3, 2], auto_pad="SAME_LOWER", strides=[2, 3]),
])
def test_maxpool_with_indices_matches_onnxruntime(attrs):
    X = randn(2, 3, 8, 9)
    expected = run_ort("MaxPool", [X], attrs, outputs=2)
    Y, I = max_pool(np, X, **attrs, _outputs=2)
    np.testing.assert_array_equal(Y, expected[0])
    np.testing.assert_array_equal(I, expected[1])
    assert I.dtype == np.int64


def test_maxpool_int8_and_bfloat16():
    X = RNG.integers(-128, 127, (1, 2, 5, 5)).astype(np.int8)
    Y = max_pool(np, X, kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(Y, run_ort("MaxPool", [X], dict(kernel_shape=[2, 2],
                                                                     pads=[1, 1, 1, 1]))[0])
    Xb = X.astype(ml_dtypes.bfloat16)
    Yb = max_pool(np, Xb, kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    assert Yb.dtype == Xb.dtype
    np.testing.assert_array_equal(Yb.astype(np.float32), Y.astype(np.float32))
    assert REGISTRY.find("", "MaxPool", 12).supports_dtype("int8")
    assert not REGISTRY.find("", "MaxPool", 11).supports_dtype("int8")


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
         count_include_pad=1),
    dict(kernel_shape=[2, 2], strides=[1, 1], auto_pad="SAME_UPPER", count_include_pad=1),
    dict(kernel_shape=[3, 2], dilations=[2, 2], pads=[2, 1, 0, 1], count_include_pad=1),
])
def test_averagepool_matches_onnxruntime(attrs):
    X = randn(1, 2, 8, 7)
    np.testing.assert_allclose(average_pool(np, X, **attrs),
                               run_ort("AveragePool", [X], attrs)[0], rtol=1e-5, atol=1e-6)


def test_averagepool_float16_sums_in_float32():
    X = np.full((1, 1, 64, 64), 1000.0, dtype=np.float16)  # a float16 sum would overflow
    Y = average_pool(np, X, kernel_shape=[64, 64])
    assert Y.dtype == np.float16 and float(Y[0, 0, 0, 0]) == 1000.0


def test_lppool_and_global_lppool():
    X = randn(1, 2, 6, 6)
    attrs = dict(kernel_shape=[3, 3], p=3, strides=[2, 2], pads=[1, 1, 1, 1])
    np.testing.assert_allclose(lp_pool(np, X, **attrs), run_ort("LpPool", [X], attrs)[0],
                               rtol=1e-5)
    expected = (np.abs(X) ** 3).sum(axis=(2, 3), keepdims=True) ** (1 / 3)
    np.testing.assert_allclose(global_lp_pool(np, X, p=3), expected, rtol=1e-5)


def test_maxunpool_inverts_maxpool_indices():
    X = randn(1, 2, 5, 5)
    Y, I = max_pool(np, X, kernel_shape=[2, 2], strides=[2, 2], _outputs=2)
    shape = np.array([1, 2, 5, 5], dtype=np.int64)
    U = max_unpool(np, Y, I, shape, kernel_shape=[2, 2], strides=[2, 2])
    assert U.shape == X.shape
    # each maximum goes back to the place it came from, every other place is zero
    np.testing.assert_array_equal(U.reshape(-1)[I.reshape(-1)], Y.reshape(-1))
    placed = np.zeros(U.size, bool)
    placed[I.reshape(-1)] = True
    assert not U.reshape(-1)[~placed].any()
    default = max_unpool(np, Y, max_pool(np, X[..., :4, :4], kernel_shape=[2, 2],
                                         strides=[2, 2], _outputs=2)[1],
                         kernel_shape=[2, 2], strides=[2, 2])
    assert default.shape == (1, 2, 4, 4)


def test_max_roi_pool_matches_onnxruntime():
    X = randn(2, 3, 10, 12)
    rois = np.array([[0, 1, 1, 8, 6], [1, 0.4, 2.6, 11, 9], [0, 5, 5, 5, 5]], np.float32)
    attrs = dict(pooled_shape=[3, 2], spatial_scale=0.9)
    np.testing.assert_allclose(max_roi_pool(np, X, rois, **attrs),
                               run_ort("MaxRoiPool", [X, rois], attrs, opset=16)[0], rtol=1e-6)


@pytest.mark.parametrize("attrs", [
    dict(output_height=3, output_width=4, sampling_ratio=0, spatial_scale=0.5,
         coordinate_transformation_mode="output_half_pixel"),
    dict(output_height=2, output_width=2, sampling_ratio=3, mode="max"),
    dict(output_height=5, output_width=3, sampling_ratio=2),
])
def test_roialign_matches_onnxruntime(attrs):
    X = randn(2, 3, 9, 10)
    rois = np.array([[0, 0, 9, 8], [1.5, 2.2, 7.7, 8.9], [-2, -1, 3, 2]], np.float32)
    batches = np.array([0, 1, 1], np.int64)
    np.testing.assert_allclose(roi_align(np, X, rois, batches, **attrs),
                               run_ort("RoiAlign", [X, rois, batches], attrs, opset=16)[0],
                               rtol=1e-4, atol=1e-5)


def test_shape_inference():
    f32 = np.dtype(np.float32)
    X = TensorType(f32, ("batch", 3, 224, 224))
    W = TensorType(f32, (64, 3, 7, 7))
    kernel = REGISTRY.find("", "Conv", 22)
    assert kernel.infer_fn(X, W, None, pads=[3, 3, 3, 3], strides=[2, 2])[0].shape == \
        ("batch", 64, 112, 112)
    pool = REGISTRY.find("", "MaxPool", 22)
    Y, I = pool.infer_fn(TensorType(f32, (1, 64, 112, 112)), kernel_shape=[3, 3],
                         strides=[2, 2], pads=[1, 1, 1, 1])
    assert Y.shape == (1, 64, 56, 56) and I.dtype == np.int64
    avg = REGISTRY.find("", "AveragePool", 19)
    assert avg.infer_fn(TensorType(f32, (1, 1, 6, 6)), kernel_shape=[3, 3], strides=[2, 2],
                        ceil_mode=1)[0].shape == (1, 1, 3, 3)
    transpose = REGISTRY.find("", "ConvTranspose", 11)
    assert transpose.infer_fn(TensorType(f32, (1, 4, 5, 5)), TensorType(f32, (4, 2, 3, 3)),
                              group=2, strides=[2, 2], output_padding=[1, 1])[0].shape == \
        (1, 4, 12, 12)
    glob = REGISTRY.find("", "GlobalAveragePool", 1)
    assert glob.infer_fn(TensorType(f32, (2, 8, None, 7)))[0].shape == (2, 8, 1, 1)


def test_roialign_opset10_has_no_half_pixel_shift():
    X = randn(1, 2, 8, 8)
    rois = np.array([[0.5, 1.5, 6.2, 7.1]], np.float32)
    batches = np.array([0], np.int64)
    attrs = dict(output_height=2, output_width=3, sampling_ratio=2)
    kernel = REGISTRY.find("", "RoiAlign", 10).fn
    np.testing.assert_allclose(kernel(np, X, rois, batches, **attrs),
                               run_ort("RoiAlign", [X, rois, batches], attrs, opset=10)[0],
                               rtol=1e-4, atol=1e-5)
