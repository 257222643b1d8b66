"""Winograd F(2x2, 3x3) convolution (ops/conv/winograd_cpu.py): equal to im2col over pads, odd
and even planes, batches, bands that split images and join them, bias and FusedConv's
epilogue; taken by the layers its size rule names and by no other geometry; and NaNs and
infinities reach the outputs im2col's would."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import conv_cpu, conv_direct_cpu, winograd_cpu
from mixrt.ops.nn import fused

# the CPU's fast paths, as a CPU session binds them
fused_conv = fused.fused_conv.kernels[-1].for_device("cpu")

RNG = np.random.default_rng(11)

pytestmark = pytest.mark.skipif(not jit_cpu.enabled(), reason="numba is not importable")

CASES = [
    # (batch, channels, outputs, image (h, w), pads (top, left, bottom, right))
    (1, 6, 5, (8, 8), (1, 1, 1, 1)),
    (2, 4, 7, (7, 9), (1, 1, 1, 1)),  # odd output rows and columns
    (3, 5, 3, (13, 11), (0, 0, 0, 0)),
    (1, 3, 4, (9, 10), (2, 1, 0, 2)),  # asymmetric: tiles reach past the bottom pad
    (2, 2, 2, (3, 3), (0, 0, 0, 0)),  # one output pixel per image
    (1, 8, 8, (6, 5), (2, 2, 2, 2)),
]


@pytest.fixture
def every_size(monkeypatch):
    """Let every 3x3 stride-1 convolution take the Winograd path, whatever its size (the
    direct path, taken first where the panel tile runs, is switched off)."""
    monkeypatch.setattr(conv_direct_cpu, "suits", lambda *args: False)
    monkeypatch.setattr(winograd_cpu, "MIN_CHANNEL_PRODUCT", 1)
    monkeypatch.setattr(winograd_cpu, "MIN_PIXELS", 1)
    monkeypatch.setattr(winograd_cpu, "MAX_PIXELS", 1 << 30)


def _calls(monkeypatch) -> list:
    calls = []
    real = winograd_cpu.conv
    monkeypatch.setattr(winograd_cpu, "conv", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _im2col(X, W, B, pads, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(winograd_cpu, "ENABLED", False)
        return conv_cpu.conv_bands(X, W, B, pads=list(pads))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_im2col(case, dtype, with_bias, every_size, monkeypatch):
    n, c, m, image, pads = case
    X = RNG.standard_normal((n, c) + image)
    W = RNG.standard_normal((m, c, 3, 3))
    B = RNG.standard_normal(m) if with_bias else None
    expected = _im2col(X, W, B, pads, monkeypatch)
    calls = _calls(monkeypatch)
    got = conv_cpu.conv_bands(X.astype(dtype), W.astype(dtype),
                              None if B is None else B.astype(dtype), pads=list(pads),
                              prepacked={})
    assert calls, "the Winograd path was not taken"
    assert got.dtype == dtype and got.shape == expected.shape
    scale = np.abs(expected).max()
    tolerance = 1e-13 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance * scale)


# one tile row of 8 channels takes 16 planes x 8 x (6 + 1) columns x 8 bytes
TILE_ROW_BYTES = 16 * 8 * 7 * 8


@pytest.mark.parametrize("rows", [1, 2, 3, 64])
def test_bands_split_and_join_images(rows, every_size, monkeypatch):
    """Bands of 1, 2 and 3 tile rows (7 rows of tiles per image, so bands end inside
    images and span two) and one band over the whole batch give the same output, and the
    epilogue sees every output column of every image exactly once."""
    band_bytes = rows * TILE_ROW_BYTES
    monkeypatch.setattr(winograd_cpu, "BAND_BYTES", band_bytes)
    X = RNG.standard_normal((3, 8, 13, 12))
    W = RNG.standard_normal((8, 8, 3, 3))
    expected = _im2col(X, W, None, (1, 1, 1, 1), monkeypatch)
    seen = np.zeros((3, 13 * 12), int)

    def epilogue(y, image, start, stop):
        assert y.shape == (8, stop - start)
        seen[image, start:stop] += 1
    got = conv_cpu.conv_bands(X, W, pads=[1, 1, 1, 1], epilogue=epilogue, prepacked={})
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert (seen == 1).all()


def test_fused_conv_epilogue_and_planned_output(every_size, monkeypatch):
    """FusedConv (bias, residual, Relu) through the Winograd path into a given output."""
    X = RNG.standard_normal((2, 6, 10, 10)).astype(np.float32)
    W = RNG.standard_normal((4, 6, 3, 3)).astype(np.float32)
    B = RNG.standard_normal(4).astype(np.float32)
    Z = RNG.standard_normal((2, 4, 10, 10)).astype(np.float32)
    reference = np.maximum(_im2col(X.astype(np.float64), W.astype(np.float64),
                                   B.astype(np.float64), (1, 1, 1, 1), monkeypatch) + Z, 0)
    calls = _calls(monkeypatch)
    out = np.full((2, 4, 10, 10), np.nan, np.float32)
    got = fused_conv(np, X, W, B, Z, pads=[1, 1, 1, 1], activation="Relu", out=out,
                     _prepacked={})
    assert calls and got is out
    np.testing.assert_allclose(out, reference, rtol=0, atol=2e-5)


def test_special_values_reach_the_same_outputs_as_im2col(every_size, monkeypatch):
    """The transforms mix a tile's pixels, but input row (column) 0 of a tile feeds only
    output row (column) 0 and row 3 only row 1, so a NaN reaches exactly the outputs whose
    3x3 window holds it, as in im2col. An infinity reaches the same outputs, as NaN: the
    transforms subtract it from itself (im2col gives +-inf there)."""
    X = RNG.standard_normal((1, 2, 12, 12))
    X[0, 1, 5, 6] = np.nan
    X[0, 0, 9, 2] = np.inf
    W = RNG.standard_normal((3, 2, 3, 3))
    got = conv_cpu.conv_bands(X, W, pads=[1, 1, 1, 1], prepacked={})
    expected = _im2col(X, W, None, (1, 1, 1, 1), monkeypatch)
    window = np.zeros((12, 12), bool)
    window[4:7, 5:8] = True
    assert np.isnan(got[0][:, window]).all()
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(expected))
    np.testing.assert_array_equal(np.isnan(got[0][:, window]), np.isnan(expected[0][:, window]))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-12, atol=1e-12)


def test_transformed_weights_are_g_w_g_transposed():
    W = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    U = winograd_cpu.transformed_weights(W)
    assert U.shape == (16, 3, 2) and U.dtype == np.float32 and U.flags.c_contiguous
    G = winograd_cpu._G
    for m, c in [(0, 0), (2, 1)]:
        expected = G @ W[m, c].astype(np.float64) @ G.T
        np.testing.assert_allclose(U[:, m, c].reshape(4, 4), expected, rtol=1e-6)


@pytest.mark.parametrize("change", [
    {"strides": [2, 2]}, {"dilations": [2, 2]}, {"kernel": (5, 5)}, {"kernel": (1, 1)},
    {"group": 2}, {"dtype": np.int32}, {"transposed": True}])
def test_other_geometries_keep_im2col(change, every_size, monkeypatch):
    """Strides, dilations, other kernels, groups, integer data and a non-contiguous input
    never take the Winograd path, and still convolve right."""
    c = 4
    kernel = change.get("kernel", (3, 3))
    group = change.get("group", 1)
    X = RNG.standard_normal((1, c, 9, 9))
    if change.get("transposed"):
        X = np.ascontiguousarray(X.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    W = RNG.standard_normal((4, c // group) + kernel)
    dtype = change.get("dtype", np.float64)
    X, W = (RNG.integers(-3, 3, X.shape).astype(dtype), RNG.integers(-3, 3, W.shape)
            .astype(dtype)) if dtype == np.int32 else (X, W)
    attrs = dict(strides=change.get("strides"), dilations=change.get("dilations"),
                 group=group, pads=[1, 1, 1, 1])
    calls = _calls(monkeypatch)
    got = conv_cpu.conv_bands(X, W, **attrs, prepacked={})
    assert not calls
    with monkeypatch.context() as patch:
        patch.setattr(winograd_cpu, "ENABLED", False)
        np.testing.assert_allclose(got, conv_cpu.conv_bands(X, W, **attrs), rtol=1e-12)


@pytest.mark.parametrize("channels, image, taken", [
    (256, 14, True),    # ResNet's and VGG's 14x14 layers
    (256, 56, True),    # VGG's 56x56 layers
    (128, 14, False),   # too few channels
    (512, 7, False),    # too few tiles for the weights' bytes
    (64, 56, False),    # up to 56x56 the channel product must reach 256 x 256
    (64, 112, True),    # past 56x56, 64 x 64 (VGG's 112x112 and 224x224 layers)
    (256, 112, True),
    (32, 224, False),   # too few channels even on a large plane
])
def test_size_rule(channels, image, taken):
    X = np.zeros((1, channels, image, image), np.float32)
    W = np.zeros((channels, channels, 3, 3), np.float32)
    assert winograd_cpu.suits(X, W, (3, 3), (1, 1), (1, 1), 1, (image, image)) is taken


def test_not_taken_for_a_weight_that_varies(every_size, monkeypatch):
    """Without the node's dict (the weight is an input, not a constant) the weight would be
    transformed on every call, 10x a 256-channel 14x14 convolution: im2col takes it."""
    X = RNG.standard_normal((1, 8, 12, 12))
    W = RNG.standard_normal((8, 8, 3, 3))
    calls = _calls(monkeypatch)
    got = conv_cpu.conv_bands(X, W, pads=[1, 1, 1, 1])
    assert not calls
    np.testing.assert_allclose(got, conv_cpu.conv_bands(X, W, pads=[1, 1, 1, 1],
                                                        prepacked={}), rtol=1e-12, atol=1e-12)
    assert calls


def test_turned_off_by_the_switch(monkeypatch):
    monkeypatch.setattr(winograd_cpu, "ENABLED", False)
    X = np.zeros((1, 256, 14, 14), np.float32)
    W = np.zeros((256, 256, 3, 3), np.float32)
    assert not winograd_cpu.suits(X, W, (3, 3), (1, 1), (1, 1), 1, (14, 14))


def test_session_layer_matches_onnxruntime(tmp_path, monkeypatch):
    """A 256 -> 256 3x3 conv with bias and Relu at 14x14, batch 2, imported and optimized:
    the Session runs it through the Winograd path (the direct path switched off) and agrees
    with onnxruntime."""
    monkeypatch.setattr(conv_direct_cpu, "suits", lambda *args: False)
    W = (RNG.standard_normal((256, 256, 3, 3)) / 48).astype(np.float32)
    B = RNG.standard_normal(256).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1],
                              kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "winograd", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                          [2, 256, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 256, 14, 14])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "winograd.onnx"
    path.write_bytes(model.SerializeToString())
    x = RNG.standard_normal((2, 256, 14, 14)).astype(np.float32)
    calls = _calls(monkeypatch)
    got = mixrt.Session(str(path), opt_level=2).run(None, {"x": x})[0]
    assert calls
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5 * np.abs(expected).max())
