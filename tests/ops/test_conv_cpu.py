"""The CPU fast paths of Conv (ops/conv_cpu.py) against the generic kernel: im2col bands and
shift-and-add, with padding, dilation, batches and the fused epilogue."""

import numpy as np
import pytest

import mixrt.ops.conv_cpu as conv_cpu
from mixrt.ops.conv import conv
from mixrt.ops.fused import fused_conv

CASES = [  # x shape, w shape, attributes
    ((1, 16, 9, 9), (4, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 12, 8, 11), (3, 12, 3, 3), dict(pads=[0, 2, 1, 0])),
    ((1, 8, 10, 10), (4, 8, 3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2])),
    ((1, 8, 10, 7), (2, 8, 5, 3), dict(pads=[2, 1, 2, 1])),
    ((1, 6, 7, 7), (3, 6, 2, 2), dict()),
    ((3, 10, 6, 6), (5, 10, 1, 3), dict(pads=[0, 1, 0, 1], dilations=[1, 2])),
]


@pytest.fixture(params=["im2col", "shift_add"])
def method(request, monkeypatch):
    """Force one of the two stride-1 algorithms, whatever the channel counts."""
    never, always = 10 ** 9, 0
    chosen = always if request.param == "shift_add" else never
    monkeypatch.setattr(conv_cpu, "SHIFT_ADD_RATIO", chosen)
    monkeypatch.setattr(conv_cpu, "SHIFT_ADD_PIXELS", chosen)
    return request.param


@pytest.mark.parametrize("x_shape, w_shape, attrs", CASES)
def test_fast_conv_matches_generic(method, x_shape, w_shape, attrs):
    rng = np.random.default_rng(0)
    X = rng.standard_normal(x_shape).astype(np.float32)
    W = rng.standard_normal(w_shape).astype(np.float32)
    B = rng.standard_normal(w_shape[0]).astype(np.float32)
    expected = conv(np, X, W, B, **attrs)
    out = np.full(expected.shape, np.nan, np.float32)  # every element must be written
    got = conv_cpu.conv_cpu(np, X, W, B, out=out, **attrs)
    assert got is out
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, attrs", CASES[:3])
def test_fused_epilogue_runs_once_per_output(method, x_shape, w_shape, attrs):
    """Residual and ReLU applied by the epilogue exactly once on every element."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal(x_shape).astype(np.float32)
    W = rng.standard_normal(w_shape).astype(np.float32)
    plain = conv(np, X, W, None, **attrs)
    Z = rng.standard_normal(plain.shape).astype(np.float32)
    got = fused_conv(np, X, W, None, Z, activation="Relu", **attrs)
    np.testing.assert_allclose(got, np.maximum(plain + Z, 0), rtol=1e-5, atol=1e-4)


def test_shift_add_chosen_for_few_output_channels():
    x, w = np.zeros((128, 56, 56), np.float32), np.zeros((32, 128 * 9), np.float32)
    assert conv_cpu._shift_add_suits(x, w, (3, 3), (1, 1), (56, 56))
    assert not conv_cpu._shift_add_suits(x, w, (3, 3), (2, 2), (28, 28))  # strided: im2col
    assert not conv_cpu._shift_add_suits(x, w, (1, 1), (1, 1), (56, 56))  # 1x1: one matmul
    many = np.zeros((512, 7, 7), np.float32)
    assert not conv_cpu._shift_add_suits(many, np.zeros((512, 512 * 9)), (3, 3), (1, 1), (7, 7))
