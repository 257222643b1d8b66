"""Recurrent layers: RNN, LSTM and GRU over a whole sequence, stacked ``num_layers`` deep
and optionally bidirectional, each layer one fused ONNX RNN/LSTM/GRU node.

    layer = rnn.LSTM(64, num_layers=2, layout="NTC", bidirectional=True)
    layer.initialize()
    out = layer(x)                                       # (N, T, 2 * 64)
    out, (h, c) = layer(x, layer.begin_state(batch_size=N))
    out = padded(x, None, lengths)                       # use_sequence_length=True

Parameters per layer ``k`` and direction (``l`` forward, ``r`` reverse), as in MXNet:
``l0_i2h_weight`` (gates * hidden, input), ``l0_h2h_weight`` (gates * hidden, hidden),
``l0_i2h_bias``, ``l0_h2h_bias`` -- PyTorch's ``weight_ih_l0``, ``weight_hh_l0``,
``bias_ih_l0``, ``bias_hh_l0`` (``r0_*``: its ``*_l0_reverse``). States are
(num_layers * directions, N, hidden) with PyTorch's order (layer by layer, forward first).

Why the fused ops: one node per layer runs the whole recurrence in one kernel (and one
backward kernel, ``ops/rnn/rnn_grad.py``), the traced graph does not grow with the sequence
length, and an exported layer is the ONNX LSTM that onnxruntime and every other runtime run
natively. The parameters keep MXNet's and PyTorch's gate order (LSTM i, f, g, o; GRU r, z,
n) so their checkpoints load unchanged; each call reorders the rows into ONNX's (LSTM i, o,
f, c; GRU z, r, h) with a Split and a Concat, which also carries the gradients back.
``use_sequence_length``: a third argument (N,) gives each sequence's length; the steps past
it output zeros and the final states are those of the last real step (PyTorch's packed
sequences), the reverse direction starting from that step.
"""

from __future__ import annotations

import numpy as np

from mixrt import nd
from mixrt.base.errors import InputError
from mixrt.gluon.hybrid import static_shape, HybridBlock
from mixrt.gluon.nn.basic_layers import dropout
from mixrt.gluon.rnn.cell_wrappers import (BidirectionalCell, DropoutCell,
                                           HybridSequentialRNNCell)
from mixrt.gluon.rnn.rnn_cell import (check_mode_options, GRUCell, LSTMCell, LSTMPCell, MODES,
                                      RNNCell, split)

_INT32 = 6  # TensorProto.INT32: ONNX's sequence_lens type

# mode -> (ONNX op, its attributes, ONNX's gate order as indices into MXNet's)
_FUSED = {
    "rnn_tanh": ("RNN", {"activations": ["Tanh"]}, (0,)),
    "rnn_relu": ("RNN", {"activations": ["Relu"]}, (0,)),
    "lstm": ("LSTM", {}, (0, 3, 1, 2)),
    "gru": ("GRU", {"linear_before_reset": 1}, (1, 0, 2)),
}


class _RNNLayer(HybridBlock):
    """The layers' common body; ``mode`` is one of ``rnn_cell.MODES``."""

    _free_axes = (0, 1)  # an exported layer takes any batch size and sequence length

    def __init__(self, mode: str, hidden_size: int, num_layers: int, layout: str,
                 dropout: float, bidirectional: bool, input_size: int,
                 i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                 h2h_bias_initializer, dtype, use_sequence_length: bool = False,
                 projection_size: int | None = None, h2r_weight_initializer=None, **kwargs):
        where = type(self).__name__
        if projection_size is not None and (mode != "lstm" or projection_size < 1):
            raise InputError(f"{where}: projection_size must be None or, for an LSTM, >= 1; "
                             f"got {projection_size}")
        check_mode_options(where, hidden_size)
        if layout not in ("TNC", "NTC"):
            raise InputError(f"{where}: layout must be 'TNC' or 'NTC', got {layout!r}")
        if num_layers < 1:
            raise InputError(f"{where}: num_layers must be >= 1, got {num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise InputError(f"{where}: dropout must be in [0, 1), got {dropout}")
        super().__init__(**kwargs)
        self._mode, self._hidden_size, self._num_layers = mode, int(hidden_size), num_layers
        self._layout, self._dropout = layout, float(dropout)
        self._use_sequence_length = bool(use_sequence_length)
        self._directions = ["l", "r"] if bidirectional else ["l"]
        self._input_size = int(input_size)
        self._projection_size = projection_size
        if projection_size is not None:  # unrolled: only the batch axis stays free
            self._free_axes = (layout.find("N"),)
        self._initializers = {"i2h_weight_initializer": i2h_weight_initializer,
                              "h2h_weight_initializer": h2h_weight_initializer,
                              "i2h_bias_initializer": i2h_bias_initializer,
                              "h2h_bias_initializer": h2h_bias_initializer}
        if projection_size is not None:
            self._initializers["h2r_weight_initializer"] = h2r_weight_initializer
        rows, width = MODES[mode][0] * hidden_size, self._state_width()
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else width * len(self._directions)
            shapes = {"i2h_weight": (rows, in_size), "h2h_weight": (rows, width),
                      "i2h_bias": (rows,), "h2h_bias": (rows,)}
            if projection_size is not None:
                shapes["h2r_weight"] = (projection_size, hidden_size)
            for direction in self._directions:
                for role, shape in shapes.items():
                    name = f"{direction}{layer}_{role}"  # MXNet's: l0_i2h_weight, also
                    setattr(self, name, self.params.get(  # an attribute of the layer
                        name, shape=shape, dtype=dtype,
                        init=self._initializers[role + "_initializer"]))

    def _state_width(self) -> int:
        """The width of h: the hidden size, or an LSTMP's projection size."""
        return self._hidden_size if self._projection_size is None else self._projection_size

    # -- states ------------------------------------------------------------------------------

    def state_info(self, batch_size: int = 0) -> list:
        rows = self._num_layers * len(self._directions)
        widths = [self._state_width(), self._hidden_size][:MODES[self._mode][1]]
        return [{"shape": (rows, batch_size, width), "__layout__": "LNC"} for width in widths]

    def begin_state(self, batch_size: int = 0, func=None, **kwargs) -> list:
        """Zero states (``func(shape, **kwargs)``, default ``nd.zeros``) for a batch."""
        if func is None:
            func = nd.zeros
        return [func(info["shape"], **kwargs) for info in self.state_info(batch_size)]

    # -- calling -----------------------------------------------------------------------------

    def infer_shape(self, inputs, *states) -> None:
        shape = static_shape(inputs)
        if len(shape) != 3:
            raise InputError(f"{self.name}: expects a 3-D input ({self._layout}), got shape "
                             f"{shape}")
        for direction in self._directions:
            weight = self.params.get(f"{direction}0_i2h_weight")
            weight.shape = (weight.shape[0], shape[2])

    def forward(self, inputs, states=None, sequence_length=None):
        """The output sequence; with ``states`` given, also the final states."""
        lengths = self._lengths_argument(sequence_length)
        if states is None:
            return super().forward(inputs, *lengths)
        states = list(states) if isinstance(states, (list, tuple)) else [states]
        expected = MODES[self._mode][1]
        if len(states) != expected:
            raise InputError(f"{self.name}: takes {expected} state(s), got {len(states)}")
        outputs = super().forward(inputs, *states, *lengths)
        return outputs[0], list(outputs[1:])

    def _lengths_argument(self, sequence_length) -> list:
        if self._use_sequence_length and sequence_length is None:
            raise InputError(f"{self.name}: made with use_sequence_length=True, so it needs "
                             f"sequence_length, one length per sequence of the batch")
        if not self._use_sequence_length and sequence_length is not None:
            raise InputError(f"{self.name}: sequence_length given, but the layer was made "
                             f"without use_sequence_length=True")
        return [] if sequence_length is None else [sequence_length]

    def hybrid_forward(self, F, inputs, *args, **params):
        lengths = None
        if self._use_sequence_length:
            *args, lengths = args
            lengths = F.Cast(lengths, to=_INT32)
        if self._projection_size is not None:
            return self._projected(F, inputs, args, lengths)
        if self._layout == "NTC":
            inputs = F.Transpose(inputs, perm=[1, 0, 2])
        # per layer: its slice (directions, N, hidden) of each given state
        begin = [[] for _ in range(self._num_layers)]
        if args:
            pieces = [split(F, state, [len(self._directions)] * self._num_layers, 0)
                      for state in args]
            begin = [list(group) for group in zip(*pieces)]
        finals, sequence = [], inputs
        for layer in range(self._num_layers):
            sequence, final = self._fused_layer(F, sequence, layer, begin[layer], lengths,
                                                params)
            finals.append(final)
            if layer + 1 < self._num_layers:
                sequence = dropout(F, sequence, self._dropout)
        if self._layout == "NTC":
            sequence = F.Transpose(sequence, perm=[1, 0, 2])
        if not args:
            return sequence
        stacked = [_concat(F, [final[k] for final in finals]) for k in range(len(args))]
        return (sequence, *stacked)

    def _fused_layer(self, F, sequence, layer: int, states: list, lengths, params: dict):
        """One layer, both directions, over (T, N, C): its (T, N, directions * hidden)
        outputs and its final states, each (directions, N, hidden)."""
        op_type, attributes, order = _FUSED[self._mode]
        prefixes = [f"{direction}{layer}_" for direction in self._directions]

        def stacked(role: str):
            return F.stack(*[self._onnx_gates(F, params[p + role], order) for p in prefixes],
                           axis=0)

        weights, recurrences = stacked("i2h_weight"), stacked("h2h_weight")
        biases = F.stack(*[F.Concat(self._onnx_gates(F, params[p + "i2h_bias"], order),
                                    self._onnx_gates(F, params[p + "h2h_bias"], order),
                                    axis=0) for p in prefixes], axis=0)
        attributes = dict(attributes, hidden_size=self._hidden_size,
                          direction="bidirectional" if len(prefixes) == 2 else "forward")
        if "activations" in attributes:
            attributes["activations"] = attributes["activations"] * len(prefixes)
        outputs = getattr(F, op_type)(sequence, weights, recurrences, biases, lengths,
                                      *states, num_outputs=1 + MODES[self._mode][1],
                                      **attributes)
        outputs = list(outputs)
        y = outputs[0]  # (T, directions, N, hidden)
        if len(prefixes) == 1:
            return y.squeeze(1), outputs[1:]
        y = F.Transpose(y, perm=[0, 2, 1, 3])
        return F.Reshape(y, np.array([0, 0, -1], dtype=np.int64)), outputs[1:]

    def _projected(self, F, inputs, states, lengths):
        """An LSTMP, which no fused ONNX op computes: the layer's cells (sharing its
        parameters) unrolled over the sequence, whose length the trace fixes."""
        length = static_shape(inputs)[self._layout.find("T")]
        count = self._num_layers * len(self._directions)
        begin = None
        if states:  # (count, N, width) each -> per cell [h, c]
            pieces = [[p.squeeze(0) for p in split(F, state, [1] * count, 0)]
                      for state in states]
            begin = [piece for k in range(count) for piece in (pieces[0][k], pieces[1][k])]
        outputs, finals = self._cells().unroll(length, inputs, begin, self._layout,
                                               merge_outputs=True, valid_length=lengths)
        if not states:
            return outputs
        return outputs, F.stack(*finals[0::2], axis=0), F.stack(*finals[1::2], axis=0)

    def _cells(self):
        """``_unfuse()``, made once (not a child: its parameters are the layer's own)."""
        if self.__dict__.get("_cell_stack") is None:
            object.__setattr__(self, "_cell_stack", self._unfuse())
        return self._cell_stack

    def _unfuse(self):
        """The layer as cells sharing its parameters: a HybridSequentialRNNCell of one
        cell (a BidirectionalCell of two) per layer, DropoutCells between them."""
        cell_class, options = {"rnn_tanh": (RNNCell, {"activation": "tanh"}),
                               "rnn_relu": (RNNCell, {"activation": "relu"}),
                               "lstm": (LSTMCell, {}), "gru": (GRUCell, {})}[self._mode]
        if self._projection_size is not None:
            cell_class, options = LSTMPCell, {"projection_size": self._projection_size}
        stack = HybridSequentialRNNCell(prefix=self.prefix, params=self.params)
        with stack.name_scope():
            in_size = self._input_size
            for layer in range(self._num_layers):
                # made in the stack's scope, the cells find the layer's parameters
                cells = [cell_class(self._hidden_size, prefix=f"{direction}{layer}_",
                                    input_size=in_size, **options, **self._initializers)
                         for direction in self._directions]
                # a graph's node names are unique: each layer's outputs get their own
                stack.add(cells[0] if len(cells) == 1 else
                          BidirectionalCell(*cells, output_prefix=f"bi{layer}_"))
                if self._dropout > 0 and layer + 1 < self._num_layers:
                    stack.add(DropoutCell(self._dropout))
                in_size = self._state_width() * len(self._directions)
        return stack

    def _onnx_gates(self, F, x, order: tuple):
        """``x``'s gate blocks of rows (MXNet's order) in ONNX's order."""
        if order == tuple(range(len(order))):
            return x
        pieces = split(F, x, [self._hidden_size] * len(order), 0)
        return F.Concat(*[pieces[i] for i in order], axis=0)

    def __repr__(self) -> str:
        in_size = self.params.get("l0_i2h_weight").shape[1]
        bidirectional = ", bidirectional" if len(self._directions) == 2 else ""
        return f"{type(self).__name__}({in_size or None} -> {self._hidden_size}, " \
               f"{self._layout}, num_layers={self._num_layers}{bidirectional})"


def _concat(F, parts: list):
    return parts[0] if len(parts) == 1 else F.Concat(*parts, axis=0)


class RNN(_RNNLayer):
    """Elman RNN: ``h' = activation(W_ih x + b_ih + W_hh h + b_hh)`` ("tanh" or "relu")."""

    def __init__(self, hidden_size: int, num_layers: int = 1, activation: str = "relu",
                 layout: str = "TNC", dropout: float = 0.0, bidirectional: bool = False,
                 i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 input_size: int = 0, dtype="float32", use_sequence_length: bool = False,
                 **kwargs):
        check_mode_options("RNN", hidden_size, activation)
        super().__init__(f"rnn_{activation}", hidden_size, num_layers, layout, dropout,
                         bidirectional, input_size, i2h_weight_initializer,
                         h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer,
                         dtype, use_sequence_length, **kwargs)


class LSTM(_RNNLayer):
    """Long short-term memory layer; states [h, c]. ``projection_size``: an LSTMP, whose
    h is projected to that size (``l0_h2r_weight``) before the next step and the output
    read it; it runs as its cells unrolled, not as one fused node."""

    def __init__(self, hidden_size: int, num_layers: int = 1, layout: str = "TNC",
                 dropout: float = 0.0, bidirectional: bool = False, input_size: int = 0,
                 i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 projection_size: int | None = None, h2r_weight_initializer=None,
                 dtype="float32", use_sequence_length: bool = False, **kwargs):
        super().__init__("lstm", hidden_size, num_layers, layout, dropout, bidirectional,
                         input_size, i2h_weight_initializer, h2h_weight_initializer,
                         i2h_bias_initializer, h2h_bias_initializer, dtype,
                         use_sequence_length, projection_size, h2r_weight_initializer,
                         **kwargs)


class GRU(_RNNLayer):
    """Gated recurrent unit layer; states [h]."""

    def __init__(self, hidden_size: int, num_layers: int = 1, layout: str = "TNC",
                 dropout: float = 0.0, bidirectional: bool = False, input_size: int = 0,
                 i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 dtype="float32", use_sequence_length: bool = False, **kwargs):
        super().__init__("gru", hidden_size, num_layers, layout, dropout, bidirectional,
                         input_size, i2h_weight_initializer, h2h_weight_initializer,
                         i2h_bias_initializer, h2h_bias_initializer, dtype,
                         use_sequence_length, **kwargs)
