"""Linear-algebra operators: Det."""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType


@op("Det", since=22, dtypes=FLOATS)
@op("Det", since=11, dtypes=FLOATS)
def det(xp, X):
    """Determinants of the trailing square matrices of X (shape [*, M, M] -> [*])."""
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise ValueError(f"Det: expected [*, M, M] square matrices, got shape {X.shape}")
    # LAPACK has no half-precision routines: float16/bfloat16 go through float32.
    compute = np.float64 if X.dtype == np.float64 else np.float32
    return xp.asarray(xp.linalg.det(X.astype(compute, copy=False))).astype(X.dtype, copy=False)


@det.infer
def _infer_det(X, **_):
    return [TensorType(X.dtype, None if X.shape is None else X.shape[:-2])]
