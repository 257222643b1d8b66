"""The recurrent cells as the gradients and the training forward run them: RNN, GRU and LSTM
cells that step forward keeping what each step's backward needs (the states a step started
from, the gate pre-activations) and step backward through it, the layer that runs them over
a sequence in each direction, and the compiled CPU cells that replace the standard LSTM's,
GRU's and RNN's steps (``lstm_cpu.py``, ``gru_cpu.py``, ``rnn_cpu.py``). ``rnn.py``'s
operators and ``rnn_grad.py``'s gradient kernels both run on them.

Activations are differentiated at the clipped pre-activation, times 1 inside ``[-clip, clip]``
and 0 outside (the slope of the clip).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixrt.ops.rnn import gru_cpu, lstm_cpu, recurrence, rnn_cpu
from mixrt.ops.ir.dtypes import accumulation_dtype
from mixrt.ops.ir.types import TensorType


# -- activations and their slopes -----------------------------------------------------------

def _sigmoid_slope(xp, x, alpha, beta):
    s = recurrence._sigmoid(xp, x, alpha, beta)
    return s * (1 - s)


def _hard_sigmoid_slope(xp, x, alpha, beta):
    y = alpha * x + beta
    return xp.where((y > 0) & (y < 1), alpha, 0.0).astype(x.dtype)


# key -> d f(x) / dx, for every activation in recurrence.ACTIVATIONS
SLOPES = {
    "relu": lambda xp, x, a, b: (x > 0).astype(x.dtype),
    "tanh": lambda xp, x, a, b: 1 - xp.tanh(x) ** 2,
    "sigmoid": _sigmoid_slope,
    "affine": lambda xp, x, a, b: xp.full_like(x, a),
    "leakyrelu": lambda xp, x, a, b: xp.where(x >= 0, 1.0, a).astype(x.dtype),
    "thresholdedrelu": lambda xp, x, a, b: (x > a).astype(x.dtype),
    "scaledtanh": lambda xp, x, a, b: a * b * (1 - xp.tanh(b * x) ** 2),
    "hardsigmoid": _hard_sigmoid_slope,
    "elu": lambda xp, x, a, b: xp.where(x >= 0, 1.0, a * xp.exp(xp.minimum(x, 0))),
    "softsign": lambda xp, x, a, b: 1 / (1 + xp.abs(x)) ** 2,
    "softplus": lambda xp, x, a, b: recurrence._sigmoid(xp, x, a, b),
}


SLOPES_OF_VALUES = {"sigmoid": lambda y: y * (1 - y), "tanh": lambda y: 1 - y * y}


class Activation:
    """f(clip(a)) and its derivative with respect to a."""

    def __init__(self, xp, spec, clip):
        self.xp, (self.key, self.alpha, self.beta), self.clip = xp, spec, clip

    def _clipped(self, a):
        return a if self.clip is None else self.xp.clip(a, -self.clip, self.clip)

    def value(self, a):
        activation = recurrence.ACTIVATIONS[self.key][0]
        return activation(self.xp, self._clipped(a), self.alpha, self.beta)

    def slope(self, a, value=None):
        """d value / d a; ``value`` (f at a, when the caller kept it) saves recomputing
        sigmoid and tanh, whose slopes are functions of their values."""
        if value is not None and self.key in SLOPES_OF_VALUES:
            slope = SLOPES_OF_VALUES[self.key](value)
        else:
            slope = SLOPES[self.key](self.xp, self._clipped(a), self.alpha, self.beta)
        if self.clip is None:
            return slope
        return slope * ((a >= -self.clip) & (a <= self.clip))


# -- the cells: forward keeping a cache, backward accumulating weight gradients ---------------
# A cell's cache is a tuple of (batch, hidden) arrays; ``kept(acts, clip, options)`` says
# which entries its backward reads (acts: per direction, the (key, alpha, beta) activation
# specs). A pre-activation is read only for a slope that is not a function of the value
# (sigmoid's and tanh's are) or under ``clip``: the workspace (see forward_keeping_workspace)
# stores only the kept entries.

def _reads_input(acts: list, index: int, clip) -> bool:
    return clip is not None or any(a[index][0] not in SLOPES_OF_VALUES for a in acts)


class RNNCell:
    """H' = f(x_proj + H R^T + Rb)."""

    @staticmethod
    def kept(acts, clip, options):  # cache: h, a, h_new
        return (True, _reads_input(acts, 0, clip), True)

    def __init__(self, xp, r, rb, peepholes, acts, **_):
        self.xp, self.r, self.rb, (self.f,) = xp, r, rb, acts

    def forward(self, x_proj, states):
        (h,) = states
        a = x_proj + h @ self.r.T + self.rb
        h_new = self.f.value(a)
        return [h_new], (h, a, h_new)

    def backward(self, cache, d_new):
        h, a, h_new = cache
        da = d_new[0] * self.f.slope(a, h_new)
        return da, [da @ self.r]

    def weight_grads(self, d_projected, caches):
        return _recurrent_weight_grads(self.xp, d_projected, caches)

    def peephole_grad(self):
        return None


def _recurrent_weight_grads(xp, d_projected, caches):
    """(dR, dRb) when the recurrent product's gradient is the whole projection's (RNN,
    LSTM): one matrix product over all steps instead of one per step. ``caches[t][0]`` is
    the hidden state step t started from; padded steps have zero gradients."""
    gates = d_projected.shape[-1]
    previous = xp.stack([cache[0] for cache in caches])
    dr = d_projected.reshape(-1, gates).T @ previous.reshape(-1, previous.shape[-1])
    return dr, d_projected.sum(axis=(0, 1))


class GRUCell:
    """Gates z (update), r (reset), h (candidate), in that order in R and Rb."""

    @staticmethod
    def kept(acts, clip, options):  # cache: h, a_z, a_r, a_h, z, reset, candidate, recurrent
        gate, candidate = _reads_input(acts, 0, clip), _reads_input(acts, 1, clip)
        return (True, gate, gate, candidate, True, True, True,
                bool(options.get("linear_before_reset")))

    def __init__(self, xp, r, rb, peepholes, acts, *, linear_before_reset=0, **_):
        self.xp, self.linear_before_reset, self.r = xp, linear_before_reset, r
        self.rz, self.rr, self.rh = xp.split(r, 3, axis=0)
        self.bz, self.br, self.bh = xp.split(rb, 3)
        self.gate, self.candidate = acts
        self.dr, self.drb = xp.zeros_like(r), xp.zeros_like(rb)

    def forward(self, x_proj, states):
        (h,) = states
        xz, xr, xh = self.xp.split(x_proj, 3, axis=-1)
        a_z = xz + h @ self.rz.T + self.bz
        a_r = xr + h @ self.rr.T + self.br
        z, reset = self.gate.value(a_z), self.gate.value(a_r)
        if self.linear_before_reset:
            recurrent = h @ self.rh.T + self.bh
            a_h = xh + reset * recurrent
        else:
            recurrent = None
            a_h = xh + (reset * h) @ self.rh.T + self.bh
        candidate = self.candidate.value(a_h)
        return [(1 - z) * candidate + z * h], (h, a_z, a_r, a_h, z, reset, candidate, recurrent)

    def backward(self, cache, d_new):
        h, a_z, a_r, a_h, z, reset, candidate, recurrent = cache
        (dh_new,) = d_new
        dz = dh_new * (h - candidate)
        dh = dh_new * z
        da_h = dh_new * (1 - z) * self.candidate.slope(a_h, candidate)
        hidden = h.shape[1]
        dr_z, dr_r, dr_h = (self.dr[i * hidden:(i + 1) * hidden] for i in range(3))
        db_z, db_r, db_h = (self.drb[i * hidden:(i + 1) * hidden] for i in range(3))
        if self.linear_before_reset:
            d_reset = da_h * recurrent
            d_recurrent = da_h * reset
            dr_h += d_recurrent.T @ h
            db_h += d_recurrent.sum(axis=0)
            dh += d_recurrent @ self.rh
        else:
            d_gated = da_h @ self.rh              # gradient of reset * h
            dr_h += da_h.T @ (reset * h)
            db_h += da_h.sum(axis=0)
            d_reset = d_gated * h
            dh += d_gated * reset
        da_r = d_reset * self.gate.slope(a_r, reset)
        da_z = dz * self.gate.slope(a_z, z)
        for da, dr, db, r in ((da_r, dr_r, db_r, self.rr), (da_z, dr_z, db_z, self.rz)):
            dr += da.T @ h
            db += da.sum(axis=0)
            dh += da @ r
        return self.xp.concatenate([da_z, da_r, da_h], axis=-1), [dh]

    def weight_grads(self, d_projected, caches):
        return self.dr, self.drb  # accumulated step by step: the gates read different inputs

    def peephole_grad(self):
        return None


class LSTMCell:
    """Gates i, o, f, c in that order in R and Rb; peepholes P in order i, o, f."""

    @staticmethod
    def kept(acts, clip, options):
        # cache: h, c, g_i, g_o, g_f, g_c, i, forget, candidate, cell, o, squashed
        gate = _reads_input(acts, 0, clip)
        return (True, True, gate, gate, gate and not options.get("input_forget"),
                _reads_input(acts, 1, clip)) + (True,) * 6

    def __init__(self, xp, r, rb, peepholes, acts, *, input_forget=0, **_):
        self.xp, self.r, self.rb, self.input_forget = xp, r, rb, input_forget
        self.gate, self.cell_input, self.output = acts
        self.peepholes = None if peepholes is None else xp.split(peepholes, 3)
        self.dp = None if peepholes is None else [xp.zeros_like(p) for p in self.peepholes]

    def forward(self, x_proj, states):
        h, c = states
        pre = h @ self.r.T
        pre += x_proj
        pre += self.rb
        g_i, g_o, g_f, g_c = self.xp.split(pre, 4, axis=-1)
        if self.peepholes is None and not self.input_forget:  # i, o, f: one activation call
            i, o, forget = self.xp.split(self.gate.value(pre[:, :3 * c.shape[-1]]), 3, axis=-1)
            candidate = self.cell_input.value(g_c)
            cell = forget * c
            cell += i * candidate
            squashed = self.output.value(cell)
            return [o * squashed, cell], (h, c, g_i, g_o, g_f, g_c, i, forget, candidate, cell,
                                          o, squashed)
        if self.peepholes is not None:
            p_i, p_o, p_f = self.peepholes
            g_i, g_f = g_i + p_i * c, g_f + p_f * c
        i = self.gate.value(g_i)
        forget = 1 - i if self.input_forget else self.gate.value(g_f)
        candidate = self.cell_input.value(g_c)
        cell = forget * c + i * candidate
        if self.peepholes is not None:
            g_o = g_o + p_o * cell
        o = self.gate.value(g_o)
        squashed = self.output.value(cell)
        return [o * squashed, cell], (h, c, g_i, g_o, g_f, g_c, i, forget, candidate, cell, o,
                                      squashed)

    def backward(self, cache, d_new):
        h, c, g_i, g_o, g_f, g_c, i, forget, candidate, cell, o, squashed = cache
        dh_new, dc_new = d_new
        dg_o = dh_new * squashed * self.gate.slope(g_o, o)
        d_cell = dc_new + dh_new * o * self.output.slope(cell, squashed)
        if self.peepholes is not None:
            d_cell = d_cell + dg_o * self.peepholes[1]
        d_forget, dc = d_cell * c, d_cell * forget
        d_i = d_cell * candidate
        dg_c = d_cell * i * self.cell_input.slope(g_c, candidate)
        if self.input_forget:
            d_i = d_i - d_forget
            dg_f = self.xp.zeros_like(d_forget)
        else:
            dg_f = d_forget * self.gate.slope(g_f, forget)
        dg_i = d_i * self.gate.slope(g_i, i)
        if self.peepholes is not None:
            dc = dc + dg_i * self.peepholes[0] + dg_f * self.peepholes[2]
            for dp, dg, state in zip(self.dp, (dg_i, dg_o, dg_f), (c, cell, c)):
                dp += (dg * state).sum(axis=0)
        dg = self.xp.concatenate([dg_i, dg_o, dg_f, dg_c], axis=-1)
        return dg, [dg @ self.r, dc]

    def weight_grads(self, d_projected, caches):
        return _recurrent_weight_grads(self.xp, d_projected, caches)

    def peephole_grad(self):
        return None if self.dp is None else self.xp.concatenate(self.dp)


# -- the shared driver ----------------------------------------------------------------------

def _time_major(a, layout):
    return a if a is None or not layout else a.swapaxes(0, 1)


@dataclass
class _Layer:
    """One recurrent node's inputs, time-major and widened, and per direction its cell."""

    xp: object
    wide: np.dtype
    x: object  # (seq, batch, input)
    lengths: object  # (batch,) int64
    padded: bool  # some sequence is shorter than seq (then steps are masked)
    cells: list
    initials: list  # per state: (directions, batch, hidden) or None
    kept: tuple  # the cache entries the workspace stores
    backwards: list  # per direction
    hidden: int
    gates: int

    @property
    def steps(self) -> int:
        return self.x.shape[0]

    @property
    def batch(self) -> int:
        return self.x.shape[1]

    def order(self):
        """Each sequence reversed within its length, as (time index, batch index)."""
        return (recurrence.reversal_index(self.xp, self.lengths, self.steps),
                self.xp.arange(self.batch))

    def start_states(self, d: int) -> list:
        return [self.xp.zeros((self.batch, self.hidden), dtype=self.wide) if s is None
                else s[d].astype(self.wide) for s in self.initials]

    def running(self, t: int):
        """(batch, 1): whether step t is inside each sequence; None when none is padded."""
        return (t < self.lengths).reshape(-1, 1) if self.padded else None


def _layer(xp, cell_type, defaults, X, W, R, B, sequence_lens, initials, P, *,
           activation_alpha=None, activation_beta=None, activations=None, clip=None,
           direction="forward", hidden_size=None, layout=0, **options) -> _Layer:
    wide = accumulation_dtype(X.dtype)
    x = _time_major(X.astype(wide, copy=False), layout)  # read only, as R is below
    seq_len, batch, _ = x.shape
    num_directions, gates = W.shape[0], W.shape[1]
    lengths = recurrence.step_counts(xp, sequence_lens, batch, seq_len)
    padded = sequence_lens is not None and bool((lengths < seq_len).any())
    acts = recurrence.activation_specs(activations, activation_alpha, activation_beta, defaults,
                                num_directions)
    cells = []
    for d in range(num_directions):
        gates_of_d = [Activation(xp, spec, clip) for spec in acts[d]]
        if cell_type is LSTMCell:  # the output activation is applied to the unclipped cell
            gates_of_d[2] = Activation(xp, acts[d][2], None)
        rb = xp.zeros(gates, dtype=wide) if B is None else B[d, gates:].astype(wide)
        peepholes = None if P is None else P[d].astype(wide)
        cells.append(cell_type(xp, R[d].astype(wide, copy=False), rb, peepholes, gates_of_d,
                               **options))
    return _Layer(xp, wide, x, lengths, padded, cells,
                  [_time_major(s, layout) for s in initials],
                  cell_type.kept(acts, clip, options),
                  [direction == "reverse" or d == 1 for d in range(num_directions)],
                  hidden_size or R.shape[-1], gates)


def _projected(layer: _Layer, W, B, d: int):
    """X W^T + Wb of direction d for every step, in the order the direction runs."""
    projected = recurrence.sequence_product(layer.x, W[d].astype(layer.wide).T)
    if B is not None:
        projected = projected + B[d, :layer.gates].astype(layer.wide)
    return projected[layer.order()] if layer.backwards[d] else projected


def _run_forward(layer: _Layer, d: int, projected):
    """Direction d step by step: each step's cache, the outputs (zeros at padded steps) and
    the final states."""
    xp, cell = layer.xp, layer.cells[d]
    states, caches, ys = layer.start_states(d), [], []
    for t in range(layer.steps):
        new, cache = cell.forward(projected[t], states)
        caches.append(cache)
        running = layer.running(t)
        if running is None:
            states = new
            ys.append(new[0])
        else:
            states = [xp.where(running, n, s) for n, s in zip(new, states)]
            ys.append(xp.where(running, new[0], xp.zeros((), dtype=layer.wide)))
    return caches, ys, states


def _run_backward(layer: _Layer, d: int, caches, dy, d_states):
    """d projection (seq, batch, gates) and the initial states' gradients."""
    xp, cell = layer.xp, layer.cells[d]
    d_projected = xp.empty((len(caches), dy.shape[1], layer.gates), dtype=dy.dtype)
    for t in reversed(range(len(caches))):
        running = layer.running(t)
        if running is None:
            d_new = list(d_states)
            d_new[0] = d_new[0] + dy[t]
            d_projected[t], d_states = cell.backward(caches[t], d_new)
            continue
        d_new = [xp.where(running, ds, 0) for ds in d_states]
        d_new[0] = d_new[0] + xp.where(running, dy[t], 0)
        d_projected[t], d_old = cell.backward(caches[t], d_new)
        d_states = [old + xp.where(running, 0, ds) for old, ds in zip(d_old, d_states)]
    return d_projected, d_states


# -- the training forward: the outputs and a workspace of every step's cache ----------------

def forward_keeping_workspace(xp, cell_type, defaults, X, W, R, B, sequence_lens, initials,
                              P=None, **attributes):
    """(Y, final states..., workspace): the layer's outputs as its ONNX kernel gives them,
    plus (directions, seq, kept entries, batch, hidden) holding each step's cache, so the
    backward kernel reads what it would otherwise compute by running the forward again
    (cuDNN's reserve space). What a training graph runs when the gradient asks for it."""
    layer = _layer(xp, cell_type, defaults, X, W, R, B, sequence_lens, initials, P,
                   **attributes)
    kept = [i for i, keep in enumerate(layer.kept) if keep]
    workspace = xp.empty((len(layer.cells), layer.steps, len(kept), layer.batch,
                          layer.hidden), dtype=layer.wide)
    outputs, finals = [], []
    for d in range(len(layer.cells)):
        compiled = _compiled(cell_type, layer, d)
        if compiled is not None:
            y, states = compiled.forward(layer, d, W, B, workspace[d])
        else:
            caches, ys, states = _run_forward(layer, d, _projected(layer, W, B, d))
            for t, cache in enumerate(caches):
                for slot, entry in enumerate(kept):
                    workspace[d, t, slot] = cache[entry]
            y = recurrence.stacked_steps(xp, ys, layer.batch, layer.hidden, layer.wide)
        outputs.append(y[layer.order()] if layer.backwards[d] else y)
        finals.append(states)
    return (*recurrence.layer_outputs(xp, outputs, finals, layer.lengths, attributes.get("layout"),
                               X.dtype), workspace)


def compiled_forward(xp, cell_type, X, W, R, B, sequence_lens, initials, prepacked=None,
                     **attributes):
    """(Y, final states...) of a recurrent node through ops/rnn/lstm_cpu.py, ops/rnn/gru_cpu.py or
    ops/rnn/rnn_cpu.py when every direction suits it (the inference forward: no workspace
    kept), else None. ``prepacked``: the node's dict where its weight is a session
    constant."""
    layer = _layer(xp, cell_type, CELLS_BY_TYPE[cell_type], X, W, R, B, sequence_lens,
                   initials, None, **attributes)
    directions = range(len(layer.cells))
    module = INFERENCE.get(cell_type)
    if module is None or not all(module.suits(layer, d) for d in directions):
        return None
    outputs, finals = [], []
    constants = lstm_cpu.constant_weights(prepacked, B)
    for d in directions:
        y, states = module.inference(layer, d, W, B, constants)
        outputs.append(y[layer.order()] if layer.backwards[d] else y)
        finals.append(states)
    return recurrence.layer_outputs(xp, outputs, finals, layer.lengths, attributes.get("layout"),
                             X.dtype)


def _compiled(cell_type, layer: _Layer, d: int):
    """ops/rnn/lstm_cpu.py or ops/rnn/gru_cpu.py where direction d is its standard cell, else
    None."""
    module = COMPILED.get(cell_type)
    return module if module is not None and module.suits(layer, d) else None


def _compiled_workspace(module, layer: _Layer, d: int, W, B):
    """Direction d's step caches, made by running its forward again (no workspace came)."""
    steps = np.empty((layer.steps, module.entries(layer, d), layer.batch, layer.hidden),
                     layer.wide)
    module.forward(layer, d, W, B, steps)
    return steps


def _caches_from(layer: _Layer, workspace, d: int) -> list:
    """Direction d's step caches out of the workspace (views), None where not kept."""
    caches = []
    for t in range(layer.steps):
        stored = iter(workspace[d, t])
        caches.append(tuple(next(stored) if keep else None for keep in layer.kept))
    return caches


def workspace_type(cell_type, defaults, X: TensorType, W: TensorType, R: TensorType, *,
                   activation_alpha=None, activation_beta=None, activations=None, clip=None,
                   direction="forward", hidden_size=None, layout=0, **options) -> TensorType:
    """The workspace output's type (forward_keeping_workspace)."""
    directions = 2 if direction == "bidirectional" else 1
    acts = recurrence.activation_specs(activations, activation_alpha, activation_beta, defaults,
                                directions)
    entries = sum(cell_type.kept(acts, clip, options))
    hidden = hidden_size or (None if R.shape is None else R.shape[-1])
    if X.shape is None:
        return TensorType(accumulation_dtype(X.dtype), None)
    seq, batch = (X.shape[1], X.shape[0]) if layout else X.shape[:2]
    return TensorType(accumulation_dtype(X.dtype), (directions, seq, entries, batch, hidden))


# -- the backward ---------------------------------------------------------------------------

def recurrent_backward(xp, cell_type, defaults, d_outputs, X, W, R, B, sequence_lens,
                       initials, P=None, workspace=None, **attributes):
    """(dX, dW, dR, dB, d initial state..., dP) of one recurrent layer. ``d_outputs`` are the
    gradients of (Y, final state...), None for an output nobody used. Without the forward's
    ``workspace`` the forward runs again here, keeping its caches."""
    layer = _layer(xp, cell_type, defaults, X, W, R, B, sequence_lens, initials, P,
                   **attributes)
    wide, x, layout = layer.wide, layer.x, attributes.get("layout", 0)
    num_directions, gates = len(layer.cells), layer.gates
    seq_len, batch, hidden = layer.steps, layer.batch, layer.hidden
    dY = (xp.zeros((seq_len, num_directions, batch, hidden), dtype=wide)
          if d_outputs[0] is None else d_outputs[0].astype(wide))
    if layout:
        dY = dY.transpose(1, 2, 0, 3)
    d_finals = [_time_major(None if g is None else g.astype(wide), layout)
                for g in d_outputs[1:]]
    started = (layer.lengths > 0).reshape(-1, 1)  # a length-0 sequence's finals are zeros

    dX = xp.zeros_like(x)
    dW, dR = xp.zeros(W.shape, dtype=wide), xp.zeros(R.shape, dtype=wide)
    dB = xp.zeros((num_directions, 2 * gates), dtype=wide)
    d_initials = [xp.zeros((num_directions, batch, hidden), dtype=wide)
                  for _ in layer.initials]
    dP = None if P is None else xp.zeros(P.shape, dtype=wide)
    for d, cell in enumerate(layer.cells):
        dy = dY[:, d]
        if layer.backwards[d]:
            dy = dy[layer.order()]
        d_states = [xp.zeros((batch, hidden), dtype=wide) if g is None
                    else xp.where(started, g[d], 0) for g in d_finals]
        compiled = _compiled(cell_type, layer, d)
        if compiled is not None:
            steps = workspace[d] if workspace is not None \
                else _compiled_workspace(compiled, layer, d, W, B)
            d_projected, d_states, dR[d], dB[d, gates:] = compiled.backward(
                layer, d, steps, dy, d_states)
        else:
            caches = _run_forward(layer, d, _projected(layer, W, B, d))[0] \
                if workspace is None else _caches_from(layer, workspace, d)
            d_projected, d_states = _run_backward(layer, d, caches, dy, d_states)
            dR[d], dB[d, gates:] = cell.weight_grads(d_projected, caches)
        if layer.backwards[d]:
            d_projected = d_projected[layer.order()]
        w = W[d].astype(wide)
        dX += recurrence.sequence_product(d_projected, w)
        dW[d] = d_projected.reshape(-1, gates).T @ x.reshape(-1, x.shape[-1])
        dB[d, :gates] = d_projected.sum(axis=(0, 1))
        for d_initial, d_state in zip(d_initials, d_states):
            d_initial[d] = d_state
        if dP is not None:
            dP[d] = cell.peephole_grad()
    dX = _time_major(dX, layout)
    d_initials = [_time_major(g, layout) for g in d_initials]
    likes = [X, W, R, B, *initials, P]
    grads = [dX, dW, dR, dB, *d_initials] + ([] if dP is None else [dP])
    return tuple(g.astype(like.dtype if like is not None else X.dtype, copy=False)
                 for g, like in zip(grads, likes))


# -- the kernels ----------------------------------------------------------------------------
# Every input is optional: an output nobody used has no gradient (None), and X, W and R,
# always present, follow them. The last input is the forward's workspace.

ATTRIBUTES = ("activation_alpha", "activation_beta", "activations", "clip", "direction",
              "hidden_size", "layout")
# op -> (cell, default activations, states)
CELLS = {"RNN": (RNNCell, ["Tanh"], 1), "GRU": (GRUCell, ["Sigmoid", "Tanh"], 1),
         "LSTM": (LSTMCell, ["Sigmoid", "Tanh", "Tanh"], 2)}
CELLS_BY_TYPE = {cell: defaults for cell, defaults, _ in CELLS.values()}
# the cells whose standard form runs compiled steps on the CPU
COMPILED = {LSTMCell: lstm_cpu, GRUCell: gru_cpu}
# ... and those whose inference forward does (the RNN's only there: a few rows)
INFERENCE = {**COMPILED, RNNCell: rnn_cpu}
