"""A standard LSTM's and GRU's step arithmetic (``ops/rnn/lstm_cpu.py``, ``ops/rnn/gru_cpu.py``):
the gates, the new states and a step's backward from its cache, each one compiled pass
where NumPy took ~15 small calls a step and their temporaries. Arrays are flat and indexed
with unsigned offsets (see ``ops/compiled/jit_cpu.py``).
"""

from __future__ import annotations

from numba import njit, uint64

_jit = njit(nogil=True, cache=True, boundscheck=False)


# -- a standard LSTM's steps (ops/rnn/lstm_cpu.py) -----------------------------------------------
# A step's cache ``block`` is (8, batch, hidden), flat: the states it started from (h, c),
# then i, forget, candidate, cell, o and tanh(cell), the entries ops/rnn/rnn_grad.py's workspace
# keeps for sigmoid and tanh gates. Plain float arithmetic in the array's own dtype, in the
# order ops/rnn/rnn.py and ops/rnn/rnn_grad.py's NumPy expressions take, so both give the same
# numbers from the same gates. Sequence n runs at step t while t < lengths[n]; past its
# length (padding) its states hold, its output is zero and its step passes no gradient.

@_jit
def lstm_step(gates, h, c, block, batch, hidden):
    """One step after NumPy's tanh over its gates: ``gates`` (batch, 4 hidden), flat, holds
    tanh(pre / 2) for i, o and f (a sigmoid is tanh(x / 2) / 2 + 1 / 2, as ops/rnn/rnn.py takes
    it) and tanh(pre) for the candidate; ``h``, ``c`` (batch, hidden), flat, are the states
    the step starts from. Writes ``block``'s first seven entries; the caller's tanh makes the
    eighth, and :func:`lstm_output` the new states."""
    half = gates.dtype.type(0.5)
    size = batch * hidden
    for n in range(batch):
        row = n * 4 * hidden
        for k in range(hidden):
            s = uint64(n * hidden + k)
            i = gates[uint64(row + k)] * half + half
            o = gates[uint64(row + hidden + k)] * half + half
            forget = gates[uint64(row + 2 * hidden + k)] * half + half
            candidate = gates[uint64(row + 3 * hidden + k)]
            old = c[s]
            cell = forget * old
            cell += i * candidate
            block[s] = h[s]
            block[uint64(size) + s] = old
            block[uint64(2 * size) + s] = i
            block[uint64(3 * size) + s] = forget
            block[uint64(4 * size) + s] = candidate
            block[uint64(5 * size) + s] = cell
            block[uint64(6 * size) + s] = o


@_jit
def lstm_output(block, h, c, out, lengths, t, batch, hidden):
    """Step t's output o tanh(cell) into ``out`` and, for the sequences still running, into
    the states ``h`` and ``c`` (the cell from the block); zeros for the others. All flat."""
    size = batch * hidden
    zero = block.dtype.type(0)
    for n in range(batch):
        running = t < lengths[n]
        for k in range(hidden):
            s = uint64(n * hidden + k)
            if running:
                y = block[uint64(6 * size) + s] * block[uint64(7 * size) + s]
                out[s] = y
                h[s] = y
                c[s] = block[uint64(5 * size) + s]
            else:
                out[s] = zero


@_jit
def lstm_step_grad(block, dh, dy, dc, d_gates, lengths, t, batch, hidden):
    """Step t backward from its cache ``block``: ``dh`` + ``dy`` is the gradient of the h
    it made, ``dc`` that of its cell (overwritten with the gradient of the cell it started
    from); writes the gradient of its pre-activations into ``d_gates`` (batch, 4 hidden).
    A sequence past its length gets zeros there and keeps its ``dc``. All flat. The slopes
    are functions of the values: s (1 - s), 1 - t t."""
    one, zero = block.dtype.type(1), block.dtype.type(0)
    size = batch * hidden
    for n in range(batch):
        row = n * 4 * hidden
        if t >= lengths[n]:
            for j in range(4 * hidden):
                d_gates[uint64(row + j)] = zero
            continue
        for k in range(hidden):
            s = uint64(n * hidden + k)
            old = block[uint64(size) + s]
            i = block[uint64(2 * size) + s]
            forget = block[uint64(3 * size) + s]
            candidate = block[uint64(4 * size) + s]
            o = block[uint64(6 * size) + s]
            squashed = block[uint64(7 * size) + s]
            d_h = dh[s] + dy[s]
            d_cell = dc[s] + d_h * o * (one - squashed * squashed)
            d_gates[uint64(row + k)] = d_cell * candidate * (i * (one - i))
            d_gates[uint64(row + hidden + k)] = d_h * squashed * (o * (one - o))
            d_gates[uint64(row + 2 * hidden + k)] = d_cell * old * (forget * (one - forget))
            d_gates[uint64(row + 3 * hidden + k)] = d_cell * i * (one - candidate * candidate)
            dc[s] = d_cell * forget


@_jit
def hold_rows(carried, dh, lengths, t, batch, hidden):
    """``carried``'s rows of the sequences past their length at step t take ``dh``'s: the
    state's gradient passes a padded step unchanged. Flat (batch, hidden)."""
    for n in range(batch):
        if t >= lengths[n]:
            for k in range(hidden):
                carried[uint64(n * hidden + k)] = dh[uint64(n * hidden + k)]


# -- a standard GRU's steps, reset after the recurrent product (ops/rnn/gru_cpu.py) --------------
# A step's cache ``block`` is (5, batch, hidden), flat: the h it started from, z, reset, the
# candidate and the recurrent term R_h h + Rb_h, the entries ops/rnn/rnn_grad.py's workspace
# keeps for sigmoid and tanh gates with linear_before_reset. ``recurrent`` (batch, 3 hidden)
# is h R'^T: z's and r's columns halved, the candidate's not. Padding as for the LSTM.

@_jit
def gru_gates(recurrent, projected, bias_h, gates, block, batch, hidden):
    """Before the sigmoids: ``gates`` (batch, 2 hidden) = the halved z and r pre-activations,
    and the step's recurrent term (block entry 4) = R_h h + ``bias_h``. All flat."""
    size = batch * hidden
    for n in range(batch):
        row, two = n * 3 * hidden, n * 2 * hidden
        for k in range(hidden):
            gates[uint64(two + k)] = projected[uint64(row + k)] + recurrent[uint64(row + k)]
            gates[uint64(two + hidden + k)] = (projected[uint64(row + hidden + k)]
                                               + recurrent[uint64(row + hidden + k)])
            block[uint64(4 * size + n * hidden + k)] = (recurrent[uint64(row + 2 * hidden + k)]
                                                        + bias_h[k])


@_jit
def gru_candidate(gates, projected, h, block, pre, batch, hidden):
    """After NumPy's tanh over ``gates`` (tanh of half the z and r pre-activations): z and
    reset, and the candidate's pre-activation ``pre`` (batch, hidden) = x_h + reset times
    the recurrent term. Writes block entries h, z and reset. All flat."""
    half = gates.dtype.type(0.5)
    size = batch * hidden
    for n in range(batch):
        two, row = n * 2 * hidden, n * 3 * hidden
        for k in range(hidden):
            s = uint64(n * hidden + k)
            reset = _gru_sigmoids(gates, h, block, s, two + k, hidden, size, half)
            pre[s] = projected[uint64(row + 2 * hidden + k)] + reset * block[uint64(4 * size) + s]


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _gru_sigmoids(gates, h, block, s, at, hidden, size, half):
    """z and reset of element ``s`` (its z at ``at`` in the flat (batch, 2 hidden)
    ``gates``, tanh of half the pre-activations) into the block with h; returns reset."""
    z = gates[uint64(at)] * half + half
    reset = gates[uint64(at + hidden)] * half + half
    block[s] = h[s]
    block[uint64(size) + s] = z
    block[uint64(2 * size) + s] = reset
    return reset


@_jit
def gru_output(block, h, out, lengths, t, batch, hidden):
    """Step t's new h = (1 - z) candidate + z h (the candidate, block entry 3, made by the
    caller's tanh) into ``out`` and the state ``h`` for the sequences still running; zeros
    into ``out`` for the others, whose ``h`` holds. All flat."""
    one, zero = block.dtype.type(1), block.dtype.type(0)
    size = batch * hidden
    for n in range(batch):
        running = t < lengths[n]
        for k in range(hidden):
            s = uint64(n * hidden + k)
            if running:
                z = block[uint64(size) + s]
                y = (one - z) * block[uint64(3 * size) + s] + z * block[s]
                out[s] = y
                h[s] = y
            else:
                out[s] = zero


@_jit
def gru_step_grad(block, dh, dy, d_gates, d_recurrent, carried, lengths, t, batch, hidden):
    """Step t backward from its cache: ``dh`` + ``dy`` is the gradient of the h it made.
    Writes the gradient of its three pre-activations into ``d_gates`` (batch, 3 hidden),
    that of h R^T + Rb into ``d_recurrent`` (batch, 3 hidden), and into ``carried`` the
    part of the old h's gradient that does not pass through R (dh z). A sequence past its
    length gets zeros in both and carries ``dh`` unchanged. All flat."""
    one, zero = block.dtype.type(1), block.dtype.type(0)
    size = batch * hidden
    for n in range(batch):
        row = n * 3 * hidden
        if t >= lengths[n]:
            for j in range(3 * hidden):
                d_gates[uint64(row + j)] = zero
                d_recurrent[uint64(row + j)] = zero
            for k in range(hidden):
                carried[uint64(n * hidden + k)] = dh[uint64(n * hidden + k)]
            continue
        for k in range(hidden):
            s = uint64(n * hidden + k)
            h = block[s]
            z = block[uint64(size) + s]
            reset = block[uint64(2 * size) + s]
            candidate = block[uint64(3 * size) + s]
            recurrent = block[uint64(4 * size) + s]
            d_h = dh[s] + dy[s]
            dz = d_h * (h - candidate)
            da_h = d_h * (one - z) * (one - candidate * candidate)
            da_z = dz * (z * (one - z))
            da_r = da_h * recurrent * (reset * (one - reset))
            d_gates[uint64(row + k)] = da_z
            d_gates[uint64(row + hidden + k)] = da_r
            d_gates[uint64(row + 2 * hidden + k)] = da_h
            d_recurrent[uint64(row + k)] = da_z
            d_recurrent[uint64(row + hidden + k)] = da_r
            d_recurrent[uint64(row + 2 * hidden + k)] = da_h * reset
            carried[s] = d_h * z


# -- a standard GRU's steps, reset before the recurrent product (ops/rnn/gru_cpu.py) -------------
# The cache ``block`` is (4, batch, hidden), flat: the h the step started from, z, reset and
# the candidate (the entries ops/rnn/rnn_grad.py's workspace keeps without linear_before_reset).

@_jit
def gru_reset(gates, h, block, gated, batch, hidden):
    """After NumPy's tanh over ``gates`` (batch, 2 hidden: tanh of half the z and r
    pre-activations): z and reset into the block (with h), and ``gated`` = reset h, the
    candidate's recurrent product's operand. All flat."""
    half = gates.dtype.type(0.5)
    size = batch * hidden
    for n in range(batch):
        two = n * 2 * hidden
        for k in range(hidden):
            s = uint64(n * hidden + k)
            gated[s] = _gru_sigmoids(gates, h, block, s, two + k, hidden, size, half) * h[s]


@_jit
def gru_reset_grad_candidate(block, dh, dy, d_gates, da_h, dz, carried, lengths, t, batch,
                             hidden):
    """Step t backward, first part: the candidate's pre-activation gradient into ``da_h``
    (batch, hidden) and the last third of ``d_gates`` (batch, 3 hidden), z's output-side
    gradient into ``dz``, and dh z into ``carried``. A sequence past its length gets zeros
    and carries ``dh`` unchanged. All flat."""
    one, zero = block.dtype.type(1), block.dtype.type(0)
    size = batch * hidden
    for n in range(batch):
        row = n * 3 * hidden
        running = t < lengths[n]
        for k in range(hidden):
            s = uint64(n * hidden + k)
            if not running:
                d_gates[uint64(row + 2 * hidden + k)] = zero
                da_h[s] = zero
                dz[s] = zero
                carried[s] = dh[s]
                continue
            h = block[s]
            z = block[uint64(size) + s]
            candidate = block[uint64(3 * size) + s]
            d_h = dh[s] + dy[s]
            d = d_h * (one - z) * (one - candidate * candidate)
            d_gates[uint64(row + 2 * hidden + k)] = d
            da_h[s] = d
            dz[s] = d_h * (h - candidate)
            carried[s] = d_h * z


@_jit
def gru_reset_grad_gates(block, d_gated, dz, d_gates, d_zr, carried, batch, hidden):
    """Step t backward, second part, from ``d_gated`` = da_h R_h (the gradient of reset h):
    z's and r's pre-activation gradients into the first two thirds of ``d_gates`` and into
    ``d_zr`` (batch, 2 hidden), and d_gated reset added to ``carried``. All flat."""
    one = block.dtype.type(1)
    size = batch * hidden
    for n in range(batch):
        row, two = n * 3 * hidden, n * 2 * hidden
        for k in range(hidden):
            s = uint64(n * hidden + k)
            h = block[s]
            z = block[uint64(size) + s]
            reset = block[uint64(2 * size) + s]
            g = d_gated[s]
            da_r = g * h * (reset * (one - reset))
            da_z = dz[s] * (z * (one - z))
            carried[s] += g * reset
            d_gates[uint64(row + k)] = da_z
            d_gates[uint64(row + hidden + k)] = da_r
            d_zr[uint64(two + k)] = da_z
            d_zr[uint64(two + hidden + k)] = da_r
