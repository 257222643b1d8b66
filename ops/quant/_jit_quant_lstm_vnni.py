"""DynamicQuantizeLSTM's products on AVX-512 VNNI: ``_jit_quant_lstm.py``'s direction with R's
product, and the input projection of every step, through ops/quant/_jit_int8.py's tile
(vpdpbusd: 64 multiply-adds of the raw uint8 codes and the weight's signed 8-bit codes an
instruction), the zero points applied to its exact sums as ops/quant/int8_cpu.py does:

    sum (q - zq)(w - zw) = sum q w - zw sum q - zq sum w + k zq zw

``panels``: a weight's VNNI panels of ``k_groups`` groups of four k, its signed codes'
``column_sums`` and ``weight_zero`` (the zero point, shifted with the codes). Loaded only
where ``int8_cpu.available()``: importing ``_jit_int8`` compiles its native-pool entry, which
LLVM cannot build without VNNI. On the bidirectional hidden-256 layer of 50 steps at batch
1, a step's product took ~3 us here against ~8 through the 16-bit dot products.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mixrt.ops.quant._jit_int8 import PANEL_COLUMNS, product
from mixrt.ops.quant._jit_quant_lstm import (ZERO, _first_final_h, _no_final_cell,
                                            _step_cells, f32, quantize)

_jit = njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")


@_jit
def _centered(raw, ldc, codes, lda, depth, zero, weight_zero, column_sums, sums):
    """sums (rows, n) = the exact sums of (codes - zero)(w - weight_zero) from the raw
    ones (rows x ldc)."""
    rows, n = sums.shape
    for r in range(rows):
        row_sum = np.int32(0)
        row = codes[r * lda:r * lda + depth]
        for k in range(depth):
            row_sum += np.int32(row[k])
        shift = np.int32(depth * zero * weight_zero - weight_zero * row_sum)
        totals, out = raw[r * ldc:r * ldc + n], sums[r]
        for j in range(n):
            out[j] = totals[j] - zero * column_sums[j] + shift


@_jit
def _vnni_sums(codes, rows, lda, depth, zero, panels, k_groups, column_sums, weight_zero,
               raw, sums):
    ldc = raw.size // rows
    product(codes, rows, lda, panels, k_groups, raw, ldc, 0, ldc // PANEL_COLUMNS)
    _centered(raw, ldc, codes, lda, depth, zero, weight_zero, column_sums, sums)


@_jit
def project_vnni(x, width, panels, k_groups, column_sums, weight_zero, weight_scale, out):
    """The input projection of every step, out (rows, 4 hidden) = x (rows of ``width``,
    flat) through dynamic codes times W's panels, scaled as DirectionWeights.product;
    False where x is not finite."""
    rows, wide = out.shape
    lda = 4 * k_groups
    codes = np.zeros(rows * lda, np.uint8)
    scale, zero = quantize(x, width, codes, lda)
    if scale == ZERO:
        return False
    sums = np.empty((rows, wide), np.int32)
    raw = np.empty(rows * ((wide + PANEL_COLUMNS - 1) // PANEL_COLUMNS) * PANEL_COLUMNS,
                   np.int32)
    _vnni_sums(codes, rows, lda, width, np.int32(zero), panels, k_groups, column_sums,
               np.int32(weight_zero), raw, sums)
    for r in range(rows):
        totals, values = sums[r], out[r]
        for j in range(wide):
            values[j] = f32(totals[j]) * (scale * weight_scale[j])
    return True


@_jit
def direction_vnni(projected, panels, k_groups, column_sums, weight_zero, weight_scale, bias,
                   has_bias, peepholes, has_peepholes, clip, kinds, alphas, betas,
                   input_forget, lengths, h, c, outputs, final_h):
    """:func:`direction` with R's product through the VNNI tile."""
    steps, batch, wide = projected.shape
    hidden, lda = wide // 4, 4 * k_groups
    _first_final_h(h, lengths, final_h)
    codes = np.zeros(batch * lda, np.uint8)
    raw = np.empty(batch * ((wide + PANEL_COLUMNS - 1) // PANEL_COLUMNS) * PANEL_COLUMNS,
                   np.int32)
    sums = np.empty((batch, wide), np.int32)
    gates, squashed, new_c = np.empty(wide, f32), np.empty(hidden, f32), np.empty(hidden, f32)
    for t in range(steps):
        scale, zero = quantize(h.reshape(-1), hidden, codes, lda)
        if scale == ZERO:
            return False
        _vnni_sums(codes, batch, lda, hidden, np.int32(zero), panels, k_groups, column_sums,
                   np.int32(weight_zero), raw, sums)
        _step_cells(t, scale, sums, projected, weight_scale, bias, has_bias, peepholes,
                    has_peepholes, clip, kinds, alphas, betas, input_forget, lengths, h, c,
                    outputs, final_h, gates, squashed, new_c)
    _no_final_cell(c, lengths)
    return True
