"""PairwiseSquaredDistances (mixrt domain): every row of X against every row of R, the
distances a nearest-neighbours model computes.

skl2onnx converts scikit-learn's kNN models with a Scan over the training rows whose body
subtracts one row from the whole batch and sums the squares (``runtime/passes/
fuse_scan_distances.py`` replaces that Scan by this op). A Scan step per training row costs
a node dispatch per row (1,797 for the digits set); here the differences of a block of
rows are formed at once. They are differences, not ``|x|^2 + |r|^2 - 2 x.r`` through BLAS,
so a neighbour at distance 0 stays at exactly 0 as in the Scan.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.parallel import parallel_for, thread_parts
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType

MIXRT = "mixrt"
FLOATS = frozenset({"float32", "float64", "float16"})
# elements of the [rows of R, rows of X, features] difference block formed at once
_BLOCK_ELEMENTS = 1 << 20


@op("PairwiseSquaredDistances", since=1, domain=MIXRT, dtypes=FLOATS)
def pairwise_squared_distances(xp, X, R, *, root=0):
    """[T, N]: ``sum_d (X[n, d] - R[t, d])^2`` (its square root with ``root=1``), in X's
    dtype; row t is the Scan's output of step t."""
    if X.ndim != 2 or R.ndim != 2 or X.shape[1] != R.shape[1]:
        raise ValueError(f"X {tuple(X.shape)} and R {tuple(R.shape)} must be matrices with "
                         f"the same number of columns")
    kernels = _compiled(xp, X, R)
    if kernels is not None:  # one loop per distance, R's rows split between the threads
        out, transposed = np.empty((R.shape[0], X.shape[0]), X.dtype), X.T.copy()
        parallel_for(thread_parts(R.shape[0], out.size * X.shape[1]), lambda start, stop:
                     kernels.squared_distances(transposed, R, out, start, stop))
        return np.sqrt(out) if root else out
    step = max(1, _BLOCK_ELEMENTS // max(1, X.shape[0] * X.shape[1]))
    blocks = []
    for start in range(0, R.shape[0], step):
        difference = X[None, :, :] - R[start:start + step, None, :]
        blocks.append((difference * difference).sum(axis=2))
    out = (xp.concatenate(blocks, axis=0) if blocks
           else xp.zeros((0, X.shape[0]), X.dtype)).astype(X.dtype, copy=False)
    return xp.sqrt(out) if root else out


def _compiled(xp, X, R):
    """ops/ml/_jit_distances.py for host float32 or float64 matrices of one dtype, both
    contiguous, R not empty, with the compiled tier on; else None (the NumPy form)."""
    if xp is not np or X.dtype != R.dtype or X.dtype not in _COMPILED or not R.shape[0] \
            or not (X.flags.c_contiguous and R.flags.c_contiguous) or not jit_cpu.enabled():
        return None
    return jit_cpu.load("mixrt.ops.ml._jit_distances")


_COMPILED = frozenset(np.dtype(t) for t in (np.float32, np.float64))


@pairwise_squared_distances.infer
def _(X, R, **_):
    rows = None if R.shape is None else R.shape[0]
    batch = None if X.shape is None else X.shape[0]
    return [TensorType(X.dtype, (rows, batch))]
