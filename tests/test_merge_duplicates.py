"""runtime/passes/merge_duplicates.py: a node that repeats an earlier one's op, attributes and
inputs (constants compared by value where small) is merged into it at opt_level 1; random
ops, graph outputs and nodes with subgraphs are not; the outputs stay what onnxruntime and
the untouched graph compute."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.runtime.passes import optimize
from mixrt.runtime.passes.merge_duplicates import MAX_VALUE_BYTES
from mixrt.runtime.session import load_graph

RNG = np.random.default_rng(17)


def constant(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def save(path, nodes, initializers, outputs=("y",), inputs=None):
    inputs = inputs or [helper.make_tensor_value_info("mask", TensorProto.BOOL, ["n", 5]),
                        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5])]
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                               for o in outputs], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(model.SerializeToString())
    return str(path)


def layers_model(path):
    """Three layers each turning the same mask into the same bias (constants copied per
    layer, as exporters write them), one layer's copy with another fill value."""
    nodes, initializers, x = [], [], "x"
    for layer, low in enumerate((-1e4, -1e4, -1e4, -5.0)):
        initializers += [constant(f"zero{layer}", 0.0), constant(f"low{layer}", low)]
        nodes += [helper.make_node("Where", ["mask", f"zero{layer}", f"low{layer}"],
                                   [f"bias{layer}"]),
                  helper.make_node("Add", [x, f"bias{layer}"], [f"h{layer}"]),
                  helper.make_node("Tanh", [f"h{layer}"], [f"t{layer}"])]
        x = f"t{layer}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    return save(path, nodes, initializers)


def feeds():
    return {"mask": RNG.random((3, 5)) < 0.5,
            "x": RNG.standard_normal((3, 5)).astype(np.float32)}


def test_a_repeated_mask_bias_is_computed_once_with_the_same_outputs(tmp_path):
    path = layers_model(tmp_path / "layers.onnx")
    stats = {}
    graph = optimize(load_graph(path), 1, stats)
    wheres = [n for n in graph.nodes if n.op_type == "Where"]
    assert len(wheres) == 2  # the three equal ones as one, the other fill value apart
    assert stats["merge_duplicates"] == 2
    assert not any(name.startswith(("zero1", "zero2", "low1", "low2"))
                   for name in graph.initializers)  # read by nothing, pruned
    x = feeds()
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, x)[0]
    for level in (0, 1, 2):
        got = mixrt.Session(path, opt_level=level).run(None, x)[0]
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert np.array_equal(mixrt.Session(path, opt_level=1).run(None, x)[0],
                          mixrt.Session(path, opt_level=0).run(None, x)[0])


def test_large_constants_are_told_apart_by_name_and_equal_names_merge(tmp_path):
    big = RNG.standard_normal(MAX_VALUE_BYTES // 4 + 1).astype(np.float32)
    nodes = [helper.make_node("Add", ["v", "big_a"], ["a"]),
             helper.make_node("Add", ["v", "big_b"], ["b"]),  # equal bytes, another name
             helper.make_node("Add", ["v", "big_a"], ["c"]),  # the first again
             helper.make_node("Sum", ["a", "b", "c"], ["y"])]
    path = save(tmp_path / "big.onnx", nodes,
                [constant("big_a", big), constant("big_b", big)],
                inputs=[helper.make_tensor_value_info("v", TensorProto.FLOAT, [big.size])])
    graph = optimize(load_graph(path), 1)
    assert [n.op_type for n in graph.nodes].count("Add") == 2
    v = RNG.standard_normal(big.size).astype(np.float32)
    assert np.array_equal(mixrt.Session(path).run(None, {"v": v})[0], 3 * (v + big))


def test_random_ops_graph_outputs_and_other_attributes_are_left_apart(tmp_path):
    nodes = [helper.make_node("RandomUniformLike", ["x"], ["r1"], seed=3.0),
             helper.make_node("RandomUniformLike", ["x"], ["r2"], seed=3.0),
             helper.make_node("Neg", ["x"], ["y"]),
             helper.make_node("Neg", ["x"], ["z"]),  # a graph output of its own
             helper.make_node("LeakyRelu", ["x"], ["l1"], alpha=0.1),
             helper.make_node("LeakyRelu", ["x"], ["l2"], alpha=0.2),
             helper.make_node("Sum", ["r1", "r2", "l1", "l2"], ["s"])]
    path = save(tmp_path / "apart.onnx", nodes, [], outputs=("y", "z", "s"))
    graph = optimize(load_graph(path), 1)
    kinds = [n.op_type for n in graph.nodes]
    assert kinds.count("RandomUniformLike") == 2
    assert kinds.count("Neg") == 2
    assert kinds.count("LeakyRelu") == 2
    assert set(graph.output_names) == {"y", "z", "s"}


def test_mxnets_samplers_are_random_draws_neither_merged_nor_folded(tmp_path):
    """Two SampleUniform nodes (mixrt's MXNet samplers) over the same constant parameters are
    two draws: neither merged into one nor folded into a constant at load."""
    low, high = constant("low", np.zeros(64)), constant("high", np.ones(64))
    nodes = [helper.make_node("SampleUniform", ["low", "high"], ["a"], domain="mixrt"),
             helper.make_node("SampleUniform", ["low", "high"], ["b"], domain="mixrt"),
             helper.make_node("Sub", ["a", "b"], ["d"]),
             helper.make_node("Add", ["d", "x"], ["y"])]
    graph = helper.make_graph(
        nodes, "draws", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [low, high])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("mixrt", 1)])
    path = tmp_path / "draws.onnx"
    path.write_bytes(model.SerializeToString())
    optimized = optimize(load_graph(str(path)), 2)
    assert [n.op_type for n in optimized.nodes].count("SampleUniform") == 2
    x = np.zeros(64, np.float32)
    session = mixrt.Session(str(path))
    first, second = (session.run(None, {"x": x})[0] for _ in range(2))
    assert np.any(first != 0) and np.any(first != second)  # two draws, new each run



def test_long_list_and_large_array_attributes_are_not_compared():
    """A node whose attributes hold a long list (a tree ensemble's node lists hold 10^5
    numbers) or a large array is left as it is, rather than compared element by element
    in each round of the exact passes; short ones are compared."""
    from mixrt.runtime.passes.merge_duplicates import MAX_LIST, _frozen, _Unkeyable
    assert _frozen(list(range(MAX_LIST))) == _frozen(list(range(MAX_LIST)))
    for value in (list(range(MAX_LIST + 1)), np.zeros(MAX_VALUE_BYTES + 1, np.uint8)):
        with pytest.raises(_Unkeyable):
            _frozen(value)
