"""Gradients of RNN, GRU and LSTM (ops/rnn/rnn_grad.py): backpropagation through time against
central differences for every attribute the forward takes, the op against torch.nn.LSTM and
torch.nn.GRU, and two models PyTorch exported (tests/data/torch_exports) differentiated whole
against PyTorch's autograd, then fine-tuned."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from grad.gradcheck import check_gradient
import mixrt
from mixrt import autograd, nd
from mixrt.errors import GradientError
from mixrt.importers.onnx import import_model
from mixrt.ops.device import gpu_available, to_host
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.passes.autodiff import gradient_graph
from mixrt.runtime.training.program import TrainingProgram, mse, softmax_cross_entropy


def _nd(value, **kwargs):
    """``nd.array`` keeping a NumPy array's dtype (these checks compute in float64);
    ``nd.array``'s own default is float32, as MXNet's."""
    return nd.array(value, dtype=getattr(value, "dtype", None), **kwargs)

rng = np.random.default_rng(3)
ROOT = Path(__file__).resolve().parents[2]
EXPORTS = ROOT / "tests" / "data" / "torch_exports"
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
SEQ, BATCH, INPUT, HIDDEN = 4, 3, 2, 3


def randn(*shape, scale=0.6):
    return rng.standard_normal(shape) * scale


def layer_inputs(kind, *, directions=1, lengths=None, initial=True, bias=True,
                 peepholes=False, layout=0):
    """X, W, R, B, sequence_lens, initial_h[, initial_c, P] (None where absent)."""
    gates = GATES[kind] * HIDDEN
    x_shape = (BATCH, SEQ, INPUT) if layout else (SEQ, BATCH, INPUT)
    state = (BATCH, directions, HIDDEN) if layout else (directions, BATCH, HIDDEN)
    inputs = [randn(*x_shape), randn(directions, gates, INPUT), randn(directions, gates, HIDDEN),
              randn(directions, 2 * gates) if bias else None,
              None if lengths is None else np.array(lengths, np.int32),
              randn(*state) if initial else None]
    if kind == "LSTM":
        inputs += [randn(*state) if initial else None,
                   randn(directions, 3 * HIDDEN) if peepholes else None]
    while inputs[-1] is None:
        inputs.pop()
    return inputs


def check_layer(kind, inputs, attributes, *, opset=14, loss_outputs=None):
    outputs = 3 if kind == "LSTM" else 2
    check_gradient(kind, inputs, {"hidden_size": HIDDEN, **attributes}, constants=(4,),
                   opset=opset, outputs=outputs, loss_outputs=loss_outputs,
                   second_order=True)


# -- every attribute, against central differences ------------------------------------------

@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_directions_with_sequence_lengths_and_initial_states(kind, direction):
    directions = 2 if direction == "bidirectional" else 1
    inputs = layer_inputs(kind, directions=directions, lengths=[4, 2, 3])
    check_layer(kind, inputs, {"direction": direction})


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction, layout", [
    ("forward", 0), ("reverse", 0), ("bidirectional", 0), ("bidirectional", 1)])
def test_unpadded_layers_through_the_compiled_steps(kind, direction, layout):
    """Default activations and no padding: the steps ops/rnn/lstm_cpu.py and ops/rnn/gru_cpu.py run
    (the GRU with its reset after the product; sequence_lens given, all full length, still
    counts as unpadded)."""
    directions = 2 if direction == "bidirectional" else 1
    inputs = layer_inputs(kind, directions=directions, lengths=[SEQ] * BATCH, layout=layout)
    extra = {"linear_before_reset": 1} if kind == "GRU" else {}
    check_layer(kind, inputs, {"direction": direction, "layout": layout, **extra})


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_an_empty_sequence_has_zero_finals_and_passes_no_gradient(kind):
    """A length-0 sequence outputs zeros and zero final states (onnxruntime's rule), so its
    initial states get no gradient: the finals' gradient must not pass through to them."""
    inputs = layer_inputs(kind, directions=2, lengths=[4, 0, 3])
    check_layer(kind, inputs, {"direction": "bidirectional"})


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_batch_first_layout(kind):
    inputs = layer_inputs(kind, directions=2, lengths=[1, 4, 3], layout=1)
    check_layer(kind, inputs, {"direction": "bidirectional", "layout": 1})


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_without_bias_or_initial_states_at_opset_7(kind):
    inputs = layer_inputs(kind, initial=False, bias=False)
    check_layer(kind, inputs, {}, opset=7)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_clip_passes_no_gradient_where_it_clipped(kind):
    inputs = layer_inputs(kind, directions=2, lengths=[3, 4, 2])
    inputs[1] *= 3  # pre-activations well past the clip on some steps
    check_layer(kind, inputs, {"direction": "bidirectional", "clip": 0.9})


@pytest.mark.parametrize("activation, alpha, beta", [
    ("Relu", None, None), ("Tanh", None, None), ("Sigmoid", None, None),
    ("Affine", 0.7, 0.2), ("LeakyRelu", 0.1, None), ("ThresholdedRelu", 0.3, None),
    ("ScaledTanh", 1.3, 0.6), ("HardSigmoid", 0.3, 0.4), ("Elu", 0.8, None),
    ("Softsign", None, None), ("Softplus", None, None)])
def test_every_activation(activation, alpha, beta):
    attributes = {"activations": [activation]}
    if alpha is not None:
        attributes["activation_alpha"] = [alpha]
    if beta is not None:
        attributes["activation_beta"] = [beta]
    check_layer("RNN", layer_inputs("RNN"), attributes)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_reset_before_or_after_the_recurrent_product(linear_before_reset):
    inputs = layer_inputs("GRU", directions=2, lengths=[4, 1, 3])
    check_layer("GRU", inputs, {"direction": "bidirectional",
                                "linear_before_reset": linear_before_reset})


def test_gru_with_other_activations_per_direction():
    attributes = {"direction": "bidirectional", "activations":
                  ["HardSigmoid", "Softsign", "Sigmoid", "ScaledTanh"],
                  "activation_alpha": [0.25, 1.1], "activation_beta": [0.45, 0.8]}
    check_layer("GRU", layer_inputs("GRU", directions=2), attributes)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_peepholes(direction):
    directions = 2 if direction == "bidirectional" else 1
    inputs = layer_inputs("LSTM", directions=directions, lengths=[2, 4, 3], peepholes=True)
    check_layer("LSTM", inputs, {"direction": direction})


def test_lstm_coupled_input_and_forget_gates():
    inputs = layer_inputs("LSTM", directions=2, peepholes=True)
    check_layer("LSTM", inputs, {"direction": "bidirectional", "input_forget": 1})


def test_lstm_with_other_activations():
    attributes = {"activations": ["HardSigmoid", "Elu", "Softsign"],
                  "activation_alpha": [0.3, 0.9], "activation_beta": [0.5]}
    check_layer("LSTM", layer_inputs("LSTM", peepholes=True), attributes)


@pytest.mark.parametrize("used", [[0], [1], [2], [1, 2]])
def test_only_some_outputs_feed_the_loss(used):
    inputs = layer_inputs("LSTM", directions=2, lengths=[4, 2, 3])
    check_layer("LSTM", inputs, {"direction": "bidirectional"}, loss_outputs=used)


@pytest.mark.parametrize("kind, attributes", [
    ("RNN", {"activations": ["Relu", "Affine"], "activation_alpha": [0.5]}),
    ("GRU", {"clip": 0.8, "linear_before_reset": 1}),
    ("LSTM", {}),
    ("LSTM", {"clip": 1.0, "input_forget": 1})], ids=["RNN", "GRU", "LSTM", "LSTM-clip"])
def test_the_backward_reads_the_forwards_workspace(kind, attributes):
    """A training graph's forward node gains a workspace output (every step's cache), which
    the backward kernel reads instead of running the forward again: the same outputs and
    the same gradients as without it."""
    from mixrt.ops.rnn import cells, recurrence, rnn, rnn_grad  # noqa: PLC0415
    states = 2 if kind == "LSTM" else 1
    inputs = layer_inputs(kind, directions=2, lengths=[4, 0, 3], peepholes=kind == "LSTM")
    inputs += [None] * (5 + states + (states == 2) - len(inputs))  # P is the LSTM's
    options = {"hidden_size": HIDDEN, "direction": "bidirectional", **attributes}
    forward = getattr(rnn, f"{kind.lower()}_14")
    *outputs, workspace = forward(np, *inputs, _outputs=2 + states, **options)
    for got, want in zip(outputs, forward(np, *inputs, **options)):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    kept = sum(cells.CELLS[kind][0].kept(
        recurrence.activation_specs(options.get("activations"), options.get("activation_alpha"),
                             None, cells.CELLS[kind][1], 2),
        options.get("clip"), options))
    assert workspace.shape == (2, SEQ, kept, BATCH, HIDDEN)
    heads = [randn(*o.shape) for o in outputs]
    backward = getattr(rnn_grad, f"{kind.lower()}_grad")
    grads = [backward(np, *heads, *inputs, saved, **options) for saved in (workspace, None)]
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    graph = _one_layer_graph(kind, inputs[:3])
    joint = gradient_graph(graph, "loss", ["X", "W", "R"]).graph
    layer, = (n for n in joint.nodes if n.op_type == kind)
    grad, = (n for n in joint.nodes if n.op_type == f"{kind}Grad")
    assert len(layer.outputs) == 2 + states and grad.inputs[-1] == layer.outputs[-1]


def test_float32_gradients_have_the_inputs_dtype():
    inputs = [None if a is None else a.astype(np.float32) if a.dtype.kind == "f" else a
              for a in layer_inputs("GRU")]
    graph = _one_layer_graph("GRU", inputs)
    joint = gradient_graph(graph, "loss", ["X", "W", "R"])
    session = mixrt.Session(joint.graph)
    grads = session.run([joint.grads[n] for n in ("X", "W", "R")],
                        {"X": inputs[0], "W": inputs[1], "R": inputs[2]})
    assert all(g.dtype == np.float32 for g in grads)


def _one_layer_graph(kind, inputs):
    names = ["X", "W", "R", "B", "", "initial_h"]
    initializers = {n: a for n, a in zip(names, inputs) if n and n not in ("X", "W", "R")
                    and a is not None}
    node_inputs = [n if a is not None else "" for n, a in zip(names, inputs)]
    nodes = [Node(kind, node_inputs, ["Y"], name=kind.lower(), opset=14,
                  attributes={"hidden_size": HIDDEN}),
             Node("ReduceSum", ["Y"], ["loss"], name="loss", opset=14,
                  attributes={"keepdims": 0})]
    graph = Graph(nodes=nodes, inputs=[Value("X"), Value("W"), Value("R")],
                  outputs=[Value("loss")], initializers=initializers, name="rnn")
    return graph


def test_second_derivatives_through_the_imperative_layer():
    """create_graph through nd.LSTM differentiates the layer unrolled (ops/rnn/rnn_expansion.py);
    its Hessian-vector product equals central differences of the fused first-order
    gradient, and the first-order gradient it returns is the fused kernel's."""
    x = _nd(randn(SEQ, BATCH, INPUT))
    w, r = _nd(randn(1, 4 * HIDDEN, INPUT)), _nd(randn(1, 4 * HIDDEN, HIDDEN))
    lengths = nd.array(np.array([4, 1, 3], np.int32), dtype=np.int32)
    v = randn(SEQ, BATCH, INPUT)

    def first_order(value, create_graph=False):
        point = _nd(value)
        point.attach_grad()
        with autograd.record():
            y = nd.LSTM(point, w, r, None, lengths, hidden_size=HIDDEN)[0]
            grad = autograd.grad((y * y * y).sum(), [point], create_graph=create_graph)[0]
        return point, grad

    point, grad = first_order(x.asnumpy(), create_graph=True)
    with autograd.record():
        (grad * _nd(v)).sum().backward()
    np.testing.assert_allclose(grad.asnumpy(), first_order(x.asnumpy())[1].asnumpy(),
                               rtol=1e-12)
    numeric = np.zeros_like(v)
    eps = 1e-6
    for index in np.ndindex(v.shape):
        shifted = [x.asnumpy().copy() for _ in range(2)]
        shifted[0][index] += eps
        shifted[1][index] -= eps
        ups, downs = (float((first_order(s)[1].asnumpy() * v).sum()) for s in shifted)
        numeric[index] = (ups - downs) / (2 * eps)
    np.testing.assert_allclose(point.grad.asnumpy(), numeric, rtol=1e-5, atol=1e-7)


def test_a_second_derivative_at_an_unknown_length_is_named_at_the_backward_kernel():
    """Unrolling needs the number of steps; where it is symbolic the expansion steps aside
    and the second derivative stops at the fused kernel, by name."""
    inputs = layer_inputs("LSTM")
    graph = _one_layer_graph("LSTM", inputs[:3])
    graph.inputs[0] = Value("X", TensorType(np.dtype(np.float64), ("T", BATCH, INPUT)))
    first = gradient_graph(graph, "loss", ["X"], differentiable_backward=True)
    assert "LSTMGrad" in {node.op_type for node in first.graph.nodes}
    summed = Node("ReduceSum", [first.grads["X"]], ["g_total"], name="g_total", opset=14,
                  attributes={"keepdims": 0})
    first.graph.nodes.append(summed)
    first.graph.outputs.append(Value("g_total"))
    with pytest.raises(GradientError, match="LSTMGrad"):
        gradient_graph(first.graph, "g_total", ["X"])


# -- against PyTorch ------------------------------------------------------------------------

def _torch_gate_order(kind):
    """Row blocks of PyTorch's weights in ONNX's gate order: LSTM i,f,g,o -> i,o,f,c;
    GRU r,z,n -> z,r,h."""
    return [0, 3, 1, 2] if kind == "LSTM" else [1, 0, 2]


def _onnx_weights(torch_weight, kind):
    blocks = np.split(torch_weight.detach().numpy(), GATES[kind], axis=0)
    return np.concatenate([blocks[i] for i in _torch_gate_order(kind)], axis=0)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_the_layer_matches_torch_autograd(kind):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer = getattr(torch.nn, kind)(INPUT, HIDDEN, bidirectional=True).double()
    x = torch.tensor(randn(SEQ, BATCH, INPUT), requires_grad=True)
    weights = torch.tensor(randn(SEQ, BATCH, 2 * HIDDEN))
    y, _ = layer(x)
    (y * weights).sum().backward()

    suffixes = ["", "_reverse"]
    W = np.stack([_onnx_weights(getattr(layer, f"weight_ih_l0{s}"), kind) for s in suffixes])
    R = np.stack([_onnx_weights(getattr(layer, f"weight_hh_l0{s}"), kind) for s in suffixes])
    B = np.stack([np.concatenate([_onnx_weights(getattr(layer, f"bias_{p}_l0{s}"), kind)
                                  for p in ("ih", "hh")]) for s in suffixes])
    args = [_nd(a) for a in (x.detach().numpy(), W, R, B)]
    for a in args:
        a.attach_grad()
    extra = {"linear_before_reset": 1} if kind == "GRU" else {}
    with autograd.record():
        out = getattr(nd, kind)(*args, hidden_size=HIDDEN, direction="bidirectional",
                                **extra)
        y_onnx = out[0] if isinstance(out, (list, tuple)) else out   # (seq, dirs, batch, h)
        per_direction = _nd(weights.numpy().reshape(SEQ, BATCH, 2, HIDDEN)
                                 .transpose(0, 2, 1, 3))
        (y_onnx * per_direction).sum().backward()
    np.testing.assert_allclose(args[0].grad.asnumpy(), x.grad.numpy(), rtol=1e-9, atol=1e-12)
    torch_w = np.stack([_onnx_weights(getattr(layer, f"weight_ih_l0{s}").grad, kind)
                        for s in suffixes])
    torch_r = np.stack([_onnx_weights(getattr(layer, f"weight_hh_l0{s}").grad, kind)
                        for s in suffixes])
    np.testing.assert_allclose(args[1].grad.asnumpy(), torch_w, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(args[2].grad.asnumpy(), torch_r, rtol=1e-9, atol=1e-12)


def _exported(stem):
    return import_model(onnx.load(EXPORTS / f"{stem}.torchscript.onnx"))


def _torch_model(name):
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import export_torch_models
    finally:
        sys.path.remove(str(ROOT / "tools"))
    torch.manual_seed(1)  # the exporter's seed: the committed weights
    return torch, getattr(export_torch_models, name)()


def test_an_exported_two_layer_bidirectional_lstm_matches_torch_gradients():
    torch, model = _torch_model("LSTMClassifier")
    graph = _exported("lstm_classifier")
    trainable = list(graph.initializers)
    program = TrainingProgram(graph, softmax_cross_entropy(graph.output_names[0]), trainable)
    tokens, label = rng.integers(0, 50, (6, 7)), rng.integers(0, 5, 6)
    params = {n: np.asarray(a) for n, a in graph.initializers.items()}
    loss, _, grads = program.step(params, {"tokens": tokens, "label": label})

    torch_loss = torch.nn.functional.cross_entropy(model(torch.tensor(tokens)),
                                                   torch.tensor(label))
    torch_loss.backward()
    assert loss == pytest.approx(torch_loss.item(), rel=1e-6)
    torch_params = dict(model.named_parameters())
    for name in ("embed.weight", "out.weight", "out.bias"):
        np.testing.assert_allclose(grads[name], torch_params[name].grad.numpy(),
                                   rtol=1e-4, atol=1e-7, err_msg=name)
    # the exporter's initializers for layer 0: W (2, 48, 16), R (2, 48, 12), B (2, 96)
    by_shape = {tuple(params[n].shape): n for n in trainable if n.startswith("onnx::LSTM")}
    torch_w = np.stack([_onnx_weights(torch_params[f"lstm.weight_ih_l0{s}"].grad, "LSTM")
                        for s in ("", "_reverse")])
    np.testing.assert_allclose(grads[by_shape[(2, 48, 16)]], torch_w, rtol=1e-4, atol=1e-7)


def test_an_exported_gru_tagger_matches_torch_gradients():
    torch, model = _torch_model("GRUTagger")
    graph = _exported("gru_tagger")
    output = graph.output_names[0]  # log-probabilities (batch, seq, tags)
    trainable = list(graph.initializers)
    program = TrainingProgram(graph, mse(output), trainable)
    x = randn(2, 6, 8).astype(np.float32)
    target = randn(2, 6, 4).astype(np.float32)
    params = {n: np.asarray(a) for n, a in graph.initializers.items()}
    loss, _, grads = program.step(params, {"x": x, "label": target})

    torch_loss = ((model(torch.tensor(x)) - torch.tensor(target)) ** 2).mean()
    torch_loss.backward()
    assert loss == pytest.approx(torch_loss.item(), rel=1e-5)
    torch_params = dict(model.named_parameters())
    np.testing.assert_allclose(grads["tag.bias"], torch_params["tag.bias"].grad.numpy(),
                               rtol=1e-4, atol=1e-7)
    w_name = next(n for n in trainable if params[n].shape == (1, 36, 8))
    np.testing.assert_allclose(grads[w_name][0],
                               _onnx_weights(torch_params["gru.weight_ih_l0"].grad, "GRU"),
                               rtol=1e-4, atol=1e-7)


def test_fine_tuning_the_exported_lstm_learns_a_sequence_task():
    """Label = the first token's class: only a recurrence that carries it (the forward
    direction, over 7 steps) can learn it."""
    graph = _exported("lstm_classifier")
    trainable = list(graph.initializers)
    program = TrainingProgram(graph, softmax_cross_entropy(graph.output_names[0]), trainable)
    params = {n: np.array(a) for n, a in graph.initializers.items()}
    data = np.random.default_rng(7)
    moments = {n: (np.zeros_like(p), np.zeros_like(p)) for n, p in params.items()}
    losses = []
    for step in range(1, 401):
        tokens = data.integers(0, 50, (32, 7))
        loss, _, grads = program.step(params, {"tokens": tokens, "label": tokens[:, 0] % 5})
        losses.append(loss)
        for name, grad in grads.items():  # Adam, lr 3e-2
            m, v = moments[name]
            m[...] = 0.9 * m + 0.1 * grad
            v[...] = 0.999 * v + 0.001 * grad * grad
            params[name] -= 3e-2 * (m / (1 - 0.9 ** step)) / (
                np.sqrt(v / (1 - 0.999 ** step)) + 1e-8)
    tokens = data.integers(0, 50, (256, 7))
    _, (logits,), _ = program.step(params, {"tokens": tokens, "label": tokens[:, 0] % 5})
    accuracy = float((logits.argmax(axis=1) == tokens[:, 0] % 5).mean())
    assert np.mean(losses[-10:]) < 0.1 * np.mean(losses[:10])  # 1.63 -> 0.004 when written
    assert accuracy > 0.95, accuracy                            # 1.0 when written


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")
@pytest.mark.parametrize("stem, loss, feeds", [
    ("lstm_classifier", "softmax", {"tokens": np.arange(21).reshape(3, 7) % 50,
                                    "label": np.array([0, 3, 4])}),
    ("gru_tagger", "mse", {"x": np.linspace(-1, 1, 96, dtype=np.float32).reshape(2, 6, 8),
                           "label": np.full((2, 6, 4), -1.5, np.float32)})])
def test_the_gpu_gives_the_cpus_gradients(stem, loss, feeds):
    graph = _exported(stem)
    make_loss = softmax_cross_entropy if loss == "softmax" else mse
    params = {n: np.asarray(a) for n, a in graph.initializers.items()}
    results = []
    for device in ("cpu", "gpu"):
        program = TrainingProgram(graph, make_loss(graph.output_names[0]), list(params),
                                  device=device)
        device_params = {n: program.session.device.put(a) for n, a in params.items()}
        _, _, grads = program.step(device_params, feeds)
        results.append({n: to_host(g) for n, g in grads.items()})
    for name in params:
        np.testing.assert_allclose(results[1][name], results[0][name], rtol=1e-4, atol=1e-6,
                                   err_msg=name)
