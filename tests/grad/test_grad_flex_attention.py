"""Gradients of ai.onnx.preview FlexAttention, differentiated through its expansion
(ops/attention/attention_expansion.py), which writes score_mod and prob_mod into the graph.

* Every ONNX backend case against the gradient of the function body ONNX itself expands it
  to (the ``_expanded_ver26`` models: the same computation in default-domain ops).
* float64 central differences with grouped-query heads and subgraphs that read values of
  the enclosing graph (a learned bias, a slope, a probability weighting): those values get
  gradients too. Second order through the expansion.
* A row that score_mod masks completely has the forward's zero output and finite
  gradients; subgraphs the expansion cannot inline are errors naming the node.
"""

import warnings

import numpy as np
import pytest

import mixrt
from grad.gradcheck import _numeric_gradient, check_second_order
from mixrt.errors import GradientError
from mixrt.importers.onnx import import_model
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

rng = np.random.default_rng(29)
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
F64 = np.dtype(np.float64)
PREVIEW = "ai.onnx.preview"


def _backend_cases() -> dict:
    import onnx.backend.test.loader as loader
    with warnings.catch_warnings():  # the loader's own cases warn while they are built
        warnings.simplefilter("ignore")
        return {case.name: case for case in loader.load_model_tests(kind="node")
                if case.name.startswith("test_flexattention")}


BACKEND = _backend_cases()
UNEXPANDED = sorted(name for name in BACKEND if "expanded" not in name)


def with_weighted_loss(graph: Graph, weights: np.ndarray) -> list[str]:
    """loss = sum(Y * R) with R an input; returns the differentiable inputs' names."""
    wrt = [v.name for v in graph.inputs]
    output = graph.outputs[0].name
    graph.inputs.append(Value("r", TensorType(weights.dtype, weights.shape)))
    graph.nodes += [Node("Mul", [output, "r"], ["weighted"], name="weighted", opset=14),
                    Node("ReduceSum", ["weighted"], ["loss"], name="loss", opset=13,
                         attributes={"keepdims": 0})]
    graph.outputs = [Value("loss")]
    return wrt


def gradients(graph: Graph, feeds: dict, weights: np.ndarray) -> list[np.ndarray]:
    wrt = with_weighted_loss(graph, weights)
    joint = gradient_graph(graph, "loss", wrt)
    return mixrt.Session(joint.graph).run([joint.grads[n] for n in wrt],
                                          {**feeds, "r": weights})


@pytest.mark.parametrize("name", UNEXPANDED)
def test_backend_cases_match_the_gradient_of_onnx_own_expansion(name):
    assert len(UNEXPANDED) >= 11  # the suite's cases: scale, GQA, mods, fp16, double, ...
    case = BACKEND[name]
    inputs = case.data_sets[0][0]
    feeds = {value.name: x for value, x in zip(case.model.graph.input, inputs)}
    output = case.data_sets[0][1][0]
    weights = rng.standard_normal(output.shape).astype(output.dtype)
    mine = gradients(import_model(case.model), feeds, weights)
    theirs = gradients(import_model(BACKEND[f"{name}_expanded_ver26"].model), feeds, weights)
    tolerance = 1e-2 if output.dtype == np.float16 else 1e-6
    for got, expected in zip(mine, theirs):
        assert got.dtype == expected.dtype
        scale = max(1.0, float(np.abs(expected.astype(np.float64)).max()))
        np.testing.assert_allclose(got.astype(np.float64) / scale,
                                   expected.astype(np.float64) / scale, atol=tolerance)


# -- hand-built graphs in float64 ----------------------------------------------------------

def subgraph(name: str, nodes: list[Node], initializers: dict | None = None) -> Graph:
    """A one-input one-output mod: input 's', output 'out'."""
    graph = Graph(name=name, opsets={"": 26})
    graph.inputs = [Value("s", TensorType(F64, None))]
    graph.nodes = nodes
    graph.initializers = dict(initializers or {})
    graph.outputs = [Value("out")]
    return graph


# the query index as a column 'q_col' and the key index as a row 'k_idx' of the scores 's'
POSITIONS = [
    Node("Shape", ["s"], ["q_len"], name="q_len", opset=26, attributes={"start": 2, "end": 3}),
    Node("Shape", ["s"], ["k_len"], name="k_len", opset=26, attributes={"start": 3}),
    Node("Squeeze", ["q_len"], ["q_n"], name="q_n", opset=26),
    Node("Squeeze", ["k_len"], ["k_n"], name="k_n", opset=26),
    Node("Range", ["zero", "q_n", "one"], ["q_idx"], name="q_idx", opset=26),
    Node("Range", ["zero", "k_n", "one"], ["k_idx"], name="k_idx", opset=26),
    Node("Unsqueeze", ["q_idx", "last"], ["q_col"], name="q_col", opset=26),
]
POSITION_CONSTANTS = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64),
                      "last": np.array([1], np.int64)}


def biased_scores() -> Graph:
    """scores + bias + slope * (q_idx - k_idx): a learned bias and an ALiBi-like slope,
    both read from the enclosing graph."""
    return subgraph("score_mod", POSITIONS + [
        Node("Sub", ["q_col", "k_idx"], ["distance"], name="distance", opset=26),
        Node("Cast", ["distance"], ["distance_f"], name="distance_f", opset=26,
             attributes={"to": 11}),
        Node("Mul", ["slope", "distance_f"], ["tilt"], name="tilt", opset=26),
        Node("Add", ["s", "bias"], ["biased"], name="biased", opset=26),
        Node("Add", ["biased", "tilt"], ["out"], name="out", opset=26),
    ], POSITION_CONSTANTS)


def weighted_probs() -> Graph:
    return subgraph("prob_mod", [Node("Mul", ["s", "keep"], ["out"], name="out", opset=26)])


def flex_graph(shapes: dict, attributes: dict, extra_inputs: dict) -> Graph:
    graph = Graph(name="flex", opsets={"": 26, PREVIEW: 1, "mixrt": 1})
    graph.inputs = [Value(n, TensorType(F64, s)) for n, s in {**shapes, **extra_inputs}.items()]
    graph.nodes = [Node("FlexAttention", ["Q", "K", "V"], ["Y"], name="flex", domain=PREVIEW,
                        opset=1, attributes=attributes)]
    graph.outputs = [Value("Y")]
    return graph


def test_grouped_heads_and_captured_values_against_finite_differences():
    """Q, K, V and the three values the mods read from outside, in float64."""
    batch, q_heads, kv_heads, q_len, kv_len, size, v_size = 1, 4, 2, 3, 5, 2, 3
    shapes = {"Q": (batch, q_heads, q_len, size), "K": (batch, kv_heads, kv_len, size),
              "V": (batch, kv_heads, kv_len, v_size)}
    extra = {"bias": (q_heads, q_len, kv_len), "slope": (q_heads, 1, 1),
             "keep": (1, 1, q_len, kv_len)}
    graph = flex_graph(shapes, {"score_mod": biased_scores(), "prob_mod": weighted_probs(),
                                "scale": 0.8}, extra)
    feeds = {n: rng.standard_normal(s) for n, s in {**shapes, **extra}.items()}
    feeds["keep"] = rng.uniform(0.5, 1.5, extra["keep"])
    weights = rng.standard_normal((batch, q_heads, q_len, v_size))
    wrt = with_weighted_loss(graph, weights)
    feeds["r"] = weights
    joint = gradient_graph(graph, "loss", wrt)
    symbolic = mixrt.Session(joint.graph).run([joint.grads[n] for n in wrt], feeds)
    forward = mixrt.Session(graph, opt_level=0)
    for name, got in zip(wrt, symbolic):
        numeric = _numeric_gradient(forward, feeds, name)
        assert np.abs(numeric).max() > 1e-3, name  # every input matters to the loss
        np.testing.assert_allclose(got, numeric, rtol=1e-5, atol=1e-7, err_msg=name)


def test_second_order_through_the_expansion():
    inputs = [rng.standard_normal((1, 2, 3, 2)), rng.standard_normal((1, 1, 4, 2)),
              rng.standard_normal((1, 1, 4, 2))]
    check_second_order("FlexAttention", inputs, {"score_mod": subgraph("cap", [
        Node("Tanh", ["s"], ["out"], name="out", opset=26)])}, domain=PREVIEW)


def causal_minus_infinity(row_masked: int) -> Graph:
    """Where(k_idx <= q_idx, s, -inf), and row ``row_masked`` masked entirely."""
    return subgraph("causal", POSITIONS + [
        Node("LessOrEqual", ["k_idx", "q_col"], ["causal"], name="causal", opset=26),
        Node("Equal", ["q_col", "dead"], ["dead_row"], name="dead_row", opset=26),
        Node("Not", ["dead_row"], ["live_row"], name="live_row", opset=26),
        Node("And", ["causal", "live_row"], ["allowed"], name="allowed", opset=26),
        Node("Where", ["allowed", "s", "minus_inf"], ["out"], name="out", opset=26),
    ], {**POSITION_CONSTANTS, "dead": np.array(row_masked, np.int64),
        "minus_inf": np.array(-np.inf)})


def test_a_row_the_score_mod_masks_entirely_has_zero_output_and_finite_gradients():
    shapes = {n: (1, 2, 4, 3) for n in "QKV"}
    graph = flex_graph(shapes, {"score_mod": causal_minus_infinity(row_masked=2)}, {})
    feeds = {n: rng.standard_normal(s) for n, s in shapes.items()}
    y = mixrt.Session(graph).run(None, feeds)[0]
    assert np.all(y[:, :, 2] == 0) and np.isfinite(y).all()
    weights = rng.standard_normal(y.shape)
    grads = gradients(graph, feeds, weights)
    assert all(np.isfinite(g).all() for g in grads)
    assert np.all(grads[0][:, :, 2] == 0)  # the masked query row reads nothing
    forward = mixrt.Session(graph, opt_level=0)
    for name, got in zip("QKV", grads):
        numeric = _numeric_gradient(forward, {**feeds, "r": weights}, name)
        np.testing.assert_allclose(got, numeric, rtol=1e-5, atol=1e-7, err_msg=name)


def test_a_mod_with_nested_subgraphs_is_a_clear_error():
    branch = subgraph("branch", [Node("Identity", ["s"], ["out"], name="id", opset=26)])
    nested = subgraph("nested", [Node("If", ["flag"], ["out"], name="if", opset=26,
                                      attributes={"then_branch": branch,
                                                  "else_branch": branch})])
    graph = flex_graph({n: (1, 1, 2, 2) for n in "QKV"}, {"score_mod": nested},
                       {"flag": ()})
    graph.inputs[-1] = Value("flag", TensorType(np.dtype(bool), ()))
    graph.nodes.append(Node("ReduceSum", ["Y"], ["loss"], name="loss", opset=13,
                            attributes={"keepdims": 0}))
    graph.outputs = [Value("loss")]
    with pytest.raises(GradientError, match="'flex'.*nested"):
        gradient_graph(graph, "loss", ["Q"])


@needs_gpu
def test_the_gpu_gradients_agree_with_the_cpu_ones():
    shapes = {"Q": (2, 4, 3, 2), "K": (2, 2, 5, 2), "V": (2, 2, 5, 3)}
    extra = {"bias": (4, 3, 5), "slope": (4, 1, 1), "keep": (1, 1, 3, 5)}
    feeds = {n: rng.standard_normal(s) for n, s in {**shapes, **extra}.items()}
    weights = rng.standard_normal((2, 4, 3, 3))
    results = []
    for device in ("cpu", "gpu"):
        graph = flex_graph(shapes, {"score_mod": biased_scores(),
                                    "prob_mod": weighted_probs()}, extra)
        wrt = with_weighted_loss(graph, weights)
        joint = gradient_graph(graph, "loss", wrt)
        results.append(mixrt.Session(joint.graph, device=device).run(
            [joint.grads[n] for n in wrt], {**feeds, "r": weights}))
    for cpu, gpu in zip(*results):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-10, atol=1e-10)
