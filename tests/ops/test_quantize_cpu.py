"""ops/quantize_cpu.py: per-tensor 8-bit QuantizeLinear/DequantizeLinear through the compiled
loops of ops/_jit_quantize.py give the NumPy forms' codes and values bit for bit, and every
other form still takes the NumPy path."""

from __future__ import annotations

import numpy as np
import pytest

from mixrt.ops import jit_cpu, quantize_cpu
from mixrt.ops.quantize import dequantize_linear, quantize_linear

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
    half = x.astype(np.float16)
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(
            quantize_cpu.quantize_cpu(np, half, np.array(np.float16(0.5))),
            quantize_linear(np, half, np.array(np.float16(0.5))))
    assert not any(compiled_calls)
