"""The standard LSTM and GRU steps compiled (ops/rnn/lstm_cpu.py, ops/rnn/gru_cpu.py) against the
NumPy cells they stand in for (ops/rnn/rnn_grad.py), forward and backward, and where each is
taken."""

import functools

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.rnn import cells, gru_cpu, lstm_cpu, rnn, rnn_grad

# the CPU's fast paths, as a CPU session binds them
lstm_on_cpu = rnn.lstm_14.kernels[-1].for_device("cpu")
gru_on_cpu = rnn.gru_14.kernels[-1].for_device("cpu")

pytestmark = pytest.mark.skipif(not jit_cpu.enabled(), reason="needs numba")

SEQ, BATCH, INPUT, HIDDEN = 5, 4, 6, 8


def inputs(dtype, directions, layout, bias=True, initial=True, seed=0, gates=4):
    """An LSTM's inputs (4 gates, 2 states), or a GRU's (``gates=3``, one state)."""
    rng = np.random.default_rng(seed)

    def randn(*shape):
        return (rng.standard_normal(shape) * 0.7).astype(dtype)
    x = randn(BATCH, SEQ, INPUT) if layout else randn(SEQ, BATCH, INPUT)
    state = (BATCH, directions, HIDDEN) if layout else (directions, BATCH, HIDDEN)
    states = 2 if gates == 4 else 1
    return dict(X=x, W=randn(directions, gates * HIDDEN, INPUT),
                R=randn(directions, gates * HIDDEN, HIDDEN),
                B=randn(directions, 2 * gates * HIDDEN) if bias else None,
                initials=[randn(*state) if initial else None for _ in range(states)])


def forward_and_backward(values, direction, layout, seed=1, lengths=None):
    """(outputs, workspace, gradients) of one layer through rnn_grad's kernels."""
    attributes = {"direction": direction, "hidden_size": HIDDEN, "layout": layout}
    X, W, R, B, initials = (values[k] for k in ("X", "W", "R", "B", "initials"))
    y, y_h, y_c, workspace = cells.forward_keeping_workspace(
        np, cells.LSTMCell, ["Sigmoid", "Tanh", "Tanh"], X, W, R, B, lengths, initials,
        **attributes)
    rng = np.random.default_rng(seed)
    d_outputs = [rng.standard_normal(a.shape).astype(a.dtype) for a in (y, y_h, y_c)]
    grads = rnn_grad.lstm_grad(np, *d_outputs, X, W, R, B, lengths, *initials, None, workspace,
                               **attributes)
    return (y, y_h, y_c), workspace, grads


def generic(monkeypatch):
    monkeypatch.setattr(lstm_cpu, "suits", lambda layer, d: False)


CELLS = ["LSTM", "GRU", "GRU, reset first"]


def cell_case(cell, dtype, directions, layout, bias=True, initial=True):
    """(inputs, forward_and_backward, compiled module) of an LSTM case, or of a GRU's with
    its reset after the product or ("reset first") before it."""
    if cell == "LSTM":
        return inputs(dtype, directions, layout, bias, initial), forward_and_backward, lstm_cpu
    run = functools.partial(gru_forward_and_backward, linear_before_reset=int(cell == "GRU"))
    return gru_inputs(dtype, directions, layout, bias, initial), run, gru_cpu


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("direction, layout, bias, initial", [
    ("forward", 0, True, True), ("reverse", 0, False, True), ("bidirectional", 0, True, False),
    ("bidirectional", 1, True, True)])
def test_compiled_steps_match_the_numpy_cells(monkeypatch, cell, dtype, rtol, direction, layout,
                                              bias, initial):
    directions = 2 if direction == "bidirectional" else 1
    values, run, module = cell_case(cell, dtype, directions, layout, bias, initial)
    fast = run(values, direction, layout)
    with monkeypatch.context() as patch:
        patch.setattr(module, "suits", lambda layer, d: False)
        slow = run(values, direction, layout)
    for got, want in zip(fast[0] + (fast[1],) + fast[2], slow[0] + (slow[1],) + slow[2]):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


def test_each_backward_reads_the_other_forwards_workspace(monkeypatch):
    """The cache layout is one: the NumPy forward's workspace through the compiled backward,
    and the compiled forward's through the NumPy backward, give the same gradients."""
    values = inputs(np.float64, 1, 0)
    attributes = {"hidden_size": HIDDEN}
    _, fast_workspace, fast_grads = forward_and_backward(values, "forward", 0)
    with monkeypatch.context() as patch:
        generic(patch)
        outputs, slow_workspace, slow_grads = forward_and_backward(values, "forward", 0)
        np.testing.assert_allclose(fast_workspace, slow_workspace, rtol=1e-12)
        rng = np.random.default_rng(1)
        d_outputs = [rng.standard_normal(a.shape) for a in outputs]
        crossed = rnn_grad.lstm_grad(np, *d_outputs, values["X"], values["W"], values["R"],
                                     values["B"], None, *values["initials"], None,
                                     fast_workspace, **attributes)
    for got, want in zip(crossed, slow_grads):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_without_a_workspace_the_backward_runs_the_forward_again():
    values = inputs(np.float64, 1, 0, bias=False, initial=False)
    (y, y_h, y_c), _, with_workspace = forward_and_backward(values, "forward", 0)
    rng = np.random.default_rng(1)
    d_outputs = [rng.standard_normal(a.shape) for a in (y, y_h, y_c)]
    again = rnn_grad.lstm_grad(np, *d_outputs, values["X"], values["W"], values["R"], None,
                               None, None, None, None, None, hidden_size=HIDDEN)
    for got, want in zip(again, with_workspace):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", ["forward", "forward_sequence"])
@pytest.mark.parametrize("direction, layout", [("forward", 0), ("bidirectional", 1)])
def test_the_inference_forward_matches_the_numpy_steps(monkeypatch, direction, layout, path):
    """Both compiled inference paths: the steps (more than SEQUENCE_ROWS rows) and the whole
    sequence in one call (ops/rnn/_jit_recurrent.py; tests/ops/test_recurrent_sequence.py)."""
    if path == "forward_sequence" and jit_cpu.panel_kernels() is None:
        pytest.skip("the sequence kernels need the panel tile (AVX-512)")
    values = inputs(np.float32, 2 if direction == "bidirectional" else 1, layout)
    args = (np, values["X"], values["W"], values["R"], values["B"], None, *values["initials"])
    options = {"direction": direction, "hidden_size": HIDDEN, "layout": layout}
    monkeypatch.setattr(lstm_cpu, "SEQUENCE_ROWS", BATCH if path == "forward_sequence" else 0)
    taken = []
    real = getattr(lstm_cpu, path)
    monkeypatch.setattr(lstm_cpu, path, lambda *a, **k: taken.append(1) or real(*a, **k))
    fast = lstm_on_cpu(*args, **options)
    assert taken  # the compiled steps ran
    generic(monkeypatch)
    slow = lstm_on_cpu(*args, **options)
    for got, want in zip(fast, slow):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("options, reason", [
    ({"clip": 2.0}, "clip"), ({"input_forget": 1}, "input_forget"),
    ({"activations": ["Sigmoid", "Relu", "Tanh"]}, "another activation")])
def test_variants_keep_the_numpy_cells(monkeypatch, options, reason):
    values = inputs(np.float32, 1, 0)
    monkeypatch.setattr(lstm_cpu, "inference", lambda *a, **k: pytest.fail(reason))
    lengths = options.pop("sequence_lens", None)
    y = lstm_on_cpu(np, values["X"], values["W"], values["R"], values["B"],
                    lengths, *values["initials"], hidden_size=HIDDEN,
                    **options)[0]
    assert y.shape == (SEQ, 1, BATCH, HIDDEN) and np.isfinite(y).all()


def test_a_nan_in_the_input_reaches_the_outputs():
    values = inputs(np.float32, 1, 0)
    values["X"][2, 1, 0] = np.nan
    y = lstm_on_cpu(np, values["X"], values["W"], values["R"], values["B"],
                    None, *values["initials"], hidden_size=HIDDEN)[0]
    assert np.isfinite(y[:2]).all() and np.isnan(y[2:, 0, 1]).all()
    assert np.isfinite(y[2, 0, 0]).all()  # other sequences of the batch are untouched


def lstm_model(constant: tuple, directions=1):
    """An LSTM node whose inputs named in ``constant`` ("W", "R", "B") are initializers and
    the others graph inputs, with the weights it was built from."""
    from onnx import TensorProto, helper, numpy_helper
    values = inputs(np.float32, directions, 0, initial=False)
    weights = {k: values[k] for k in ("W", "R", "B")}
    direction = "bidirectional" if directions == 2 else "forward"
    node = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y", "Y_h", "Y_c"],
                            hidden_size=HIDDEN, direction=direction)
    feeds = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["S", "N", INPUT])]
    feeds += [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
              for k, v in weights.items() if k not in constant]
    graph = helper.make_graph(
        [node], "lstm", feeds, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items() if k in constant])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), values


def lstm_node_state(session, op_type="LSTM"):
    (node,) = [n for n in session._bound.nodes if n.node.op_type == op_type]
    return node.attributes.get("_prepacked")


@pytest.mark.parametrize("sequence", [False, True])
@pytest.mark.parametrize("directions", [1, 2])
def test_constant_weights_are_halved_and_packed_once_per_session(monkeypatch, directions,
                                                                 sequence):
    import mixrt
    if sequence and jit_cpu.panel_kernels() is None:
        pytest.skip("the sequence kernels need the panel tile (AVX-512)")
    monkeypatch.setattr(lstm_cpu, "SEQUENCE_ROWS", BATCH if sequence else 0)
    model, values = lstm_model(("W", "R", "B"), directions)
    session = mixrt.Session(model.SerializeToString())
    x = values["X"]
    first = session.run(None, {"X": x})[0]
    state = lstm_node_state(session)
    kept = {key[0] for key in state if isinstance(key, tuple) and str(key[0]).startswith("lstm")}
    recurrent = {"lstm R' by part"} if sequence else {"lstm R'", "lstm panels"}
    assert kept == {"lstm W'", "lstm bias'", "lstm W' panels"} | recurrent
    again = session.run(None, {"X": x[:, :2]})[0]  # another batch reuses the kept forms
    np.testing.assert_array_equal(again, session.run(None, {"X": x[:, :2]})[0])
    fed_model, _ = lstm_model((), directions)
    fed = mixrt.Session(fed_model.SerializeToString())
    weights = {k: values[k] for k in ("W", "R", "B")}
    np.testing.assert_allclose(first, fed.run(None, {"X": x, **weights})[0], rtol=2e-5,
                               atol=2e-6)
    np.testing.assert_allclose(again, fed.run(None, {"X": x[:, :2], **weights})[0],
                               rtol=2e-5, atol=2e-6)


def test_a_fed_recurrent_weight_is_read_afresh_on_every_run():
    """W constant (the node gets its dict) but R fed: nothing derived from the weights is
    kept, so a new R changes the outputs."""
    import mixrt
    model, values = lstm_model(("W", "B"))
    session = mixrt.Session(model.SerializeToString())
    x, r = values["X"], values["R"]
    first = session.run(None, {"X": x, "R": r})[0]
    second = session.run(None, {"X": x, "R": r * 0.5})[0]
    state = lstm_node_state(session)
    assert state is not None and not any(
        isinstance(key, tuple) and str(key[0]).startswith("lstm") for key in state)
    assert not np.allclose(first, second)
    expected = lstm_on_cpu(np, x, values["W"], r * 0.5, values["B"],
                           hidden_size=HIDDEN)[0]
    np.testing.assert_allclose(second, expected, rtol=2e-5, atol=2e-6)


# -- the GRU (ops/rnn/gru_cpu.py): reset after the recurrent product ------------------------------

def gru_inputs(dtype, directions, layout, bias=True, initial=True, seed=0):
    return inputs(dtype, directions, layout, bias, initial, seed, gates=3)


def gru_forward_and_backward(values, direction, layout, linear_before_reset=1, seed=1,
                             lengths=None):
    attributes = {"direction": direction, "hidden_size": HIDDEN, "layout": layout,
                  "linear_before_reset": linear_before_reset}
    X, W, R, B, initials = (values[k] for k in ("X", "W", "R", "B", "initials"))
    y, y_h, workspace = cells.forward_keeping_workspace(
        np, cells.GRUCell, ["Sigmoid", "Tanh"], X, W, R, B, lengths, initials,
        **attributes)
    rng = np.random.default_rng(seed)
    d_outputs = [rng.standard_normal(a.shape).astype(a.dtype) for a in (y, y_h)]
    grads = rnn_grad.gru_grad(np, *d_outputs, X, W, R, B, lengths, *initials, workspace,
                              **attributes)
    return (y, y_h), workspace, grads


def generic_gru(monkeypatch):
    monkeypatch.setattr(gru_cpu, "suits", lambda layer, d: False)


def test_gru_backward_reads_the_numpy_forwards_workspace(monkeypatch):
    values = gru_inputs(np.float64, 1, 0)
    attributes = {"hidden_size": HIDDEN, "linear_before_reset": 1}
    _, _, fast_grads = gru_forward_and_backward(values, "forward", 0)
    with monkeypatch.context() as patch:
        generic_gru(patch)
        outputs, slow_workspace, _ = gru_forward_and_backward(values, "forward", 0)
    rng = np.random.default_rng(1)
    d_outputs = [rng.standard_normal(a.shape) for a in outputs]
    crossed = rnn_grad.gru_grad(np, *d_outputs, values["X"], values["W"], values["R"],
                                values["B"], None, *values["initials"], slow_workspace,
                                **attributes)
    for got, want in zip(crossed, fast_grads):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", ["forward", "forward_sequence"])
@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_inference_takes_the_compiled_steps(monkeypatch, linear_before_reset, path):
    if path == "forward_sequence" and jit_cpu.panel_kernels() is None:
        pytest.skip("the sequence kernels need the panel tile (AVX-512)")
    values = gru_inputs(np.float32, 2, 0)
    args = (np, values["X"], values["W"], values["R"], values["B"], None, *values["initials"])
    monkeypatch.setattr(lstm_cpu, "SEQUENCE_ROWS", BATCH if path == "forward_sequence" else 0)
    taken = []
    real = getattr(gru_cpu, path)
    monkeypatch.setattr(gru_cpu, path, lambda *a, **k: taken.append(1) or real(*a, **k))
    options = {"direction": "bidirectional", "hidden_size": HIDDEN,
               "linear_before_reset": linear_before_reset}
    fast = gru_on_cpu(*args, **options)
    assert taken
    generic_gru(monkeypatch)
    slow = gru_on_cpu(*args, **options)
    for got, want in zip(fast, slow):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_gru_sessions_constant_weights_are_kept_and_match_fed_ones(monkeypatch):
    import mixrt
    monkeypatch.setattr(lstm_cpu, "SEQUENCE_ROWS", 1)  # batch 4 the steps, 1 the sequence
    from onnx import TensorProto, helper, numpy_helper
    values = gru_inputs(np.float32, 1, 0, initial=False)
    weights = {k: values[k] for k in ("W", "R", "B")}

    def model(constant):
        node = helper.make_node("GRU", ["X", "W", "R", "B"], ["Y"], hidden_size=HIDDEN,
                                linear_before_reset=1)
        feeds = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["S", "N", INPUT])]
        feeds += [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                  for k, v in weights.items() if not constant]
        graph = helper.make_graph(
            [node], "gru", feeds, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
            initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()
                         if constant])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    kept = mixrt.Session(model(True).SerializeToString())
    fed = mixrt.Session(model(False).SerializeToString())
    for batch in (BATCH, 1):
        x = values["X"][:, :batch]
        np.testing.assert_allclose(kept.run(None, {"X": x})[0],
                                   fed.run(None, {"X": x, **weights})[0], rtol=2e-5, atol=2e-6)
    keys = {key[0] for key in lstm_node_state(kept, "GRU") if isinstance(key, tuple)}
    assert {"gru W'", "gru bias'", "gru R'", "gru panels"} <= keys
    if jit_cpu.panel_kernels() is not None:
        assert "gru R' by part" in keys


# -- padding: sequences shorter than the batch's, one of them empty ----------------------------

PADDED = np.array([5, 2, 0, 4], np.int32)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("direction, layout", [
    ("forward", 0), ("reverse", 0), ("bidirectional", 0), ("bidirectional", 1)])
def test_padded_sequences_match_the_numpy_cells(monkeypatch, cell, dtype, rtol, direction,
                                                layout):
    """Past its length a sequence's states hold, its outputs are zero and its padded steps
    pass no gradient to the weights: the compiled steps against the NumPy cells."""
    directions = 2 if direction == "bidirectional" else 1
    values, run, module = cell_case(cell, dtype, directions, layout)
    taken = []
    real = module.backward
    monkeypatch.setattr(module, "backward", lambda *a, **k: taken.append(1) or real(*a, **k))
    fast = run(values, direction, layout, lengths=PADDED)
    assert taken
    with monkeypatch.context() as patch:
        patch.setattr(module, "suits", lambda layer, d: False)
        slow = run(values, direction, layout, lengths=PADDED)
    for got, want in zip(fast[0] + fast[2], slow[0] + slow[2]):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
