"""Elementwise and activation kernels: the integer, narrow-float, legacy-opset and extreme-value
behaviour the ONNX node tests cover thinly, checked against C semantics, math.erf and
onnxruntime, plus plan-time inference."""

import math
import warnings

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import mixrt
from mixrt.ops import REGISTRY
from mixrt.ops.elementwise import activation, elementwise as ew
from mixrt.ops.ir.types import TensorType

SIGNED = [np.int8, np.int16, np.int32, np.int64]
UNSIGNED = [np.uint8, np.uint16, np.uint32, np.uint64]


def _c_division(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _model(op_type, inputs, attrs, opset, output_shape):
    node = helper.make_node(op_type, [f"x{i}" for i in range(len(inputs))], ["y"], **attrs)
    graph_inputs = [helper.make_tensor_value_info(
        f"x{i}", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for i, a in enumerate(inputs)]
    output = helper.make_tensor_value_info(
        "y", helper.np_dtype_to_tensor_dtype(inputs[0].dtype), output_shape)
    graph = helper.make_graph([node], "g", graph_inputs, [output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=7)


def run_both(op_type, inputs, opset, output_shape=None, **attrs):
    model = _model(op_type, inputs, attrs, opset, output_shape or inputs[0].shape)
    feeds = {f"x{i}": a for i, a in enumerate(inputs)}
    ours = mixrt.Session(model).run(None, feeds)[0]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    reference = ort.InferenceSession(model.SerializeToString(), options,
                                     providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    np.testing.assert_allclose(ours, reference, rtol=1e-6)


# -- integer arithmetic ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", SIGNED)
def test_integer_div_truncates_toward_zero(dtype):
    a = np.array([7, -7, 7, -7, 6, -6, 0, 1, -1], dtype)
    b = np.array([2, 2, -2, -2, 3, -3, 5, -5, 5], dtype)
    expected = [_c_division(int(x), int(y)) for x, y in zip(a, b)]
    got = ew.div(np, a, b)
    assert got.dtype == dtype and got.tolist() == expected


@pytest.mark.parametrize("dtype", UNSIGNED)
def test_unsigned_sub_and_add_wrap_around(dtype):
    top = np.iinfo(dtype).max
    a, b = np.array([0, 1, top], dtype), np.array([1, 2, 1], dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # wrapping is the answer, not an accident to warn about
        assert ew.sub(np, a, b).tolist() == [top, top, top - 1]
        assert ew.add(np, a, b).tolist() == [1, 3, 0]


@pytest.mark.parametrize("dtype", SIGNED)
def test_integer_mod_follows_python_or_c(dtype):
    a = np.array([7, -7, 7, -7, 5], dtype)
    b = np.array([3, 3, -3, -3, 5], dtype)
    pairs = list(zip(a.tolist(), b.tolist()))
    assert ew.mod(np, a, b).tolist() == [x % y for x, y in pairs]
    assert ew.mod(np, a, b, fmod=1).tolist() == [int(math.fmod(x, y)) for x, y in pairs]
    assert ew.mod(np, a, b).dtype == dtype


def test_pow_keeps_the_base_dtype():
    assert ew.pow_(np, np.array([2.0], np.float32), np.array([3], np.int64)).dtype == np.float32
    got = ew.pow_(np, np.array([2, 3], np.int32), np.array([0.5, 2.0], np.float32))
    assert got.dtype == np.int32 and got.tolist() == [1, 9]


def test_integer_pow_with_negative_exponents_truncates():
    base = np.array([1, -1, -1, 2, -2, 0, 3], np.int64)
    exponent = np.array([-3, -3, -2, -1, -2, 2, 4], np.int64)
    assert ew.pow_(np, base, exponent).tolist() == [1, -1, 1, 0, 0, 0, 81]


@pytest.mark.parametrize("dtype", [np.int8, np.int32])
def test_bitshift_out_of_range_amounts_leave_the_sign_fill(dtype):
    bits = np.dtype(dtype).itemsize * 8
    x = np.array([-8, -8, 8, 8, -8], dtype)
    y = np.array([bits, -1, bits, -1, 1], dtype)
    assert ew.bit_shift(np, x, y, direction="RIGHT").tolist() == [-1, -1, 0, 0, -4]
    assert ew.bit_shift(np, x, y, direction="LEFT").tolist() == [0, 0, 0, 0, -16]


def test_bitshift_requires_a_direction():
    with pytest.raises(ValueError, match="LEFT"):
        ew.bit_shift(np, np.array([1], np.uint8), np.array([1], np.uint8))


# -- erf and narrow floats --------------------------------------------------------------------

def test_erf_matches_math_erf():
    x = np.concatenate([np.linspace(-7, 7, 20001), np.logspace(-40, 0.5, 500)])
    expected = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(ew.erf_values(np, x), expected, rtol=1e-14, atol=0)
    single = x.astype(np.float32)
    expected = np.array([math.erf(v) for v in single.astype(np.float64)], np.float32)
    np.testing.assert_array_max_ulp(ew.erf_values(np, single), expected, maxulp=1)


def test_erf_special_values():
    got = ew.erf(np, np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32))
    assert got.dtype == np.float32
    assert got[:4].tolist() == [0.0, -0.0, 1.0, -1.0] and np.signbit(got[1]) and np.isnan(got[4])


@pytest.mark.parametrize("kernel", [ew.exp, ew.sqrt, ew.erf, ew.round_, activation.sigmoid,
                                    activation.gelu, activation.mish, activation.hard_swish])
def test_bfloat16_is_computed_in_float32_and_rounded_once(kernel):
    x = np.linspace(0.1, 3.0, 16).astype(ml_dtypes.bfloat16)
    got = kernel(np, x)
    assert got.dtype == ml_dtypes.bfloat16
    expected = kernel(np, x.astype(np.float32)).astype(ml_dtypes.bfloat16)
    assert np.array_equal(got.astype(np.float32), expected.astype(np.float32))


def test_isnan_and_isinf_on_float8_and_bfloat16():
    values = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert ew.isnan(np, values.astype(ml_dtypes.float8_e4m3fn)).tolist()[:2] == [False, True]
    x = values.astype(ml_dtypes.bfloat16)
    assert ew.isinf(np, x).tolist() == [False, False, True, True]
    assert ew.isinf(np, x, detect_negative=0).tolist() == [False, False, True, False]
    assert ew.isinf(np, x, detect_positive=0).tolist() == [False, False, False, True]


def test_float_attributes_do_not_promote_float32():
    x = np.array([-2.0, 2.0], np.float32)
    for kernel in (activation.leaky_relu, activation.elu, activation.selu, activation.celu,
                   activation.hard_sigmoid, activation.thresholded_relu, activation.swish):
        assert kernel(np, x).dtype == np.float32, kernel.__name__


def test_activations_are_stable_at_extremes():
    x = np.array([-1000.0, -100.0, 100.0, 1000.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert activation.sigmoid(np, x).tolist() == [0.0, pytest.approx(3.7e-44, rel=0.1),
                                                      1.0, 1.0]
        assert activation.softplus(np, x).tolist() == [0.0, pytest.approx(3.7e-44, rel=0.1),
                                                       100.0, 1000.0]
        assert activation.mish(np, x).tolist()[2:] == [100.0, 1000.0]


# -- Clip, variadic, Where --------------------------------------------------------------------

def test_clip_6_defaults_do_not_overflow_float16():
    x = np.array([-60000.0, 0.5, 60000.0], np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ew.clip_6(np, x).tolist() == x.tolist()
    assert ew.clip_6(np, x, min=0.0, max=1.0).tolist() == [0.0, 0.5, 1.0]


def test_clip_min_above_max_gives_max_and_bounds_are_optional():
    x = np.arange(-3, 4, dtype=np.int8)
    assert ew.clip(np, x, np.array(2, np.int8), np.array(-1, np.int8)).tolist() == [-1] * 7
    assert ew.clip(np, x, None, np.array(1, np.int8)).tolist() == [-3, -2, -1, 0, 1, 1, 1]
    unchanged = ew.clip(np, x)
    assert unchanged.tolist() == x.tolist() and unchanged is not x


def test_variadic_ops_broadcast_and_never_alias_their_input():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([10.0, -10.0, 0.5], np.float32)
    assert ew.sum_(np, a, b).tolist() == (a + b).tolist()
    assert ew.mean(np, a, b).tolist() == ((a + b) / 2).tolist()
    assert ew.max_(np, a, b, np.float32(2)).tolist() == np.maximum(np.maximum(a, b), 2).tolist()
    for kernel in (ew.sum_, ew.mean, ew.max_, ew.min_):
        assert kernel(np, a) is not a


def test_where_and_equal_on_strings():
    x = np.array(["a", "b", "c"], dtype=object)
    y = np.array(["a", "x", "c"], dtype=object)
    assert ew.equal(np, x, y).tolist() == [True, False, True]
    assert ew.where(np, np.array([True, False, True]), x, y).tolist() == ["a", "x", "c"]


# -- legacy opsets (onnxruntime runs only some of them) -----------------------------------------

def _run(op_type, inputs, opset, output_shape, **attrs):
    model = _model(op_type, inputs, attrs, opset, output_shape)
    return mixrt.Session(model).run(None, {f"x{i}": a for i, a in enumerate(inputs)})[0]


def test_opset6_add_broadcasts_from_axis():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = np.array([1.0, 2.0, 3.0], np.float32)
    got = _run("Add", [a, b], 6, a.shape, broadcast=1, axis=1)
    assert got.tolist() == (a + b[:, None]).tolist()
    c = np.array([2.0, 3.0, 4.0, 5.0], np.float32)
    assert _run("Mul", [a, c], 6, a.shape, broadcast=1).tolist() == (a * c).tolist()


def test_opset6_prelu_slope_is_per_channel():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    expected = np.where(x < 0, x * slope[:, None], x)
    np.testing.assert_array_equal(_run("PRelu", [x, slope], 6, x.shape), expected)


def test_clip_opset6_attributes_against_onnxruntime():
    x = np.linspace(-3, 3, 12, dtype=np.float32)
    run_both("Clip", [x], opset=6, min=-1.0, max=0.5)


# -- inference and registration -----------------------------------------------------------------

def test_inference_rules():
    f32, b = TensorType(np.dtype(np.float32), (2, 3)), TensorType(np.dtype(bool), (1, 3))
    assert ew.where.kernels[0].infer_fn(b, f32, TensorType(np.dtype(np.float32), (3,))) == \
        [TensorType(np.dtype(np.float32), (2, 3))]
    assert REGISTRY.find("", "Less", 13).infer_fn(f32, f32)[0].dtype == np.dtype(bool)
    assert REGISTRY.find("", "IsNaN", 20).infer_fn(f32)[0] == TensorType(np.dtype(bool), (2, 3))
    legacy = REGISTRY.find("", "Add", 6).infer_fn(f32, TensorType(np.dtype(np.float32), (2,)))
    assert legacy == [f32]


def test_versions_are_registered_from_opset_6_on():
    for op_type in ("Add", "Div", "Pow", "Equal", "And", "Clip", "Sum", "Max", "Relu", "PRelu",
                    "Sigmoid", "Elu", "LeakyRelu", "Abs", "Exp"):
        kernel = REGISTRY.find("", op_type, 6)
        assert kernel is not None, op_type
        assert REGISTRY.find("", op_type, 24) is not None
