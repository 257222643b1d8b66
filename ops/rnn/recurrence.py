"""What the recurrent layers share below their operators and their cells: the activations
and their ONNX names, the operand checks, the sequence helpers (reversal within each
sequence's length, step counts, the input projection for every step) and the driver all
three layers run (:func:`run_directions`): it brings the input to time-major layout,
precomputes the input projection for every step at once, runs each direction's cell step by
step, and writes the outputs. A reverse direction with ``sequence_lens`` is run forward over
each sequence reversed within its own length, so every step is a plain gather and padded
steps simply hold the state and emit zeros.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import accumulation_dtype
from mixrt.ops.ir.types import fits, shape_text

DIRECTIONS = ("forward", "reverse", "bidirectional")


# -- activation functions ---------------------------------------------------------------

def _sigmoid(xp, x, alpha, beta):
    # tanh(x / 2) / 2 + 1 / 2, in place after the first product: NumPy's SIMD tanh makes it
    # 1.6x faster than 1 / (1 + exp(-x)) (16 against 25 us over 64x768 float32), and the
    # gates' sigmoids are most of a recurrent step's elementwise work
    y = x * 0.5
    xp.tanh(y, out=y)
    y *= 0.5
    y += 0.5
    return y


def _hard_sigmoid(xp, x, alpha, beta):
    return xp.clip(alpha * x + beta, 0, 1)


def _elu(xp, x, alpha, beta):
    return xp.where(x >= 0, x, alpha * (xp.exp(xp.minimum(x, 0)) - 1))


# name -> (function, default alpha or None when unused, default beta or None when unused);
# the defaults are those of the ONNX operator of the same name.
ACTIVATIONS = {
    "relu": (lambda xp, x, a, b: xp.maximum(x, 0), None, None),
    "tanh": (lambda xp, x, a, b: xp.tanh(x), None, None),
    "sigmoid": (_sigmoid, None, None),
    "affine": (lambda xp, x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda xp, x, a, b: xp.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda xp, x, a, b: xp.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda xp, x, a, b: a * xp.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (_hard_sigmoid, 0.2, 0.5),
    "elu": (_elu, 1.0, None),
    "softsign": (lambda xp, x, a, b: x / (1 + xp.abs(x)), None, None),
    "softplus": (lambda xp, x, a, b: xp.logaddexp(x, 0), None, None),
}


def activation_specs(names, alphas, betas, defaults, num_directions):
    """One list of (activation key, alpha, beta) per direction. ``activation_alpha``/``beta``
    are consumed in order by the activations that take them; the rest keep their ONNX
    defaults."""
    names = list(names) if names else list(defaults) * num_directions
    if len(names) == len(defaults) and num_directions == 2:
        names = names * 2
    if len(names) != len(defaults) * num_directions:
        raise ValueError(f"expected {len(defaults) * num_directions} activations, got "
                         f"{names}")
    alphas, betas = list(alphas or ()), list(betas or ())
    specs = []
    for name in names:
        key = name.lower()
        if key not in ACTIVATIONS:
            raise ValueError(f"unknown activation {name!r}; expected one of "
                             f"{sorted(ACTIVATIONS)}")
        _, alpha, beta = ACTIVATIONS[key]
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        specs.append((key, alpha, beta))
    per = len(defaults)
    return [specs[d * per:(d + 1) * per] for d in range(num_directions)]


def activation_functions(xp, names, alphas, betas, defaults, num_directions):
    """One list of unary callables per direction (see :func:`activation_specs`)."""
    return [[lambda x, fn=ACTIVATIONS[key][0], a=alpha, b=beta: fn(xp, x, a, b)
             for key, alpha, beta in direction]
            for direction in activation_specs(names, alphas, betas, defaults, num_directions)]


# -- the operands' shapes --------------------------------------------------------------------

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def check_operands(op_type: str, X, W, R, B=None, *, initial_h=None, initial_c=None, P=None,
                   direction="forward", hidden_size=None, layout=0) -> None:
    """Raises a ValueError naming the first operand whose shape does not fit the others, and
    the shape it should have: W (D, G x H, I), R (D, G x H, H), B (D, 2 x G x H), the initial
    states (D, batch, H) or with layout=1 (batch, D, H), P (D, 3 x H), for D directions, G
    gates, hidden size H and input size I. Shapes are tuples (an absent input None); a dim
    that is not a known int (a name, None) always fits, so the shape inference at load time
    and the kernels at run time share this."""
    if direction not in DIRECTIONS:
        raise ValueError(f"{op_type}: direction must be one of {DIRECTIONS}, got {direction!r}")
    gates, directions = GATES[op_type], 2 if direction == "bidirectional" else 1
    x = X if X is not None and len(X) == 3 else (None,) * 3
    if X is not None and len(X) != 3:
        raise ValueError(f"{op_type}: X has shape {shape_text(X)}; expected 3 axes "
                         f"({'batch, seq_length' if layout else 'seq_length, batch'}, "
                         "input_size)")
    batch, size = (x[0] if layout else x[1]), x[2]
    hidden = hidden_size if hidden_size is not None else (
        R[-1] if R is not None and len(R) == 3 else None)
    wide = None if not isinstance(hidden, int) else gates * hidden
    state = (batch, directions, hidden) if layout else (directions, batch, hidden)
    state_axes = "batch, num_directions, hidden_size" if layout \
        else "num_directions, batch, hidden_size"
    expected = (
        ("W", W, (directions, wide, size), f"num_directions, {gates} x hidden_size, input_size"),
        ("R", R, (directions, wide, hidden), f"num_directions, {gates} x hidden_size, "
                                             "hidden_size"),
        ("B", B, (directions, None if wide is None else 2 * wide),
         f"num_directions, {2 * gates} x hidden_size"),
        ("initial_h", initial_h, state, state_axes),
        ("initial_c", initial_c, state, state_axes),
        ("P", P, (directions, None if hidden is None else 3 * hidden),
         "num_directions, 3 x hidden_size"))
    for name, shape, want, axes in expected:
        if shape is not None and not fits(shape, want):
            raise ValueError(f"{op_type}: {name} has shape {shape_text(shape)}; expected "
                             f"{shape_text(want)} ({axes}) for X {shape_text(X)}, "
                             f"direction {direction!r} and hidden_size {hidden}")


def _shape(array):
    return None if array is None else tuple(array.shape)


# -- the shared driver ------------------------------------------------------------------

def reversal_index(xp, lengths, seq_len):
    """index[t, b] = lengths[b] - 1 - t inside the sequence, t past its end: reversing each
    sequence within its own length. It is its own inverse."""
    steps = xp.arange(seq_len).reshape(-1, 1)
    return xp.where(steps < lengths, lengths - 1 - steps, steps)


def step_counts(xp, sequence_lens, batch: int, seq_len: int):
    """Each sequence's length (int64), all ``seq_len`` when none are given. A length outside
    [0, seq_len] is refused (as onnxruntime does) rather than read past the sequence."""
    if sequence_lens is None:
        return xp.full((batch,), seq_len, dtype=np.int64)
    lengths = sequence_lens.astype(np.int64)
    if lengths.shape != (batch,):
        raise ValueError(f"sequence_lens has shape {tuple(lengths.shape)}; expected "
                         f"({batch},), one length per sequence of the batch")
    if batch and bool(((lengths < 0) | (lengths > seq_len)).any()):
        raise ValueError(f"sequence_lens {lengths.tolist()} holds a length outside "
                         f"[0, {seq_len}], the sequence length of X")
    return lengths


def sequence_product(a, b):
    """``a @ b`` for a (steps, batch, k) stack and a 2-D b as one matrix product over every
    step: NumPy's matmul of a 3-D stack runs one product per step (32 of 64 x 256 @ 256 x
    1024 took 5.1-5.4 ms, the one 2048-row product 2.9-3.0)."""
    return (a.reshape(-1, a.shape[-1]) @ b).reshape(a.shape[:-1] + b.shape[-1:])


def run_directions(xp, X, W, R, B, sequence_lens, initial_states, *, hidden_size,
                   direction, layout, step, activations, gate_count):
    """Run ``step`` over time for each direction.

    step(x_proj, states, weights, acts) -> new states (hidden first), where x_proj is the
    input projection X_t W^T + Wb for that step and weights holds (R, Rb, extra) of the
    direction. Returns (Y, final state 0, final state 1, ...) in the requested layout.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    wide = accumulation_dtype(X.dtype)
    x = X.astype(wide)
    if layout:
        x = x.swapaxes(0, 1)
        initial_states = [None if s is None else s.swapaxes(0, 1) for s in initial_states]
    seq_len, batch, _ = x.shape
    num_directions = W.shape[0]
    hidden = hidden_size or R.shape[-1]
    gates = gate_count * hidden
    if B is None:
        B = xp.zeros((num_directions, 2 * gates), dtype=wide)
    lengths = step_counts(xp, sequence_lens, batch, seq_len)
    batch_index = xp.arange(batch)
    padded = sequence_lens is not None and bool((lengths < seq_len).any())

    outputs, finals = [], []
    for d in range(num_directions):
        backwards = direction == "reverse" or d == 1
        projected = sequence_product(x, W[d].astype(wide).T) + B[d, :gates].astype(wide)
        if backwards:
            order = reversal_index(xp, lengths, seq_len)
            projected = projected[order, batch_index]
        states = [xp.zeros((batch, hidden), dtype=wide) if s is None else s[d].astype(wide)
                  for s in initial_states]
        weights = (R[d].astype(wide), B[d, gates:].astype(wide), d)
        ys = []
        for t in range(seq_len):
            new = step(projected[t], states, weights, activations[d])
            if not padded:
                states = new
                ys.append(new[0])
                continue
            running = (t < lengths).reshape(-1, 1)
            states = [xp.where(running, n, s) for n, s in zip(new, states)]
            ys.append(xp.where(running, new[0], xp.zeros((), dtype=wide)))
        y = stacked_steps(xp, ys, batch, hidden, wide)
        if backwards:
            y = y[order, batch_index]
        outputs.append(y)
        finals.append(states)
    return layer_outputs(xp, outputs, finals, lengths, layout, X.dtype)


def stacked_steps(xp, ys: list, batch: int, hidden: int, dtype):
    """A direction's per-step outputs as one (steps, batch, hidden) array; an X of no steps
    gives an empty one (as onnxruntime does), not NumPy's "need at least one array"."""
    return xp.stack(ys) if ys else xp.zeros((0, batch, hidden), dtype=dtype)


def layer_outputs(xp, outputs: list, finals: list, lengths, layout, dtype) -> tuple:
    """(Y, final states...) in the node's layout and dtype from each direction's (seq,
    batch, hidden) outputs and final states. A sequence of length 0 has no last step: its
    final states are zeros (onnxruntime's)."""
    # (seq, directions, batch, hidden); one direction's arrays are viewed, not copied: the
    # cells made them for this call (a service's batch-1 step spent ~10 us a node on copies)
    Y = outputs[0][:, None] if len(outputs) == 1 else xp.stack(outputs, axis=1)
    final = [finals[0][i][None] if len(finals) == 1 else xp.stack([f[i] for f in finals])
             for i in range(len(finals[0]))]
    if xp is not np or bool((lengths == 0).any()):  # (CuPy: no host sync to ask)
        started = (lengths > 0).reshape(-1, 1)
        final = [xp.where(started, f, 0) for f in final]
    if layout:
        Y = Y.transpose(2, 0, 1, 3)
        final = [f.swapaxes(0, 1) for f in final]
    return tuple(xp.ascontiguousarray(a).astype(dtype, copy=False) for a in (Y, *final))


def clipped(xp, clip):
    if clip is None:
        return lambda v: v
    return lambda v: xp.clip(v, -clip, clip)
