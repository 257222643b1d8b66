"""MXNet's fused ``RNN`` operator, written once for arrays and symbols: one ONNX RNN, GRU or
LSTM node per layer over MXNet's weights.

    nd.RNN(data, parameters, state, state_size=16, num_layers=2, mode="gru")   # runs now
    sym.RNN(data, state_size=16, num_layers=2, mode="lstm", name="lstm")       # builds

MXNet's weights (cuDNN's layout, MXNet's gate order) are cut out per layer and direction,
reordered to ONNX's gates and stacked (:class:`_RNNLayout`). The ops go through a writer,
the one thing each front end provides:

* ``call(op_type, inputs, attributes, name, exact_name=False, num_outputs=None)``: one op
  (a list of its outputs where ``num_outputs`` is given);
* ``constant(array, name)``: a constant;
* ``group(outputs)``: several outputs as the front end returns them;
* ``pieces(parameters, count)``: the ``count`` parts ``parameters`` was concatenated from
  where the front end can see them (Gluon's exported ``_rnn_param_concat``), else None.

``mixrt.nd.fused_rnn`` writes to arrays (every op runs at once, through the imperative
dispatcher, so autograd records it as any op), ``mixrt.sym.fused_rnn`` and MXNet's symbol
files (``sym.fused_rnn.mxnet_rnn``) to a Symbol's graph.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import GraphError
from mixrt.layers.op_params import (check_arity, INT64_MAX, is_integer, no_params,
                                    required_param)

# the inputs of MXNet's RNN, in its order (state_cell only for an LSTM, sequence_length only
# with use_sequence_length)
INPUTS = ("data", "parameters", "state", "state_cell", "sequence_length")
# MXNet's RNN parameters; any of them given means MXNet's operator rather than ONNX's
PARAMETERS = ("state_size", "num_layers", "bidirectional", "mode", "p", "state_outputs",
              "projection_size", "lstm_state_clip_min", "lstm_state_clip_max",
              "lstm_state_clip_nan", "use_sequence_length", "cudnn_off")
# each RNN layer is a handful of ops made now: a file asking for 10**11 would exhaust memory
MAX_RNN_LAYERS = 1024

# MXNet's RNN modes -> (ONNX operator, its attributes, gates, ONNX's gate order as indices
# into MXNet's, states)
_RNN_MODES = {
    "rnn_tanh": ("RNN", {"activations": ["Tanh"]}, 1, (0,), 1),
    "rnn_relu": ("RNN", {"activations": ["Relu"]}, 1, (0,), 1),
    "lstm": ("LSTM", {}, 4, (0, 3, 1, 2), 2),
    "gru": ("GRU", {"linear_before_reset": 1}, 3, (1, 0, 2), 1),
}
# gates per mode (rnn_relu and rnn_tanh: 1)
GATES = {"lstm": 4, "gru": 3}


def is_mxnet_call(kwargs: dict) -> bool:
    """Whether an ``RNN`` call is MXNet's: it names one of MXNet's parameters, or an input
    ONNX's RNN does not have."""
    return any(key in kwargs for key in (*PARAMETERS, "data", "parameters", "state",
                                         "state_cell"))


def with_onnx_rnn(onnx_rnn, fused_rnn, frontend: str):
    """``RNN`` as a front end offers it: MXNet's fused RNN (``fused_rnn``) when called with
    its arguments, else ONNX's RNN operator (``onnx_rnn``), whose name it shares."""
    def RNN(*args, **kwargs):
        if is_mxnet_call(kwargs):
            return fused_rnn(*args, **kwargs)
        return onnx_rnn(*args, **kwargs)

    RNN.__doc__ = (f"MXNet's fused RNN when called with its arguments (``state_size``, "
                   f"``mode``, ``parameters``, ...: ``{frontend}``); else ONNX's RNN "
                   f"operator.\n\n" + (onnx_rnn.__doc__ or ""))
    return RNN


def input_names(params: dict) -> list[str]:
    """The inputs the mode reads, in MXNet's order (state_cell for an LSTM,
    sequence_length with use_sequence_length)."""
    names = ["data", "parameters", "state"]
    if params.get("mode") == "lstm":
        names.append("state_cell")
    if params.get("use_sequence_length"):
        names.append("sequence_length")
    return names


def fused_rnn(writer, name, inputs, params):
    """MXNet's fused RNN op over (T, N, C) data, one ONNX RNN/LSTM/GRU node per layer.

    Its parameters are MXNet's (cuDNN's) layout: per layer and direction ``i2h_weight``,
    ``h2h_weight``, then all the ``i2h_bias``, ``h2h_bias`` pairs in the same order; either
    the ``_rnn_param_concat`` of the separate arrays that Gluon's rnn layers export, or
    ``RNN``'s one flat vector (whose size follows from the data's width). ``params`` is
    consumed: what is left over is refused."""
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
    _refuse_unsupported(params)
    check_arity(inputs, 2 + states + bool(lengths))  # a symbol file's node can be short
    data, layout = inputs[0], _RNNLayout(writer, name, hidden, gates, order, directions)
    pieces = _rnn_pieces(writer, name, data, inputs[1], layout, layers)
    begin = inputs[2:2 + states]
    lengths = writer.call("Cast", [inputs[-1]], {"to": 6}, f"{name}_lengths",
                          exact_name=True) if lengths else None
    attributes = dict(attributes, hidden_size=hidden,
                      direction="bidirectional" if directions == 2 else "forward")
    if "activations" in attributes:
        attributes["activations"] = attributes["activations"] * directions
    sequence, finals = data, []
    for layer in range(layers):
        if layer and rate:
            sequence = _dropout(writer, f"{name}dropout{layer}", sequence, rate)
        sequence, final = layout.layer(layer, sequence, pieces, begin, lengths, op_type,
                                       attributes, 1 + states)
        finals.append(final)
    output = writer.call("Identity", [sequence], {}, name)
    if not state_outputs:
        return output
    stacked = [finals[0][k] if layers == 1 else writer.call(
        "Concat", [final[k] for final in finals], {"axis": 0}, f"{name}_state{k}",
        exact_name=True) for k in range(states)]
    return writer.group([output, *stacked])


def _refuse_unsupported(params: dict) -> None:
    for unsupported in ("projection_size", "lstm_state_clip_min", "lstm_state_clip_max"):
        if params.pop(unsupported, None) is not None:
            raise GraphError(f"{unsupported} is not supported")
    params.pop("lstm_state_clip_nan", None)
    params.pop("cudnn_off", None)
    no_params(params)


def _dropout(writer, name, data, rate):
    """MXNet's Dropout between layers (the op runs in training mode only)."""
    ratio = writer.constant(np.array(rate, dtype=np.float32), f"{name}_ratio")
    return writer.call("Dropout", [data, ratio], {}, name)


def _slice(writer, name, data, starts, ends, axes):
    bounds = [writer.constant(np.array(values, dtype=np.int64), f"{name}_{role}")
              for role, values in (("starts", starts), ("ends", ends), ("axes", axes))]
    return writer.call("Slice", [data, *bounds], {}, name)


def _rnn_pieces(writer, name, data, parameters, layout: "_RNNLayout", layers: int):
    """The weights and biases, each flattened, in MXNet's order: the inputs of the
    ``_rnn_param_concat`` Gluon exports, or else slices of the one flat vector."""
    given = writer.pieces(parameters, layers * layout.directions * 4)
    if given is not None:
        return given
    return _flat_pieces(writer, name, data, parameters, layout, layers)


def _flat_pieces(writer, name, data, parameters, layout, layers):
    """Slices of the flat parameter vector. Only the first layer's input weights depend on
    the data's width C, so each bound is ``a + b * C`` with a, b known now."""
    rows, cells = layout.gates * layout.hidden, layout.directions
    sizes = []  # (constant part, multiple of C) of each piece's length
    for layer in range(layers):
        for _ in range(cells):
            sizes += [(0, rows) if layer == 0 else (rows * cells * layout.hidden, 0),
                      (rows * layout.hidden, 0)]
    sizes += [(rows, 0)] * (2 * layers * cells)
    bounds = np.cumsum([(0, 0)] + sizes, axis=0)
    shape = writer.call("Shape", [data], {}, f"{name}_data_shape", exact_name=True)
    width = _slice(writer, f"{name}_width", shape, [2], [3], [0])
    per_width = writer.constant(bounds[:, 1].astype(np.int64), f"{name}_per_width")
    scaled = writer.call("Mul", [width, per_width], {}, f"{name}_scaled", exact_name=True)
    fixed = writer.constant(bounds[:, 0].astype(np.int64), f"{name}_fixed")
    offsets = writer.call("Add", [scaled, fixed], {}, f"{name}_offsets", exact_name=True)
    pieces = []
    for i in range(len(sizes)):
        start = _slice(writer, f"{name}_start{i}", offsets, [i], [i + 1], [0])
        end = _slice(writer, f"{name}_end{i}", offsets, [i + 1], [i + 2], [0])
        pieces.append(writer.call("Slice", [parameters, start, end], {}, f"{name}_piece{i}",
                                  exact_name=True))
    return pieces


class _RNNLayout:
    """Where a layer's weights, biases and states are among MXNet's, in ONNX's layout."""

    def __init__(self, writer, name: str, hidden: int, gates: int, order: tuple,
                 directions: int):
        self.writer, self.name, self.hidden, self.gates = writer, name, hidden, gates
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
        result = self.writer.call(op_type, [sequence, weights, recurrences, bias, lengths,
                                            *states], attributes, prefix,
                                  exact_name=True, num_outputs=outputs)
        y = self.writer.call("Transpose", [result[0]], {"perm": [0, 2, 1, 3]},  # (T, N, D, H)
                             f"{prefix}_y", exact_name=True)
        width = self._ints([0, 0, -1], f"{prefix}_width")
        y = self.writer.call("Reshape", [y, width], {}, f"{prefix}_out", exact_name=True)
        return y, [result[k] for k in range(1, outputs)]

    def _ints(self, values, name):
        return self.writer.constant(np.array(values, dtype=np.int64), name)

    def _gates(self, piece, name, matrix=True):
        """A flattened weight (or bias) as (gates * hidden, -1) rows in ONNX's gate order."""
        rows = self.gates * self.hidden
        shape = self._ints([rows, -1] if matrix else [rows], f"{name}_shape")
        piece = self.writer.call("Reshape", [piece, shape], {}, f"{name}_rows",
                                 exact_name=True)
        if self.order == tuple(range(self.gates)):
            return piece
        sizes = self._ints([self.hidden] * self.gates, f"{name}_sizes")
        blocks = self.writer.call("Split", [piece, sizes], {"axis": 0}, f"{name}_split",
                                  exact_name=True, num_outputs=self.gates)
        return self._concat([blocks[i] for i in self.order], f"{name}_gates")

    def _concat(self, parts, name):
        return self.writer.call("Concat", parts, {"axis": 0}, name, exact_name=True)

    def _stack(self, parts, name):
        axes = self._ints([0], f"{name}_axes")
        lifted = [self.writer.call("Unsqueeze", [part, axes], {}, f"{name}_{i}",
                                   exact_name=True) for i, part in enumerate(parts)]
        return lifted[0] if len(lifted) == 1 else self._concat(lifted, name)

    def _state_slice(self, state, layer, name):
        first = layer * self.directions
        return _slice(self.writer, name, state, [first], [first + self.directions], [0])
