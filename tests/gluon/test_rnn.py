"""mixrt.gluon.rnn: LSTM/GRU/RNN layers and cells against torch.nn with the same weights
(outputs, final states, input and parameter gradients), imperatively and hybridized, with
sequence lengths against torch's packed sequences, and an exported LSTM in onnxruntime at
other batch sizes and lengths."""

import mixrt  # (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import autograd, initializer, nd
from mixrt.errors import ExecutionError, InputError
from mixrt.gluon import rnn
from mixrt.ops.device import gpu_available

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(2)
TORCH_LAYERS = {rnn.LSTM: torch.nn.LSTM, rnn.GRU: torch.nn.GRU, rnn.RNN: torch.nn.RNN}


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def torch_name(ours: str) -> str:
    """``l1_i2h_weight`` -> ``weight_ih_l1``; ``r0_h2h_bias`` -> ``bias_hh_l0_reverse``."""
    layer, connection, kind = ours.split("_")
    link = {"i2h": "ih", "h2h": "hh"}[connection]
    return f"{kind}_{link}_l{layer[1:]}" + ("_reverse" if layer[0] == "r" else "")


def params_of(block) -> dict:
    return {name[len(block.prefix):]: p for name, p in block.collect_params().items()}


def to_torch(layer, module):
    with torch.no_grad():
        for name, param in params_of(layer).items():
            module.get_parameter(torch_name(name)).copy_(torch.tensor(param.data().asnumpy()))


def run_layer(layer, x, states, heads, lengths=None):
    """Outputs, final states and gradients of sum(output * head) + sum(state * head)."""
    x = nd.array(x)
    x.attach_grad()
    states = [nd.array(s) for s in states]
    for s in states:
        s.attach_grad()
    more = [] if lengths is None else [nd.array(lengths)]
    with autograd.record():
        if states:
            out, finals = layer(x, states, *more)
        else:
            out, finals = layer(x, None, *more), []
        loss = (out * nd.array(heads[0])).sum()
        for final, head in zip(finals, heads[1:]):
            loss = loss + (final * nd.array(head)).sum()
    loss.backward()
    grads = {n: p.grad().asnumpy().copy() for n, p in params_of(layer).items()}
    return ([out.asnumpy()] + [f.asnumpy() for f in finals],
            [x.grad.asnumpy().copy()] + [s.grad.asnumpy().copy() for s in states], grads)


def run_torch(module, x, states, heads, batch_first, lengths=None):
    xt = torch.tensor(x, requires_grad=True)
    st = [torch.tensor(s, requires_grad=True) for s in states]
    given = None if not st else (tuple(st) if len(st) == 2 else st[0])
    if lengths is None:
        out, finals = module(xt, given)
    else:
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            xt, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=False)
        out, finals = module(packed, given)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=batch_first,
                                                        total_length=x.shape[int(batch_first)])
    finals = list(finals) if isinstance(finals, tuple) else [finals]
    finals = finals if states else []
    loss = (out * torch.tensor(heads[0])).sum()
    for final, head in zip(finals, heads[1:]):
        loss = loss + (final * torch.tensor(head)).sum()
    loss.backward()
    grads = {n: p.grad.numpy() for n, p in module.named_parameters()}
    return ([out.detach().numpy()] + [f.detach().numpy() for f in finals],
            [xt.grad.numpy()] + [s.grad.numpy() for s in st], grads)


CONFIGS = [  # (layer class, options, with states)
    (rnn.LSTM, {"num_layers": 1, "layout": "TNC"}, False),
    (rnn.LSTM, {"num_layers": 2, "layout": "NTC", "bidirectional": True}, True),
    (rnn.GRU, {"num_layers": 1, "layout": "NTC"}, True),
    (rnn.GRU, {"num_layers": 2, "layout": "TNC", "bidirectional": True}, False),
    (rnn.RNN, {"num_layers": 2, "activation": "tanh"}, True),
]


@pytest.mark.parametrize("cls, options, with_states", CONFIGS,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(CONFIGS)])
def test_layer_matches_torch_in_both_modes(cls, options, with_states):
    check_against_torch(cls, options, with_states)


@pytest.mark.parametrize("cls, options", [
    (rnn.LSTM, {"num_layers": 2, "layout": "NTC", "bidirectional": True}),
    (rnn.GRU, {"num_layers": 1, "layout": "TNC", "bidirectional": True}),
    (rnn.RNN, {"num_layers": 2, "activation": "tanh", "layout": "NTC"}),
], ids=["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("with_states", [False, True], ids=["zeros", "states"])
def test_sequence_length_matches_torch_packed_sequences(cls, options, with_states):
    """Steps past a sequence's length output zeros, its final states are those of its last
    step, and the reverse direction starts there: torch's pack_padded_sequence."""
    check_against_torch(cls, dict(options, use_sequence_length=True), with_states,
                        lengths=np.array([5, 2, 3, 1], dtype=np.float32))


def check_against_torch(cls, options, with_states, lengths=None):
    """The layer's outputs and gradients hybridized equal the imperative ones, and those
    equal torch.nn's with the same weights."""
    hidden, inputs, batch, steps = 5, 3, 2 if lengths is None else len(lengths), 5
    layer = cls(hidden, **options)
    layer.initialize(initializer.Uniform(0.4))
    ntc = options.get("layout", "TNC") == "NTC"
    x = rand(batch, steps, inputs) if ntc else rand(steps, batch, inputs)
    directions = 2 if options.get("bidirectional") else 1
    state_shape = (options["num_layers"] * directions, batch, hidden)
    count = 2 if cls is rnn.LSTM else 1
    states = [rand(*state_shape) for _ in range(count)] if with_states else []
    out_shape = x.shape[:2] + (hidden * directions,)
    heads = [rand(*out_shape)] + [rand(*state_shape) for _ in states]
    runs = []
    for hybrid in (False, True):
        layer.hybridize(hybrid)
        runs.append(run_layer(layer, x, states, heads, lengths))
    assert layer._cached
    for got, want in zip(runs[1][0] + runs[1][1], runs[0][0] + runs[0][1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for name, grad in runs[0][2].items():
        np.testing.assert_allclose(runs[1][2][name], grad, rtol=1e-5, atol=1e-6)

    torch_options = {k: v for k, v in options.items()
                     if k not in ("layout", "activation", "use_sequence_length")}
    if cls is rnn.RNN:
        torch_options["nonlinearity"] = options["activation"]
    module = TORCH_LAYERS[cls](inputs, hidden, batch_first=ntc, **torch_options)
    to_torch(layer, module)
    values, grads, param_grads = runs[0]
    t_lengths = None if lengths is None else lengths.astype(np.int64)
    t_values, t_grads, t_param_grads = run_torch(module, x, states, heads, ntc, t_lengths)
    assert len(values) == len(t_values) == 1 + (count if with_states else 0)
    for got, want in zip(values + grads, t_values + t_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert len(param_grads) == len(t_param_grads)
    for name, grad in param_grads.items():
        np.testing.assert_allclose(grad, t_param_grads[torch_name(name)], rtol=1e-4,
                                   atol=1e-5, err_msg=name)


def test_deferred_input_size_names_and_begin_state():
    layer = rnn.LSTM(4, num_layers=2, bidirectional=True, prefix="lstm0_")
    layer.initialize()
    assert layer.params.get("l0_i2h_weight").shape == (16, 0)
    assert [s.shape for s in layer.begin_state(batch_size=3)] == [(4, 3, 4)] * 2
    out = layer(nd.array(rand(6, 3, 7)))
    assert out.shape == (6, 3, 8)
    params = params_of(layer)
    assert params["l0_i2h_weight"].shape == (16, 7)
    assert params["r1_i2h_weight"].shape == (16, 8)
    assert params["l1_h2h_weight"].shape == (16, 4)
    assert list(layer.collect_params())[:4] == ["lstm0_l0_i2h_weight", "lstm0_l0_h2h_weight",
                                               "lstm0_l0_i2h_bias", "lstm0_l0_h2h_bias"]
    out, states = layer(nd.array(rand(6, 3, 7)), layer.begin_state(batch_size=3))
    assert [s.shape for s in states] == [(4, 3, 4)] * 2
    assert len(rnn.GRU(2).begin_state(5)) == 1


def test_zero_states_are_the_same_as_none():
    layer = rnn.GRU(3, num_layers=2)
    layer.initialize()
    x = nd.array(rand(4, 2, 5))
    out, _ = layer(x, layer.begin_state(batch_size=2))
    np.testing.assert_allclose(layer(x).asnumpy(), out.asnumpy(), rtol=1e-6)


def test_dropout_between_layers_only_when_training():
    layer = rnn.LSTM(4, num_layers=2, dropout=0.5)
    layer.initialize()
    x = nd.array(rand(3, 2, 3))
    quiet = layer(x).asnumpy()
    with autograd.train_mode():
        noisy = layer(x).asnumpy()
    assert not np.allclose(noisy, quiet)
    layer.hybridize()
    np.testing.assert_allclose(layer(x).asnumpy(), quiet, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell_cls, torch_cls", [(rnn.LSTMCell, torch.nn.LSTMCell),
                                                 (rnn.GRUCell, torch.nn.GRUCell)])
def test_cell_matches_torch_and_unrolls(cell_cls, torch_cls):
    cell = cell_cls(4)
    cell.initialize(initializer.Uniform(0.5))
    x, batch = rand(2, 3, 6), 2  # NTC
    states = cell.begin_state(batch_size=batch)
    outputs, finals = cell.unroll(3, nd.array(x), states, layout="NTC")
    assert outputs.shape == (2, 3, 4) and len(finals) == len(states)
    module = torch_cls(6, 4)
    with torch.no_grad():
        for name, param in params_of(cell).items():
            link = {"i2h": "ih", "h2h": "hh"}[name[:3]]
            module.get_parameter(f"{name[4:]}_{link}").copy_(
                torch.tensor(param.data().asnumpy()))
    state = None
    expected = []
    for t in range(3):
        state = module(torch.tensor(x[:, t]), state)
        expected.append((state[0] if isinstance(state, tuple) else state).detach().numpy())
    np.testing.assert_allclose(outputs.asnumpy(), np.stack(expected, axis=1), rtol=1e-5,
                               atol=1e-6)
    cell.hybridize()  # one step, hybridized, from the states of the unrolled run
    out, new_states = cell(nd.array(x[:, 0]), finals)
    t_state = module(torch.tensor(x[:, 0]), tuple(torch.tensor(f.asnumpy()) for f in finals)
                     if len(finals) == 2 else torch.tensor(finals[0].asnumpy()))
    t_h = t_state[0] if isinstance(t_state, tuple) else t_state
    np.testing.assert_allclose(out.asnumpy(), t_h.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_states[0].asnumpy(), out.asnumpy())
    listed, _ = cell.unroll(3, [nd.array(x[:, t]) for t in range(3)], layout="NTC")
    assert isinstance(listed, list) and len(listed) == 3


def test_bad_options_are_refused():
    with pytest.raises(InputError, match="layout"):
        rnn.LSTM(3, layout="NCT")
    with pytest.raises(InputError, match="activation"):
        rnn.RNN(3, activation="sigmoid")
    with pytest.raises(InputError, match="2 state"):
        layer = rnn.LSTM(3)
        layer.initialize()
        layer(nd.array(rand(2, 1, 3)), [nd.zeros((1, 1, 3))])


def test_each_layer_is_one_fused_node_and_one_trace_serves_every_length():
    layer = rnn.GRU(4, num_layers=3, bidirectional=True)
    layer.initialize(initializer.Uniform(0.4))
    x = {steps: rand(steps, 2, 3) for steps in (2, 7)}
    expected = {steps: layer(nd.array(v)).asnumpy() for steps, v in x.items()}
    layer.hybridize()
    for steps, value in x.items():
        np.testing.assert_allclose(layer(nd.array(value)).asnumpy(), expected[steps],
                                   rtol=1e-5, atol=1e-6)
    ops = [node.op_type for node in layer._last_cached.inference_graph().nodes]
    assert ops.count("GRU") == 3
    assert not {"Gemm", "MatMul", "Sigmoid", "Tanh"} & set(ops)


def test_sequence_length_is_asked_for_exactly_when_declared():
    x = nd.array(rand(3, 2, 4))
    with pytest.raises(InputError, match="needs sequence_length"):
        rnn.LSTM(3, use_sequence_length=True, input_size=4)(x)
    with pytest.raises(InputError, match="without use_sequence_length"):
        rnn.LSTM(3, input_size=4)(x, None, nd.array([1, 2]))
    layer = rnn.GRU(3, use_sequence_length=True, input_size=4)
    layer.initialize()
    with pytest.raises(ExecutionError, match=r"outside \[0, 3\]"):
        layer(x, None, nd.array([4, 1]))


def test_export_runs_in_onnxruntime_at_other_batch_sizes_and_lengths(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    layer = rnn.LSTM(5, num_layers=2, layout="NTC", bidirectional=True,
                     use_sequence_length=True)
    layer.initialize(initializer.Uniform(0.4))
    layer.hybridize()

    def feeds(batch, steps):
        states = [rand(4, batch, 5) for _ in range(2)]
        lengths = RNG.integers(1, steps + 1, batch).astype(np.float32)
        return [rand(batch, steps, 2), *states, lengths]

    def ours(values):
        out, finals = layer(nd.array(values[0]), [nd.array(v) for v in values[1:3]],
                            nd.array(values[3]))
        return [out.asnumpy()] + [f.asnumpy() for f in finals]

    traced = feeds(3, 4)
    ours(traced)
    paths = layer.export(str(tmp_path / "lstm"))
    session = ort.InferenceSession(paths["onnx"], providers=["CPUExecutionProvider"])
    names = [f"data{i}" for i in range(4)]  # the block's inputs, in its call's order
    assert sorted(i.name for i in session.get_inputs()) == names
    assert [n for n in session.get_outputs()[0].shape if isinstance(n, int)] == [10]
    for values in (traced, feeds(6, 9), feeds(1, 2)):
        for got, want in zip(session.run(None, dict(zip(names, values))), ours(values)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("cls", [rnn.LSTM, rnn.GRU])
def test_the_gpu_gives_the_cpus_outputs_and_gradients(cls):
    """The layer on mixrt.gpu(0), imperatively and hybridized, with states and sequence
    lengths: outputs, final states and every gradient equal the CPU's (float64)."""
    layer = cls(4, num_layers=2, layout="NTC", bidirectional=True, use_sequence_length=True,
                dtype="float64")
    layer.initialize(initializer.Uniform(0.4))
    x = rand(3, 5, 2).astype(np.float64)
    states = [rand(4, 3, 4).astype(np.float64) for _ in range(2 if cls is rnn.LSTM else 1)]
    heads = [rand(3, 5, 8)] + [rand(4, 3, 4) for _ in states]
    lengths = np.array([5, 2, 3], np.float32)
    runs = {}
    for device in ("cpu", "gpu"):
        ctx = mixrt.gpu(0) if device == "gpu" else mixrt.cpu()
        layer.collect_params().reset_ctx(ctx)
        for hybrid in (False, True):
            layer.hybridize(hybrid)
            with ctx:
                runs[device, hybrid] = run_layer(layer, x, states, heads, lengths)
    for hybrid in (False, True):
        (g_values, g_grads, g_params), (c_values, c_grads, c_params) = \
            runs["gpu", hybrid], runs["cpu", hybrid]
        for got, want in zip(g_values + g_grads, c_values + c_grads):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        for name, grad in c_params.items():
            np.testing.assert_allclose(g_params[name], grad, rtol=1e-9, atol=1e-12,
                                       err_msg=name)
