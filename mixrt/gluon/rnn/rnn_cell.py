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

import contextlib
import functools

import numpy as np

from mixrt import name as naming, nd, sym
from mixrt.base.errors import InputError
from mixrt.gluon.block import Block
from mixrt.gluon.hybrid import HybridBlock
from mixrt.sym.tracing import tracing

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


class RecurrentCell(Block):
    """The base of every cell, MXNet's: ``cell(x, states)`` -> ``(output, new_states)`` for
    one step (x: (N, input_size); states: a list as ``begin_state(N)`` gives, or None for
    zeros); ``unroll`` runs it over a sequence. Cells that hold other cells (stacks,
    modifiers, bidirectional) derive from it or from :class:`HybridRecurrentCell`."""

    def __init__(self, prefix: str | None = None, params=None):
        super().__init__(prefix, params)  # cooperative: HybridBlock's too, for hybrid cells
        self._counter = -1  # the step being run since the last reset(): names its output

    def reset(self) -> None:
        """Start counting steps again (``unroll`` does), here and in every child cell."""
        self._counter = -1
        for child in self._children.values():
            if isinstance(child, RecurrentCell):
                child.reset()

    def state_info(self, batch_size: int = 0) -> list:
        raise NotImplementedError(f"{type(self).__name__} must define state_info()")

    def begin_state(self, batch_size: int = 0, func=None, **kwargs) -> list:
        """Zero states (``func(shape, **kwargs)``, default ``nd.zeros``) for a batch."""
        if func is None:
            func = nd.zeros
        return [func(info["shape"], **kwargs) for info in self.state_info(batch_size)]

    def unroll(self, length: int, inputs, begin_state=None, layout: str = "NTC",
               merge_outputs: bool | None = None, valid_length=None):
        """Run ``length`` steps over ``inputs`` (one tensor with a ``T`` axis per
        ``layout``, or a list of per-step tensors). Returns (outputs, final states);
        outputs are one stacked tensor when ``merge_outputs`` (default: when the inputs
        were one tensor), else a list. ``valid_length`` (N,): each sequence's length; the
        outputs past it are zeros and its final states are those of its last step."""
        self.reset()
        steps, axis, merged_in = sequence_steps(length, inputs, layout)
        states = first_states(self, steps[0], begin_state)
        outputs, history = [], []
        with one_symbol_per_parameter():
            for x in steps:
                output, states = self(x, states)
                outputs.append(output)
                history.append(states)
        if valid_length is not None:
            F = namespace_of(steps[0])
            outputs = mask_steps(F, outputs, valid_length)
            states = states_at_lengths(F, history, valid_length)
        return merged(outputs, axis, merged_in if merge_outputs is None else merge_outputs), \
            states


class HybridRecurrentCell(RecurrentCell, HybridBlock):
    """A cell whose step is ``hybrid_forward(F, x, *states, **params)`` returning
    ``(output, *new_states)``: it hybridizes, one trace serving every step."""

    def forward(self, inputs, states=None):
        self._counter += 1
        # a traced call takes arrays only: the states travel as separate inputs
        outputs = HybridBlock.forward(self, inputs, *as_list(states))
        output, *new_states = outputs
        return output, new_states


class _GatedCell(HybridRecurrentCell):
    """RNN, LSTM and GRU cells: i2h and h2h weights and biases, one ``step``."""

    _mode = "rnn_tanh"

    def __init__(self, hidden_size: int, i2h_weight_initializer=None,
                 h2h_weight_initializer=None, i2h_bias_initializer="zeros",
                 h2h_bias_initializer="zeros", input_size: int = 0, prefix=None,
                 params=None):
        check_mode_options(type(self).__name__, hidden_size)
        super().__init__(prefix, params)
        self._hidden_size, self._input_size = int(hidden_size), int(input_size)
        rows = MODES[self._mode][0] * hidden_size
        self.i2h_weight = self.params.get("i2h_weight", shape=(rows, input_size),
                                          init=i2h_weight_initializer)
        self.h2h_weight = self.params.get("h2h_weight",
                                          shape=(rows, self._recurrent_size()),
                                          init=h2h_weight_initializer)
        self.i2h_bias = self.params.get("i2h_bias", shape=(rows,), init=i2h_bias_initializer)
        self.h2h_bias = self.params.get("h2h_bias", shape=(rows,), init=h2h_bias_initializer)

    def _recurrent_size(self) -> int:
        """The width of the state the h2h weights read (LSTMPCell's is its projection)."""
        return self._hidden_size

    def state_info(self, batch_size: int = 0) -> list:
        return [{"shape": (batch_size, self._hidden_size), "__layout__": "NC"}] * \
            MODES[self._mode][1]

    def infer_shape(self, x, *states) -> None:
        self.i2h_weight.shape = (self.i2h_weight.shape[0], x.shape[1])

    def hybrid_forward(self, F, x, *states, **params):
        if F is not sym:
            return self._step(F, x, states, **params)
        # MXNet names a step's nodes after the step, under the cell's prefix (rnn_t0_out):
        # each step's are its own, and its output is named as MXNet's
        with naming.Prefix(f"{self.prefix}t{self._counter}_"):
            return self._step(F, x, states, **params)

    def _step(self, F, x, states, i2h_weight, h2h_weight, i2h_bias, h2h_bias):
        x_proj = F.Gemm(x, i2h_weight, i2h_bias, transB=1)
        h, new_states = step(F, self._mode, x_proj, list(states) or None, h2h_weight,
                             h2h_bias, self._hidden_size)
        return (named(h, "out"), *new_states)

    def __repr__(self) -> str:
        shape = self.i2h_weight.shape
        return f"{type(self).__name__}({shape[1] or None} -> {self._hidden_size})"


# -- sequences as lists of steps ------------------------------------------------------------

def namespace_of(x):
    return sym if isinstance(x, sym.Symbol) else nd


def as_list(states) -> list:
    if states is None:
        return []
    return list(states) if isinstance(states, (list, tuple)) else [states]


def first_states(cell, first_step, begin_state):
    """``begin_state``, or MXNet's default, zeros: for arrays of the step's batch, device
    and dtype (a hybridized cell then sees one input structure at every step), for
    Symbols built from the step's batch size, which is unknown until the graph runs."""
    if begin_state is not None:
        return begin_state
    if isinstance(first_step, sym.Symbol):
        # (N, 1) from one column of the step, broadcast with a row of zeros: shape
        # inference follows a Slice and an Expand, not arithmetic on shape values
        column = sym.Shape(sym.Slice(first_step, np.array([0], dtype=np.int64),
                                     np.array([1], dtype=np.int64),
                                     np.array([-1], dtype=np.int64)))
        return [sym.Expand(sym.CastLike(np.zeros((1, *info["shape"][1:]), np.float32),
                                        first_step), column)
                for info in cell.state_info()]
    return cell.begin_state(first_step.shape[0], ctx=first_step.ctx, dtype=first_step.dtype)


@contextlib.contextmanager
def one_symbol_per_parameter():
    """Outside a trace, every call of a block on Symbols makes a Variable per parameter;
    the steps of one unroll must share them, as one trace's calls do."""
    if tracing.variables is not None:
        yield
        return
    tracing.variables = {}
    try:
        yield
    finally:
        tracing.variables = None


def named(x, name: str):
    """``x`` under MXNet's output name when it is a Symbol (arrays have no names)."""
    return sym.Identity(x, name=name) if isinstance(x, sym.Symbol) else x


def sequence_steps(length: int, inputs, layout: str):
    """(per-step tensors, the time axis, whether ``inputs`` was one tensor)."""
    if layout not in ("NTC", "TNC"):
        raise InputError(f"unroll: layout must be 'NTC' or 'TNC', got {layout!r}")
    axis = layout.find("T")
    if isinstance(inputs, (list, tuple)):
        steps = list(inputs)
    else:
        F = namespace_of(inputs)
        steps = [s.squeeze(axis) for s in split(F, inputs, [1] * length, axis)]
    if len(steps) != length:
        raise InputError(f"unroll: length={length} but the inputs hold {len(steps)} steps")
    return steps, axis, not isinstance(inputs, (list, tuple))


def merged(outputs: list, axis: int, merge: bool):
    """The steps stacked along ``axis`` when ``merge``, else the list."""
    return namespace_of(outputs[0]).stack(*outputs, axis=axis) if merge else list(outputs)


def _lengths_column(F, valid_length, like):
    """``valid_length`` as an (N, 1) column of ``like``'s dtype."""
    return F.CastLike(F.Reshape(valid_length, np.array([-1, 1], dtype=np.int64)), like)


def _where_length(F, lengths, test: str, value: int, like):
    """1 where ``lengths <test> value`` (Greater, Equal, LessOrEqual), else 0, in the
    shape of ``like`` (spelled out: symbolic shape inference takes the operands of a
    product to have one shape)."""
    bound = F.CastLike(np.array(value, dtype=np.float32), lengths)
    return F.Expand(F.CastLike(getattr(F, test)(lengths, bound), lengths), F.Shape(like))


def mask_steps(F, outputs: list, valid_length) -> list:
    """Each step's output, zero for the sequences that ended before it."""
    lengths = _lengths_column(F, valid_length, outputs[0])
    return [out * _where_length(F, lengths, "Greater", t, out)
            for t, out in enumerate(outputs)]


def states_at_lengths(F, history: list, valid_length) -> list:
    """Per state, each sequence's value after its last step (``history``: the states
    after every step)."""
    lengths = _lengths_column(F, valid_length, history[0][0])
    finals = []
    for k in range(len(history[0])):
        picked = [states[k] * _where_length(F, lengths, "Equal", t + 1, states[k])
                  for t, states in enumerate(history)]
        finals.append(functools.reduce(lambda a, b: a + b, picked))
    return finals


def reverse_steps(F, steps: list, valid_length) -> list:
    """The steps in reverse order; with ``valid_length``, each sequence reversed within
    its own length, the steps past it left where they are (MXNet's SequenceReverse)."""
    if valid_length is None:
        return steps[::-1]
    lengths = _lengths_column(F, valid_length, steps[0])
    reversed_steps = []
    for t, x in enumerate(steps):
        step_t = x * _where_length(F, lengths, "LessOrEqual", t, x)
        for s in range(len(steps) - t):  # step s lands on t where length = s + t + 1
            step_t = step_t + steps[s] * _where_length(F, lengths, "Equal", s + t + 1, x)
        reversed_steps.append(step_t)
    return reversed_steps


class RNNCell(_GatedCell):
    """``h' = activation(W_ih x + b_ih + W_hh h + b_hh)``, activation "tanh" or "relu"."""

    def __init__(self, hidden_size: int, activation: str = "tanh", **kwargs):
        check_mode_options("RNNCell", hidden_size, activation)
        self._mode = f"rnn_{activation}"
        super().__init__(hidden_size, **kwargs)


class LSTMCell(_GatedCell):
    """Long short-term memory; states [h, c]."""

    _mode = "lstm"


class GRUCell(_GatedCell):
    """Gated recurrent unit; states [h]."""

    _mode = "gru"


class LSTMPCell(_GatedCell):
    """LSTM with a projection (Sak et al. 2014, "LSTM based RNN architectures for large
    vocabulary speech recognition"): the hidden state h (hidden_size) is projected to
    ``r = W_hr h`` (projection_size, no bias), which is the output and what the next step
    reads; states [r, c]. MXNet's ``gluon.contrib.rnn.LSTMPCell``."""

    _mode = "lstm"

    def __init__(self, hidden_size: int, projection_size: int, i2h_weight_initializer=None,
                 h2h_weight_initializer=None, h2r_weight_initializer=None,
                 i2h_bias_initializer="zeros", h2h_bias_initializer="zeros",
                 input_size: int = 0, prefix=None, params=None):
        if projection_size < 1:
            raise InputError(f"LSTMPCell: projection_size must be >= 1, got "
                             f"{projection_size}")
        self._projection_size = int(projection_size)
        super().__init__(hidden_size, i2h_weight_initializer, h2h_weight_initializer,
                         i2h_bias_initializer, h2h_bias_initializer, input_size, prefix,
                         params)
        self.h2r_weight = self.params.get("h2r_weight",
                                          shape=(projection_size, hidden_size),
                                          init=h2r_weight_initializer)

    def _recurrent_size(self) -> int:
        return self._projection_size

    def state_info(self, batch_size: int = 0) -> list:
        return [{"shape": (batch_size, self._projection_size), "__layout__": "NC"},
                {"shape": (batch_size, self._hidden_size), "__layout__": "NC"}]

    def _step(self, F, x, states, i2h_weight, h2h_weight, i2h_bias, h2h_bias, h2r_weight):
        x_proj = F.Gemm(x, i2h_weight, i2h_bias, transB=1)
        _, (h, c) = step(F, "lstm", x_proj, list(states) or None, h2h_weight, h2h_bias,
                         self._hidden_size)
        r = F.MatMul(h, F.Transpose(h2r_weight, perm=[1, 0]))
        return (named(r, "out"), r, c)
