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
