"""Operand types against the ONNX schema (runtime/passes/typecheck.py): a model the spec calls
invalid is refused when it loads, as onnxruntime refuses it, instead of running on NumPy's
promotions. Every ONNX backend node case (tests/conformance) loading proves the check
refuses no valid model."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt import autograd, nd
from mixrt.errors import ExecutionError, GraphError, InputError
from mixrt.gluon import nn
from mixrt.ops.device import parse_device
from mixrt.runtime.passes.typecheck import promote_mixed_floats
from mixrt.runtime.support import support_table
from mixrt.importers.onnx import import_model

F32, F64, I32, I64, BOOL = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32,
                            TensorProto.INT64, TensorProto.BOOL)


def _model(op_type, input_types, *, outputs=1, opset=17, **attributes) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(len(input_types))]
    node = helper.make_node(op_type, names, [f"y{k}" for k in range(outputs)], name="the_node",
                            **attributes)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, t, None) for n, t in
                      zip(names, input_types)],
        [helper.make_empty_tensor_value_info(f"y{k}") for k in range(outputs)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)  # one the installed onnxruntime reads


def _onnxruntime_refuses(model) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 (onnxruntime's own exception classes)
        return True
    return False


INVALID = [
    # (op, input types, attributes, words the message must hold)
    ("Sqrt", [I32], {}, ["input 0 (X) 'x0' is tensor(int32)", "tensor(float)"]),
    ("Softmax", [I64], {}, ["'x0' is tensor(int64)", "Softmax-13 accepts"]),
    ("Conv", [I32, I32], {}, ["tensor(int32)", "Conv-11 accepts"]),
    ("Add", [F32, F64], {}, ["'x0' (tensor(float)) and 'x1' (tensor(double))",
                             "both are T in Add-14", "Cast"]),
    ("MatMul", [F32, I32], {}, ["'x0' (tensor(float)) and 'x1' (tensor(int32))"]),
    ("Where", [F32, F32, F32], {}, ["input 0 (condition)", "accepts tensor(bool)"]),
    ("Concat", [F32, F32, F64], {"axis": 0}, ["'x0' (tensor(float)) and 'x2' "
                                              "(tensor(double))"]),
    ("Gather", [F32, F32], {}, ["input 1 (indices) 'x1' is tensor(float)"]),
    ("Dropout", [F32, F32, F32], {}, ["input 2 (training_mode)", "tensor(bool)"]),
]


@pytest.mark.parametrize("op_type, types, attributes, words", INVALID,
                         ids=[case[0] for case in INVALID])
def test_an_invalid_model_is_refused_at_load_naming_node_input_and_types(
        op_type, types, attributes, words):
    model = _model(op_type, types, **attributes)
    assert _onnxruntime_refuses(model)  # the reference refuses it too: we are not stricter
    with pytest.raises(GraphError) as caught:
        mixrt.Session(model.SerializeToString())
    message = str(caught.value)
    assert message.startswith(f"node 'the_node' (ai.onnx::{op_type}, opset 17)")
    for word in words:
        assert word in message


VALID = [
    ("Add", [F64, F64], {}), ("Sqrt", [F64], {}), ("Relu", [I32], {}),
    ("Pow", [F32, I64], {}),  # T and T1 are separate parameters
    ("Where", [BOOL, I64, I64], {}), ("Concat", [I32, I32, I32], {"axis": 0}),
    ("Gather", [F32, I32], {}), ("Dropout", [F64, F32, BOOL], {}),
    ("Shape", [TensorProto.STRING], {}),
]


@pytest.mark.parametrize("op_type, types, attributes", VALID, ids=[c[0] for c in VALID])
def test_valid_operand_types_load_in_mixrt_and_onnxruntime(op_type, types, attributes):
    model = _model(op_type, types, **attributes)
    assert not _onnxruntime_refuses(model)
    mixrt.Session(model.SerializeToString())


def test_a_mismatch_found_by_inference_names_the_node_downstream():
    """x0 is int64; Shape's output is int64 too, so Add(Shape(x), float) is caught although
    no declared type says so."""
    nodes = [helper.make_node("Shape", ["x0"], ["s"], name="shape"),
             helper.make_node("Add", ["s", "x1"], ["y"], name="bad_add")]
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x0", F32, [2, 3]),
        helper.make_tensor_value_info("x1", F32, [2])],
        [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(GraphError, match=r"node 'bad_add'.*'s' \(tensor\(int64\)\) and "
                                         r"'x1' \(tensor\(float\)\)"):
        mixrt.Session(model.SerializeToString())


def test_unknown_types_and_ops_without_a_schema_are_left_alone():
    # no declared element type: nothing to check until data arrives
    model = _model("Add", [TensorProto.UNDEFINED, F32])
    model.graph.input[0].type.tensor_type.ClearField("elem_type")
    mixrt.Session(model.SerializeToString())  # loads
    # a domain ONNX has no schema for (here: com.example) is not checked
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F32, [2])],
                              [helper.make_tensor_value_info("y", F32, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    table = support_table(import_model(model.SerializeToString()), parse_device("cpu"))
    assert "invalid" not in table[0].reason  # unsupported for lack of a kernel, not invalid


def test_mixrt_check_reports_the_invalid_node():
    graph = import_model(_model("Add", [F32, F64]).SerializeToString())
    (row,) = support_table(graph, parse_device("cpu"))
    assert not row.supported and row.kernel.startswith("add")
    assert row.reason.startswith("invalid model: inputs 'x0' (tensor(float)) and 'x1'")


def test_a_subgraph_node_is_checked_too():
    then = helper.make_graph([helper.make_node("Add", ["a", "b"], ["t"], name="inner_add")],
                             "then", [], [helper.make_tensor_value_info("t", F32, None)])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F32, None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("c", BOOL, []),
        helper.make_tensor_value_info("a", F32, [2]),
        helper.make_tensor_value_info("b", F64, [2])],
        [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(GraphError, match="node 'inner_add'"):
        mixrt.Session(model.SerializeToString())


# -- static shapes the op's rules refuse -------------------------------------------------------

def _shaped_model(op_type, shapes, *, opset=17, **attributes) -> onnx.ModelProto:
    """One float32 node whose inputs have the given static shapes: the first a graph input,
    the rest initializers (weights, as a model carries them)."""
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node(op_type, names, ["y"], name="the_node", **attributes)
    weights = [numpy_helper.from_array(np.ones(shape, np.float32), name)
               for name, shape in zip(names[1:], shapes[1:])]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x0", F32, shapes[0])],
                              [helper.make_empty_tensor_value_info("y")], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _onnxruntime_fails(model, shape) -> bool:
    """onnxruntime refuses the model at load, or fails running it."""
    try:
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        session.run(None, {"x0": np.ones(shape, np.float32)})
    except Exception:  # noqa: BLE001 (onnxruntime's own exception classes)
        return True
    return False


SHAPE_INVALID = {
    # id: (op, shapes, attributes, opset, words the message must hold)
    "conv-channels": ("Conv", [(1, 4, 8, 8), (2, 3, 3, 3)], {}, 17,
                      ["X (1, 4, 8, 8) has 4 channels", "W (2, 3, 3, 3)", "group=1"]),
    "conv-groups": ("Conv", [(1, 4, 8, 8), (3, 2, 3, 3)], {"group": 2}, 17, ["group=2"]),
    "conv-bias": ("Conv", [(1, 3, 8, 8), (2, 3, 3, 3), (3,)], {}, 17,
                  ["Conv's bias B has shape (3,); expected (2,)"]),
    "matmul": ("MatMul", [(2, 3), (4, 5)], {}, 17, ["(2, 3) and (4, 5)", "3 against 4"]),
    "gemm": ("Gemm", [(2, 3), (2, 5)], {}, 17, ["inner dim"]),
    "gemm-c": ("Gemm", [(2, 3), (3, 5), (4,)], {}, 17, ["do not broadcast"]),
    "add": ("Add", [(2, 3), (4,)], {}, 17, ["shapes (2, 3), (4,) do not broadcast",
                                             "dims [3, 4]"]),
    "concat": ("Concat", [(2, 3), (2, 4)], {"axis": 0}, 17,
               ["axis 0", "(2, 3) and (2, 4) differ off that axis"]),
    "batch-norm": ("BatchNormalization", [(2, 3, 4), (4,), (3,), (3,), (3,)], {}, 15,
                   ["BatchNormalization's scale has shape (4,); expected (3,)"]),
    "instance-norm": ("InstanceNormalization", [(2, 3, 4), (3,), (2,)], {}, 17,
                      ["InstanceNormalization's bias has shape (2,); expected (3,)"]),
    "layer-norm": ("LayerNormalization", [(2, 3, 4), (5,)], {}, 17, ["do not broadcast"]),
    # opset 18's per-group scale and bias in a model that declares opset 21
    "group-norm-21": ("GroupNormalization", [(2, 4, 8), (2,), (2,)], {"num_groups": 2}, 21,
                      ["GroupNormalization-21's scale has shape (2,); expected (4,)"]),
    "group-norm-groups": ("GroupNormalization", [(2, 4, 8), (4,), (4,)], {"num_groups": 3},
                          21, ["4 channels do not split into num_groups=3"]),
    "rms-norm": ("RMSNormalization", [(2, 3, 4), (5,)], {}, 23, ["do not broadcast"]),
    "attention-head-size": ("Attention", [(2, 3, 4, 8), (2, 3, 6, 5), (2, 3, 6, 8)], {}, 23,
                            ["K has shape (2, 3, 6, 5): head size 5, Q's is 8"]),
    "attention-heads": ("Attention", [(2, 4, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8)], {}, 23,
                        ["3 heads do not divide Q's 4"]),
    "attention-kv-length": ("Attention", [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 5, 8)], {}, 23,
                            ["V has shape (2, 3, 5, 8): 5 positions, K's are 6"]),
    "attention-mask": ("Attention", [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), (4, 7)], {},
                       23, ["attn_mask has shape (4, 7)", "(2, 3, 4, 6)"]),
    "attention-3d": ("Attention", [(2, 4, 32), (2, 6, 12), (2, 6, 12)],
                     {"q_num_heads": 4, "kv_num_heads": 2}, 23,
                     ["K has shape (2, 6, 12): head size 6, Q's is 8"]),
    "rotary-cache": ("RotaryEmbedding", [(2, 3, 4, 8), (2, 4, 3), (2, 4, 3)], {}, 23,
                     ["cos_cache has shape (2, 4, 3); expected (2, 4, 4)"]),
}


@pytest.mark.parametrize("case", list(SHAPE_INVALID))
def test_static_shapes_the_op_refuses_fail_at_load_naming_the_node(case):
    """A model whose static shapes break its op's rules is refused when it loads, as a
    GraphError naming the node and the operands, not as a kernel failure on the first run;
    onnxruntime fails on each of these too (at load, or when it runs)."""
    op_type, shapes, attributes, opset, words = SHAPE_INVALID[case]
    model = _shaped_model(op_type, shapes, opset=opset, **attributes)
    assert _onnxruntime_fails(model, shapes[0])
    with pytest.raises(GraphError) as caught:
        mixrt.Session(model.SerializeToString())
    message = str(caught.value)
    assert message.startswith(f"node 'the_node' (ai.onnx::{op_type}, opset {opset})")
    assert "(operands: 'x0' float32[" in message
    for word in words:
        assert word in message
    (row,) = support_table(import_model(model.SerializeToString()), parse_device("cpu"))
    assert not row.supported and row.reason.startswith("invalid model: ")


@pytest.mark.parametrize("shapes, words", [
    ([(3, 5, 2), (3, 4)], "the target has shape (3, 4); expected (3, 2) (the input (3, 5, 2) "
                          "without its class axis 1)"),
    ([(3, 5), (3,), (4,)], "the weight has shape (4,); expected (5,), one per class"),
    ([(3,), (3,)], "the input has shape (3,); expected (N, C, d1, ..., dk)"),
])
def test_a_loss_whose_target_or_weight_does_not_fit_is_refused_at_load(shapes, words):
    names = ["scores", "labels", "weights"][:len(shapes)]
    node = helper.make_node("SoftmaxCrossEntropyLoss", names, ["loss"], name="sce")
    inputs = [helper.make_tensor_value_info(name, I64 if name == "labels" else F32, shape)
              for name, shape in zip(names, shapes)]
    graph = helper.make_graph([node], "g", inputs, [helper.make_empty_tensor_value_info("loss")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(GraphError) as caught:
        mixrt.Session(model.SerializeToString())
    assert "SoftmaxCrossEntropyLoss: " + words in str(caught.value)


def test_a_loss_target_class_out_of_range_is_named():
    node = helper.make_node("NegativeLogLikelihoodLoss", ["input", "target"], ["loss"],
                            name="nll", ignore_index=-1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("input", F32, [3, 5]),
                                            helper.make_tensor_value_info("target", I64, [3])],
                              [helper.make_empty_tensor_value_info("loss")])
    session = mixrt.Session(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    scores = np.zeros((3, 5), np.float32)
    (loss,) = session.run(None, {"input": scores, "target": np.array([4, -1, 0])})
    assert loss == 0.0  # -1 is ignore_index, not a class
    with pytest.raises(ExecutionError, match=r"the target holds class 7, outside \[0, 5\)"):
        session.run(None, {"input": scores, "target": np.array([4, 7, 0])})


def test_symbolic_dims_are_not_guessed_at():
    """A batch dim named N against a static 3 may be 1 or 3 when the model runs: the model
    loads, and runs where the dims agree."""
    node = helper.make_node("Add", ["a", "b"], ["y"], name="add")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", F32, ["N", 3]),
                                            helper.make_tensor_value_info("b", F32, [3, 3])],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = mixrt.Session(model.SerializeToString())
    (y,) = session.run(None, {"a": np.ones((3, 3), np.float32), "b": np.ones((3, 3), np.float32)})
    assert y.shape == (3, 3)
    with pytest.raises(ExecutionError, match="node 'add'"):
        session.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((3, 3), np.float32)})


def test_a_kernel_failure_on_symbolic_dims_is_explained_by_the_ops_shape_rule():
    """Shapes the load could not check fail in the kernel; the error then says what the op's
    own shape rule says of the operands the run gave it, then what the kernel raised."""
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", F32, ["N", "K"]),
                                            helper.make_tensor_value_info("b", F32, [4, 3])],
                              [helper.make_empty_tensor_value_info("y")])
    session = mixrt.Session(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(ExecutionError) as caught:
        session.run(None, {"a": np.ones((3, 5), np.float32), "b": np.ones((4, 3), np.float32)})
    message = str(caught.value)
    assert message.startswith("node 'mm' (ai.onnx::MatMul, opset 17) failed: MatMul operands "
                              "(3, 5) and (4, 3) do not share an inner dim (5 against 4)")
    assert "'a' float32[3x5]" in message and "[the kernel raised ValueError: matmul" in message


def test_a_kernel_failure_the_shape_rule_accepts_keeps_the_kernels_words():
    node = helper.make_node("Gather", ["data", "indices"], ["y"], name="gather")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("data", F32, [3]),
                                            helper.make_tensor_value_info("indices", I64, [1])],
                              [helper.make_empty_tensor_value_info("y")])
    session = mixrt.Session(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(ExecutionError) as caught:
        session.run(None, {"data": np.ones(3, np.float32), "indices": np.array([7])})
    message = str(caught.value)
    assert message.startswith("node 'gather' (ai.onnx::Gather, opset 17) failed: ")
    assert "7" in message and "the kernel raised" not in message


# -- axes out of range ------------------------------------------------------------------------

def test_an_axis_out_of_range_is_an_error_not_a_clamp():
    model = _model("Unsqueeze", [F32, I64], opset=17)
    session = mixrt.Session(model.SerializeToString())
    x = np.ones((2, 3), np.float32)
    assert session.run(None, {"x0": x, "x1": np.array([-1], np.int64)})[0].shape == (2, 3, 1)
    with pytest.raises(ExecutionError, match=r"axis 5 is out of range for rank 3"):
        session.run(None, {"x0": x, "x1": np.array([5], np.int64)})


@pytest.mark.parametrize("axis, shape", [(0, (1, 24)), (3, (24, 1)), (-2, (2, 12)),
                                         (-1, (6, 4))])
def test_flatten_takes_every_axis_from_minus_rank_to_rank(axis, shape):
    model = _model("Flatten", [F32], axis=axis)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (got,) = mixrt.Session(model.SerializeToString()).run(None, {"x0": x})
    assert got.shape == shape
    with pytest.raises(ExecutionError, match="out of range"):
        mixrt.Session(_model("Flatten", [F32], axis=4).SerializeToString()).run(None,
                                                                               {"x0": x})


# -- where mixrt itself mixes float types ------------------------------------------------------

def test_a_number_fills_a_bool_input_as_bool():
    """nd.Dropout(x, 0.25, True): training_mode is bool in ONNX; it used to become a float
    array, which the backward's Where refused as a condition."""
    x = nd.array(np.ones((50, 40)))
    x.attach_grad()
    with autograd.record():
        y = nd.Dropout(x, 0.25, True)
    y.backward()
    kept = y.asnumpy() != 0
    np.testing.assert_allclose(x.grad.asnumpy(), kept / 0.75)


def test_hybridized_float64_data_matches_imperative_through_casts():
    net = nn.HybridSequential()
    net.add(nn.Dense(6, activation="relu"), nn.Dense(2))
    net.initialize()
    x = nd.array(np.random.default_rng(0).standard_normal((4, 5)), dtype="float64")
    imperative = net(x).asnumpy()
    net.hybridize()
    hybrid = net(x).asnumpy()
    assert imperative.dtype == hybrid.dtype == np.float64
    np.testing.assert_allclose(hybrid, imperative, rtol=1e-12)


def test_promotion_casts_each_narrow_operand_once():
    from mixrt.ops.ir.types import TensorType
    from mixrt.runtime.graph import Graph, Node, Value
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    graph = Graph(name="g", opsets={"": 17})
    graph.inputs = [Value("x", TensorType(f64, (2, 3)))]
    graph.initializers["w"] = np.ones((3, 3), np.float32)
    graph.nodes = [Node("MatMul", ["x", "w"], ["h"], "mm1", opset=17),
                   Node("MatMul", ["h", "w"], ["y"], "mm2", opset=17)]
    graph.outputs = [Value("y", TensorType(f64, (2, 3)))]
    promote_mixed_floats(graph)
    casts = [n for n in graph.nodes if n.op_type == "Cast"]
    assert [c.inputs for c in casts] == [["w"]]
    assert graph.nodes[1].inputs[1] == graph.nodes[2].inputs[1] == casts[0].outputs[0]
    (y,) = mixrt.Session(graph).run(None, {"x": np.ones((2, 3))})
    assert y.dtype == f64 and np.allclose(y, 9.0)
    assert f32 != f64


def test_a_crafted_mxr_with_mixed_types_is_refused(tmp_path):
    """A .mxr runs as compiled, without the passes; anyone can write one, so its graph is
    checked as an ONNX model is."""
    from mixrt.ops.ir.types import TensorType
    from mixrt.runtime.format import save_mxr
    from mixrt.runtime.graph import Graph, Node, Value
    graph = Graph(name="crafted", opsets={"": 17})
    graph.inputs = [Value("x", TensorType(np.dtype(np.float32), (2,)))]
    graph.initializers["w"] = np.ones(2, np.float64)
    graph.nodes = [Node("Add", ["x", "w"], ["y"], "mixed_add", opset=17)]
    graph.outputs = [Value("y", TensorType(np.dtype(np.float32), (2,)))]
    save_mxr(graph, tmp_path / "crafted.mxr")
    with pytest.raises(GraphError, match="node 'mixed_add'.*'x' \\(tensor\\(float\\)\\) and "
                                         "'w' \\(tensor\\(double\\)\\)"):
        mixrt.Session(str(tmp_path / "crafted.mxr"))


# -- mixrt.nd: the same constraints, imperatively -----------------------------------------------

@pytest.mark.parametrize("function", ["sqrt", "exp", "sigmoid", "softmax", "log"])
def test_nd_refuses_a_dtype_the_op_does_not_take(function):
    """MXNet 1.9.1 computes sqrt/exp/sigmoid/log of int32 in the integers (sqrt(2) == 1)
    and refuses softmax; mixrt refuses them all, naming the op and the fix."""
    x = nd.array(np.array([4, 9, 2], np.int32), dtype="int32")
    with pytest.raises(InputError, match=r"input 0 is int32, which the op does not take "
                                         r"\(it takes .*float32.*\); cast it first"):
        getattr(nd, function)(x)
    np.testing.assert_allclose(getattr(nd, function)(x.astype("float32")).asnumpy(),
                               getattr(nd, function)(nd.array([4.0, 9.0, 2.0])).asnumpy())


def test_nd_ops_that_take_integers_keep_them():
    x = nd.array(np.array([4, -9, 2], np.int32), dtype="int32")
    assert nd.relu(x).dtype == nd.abs(x).dtype == (x + 1).dtype == np.int32
    np.testing.assert_array_equal(nd.abs(x).asnumpy(), [4, 9, 2])


def test_nd_where_takes_a_numeric_condition_as_mxnet_does():
    got = nd.where(nd.array([[1.0, 0.0], [0.0, 2.5]]), nd.ones((2, 2)), nd.zeros((2, 2)))
    np.testing.assert_array_equal(got.asnumpy(), [[1, 0], [0, 1]])


# -- MXNet's reshape codes are not ONNX's ------------------------------------------------------

def test_onnx_reshape_refuses_mxnets_codes():
    """NumPy takes any negative size as -1: Reshape to (0, -3, 0) of (2, 3, 4, 5) gave
    (2, 15, 4) where MXNet means (2, 12, 5)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="merge")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, None)],
                              [helper.make_empty_tensor_value_info("y")],
                              [onnx.numpy_helper.from_array(np.array([0, -3, 0]), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.zeros((2, 3, 4, 5), np.float32)
    with pytest.raises(ExecutionError, match=r"node 'merge'.*only one -1 and no other "
                                             r"negative value"):
        mixrt.Session(model.SerializeToString()).run(None, {"x": x})


def test_mxnets_reshape_codes_mean_the_same_hybridized():
    # NumPy takes any negative size as -1: a hybridized reshape(0, -3, 0) of (2, 3, 4, 5)
    # gave (2, 15, 4). ONNX Reshape refuses -3 now; a symbol writes mixrt::MXReshape
    # (tests/test_mx_reshape.py has the rest).
    from mixrt import sym
    from mixrt.gluon import nn as gluon_nn

    class Merge(gluon_nn.HybridBlock):
        def hybrid_forward(self, F, x):
            return F.reshape(x, (0, -3, 0))

    block = Merge()
    block.initialize()
    x = nd.array(np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5))
    imperative = block(x).asnumpy()
    block.hybridize()
    np.testing.assert_array_equal(block(x).asnumpy(), imperative)
    assert imperative.shape == (2, 12, 5)
    assert sym.Variable("x").reshape((2, -1), reverse=True).eval(
        "cpu", x=np.zeros((3, 4)))[0].shape == (2, 6)  # MXNet's too
    assert sym.Variable("x").reshape((0, -1)).eval("cpu", x=np.zeros((2, 3, 4)))[0].shape \
        == (2, 12)
