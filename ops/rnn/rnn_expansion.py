"""RNN, GRU and LSTM written out step by step in ops that have gradients (``@op.expansion``),
for gradients of gradients through a recurrent layer.

A recurrent layer's first-order backward is one fused kernel (rnn_grad.py) with no gradient
of its own. When a backward is to be differentiated again (``autograd.grad(...,
create_graph=True)``, ``gradient_graph(differentiable_backward=True)``) autodiff
differentiates this expansion instead: the layer unrolled over its time steps in Gemm,
Split, the activations, Mul, Add and Where, whose gradients are ordinary ops again.
Unrolling needs the sequence length and the batch size as static dimensions; where either is
unknown the expansion steps aside (returns None), and a second derivative stops at the fused
kernel with a GradientError that names it.

Padding (``sequence_lens``): step t of a sequence of length L runs when t < L; a padded step
holds the states and outputs zeros (Where). The reverse direction walks t from the last step
down under the same rule, so each sequence starts at its own last step: the reversal within
the length that ``recurrence.run_directions`` does with a gather. A sequence of length 0 ends with
zero states, as the kernel's does. The expansion computes in X's dtype, as the other
expansions do (the fused kernels widen float16 to float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixrt.ops.rnn import recurrence, rnn
from mixrt.ops.conv.conv_grad import optional_input

_INT64 = 7  # TensorProto.INT64


@dataclass
class _Layer:
    """What one recurrent node's expansion reads, its dims static."""

    x: str  # time-major (T, N, C)
    weights: list  # per direction: W (gates, C), R (gates, H), Wb, Rb (None without B)
    initials: list  # per state: None, or per direction its (N, H) initial value
    peepholes: list | None  # per direction: P (3H,)
    running: list | None  # per step: (N, 1) bool, whether that step is inside the sequence
    started: str | None  # (N, 1) bool: the sequence has a step at all
    steps: int
    batch: int
    hidden: int
    activations: list  # per direction: (key, alpha, beta) per activation
    clip: float | None
    backwards: list  # per direction: walks the steps from the last


def _read(b, node, defaults: list, state_count: int) -> _Layer | None:
    inputs = [optional_input(node, i) for i in range(8)]
    x, w, r, bias, lengths = inputs[:5]
    attributes = node.attributes
    layout = int(attributes.get("layout", 0))
    shape, r_shape = b.shape(x), b.shape(r)
    if shape is None or r_shape is None:
        return None
    steps, batch = (shape[1], shape[0]) if layout else shape[:2]
    directions, hidden = r_shape[0], r_shape[-1]
    if layout:
        x = b.emit("Transpose", x, perm=[1, 0, 2])
    weights = []
    for d, (w_d, r_d) in enumerate(zip(_per_direction(b, w, directions),
                                       _per_direction(b, r, directions))):
        biases = [None, None]
        if bias is not None:
            both = _per_direction(b, bias, directions)[d]
            biases = list(b.emit("Split", both, b.ints([r_shape[1]] * 2), axis=0,
                                 outputs=2))
        weights.append((w_d, r_d, *biases))
    initials = []
    for index in range(state_count):
        state = inputs[5 + index]
        if state is not None and layout:
            state = b.emit("Transpose", state, perm=[1, 0, 2])
        initials.append(None if state is None else _per_direction(b, state, directions))
    peepholes = None
    if state_count == 2 and inputs[7] is not None:
        peepholes = _per_direction(b, inputs[7], directions)
    running = started = None
    if lengths is not None:
        lengths = b.emit("Cast", lengths, to=_INT64)
        running = [_unsqueezed(b, b.emit("Less", b.ints([t]), lengths)) for t in range(steps)]
        started = _unsqueezed(b, b.emit("Greater", lengths, b.ints([0])))
    direction = attributes.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    activations = recurrence.activation_specs(
        _texts(attributes.get("activations")), attributes.get("activation_alpha"),
        attributes.get("activation_beta"), defaults, directions)
    return _Layer(x, weights, initials, peepholes, running, started, steps, batch, hidden,
                  activations, attributes.get("clip"),
                  [direction == "reverse" or d == 1 for d in range(directions)])


def _texts(names):
    return None if names is None else [n.decode() if isinstance(n, bytes) else n
                                       for n in names]


def _per_direction(b, name: str, directions: int) -> list:
    """``name`` (directions, ...) as one value per direction, the leading axis dropped."""
    parts = [name] if directions == 1 else list(
        b.emit("Split", name, b.ints([1] * directions), axis=0, outputs=directions))
    return [b.emit("Squeeze", part, b.ints([0])) for part in parts]


def _unsqueezed(b, name: str) -> str:
    return b.emit("Unsqueeze", name, b.ints([1]))


def _activation(b, spec, x: str, clip: float | None) -> str:
    """One ONNX recurrent activation of ``x`` clipped to [-clip, clip] first when given."""
    if clip is not None:
        x = b.emit("Clip", x, b.constant(-clip, like=x), b.constant(clip, like=x))
    key, alpha, beta = spec
    if key in ("relu", "tanh", "sigmoid", "softsign", "softplus"):
        return b.emit({"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid",
                       "softsign": "Softsign", "softplus": "Softplus"}[key], x)
    if key == "affine":
        return b.emit("Add", b.mul(x, b.constant(alpha, like=x)), b.constant(beta, like=x))
    if key == "scaledtanh":
        inner = b.emit("Tanh", b.mul(x, b.constant(beta, like=x)))
        return b.mul(inner, b.constant(alpha, like=x))
    if key == "hardsigmoid":
        return b.emit("HardSigmoid", x, alpha=float(alpha), beta=float(beta))
    return b.emit({"leakyrelu": "LeakyRelu", "thresholdedrelu": "ThresholdedRelu",
                   "elu": "Elu"}[key], x, alpha=float(alpha))


def _recurrent(b, h: str, r: str, rb: str | None) -> str:
    """h R^T + Rb."""
    return b.emit("Gemm", h, r, rb, transB=1) if rb is not None else \
        b.emit("Gemm", h, r, transB=1)


# -- the cells: (projected input, states, weights, activations) -> new states, hidden first --

def _rnn_cell(b, layer, x_t, states, weights, acts, options):
    del options
    _, r, _, rb = weights
    pre = b.emit("Add", x_t, _recurrent(b, states[0], r, rb))
    return [_activation(b, acts[0], pre, layer.clip)]


def _gru_cell(b, layer, x_t, states, weights, acts, options):
    (h,), (_, r, _, rb), hidden = states, weights, layer.hidden
    sizes = b.ints([hidden] * 3)
    xz, xr, xh = b.emit("Split", x_t, sizes, axis=-1, outputs=3)
    rz, rr, rh = b.emit("Split", r, sizes, axis=0, outputs=3)
    bz, br, bh = (None,) * 3 if rb is None else b.emit("Split", rb, sizes, axis=0, outputs=3)
    z = _activation(b, acts[0], b.emit("Add", xz, _recurrent(b, h, rz, bz)), layer.clip)
    reset = _activation(b, acts[0], b.emit("Add", xr, _recurrent(b, h, rr, br)), layer.clip)
    if options.get("linear_before_reset"):
        candidate_in = b.emit("Add", xh, b.mul(reset, _recurrent(b, h, rh, bh)))
    else:
        candidate_in = b.emit("Add", xh, _recurrent(b, b.mul(reset, h), rh, bh))
    candidate = _activation(b, acts[1], candidate_in, layer.clip)
    # (1 - z) candidate + z h
    return [b.emit("Add", candidate, b.mul(z, b.emit("Sub", h, candidate)))]


def _lstm_cell(b, layer, x_t, states, weights, acts, options):
    (h, c), (_, r, _, rb) = states, weights
    pre = b.emit("Add", x_t, _recurrent(b, h, r, rb))
    g_i, g_o, g_f, g_c = b.emit("Split", pre, b.ints([layer.hidden] * 4), axis=-1, outputs=4)
    peepholes = options.get("peepholes")
    if peepholes is not None:
        p_i, p_o, p_f = b.emit("Split", peepholes, b.ints([layer.hidden] * 3), axis=0,
                               outputs=3)
        g_i, g_f = b.emit("Add", g_i, b.mul(p_i, c)), b.emit("Add", g_f, b.mul(p_f, c))
    i = _activation(b, acts[0], g_i, layer.clip)
    if options.get("input_forget"):
        forget = b.emit("Sub", b.constant(1.0, like=i), i)
    else:
        forget = _activation(b, acts[0], g_f, layer.clip)
    candidate = _activation(b, acts[1], g_c, layer.clip)
    cell = b.emit("Add", b.mul(forget, c), b.mul(i, candidate))
    if peepholes is not None:
        g_o = b.emit("Add", g_o, b.mul(p_o, cell))
    o = _activation(b, acts[0], g_o, layer.clip)
    return [b.mul(o, _activation(b, acts[2], cell, None)), cell]  # the cell is not clipped


# -- the driver -------------------------------------------------------------------------------

def _direction(b, layer: _Layer, d: int, cell, options: dict):
    """One direction over all steps: its (T, 1, N, H) outputs and final states."""
    w, _, wb, _ = layer.weights[d]
    projected = b.emit("MatMul", layer.x, b.emit("Transpose", w, perm=[1, 0]))
    if wb is not None:
        projected = b.emit("Add", projected, wb)
    inputs = [projected] if layer.steps == 1 else list(
        b.emit("Split", projected, b.ints([1] * layer.steps), axis=0, outputs=layer.steps))
    inputs = [b.emit("Squeeze", x_t, b.ints([0])) for x_t in inputs]
    zeros = b.constant(np.zeros((layer.batch, layer.hidden)), like=layer.x)
    states = [zeros if initial is None else initial[d] for initial in layer.initials]
    if layer.peepholes is not None:
        options = dict(options, peepholes=layer.peepholes[d])
    outputs = [None] * layer.steps
    order = range(layer.steps - 1, -1, -1) if layer.backwards[d] else range(layer.steps)
    for t in order:
        new = cell(b, layer, inputs[t], states, layer.weights[d], layer.activations[d],
                   options)
        if layer.running is None:
            states, outputs[t] = new, new[0]
        else:
            states = [b.emit("Where", layer.running[t], n, s) for n, s in zip(new, states)]
            outputs[t] = b.emit("Where", layer.running[t], new[0], zeros)
    if layer.started is not None:
        states = [b.emit("Where", layer.started, s, zeros) for s in states]
    y = b.emit("Concat", *[b.emit("Unsqueeze", o, b.ints([0, 1])) for o in outputs], axis=0)
    return y, states


def _expansion(cell, defaults: list, state_count: int, option_names: tuple):
    def expand(b, node):
        layer = _read(b, node, defaults, state_count)
        if layer is None:
            return None
        options = {name: node.attributes.get(name, 0) for name in option_names}
        runs = [_direction(b, layer, d, cell, options) for d in range(len(layer.weights))]
        y = _joined(b, [run[0] for run in runs], axis=1)
        finals = [_joined(b, [b.emit("Unsqueeze", run[1][k], b.ints([0])) for run in runs],
                          axis=0) for k in range(state_count)]
        if int(node.attributes.get("layout", 0)):
            y = b.emit("Transpose", y, perm=[2, 0, 1, 3])
            finals = [b.emit("Transpose", f, perm=[1, 0, 2]) for f in finals]
        return ([y, *finals] + [None] * len(node.outputs))[:len(node.outputs)]
    return expand


def _joined(b, parts: list, axis: int) -> str:
    return parts[0] if len(parts) == 1 else b.emit("Concat", *parts, axis=axis)


for _version in (rnn.rnn_7, rnn.rnn_14):
    _version.expansion(_expansion(_rnn_cell, ["Tanh"], 1, ()))
for _version in (rnn.gru_7, rnn.gru_14):
    _version.expansion(_expansion(_gru_cell, ["Sigmoid", "Tanh"], 1, ("linear_before_reset",)))
for _version in (rnn.lstm_7, rnn.lstm_14):
    _version.expansion(_expansion(_lstm_cell, ["Sigmoid", "Tanh", "Tanh"], 2,
                                  ("input_forget",)))
