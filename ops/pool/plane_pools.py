"""2-D MaxPool and AveragePool in compiled loops: over the stride-phase planes of
``ops/conv/phase_planes.py`` (``_jit_depthwise_pool.py``'s pool loop), and pools whose one
window is each whole plane (global pools, windows that cover the input) as one pass over
rows (``ops/nn/_jit_row_reductions.py``).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.jit_cpu import NATIVE
from mixrt.ops.conv.phase_planes import KERNELS as PLANE_KERNELS
from mixrt.ops.conv.phase_planes import phase_planes

ROW_KERNELS = "mixrt.ops.nn._jit_row_reductions"


def pool_suits(X, geometry) -> bool:
    return X.ndim == 4 and X.dtype in NATIVE and len(geometry[0]) == 2 and jit_cpu.enabled()


def pool2d(X, out, geometry, maximum: bool, counts=None):
    """MaxPool (``maximum``) or AveragePool (the window sums divided by ``counts``, one number
    or an (oh, ow) array) of X (N, C, H, W) into the C-contiguous ``out`` (N, C, oh, ow).
    X is copied into the phase planes first, so ``out`` may overlap it."""
    kernel, strides, dilations, begin, _, out_dims = geometry
    n, c = X.shape[:2]
    planes = phase_planes(X.reshape((1, n * c) + X.shape[2:]), kernel, strides, dilations,
                           begin, out_dims, -np.inf if maximum else 0)[0]
    acc = jit_cpu.scratch_array("acc", X.dtype, (planes.shape[2] * planes.shape[3],))
    divisor = np.ones(out_dims, X.dtype) if counts is None else np.ascontiguousarray(
        np.broadcast_to(np.asarray(counts, X.dtype), out_dims))
    jit_cpu.load(PLANE_KERNELS).pool(planes.reshape(-1), np.array(planes.shape, np.int64),
                    np.array(kernel, np.int64), out.reshape(-1),
                    np.array(out_dims, np.int64), strides[0], strides[1],
                    dilations[0], dilations[1], acc, maximum, divisor.reshape(-1))
    return out


def whole_plane_pool(X, out, maximum: bool, count=None) -> bool:
    """A pool whose one window holds each whole plane of X (N, C, *spatial) into ``out``
    (N, C, 1, ...): GlobalAveragePool / GlobalMaxPool, and Average/MaxPool windows that
    cover the input (an average divides by ``count``, the plane's size by default). False
    (nothing written) when the compiled loop does not apply."""
    call = whole_plane_call(X, out, maximum, count)
    if call is None:
        return False
    call(X)
    return True


def whole_plane_call(X, out, maximum: bool, count=None):
    """:func:`whole_plane_pool` of arrays shaped as X and ``out`` as a call of X (into
    ``out``), or None where the compiled loop does not apply: what a global pool's bound
    call makes (``inplace_cpu.bind_global_average_pool``)."""
    if not (X.dtype in NATIVE and out.dtype == X.dtype and X.ndim >= 3 and X.size > 0
            and X.flags.c_contiguous and out.flags.c_contiguous
            and out.size == X.shape[0] * X.shape[1] and jit_cpu.enabled()):
        return None
    rows = X.shape[0] * X.shape[1]
    n = X.size // rows
    flat, kernels = out.reshape(-1), jit_cpu.load(ROW_KERNELS)
    if maximum:
        return lambda X: kernels.row_maxima(X.reshape(-1), flat, rows, n)
    divisor = count or n
    return lambda X: kernels.row_means(X.reshape(-1), flat, rows, n, divisor)
