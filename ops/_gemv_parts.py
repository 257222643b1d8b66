"""The compiled parts of a one-row product against a constant weight (``ops/matmul_cpu.py``'s
``one_row_product``): ``y[n] = a . w[n]`` for a run of the weight's rows, each row read once,
in order. Kept apart so that numba loads only when such a product first runs here.

The sums may be reassociated (``fastmath`` reassoc and contract, nothing about NaN or
infinities): that is what lets LLVM keep sixteen lanes of partial sums, as a BLAS does."""

from __future__ import annotations

import numpy as np
from numba import carray, cfunc, njit, types

_SIGNATURE = types.void(types.CPointer(types.voidptr), types.int64)
_jit = njit(nogil=True, cache=True, boundscheck=False, error_model="numpy",
            fastmath={"reassoc", "contract"})


@_jit
def _rows(words, a, w, y, index):
    """Part ``index``: rows start..stop of the flat (N, K) weight ``w``."""
    at = 1 + 3  # past the length word and the three arrays' sizes
    k = np.uint64(words[at])
    start, stop = words[at + 1 + index], words[at + 2 + index]
    for n in range(start, stop):
        base = np.uint64(n) * k
        total = a[0] * 0
        for j in range(k):
            total += a[j] * w[base + j]
        y[n] = total


@_jit
def _words(args):
    return carray(args[0], (carray(args[0], (1,), np.int64)[0],), np.int64)


@cfunc(_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def part_f(args, index):
    words = _words(args)
    _rows(words, carray(args[1], (words[1],), np.float32),
          carray(args[2], (words[2],), np.float32), carray(args[3], (words[3],), np.float32),
          index)


@cfunc(_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def part_d(args, index):
    words = _words(args)
    _rows(words, carray(args[1], (words[1],), np.float64),
          carray(args[2], (words[2],), np.float64), carray(args[3], (words[3],), np.float64),
          index)
