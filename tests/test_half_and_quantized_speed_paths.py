"""The float16-in-float32 pass (runtime/passes/half_regions.py) and the fused integer
products of dynamically quantized models: each gives what the graph as written gives."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.runtime.passes import optimize
from mixrt.runtime.session import load_graph

F16, F32 = np.float16, np.float32


def _model(nodes, inputs, outputs, initializers, opset=17, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              initializer=[numpy_helper.from_array(v, n)
                                           for n, v in initializers.items()])
    return helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", opset), *extra_opsets]).SerializeToString()


def _both(data, feeds):
    exact = mixrt.Session(data, opt_level=0).run(None, feeds)
    fast = mixrt.Session(data, opt_level=2).run(None, feeds)
    return exact, fast


# -- float16 graphs ------------------------------------------------------------------------

def _half_convnet(io_type):
    rng = np.random.default_rng(0)
    weights = {"w": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(F16),
               "b": rng.standard_normal(8).astype(F16),
               "s": np.array(1.5, F16)}
    nodes = []
    x = "x"
    if io_type == TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16))
        x = "xh"
    nodes += [helper.make_node("Conv", [x, "w", "b"], ["c"], pads=[1, 1, 1, 1]),
              helper.make_node("Sigmoid", ["c"], ["sg"]),
              helper.make_node("Mul", ["c", "sg"], ["m"]),
              helper.make_node("Mul", ["m", "s"], ["ms"]),
              helper.make_node("GlobalAveragePool", ["ms"], ["p"])]
    last = "p"
    if io_type == TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["p"], ["y"], to=TensorProto.FLOAT))
        last = "y"
    nodes.append(helper.make_node("Relu", ["ms"], ["r"]))
    outputs = [helper.make_tensor_value_info(last, io_type, None),
               helper.make_tensor_value_info("r", TensorProto.FLOAT16, None)]
    return _model(nodes, [helper.make_tensor_value_info("x", io_type, [1, 3, 10, 12])],
                  outputs, weights)


@pytest.mark.parametrize("io_type", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_half_graph_keeps_output_dtypes_within_float16_tolerance(io_type):
    data = _half_convnet(io_type)
    dtype = F32 if io_type == TensorProto.FLOAT else F16
    x = np.random.default_rng(1).standard_normal((1, 3, 10, 12)).astype(dtype)
    exact, fast = _both(data, {"x": x})
    for a, b in zip(exact, fast):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(b.astype(F32), a.astype(F32), rtol=2e-2, atol=2e-2)


def test_half_graph_computes_in_float32():
    graph = optimize(load_graph(_half_convnet(TensorProto.FLOAT)))
    assert {a.dtype for a in graph.initializers.values()} == {np.dtype(F32)}
    casts = [n for n in graph.nodes if n.op_type == "Cast"]
    # only the float16 output "r" is rounded; the float32 input and output need no Cast
    assert [(n.outputs, n.attributes["to"]) for n in casts] == [(["r"], TensorProto.FLOAT16)]


def test_half_graph_with_unknown_op_is_left_alone():
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Bernoulli", ["h"], ["y"], seed=1.0)]
    data = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], {})
    graph = optimize(load_graph(data))
    assert [n.attributes.get("to") for n in graph.nodes if n.op_type == "Cast"] == \
        [TensorProto.FLOAT16]


# -- exact integer products ----------------------------------------------------------------

@pytest.mark.parametrize("k", [7, 300, 1000, 1537])
def test_exact_integer_product_matches_integer_matmul(k):
    from mixrt.ops.quant.quantize import exact_integer_product
    rng = np.random.default_rng(k)
    # worst-case magnitudes: the row sums pass 2**24 / 128, so K is cut into chunks (and the
    # last chunk is shorter when K is not a multiple of the chunk)
    a = rng.choice([-255, 255], (3, 5, k)).astype(F32)
    b = rng.choice([-128, 127], (k, 9)).astype(F32)
    want = a.astype(np.int64) @ b.astype(np.int64)
    got = exact_integer_product(np, a, b)
    np.testing.assert_array_equal(got.astype(np.int64), want)


def _dynamic_layer(k, n, bias_first):
    rng = np.random.default_rng(k + n)
    weights = {"B": rng.integers(-128, 128, (k, n)).astype(np.int8),
               "b_scale": np.array(0.013, F32), "b_zero": np.array(0, np.int8),
               "bias": rng.standard_normal(n).astype(F32)}
    add_inputs = ["bias", "m"] if bias_first else ["m", "bias"]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "a_scale", "a_zero"]),
             helper.make_node("Mul", ["a_scale", "b_scale"], ["s"]),
             helper.make_node("MatMulInteger", ["q", "B", "a_zero", "b_zero"], ["i"]),
             helper.make_node("Cast", ["i"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("Add", add_inputs, ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, k])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)


@pytest.mark.parametrize("k,n,bias_first", [(64, 40, True), (700, 96, False), (1100, 33, True)])
def test_dynamic_quantized_layer_fuses_and_equals_the_chain(k, n, bias_first):
    data = _dynamic_layer(k, n, bias_first)
    graph = optimize(load_graph(data))
    assert [n.op_type for n in graph.nodes].count("MatMulIntegerToFloat") == 1
    for seed in range(3):
        x = (np.random.default_rng(seed).standard_normal((1, 6, k)) * 4).astype(F32)
        exact, fast = _both(data, {"x": x})
        np.testing.assert_array_equal(fast[0], exact[0])


def test_matmul_integer_with_constant_weight_is_exact():
    rng = np.random.default_rng(5)
    weights = {"B": rng.integers(0, 256, (900, 20)).astype(np.uint8),
               "b_zero": np.array(3, np.uint8)}
    nodes = [helper.make_node("MatMulInteger", ["a", "B", "a_zero", "b_zero"], ["y"])]
    data = _model(nodes, [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 900]),
                          helper.make_tensor_value_info("a_zero", TensorProto.UINT8, [])],
                  [helper.make_tensor_value_info("y", TensorProto.INT32, None)], weights)
    a = rng.integers(0, 256, (4, 900)).astype(np.uint8)
    zero = np.array(250, np.uint8)
    session = mixrt.Session(data)
    for _ in range(2):  # the second run reads the kept weight
        got = session.run(None, {"a": a, "a_zero": zero})[0]
        want = (a.astype(np.int64) - 250) @ (weights["B"].astype(np.int64) - 3)
        np.testing.assert_array_equal(got, want.astype(np.int32))
