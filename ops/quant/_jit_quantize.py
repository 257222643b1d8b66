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
