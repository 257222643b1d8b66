"""A standard GRU's steps on the CPU, as ops/lstm_cpu.py runs an LSTM's.

The cell: sigmoid and tanh, no clip, and the reset applied after the recurrent
product (``linear_before_reset=1``, which is how PyTorch's GRU computes and exports). Then
all three gates' recurrent products are one ``h @ R'^T`` a step, through the packed panels.
With the reset before the product (the ONNX default), the candidate's product waits on the
reset gate, and the layer keeps ops/rnn_grad.py's NumPy cells.

A forward step: that product; a compiled pass (``_jit_kernels.gru_gates``) adding the
step's input projection to z's and r's halves and keeping the recurrent term R_h h + Rb_h;
NumPy's tanh over z and r (halved, so it gives the sigmoids); a compiled pass
(``gru_candidate``) writing z, reset and the candidate's pre-activation; NumPy's tanh of
that into the cache; and a compiled pass (``gru_output``) for the new h (padding holds a
sequence's h past its length, as in ops/lstm_cpu.py). A backward step is
one compiled pass (``gru_step_grad``) and the product that carries dh back through R. The
recurrent weight's gradient is one product over every step at the end.

The cache is rnn_grad's workspace entry for these activations: h, z, reset, candidate and
the recurrent term per step, so either forward feeds either backward.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops import jit_cpu, rnn
from mixrt.ops.conv_cpu import packed
from mixrt.ops.lstm_cpu import halved
from mixrt.ops.matmul_cpu import dense_product

ENTRIES = 5  # a step's cache: h, z, reset, candidate, recurrent term
CANDIDATE = 3
STANDARD = ("sigmoid", "tanh")


def suits(layer, d: int) -> bool:
    """Whether direction d of ``layer`` (rnn_grad's _Layer of a GRU) is the standard cell,
    reset after the product, on NumPy floats with the compiled loops at hand."""
    cell = layer.cells[d]
    acts = (cell.gate, cell.candidate)
    return layer.xp is np and layer.wide in jit_cpu.NATIVE \
        and bool(cell.linear_before_reset) \
        and tuple(a.key for a in acts) == STANDARD and all(a.clip is None for a in acts) \
        and layer.batch > 0 and layer.hidden > 0 and jit_cpu.enabled()


def _projection(layer, W, B, d: int, constants=None):
    """X W'^T + b' of direction d for every step, in the order the direction runs,
    C-contiguous (steps, batch, 3 hidden): z's and r's columns halved, with Wb + Rb; the
    candidate's with Wb alone (its Rb is inside the reset)."""
    hidden, wide = layer.hidden, layer.wide
    weight = packed(constants, ("gru W'", d, wide.str), lambda: halved(W[d], 2 * hidden, wide))
    projected = rnn.sequence_product(layer.x, weight.T)
    if B is not None:
        def bias():
            wb, rb = B[d, :layer.gates].astype(wide), B[d, layer.gates:].astype(wide)
            both = wb.copy()
            both[:2 * hidden] += rb[:2 * hidden]
            return halved(both, 2 * hidden, wide)
        projected += packed(constants, ("gru bias'", d, wide.str), bias)
    return np.ascontiguousarray(projected[layer.order()] if layer.backwards[d] else projected)


def forward(layer, d: int, W, B, workspace=None, constants=None):
    """Direction d over every step: (outputs (steps, batch, hidden) in the order it ran,
    [final h]). ``workspace`` (steps, 5, batch, hidden), when given, receives each step's
    cache; without it two blocks take turns (inference). ``constants`` as in lstm_cpu."""
    kernels, hidden, wide = jit_cpu._kernels(), layer.hidden, layer.wide
    steps, batch = layer.steps, layer.batch
    projected = _projection(layer, W, B, d, constants)
    cell = layer.cells[d]
    recurrent_weight = packed(constants, ("gru R'", d, wide.str),
                              lambda: halved(cell.r, 2 * hidden, wide)).T  # a view
    bias_h = np.ascontiguousarray(cell.bh, dtype=wide)
    panels = {} if constants is None else constants.setdefault(("gru panels", d, wide.str), {})
    blocks = workspace if workspace is not None else np.empty((2, ENTRIES, batch, hidden), wide)
    outputs = np.empty((steps, batch, hidden), wide)
    recurrent = np.empty((batch, 3 * hidden), wide)
    gates = np.empty((batch, 2 * hidden), wide)
    pre = np.empty((batch, hidden), wide)
    (h,) = (np.array(s, dtype=wide, order="C", copy=True) for s in layer.start_states(d))
    lengths = np.ascontiguousarray(layer.lengths, dtype=np.int64)
    for t in range(steps):
        block = blocks[t] if workspace is not None else blocks[t % 2]
        flat = block.reshape(-1)
        dense_product(h, recurrent_weight, recurrent, panels)
        kernels.gru_gates(recurrent.reshape(-1), projected[t].reshape(-1), bias_h,
                          gates.reshape(-1), flat, batch, hidden)
        np.tanh(gates, out=gates)
        kernels.gru_candidate(gates.reshape(-1), projected[t].reshape(-1), h.reshape(-1), flat,
                              pre.reshape(-1), batch, hidden)
        np.tanh(pre, out=block[CANDIDATE])
        kernels.gru_output(flat, h.reshape(-1), outputs[t].reshape(-1), lengths, t, batch,
                           hidden)
    return outputs, [h]


def backward(layer, d: int, workspace, dy, d_states):
    """Direction d's steps in reverse from its ``workspace`` (steps, 5, batch, hidden):
    (d projection (steps, batch, 3 hidden), [d initial h], dR, dRb). ``dy`` is the gradient
    of its outputs in the order it ran; ``d_states`` that of its final state."""
    kernels, hidden, wide = jit_cpu._kernels(), layer.hidden, layer.wide
    steps, batch = layer.steps, layer.batch
    weight = np.ascontiguousarray(layer.cells[d].r)  # (3 hidden, hidden)
    dy = np.ascontiguousarray(dy, dtype=wide)
    (dh,) = (np.array(s, dtype=wide, order="C", copy=True) for s in d_states)
    carried = np.empty_like(dh)
    through = np.empty_like(dh)
    d_projected = np.empty((steps, batch, 3 * hidden), wide)
    d_recurrent = np.empty((steps, batch, 3 * hidden), wide)
    lengths = np.ascontiguousarray(layer.lengths, dtype=np.int64)
    panels: dict = {}
    for t in reversed(range(steps)):
        kernels.gru_step_grad(workspace[t].reshape(-1), dh.reshape(-1), dy[t].reshape(-1),
                              d_projected[t].reshape(-1), d_recurrent[t].reshape(-1),
                              carried.reshape(-1), lengths, t, batch, hidden)
        dense_product(d_recurrent[t], weight, through, panels)
        np.add(carried, through, out=dh)
    started_from = workspace[:, 0].reshape(-1, hidden)
    dr = d_recurrent.reshape(-1, 3 * hidden).T @ started_from
    return d_projected, [dh], dr, d_recurrent.sum(axis=(0, 1))
