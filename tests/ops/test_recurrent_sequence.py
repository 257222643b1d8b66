"""A recurrent layer's whole sequence in one compiled call (ops/rnn/_jit_recurrent.py), split
between threads: its tanh against NumPy's, its steps against ops/rnn/lstm_cpu.py's (the RNN's
against ops/rnn/rnn.py's NumPy step), and its parts run by one thread, by the native pool, or
by a thread that arrives late."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.rnn import compiled_steps, gru_cpu, lstm_cpu, rnn, rnn_cpu

# the CPU's fast paths, as a CPU session binds them
lstm_on_cpu = rnn.lstm_14.kernels[-1].for_device("cpu")
gru_on_cpu = rnn.gru_14.kernels[-1].for_device("cpu")
rnn_on_cpu = rnn.rnn_14.kernels[-1].for_device("cpu")

pytestmark = pytest.mark.skipif(
    not jit_cpu.enabled() or jit_cpu.panel_kernels() is None,
    reason="needs numba and the panel tile (AVX-512)")

# hidden 40 splits into parts of 16 and 24 units: 64 and 96 columns, the second part's last
# panel (32 float32 columns) half padding
HIDDEN, INPUT, STEPS = 40, 6, 7


def kernels():
    return compiled_steps.recurrent_kernels()


# -- tanh ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, ulps", [(np.float32, 1.0), (np.float64, 4.0)])
def test_tanh_is_within_a_few_ulp_of_numpys(dtype, ulps):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(200_000) * scale
                        for scale in (1e-7, 1e-3, 0.1, 0.35, 1.0, 3.0, 9.0, 25.0)]).astype(dtype)
    y = np.empty_like(x)
    kernels().tanh_into(x, y)
    exact = np.tanh(x.astype(np.float64))
    spacing = np.spacing(np.abs(exact.astype(dtype))).astype(np.float64)
    assert (np.abs(y - exact) / spacing).max() <= ulps


def test_tanh_keeps_signs_limits_and_nans():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1e-300, 20.5, -1e300])
    y = np.empty_like(x)
    kernels().tanh_into(x, y)
    np.testing.assert_array_equal(y[:4], [0.0, -0.0, 1.0, -1.0])
    assert np.signbit(y[1]) and not np.signbit(y[0])
    assert np.isnan(y[4])
    np.testing.assert_array_equal(y[5:], [1e-300, -1e-300, 1.0, -1.0])


# -- the LSTM sequence -----------------------------------------------------------------------

def layer_values(dtype, batch, directions=1, gates=4, seed=0):
    """An LSTM's inputs (4 gates: two initial states) or a GRU's (3 gates: one)."""
    rng = np.random.default_rng(seed)

    def randn(*shape, scale=0.5):
        return (rng.standard_normal(shape) * scale).astype(dtype)
    return dict(X=randn(STEPS, batch, INPUT, scale=1.0),
                W=randn(directions, gates * HIDDEN, INPUT),
                R=randn(directions, gates * HIDDEN, HIDDEN),
                B=randn(directions, 2 * gates * HIDDEN),
                initials=[randn(directions, batch, HIDDEN) for _ in range(gates - 2)])


def lstm_values(dtype, batch, directions=1):
    return layer_values(dtype, batch, directions)


def gru_values(dtype, batch, directions=1):
    return layer_values(dtype, batch, directions, gates=3)


def run_lstm(values, monkeypatch, rows, lengths=None, direction="forward"):
    """LSTM's CPU kernel with SEQUENCE_ROWS = ``rows`` (0: the compiled steps)."""
    monkeypatch.setattr(lstm_cpu, "SEQUENCE_ROWS", rows)
    return lstm_on_cpu(
        np, values["X"], values["W"], values["R"], values["B"], lengths, *values["initials"],
        hidden_size=HIDDEN, direction=direction)


@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 3e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("batch", [1, 3, 11])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_the_sequence_matches_the_compiled_steps(monkeypatch, dtype, tolerance, batch,
                                                 direction):
    values = lstm_values(dtype, batch, 2 if direction == "bidirectional" else 1)
    taken = []
    real = lstm_cpu.forward_sequence
    monkeypatch.setattr(lstm_cpu, "forward_sequence",
                        lambda *a, **k: taken.append(1) or real(*a, **k))
    whole = run_lstm(values, monkeypatch, 64, direction=direction)
    assert taken
    steps = run_lstm(values, monkeypatch, 0, direction=direction)
    for got, want in zip(whole, steps):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_padded_sequences_hold_their_states_and_output_zeros(monkeypatch, direction):
    values = lstm_values(np.float32, 4, 2 if direction == "bidirectional" else 1)
    lengths = np.array([STEPS, 2, 0, 5], np.int32)
    whole = run_lstm(values, monkeypatch, 64, lengths, direction)
    steps = run_lstm(values, monkeypatch, 0, lengths, direction)
    for got, want in zip(whole, steps):
        np.testing.assert_allclose(got, want, rtol=3e-6, atol=3e-6)
    y = whole[0]
    assert not y[2:, :, 1].any() and not y[:, :, 2].any()
    np.testing.assert_array_equal(whole[1][0, 1], y[1, 0, 1])  # h held from step 2 on


def sequence_arrays(batch, parts, seed=0):
    """A hand-made LSTM direction's kernel arguments (float32): projected, panels, bounds,
    hs, c, out, lengths (the second row padded after 3 steps)."""
    rng = np.random.default_rng(seed)
    r = (rng.standard_normal((4 * HIDDEN, HIDDEN)) * 0.3).astype(np.float32)
    bounds = lstm_cpu.unit_bounds(HIDDEN, parts)
    hs = np.zeros((2, batch, HIDDEN), np.float32)
    hs[0] = rng.standard_normal((batch, HIDDEN))
    lengths = np.full(batch, STEPS, np.int64)
    lengths[1 % batch] = 3
    return (rng.standard_normal((STEPS, batch, 4 * HIDDEN)).astype(np.float32),
            lstm_cpu.panels_by_part(r, bounds, 4), np.array(bounds, np.int64), hs,
            rng.standard_normal((batch, HIDDEN)).astype(np.float32),
            np.empty((STEPS, batch, HIDDEN), np.float32), lengths)


def test_a_split_sequence_gives_the_same_bits_on_one_thread_or_two():
    """Each column's sum runs over k in the same order whichever part holds it, so one
    part, two parts on one thread, and two on the native pool agree exactly."""
    native = jit_cpu.native_pool()
    results = []
    for parts, pool in ((1, None), (2, None), (2, native)):
        arrays = sequence_arrays(3, parts)
        assert arrays[2].size - 1 == parts
        lstm_cpu.run_sequence("lstm", pool, STEPS, 3, HIDDEN, arrays)
        results.append((arrays[5], arrays[3][STEPS % 2], arrays[4]))
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            np.testing.assert_array_equal(got, want)


def test_a_thread_alone_takes_every_part():
    """The caller's part when the other part's thread never comes (a busy pool): it takes
    every step of both, and the shared words end counting every part of every step."""
    arrays = sequence_arrays(2, 2)
    alone = sequence_arrays(2, 1)
    sync = np.zeros(kernels().sync_words(2), np.int64)
    width = 32
    tile = jit_cpu.panel_kernels().tile_f.address
    kernels().lstm_sequence(1, sync, *(a.reshape(-1) for a in arrays), STEPS, 2, HIDDEN,
                            width, tile)
    lstm_cpu.run_sequence("lstm", None, STEPS, 2, HIDDEN, alone)
    np.testing.assert_array_equal(arrays[5], alone[5])
    line = kernels().LINE
    assert sync[4 * line] == 2 * STEPS  # DONE
    assert sync[line] == sync[3 * line] == STEPS  # each part's steps all claimed
    assert sync[0] == 0 and sync[2 * line] == 1  # only part 1's thread came


def test_a_late_thread_joins_where_the_sequence_is():
    """A thread that arrives after every step is done finds nothing left to claim."""
    arrays = sequence_arrays(2, 2)
    sync = np.zeros(kernels().sync_words(2), np.int64)
    tile = jit_cpu.panel_kernels().tile_f.address
    flat = [a.reshape(-1) for a in arrays]
    kernels().lstm_sequence(0, sync, *flat, STEPS, 2, HIDDEN, 32, tile)
    before = [a.copy() for a in arrays]
    kernels().lstm_sequence(1, sync, *flat, STEPS, 2, HIDDEN, 32, tile)
    for got, want in zip(arrays, before):
        np.testing.assert_array_equal(got, want)
    assert sync[4 * kernels().LINE] == 2 * STEPS


def test_unit_bounds_keep_whole_lines_and_enough_units():
    assert lstm_cpu.unit_bounds(256, 2) == [0, 128, 256]
    assert lstm_cpu.unit_bounds(40, 2) == [0, 16, 40]
    assert lstm_cpu.unit_bounds(40, 3) == [0, 16, 40]  # two parts: 40 units hold 2 lines
    assert lstm_cpu.unit_bounds(8, 4) == [0, 8]
    assert lstm_cpu.unit_bounds(100, 1) == [0, 100]


def recurrent_sessions(op_type, weights, outputs, **attributes):
    """Two sessions of one ``op_type`` node over X (S, N, INPUT): W, R and B constants in
    the first, fed in the second."""
    import mixrt
    from onnx import TensorProto, helper, numpy_helper

    def model(constant):
        node = helper.make_node(op_type, ["X", "W", "R", "B"], outputs, hidden_size=HIDDEN,
                                **attributes)
        feeds = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["S", "N", INPUT])]
        feeds += [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                  for k, v in weights.items() if not constant]
        graph = helper.make_graph(
            [node], op_type.lower(), feeds,
            [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in outputs],
            initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()
                         if constant])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return (mixrt.Session(model(True).SerializeToString()),
            mixrt.Session(model(False).SerializeToString()))


def test_a_session_at_batch_one_keeps_the_parts_panels_and_matches_fed_weights(monkeypatch):
    values = lstm_values(np.float32, 1)
    weights = {k: values[k] for k in ("W", "R", "B")}
    kept, fed = recurrent_sessions("LSTM", weights, ["Y"])
    x = values["X"]
    first = kept.run(None, {"X": x})[0]
    np.testing.assert_array_equal(first, kept.run(None, {"X": x})[0])
    np.testing.assert_allclose(first, fed.run(None, {"X": x, **weights})[0], rtol=3e-6,
                               atol=3e-6)
    (node,) = [n for n in kept._bound.nodes if n.node.op_type == "LSTM"]
    keys = {key[0] for key in node.attributes["_prepacked"] if isinstance(key, tuple)}
    assert "lstm R' by part" in keys
    monkeypatch.setattr(lstm_cpu, "suits", lambda layer, d: False)  # the NumPy cells
    expected = lstm_on_cpu(np, x, *weights.values(), hidden_size=HIDDEN)[0]
    np.testing.assert_allclose(first, expected, rtol=3e-6, atol=3e-6)


# -- the GRU sequence ------------------------------------------------------------------------

def run_gru(values, monkeypatch, rows, reset_after, lengths=None, direction="forward"):
    monkeypatch.setattr(lstm_cpu, "SEQUENCE_ROWS", rows)
    return gru_on_cpu(
        np, values["X"], values["W"], values["R"], values["B"], lengths, *values["initials"],
        hidden_size=HIDDEN, direction=direction, linear_before_reset=reset_after)


@pytest.mark.parametrize("reset_after", [1, 0])
@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 3e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("batch", [1, 11])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_the_gru_sequence_matches_the_compiled_steps(monkeypatch, reset_after, dtype,
                                                     tolerance, batch, direction):
    values = gru_values(dtype, batch, 2 if direction == "bidirectional" else 1)
    taken = []
    real = gru_cpu.forward_sequence
    monkeypatch.setattr(gru_cpu, "forward_sequence",
                        lambda *a, **k: taken.append(1) or real(*a, **k))
    whole = run_gru(values, monkeypatch, 64, reset_after, direction=direction)
    assert taken
    steps = run_gru(values, monkeypatch, 0, reset_after, direction=direction)
    for got, want in zip(whole, steps):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("reset_after", [1, 0])
def test_padded_gru_sequences_match_the_compiled_steps(monkeypatch, reset_after):
    values = gru_values(np.float32, 4, 2)
    lengths = np.array([STEPS, 2, 0, 5], np.int32)
    whole = run_gru(values, monkeypatch, 64, reset_after, lengths, "bidirectional")
    steps = run_gru(values, monkeypatch, 0, reset_after, lengths, "bidirectional")
    for got, want in zip(whole, steps):
        np.testing.assert_allclose(got, want, rtol=3e-6, atol=3e-6)
    assert not whole[0][2:, :, 1].any() and not whole[0][:, :, 2].any()


@pytest.mark.parametrize("reset_after", [1, 0])
def test_a_split_gru_gives_the_same_bits_on_the_pool_as_on_one_thread(monkeypatch,
                                                                      reset_after):
    values = gru_values(np.float32, 3)
    monkeypatch.setattr(jit_cpu, "native_pool", lambda: None)
    alone = run_gru(values, monkeypatch, 64, reset_after)
    monkeypatch.undo()
    pooled = run_gru(values, monkeypatch, 64, reset_after)
    for got, want in zip(pooled, alone):
        np.testing.assert_array_equal(got, want)


# -- the RNN sequence ------------------------------------------------------------------------

def rnn_values(dtype, batch, directions=1):
    """An RNN's inputs, R scaled down so that a ReLU RNN's states stay near 1 (growing
    states would grow the rounding differences with them)."""
    values = layer_values(dtype, batch, directions, gates=1, seed=3)
    values["R"] *= dtype(0.4)
    values["initials"] = [layer_values(dtype, batch, directions, gates=3, seed=4)["initials"][0]]
    return values


def run_rnn(values, monkeypatch, compiled, lengths=None, **attributes):
    """RNN's CPU kernel through ops/rnn/rnn_cpu.py (``compiled``) or the NumPy step; the result
    and whether the compiled sequence ran."""
    taken = []
    real = rnn_cpu.inference
    monkeypatch.setattr(rnn_cpu, "inference",
                        lambda *a, **k: taken.append(1) or real(*a, **k))
    if not compiled:
        monkeypatch.setattr(rnn_cpu, "suits", lambda layer, d: False)
    result = rnn_on_cpu(np, values["X"], values["W"], values["R"], values["B"], lengths,
                        *values["initials"], hidden_size=HIDDEN, **attributes)
    monkeypatch.undo()
    return result, bool(taken)


@pytest.mark.parametrize("activation", ["Tanh", "Relu", "Sigmoid"])
@pytest.mark.parametrize("clip", [None, 0.7])
# the NumPy step sums h R^T by the BLAS and adds the biases in another order
@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("batch", [1, 11])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_the_rnn_sequence_matches_the_numpy_steps(monkeypatch, activation, clip, dtype,
                                                  tolerance, batch, direction):
    directions = 2 if direction == "bidirectional" else 1
    values = rnn_values(dtype, batch, directions)
    attributes = dict(direction=direction, clip=clip, activations=[activation] * directions)
    whole, taken = run_rnn(values, monkeypatch, True, **attributes)
    assert taken
    steps, taken = run_rnn(values, monkeypatch, False, **attributes)
    assert not taken
    for got, want in zip(whole, steps):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
    if clip is not None and activation == "Relu":
        assert whole[0].max() <= clip


def test_padded_rnn_sequences_hold_their_states_and_output_zeros(monkeypatch):
    values = rnn_values(np.float32, 4, 2)
    lengths = np.array([STEPS, 2, 0, 5], np.int32)
    whole, taken = run_rnn(values, monkeypatch, True, lengths, direction="bidirectional")
    assert taken
    steps, _ = run_rnn(values, monkeypatch, False, lengths, direction="bidirectional")
    for got, want in zip(whole, steps):
        np.testing.assert_allclose(got, want, rtol=3e-6, atol=3e-6)
    y, h = whole
    assert not y[2:, :, 1].any() and not y[:, :, 2].any()
    np.testing.assert_array_equal(h[0, 1], y[1, 0, 1])  # the forward h held from step 2 on
    np.testing.assert_array_equal(h[:, 2], 0)  # a sequence of length 0 has no last step


def test_the_rnn_keeps_the_numpy_step_past_the_sequence_rows_and_for_other_activations(
        monkeypatch):
    values = rnn_values(np.float32, 5)
    monkeypatch.setattr(lstm_cpu, "SEQUENCE_ROWS", 4)
    _, taken = run_rnn(values, monkeypatch, True)
    assert not taken  # 5 rows > 4
    for activation in ("LeakyRelu", "Softsign", "HardSigmoid"):
        _, taken = run_rnn(values, monkeypatch, True, activations=[activation])
        assert not taken


def test_a_split_rnn_gives_the_same_bits_on_the_pool_as_on_one_thread(monkeypatch):
    values = rnn_values(np.float32, 3)
    monkeypatch.setattr(jit_cpu, "native_pool", lambda: None)
    alone = rnn_on_cpu(np, values["X"], values["W"], values["R"], values["B"], None,
                       *values["initials"], hidden_size=HIDDEN)
    monkeypatch.undo()
    pooled, taken = run_rnn(values, monkeypatch, True)
    assert taken
    for got, want in zip(pooled, alone):
        np.testing.assert_array_equal(got, want)


def test_the_rnn_keeps_nans_and_infinities_as_numpy_does(monkeypatch):
    values = rnn_values(np.float32, 2)
    values["X"][3, 0, 0] = np.nan
    values["X"][1, 1, 0] = np.inf
    for activation in ("Tanh", "Relu", "Sigmoid"):
        whole, taken = run_rnn(values, monkeypatch, True, activations=[activation])
        assert taken
        with np.errstate(invalid="ignore"):  # NumPy's matmul of a NaN says so
            steps, _ = run_rnn(values, monkeypatch, False, activations=[activation])
        for got, want in zip(whole, steps):
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            finite = np.isfinite(want)
            np.testing.assert_allclose(got[finite], want[finite], rtol=3e-6, atol=3e-6)


def test_an_rnn_session_keeps_the_parts_panels_and_matches_fed_weights():
    values = rnn_values(np.float32, 1)
    weights = {k: values[k] for k in ("W", "R", "B")}
    kept, fed = recurrent_sessions("RNN", weights, ["Y", "Y_h"], activations=["Relu"])
    x = values["X"]
    first = kept.run(None, {"X": x})
    for got, again, other in zip(first, kept.run(None, {"X": x}),
                                 fed.run(None, {"X": x, **weights})):
        np.testing.assert_array_equal(got, again)
        np.testing.assert_allclose(got, other, rtol=3e-6, atol=3e-6)
    (node,) = [n for n in kept._bound.nodes if n.node.op_type == "RNN"]
    keys = {key[0] for key in node.attributes["_prepacked"] if isinstance(key, tuple)}
    assert {"rnn R by part", "rnn W'", "rnn bias'"} <= keys
