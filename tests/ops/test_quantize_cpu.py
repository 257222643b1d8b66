"""ops/quant/quantize_cpu.py: per-tensor 8-bit QuantizeLinear/DequantizeLinear through the compiled
loops of ops/quant/_jit_quantize.py give the NumPy forms' codes and values bit for bit, and every
other form still takes the NumPy path."""

from __future__ import annotations

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.quant import quantize_cpu
from mixrt.ops.quant.quantize import dequantize_linear, quantize_linear

pytestmark = pytest.mark.skipif(not jit_cpu.enabled(), reason="the compiled tier needs numba")
RNG = np.random.default_rng(8)


@pytest.fixture
def compiled_calls(monkeypatch):
    calls = []
    original = quantize_cpu._kernels

    def spy(*args):
        kernels = original(*args)
        calls.append(kernels is not None)
        return kernels
    monkeypatch.setattr(quantize_cpu, "_kernels", spy)
    return calls


def values(shape=(2, 3, 17, 5)):
    x = (RNG.standard_normal(shape) * 6).astype(np.float32)
    # NaN, infinities, ties at .5 (half to even), values past either end of the range
    x.flat[:9] = [np.nan, np.inf, -np.inf, 0.5, 1.5, -2.5, 1e9, -1e9, 0.0]
    return x


@pytest.mark.parametrize("zero", [None, np.uint8(0), np.uint8(131), np.int8(0), np.int8(-7)])
@pytest.mark.parametrize("scale", [0.037, 1.0, 3e-5])
def test_per_tensor_codes_and_values_are_the_numpy_forms(compiled_calls, zero, scale):
    x, y_scale = values(), np.array(np.float32(scale))
    zero_point = None if zero is None else np.array(zero)
    with np.errstate(invalid="ignore"):  # NumPy warns casting NaN
        expected = quantize_linear(np, x, y_scale, zero_point)
    out = np.empty(x.shape, expected.dtype)
    got = quantize_cpu.quantize_cpu(np, x, y_scale, zero_point, axis=1, out=out)
    assert got is out and got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    back = quantize_cpu.dequantize_cpu(np, expected, y_scale, zero_point, axis=1)
    np.testing.assert_array_equal(back, dequantize_linear(np, expected, y_scale, zero_point))
    assert back.dtype == np.float32
    assert compiled_calls == [True, True]


def test_per_axis_and_other_types_take_the_numpy_forms(compiled_calls):
    x = values((2, 3, 4))
    scales = np.array([0.5, 0.25, 2.0], np.float32)
    zeros = np.array([1, 2, 3], np.uint8)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(quantize_cpu.quantize_cpu(np, x, scales, zeros, axis=1),
                                      quantize_linear(np, x, scales, zeros, axis=1))
    codes = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    np.testing.assert_array_equal(
        quantize_cpu.dequantize_cpu(np, codes, np.array(np.float32(0.5))),
        dequantize_linear(np, codes, np.array(np.float32(0.5))))
    with np.errstate(over="ignore"):  # 1e9 is past float16's range: inf
        half = x.astype(np.float16)
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(
            quantize_cpu.quantize_cpu(np, half, np.array(np.float16(0.5))),
            quantize_linear(np, half, np.array(np.float16(0.5))))
    assert not any(compiled_calls)


CONVS = [  # x shape, w shape, attributes
    ((1, 8, 9, 9), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 12, 10, 7), (12, 1, 5, 5), dict(group=12, pads=[2, 2, 2, 2], strides=[2, 2])),
    ((1, 6, 8, 8), (9, 2, 3, 1), dict(group=3, dilations=[2, 1], pads=[2, 0, 2, 0])),
    ((1, 64, 7, 7), (32, 64, 1, 1), {}),
]


@pytest.mark.parametrize("x_shape, w_shape, attributes", CONVS)
@pytest.mark.parametrize("codes, per_channel, biased", [(np.uint8, False, True),
                                                        (np.int8, True, False),
                                                        (np.uint8, True, True)])
def test_qlinear_conv_on_the_cpu_gives_the_generic_codes(x_shape, w_shape, attributes, codes,
                                                         per_channel, biased):
    from mixrt.ops.quant.quantize import qlinear_conv
    info = np.iinfo(codes)
    x = RNG.integers(info.min, info.max + 1, x_shape).astype(codes)
    w = RNG.integers(info.min, info.max + 1, w_shape).astype(codes)
    channels = w_shape[0] if per_channel else 1
    w_scale = (RNG.random(channels) * 0.01 + 1e-3).astype(np.float32).reshape(
        (channels,) if per_channel else ())
    w_zero = RNG.integers(info.min, info.max + 1, channels).astype(codes).reshape(
        (channels,) if per_channel else ())
    params = (np.array(np.float32(0.02)), np.array(codes(3)), w, w_scale, w_zero,
              np.array(np.float32(0.5)), np.array(codes(7)))
    bias = RNG.integers(-50000, 50000, w_shape[0]).astype(np.int32) if biased else None
    expected = qlinear_conv(np, x, *params, bias, **attributes)
    node: dict = {}
    for _ in range(2):  # the second call from the node's centred weights
        got = quantize_cpu.qlinear_conv_cpu(np, x, *params, bias, _node=node, **attributes)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    assert "qlinear_conv" in node


def _qlinear_case(x_shape, w_shape, codes, weights_within):
    """x, the parameters and a bias: full-range codes, weights within ``weights_within`` of
    a zero point of 0 (a bound on the channels' centred sums), per-channel scales."""
    info = np.iinfo(codes)
    x = RNG.integers(info.min, info.max + 1, x_shape).astype(codes)
    w = RNG.integers(-weights_within, weights_within + 1, w_shape).astype(np.int8)
    w_scale = (RNG.random(w_shape[0]) * 0.01 + 1e-3).astype(np.float32)
    params = (np.array(np.float32(0.02)), np.array(codes(3)), w, w_scale,
              np.zeros(w_shape[0], np.int8), np.array(np.float32(0.5)), np.array(codes(7)))
    return x, params, RNG.integers(-50000, 50000, w_shape[0]).astype(np.int32)


@pytest.mark.parametrize("x_shape, w_shape, weights_within, in_float32", [
    # 256 x 3 x 3 weights of ~64 in magnitude on average, times codes of up to 252: a
    # channel's bound ~3.7e7, past 2^24, so float64; weights within 4 keep it in float32
    ((1, 256, 8, 8), (16, 256, 3, 3), 127, False),
    ((1, 256, 8, 8), (16, 256, 3, 3), 4, True),
    ((2, 16, 9, 11), (64, 16, 1, 1), 127, True),  # 16 x 255 x 127: within
    ((2, 24, 9, 9), (24, 1, 3, 3), 127, True),  # depthwise (group set below)
])
def test_qlinear_conv_sums_in_float32_only_where_no_sum_can_round(
        monkeypatch, x_shape, w_shape, weights_within, in_float32):
    from mixrt.ops.quant.quantize import qlinear_conv
    routes = []
    float32_conv = quantize_cpu._float32_conv
    monkeypatch.setattr(quantize_cpu, "_float32_conv",
                        lambda *args: routes.append(True) or float32_conv(*args))
    attributes = dict(pads=[1, 1, 1, 1], group=x_shape[1] if w_shape[1] == 1 else 1)
    if w_shape[2] == 1:
        attributes["pads"] = [0, 0, 0, 0]
    for codes in (np.uint8, np.int8):
        x, params, bias = _qlinear_case(x_shape, w_shape, codes, weights_within)
        expected = qlinear_conv(np, x, *params, bias, **attributes)
        node: dict = {}
        for _ in range(2):
            got = quantize_cpu.qlinear_conv_cpu(np, x, *params, bias, _node=node, **attributes)
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected)
    assert routes == [True] * 4 * in_float32


def test_qlinear_conv_in_float32_takes_no_winograd(monkeypatch):
    """A 3x3 stride-1 layer of 256 x 256 channels is Winograd's as a float convolution;
    Winograd's transforms round, so QLinearConv's exact float32 sums must not take it."""
    from mixrt.ops.conv import winograd_cpu
    from mixrt.ops.quant.quantize import qlinear_conv
    x, params, bias = _qlinear_case((1, 256, 12, 12), (256, 256, 3, 3), np.uint8, 3)
    attributes = dict(pads=[1, 1, 1, 1])
    x_float = x.astype(np.float32)
    assert winograd_cpu.suits(x_float, params[2].astype(np.float32), (3, 3), (1, 1), (1, 1), 1,
                              (12, 12))
    monkeypatch.setattr(winograd_cpu, "conv", lambda *a, **k: pytest.fail("took Winograd"))
    expected = qlinear_conv(np, x, *params, bias, **attributes)
    got = quantize_cpu.qlinear_conv_cpu(np, x, *params, bias, _node={}, **attributes)
    np.testing.assert_array_equal(got, expected)


def _with(values, index, value):
    values = values.copy()
    values.flat[index] = value
    return values


@pytest.mark.parametrize("case", ["spread", "positive", "negative", "zeros", "nan", "inf",
                                  "tiny", "late_nan", "late_minus_inf", "signed_zeros",
                                  "one", "huge", "subnormal"])
def test_dynamic_quantize_on_the_cpu_gives_the_numpy_forms_outputs(case):
    """The compiled call (the range on the values' bits as ordered integers, then the codes)
    against the NumPy form, bit for bit, NaN and infinities (which the NumPy form takes)
    anywhere in a long tensor included."""
    from mixrt.ops.quant.quantize import dynamic_quantize_linear
    long = RNG.standard_normal((16, 771))
    x = {"spread": RNG.standard_normal((64, 256)) * 3,
         "positive": RNG.random((3, 5)) + 2, "negative": -RNG.random((7,)) * 1e3,
         "zeros": np.zeros((4, 4)), "nan": np.array([1.0, np.nan, -2.0]),
         "inf": np.array([1.0, np.inf, -2.0]), "tiny": RNG.standard_normal(9) * 1e-30,
         "late_nan": _with(long, -1, np.nan), "late_minus_inf": _with(long, -5, -np.inf),
         "signed_zeros": np.array([-0.0, 0.0, -0.0, 2.5]), "one": np.array([-3.25]),
         "huge": RNG.standard_normal(100) * 1e38,
         "subnormal": RNG.standard_normal(40) * 1e-40,
         }[case].astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # the NumPy form's range of "huge"
        expected = dynamic_quantize_linear(np, x)
        got = quantize_cpu.dynamic_quantize_cpu(np, x)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_array_equal(g, e)
