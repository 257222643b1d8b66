"""The CPU fast path of BatchNormalizationGrad in training mode: two sweeps over X and dY in
cache-sized chunks, written into the planned output.

The generic kernel (norm_grad.py) is a dozen whole-tensor NumPy expressions, each allocating a
temporary as big as X. Here every (image, channel) plane is one row of X viewed as
(N*C, L), and the intra-op threads take chunks of rows:

1. per row: its mean, its sum of squared deviations from that mean, the sum of dY and the sum
   of dY times the deviation, computed while the chunk is in cache; the rows of a channel are
   then combined in float64 (Chan et al.'s pairwise update), so the variance never comes from
   E[x^2] - E[x]^2 and its cancellation;
2. per row: dX = a dY + b X + c with per-channel a, b, c (the standardization's backward
   folded into three coefficients).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.conv_cpu import scratch_arrays
from mixrt.ops.norm_grad import batch_norm_grad
from mixrt.ops.parallel import parallel_rows

NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
# bytes of X per chunk of rows (with its temporary, inside L2). Smaller chunks lose the
# second thread to GIL hand-offs: 256 KiB chunks took 29.8 ms on ResNet's 64x112x112 batch,
# 1 MiB chunks 17.8 ms (one thread: 31 ms)
CHUNK_BYTES = 1 << 20


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
    _affine_rows(rows, coefficients, dx.reshape(n * c, -1))
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


def _row_parts(rows: int, length: int, itemsize: int):
    """Chunks of rows of about CHUNK_BYTES each, and the chunk size."""
    step = max(1, min(rows, CHUNK_BYTES // max(length * itemsize, 1)))
    return step, -(-rows // step)


def _row_stats(x, dy):
    """(mean, squared deviations, sum of dY, sum of dY x deviation) of every row, float64."""
    rows, length = x.shape
    stats = np.empty((4, rows), dtype=np.float64)
    step, chunks = _row_parts(rows, length, x.itemsize)

    def part(first, last):
        deviation = scratch_arrays(x.dtype, (step, length))[0]
        for start in range(first * step, min(last * step, rows), step):
            stop = min(start + step, rows)
            xs, ds, dev = x[start:stop], dy[start:stop], deviation[:stop - start]
            row_mean = xs.mean(axis=1, keepdims=True)
            np.subtract(xs, row_mean, out=dev)
            stats[0, start:stop] = row_mean[:, 0]
            stats[1, start:stop] = np.einsum("ij,ij->i", dev, dev)
            stats[2, start:stop] = ds.sum(axis=1)
            stats[3, start:stop] = np.einsum("ij,ij->i", ds, dev)
    parallel_rows(chunks, step * length, part)
    return stats


def _channel_terms(stats, n, c, length, scale, epsilon):
    """d scale, d bias and the (a, b, c) of dX = a dY + b X + c, per channel."""
    row_mean, squares, sum_dy, sum_dy_dev = (s.reshape(n, c) for s in stats)
    count = n * length
    mean = row_mean.mean(axis=0)
    shift = row_mean - mean  # each row's mean from its channel's
    variance = (squares.sum(axis=0) + length * (shift * shift).sum(axis=0)) / count
    inv_std = 1.0 / np.sqrt(variance + epsilon)
    d_bias = sum_dy.sum(axis=0)
    d_scale = inv_std * (sum_dy_dev + shift * sum_dy).sum(axis=0)
    a = inv_std * scale.astype(np.float64)
    b = -a * inv_std * d_scale / count
    return d_scale, d_bias, (a, b, -a * d_bias / count - b * mean)


def _affine_rows(rows, coefficients, target):
    """``target`` = a dY + b X + c, row by row (row r is channel r mod C)."""
    x, dy = rows
    count, length = x.shape
    channels = coefficients[0].shape[0]
    a, b, c = (np.tile(k.astype(x.dtype), count // channels)[:, None] for k in coefficients)
    step, chunks = _row_parts(count, length, x.itemsize)

    def part(first, last):
        term = scratch_arrays(x.dtype, (step, length))[0]
        for start in range(first * step, min(last * step, count), step):
            stop = min(start + step, count)
            rows_, scratch = slice(start, stop), term[:stop - start]
            np.multiply(dy[rows_], a[rows_], out=target[rows_])
            np.multiply(x[rows_], b[rows_], out=scratch)
            scratch += c[rows_]
            target[rows_] += scratch
    parallel_rows(chunks, step * length, part)
