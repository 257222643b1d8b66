"""Gradients of the recurrent layers (rnn.py): RNN, GRU and LSTM, every version.

Backpropagation through time, one backward kernel per cell (RNNGrad, GRUGrad, LSTMGrad in
the mixrt domain), as a framework's fused RNN does it. The kernel runs the forward again step
by step and keeps what each step's backward needs (the states it started from and the gate
pre-activations: a few (batch, hidden) arrays per step), then walks the steps in reverse:

* a cell's ``backward`` turns the gradient of its new states into the gradient of its input
  projection and of its old states, adding its weight gradients (R, Rb, P) as it goes;
* padding (``sequence_lens``) held the states and wrote zeros, so at a padded step the
  state gradient passes through unchanged and the cell sees none;
* the input projection ``X W^T + Wb`` was computed for all steps at once, so dX, dW and dWb
  are three products over the whole sequence at the end;
* a reverse direction ran over each sequence reversed within its own length
  (``recurrence.reversal_index``); its gradients are gathered with the same index, its own inverse.

The standard LSTM and GRU (sigmoid and tanh gates, no clip, peepholes or coupled gates)
run their steps compiled on the CPU instead of these NumPy cells (ops/rnn/lstm_cpu.py,
ops/rnn/gru_cpu.py: the same workspace, the same results to rounding, padding included); every
other variant and CuPy keep them. The RNN's inference with a few rows runs compiled too
(ops/rnn/rnn_cpu.py); its training keeps the NumPy cell.

Activations are differentiated at the clipped pre-activation, times 1 inside ``[-clip, clip]``
and 0 outside (the slope of the clip). These kernels have no gradient of their own: a second
derivative through a recurrent layer is a GradientError.
"""

from __future__ import annotations

from mixrt.ops.rnn import rnn
from mixrt.ops.rnn.cells import (ATTRIBUTES, CELLS, GRUCell, LSTMCell, RNNCell,
                                 recurrent_backward, workspace_type)
from mixrt.ops.conv.conv_grad import forwarded, optional_input
from mixrt.ops.training.grad_support import MIXRT
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType


# -- activations and their slopes -----------------------------------------------------------

@op("RNNGrad", since=1, domain=MIXRT)
def rnn_grad(xp, dY=None, dY_h=None, X=None, W=None, R=None, B=None, sequence_lens=None,
             initial_h=None, workspace=None, **attributes):
    """(dX, dW, dR, dB, d initial_h) of RNN."""
    return recurrent_backward(xp, RNNCell, ["Tanh"], [dY, dY_h], X, W, R, B, sequence_lens,
                              [initial_h], workspace=workspace, **attributes)


@op("GRUGrad", since=1, domain=MIXRT)
def gru_grad(xp, dY=None, dY_h=None, X=None, W=None, R=None, B=None, sequence_lens=None,
             initial_h=None, workspace=None, *, linear_before_reset=0, **attributes):
    """(dX, dW, dR, dB, d initial_h) of GRU."""
    return recurrent_backward(xp, GRUCell, ["Sigmoid", "Tanh"], [dY, dY_h], X, W, R, B,
                              sequence_lens, [initial_h], workspace=workspace,
                              linear_before_reset=linear_before_reset, **attributes)


@op("LSTMGrad", since=1, domain=MIXRT)
def lstm_grad(xp, dY=None, dY_h=None, dY_c=None, X=None, W=None, R=None, B=None,
              sequence_lens=None, initial_h=None, initial_c=None, P=None, workspace=None, *,
              input_forget=0, **attributes):
    """(dX, dW, dR, dB, d initial_h, d initial_c[, dP]) of LSTM."""
    return recurrent_backward(xp, LSTMCell, ["Sigmoid", "Tanh", "Tanh"], [dY, dY_h, dY_c], X,
                              W, R, B, sequence_lens, [initial_h, initial_c], P,
                              workspace=workspace, input_forget=input_forget, **attributes)


def _infer_like_inputs(state_count):
    """The gradients have their inputs' types; an absent B or initial state's gradient is
    still computed (zeros), with the shape the layer would have given it."""
    def infer(*types, direction="forward", hidden_size=None, layout=0, **_):
        types = list(types) + [None] * (8 + 2 * state_count - len(types))
        X, W, R, B = types[1 + state_count:5 + state_count]
        initials = types[6 + state_count:6 + 2 * state_count]
        result = [TensorType(t.dtype, t.shape) for t in (X, W, R)]
        bias_shape = None if W.shape is None else (W.shape[0], 2 * W.shape[1])
        result.append(TensorType(X.dtype, B.shape if B is not None else bias_shape))
        for state in initials:
            result.append(TensorType(X.dtype, None if state is None else state.shape))
        P = types[6 + 2 * state_count] if state_count == 2 else None
        if P is not None:
            result.append(TensorType(P.dtype, P.shape))
        return result
    return infer


rnn_grad.infer(_infer_like_inputs(1))
gru_grad.infer(_infer_like_inputs(1))
lstm_grad.infer(_infer_like_inputs(2))


def _with_workspace(infer, op_type: str):
    """The forward op's inference plus its workspace output's type (this module adds the
    output, so it extends rnn.py's inference here)."""
    cell_type, defaults, _ = CELLS[op_type]

    def extended(X, W, R, *rest, **attributes):
        return list(infer(X, W, R, *rest, **attributes)) + [
            workspace_type(cell_type, defaults, X, W, R, **attributes)]
    return extended


for _op_type, _versions in (("RNN", (rnn.rnn_7, rnn.rnn_14)), ("GRU", (rnn.gru_7, rnn.gru_14)),
                            ("LSTM", (rnn.lstm_7, rnn.lstm_14))):
    for _version in _versions:
        _version.infer(_with_workspace(_version.kernels[0].infer_fn, _op_type))


# -- the gradients of the forward ops -------------------------------------------------------

def _recurrent_gradient(kernel: str, state_count: int, extra_attributes: tuple):
    """input index -> gradient: X, W, R, B, (sequence_lens: none), initial states, P. The
    forward node gains its workspace output, which the backward kernel reads."""
    def gradient(b, node, dy):
        d_outputs = [dy[i] if i < len(dy) else None for i in range(1 + state_count)]
        if all(g is None for g in d_outputs):
            return []
        workspace = b.forward_output(node, 1 + state_count, f"{node.label}_workspace")
        inputs = [optional_input(node, i) for i in range(5 + state_count + (state_count == 2))]
        peephole = state_count == 2 and inputs[7] is not None
        grads = b.emit(kernel, *d_outputs, *inputs, workspace, domain=MIXRT,
                       outputs=4 + state_count + int(peephole),
                       **forwarded(node, ATTRIBUTES + extra_attributes))
        by_input = list(grads[:4]) + [None] + list(grads[4:])
        return [g if source is not None else None for g, source in zip(by_input, inputs)]
    return gradient


for _version in (rnn.rnn_7, rnn.rnn_14):
    _version.grad(_recurrent_gradient("RNNGrad", 1, ()))
for _version in (rnn.gru_7, rnn.gru_14):
    _version.grad(_recurrent_gradient("GRUGrad", 1, ("linear_before_reset",)))
for _version in (rnn.lstm_7, rnn.lstm_14):
    _version.grad(_recurrent_gradient("LSTMGrad", 2, ("input_forget",)))
