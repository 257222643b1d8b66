"""Cast and quantization kernels on what the ONNX backend suite covers thinly: strings,
saturation and float8e8m0 rounding modes, narrow-integer wrapping, BitCast of narrow types,
quantization rounding/saturation/granularity, and the integer convolutions and matmuls
(checked against onnxruntime)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mixrt.ops import REGISTRY
from mixrt.ops.elementwise.cast import bitcast, cast_array, cast_24
from mixrt.ops.quant.quantize import (conv_integer, dequantize_linear_23, dynamic_quantize_linear,
                                matmul_integer, qlinear_conv, qlinear_matmul,
                                quantize_linear_23)
from mixrt.ops.ir.types import TensorType

rng = np.random.default_rng(0)


def f32(*values):
    return np.array(values, dtype=np.float32)


def arrays(**named):
    """Inputs as arrays (0-d for scalars), as a session hands them to kernels."""
    return {name: np.asarray(value) for name, value in named.items()}


def run_ort(op_type, inputs, opset, out_dtype, **attrs):
    """One node in onnxruntime; ``inputs`` is name -> array, in the op's input order."""
    node = helper.make_node(op_type, list(inputs), ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype)),
                                       None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


# -- Cast ----------------------------------------------------------------------------------------

def test_strings_parse_special_literals_case_insensitively():
    text = np.array(["1e-3", "NaN", "INF", "-inf", "+INF", "nan", " 3.5 ", "1E8"], dtype=object)
    got = cast_array(np, text, np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, f32(1e-3, np.nan, np.inf, -np.inf, np.inf, np.nan,
                                           3.5, 1e8))


def test_strings_to_integers_are_exact_and_truncate_decimals():
    text = np.array([str(2**62 + 1), "-7", "100.5"], dtype=object)
    np.testing.assert_array_equal(cast_array(np, text, np.int64), [2**62 + 1, -7, 100])


def test_numbers_print_as_plain_shortest_text():
    got = cast_array(np, f32(0.1, np.nan, np.inf, -np.inf, 314.15926), object)
    assert got.dtype == object
    assert got.tolist() == ["0.1", "NaN", "INF", "-INF", "314.15927"]
    assert cast_array(np, np.array([-3, 12]), object).tolist() == ["-3", "12"]


def test_float8_saturates_by_default_and_overflows_without():
    x = f32(1e6, -1e6, np.inf, np.nan, 1.0)
    e4m3 = np.dtype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(cast_array(np, x, e4m3).astype(np.float32),
                                  f32(448, -448, 448, np.nan, 1))
    assert np.isnan(cast_array(np, x, e4m3, saturate=0).astype(np.float32)[:3]).all()
    e5m2 = cast_array(np, x, ml_dtypes.float8_e5m2, saturate=0).astype(np.float32)
    np.testing.assert_array_equal(e5m2[:3], f32(np.inf, -np.inf, np.inf))


def test_integers_saturate_into_float8():
    got = cast_array(np, np.array([1000, -1000, 3], np.int64), ml_dtypes.float8_e4m3fnuz)
    np.testing.assert_array_equal(got.astype(np.float32), f32(240, -240, 3))


@pytest.mark.parametrize("mode, expected", [
    ("up", [2, 2, 2, 4, 0.125]),
    ("down", [1, 1, 1, 2, 0.0625]),
    ("nearest", [1, 2, 2, 4, 0.125]),  # 3 is the midpoint of 2 and 4: ties go up
])
def test_e8m0_round_modes(mode, expected):
    got = cast_array(np, f32(1.1, 1.5, 1.6, 3.0, 0.124), ml_dtypes.float8_e8m0fnu,
                     round_mode=mode)
    np.testing.assert_array_equal(got.astype(np.float32), f32(*expected))


def test_e8m0_special_values():
    x = f32(0.0, np.inf, 3e38, np.nan)
    saturated = cast_array(np, x, ml_dtypes.float8_e8m0fnu).astype(np.float32)
    np.testing.assert_array_equal(saturated[:3], f32(2.0**-127, 2.0**127, 2.0**127))
    assert np.isnan(saturated[3])
    unsaturated = cast_array(np, x, ml_dtypes.float8_e8m0fnu, saturate=0, round_mode="nearest")
    assert np.isnan(unsaturated.astype(np.float32)).all()


def test_floats_truncate_then_wrap_into_narrow_integers():
    got = cast_array(np, f32(-9.7, 9.7, 300.0, 7.0), ml_dtypes.int4)
    np.testing.assert_array_equal(got.astype(np.int8), [7, -7, -4, 7])
    got = cast_array(np, np.array([-3, 7], ml_dtypes.int4), ml_dtypes.uint2)
    np.testing.assert_array_equal(got.astype(np.int8), [1, 3])


def test_bool_targets_and_sources():
    got = cast_array(np, np.array([1.5, 0, np.nan], ml_dtypes.float8_e4m3fn), np.bool_)
    np.testing.assert_array_equal(got, [True, False, True])
    got = cast_array(np, np.array([True, False]), ml_dtypes.float8_e8m0fnu)
    np.testing.assert_array_equal(got.astype(np.float32), f32(1, 2.0**-127))


def test_cast_versions_and_attributes():
    assert "round_mode" in REGISTRY.find("", "Cast", 24).attribute_names
    assert "saturate" not in REGISTRY.find("", "Cast", 13).attribute_names
    opset1 = REGISTRY.find("", "Cast", 1).fn
    assert opset1(np, f32(1.5), to="DOUBLE").dtype == np.float64
    assert cast_24(np, f32(1.5), to=TensorProto.FLOAT16).dtype == np.float16
    infer = REGISTRY.find("", "Cast", 21).infer_fn
    assert infer(TensorType(np.dtype(np.float32), (2, None)), to=TensorProto.INT4) == \
        [TensorType(np.dtype(ml_dtypes.int4), (2, None))]


# -- BitCast -------------------------------------------------------------------------------------

def test_bitcast_keeps_bits():
    assert bitcast(np, f32(1.0), to=TensorProto.INT32)[0] == 0x3F800000
    got = bitcast(np, np.array([-1, 1], ml_dtypes.int4), to=TensorProto.UINT4)
    np.testing.assert_array_equal(got.astype(np.uint8), [15, 1])
    got = bitcast(np, np.array([-1.0], ml_dtypes.float4_e2m1fn), to=TensorProto.INT4)
    assert int(got.astype(np.int8)[0]) == -6  # 0b1010


def test_bitcast_rejects_different_widths():
    with pytest.raises(ValueError, match="widths must match"):
        bitcast(np, f32(1.0), to=TensorProto.INT64)


# -- QuantizeLinear / DequantizeLinear ------------------------------------------------------------

def test_quantize_rounds_half_to_even_and_saturates():
    x = f32(2.5, 3.5, -2.5, 1000, -1000)
    got = quantize_linear_23(np, x, np.float32(1), np.int8(0))
    np.testing.assert_array_equal(got, np.array([2, 4, -2, 127, -128], np.int8))
    assert quantize_linear_23(np, x, np.float32(1)).dtype == np.uint8  # no zero point


def test_quantize_per_axis_negative_axis():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = quantize_linear_23(np, x, f32(1, 2, 4), np.array([0, 1, 2], np.uint8), axis=-1)
    np.testing.assert_array_equal(got, [[0, 1, 2], [3, 3, 3]])


def test_quantize_blocked_with_partial_last_block():
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    scale = f32(1, 2, 4, 1, 2, 4).reshape(2, 3)  # ceil(5 / 2) = 3 blocks
    got = quantize_linear_23(np, x, scale, axis=1, block_size=2, output_dtype=TensorProto.INT16)
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, [[0, 1, 1, 2, 1], [5, 6, 4, 4, 2]])


def test_quantize_precision_attribute_sets_the_division_type():
    x = f32(1.0001)
    wide = quantize_linear_23(np, x, np.float32(1e-4), output_dtype=TensorProto.UINT16)
    half = quantize_linear_23(np, x, np.float32(1e-4), output_dtype=TensorProto.UINT16,
                              precision=TensorProto.FLOAT16)
    assert int(wide[0]) == 10001 and int(half[0]) != 10001


def test_quantize_to_int4_without_zero_point():
    got = quantize_linear_23(np, f32(-20, 3, 20), np.float32(2),
                             output_dtype=TensorProto.INT4)
    assert got.dtype == ml_dtypes.int4
    np.testing.assert_array_equal(got.astype(np.int8), [-8, 2, 7])


def test_dequantize_int16_extremes_and_output_dtype():
    got = dequantize_linear_23(np, np.array([32767, -32768], np.int16), np.float32(0.5),
                               np.int16(-32768))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [32767.5, 0])
    got = dequantize_linear_23(np, np.array([10, 20], np.uint8), np.float32(0.5),
                               np.uint8(4), output_dtype=TensorProto.FLOAT16)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, [3, 8])


def test_dequantize_blocked():
    x = np.array([[0, 1, 2, 3, 4]], np.int8)
    got = dequantize_linear_23(np, x, f32(1, 10, 100).reshape(1, 3),
                               np.array([[0, 1, 2]], np.int8), axis=1, block_size=2)
    np.testing.assert_array_equal(got, [[0, 1, 10, 20, 200]])


def test_dynamic_quantize_all_zero_input():
    y, scale, zero = dynamic_quantize_linear(np, np.zeros((2, 2), np.float32))
    assert y.dtype == np.uint8 and not y.any()
    assert scale.shape == () and scale.dtype == np.float32 and float(scale) == 0
    assert zero.shape == () and zero.dtype == np.uint8 and int(zero) == 0


# -- integer matmul and convolution against onnxruntime -------------------------------------------

def test_matmul_integer_per_row_zero_points():
    A = rng.integers(0, 256, (4, 6)).astype(np.uint8)
    B = rng.integers(-128, 128, (6, 3)).astype(np.int8)
    a_zero = rng.integers(0, 256, 4).astype(np.uint8)
    b_zero = rng.integers(-128, 128, 3).astype(np.int8)
    expected = (A.astype(np.int64) - a_zero[:, None]) @ (B.astype(np.int64) - b_zero)
    for kernel in (matmul_integer.kernels[-1].fn, matmul_integer.kernels[-1].for_device("cpu")):
        got = kernel(np, A, B, a_zero, b_zero)  # the generic kernel and the CPU's
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, expected)


def test_qlinear_matmul_matches_onnxruntime():
    inputs = arrays(
        a=rng.integers(0, 256, (2, 3, 5)).astype(np.uint8), a_scale=np.float32(0.02),
        a_zero_point=np.uint8(120), b=rng.integers(0, 256, (5, 4)).astype(np.uint8),
        b_scale=np.float32(0.03), b_zero_point=np.uint8(130), y_scale=np.float32(0.05),
        y_zero_point=np.uint8(128))
    expected = run_ort("QLinearMatMul", inputs, 21, np.uint8)
    got = qlinear_matmul(np, *inputs.values())
    assert np.abs(got.astype(int) - expected.astype(int)).max() == 0


def test_conv_integer_matches_onnxruntime():
    inputs = arrays(x=rng.integers(0, 256, (1, 2, 5, 5)).astype(np.uint8),
                  w=rng.integers(0, 256, (3, 2, 3, 3)).astype(np.uint8),
                  x_zero_point=np.uint8(7), w_zero_point=np.uint8(3))
    attrs = dict(pads=[1, 0, 1, 2], strides=[2, 1])
    expected = run_ort("ConvInteger", inputs, 10, np.int32, **attrs)
    got = conv_integer(np, *inputs.values(), **attrs)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)


def _qlinear_conv_inputs(weight_low: int, weight_high: int) -> dict:
    return arrays(
        x=rng.integers(0, 256, (1, 4, 6, 6)).astype(np.uint8), x_scale=np.float32(0.01),
        x_zero_point=np.uint8(100),
        w=rng.integers(weight_low, weight_high, (4, 2, 3, 3)).astype(np.int8),
        w_scale=f32(0.01, 0.02, 0.03, 0.04), w_zero_point=np.zeros(4, np.int8),
        y_scale=np.float32(0.2), y_zero_point=np.uint8(120),
        B=rng.integers(-500, 500, 4).astype(np.int32))


def _exact_grouped_qlinear_conv(inputs: dict) -> np.ndarray:
    """QLinearConv of _qlinear_conv_inputs (2 groups, 3x3, SAME_UPPER) in int64 and float64:
    the arithmetic the operator defines, with no kernel's shortcuts."""
    x = np.pad(inputs["x"].astype(np.int64) - int(inputs["x_zero_point"]),
               ((0, 0), (0, 0), (1, 1), (1, 1)))
    w = inputs["w"].astype(np.int64)
    acc = np.zeros((1, 4, 6, 6), np.int64)
    for o in range(4):
        group = o // 2
        for i, kh, kw in np.ndindex(2, 3, 3):
            acc[0, o] += w[o, i, kh, kw] * x[0, group * 2 + i, kh:kh + 6, kw:kw + 6]
    acc += inputs["B"].astype(np.int64)[None, :, None, None]
    scale = (float(inputs["x_scale"]) * inputs["w_scale"].astype(np.float64)
             / float(inputs["y_scale"]))
    y = np.rint(acc * scale[None, :, None, None]) + int(inputs["y_zero_point"])
    return np.clip(y, 0, 255).astype(np.uint8)


def test_qlinear_conv_per_channel_with_bias_matches_onnxruntime():
    # onnxruntime's AVX2 kernels (no VNNI) add u8 x s8 products in pairs into int16 with
    # saturation (vpmaddubsw): weights of |w| <= 64 keep every pair exact, so onnxruntime is a
    # reference on any x86 CPU; the full range is checked against the exact arithmetic below
    inputs = _qlinear_conv_inputs(-64, 65)
    attrs = dict(group=2, auto_pad="SAME_UPPER")
    expected = run_ort("QLinearConv", inputs, 10, np.uint8, **attrs)
    got = qlinear_conv(np, *inputs.values(), **attrs)
    assert got.dtype == np.uint8 and got.shape == expected.shape
    assert np.abs(got.astype(int) - expected.astype(int)).max() == 0
    np.testing.assert_array_equal(_exact_grouped_qlinear_conv(inputs), expected)
    infer = REGISTRY.find("", "QLinearConv", 10).infer_fn
    types = [TensorType(a.dtype, a.shape) for a in inputs.values()]
    assert infer(*types, **attrs) == [TensorType(np.dtype(np.uint8), expected.shape)]


def test_qlinear_conv_full_range_weights_are_exact():
    inputs = _qlinear_conv_inputs(-128, 128)
    got = qlinear_conv(np, *inputs.values(), group=2, auto_pad="SAME_UPPER")
    np.testing.assert_array_equal(got, _exact_grouped_qlinear_conv(inputs))


