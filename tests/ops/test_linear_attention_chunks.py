"""LinearAttention's chunked forward (ops/attention/attention_recurrent.py: ``_chunk``) against the
token-by-token recurrence the spec writes, which the backward kernel replays
(ops/attention/attention_recurrent_grad.py: ``_Tokens.step``): every update rule, a decay per head
and per key channel, grouped query heads, chunk sizes that do and do not divide the
sequence, a past state, decays strong enough to overflow a naive exp(-G), and float16."""

import numpy as np
import pytest

import mixrt
from mixrt.ops.attention.attention_recurrent import linear_attention
from mixrt.ops.attention.attention_recurrent_grad import _tokens
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available
from mixrt.runtime.graph import Graph, Node, Value

rng = np.random.default_rng(53)
RULES = ["linear", "gated", "delta", "gated_delta"]


def token_by_token(query, key, value, past, decay, beta, *, q_num_heads, kv_num_heads,
                   update_rule, scale=0.0):
    """Output and final state of the recurrence, one token at a time, in float64."""
    x = _tokens(query, key, value, decay, beta, q_num_heads=q_num_heads,
                kv_num_heads=kv_num_heads, rule=update_rule, scale=scale)
    batch, steps, heads, group, d_k = x.q.shape
    state = past.astype(np.float64) if past is not None else np.zeros(
        (batch, heads, d_k, x.v.shape[-1]))
    outputs = []
    for t in range(steps):
        state = x.step(np, state, t)
        outputs.append(x.scale * np.einsum("bhgk,bhkv->bhgv", x.q[:, t], state))
    return np.stack(outputs, axis=1).reshape(batch, steps, -1), state


def case(*, batch=2, steps=11, q_heads=4, kv_heads=2, d_k=5, d_v=3, per_key=False,
         past=True, decay_scale=1.0):
    keys = rng.standard_normal((batch, steps, kv_heads, d_k))
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)  # as delta-rule models feed them
    return [rng.standard_normal((batch, steps, q_heads * d_k)),
            keys.reshape(batch, steps, -1),
            rng.standard_normal((batch, steps, kv_heads * d_v)),
            rng.standard_normal((batch, kv_heads, d_k, d_v)) if past else None,
            -decay_scale * rng.uniform(0.01, 1.0,
                                       (batch, steps, kv_heads * (d_k if per_key else 1))),
            rng.uniform(0.1, 1.0, (batch, steps, kv_heads))], \
        {"q_num_heads": q_heads, "kv_num_heads": kv_heads}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("per_key", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 3, 4, 64])
def test_chunks_give_the_token_by_token_result(rule, per_key, chunk_size):
    arrays, attributes = case(per_key=per_key)
    attributes["update_rule"] = rule
    want_y, want_state = token_by_token(*arrays, **attributes)
    got_y, got_state = linear_attention.fn(np, *arrays, chunk_size=chunk_size, **attributes)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got_state, want_state, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("per_key", [False, True])
def test_strong_decay_neither_overflows_nor_loses_the_recent_tokens(per_key):
    """Decays of up to -40 a token: exp(-G) over a 64-token chunk would be exp(2560)."""
    arrays, attributes = case(steps=70, per_key=per_key, decay_scale=40.0)
    attributes.update(update_rule="gated_delta", scale=0.5)
    want_y, want_state = token_by_token(*arrays, **attributes)
    got_y, got_state = linear_attention.fn(np, *arrays, chunk_size=64, **attributes)
    assert np.isfinite(got_y).all() and np.isfinite(got_state).all()
    np.testing.assert_allclose(got_y, want_y, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got_state, want_state, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("q_heads, kv_heads, steps, past", [(3, 1, 1, True), (2, 2, 9, False),
                                                            (6, 3, 17, True)])
def test_decoding_one_token_multi_query_and_no_past(q_heads, kv_heads, steps, past):
    arrays, attributes = case(q_heads=q_heads, kv_heads=kv_heads, steps=steps, past=past)
    attributes["update_rule"] = "gated_delta"
    want_y, want_state = token_by_token(*arrays, **attributes)
    got_y, got_state = linear_attention.fn(np, *arrays, chunk_size=8, **attributes)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got_state, want_state, rtol=1e-10, atol=1e-10)


def test_float16_inputs_are_computed_in_float32():
    arrays, attributes = case(steps=40)
    attributes["update_rule"] = "gated_delta"
    half = [None if a is None else a.astype(np.float16) for a in arrays]
    want_y, want_state = token_by_token(*[None if a is None else a.astype(np.float64)
                                          for a in half], **attributes)
    got_y, got_state = linear_attention.fn(np, *half, **attributes)
    assert got_y.dtype == np.float16 and got_state.dtype == np.float16
    np.testing.assert_allclose(got_y.astype(np.float64), want_y, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(got_state.astype(np.float64), want_state, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("per_key", [False, True])
def test_the_gpu_chunks_agree_with_the_cpu_ones(per_key):
    arrays, attributes = case(steps=21, per_key=per_key)
    attributes.update(update_rule="gated_delta", chunk_size=8)
    names = ["query", "key", "value", "past_state", "decay", "beta"]
    graph = Graph(name="linear_attention", opsets={"": 27})
    graph.inputs = [Value(n, TensorType(np.dtype(np.float32), a.shape))
                    for n, a in zip(names, arrays)]
    graph.nodes = [Node("LinearAttention", names, ["y", "state"], name="mix", opset=27,
                        attributes=attributes)]
    graph.outputs = [Value("y"), Value("state")]
    feeds = {n: a.astype(np.float32) for n, a in zip(names, arrays)}
    cpu = mixrt.Session(graph).run(None, feeds)
    gpu = mixrt.Session(graph, device="gpu").run(None, feeds)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
