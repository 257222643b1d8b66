"""Dilated convolutions computed tap by tap over the outputs each tap reaches
(ops/conv/sparse_taps.py): the same values as the generic convolution, with a bias, a
residual and each piecewise activation, and only where most taps read padding."""

import math

import numpy as np
import pytest

from mixrt.ops.conv import conv_cpu, sparse_taps
from mixrt.ops.conv.conv import conv, conv_geometry
from mixrt.ops.conv.conv_direct_cpu import NO_ACTIVATION, activation_limits

RNG = np.random.default_rng(11)

CASES = [
    # (input, weight, attributes): DeepLabV3's atrous 3x3 (dilation 12 over 14x14), a
    # strided one, asymmetric pads, a 5x5 reaching past the image on one side
    ((1, 16, 14, 14), (8, 16, 3, 3), dict(dilations=[12, 12], pads=[12, 12, 12, 12])),
    ((2, 6, 9, 11), (5, 6, 3, 3), dict(dilations=[6, 8], pads=[6, 8, 6, 8], strides=[2, 1])),
    ((1, 4, 7, 7), (3, 4, 3, 3), dict(dilations=[5, 5], pads=[5, 2, 4, 6])),
    ((1, 3, 6, 6), (4, 3, 5, 5), dict(dilations=[4, 3], pads=[8, 6, 8, 6])),
]


def _geometry(X, W, attributes):
    return conv_geometry(X, W, "NOTSET", attributes.get("dilations"), 1,
                         list(W.shape[2:]), attributes.get("pads"),
                         attributes.get("strides"))


@pytest.mark.parametrize("activation", [("", None), ("Relu", None), ("LeakyRelu", [0.1]),
                                        ("Clip", [-0.5, 0.5])], ids=lambda a: a[0] or "none")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"x{c[0][2]}-d{c[2]['dilations']}")
def test_tap_by_tap_matches_the_generic_convolution(case, activation):
    x_shape, w_shape, attributes = case
    X, W = RNG.standard_normal(x_shape).astype(np.float32), \
        RNG.standard_normal(w_shape).astype(np.float32)
    B = RNG.standard_normal(w_shape[0]).astype(np.float32)
    found = _geometry(X, W, attributes)
    assert sparse_taps.suits(X, W, 1, found, None)
    reference = conv(np, X, W, B, **attributes)
    Z = RNG.standard_normal(reference.shape).astype(np.float32)
    want = reference + Z
    if activation[0] == "Relu":
        want = np.maximum(want, 0)
    elif activation[0] == "LeakyRelu":
        want = np.where(want < 0, want * np.float32(0.1), want)
    elif activation[0] == "Clip":
        want = np.clip(want, -0.5, 0.5)
    limits = activation_limits(*activation)
    got = sparse_taps.conv(X, W, B, Z, limits, None, found, {})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_fused_convolution_takes_it_where_it_suits(monkeypatch):
    calls = []
    real = sparse_taps.conv
    monkeypatch.setattr(sparse_taps, "conv", lambda *a: calls.append(1) or real(*a))
    X = RNG.standard_normal((1, 16, 14, 14)).astype(np.float32)
    W = RNG.standard_normal((8, 16, 3, 3)).astype(np.float32)
    attributes = dict(dilations=[12, 12], pads=[12, 12, 12, 12])
    # (a session's Conv node passes its dict for a constant weight)
    got = conv_cpu.conv_cpu(np, X, W, None, _prepacked={}, **attributes)
    np.testing.assert_allclose(got, conv(np, X, W, None, **attributes), rtol=1e-4, atol=1e-4)
    assert calls


def test_taps_that_mostly_read_the_image_keep_the_direct_kernel():
    X = np.zeros((1, 4, 28, 28), np.float32)
    W = np.zeros((4, 4, 3, 3), np.float32)
    assert not sparse_taps.suits(X, W, 1, _geometry(X, W, dict(dilations=[2, 2],
                                                               pads=[2, 2, 2, 2])), None)
    undilated = _geometry(X, W, dict(pads=[1, 1, 1, 1]))
    assert not sparse_taps.suits(X, W, 1, undilated, None)


def test_tap_ranges_are_the_outputs_that_read_the_image():
    X, W = np.zeros((1, 1, 14, 14)), np.zeros((1, 1, 3, 3))
    found = _geometry(X, W, dict(dilations=[12, 12], pads=[12, 12, 12, 12]))
    ranges = {(a, b): (rows, columns) for a, b, rows, columns in
              sparse_taps.tap_ranges(found, (14, 14))}
    assert ranges[(1, 1)] == ((0, 14), (0, 14))
    assert ranges[(0, 1)] == ((12, 14), (0, 14))  # row i reads i - 12
    assert ranges[(2, 2)] == ((0, 2), (0, 2))
    reached = sum((r[1] - r[0]) * (c[1] - c[0]) for r, c in ranges.values())
    assert reached == 196 + 4 * 28 + 4 * 4 < sparse_taps.MAX_COVERAGE * 9 * 196
    assert NO_ACTIVATION == (1.0, -math.inf, math.inf)


def test_an_infinite_weight_keeps_the_direct_kernel():
    """Zero padding times inf is NaN in the spec: skipping the padded taps would lose it."""
    X = RNG.standard_normal((1, 4, 14, 14)).astype(np.float32)
    W = RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)
    W[0, 0, 0, 0] = np.inf
    attributes = dict(dilations=[12, 12], pads=[12, 12, 12, 12])
    found = _geometry(X, W, attributes)
    assert sparse_taps.conv(X, W, None, None, NO_ACTIVATION, None, found, {}) is None
    got = conv_cpu.conv_cpu(np, X, W, None, _prepacked={}, **attributes)
    with np.errstate(invalid="ignore"):  # inf * 0 in the reference's product
        want = conv(np, X, W, None, **attributes)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0, 0, :12]).all()  # the rows whose corner tap reads only padding


def test_a_node_seeing_another_image_size_takes_that_size_s_taps():
    W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    attributes = dict(dilations=[8, 8], pads=[8, 8, 8, 8])
    state = {}
    for size in (6, 14, 6):  # at 6 only the centre tap reaches the image, at 14 all nine
        X = RNG.standard_normal((1, 3, size, size)).astype(np.float32)
        got = sparse_taps.conv(X, W, None, None, NO_ACTIVATION, None,
                               _geometry(X, W, attributes), state)
        np.testing.assert_allclose(got, conv(np, X, W, None, **attributes), rtol=1e-4,
                                   atol=1e-4)
