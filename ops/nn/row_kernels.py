"""Compiled loops over rows held in L1, for the dense layers: LayerNormalization and its RMS
form, Softmax's shift by the row max and scale by the row sum
(``_jit_row_reductions.py``), and products with up to eight rows against a transposed
weight (``_jit_few_rows.py``), each with the test of whether it applies.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.jit_cpu import NATIVE
from mixrt.ops.compiled.parallel import parallel_for, thread_parts

ROW_KERNELS = "mixrt.ops.nn._jit_row_reductions"
VECTOR_SOFTMAX = "mixrt.ops.panels._jit_vector_softmax"
FEW_ROWS_KERNELS = "mixrt.ops.nn._jit_few_rows"


def layer_norm_suits(X, Scale, B, out) -> bool:
    """float32 arrays (stash_type 1: float32 statistics), contiguous, normalized over the
    trailing axes that ``Scale`` (and ``B``) cover exactly; ``out`` may be ``X`` itself."""
    arrays = [a for a in (X, Scale, B, out) if a is not None]
    return (X.dtype == np.float32 and all(isinstance(a, np.ndarray) and a.dtype == X.dtype
                                      and a.flags.c_contiguous for a in arrays)
            and out.shape == X.shape and Scale.size > 0
            and (B is None or B.size == Scale.size) and jit_cpu.enabled())


def layer_norm(X, Scale, B, out, axis: int, epsilon: float):
    """LayerNormalization of X over its axes from ``axis`` on into ``out``; returns the call
    made, ``again(X, Scale, B, out)`` on arrays of these shapes (a replay's,
    ``ops/compiled/replay.py``), or None, nothing written, when Scale does not span exactly
    those axes (broadcast scales stay in NumPy)."""
    n = math.prod(X.shape[axis:])
    if Scale.size != n or X.size == 0:
        return None
    rows, epsilon, kernel = X.size // n, X.dtype.type(epsilon), \
        jit_cpu.load(ROW_KERNELS).layer_norm
    zeros = np.zeros(n, X.dtype) if B is None else None

    def again(X, Scale, B, out):
        kernel(X.reshape(-1), Scale.reshape(-1), zeros if B is None else B.reshape(-1),
               out.reshape(-1), rows, n, epsilon)
    again(X, Scale, B, out)
    return again


def rms_norm(X, scale, out, axis: int, epsilon: float):
    """SimplifiedLayerNormalization of float32 X over its axes from ``axis`` on into
    ``out`` (:func:`layer_norm_suits` holds for them); returns the call made,
    ``again(X, scale, out)``, as :func:`layer_norm` does, or None (nothing written) when
    ``scale`` does not span exactly those axes."""
    n = math.prod(X.shape[axis:])
    if scale.size != n or X.size == 0:
        return None
    rows, epsilon, kernel = X.size // n, X.dtype.type(epsilon), \
        jit_cpu.load(ROW_KERNELS).rms_norm

    def again(X, scale, out):
        kernel(X.reshape(-1), scale.reshape(-1), out.reshape(-1), rows, n, epsilon)
    again(X, scale, out)
    return again


# -- softmax -------------------------------------------------------------------------------------

def softmax_suits(rows, target) -> bool:
    """Contiguous (R, n) float32/float64 views, ``target`` either apart from ``rows`` or the
    same memory (in place)."""
    return (rows.dtype == target.dtype and rows.dtype in NATIVE
            and rows.flags.c_contiguous and target.flags.c_contiguous and jit_cpu.enabled())


def softmax_rows(rows, target, start: int, stop: int) -> None:
    """Softmax of rows start..stop of ``rows`` (R, n) into ``target`` (the same memory or
    apart: :func:`softmax_suits`), each row in one pass of vector IR in the CPU's width
    (ops/panels/_jit_vector_softmax.py), over a copy when apart. NumPy's float32 exp had run
    2.3 ns an element on an AMD EPYC Zen 3 between a compiled shift and scale."""
    n = rows.shape[1]
    out = target.reshape(-1)
    if not np.may_share_memory(rows, target):  # NumPy's copy: the compiled one went by element
        np.copyto(target[start:stop], rows[start:stop])
    jit_cpu.load(VECTOR_SOFTMAX).softmax_rows(out[start * n:stop * n], stop - start, n)


EIGHT_ROWS = 8  # rows the compiled product computes at once (fewer are padded with zeros)
# weight elements from which the product is split over the intra-op threads by columns
SPLIT_WEIGHT = 1 << 19


def few_rows_suits(a, bt, out) -> bool:
    """a (rows <= 8, K), bt (N, K) and out (rows, N): contiguous, one native float dtype."""
    return (a.ndim == bt.ndim == out.ndim == 2 and 1 <= a.shape[0] <= EIGHT_ROWS
            and a.dtype == bt.dtype == out.dtype and a.dtype in NATIVE
            and bt.flags.c_contiguous and out.flags.c_contiguous
            and a.shape[1] == bt.shape[1] and out.shape == (a.shape[0], bt.shape[0])
            and jit_cpu.enabled())


def few_rows_kernel():
    """The compiled few-rows loop for this CPU: two weight rows at a time (sixteen sums)
    where AVX-512's 32 vector registers hold them, one at a time (eight) on AVX2's 16."""
    kernels = jit_cpu.load(FEW_ROWS_KERNELS)
    return kernels.eight_rows if jit_cpu.vector_bytes() >= 64 else kernels.eight_rows_by_one


def few_rows_product(a, bt, out) -> None:
    """``out = a @ bt.T`` for a few rows (:func:`few_rows_suits`): the rows padded to eight in
    a scratch, the columns split over the intra-op threads for a large weight."""
    few_rows_call(a.shape, bt, out)(a)


def few_rows_call(a_shape, bt, out):
    """:func:`few_rows_product` for a of ``a_shape`` into ``out`` against ``bt``, as a call
    of ``a`` alone with this thread's scratch, the kernel and the split looked up once (a
    bound call keeps it for its arena and thread: ``ops/nn/bound_products.py``)."""
    rows, n = a_shape[0], bt.shape[0]
    padded = jit_cpu.scratch_array("few_rows_a", bt.dtype, (EIGHT_ROWS, a_shape[1]))
    target = out if rows == EIGHT_ROWS else jit_cpu.scratch_array("few_rows_out", bt.dtype,
                                                                  (EIGHT_ROWS, n))
    kernel = few_rows_kernel()

    def part(start, stop):
        kernel(padded, bt, target, start, stop)
    parts = None if bt.size < SPLIT_WEIGHT else thread_parts(n, bt.size)

    def call(a):
        padded[:rows] = a
        padded[rows:] = 0
        if parts is None:
            part(0, n)
        else:
            parallel_for(parts, part)
        if target is not out:
            np.copyto(out, target[:rows])
    return call
