"""MXNet 1.x's symbolic RNN API (``mixrt.rnn``, ``mx.rnn``): cells unrolled into Symbols
named as MXNet names them, their values, weight (un)packing, the sentence iterator and
encoder. Expected names and iterator contents were read from MXNet 1.9.1."""

from __future__ import annotations

import numpy as np
import pytest

import mixrt as mx
from mixrt.errors import InputError


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _stack(layers: int, hidden: int):
    stack = mx.rnn.SequentialRNNCell()
    for i in range(layers):
        stack.add(mx.rnn.LSTMCell(num_hidden=hidden, prefix=f"lstm_l{i}_"))
    return stack


def test_stack_begin_state_variables_and_final_state_names():
    stack = _stack(2, 20)
    begin = stack.begin_state(func=mx.sym.Variable)
    assert [s.name for s in begin] == ["lstm_l0_begin_state_0", "lstm_l0_begin_state_1",
                                       "lstm_l1_begin_state_0", "lstm_l1_begin_state_1"]
    _, states = stack.unroll(10, begin_state=begin, inputs=mx.sym.Variable("data"))
    assert [s.name for s in states] == ["lstm_l0_t9_out", "lstm_l0_t9_state",
                                        "lstm_l1_t9_out", "lstm_l1_t9_state"]
    assert mx.sym.Group(states).list_arguments() == [
        "data", "lstm_l0_i2h_weight", "lstm_l0_i2h_bias", "lstm_l0_begin_state_0",
        "lstm_l0_h2h_weight", "lstm_l0_h2h_bias", "lstm_l0_begin_state_1",
        "lstm_l1_i2h_weight", "lstm_l1_i2h_bias", "lstm_l1_begin_state_0",
        "lstm_l1_h2h_weight", "lstm_l1_h2h_bias", "lstm_l1_begin_state_1"]


def test_merged_outputs_infer_any_batch_from_zero_begin_states():
    out, _ = _stack(2, 6).unroll(4, inputs=mx.sym.Variable("data"), merge_outputs=True)
    for batch in (3, 7):
        _, shapes, _ = out.infer_shape(data=(batch, 4, 5))
        assert shapes == [(batch, 4, 6)]


def test_gru_unroll_names_outputs_per_step():
    outputs, states = mx.rnn.GRUCell(3, prefix="g_").unroll(
        2, mx.sym.Variable("x"), merge_outputs=False)
    assert [o.name for o in outputs] == ["g_t0_out", "g_t1_out"]
    assert states[0].name == "g_t1_out"


def test_lstm_values_match_the_gate_equations():
    rng = np.random.default_rng(0)
    hidden, width, batch, steps = 3, 4, 2, 3
    cell = mx.rnn.LSTMCell(hidden, prefix="l_")
    out, _ = cell.unroll(steps, mx.sym.Variable("data"), merge_outputs=True)
    args = {"data": rng.standard_normal((batch, steps, width)),
            "l_i2h_weight": rng.standard_normal((4 * hidden, width)),
            "l_i2h_bias": rng.standard_normal(4 * hidden),
            "l_h2h_weight": rng.standard_normal((4 * hidden, hidden)),
            "l_h2h_bias": rng.standard_normal(4 * hidden)}
    args = {k: v.astype(np.float32) for k, v in args.items()}
    got = out.eval(ctx=mx.cpu(), **{k: mx.nd.array(v) for k, v in args.items()})[0]
    h = c = np.zeros((batch, hidden), np.float32)
    expected = []
    for t in range(steps):
        gates = args["data"][:, t] @ args["l_i2h_weight"].T + args["l_i2h_bias"] + \
            h @ args["l_h2h_weight"].T + args["l_h2h_bias"]
        i, f, g, o = np.split(gates, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        expected.append(h)
    np.testing.assert_allclose(got.asnumpy(), np.stack(expected, axis=1), rtol=1e-4,
                               atol=1e-5)


def test_unpack_and_pack_weights_round_trip():
    cell = mx.rnn.LSTMCell(2, prefix="l_")
    packed = {"l_i2h_weight": mx.nd.array(np.arange(24.0).reshape(8, 3)),
              "l_i2h_bias": mx.nd.array(np.arange(8.0)),
              "l_h2h_weight": mx.nd.array(np.arange(16.0).reshape(8, 2)),
              "l_h2h_bias": mx.nd.array(np.arange(8.0))}
    unpacked = cell.unpack_weights(packed)
    assert sorted(unpacked) == sorted(f"l_{g}{s}_{k}" for g in ("i2h", "h2h")
                                      for s in ("_i", "_f", "_c", "_o")
                                      for k in ("weight", "bias"))
    np.testing.assert_array_equal(unpacked["l_i2h_f_bias"].asnumpy(), [2.0, 3.0])
    repacked = cell.pack_weights(unpacked)
    for name, value in packed.items():
        np.testing.assert_array_equal(repacked[name].asnumpy(), value.asnumpy())


def test_unroll_rejects_a_wrong_layout_and_step_count():
    cell = mx.rnn.RNNCell(3)
    with pytest.raises(InputError, match="layout"):
        cell.unroll(2, mx.sym.Variable("x"), layout="NCT")
    with pytest.raises(InputError, match="length is 3"):
        cell.unroll(3, [mx.sym.Variable("a"), mx.sym.Variable("b")])


def test_encode_sentences_numbers_words_around_the_invalid_label():
    assert mx.rnn.encode_sentences([["a", "b"], ["b", "c"]], invalid_label=-1) == \
        ([[0, 1], [1, 2]], {"\n": -1, "a": 0, "b": 1, "c": 2})
    assert mx.rnn.encode_sentences([["a", "b"], ["b", "c"]], invalid_label=0) == \
        ([[1, 2], [2, 3]], {"\n": 0, "a": 1, "b": 2, "c": 3})
    with pytest.raises(InputError, match="'z'"):
        mx.rnn.encode_sentences([["z"]], vocab={"a": 0})


def test_bucket_sentence_iter_pads_to_buckets_and_shifts_labels():
    it = mx.rnn.BucketSentenceIter([[1, 2, 3], [4, 5], [6, 7, 8, 9], [1, 1, 1]], 2,
                                   buckets=[3, 5], invalid_label=0)
    assert it.default_bucket_key == 5
    assert it.provide_data[0].shape == (2, 5)
    assert it.idx == [(0, 0)]
    batch = next(it)
    assert batch.bucket_key == 3
    data, label = batch.data[0].asnumpy(), batch.label[0].asnumpy()
    assert data.shape == label.shape == (2, 3)
    np.testing.assert_array_equal(label[:, :-1], data[:, 1:])
    assert (label[:, -1] == 0).all()
    with pytest.raises(StopIteration):
        next(it)


def test_rnn_checkpoint_saves_unpacked_and_loads_packed(tmp_path):
    cell = mx.rnn.GRUCell(2, prefix="g_")
    out, _ = cell.unroll(2, mx.sym.Variable("data"), merge_outputs=True)
    args = {"g_i2h_weight": mx.nd.ones((6, 3)), "g_i2h_bias": mx.nd.zeros((6,)),
            "g_h2h_weight": mx.nd.ones((6, 2)), "g_h2h_bias": mx.nd.zeros((6,))}
    prefix = str(tmp_path / "gru")
    mx.rnn.save_rnn_checkpoint(cell, prefix, 1, out, args, {})
    saved = mx.nd.load(f"{prefix}-0001.params")
    assert "arg:g_i2h_r_weight" in saved and "arg:g_i2h_weight" not in saved
    _, loaded, _ = mx.rnn.load_rnn_checkpoint(cell, prefix, 1)
    assert sorted(loaded) == sorted(args)
    assert loaded["g_h2h_weight"].shape == (6, 2)
