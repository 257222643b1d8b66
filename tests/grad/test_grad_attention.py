"""Gradients of Attention (opsets 23-25, differentiated through its expansion in
ops/attention/attention_expansion.py) and RotaryEmbedding against float64 finite differences, first
and second order; the expansion's values against the forward kernel (fully masked rows
included); the dynamic-shape paths against static ones; Attention against PyTorch; and a
tiny attention model trained end to end through gradient_graph."""

import numpy as np
import onnx
import pytest

import mixrt
from grad.gradcheck import check_gradient
from mixrt.errors import GradientError
from mixrt.importers.onnx import import_model
from mixrt.ops.attention import attention
from mixrt.ops.ir.registry import REGISTRY
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import GradBuilder, gradient_graph
from mixrt.runtime.passes import typecheck
from mixrt.runtime.passes.infer import infer_types

rng = np.random.default_rng(23)


def randn(*shape):
    return rng.standard_normal(shape)


def qkv(batch=1, q_heads=2, kv_heads=2, q_len=3, kv_len=4, size=2):
    """4D Q, K, V: (batch, heads, seq, size)."""
    return [randn(batch, q_heads, q_len, size), randn(batch, kv_heads, kv_len, size),
            randn(batch, kv_heads, kv_len, size)]


def packed(x):
    """(batch, heads, seq, size) -> the 3D layout (batch, seq, heads*size)."""
    return x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


def causal_past():
    """Two new queries over a past of three: keys 0-3 for the first, 0-4 for the second."""
    return qkv(q_len=2, kv_len=2) + [None, randn(1, 2, 3, 2), randn(1, 2, 3, 2)]


# -- first and second order against finite differences -------------------------------------

CASES = {  # id: (inputs, attributes, opset, outputs)
    "4d-default-scale": (qkv(), {}, 23, 1),
    "3d-heads-scale": ([packed(x) for x in qkv(batch=2)],
                       {"q_num_heads": 2, "kv_num_heads": 2, "scale": 0.7}, 23, 1),
    "4d-gqa": (qkv(q_heads=4, kv_heads=2), {}, 23, 1),
    "3d-gqa-causal": ([packed(x) for x in qkv(q_heads=4, kv_heads=1, q_len=4)],
                      {"q_num_heads": 4, "kv_num_heads": 1, "is_causal": 1}, 23, 1),
    "causal-q-longer-than-keys": (qkv(q_len=4, kv_len=3), {"is_causal": 1}, 23, 1),
    "bool-mask-broadcast": (qkv() + [randn(3, 4) > -0.5], {}, 23, 1),
    "bool-mask-short-padded": (qkv() + [randn(1, 2, 1, 2) > -1.0], {}, 23, 1),
    "float-mask-broadcast": (qkv(batch=2) + [randn(2, 1, 3, 4)], {}, 23, 1),
    "float-mask-short-padded": (qkv() + [randn(3, 2)], {}, 23, 1),
    "past-causal-present": (causal_past(), {"is_causal": 1}, 23, 3),
    "3d-past-gqa-present": ([packed(x) for x in qkv(q_heads=4, kv_heads=2)] + [
        None, randn(1, 2, 2, 2), randn(1, 2, 2, 2)],
        {"q_num_heads": 4, "kv_num_heads": 2}, 23, 3),
    "past-bool-mask-short": (causal_past()[:3] + [np.array([[True, False, True]] * 2)]
                             + causal_past()[4:], {"is_causal": 1}, 23, 1),
    "softcap": (qkv(), {"softcap": 1.5, "scale": 2.0}, 23, 1),
    "softcap-gqa-causal-float-mask": (qkv(q_heads=4, kv_heads=2, q_len=4) + [randn(4, 4)],
                                      {"softcap": 2.0, "is_causal": 1}, 23, 1),
    "nonpad-24": (qkv(batch=2) + [None, None, None, np.array([2, 4])], {}, 24, 1),
    "nonpad-causal-25": (qkv(batch=2, q_len=2) + [None, None, None, np.array([3, 4])],
                         {"is_causal": 1}, 25, 1),
    "windows-25": (qkv(q_len=4, kv_len=4), {"left_window_size": 1, "right_window_size": 1},
                   25, 1),
    "left-window-past-25": (causal_past(), {"is_causal": 1, "left_window_size": 2}, 25, 1),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_attention_gradient(case):
    inputs, attributes, opset, outputs = CASES[case]
    check_gradient("Attention", inputs, attributes, opset=opset, outputs=outputs)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_matmul_output_modes(mode):
    """Every stage the fourth output can show carries a gradient; a finite mask keeps the
    post-mask stage (mode 2) finite, so the loss reading it is too."""
    inputs = qkv(q_heads=4, kv_heads=2) + [randn(3, 4)]
    check_gradient("Attention", inputs, {"softcap": 1.5, "qk_matmul_output_mode": mode},
                   opset=23, outputs=4)


@pytest.mark.parametrize("mode", [0, 1, 3])
def test_attention_qk_output_with_causal_mask(mode):
    check_gradient("Attention", qkv(q_len=4), {"is_causal": 1, "softcap": 3.0,
                                               "qk_matmul_output_mode": mode},
                   opset=23, outputs=4)


# -- fully masked rows: the forward's zero row, no NaN ---------------------------------------

def fully_masked_cases():
    bool_mask = np.array([[True, False, True, True], [False] * 4, [True] * 4])
    float_mask = randn(3, 4)
    float_mask[0] = -np.inf
    float_mask[2, 1] = -np.inf
    return {
        "bool-row": (qkv() + [bool_mask], {}, 24),
        "float-row": (qkv() + [float_mask], {}, 23),
        "nonpad-zero": (qkv(batch=2) + [None, None, None, np.array([0, 3])], {}, 24),
        "window-past-the-keys": (qkv(q_len=4, kv_len=2), {"left_window_size": 0,
                                                          "right_window_size": 0}, 25),
    }


FULLY_MASKED = fully_masked_cases()


@pytest.mark.parametrize("case", FULLY_MASKED, ids=list(FULLY_MASKED))
def test_attention_fully_masked_rows_have_finite_gradients(case):
    inputs, attributes, opset = FULLY_MASKED[case]
    grads = check_gradient("Attention", inputs, attributes, opset=opset)
    assert all(np.all(np.isfinite(g)) for g in grads.values())


def run_expansion(inputs, attributes, opset, outputs):
    """The expansion's outputs, run on their own: the nodes the builder writes for a
    one-node graph."""
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    graph = Graph("attention", opsets={"": opset},
                  inputs=[Value(n, TensorType(x.dtype, x.shape))
                          for n, x in zip(names, inputs) if x is not None])
    node = Node("Attention", names, [f"y{k}" for k in range(outputs)], name="attention",
                opset=opset, attributes=attributes)
    graph.nodes.append(node)
    builder = GradBuilder(graph, infer_types(graph))
    expanded = REGISTRY.find("", "Attention", opset).expand_fn(builder, node)
    written = Graph("expanded", inputs=graph.inputs, outputs=[Value(n) for n in expanded],
                    nodes=builder.nodes, initializers=dict(builder.constants),
                    opsets={"": opset})
    feeds = {n: x for n, x in zip(names, inputs) if x is not None}
    return mixrt.Session(written, opt_level=0).run(None, feeds)


FORWARD_CASES = {**{k: CASES[k] for k in (
    "3d-gqa-causal", "bool-mask-short-padded", "float-mask-short-padded",
    "past-causal-present", "3d-past-gqa-present", "softcap-gqa-causal-float-mask",
    "nonpad-causal-25", "left-window-past-25")},
    **{k: (inputs, attributes, opset, 4) for k, (inputs, attributes, opset)
       in FULLY_MASKED.items()},
    "bool-row-probabilities": (FULLY_MASKED["bool-row"][0], {"qk_matmul_output_mode": 3},
                               24, 4),
    "float-row-masked-scores": (FULLY_MASKED["float-row"][0], {"qk_matmul_output_mode": 2},
                                23, 4)}


@pytest.mark.parametrize("case", FORWARD_CASES, ids=list(FORWARD_CASES))
def test_expansion_matches_the_forward(case):
    inputs, attributes, opset, outputs = FORWARD_CASES[case]
    version = {23: attention.attention_23, 24: attention.attention_24,
               25: attention.attention_25}[opset]
    expected = version(np, *inputs, **attributes, _outputs=outputs)
    got = run_expansion(inputs, attributes, opset, outputs)
    for k, (value, want) in enumerate(zip(got, expected)):
        assert value.shape == want.shape, k
        # atol 0: the forward's zero rows (every key masked) must be exact zeros here too
        np.testing.assert_allclose(value, want, rtol=1e-13, atol=0, err_msg=f"output {k}")
    assert np.all(np.isfinite(got[0]))


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_expansion_takes_the_softmax_at_softmax_precision(dtype, monkeypatch):
    """float64 inputs with a float32 softmax: the forward rounds the probabilities to float32,
    and so must the expansion (at 1e-13 a float64 softmax would not match). Both through
    NumPy's exp: the compiled small-softmax kernel's float32 exp may differ from NumPy's in
    the last bit, which at this tolerance is a mismatch."""
    monkeypatch.setenv("MIXRT_JIT", "0")
    inputs = [x.astype(dtype) for x in qkv(q_len=4, kv_len=5, size=3)]
    attributes = {"softmax_precision": onnx.TensorProto.FLOAT, "qk_matmul_output_mode": 3}
    expected = attention.attention_23(np, *inputs, **attributes, _outputs=4)
    got = run_expansion(inputs, attributes, 23, 4)
    for k, (value, want) in enumerate(zip(got, expected)):
        assert value.dtype == want.dtype == dtype, k
        np.testing.assert_allclose(value, want, rtol=1e-13 if dtype == np.float64 else 1e-3,
                                   atol=0, err_msg=f"output {k}")
    plain = attention.attention_23(np, *inputs, qk_matmul_output_mode=3, _outputs=4)
    if dtype == np.float64:  # the float32 rounding is there to see
        assert np.abs(plain[3] - got[3]).max() > 1e-12


def test_softmax_precision_of_the_inputs_own_type_differentiates():
    check_gradient("Attention", qkv(q_len=3, kv_len=4, size=2),
                   {"softmax_precision": onnx.TensorProto.DOUBLE}, opset=23)


def test_softmax_precision_gradient_is_the_float32_softmax_gradient():
    """float64 inputs, float32 softmax: the backward of the softmax runs in float32 too (as
    PyTorch's autograd of the same casts does)."""
    torch = pytest.importorskip("torch")
    inputs = qkv(q_len=3, kv_len=4, size=2)
    weights = randn(*inputs[0].shape[:-1], inputs[2].shape[-1])
    graph = attention_graph({n: TensorType(np.float64, x.shape) for n, x in zip("qkv", inputs)},
                            {"softmax_precision": onnx.TensorProto.FLOAT}, 23, ["q", "k", "v"])
    joint = gradient_graph(graph, "loss", ["q", "k", "v"])
    types = infer_types(joint.graph)
    assert any(getattr(types.get(out), "dtype", None) == np.float32
               for node in joint.graph.nodes if node.op_type != "Attention"
               for out in node.outputs)
    ours = mixrt.Session(joint.graph, opt_level=0).run(
        [joint.grads[n] for n in "qkv"], {**dict(zip("qkv", inputs)), "r": weights})
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in inputs)
    scores = tq @ tk.transpose(-1, -2) / np.sqrt(inputs[0].shape[-1])
    probs = torch.softmax(scores.float(), dim=-1).double()
    ((probs @ tv) * torch.tensor(weights)).sum().backward()
    for got, x in zip(ours, (tq, tk, tv)):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, x.grad.numpy(), rtol=1e-5, atol=1e-7)


# -- shapes known only at run time -----------------------------------------------------------

def attention_graph(types: dict, attributes: dict, opset: int, names: list) -> Graph:
    """Attention over graph inputs of the given types, loss = sum(Y * R)."""
    graph = Graph("attention", opsets={"": opset},
                  inputs=[Value(n, t) for n, t in types.items()])
    graph.inputs.append(Value("r", TensorType(np.float64, None)))
    graph.nodes = [
        Node("Attention", names, ["y"], name="attention", opset=opset, attributes=attributes),
        Node("Mul", ["y", "r"], ["m"], name="weigh", opset=17),
        Node("ReduceSum", ["m"], ["loss"], name="sum", opset=17, attributes={"keepdims": 0})]
    graph.outputs = [Value("loss")]
    return graph


def gradients(graph: Graph, feeds: dict, wrt: list) -> list:
    joint = gradient_graph(graph, "loss", wrt)
    return mixrt.Session(joint.graph, opt_level=0).run([joint.grads[w] for w in wrt], feeds)


@pytest.mark.parametrize("opset, attributes, extra", [
    (23, {"is_causal": 1}, {"mask": randn(3, 2) > -1.0, "past_key": randn(2, 2, 3, 3),
                            "past_value": randn(2, 2, 3, 3)}),
    (23, {}, {"mask": randn(2, 1, 3, 3)}),
    (24, {"is_causal": 1}, {"nonpad": np.array([4, 5])}),
], ids=["causal-past-short-bool-mask", "short-float-mask", "nonpad"])
def test_symbolic_dims_give_the_static_gradient(opset, attributes, extra):
    """Batch, lengths and head size unknown to inference: the masks, the default scale,
    the padding and the kv head repetition come from Shape nodes."""
    feeds = {"q": randn(2, 4, 3, 3), "k": randn(2, 2, 5, 3), "v": randn(2, 2, 5, 3),
             **extra, "r": randn(2, 4, 3, 3)}
    symbolic = {"q": ("B", 4, "S", "D"), "k": ("B", 2, "T", "D"), "v": ("B", 2, "T", "D"),
                "mask": tuple(f"M{i}" for i in range(np.ndim(extra.get("mask", 0)))),
                "past_key": ("B", 2, "P", "D"), "past_value": ("B", 2, "P", "D"),
                "nonpad": ("B",)}
    slots = ["q", "k", "v", "mask", "past_key", "past_value", "nonpad"]
    names = [n if n in feeds else "" for n in slots]
    while not names[-1]:
        names.pop()
    wrt = ["q", "k", "v"] + [n for n in ("past_key", "past_value") if n in feeds]
    if "mask" in feeds and feeds["mask"].dtype != np.bool_:
        wrt.append("mask")
    static = attention_graph({n: TensorType(feeds[n].dtype, feeds[n].shape)
                              for n in names if n}, attributes, opset, names)
    dynamic = attention_graph({n: TensorType(feeds[n].dtype, symbolic[n])
                               for n in names if n}, attributes, opset, names)
    for got, want in zip(gradients(dynamic, feeds, wrt), gradients(static, feeds, wrt)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


# -- what the expansion does not cover -------------------------------------------------------

def test_unexpanded_qk_output_mode_raises_naming_the_node():
    graph = attention_graph({n: TensorType(np.float64, (1, 2, 3, 2)) for n in "qkv"},
                            {"qk_matmul_output_mode": 4}, 23, ["q", "k", "v"])
    with pytest.raises(GradientError, match="'attention'.*no gradient definition") as error:
        gradient_graph(graph, "loss", ["q"])
    assert error.value.node == "attention"


def test_grouped_query_with_symbolic_heads_raises_naming_the_node():
    types = {"q": TensorType(np.float64, (1, "H", 3, 2)),
             "k": TensorType(np.float64, (1, "G", 4, 2)),
             "v": TensorType(np.float64, (1, "G", 4, 2))}
    with pytest.raises(GradientError, match="'attention'.*static head counts"):
        gradient_graph(attention_graph(types, {}, 23, ["q", "k", "v"]), "loss", ["q"])


def test_nonpad_with_a_past_of_unknown_length_raises():
    types = {"q": TensorType(np.float64, (2, 2, 1, 2)),
             "k": TensorType(np.float64, (2, 2, 1, 2)),
             "v": TensorType(np.float64, (2, 2, 1, 2)),
             "past_key": TensorType(np.float64, (2, 2, "P", 2)),
             "past_value": TensorType(np.float64, (2, 2, "P", 2)),
             "nonpad": TensorType(np.int64, (2,))}
    graph = attention_graph(types, {}, 24, ["q", "k", "v", "", "past_key", "past_value",
                                            "nonpad"])
    with pytest.raises(GradientError, match="'attention'.*static length of past_key"):
        gradient_graph(graph, "loss", ["q"])


# -- RotaryEmbedding ---------------------------------------------------------------------

@pytest.fixture
def rotary_in_float64(monkeypatch):
    """The spec gives RotaryEmbedding no double type, but its kernel is dtype-generic: for
    the float64 finite-difference check, the test lets the kernel and the schema check
    accept it (finite differences in float32 would be noise)."""
    for kernel in attention.rotary_embedding.kernels:
        monkeypatch.setattr(kernel, "dtypes", kernel.dtypes | {"float64"})
    schema_check = typecheck.operand_type_problem

    def allowing_rotary(node, types):
        return None if node.op_type == "RotaryEmbedding" else schema_check(node, types)
    monkeypatch.setattr(typecheck, "operand_type_problem", allowing_rotary)


def caches(rows, half):
    angles = rng.uniform(-np.pi, np.pi, (*rows, half))
    return np.cos(angles), np.sin(angles)


def positions(batch, seq, top):
    return rng.integers(0, top, (batch, seq)).astype(np.int64)


ROTARY = {  # id: (X, caches' leading dims, position ids, attributes); half = rotated / 2
    "4d-by-batch-and-seq": (randn(2, 2, 3, 4), (2, 3), None, {}),
    "4d-interleaved-positions": (randn(2, 2, 3, 4), (5,), positions(2, 3, 5),
                                 {"interleaved": 1}),
    "3d-partial": (randn(2, 3, 12), (4,), positions(2, 3, 4),
                   {"num_heads": 2, "rotary_embedding_dim": 4}),
    "3d-partial-interleaved": (randn(1, 3, 12), (1, 3), None,
                               {"num_heads": 2, "rotary_embedding_dim": 4, "interleaved": 1}),
}


@pytest.mark.parametrize("case", ROTARY, ids=list(ROTARY))
def test_rotary_embedding_gradient(case, rotary_in_float64):
    x, rows, position_ids, attributes = ROTARY[case]
    size = x.shape[-1] // attributes.get("num_heads", 1) if x.ndim == 3 else x.shape[-1]
    cos, sin = caches(rows, attributes.get("rotary_embedding_dim", size) // 2)
    inputs = [x, cos, sin] + ([] if position_ids is None else [position_ids])
    check_gradient("RotaryEmbedding", inputs, attributes, opset=23,
                   constants=tuple(range(1, len(inputs))))


def test_rotary_embedding_gradient_is_the_inverse_rotation():
    """A rotation's adjoint is its inverse: dX of dY = Y is X again (float32, as served)."""
    x = randn(1, 4, 8).astype(np.float32)
    cos, sin = (c.astype(np.float32) for c in caches((6,), 2))
    position_ids = positions(1, 4, 6)
    graph = Graph("rope", opsets={"": 23}, inputs=[
        Value("x", TensorType(np.float32, x.shape)), Value("r", TensorType(np.float32, None))],
        initializers={"cos": cos, "sin": sin, "pos": position_ids})
    graph.nodes = [Node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], name="rope",
                        opset=23, attributes={"num_heads": 2}),
                   Node("Mul", ["y", "r"], ["m"], name="weigh", opset=17),
                   Node("ReduceSum", ["m"], ["loss"], name="sum", opset=17,
                        attributes={"keepdims": 0})]
    graph.outputs = [Value("loss"), Value("y")]
    joint = gradient_graph(graph, "loss", ["x"])
    session = mixrt.Session(joint.graph, opt_level=0)
    (y,) = session.run(["y"], {"x": x, "r": x})
    (dx,) = session.run([joint.grads["x"]], {"x": x, "r": y})
    np.testing.assert_allclose(dx, x, rtol=1e-5, atol=1e-6)


# -- against PyTorch -----------------------------------------------------------------------

def imperative_gradients(q, k, v, weights) -> list:
    """The same gradients through mixrt.autograd's tape (nd.Attention at its opset)."""
    from mixrt import autograd, nd  # noqa: PLC0415

    arrays = [nd.array(x, dtype=np.float64) for x in (q, k, v)]
    for x in arrays:
        x.attach_grad()
    with autograd.record():
        loss = (nd.Attention(*arrays, is_causal=1) * nd.array(weights, dtype=np.float64)).sum()
    loss.backward()
    return [x.grad.asnumpy() for x in arrays]


def test_causal_grouped_query_attention_matches_torch():
    torch = pytest.importorskip("torch")
    q, k, v = qkv(batch=2, q_heads=4, kv_heads=2, q_len=5, kv_len=5, size=3)
    weights = randn(2, 4, 5, 3)
    graph = attention_graph({n: TensorType(np.float64, x.shape) for n, x in zip("qkv", (
        q, k, v))}, {"is_causal": 1}, 23, ["q", "k", "v"])
    symbolic = gradients(graph, {"q": q, "k": k, "v": v, "r": weights}, ["q", "k", "v"])
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    y = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                         enable_gqa=True)
    (y * torch.tensor(weights)).sum().backward()
    expected = [x.grad.numpy() for x in (tq, tk, tv)]
    for ours in (symbolic, imperative_gradients(q, k, v, weights)):
        for got, want in zip(ours, expected):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


# -- a one-layer attention model trained end to end -----------------------------------------

def tiny_transformer_layer():
    """x -> rotary(x Wq), rotary(x Wk), x Wv -> causal grouped-query Attention (2 query
    heads, 1 kv head, 3D) -> Wo; loss = mean((out - target)^2). Opset 23, IR version 10."""
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    batch, seq, width, size = 2, 4, 8, 4
    init = np.random.default_rng(5)
    angles = np.outer(np.arange(seq), 1.0 / 10 ** (np.arange(size // 2) / 2))
    weights = {"Wq": init.normal(0, 0.4, (width, 2 * size)),
               "Wk": init.normal(0, 0.4, (width, size)),
               "Wv": init.normal(0, 0.4, (width, size)),
               "Wo": init.normal(0, 0.4, (2 * size, width)),
               "cos": np.cos(angles), "sin": np.sin(angles)}
    initializers = [numpy_helper.from_array(w.astype(np.float32), n)
                    for n, w in weights.items()]
    initializers.append(numpy_helper.from_array(
        np.tile(np.arange(seq, dtype=np.int64), (batch, 1)), "pos"))
    node = helper.make_node
    nodes = [
        node("MatMul", ["x", "Wq"], ["q"]), node("MatMul", ["x", "Wk"], ["k"]),
        node("MatMul", ["x", "Wv"], ["v"]),
        node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["qr"], num_heads=2),
        node("RotaryEmbedding", ["k", "cos", "sin", "pos"], ["kr"], num_heads=1),
        node("Attention", ["qr", "kr", "v"], ["a"], q_num_heads=2, kv_num_heads=1,
             is_causal=1),
        node("MatMul", ["a", "Wo"], ["out"]), node("Sub", ["out", "target"], ["err"]),
        node("Mul", ["err", "err"], ["sq"]), node("ReduceMean", ["sq"], ["loss"], keepdims=0)]
    shape = [batch, seq, width]
    graph = helper.make_graph(
        nodes, "tiny_layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("target", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)],
                              ir_version=10)
    return model, {n: weights[n].astype(np.float32) for n in ("Wq", "Wk", "Wv", "Wo")}


def test_tiny_attention_layer_trains_with_sgd():
    model, params = tiny_transformer_layer()
    joint = gradient_graph(import_model(model), "loss", list(params))
    session = mixrt.Session(joint.graph)
    data = np.random.default_rng(6)
    x = data.standard_normal((2, 4, 8)).astype(np.float32)
    target = np.tanh(np.roll(x, 1, axis=-1))
    losses = []
    for _ in range(15):
        loss, *grads = session.run([joint.loss] + [joint.grads[n] for n in params],
                                   {"x": x, "target": target, **params})
        losses.append(float(loss))
        params = {n: p - 0.5 * g for (n, p), g in zip(params.items(), grads)}
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.7 * losses[0], losses
