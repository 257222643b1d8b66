"""Recurrent layers: RNN, LSTM and GRU over a whole sequence, stacked ``num_layers`` deep
and optionally bidirectional, unrolled over the time steps.

    layer = rnn.LSTM(64, num_layers=2, layout="NTC", bidirectional=True)
    layer.initialize()
    out = layer(x)                                       # (N, T, 2 * 64)
    out, (h, c) = layer(x, layer.begin_state(batch_size=N))

Parameters per layer ``k`` and direction (``l`` forward, ``r`` reverse), as in MXNet:
``l0_i2h_weight`` (gates * hidden, input), ``l0_h2h_weight`` (gates * hidden, hidden),
``l0_i2h_bias``, ``l0_h2h_bias`` -- PyTorch's ``weight_ih_l0``, ``weight_hh_l0``,
``bias_ih_l0``, ``bias_hh_l0`` (``r0_*``: its ``*_l0_reverse``). States are
(num_layers * directions, N, hidden) with PyTorch's order (layer by layer, forward first).

The sequence length comes from the input's static shape, so a hybridized layer is traced
once per sequence length. The input projection of every step is one MatMul per layer and
direction; the recurrence is Gemm and elementwise ops per step (``rnn_cell.step``).
"""

from __future__ import annotations

from mixrt.errors import InputError
from mixrt.gluon.hybrid import HybridBlock, static_shape
from mixrt.gluon.nn.basic_layers import dropout
from mixrt.gluon.rnn.rnn_cell import MODES, check_mode_options, split, step


class _RNNLayer(HybridBlock):
    """The layers' common body; ``mode`` is one of ``rnn_cell.MODES``."""

    def __init__(self, mode: str, hidden_size: int, num_layers: int, layout: str,
                 dropout: float, bidirectional: bool, input_size: int,
                 i2h_weight_initializer, h2h_weight_initializer, i2h_bias_initializer,
                 h2h_bias_initializer, dtype, **kwargs):
        where = type(self).__name__
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
        self._directions = ["l", "r"] if bidirectional else ["l"]
        rows = MODES[mode][0] * hidden_size
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else hidden_size * len(self._directions)
            for direction in self._directions:
                name = f"{direction}{layer}_"
                self.params.get(name + "i2h_weight", shape=(rows, in_size), dtype=dtype,
                                init=i2h_weight_initializer)
                self.params.get(name + "h2h_weight", shape=(rows, hidden_size), dtype=dtype,
                                init=h2h_weight_initializer)
                self.params.get(name + "i2h_bias", shape=(rows,), dtype=dtype,
                                init=i2h_bias_initializer)
                self.params.get(name + "h2h_bias", shape=(rows,), dtype=dtype,
                                init=h2h_bias_initializer)

    # -- states ------------------------------------------------------------------------------

    def state_info(self, batch_size: int = 0) -> list:
        shape = (self._num_layers * len(self._directions), batch_size, self._hidden_size)
        return [{"shape": shape, "__layout__": "LNC"}] * MODES[self._mode][1]

    def begin_state(self, batch_size: int = 0, func=None, **kwargs) -> list:
        """Zero states (``func(shape, **kwargs)``, default ``nd.zeros``) for a batch."""
        if func is None:
            from mixrt import nd  # noqa: PLC0415
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

    def forward(self, inputs, states=None):
        """The output sequence; with ``states`` given, also the final states."""
        if states is None:
            return super().forward(inputs)
        states = list(states) if isinstance(states, (list, tuple)) else [states]
        expected = MODES[self._mode][1]
        if len(states) != expected:
            raise InputError(f"{self.name}: takes {expected} state(s), got {len(states)}")
        outputs = super().forward(inputs, *states)
        return outputs[0], list(outputs[1:])

    def hybrid_forward(self, F, inputs, *states, **params):
        if self._layout == "NTC":
            inputs = F.Transpose(inputs, perm=[1, 0, 2])
        steps = static_shape(inputs)[0]
        count = self._num_layers * len(self._directions)
        # per (layer, direction): its list of initial states, or None for zeros
        begin = [None] * count
        if states:
            pieces = [[s.squeeze(0) for s in split(F, state, [1] * count, 0)]
                      for state in states]
            begin = [list(group) for group in zip(*pieces)]
        finals, sequence = [], inputs
        for layer in range(self._num_layers):
            outputs = []
            for index, direction in enumerate(self._directions):
                which = layer * len(self._directions) + index
                out, final = self._unroll(F, sequence, steps, begin[which],
                                          f"{direction}{layer}_", params, direction == "r")
                outputs.append(out)
                finals.append(final)
            sequence = outputs[0] if len(outputs) == 1 else F.Concat(*outputs, axis=2)
            if layer + 1 < self._num_layers:
                sequence = dropout(F, sequence, self._dropout)
        if self._layout == "NTC":
            sequence = F.Transpose(sequence, perm=[1, 0, 2])
        if not states:
            return sequence
        stacked = [F.stack(*[final[k] for final in finals], axis=0)
                   for k in range(len(states))]
        return (sequence, *stacked)

    def _unroll(self, F, sequence, steps: int, states, prefix: str, params: dict,
                reverse: bool):
        """One direction of one layer over (T, N, C): the (T, N, H) outputs and the final
        states."""
        i2h_weight, h2h_weight, i2h_bias, h2h_bias = (
            params[prefix + role] for role in ("i2h_weight", "h2h_weight", "i2h_bias",
                                               "h2h_bias"))
        projected = F.MatMul(sequence, F.Transpose(i2h_weight)) + i2h_bias
        inputs = [x.squeeze(0) for x in split(F, projected, [1] * steps, 0)]
        outputs = [None] * steps
        for t in (reversed(range(steps)) if reverse else range(steps)):
            outputs[t], states = step(F, self._mode, inputs[t], states, h2h_weight, h2h_bias,
                                      self._hidden_size)
        return F.stack(*outputs, axis=0), states

    def __repr__(self) -> str:
        in_size = self.params.get("l0_i2h_weight").shape[1]
        bidirectional = ", bidirectional" if len(self._directions) == 2 else ""
        return f"{type(self).__name__}({in_size or None} -> {self._hidden_size}, " \
               f"{self._layout}, num_layers={self._num_layers}{bidirectional})"


class RNN(_RNNLayer):
    """Elman RNN: ``h' = activation(W_ih x + b_ih + W_hh h + b_hh)`` ("tanh" or "relu")."""

    def __init__(self, hidden_size: int, num_layers: int = 1, activation: str = "relu",
                 layout: str = "TNC", dropout: float = 0.0, bidirectional: bool = False,
                 i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 input_size: int = 0, dtype="float32", **kwargs):
        check_mode_options("RNN", hidden_size, activation)
        super().__init__(f"rnn_{activation}", hidden_size, num_layers, layout, dropout,
                         bidirectional, input_size, i2h_weight_initializer,
                         h2h_weight_initializer, i2h_bias_initializer, h2h_bias_initializer,
                         dtype, **kwargs)


class LSTM(_RNNLayer):
    """Long short-term memory layer; states [h, c]."""

    def __init__(self, hidden_size: int, num_layers: int = 1, layout: str = "TNC",
                 dropout: float = 0.0, bidirectional: bool = False, input_size: int = 0,
                 i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 dtype="float32", **kwargs):
        super().__init__("lstm", hidden_size, num_layers, layout, dropout, bidirectional,
                         input_size, i2h_weight_initializer, h2h_weight_initializer,
                         i2h_bias_initializer, h2h_bias_initializer, dtype, **kwargs)


class GRU(_RNNLayer):
    """Gated recurrent unit layer; states [h]."""

    def __init__(self, hidden_size: int, num_layers: int = 1, layout: str = "TNC",
                 dropout: float = 0.0, bidirectional: bool = False, input_size: int = 0,
                 i2h_weight_initializer=None, h2h_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 dtype="float32", **kwargs):
        super().__init__("gru", hidden_size, num_layers, layout, dropout, bidirectional,
                         input_size, i2h_weight_initializer, h2h_weight_initializer,
                         i2h_bias_initializer, h2h_bias_initializer, dtype, **kwargs)
