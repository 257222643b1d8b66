"""One direction of DynamicQuantizeLSTM's recurrence in one compiled call
(``ops/quant/contrib_quant_lstm.py`` prepares the operands and keeps the NumPy form).

The NumPy form spent ~0.27 ms a step of a hidden-256 layer at batch 1 in over a hundred
small calls, most of them the float64 emulation of MLAS's fused multiply-adds. Here each
step, for the whole batch:

* quantizes the hidden state to uint8 over its range, exactly as
  ``contrib_quant_lstm.dynamic_codes`` does (the same float32 operations in the same order);
* multiplies the raw codes by R's centered codes as integers (int16 weights, int32 sums:
  exact, as the NumPy form's float sums are) and takes the hidden state's zero point off
  through R's column sums: sum (q - z) w = sum q w - z sum w;
* rounds each sum to float32 once, scales and adds it to the step's input projection;
* computes the gates as ``contrib_quant_lstm.Gates`` does, operation by operation in
  float32, with MLAS's sigmoid and tanh emulated as there: each fused multiply-add is
  float32(float64(a) * float64(b) + float64(c)). Nothing here may be contracted into a
  real FMA, so the kernels are compiled without fastmath.

A hidden state holding a NaN or an infinity has no codes; the call then stops and says so,
and the caller runs the direction in NumPy.

Where the CPU has AVX-512 VNNI, ``_jit_quant_lstm_vnni.py`` runs the same steps with the
products through the 8-bit tile; it is a module of its own because importing the tile's
module compiles its native-pool entry, which LLVM cannot build for a CPU without VNNI.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from mixrt.ops.quant.contrib_quant_lstm import (LOGISTIC_P, LOGISTIC_Q, LOGISTIC_RANGE,
                                                TANH_P, TANH_Q, TANH_RANGE)

_jit = njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
_inline = njit(inline="always", boundscheck=False, error_model="numpy")

f32 = np.float32

# the activations the compiled gates know, by code (contrib_quant_lstm.COMPILED_ACTIVATIONS)
SIGMOID, TANH, RELU, AFFINE, LEAKY_RELU, THRESHOLDED_RELU, HARD_SIGMOID, SOFTSIGN = range(8)

# MLAS's coefficients, each rounded to float32 as contrib_quant_lstm._polynomial rounds them
# (compiled in as constants: numba's cache entries follow this file, not that one, but
# they are onnxruntime's and do not change)
LP0, LP1, LP2, LP3, LP4 = (f32(c) for c in LOGISTIC_P)
LQ0, LQ1, LQ2, LQ3, LQ4, LQ5 = (f32(c) for c in LOGISTIC_Q)
TP0, TP1, TP2, TP3, TP4, TP5, TP6 = (f32(c) for c in TANH_P)
TQ0, TQ1, TQ2, TQ3 = (f32(c) for c in TANH_Q)
ZERO, HALF, ONE, LEVELS = f32(0), f32(0.5), f32(1), f32(255)


# -- MLAS's sigmoid and tanh -----------------------------------------------------------------

@intrinsic
def _fma64(typingctx, a, b, c):
    """llvm.fma.f64: a * b + c rounded once."""
    def codegen(context, builder, signature, args):
        double = ir.DoubleType()
        fma = builder.module.declare_intrinsic(
            "llvm.fma", [double], ir.FunctionType(double, [double] * 3))
        return builder.call(fma, args)
    return types.float64(types.float64, types.float64, types.float64), codegen


@_inline
def _fma(a, b, c):
    """contrib_quant.fma_f32: the product of two float32 is exact in float64, so its float64
    sum rounds once, as one float64 fused multiply-add (a step less than a product and a
    sum); then one rounding to float32."""
    return f32(_fma64(np.float64(a), np.float64(b), np.float64(c)))


@_inline
def _clipped(x, low, high):
    """np.clip(x, low, high): x where it is within (a NaN stays)."""
    if x < low:
        return low
    if x > high:
        return high
    return x


@_inline
def _bounded(x, bound):
    """np.minimum(np.maximum(x, -bound), bound)."""
    return _clipped(x, -bound, bound)


@_inline
def logistic(x):
    """contrib_quant_lstm.mlas_logistic of one float32."""
    x = _bounded(x, LOGISTIC_RANGE)
    x2 = x * x
    p = _fma(_fma(_fma(_fma(x2, LP0, LP1), x2, LP2), x2, LP3), x2, LP4)
    q = _fma(_fma(_fma(_fma(_fma(x2, LQ0, LQ1), x2, LQ2), x2, LQ3), x2, LQ4), x2, LQ5)
    value = (x * p) / q + HALF
    return ZERO if value < ZERO else value


@_inline
def tanh(x):
    """contrib_quant_lstm.mlas_tanh of one float32."""
    x = _bounded(x, TANH_RANGE)
    x2 = x * x
    p = _fma(_fma(_fma(_fma(_fma(_fma(x2, TP0, TP1), x2, TP2), x2, TP3), x2, TP4), x2, TP5),
             x2, TP6)
    q = _fma(_fma(_fma(x2, TQ0, TQ1), x2, TQ2), x2, TQ3)
    return (x * p) / q


# -- the activations -------------------------------------------------------------------------

@_inline
def _activation(kind, x, alpha, beta):
    """recurrence.ACTIVATIONS' formulas in float32 (np.maximum's +0 for Relu's -0)."""
    if kind == SIGMOID:
        return logistic(x)
    if kind == TANH:
        return tanh(x)
    if kind == RELU:
        return x if x > ZERO or x != x else ZERO
    if kind == AFFINE:
        return alpha * x + beta
    if kind == LEAKY_RELU:
        return x if x >= ZERO else alpha * x
    if kind == THRESHOLDED_RELU:
        return x if x > alpha else ZERO
    if kind == HARD_SIGMOID:
        return _clipped(alpha * x + beta, ZERO, ONE)
    return x / (ONE + abs(x))  # SOFTSIGN


@_jit
def activate(kind, values, alpha, beta):
    """``values`` through activation ``kind``, in place. A loop per kind, so that each
    vectorizes (over a view indexed from 0: numba's wraparound test on other indices kept
    LLVM from it, 14 ns a sigmoid against 2)."""
    if kind == SIGMOID:
        for u in range(values.size):
            values[u] = logistic(values[u])
    elif kind == TANH:
        for u in range(values.size):
            values[u] = tanh(values[u])
    else:
        for u in range(values.size):
            values[u] = _activation(kind, values[u], alpha, beta)


# -- the hidden state's codes ----------------------------------------------------------------

@_jit
def quantize(values, width, codes, lda):
    """values (rows of ``width``, flat float32) quantized over their range widened to 0, as
    contrib_quant_lstm.dynamic_codes: the raw uint8 codes of row r at ``codes[r * lda:]``;
    returns (scale, zero point), or a scale of 0 where a value is not finite (it has no
    code)."""
    low, high = ZERO, ZERO
    for i in range(values.size):
        if not np.isfinite(values[i]):
            return ZERO, ZERO
        low = min(low, values[i])
        high = max(high, values[i])
    scale = ONE if high == low else (high - low) / LEVELS
    zero = np.rint(_clipped(ZERO - low / scale, ZERO, LEVELS))
    for r in range(values.size // max(width, 1)):
        row, out = values[r * width:(r + 1) * width], codes[r * lda:r * lda + width]
        for i in range(width):
            out[i] = np.uint8(_clipped(np.rint(row[i] / scale) + zero, ZERO, LEVELS))
    return scale, zero


# -- the recurrent product -------------------------------------------------------------------
#
# Each sum is a dot product along R's rows (``weight`` holds R's codes transposed, a gate
# column a row): LLVM makes the loop over k vpmaddwd, 32 multiply-adds of 16-bit codes an
# instruction into 16 int32 sums. Written as rows of h times R, each k read and wrote every
# sum (256 x 1024 codes: 15 us against 8 at one row, 92 against 61 at eight). A column's
# codes serve every row of the batch while they are in L1.

@_jit
def _products(codes, lengths, t, weight, column_sums, zero, sums):
    """sums (batch, 4 hidden) = (codes - zero) @ weight.T as exact int32, for the sequences
    still running at step t: the raw codes' sums less zero times the column sums."""
    batch, hidden = sums.shape[0], weight.shape[1]
    for j in range(weight.shape[0]):
        column = weight[j]
        for b in range(batch):
            if t < lengths[b]:
                row, total = codes[b * hidden:(b + 1) * hidden], np.int32(0)
                for k in range(hidden):
                    total += np.int32(np.int32(row[k]) * np.int32(column[k]))
                sums[b, j] = total - zero * column_sums[j]


# -- one step of one sequence ----------------------------------------------------------------

@_jit
def _pre_activations(projected, sums, scale, weight_scale, gates):
    """gates = projected + float32(sums) * (scale * weight_scale): the integer sums rounded
    to float32 once, then MLAS's two float32 roundings."""
    for j in range(gates.size):
        gates[j] = projected[j] + f32(sums[j]) * (scale * weight_scale[j])


@_jit
def _gate(x, c, peephole, has_peepholes, bias, has_bias, clip):
    """Gates.part on one gate's values ``x``, in place: the peephole term (where
    ``has_peepholes``), the bias and the clip, in that order."""
    if has_peepholes:
        for u in range(x.size):
            x[u] = x[u] + c[u] * peephole[u]
    if has_bias:
        for u in range(x.size):
            x[u] = x[u] + bias[u]
    for u in range(x.size):
        x[u] = _bounded(x[u], clip)


@_jit
def _cell(gates, c, peepholes, has_peepholes, bias, has_bias, clip, kinds, alphas, betas,
          input_forget, squashed, h_out, c_out):
    """Gates.step on one sequence's pre-activations ``gates`` (i, o, f, c) and cell ``c``:
    the new cell into c_out, the new hidden state into h_out."""
    hidden = c.size
    i, o = gates[:hidden], gates[hidden:2 * hidden]
    forget, candidate = gates[2 * hidden:3 * hidden], gates[3 * hidden:]
    i_bias, o_bias = bias[:hidden], bias[hidden:2 * hidden]
    f_bias, c_bias = bias[2 * hidden:3 * hidden], bias[3 * hidden:]
    _gate(i, c, peepholes[0], has_peepholes, i_bias, has_bias, clip)
    activate(kinds[0], i, alphas[0], betas[0])
    if input_forget:
        for u in range(hidden):
            forget[u] = ONE - i[u]
    else:
        _gate(forget, c, peepholes[2], has_peepholes, f_bias, has_bias, clip)
        activate(kinds[0], forget, alphas[0], betas[0])
    _gate(candidate, c, peepholes[0], False, c_bias, has_bias, clip)
    activate(kinds[1], candidate, alphas[1], betas[1])
    for u in range(hidden):
        c_out[u] = c[u] * forget[u] + i[u] * candidate[u]
    _gate(o, c_out, peepholes[1], has_peepholes, o_bias, has_bias, clip)
    activate(kinds[0], o, alphas[0], betas[0])
    for u in range(hidden):
        squashed[u] = c_out[u]
    activate(kinds[2], squashed, alphas[2], betas[2])
    for u in range(hidden):
        h_out[u] = squashed[u] * o[u]


# -- the direction ---------------------------------------------------------------------------
#
# ``projected`` (steps, batch, 4 hidden) float32 in the order the direction runs;
# ``weight_scale`` (4 hidden) float32; ``bias`` (4 hidden) float32 (Wb + Rb); ``peepholes``
# (3, hidden) float32; ``clip`` float32; ``kinds``, ``alphas``, ``betas`` (3,): the f, g and h
# activations; ``lengths`` (batch,) int64; ``h``, ``c`` (batch, hidden): the initial states,
# replaced by the running ones (c ends as the final cell); ``outputs`` (steps, batch, hidden),
# zeros, receives the outputs; ``final_h`` (batch, hidden) each sequence's last output. A
# direction returns False, having stopped, where a hidden state held a value that is not
# finite.

@_jit
def _first_final_h(h, lengths, final_h):
    for b in range(h.shape[0]):
        if lengths[b] > 0:
            final_h[b] = h[b]
        else:
            final_h[b] = ZERO


@_jit
def _step_cells(t, scale, sums, projected, weight_scale, bias, has_bias, peepholes,
                has_peepholes, clip, kinds, alphas, betas, input_forget, lengths, h, c,
                outputs, final_h, gates, squashed, new_c):
    """Step t's gates and states from its integer sums (batch, 4 hidden) and h's scale."""
    for b in range(h.shape[0]):
        if t >= lengths[b]:  # ended: zeros in the output and the next hidden state
            h[b] = ZERO
            continue
        _pre_activations(projected[t, b], sums[b], scale, weight_scale, gates)
        _cell(gates, c[b], peepholes, has_peepholes, bias, has_bias, clip, kinds, alphas,
              betas, input_forget, squashed, outputs[t, b], new_c)
        c[b] = new_c
        h[b] = outputs[t, b]
        final_h[b] = outputs[t, b]


@_jit
def _no_final_cell(c, lengths):
    for b in range(c.shape[0]):
        if lengths[b] <= 0:  # a sequence of no steps has no final cell
            c[b] = ZERO


@_jit
def direction(projected, weight, column_sums, weight_scale, bias, has_bias, peepholes,
              has_peepholes, clip, kinds, alphas, betas, input_forget, lengths, h, c,
              outputs, final_h):
    """contrib_quant_lstm.run_direction in one call (operands above); ``weight`` (4 hidden,
    hidden) int16: R's codes less their zero point, transposed; ``column_sums`` theirs."""
    steps, batch, wide = projected.shape
    hidden = wide // 4
    _first_final_h(h, lengths, final_h)
    codes = np.empty(batch * hidden, np.uint8)
    sums = np.empty((batch, wide), np.int32)
    gates, squashed, new_c = np.empty(wide, f32), np.empty(hidden, f32), np.empty(hidden, f32)
    for t in range(steps):
        scale, zero = quantize(h.reshape(-1), hidden, codes, hidden)
        if scale == ZERO:
            return False
        _products(codes, lengths, t, weight, column_sums, np.int32(zero), sums)
        _step_cells(t, scale, sums, projected, weight_scale, bias, has_bias, peepholes,
                    has_peepholes, clip, kinds, alphas, betas, input_forget, lengths, h, c,
                    outputs, final_h, gates, squashed, new_c)
    _no_final_cell(c, lengths)
    return True
