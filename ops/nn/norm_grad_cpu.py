"""The CPU fast path of BatchNormalizationGrad in training mode: two sweeps over X and dY in
cache-sized chunks of rows (norm_cpu.py's), written into the planned output.

The generic kernel (norm_grad.py) is a dozen whole-tensor NumPy expressions, each allocating a
temporary as big as X. Here every (image, channel) plane is one row of X viewed as (N*C, L):

1. per row: its mean, its sum of squared deviations from that mean, the sum of dY and the sum
   of dY times the deviation, computed while the chunk is in cache; the rows of a channel are
   then combined in float64 (Chan et al.'s pairwise update), so the variance never comes from
   E[x^2] - E[x]^2 and its cancellation;
2. per row: dX = a dY + b X + c with per-channel a, b, c (the standardization's backward
   folded into three coefficients).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled.workspace import scratch_arrays
from mixrt.ops.nn.norm_cpu import (NATIVE, channel_moments, for_row_chunks, per_row,
                                row_moments)
from mixrt.ops.nn.norm_grad import batch_norm_grad


@batch_norm_grad.fast("cpu")
def batch_norm_grad_cpu(xp, dY, X, scale, mean=None, var=None, *, epsilon=1e-5, spatial=1,
                        training_mode=0, _outputs=3, out=None):
    if not (training_mode and _suits(dY, X, scale, out)):
        result = batch_norm_grad(xp, dY, X, scale, mean, var, epsilon=epsilon,
                                 spatial=spatial, training_mode=training_mode,
                                 _outputs=_outputs)
        return _first_into(out, result)
    n, c = X.shape[:2]
    rows = (X.reshape(n * c, -1), dY.reshape(n * c, -1))
    stats = _row_stats(*rows)
    d_scale, d_bias, coefficients = _channel_terms(stats, n, c, rows[0].shape[1], scale,
                                                   epsilon)
    dx = np.empty_like(X) if out is None else out
    _affine_rows(rows, [per_row(k, n * c, X.dtype) for k in coefficients],
                 dx.reshape(n * c, -1))
    grads = (dx, d_scale.astype(scale.dtype), d_bias.astype(scale.dtype))
    return grads[:_outputs] if _outputs > 1 else dx


def _suits(dY, X, scale, out) -> bool:
    arrays = (dY, X) if out is None else (dY, X, out)
    return (all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)
            and X.ndim >= 2 and X.dtype in NATIVE and isinstance(scale, np.ndarray)
            and all(a.dtype == X.dtype and a.shape == X.shape for a in arrays)
            and (out is None or not any(np.may_share_memory(out, a) for a in (dY, X))))


def _first_into(out, result):
    if out is None:
        return result
    first = result[0] if isinstance(result, tuple) else result
    np.copyto(out, first)
    return (out,) + tuple(result[1:]) if isinstance(result, tuple) else out


def _row_stats(x, dy):
    """(mean, squared deviations, sum of dY, sum of dY x deviation) of every row, float64."""
    stats = np.empty((4, x.shape[0]), dtype=np.float64)

    def fn(start, stop, step):
        deviation = row_moments(x, stats, start, stop, step)
        stats[2, start:stop] = dy[start:stop].sum(axis=1)
        stats[3, start:stop] = np.einsum("ij,ij->i", dy[start:stop], deviation)
    for_row_chunks(x.shape[0], x.shape[1], x.itemsize, fn)
    return stats


def _channel_terms(stats, n, c, length, scale, epsilon):
    """d scale, d bias and the (a, b, c) of dX = a dY + b X + c, per channel."""
    row_mean, squares, sum_dy, sum_dy_dev = (s.reshape(n, c) for s in stats)
    count = n * length
    mean, variance, shift = channel_moments(row_mean, squares, length)
    inv_std = 1.0 / np.sqrt(variance + epsilon)
    d_bias = sum_dy.sum(axis=0)
    d_scale = inv_std * (sum_dy_dev + shift * sum_dy).sum(axis=0)
    a = inv_std * scale.astype(np.float64)
    b = -a * inv_std * d_scale / count
    return d_scale, d_bias, (a, b, -a * d_bias / count - b * mean)


def _affine_rows(rows, coefficients, target):
    """``target`` = a dY + b X + c, row by row, with per-row columns a, b, c."""
    x, dy = rows
    a, b, c = coefficients

    def fn(start, stop, step):
        term = scratch_arrays(x.dtype, (step, x.shape[1]))[0][:stop - start]
        np.multiply(dy[start:stop], a[start:stop], out=target[start:stop])
        np.multiply(x[start:stop], b[start:stop], out=term)
        term += c[start:stop]
        target[start:stop] += term
    for_row_chunks(x.shape[0], x.shape[1], x.itemsize, fn)
