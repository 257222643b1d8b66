"""onnxruntime's transformer-fusion operators (com.microsoft FusedMatMul, FusedGemm,
FusedConv, the GELU family, the skip/embed/simplified layer normalizations, and
LayerNormalization below opset 17) against onnxruntime itself, float32 and float16."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import mixrt
from grad.gradcheck import check_gradient
from mixrt.errors import ExecutionError, GraphError, MixrtError
from mixrt.ops import REGISTRY
from mixrt.ops.device import gpu_available
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.session import load_graph

MS = "com.microsoft"
rng = np.random.default_rng(0)
TOLERANCES = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float16: dict(rtol=2e-3, atol=2e-3),
              np.float64: dict(rtol=1e-5, atol=1e-6)}


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def ids(high, *shape):
    return rng.integers(0, high, shape).astype(np.int32)


def model(op_type, inputs: dict, outputs, *, domain=MS, opset=17, constants=(), shapes=None,
          **attributes):
    """One node; ``inputs`` name -> array in the op's input order ("" skips an optional
    input, any name starting with "_" is skipped the same way); ``constants`` become
    initializers; ``shapes`` overrides the declared input shapes (symbolic dims)."""
    names = ["" if name.startswith("_") else name for name in inputs]
    node = helper.make_node(op_type, names, list(outputs), domain=domain, **attributes)
    fed = {n: a for n, a in inputs.items() if not n.startswith("_") and n not in constants}
    declared = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(a.dtype), (shapes or {}).get(n, a.shape))
        for n, a in fed.items()]
    graph = helper.make_graph(
        [node], "g", declared, [onnx.ValueInfoProto(name=o) for o in outputs if o],
        initializer=[numpy_helper.from_array(inputs[n], n) for n in constants])
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])


def feeds_of(inputs: dict, constants=()):
    return {n: a for n, a in inputs.items() if not n.startswith("_") and n not in constants}


def compare(op_type, inputs: dict, outputs=("y",), *, dtype=np.float32, constants=(),
            **attributes):
    """Run one node in onnxruntime and mixrt and compare every output; also check that the
    types inferred for the outputs are those the run made."""
    built = model(op_type, inputs, outputs, constants=constants, **attributes)
    data = built.SerializeToString()
    feeds = feeds_of(inputs, constants)
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = mixrt.Session(data).run(None, feeds)
    types = infer_types(load_graph(data))
    for name, want, have in zip([o for o in outputs if o], expected, got):
        assert have.dtype == want.dtype, (name, have.dtype, want.dtype)
        assert have.shape == want.shape, (name, have.shape, want.shape)
        if want.dtype.kind in "iu":
            np.testing.assert_array_equal(have, want, err_msg=name)
        else:
            np.testing.assert_allclose(have.astype(np.float64), want.astype(np.float64),
                                       err_msg=name, **TOLERANCES[np.dtype(dtype).type])
        assert types[name].dtype == have.dtype and types[name].shape == have.shape, \
            (name, types[name], have.shape)
    return got


FLOAT_TYPES = [np.float32, np.float16]


# -- FusedMatMul -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("a_shape,b_shape,attributes", [
    ((3, 4), (4, 5), dict(alpha=0.5)),
    ((4, 3), (5, 4), dict(transA=1, transB=1)),
    ((2, 3, 4), (2, 5, 4), dict(transB=1, alpha=0.125)),
    ((2, 3, 4, 5), (4, 6), dict(transA=1)),
    ((4, 2, 3, 5), (2, 3, 5, 6), dict(transBatchA=1)),
    ((5, 2, 3, 4), (6, 2, 3, 5), dict(transBatchA=1, transA=1, transBatchB=1, transB=1)),
    ((2, 3, 4), (5, 2, 4), dict(transBatchB=1, transB=1)),
    ((2, 3, 4), (4,), dict(transB=1)),
    ((4,), (3, 4, 5), dict(transA=1)),
    ((1, 3, 4), (2, 4, 5), {}),
])
def test_fused_mat_mul(dtype, a_shape, b_shape, attributes):
    compare("FusedMatMul", {"A": randn(*a_shape, dtype=dtype), "B": randn(*b_shape, dtype=dtype)},
            dtype=dtype, **attributes)


def test_fused_mat_mul_with_a_constant_weight_takes_the_packed_product():
    # big enough for the panel kernels of a constant weight (ops/nn/matmul_cpu.py)
    inputs = {"A": randn(2, 64, 128), "B": randn(160, 128)}
    compare("FusedMatMul", inputs, constants=("B",), transB=1, alpha=0.5)


# -- FusedGemm -------------------------------------------------------------------------------

GEMM_ACTIVATIONS = [
    ("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Softsign", {}), ("Softplus", {}),
    ("LeakyRelu", dict(activation_alpha=0.2)), ("Elu", dict(activation_alpha=0.7)),
    ("Celu", dict(activation_alpha=1.5)), ("ThresholdedRelu", dict(activation_alpha=0.3)),
    ("HardSigmoid", dict(activation_alpha=0.3, activation_beta=0.4)),
    ("Selu", dict(activation_alpha=1.6, activation_gamma=1.1)),
    ("ScaledTanh", dict(activation_alpha=2.0, activation_beta=0.5)),
    ("ParametricSoftplus", dict(activation_alpha=1.5, activation_beta=0.5)),
]


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("activation,parameters", GEMM_ACTIVATIONS)
def test_fused_gemm_activations(dtype, activation, parameters):
    inputs = {"A": randn(3, 4, dtype=dtype), "B": randn(5, 4, dtype=dtype),
              "C": randn(5, dtype=dtype)}
    compare("FusedGemm", inputs, dtype=dtype, transB=1, alpha=0.8, beta=0.5,
            activation=activation, **parameters)


def test_fused_gemm_with_a_constant_weight_and_no_bias():
    inputs = {"A": randn(4, 64, dtype=np.float32).T.copy(), "B": randn(64, 32)}
    compare("FusedGemm", inputs, constants=("B",), transA=1, activation="Relu")


def test_fused_gemm_activation_parameters_default_to_the_onnx_ops():
    """onnxruntime insists on activation_alpha; ONNX LeakyRelu's default is 0.01."""
    a, b = randn(3, 4), randn(4, 5)
    data = model("FusedGemm", {"A": a, "B": b}, ["y"], activation="LeakyRelu").SerializeToString()
    product = a @ b
    expected = np.where(product >= 0, product, 0.01 * product)
    np.testing.assert_allclose(mixrt.Session(data).run(None, {"A": a, "B": b})[0], expected,
                               rtol=1e-5, atol=1e-6)


# -- FusedConv -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("activation,parameters", [
    (None, None), ("Relu", None), ("LeakyRelu", [0.1]), ("Clip", [0.0, 1.5]),
    ("HardSigmoid", [0.2, 0.5]), ("Sigmoid", None), ("Tanh", None)])
def test_fused_conv_activations(dtype, activation, parameters):
    inputs = {"X": randn(2, 4, 7, 7, dtype=dtype), "W": randn(6, 4, 3, 3, dtype=dtype),
              "B": randn(6, dtype=dtype)}
    attributes = {} if activation is None else dict(activation=activation)
    if parameters:
        attributes["activation_params"] = parameters
    compare("FusedConv", inputs, dtype=dtype, constants=("W", "B"), pads=[1, 1, 1, 1],
            **attributes)


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
def test_fused_conv_with_a_residual_strides_and_groups(dtype):
    inputs = {"X": randn(1, 4, 9, 9, dtype=dtype), "W": randn(4, 2, 3, 3, dtype=dtype),
              "B": randn(4, dtype=dtype), "Z": randn(1, 4, 4, 4, dtype=dtype)}
    compare("FusedConv", inputs, dtype=dtype, constants=("W",), strides=[2, 2], group=2,
            activation="Relu")


# -- the GELU family -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("op_type,with_bias,attributes", [
    ("Gelu", False, {}), ("FastGelu", False, {}), ("FastGelu", True, {}),
    ("BiasGelu", True, {}), ("QuickGelu", False, {}), ("QuickGelu", False, dict(alpha=1.3))])
def test_gelu_family(dtype, op_type, with_bias, attributes):
    inputs = {"X": randn(2, 5, 16, dtype=dtype) * 3}
    if with_bias:
        inputs["bias"] = randn(16, dtype=dtype)
    compare(op_type, inputs, dtype=dtype, **attributes)


def test_bias_add_is_input_plus_bias_plus_skip():
    x, bias, skip = randn(2, 3, 8), randn(8), randn(2, 3, 8)
    data = model("BiasAdd", {"X": x, "bias": bias, "skip": skip}, ["y"]).SerializeToString()
    got = mixrt.Session(data).run(None, {"X": x, "bias": bias, "skip": skip})[0]
    np.testing.assert_allclose(got, x + bias + skip, rtol=1e-5, atol=1e-6)
    half = {k: v.astype(np.float16) for k, v in dict(X=x, bias=bias, skip=skip).items()}
    data = model("BiasAdd", half, ["y"]).SerializeToString()
    got = mixrt.Session(data).run(None, half)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, (x + bias + skip).astype(np.float16), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("bias_shape,axis", [((2, 1, 5, 5), 3), ((1, 3, 5, 5), -1),
                                             ((2, 1, 1, 5), 2)])
def test_bias_softmax_is_the_softmax_of_the_sum(bias_shape, axis):
    """onnxruntime has no CPU kernel for it: checked against its definition."""
    data, bias = randn(2, 3, 5, 5), randn(*bias_shape)
    built = model("BiasSoftmax", {"data": data, "bias": bias}, ["y"], axis=axis,
                  is_inner_broadcast=int(bias_shape[0] != 1)).SerializeToString()
    got = mixrt.Session(built).run(None, {"data": data, "bias": bias})[0]
    total = (data + bias).astype(np.float64)
    axes = tuple(range(axis % 4, 4))
    exps = np.exp(total - total.max(axis=axes, keepdims=True))
    np.testing.assert_allclose(got, exps / exps.sum(axis=axes, keepdims=True), rtol=1e-5)


# -- SkipLayerNormalization, SkipSimplifiedLayerNormalization ---------------------------------

@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("skip_shape", [(2, 5, 32), (5, 32), (1, 5, 32)])
@pytest.mark.parametrize("with_beta,with_bias", [(True, True), (False, False), (True, False),
                                                 (False, True)])
def test_skip_layer_normalization_all_outputs(dtype, skip_shape, with_beta, with_bias):
    inputs = {"input": randn(2, 5, 32, dtype=dtype) * 2, "skip": randn(*skip_shape, dtype=dtype),
              "gamma": randn(32, dtype=dtype)}
    if with_beta or with_bias:
        inputs["beta" if with_beta else "_beta"] = randn(32, dtype=dtype)
    if with_bias:
        inputs["bias"] = randn(32, dtype=dtype)
    compare("SkipLayerNormalization", inputs, ("y", "mean", "inv_std", "sum"), dtype=dtype,
            constants=("gamma",), epsilon=1e-5)


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("outputs", [("y",), ("y", "", "", "sum")])
def test_skip_layer_normalization_of_a_bert_block(dtype, outputs):
    inputs = {"input": randn(4, 128, 64, dtype=dtype), "skip": randn(4, 128, 64, dtype=dtype),
              "gamma": randn(64, dtype=dtype), "beta": randn(64, dtype=dtype),
              "bias": randn(64, dtype=dtype)}
    compare("SkipLayerNormalization", inputs, outputs, dtype=dtype,
            constants=("gamma", "beta", "bias"))


def test_skip_layer_normalization_of_a_matrix():
    compare("SkipLayerNormalization", {"input": randn(6, 16), "skip": randn(6, 16),
                                       "gamma": randn(16)}, ("y", "mean", "inv_std"))


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_skip_simplified_layer_normalization(dtype, with_bias):
    inputs = {"input": randn(2, 5, 32, dtype=dtype), "skip": randn(5, 32, dtype=dtype),
              "gamma": randn(32, dtype=dtype)}
    if with_bias:
        inputs["bias"] = randn(32, dtype=dtype)
    compare("SkipSimplifiedLayerNormalization", inputs, ("y", "mean", "inv_std", "sum"),
            dtype=dtype, epsilon=1e-6)


# -- SimplifiedLayerNormalization and LayerNormalization below opset 17 ------------------------

@pytest.mark.parametrize("dtype", FLOAT_TYPES + [np.float64])
@pytest.mark.parametrize("axis,outputs", [(-1, ("y",)), (-1, ("y", "inv_std")),
                                          (1, ("y", "inv_std"))])
def test_simplified_layer_normalization(dtype, axis, outputs):
    inputs = {"X": randn(3, 4, 8, dtype=dtype), "scale": randn(*(4, 8)[axis:], dtype=dtype)}
    compare("SimplifiedLayerNormalization", inputs, outputs, dtype=dtype, domain="",
            opset=13, axis=axis, epsilon=1e-5)


def test_simplified_layer_normalization_is_onnxruntimes_default_domain_op():
    """onnxruntime knows it in the default domain only; so does mixrt."""
    assert REGISTRY.find("", "SimplifiedLayerNormalization", 1) is not None
    assert REGISTRY.find(MS, "SimplifiedLayerNormalization", 1) is None
    assert REGISTRY.find(MS, "LayerNormalization", 1) is None


@pytest.mark.parametrize("dtype", FLOAT_TYPES + [np.float64])
@pytest.mark.parametrize("opset", [1, 13, 16])
@pytest.mark.parametrize("axis,outputs", [(-1, ("y",)), (1, ("y", "mean", "inv_std"))])
def test_layer_normalization_below_opset_17(dtype, opset, axis, outputs):
    inputs = {"X": randn(2, 3, 8, dtype=dtype), "Scale": randn(*(3, 8)[axis:], dtype=dtype),
              "B": randn(*(3, 8)[axis:], dtype=dtype)}
    compare("LayerNormalization", inputs, outputs, dtype=dtype, domain="", opset=opset,
            constants=("Scale", "B"), axis=axis, epsilon=1e-4)


def test_layer_normalization_below_17_keeps_its_gradient_and_fast_path():
    early, late = (REGISTRY.find("", "LayerNormalization", v) for v in (13, 17))
    assert early is not late and early.fn is late.fn
    assert early.fast == late.fast and "cpu" in early.fast
    assert early.grad_fn is late.grad_fn is not None
    assert early.expand_fn is late.expand_fn is not None
    x = randn(2, 3, 4).astype(np.float64)
    check_gradient("LayerNormalization", [x, randn(4).astype(np.float64) + 2,
                                          randn(4).astype(np.float64)],
                   {"stash_type": 11}, opset=13)


# -- EmbedLayerNormalization -----------------------------------------------------------------

def embed_inputs(dtype, *, segments=True, mask=True, position_ids=None, batch=3, length=6):
    hidden, vocabulary = 16, 30
    inputs = {"input_ids": ids(vocabulary, batch, length)}
    inputs["segment_ids" if segments else "_segment_ids"] = ids(2, batch, length)
    inputs["word_embedding"] = randn(vocabulary, hidden, dtype=dtype)
    inputs["position_embedding"] = randn(10, hidden, dtype=dtype)
    inputs["segment_embedding" if segments else "_segment_embedding"] = randn(2, hidden,
                                                                               dtype=dtype)
    inputs["gamma"], inputs["beta"] = randn(hidden, dtype=dtype), randn(hidden, dtype=dtype)
    masked = (np.arange(length) < rng.integers(1, length + 1, (batch, 1))).astype(np.int32)
    inputs["mask" if mask else "_mask"] = masked
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    return inputs


EMBED_TABLES = ("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta")


@pytest.mark.parametrize("dtype", FLOAT_TYPES)
@pytest.mark.parametrize("segments,mask", [(True, True), (False, True), (True, False)])
def test_embed_layer_normalization(dtype, segments, mask):
    inputs = embed_inputs(dtype, segments=segments, mask=mask)
    tables = [n for n in EMBED_TABLES if n in inputs]
    compare("EmbedLayerNormalization", inputs, ("y", "mask_index", "sum"), dtype=dtype,
            constants=tables, epsilon=1e-5)


@pytest.mark.parametrize("positions", [np.array([[5, 4, 3, 2, 1, 0]], np.int32),
                                       ids(10, 3, 6)])
def test_embed_layer_normalization_with_position_ids(positions):
    inputs = embed_inputs(np.float32, position_ids=positions)
    compare("EmbedLayerNormalization", inputs, ("y", "mask_index"))


def test_embed_layer_normalization_refuses_an_id_outside_its_table():
    inputs = embed_inputs(np.float32)
    inputs["input_ids"][1, 2] = -1
    data = model("EmbedLayerNormalization", inputs, ["y", "mask_index"]).SerializeToString()
    with pytest.raises(ExecutionError, match=r"EmbedLayerNormalization.*input_ids.*-1"):
        mixrt.Session(data).run(None, feeds_of(inputs))


# -- shape rules with symbolic dims ----------------------------------------------------------

def inferred(op_type, inputs, outputs, shapes, **attributes):
    built = model(op_type, inputs, outputs, shapes=shapes, **attributes).SerializeToString()
    mixrt.Session(built).run(None, feeds_of(inputs))  # it loads and runs
    types = infer_types(load_graph(built))
    return [(types[o].dtype.name, types[o].shape) for o in outputs if o]


def test_symbolic_shapes_of_the_products_and_activations():
    a, b = randn(2, 3, 4), randn(2, 5, 4)
    assert inferred("FusedMatMul", {"A": a, "B": b}, ["y"],
                    {"A": ["N", "S", 4], "B": ["N", 5, 4]}, transB=1) == \
        [("float32", ("N", "S", 5))]
    assert inferred("FusedMatMul", {"A": randn(4, 2, 3, 5), "B": randn(2, 3, 5, 6)}, ["y"],
                    {"A": ["K", "N", "H", 5], "B": ["N", "H", 5, 6]}, transBatchA=1) == \
        [("float32", ("N", "H", "K", 6))]
    assert inferred("FusedGemm", {"A": randn(3, 4), "B": randn(4, 5)}, ["y"],
                    {"A": ["M", 4]}, activation="Relu") == [("float32", ("M", 5))]
    assert inferred("FusedConv", {"X": randn(1, 2, 6, 6), "W": randn(3, 2, 3, 3)}, ["y"],
                    {"X": ["N", 2, "H", "W"]}, activation="Relu") == \
        [("float32", ("N", 3, "H-2", "W-2"))]  # a 3x3 window unpadded: two fewer
    x16 = randn(2, 3, 8, dtype=np.float16)
    for op_type in ("Gelu", "FastGelu", "QuickGelu"):
        assert inferred(op_type, {"X": x16}, ["y"], {"X": ["N", "S", 8]}) == \
            [("float16", ("N", "S", 8))]


def test_symbolic_shapes_of_the_normalizations():
    inputs = {"input": randn(2, 5, 8), "skip": randn(2, 5, 8), "gamma": randn(8)}
    both = {"input": ["B", "S", 8], "skip": ["B", "S", 8]}
    assert inferred("SkipLayerNormalization", inputs, ["y", "mean", "inv_std", "sum"], both) \
        == [("float32", ("B", "S", 8)), ("float32", ("B", "S", 1)),
            ("float32", ("B", "S", 1)), ("float32", ("B", "S", 8))]
    half = {k: v.astype(np.float16) for k, v in inputs.items()}
    assert inferred("SkipSimplifiedLayerNormalization", half, ["y", "", "inv_std"], both) \
        == [("float16", ("B", "S", 8)), ("float32", ("B", "S", 1))]
    assert inferred("SimplifiedLayerNormalization", {"X": randn(2, 5, 8), "s": randn(8)},
                    ["y", "inv_std"], {"X": ["B", "S", 8]}, domain="", opset=13) == \
        [("float32", ("B", "S", 8)), ("float32", ("B", "S", 1))]
    inputs = embed_inputs(np.float32)
    assert inferred("EmbedLayerNormalization", inputs, ["y", "mask_index", "sum"],
                    {"input_ids": ["B", "S"], "segment_ids": ["B", "S"],
                     "mask": ["B", "S"]}) == \
        [("float32", ("B", "S", 16)), ("int32", ("B",)), ("float32", ("B", "S", 16))]


# -- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type,inputs,attributes,words", [
    ("FusedMatMul", {"A": randn(2, 3, 4), "B": randn(2, 3, 4)}, {}, "inner dim"),
    ("FusedMatMul", {"A": randn(2, 3, 4), "B": randn(4, 5)}, dict(transBatchA=1),
     "transBatchA"),
    ("FusedGemm", {"A": randn(3, 4), "B": randn(4, 5)}, dict(activation="Gelu"),
     "activation 'Gelu'"),
    ("FusedConv", {"X": randn(1, 2, 5, 5), "W": randn(3, 2, 3, 3)},
     dict(activation="LeakyRelu"), "activation_params"),
    ("SkipLayerNormalization", {"input": randn(2, 3, 8), "skip": randn(2, 3, 8),
                                "gamma": randn(7)}, {}, "gamma has shape"),
    ("SkipLayerNormalization", {"input": randn(2, 3, 8), "skip": randn(2, 1, 8),
                                "gamma": randn(8)}, {}, "skip has shape"),
    ("EmbedLayerNormalization", {"input_ids": ids(5, 2, 3), "_s": None,
                                 "word_embedding": randn(5, 8), "position_embedding": randn(4, 6),
                                 "_e": None, "gamma": randn(8), "beta": randn(8)}, {},
     "position_embedding has shape"),
    ("FastGelu", {"X": randn(2, 8), "bias": randn(2, 1, 8)}, {}, "does not broadcast onto"),
])
def test_bad_input_names_the_node(op_type, inputs, attributes, words):
    built = model(op_type, inputs, ["y"], **attributes)
    built.graph.node[0].name = "the_node"
    with pytest.raises(MixrtError, match=rf"the_node.*{words}") as info:
        mixrt.Session(built.SerializeToString()).run(None, feeds_of(inputs))
    assert isinstance(info.value, (GraphError, ExecutionError))


def test_bad_input_with_symbolic_dims_fails_at_run_naming_the_node():
    inputs = {"input": randn(2, 3, 8), "skip": randn(2, 3, 8), "gamma": randn(8)}
    built = model("SkipLayerNormalization", inputs, ["y"],
                  shapes={"input": ["B", "S", "H"], "skip": ["B", "S", "H"], "gamma": ["G"]})
    built.graph.node[0].name = "residual_norm"
    with pytest.raises(ExecutionError, match=r"residual_norm.*gamma has shape \(6,\)"):
        mixrt.Session(built.SerializeToString()).run(None, dict(inputs, gamma=randn(6)))


# -- the GPU ---------------------------------------------------------------------------------

GPU_CASES = [
    ("FusedMatMul", {"A": randn(4, 2, 3, 5), "B": randn(2, 3, 5, 6)}, ("y",),
     dict(transBatchA=1, alpha=0.5)),
    ("FusedGemm", {"A": randn(3, 4), "B": randn(5, 4), "C": randn(5)}, ("y",),
     dict(transB=1, activation="LeakyRelu", activation_alpha=0.2)),
    ("FusedGemm", {"A": randn(3, 4), "B": randn(4, 5)}, ("y",), dict(activation="Selu")),
    ("FusedConv", {"X": randn(1, 2, 6, 6), "W": randn(3, 2, 3, 3), "B": randn(3)}, ("y",),
     dict(activation="Relu")),
    ("FastGelu", {"X": randn(2, 5, 16), "bias": randn(16)}, ("y",), {}),
    ("BiasGelu", {"X": randn(2, 5, 16), "bias": randn(16)}, ("y",), {}),
    ("QuickGelu", {"X": randn(2, 5, 16)}, ("y",), {}),
    ("SkipLayerNormalization", {"input": randn(2, 5, 16), "skip": randn(5, 16),
                                "gamma": randn(16), "beta": randn(16)},
     ("y", "mean", "inv_std", "sum"), {}),
    ("SkipSimplifiedLayerNormalization", {"input": randn(2, 5, 16), "skip": randn(2, 5, 16),
                                          "gamma": randn(16)}, ("y", "mean", "inv_std"), {}),
    ("EmbedLayerNormalization", embed_inputs(np.float32), ("y", "mask_index", "sum"), {}),
]


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("op_type,inputs,outputs,attributes", GPU_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(GPU_CASES)])
def test_the_gpu_computes_what_the_cpu_does(op_type, inputs, outputs, attributes):
    data = model(op_type, inputs, outputs, **attributes).SerializeToString()
    feeds = feeds_of(inputs)
    on_cpu = mixrt.Session(data).run(None, feeds)
    on_gpu = mixrt.Session(data, device="gpu:0").run(None, feeds)
    for name, want, have in zip(outputs, on_cpu, on_gpu):
        assert have.dtype == want.dtype and have.shape == want.shape, name
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_onnx_gelu_on_the_cpu_runs_the_compiled_program_with_the_numpy_forms_values(
        approximate, dtype):
    from mixrt.ops.elementwise.activation import gelu
    from mixrt.ops.attention.contrib_transformer import gelu_cpu
    X = (randn(3, 70) * 4).astype(dtype)
    X[0, :4] = [np.inf, -np.inf, np.nan, 0]
    with np.errstate(all="ignore"):  # inf * 0 in the tanh form: NaN, as both compute it
        expected = gelu.kernels[0].fn(np, X, approximate=approximate)
    out = np.empty_like(X)
    got = gelu_cpu(np, X, approximate=approximate, out=out)
    assert got.dtype == X.dtype and got.shape == X.shape
    tolerance = {np.float16: 1e-3, np.float32: 2e-6, np.float64: 1e-12}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                               rtol=tolerance, atol=tolerance)
    with pytest.raises(ValueError, match="approximate"):
        gelu_cpu(np, X, approximate="erf")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_onnx_hard_swish_on_the_cpu_gives_the_numpy_forms_bits(dtype):
    from mixrt.ops.elementwise.activation import hard_swish
    from mixrt.ops.attention.contrib_transformer import hard_swish_cpu
    X = (randn(2, 8, 9, 9) * 4).astype(dtype)
    X.flat[:5] = [np.nan, np.inf, -np.inf, 3, -3]
    with np.errstate(all="ignore"):  # inf * 1, -inf * 0: NaN in both
        expected = hard_swish.kernels[0].fn(np, X)
    got = hard_swish_cpu(np, X, out=np.empty_like(X))
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == X.dtype


@pytest.mark.parametrize("shape, axis", [((2, 7, 64), -1), ((3, 5, 4, 6), 2), ((1, 1, 1), -1)])
def test_rms_normalization_on_the_cpu_compiled_as_the_numpy_form(monkeypatch, shape, axis):
    from mixrt.ops.compiled import jit_cpu
    from mixrt.ops.nn import row_kernels
    from mixrt.ops.attention.contrib_norm import (simplified_layer_normalization,
                                        simplified_layer_normalization_cpu)
    if not jit_cpu.enabled():
        pytest.skip("the compiled tier needs numba")
    compiled = []
    original = row_kernels.rms_norm
    monkeypatch.setattr(row_kernels, "rms_norm", lambda *a: compiled.append(1) or original(*a))
    X = randn(*shape) * 3
    X[0, 0] = np.nan  # a NaN fills its own row only
    scale = randn(*shape[axis % len(shape):])
    expected = simplified_layer_normalization.kernels[0].fn(np, X, scale, axis=axis,
                                                            epsilon=1e-6)
    out = np.empty_like(X)
    got = simplified_layer_normalization_cpu(np, X, scale, axis=axis, epsilon=1e-6, out=out)
    assert got is out and compiled
    np.testing.assert_allclose(got, expected, rtol=3e-6, atol=1e-6)
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    in_place = X.copy()
    simplified_layer_normalization_cpu(np, in_place, scale, axis=axis, epsilon=1e-6,
                                       out=in_place)
    np.testing.assert_array_equal(in_place, got)
