"""QLinearConv and QLinearMatMul requantize their exact integer sums as onnxruntime's
MlasRequantizeOutput does (ops/quant/quantize.py, requantize_sum): the sum in float32 times the
float32 multiplier ``x_scale * w_scale / y_scale``, rounded half to even. Checked against
onnxruntime with its graph optimizations off.

The scales put a quarter of the outputs exactly on .5 in real arithmetic: 0.025 * 0.005 / 0.05
is 1/400, and the sums run over 100 * (code - 128) + 200. Rounded to float32 the multiplier
lands just above 1/400, so those outputs round away from zero; the same steps in float64 round
them the other way. A QOperator RegNet (regnet_y_400mf) had 3 of one layer's 81,536 codes one
apart from onnxruntime for this, and its logits a whole output code apart."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.quant import quantize_cpu
from mixrt.ops.quant.quantize import qlinear_conv, qlinear_matmul

F32 = np.float32
CODES = np.arange(256, dtype=np.uint8)  # every uint8 code; 128 is the zero point


def one_node_model(op_type, feed_name, feed, constants, opset):
    """``op_type`` reading the feed and then ``constants`` (initializers), in that order."""
    node = helper.make_node(op_type, [feed_name, *constants], ["y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(feed_name, TensorProto.UINT8, feed.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        initializer=[numpy_helper.from_array(value, name) for name, value in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def onnxruntime_unoptimized(model, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def float64_codes(total, x_scale, w_scale, y_scale, zero_point):
    """What the same requantization gives in float64 (the kernels' arithmetic before)."""
    real = total * (np.float64(x_scale) * w_scale.astype(np.float64)) / np.float64(y_scale)
    return np.clip(np.rint(real) + zero_point, 0, 255)


def conv_constants():
    # channel 0 and 1 land on ties, channel 2 (an odd weight and scale) on none
    return dict(x_scale=np.array(F32(0.025)), x_zero_point=np.array(np.uint8(128)),
                w=np.array([100, -100, 37], np.int8).reshape(3, 1, 1, 1),
                w_scale=np.array([0.005, 0.005, 0.003], F32), w_zero_point=np.zeros(3, np.int8),
                y_scale=np.array(F32(0.05)), y_zero_point=np.array(np.uint8(128)),
                B=np.array([200, -200, 11], np.int32))


def test_qlinear_conv_requantizes_in_float32_as_onnxruntime():
    x = CODES.reshape(1, 1, 16, 16)
    constants = conv_constants()
    expected = onnxruntime_unoptimized(one_node_model("QLinearConv", "x", x, constants, 17),
                                       {"x": x})
    total = (x.astype(np.int64) - 128) * constants["w"].astype(np.int64).reshape(1, 3, 1, 1) \
        + constants["B"].reshape(1, 3, 1, 1)
    in_float64 = float64_codes(total, F32(0.025), constants["w_scale"].reshape(1, 3, 1, 1),
                               F32(0.05), 128)
    assert np.count_nonzero(in_float64 != expected) == 128  # the ties of channels 0 and 1

    params = list(constants.values())
    got = mixrt.Session(one_node_model("QLinearConv", "x", x, constants, 17)).run(
        None, {"x": x})[0]
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(qlinear_conv(np, x, *params), expected)
    node: dict = {}
    for _ in range(2):  # the CPU form, then again from the node's centred weights
        np.testing.assert_array_equal(quantize_cpu.qlinear_conv_cpu(np, x, *params, _node=node),
                                      expected)
    assert "qlinear_conv" in node


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize("b_scale", [np.array(F32(0.005)), np.array([0.005, 0.005, 0.003], F32)],
                         ids=["per_tensor", "per_column"])
def test_qlinear_matmul_requantizes_in_float32_as_onnxruntime(opset, b_scale):
    a = CODES.reshape(256, 1)
    constants = dict(a_scale=np.array(F32(0.025)), a_zero_point=np.array(np.uint8(128)),
                     b=np.array([[100, -100, 37]], np.int8), b_scale=b_scale,
                     b_zero_point=np.zeros(b_scale.shape, np.int8),
                     y_scale=np.array(F32(0.05)), y_zero_point=np.array(np.uint8(128)))
    model = one_node_model("QLinearMatMul", "a", a, constants, opset)
    expected = onnxruntime_unoptimized(model, {"a": a})
    total = (a.astype(np.int64) - 128) @ constants["b"].astype(np.int64)
    assert np.count_nonzero(float64_codes(total, F32(0.025), b_scale, F32(0.05), 128)
                            != expected) == 128

    np.testing.assert_array_equal(mixrt.Session(model).run(None, {"a": a})[0], expected)
    np.testing.assert_array_equal(qlinear_matmul(np, a, *constants.values()), expected)
