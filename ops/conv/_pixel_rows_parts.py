"""The compiled parts of a 1x1 convolution over small planes split by bands of pixel rows
(``ops/conv/pointwise_rows.py``): each part copies its band's pixels into rows, multiplies
them by every panel of the weight, and writes its band's outputs back with the epilogue.

Split the other way, by panels (``_jit_dense.pixel_rows_conv``), the copies in and out ran
on the calling thread alone, and half the products it read back had been written in the
other core's cache: 8 images of a 240 -> 40 layer at 6 x 6 took 81-87 us, its product 37 of
them. Here a band's rows stay in the core that made them. Kept apart so that numba loads only
when such a convolution first runs here.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types

from mixrt.ops.compiled.first_use import first_use_cfunc
from mixrt.ops.panels._jit_dense import panel_product
from mixrt.ops.panels._jit_tile import DENSE_ROWS, limited
from mixrt.ops.panels._jit_transpose import transpose

_SIGNATURE = types.void(types.CPointer(types.voidptr), types.int64)
_jit = njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
ARRAYS = 9  # x, rows, panels, products, y, bias, residual, spill, limits (all flat)
SCALARS = 7  # images, channels, pixels, outputs, panels' K, panels' width, the gate
# the epilogue after the clamp of ``limits`` (slope, low, high): none, or a hard gate
# g = clip(v * alpha + beta, 0, 1) with limits[3:6] = (alpha, beta, 1), as the output (HardSigmoid)
# or times v (HardSwish), in ops/elementwise/jit_elementwise.py's order of operations
CLAMP, HARD_SIGMOID, HARD_SWISH = 0, 1, 2


@_jit
def _band(words, x, rows, panels, products, y, bias, residual, spill, limits, index):
    """Part ``index``: the pixel rows ``bounds[index]..bounds[index + 1]`` (row b * pixels +
    i is image b's pixel i) through the whole weight."""
    at = 1 + ARRAYS
    n, c, p, m = words[at], words[at + 1], words[at + 2], words[at + 3]
    k_len, width, gate = words[at + 4], words[at + 5], words[at + 6]
    r0, r1 = words[at + SCALARS + index], words[at + SCALARS + index + 1]
    has_residual = residual.shape[0] > 0
    count = panels.shape[0] // (k_len * width)
    # three-dimensional views: numba's loops over them ran ~3x faster than flat indices
    outputs, sums = y.reshape((n, m, p)), products.reshape((n, p, m))
    added = residual.reshape((n, m, p)) if has_residual else outputs
    for b in range(r0 // p, (r1 - 1) // p + 1):  # x's pixels as rows, in blocks
        i0, i1 = max(r0 - b * p, 0), min(r1 - b * p, p)
        transpose(x, b * c * p + i0, p, rows, (b * p + i0) * c, c, c, i1 - i0)
    part_spill = spill[index * DENSE_ROWS * width:(index + 1) * DENSE_ROWS * width]
    panel_product(rows.reshape((n * p, c))[r0:r1], panels.reshape((count, k_len, width)),
                  products.reshape((n * p, m))[r0:r1], 0, count,
                  part_spill.reshape((DENSE_ROWS, width)), bias, bias[:0])
    slope, low, high = limits[0], limits[1], limits[2]  # the direct forms' order
    alpha, beta, one = limits[3], limits[4], limits[5]
    for b in range(r0 // p, (r1 - 1) // p + 1):  # the outputs, each written in order
        i0, i1 = max(r0 - b * p, 0), min(r1 - b * p, p)
        if has_residual:  # read and written one at a time: the residual may be y itself
            for j in range(m):
                for i in range(i0, i1):
                    outputs[b, j, i] = _finished(sums[b, i, j] + added[b, j, i], low, high,
                                                 slope, gate, alpha, beta, one)
            continue
        # the sums moved into place in blocks, then finished there in order
        transpose(products, (b * p + i0) * m, m, y, b * m * p + i0, p, i1 - i0, m)
        for j in range(m):
            for i in range(i0, i1):
                outputs[b, j, i] = _finished(outputs[b, j, i], low, high, slope, gate, alpha,
                                             beta, one)


@njit(inline="always")
def _finished(v, low, high, slope, gate, alpha, beta, one):
    """The clamp, then the gate (CLAMP: none). A NaN passes through both, as NumPy's
    maximum and minimum pass it. ``one``: 1 in v's dtype."""
    v = limited(v, low, high, slope)
    if gate == CLAMP:
        return v
    g = v * alpha + beta
    g = g if (g > 0 or g != g) else one - one
    g = g if (g < one or g != g) else one
    return g if gate == HARD_SIGMOID else v * g


@_jit
def _words(args):
    return carray(args[0], (carray(args[0], (1,), np.int64)[0],), np.int64)


@first_use_cfunc(_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def part_f(args, index):
    words = _words(args)
    _band(words, carray(args[1], (words[1],), np.float32),
          carray(args[2], (words[2],), np.float32), carray(args[3], (words[3],), np.float32),
          carray(args[4], (words[4],), np.float32), carray(args[5], (words[5],), np.float32),
          carray(args[6], (words[6],), np.float32), carray(args[7], (words[7],), np.float32),
          carray(args[8], (words[8],), np.float32), carray(args[9], (words[9],), np.float32),
          index)


@first_use_cfunc(_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def part_d(args, index):
    words = _words(args)
    _band(words, carray(args[1], (words[1],), np.float64),
          carray(args[2], (words[2],), np.float64), carray(args[3], (words[3],), np.float64),
          carray(args[4], (words[4],), np.float64), carray(args[5], (words[5],), np.float64),
          carray(args[6], (words[6],), np.float64), carray(args[7], (words[7],), np.float64),
          carray(args[8], (words[8],), np.float64), carray(args[9], (words[9],), np.float64),
          index)
