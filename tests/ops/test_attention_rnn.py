"""Attention and recurrent kernels on cases the ONNX backend suite covers thinly:
sequence_lens with reversed directions, activation lists with alpha/beta, clip, coupled
gates, state chaining of the stateful ops, and shape inference. Recurrent layers are checked
against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mixrt.ops.attention import attention, attention_recurrent
from mixrt.ops.rnn import recurrence, rnn
from mixrt.ops.ir.types import TensorType, tensor

rng = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def run_ort(op_type, inputs, outputs, opset, **attrs):
    """Run one node in onnxruntime; ``inputs`` is name -> array (None = omitted)."""
    names = [n if a is not None else "" for n, a in inputs.items()]
    node = helper.make_node(op_type, names, outputs, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items() if a is not None],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {n: a for n, a in inputs.items() if a is not None})


def assert_all_close(ours, theirs, rtol=1e-4, atol=1e-5):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# -- recurrent layers against onnxruntime ------------------------------------------------

@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_sequence_lens_peepholes_clip(direction):
    seq, batch, inp, hid = 5, 3, 4, 6
    dirs = 2 if direction == "bidirectional" else 1
    inputs = dict(X=randn(seq, batch, inp), W=randn(dirs, 4 * hid, inp),
                  R=randn(dirs, 4 * hid, hid), B=randn(dirs, 8 * hid),
                  sequence_lens=np.array([5, 2, 3], np.int32),
                  initial_h=randn(dirs, batch, hid), initial_c=randn(dirs, batch, hid),
                  P=randn(dirs, 3 * hid))
    attrs = dict(hidden_size=hid, direction=direction, clip=1.5)
    expected = run_ort("LSTM", inputs, ["Y", "Y_h", "Y_c"], 14, **attrs)
    assert_all_close(rnn.lstm_14(np, *inputs.values(), **attrs), expected)


def test_lstm_input_forget_and_layout_1():
    seq, batch, inp, hid = 4, 2, 3, 5
    inputs = dict(X=randn(seq, batch, inp), W=randn(1, 4 * hid, inp),
                  R=randn(1, 4 * hid, hid), B=None, sequence_lens=None,
                  initial_h=randn(1, batch, hid), initial_c=None, P=None)
    attrs = dict(hidden_size=hid, input_forget=1)
    expected = run_ort("LSTM", inputs, ["Y", "Y_h", "Y_c"], 14, **attrs)
    assert_all_close(rnn.lstm_14(np, *inputs.values(), **attrs), expected)
    # onnxruntime has no batch-first LSTM: check layout=1 against the transposed layout 0.
    batch_first = dict(inputs, X=inputs["X"].swapaxes(0, 1),
                       initial_h=inputs["initial_h"].swapaxes(0, 1))
    y, h, c = rnn.lstm_14(np, *batch_first.values(), layout=1, **attrs)
    assert_all_close([y.transpose(1, 2, 0, 3), h.swapaxes(0, 1), c.swapaxes(0, 1)], expected)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_reverse_sequence_lens(linear_before_reset):
    seq, batch, inp, hid = 4, 3, 2, 3
    inputs = dict(X=randn(seq, batch, inp), W=randn(2, 3 * hid, inp),
                  R=randn(2, 3 * hid, hid), B=randn(2, 6 * hid),
                  sequence_lens=np.array([1, 4, 3], np.int32), initial_h=None)
    attrs = dict(hidden_size=hid, direction="bidirectional",
                 linear_before_reset=linear_before_reset)
    expected = run_ort("GRU", inputs, ["Y", "Y_h"], 14, **attrs)
    assert_all_close(rnn.gru_14(np, *inputs.values(), **attrs), expected)


def test_sequence_length_zero_agrees_with_onnxruntime_and_out_of_range_is_refused():
    """A length of 0 outputs zeros and keeps the initial state (onnxruntime does so too);
    a length below 0 or past the sequence is an error in the forward and the backward, not
    a read past the sequence."""
    from mixrt.ops.rnn import rnn_grad  # noqa: PLC0415
    seq, batch, inp, hid = 3, 2, 2, 3
    inputs = dict(X=randn(seq, batch, inp), W=randn(2, 3 * hid, inp),
                  R=randn(2, 3 * hid, hid), B=randn(2, 6 * hid),
                  sequence_lens=np.array([0, 3], np.int32), initial_h=randn(2, batch, hid))
    attrs = dict(hidden_size=hid, direction="bidirectional")
    expected = run_ort("GRU", inputs, ["Y", "Y_h"], 14, **attrs)
    assert_all_close(rnn.gru_14(np, *inputs.values(), **attrs), expected)
    for lengths in ([4, 1], [-1, 2]):
        bad = dict(inputs, sequence_lens=np.array(lengths, np.int32))
        with pytest.raises(ValueError, match=r"outside \[0, 3\]"):
            rnn.gru_14(np, *bad.values(), **attrs)
        with pytest.raises(ValueError, match=r"outside \[0, 3\]"):
            rnn_grad.gru_grad(np, np.ones((seq, 2, batch, hid), np.float32), None,
                              *bad.values(), **attrs)
    with pytest.raises(ValueError, match=r"expected \(2,\)"):
        rnn.gru_14(np, *dict(inputs, sequence_lens=np.array([1, 2, 3], np.int32)).values(),
                   **attrs)


def test_rnn_activation_alpha_beta_consumed_in_order():
    seq, batch, inp, hid = 3, 2, 3, 4
    inputs = dict(X=randn(seq, batch, inp), W=randn(2, hid, inp), R=randn(2, hid, hid))
    attrs = dict(hidden_size=hid, direction="bidirectional",
                 activations=["LeakyRelu", "HardSigmoid"],
                 activation_alpha=[0.3, 0.1], activation_beta=[0.6])
    expected = run_ort("RNN", inputs, ["Y", "Y_h"], 14, **attrs)
    assert_all_close(rnn.rnn_14(np, *inputs.values(), **attrs), expected)


def test_rnn_opset7_has_no_layout_and_output_count_truncates():
    assert "layout" not in rnn.rnn_7.kernels[0].attribute_names
    assert "layout" in rnn.rnn_14.kernels[0].attribute_names
    X, W, R = randn(2, 1, 3), randn(1, 4, 3), randn(1, 4, 4)
    (y,) = rnn.rnn_7(np, X, W, R, _outputs=1)
    assert y.shape == (2, 1, 1, 4)


def test_recurrent_float16_runs_wide_and_returns_float16():
    X, W, R = randn(3, 2, 3, dtype=np.float16), randn(1, 12, 3, dtype=np.float16), \
        randn(1, 12, 4, dtype=np.float16)
    y, h = rnn.gru_14(np, X, W, R)
    y32, h32 = rnn.gru_14(np, X.astype(np.float32), W.astype(np.float32), R.astype(np.float32))
    assert y.dtype == h.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float32), y32, rtol=2e-3, atol=2e-3)


def test_recurrent_infer_layouts():
    x = tensor(np.float32, ("S", "N", 3))
    w, r = tensor(np.float32, (2, 16, 3)), tensor(np.float32, (2, 16, 4))
    y, yh, yc, workspace = rnn.lstm_14.kernels[0].infer_fn(
        x, w, r, direction="bidirectional")
    assert y.shape == ("S", 2, "N", 4) and yh.shape == yc.shape == (2, "N", 4)
    # the training forward's extra output (rnn_grad.py): the 8 cache entries LSTMGrad reads
    # with sigmoid and tanh, the 4 pre-activations too when clipped
    assert workspace.shape == (2, "S", 8, "N", 4)
    clipped = rnn.lstm_14.kernels[0].infer_fn(x, w, r, direction="bidirectional", clip=1.0)
    assert clipped[3].shape == (2, "S", 12, "N", 4)
    y, yh, workspace = rnn.gru_14.kernels[0].infer_fn(
        tensor(np.float32, ("N", "S", 3)), tensor(np.float32, (1, 12, 3)),
        tensor(np.float32, (1, 12, 4)), layout=1, hidden_size=4)
    assert y.shape == ("N", "S", 1, 4) and yh.shape == ("N", 1, 4)
    assert workspace.shape == (1, "S", 4, "N", 4)


def recurrent_model(op_type, shapes, **attributes):
    """One recurrent node whose inputs (name -> shape, None: absent) are graph inputs."""
    names = [name if shape is not None else "" for name, shape in shapes.items()]
    node = helper.make_node(op_type, names, ["Y"], **attributes)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
                      for name, shape in shapes.items() if shape is not None],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)],
                             ir_version=8).SerializeToString()


# static shapes: the load-time check shows a node to its infer function only when every
# input's shape is known (runtime/passes/typecheck.py)
LSTM_SHAPES = dict(X=(5, 2, 3), W=(2, 16, 3), R=(2, 16, 4), B=(2, 32), sequence_lens=None,
                   initial_h=(2, 2, 4), initial_c=(2, 2, 4), P=(2, 12))


@pytest.mark.parametrize("operand, shape, expected", [
    ("W", (2, 16, 5), r"W has shape \(2, 16, 5\); expected \(2, 16, 3\) \(num_directions, "
                      r"4 x hidden_size, input_size\)"),
    ("W", (1, 16, 3), r"W has shape \(1, 16, 3\); expected \(2, 16, 3\)"),
    ("R", (2, 16, 5), r"R has shape \(2, 16, 5\); expected \(2, 16, 4\)"),
    ("B", (2, 16), r"B has shape \(2, 16\); expected \(2, 32\) \(num_directions, "
                   r"8 x hidden_size\)"),
    ("initial_h", (1, 2, 4), r"initial_h has shape \(1, 2, 4\); expected \(2, 2, 4\)"),
    ("initial_c", (2, 3, 4), r"initial_c has shape \(2, 3, 4\); expected \(2, 2, 4\)"),
    ("P", (2, 16), r"P has shape \(2, 16\); expected \(2, 12\) \(num_directions, "
                   r"3 x hidden_size\)"),
    ("X", (5, 3), r"X has shape \(5, 3\); expected 3 axes"),
])
def test_a_recurrent_operand_of_the_wrong_shape_is_refused_at_load_naming_it(
        operand, shape, expected):
    import mixrt
    from mixrt.errors import GraphError
    model = recurrent_model("LSTM", dict(LSTM_SHAPES, **{operand: shape}), hidden_size=4,
                            direction="bidirectional")
    with pytest.raises(GraphError, match=expected) as caught:
        mixrt.Session(model)
    assert "LSTM" in str(caught.value)


def test_a_recurrent_state_whose_batch_differs_from_x_is_refused_at_run_time():
    """The batch is a symbol at load time, so a fed initial_h whose batch differs from X's
    is caught when the node runs, with the shapes it should have."""
    import mixrt
    from mixrt.errors import ExecutionError
    shapes = dict(X=("S", "N", 3), W=(1, 4, 3), R=(1, 4, 4), B=None, sequence_lens=None,
                  initial_h=(1, "M", 4))
    session = mixrt.Session(recurrent_model("RNN", shapes, hidden_size=4))
    feeds = dict(X=randn(5, 2, 3), W=randn(1, 4, 3), R=randn(1, 4, 4))
    np.testing.assert_allclose(session.run(None, dict(feeds, initial_h=randn(1, 2, 4)))[0].shape,
                               (5, 1, 2, 4))
    with pytest.raises(ExecutionError, match=r"RNN: initial_h has shape \(1, 3, 4\); "
                                             r"expected \(1, 2, 4\)"):
        session.run(None, dict(feeds, initial_h=randn(1, 3, 4)))


def test_check_operands_lets_unknown_dims_fit_and_refuses_an_unknown_direction():
    recurrence.check_operands("GRU", None, (1, 12, None), ("K", 12, 4), None, hidden_size=None)
    recurrence.check_operands("GRU", ("S", "N", 7), (1, 12, 7), (1, 12, 4), (1, 24), layout=1,
                       initial_h=("N", 1, 4))
    with pytest.raises(ValueError, match=r"direction must be one of"):
        recurrence.check_operands("RNN", None, None, None, direction="sideways")


# -- Attention -------------------------------------------------------------------------

def test_attention_3d_gqa_with_past_matches_4d():
    """Packing heads into the last axis (3D) must give the 4D result, merged back."""
    batch, q_heads, kv_heads, q_len, kv_len, past, size = 2, 4, 2, 3, 2, 5, 8
    Q, K, V = randn(batch, q_heads, q_len, size), randn(batch, kv_heads, kv_len, size), \
        randn(batch, kv_heads, kv_len, size)
    pk, pv = randn(batch, kv_heads, past, size), randn(batch, kv_heads, past, size)
    y4, key4, value4 = attention.attention_23(np, Q, K, V, None, pk, pv, is_causal=1,
                                              _outputs=3)

    def pack(x):
        return x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)

    y3, key3, value3 = attention.attention_23(
        np, pack(Q), pack(K), pack(V), None, pk, pv, is_causal=1, q_num_heads=q_heads,
        kv_num_heads=kv_heads, _outputs=3)
    np.testing.assert_allclose(y3, pack(y4), rtol=1e-6)
    np.testing.assert_array_equal(key3, key4)
    assert key4.shape == (batch, kv_heads, past + kv_len, size)


def test_attention_causal_with_past_is_bottom_right():
    """With a cache the last query sees every key; the first sees past + itself."""
    Q, K, V = randn(1, 1, 2, 4), randn(1, 1, 2, 4), randn(1, 1, 2, 4)
    pk, pv = randn(1, 1, 3, 4), randn(1, 1, 3, 4)
    *_, probs = attention.attention_23(np, Q, K, V, None, pk, pv, is_causal=1,
                                       qk_matmul_output_mode=3, _outputs=4)
    assert np.all(probs[0, 0, 0, :4] > 0) and probs[0, 0, 0, 4] == 0
    assert np.all(probs[0, 0, 1] > 0)


def test_attention_short_float_mask_is_padded_with_neg_inf():
    Q, K, V = randn(1, 2, 3, 4), randn(1, 2, 5, 4), randn(1, 2, 5, 4)
    mask = np.zeros((3, 3), np.float32)
    *_, probs = attention.attention_24(np, Q, K, V, mask, qk_matmul_output_mode=3,
                                       _outputs=4)
    assert np.all(probs[..., 3:] == 0)
    np.testing.assert_allclose(probs.sum(-1), 1, rtol=1e-6)


def test_attention_float_mask_fully_neg_inf_row_is_zero():
    Q, K, V = randn(1, 1, 2, 4), randn(1, 1, 3, 4), randn(1, 1, 3, 4)
    mask = np.array([[-np.inf] * 3, [0, 0, 0]], np.float32)
    (y,) = attention.attention_23(np, Q, K, V, mask)
    assert np.all(y[0, 0, 0] == 0) and np.all(np.isfinite(y))


def test_attention_window_opset25_and_infer():
    Q, K, V = randn(1, 1, 4, 2), randn(1, 1, 4, 2), randn(1, 1, 4, 2)
    *_, probs = attention.attention_25(np, Q, K, V, left_window_size=0, right_window_size=0,
                                       qk_matmul_output_mode=3, _outputs=4)
    np.testing.assert_allclose(probs[0, 0], np.eye(4), atol=1e-7)
    types = attention.infer_attention(
        tensor(np.float16, (2, "S", 32)), tensor(np.float16, (2, "T", 8)),
        tensor(np.float16, (2, "T", 6)), None, tensor(np.float16, (2, 1, 5, 8)),
        tensor(np.float16, (2, 1, 5, 6)), q_num_heads=4, kv_num_heads=1)
    assert [t.shape for t in types] == [(2, "S", 24), (2, 1, None, 8), (2, 1, None, 6),
                                        (2, 4, "S", None)]
    assert types[0] == TensorType(np.dtype(np.float16), (2, "S", 24))


# -- stateful ops: running in two pieces equals running at once ------------------------

@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_state_chaining(rule):
    # its own generator: the module's shared one gave inputs that depended on which tests a
    # worker ran first, and one draw put a float32 difference just past the tolerance
    local = np.random.default_rng(29)
    batch, steps, q_heads, kv_heads, d_k, d_v = 2, 5, 4, 2, 3, 4
    q, k, v = (local.standard_normal((batch, steps, heads * size)).astype(np.float32)
               for heads, size in ((q_heads, d_k), (kv_heads, d_k), (kv_heads, d_v)))
    decay = -np.abs(local.standard_normal((batch, steps, kv_heads)).astype(np.float32)) * 0.1
    beta = local.random((batch, steps, kv_heads), dtype=np.float32)
    kw = dict(q_num_heads=q_heads, kv_num_heads=kv_heads, update_rule=rule)
    whole, state = attention_recurrent.linear_attention(np, q, k, v, None, decay, beta, **kw)
    first, mid = attention_recurrent.linear_attention(
        np, q[:, :2], k[:, :2], v[:, :2], None, decay[:, :2], beta[:, :2], **kw)
    second, end = attention_recurrent.linear_attention(
        np, q[:, 2:], k[:, 2:], v[:, 2:], mid, decay[:, 2:], beta[:, 2:], **kw)
    # two pieces and one run sum the float32 state in different orders: ~20 ulp apart
    np.testing.assert_allclose(np.concatenate([first, second], 1), whole, rtol=1e-5, atol=5e-6)
    np.testing.assert_allclose(end, state, rtol=1e-5, atol=5e-6)
    assert state.shape == (batch, kv_heads, d_k, d_v)


def test_causal_conv_state_chaining_and_short_inputs():
    x, w, b = randn(2, 3, 7), randn(3, 1, 4), randn(3)
    whole, state = attention_recurrent.causal_conv_with_state(np, x, w, b, activation="silu")
    out, carry = None, None
    pieces = []
    for start, stop in [(0, 1), (1, 3), (3, 7)]:  # pieces shorter than k - 1 included
        out, carry = attention_recurrent.causal_conv_with_state(
            np, x[..., start:stop], w, b, carry, activation="silu")
        pieces.append(out)
    np.testing.assert_allclose(np.concatenate(pieces, -1), whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(carry, state)
    np.testing.assert_array_equal(state, x[..., -3:])


def test_rotary_embedding_partial_fp16_keeps_tail():
    x = randn(1, 2, 3, 8, dtype=np.float16)
    cos, sin = randn(4, 2, dtype=np.float16), randn(4, 2, dtype=np.float16)
    pos = np.array([[0, 1, 3]], np.int64)
    y = attention.rotary_embedding(np, x, cos, sin, pos, rotary_embedding_dim=4,
                                   interleaved=1)
    assert y.dtype == np.float16 and y.shape == x.shape
    np.testing.assert_array_equal(y[..., 4:], x[..., 4:])


@pytest.mark.parametrize("op_type, gates", [("RNN", 1), ("GRU", 3), ("LSTM", 4)])
@pytest.mark.parametrize("activations", [None, "numpy"])
def test_a_sequence_of_no_steps_gives_an_empty_y_and_zero_states(op_type, gates,
                                                                   activations):
    """X of seq_length 0: Y (0, directions, batch, hidden) and zero final states, as
    onnxruntime gives for RNN and LSTM (its GRU aborts the process there), through the
    compiled cells and through NumPy's (an activation they do not take)."""
    kernel = {"RNN": rnn.rnn_14, "GRU": rnn.gru_14, "LSTM": rnn.lstm_14}[op_type]
    X, W = randn(0, 2, 3), randn(2, gates * 4, 3)
    R, h0 = randn(2, gates * 4, 4), randn(2, 2, 4)
    defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"],
                "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[op_type]
    chosen = None if activations is None else (["Softsign"] + defaults[1:]) * 2
    outputs = kernel(np, X, W, R, None, None, h0, hidden_size=4, direction="bidirectional",
                     activations=chosen)
    assert outputs[0].shape == (0, 2, 2, 4)
    for state in outputs[1:]:
        assert state.shape == (2, 2, 4) and not state.any()
    if op_type != "GRU":
        expected = run_ort(op_type, dict(X=X, W=W, R=R, B=None, sequence_lens=None,
                                         initial_h=h0), ["Y", "Y_h"], 14, hidden_size=4,
                           direction="bidirectional")
        assert_all_close(outputs[:2], expected)
