"""Convolutions of one pixel into one pixel (ops/conv/one_pixel.py): a squeeze-excite block's
layers, as Conv and FusedConv, against the generic convolution; kept as the node's replay."""

import numpy as np
import pytest

from mixrt.ops.compiled import replay
from mixrt.ops.conv import one_pixel
from mixrt.ops.conv.conv import conv
from mixrt.ops.conv.conv_cpu import conv_cpu
from mixrt.ops.nn import fused
from mixrt.ops.nn.fused import activate

fused_conv = fused.fused_conv.kernels[-1].for_device("cpu")
RNG = np.random.default_rng(11)
ATTRIBUTES = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                  strides=None)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation, params", [("", None), ("Relu", None),
                                                ("HardSigmoid", [1 / 6, 0.5]),
                                                ("Swish", None), ("Sigmoid", None)])
@pytest.mark.parametrize("residual", [False, True])
def test_fused_one_pixel_conv_matches_the_generic_one_and_replays(batch, dtype, activation,
                                                                   params, residual):
    X, W, B = _rand(batch, 96, 1, 1, dtype=dtype), _rand(24, 96, 1, 1, dtype=dtype), \
        _rand(24, dtype=dtype)
    Z = _rand(batch, 24, 1, 1, dtype=dtype) if residual else None
    assert one_pixel.suits(X, W, 1, None, "NOTSET", None)
    expected = conv(np, X, W, B, **ATTRIBUTES)
    if Z is not None:
        expected = expected + Z
    expected = activate(np, expected, activation, params)
    prepacked: dict = {}
    out = np.full((batch, 24, 1, 1), np.nan, dtype)
    for scale in (1, 2, -1):  # later calls replay on new values in the same arrays
        X *= dtype(scale)
        if scale != 1:
            expected = conv(np, X, W, B, **ATTRIBUTES) + (0 if Z is None else Z)
            expected = activate(np, expected, activation, params)
        got = fused_conv(np, X, W, B, Z, activation=activation,
                         activation_params=params, out=out, _prepacked=prepacked,
                         **ATTRIBUTES)
        assert got is out and replay.KEY in prepacked
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_plain_one_pixel_conv_into_a_new_array_and_not_other_planes():
    X, W, B = _rand(2, 8, 1, 1), _rand(5, 8, 1, 1), _rand(5)
    np.testing.assert_allclose(conv_cpu(np, X, W, B, **ATTRIBUTES),
                               conv(np, X, W, B, **ATTRIBUTES), rtol=1e-5, atol=1e-6)
    assert not one_pixel.suits(_rand(1, 8, 2, 1), W, 1, None, "NOTSET", None)
    assert not one_pixel.suits(X, _rand(5, 8, 3, 3), 1, None, "NOTSET", None)
    assert not one_pixel.suits(X, W, 1, [1, 1, 1, 1], "NOTSET", None)
    assert not one_pixel.suits(_rand(1, 8, 1, 1), _rand(8, 1, 1, 1), 8, None, "NOTSET", None)


@pytest.mark.parametrize("batch, channels, outputs", [(8, 144, 576), (8, 240, 40), (2, 16, 8)])
@pytest.mark.parametrize("residual", [False, True])
def test_one_pixel_conv_of_a_constant_weight_takes_the_panels(batch, channels, outputs,
                                                             residual):
    """A batch of channel vectors against a constant weight is one panel product (bias in
    its tiles, a last panel of 8 columns on its half tile), then the epilogue."""
    from mixrt.ops.compiled import jit_cpu
    if jit_cpu.panel_kernels() is None:
        pytest.skip("no panel kernels on this CPU")
    X, W, B = _rand(batch, channels, 1, 1), _rand(outputs, channels, 1, 1), _rand(outputs)
    Z = _rand(batch, outputs, 1, 1) if residual else None
    exact = np.einsum("nc,mc->nm", X[:, :, 0, 0].astype(np.float64),
                      W[:, :, 0, 0].astype(np.float64)) + B
    if Z is not None:
        exact = exact + Z[:, :, 0, 0]
    expected = np.maximum(exact, 0).reshape(batch, outputs, 1, 1)
    prepacked: dict = {}
    out = np.full((batch, outputs, 1, 1), np.nan, np.float32)
    for _ in range(2):  # the call, then its replay
        fused_conv(np, X, W, B, Z, activation="Relu", activation_params=None, out=out,
                   _prepacked=prepacked, **ATTRIBUTES)
        assert "panels" in prepacked["_one_pixel"]
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
