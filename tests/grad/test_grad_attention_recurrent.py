"""Gradients of LinearAttention and CausalConvWithState
(ops/attention/attention_recurrent_grad.py).

Both ops take float32, float16 and bfloat16 only, so the finite-difference checks call the
forward and backward kernels directly in float64 (the kernels accumulate in float64 when
given it); the graph tests then run the same gradients through ``gradient_graph`` and a
Session in float32 and float16 against those float64 figures. PyTorch's autograd over the
spec's formulas is a second, independent reference where it is installed.
"""

import numpy as np
import pytest

import mixrt
from mixrt.errors import GradientError
from mixrt.ops.attention.attention_recurrent import causal_conv_with_state, linear_attention
from mixrt.ops.attention.attention_recurrent_grad import (causal_conv_with_state_grad,
                                                linear_attention_grad)
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

rng = np.random.default_rng(41)
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
EPS = 1e-6
LA_NAMES = ["query", "key", "value", "past_state", "decay", "beta"]
CC_NAMES = ["input", "weight", "bias", "past_state"]


def central_differences(loss, arrays, index):
    x = arrays[index]
    grad = np.zeros_like(x)
    flat, out = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + EPS
        up = loss(arrays)
        flat[i] = keep - EPS
        down = loss(arrays)
        flat[i] = keep
        out[i] = (up - down) / (2 * EPS)
    return grad


def check_kernels(forward, backward, arrays, attributes, *, read=(0, 1)):
    """Backward kernel against central differences of loss = sum_k <Y_k, R_k> over the
    outputs in ``read`` (the others get no gradient: None, as autodiff passes them)."""
    outputs = forward.fn(np, *arrays, **attributes)
    weights = [rng.standard_normal(y.shape) if k in read else None
               for k, y in enumerate(outputs)]

    def loss(values):
        return sum(float((y * r).sum()) for y, r in
                   zip(forward.fn(np, *values, **attributes), weights) if r is not None)

    grads = backward.fn(np, *weights, *arrays, **attributes)
    present = [i for i, a in enumerate(arrays) if a is not None]
    assert len(grads) == len(present)
    for grad, index in zip(grads, present):
        numeric = central_differences(loss, arrays, index)
        assert grad.shape == arrays[index].shape
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8,
                                   err_msg=f"{forward.fn.__name__}: input {index}")


# -- LinearAttention ----------------------------------------------------------------------

def la_case(*, batch=2, steps=5, q_heads=4, kv_heads=2, d_k=3, d_v=2, past=True,
            scalar_decay=False, scalar_beta=False, dtype=np.float64):
    """Keys scaled down and decays negative, as the delta rule expects of real models (an
    L2-normalised key keeps the state bounded)."""
    arrays = [rng.standard_normal((batch, steps, q_heads * d_k)),
              0.5 * rng.standard_normal((batch, steps, kv_heads * d_k)),
              rng.standard_normal((batch, steps, kv_heads * d_v)),
              rng.standard_normal((batch, kv_heads, d_k, d_v)) if past else None,
              -rng.uniform(0.05, 1.0, (batch, steps, kv_heads * (1 if scalar_decay else d_k))),
              rng.uniform(0.1, 0.9, (batch, steps, 1 if scalar_beta else kv_heads))]
    attributes = {"q_num_heads": q_heads, "kv_num_heads": kv_heads}
    return [None if a is None else a.astype(dtype) for a in arrays], attributes


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("chunk_size", [1, 2, 64])
def test_linear_attention_against_finite_differences(rule, chunk_size):
    """Every rule, with checkpoints every token, every other token, and one for the whole
    sequence; decay and beta get zeros under the rules that do not read them."""
    arrays, attributes = la_case()
    check_kernels(linear_attention, linear_attention_grad, arrays,
                  {**attributes, "update_rule": rule, "chunk_size": chunk_size})


@pytest.mark.parametrize("case", [
    {"scalar_decay": True, "scalar_beta": True, "past": False},
    {"q_heads": 2, "kv_heads": 2, "d_k": 4, "d_v": 3, "steps": 7},
    {"q_heads": 3, "kv_heads": 1, "steps": 1},
])
def test_linear_attention_heads_shared_gates_and_no_past(case):
    """Per-head scalar decay and a beta shared by every head (their gradients sum over
    what they broadcast to), multi-head without groups, multi-query decoding of one token."""
    arrays, attributes = la_case(**case)
    check_kernels(linear_attention, linear_attention_grad, arrays,
                  {**attributes, "update_rule": "gated_delta", "chunk_size": 3,
                   "scale": 0.7})


@pytest.mark.parametrize("read", [(0,), (1,)])
def test_linear_attention_with_only_one_output_read(read):
    arrays, attributes = la_case(steps=4)
    check_kernels(linear_attention, linear_attention_grad, arrays,
                  {**attributes, "update_rule": "gated_delta", "chunk_size": 3}, read=read)


def test_the_checkpoint_interval_does_not_change_the_gradients():
    arrays, attributes = la_case(steps=11)
    weights = [rng.standard_normal(y.shape) for y in
               linear_attention.fn(np, *arrays, **attributes)]
    results = [linear_attention_grad.fn(np, *weights, *arrays, **attributes, chunk_size=c)
               for c in (1, 4, 11, 100)]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def _one_node_graph(op_type, names, arrays, attributes, dtype):
    """op -> loss = sum(Y * R) + sum(S * Q), in ``dtype``, with the loss weights as inputs."""
    graph = Graph(name=op_type, opsets={"": 27, "mixrt": 1})
    fed = [n for n, a in zip(names, arrays) if a is not None]
    graph.inputs = [Value(n, TensorType(np.dtype(dtype), np.shape(a)))
                    for n, a in zip(names, arrays) if a is not None]
    graph.inputs += [Value("r", TensorType(np.dtype(dtype), None)),
                     Value("q", TensorType(np.dtype(dtype), None))]
    inputs = [n if a is not None else "" for n, a in zip(names, arrays)]
    while inputs and not inputs[-1]:
        inputs.pop()
    graph.nodes = [Node(op_type, inputs, ["y", "state"], name="layer", opset=27,
                        attributes=attributes),
                   Node("Mul", ["y", "r"], ["yr"], name="yr", opset=14),
                   Node("Mul", ["state", "q"], ["sq"], name="sq", opset=14),
                   Node("ReduceSum", ["yr"], ["ly"], name="ly", opset=13,
                        attributes={"keepdims": 0}),
                   Node("ReduceSum", ["sq"], ["ls"], name="ls", opset=13,
                        attributes={"keepdims": 0}),
                   Node("Add", ["ly", "ls"], ["loss"], name="loss", opset=14)]
    graph.outputs = [Value("loss")]
    return graph, fed


def _graph_gradients(op_type, names, arrays, attributes, weights, dtype, *, device="cpu"):
    graph, fed = _one_node_graph(op_type, names, arrays, attributes, dtype)
    joint = gradient_graph(graph, "loss", fed)
    feeds = {n: a.astype(dtype) for n, a in zip(names, arrays) if a is not None}
    feeds.update(r=weights[0].astype(dtype), q=weights[1].astype(dtype))
    session = mixrt.Session(joint.graph, opt_level=2, device=device)
    return dict(zip(fed, session.run([joint.grads[n] for n in fed], feeds)))


@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 2e-5), (np.float16, 2e-2)])
def test_linear_attention_trains_through_a_session(dtype, tolerance):
    """gradient_graph emits one LinearAttentionGrad node; its float32 and float16 results
    match the float64 kernel's, relative to each gradient's largest element."""
    arrays, attributes = la_case(steps=6)
    attributes.update(update_rule="gated_delta", chunk_size=4)
    weights = [rng.standard_normal(y.shape) for y in
               linear_attention.fn(np, *arrays, **attributes)]
    expected = linear_attention_grad.fn(np, *weights, *arrays, **attributes)
    got = _graph_gradients("LinearAttention", LA_NAMES, arrays, attributes, weights, dtype)
    assert list(got) == LA_NAMES
    for name, reference in zip(LA_NAMES, expected):
        assert got[name].dtype == dtype
        scale = np.abs(reference).max()
        np.testing.assert_allclose(got[name].astype(np.float64) / scale, reference / scale,
                                   atol=tolerance, err_msg=name)


def torch_linear_attention(torch, q, k, v, state, decay, beta, q_heads, kv_heads, rule):
    """The spec's recurrence written out in PyTorch, token by token, per query head."""
    batch, steps, _ = q.shape
    d_k, d_v = k.shape[-1] // kv_heads, v.shape[-1] // kv_heads
    q = q.reshape(batch, steps, q_heads, d_k)
    k = k.reshape(batch, steps, kv_heads, d_k)
    v = v.reshape(batch, steps, kv_heads, d_v)
    g = decay.reshape(batch, steps, kv_heads, -1)
    b = beta.reshape(batch, steps, -1)
    outputs = []
    for t in range(steps):
        new = []
        for h in range(kv_heads):
            s = state[:, h]
            if rule in ("gated", "gated_delta"):
                s = torch.exp(g[:, t, h])[:, :, None] * s
            write = v[:, t, h]
            if rule in ("delta", "gated_delta"):
                read = torch.einsum("bkv,bk->bv", s, k[:, t, h])
                write = b[:, t, h if b.shape[-1] > 1 else 0][:, None] * (write - read)
            new.append(s + k[:, t, h][:, :, None] * write[:, None, :])
        state = torch.stack(new, dim=1)
        group = q_heads // kv_heads
        outputs.append(torch.stack([torch.einsum("bk,bkv->bv", q[:, t, h], state[:, h // group])
                                    for h in range(q_heads)], dim=1) / d_k ** 0.5)
    return torch.stack(outputs, dim=1).reshape(batch, steps, -1), state


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_against_pytorch_autograd(rule):
    torch = pytest.importorskip("torch")
    arrays, attributes = la_case(steps=6, scalar_beta=rule == "delta")
    attributes.update(update_rule=rule)
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, state = torch_linear_attention(torch, *tensors, attributes["q_num_heads"],
                                      attributes["kv_num_heads"], rule)
    weights = [rng.standard_normal(tuple(y.shape)), rng.standard_normal(tuple(state.shape))]
    ((y * torch.tensor(weights[0])).sum() + (state * torch.tensor(weights[1])).sum()).backward()
    got = _graph_gradients("LinearAttention", LA_NAMES, arrays, attributes, weights,
                           np.float32)
    for name, tensor in zip(LA_NAMES, tensors):
        theirs = np.zeros(tensor.shape) if tensor.grad is None else tensor.grad.numpy()
        scale = max(1.0, np.abs(theirs).max())
        np.testing.assert_allclose(got[name] / scale, theirs / scale, atol=3e-5, err_msg=name)


def test_a_gated_delta_layer_learns_its_projections():
    """A token mixer q, k, v = x W_q, x W_k, x W_v -> gated delta LinearAttention, fitted by
    gradient descent on the three weights to the output of other weights: the squared error
    falls a hundredfold, through a planned Session."""
    local = np.random.default_rng(5)  # its own stream: the fit does not hang on test order
    batch, steps, width, heads, d = 2, 6, 4, 2, 2
    x = local.standard_normal((batch, steps, width)).astype(np.float32)
    true = [0.3 * local.standard_normal((width, heads * d)).astype(np.float32)
            for _ in range(3)]
    decay = np.full((batch, steps, heads), -0.2, np.float32)
    beta = np.full((batch, steps, heads), 0.5, np.float32)
    graph = Graph(name="mixer", opsets={"": 27, "mixrt": 1})
    graph.inputs = [Value("x", TensorType(np.dtype(np.float32), x.shape)),
                    Value("decay", TensorType(np.dtype(np.float32), decay.shape)),
                    Value("beta", TensorType(np.dtype(np.float32), beta.shape))]
    graph.inputs += [Value(w, TensorType(np.dtype(np.float32), (width, heads * d)))
                     for w in ("wq", "wk", "wv")]
    graph.nodes = [Node("MatMul", ["x", w], [p], name=p, opset=13)
                   for w, p in (("wq", "q"), ("wk", "k"), ("wv", "v"))]
    graph.nodes.append(Node("LinearAttention", ["q", "k", "v", "", "decay", "beta"],
                            ["y", "state"], name="mix", opset=27,
                            attributes={"q_num_heads": heads, "kv_num_heads": heads}))
    graph.outputs = [Value("y")]
    feeds = {"x": x, "decay": decay, "beta": beta}
    target = mixrt.Session(graph).run(["y"], {**feeds, **dict(zip(("wq", "wk", "wv"),
                                                                   true))})[0]
    graph.inputs.append(Value("target", TensorType(np.dtype(np.float32), target.shape)))
    graph.nodes += [Node("Sub", ["y", "target"], ["diff"], name="diff", opset=14),
                    Node("Mul", ["diff", "diff"], ["sq"], name="sq", opset=14),
                    Node("ReduceSum", ["sq"], ["loss"], name="loss", opset=13,
                         attributes={"keepdims": 0})]
    graph.outputs = [Value("loss")]
    joint = gradient_graph(graph, "loss", ["wq", "wk", "wv"])
    session = mixrt.Session(joint.graph, opt_level=2)
    weights = [w + 0.2 * local.standard_normal(w.shape).astype(np.float32) for w in true]
    losses = []
    for _ in range(300):
        loss, *grads = session.run(["loss"] + [joint.grads[w] for w in ("wq", "wk", "wv")],
                                   {**feeds, "target": target,
                                    **dict(zip(("wq", "wk", "wv"), weights))})
        losses.append(float(loss))
        weights = [w - 0.1 * g for w, g in zip(weights, grads)]
    assert losses[-1] < losses[0] / 100, losses[::50]


# -- CausalConvWithState ------------------------------------------------------------------

def cc_case(*, batch=2, channels=3, length=5, taps=3, bias=True, past=True,
            dtype=np.float64):
    arrays = [rng.standard_normal((batch, channels, length)),
              rng.standard_normal((channels, 1, taps)),
              rng.standard_normal(channels) if bias else None,
              rng.standard_normal((batch, channels, taps - 1)) if past else None]
    return [None if a is None else a.astype(dtype) for a in arrays]


@pytest.mark.parametrize("activation", ["none", "silu", "swish"])
@pytest.mark.parametrize("case", [{}, {"bias": False, "past": False}, {"taps": 1},
                                  {"length": 2, "taps": 4}, {"length": 1}])
def test_causal_conv_against_finite_differences(activation, case):
    """With and without bias and past state, one tap (no state), an input shorter than the
    state (the present state is partly the past's), one token of decoding."""
    check_kernels(causal_conv_with_state, causal_conv_with_state_grad, cc_case(**case),
                  {"activation": activation})


@pytest.mark.parametrize("read", [(0,), (1,)])
def test_causal_conv_with_only_one_output_read(read):
    check_kernels(causal_conv_with_state, causal_conv_with_state_grad, cc_case(length=2),
                  {"activation": "silu"}, read=read)


@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-5), (np.float16, 1e-2)])
def test_causal_conv_trains_through_a_session(dtype, tolerance):
    arrays = cc_case()
    attributes = {"activation": "silu"}
    weights = [rng.standard_normal(y.shape) for y in
               causal_conv_with_state.fn(np, *arrays, **attributes)]
    expected = causal_conv_with_state_grad.fn(np, *weights, *arrays, **attributes)
    got = _graph_gradients("CausalConvWithState", CC_NAMES, arrays, attributes, weights,
                           dtype)
    for name, reference in zip(CC_NAMES, expected):
        assert got[name].dtype == dtype
        scale = np.abs(reference).max()
        np.testing.assert_allclose(got[name].astype(np.float64) / scale, reference / scale,
                                   atol=tolerance, err_msg=name)


def test_causal_conv_against_pytorch_conv1d():
    """PyTorch's depthwise conv1d over the past state and the input laid end to end."""
    torch = pytest.importorskip("torch")
    x, w, b, past = arrays = cc_case(taps=4)
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    padded = torch.cat([tensors[3], tensors[0]], dim=-1)
    y = torch.nn.functional.silu(torch.nn.functional.conv1d(padded, tensors[1], tensors[2],
                                                            groups=x.shape[1]))
    state = padded[:, :, -3:]
    weights = [rng.standard_normal(tuple(y.shape)), rng.standard_normal(tuple(state.shape))]
    ((y * torch.tensor(weights[0])).sum() + (state * torch.tensor(weights[1])).sum()).backward()
    got = _graph_gradients("CausalConvWithState", CC_NAMES, arrays, {"activation": "silu"},
                           weights, np.float32)
    for name, tensor in zip(CC_NAMES, tensors):
        np.testing.assert_allclose(got[name], tensor.grad.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)


# -- both ---------------------------------------------------------------------------------

def test_imperative_autograd_uses_the_same_gradients():
    """mixrt.nd under autograd.record reaches both backward kernels."""
    from mixrt import autograd, nd
    arrays, attributes = la_case(steps=4, dtype=np.float32)
    attributes.update(update_rule="gated_delta")
    x = cc_case(dtype=np.float32)
    weights = [rng.standard_normal(y.shape) for y in linear_attention.fn(np, *arrays,
                                                                         **attributes)]
    c_weights = [rng.standard_normal(y.shape) for y in causal_conv_with_state.fn(np, *x)]
    la_inputs = [nd.array(a) for a in arrays]
    cc_inputs = [nd.array(a) for a in x]
    for a in la_inputs + cc_inputs:
        a.attach_grad()
    with autograd.record():
        y, state = nd.LinearAttention(*la_inputs, **attributes)
        c, c_state = nd.CausalConvWithState(*cc_inputs)
        loss = ((y * nd.array(weights[0].astype(np.float32))).sum()
                + (state * nd.array(weights[1].astype(np.float32))).sum()
                + (c * nd.array(c_weights[0].astype(np.float32))).sum()
                + (c_state * nd.array(c_weights[1].astype(np.float32))).sum())
    loss.backward()
    expected = (list(linear_attention_grad.fn(np, *weights, *arrays, **attributes))
                + list(causal_conv_with_state_grad.fn(np, *c_weights, *x)))
    for name, a, reference in zip(LA_NAMES + CC_NAMES, la_inputs + cc_inputs, expected):
        np.testing.assert_allclose(a.grad.asnumpy(), reference, rtol=1e-4, atol=1e-4,
                                   err_msg=name)


def test_only_the_present_inputs_get_gradients():
    """No past state and no bias: the backward node has one output per input present."""
    arrays = cc_case(bias=False, past=False)
    graph, fed = _one_node_graph("CausalConvWithState", CC_NAMES, arrays, {}, np.float32)
    joint = gradient_graph(graph, "loss", fed)
    kernel, = [n for n in joint.graph.nodes if n.op_type == "CausalConvWithStateGrad"]
    assert len(kernel.outputs) == 2 and sorted(joint.grads) == ["input", "weight"]


@pytest.mark.parametrize("op_type, names, arrays, attributes, kernel", [
    ("LinearAttention", LA_NAMES, la_case(steps=3)[0], la_case()[1], "LinearAttentionGrad"),
    ("CausalConvWithState", CC_NAMES, cc_case(), {}, "CausalConvWithStateGrad"),
])
def test_second_order_is_a_clear_error(op_type, names, arrays, attributes, kernel):
    graph, fed = _one_node_graph(op_type, names, arrays, attributes, np.float32)
    joint = gradient_graph(graph, "loss", fed[:1])
    joint.graph.nodes.append(Node("ReduceSum", [joint.grads[fed[0]]], ["gsum"], name="gsum",
                                  opset=13, attributes={"keepdims": 0}))
    joint.graph.outputs = [Value("gsum")]
    with pytest.raises(GradientError, match=kernel):
        gradient_graph(joint.graph, "gsum", fed[1:2])


@needs_gpu
@pytest.mark.parametrize("op_type, names, forward, case, attributes", [
    ("LinearAttention", LA_NAMES, linear_attention, la_case(steps=9, dtype=np.float32),
     {"update_rule": "gated_delta", "chunk_size": 4}),
    ("CausalConvWithState", CC_NAMES, causal_conv_with_state,
     (cc_case(dtype=np.float32), {}), {"activation": "silu"}),
])
def test_the_gpu_kernels_agree_with_the_cpu_ones(op_type, names, forward, case, attributes):
    arrays, base = case
    attributes = {**base, **attributes}
    weights = [rng.standard_normal(y.shape) for y in forward.fn(np, *arrays, **attributes)]
    cpu = _graph_gradients(op_type, names, arrays, attributes, weights, np.float32)
    gpu = _graph_gradients(op_type, names, arrays, attributes, weights, np.float32,
                           device="gpu")
    for name in cpu:
        np.testing.assert_allclose(gpu[name], cpu[name], rtol=1e-5, atol=1e-5, err_msg=name)
