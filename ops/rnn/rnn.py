"""Recurrent layers: RNN, GRU and LSTM (opsets 7, 14 with ``layout``, 22 with bfloat16).

All three run one driver (``recurrence.run_directions``) with their own cell step, on any
device; the standard forms run compiled on the CPU (``cells.compiled_forward``, registered with
``.fast("cpu")`` in ``ops/rnn/recurrent_cpu.py``), and a training graph's forward keeps a
workspace of every step for the gradient (``cells.forward_keeping_workspace``).
"""

from __future__ import annotations

from mixrt.ops.ir.dtypes import FLOATS, accumulation_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.rnn import cells
from mixrt.ops.rnn.recurrence import (_shape, activation_functions, check_operands, clipped,
                                      run_directions)

FLOATS_NO_BF16 = frozenset({"float16", "float32", "float64"})


def _keeping_workspace(op_type, xp, *inputs, **attributes):
    """The outputs plus a workspace of every step's cache, for a training graph whose
    gradient asked for it as one output more than ONNX's (rnn_grad.py)."""
    cell_type, defaults, _ = cells.CELLS[op_type]
    return cells.forward_keeping_workspace(xp, cell_type, defaults, *inputs, **attributes)


# -- RNN --------------------------------------------------------------------------------

def simple_rnn(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
               activation_alpha=None, activation_beta=None, activations=None, clip=None,
               direction="forward", hidden_size=None, layout=0, _outputs=2, _prepacked=None):
    """H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb). ``_prepacked`` as in
    :func:`long_short_term_memory` (the CPU's form: ops/rnn/recurrent_cpu.py)."""
    check_operands("RNN", X.shape, W.shape, R.shape, _shape(B), initial_h=_shape(initial_h),
                   direction=direction, hidden_size=hidden_size, layout=layout)
    if _outputs > 2:
        return _keeping_workspace("RNN", xp, X, W, R, B, sequence_lens, [initial_h], None,
                                  activation_alpha=activation_alpha,
                                  activation_beta=activation_beta, activations=activations,
                                  clip=clip, direction=direction, hidden_size=hidden_size,
                                  layout=layout)
    num_directions = W.shape[0]
    acts = activation_functions(xp, activations, activation_alpha, activation_beta,
                                ["Tanh"], num_directions)
    clamp = clipped(xp, clip)

    def step(x_proj, states, weights, f):
        (h,), (r, rb, _) = states, weights
        return [f[0](clamp(x_proj + xp.matmul(h, r.T) + rb))]

    return run_directions(xp, X, W, R, B, sequence_lens, [initial_h],
                          hidden_size=hidden_size, direction=direction, layout=layout,
                          step=step, activations=acts, gate_count=1)[:max(_outputs, 1)]


@op("RNN", since=7, dtypes=FLOATS_NO_BF16)
def rnn_7(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, _outputs=2, _prepacked=None):
    return simple_rnn(xp, X, W, R, B, sequence_lens, initial_h, _prepacked=_prepacked,
                      activation_alpha=activation_alpha, activation_beta=activation_beta,
                      activations=activations, clip=clip, direction=direction,
                      hidden_size=hidden_size, _outputs=_outputs)


@op("RNN", since=22, dtypes=FLOATS)
@op("RNN", since=14, dtypes=FLOATS_NO_BF16)
def rnn_14(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
           activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, layout=0, _outputs=2, _prepacked=None):
    return simple_rnn(xp, X, W, R, B, sequence_lens, initial_h, _prepacked=_prepacked,
                      activation_alpha=activation_alpha, activation_beta=activation_beta,
                      activations=activations, clip=clip, direction=direction,
                      hidden_size=hidden_size, layout=layout, _outputs=_outputs)


# -- GRU --------------------------------------------------------------------------------

def gated_recurrent_unit(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, *,
                         activation_alpha=None, activation_beta=None, activations=None,
                         clip=None, direction="forward", hidden_size=None, layout=0,
                         linear_before_reset=0, _outputs=2, _prepacked=None):
    """Gates z (update), r (reset), h (candidate), in that order in W, R and B.
    ``_prepacked`` as in :func:`long_short_term_memory` (the CPU's form:
    ops/rnn/recurrent_cpu.py)."""
    check_operands("GRU", X.shape, W.shape, R.shape, _shape(B), initial_h=_shape(initial_h),
                   direction=direction, hidden_size=hidden_size, layout=layout)
    if _outputs > 2:
        return _keeping_workspace("GRU", xp, X, W, R, B, sequence_lens, [initial_h], None,
                                  activation_alpha=activation_alpha,
                                  activation_beta=activation_beta, activations=activations,
                                  clip=clip, direction=direction, hidden_size=hidden_size,
                                  layout=layout, linear_before_reset=linear_before_reset)
    num_directions = W.shape[0]
    acts = activation_functions(xp, activations, activation_alpha, activation_beta,
                                ["Sigmoid", "Tanh"], num_directions)
    clamp = clipped(xp, clip)

    def step(x_proj, states, weights, f):
        (h,), (r_weights, rb, _) = states, weights
        xz, xr, xh = xp.split(x_proj, 3, axis=-1)
        rz, rr, rh = xp.split(r_weights, 3, axis=0)
        bz, br, bh = xp.split(rb, 3)
        z = f[0](clamp(xz + xp.matmul(h, rz.T) + bz))
        reset = f[0](clamp(xr + xp.matmul(h, rr.T) + br))
        if linear_before_reset:
            candidate = f[1](clamp(xh + reset * (xp.matmul(h, rh.T) + bh)))
        else:
            candidate = f[1](clamp(xh + xp.matmul(reset * h, rh.T) + bh))
        return [(1 - z) * candidate + z * h]

    return run_directions(xp, X, W, R, B, sequence_lens, [initial_h],
                          hidden_size=hidden_size, direction=direction, layout=layout,
                          step=step, activations=acts, gate_count=3)[:max(_outputs, 1)]


@op("GRU", since=7, dtypes=FLOATS_NO_BF16)
def gru_7(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
          activation_beta=None, activations=None, clip=None, direction="forward",
          hidden_size=None, linear_before_reset=0, _outputs=2, _prepacked=None):
    return gated_recurrent_unit(
        xp, X, W, R, B, sequence_lens, initial_h, _prepacked=_prepacked,
        activation_alpha=activation_alpha,
        activation_beta=activation_beta, activations=activations, clip=clip,
        direction=direction, hidden_size=hidden_size,
        linear_before_reset=linear_before_reset, _outputs=_outputs)


@op("GRU", since=22, dtypes=FLOATS)
@op("GRU", since=14, dtypes=FLOATS_NO_BF16)
def gru_14(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
           activation_beta=None, activations=None, clip=None, direction="forward",
           hidden_size=None, layout=0, linear_before_reset=0, _outputs=2, _prepacked=None):
    return gated_recurrent_unit(
        xp, X, W, R, B, sequence_lens, initial_h, _prepacked=_prepacked,
        activation_alpha=activation_alpha,
        activation_beta=activation_beta, activations=activations, clip=clip,
        direction=direction, hidden_size=hidden_size, layout=layout,
        linear_before_reset=linear_before_reset, _outputs=_outputs)


# -- LSTM -------------------------------------------------------------------------------

def long_short_term_memory(xp, X, W, R, B=None, sequence_lens=None, initial_h=None,
                           initial_c=None, P=None, *, activation_alpha=None,
                           activation_beta=None, activations=None, clip=None,
                           direction="forward", hidden_size=None, input_forget=0, layout=0,
                           _outputs=3, _prepacked=None):
    """Gates i, o, f, c in that order in W, R and B; peepholes P in order i, o, f.
    ``_prepacked``: the node's dict where W is a session constant (the CPU's form,
    ops/rnn/recurrent_cpu.py, through ops/rnn/lstm_cpu.py keeps the weights' halved and packed
    forms there when R and B are constants too; this generic form does not read it)."""
    check_operands("LSTM", X.shape, W.shape, R.shape, _shape(B), initial_h=_shape(initial_h),
                   initial_c=_shape(initial_c), P=_shape(P), direction=direction,
                   hidden_size=hidden_size, layout=layout)
    if _outputs > 3:
        return _keeping_workspace("LSTM", xp, X, W, R, B, sequence_lens,
                                  [initial_h, initial_c], P, activation_alpha=activation_alpha,
                                  activation_beta=activation_beta, activations=activations,
                                  clip=clip, direction=direction, hidden_size=hidden_size,
                                  layout=layout, input_forget=input_forget)
    num_directions = W.shape[0]
    acts = activation_functions(xp, activations, activation_alpha, activation_beta,
                                ["Sigmoid", "Tanh", "Tanh"], num_directions)
    clamp = clipped(xp, clip)
    peepholes = None if P is None else P.astype(accumulation_dtype(X.dtype))

    def step(x_proj, states, weights, f):
        (h, c), (r_weights, rb, d) = states, weights
        pre = xp.matmul(h, r_weights.T)
        pre += x_proj
        pre += rb
        if peepholes is None and not input_forget:  # i, o, f: one activation call
            hidden = c.shape[-1]
            i, o, forget = xp.split(f[0](clamp(pre[:, :3 * hidden])), 3, axis=-1)
            cell = forget * c
            cell += i * f[1](clamp(pre[:, 3 * hidden:]))
            return [o * f[2](cell), cell]
        gi, go, gf, gc = xp.split(pre, 4, axis=-1)
        if peepholes is not None:
            pi, po, pf = xp.split(peepholes[d], 3)
            gi, gf = gi + pi * c, gf + pf * c
        i = f[0](clamp(gi))
        forget = 1 - i if input_forget else f[0](clamp(gf))
        cell = forget * c + i * f[1](clamp(gc))
        if peepholes is not None:
            go = go + po * cell
        o = f[0](clamp(go))
        return [o * f[2](cell), cell]

    return run_directions(xp, X, W, R, B, sequence_lens, [initial_h, initial_c],
                          hidden_size=hidden_size, direction=direction, layout=layout,
                          step=step, activations=acts, gate_count=4)[:max(_outputs, 1)]


@op("LSTM", since=7, dtypes=FLOATS_NO_BF16)
def lstm_7(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
           activation_alpha=None, activation_beta=None, activations=None, clip=None,
           direction="forward", hidden_size=None, input_forget=0, _outputs=3,
           _prepacked=None):
    return long_short_term_memory(
        xp, X, W, R, B, sequence_lens, initial_h, initial_c, P, _prepacked=_prepacked,
        activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
        input_forget=input_forget, _outputs=_outputs)


@op("LSTM", since=22, dtypes=FLOATS)
@op("LSTM", since=14, dtypes=FLOATS_NO_BF16)
def lstm_14(xp, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,
            *, activation_alpha=None, activation_beta=None, activations=None, clip=None,
            direction="forward", hidden_size=None, input_forget=0, layout=0, _outputs=3,
            _prepacked=None):
    return long_short_term_memory(
        xp, X, W, R, B, sequence_lens, initial_h, initial_c, P, _prepacked=_prepacked,
        activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
        input_forget=input_forget, layout=layout, _outputs=_outputs)


# -- shape inference --------------------------------------------------------------------

def recurrent_infer(op_type: str, state_outputs: int):
    """Y plus ``state_outputs`` final states, each (directions, batch, hidden) or, with
    layout=1, batch first; operands whose shapes do not fit are refused at load time
    (:func:`check_operands`)."""
    def infer(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
              hidden_size=None, direction="forward", layout=0, **__):
        check_operands(op_type, *(_type_shape(t) for t in (X, W, R, B)),
                       initial_h=_type_shape(initial_h), initial_c=_type_shape(initial_c),
                       P=_type_shape(P), direction=direction, hidden_size=hidden_size,
                       layout=layout)
        if X.shape is None:
            return [TensorType(X.dtype, None) for _ in range(1 + state_outputs)]
        directions = 2 if direction == "bidirectional" else 1
        hidden = hidden_size or (R.shape[-1] if R.shape is not None else None)
        seq, batch = (X.shape[1], X.shape[0]) if layout else (X.shape[0], X.shape[1])
        if layout:
            y, state = (batch, seq, directions, hidden), (batch, directions, hidden)
        else:
            y, state = (seq, directions, batch, hidden), (directions, batch, hidden)
        return [TensorType(X.dtype, y)] + [TensorType(X.dtype, state)
                                            for _ in range(state_outputs)]
    return infer


def _type_shape(value_type):
    return None if value_type is None else value_type.shape


for _kernel, _op_type in ((rnn_7, "RNN"), (rnn_14, "RNN"), (gru_7, "GRU"), (gru_14, "GRU")):
    _kernel.infer(recurrent_infer(_op_type, 1))
for _kernel in (lstm_7, lstm_14):
    _kernel.infer(recurrent_infer("LSTM", 2))
