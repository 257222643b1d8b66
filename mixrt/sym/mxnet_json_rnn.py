"""MXNet's fused ``RNN`` op as ONNX's recurrent operators, one RNN, GRU or LSTM node per
layer: how MXNet's symbol files (``mixrt.sym.mxnet_json``) and ``sym.RNN``
(``mixrt.sym.fused_rnn``) build it.

MXNet's weights (cuDNN's layout, MXNet's gate order) are cut out per layer and direction,
reordered to ONNX's gates and stacked (:class:`_RNNLayout`). It stands apart from the
other translations (``mxnet_json_ops.py``, whose checks it uses) as the one op that builds
a graph of its own from a weight layout.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import GraphError
from mixrt.sym.mxnet_json_ops import (check_arity, dropout, INT64_MAX, is_integer, no_params,
                                      onnx_slice, required_param)
from mixrt.sym.ops import call_op
from mixrt.sym.symbol import constant, Group, Symbol

# each RNN layer is a handful of nodes made now: a file asking for 10**11 would exhaust memory
MAX_RNN_LAYERS = 1024

# MXNet's RNN modes -> (ONNX operator, its attributes, gates, ONNX's gate order as indices
# into MXNet's, states)
_RNN_MODES = {
    "rnn_tanh": ("RNN", {"activations": ["Tanh"]}, 1, (0,), 1),
    "rnn_relu": ("RNN", {"activations": ["Relu"]}, 1, (0,), 1),
    "lstm": ("LSTM", {}, 4, (0, 3, 1, 2), 2),
    "gru": ("GRU", {"linear_before_reset": 1}, 3, (1, 0, 2), 1),
}


def mxnet_rnn(name, inputs, params):
    """MXNet's fused RNN op over (T, N, C) data, one ONNX RNN/LSTM/GRU node per layer.

    Its parameters are MXNet's (cuDNN's) layout: per layer and direction ``i2h_weight``,
    ``h2h_weight``, then all the ``i2h_bias``, ``h2h_bias`` pairs in the same order; either
    the ``_rnn_param_concat`` of the separate arrays that Gluon's rnn layers export, or
    ``sym.RNN``'s one flat vector (whose size follows from the data's width: bind it with
    its array or its shape)."""
    mode = required_param(params, "mode")
    if mode not in _RNN_MODES:
        raise GraphError(f"mode must be one of {sorted(_RNN_MODES)}, got {mode!r}")
    op_type, attributes, gates, order, states = _RNN_MODES[mode]
    hidden, layers = required_param(params, "state_size"), params.pop("num_layers", 1)
    for key, value, most in (("state_size", hidden, INT64_MAX),
                             ("num_layers", layers, MAX_RNN_LAYERS)):
        if not is_integer(value) or not 1 <= value <= most:
            raise GraphError(f"{key} must be a whole number in 1..{most}, got {value!r}")
    directions = 2 if params.pop("bidirectional", False) else 1
    rate, state_outputs = params.pop("p", 0.0), params.pop("state_outputs", False)
    lengths = params.pop("use_sequence_length", False)
    for unsupported in ("projection_size", "lstm_state_clip_min", "lstm_state_clip_max"):
        if params.pop(unsupported, None) is not None:
            raise GraphError(f"{unsupported} is not supported")
    params.pop("lstm_state_clip_nan", None)
    params.pop("cudnn_off", None)
    no_params(params)
    check_arity(inputs, 2 + states + bool(lengths))
    data, layout = inputs[0], _RNNLayout(name, hidden, gates, order, directions)
    pieces = _rnn_pieces(name, data, inputs[1], layout, layers)
    begin = inputs[2:2 + states]
    lengths = call_op("", "Cast", [inputs[-1]], {"to": 6}, name=f"{name}_lengths",
                      exact_name=True) if lengths else None
    attributes = dict(attributes, hidden_size=hidden,
                      direction="bidirectional" if directions == 2 else "forward")
    if "activations" in attributes:
        attributes["activations"] = attributes["activations"] * directions
    sequence, finals = data, []
    for layer in range(layers):
        if layer and rate:
            sequence = dropout(f"{name}dropout{layer}", [sequence], {"p": rate})
        sequence, final = layout.layer(layer, sequence, pieces, begin, lengths, op_type,
                                       attributes, 1 + states)
        finals.append(final)
    output = call_op("", "Identity", [sequence], {}, name=name)
    if not state_outputs:
        return output
    stacked = [finals[0][k] if layers == 1 else call_op(
        "", "Concat", [final[k] for final in finals], {"axis": 0},
        name=f"{name}_state{k}", exact_name=True) for k in range(states)]
    return Group([output, *stacked])


def _rnn_pieces(name, data, parameters: Symbol, layout: "_RNNLayout", layers: int):
    """The weights and biases, each flattened, in MXNet's order: the inputs of the
    ``_rnn_param_concat`` Gluon exports, or else slices of the one flat vector."""
    count = layers * layout.directions * 4
    node = parameters._outputs[0][0]
    if node.op == "Concat" and len(node.inputs) == count:
        return [Symbol([entry]) for entry in node.inputs]
    return _flat_pieces(name, data, parameters, layout, layers)


def _flat_pieces(name, data, parameters, layout, layers):
    """Slices of ``sym.RNN``'s flat parameter vector. Only the first layer's input weights
    depend on the data's width C, so each bound is ``a + b * C`` with a, b known now."""
    rows, cells = layout.gates * layout.hidden, layout.directions
    sizes = []  # (constant part, multiple of C) of each piece's length
    for layer in range(layers):
        for _ in range(cells):
            sizes += [(0, rows) if layer == 0 else (rows * cells * layout.hidden, 0),
                      (rows * layout.hidden, 0)]
    sizes += [(rows, 0)] * (2 * layers * cells)
    bounds = np.cumsum([(0, 0)] + sizes, axis=0)
    shape = call_op("", "Shape", [data], {}, name=f"{name}_data_shape", exact_name=True)
    width = onnx_slice(f"{name}_width", shape, [2], [3], [0])
    scaled = call_op("", "Mul", [width, constant(bounds[:, 1].astype(np.int64),
                                                 name=f"{name}_per_width")], {},
                     name=f"{name}_scaled", exact_name=True)
    offsets = call_op("", "Add", [scaled, constant(bounds[:, 0].astype(np.int64),
                                                   name=f"{name}_fixed")], {},
                      name=f"{name}_offsets", exact_name=True)
    pieces = []
    for i in range(len(sizes)):
        start = onnx_slice(f"{name}_start{i}", offsets, [i], [i + 1], [0])
        end = onnx_slice(f"{name}_end{i}", offsets, [i + 1], [i + 2], [0])
        pieces.append(call_op("", "Slice", [parameters, start, end], {},
                              name=f"{name}_piece{i}", exact_name=True))
    return pieces


class _RNNLayout:
    """Where a layer's weights, biases and states are among MXNet's, in ONNX's layout."""

    def __init__(self, name: str, hidden: int, gates: int, order: tuple, directions: int):
        self.name, self.hidden, self.gates = name, hidden, gates
        self.order, self.directions = order, directions

    def layer(self, layer, sequence, pieces, begin, lengths, op_type, attributes, outputs):
        """One layer, all directions: (T, N, directions * hidden) and its final states."""
        prefix = f"{self.name}_layer{layer}"
        cells = [layer * self.directions + d for d in range(self.directions)]
        biases = len(pieces) // 2
        weights = self._stack([self._gates(pieces[2 * c], f"{prefix}_w{c}") for c in cells],
                              f"{prefix}_W")
        recurrences = self._stack([self._gates(pieces[2 * c + 1], f"{prefix}_r{c}")
                                   for c in cells], f"{prefix}_R")
        bias = self._stack([self._concat([self._gates(pieces[biases + 2 * c + k],
                                                      f"{prefix}_b{c}_{k}", matrix=False)
                                          for k in (0, 1)], f"{prefix}_b{c}")
                            for c in cells], f"{prefix}_B")
        states = [self._state_slice(state, layer, f"{prefix}_state{k}")
                  for k, state in enumerate(begin)]
        result = call_op("", op_type, [sequence, weights, recurrences, bias, lengths, *states],
                         attributes, name=prefix, num_outputs=outputs, exact_name=True)
        y = result[0]  # (T, directions, N, hidden)
        y = call_op("", "Transpose", [y], {"perm": [0, 2, 1, 3]}, name=f"{prefix}_y",
                    exact_name=True)
        width = constant(np.array([0, 0, -1], dtype=np.int64), name=f"{prefix}_width")
        y = call_op("", "Reshape", [y, width], {}, name=f"{prefix}_out", exact_name=True)
        return y, [result[k] for k in range(1, outputs)]

    def _gates(self, piece, name, matrix=True):
        """A flattened weight (or bias) as (gates * hidden, -1) rows in ONNX's gate order."""
        rows = self.gates * self.hidden
        shape = constant(np.array([rows, -1] if matrix else [rows], dtype=np.int64),
                         name=f"{name}_shape")
        piece = call_op("", "Reshape", [piece, shape], {}, name=f"{name}_rows",
                        exact_name=True)
        if self.order == tuple(range(self.gates)):
            return piece
        sizes = constant(np.array([self.hidden] * self.gates, dtype=np.int64),
                         name=f"{name}_sizes")
        blocks = call_op("", "Split", [piece, sizes], {"axis": 0}, name=f"{name}_split",
                         num_outputs=self.gates, exact_name=True)
        return self._concat([blocks[i] for i in self.order], f"{name}_gates")

    def _concat(self, parts, name):
        return call_op("", "Concat", parts, {"axis": 0}, name=name, exact_name=True)

    def _stack(self, parts, name):
        axes = constant(np.array([0], dtype=np.int64), name=f"{name}_axes")
        lifted = [call_op("", "Unsqueeze", [part, axes], {}, name=f"{name}_{i}",
                          exact_name=True) for i, part in enumerate(parts)]
        return lifted[0] if len(lifted) == 1 else self._concat(lifted, name)

    def _state_slice(self, state, layer, name):
        first = layer * self.directions
        return onnx_slice(name, state, [first], [first + self.directions], [0])



OPERATORS = {"RNN": mxnet_rnn}
