"""A recurrent layer's whole sequence in one compiled call, split between the native workers.

With a service's few rows (batch 1-8) an LSTM step is a matrix-vector product, 256 x 1024
for hidden 256: 1 MB of float32 weight read per step, ~11 us from one core's L2,
~25 us a step with the six calls from Python that ops/rnn/lstm_cpu.py makes around it. Here
one call runs every step (:func:`lstm_sequence`, :func:`gru_sequence`, :func:`rnn_sequence`;
inference up to ops/rnn/lstm_cpu.SEQUENCE_ROWS rows, 8 at a time through the tile), and the
hidden units are split into one part per thread: a part's rows of the recurrent weight are
packed together (ops/rnn/lstm_cpu.py), so each thread reads only its own share, which stays in
its core's L2 from step to step. A step's parts meet at a barrier (every part reads all of
h), one counter in the shared ``sync`` words.

The threads are the native pool's (ops/panels/_jit_panels.py): the caller hands ``parts`` parts to
``lstm_part_f`` (or ``_d``, ``gru_part_*``, ``rnn_part_*``) through ``native_for``. A part
is a thread's preferred share, not a promise: a part's steps are claimed one at a time, and
a thread takes the steps of any part whose thread has not arrived yet (asleep, busy with
another caller, or never coming: ``native_for`` then runs the parts one after another on
the caller). So nobody waits for a thread that is not there, and once both are in, each
keeps to its own share.

``sync`` (int64), one 64-byte line per word: for each part p, PRESENT (its thread has
arrived) and CLAIMED (how many of its steps are taken); then DONE, parts finished in all.
Step s may start once DONE reaches s * parts (the GRU with its reset before the product
counts two phases a step).

The gate functions are computed in float64 by :func:`tanh`, written so that LLVM vectorizes
it (numba's math.tanh calls libm once per element, ~16 ns; this one ~0.6 ns in a loop). Its
error against NumPy's: at most 3 ulp in float64, and float32 results correctly rounded over
16M samples (tests/ops/test_recurrent_sequence.py allows 1 ulp).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import carray, njit, types, uint64
from numba.extending import intrinsic

from mixrt.ops.compiled.first_use import first_use_cfunc
from mixrt.ops.panels._jit_atomics import address, compare_swap, fetch_add, load, pause
from mixrt.ops.panels._jit_atomics import void_pointer_like as _pointer_like

_jit = njit(nogil=True, cache=True, boundscheck=False, error_model="numpy",
            fastmath={"contract"})

LINE = 8  # int64 words per 64-byte line


@_jit
def sync_words(parts):
    """The size of the ``sync`` array for ``parts`` parts."""
    return (2 * parts + 1) * LINE


# -- tanh ------------------------------------------------------------------------------------
#
# tanh|x| = -m / (2 + m) with m = expm1(-2|x|), which keeps its relative precision near 0.
# expm1(z) for z = n ln2 + r (|r| <= ln2 / 2) is 2^n expm1(r) + (2^n - 1), expm1(r) by its
# Taylor series to r^13 (error below 2e-17 relative), 2^n built from its bits. |x| is held
# at 20, where tanh is 1 in float64; a NaN passes through every step.

LOG2E = 1.4426950408889634
LN2_HIGH, LN2_LOW = 6.93147180369123816490e-01, 1.90821492927058770002e-10
(E1, E2, E3, E4, E5, E6, E7, E8, E9, E10, E11, E12, E13) = \
    (1.0 / math.factorial(k) for k in range(1, 14))


@intrinsic
def _bits_as_float64(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@njit(inline="always", error_model="numpy", fastmath={"contract"})
def tanh(x):
    """tanh of the float64 ``x``; vectorizes inside a loop."""
    a = abs(x)
    if a > 20.0:  # written so that a NaN is kept
        a = 20.0
    z = -2.0 * a
    n = np.int64(z * LOG2E - 0.5)  # round to nearest: z <= 0
    whole = np.float64(n)
    r = (z - whole * LN2_HIGH) - whole * LN2_LOW
    series = r * (E1 + r * (E2 + r * (E3 + r * (E4 + r * (E5 + r * (E6 + r * (E7 + r * (
        E8 + r * (E9 + r * (E10 + r * (E11 + r * (E12 + r * E13))))))))))))
    power = _bits_as_float64((n + 1023) << 52)
    m = power * series + (power - 1.0)
    return math.copysign(-m / (2.0 + m), x)


@_jit
def tanh_into(x, y):
    """y = tanh(x), flat arrays (for the tests)."""
    for i in range(x.size):
        y[uint64(i)] = tanh(np.float64(x[uint64(i)]))


# -- the barrier -----------------------------------------------------------------------------

@_jit
def _claim(sync, part, step) -> bool:
    """Takes ``part``'s step ``step`` if nobody has."""
    return compare_swap(sync, (2 * part + 1) * LINE, step, step + 1)


@_jit
def _wait_for_step(sync, step, parts):
    done = (2 * parts) * LINE
    while load(sync, done) < step * parts:
        pause()


@_jit
def _finished(sync, parts):
    fetch_add(sync, (2 * parts) * LINE, 1)


@_jit
def _arrive(sync, part, parts) -> int:
    """Marks ``part``'s thread present; the first phase it may still find work in."""
    fetch_add(sync, 2 * part * LINE, 1)
    return load(sync, 2 * parts * LINE) // parts


@_jit
def _takes(sync, part, offset, parts, phase) -> bool:
    """Whether the thread preferring ``part`` runs part (part + offset) % parts of
    ``phase``: its own unless taken, another only while that part's thread is absent."""
    other = (part + offset) % parts
    return (offset == 0 or load(sync, 2 * other * LINE) == 0) and _claim(sync, other, phase)


@_jit
def _accumulator(bounds, gates, width, batch, like):
    """Room for one part's product: ``batch`` rows of its widest part's columns."""
    widest = 0
    for p in range(bounds.size - 1):
        widest = max(widest, part_columns(bounds[p + 1] - bounds[p], gates, width))
    return np.empty(batch * widest, like.dtype)


# -- the product -----------------------------------------------------------------------------
#
# A step's product is the packed-panel tile of ops/panels/_jit_panels.py (8 rows at a time), called
# through its C entry's address ``tile``: 256 x 1024 at 1 / 8 rows took 13 / 23 us on one
# thread, against 17 / 80 with the product written as loops here.

@intrinsic
def _call_tile(typingctx, tile, rows, a, a_offset, lda, panels, panel_offset, ldw, c,
               c_offset, ldc, k_len):
    """Calls the tile entry (ops/panels/_jit_panels.TILE_SIGNATURE) at address ``tile``."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        function = ir.FunctionType(ir.VoidType(), [i64] * 11)
        builder.call(builder.inttoptr(args[0], function.as_pointer()), list(args[1:]))
        return context.get_dummy_value()
    return types.void(*([types.int64] * 12)), codegen


@_jit
def part_columns(units, gates, width):
    """The columns of a part of ``units`` units: its gates' units, in whole panels."""
    return (gates * units + width - 1) // width * width


@_jit
def _product(tile, hs, h_at, panels, panel_at, acc, batch, hidden, columns, width):
    """acc (batch, columns) = h (batch, hidden, at ``h_at`` in ``hs``) @ the part's
    panels (columns / width of (hidden, width), from ``panel_at``)."""
    a, p, c = address(hs), address(panels), address(acc)
    for b0 in range(0, batch, 8):
        rows = min(8, batch - b0)
        for i in range(columns // width):
            _call_tile(tile, rows, a, h_at + b0 * hidden, hidden, p,
                       panel_at + i * hidden * width, width, c, b0 * columns + i * width,
                       columns, hidden)


# -- LSTM ------------------------------------------------------------------------------------

@_jit
def lstm_sequence(part, sync, projected, panels, bounds, hs, c, out, lengths, steps, batch,
                  hidden, width, tile):
    """The steps of an LSTM direction, this thread preferring part ``part``.

    ``projected`` (steps, batch, 4 hidden): X W'^T + bias' per step in the order the
    direction runs (' : the i, o and f gates halved, see ops/rnn/lstm_cpu.py); ``panels``: R'^T
    by part, part p's units of the four gates (:func:`part_columns`) as panels of ``width``
    columns over ``hidden`` rows, the parts one after another; ``hs`` (2, batch, hidden): h
    (the initial one in [0]) and room for the next; ``c`` (batch, hidden) in place; ``out``
    (steps, batch, hidden); ``lengths`` (batch,). All flat. h ends in ``hs[steps % 2]``."""
    parts = bounds.size - 1
    acc = _accumulator(bounds, 4, width, batch, projected)
    for step in range(_arrive(sync, part, parts), steps):
        _wait_for_step(sync, step, parts)
        for offset in range(parts):  # its own part, then those whose thread is not here
            if _takes(sync, part, offset, parts, step):
                _lstm_part(step, (part + offset) % parts, projected, panels, bounds, hs, c,
                           out, lengths, batch, hidden, width, tile, acc)
                _finished(sync, parts)


@_jit
def _lstm_part(step, part, projected, panels, bounds, hs, c, out, lengths, batch, hidden,
               width, tile, acc):
    """Units bounds[part]..bounds[part + 1] of every row at ``step``."""
    u0, w = bounds[part], bounds[part + 1] - bounds[part]
    columns = part_columns(w, 4, width)
    panel_at = _panel_start(bounds, part, 4, width, hidden)
    h_in, h_out = (step % 2) * batch * hidden, ((step + 1) % 2) * batch * hidden
    _product(tile, hs, h_in, panels, panel_at, acc, batch, hidden, columns, width)
    for b in range(batch):
        at = b * hidden + u0
        written = (step * batch + b) * hidden + u0
        if step < lengths[b]:
            _lstm_units(acc, b * columns, projected, (step * batch + b) * 4 * hidden + u0,
                        hidden, w, c, at, hs, h_out + at, out, written)
        else:  # past the sequence's end: its states hold and its output is zero
            _hold(hs, h_in + at, h_out + at, out, written, w)


@_jit
def _hold(hs, h_at, h_to, out, written, w):
    """A padded step of one row's ``w`` units: h carried over, the output zero."""
    for j in range(w):
        hs[uint64(h_to + j)] = hs[uint64(h_at + j)]
        out[uint64(written + j)] = 0.0


@_jit
def _lstm_units(acc, base, projected, source, hidden, w, c, at, hs, h_at, out, written):
    """i, o, f (sigmoids of halved inputs) and the candidate, the new cell and h."""
    for j in range(w):
        i = 0.5 + 0.5 * tanh(np.float64(acc[uint64(base + j)] +
                                        projected[uint64(source + j)]))
        o = 0.5 + 0.5 * tanh(np.float64(acc[uint64(base + w + j)] +
                                        projected[uint64(source + hidden + j)]))
        f = 0.5 + 0.5 * tanh(np.float64(acc[uint64(base + 2 * w + j)] +
                                        projected[uint64(source + 2 * hidden + j)]))
        candidate = tanh(np.float64(acc[uint64(base + 3 * w + j)] +
                                    projected[uint64(source + 3 * hidden + j)]))
        cell = f * c[uint64(at + j)] + i * candidate
        c[uint64(at + j)] = cell
        h = o * tanh(cell)
        hs[uint64(h_at + j)] = h
        out[uint64(written + j)] = h


# -- GRU -------------------------------------------------------------------------------------
#
# With the reset after the product (``linear_before_reset``, PyTorch's form) a step is one
# product of h with the part's z, r and candidate rows, as an LSTM's. With the reset before
# it, the candidate's product reads reset * h of every unit, so a step has two phases, each
# ending at the barrier: z, r and ``gated`` = r h from h's product with the z and r rows;
# then the candidate from ``gated``'s product with its rows, and h. z waits in ``zs``
# between them (another thread may take the second phase). The barrier counts phases.

@_jit
def gru_sequence(part, sync, projected, panels, bounds, hs, out, lengths, bias_h,
                 candidate_panels, gated, zs, steps, batch, hidden, width, tile, reset_after):
    """The steps of a GRU direction, this thread preferring part ``part``. ``projected``
    (steps, batch, 3 hidden): X W'^T + bias' (ops/rnn/gru_cpu.py: z's and r's halved); with
    ``reset_after``, ``panels`` hold each part's z, r and candidate units of R'^T and
    ``bias_h`` is Rb_h (hidden,); else ``panels`` hold the z and r units and
    ``candidate_panels`` the candidate's, and ``gated``, ``zs`` (batch, hidden) are shared
    room. ``hs``, ``out``, ``lengths`` as for :func:`lstm_sequence`."""
    parts = bounds.size - 1
    phases = 1 if reset_after else 2
    acc = _accumulator(bounds, 3, width, batch, projected)
    for phase in range(_arrive(sync, part, parts), steps * phases):
        _wait_for_step(sync, phase, parts)
        for offset in range(parts):
            if _takes(sync, part, offset, parts, phase):
                _gru_part(phase // phases, phase % phases, reset_after, (part + offset) % parts,
                          projected, panels, bounds, hs, out, lengths, bias_h,
                          candidate_panels, gated, zs, batch, hidden, width, tile, acc)
                _finished(sync, parts)


@_jit
def _panel_start(bounds, part, gates, width, hidden):
    """Where part ``part``'s panels start among all parts' (``gates`` gates each)."""
    at = 0
    for p in range(part):
        at += part_columns(bounds[p + 1] - bounds[p], gates, width) * hidden
    return at


@_jit
def _gru_part(step, phase, reset_after, part, projected, panels, bounds, hs, out, lengths,
              bias_h, candidate_panels, gated, zs, batch, hidden, width, tile, acc):
    u0, w = bounds[part], bounds[part + 1] - bounds[part]
    h_in, h_out = (step % 2) * batch * hidden, ((step + 1) % 2) * batch * hidden
    if reset_after:
        columns = part_columns(w, 3, width)
        _product(tile, hs, h_in, panels, _panel_start(bounds, part, 3, width, hidden), acc,
                 batch, hidden, columns, width)
    elif phase == 0:
        columns = part_columns(w, 2, width)
        _product(tile, hs, h_in, panels, _panel_start(bounds, part, 2, width, hidden), acc,
                 batch, hidden, columns, width)
    else:
        columns = part_columns(w, 1, width)
        _product(tile, gated, 0, candidate_panels,
                 _panel_start(bounds, part, 1, width, hidden), acc, batch, hidden, columns,
                 width)
    for b in range(batch):
        at = b * hidden + u0
        source = (step * batch + b) * 3 * hidden + u0
        written = (step * batch + b) * hidden + u0
        if step >= lengths[b]:  # past the sequence's end: h holds, the output is zero
            if reset_after or phase == 1:
                _hold(hs, h_in + at, h_out + at, out, written, w)
            else:  # its row of the candidate's product: defined, then not read
                for j in range(w):
                    gated[uint64(at + j)] = 0.0
        elif reset_after:
            _gru_units_reset_after(acc, b * columns, projected, source, hidden, w, bias_h, u0,
                                   hs, h_in + at, h_out + at, out, written)
        elif phase == 0:
            _gru_gates(acc, b * columns, projected, source, hidden, w, hs, h_in + at, gated,
                       zs, at)
        else:
            _gru_candidate(acc, b * columns, projected, source, hidden, w, hs, h_in + at,
                           h_out + at, zs, at, out, written)


@_jit
def _gru_units_reset_after(acc, base, projected, source, hidden, w, bias_h, u0, hs, h_at,
                           h_to, out, written):
    for j in range(w):
        z = 0.5 + 0.5 * tanh(np.float64(acc[uint64(base + j)] + projected[uint64(source + j)]))
        r = 0.5 + 0.5 * tanh(np.float64(acc[uint64(base + w + j)] +
                                        projected[uint64(source + hidden + j)]))
        recurrent = np.float64(acc[uint64(base + 2 * w + j)] + bias_h[uint64(u0 + j)])
        candidate = tanh(projected[uint64(source + 2 * hidden + j)] + r * recurrent)
        h = (1.0 - z) * candidate + z * hs[uint64(h_at + j)]
        hs[uint64(h_to + j)] = h
        out[uint64(written + j)] = h


@_jit
def _gru_gates(acc, base, projected, source, hidden, w, hs, h_at, gated, zs, at):
    for j in range(w):
        z = 0.5 + 0.5 * tanh(np.float64(acc[uint64(base + j)] + projected[uint64(source + j)]))
        r = 0.5 + 0.5 * tanh(np.float64(acc[uint64(base + w + j)] +
                                        projected[uint64(source + hidden + j)]))
        zs[uint64(at + j)] = z
        gated[uint64(at + j)] = r * hs[uint64(h_at + j)]


@_jit
def _gru_candidate(acc, base, projected, source, hidden, w, hs, h_at, h_to, zs, at, out,
                   written):
    for j in range(w):
        candidate = tanh(np.float64(acc[uint64(base + j)] +
                                    projected[uint64(source + 2 * hidden + j)]))
        z = np.float64(zs[uint64(at + j)])
        h = (1.0 - z) * candidate + z * hs[uint64(h_at + j)]
        hs[uint64(h_to + j)] = h
        out[uint64(written + j)] = h


# -- RNN -------------------------------------------------------------------------------------
#
# h' = f(clip(x W^T + Wb + Rb + h R^T)): one product a step, as the LSTM's, with one gate. f
# is one of ACTIVATIONS (ONNX's names, lower case); ``clip`` is +inf without a clip.

TANH, RELU, SIGMOID = 0, 1, 2
ACTIVATIONS = {"tanh": TANH, "relu": RELU, "sigmoid": SIGMOID}


@_jit
def rnn_sequence(part, sync, projected, panels, bounds, hs, out, lengths, clip, steps, batch,
                 hidden, width, tile, activation):
    """The steps of an RNN direction, this thread preferring part ``part``. ``projected``
    (steps, batch, hidden): X W^T + Wb + Rb per step in the order the direction runs;
    ``panels``: R^T by part (:func:`lstm_sequence`'s layout, one gate); ``clip`` (1,) the
    bound of the pre-activation; ``activation`` a code of ACTIVATIONS. ``hs``, ``out`` and
    ``lengths`` as for :func:`lstm_sequence`."""
    parts = bounds.size - 1
    acc = _accumulator(bounds, 1, width, batch, projected)
    for step in range(_arrive(sync, part, parts), steps):
        _wait_for_step(sync, step, parts)
        for offset in range(parts):
            if _takes(sync, part, offset, parts, step):
                _rnn_part(step, (part + offset) % parts, projected, panels, bounds, hs, out,
                          lengths, np.float64(clip[0]), batch, hidden, width, tile, acc,
                          activation)
                _finished(sync, parts)


@_jit
def _rnn_part(step, part, projected, panels, bounds, hs, out, lengths, clip, batch, hidden,
              width, tile, acc, activation):
    u0, w = bounds[part], bounds[part + 1] - bounds[part]
    columns = part_columns(w, 1, width)
    h_in, h_out = (step % 2) * batch * hidden, ((step + 1) % 2) * batch * hidden
    _product(tile, hs, h_in, panels, _panel_start(bounds, part, 1, width, hidden), acc, batch,
             hidden, columns, width)
    for b in range(batch):
        at = b * hidden + u0
        row = (step * batch + b) * hidden + u0  # in projected and in out alike
        if step < lengths[b]:
            _rnn_units(acc, b * columns, projected, row, w, clip, activation, hs, h_out + at,
                       out)
        else:
            _hold(hs, h_in + at, h_out + at, out, row, w)


@_jit
def _rnn_units(acc, base, projected, row, w, clip, activation, hs, h_to, out):
    """One row's ``w`` units of h' (a loop per activation, so that each vectorizes)."""
    if activation == TANH:
        for j in range(w):
            h = tanh(_clipped(acc[uint64(base + j)] + projected[uint64(row + j)], clip))
            hs[uint64(h_to + j)] = h
            out[uint64(row + j)] = h
    elif activation == RELU:
        for j in range(w):
            a = _clipped(acc[uint64(base + j)] + projected[uint64(row + j)], clip)
            h = 0.0 if a < 0.0 else a  # a NaN passes
            hs[uint64(h_to + j)] = h
            out[uint64(row + j)] = h
    else:
        for j in range(w):
            a = _clipped(acc[uint64(base + j)] + projected[uint64(row + j)], clip)
            h = 0.5 + 0.5 * tanh(0.5 * a)
            hs[uint64(h_to + j)] = h
            out[uint64(row + j)] = h


@njit(inline="always", error_model="numpy", fastmath={"contract"})
def _clipped(value, clip):
    """``value`` (a sum in the arrays' dtype) in float64, held to [-clip, clip]; a NaN
    passes."""
    a = np.float64(value)
    if a > clip:
        return clip
    if a < -clip:
        return -clip
    return a


# -- the pool's entries ----------------------------------------------------------------------
#
# args[0]: int64 words: steps, batch, hidden, parts, width, tile, flag (the GRU's
# reset_after, the RNN's activation), then the size of each array after ``sync``; args[1:]:
# sync, then the arrays in the order of the kernel's arguments.

PART_SIGNATURE = types.void(types.CPointer(types.voidptr), types.int64)
HEAD = 7  # words before the sizes


@_jit
def _floats(args, words, i, zero):
    """The float array ``i`` (0: the first after sync)."""
    return carray(_pointer_like(args[2 + i], zero), (words[HEAD + i],))


@_jit
def _ints(args, words, i):
    return carray(args[2 + i], (words[HEAD + i],), np.int64)


@_jit
def _lstm_args(args, part, zero):
    words = carray(args[0], (HEAD + 7,), np.int64)
    steps, batch, hidden, parts = words[0], words[1], words[2], words[3]
    lstm_sequence(part, carray(args[1], (sync_words(parts),), np.int64),
                  _floats(args, words, 0, zero), _floats(args, words, 1, zero),
                  _ints(args, words, 2), _floats(args, words, 3, zero),
                  _floats(args, words, 4, zero), _floats(args, words, 5, zero),
                  _ints(args, words, 6), steps, batch, hidden, words[4], words[5])


@_jit
def _gru_args(args, part, zero):
    words = carray(args[0], (HEAD + 10,), np.int64)
    steps, batch, hidden, parts = words[0], words[1], words[2], words[3]
    gru_sequence(part, carray(args[1], (sync_words(parts),), np.int64),
                 _floats(args, words, 0, zero), _floats(args, words, 1, zero),
                 _ints(args, words, 2), _floats(args, words, 3, zero),
                 _floats(args, words, 4, zero), _ints(args, words, 5),
                 _floats(args, words, 6, zero), _floats(args, words, 7, zero),
                 _floats(args, words, 8, zero), _floats(args, words, 9, zero), steps, batch,
                 hidden, words[4], words[5], words[6] != 0)


@_jit
def _rnn_args(args, part, zero):
    words = carray(args[0], (HEAD + 7,), np.int64)
    steps, batch, hidden, parts = words[0], words[1], words[2], words[3]
    rnn_sequence(part, carray(args[1], (sync_words(parts),), np.int64),
                 _floats(args, words, 0, zero), _floats(args, words, 1, zero),
                 _ints(args, words, 2), _floats(args, words, 3, zero),
                 _floats(args, words, 4, zero), _ints(args, words, 5),
                 _floats(args, words, 6, zero), steps, batch, hidden, words[4], words[5],
                 words[6])


@first_use_cfunc(PART_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def lstm_part_f(args, part):
    _lstm_args(args, part, np.float32(0))


@first_use_cfunc(PART_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def lstm_part_d(args, part):
    _lstm_args(args, part, np.float64(0))


@first_use_cfunc(PART_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def gru_part_f(args, part):
    _gru_args(args, part, np.float32(0))


@first_use_cfunc(PART_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def gru_part_d(args, part):
    _gru_args(args, part, np.float64(0))


@first_use_cfunc(PART_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def rnn_part_f(args, part):
    _rnn_args(args, part, np.float32(0))


@first_use_cfunc(PART_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def rnn_part_d(args, part):
    _rnn_args(args, part, np.float64(0))
