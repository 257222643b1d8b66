"""Recurrent cells: one time step of an RNN, LSTM or GRU, and the step function ``unroll``
repeats.

The gates are PyTorch's (``torch.nn.LSTM``/``GRU``, also MXNet's): an LSTM's i2h/h2h rows
are the input, forget, cell and output gates; a GRU's are the reset, update and new gates,
with ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`` and ``h' = (1 - z) n + z h``.

A cell is one step written as Gemm, Split, Sigmoid, Tanh, Add and Mul (the layers, which
see the whole sequence, use ONNX's fused RNN/LSTM/GRU instead). A missing state (``None``)
means zeros and is left out of the arithmetic, so no zero tensor of a fixed batch size is
needed.
"""

from __future__ import annotations

import numpy as np

from mixrt import nd, sym
from mixrt.base.errors import InputError
from mixrt.gluon.hybrid import HybridBlock

# mode -> (gates, states): the i2h/h2h weights have gates * hidden_size rows
MODES = {"rnn_tanh": (1, 1), "rnn_relu": (1, 1), "lstm": (4, 2), "gru": (3, 1)}


def split(F, x, sizes, axis: int) -> list:
    """``x`` cut into pieces of ``sizes`` along ``axis``, always as a list."""
    if len(sizes) == 1:
        return [x]
    return list(F.Split(x, np.asarray(sizes, dtype=np.int64), axis=axis))


def step(F, mode: str, x_proj, states, h2h_weight, h2h_bias, hidden_size: int):
    """One step from ``x_proj`` (the input already through i2h, ``x W^T + b``: (N, gates *
    hidden_size)) and ``states`` (a list, or None for zeros). Returns (h, new states)."""
    h = None if states is None else states[0]
    h_proj = h2h_bias if h is None else F.Gemm(h, h2h_weight, h2h_bias, transB=1)
    gates = MODES[mode][0]
    if mode == "lstm":
        i, f, g, o = split(F, x_proj + h_proj, [hidden_size] * gates, axis=-1)
        i, f, g, o = F.Sigmoid(i), F.Sigmoid(f), F.Tanh(g), F.Sigmoid(o)
        c = i * g if states is None else f * states[1] + i * g
        h = o * F.Tanh(c)
        return h, [h, c]
    if mode == "gru":
        x_r, x_z, x_n = split(F, x_proj, [hidden_size] * gates, axis=-1)
        h_r, h_z, h_n = split(F, h_proj, [hidden_size] * gates, axis=-1)
        r, z = F.Sigmoid(x_r + h_r), F.Sigmoid(x_z + h_z)
        n = F.Tanh(x_n + r * h_n)
        h = n - z * n if h is None else n + z * (h - n)
        return h, [h]
    pre = x_proj + h_proj
    h = F.Tanh(pre) if mode == "rnn_tanh" else F.Relu(pre)
    return h, [h]


def check_mode_options(where: str, hidden_size: int, activation: str | None = None) -> None:
    if hidden_size < 1:
        raise InputError(f"{where}: hidden_size must be >= 1, got {hidden_size}")
    if activation is not None and activation not in ("tanh", "relu"):
        raise InputError(f"{where}: activation must be 'tanh' or 'relu', got {activation!r}")


class RecurrentCell(HybridBlock):
    """The base of the cells: ``cell(x, states)`` -> ``(output, new_states)`` for one step
    (x: (N, input_size); states: ``begin_state(N)``, or None for zeros); ``unroll`` runs
    it over a sequence."""

    _mode = "rnn_tanh"

    def __init__(self, hidden_size: int, i2h_weight_initializer=None,
                 h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", input_size: int = 0, **kwargs):
        check_mode_options(type(self).__name__, hidden_size)
        super().__init__(**kwargs)
        self._hidden_size = int(hidden_size)
        rows = MODES[self._mode][0] * hidden_size
        self.i2h_weight = self.params.get("i2h_weight", shape=(rows, input_size),
                                          init=i2h_weight_initializer)
        self.h2h_weight = self.params.get("h2h_weight", shape=(rows, hidden_size),
                                          init=h2h_weight_initializer)
        self.i2h_bias = self.params.get("i2h_bias", shape=(rows,), init=i2h_bias_initializer)
        self.h2h_bias = self.params.get("h2h_bias", shape=(rows,), init=h2h_bias_initializer)

    def state_info(self, batch_size: int = 0) -> list:
        return [{"shape": (batch_size, self._hidden_size), "__layout__": "NC"}] * \
            MODES[self._mode][1]

    def begin_state(self, batch_size: int = 0, func=None, **kwargs) -> list:
        """Zero states (``func(shape, **kwargs)``, default ``nd.zeros``) for a batch."""
        if func is None:
            func = nd.zeros
        return [func(info["shape"], **kwargs) for info in self.state_info(batch_size)]

    def infer_shape(self, x, *states) -> None:
        self.i2h_weight.shape = (self.i2h_weight.shape[0], x.shape[1])

    def forward(self, inputs, states=None):
        # a traced call takes arrays only: the states travel as separate inputs
        states = [] if states is None else \
            list(states) if isinstance(states, (list, tuple)) else [states]
        outputs = super().forward(inputs, *states)
        outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        return outputs[0], outputs

    def hybrid_forward(self, F, x, *states, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        x_proj = F.Gemm(x, i2h_weight, i2h_bias, transB=1)
        _, new_states = step(F, self._mode, x_proj, list(states) or None, h2h_weight,
                             h2h_bias, self._hidden_size)
        return new_states[0] if len(new_states) == 1 else tuple(new_states)

    def unroll(self, length: int, inputs, begin_state=None, layout: str = "NTC",
               merge_outputs: bool | None = None):
        """Run ``length`` steps over ``inputs`` (one tensor with a ``T`` axis per
        ``layout``, or a list of per-step tensors). Returns (outputs, final states);
        outputs are one stacked tensor when ``merge_outputs`` (default: when the inputs
        were one tensor), else a list."""
        if layout not in ("NTC", "TNC"):
            raise InputError(f"unroll: layout must be 'NTC' or 'TNC', got {layout!r}")
        axis = layout.find("T")
        merged_in = not isinstance(inputs, (list, tuple))
        if merged_in:
            F = _namespace_of(inputs)
            steps = [s.squeeze(axis) for s in split(F, inputs, [1] * length, axis)]
        else:
            steps = list(inputs)
        if len(steps) != length:
            raise InputError(f"unroll: length={length} but the inputs hold {len(steps)} "
                             f"steps")
        states, outputs = begin_state, []
        for x in steps:
            output, states = self(x, states)
            outputs.append(output)
        if merged_in if merge_outputs is None else merge_outputs:
            F = _namespace_of(outputs[0])
            outputs = F.stack(*outputs, axis=axis)
        return outputs, states

    def __repr__(self) -> str:
        shape = self.i2h_weight.shape
        return f"{type(self).__name__}({shape[1] or None} -> {self._hidden_size})"


def _namespace_of(x):
    return sym if isinstance(x, sym.Symbol) else nd


class RNNCell(RecurrentCell):
    """``h' = activation(W_ih x + b_ih + W_hh h + b_hh)``, activation "tanh" or "relu"."""

    def __init__(self, hidden_size: int, activation: str = "tanh", **kwargs):
        check_mode_options("RNNCell", hidden_size, activation)
        self._mode = f"rnn_{activation}"
        super().__init__(hidden_size, **kwargs)


class LSTMCell(RecurrentCell):
    """Long short-term memory; states [h, c]."""

    _mode = "lstm"


class GRUCell(RecurrentCell):
    """Gated recurrent unit; states [h]."""

    _mode = "gru"
