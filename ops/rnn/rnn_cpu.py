"""A simple RNN's inference on the CPU: the whole sequence in one compiled call.

ops/rnn/rnn.py's NumPy step (``f(x_proj + h @ R^T + Rb)``) serves every RNN. With a service's few
rows a step is a matrix-vector product of a few microseconds, and the calls from Python
around it cost more: PyTorch's 2-layer ``nn.RNN`` (hidden 256, 32 steps) took 1.02 ms at
batch 1 against onnxruntime's 0.43. Here a direction runs as the LSTM's does
(ops/rnn/lstm_cpu.forward_sequence, ops/rnn/_jit_recurrent.rnn_sequence): the input projection of
every step in one product, then every step in one call, the hidden units split between the
native pool's threads. It takes the activations ops/rnn/_jit_recurrent.ACTIVATIONS names (Tanh,
PyTorch's default; Relu, its other choice; Sigmoid), with or without ``clip``, padded or
not, up to ``lstm_cpu.SEQUENCE_ROWS`` rows. Larger batches keep the NumPy step, where the
product dominates and the BLAS does as well. Training keeps the NumPy cell (ops/rnn/rnn_grad.py),
whose workspace the backward reads.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.rnn.compiled_steps import recurrent_kernels
from mixrt.ops.compiled.workspace import packed
from mixrt.ops.rnn.lstm_cpu import (panels_by_part, projection, run_sequence, sequence_suits,
                                unit_bounds)

ACTIVATIONS = ("tanh", "relu", "sigmoid")  # ops/rnn/_jit_recurrent.ACTIVATIONS' names


def suits(layer, d: int) -> bool:
    """Whether direction d of ``layer`` (rnn_grad's _Layer of an RNN) runs here: NumPy
    floats, an activation of ACTIVATIONS, a few rows, the compiled kernels at hand."""
    return layer.xp is np and layer.wide in jit_cpu.NATIVE \
        and layer.cells[d].f.key in ACTIVATIONS and layer.batch > 0 and layer.hidden > 0 \
        and jit_cpu.enabled() and sequence_suits(layer)


def inference(layer, d: int, W, B, constants=None):
    """Direction d over every step: (outputs (steps, batch, hidden) in the order it ran,
    [final h]). ``constants``: the node's dict where W, R and B are session constants
    (lstm_cpu.constant_weights), which keeps their packed forms."""
    hidden, wide, steps, batch = layer.hidden, layer.wide, layer.steps, layer.batch
    cell = layer.cells[d]
    native = jit_cpu.native_pool()
    bounds = unit_bounds(hidden, 1 if native is None else native.workers + 1)
    panels = packed(constants, ("rnn R by part", d, wide.str, len(bounds)),
                    lambda: panels_by_part(np.asarray(cell.r, wide), bounds, 1))
    (h,) = layer.start_states(d)
    hs = np.empty((2, batch, hidden), wide)
    hs[0] = h
    outputs = np.empty((steps, batch, hidden), wide)
    clip = np.array([math.inf if cell.f.clip is None else abs(float(cell.f.clip))], wide)
    code = recurrent_kernels().ACTIVATIONS[cell.f.key]
    run_sequence("rnn", native, steps, batch, hidden, (
        _projection(layer, W, B, d, constants), panels, np.array(bounds, np.int64), hs,
        outputs, np.ascontiguousarray(layer.lengths, dtype=np.int64), clip), code)
    return outputs, [hs[steps % 2]]


def _projection(layer, W, B, d: int, constants=None):
    """X W^T + Wb + Rb of direction d for every step, in the order the direction runs,
    C-contiguous (steps, batch, hidden)."""
    wide = layer.wide
    return projection(layer, d, constants, "rnn", lambda: np.asarray(W[d], wide),
                      None if B is None else lambda: (
                          B[d, :layer.gates].astype(wide) + B[d, layer.gates:].astype(wide)))
