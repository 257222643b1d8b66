"""ONNX export (exporters/onnx.py, exporters/decompose.py) and ``mixrt export``.

Hand-built graphs come back from mixrt's importer as they went in and run in onnxruntime as
they run in mixrt; optimized graphs (fused mixrt-domain ops) export as standard ops at every
opset 13..21; what a target opset cannot express is an ExportError that names the node.
The backend node suite's round trip is tests/conformance/test_roundtrip.py.
"""

import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from mixrt.errors import ExportError
from mixrt.exporters.onnx import export_model, save_model
from mixrt.importers.onnx import import_model
from mixrt.models.zoo import light_model, light_model_with_random_weights
from mixrt.ops.nn.fused import ACTIVATIONS
from mixrt.ops.elementwise.fused_elementwise import OPS
from mixrt.ops.ir.types import SequenceType, tensor
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.session import Session

from helpers import save

TARGETS = range(13, 22)
F32 = np.float32


# -- helpers ---------------------------------------------------------------------------------

def make_graph(nodes, inputs, outputs, initializers=None, opset=17, **domains) -> Graph:
    """A Graph from {name: type} inputs and outputs; ``domains`` adds opsets (mixrt=1)."""
    return Graph("g", [Value(n, t) for n, t in inputs.items()],
                 [Value(n, t) for n, t in outputs.items()], nodes, dict(initializers or {}),
                 {}, {"": opset, **domains})


def node(op_type, inputs, outputs, opset=17, domain="", name="", **attributes) -> Node:
    return Node(op_type, list(inputs), list(outputs), name, domain, opset, attributes)


def checked_export(graph: Graph, opset=None) -> onnx.ModelProto:
    model = export_model(graph, opset)
    onnx.checker.check_model(model, full_check=True)
    return model


def ort_run(model: onnx.ModelProto, feeds: dict) -> list:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_same_outputs(mine, theirs, rtol=1e-5, atol=1e-6):
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        if isinstance(a, list):
            assert_same_outputs(a, b, rtol, atol)
        elif np.asarray(a).dtype == object:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        else:
            np.testing.assert_allclose(np.asarray(a, F32), np.asarray(b, F32), rtol, atol)


def attribute_types(model: onnx.ModelProto, op_type: str) -> dict:
    found = next(n for n in model.graph.node if n.op_type == op_type)
    return {a.name: a.type for a in found.attribute}


def domains_of(model: onnx.ModelProto) -> set:
    return {n.domain for n in model.graph.node}


# -- a hand-built graph, every attribute kind --------------------------------------------------

def every_kind_graph() -> Graph:
    """Symbolic batch, narrow and string initializers, and attributes of every common kind
    (some given as the 'wrong' Python type, which the schema corrects)."""
    rng = np.random.default_rng(0)
    then_branch = make_graph([node("Relu", ["t"], ["r1"], 21)], {}, {"r1": None}, opset=21)
    else_branch = make_graph([node("Neg", ["t"], ["r2"], 21)], {}, {"r2": None}, opset=21)
    nodes = [
        node("MatMul", ["x", "w"], ["h"], 21, name="matmul"),
        node("LeakyRelu", ["h"], ["a"], 21, alpha=1),  # an int where the schema says FLOAT
        node("Cast", ["b16"], ["c"], 21, to=TensorProto.FLOAT),
        node("Add", ["a", "c"], ["s"], 21),
        node("Transpose", ["s"], ["t"], 21, perm=[1, 0]),
        node("If", ["cond"], ["y"], 21, then_branch=then_branch, else_branch=else_branch),
        node("Gelu", ["s"], ["gelu"], 21, approximate="tanh"),
        node("Identity", ["labels"], ["labels_out"], 21),
        node("DequantizeLinear", ["q4", "scale"], ["dq"], 21),
        node("Constant", [], ["floats"], 21, value_floats=[1.5, 2.5]),
        node("Constant", [], ["strings"], 21, value_strings=["a", "bé"]),
        node("Constant", [], ["three"], 21, value=np.array(3.0, F32)),
        node("Transpose", ["three"], ["scalar"], 21, perm=[]),  # an empty INTS
    ]
    initializers = {
        "w": rng.standard_normal((4, 4)).astype(F32),
        "b16": np.array([0.5, -1.0, 2.0, 0.25], ml_dtypes.bfloat16),
        "labels": np.array(["cat", "dog"], dtype=object),
        "q4": np.array([-8, -1, 0, 7], ml_dtypes.int4),
        "scale": np.array(0.5, F32),
    }
    outputs = {"y": tensor(F32, (4, "batch")), "gelu": tensor(F32, ("batch", 4)),
               "labels_out": tensor(object, (2,)), "dq": tensor(F32, (4,)),
               "floats": tensor(F32, (2,)), "strings": tensor(object, (2,)),
               "scalar": tensor(F32, ())}
    inputs = {"x": tensor(F32, ("batch", 4)), "cond": tensor(bool, ())}
    return make_graph(nodes, inputs, outputs, initializers, opset=21)


def test_hand_built_graph_passes_the_full_check_and_runs_like_mixrt():
    graph = every_kind_graph()
    model = checked_export(graph)
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 4)).astype(F32)}
    for cond in (True, False):
        feeds["cond"] = np.array(cond)
        assert_same_outputs(ort_run(model, feeds), Session(graph, opt_level=0).run(None, feeds))


def test_attributes_take_the_schema_type():
    model = checked_export(every_kind_graph())
    assert attribute_types(model, "LeakyRelu") == {"alpha": AttributeProto.FLOAT}
    assert attribute_types(model, "Gelu") == {"approximate": AttributeProto.STRING}
    assert attribute_types(model, "If") == {"then_branch": AttributeProto.GRAPH,
                                            "else_branch": AttributeProto.GRAPH}
    perms = [a for n in model.graph.node if n.op_type == "Transpose" for a in n.attribute]
    assert [(a.type, list(a.ints)) for a in perms] == [(AttributeProto.INTS, [1, 0]),
                                                       (AttributeProto.INTS, [])]
    constants = {a.name: a.type for n in model.graph.node if n.op_type == "Constant"
                 for a in n.attribute}
    assert constants == {"value_floats": AttributeProto.FLOATS,
                         "value_strings": AttributeProto.STRINGS, "value": AttributeProto.TENSOR}


def test_reimport_gives_back_the_graph():
    graph = every_kind_graph()
    back = import_model(checked_export(graph))
    assert [(n.op_type, n.inputs, n.outputs) for n in back.nodes] == \
        [(n.op_type, n.inputs, n.outputs) for n in graph.nodes]
    assert back.nodes[1].attributes == {"alpha": 1.0}
    assert back.nodes[5].attributes["then_branch"].nodes[0].op_type == "Relu"
    for name, array in graph.initializers.items():
        assert back.initializers[name].dtype == array.dtype
        np.testing.assert_array_equal(back.initializers[name], array)
    assert [(v.name, v.type) for v in back.inputs] == [(v.name, v.type) for v in graph.inputs]
    assert back.type_of("y").shape == (4, "batch")  # symbolic dims stay dim_params
    assert back.opsets == {"": 21}


def test_attributes_without_a_schema_keep_their_python_kind():
    thing = node("Thing", ["x"], ["y"], 1, "com.example", count=3, ratio=0.5, mode="fast",
                 sizes=[1, 2], mixed=[1, 2.5], nothing=[])
    graph = make_graph([thing], {"x": tensor(F32, (2,))}, {"y": tensor(F32, (2,))},
                       **{"com.example": 1})
    model = export_model(graph)
    assert attribute_types(model, "Thing") == {
        "count": AttributeProto.INT, "ratio": AttributeProto.FLOAT,
        "mode": AttributeProto.STRING, "sizes": AttributeProto.INTS,
        "mixed": AttributeProto.FLOATS, "nothing": AttributeProto.INTS}
    assert {(o.domain, o.version) for o in model.opset_import} == {("com.example", 1)}


def test_sparse_constant_exports_as_sparse():
    dense = np.zeros((3, 4), F32)
    dense[1, 2], dense[2, 0] = 5.0, -1.0
    graph = make_graph([node("Constant", [], ["c"], sparse_value=dense)], {},
                       {"c": tensor(F32, (3, 4))})
    model = checked_export(graph)
    sparse = model.graph.node[0].attribute[0].sparse_tensor
    assert list(sparse.dims) == [3, 4]
    assert numpy_helper.to_array(sparse.indices).tolist() == [6, 8]
    assert numpy_helper.to_array(sparse.values).tolist() == [5.0, -1.0]
    # onnxruntime hands a sparse constant back as a SparseTensor; mixrt reads it dense
    np.testing.assert_array_equal(Session(model, opt_level=0).run(None, {})[0], dense)


def test_sequence_output():
    graph = make_graph([node("SequenceConstruct", ["x", "x"], ["seq"])],
                       {"x": tensor(F32, (3, 4))}, {"seq": SequenceType(tensor(F32, (3, 4)))})
    x = np.arange(12, dtype=F32).reshape(3, 4)
    (sequence,) = ort_run(checked_export(graph), {"x": x})
    assert len(sequence) == 2 and np.array_equal(sequence[1], x)


def test_provenance_and_ir_version():
    graph = make_graph([node("Relu", ["x"], ["y"], 13)], {"x": tensor(F32, (2,))},
                       {"y": tensor(F32, (2,))}, opset=13)
    graph.metadata.update(producer="pytorch 2.5", source_opset=13, doc_string="relu", ir_version=7)
    model = checked_export(graph)
    props = {p.key: p.value for p in model.metadata_props}
    assert model.producer_name == "mixrt" and model.doc_string == "relu"
    assert props == {"source_producer": "pytorch 2.5", "source_opset": "13"}
    assert model.ir_version == 7  # the lowest IR version opset 13 allows


def test_initializers_listed_as_inputs_before_ir4_stay_constants():
    graph = import_model(light_model("squeezenet").path)  # IR 3: every weight is an input
    model = checked_export(graph)
    assert [v.name for v in model.graph.input] == ["data_0"]


# -- target opsets -----------------------------------------------------------------------------

def test_an_unchanged_op_is_only_relabelled():
    graph = make_graph([node("Relu", ["x"], ["y"], 14)], {"x": tensor(F32, (2,))},
                       {"y": tensor(F32, (2,))}, opset=14)
    model = checked_export(graph, 21)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 21)]
    assert [n.op_type for n in model.graph.node] == ["Relu"]


@pytest.mark.parametrize("source, target", [(17, 18), (18, 13)])
def test_the_version_converter_moves_reduce_mean_axes(source, target):
    x = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(F32)
    if source < 18:
        mean = node("ReduceMean", ["x"], ["y"], source, name="mean", axes=[1], keepdims=1)
        initializers = {}
    else:
        mean = node("ReduceMean", ["x", "axes"], ["y"], source, name="mean", keepdims=1)
        initializers = {"axes": np.array([1], np.int64)}
    graph = make_graph([mean], {"x": tensor(F32, ("batch", 3, 4))},
                       {"y": tensor(F32, ("batch", 1, 4))}, initializers, opset=source)
    model = checked_export(graph, target)
    exported = next(n for n in model.graph.node if n.op_type == "ReduceMean")
    assert (len(exported.input) == 2) == (target >= 18)
    np.testing.assert_allclose(ort_run(model, {"x": x})[0], x.mean(axis=1, keepdims=True),
                               rtol=1e-6)


def test_a_change_that_only_added_types_is_relabelled_down():
    """Relu 14 only added integer types: a float Relu built at 21 is written at 13, and
    BatchNormalization 15 (which split its type parameter) at 14, with no converter."""
    bn = node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], 21, name="bn")
    relu = node("Relu", ["y"], ["z"], 21)
    ones, zeros = np.ones(2, F32), np.zeros(2, F32)
    graph = make_graph([bn, relu], {"x": tensor(F32, (1, 2, 3))}, {"z": tensor(F32, (1, 2, 3))},
                       {"s": ones, "b": zeros, "m": zeros, "v": ones}, opset=21)
    x = np.random.default_rng(0).standard_normal((1, 2, 3)).astype(F32)
    for target in (14, 13):
        model = checked_export(graph, target)
        assert [(o.domain, o.version) for o in model.opset_import] == [("", target)]
        np.testing.assert_allclose(ort_run(model, {"x": x})[0],
                                   np.maximum(x / np.sqrt(1 + 1e-5), 0), rtol=1e-5)


def test_a_type_the_target_lacks_is_not_relabelled():
    graph = make_graph([node("Relu", ["x"], ["y"], 21, name="int_relu")],
                       {"x": tensor(np.int32, (2,))}, {"y": tensor(np.int32, (2,))}, opset=21)
    with pytest.raises(ExportError, match=r"node 'int_relu': Relu cannot be exported at opset "
                                          r"13 .*lowest opset .* 14"):
        export_model(graph, 13)


def test_newer_ops_are_lowered_for_older_opsets():
    """LayerNormalization (17) and Gelu (20, both forms) written in older opsets' ops."""
    rng = np.random.default_rng(1)
    x, scale, bias = (rng.standard_normal(s).astype(F32) for s in ((2, 3, 4), (4,), (4,)))
    nodes = [node("LayerNormalization", ["x", "scale", "bias"], ["n"], 21, epsilon=1e-3),
             node("Gelu", ["n"], ["g"], 21), node("Gelu", ["g"], ["y"], 21, approximate="tanh")]
    graph = make_graph(nodes, {"x": tensor(F32, (2, 3, 4))}, {"y": tensor(F32, (2, 3, 4))},
                       {"scale": scale, "bias": bias}, opset=21)
    expected = Session(graph).run(None, {"x": x})[0]
    for target in (13, 17, 19, 21):
        model = checked_export(graph, target)
        ops = {n.op_type for n in model.graph.node}
        assert ("LayerNormalization" in ops) == (target >= 17)
        assert ("Gelu" in ops) == (target >= 20)
        np.testing.assert_allclose(ort_run(model, {"x": x})[0], expected, rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("name, options, shape", [
    ("lenet", {"size": 8, "pad": 2}, (2, 1, 8, 8)),
    ("transformer", {"vocab": 30, "seq": 8, "hidden": 16, "heads": 2, "layers": 1}, (2, 8)),
    ("resnet18", {"classes": 4}, (1, 3, 32, 32)),
])
def test_symbol_zoo_exports_at_every_opset(tmp_path, name, options, shape):
    import mixrt  # noqa: PLC0415
    from mixrt.models import get_symbol  # noqa: PLC0415
    mixrt.random.seed(0)
    symbol = get_symbol(name, **options)
    integer = name == "transformer"
    executor = symbol.simple_bind("cpu", data=shape,
                                  type_dict={"data": np.int64} if integer else None)
    executor.init_params()
    rng = np.random.default_rng(0)
    data = rng.integers(0, 30, shape) if integer else rng.standard_normal(shape).astype(F32)
    expected = executor.forward(data=data)[0]
    graph = executor.to_graph()
    for target in (TARGETS if name != "resnet18" else (13, 21)):
        model = export_model(graph, target)
        np.testing.assert_allclose(ort_run(model, {"data": data})[0], expected, rtol=1e-4,
                                   atol=2e-5, err_msg=f"{name} at opset {target}")


I32 = np.int32


def _bitwise_graph():
    return make_graph([node("BitwiseAnd", ["x", "x"], ["y"], 18, name="mask_bits")],
                      {"x": tensor(I32, (2,))}, {"y": tensor(I32, (2,))}, opset=18)


def test_an_op_newer_than_the_target_is_an_export_error():
    with pytest.raises(ExportError, match=r"node 'mask_bits': BitwiseAnd cannot be exported "
                                          r"at opset 13 .*did not exist yet.* lowest opset "
                                          r".* 18"):
        export_model(_bitwise_graph(), 13)


def test_a_change_the_converter_cannot_undo_is_an_export_error():
    """Pad's axes as a run-time input: neither the lowering (which folds constant axes) nor
    onnx's converter can write it before opset 18."""
    pad = node("Pad", ["x", "pads", "", "axes"], ["y"], 18, name="padding", mode="constant")
    graph = make_graph([pad], {"x": tensor(F32, (2, 3)), "axes": tensor(np.int64, (1,))},
                       {"y": tensor(F32, (2, 5))}, {"pads": np.array([1, 1], np.int64)},
                       opset=18)
    with pytest.raises(ExportError, match=r"node 'padding': Pad cannot be exported at opset 13 "
                                          r"\(the version converter cannot adapt it.*18"):
        export_model(graph, 13)


def test_opset_18_forms_pytorch_writes_are_lowered_for_older_opsets():
    """What torch.onnx.export(dynamo=True) writes at opset 18+: Mish, Split by num_outputs
    (even and uneven), Pad with constant axes, ReduceMean with constant axes (and with none,
    under noop_with_empty_axes). Each is rewritten for 13 and 17 and still computes what it
    computed (onnxruntime at the target against mixrt at 18)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 7, 4)).astype(F32)
    nodes = [node("Mish", ["x"], ["m"], 18),
             node("Split", ["m"], ["a", "b", "c"], 18, axis=1, num_outputs=3),  # 3, 3, 1
             node("Split", ["a"], ["a1", "a2"], 18, axis=2, num_outputs=2),  # 2, 2
             node("Pad", ["c", "pads", "", "axes"], ["p"], 18, mode="reflect"),
             node("ReduceMean", ["b", "mean_axes"], ["r"], 18, keepdims=1),
             node("ReduceMax", ["a2", ""], ["same"], 18, noop_with_empty_axes=1)]
    outputs = {"a1": tensor(F32, (2, 3, 2)), "p": tensor(F32, (2, 1, 8)),
               "r": tensor(F32, (2, 3, 1)), "same": tensor(F32, (2, 3, 2))}
    graph = make_graph(nodes, {"x": tensor(F32, (2, 7, 4))}, outputs,
                       {"pads": np.array([2, 2], np.int64), "axes": np.array([-1], np.int64),
                        "mean_axes": np.array([2], np.int64)}, opset=18)
    expected = Session(graph).run(None, {"x": x})
    for target in (13, 17):
        model = checked_export(graph, target)
        assert {"Mish", "Identity"} & {n.op_type for n in model.graph.node} == {"Identity"}
        assert all(not n.attribute or n.op_type != "Split" or
                   "num_outputs" not in {a.name for a in n.attribute} for n in model.graph.node)
        assert_same_outputs(ort_run(model, {"x": x}), expected)


@pytest.mark.parametrize("op_type", ["ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
                                     "ReduceLogSumExp"])
def test_a_reduction_over_no_axis_lowers_to_its_elementwise_part(op_type):
    """noop_with_empty_axes with no axes is not Identity for the reductions that square, take
    the absolute value or the log first: at opsets before 18 it lowers to that op."""
    x = np.abs(np.random.default_rng(3).standard_normal((2, 3))).astype(F32) + 0.1
    x[0] *= -1 if op_type != "ReduceLogSum" else 1
    graph = make_graph([node(op_type, ["x", ""], ["y"], 18, noop_with_empty_axes=1)],
                       {"x": tensor(F32, (2, 3))}, {"y": tensor(F32, (2, 3))}, opset=18)
    expected = Session(graph).run(None, {"x": x})
    assert_same_outputs(ort_run(checked_export(graph, 18), {"x": x}), expected)
    assert_same_outputs(ort_run(checked_export(graph, 13), {"x": x}), expected)


def test_a_conversion_onnx_gets_wrong_is_refused():
    norm = node("GroupNormalization", ["x", "scale", "bias"], ["y"], 18, name="norm",
                num_groups=2)
    graph = make_graph([norm], {"x": tensor(F32, (1, 4, 2, 2))}, {"y": tensor(F32, (1, 4, 2, 2))},
                       {"scale": np.ones(2, F32), "bias": np.zeros(2, F32)}, opset=18)
    with pytest.raises(ExportError, match=r"node 'norm': GroupNormalization cannot be exported "
                                          r"at opset 21 \(onnx's converter treats"):
        export_model(graph, 21)


@pytest.mark.parametrize("opset", [0, 99, "17", True])
def test_an_opset_onnx_does_not_define_is_an_export_error(opset):
    graph = make_graph([node("Relu", ["x"], ["y"])], {"x": tensor(F32, (2,))},
                       {"y": tensor(F32, (2,))})
    with pytest.raises(ExportError, match="cannot export at opset"):
        export_model(graph, opset)


# -- decompositions of the mixrt domain --------------------------------------------------------

_PARAMS = {"Pow": [3.0], "Clip": [-0.5, 0.75], "LeakyRelu": [0.1], "HardSigmoid": [0.3, 0.4]}
_POSITIVE = {"Log", "Sqrt", "Pow"}  # ops whose test input must be positive


def fused_elementwise_graph(op: str, opset: int, params=None) -> Graph:
    """``op`` alone in a FusedElementwise program; a binary op reads a Scalar literal."""
    if OPS[op].arity == 2:
        attributes = dict(ops=["Scalar", op], operands=[0, 1], params=[0.75])
    else:
        attributes = dict(ops=[op], operands=[0], params=params or _PARAMS.get(op, []))
    fused = node("FusedElementwise", ["x"], ["y"], 1, "mixrt", name="chain", **attributes)
    return make_graph([fused], {"x": tensor(F32, ("n", 5))}, {"y": tensor(F32, ("n", 5))},
                      opset=opset, mixrt=1)


def ramp(op: str) -> np.ndarray:
    x = np.linspace(-2.0, 2.0, 15, dtype=F32).reshape(3, 5)
    return np.abs(x) + F32(0.1) if op in _POSITIVE else x


@pytest.mark.parametrize("opset", [10, 17])
@pytest.mark.parametrize("op", sorted(set(OPS) - {"Scalar"}))
def test_every_fused_elementwise_step_decomposes(op, opset):
    graph = fused_elementwise_graph(op, opset)
    model = checked_export(graph)
    assert domains_of(model) == {""}
    x = ramp(op)
    assert_same_outputs(ort_run(model, {"x": x}), Session(graph, opt_level=0).run(None, {"x": x}))


def test_a_one_sided_clip_leaves_the_other_bound_out():
    graph = fused_elementwise_graph("Clip", 17, params=[-np.inf, 0.5])
    model = checked_export(graph)
    clip = next(n for n in model.graph.node if n.op_type == "Clip")
    assert clip.input[1] == "" and len(clip.input) == 3
    x = ramp("Clip")
    np.testing.assert_array_equal(ort_run(model, {"x": x})[0], np.minimum(x, F32(0.5)))


def fused_product_graph(op_type: str, activation: str) -> tuple[Graph, dict]:
    rng = np.random.default_rng(3)
    params = {"LeakyRelu": [0.1], "HardSigmoid": [0.2, 0.5], "Clip": [0.0, 6.0]}
    extra = dict(activation=activation, activation_params=params.get(activation, [])) \
        if activation else {}
    if op_type == "FusedConv":
        inputs, shapes = ["x", "w", "b", "z"], [(1, 2, 5, 5), (3, 2, 3, 3), (3,), (1, 3, 5, 5)]
        extra.update(pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    elif op_type == "FusedGemm":
        inputs, shapes = ["x", "w", "b"], [(2, 4), (3, 4), (3,)]
        extra.update(transB=1, alpha=0.5)
    else:
        inputs, shapes = ["x", "w", "b", "z"], [(2, 3, 4), (4, 3), (3,), (2, 3, 3)]
    arrays = {n: rng.standard_normal(s).astype(F32) for n, s in zip(inputs, shapes)}
    fused = node(op_type, inputs, ["y"], 1, "mixrt", name="product", **extra)
    feeds = {n: arrays[n] for n in ("x", "z") if n in arrays}
    graph = make_graph([fused], {n: tensor(F32, a.shape) for n, a in feeds.items()},
                       {"y": tensor(F32, None)},
                       {n: a for n, a in arrays.items() if n not in feeds}, opset=13, mixrt=1)
    return graph, feeds


@pytest.mark.parametrize("activation", ["", *ACTIVATIONS])
@pytest.mark.parametrize("op_type", ["FusedConv", "FusedGemm", "FusedMatMul"])
def test_fused_products_decompose(op_type, activation):
    graph, feeds = fused_product_graph(op_type, activation)
    model = checked_export(graph)
    assert domains_of(model) == {""}
    assert_same_outputs(ort_run(model, feeds), Session(graph, opt_level=0).run(None, feeds),
                        rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_attention_decomposes(masked, opset):
    rng = np.random.default_rng(4)
    shapes = {"q": (2, 5, 3, 8), "k": (2, 6, 3, 8), "v": (2, 6, 3, 4), "m": (2, 1, 1, 6)}
    feeds = {n: rng.standard_normal(s).astype(F32) for n, s in shapes.items()
             if masked or n != "m"}
    fused = node("FusedAttention", list(feeds), ["y"], 1, "mixrt", name="attention",
                 scale=0.35)
    graph = make_graph([fused], {n: tensor(F32, a.shape) for n, a in feeds.items()},
                       {"y": tensor(F32, None)}, opset=opset, mixrt=1)
    model = checked_export(graph)
    assert domains_of(model) == {""}
    assert [n.op_type for n in model.graph.node].count("Transpose") == 4
    assert_same_outputs(ort_run(model, feeds), Session(graph, opt_level=0).run(None, feeds),
                        rtol=1e-5, atol=1e-6)


def test_heads_first_attention_with_its_nan_guard_decomposes():
    rng = np.random.default_rng(6)
    shapes = {"q": (2, 1, 3, 8), "k": (2, 3, 6, 8), "v": (2, 3, 6, 4), "m": (2, 1, 1, 6)}
    feeds = {n: rng.standard_normal(s).astype(F32) for n, s in shapes.items()}
    feeds["m"][1] = -np.inf  # the second batch's query sees no key: the guard zeroes it
    fused = node("FusedAttention", list(feeds), ["y"], 1, "mixrt", name="attention",
                 scale=0.35, heads_first=[0, 1, 1], nan_to_zero=1)
    graph = make_graph([fused], {n: tensor(F32, a.shape) for n, a in feeds.items()},
                       {"y": tensor(F32, None)}, opset=17, mixrt=1)
    model = checked_export(graph)
    kinds = [n.op_type for n in model.graph.node]
    # Q brought heads first, K^T of heads-first K, the output: V is used as it is
    assert kinds.count("Transpose") == 3 and {"IsNaN", "Where"} <= set(kinds)
    expected = Session(graph, opt_level=0).run(None, feeds)
    assert (expected[0][1] == 0).all()
    assert_same_outputs(ort_run(model, feeds), expected, rtol=1e-5, atol=1e-6)


def test_grouped_heads_attention_decomposes_with_gathers():
    rng = np.random.default_rng(8)
    shapes = {"q": (1, 4, 2, 8), "k": (1, 2, 6, 8), "v": (1, 2, 6, 4)}
    feeds = {n: rng.standard_normal(s).astype(F32) for n, s in shapes.items()}
    fused = node("FusedAttention", list(feeds), ["y"], 1, "mixrt", name="attention",
                 scale=0.35, heads_first=[1, 1, 1], kv_repeat=2)
    graph = make_graph([fused], {n: tensor(F32, a.shape) for n, a in feeds.items()},
                       {"y": tensor(F32, None)}, opset=17, mixrt=1)
    model = checked_export(graph)
    assert [n.op_type for n in model.graph.node].count("Gather") == 2
    expected = Session(graph, opt_level=0).run(None, feeds)
    assert expected[0].shape == (1, 2, 4, 4)
    assert_same_outputs(ort_run(model, feeds), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [9, 13, 18])  # Split's three forms, axis -1 from 11
def test_fused_rotary_decomposes_into_its_halves(opset):
    rng = np.random.default_rng(9)
    shapes = {"x": (1, 3, 5, 8), "cos": (1, 1, 5, 8), "sin": (1, 1, 5, 8)}
    feeds = {n: rng.standard_normal(s).astype(F32) for n, s in shapes.items()}
    fused = node("FusedRotary", list(feeds), ["y"], 1, "mixrt", name="rotary")
    graph = make_graph([fused], {n: tensor(F32, a.shape) for n, a in feeds.items()},
                       {"y": tensor(F32, None)}, opset=opset, mixrt=1)
    model = checked_export(graph)
    assert domains_of(model) == {""}
    assert {"Split", "Neg", "Concat"} <= {n.op_type for n in model.graph.node}
    # the same float operations in the same order: the same bits
    np.testing.assert_array_equal(ort_run(model, feeds)[0],
                                  Session(graph, opt_level=0).run(None, feeds)[0])


def test_a_mixrt_op_without_decomposition_is_an_export_error():
    grad = node("ReluGrad", ["dy", "y"], ["dx"], 1, "mixrt", name="relu_backward")
    graph = make_graph([grad], {"dy": tensor(F32, (2,)), "y": tensor(F32, (2,))},
                       {"dx": tensor(F32, (2,))}, mixrt=1)
    with pytest.raises(ExportError, match=r"node 'relu_backward': mixrt::ReluGrad has no "
                                          r"standard ONNX decomposition"):
        export_model(graph)


# -- optimized zoo-like models at every opset --------------------------------------------------

def mlp_with_gelu() -> tuple[onnx.ModelProto, dict]:
    """A transformer-style block at opset 13: dense + GELU + dense + residual, then a Gemm
    with ReLU6 and an elementwise tail; every fused kind appears once compiled."""
    rng = np.random.default_rng(5)
    weights = {"w1": (16, 32), "b1": (32,), "w2": (32, 16), "b2": (16,), "w3": (8, 16),
               "b3": (8,)}
    initializers = [numpy_helper.from_array(rng.standard_normal(s).astype(F32) * 0.3, n)
                    for n, s in weights.items()]
    initializers += [numpy_helper.from_array(np.array(v, F32), n) for n, v in
                     (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5), ("zero", 0.0),
                      ("six", 6.0), ("two", 2.0))]
    make = helper.make_node
    nodes = [make("MatMul", ["x", "w1"], ["h1"]), make("Add", ["h1", "b1"], ["h2"]),
             make("Div", ["h2", "sqrt2"], ["g1"]), make("Erf", ["g1"], ["g2"]),
             make("Add", ["g2", "one"], ["g3"]), make("Mul", ["h2", "g3"], ["g4"]),
             make("Mul", ["g4", "half"], ["gelu"]), make("MatMul", ["gelu", "w2"], ["d1"]),
             make("Add", ["d1", "b2"], ["d2"]), make("Add", ["d2", "x"], ["res"]),
             make("Gemm", ["res", "w3", "b3"], ["p1"], transB=1),
             make("Clip", ["p1", "zero", "six"], ["p2"]), make("Pow", ["p2", "two"], ["t1"]),
             make("Mul", ["t1", "half"], ["t2"]), make("LeakyRelu", ["t2"], ["y"], alpha=0.1)]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, {"x": rng.standard_normal((3, 16)).astype(F32)}


# squeezenet with seeded He-initialized weights instead of its constant ones, so the outputs
# depend on every layer (and its logits are an output too)
ZOO_LIKE = {"squeezenet": lambda: light_model_with_random_weights("squeezenet", seed=4),
            "mlp": mlp_with_gelu}
FUSED_KINDS = {"squeezenet": {"FusedConv"},
               "mlp": {"FusedMatMul", "FusedGemm", "FusedElementwise"}}


@pytest.fixture(scope="module")
def compiled():
    """name -> (optimized mixrt session, feeds, its outputs), built once."""
    found = {}
    for name, build in ZOO_LIKE.items():
        model, feeds = build()
        session = Session(model, opt_level=2)
        found[name] = (session, feeds, session.run(None, feeds))
    return found


@pytest.mark.parametrize("opset", TARGETS)
@pytest.mark.parametrize("name", ZOO_LIKE)
def test_optimized_models_export_at_every_opset(compiled, name, opset):
    session, feeds, expected = compiled[name]
    assert FUSED_KINDS[name] <= {n.op_type for n in session.graph.nodes if n.domain == "mixrt"}
    model = checked_export(session.graph, opset)
    assert domains_of(model) == {""}
    assert [(o.domain, o.version) for o in model.opset_import] == [("", opset)]
    assert_same_outputs(ort_run(model, feeds), expected, rtol=1e-4, atol=1e-5)


# -- mixrt export ------------------------------------------------------------------------------

def mixrt(*args):
    return subprocess.run([sys.executable, "-c", "from mixrt.cli import main; "
                           "raise SystemExit(main())", *args], capture_output=True, text=True)


def test_cli_exports_a_compiled_mxr_at_an_opset(tmp_path):
    model, feeds = mlp_with_gelu()
    source = save(model, tmp_path / "mlp.onnx")
    compiled = mixrt("compile", source, "-o", str(tmp_path / "mlp.mxr"), "--dim", "batch=3")
    assert compiled.returncode == 0, compiled.stderr
    result = mixrt("export", str(tmp_path / "mlp.mxr"), "-o", str(tmp_path / "out.onnx"),
                   "--opset", "17")
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout and "opset 17" in result.stdout
    exported = onnx.load(tmp_path / "out.onnx")
    onnx.checker.check_model(exported, full_check=True)
    expected = Session(str(tmp_path / "mlp.mxr")).run(None, feeds)
    assert_same_outputs(ort_run(exported, feeds), expected, rtol=1e-4, atol=1e-5)


def test_cli_export_error_is_one_line(tmp_path):
    save_model(_bitwise_graph(), tmp_path / "bits.onnx")
    result = mixrt("export", str(tmp_path / "bits.onnx"), "-o", str(tmp_path / "old.onnx"),
                   "--opset", "13")
    assert result.returncode == 2
    assert result.stderr.startswith("mixrt: error: node 'mask_bits': BitwiseAnd cannot be "
                                    "exported")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "old.onnx").exists()
