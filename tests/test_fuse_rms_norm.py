"""The RMS normalization pass: Llama's spellings become one SimplifiedLayerNormalization with
the unfused graph's results, and near misses stay as they are."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt  # noqa: F401  (registers the ONNX loader)
from mixrt.runtime.passes import optimize
from mixrt.runtime.session import Session, load_graph

RNG = np.random.default_rng(3)
HIDDEN = 32


def rms_graph(square="Pow", inverse="Div", axes=(-1,), epsilon=1e-6):
    c = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]) if square == "Pow"
             else helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["mean"], axes=list(axes), keepdims=1),
             helper.make_node("Add", ["mean", "eps"], ["var"]),
             helper.make_node("Sqrt", ["var"], ["root"])]
    if inverse == "Div":
        nodes += [helper.make_node("Div", ["one", "root"], ["inv"]),
                  helper.make_node("Mul", ["x", "inv"], ["n"])]
    elif inverse == "Reciprocal":
        nodes += [helper.make_node("Reciprocal", ["root"], ["inv"]),
                  helper.make_node("Mul", ["inv", "x"], ["n"])]
    else:
        nodes += [helper.make_node("Div", ["x", "root"], ["n"])]
    nodes.append(helper.make_node("Mul", ["w", "n"], ["y"]))
    weight = RNG.standard_normal(HIDDEN).astype(np.float32)
    graph = helper.make_graph(
        nodes, "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, HIDDEN])],
        [c("two", 2.0), c("eps", epsilon), c("one", 1.0), c("w", weight)])
    return load_graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def ops(graph):
    return Counter(node.op_type for node in graph.nodes)


@pytest.mark.parametrize("square, inverse", [("Pow", "Div"), ("Mul", "Reciprocal"),
                                             ("Pow", "DivX")])
def test_rms_norm_fuses_to_one_node_with_the_unfused_results(square, inverse):
    graph = rms_graph(square, inverse)
    fused = optimize(graph, 2)
    assert ops(fused) == {"SimplifiedLayerNormalization": 1}
    x = RNG.standard_normal((2, 5, HIDDEN)).astype(np.float32)
    x[0, 0] *= 1e4  # large and tiny rows: the epsilon matters in one
    x[0, 1] *= 1e-4
    x[1, 0] = 0.0
    want = Session(graph, opt_level=0).run(None, {"x": x})[0]
    got = Session(fused, opt_level=0).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    x[1, 1, 3] = np.nan  # NaN spreads over its own row only, as unfused
    got, want = (Session(g, opt_level=0).run(None, {"x": x})[0] for g in (fused, graph))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


def test_other_axes_stay_unfused():
    assert "SimplifiedLayerNormalization" not in ops(optimize(rms_graph(axes=(1,)), 2))
