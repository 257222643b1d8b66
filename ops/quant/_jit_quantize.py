"""Per-tensor QuantizeLinear and DequantizeLinear compiled by numba
(``ops/quant/quantize_cpu.py``): one pass over the tensor, where the NumPy forms of
``ops/quant/quantize.py`` take seven with float64 temporaries (a QDQ MobileNetV3 spent 46 of its 55
ms in them). The arithmetic is theirs: the division or product in float32, rounding half to even of
that float32 value, the zero point added exactly, then clamped to the type's range. A NaN becomes
0, as NumPy's cast of NaN to an 8-bit integer gives on x86.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_jit = njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")


@_jit
def quantize(x, scale, zero, low, high, y):
    """y = clamp(rint(x / scale) + zero, low, high) over flat float32 x, integer y."""
    for i in range(x.shape[0]):
        scaled = x[i] / scale
        if scaled != scaled:
            y[i] = 0
            continue
        value = np.float64(np.rint(scaled)) + zero
        y[i] = low if value < low else (high if value > high else value)


@_jit
def dequantize(x, scale, zero, y):
    """y = float32(x - zero) * scale over flat integer x, float32 y."""
    for i in range(x.shape[0]):
        y[i] = np.float32(np.int64(x[i]) - zero) * scale


@_jit
def requantize_channels(total, bias, multiplier, zero, low, high, y):
    """y = clamp(rint((total + bias[c]) * multiplier[c]) + zero, low, high) over total
    (N, C, P) float32 sums, integer y of that shape: QLinearConv's requantization
    (``quantize.requantize_sum``) in one pass, each step in float32 as there (the
    zero point added exactly; a multiplier here is finite)."""
    for i in range(total.shape[0]):
        for c in range(total.shape[1]):
            shift, scale = bias[c], multiplier[c]
            for j in range(total.shape[2]):
                value = np.float64(np.rint((total[i, c, j] + shift) * scale)) + zero
                y[i, c, j] = low if value < low else (high if value > high else value)


# -- DynamicQuantizeLinear ---------------------------------------------------------------------
#
# ``ops/quant/quantize_cpu.dynamic_quantize_cpu`` made the range with NumPy's min and max and
# the codes with ``quantize`` above, three calls and the scalar steps in Python between them:
# ~11 us for BERT's 16 x 768 activations, 17 times a run of a dynamically quantized 4-layer
# encoder. Here it is one call of two passes that vectorize. The range is taken on the
# values' bits as ordered integers (a negative float's magnitude bits flipped: integer
# minima and maxima vectorize where float ones, NaN-aware, stayed scalar at ~0.55 ns a value),
# with the largest exponent field, which says whether any value is NaN or infinite; the
# codes then have no NaN to test for.

EXPONENT = np.int32(0x7F800000)  # a float32's exponent bits: all set for NaN and infinity
MAGNITUDE = np.int32(0x7FFFFFFF)


@_jit
def _ordered_range(bits):
    """(the least and the greatest ordered key, the largest exponent field) of the float32
    values whose bits are ``bits`` (int32, flat, not empty); a key is the bits with a
    negative value's magnitude flipped, so keys order as the values do."""
    low, high, exponents = MAGNITUDE, -MAGNITUDE - np.int32(1), np.int32(0)
    for i in range(bits.shape[0]):
        b = bits[i]
        key = b ^ ((b >> np.int32(31)) & MAGNITUDE)
        low = key if key < low else low
        high = key if key > high else high
        exponent = b & EXPONENT
        exponents = exponent if exponent > exponents else exponents
    return low, high, exponents


@_jit
def _key_value(key, scratch):
    """The float32 whose ordered key is ``key`` (through ``scratch``, one int32)."""
    scratch[0] = key ^ ((key >> np.int32(31)) & MAGNITUDE)
    return scratch.view(np.float32)[0]


@_jit
def dynamic_quantize(x, y):
    """DynamicQuantizeLinear of flat float32 x into uint8 y: (whether it was done, scale,
    zero point). The NumPy form's arithmetic, in float32: the range widened to hold 0,
    scale = (high - low) / 255 (1 where it is 0), zero = clamp(rint(-low / scale), 0, 255),
    codes clamp(rint(x / scale) + zero, 0, 255), each a whole number under 2**24 and so
    exact in float32. Not done (False) where a value is NaN or infinite."""
    low_key, high_key, exponents = _ordered_range(x.view(np.int32))
    if exponents == EXPONENT:
        return False, np.float32(0), 0
    scratch = np.empty(1, np.int32)
    lowest, highest = _key_value(low_key, scratch), _key_value(high_key, scratch)
    zero32 = np.float32(0)
    low = lowest if lowest < zero32 else zero32
    high = highest if highest > zero32 else zero32
    scale = np.float32((high - low) / np.float32(255))
    safe = np.float32(1) if scale == 0 else scale
    point = np.rint(np.float32(-low / safe))
    point = np.float32(0) if point < 0 else (np.float32(255) if point > 255 else point)
    for i in range(x.shape[0]):
        code = np.rint(x[i] / safe) + point
        code = np.float32(0) if code < 0 else (np.float32(255) if code > 255 else code)
        y[i] = np.uint8(code)
    return True, scale, int(point)
