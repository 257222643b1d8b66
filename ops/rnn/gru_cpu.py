"""A standard GRU's steps on the CPU, as ops/rnn/lstm_cpu.py runs an LSTM's.

The cell: sigmoid and tanh, no clip; padded or not (a sequence's h holds past its length,
as in ops/rnn/lstm_cpu.py). Both places of the reset gate:

* after the recurrent product (``linear_before_reset=1``, how PyTorch's GRU computes and
  exports, and Gluon's): all three gates' recurrent products are one ``h @ R'^T`` a step,
  through the packed panels; a compiled pass (``_jit_rnn_steps.gru_gates``) adds the step's
  input projection to z's and r's halves and keeps the recurrent term R_h h + Rb_h; NumPy's
  tanh over z and r (halved, so it gives the sigmoids); a compiled pass
  (``gru_candidate``) writes z, reset and the candidate's pre-activation; NumPy's tanh of
  that into the cache; a compiled pass (``gru_output``) for the new h. A backward step is
  one compiled pass (``gru_step_grad``) and the product that carries dh back through R.
* before it (the ONNX default): the candidate's product reads reset h, so a step makes two,
  ``h @ R_zr'^T`` and then ``(reset h) @ R_h^T``, with ``gru_reset`` between; its backward
  is two compiled passes around the two products (``gru_reset_grad_candidate``,
  ``gru_reset_grad_gates``).

Inference with a few rows (lstm_cpu.SEQUENCE_ROWS) runs the whole sequence in one compiled
call instead (:func:`forward_sequence`, ops/rnn/_jit_recurrent.gru_sequence), as the LSTM does.

The recurrent weight's gradient is one product over every step at the end (per part, with
the reset before). The cache is rnn_grad's workspace entry for these activations: h, z,
reset, the candidate, and with the reset after also the recurrent term, per step, so
either forward feeds either backward.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.rnn.compiled_steps import STEPS
from mixrt.ops.compiled.workspace import packed
from mixrt.ops.rnn.lstm_cpu import (halved, panels_by_part, projection, run_sequence,
                                sequence_suits, unit_bounds)
from mixrt.ops.nn.matmul_cpu import dense_product

CANDIDATE = 3  # a step's cache: h, z, reset, candidate, then (reset after) the recurrent term
STANDARD = ("sigmoid", "tanh")


def suits(layer, d: int) -> bool:
    """Whether direction d of ``layer`` (rnn_grad's _Layer of a GRU) is the standard cell
    on NumPy floats with the compiled loops at hand."""
    cell = layer.cells[d]
    acts = (cell.gate, cell.candidate)
    return layer.xp is np and layer.wide in jit_cpu.NATIVE \
        and tuple(a.key for a in acts) == STANDARD and all(a.clip is None for a in acts) \
        and layer.batch > 0 and layer.hidden > 0 and jit_cpu.enabled()


def entries(layer, d: int) -> int:
    """A step's cache entries in direction d's workspace."""
    return 5 if layer.cells[d].linear_before_reset else 4


def _projection(layer, W, B, d: int, constants=None):
    """X W'^T + b' of direction d for every step, in the order the direction runs,
    C-contiguous (steps, batch, 3 hidden): z's and r's columns halved, with Wb + Rb; the
    candidate's with Wb, and Rb too when the reset comes before the product (after it, Rb
    is inside the reset)."""
    hidden, wide = layer.hidden, layer.wide

    def bias():
        wb, rb = B[d, :layer.gates].astype(wide), B[d, layer.gates:].astype(wide)
        both = wb.copy()
        joining = 2 * hidden if layer.cells[d].linear_before_reset else 3 * hidden
        both[:joining] += rb[:joining]
        return halved(both, 2 * hidden, wide)
    return projection(layer, d, constants, "gru", lambda: halved(W[d], 2 * hidden, wide),
                      None if B is None else bias)


def inference(layer, d: int, W, B, constants=None):
    """:func:`forward` without a workspace: (outputs, [final h])."""
    if sequence_suits(layer):
        return forward_sequence(layer, d, W, B, constants)
    return forward(layer, d, W, B, constants=constants)


def forward_sequence(layer, d: int, W, B, constants=None):
    """:func:`forward` without a workspace, every step in one compiled call
    (ops/rnn/_jit_recurrent.gru_sequence; a few rows, as lstm_cpu.forward_sequence)."""
    hidden, wide, steps, batch = layer.hidden, layer.wide, layer.steps, layer.batch
    cell = layer.cells[d]
    native = jit_cpu.native_pool()
    bounds = unit_bounds(hidden, 1 if native is None else native.workers + 1)
    projected = _projection(layer, W, B, d, constants)
    after = bool(cell.linear_before_reset)
    key = (d, wide.str, len(bounds))

    def weight():
        return halved(cell.r, 2 * hidden, wide)
    if after:  # one product a step: z, r and the candidate's rows together
        panels = packed(constants, ("gru R' by part",) + key,
                        lambda: panels_by_part(weight(), bounds, 3))
        candidate, bias_h = np.zeros(1, wide), np.ascontiguousarray(cell.bh, dtype=wide)
    else:  # z's and r's rows, then the candidate's
        panels = packed(constants, ("gru R' by part",) + key,
                        lambda: panels_by_part(weight()[:2 * hidden], bounds, 2))
        candidate = packed(constants, ("gru candidate R' by part",) + key,
                           lambda: panels_by_part(weight()[2 * hidden:], bounds, 1))
        bias_h = np.zeros(1, wide)
    (h,) = layer.start_states(d)
    hs = np.empty((2, batch, hidden), wide)
    hs[0] = h
    outputs = np.empty((steps, batch, hidden), wide)
    shared = np.empty((2, batch, hidden), wide)  # reset h and z, between the phases
    run_sequence("gru", native, steps, batch, hidden, (
        projected, panels, np.array(bounds, np.int64), hs, outputs,
        np.ascontiguousarray(layer.lengths, dtype=np.int64), bias_h, candidate, shared[0],
        shared[1]), after)
    return outputs, [hs[steps % 2]]


def forward(layer, d: int, W, B, workspace=None, constants=None):
    """Direction d over every step: (outputs (steps, batch, hidden) in the order it ran,
    [final h]). ``workspace`` (steps, entries, batch, hidden), when given, receives each
    step's cache; without it two blocks take turns (inference). ``constants`` as in
    lstm_cpu."""
    hidden, wide = layer.hidden, layer.wide
    cell = layer.cells[d]
    projected = _projection(layer, W, B, d, constants)
    weight = packed(constants, ("gru R'", d, wide.str),
                    lambda: halved(cell.r, 2 * hidden, wide))
    panels = {} if constants is None else constants.setdefault(("gru panels", d, wide.str), {})
    shape = (layer.steps, layer.batch, hidden)
    blocks = workspace if workspace is not None \
        else np.empty((2, entries(layer, d)) + shape[1:], wide)
    outputs = np.empty(shape, wide)
    (h,) = (np.array(s, dtype=wide, order="C", copy=True) for s in layer.start_states(d))
    lengths = np.ascontiguousarray(layer.lengths, dtype=np.int64)

    def block(t):
        return blocks[t] if workspace is not None else blocks[t % 2]
    steps = _steps_reset_after if cell.linear_before_reset else _steps_reset_before
    steps(layer, d, projected, weight, panels, block, outputs, h, lengths)
    return outputs, [h]


def _steps_reset_after(layer, d, projected, weight, panels, block, outputs, h, lengths):
    kernels, hidden, wide, batch = jit_cpu.load(STEPS), layer.hidden, layer.wide, layer.batch
    bias_h = np.ascontiguousarray(layer.cells[d].bh, dtype=wide)
    recurrent = np.empty((batch, 3 * hidden), wide)
    gates = np.empty((batch, 2 * hidden), wide)
    pre = np.empty((batch, hidden), wide)
    for t in range(layer.steps):
        cache = block(t)
        flat = cache.reshape(-1)
        dense_product(h, weight.T, recurrent, panels)
        kernels.gru_gates(recurrent.reshape(-1), projected[t].reshape(-1), bias_h,
                          gates.reshape(-1), flat, batch, hidden)
        np.tanh(gates, out=gates)
        kernels.gru_candidate(gates.reshape(-1), projected[t].reshape(-1), h.reshape(-1), flat,
                              pre.reshape(-1), batch, hidden)
        np.tanh(pre, out=cache[CANDIDATE])
        kernels.gru_output(flat, h.reshape(-1), outputs[t].reshape(-1), lengths, t, batch,
                           hidden)


def _steps_reset_before(layer, d, projected, weight, panels, block, outputs, h, lengths):
    kernels, hidden, wide, batch = jit_cpu.load(STEPS), layer.hidden, layer.wide, layer.batch
    gates_weight, candidate_weight = weight[:2 * hidden].T, weight[2 * hidden:].T
    candidate_panels: dict = panels.setdefault("candidate", {})
    gates = np.empty((batch, 2 * hidden), wide)
    gated = np.empty((batch, hidden), wide)
    pre = np.empty((batch, hidden), wide)
    for t in range(layer.steps):
        cache = block(t)
        flat = cache.reshape(-1)
        dense_product(h, gates_weight, gates, panels)
        gates += projected[t][:, :2 * hidden]
        np.tanh(gates, out=gates)
        kernels.gru_reset(gates.reshape(-1), h.reshape(-1), flat, gated.reshape(-1), batch,
                          hidden)
        dense_product(gated, candidate_weight, pre, candidate_panels)
        pre += projected[t][:, 2 * hidden:]
        np.tanh(pre, out=cache[CANDIDATE])
        kernels.gru_output(flat, h.reshape(-1), outputs[t].reshape(-1), lengths, t, batch,
                           hidden)


def backward(layer, d: int, workspace, dy, d_states):
    """Direction d's steps in reverse from its ``workspace`` (steps, entries, batch,
    hidden): (d projection (steps, batch, 3 hidden), [d initial h], dR, dRb). ``dy`` is the
    gradient of its outputs in the order it ran; ``d_states`` that of its final state."""
    wide = layer.wide
    dy = np.ascontiguousarray(dy, dtype=wide)
    (dh,) = (np.array(s, dtype=wide, order="C", copy=True) for s in d_states)
    d_projected = np.empty((layer.steps, layer.batch, 3 * layer.hidden), wide)
    lengths = np.ascontiguousarray(layer.lengths, dtype=np.int64)
    steps = _grad_reset_after if layer.cells[d].linear_before_reset else _grad_reset_before
    dh, dr, drb = steps(layer, d, workspace, dy, dh, d_projected, lengths)
    return d_projected, [dh], dr, drb


def _grad_reset_after(layer, d, workspace, dy, dh, d_projected, lengths):
    kernels, hidden, batch = jit_cpu.load(STEPS), layer.hidden, layer.batch
    weight = np.ascontiguousarray(layer.cells[d].r)  # (3 hidden, hidden)
    carried, through = np.empty_like(dh), np.empty_like(dh)
    d_recurrent = np.empty_like(d_projected)  # the gradient of h R^T + Rb
    panels: dict = {}
    for t in reversed(range(layer.steps)):
        kernels.gru_step_grad(workspace[t].reshape(-1), dh.reshape(-1), dy[t].reshape(-1),
                              d_projected[t].reshape(-1), d_recurrent[t].reshape(-1),
                              carried.reshape(-1), lengths, t, batch, hidden)
        dense_product(d_recurrent[t], weight, through, panels)
        np.add(carried, through, out=dh)
    started_from = workspace[:, 0].reshape(-1, hidden)
    dr = d_recurrent.reshape(-1, 3 * hidden).T @ started_from
    return dh, dr, d_recurrent.sum(axis=(0, 1))


def _grad_reset_before(layer, d, workspace, dy, dh, d_projected, lengths):
    kernels, hidden, batch, wide = jit_cpu.load(STEPS), layer.hidden, layer.batch, layer.wide
    r = np.ascontiguousarray(layer.cells[d].r)
    gates_weight, candidate_weight = r[:2 * hidden], r[2 * hidden:]  # contiguous rows
    carried, through, d_gated = np.empty_like(dh), np.empty_like(dh), np.empty_like(dh)
    da_h, dz = np.empty_like(dh), np.empty_like(dh)
    d_zr = np.empty((batch, 2 * hidden), wide)
    gates_panels: dict = {}
    candidate_panels: dict = {}
    for t in reversed(range(layer.steps)):
        cache = workspace[t].reshape(-1)
        kernels.gru_reset_grad_candidate(cache, dh.reshape(-1), dy[t].reshape(-1),
                                         d_projected[t].reshape(-1), da_h.reshape(-1),
                                         dz.reshape(-1), carried.reshape(-1), lengths, t,
                                         batch, hidden)
        dense_product(da_h, candidate_weight, d_gated, candidate_panels)
        kernels.gru_reset_grad_gates(cache, d_gated.reshape(-1), dz.reshape(-1),
                                     d_projected[t].reshape(-1), d_zr.reshape(-1),
                                     carried.reshape(-1), batch, hidden)
        dense_product(d_zr, gates_weight, through, gates_panels)
        np.add(carried, through, out=dh)
    started_from = workspace[:, 0].reshape(-1, hidden)
    gated = (workspace[:, 2] * workspace[:, 0]).reshape(-1, hidden)  # reset h of every step
    flat = d_projected.reshape(-1, 3 * hidden)
    dr = np.concatenate([flat[:, :2 * hidden].T @ started_from, flat[:, 2 * hidden:].T @ gated])
    return dh, dr, d_projected.sum(axis=(0, 1))
