"""The optimizer: each pass fires on a small graph built to exercise it and leaves the
outputs as they were (bit for bit at level 1, to rounding at level 2); the 9 light zoo
models still match their reference outputs at levels 1 and 2."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt  # noqa: F401  (registers the ONNX loader)
from mixrt.errors import GraphError
from mixrt.models.zoo import LIGHT_MODELS, light_model
from mixrt.runtime.graph import Graph
from mixrt.runtime.passes import optimize
from mixrt.runtime.session import Session, load_graph

RNG = np.random.default_rng(7)
F = TensorProto.FLOAT


# -- building and checking -------------------------------------------------------------------

def graph_of(nodes, inputs, outputs, initializers=(), opset=17, ir_version=None,
             value_info=(), ml_opset=None) -> Graph:
    """A Graph from onnx helper pieces; ``inputs``/``outputs`` are (name, shape) pairs or
    ValueInfoProtos; initializers are name -> array."""
    values, results = [_value(v) for v in inputs], [_value(v) for v in outputs]
    tensors = [numpy_helper.from_array(a, n) for n, a in dict(initializers).items()]
    graph = helper.make_graph(nodes, "g", values, results, tensors, value_info=value_info)
    opsets = [helper.make_opsetid("", opset)] + \
        ([helper.make_opsetid("ai.onnx.ml", ml_opset)] if ml_opset else [])
    model = helper.make_model(graph, opset_imports=opsets)
    imported = load_graph(model)
    if ir_version is not None:
        imported.metadata["ir_version"] = ir_version
    return imported


def _value(v):
    """(name, shape) or (name, shape, element type) -> ValueInfoProto (float by default)."""
    if not isinstance(v, tuple):
        return v
    name, shape, elem_type = (*v, F) if len(v) == 2 else v
    return helper.make_tensor_value_info(name, elem_type, shape)


def rand(*shape, low=-2.0, high=2.0):
    return RNG.uniform(low, high, shape).astype(np.float32)


def run(graph: Graph, feeds: dict) -> list[np.ndarray]:
    """The graph's outputs, computed as the graph says (an optimized graph carries its
    opt_level, so Session runs it as it is; a plain one is run at level 0)."""
    return Session(graph, opt_level=0).run(None, feeds)


def checked(graph: Graph, feeds: dict, level: int, **tolerance) -> Graph:
    """The graph optimized at ``level``, after checking it computes what the original does
    (exactly at level 1)."""
    before = [repr(n) for n in graph.nodes], dict(graph.initializers)
    optimized = optimize(graph, level)
    assert [repr(n) for n in graph.nodes] == before[0], "optimize changed its input graph"
    assert graph.initializers.keys() == before[1].keys()
    assert optimized.metadata["opt_level"] == level
    assert optimized.output_names == graph.output_names
    expected, actual = run(graph, feeds), run(optimized, feeds)
    for want, got in zip(expected, actual):
        assert got.dtype == want.dtype and got.shape == want.shape
        if level <= 1:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, **({"rtol": 1e-5, "atol": 1e-5} | tolerance))
    return optimized


def ops(graph: Graph) -> Counter:
    return Counter(n.op_type for n in graph.all_nodes())


def node(op_type, inputs, outputs, **attributes):
    return helper.make_node(op_type, inputs, outputs, **attributes)


def const(name, array):
    return node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array)))


# -- levels and the copy ---------------------------------------------------------------------

def test_level_zero_is_an_untouched_copy():
    g = graph_of([node("Identity", ["x"], ["y"])], [("x", [2])], [("y", [2])])
    copy = optimize(g, 0)
    assert copy is not g and copy.nodes[0] is not g.nodes[0]
    assert ops(copy) == {"Identity": 1} and copy.metadata["opt_level"] == 0


def test_unknown_level_is_a_graph_error():
    g = graph_of([node("Identity", ["x"], ["y"])], [("x", [2])], [("y", [2])])
    with pytest.raises(GraphError, match="level must be one of"):
        optimize(g, 3)


# -- constant folding -------------------------------------------------------------------------

def test_constant_subexpressions_fold_into_initializers():
    w = rand(3)
    g = graph_of([const("c", np.float32([1, 2, 3])),
                  node("Mul", ["c", "w"], ["cw"]),
                  node("Exp", ["cw"], ["e"]),
                  node("Add", ["x", "e"], ["y"])],
                 [("x", [2, 3])], [("y", [2, 3])], {"w": w})
    optimized = checked(g, {"x": rand(2, 3)}, 1)
    assert ops(optimized) == {"Add": 1}
    assert set(optimized.initializers) == {"e"}  # the consumed constants are gone too


def test_initializer_that_is_also_an_input_is_not_folded():
    w = rand(3)
    nodes = [node("Exp", ["w"], ["e"]), node("Add", ["x", "e"], ["y"])]
    inputs = [("x", [3]), ("w", [3])]
    overridable = graph_of(nodes, inputs, [("y", [3])], {"w": w}, ir_version=8)
    assert ops(checked(overridable, {"x": rand(3)}, 1)) == {"Exp": 1, "Add": 1}
    unknown = graph_of(nodes, inputs, [("y", [3])], {"w": w})
    assert ops(optimize(unknown, 1)) == {"Exp": 1, "Add": 1}
    # before IR 4 every initializer was listed as an input: there they are constants
    old = graph_of(nodes, inputs, [("y", [3])], {"w": w}, ir_version=3)
    folded = checked(old, {"x": rand(3)}, 1)
    assert ops(folded) == {"Add": 1}
    assert [v.name for v in folded.inputs] == ["x"]


def test_random_ops_and_graph_outputs_do_not_fold():
    g = graph_of([node("RandomNormal", [], ["r"], shape=[3], seed=1.0),
                  node("Add", ["x", "r"], ["y"]),
                  const("k", np.float32([4.0])),
                  node("Neg", ["k"], ["z"])],
                 [("x", [3])], [("y", [3]), ("z", [1])])
    optimized = optimize(g, 1)
    assert ops(optimized) == {"RandomNormal": 1, "Add": 1, "Neg": 1}
    np.testing.assert_array_equal(run(optimized, {"x": rand(3)})[1], [-4.0])


def test_a_node_whose_kernel_fails_is_left_to_fail_at_run_time():
    g = graph_of([const("s", np.int64([5])), node("Reshape", ["c", "s"], ["r"]),
                  const("c", np.float32([1, 2, 3])), node("Add", ["x", "r"], ["y"])],
                 [("x", [3])], [("y", [3])])
    optimized = optimize(g, 1)
    assert "Reshape" in ops(optimized)


def test_static_shape_and_size_fold_but_symbolic_ones_stay():
    nodes = [node("Shape", ["x"], ["s"]), node("Size", ["x"], ["n"]),
             node("Reshape", ["x", "s"], ["r"]), node("Cast", ["n"], ["nf"], to=F),
             node("Mul", ["r", "nf"], ["y"])]
    static = graph_of(nodes, [("x", [2, 3])], [("y", [2, 3])])
    optimized = checked(static, {"x": rand(2, 3)}, 1)
    assert ops(optimized) == {"Mul": 1}  # Reshape to its own shape went too
    symbolic = graph_of(nodes, [("x", ["n", 3])], [("y", ["n", 3])])
    assert {"Shape", "Size"} <= set(ops(checked(symbolic, {"x": rand(4, 3)}, 1)))


def test_shape_chain_feeding_reshape_folds_to_a_constant_target():
    g = graph_of([node("Shape", ["x"], ["s"]),
                  const("i", np.int64([0])), node("Gather", ["s", "i"], ["b"]),
                  const("rest", np.int64([-1])), node("Concat", ["b", "rest"], ["t"], axis=0),
                  node("Reshape", ["x", "t"], ["y"])],
                 [("x", [2, 3, 4])], [("y", [2, 12])])
    optimized = checked(g, {"x": rand(2, 3, 4)}, 1)
    assert ops(optimized) == {"Reshape": 1}
    assert optimized.initializers[optimized.nodes[0].inputs[1]].tolist() == [2, -1]


def test_shape_of_a_split_sized_at_run_time_is_not_guessed():
    # needs Split's infer to leave the parts' lengths unknown when its sizes are fed
    # (it used to guess equal parts, and folding Shape baked the guess in)
    g = graph_of([node("Split", ["x", "sizes"], ["a", "b"], axis=0),
                  node("Shape", ["a"], ["s"]), const("k", np.float32(2.0)),
                  node("Expand", ["k", "s"], ["e"]), node("Add", ["e", "a"], ["y"])],
                 [("x", [4]), ("sizes", [2], TensorProto.INT64)], [("y", None)])
    optimized = checked(g, {"x": rand(4), "sizes": np.int64([1, 3])}, 1)
    assert "Shape" in ops(optimized)


# -- dead nodes ---------------------------------------------------------------------------------

def test_dead_nodes_and_their_initializers_go():
    g = graph_of([node("Mul", ["x", "w"], ["unused"]), node("Relu", ["unused"], ["dead"]),
                  node("Sigmoid", ["x"], ["y"])],
                 [("x", [4])], [("y", [4])], {"w": rand(4)})
    optimized = checked(g, {"x": rand(4)}, 1)
    assert ops(optimized) == {"Sigmoid": 1} and not optimized.initializers


# -- removal of pass-through nodes ---------------------------------------------------------------

def test_identity_dropout_and_noop_shape_ops_are_removed():
    g = graph_of([node("Identity", ["x"], ["a"]),
                  const("ratio", np.float32(0.3)), node("Dropout", ["a", "ratio"], ["b"]),
                  node("Transpose", ["b"], ["c"], perm=[0, 1]),
                  node("Cast", ["c"], ["d"], to=F),
                  const("shape", np.int64([2, 3])), node("Reshape", ["d", "shape"], ["e"]),
                  node("Expand", ["e", "shape"], ["f"]),
                  node("Relu", ["f"], ["y"])],
                 [("x", [2, 3])], [("y", [2, 3])])
    optimized = checked(g, {"x": rand(2, 3)}, 1)
    assert ops(optimized) == {"Relu": 1}
    assert optimized.nodes[0].inputs == ["x"]


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_flatten_of_a_matrix_at_axis_one_is_removed_whatever_its_dims(axis):
    g = graph_of([node("Flatten", ["x"], ["f"], axis=axis), node("Relu", ["f"], ["y"])],
                 [("x", ["n", "m"])], [("y", None)])
    optimized = checked(g, {"x": rand(2, 3)}, 1)
    # at axis 0, (n, m) becomes (1, n * m): a reshape, which stays
    assert ops(optimized) == ({"Relu": 1} if axis else {"Flatten": 1, "Relu": 1})


def test_a_node_binding_would_reject_is_not_optimized_away():
    g = graph_of([node("Identity", ["x"], ["a"], bogus=1), node("Neg", ["a"], ["y"])],
                 [("x", [2])], [("y", [2])])
    assert ops(optimize(g, 2)) == {"Identity": 1, "Neg": 1}


def test_dropout_stays_when_training_or_mask_is_read():
    training = graph_of([node("Dropout", ["x", "", "t"], ["y"], seed=3)],
                        [("x", [4]), ("t", [], TensorProto.BOOL)], [("y", [4])])
    assert ops(optimize(training, 1)) == {"Dropout": 1}
    off = graph_of([node("Dropout", ["x", "", "t"], ["a"]), node("Neg", ["a"], ["y"])],
                   [("x", [4])], [("y", [4])], {"t": np.array(False)})
    assert ops(checked(off, {"x": rand(4)}, 1)) == {"Neg": 1}
    mask = graph_of([node("Dropout", ["x"], ["y", "m"])], [("x", [4])],
                    [("y", [4]), ("m", [4], TensorProto.BOOL)])
    assert ops(optimize(mask, 1)) == {"Dropout": 1}


def test_removed_node_producing_a_graph_output_keeps_the_output_name():
    g = graph_of([node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["y"]),
                  node("Neg", ["r"], ["z"])],
                 [("x", [3])], [("y", [3]), ("z", [3])])
    optimized = checked(g, {"x": rand(3)}, 1)
    assert ops(optimized) == {"Relu": 1, "Neg": 1}
    assert optimized.nodes[0].outputs == ["y"] and optimized.nodes[1].inputs == ["y"]


def test_pass_through_of_an_input_to_an_output_stays_an_identity():
    g = graph_of([node("Cast", ["x"], ["y"], to=F), node("Identity", ["x"], ["z"])],
                 [("x", [3])], [("y", [3]), ("z", [3])])
    optimized = checked(g, {"x": rand(3)}, 1)
    assert ops(optimized) == {"Identity": 2}


def test_subgraph_outer_reads_follow_a_removed_node():
    then_branch = helper.make_graph([node("Add", ["a", "c"], ["t"])], "then", [],
                                    [helper.make_tensor_value_info("t", F, [3])])
    else_branch = helper.make_graph([node("Sub", ["a", "c"], ["e"])], "else", [],
                                    [helper.make_tensor_value_info("e", F, [3])])
    g = graph_of([node("Identity", ["x"], ["a"]),
                  const("c0", np.float32([1, 2, 3])), node("Neg", ["c0"], ["c"]),
                  node("If", ["cond"], ["y"], then_branch=then_branch,
                       else_branch=else_branch)],
                 [("x", [3]), ("cond", [], TensorProto.BOOL)], [("y", [3])])
    for cond in (True, False):
        optimized = checked(g, {"x": rand(3), "cond": np.array(cond)}, 1)
    assert ops(optimized) == {"If": 1, "Add": 1, "Sub": 1}
    branch = optimized.nodes[0].attributes["then_branch"]
    assert branch.nodes[0].inputs == ["x", "c"] and "c" in optimized.initializers


def test_constants_inside_a_loop_body_fold():
    body = helper.make_graph(
        [const("one", np.float32([1.0])), node("Neg", ["one"], ["m"]),
         node("Add", ["acc", "m"], ["acc2"]), node("Identity", ["keep"], ["keep2"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("keep", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", F, [3])],
        [helper.make_tensor_value_info("keep2", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc2", F, [3])])
    g = graph_of([node("Loop", ["n", "", "x"], ["y"], body=body)],
                 [("n", [], TensorProto.INT64), ("x", [3])], [("y", [3])])
    optimized = checked(g, {"n": np.array(4), "x": rand(3)}, 1)
    assert ops(optimized) == {"Loop": 1, "Add": 1, "Identity": 1}


# -- level 2: Conv + BatchNormalization ------------------------------------------------------------

def _bn_params(channels):
    return {"scale": rand(channels), "bias": rand(channels), "mean": rand(channels),
            "var": rand(channels, low=0.5, high=2.0)}


@pytest.mark.parametrize("group, with_bias", [(1, True), (2, False), (4, True)])
def test_conv_batchnorm_folds_into_the_weights(group, with_bias):
    params = _bn_params(8) | {"W": rand(8, 8 // group, 3, 3)} | ({"B": rand(8)} if with_bias
                                                                 else {})
    conv_inputs = ["x", "W", "B"] if with_bias else ["x", "W"]
    g = graph_of([node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1], group=group),
                  node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"],
                       epsilon=1e-3)],
                 [("x", [2, 8, 5, 5])], [("y", [2, 8, 5, 5])], params)
    optimized = checked(g, {"x": rand(2, 8, 5, 5)}, 2)
    assert ops(optimized) == {"Conv": 1}
    # each folded filter value is the float64 product rounded once to float32
    (conv,) = optimized.nodes
    scale = params["scale"].astype(np.float64) / np.sqrt(params["var"].astype(np.float64)
                                                         + np.float64(np.float32(1e-3)))
    expected = (params["W"].astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
    np.testing.assert_array_equal(optimized.initializers[conv.inputs[1]], expected)


def test_conv_then_per_channel_mul_and_add_fold():
    g = graph_of([node("Conv", ["x", "W"], ["c"]),
                  node("Mul", ["c", "s"], ["m"]), node("Add", ["t", "m"], ["y"])],
                 [("x", [1, 3, 4, 4])], [("y", [1, 4, 4, 4])],
                 {"W": rand(4, 3, 1, 1), "s": rand(4, 1, 1), "t": rand(1, 4, 1, 1)})
    assert ops(checked(g, {"x": rand(1, 3, 4, 4)}, 2)) == {"Conv": 1}


def test_batchnorm_that_is_read_twice_or_trains_is_not_folded():
    params = _bn_params(4) | {"W": rand(4, 3, 1, 1)}
    shared = graph_of([node("Conv", ["x", "W"], ["c"]),
                       node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"]),
                       node("Neg", ["c"], ["z"])],
                      [("x", [1, 3, 2, 2])], [("y", [1, 4, 2, 2]), ("z", [1, 4, 2, 2])], params)
    optimized = checked(shared, {"x": rand(1, 3, 2, 2)}, 2)
    assert "Conv" in ops(optimized) and "BatchNormalization" not in ops(optimized)
    assert "Mul" in ops(optimized) or "FusedElementwise" in ops(optimized)


# -- level 2: products with their followers --------------------------------------------------------

ACTIVATIONS = [
    (node("Relu", ["s"], ["y"]), {}),
    (node("LeakyRelu", ["s"], ["y"], alpha=0.2), {}),
    (node("Sigmoid", ["s"], ["y"]), {}),
    (node("Tanh", ["s"], ["y"]), {}),
    (node("HardSigmoid", ["s"], ["y"], alpha=0.3, beta=0.4), {}),
    (node("HardSwish", ["s"], ["y"]), {}),
    (node("Clip", ["s", "lo", "hi"], ["y"]), {"lo": np.float32(-0.5), "hi": np.float32(0.5)}),
]


@pytest.mark.parametrize("activation, extra", ACTIVATIONS, ids=lambda a: getattr(a, "op_type",
                                                                                  ""))
def test_conv_batchnorm_residual_activation_become_one_fused_conv(activation, extra):
    params = _bn_params(4) | {"W": rand(4, 4, 3, 3)} | extra
    g = graph_of([node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
                  node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"]),
                  node("Add", ["x", "b"], ["s"]), activation],
                 [("x", [1, 4, 6, 6])], [("y", [1, 4, 6, 6])], params)
    optimized = checked(g, {"x": rand(1, 4, 6, 6)}, 2)
    assert ops(optimized) == {"FusedConv": 1}
    fused = optimized.nodes[0]
    assert fused.domain == "mixrt" and optimized.opsets["mixrt"] == 1
    assert fused.attributes["activation"] == activation.op_type
    assert fused.inputs[3] == "x"


@pytest.mark.parametrize("order", [["c", "s"], ["s", "c"]])
def test_conv_then_silu_becomes_a_fused_conv_with_swish(order):
    g = graph_of([node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
                  node("Sigmoid", ["c"], ["s"]), node("Mul", order, ["y"])],
                 [("x", [1, 4, 6, 6])], [("y", [1, 4, 6, 6])], {"W": rand(4, 4, 3, 3)})
    optimized = checked(g, {"x": rand(1, 4, 6, 6)}, 2)
    assert ops(optimized) == {"FusedConv": 1}
    assert optimized.nodes[0].attributes["activation"] == "Swish"


def test_a_sigmoid_read_elsewhere_keeps_silu_apart():
    g = graph_of([node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
                  node("Sigmoid", ["c"], ["s"]), node("Mul", ["c", "s"], ["y"])],
                 [("x", [1, 4, 6, 6])], [("y", [1, 4, 6, 6]), ("s", [1, 4, 6, 6])],
                 {"W": rand(4, 4, 3, 3)})
    assert "FusedConv" not in ops(checked(g, {"x": rand(1, 4, 6, 6)}, 2))


def _reshaped_gemm(transB=0, x_shape=(1, 1, 8)):
    weight = rand(8, 6) if not transB else rand(6, 8)
    return graph_of([node("Reshape", ["x", "flat"], ["a"]),
                     node("Gemm", ["a", "W", "C"], ["g"], transB=transB),
                     node("Reshape", ["g", "back"], ["y0"]),
                     node("Add", ["y0", "x2"], ["y"])],
                    [("x", list(x_shape)), ("x2", [1, 1, 6])], [("y", [1, 1, 6])],
                    {"W": weight, "C": rand(6), "flat": np.array([1, 8], np.int64),
                     "back": np.array([1, 1, 6], np.int64)})


def test_a_reshaped_gemm_becomes_one_fused_matmul_with_its_residual():
    """GPT-2's Conv1D: Reshape to 2-D, Gemm, Reshape back, then the residual Add."""
    optimized = checked(_reshaped_gemm(), {"x": rand(1, 1, 8), "x2": rand(1, 1, 6)}, 2)
    assert ops(optimized) == {"FusedMatMul": 1}
    assert optimized.nodes[0].inputs[0] == "x" and len(optimized.nodes[0].inputs) == 4


def test_a_transposed_gemm_keeps_its_reshapes():
    optimized = checked(_reshaped_gemm(transB=1), {"x": rand(1, 1, 8), "x2": rand(1, 1, 6)},
                        2)
    assert ops(optimized)["Gemm"] + ops(optimized)["FusedGemm"] == 1


def test_residual_that_would_broadcast_the_conv_output_is_not_fused():
    g = graph_of([node("Conv", ["x", "W"], ["c"]), node("Add", ["c", "z"], ["y"])],
                 [("x", [1, 3, 1, 1]), ("z", [2, 4, 1, 1])], [("y", [2, 4, 1, 1])],
                 {"W": rand(4, 3, 1, 1)})
    assert ops(checked(g, {"x": rand(1, 3, 1, 1), "z": rand(2, 4, 1, 1)}, 2)) == \
        {"Conv": 1, "Add": 1}


def test_intermediate_graph_output_blocks_fusion():
    g = graph_of([node("Conv", ["x", "W"], ["c"]), node("Relu", ["c"], ["y"])],
                 [("x", [1, 3, 4, 4])], [("y", [1, 4, 4, 4]), ("c", [1, 4, 4, 4])],
                 {"W": rand(4, 3, 3, 3)})
    assert ops(checked(g, {"x": rand(1, 3, 4, 4)}, 2)) == {"Conv": 1, "Relu": 1}


def test_gemm_and_matmul_fuse_with_bias_and_activation():
    g = graph_of([node("Gemm", ["x", "W", "C"], ["g"], transB=1, alpha=0.5),
                  node("Relu", ["g"], ["h"]),
                  node("MatMul", ["h", "V"], ["m"]), node("Add", ["m", "b"], ["a"]),
                  node("Tanh", ["a"], ["y"])],
                 [("x", [3, 5])], [("y", [3, 2])],
                 {"W": rand(4, 5), "C": rand(4), "V": rand(4, 2), "b": rand(2)})
    optimized = checked(g, {"x": rand(3, 5)}, 2)
    assert ops(optimized) == {"FusedGemm": 1, "FusedMatMul": 1}
    matmul = optimized.nodes[1]
    assert matmul.inputs == ["h", "V", "b"] and matmul.attributes["activation"] == "Tanh"


def test_a_bias_of_one_row_is_fused_as_one_value_a_column():
    """scikit-learn's (1, N) intercepts and a Gemm's (1, N) C become (N,) constants of their
    own (the panels' bias, kept by the rows route); a bias read elsewhere keeps its own."""
    g = graph_of([node("Gemm", ["x", "W", "C"], ["g"], transB=1),
                  node("Relu", ["g"], ["h"]),
                  node("MatMul", ["h", "V"], ["m"]), node("Add", ["m", "b"], ["a"]),
                  node("Relu", ["a"], ["r"]), node("Add", ["r", "b"], ["y"])],
                 [("x", ["n", 5])], [("y", ["n", 2])],
                 {"W": rand(4, 5), "C": rand(1, 4), "V": rand(4, 2), "b": rand(1, 2)})
    optimized = checked(g, {"x": rand(70, 5)}, 2)
    gemm, matmul = (n for n in optimized.nodes if n.op_type.startswith("Fused"))
    for fused, name in ((gemm, "C"), (matmul, "b")):
        column = optimized.initializers[fused.inputs[2]]
        assert fused.inputs[2] != name and column.shape == g.initializers[name].shape[1:]
        np.testing.assert_array_equal(column, g.initializers[name].reshape(-1))
    assert optimized.initializers["b"].shape == (1, 2)  # the last Add's


def test_matmul_bias_and_residual_fuse_but_a_widening_addend_does_not():
    residual = graph_of([node("MatMul", ["x", "V"], ["m"]), node("Add", ["m", "b"], ["a"]),
                         node("Add", ["x", "a"], ["y"])],
                        [("x", ["n", 4])], [("y", ["n", 4])], {"V": rand(4, 4), "b": rand(4)})
    optimized = checked(residual, {"x": rand(3, 4)}, 2)
    assert ops(optimized) == {"FusedMatMul": 1}
    assert optimized.nodes[0].inputs == ["x", "V", "b", "x"]
    widening = graph_of([node("MatMul", ["x", "V"], ["m"]), node("Add", ["m", "z"], ["y"])],
                        [("x", [1, 4]), ("z", [3, 2])], [("y", [3, 2])], {"V": rand(4, 2)})
    assert ops(checked(widening, {"x": rand(1, 4), "z": rand(3, 2)}, 2)) == \
        {"MatMul": 1, "Add": 1}


def test_bias_fuses_over_dims_inference_left_unknown_but_a_residual_needs_them():
    # a Reshape to a runtime shape leaves the product's rows unknown: (?, 3)
    nodes = [node("Reshape", ["x", "shape"], ["r"]), node("MatMul", ["r", "V"], ["m"]),
             node("Add", ["b", "m"], ["a"]), node("Add", ["a", "z"], ["y"])]
    g = graph_of(nodes, [("x", [2, 4]), ("shape", [2], TensorProto.INT64), ("z", ["n", 3])],
                 [("y", ["n", 3])], {"V": rand(4, 3), "b": rand(3)})
    feeds = {"x": rand(2, 4), "shape": np.array([2, 4], np.int64), "z": rand(2, 3)}
    optimized = checked(g, feeds, 2)
    assert ops(optimized) == {"Reshape": 1, "FusedMatMul": 1, "Add": 1}
    fused = next(n for n in optimized.nodes if n.op_type == "FusedMatMul")
    assert fused.inputs == ["r", "V", "b"]  # the bias, not the residual of unknown rows


# -- level 2: elementwise chains -------------------------------------------------------------------

def gelu_nodes(x="x", y="y"):
    """PyTorch's export of GELU: x * 0.5 * (1 + erf(x / sqrt 2)), as it writes it."""
    return [const("sqrt2", np.float32(np.sqrt(2.0))), const("one", np.float32(1.0)),
            const("half", np.float32(0.5)),
            node("Div", [x, "sqrt2"], ["g1"]), node("Erf", ["g1"], ["g2"]),
            node("Add", ["g2", "one"], ["g3"]), node("Mul", [x, "g3"], ["g4"]),
            node("Mul", ["g4", "half"], [y])]


def test_gelu_becomes_one_fused_elementwise_node():
    g = graph_of([node("MatMul", ["x", "W"], ["h"]), node("Add", ["h", "b"], ["a"]),
                  *gelu_nodes("a")],
                 [("x", ["batch", 8])], [("y", ["batch", 16])],
                 {"W": rand(8, 16), "b": rand(16)})
    optimized = checked(g, {"x": rand(4, 8)}, 2)
    assert ops(optimized) == {"FusedMatMul": 1, "FusedElementwise": 1}
    fused = optimized.nodes[1]
    assert fused.inputs == ["a"]  # the scalars became literals of the program
    assert fused.attributes["ops"].count("Scalar") == 3
    for value in fused.attributes.values():
        assert isinstance(value, (int, float, str)) or all(
            isinstance(v, (int, float, str)) for v in value)


def test_layernorm_tail_fuses_from_epsilon_to_beta():
    g = graph_of([node("ReduceMean", ["x"], ["mu"], axes=[-1]),
                  node("Sub", ["x", "mu"], ["d"]),
                  const("two", np.float32(2.0)), node("Pow", ["d", "two"], ["d2"]),
                  node("ReduceMean", ["d2"], ["var"], axes=[-1]),
                  const("eps", np.float32(1e-5)), node("Add", ["var", "eps"], ["v"]),
                  node("Sqrt", ["v"], ["std"]), node("Div", ["d", "std"], ["n"]),
                  node("Mul", ["n", "gamma"], ["s"]), node("Add", ["s", "beta"], ["y"])],
                 [("x", [2, 5, 8])], [("y", [2, 5, 8])],
                 {"gamma": rand(8), "beta": rand(8)}, opset=17)
    optimized = checked(g, {"x": rand(2, 5, 8)}, 2)
    counts = ops(optimized)
    assert counts["FusedElementwise"] == 1 and counts["Sqrt"] == 0 and counts["Div"] == 0
    tail = next(n for n in optimized.nodes if n.op_type == "FusedElementwise")
    assert tail.attributes["ops"][-4:] == ["Sqrt", "Div", "Mul", "Add"]


def test_intermediate_read_outside_the_chain_is_not_swallowed():
    g = graph_of([node("Exp", ["x"], ["e"]), node("Neg", ["e"], ["n"]),
                  node("Abs", ["n"], ["y"]), node("ReduceSum", ["e"], ["s"])],
                 [("x", [2, 3])], [("y", [2, 3]), ("s", [1, 1])])
    optimized = checked(g, {"x": rand(2, 3)}, 2)
    assert ops(optimized) == {"Exp": 1, "FusedElementwise": 1, "ReduceSum": 1}


def test_float16_is_computed_in_float32_and_rounded_once():
    # passes/half_regions.py: the float16 chain runs in float32 (so it fuses), and only the
    # float16 output is rounded, which moves it by at most float16 rounding
    g = graph_of([node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                  node("Exp", ["h"], ["e"]), node("Neg", ["e"], ["y"])],
                 [("x", [3])], [("y", [3], TensorProto.FLOAT16)])
    optimized = checked(g, {"x": rand(3)}, 2, rtol=2e-3, atol=1e-3)
    assert ops(optimized) == {"Cast": 1, "FusedElementwise": 1}


def test_batchnorm_after_concat_becomes_a_fused_affine_relu():
    params = _bn_params(6)
    g = graph_of([node("Concat", ["a", "b"], ["c"], axis=1),
                  node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
                  node("Mul", ["n", "k"], ["m"]), node("Add", ["m", "t"], ["s"]),
                  node("Relu", ["s"], ["y"])],
                 [("a", [1, 2, 3, 3]), ("b", [1, 4, 3, 3])], [("y", [1, 6, 3, 3])],
                 params | {"k": rand(6, 1, 1), "t": rand(6, 1, 1)})
    optimized = checked(g, {"a": rand(1, 2, 3, 3), "b": rand(1, 4, 3, 3)}, 2)
    assert ops(optimized) == {"Concat": 1, "FusedElementwise": 1}
    assert optimized.nodes[1].attributes["ops"] == ["Mul", "Add", "Relu"]


def test_float64_constants_a_float_attribute_cannot_hold_stay_inputs():
    g = graph_of([node("Mul", ["x", "k"], ["m"]), node("Exp", ["m"], ["y"])],
                 [("x", [3], TensorProto.DOUBLE)], [("y", [3], TensorProto.DOUBLE)],
                 {"k": np.array(0.1)})
    optimized = checked(g, {"x": RNG.standard_normal(3)}, 2, rtol=1e-12, atol=0)
    assert optimized.nodes[0].inputs == ["x", "k"]


# -- the zoo ------------------------------------------------------------------------------------

# light models whose expected output is a softmax tie: equal logits in exact arithmetic that
# float32 keeps only if every sum rounds identically (tests/conformance/test_ties.py checks
# the logits against float64 instead)
TIES = {"squeezenet"}


@pytest.fixture(scope="module", params=LIGHT_MODELS)
def zoo(request):
    model = light_model(request.param)
    graph = load_graph(str(model.path))
    graph.metadata.setdefault(
        "ir_version", onnx.load(str(model.path), load_external_data=False).ir_version)
    return model, graph


@pytest.mark.parametrize("level", [1, 2])
def test_light_zoo_models_match_their_references(zoo, level):
    model, graph = zoo
    optimized = optimize(graph, level)
    assert len(optimized.nodes) < len(graph.nodes)
    outputs = run(optimized, model.inputs)
    for got, want in zip(outputs, model.expected):
        if model.name in TIES:  # only its shape and a softmax's sum hold (see TIES)
            assert got.shape == want.shape and np.isclose(got.sum(), 1, atol=1e-4)
            continue
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
    if level == 2:
        assert "BatchNormalization" not in ops(optimized)
        assert any(n.domain == "mixrt" for n in optimized.nodes)


# -- level 1: a classifier's labels (runtime/passes/class_labels.py) -----------------------------

def labels_graph(classes, cast_to=TensorProto.INT64, argmax_read_elsewhere=False):
    """skl2onnx's label tail: ArgMax, ArrayFeatureExtractor of the classes, Reshape [-1],
    an optional Cast."""
    nodes = [node("ArgMax", ["p"], ["index"], axis=1),
             helper.make_node("ArrayFeatureExtractor", ["classes", "index"], ["picked"],
                              domain="ai.onnx.ml"),
             node("Reshape", ["picked", "flat"], ["label" if cast_to is None else "flat_label"])]
    if cast_to is not None:
        nodes.append(node("Cast", ["flat_label"], ["label"], to=cast_to))
    label_type = {np.str_: TensorProto.STRING}.get(classes.dtype.type, TensorProto.INT64)
    outputs = [("label", None, cast_to or label_type)]
    if argmax_read_elsewhere:
        outputs.append(("index", None, TensorProto.INT64))
    initializers = {"classes": classes, "flat": np.array([-1], np.int64)}
    graph = graph_of(nodes, [("p", ["n", 4])], outputs, initializers, ml_opset=1)
    return graph, {"p": rand(5, 4)}


@pytest.mark.parametrize("classes, cast_to, kept", [
    (np.arange(4, dtype=np.int32), TensorProto.INT64, {"ArgMax": 1}),  # the index is the label
    (np.array([3, 7, 11, 40], np.int64), TensorProto.INT64, {"ArgMax": 1, "Gather": 1}),
    (np.array(["ant", "bee", "cat", "dog"]), None, {"ArgMax": 1, "Gather": 1}),
])
def test_a_classifiers_label_tail_becomes_one_lookup(classes, cast_to, kept):
    graph, feeds = labels_graph(classes, cast_to)
    optimized = checked(graph, feeds, 1)
    assert ops(optimized) == kept


def test_a_label_tail_whose_cast_is_not_exact_or_whose_index_is_read_stays():
    graph, feeds = labels_graph(np.array([0.5, 1.0, 2.0, 3.0], np.float32))
    assert "ArrayFeatureExtractor" in ops(checked(graph, feeds, 1))
    graph, feeds = labels_graph(np.arange(4, dtype=np.int64), argmax_read_elsewhere=True)
    assert "ArrayFeatureExtractor" in ops(checked(graph, feeds, 1))


# -- level 2: attention ---------------------------------------------------------------------------

def attention_graph(scale="Mul", mask=False, key_transposes=1, softmax_axis=-1,
                    probabilities_out=False) -> tuple[Graph, dict]:
    """Self-attention as PyTorch exports it, over (batch, seq, heads, size) inputs."""
    q_perm = [0, 2, 1, 3]
    nodes = [node("Transpose", ["q"], ["qt"], perm=q_perm)]
    if key_transposes == 1:
        nodes.append(node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]))
    else:
        nodes += [node("Transpose", ["k"], ["k1"], perm=q_perm),
                  node("Transpose", ["k1"], ["kt"], perm=[0, 1, 3, 2])]
    nodes.append(node("MatMul", ["qt", "kt"], ["s"]))
    scores = "s"
    if scale:
        nodes += [const("c", np.float32(0.25 if scale == "Mul" else 4.0)),
                  node(scale, ["s", "c"], ["scaled"])]
        scores = "scaled"
    if mask:
        nodes.append(node("Add", ["m", scores], ["masked"]))
        scores = "masked"
    nodes += [node("Softmax", [scores], ["p"], axis=softmax_axis),
              node("Transpose", ["v"], ["vt"], perm=q_perm), node("MatMul", ["p", "vt"], ["o"]),
              node("Transpose", ["o"], ["y"], perm=q_perm)]
    inputs = [("q", ["b", 5, 2, 8]), ("k", ["b", 7, 2, 8]), ("v", ["b", 7, 2, 4])]
    feeds = {"q": rand(2, 5, 2, 8), "k": rand(2, 7, 2, 8), "v": rand(2, 7, 2, 4)}
    if mask:
        inputs.append(("m", ["b", 1, 1, 7]))
        feeds["m"] = np.where(RNG.random((2, 1, 1, 7)) < 0.3, -np.inf, 0).astype(np.float32)
        feeds["m"][..., 0] = 0
    outputs = [("y", ["b", 5, 2, 4])] + ([("p", None)] if probabilities_out else [])
    return graph_of(nodes, inputs, outputs), feeds


@pytest.mark.parametrize("key_transposes", [1, 2])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("scale", ["Mul", "Div", ""])
def test_attention_becomes_one_fused_node(scale, mask, key_transposes):
    graph, feeds = attention_graph(scale, mask, key_transposes)
    optimized = checked(graph, feeds, 2)
    assert ops(optimized) == {"FusedAttention": 1}
    fused = optimized.nodes[0]
    assert fused.inputs == ["q", "k", "v"] + (["m"] if mask else [])
    assert fused.attributes.get("scale", 1.0) == (0.25 if scale else 1.0)


def test_attention_whose_probabilities_are_read_or_softmax_on_another_axis_stays():
    graph, feeds = attention_graph(probabilities_out=True)
    assert "FusedAttention" not in ops(checked(graph, feeds, 2))
    graph, feeds = attention_graph(softmax_axis=2)
    assert "FusedAttention" not in ops(checked(graph, feeds, 2))


def sdpa_graph(key_form="transpose", guard_value=0.0, reshape_out=False,
               kv_heads_first=True, out_shape=None) -> tuple[Graph, dict]:
    """Attention as PyTorch's ``scaled_dot_product_attention`` exports it: Q and K^T each
    scaled by the root of the scale, the guard Where(IsNaN(P), 0, P) after the Softmax, K and
    V heads first (a KV cache's Concat) or transposed there from (batch, seq, heads, size);
    K^T by a Transpose [0, 1, 3, 2] or (``key_form="reshape"``) the dynamo exporter's 3-D
    Reshape, Transpose [0, 2, 1] and Reshape back."""
    perm = [0, 2, 1, 3]
    b, s, t, h, d = 2, 3, 6, 2, 8
    nodes = [node("Transpose", ["q"], ["qh"], perm=perm), const("root", np.float32(0.5)),
             node("Mul", ["qh", "root"], ["qs"])]
    if kv_heads_first:
        key, value = "k", "v"
    else:
        nodes += [node("Transpose", ["k"], ["kh"], perm=perm),
                  node("Transpose", ["v"], ["vh"], perm=perm)]
        key, value = "kh", "vh"
    if key_form == "transpose":
        nodes.append(node("Transpose", [key], ["kt"], perm=[0, 1, 3, 2]))
    else:
        nodes += [const("flat", np.array([b * h, t, d], np.int64)),
                  const("back", np.array([b, h, d, t], np.int64)),
                  node("Reshape", [key, "flat"], ["k3"]),
                  node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
                  node("Reshape", ["k3t", "back"], ["kt"])]
    nodes += [node("Mul", ["root", "kt"], ["ks"]), node("MatMul", ["qs", "ks"], ["s"]),
              node("Add", ["s", "m"], ["masked"]), node("Softmax", ["masked"], ["p"], axis=-1),
              node("IsNaN", ["p"], ["bad"]), const("zero", np.float32(guard_value)),
              node("Where", ["bad", "zero", "p"], ["pg"]), node("MatMul", ["pg", value], ["o"])]
    out = "o"
    if reshape_out:
        nodes += [const("same", np.array(out_shape or [b, h, s, d], np.int64)),
                  node("Reshape", ["o", "same"], ["o2"])]
        out = "o2"
    nodes.append(node("Transpose", [out], ["y"], perm=perm))
    kv_shape = [b, h, t, d] if kv_heads_first else [b, t, h, d]
    feeds = {"q": rand(b, s, h, d), "k": rand(*kv_shape), "v": rand(*kv_shape),
             "m": np.where(RNG.random((b, 1, s, t)) < 0.3, -np.inf, 0).astype(np.float32)}
    feeds["m"][0, 0, 1] = -np.inf  # one query sees no key: its probabilities are NaN
    inputs = [("q", [b, s, h, d]), ("k", kv_shape), ("v", kv_shape), ("m", [b, 1, s, t])]
    return graph_of(nodes, inputs, [("y", None if out_shape else [b, s, h, d])]), feeds


@pytest.mark.parametrize("key_form", ["transpose", "reshape"])
@pytest.mark.parametrize("kv_heads_first", [True, False])
def test_scaled_dot_product_attention_becomes_one_fused_node(key_form, kv_heads_first):
    graph, feeds = sdpa_graph(key_form, kv_heads_first=kv_heads_first,
                              reshape_out=key_form == "reshape")
    optimized = checked(graph, feeds, 2)
    fused = [n for n in optimized.nodes if n.op_type == "FusedAttention"]
    assert len(fused) == 1 and ops(optimized) == {"FusedAttention": 1}
    assert fused[0].inputs == ["q", "k", "v", "m"]
    assert fused[0].attributes["scale"] == pytest.approx(0.25)
    assert fused[0].attributes["nan_to_zero"] == 1
    assert fused[0].attributes.get("heads_first") == ([0, 1, 1] if kv_heads_first else None)
    # the fully masked query's output is zeros, as the guard makes it, not NaN
    assert np.all(run(optimized, feeds)[0][0, 1] == 0)


def test_a_guard_that_is_not_zero_or_a_reshape_that_moves_values_keeps_attention_unfused():
    graph, feeds = sdpa_graph(guard_value=0.5)
    assert "FusedAttention" not in ops(checked(graph, feeds, 2))
    # (b, h, s, d) -> (b, s, h, d) as a Reshape: the same rank, other values where they lie
    graph, feeds = sdpa_graph(reshape_out=True, out_shape=[2, 3, 2, 8])
    assert "FusedAttention" not in ops(checked(graph, feeds, 2))


def exporter_attention_graph(target="own dims", shape_elsewhere=False) -> tuple[Graph, dict]:
    """Attention as the transformers exporter writes it since 2025 (BERT, GPT-2, DistilBERT):
    Q, K and V parts of one projection's Split, each reshaped to (batch, seq, heads, size)
    and transposed heads first, Q's transpose read by a Shape too; K and V through a KV
    cache's Concat of one input; the scales on Q and K^T, the mask, the guard; and the
    values product reshaped to a shape made of its own dims (``Reshape(o, [o.shape[0], -1,
    q.shape[2], v.shape[3]])``) before the last Transpose. ``target="moved"`` takes q's
    size instead of v's for the last dim (not the product's shape); ``shape_elsewhere``: the
    product's Shape is also a graph output."""
    perm, h, d = [0, 2, 1, 3], 2, 4
    nodes = [const("parts", np.array([h * d] * 3, np.int64)),
             node("Split", ["x", "parts"], ["q2", "k2", "v2"], axis=2),
             const("heads", np.array([0, 0, h, d], np.int64))]
    for name in "qkv":
        nodes += [node("Reshape", [f"{name}2", "heads"], [f"{name}4"]),
                  node("Transpose", [f"{name}4"], [f"{name}h"], perm=perm)]
    nodes += [node("Concat", ["kh"], ["kc"], axis=-2), node("Concat", ["vh"], ["vc"], axis=-2),
              const("root", np.float32(0.5)), node("Mul", ["qh", "root"], ["qs"]),
              node("Transpose", ["kc"], ["kt"], perm=[0, 1, 3, 2]),
              node("Mul", ["kt", "root"], ["ks"]), node("MatMul", ["qs", "ks"], ["s"]),
              node("Add", ["s", "m"], ["masked"]), node("Softmax", ["masked"], ["p"], axis=-1),
              node("IsNaN", ["p"], ["bad"]), const("zero", np.float32(0.0)),
              node("Where", ["bad", "zero", "p"], ["pg"]), node("MatMul", ["pg", "vc"], ["o"]),
              const("first", np.array(0, np.int64)), const("seq", np.array(2, np.int64)),
              const("size", np.array(3, np.int64)), const("axis0", np.array([0], np.int64)),
              const("open", np.array([-1], np.int64)),
              node("Shape", ["o"], ["o_shape"]), node("Gather", ["o_shape", "first"], ["o0"]),
              node("Shape", ["qh"], ["q_shape"]), node("Gather", ["q_shape", "seq"], ["q2d"]),
              node("Shape", ["vc" if target == "own dims" else "qh"], ["v_shape"]),
              node("Gather", ["v_shape", "size"], ["v3"])]
    pieces = []
    for name in ("o0", "q2d", "v3"):
        nodes.append(node("Unsqueeze", [name, "axis0"], [f"{name}u"]))
        pieces.append(f"{name}u")
    nodes += [node("Concat", [pieces[0], "open", pieces[1], pieces[2]], ["target"], axis=0),
              node("Reshape", ["o", "target"], ["o2"]),
              node("Transpose", ["o2"], ["y"], perm=perm)]
    b, s = 2, 5
    feeds = {"x": rand(b, s, 3 * h * d),
             "m": np.where(RNG.random((b, 1, s, s)) < 0.3, -np.inf, 0).astype(np.float32)}
    feeds["m"][0, 0, 1] = -np.inf  # one query sees no key: the guard's zeros
    outputs = [("y", None)] + ([("o_shape", None)] if shape_elsewhere else [])
    return graph_of(nodes, [("x", ["b", "s", 3 * h * d]), ("m", ["b", 1, "s", "s"])],
                    outputs), feeds


def test_the_transformers_exporters_attention_becomes_one_node_reading_its_projections():
    graph, feeds = exporter_attention_graph()
    optimized = checked(graph, feeds, 2)
    fused = [n for n in optimized.nodes if n.op_type == "FusedAttention"]
    assert len(fused) == 1 and "Transpose" not in ops(optimized)
    # Q, K and V read where their Reshapes left them, sequence first: no transposes
    assert fused[0].inputs == ["q4", "k4", "v4", "m"]
    assert fused[0].attributes.get("heads_first") is None
    assert fused[0].attributes["scale"] == pytest.approx(0.25)
    assert ops(optimized)["Concat"] == 0 and ops(optimized)["Shape"] == 0
    assert np.all(run(optimized, feeds)[0][0, 1] == 0)


@pytest.mark.parametrize("variant", ["moved", "shape elsewhere"])
def test_a_reshape_to_other_dims_or_a_product_shape_read_elsewhere_keeps_attention_unfused(
        variant):
    graph, feeds = exporter_attention_graph(target="moved" if variant == "moved" else
                                            "own dims", shape_elsewhere=variant != "moved")
    assert "FusedAttention" not in ops(checked(graph, feeds, 2))


def test_a_concat_of_one_input_is_removed_where_its_axis_is_in_the_rank():
    kept = graph_of([node("Concat", ["x"], ["y"], axis=1)], [("x", [2, 3])], [("y", None)])
    assert "Concat" not in ops(checked(kept, {"x": rand(2, 3)}, 1))
    bad = graph_of([node("Concat", ["x"], ["y"], axis=2)], [("x", [2, 3])], [("y", None)])
    assert "Concat" in ops(optimize(bad, 1))  # out of the rank: its error stays


def grouped_attention_graph(key_form="transpose", v_repeat=2) -> tuple[Graph, dict]:
    """Grouped-query attention as Llama's exports spell it: K and V heads first with 2
    heads, each repeated (Unsqueeze at 2, Expand, Reshape) to Q's 4 (``v_repeat=None``: V
    comes with 4 heads of its own); K^T by a Transpose
    [0, 1, 3, 2] or (``key_form="reshape"``) the dynamo exporter's Reshape of the 5-D
    Expand straight to 3-D, Transpose [0, 2, 1] and Reshape back."""
    b, h, kv, s, t, d = 1, 4, 2, 2, 6, 8
    nodes = [const("axis2", np.array([2], np.int64)), const("c", np.float32(0.35))]

    def repeated(name, repeat, reshape=True):
        nodes.extend([node("Unsqueeze", [name, "axis2"], [f"{name}5"]),
                      const(f"{name}_grow", np.array([b, kv, repeat, t, d], np.int64)),
                      node("Expand", [f"{name}5", f"{name}_grow"], [f"{name}x"])])
        if not reshape:
            return f"{name}x"
        nodes.extend([const(f"{name}_heads", np.array([b, kv * repeat, t, d], np.int64)),
                      node("Reshape", [f"{name}x", f"{name}_heads"], [f"{name}r"])])
        return f"{name}r"
    if key_form == "transpose":
        nodes.append(node("Transpose", [repeated("k", 2)], ["kt"], perm=[0, 1, 3, 2]))
    else:
        nodes += [const("flat", np.array([b * h, t, d], np.int64)),
                  const("back", np.array([b, h, d, t], np.int64)),
                  node("Reshape", [repeated("k", 2, reshape=False), "flat"], ["k3"]),
                  node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
                  node("Reshape", ["k3t", "back"], ["kt"])]
    nodes += [node("MatMul", ["q", "kt"], ["scores"]), node("Mul", ["scores", "c"], ["sc"]),
              node("Softmax", ["sc"], ["p"], axis=-1),
              node("MatMul", ["p", repeated("v", v_repeat) if v_repeat else "v"], ["o"]),
              node("Transpose", ["o"], ["y"], perm=[0, 2, 1, 3])]
    kv_heads, v_heads = [b, kv, t, d], [b, kv if v_repeat else h, t, d]
    feeds = {"q": rand(b, h, s, d), "k": rand(*kv_heads), "v": rand(*v_heads)}
    inputs = [("q", [b, h, s, d]), ("k", kv_heads), ("v", v_heads)]
    return graph_of(nodes, inputs, [("y", [b, s, h, d])]), feeds


@pytest.mark.parametrize("key_form", ["transpose", "reshape"])
def test_grouped_query_attention_reads_the_unrepeated_heads(key_form):
    graph, feeds = grouped_attention_graph(key_form)
    optimized = checked(graph, feeds, 2)
    assert ops(optimized) == {"FusedAttention": 1}
    fused = optimized.nodes[0]
    assert fused.inputs == ["q", "k", "v"] and fused.attributes["kv_repeat"] == 2
    assert fused.attributes["heads_first"] == [1, 1, 1]


@pytest.mark.parametrize("key_form", ["transpose", "reshape"])
def test_attention_whose_values_are_not_repeated_keeps_the_keys_repeat(key_form):
    graph, feeds = grouped_attention_graph(key_form, v_repeat=None)
    found = ops(checked(graph, feeds, 2))
    if key_form == "transpose":  # K's repeated heads are a tensor the fused node reads
        assert found["FusedAttention"] == 1 and found["Expand"] == 1
    else:  # they exist only inside the reshapes: nothing to read, no fusion
        assert "FusedAttention" not in found


def rotary_graph(first_end=4, second_start=4, order="standard", opset=17) -> tuple[Graph, dict]:
    """Hugging Face's rotary embedding of x (1, 3, 5, 8): x * cos + rotate_half(x) * sin,
    rotate_half(x) = Concat(Neg(x[..., 4:]), x[..., :4]) (``order="swapped"``: the halves
    the other way round, which is another function); the products and the sum with their
    operands in the other order when ``order="commuted"``."""
    if opset >= 10:
        nodes = [const("zero", np.array([0], np.int64)), const("last", np.array([-1], np.int64)),
                 const("mid", np.array([first_end], np.int64)),
                 const("start2", np.array([second_start], np.int64)),
                 const("end", np.array([np.iinfo(np.int64).max], np.int64)),
                 node("Slice", ["x", "zero", "mid", "last"], ["x1"]),
                 node("Slice", ["x", "start2", "end", "last"], ["x2"])]
    else:
        nodes = [node("Slice", ["x"], ["x1"], starts=[0], ends=[first_end], axes=[3]),
                 node("Slice", ["x"], ["x2"], starts=[second_start], ends=[8], axes=[3])]
    nodes.append(node("Neg", ["x2"], ["n2"]))
    halves = ["x1", "n2"] if order == "swapped" else ["n2", "x1"]
    nodes.append(node("Concat", halves, ["r"], axis=-1 if opset >= 11 else 3))
    if order == "commuted":
        nodes += [node("Mul", ["cos", "x"], ["a"]), node("Mul", ["sin", "r"], ["bb"]),
                  node("Add", ["bb", "a"], ["y"])]
    else:
        nodes += [node("Mul", ["x", "cos"], ["a"]), node("Mul", ["r", "sin"], ["bb"]),
                  node("Add", ["a", "bb"], ["y"])]
    feeds = {"x": rand(1, 3, 5, 8), "cos": rand(1, 1, 5, 8), "sin": rand(1, 1, 5, 8)}
    inputs = [("x", [1, 3, 5, 8]), ("cos", [1, 1, 5, 8]), ("sin", [1, 1, 5, 8])]
    return graph_of(nodes, inputs, [("y", [1, 3, 5, 8])], opset=opset), feeds


@pytest.mark.parametrize("opset", [9, 17])
@pytest.mark.parametrize("order", ["standard", "commuted"])
def test_rotary_embedding_becomes_one_node_with_the_same_bits(order, opset):
    graph, feeds = rotary_graph(order=order, opset=opset)
    optimized = checked(graph, feeds, 2)
    assert ops(optimized) == {"FusedRotary": 1}
    assert optimized.nodes[0].inputs == ["x", "cos", "sin"]
    np.testing.assert_array_equal(run(optimized, feeds)[0], run(graph, feeds)[0])


@pytest.mark.parametrize("variant", [dict(order="swapped"), dict(first_end=5, second_start=5),
                                     dict(second_start=3, first_end=3)])
def test_a_rotation_that_is_not_rotate_half_stays_unfused(variant):
    graph, feeds = rotary_graph(**variant)
    assert "FusedRotary" not in ops(checked(graph, feeds, 2))


def tfidf_graph(idf) -> tuple[Graph, dict]:
    """skl2onnx's TfidfVectorizer: raw counts (TF mode, its weights all ones) times a
    constant idf per column."""
    nodes = [node("TfIdfVectorizer", ["x"], ["counts"], mode="TF", min_gram_length=1,
                  max_gram_length=1, max_skip_count=0, ngram_counts=[0],
                  ngram_indexes=[2, 0, 1], pool_strings=["a", "b", "c"],
                  weights=[1.0, 1.0, 1.0]),
             const("idf", np.asarray(idf, np.float32)), node("Mul", ["counts", "idf"], ["y"])]
    graph = graph_of(nodes, [("x", [2, 4], TensorProto.STRING)], [("y", [2, 3])])
    x = np.array([["a", "b", "a", "q"], ["c", "c", "x", "y"]], dtype=object)
    return graph, {"x": x}


def test_tfidf_column_weights_fold_into_the_vectorizer_exactly():
    graph, feeds = tfidf_graph([1.5, 0.25, 3.0])
    optimized = checked(graph, feeds, 1)  # level 1: the same bits
    assert ops(optimized) == {"TfIdfVectorizer": 1}
    folded = optimized.nodes[0].attributes
    # pool entry k counts into column ngram_indexes[k]: its weight is that column's idf
    assert folded["mode"] == "TFIDF" and folded["weights"] == [3.0, 1.5, 0.25]


@pytest.mark.parametrize("idf", [[1.5, -0.25, 3.0], [1.5, np.inf, 3.0]])
def test_weights_that_would_change_a_zero_column_stay_a_mul(idf):
    graph, feeds = tfidf_graph(idf)  # 0 * -0.25 is -0.0, 0 * inf is NaN: not the fold's 0
    assert ops(checked(graph, feeds, 1)) == {"TfIdfVectorizer": 1, "Mul": 1}


def test_a_pass_that_fails_names_itself_in_a_graph_error(monkeypatch, tmp_path):
    from helpers import add_model, save

    from mixrt.runtime import passes

    def broken(graph, ir_version):
        raise IndexError("list index out of range")
    monkeypatch.setattr(passes, "drop_dead_conv_taps", broken)
    graph = load_graph(save(add_model(), tmp_path / "add.onnx"))
    with pytest.raises(GraphError, match="drop_dead_conv_taps pass failed.*IndexError"):
        optimize(graph, 2)
    assert optimize(graph, 1).nodes  # the lower level does not run it


# -- a product's transposed operand, read in place -------------------------------------------

def _scaled_keys_graph(scale_shape=(), second_reader=False):
    """``(q * s) @ (k^T * s)`` as PyTorch exports scaled_dot_product_attention."""
    s = np.full(scale_shape, 0.35, np.float32)
    nodes = [node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             node("Mul", ["kt", "s"], ["ks"]), node("Mul", ["q", "s"], ["qs"]),
             node("MatMul", ["qs", "ks"], ["y"])]
    outputs = [("y", [2, 3, 5, 7])]
    if second_reader:
        nodes.append(node("Relu", ["ks"], ["z"]))
        outputs.append(("z", [2, 3, 4, 7]))
    return graph_of(nodes, [("q", [2, 3, 5, 4]), ("k", [2, 3, 7, 4])], outputs, {"s": s})


def test_a_scale_of_the_transposed_keys_moves_before_their_transpose():
    feeds = {"q": rand(2, 3, 5, 4), "k": rand(2, 3, 7, 4)}
    optimized = checked(_scaled_keys_graph(), feeds, 2)
    (transpose,) = [n for n in optimized.nodes if n.op_type == "Transpose"]
    (product,) = [n for n in optimized.nodes if n.op_type == "MatMul"]
    assert product.inputs[1] == transpose.outputs[0]  # the Transpose feeds the product
    # the same values: each product computed as before, on untransposed keys
    want = (feeds["q"] * np.float32(0.35)) @ np.swapaxes(feeds["k"] * np.float32(0.35), -1, -2)
    np.testing.assert_array_equal(run(optimized, feeds)[0], want)
    # and the planned run reads the keys transposed in place: the Transpose has no slot
    session = Session(optimized)
    session.run(None, feeds)
    plan = next(iter(session._plans.values()))
    assert transpose.outputs[0] not in plan.slots
    np.testing.assert_array_equal(session.run(None, feeds)[0], want)


@pytest.mark.parametrize("scale_shape, second_reader", [((1, 1, 4, 1), False), ((), True)])
def test_a_scale_per_position_or_read_elsewhere_stays_after_the_transpose(scale_shape,
                                                                           second_reader):
    g = _scaled_keys_graph(scale_shape, second_reader)
    stats: dict = {}
    optimize(g, 2, stats)
    assert stats["scale_before_transpose"] == 0


@pytest.mark.parametrize("op, ones, first", [
    ("Mul", np.float32(1), False), ("Mul", np.ones((1, 3), np.float32), True),
    ("Div", np.ones(3, np.float32), False), ("Mul", np.int64(1), False)])
def test_a_product_or_quotient_by_ones_that_keeps_the_shape_is_removed(op, ones, first):
    """x * 1 is x bit for bit, -0, infinities and NaN included (onnxmltools's LightGBM
    classifier writes its probabilities so)."""
    integer = ones.dtype.kind == "i"
    elem = TensorProto.INT64 if integer else F
    inputs = ["one", "x"] if first else ["x", "one"]
    g = graph_of([node(op, inputs, ["p"]), node("Neg", ["p"], ["y"])],
                 [("x", ["n", 3], elem)], [("y", None, elem)], {"one": ones})
    x = np.arange(-6, 6, dtype=np.int64).reshape(4, 3) if integer else \
        np.float32([[-0.0, 0.0, np.inf], [-np.inf, np.nan, 1e-45], [3.5, -2.25, 7.0]])
    optimized = checked(g, {"x": x}, 1)
    assert ops(optimized) == {"Neg": 1} and optimized.nodes[0].inputs == ["x"]
    np.testing.assert_array_equal(np.signbit(run(optimized, {"x": x})[0]), np.signbit(-x))


@pytest.mark.parametrize("op, ones, x_shape", [
    ("Mul", np.ones((2, 3), np.float32), ["n", 3]),  # broadcasts a batch of one: stays
    ("Mul", np.ones((1, 1, 3), np.float32), [2, 3]),  # adds an axis
    ("Mul", np.float32(2), [2, 3]),  # not one
    ("Div", np.float32(1), [2, 3])])  # the ones first: 1 / x
def test_a_product_by_ones_that_changes_the_shape_or_value_stays(op, ones, x_shape):
    inputs = ["one", "x"] if op == "Div" else ["x", "one"]
    g = graph_of([node(op, inputs, ["y"])], [("x", x_shape)], [("y", None)], {"one": ones})
    assert ops(optimize(g, 1)) == {op: 1}
