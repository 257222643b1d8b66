"""runtime/passes/dead_taps.py: Conv taps that only read padding are dropped at opt_level 2,
and the outputs stay what onnxruntime and the untouched graph compute."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.runtime.passes import optimize
from mixrt.runtime.session import load_graph

RNG = np.random.default_rng(5)


def conv_model(path, image, weight, **attributes):
    """y = Conv(x, w, b) + c, c from an If whose branches are Constant nodes (nodes without
    inputs, in subgraphs, which the pass must pass over: SSDlite's Loop body has one)."""
    inputs = ["x", "w", "b"]
    initializers = [numpy_helper.from_array(weight, "w"),
                    numpy_helper.from_array(RNG.standard_normal(weight.shape[0])
                                            .astype(np.float32), "b"),
                    numpy_helper.from_array(np.array(True), "flag")]
    branches = {}
    for branch, value in (("then_branch", 0.25), ("else_branch", -1.0)):
        branches[branch] = helper.make_graph(
            [helper.make_node("Constant", [], [f"{branch}_c"], value=numpy_helper.from_array(
                np.array(value, np.float32)))], branch, [],
            [helper.make_tensor_value_info(f"{branch}_c", TensorProto.FLOAT, [])])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["c"], **branches),
         helper.make_node("Conv", inputs, ["z"], **attributes),
         helper.make_node("Add", ["z", "c"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, image)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return str(path)


def the_conv(path):
    graph = optimize(load_graph(path), 2)
    return next(n for n in graph.nodes if n.op_type in ("Conv", "FusedConv")), graph


def outputs(path, image):
    x = RNG.standard_normal(image).astype(np.float32)
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return (mixrt.Session(path).run(None, {"x": x})[0],
            mixrt.Session(path, opt_level=0).run(None, {"x": x})[0], expected[0])


CASES = [  # image, weight, attributes, the kernel left
    ((1, 8, 14, 14), (6, 8, 3, 3), dict(dilations=[36, 36], pads=[36, 36, 36, 36]), [1, 1]),
    ((1, 8, 14, 14), (6, 8, 3, 3), dict(dilations=[24, 24], pads=[24, 24, 24, 24]), [1, 1]),
    ((1, 8, 14, 14), (6, 8, 3, 3), dict(dilations=[12, 12], pads=[12, 12, 12, 12]), [3, 3]),
    ((1, 4, 9, 20), (5, 4, 5, 3), dict(dilations=[4, 1], pads=[8, 1, 3, 1]), [3, 3]),
    ((2, 6, 10, 10), (6, 2, 3, 3), dict(dilations=[9, 2], pads=[9, 2, 9, 2], group=3,
                                         strides=[2, 1]), [2, 3]),
    ((1, 3, 7, 7), (4, 3, 3, 3), dict(pads=[5, 5, 5, 5], strides=[3, 3]), [3, 3]),
]


@pytest.mark.parametrize("image, weight_shape, attributes, kernel", CASES)
def test_dead_taps_are_dropped_and_the_outputs_stay(tmp_path, image, weight_shape,
                                                    attributes, kernel):
    weight = RNG.standard_normal(weight_shape).astype(np.float32)
    path = conv_model(tmp_path / "conv.onnx", image, weight, **attributes)
    node, graph = the_conv(path)
    assert list(graph.initializers[node.inputs[1]].shape[2:]) == kernel
    fast, plain, expected = outputs(path, image)
    assert fast.shape == plain.shape == expected.shape
    np.testing.assert_allclose(fast, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)


def test_a_dropped_tap_that_is_not_finite_keeps_the_kernel(tmp_path):
    weight = RNG.standard_normal((6, 8, 3, 3)).astype(np.float32)
    weight[0, 0, 0, 0] = np.inf  # times the padding's zeros: NaN, which must stay
    path = conv_model(tmp_path / "conv.onnx", (1, 8, 14, 14), weight, dilations=[36, 36],
                      pads=[36, 36, 36, 36])
    node, graph = the_conv(path)
    assert graph.initializers[node.inputs[1]].shape == (6, 8, 3, 3)
    fast, plain, _ = outputs(path, (1, 8, 14, 14))
    # the spec's zero padding times inf: NaN (onnxruntime skips padded taps and gives numbers)
    assert np.isnan(fast[0, 0]).all() and np.isnan(plain[0, 0]).all()


def test_an_image_of_unknown_size_keeps_the_kernel(tmp_path):
    weight = RNG.standard_normal((6, 8, 3, 3)).astype(np.float32)
    path = conv_model(tmp_path / "conv.onnx", (1, 8, "h", "w"), weight, dilations=[36, 36],
                      pads=[36, 36, 36, 36])
    node, graph = the_conv(path)
    assert graph.initializers[node.inputs[1]].shape == (6, 8, 3, 3)
