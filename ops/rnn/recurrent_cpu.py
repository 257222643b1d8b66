"""RNN, GRU and LSTM on the CPU, registered beside the generic kernels of ``ops/rnn/rnn.py``:
inference of the standard forms through the compiled cells (``cells.compiled_forward``:
ops/rnn/rnn_cpu.py, gru_cpu.py and lstm_cpu.py), with the node's kept weight layouts
(``_prepacked``); what they do not take (a clip on a GRU or LSTM, peepholes, input_forget,
other activations, a training graph's workspace output) runs the generic NumPy steps.
Signatures are the generic kernels'.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.rnn import cells
from mixrt.ops.rnn.recurrence import _shape, check_operands
from mixrt.ops.rnn.rnn import (gated_recurrent_unit, gru_7, gru_14, long_short_term_memory,
                               lstm_7, lstm_14, rnn_7, rnn_14, simple_rnn)


def _compiled(cell: str, X, W, R, B, sequence_lens, initials, outputs: int, **attributes):
    """The node's first ``outputs`` outputs through cells.compiled_forward, or None where it
    does not take them (``cell``: the cell class's name in cells.py)."""
    found = cells.compiled_forward(np, getattr(cells, cell), X, W, R, B, sequence_lens,
                                   initials, **attributes)
    return None if found is None else found[:max(outputs, 1)]


# -- RNN ----------------------------------------------------------------------------------------

def simple_rnn_cpu(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
                   activation_alpha=None, activation_beta=None, activations=None, clip=None,
                   direction="forward", hidden_size=None, layout=0, _outputs=2,
                   _prepacked=None):
    """A few rows: the whole sequence in one compiled call (ops/rnn/rnn_cpu.py)."""
    attributes = dict(activation_alpha=activation_alpha, activation_beta=activation_beta,
                      activations=activations, clip=clip, direction=direction,
                      hidden_size=hidden_size, layout=layout)
    if _outputs <= 2:
        check_operands("RNN", X.shape, W.shape, R.shape, _shape(B),
                       initial_h=_shape(initial_h), direction=direction,
                       hidden_size=hidden_size, layout=layout)
        found = _compiled("RNNCell", X, W, R, B, sequence_lens, [initial_h], _outputs,
                          prepacked=_prepacked, **attributes)
        if found is not None:
            return found
    return simple_rnn(np, X, W, R, B, sequence_lens, initial_h, _outputs=_outputs,
                      **attributes)


@rnn_7.fast("cpu")
def rnn_7_cpu(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
              activation_beta=None, activations=None, clip=None, direction="forward",
              hidden_size=None, _outputs=2, _prepacked=None):
    return simple_rnn_cpu(xp, X, W, R, B, sequence_lens, initial_h, _prepacked=_prepacked,
                          activation_alpha=activation_alpha, activation_beta=activation_beta,
                          activations=activations, clip=clip, direction=direction,
                          hidden_size=hidden_size, _outputs=_outputs)


rnn_14.fast("cpu")(simple_rnn_cpu)  # RNN 14 and 22: the same signature


# -- GRU ----------------------------------------------------------------------------------------

def gated_recurrent_unit_cpu(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
                             activation_alpha=None, activation_beta=None, activations=None,
                             clip=None, direction="forward", hidden_size=None, layout=0,
                             linear_before_reset=0, _outputs=2, _prepacked=None):
    """Sigmoid and tanh without a clip: the compiled cells (ops/rnn/gru_cpu.py)."""
    attributes = dict(activation_alpha=activation_alpha, activation_beta=activation_beta,
                      activations=activations, direction=direction, hidden_size=hidden_size,
                      layout=layout, linear_before_reset=linear_before_reset)
    if _outputs <= 2 and clip is None:
        check_operands("GRU", X.shape, W.shape, R.shape, _shape(B),
                       initial_h=_shape(initial_h), direction=direction,
                       hidden_size=hidden_size, layout=layout)
        found = _compiled("GRUCell", X, W, R, B, sequence_lens, [initial_h], _outputs,
                          prepacked=_prepacked, **attributes)
        if found is not None:
            return found
    return gated_recurrent_unit(np, X, W, R, B, sequence_lens, initial_h, clip=clip,
                                _outputs=_outputs, **attributes)


@gru_7.fast("cpu")
def gru_7_cpu(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
              activation_beta=None, activations=None, clip=None, direction="forward",
              hidden_size=None, linear_before_reset=0, _outputs=2, _prepacked=None):
    return gated_recurrent_unit_cpu(
        xp, X, W, R, B, sequence_lens, initial_h, _prepacked=_prepacked,
        activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
        linear_before_reset=linear_before_reset, _outputs=_outputs)


gru_14.fast("cpu")(gated_recurrent_unit_cpu)  # GRU 14 and 22: the same signature


# -- LSTM ---------------------------------------------------------------------------------------

def long_short_term_memory_cpu(xp, X, W, R, B=None, sequence_lens=None, initial_h=None,
                               initial_c=None, P=None, *, activation_alpha=None,
                               activation_beta=None, activations=None, clip=None,
                               direction="forward", hidden_size=None, input_forget=0, layout=0,
                               _outputs=3, _prepacked=None):
    """No peepholes, clip or input_forget: the compiled cells (ops/rnn/lstm_cpu.py), which
    keep the weights' halved and packed forms in ``_prepacked`` when W, R and B are
    constants of the session."""
    attributes = dict(activation_alpha=activation_alpha, activation_beta=activation_beta,
                      activations=activations, direction=direction, hidden_size=hidden_size,
                      layout=layout)
    if _outputs <= 3 and P is None and clip is None and not input_forget:
        check_operands("LSTM", X.shape, W.shape, R.shape, _shape(B),
                       initial_h=_shape(initial_h), initial_c=_shape(initial_c), P=_shape(P),
                       direction=direction, hidden_size=hidden_size, layout=layout)
        found = _compiled("LSTMCell", X, W, R, B, sequence_lens, [initial_h, initial_c],
                          _outputs, prepacked=_prepacked, **attributes)
        if found is not None:
            return found
    return long_short_term_memory(np, X, W, R, B, sequence_lens, initial_h, initial_c, P,
                                  clip=clip, input_forget=input_forget, _outputs=_outputs,
                                  **attributes)


@lstm_7.fast("cpu")
def lstm_7_cpu(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,
               *, activation_alpha=None, activation_beta=None, activations=None, clip=None,
               direction="forward", hidden_size=None, input_forget=0, _outputs=3,
               _prepacked=None):
    return long_short_term_memory_cpu(
        xp, X, W, R, B, sequence_lens, initial_h, initial_c, P, _prepacked=_prepacked,
        activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
        input_forget=input_forget, _outputs=_outputs)


lstm_14.fast("cpu")(long_short_term_memory_cpu)  # LSTM 14 and 22: the same signature
