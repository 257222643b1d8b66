"""A standard LSTM's steps on the CPU: six calls a step instead of twenty-odd NumPy ones.

ops/rnn/rnn_grad.py's cells serve every variant (peepholes, clip, any activation, padding, CuPy)
with one NumPy expression per gate quantity. With 64 x 256 states a forward step spent
~140 us in ~15 small calls and their temporaries beside a ~210 us recurrent product, then
copied its cache into the workspace; a backward step spent ~130 us the same way. For the
layer almost every model uses (sigmoid, tanh, tanh; no clip, peepholes or input_forget) a
step here is:

* forward: ``h @ R'`` into a reused buffer, through the packed panels of ops/nn/matmul_cpu.py
  (R' packed once per call: 64 x 256 @ 256 x 1024 took 114 us against OpenBLAS's 164);
  ``+=`` the step's input projection; one NumPy tanh over all four gates; one compiled
  pass (``_jit_rnn_steps.lstm_step``, 8 us) that makes i, o, f and the new cell and writes
  the step's cache straight into the workspace; NumPy's tanh of the cell; and a compiled
  pass (``lstm_output``) for o * tanh(cell) into the output and the states;
* backward: one compiled pass (``lstm_step_grad``, 36 us) from the cache to the gradient
  of the gates, written into its row of d projection, and the product that carries dh
  back (the panels again: 112 against 150 us).

The sigmoids are tanh(x / 2) / 2 + 1 / 2, as ops/rnn/rnn.py takes them, with the halving folded
into the weights: R's and W's i, o and f rows and their biases are halved once per call,
which is exact (a power of two), so tanh sees exactly half of each pre-activation. NumPy's
tanh stays (its SIMD loop; numba's would call libm per element).

Padding (``sequence_lens`` shorter than the sequence) is a test per sequence in those
passes: past its length a sequence's states hold, its output is zero and its steps pass
its state's gradient through unchanged (``hold_rows`` after the backward product).

The cache layout is rnn_grad's workspace entry for these activations: h, c, i, forget,
candidate, cell, o, tanh(cell) per step, so either forward feeds either backward.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.rnn.compiled_steps import STEPS, recurrent_kernels
from mixrt.ops.rnn import recurrence
from mixrt.ops.compiled.workspace import packed
from mixrt.ops.nn.matmul_cpu import (dense_product, pack_panels, panel_product, panel_width,
                                  panels_suit)
from mixrt.ops.ir.registry import CONSTANT_INPUTS

ENTRIES = 8  # a step's cache: h, c, i, forget, candidate, cell, o, tanh(cell)
CELL, SQUASHED = 5, 7
STANDARD = ("sigmoid", "tanh", "tanh")


def suits(layer, d: int) -> bool:
    """Whether direction d of ``layer`` (rnn_grad's _Layer of an LSTM) is the standard cell
    on NumPy floats with the compiled loops at hand."""
    cell = layer.cells[d]
    acts = (cell.gate, cell.cell_input, cell.output)
    return layer.xp is np and layer.wide in jit_cpu.NATIVE \
        and cell.peepholes is None and not cell.input_forget \
        and tuple(a.key for a in acts) == STANDARD and all(a.clip is None for a in acts) \
        and layer.batch > 0 and layer.hidden > 0 and jit_cpu.enabled()


def entries(layer, d: int) -> int:
    """A step's cache entries in the workspace."""
    return ENTRIES


def halved(matrix, rows: int, dtype):
    """``matrix`` (gates, ...) or a bias (gates,) in ``dtype`` with its first ``rows`` rows
    (the sigmoid gates') halved: one pass, into a new array."""
    scale = np.ones(matrix.shape[0], dtype)
    scale[:rows] = 0.5
    return np.multiply(matrix, scale.reshape((-1,) + (1,) * (matrix.ndim - 1)), dtype=dtype)


def constant_weights(prepacked: dict | None, B) -> dict | None:
    """The node's dict (runtime/binding.bind_graph) when W, R and B, if given, are all
    constants of the session, so their halved and packed forms can be kept; else None."""
    if prepacked is None:
        return None
    needed = {1, 2} | ({3} if B is not None else set())
    return prepacked if needed <= prepacked.get(CONSTANT_INPUTS, frozenset()) else None


def _projection(layer, W, B, d: int, constants=None):
    """X W'^T + (Wb + Rb)' of direction d for every step, in the order the direction runs
    (' : the i, o and f columns halved), C-contiguous (steps, batch, 4 hidden)."""
    hidden, wide = layer.hidden, layer.wide
    return projection(layer, d, constants, "lstm", lambda: halved(W[d], 3 * hidden, wide),
                      None if B is None else lambda: halved(
                          B[d, :layer.gates].astype(wide) + B[d, layer.gates:].astype(wide),
                          3 * hidden, wide))


def projection(layer, d: int, constants, cell: str, weight, bias=None):
    """X weight^T (+ bias) of direction d for every step, in the order the direction runs,
    C-contiguous (steps, batch, gates). ``weight()`` and ``bias()`` make the cell's forms
    of W[d] and of its bias (halved rows, summed biases), kept in ``constants`` under the
    ``cell``'s keys ("lstm W'", "lstm W' panels", "lstm bias'") when the weights are
    session constants."""
    wide = layer.wide
    w = packed(constants, (f"{cell} W'", d, wide.str), weight)
    projected = input_product(layer, w, constants, (f"{cell} W' panels", d, wide.str))
    if bias is not None:
        projected += packed(constants, (f"{cell} bias'", d, wide.str), bias)
    return np.ascontiguousarray(projected[layer.order()] if layer.backwards[d] else projected)


def input_product(layer, weight, constants, key):
    """X weight^T over every step, (steps, batch, gates): a constant ``weight`` through its
    panels, kept in ``constants`` under ``key``, however small the product (the BLAS woke
    from sleep for it, 40 -> 75 us at 32 x 64 @ 64 x 1024 after a sequence's 300 us; the
    panels took 23 either way; an RNN's 32 x 64 @ 64 x 256, 42 against ~10)."""
    if constants is None:
        return recurrence.sequence_product(layer.x, weight.T)
    projected = np.empty(layer.x.shape[:2] + (weight.shape[0],), layer.wide)
    x, packs = np.ascontiguousarray(layer.x), constants.setdefault(key, {})
    if panels_suit(x, weight.T, projected, packs, min_work=0):
        return panel_product(x, weight.T, projected, packs)
    dense_product(x, weight.T, projected, packs)
    return projected


def forward(layer, d: int, W, B, workspace=None, constants=None):
    """Direction d over every step: (outputs (steps, batch, hidden) in the order it ran,
    [final h, final c]). ``workspace`` (steps, 8, batch, hidden), when given, receives each
    step's cache; without it two blocks take turns (inference). ``constants``: the node's
    dict where the weights are session constants (:func:`constant_weights`), which keeps
    their halved and packed forms."""
    kernels, hidden, wide = jit_cpu.load(STEPS), layer.hidden, layer.wide
    steps, batch = layer.steps, layer.batch
    projected = _projection(layer, W, B, d, constants)
    recurrent = packed(constants, ("lstm R'", d, wide.str),
                       lambda: halved(layer.cells[d].r, 3 * hidden, wide)).T  # a view
    # the recurrent weight in panels, packed on the first step (of the session, if constant)
    panels = {} if constants is None else constants.setdefault(("lstm panels", d, wide.str), {})
    blocks = workspace if workspace is not None else np.empty((2, ENTRIES, batch, hidden), wide)
    outputs = np.empty((steps, batch, hidden), wide)
    gates = np.empty((batch, 4 * hidden), wide)
    h, c = (np.array(s, dtype=wide, order="C", copy=True) for s in layer.start_states(d))
    lengths = np.ascontiguousarray(layer.lengths, dtype=np.int64)
    for t in range(steps):
        block = blocks[t] if workspace is not None else blocks[t % 2]
        dense_product(h, recurrent, gates, panels)
        gates += projected[t]
        np.tanh(gates, out=gates)
        kernels.lstm_step(gates.reshape(-1), h.reshape(-1), c.reshape(-1), block.reshape(-1),
                          batch, hidden)
        np.tanh(block[CELL], out=block[SQUASHED])
        # the output, and the states of the sequences still running (padding holds them)
        kernels.lstm_output(block.reshape(-1), h.reshape(-1), c.reshape(-1),
                            outputs[t].reshape(-1), lengths, t, batch, hidden)
    return outputs, [h, c]


# -- inference: the whole sequence in one call ---------------------------------------------
#
# With few rows a step's product is a matrix-vector one, bound by reading R' (1 MB a step at
# hidden 256, float32), and the calls from Python around it cost more than it does:
# ops/rnn/_jit_recurrent.py runs every step in one call, the units split between the native
# pool's threads so that each reads (and keeps in its L2) only its share of R'. The
# 2-layer LSTM of hidden 256 over 32 steps (benchmarks/lstm_bench.py), one process, the
# steps above against the sequence (ms): batch 1 1.61 / 0.74-0.89 (across runs), 8 2.88 /
# 2.04, 16 5.34 / 3.89, 32 7.69 / 6.98, 64 15.67 / 14.71, 128 31.85 / 31.19 (the GRU: 32
# 7.80 / 5.35, 64 11.91 / 10.55). Training keeps the steps: they write the workspace.

SEQUENCE_ROWS = 64
UNIT_ALIGN = 16  # a part's units: whole 64-byte lines of float32


def sequence_suits(layer) -> bool:
    """Whether the inference forward takes :func:`forward_sequence`: a few rows, and the
    panel tile (AVX-512) at hand."""
    return layer.batch <= SEQUENCE_ROWS and recurrent_kernels() is not None \
        and jit_cpu.panel_kernels() is not None


def unit_bounds(hidden: int, threads: int) -> list[int]:
    """The hidden units split into one run per thread, each a multiple of UNIT_ALIGN
    long but the last (fewer parts when there are not enough units)."""
    parts = max(1, min(threads, hidden // UNIT_ALIGN))
    cuts = [hidden * p // parts // UNIT_ALIGN * UNIT_ALIGN for p in range(parts)]
    return cuts + [hidden]


def panels_by_part(recurrent, bounds: list[int], gates: int):
    """R' (gates * hidden, hidden) as the sequence kernels read it: for each part (units
    u0..u1), the columns of R'^T of its units of every gate, gate by gate, in panels
    (ops/nn/matmul_cpu.pack_panels); the parts' panels one after another, flat."""
    hidden = recurrent.shape[1]
    by_gate = recurrent.reshape(gates, hidden, hidden)
    return np.concatenate([
        pack_panels(by_gate[:, u0:u1, :].reshape(-1, hidden).T).reshape(-1)
        for u0, u1 in zip(bounds[:-1], bounds[1:])])


def inference(layer, d: int, W, B, constants=None):
    """:func:`forward` without a workspace: (outputs, [final h, final c])."""
    if sequence_suits(layer):
        return forward_sequence(layer, d, W, B, constants)
    return forward(layer, d, W, B, constants=constants)


def forward_sequence(layer, d: int, W, B, constants=None):
    """:func:`forward` without a workspace, every step in one compiled call."""
    hidden, wide = layer.hidden, layer.wide
    steps, batch = layer.steps, layer.batch
    native = jit_cpu.native_pool()
    bounds = unit_bounds(hidden, 1 if native is None else native.workers + 1)
    projected = _projection(layer, W, B, d, constants)
    panels = packed(constants, ("lstm R' by part", d, wide.str, len(bounds)),
                    lambda: panels_by_part(halved(layer.cells[d].r, 3 * hidden, wide),
                                           bounds, 4))
    h, c = layer.start_states(d)
    hs = np.empty((2, batch, hidden), wide)
    hs[0] = h
    c = np.array(c, dtype=wide, order="C", copy=True)
    outputs = np.empty((steps, batch, hidden), wide)
    run_sequence("lstm", native, steps, batch, hidden, (
        projected, panels, np.array(bounds, np.int64), hs, c, outputs,
        np.ascontiguousarray(layer.lengths, dtype=np.int64)))
    return outputs, [hs[steps % 2], c]


def run_sequence(cell: str, native, steps, batch, hidden, arrays, *flag) -> None:
    """ops/rnn/_jit_recurrent.py's ``cell`` sequence over ``arrays`` (projected, panels,
    bounds, then the cell's own; ``flag``: the GRU's reset_after, the RNN's activation
    code), on this thread, or split over ``native``'s threads where the bounds make two
    parts or more."""
    kernels, panel_kernels = recurrent_kernels(), jit_cpu.panel_kernels()
    floats = arrays[0].dtype
    parts, width = arrays[2].size - 1, panel_width(floats)
    tile = (panel_kernels.tile_f if floats == np.float32 else panel_kernels.tile_d).address
    sync = np.zeros(kernels.sync_words(parts), np.int64)
    if parts == 1 or native is None:
        getattr(kernels, f"{cell}_sequence")(0, sync, *(a.reshape(-1) for a in arrays),
                                             steps, batch, hidden, width, tile, *flag)
        return
    words = np.array([steps, batch, hidden, parts, width, tile, int(flag[0]) if flag else 0]
                     + [a.size for a in arrays], np.int64)
    addresses = np.array([a.ctypes.data for a in (words, sync) + tuple(arrays)], np.uint64)
    entry = getattr(kernels, f"{cell}_part_{'f' if floats == np.float32 else 'd'}")
    panel_kernels.native_for(native.block, entry.address, addresses, parts)


def backward(layer, d: int, workspace, dy, d_states):
    """Direction d's steps in reverse from its ``workspace`` (steps, 8, batch, hidden):
    (d projection (steps, batch, 4 hidden), [d initial h, d initial c], dR, dRb). ``dy`` is
    the gradient of its outputs in the order it ran; ``d_states`` that of its final
    states."""
    kernels, hidden, wide = jit_cpu.load(STEPS), layer.hidden, layer.wide
    steps, batch = layer.steps, layer.batch
    recurrent = np.ascontiguousarray(layer.cells[d].r)  # (4 hidden, hidden)
    dy = np.ascontiguousarray(dy, dtype=wide)
    dh, dc = (np.array(s, dtype=wide, order="C", copy=True) for s in d_states)
    carried = np.empty_like(dh)
    d_projected = np.empty((steps, batch, 4 * hidden), wide)
    lengths = np.ascontiguousarray(layer.lengths, dtype=np.int64)
    panels: dict = {}
    for t in reversed(range(steps)):
        kernels.lstm_step_grad(workspace[t].reshape(-1), dh.reshape(-1), dy[t].reshape(-1),
                               dc.reshape(-1), d_projected[t].reshape(-1), lengths, t, batch,
                               hidden)
        dense_product(d_projected[t], recurrent, carried, panels)
        if layer.padded:  # a padded step passes the state's gradient through unchanged
            kernels.hold_rows(carried.reshape(-1), dh.reshape(-1), lengths, t, batch, hidden)
        dh, carried = carried, dh
    # the recurrent weight's gradient: one product over every step, with the h each step
    # started from read out of the workspace
    started_from = workspace[:, 0].reshape(-1, hidden)
    dr = d_projected.reshape(-1, 4 * hidden).T @ started_from
    return d_projected, [dh, dc], dr, d_projected.sum(axis=(0, 1))
