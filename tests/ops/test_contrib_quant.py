"""onnxruntime's quantized com.microsoft operators (ops/quant/contrib_quant*.py) against
onnxruntime itself: integer outputs exactly, float outputs to float32 rounding; shape rules on
symbolic dims; bad operands named with their node; and models written by onnxruntime's own
quantizer (quantize_static in QOperator and QDQ formats, quantize_dynamic)."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_dynamic, quantize_static)

import mixrt
from mixrt.errors import MixrtError
from mixrt.ops.device import gpu_available
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.session import load_graph

MS = "com.microsoft"
rng = np.random.default_rng(0)
f32 = np.float32


@pytest.fixture(autouse=True)
def _seeded_by_the_test(request):
    """Each test draws from a generator seeded by its own id. With one generator for the
    module, a test's data depended on which tests its pytest-xdist worker had run first,
    and a marginal draw failed one run in many (MatMulNBits' fed path, 2026-11-26)."""
    global rng
    rng = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# -- one node in both runtimes ---------------------------------------------------------------

def node_model(op_type, inputs, out_dtypes, *, constants=(), shapes=None, domain=MS,
               node_name="qnode", **attrs):
    """A model of one node. ``inputs``: (name, array or None for an absent optional input);
    names in ``constants`` become initializers; ``shapes`` overrides declared input shapes."""
    names = [name if value is not None else "" for name, value in inputs]
    outputs = [f"y{i}" for i in range(len(out_dtypes))]
    node = helper.make_node(op_type, names, outputs, domain=domain, name=node_name, **attrs)
    present = [(n, v) for n, v in inputs if v is not None]
    shapes = shapes or {}
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype),
                                       shapes.get(n, v.shape))
         for n, v in present if n not in constants],
        [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(d)), None)
         for o, d in zip(outputs, out_dtypes)],
        initializer=[numpy_helper.from_array(v, n) for n, v in present if n in constants])
    return helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def feeds_of(inputs, constants=()):
    return {n: v for n, v in inputs if v is not None and n not in constants}


def run_both(model, feeds):
    data = model.SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = mixrt.Session(data).run(None, feeds)
    return ours, theirs


def assert_same(ours, theirs, *, rtol=1e-5, atol=1e-6):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        if a.dtype.kind in "iu":
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def check_node(op_type, inputs, out_dtypes, *, constants=(), **attrs):
    model = node_model(op_type, inputs, out_dtypes, constants=constants, **attrs)
    ours, theirs = run_both(model, feeds_of(inputs, constants))
    assert_same(ours, theirs)
    return ours


def codes(dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


# onnxruntime's x86 kernels without VNNI (AVX2: an AMD EPYC Zen 3, older Xeons) multiply u8 x s8
# codes with vpmaddubsw, which adds each pair of products into int16 with saturation: 255 x
# -128 twice is -65280, clamped to -32768, and its reference is then off by whole codes. Signed
# weights of |w| <= 64 keep every pair within int16 (255 x 64 x 2 = 32640), so onnxruntime is a
# reference on any x86 CPU; test_full_range_u8s8_products_are_exact checks the full range
# against the exact arithmetic instead.
PAIR_SAFE_INT8 = 64


def weight_codes(dtype, shape):
    """codes() for the second operand of a product whose first is uint8 (see PAIR_SAFE_INT8)."""
    if np.dtype(dtype) == np.int8:
        return rng.integers(-PAIR_SAFE_INT8, PAIR_SAFE_INT8 + 1, shape).astype(np.int8)
    return codes(dtype, shape)


def scalar(value, dtype=f32):
    return np.array(value, dtype=dtype)


def a_zero_point(dtype):
    return scalar(codes(dtype, ()), dtype)


def a_scale(low=0.002, high=0.1):
    return scalar(rng.uniform(low, high))


# -- QLinearAdd, QLinearMul ------------------------------------------------------------------

BROADCASTS = [((64, 33), (64, 33)), ((2, 3, 40), (1,)), ((1,), (3, 70)), ((2, 1, 5), (4, 1)),
              ((2, 3, 1), (2, 3, 16)), ((6,), (4, 6)),
              # large enough for the 256 x 256 table of code pairs
              ((256, 300), (256, 300)), ((3, 100, 256), (256,)), ((400, 1), (400, 200))]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("a_shape, b_shape", BROADCASTS)
def test_binary_matches_onnxruntime(op_type, dtype, a_shape, b_shape):
    for _ in range(4):
        inputs = [("A", codes(dtype, a_shape)), ("A_scale", a_scale()),
                  ("A_zero_point", a_zero_point(dtype)), ("B", codes(dtype, b_shape)),
                  ("B_scale", a_scale()), ("B_zero_point", a_zero_point(dtype)),
                  ("C_scale", a_scale(0.01, 0.2)), ("C_zero_point", a_zero_point(dtype))]
        check_node(op_type, inputs, [dtype])


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
def test_binary_ties_and_saturation(op_type):
    """Equal scales put many results on .5 (round half to even); small C_scales saturate."""
    for scale_c in (0.05, 0.1, 0.001):
        inputs = [("A", codes(np.uint8, (500,))), ("A_scale", scalar(0.05)),
                  ("A_zero_point", scalar(0, np.uint8)), ("B", codes(np.uint8, (500,))),
                  ("B_scale", scalar(0.05)), ("B_zero_point", scalar(3, np.uint8)),
                  ("C_scale", scalar(scale_c)), ("C_zero_point", scalar(128, np.uint8))]
        check_node(op_type, inputs, [np.uint8])


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
def test_binary_absent_zero_points_are_zero(op_type):
    """onnxruntime's type inference refuses absent zero points; ours reads them as 0."""
    inputs = [("A", codes(np.int8, (40,))), ("A_scale", a_scale()),
              ("A_zero_point", scalar(0, np.int8)), ("B", codes(np.int8, (40,))),
              ("B_scale", a_scale()), ("B_zero_point", scalar(0, np.int8)),
              ("C_scale", a_scale()), ("C_zero_point", scalar(0, np.int8))]
    absent = [(n, None if n.endswith("zero_point") else v) for n, v in inputs]
    feeds = feeds_of(inputs)
    explicit = mixrt.Session(node_model(op_type, inputs, [np.int8])).run(None, feeds)
    implicit = mixrt.Session(node_model(op_type, absent, [np.int8])).run(None, feeds_of(absent))
    np.testing.assert_array_equal(explicit[0], implicit[0])


@pytest.mark.parametrize("op_type, inputs", [
    ("QGemm", [("A", codes(np.uint8, (3, 4))), ("a_scale", scalar(0.1)),
               ("a_zero_point", scalar(0, np.uint8)), ("B", codes(np.int8, (4, 5))),
               ("b_scale", scalar(0.1)), ("b_zero_point", scalar(0, np.int8))]),
    ("QLinearGlobalAveragePool", [("X", codes(np.uint8, (2, 3, 4, 4))),
                                  ("x_scale", scalar(0.1)), ("x_zero_point", scalar(0, np.uint8)),
                                  ("y_scale", scalar(0.05)),
                                  ("y_zero_point", scalar(0, np.uint8))])])
def test_other_absent_zero_points_are_zero(op_type, inputs):
    absent = [(n, None if n.endswith("zero_point") else v) for n, v in inputs]
    out = [f32] if op_type == "QGemm" else [np.uint8]
    explicit = mixrt.Session(node_model(op_type, inputs, out)).run(None, feeds_of(inputs))
    implicit = mixrt.Session(node_model(op_type, absent, out)).run(None, feeds_of(absent))
    np.testing.assert_array_equal(explicit[0], implicit[0])


# -- table-driven activations, softmax, concat, where -----------------------------------------

def every_code(dtype, shape=(2, 128)):
    """All 256 codes of an 8-bit type, so a whole lookup table is compared."""
    return np.arange(256, dtype=np.uint8).view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op_type, attrs", [("QLinearSigmoid", {}),
                                            ("QLinearLeakyRelu", {"alpha": 0.1}),
                                            ("QLinearLeakyRelu", {})])
@pytest.mark.parametrize("constant_params", [False, True])
def test_table_activations_match_onnxruntime(op_type, attrs, dtype, constant_params):
    """Sigmoid's table here uses the exact sigmoid where onnxruntime's is a float32
    approximation: no code differs over these 32 tables (8192 codes). Constant parameters
    make onnxruntime build its table once at load, fed ones at each run."""
    info = np.iinfo(dtype)
    for trial in range(8):
        y_scale, y_zero = (scalar(1 / 256), scalar(info.min, dtype)) if trial % 2 else \
            (a_scale(0.002, 0.05), a_zero_point(dtype))
        inputs = [("X", every_code(dtype)), ("X_scale", a_scale(0.01, 0.1)),
                  ("X_zero_point", a_zero_point(dtype)), ("Y_scale", y_scale),
                  ("Y_zero_point", y_zero)]
        constants = ("X_scale", "X_zero_point", "Y_scale", "Y_zero_point") \
            if constant_params else ()
        check_node(op_type, inputs, [dtype], constants=constants, **attrs)


SOFTMAX_CASES = [((3, 4, 9), 13, -1), ((3, 4, 9), 13, 1), ((2, 5, 3, 4), 13, 0),
                 ((3, 4, 9), 12, 1), ((3, 4, 9), 12, 2), ((2, 300), 13, -1), ((4, 2), 13, 1)]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shape, opset, axis", SOFTMAX_CASES)
def test_softmax_matches_onnxruntime(dtype, shape, opset, axis):
    """Coarse codes repeat within rows, and odd multipliers (floor(1 / y_scale)) then put
    quotients near .5, where the float32 details of onnxruntime's table decide."""
    info = np.iinfo(dtype)
    for trial, (x_scale, y_scale, y_zero) in enumerate(
            ((0.1, 1 / 256, info.min), (0.02, 1 / 256, info.min), (0.5, 1 / 200, 0),
             (0.05, 0.0123, info.min + 3), (0.05, 1 / 83, 0), (0.3, 1 / 85, 1))):
        x = codes(dtype, shape)
        x = (x // 16).astype(dtype) if trial % 2 else x
        inputs = [("X", x), ("X_scale", scalar(x_scale)),
                  ("x_zero_point", a_zero_point(dtype)), ("y_scale", scalar(y_scale)),
                  ("y_zero_point", scalar(y_zero, dtype))]
        check_node("QLinearSoftmax", inputs, [dtype], constants=("X_scale",), axis=axis,
                   opset=opset)


def test_softmax_of_one_element_is_one():
    """A row of one element has probability 1: the largest code. (onnxruntime's float32
    product overflows there and its conversion of infinity to an integer gives the zero
    point for uint8: a case we do not copy.)"""
    inputs = [("X", codes(np.uint8, (3, 1))), ("X_scale", scalar(0.5)),
              ("x_zero_point", scalar(0, np.uint8)), ("y_scale", scalar(1 / 256)),
              ("y_zero_point", scalar(0, np.uint8))]
    model = node_model("QLinearSoftmax", inputs, [np.uint8], axis=1, opset=13)
    np.testing.assert_array_equal(mixrt.Session(model).run(None, feeds_of(inputs))[0], 255)


def test_softmax_default_axis_follows_opset():
    """Without the axis attribute both opsets normalize over the last axis (the
    attribute's default, -1, whatever Softmax's own default was before opset 13)."""
    for opset in (12, 13):
        inputs = [("X", codes(np.uint8, (2, 3, 5))), ("X_scale", scalar(0.1)),
                  ("x_zero_point", scalar(0, np.uint8)), ("y_scale", scalar(1 / 256)),
                  ("y_zero_point", scalar(0, np.uint8))]
        check_node("QLinearSoftmax", inputs, [np.uint8], opset=opset)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_concat_requantizes_each_input(dtype):
    y_scale, y_zero = a_scale(0.01, 0.05), a_zero_point(dtype)
    inputs = [("Y_scale", y_scale), ("Y_zero_point", y_zero),
              ("x0", codes(dtype, (2, 3, 4))), ("s0", a_scale()), ("z0", a_zero_point(dtype)),
              ("x1", codes(dtype, (2, 5, 4))), ("s1", y_scale.copy()), ("z1", y_zero.copy()),
              ("x2", every_code(dtype, (2, 128, 1)).repeat(4, axis=2)[:, :7]),
              ("s2", a_scale(0.05, 0.2)), ("z2", a_zero_point(dtype))]
    check_node("QLinearConcat", inputs, [dtype], axis=1)
    check_node("QLinearConcat", inputs, [dtype], axis=-2,
               constants=("Y_scale", "Y_zero_point", "s0", "z0"))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_where_requantizes_both_branches(dtype):
    inputs = [("condition", rng.random((3, 1, 6)) > 0.5), ("X", codes(dtype, (4, 6))),
              ("x_scale", a_scale()), ("x_zero_point", a_zero_point(dtype)),
              ("Y", codes(dtype, (3, 4, 1))), ("y_scale", a_scale()),
              ("y_zero_point", a_zero_point(dtype)), ("z_scale", a_scale()),
              ("z_zero_point", a_zero_point(dtype))]
    check_node("QLinearWhere", inputs, [dtype])


# -- com.microsoft QuantizeLinear and DequantizeLinear ----------------------------------------

NARROW = {"int4": TensorProto.INT4, "uint4": TensorProto.UINT4}


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16])
@pytest.mark.parametrize("per_axis", [False, True])
def test_contrib_quantize_dequantize(dtype, per_axis):
    x = (rng.standard_normal((3, 4, 5)) * 40).astype(f32)
    x[0, 0, :4] = [0.5, 1.5, 2.5, -2.5]  # ties: half to even
    if per_axis:
        scale = rng.uniform(0.05, 0.3, 4).astype(f32)
        zero = codes(dtype, (4,)) // 2
    else:
        scale, zero = scalar(0.25), scalar(codes(dtype, ()) // 2, dtype)
    inputs = [("x", x), ("y_scale", scale), ("y_zero_point", zero.astype(dtype))]
    (quantized,) = check_node("QuantizeLinear", inputs, [dtype], axis=1)
    inputs = [("x", quantized), ("x_scale", scale), ("x_zero_point", zero.astype(dtype))]
    check_node("DequantizeLinear", inputs, [f32], axis=1)


def test_contrib_quantize_float16_and_default_uint8():
    x = (rng.standard_normal((4, 6)) * 20).astype(np.float16)
    inputs = [("x", x), ("y_scale", scalar(0.3, np.float16)),
              ("y_zero_point", scalar(10, np.uint8))]
    (quantized,) = check_node("QuantizeLinear", inputs, [np.uint8])
    check_node("DequantizeLinear", [("x", quantized), ("x_scale", scalar(0.3, np.float16)),
                                    ("x_zero_point", scalar(10, np.uint8))], [np.float16])


@pytest.mark.parametrize("name", ["int4", "uint4"])
def test_contrib_quantize_int4_per_axis(name):
    """onnxruntime hands no int4 tensor to NumPy: quantize and dequantize in one model, and
    dequantize int4 codes stored as an initializer."""
    dtype = np.dtype(getattr(ml_dtypes, name))
    x = (rng.standard_normal((4, 6)) * 3).astype(f32)
    scale = rng.uniform(0.2, 0.6, 4).astype(f32)
    zero = np.array([1, -2, 0, 3] if name == "int4" else [1, 8, 0, 15]).astype(dtype)
    stored = np.array(rng.integers(-8 if name == "int4" else 0, 8, (4, 6))).astype(dtype)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=MS, axis=0),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS, axis=0),
             helper.make_node("DequantizeLinear", ["w", "s", "z"], ["v"], domain=MS, axis=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "v")],
        initializer=[numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero, "z"),
                     numpy_helper.from_array(stored, "w")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    assert_same(*run_both(model, {"x": x}))


# -- pools -----------------------------------------------------------------------------------

def pool_inputs(dtype, shape, *, same_scales=False):
    x_scale = a_scale(0.01, 0.2)
    y_scale = x_scale.copy() if same_scales else a_scale(0.01, 0.2)
    return [("X", codes(dtype, shape)), ("x_scale", x_scale), ("x_zero_point", a_zero_point(dtype)),
            ("y_scale", y_scale), ("y_zero_point", a_zero_point(dtype))]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("shape", [(2, 5, 7, 7), (1, 3, 1, 1), (2, 17, 2, 3, 4), (3, 8, 10)])
def test_global_average_pool_matches_onnxruntime(dtype, channels_last, shape):
    """Equal scales and two-element images land on .5: ties round half to even."""
    for same in (False, True):
        check_node("QLinearGlobalAveragePool", pool_inputs(dtype, shape, same_scales=same),
                   [dtype], channels_last=channels_last)
    check_node("QLinearGlobalAveragePool", pool_inputs(dtype, (4, 9, 2), same_scales=True),
               [dtype], channels_last=channels_last)


AVERAGE_POOLS = [
    dict(kernel_shape=[3, 3]),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], count_include_pad=1),
    dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 0, 0], ceil_mode=1,
         count_include_pad=1),
    dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_LOWER"),
    dict(kernel_shape=[7, 6]),  # the whole image: onnxruntime's global arithmetic
]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("attrs", AVERAGE_POOLS)
def test_average_pool_matches_onnxruntime(dtype, channels_last, attrs):
    shape = (2, 7, 6, 3) if channels_last else (2, 3, 7, 6)
    for _ in range(3):
        check_node("QLinearAveragePool", pool_inputs(dtype, shape), [dtype],
                   channels_last=channels_last, **attrs)


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3], strides=[2], pads=[1, 2]),
                                   dict(kernel_shape=[2, 2, 3], pads=[0, 1, 1, 1, 0, 1])])
def test_average_pool_1d_and_3d(channels_last, attrs):
    rank = len(attrs["kernel_shape"])
    spatial = (9, 5, 6)[:rank]
    shape = (2, *spatial, 4) if channels_last else (2, 4, *spatial)
    check_node("QLinearAveragePool", pool_inputs(np.uint8, shape), [np.uint8],
               channels_last=channels_last, **attrs)


# -- QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul ----------------------------------------

def b_params(dtype, columns, per_column):
    if per_column:
        return rng.uniform(0.002, 0.05, columns).astype(f32), codes(dtype, (columns,))
    return a_scale(0.002, 0.05), a_zero_point(dtype)


GEMM_TYPES = [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)]


@pytest.mark.parametrize("a_dtype, b_dtype", GEMM_TYPES)
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("output", ["quantized", "float", "float_scaled"])
@pytest.mark.parametrize("with_c", [False, True])
def test_qgemm_matches_onnxruntime(a_dtype, b_dtype, per_column, output, with_c):
    """Quantized or float output (no y_zero_point: float32, divided by y_scale when that
    is given); C as one int32 per column, per row and column, or per row."""
    for trial, (m, k, n) in enumerate([(7, 33, 19), (1, 5, 40), (16, 64, 1)]):
        trans_a, trans_b = trial % 2, (trial + 1) % 2
        b_scale, b_zero = b_params(b_dtype, n, per_column)
        c_shape = [(n,), (m, n), (m, 1)][trial]
        inputs = [("A", codes(a_dtype, (k, m) if trans_a else (m, k))), ("a_scale", a_scale()),
                  ("a_zero_point", a_zero_point(a_dtype)),
                  ("B", weight_codes(b_dtype, (n, k) if trans_b else (k, n))),
                  ("b_scale", b_scale),
                  ("b_zero_point", b_zero),
                  ("C", rng.integers(-3000, 3000, c_shape).astype(np.int32) if with_c else None),
                  ("y_scale", a_scale(0.05, 0.5) if output != "float" else None),
                  ("y_zero_point", a_zero_point(a_dtype) if output == "quantized" else None)]
        out = a_dtype if output == "quantized" else f32
        check_node("QGemm", inputs, [out], transA=trans_a, transB=trans_b,
                   alpha=[1.0, 0.75, 1.5][trial], constants=("B",) if trial == 1 else ())


@pytest.mark.parametrize("b_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("a_shape, b_shape", [((9, 17), (17, 11)), ((2, 3, 8), (8, 5)),
                                              ((4, 1, 6), (4, 6, 3))])
def test_matmul_integer_to_float_matches_onnxruntime(b_dtype, per_column, a_shape, b_shape):
    if per_column and len(b_shape) > 2:
        pytest.skip("onnxruntime wants a batched B's parameters per matrix as well")
    columns = b_shape[-1]
    b_scale, b_zero = b_params(b_dtype, columns, per_column)
    for bias in (None, rng.standard_normal(columns).astype(f32)):
        inputs = [("A", codes(np.uint8, a_shape)), ("B", weight_codes(b_dtype, b_shape)),
                  ("a_scale", a_scale()), ("b_scale", b_scale),
                  ("a_zero_point", a_zero_point(np.uint8)), ("b_zero_point", b_zero),
                  ("bias", bias)]
        check_node("MatMulIntegerToFloat", inputs, [f32])
        check_node("MatMulIntegerToFloat", inputs, [f32], constants=("B", "b_scale"))


@pytest.mark.parametrize("op_type", ["MatMulInteger", "MatMulIntegerToFloat"])
def test_full_range_u8s8_products_are_exact(op_type):
    """The codes onnxruntime's reference avoids on CPUs without VNNI (PAIR_SAFE_INT8): uint8
    at 255 against int8 at -128, every pair's sum beyond int16, against int64 arithmetic."""
    a = np.full((4, 64), 255, np.uint8)
    a[1::2] = codes(np.uint8, (2, 64))
    b = np.full((64, 6), -128, np.int8)
    b[:, 3:] = codes(np.int8, (64, 3))
    a_zero, b_zero = scalar(3, np.uint8), scalar(-2, np.int8)
    exact = (a.astype(np.int64) - 3) @ (b.astype(np.int64) + 2)
    if op_type == "MatMulInteger":
        inputs = [("A", a), ("B", b), ("a_zero_point", a_zero), ("b_zero_point", b_zero)]
        (got,) = mixrt.Session(node_model(op_type, inputs, [np.int32], domain="")).run(
            None, feeds_of(inputs))
        np.testing.assert_array_equal(got, exact)
        return
    inputs = [("A", a), ("B", b), ("a_scale", scalar(0.5)), ("b_scale", scalar(0.25)),
              ("a_zero_point", a_zero), ("b_zero_point", b_zero)]
    (got,) = mixrt.Session(node_model(op_type, inputs, [f32])).run(None, feeds_of(inputs))
    np.testing.assert_array_equal(got, (exact * 0.125).astype(f32))  # exact in float32


@pytest.mark.parametrize("b_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
def test_dynamic_quantize_matmul_matches_onnxruntime(b_dtype, per_column):
    for a_shape, b_shape in (((9, 17), (17, 11)), ((2, 3, 8), (8, 5))):
        b_scale, b_zero = b_params(b_dtype, b_shape[-1], per_column)
        for x in (rng.standard_normal(a_shape).astype(f32) * 3,
                  np.abs(rng.standard_normal(a_shape)).astype(f32), np.zeros(a_shape, f32)):
            inputs = [("A", x), ("B", weight_codes(b_dtype, b_shape)), ("b_scale", b_scale),
                      ("b_zero_point", b_zero),
                      ("bias", rng.standard_normal(b_shape[-1]).astype(f32))]
            check_node("DynamicQuantizeMatMul", inputs, [f32], constants=("B",))


# -- MatMulNBits -------------------------------------------------------------------------------

def pack_codes(values, bits):
    """Codes packed along the last axis, the first in the lowest bits of each byte."""
    per_byte = 8 // bits
    grouped = values.reshape(*values.shape[:-1], -1, per_byte).astype(np.uint8)
    shifts = (np.arange(per_byte) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(grouped << shifts, axis=-1).astype(np.uint8)


def nbits_weights(k, n, bits, block_size, zero_points):
    blocks = -(-k // block_size)
    quantized = rng.integers(0, 1 << bits, (n, blocks, block_size))
    scales = rng.uniform(0.01, 0.1, (n, blocks)).astype(f32)
    if zero_points == "packed":
        per_row = -(-blocks * bits // 8) * (8 // bits)
        zero = np.zeros((n, per_row), np.uint8)
        zero[:, :blocks] = rng.integers(0, 1 << bits, (n, blocks))
        zero = pack_codes(zero, bits)
    elif zero_points == "float":
        zero = rng.uniform(0, (1 << bits) - 1, (n, blocks)).astype(f32)
    else:
        zero = None
    return pack_codes(quantized, bits), scales, zero


NBITS_CASES = [(4, 32, 64, 24), (4, 16, 50, 7), (4, 128, 300, 33), (4, 64, 64, 1),
               (8, 32, 70, 12), (8, 16, 16, 5), (2, 32, 96, 9)]


@pytest.mark.parametrize("bits, block_size, k, n", NBITS_CASES)
@pytest.mark.parametrize("zero_points", ["absent", "packed", "float"])
def test_matmul_nbits_matches_onnxruntime(bits, block_size, k, n, zero_points):
    if bits == 8 and zero_points == "float":
        pytest.skip("onnxruntime takes float zero points for 2 and 4 bits only")
    packed, scales, zero = nbits_weights(k, n, bits, block_size, zero_points)
    for a_shape, bias in (((3, k), None), ((2, 4, k), rng.standard_normal(n).astype(f32))):
        inputs = [("A", rng.standard_normal(a_shape).astype(f32)), ("B", packed),
                  ("scales", scales), ("zero_points", zero), ("g_idx", None), ("bias", bias)]
        model = node_model("MatMulNBits", inputs, [f32], K=k, N=n, bits=bits,
                           block_size=block_size,
                           constants=("B", "scales", "zero_points", "bias"))
        ours, theirs = run_both(model, {"A": inputs[0][1]})
        assert_same(ours, theirs, rtol=1e-5, atol=2e-5)
        # fed weights take the path that dequantizes at each run
        fed = node_model("MatMulNBits", inputs, [f32], K=k, N=n, bits=bits,
                         block_size=block_size)
        # it sums each product in another order than onnxruntime's blockwise kernel: an
        # output near zero cancels terms of the outputs' size, so the bound scales with them
        np.testing.assert_allclose(mixrt.Session(fed).run(None, feeds_of(inputs))[0],
                                   theirs[0], rtol=1e-5,
                                   atol=2e-5 + 1e-6 * np.abs(theirs[0]).max())


@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_nbits_through_the_float_panels_matches_onnxruntime(rows, with_bias):
    """A constant weight large enough for the CPU's packed panels (split with the native
    worker, the bias added per tile), a decoder step's one row through the BLAS, and the
    replayed call of later runs: onnxruntime's results each time."""
    k, n = 256, 512
    packed, scales, zero = nbits_weights(k, n, 4, 32, "packed")
    bias = rng.standard_normal(n).astype(f32) if with_bias else None
    inputs = [("A", rng.standard_normal((1, rows, k)).astype(f32)), ("B", packed),
              ("scales", scales), ("zero_points", zero), ("g_idx", None), ("bias", bias)]
    model = node_model("MatMulNBits", inputs, [f32], K=k, N=n, bits=4, block_size=32,
                       constants=("B", "scales", "zero_points", "bias"))
    # a node after it: the product then writes into the run's memory, as inside a model
    model.graph.node[0].output[0] = "product"
    model.graph.node.append(helper.make_node("Neg", ["product"], ["y0"]))
    session = mixrt.Session(model.SerializeToString())
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"])
    for _ in range(3):  # the first (discovery), the planned, the replayed runs
        feeds = {"A": rng.standard_normal((1, rows, k)).astype(f32)}
        assert_same(session.run(None, feeds), theirs.run(None, feeds), rtol=1e-5, atol=2e-5)


def test_matmul_nbits_accuracy_level_is_ignored():
    """accuracy_level 4 lets onnxruntime quantize A to int8 blocks internally; ours keeps
    computing in float32, close to onnxruntime's level 0 exactly and to level 4 within its
    quantization error."""
    packed, scales, zero = nbits_weights(128, 16, 4, 32, "packed")
    x = rng.standard_normal((5, 128)).astype(f32)
    results = {}
    for level in (0, 4):
        inputs = [("A", x), ("B", packed), ("scales", scales), ("zero_points", zero)]
        model = node_model("MatMulNBits", inputs, [f32], K=128, N=16, bits=4, block_size=32,
                           accuracy_level=level, constants=("B", "scales", "zero_points"))
        results[level] = run_both(model, {"A": x})
    ours0, theirs0 = results[0]
    ours4, theirs4 = results[4]
    np.testing.assert_array_equal(ours0[0], ours4[0])
    assert_same(ours0, theirs0, atol=2e-5)
    scale = float(np.abs(theirs4[0]).max())
    assert float(np.abs(ours4[0] - theirs4[0]).max()) <= 0.03 * scale


# -- models written by onnxruntime's quantizers --------------------------------------------------

def weight(name, shape, scale, seed):
    values = np.random.default_rng(seed).standard_normal(shape) * scale
    return numpy_helper.from_array(values.astype(f32), name)


def small_cnn():
    """Conv, Relu, Conv, Sigmoid, Mul, Add, GlobalAveragePool, Flatten, Gemm."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["h1"]),
             helper.make_node("Conv", ["h1", "w2", "b2"], ["h2"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["h2"], ["gate"]),
             helper.make_node("Mul", ["h1", "gate"], ["gated"]),
             helper.make_node("Add", ["gated", "h1"], ["residual"]),
             helper.make_node("GlobalAveragePool", ["residual"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["flat"]),
             helper.make_node("Gemm", ["flat", "wf", "bf"], ["y"], transB=1)]
    weights = [weight("w1", (8, 3, 3, 3), 0.3, 1), weight("b1", (8,), 0.1, 2),
               weight("w2", (8, 8, 3, 3), 0.2, 3), weight("b2", (8,), 0.1, 4),
               weight("wf", (10, 8), 0.3, 5), weight("bf", (10,), 0.1, 6)]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


class Calibration(CalibrationDataReader):
    def __init__(self, seed=7):
        generator = np.random.default_rng(seed)
        self.batches = iter([{"x": generator.standard_normal((2, 3, 8, 8)).astype(f32)}
                             for _ in range(4)])

    def get_next(self):
        return next(self.batches, None)


def op_types(path):
    return {(n.domain, n.op_type) for n in onnx.load(path).graph.node}


def assert_matches_onnxruntime(path, feeds):
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = mixrt.Session(str(path)).run(None, feeds)
    assert_same(ours, theirs)


@pytest.mark.parametrize("weight_type", [QuantType.QInt8, QuantType.QUInt8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("quant_format", [QuantFormat.QOperator, QuantFormat.QDQ])
def test_quantize_static_cnn_runs_as_in_onnxruntime(tmp_path, weight_type, per_channel,
                                                    quant_format):
    """Both formats give the same float outputs as onnxruntime, bit for bit (in QDQ format
    onnxruntime fuses the float ops back into its QLinear kernels)."""
    source, target = tmp_path / "cnn.onnx", tmp_path / "cnn.quant.onnx"
    source.write_bytes(small_cnn().SerializeToString())
    # weights in 7 bits (reduce_range), as onnxruntime advises where its kernels lack VNNI:
    # its u8 x s8 pair sums stay exact there (PAIR_SAFE_INT8); per-channel convolution
    # weights are int8 whichever weight_type is asked for
    quantize_static(str(source), str(target), Calibration(), quant_format=quant_format,
                    activation_type=QuantType.QUInt8, weight_type=weight_type,
                    per_channel=per_channel, reduce_range=True)
    if quant_format == QuantFormat.QOperator:
        assert {(MS, "QLinearAdd"), (MS, "QLinearMul"), (MS, "QLinearSigmoid"),
                (MS, "QLinearGlobalAveragePool"), (MS, "QGemm")} <= op_types(target)
    x = np.random.default_rng(11).standard_normal((3, 3, 8, 8)).astype(f32)
    assert_matches_onnxruntime(target, {"x": x})


def two_projections():
    """x @ w1 (+ b1, Relu) and x @ w2, then a Gemm: quantize_dynamic's MatMul and Gemm
    cases; onnxruntime's optimizer fuses them into DynamicQuantizeMatMul and (x quantized
    once for two products) MatMulIntegerToFloat."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["x", "w2"], ["side"]),
             helper.make_node("Add", ["r", "side"], ["both"]),
             helper.make_node("Reshape", ["both", "rows"], ["flat"]),
             helper.make_node("Gemm", ["flat", "w3", "b3"], ["y"])]
    weights = [weight("w1", (16, 32), 0.3, 1), weight("b1", (32,), 0.1, 2),
               weight("w2", (16, 32), 0.3, 3), weight("w3", (32, 10), 0.3, 4),
               weight("b3", (10,), 0.1, 5),
               numpy_helper.from_array(np.array([-1, 32], np.int64), "rows")]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("weight_type", [QuantType.QInt8, QuantType.QUInt8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_dynamic_then_optimized_runs_as_in_onnxruntime(tmp_path, weight_type,
                                                                per_channel):
    source, target = tmp_path / "mlp.onnx", tmp_path / "mlp.quant.onnx"
    optimized = tmp_path / "mlp.quant.optimized.onnx"
    source.write_bytes(two_projections().SerializeToString())
    quantize_dynamic(str(source), str(target), weight_type=weight_type, per_channel=per_channel,
                     reduce_range=True)  # as in the quantize_static test
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(target), options, providers=["CPUExecutionProvider"])
    assert {(MS, "DynamicQuantizeMatMul"), (MS, "MatMulIntegerToFloat")} \
        <= op_types(optimized)
    x = np.random.default_rng(12).standard_normal((3, 5, 16)).astype(f32)
    for path in (target, optimized):
        assert_matches_onnxruntime(path, {"x": x})


def test_matmul_nbits_quantizer_model_runs_as_in_onnxruntime(tmp_path):
    quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer",
                                    exc_type=ImportError)
    source, target = tmp_path / "mlp.onnx", tmp_path / "mlp.nbits.onnx"
    source.write_bytes(two_projections().SerializeToString())
    model = quantizer.MatMulNBitsQuantizer(onnx.load(str(source)), block_size=16,
                                           is_symmetric=False)
    model.process()
    model.model.save_model_to_file(str(target))
    assert (MS, "MatMulNBits") in op_types(target)
    x = np.random.default_rng(13).standard_normal((3, 5, 16)).astype(f32)
    assert_matches_onnxruntime(target, {"x": x})


# -- shape rules on symbolic dims ---------------------------------------------------------------

def inferred_outputs(model):
    graph = load_graph(model)
    types = infer_types(graph)
    return [types[v.name] for v in graph.outputs]


def u8_params(*names):
    return [(n, a_scale() if "scale" in n else a_zero_point(np.uint8)) for n in names]


def shape_cases():
    """(op_type, inputs, declared input shapes, attributes, expected dtype and shape)."""
    u8 = np.uint8
    nbits_b, nbits_scales, nbits_zero = nbits_weights(40, 6, 4, 16, "packed")
    return [
        ("QLinearAdd", [("A", codes(u8, (2, 4))), *u8_params("A_scale", "A_zero_point"),
                        ("B", codes(u8, (2, 1))), *u8_params("B_scale", "B_zero_point"),
                        *u8_params("C_scale", "C_zero_point")],
         {"A": ["N", 4], "B": ["N", 1]}, {}, (u8, ("N", 4))),
        ("QLinearSigmoid", [("X", codes(u8, (2, 3))), *u8_params("X_scale", "X_zero_point",
                                                                 "Y_scale", "Y_zero_point")],
         {"X": ["N", "C"]}, {}, (u8, ("N", "C"))),
        ("QLinearSoftmax", [("X", codes(u8, (2, 3))), *u8_params("X_scale", "x_zero_point",
                                                                 "y_scale", "y_zero_point")],
         {"X": ["N", 3]}, {"opset": 13}, (u8, ("N", 3))),
        ("QLinearConcat", [*u8_params("Y_scale", "Y_zero_point"), ("x0", codes(u8, (2, 3))),
                           ("s0", a_scale()), ("z0", a_zero_point(u8)),
                           ("x1", codes(u8, (2, 5))), ("s1", a_scale()), ("z1", a_zero_point(u8))],
         {"x0": ["N", 3], "x1": ["N", 5]}, {"axis": 1}, (u8, ("N", 8))),
        ("QLinearWhere", [("condition", np.ones((2, 1), bool)), ("X", codes(u8, (4,))),
                          *u8_params("x_scale", "x_zero_point"), ("Y", codes(u8, (2, 4))),
                          *u8_params("y_scale", "y_zero_point", "z_scale", "z_zero_point")],
         {"condition": ["N", 1], "Y": ["N", 4]}, {}, (u8, ("N", 4))),
        ("QLinearGlobalAveragePool", [("X", codes(u8, (2, 5, 6, 8))),
                                      *u8_params("x_scale", "x_zero_point", "y_scale",
                                                 "y_zero_point")],
         {"X": ["N", "H", "W", 8]}, {"channels_last": 1}, (u8, ("N", 1, 1, 8))),
        ("QLinearAveragePool", [("X", codes(u8, (2, 8, 8, 3))),
                                *u8_params("x_scale", "x_zero_point", "y_scale",
                                           "y_zero_point")],
         {"X": ["N", 8, 8, 3]},
         {"channels_last": 1, "kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4},
         (u8, ("N", 4, 4, 3))),
        ("QGemm", [("A", codes(u8, (3, 16))), *u8_params("a_scale", "a_zero_point"),
                   ("B", weight_codes(np.int8, (16, 8))), ("b_scale", a_scale()),
                   ("b_zero_point", scalar(0, np.int8)), ("C", None),
                   *u8_params("y_scale", "y_zero_point")],
         {"A": ["M", 16]}, {}, (u8, ("M", 8))),
        ("QGemm", [("A", codes(u8, (16, 3))), *u8_params("a_scale", "a_zero_point"),
                   ("B", codes(u8, (8, 16))), ("b_scale", a_scale()),
                   ("b_zero_point", a_zero_point(u8))],
         {"A": [16, "M"], "B": ["N", 16]}, {"transA": 1, "transB": 1}, (f32, ("M", "N"))),
        ("MatMulIntegerToFloat", [("A", codes(u8, (2, 3, 16))), ("B", codes(np.int8, (16, 8))),
                                  ("a_scale", a_scale()), ("b_scale", a_scale())],
         {"A": ["B", "S", 16]}, {}, (f32, ("B", "S", 8))),
        ("DynamicQuantizeMatMul", [("A", np.zeros((2, 3, 16), f32)),
                                   ("B", codes(np.int8, (16, 8))), ("b_scale", a_scale())],
         {"A": ["B", "S", 16]}, {}, (f32, ("B", "S", 8))),
        ("MatMulNBits", [("A", np.zeros((2, 3, 40), f32)), ("B", nbits_b),
                         ("scales", nbits_scales), ("zero_points", nbits_zero)],
         {"A": ["B", "S", 40]}, {"K": 40, "N": 6, "block_size": 16}, (f32, ("B", "S", 6))),
        ("QuantizeLinear", [("x", np.zeros((2, 4), f32)), ("y_scale", a_scale()),
                            ("y_zero_point", scalar(0, np.int8))],
         {"x": ["N", 4]}, {}, (np.int8, ("N", 4))),
        ("DequantizeLinear", [("x", codes(np.int16, (2, 4))), ("x_scale", a_scale()),
                              ("x_zero_point", scalar(0, np.int16))],
         {"x": ["N", 4]}, {}, (f32, ("N", 4))),
    ]


@pytest.mark.parametrize("case", shape_cases(), ids=lambda case: case[0])
def test_symbolic_dims_infer_and_run(case):
    """Each op's shape rule keeps the symbolic dims; the model runs, and what it makes
    fits the inferred type."""
    op_type, inputs, shapes, attrs, (dtype, shape) = case
    feeds = [n for n, _ in inputs if n in shapes]
    constants = tuple(n for n, v in inputs if v is not None and n not in feeds)
    model = node_model(op_type, inputs, [dtype], constants=constants, shapes=shapes, **attrs)
    (output,) = inferred_outputs(model)
    assert (output.dtype, output.shape) == (np.dtype(dtype), shape)
    (result,) = mixrt.Session(model).run(None, {n: v for n, v in inputs if n in feeds})
    assert result.dtype == np.dtype(dtype) and result.ndim == len(shape)
    assert all(d == n for d, n in zip(shape, result.shape) if isinstance(d, int))


# -- bad operands name their node -----------------------------------------------------------------

def bad_models():
    u8 = np.uint8
    add = [("A", codes(u8, (2, 3))), ("A_scale", rng.uniform(0.1, 1, 3).astype(f32)),
           ("A_zero_point", a_zero_point(u8)), ("B", codes(u8, (2, 3))),
           *u8_params("B_scale", "B_zero_point", "C_scale", "C_zero_point")]
    mixed = [("A", codes(u8, (2, 3))), *u8_params("A_scale", "A_zero_point"),
             ("B", codes(np.int8, (2, 3))), *u8_params("B_scale", "B_zero_point", "C_scale",
                                                      "C_zero_point")]
    gemm = [("A", codes(u8, (3, 16))), *u8_params("a_scale", "a_zero_point"),
            ("B", codes(np.int8, (16, 8))), ("b_scale", rng.uniform(0.1, 1, 5).astype(f32)),
            ("b_zero_point", scalar(0, np.int8))]
    nbits_b, nbits_scales, _ = nbits_weights(40, 6, 4, 16, "absent")
    nbits = [("A", np.zeros((2, 41), f32)), ("B", nbits_b), ("scales", nbits_scales)]
    softmax = [("X", codes(u8, (2, 3))), *u8_params("X_scale", "x_zero_point", "y_scale",
                                                   "y_zero_point")]
    concat = [*u8_params("Y_scale", "Y_zero_point"), ("x0", codes(u8, (2, 3))),
              ("s0", a_scale())]
    return [("QLinearAdd", add, {}, "A_scale has shape \\(3,\\)"),
            ("QLinearMul", mixed, {}, "B is int8; expected uint8"),
            ("QGemm", gemm, {}, "b_scale has shape \\(5,\\)"),
            ("MatMulNBits", nbits, dict(K=40, N=6, block_size=16), "expected K=40"),
            ("MatMulNBits", nbits[:1] + nbits[1:], dict(K=40, N=6, block_size=16, bits=3),
             "bits=3"),
            ("QLinearSoftmax", softmax, {}, "opset attribute is required"),
            ("QLinearConcat", concat, {"axis": 1}, "triples")]


@pytest.mark.parametrize("case", bad_models(), ids=lambda case: f"{case[0]}-{case[3][:12]}")
def test_bad_operands_are_refused_naming_the_node(case):
    op_type, inputs, attrs, words = case
    model = node_model(op_type, inputs, [np.uint8], node_name="bad_node", **attrs)
    with pytest.raises(MixrtError, match=words) as caught:
        mixrt.Session(model).run(None, feeds_of(inputs))
    assert "bad_node" in str(caught.value)


def test_fed_parameters_of_the_wrong_size_fail_at_run_naming_the_node():
    """Shapes unknown at load: the kernel's words name the node when the run meets them."""
    inputs = [("X", codes(np.uint8, (2, 3))), ("X_scale", np.full(3, 0.1, f32)),
              *u8_params("X_zero_point", "Y_scale", "Y_zero_point")]
    model = node_model("QLinearSigmoid", inputs, [np.uint8], node_name="bad_node",
                       shapes={"X_scale": ["K"]})
    with pytest.raises(MixrtError, match="bad_node") as caught:
        mixrt.Session(model).run(None, feeds_of(inputs))
    assert "X_scale" in str(caught.value)


# -- QAttention ---------------------------------------------------------------------------------

def qattention_inputs(weight_dtype, mask_kind, past_length, per_column):
    batch, seq, features, heads, head_size = 2, 5, 16, 2, 4
    hidden, total = heads * head_size, seq + past_length
    masks = {"none": None,
             "lengths": np.array([total, total - 2], np.int32),
             "ends_and_starts": np.array([total, total - 1, 0, 1], np.int32),
             "2d": (rng.random((batch, total)) > 0.3).astype(np.int32),
             "3d": (rng.random((batch, seq, total)) > 0.3).astype(np.int32)}
    past = rng.standard_normal((2, batch, heads, past_length, head_size)).astype(f32) \
        if past_length else None
    weight_scale = rng.uniform(0.01, 0.03, 3 * hidden).astype(f32) if per_column \
        else scalar(0.02)
    return [("input", codes(np.uint8, (batch, seq, features))),
            ("weight", weight_codes(weight_dtype, (features, 3 * hidden))),
            ("bias", rng.standard_normal(3 * hidden).astype(f32)),
            ("input_scale", scalar(0.02)), ("weight_scale", weight_scale),
            ("mask_index", masks[mask_kind]), ("input_zero_point", a_zero_point(np.uint8)),
            ("weight_zero_point", a_zero_point(weight_dtype)), ("past", past)]


@pytest.mark.parametrize("weight_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("mask_kind", ["none", "lengths", "ends_and_starts", "2d", "3d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("past_length", [0, 3])
def test_qattention_matches_onnxruntime(weight_dtype, mask_kind, unidirectional, past_length):
    inputs = qattention_inputs(weight_dtype, mask_kind, past_length,
                               per_column=mask_kind != "none")
    outputs = [f32, f32] if past_length else [f32]
    model = node_model("QAttention", inputs, outputs, num_heads=2,
                       unidirectional=unidirectional, constants=("weight", "bias"))
    assert_same(*run_both(model, feeds_of(inputs, ("weight", "bias"))), rtol=1e-5, atol=3e-6)


def float_attention(features=16, heads=2):
    weights = [weight("w", (features, 3 * features), 0.3, 1), weight("b", (3 * features,), 0.1, 2)]
    node = helper.make_node("Attention", ["x", "w", "b", "lengths"], ["y"], domain=MS,
                            num_heads=heads)
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", features]),
         helper.make_tensor_value_info("lengths", TensorProto.INT32, ["B"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=weights)
    return helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


@pytest.mark.parametrize("weight_type", [QuantType.QInt8, QuantType.QUInt8])
def test_quantize_dynamic_attention_runs_as_in_onnxruntime(tmp_path, weight_type):
    """quantize_dynamic turns a com.microsoft Attention into DynamicQuantizeLinear and
    QAttention."""
    source, target = tmp_path / "attention.onnx", tmp_path / "attention.quant.onnx"
    source.write_bytes(float_attention().SerializeToString())
    quantize_dynamic(str(source), str(target), weight_type=weight_type)
    assert (MS, "QAttention") in op_types(target)
    feeds = {"x": np.random.default_rng(14).standard_normal((2, 5, 16)).astype(f32),
             "lengths": np.array([5, 3], np.int32)}
    theirs = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert_same(mixrt.Session(str(target)).run(None, feeds), theirs, rtol=1e-5, atol=3e-6)


def test_qattention_shapes_and_bad_weight_scale():
    inputs = qattention_inputs(np.int8, "lengths", 3, per_column=True)
    shapes = {"input": ["B", "S", 16], "mask_index": ["B"], "past": [2, "B", 2, "P", 4]}
    model = node_model("QAttention", inputs, [f32, f32], num_heads=2, shapes=shapes,
                       constants=("weight", "bias", "input_scale", "weight_scale",
                                  "input_zero_point", "weight_zero_point"))
    output, present = inferred_outputs(model)
    assert (output.dtype, output.shape) == (np.dtype(f32), ("B", "S", 8))
    assert present.shape[:3] == (2, "B", 2) and present.shape[4] == 4
    bad = [(n, v[:5] if n == "weight_scale" else v) for n, v in inputs]
    with pytest.raises(MixrtError, match="weight_scale has shape \\(5,\\)") as caught:
        mixrt.Session(node_model("QAttention", bad, [f32, f32], num_heads=2,
                                 node_name="bad_node")).run(None, feeds_of(bad))
    assert "bad_node" in str(caught.value)


# -- the GPU computes what the CPU does --------------------------------------------------------

def gpu_cases():
    """Every op of shape_cases (int4 aside: no narrow types on a GPU), and QAttention."""
    cases = [(op_type, inputs, [dtype], attrs)
             for op_type, inputs, _, attrs, (dtype, _) in shape_cases()]
    attention = qattention_inputs(np.int8, "lengths", 3, per_column=True)
    return cases + [("QAttention", attention, [f32, f32], {"num_heads": 2})]


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("case", gpu_cases(), ids=lambda case: case[0])
def test_the_gpu_computes_what_the_cpu_does(case):
    op_type, inputs, out_dtypes, attrs = case
    model = node_model(op_type, inputs, out_dtypes, **attrs).SerializeToString()
    feeds = feeds_of(inputs)
    on_cpu = mixrt.Session(model).run(None, feeds)
    on_gpu = mixrt.Session(model, device="gpu:0").run(None, feeds)
    assert_same(on_gpu, on_cpu, rtol=1e-5, atol=1e-5)
