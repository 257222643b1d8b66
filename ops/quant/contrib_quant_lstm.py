"""onnxruntime's DynamicQuantizeLSTM (``com.microsoft``): the LSTM that
``onnxruntime.quantization.quantize_dynamic`` writes for every LSTM node.

Its weights are 8-bit codes stored transposed against the ONNX LSTM's: W is
(directions, input_size, 4 x hidden) and R (directions, hidden, 4 x hidden), gates i, o, f, c
along the last axis. Their scales and zero points are one per direction, or one per direction
and gate column. Everything else (B, sequence_lens, the initial states, the peepholes P, the
attributes) is the LSTM's.

What onnxruntime's CPU kernel computes, and so what this one does:

* The input projection of every step is one integer product. X's first ``max(sequence_lens)``
  steps are quantized together to uint8, with a scale and zero point over their whole range
  (the range widened to hold 0; scale ``(max - min) / 255``, 1 when the range is empty; zero
  point ``round(-min / scale)``; codes ``round(x / scale) + zero point``, all in float32,
  rounding half to even).
* Each step quantizes the previous hidden state of the whole batch the same way, and adds
  its integer product with R to the step's projection.
* An integer sum becomes float32 once and is multiplied by ``x_scale * w_scale`` (float32,
  per gate column when the weight's scale is), then added to what is there: two roundings,
  no fused multiply-add (MLAS's output stage).
* A weight's zero point is read once per direction (its first value): onnxruntime refuses
  per-column zero points that differ (int8 weights: that are not 0).
* The gates follow onnxruntime's order of float32 operations: the peephole term is added
  to the product first, then the bias (Wb + Rb summed once in float32), then the clip
  (``clip`` or the largest float32), then the activation; the cell is ``c * f + i * g`` and
  the output gate's peephole reads the new cell.
* Sigmoid and tanh are MLAS's float32 rational approximations as its x86-64 AVX2 kernels
  compute them (fused multiply-adds, emulated exactly in float64); an activation's missing
  alpha and beta take onnxruntime's defaults (Affine's are 0 and 0, not the LSTM's 1 and 0).
* A sequence that has ended contributes zeros to the next step's hidden state, so it does
  not widen the range the batch's hidden state is quantized over.

So the outputs are onnxruntime's bits (``tests/ops/test_dynamic_quantize_lstm.py``), except:

* Elu and Softplus use NumPy's exp and log, a unit in the last place from the C library's,
  and a hidden state that close to a rounding boundary can land on the neighbouring code.
* onnxruntime with several intra-op threads and a batch of more than 4 (or 2 or more with
  hidden_size up to 256) splits the batch between its threads, and each part quantizes its
  own hidden state: its codes then depend on its thread count (outputs up to 1.5e-2 apart
  at batch 2-3 on 2 threads). This kernel quantizes the whole batch, as onnxruntime does on one thread.
* A node whose Y output is absent lets onnxruntime keep an ended sequence's last hidden
  state in the range; this kernel always uses zeros there.
* On a CPU without AVX2, onnxruntime's sigmoid and tanh round without fused multiply-adds.

On the CPU's compiled tier each direction's recurrence is one call
(``ops/quant/_jit_quant_lstm.py``) that computes the same float32 operations in the same
order as the NumPy form here, which stays as the first tier and the fallback: for Elu,
Softplus and ScaledTanh (NumPy's exp, log and tanh, which numba's need not match), for a
hidden state that is not finite (it has no codes), and for weights whose integer sums could
pass 2**31. The two forms give the same bits (the tests run both).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.ir.registry import CONSTANT_INPUTS, op
from mixrt.ops.ir.types import TensorType, fits, shape_text
from mixrt.ops.quant import int8_cpu
from mixrt.ops.quant.contrib_quant import (COM_MICROSOFT, fma_f32, require_dtype,
                                           require_float_scales)
from mixrt.ops.rnn.recurrence import (ACTIVATIONS, _shape, activation_specs, check_operands,
                                      reversal_index, step_counts)

NAME = "DynamicQuantizeLSTM"
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
LARGEST_F32 = np.float32(np.finfo(np.float32).max)
WEIGHT_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))
COMPILED = "mixrt.ops.quant._jit_quant_lstm"
COMPILED_VNNI = "mixrt.ops.quant._jit_quant_lstm_vnni"
# the activations the compiled recurrence computes as the NumPy form does, by the codes of
# _jit_quant_lstm.py; Elu, Softplus and ScaledTanh call NumPy's exp, log and tanh
COMPILED_ACTIVATIONS = {"sigmoid": 0, "tanh": 1, "relu": 2, "affine": 3, "leakyrelu": 4,
                        "thresholdedrelu": 5, "hardsigmoid": 6, "softsign": 7}
# the inputs each direction's prepared weights come from (positions in the node)
W_INPUTS, R_INPUTS = frozenset({1, 8, 9}), frozenset({2, 10, 11})
POSITIONS = {"B": 3, "P": 7}
CHECKED = "checked layouts"  # a node's dict: the operands' shapes and types it has checked


# -- the operands --------------------------------------------------------------------------

def check_shapes(X, W, R, B, initial_h, initial_c, P, scales, *, direction, hidden_size):
    """Raises a ValueError naming the first operand whose shape does not fit: W (D, I, 4H), R
    (D, H, 4H), each scale and zero point (D,) or (D, 4H), and B, the initial states and P as
    for the LSTM. Shapes are tuples (an absent input None); unknown dims fit anything."""
    directions = 2 if direction == "bidirectional" else 1
    hidden = hidden_size if hidden_size is not None else (
        R[1] if R is not None and len(R) == 3 else None)
    wide = 4 * hidden if isinstance(hidden, int) else None
    size = X[2] if X is not None and len(X) == 3 else None
    _require(W, (directions, size, wide), "W", "num_directions, input_size, 4 x hidden_size",
             X, direction, hidden)
    _require(R, (directions, hidden, wide), "R", "num_directions, hidden_size, "
             "4 x hidden_size", X, direction, hidden)
    for name, shape in scales.items():
        if shape is not None and not (fits(shape, (directions,))
                                      or fits(shape, (directions, wide))):
            raise ValueError(f"{NAME}: {name} has shape {shape_text(shape)}; expected "
                             f"({directions},) per direction or ({directions}, {wide}) per "
                             f"direction and gate column")
    try:
        check_operands("LSTM", X, None, None, B, initial_h=initial_h, initial_c=initial_c,
                       P=P, direction=direction, hidden_size=hidden)
    except ValueError as error:
        raise ValueError(str(error).replace("LSTM:", f"{NAME}:", 1)) from None


def _require(shape, want, name, axes, X, direction, hidden):
    if shape is not None and not fits(shape, want):
        raise ValueError(f"{NAME}: {name} has shape {shape_text(shape)}; expected "
                         f"{shape_text(want)} ({axes}) for X {shape_text(X)}, direction "
                         f"{direction!r} and hidden_size {hidden} (stored transposed against "
                         f"the LSTM's)")


def direction_zero_point(zero_point, weight_dtype, d: int) -> int:
    """The one zero point onnxruntime uses for direction d's weight: per-column zero points
    must be 0 for int8 weights and all alike for uint8 ones (onnxruntime refuses others)."""
    if np.dtype(zero_point.dtype) != weight_dtype:
        raise ValueError(f"{NAME}: a zero point is {np.dtype(zero_point.dtype).name}; "
                         f"expected {weight_dtype.name}, the weight's type")
    values = zero_point.reshape(zero_point.shape[0], -1)
    if zero_point.ndim == 2:
        alike = not values.any() if weight_dtype == np.int8 else (values == values.flat[0]).all()
        if not alike:
            raise ValueError(f"{NAME}: per-column zero points must be "
                             f"{'0' if weight_dtype == np.int8 else 'one value'} for "
                             f"{weight_dtype.name} weights")
    return int(values[d, 0])


# -- dynamic quantization and the integer products ------------------------------------------

def dynamic_codes(xp, values):
    """(uint8 codes less their zero point, as float32; the float32 scale) of ``values``
    over their whole range, as onnxruntime's GetQuantizationParameter and
    MlasQuantizeLinear compute them. An empty range gets scale 1 (every code is then 0)."""
    low = np.float32(min(float(values.min()), 0.0)) if values.size else np.float32(0)
    high = np.float32(max(float(values.max()), 0.0)) if values.size else np.float32(0)
    scale = np.float32(1) if high == low else np.float32(high - low) / np.float32(255)
    zero = np.float32(np.rint(np.clip(np.float32(0) - low / scale, 0, 255)))
    scaled = xp.rint(values.astype(F32, copy=False) / scale)
    codes = xp.clip(scaled + zero, 0, 255)
    return codes - zero, scale


def exact_dtype(weight_codes, depth: int):
    """float32 where every partial sum of a product of depth ``depth`` with centered uint8
    codes (at most 255 from 0) stays below 2**24, so that float32 holds each exactly in any
    summation order; float64 (exact to 2**53) otherwise."""
    reach = float(abs(weight_codes).max()) if weight_codes.size else 0.0
    return F32 if 255 * reach * depth < 2 ** 24 else F64


class DirectionWeights:
    """Direction d's centered weight codes, in a float type that sums them exactly, and its
    scales."""

    def __init__(self, xp, weight, scale, zero_point, d: int):
        zero = direction_zero_point(zero_point, np.dtype(weight.dtype), d)
        codes = weight[d].astype(np.int32) - zero
        self.dtype = exact_dtype(codes, codes.shape[0])
        self.codes = codes.astype(self.dtype)
        self.scale = scale.reshape(scale.shape[0], -1)[d].astype(F32)

    def product(self, xp, values):
        """values @ weight through dynamic uint8 codes, as onnxruntime's quantized GEMM: the
        exact integer sums round to float32 once (as MLAS converts its int32 sums), times
        the float32 ``value_scale * weight_scale``."""
        centered, value_scale = dynamic_codes(xp, values)
        total = xp.matmul(centered.astype(self.dtype, copy=False), self.codes)
        return total.astype(F32, copy=False) * (value_scale * self.scale)


# -- onnxruntime's sigmoid and tanh ---------------------------------------------------------
# MLAS's rational approximations (Eigen's coefficients) as its x86-64 AVX2 kernels compute
# them: the input clamped, numerator and denominator in x^2 by fused multiply-adds, one
# division. They match onnxruntime 1.31's Sigmoid and Tanh bit for bit (800,000 inputs).

LOGISTIC_RANGE = np.float32(18)
LOGISTIC_P = (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
              8.51377133304701e-03, 2.48287947061529e-01)
LOGISTIC_Q = (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
              1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01)
TANH_RANGE = np.float32(9)
TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
          5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
          4.89352455891786e-03)
TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
          4.89352518554385e-03)


def _polynomial(x2, coefficients):
    """Horner's rule in x2 from the highest coefficient, one rounding per step (FMA)."""
    value = fma_f32(x2, np.float32(coefficients[0]), np.float32(coefficients[1]))
    for coefficient in coefficients[2:]:
        value = fma_f32(value, x2, np.float32(coefficient))
    return value


def _rational(xp, x, bound, numerator, denominator):
    x = xp.minimum(xp.maximum(x, -bound), bound)
    x2 = x * x
    return (x * _polynomial(x2, numerator)) / _polynomial(x2, denominator)


def mlas_logistic(xp, x, alpha=None, beta=None):
    return xp.maximum(_rational(xp, x, LOGISTIC_RANGE, LOGISTIC_P, LOGISTIC_Q)
                      + np.float32(0.5), np.float32(0))


def mlas_tanh(xp, x, alpha=None, beta=None):
    return _rational(xp, x, TANH_RANGE, TANH_P, TANH_Q)


MLAS_ACTIVATIONS = {"sigmoid": mlas_logistic, "tanh": mlas_tanh}
# onnxruntime's defaults for an activation's missing alpha and beta; the others' are 0 (the
# LSTM's own defaults, from the ONNX ops of the same names, give Affine 1 and 0)
ONNXRUNTIME_DEFAULTS = {"leakyrelu": (0.01, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}


def onnxruntime_specs(names, alphas, betas, directions):
    """Per direction, (key, alpha, beta) of the f, g and h activations: alphas and betas
    taken in order by the activations that use them, the rest onnxruntime's defaults."""
    keys = [[key for key, _, _ in direction] for direction in activation_specs(
        names, None, None, ["Sigmoid", "Tanh", "Tanh"], directions)]
    alphas, betas = list(alphas or ()), list(betas or ())
    specs = []
    for direction in keys:
        specs.append([])
        for key in direction:
            _, uses_alpha, uses_beta = ACTIVATIONS[key]
            alpha, beta = ONNXRUNTIME_DEFAULTS.get(key, (0.0, 0.0))
            if uses_alpha is not None and alphas:
                alpha = alphas.pop(0)
            if uses_beta is not None and betas:
                beta = betas.pop(0)
            specs[-1].append((key, alpha, beta))
    return specs


def gate_activations(xp, names, alphas, betas, directions):
    """Per direction, the f, g and h activations as onnxruntime computes them: MLAS's
    sigmoid and tanh, the others by their formulas in float32."""
    return [[lambda x, fn=MLAS_ACTIVATIONS.get(key, ACTIVATIONS[key][0]), a=alpha, b=beta:
             fn(xp, x, np.float32(a), np.float32(b)) for key, alpha, beta in direction]
            for direction in onnxruntime_specs(names, alphas, betas, directions)]


# -- the cell ----------------------------------------------------------------------------------

class Gates:
    """One direction's gate arithmetic in onnxruntime's float32 order."""

    def __init__(self, xp, B, P, d: int, hidden: int, acts, clip):
        self.xp, self.hidden, (self.f, self.g, self.h) = xp, hidden, acts
        self.bias = None if B is None else \
            B[d, :4 * hidden].astype(F32) + B[d, 4 * hidden:].astype(F32)
        self.peepholes = None if P is None else P[d].astype(F32).reshape(3, hidden)
        self.clip = LARGEST_F32 if clip is None else np.float32(clip)

    def _part(self, pre, index: int, c=None, peephole: int | None = None):
        """Gate ``index`` (i, o, f, c) before its activation: the peephole term, the bias,
        the clip, in that order."""
        x = pre[:, index * self.hidden:(index + 1) * self.hidden]
        if self.peepholes is not None and peephole is not None:
            x = x + c * self.peepholes[peephole]
        if self.bias is not None:
            x = x + self.bias[index * self.hidden:(index + 1) * self.hidden]
        return self.xp.clip(x, -self.clip, self.clip)

    def step(self, pre, c, input_forget):
        """(h, c) after one step from the gates' pre-activations ``pre`` and the cell c."""
        i = self.f(self._part(pre, 0, c, 0))
        forget = np.float32(1) - i if input_forget else self.f(self._part(pre, 2, c, 2))
        cell = c * forget + i * self.g(self._part(pre, 3))
        o = self.f(self._part(pre, 1, cell, 1))
        return self.h(cell) * o, cell


# -- one direction -------------------------------------------------------------------------

def run_direction(xp, projected, lengths, start, weights: DirectionWeights, gates: Gates,
                  input_forget):
    """Steps over ``projected`` (steps, batch, 4H), in the order the direction runs:
    (outputs (steps, batch, H), final h, final c)."""
    h, c = start
    steps, batch = projected.shape[:2]
    outputs = xp.zeros((steps, batch, gates.hidden), dtype=F32)
    final_h = xp.where((lengths > 0)[:, None], h, np.float32(0))
    for t in range(steps):
        running = (t < lengths)[:, None]
        pre = projected[t] + weights.product(xp, h)
        new_h, new_c = gates.step(pre, c, input_forget)
        outputs[t] = xp.where(running, new_h, np.float32(0))
        final_h = xp.where(running, new_h, final_h)
        c = xp.where(running, new_c, c)
        h = outputs[t]  # an ended sequence gives zeros, as onnxruntime's output row
    final_c = xp.where((lengths > 0)[:, None], c, np.float32(0))
    return outputs, final_h, final_c


def start_states(xp, initial_h, initial_c, d: int, batch: int, hidden: int):
    return tuple(xp.zeros((batch, hidden), dtype=F32) if s is None else s[d].astype(F32)
                 for s in (initial_h, initial_c))


# -- one direction, compiled ------------------------------------------------------------------

class RecurrentCodes:
    """Direction d's R as the compiled recurrence reads it without VNNI: its codes less the
    zero point (int16), transposed (a gate column a row), their column sums (int32) and the
    scale of each gate column (float32)."""

    def __init__(self, R, scale, zero_point, d: int):
        zero = direction_zero_point(zero_point, np.dtype(R.dtype), d)
        codes = R[d].astype(np.int16) - np.int16(zero)
        self.codes = np.ascontiguousarray(codes.T)
        self.column_sums = codes.sum(axis=0, dtype=np.int64).astype(np.int32)
        self.scale = column_scales(scale, d, codes.shape[1])
        self.exact = sums_fit(codes)


class VnniCodes:
    """Direction d's W or R as the VNNI tile reads it (ops/quant/_jit_int8.py): signed 8-bit
    codes in panels (an unsigned weight shifted by 128, its zero point with it), their
    column sums, the zero point and the scale of each gate column."""

    def __init__(self, weight, scale, zero_point, d: int):
        zero = direction_zero_point(zero_point, np.dtype(weight.dtype), d)
        shift = 128 if np.dtype(weight.dtype) == np.uint8 else 0
        signed = (weight[d].astype(np.int16) - shift).astype(np.int8)
        depth, wide = signed.shape
        self.k_groups, panels = -(-depth // 4), -(-wide // 32)
        padded = np.zeros((self.k_groups * 4, panels * 32), np.int8)
        padded[:depth, :wide] = signed
        # panel p, group g: columns 32p..32p+31, each as its four codes of k = 4g..4g+3
        self.panels = np.ascontiguousarray(
            padded.reshape(self.k_groups, 4, panels, 32).transpose(2, 0, 3, 1)).reshape(-1)
        self.column_sums = signed.sum(axis=0, dtype=np.int32)
        self.zero = zero - shift
        self.scale = column_scales(scale, d, wide)
        self.exact = sums_fit(weight[d].astype(np.int16) - np.int16(zero))


def column_scales(scale, d: int, wide: int):
    """Direction d's weight scale, one float32 per gate column (a writable copy: the
    compiled calls are listed for writable arrays, ops/compiled/kernels.json)."""
    return np.array(np.broadcast_to(scale.reshape(scale.shape[0], -1)[d], (wide,)),
                    dtype=F32, order="C")


def sums_fit(centered) -> bool:
    """Whether every sum of codes at most 255 from their zero point times these centered
    weight codes stays an int32."""
    reach = int(np.abs(centered).max()) if centered.size else 0
    return 255 * reach * centered.shape[0] < 2 ** 31


class CompiledGates:
    """Gates' operands as the compiled recurrence reads them: the summed bias, the
    peepholes, the clip and the activations' codes, alphas and betas."""

    def __init__(self, B, P, d: int, hidden: int, specs, clip):
        wide = 4 * hidden
        self.has_bias = B is not None
        self.bias = (B[d, :wide].astype(F32) + B[d, wide:].astype(F32)) if self.has_bias \
            else np.zeros(wide, F32)
        self.has_peepholes = P is not None
        self.peepholes = np.ascontiguousarray(P[d].astype(F32).reshape(3, hidden)) \
            if self.has_peepholes else np.zeros((3, hidden), F32)
        self.clip = LARGEST_F32 if clip is None else np.float32(clip)
        self.kinds = np.array([COMPILED_ACTIVATIONS[key] for key, _, _ in specs], np.int64)
        self.alphas = np.array([alpha for _, alpha, _ in specs], F32)
        self.betas = np.array([beta for _, _, beta in specs], F32)

    def operands(self, input_forget) -> tuple:
        return (self.bias, self.has_bias, self.peepholes, self.has_peepholes, self.clip,
                self.kinds, self.alphas, self.betas, bool(input_forget))


def compiled_kernels(xp, specs):
    """(the compiled module, whether it is the VNNI one) where the compiled tier runs here
    and every activation has its compiled form; else (None, False): the NumPy form."""
    if xp is not np or not jit_cpu.enabled() or not all(
            key in COMPILED_ACTIVATIONS for direction in specs for key, _, _ in direction):
        return None, False
    if int8_cpu.available():
        return jit_cpu.load(COMPILED_VNNI), True
    return jit_cpu.load(COMPILED), False


def vnni_projection(kernels, X, weights: VnniCodes):
    """X's input projection (steps, batch, 4H) through the VNNI tile, as
    DirectionWeights.product computes it; None where X is not finite."""
    rows, width = X.shape[0] * X.shape[1], X.shape[2]
    out = np.empty((rows, weights.scale.size), F32)
    x = np.ascontiguousarray(X, dtype=F32)
    if not x.flags.writeable:  # a read-only feed: the listed kernel takes writable arrays
        x = x.copy()
    if not kernels.project_vnni(x.reshape(-1), width,
                                weights.panels, weights.k_groups, weights.column_sums,
                                weights.zero, weights.scale, out):
        return None
    return out.reshape(X.shape[0], X.shape[1], weights.scale.size)


def compiled_direction(kernels, projected, lengths, start, weights, gates: CompiledGates,
                       input_forget):
    """run_direction in one compiled call, R's product through the VNNI tile where
    ``weights`` are VnniCodes: (outputs, final h, final c), or None where the NumPy form
    must run it (a hidden state that is not finite)."""
    steps, batch = projected.shape[:2]
    hidden = projected.shape[2] // 4
    h, c = (np.array(s, dtype=F32, order="C", copy=True) for s in start)
    outputs = np.zeros((steps, batch, hidden), F32)
    final_h = np.empty((batch, hidden), F32)
    states = (np.ascontiguousarray(lengths, dtype=np.int64), h, c, outputs, final_h)
    projected = np.ascontiguousarray(projected, dtype=F32)
    if isinstance(weights, VnniCodes):
        done = kernels.direction_vnni(projected, weights.panels, weights.k_groups,
                                      weights.column_sums, weights.zero, weights.scale,
                                      *gates.operands(input_forget), *states)
    else:
        done = kernels.direction(projected, weights.codes, weights.column_sums, weights.scale,
                                 *gates.operands(input_forget), *states)
    return (outputs, final_h, c) if done else None


def compiled_run(kernels, vnni, X, lengths, order, start, d: int, *, weights, recurrent,
                 gates: CompiledGates, input_forget, prepacked):
    """Direction d on the compiled tier: X's projection (through the VNNI tile, or as the
    NumPy form makes it), then the recurrence (:func:`compiled_direction`), run in reverse
    through ``order`` where given. ``weights`` and ``recurrent``: W's and R's codes, scale and
    zero point. None where the NumPy form must run it."""
    codes = VnniCodes if vnni else RecurrentCodes
    w_codes, r_codes = (kept(prepacked, positions, (name, codes.__name__, d),
                             lambda operands=operands: codes(*operands, d))
                        for name, positions, operands in (("W", W_INPUTS, weights),
                                                          ("R", R_INPUTS, recurrent)))
    if not (w_codes.exact and r_codes.exact):
        return None
    if vnni:
        projected = vnni_projection(kernels, X, w_codes)
        if projected is None:
            return None
    else:
        projected = input_projection(np, X, *weights, d, len(X), prepacked)
    return compiled_direction(kernels, projected if order is None else projected[order],
                              lengths, start, r_codes, gates, input_forget)


def present(**inputs) -> frozenset:
    """The node's input positions of those of ``inputs`` (B, P) that are given."""
    return frozenset(POSITIONS[name] for name, value in inputs.items() if value is not None)


def kept(prepacked, positions, key, make):
    """make(), kept in the node's ``_prepacked`` dict when the node's inputs at
    ``positions`` are all session constants (made once per session), else made anew."""
    if prepacked is None or not positions <= prepacked.get(CONSTANT_INPUTS, frozenset()):
        return make()
    value = prepacked.get(key)
    if value is None:
        value = prepacked.setdefault(key, make())
    return value


# -- the operator ----------------------------------------------------------------------------

@op(NAME, since=1, domain=COM_MICROSOFT, dtypes=frozenset({"float32"}))
def dynamic_quantize_lstm(xp, X, W, R, B=None, sequence_lens=None, initial_h=None,
                          initial_c=None, P=None, W_scale=None, W_zero_point=None,
                          R_scale=None, R_zero_point=None, *, activation_alpha=None,
                          activation_beta=None, activations=None, clip=None,
                          direction="forward", hidden_size=None, input_forget=0,
                          _prepacked=None):
    """(Y, Y_h, Y_c) of an LSTM whose products run on dynamically quantized 8-bit codes, as
    onnxruntime's CPU kernel computes them (see the module's docstring). ``_prepacked``: the
    node's dict where W or R are session constants, which keeps their prepared forms."""
    params = {"W_scale": W_scale, "W_zero_point": W_zero_point, "R_scale": R_scale,
              "R_zero_point": R_zero_point}
    prepacked = _prepacked if xp is np else None
    operands = (X, W, R, B, initial_h, initial_c, P)
    checked = prepacked.setdefault(CHECKED, set()) if prepacked is not None else set()
    layout = tuple(None if v is None else (v.shape, v.dtype)
                   for v in operands + tuple(params.values()))
    if layout not in checked:  # a node's later calls with the same operands' shapes pass
        _check_run(*operands, params, direction, hidden_size)
        checked.add(layout)
    seq_len, batch, _ = X.shape
    hidden, directions = R.shape[1], W.shape[0]
    lengths = step_counts(xp, sequence_lens, batch, seq_len)
    evaluated = int(lengths.max()) if batch else 0
    specs = kept(prepacked, frozenset(), "specs", lambda: onnxruntime_specs(
        activations, activation_alpha, activation_beta, directions))
    kernels, vnni = compiled_kernels(xp, specs)
    Y = xp.zeros((seq_len, directions, batch, hidden), dtype=F32)
    Y_h, Y_c = (xp.empty((directions, batch, hidden), dtype=F32) for _ in range(2))
    for d in range(directions):
        backwards = direction == "reverse" or d == 1
        order = (reversal_index(xp, lengths, evaluated), xp.arange(batch)) if backwards \
            else None
        start = start_states(xp, initial_h, initial_c, d, batch, hidden)
        result = None if kernels is None else compiled_run(
            kernels, vnni, X[:evaluated], lengths, order, start, d,
            weights=(W, W_scale, W_zero_point), recurrent=(R, R_scale, R_zero_point),
            gates=kept(prepacked, present(B=B, P=P), ("gates", d),
                       lambda: CompiledGates(B, P, d, hidden, specs[d], clip)),
            input_forget=input_forget, prepacked=prepacked)
        if result is None:
            projected = input_projection(xp, X, W, W_scale, W_zero_point, d, evaluated,
                                         prepacked)
            result = run_direction(
                xp, projected if order is None else projected[order], lengths, start,
                kept(prepacked, R_INPUTS, ("R", d),
                     lambda: DirectionWeights(xp, R, R_scale, R_zero_point, d)),
                Gates(xp, B, P, d, hidden, gate_activations(
                    xp, activations, activation_alpha, activation_beta, directions)[d], clip),
                input_forget)
        outputs, Y_h[d], Y_c[d] = result
        Y[:evaluated, d] = outputs if order is None else outputs[order]
    return Y, Y_h, Y_c


def input_projection(xp, X, W, W_scale, W_zero_point, d: int, evaluated: int, prepacked):
    """X's first ``evaluated`` steps through direction d's W, as onnxruntime computes it."""
    weights = kept(prepacked, W_INPUTS, ("W", d),
                   lambda: DirectionWeights(xp, W, W_scale, W_zero_point, d))
    return weights.product(xp, X[:evaluated].astype(F32, copy=False))


def _check_run(X, W, R, B, initial_h, initial_c, P, params, direction, hidden_size):
    """The operands as the kernel is called with them: present, shapes, weight types."""
    if any(value is None for value in params.values()):
        missing = [name for name, value in params.items() if value is None]
        raise ValueError(f"{NAME}: {', '.join(missing)} missing (required inputs)")
    check_shapes(_shape(X), _shape(W), _shape(R), _shape(B), _shape(initial_h),
                 _shape(initial_c), _shape(P), {n: _shape(v) for n, v in params.items()},
                 direction=direction, hidden_size=hidden_size)
    for name, weight in (("W", W), ("R", R)):
        if np.dtype(weight.dtype) not in WEIGHT_TYPES:
            raise ValueError(f"{NAME}: {name} is {np.dtype(weight.dtype).name}; expected "
                             f"int8 or uint8 codes")


@dynamic_quantize_lstm.infer
def _(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,
      W_scale=None, W_zero_point=None, R_scale=None, R_zero_point=None, *,
      direction="forward", hidden_size=None, **_):
    shape = lambda t: None if t is None else t.shape  # noqa: E731
    check_shapes(shape(X), shape(W), shape(R), shape(B), shape(initial_h), shape(initial_c),
                 shape(P), {"W_scale": shape(W_scale), "W_zero_point": shape(W_zero_point),
                            "R_scale": shape(R_scale), "R_zero_point": shape(R_zero_point)},
                 direction=direction, hidden_size=hidden_size)
    _check_types(W, R, W_scale, W_zero_point, R_scale, R_zero_point)
    if X.shape is None:
        return [TensorType(F32, None) for _ in range(3)]
    directions = 2 if direction == "bidirectional" else 1
    hidden = hidden_size or (R.shape[1] if R.shape is not None else None)
    seq, batch = X.shape[0], X.shape[1]
    state = (directions, batch, hidden)
    return [TensorType(F32, (seq, directions, batch, hidden)), TensorType(F32, state),
            TensorType(F32, state)]


def _check_types(W, R, W_scale, W_zero_point, R_scale, R_zero_point):
    """Where types are known: 8-bit weights, their zero points of the same type, float32
    scales."""
    for name, weight, zero_point in (("W", W, W_zero_point), ("R", R, R_zero_point)):
        if weight.dtype is not None and np.dtype(weight.dtype) not in WEIGHT_TYPES:
            raise ValueError(f"{NAME}: {name} is {np.dtype(weight.dtype).name}; expected "
                             f"int8 or uint8 codes")
        require_dtype(NAME, weight.dtype, **{f"{name}_zero_point": zero_point})
    require_float_scales(NAME, W_scale=W_scale, R_scale=R_scale)
