"""The CPU fast path of BatchNormalization in training mode (opset 14+), and the chunked-row
helpers it shares with BatchNormalizationGrad's (norm_grad_cpu.py).

The generic kernel (nn.py) takes the batch mean and variance with whole-tensor reductions and
normalizes with four whole-tensor expressions, each allocating a temporary as big as X. Here
every (image, channel) plane is one row of X viewed as (N*C, L), and the intra-op threads take
chunks of rows: one sweep for each row's mean and squared deviations (combined per channel in
float64), one sweep for Y = a X + b, written into the planned output. Inference mode keeps
whatever CPU path was registered before this module (nn_cpu.py's, imported first).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled.workspace import scratch_arrays
from mixrt.ops.elementwise.row_blocks import same_view
from mixrt.ops.nn import nn_cpu  # noqa: F401  (registers the inference path this one keeps)
from mixrt.ops.nn.norm import batch_normalization
from mixrt.ops.compiled.parallel import parallel_rows

NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
# bytes of X per chunk of rows (with its temporary, inside L2). Smaller chunks lose the
# second thread to GIL hand-offs: 256 KiB chunks took 29.8 ms in BatchNormalizationGrad on
# ResNet's 64x112x112 batch, 1 MiB chunks 17.8 ms (one thread: 31 ms)
CHUNK_BYTES = 1 << 20

# the CPU path of the versions this module serves, before it: inference mode goes there
_EARLIER = {kernel.since: kernel.fast.get("cpu") for kernel in batch_normalization.kernels}


def row_chunks(rows: int, length: int, itemsize: int):
    """Rows per chunk (about CHUNK_BYTES of them) and the number of chunks."""
    step = max(1, min(rows, CHUNK_BYTES // max(length * itemsize, 1)))
    return step, -(-rows // step)


def for_row_chunks(rows: int, length: int, itemsize: int, fn) -> None:
    """``fn(start, stop, step)`` over chunks of rows, the chunks split over the threads."""
    step, chunks = row_chunks(rows, length, itemsize)

    def part(first, last):
        for start in range(first * step, min(last * step, rows), step):
            fn(start, min(start + step, rows), step)
    parallel_rows(chunks, step * length, part)


def row_moments(x, stats, start, stop, step):
    """Mean and squared deviations of rows start..stop of ``x`` into ``stats[0:2]``; returns
    the deviations (a per-thread scratch, valid until the thread's next carve)."""
    deviation = scratch_arrays(x.dtype, (step, x.shape[1]))[0][:stop - start]
    row_mean = x[start:stop].mean(axis=1, keepdims=True)
    np.subtract(x[start:stop], row_mean, out=deviation)
    stats[0, start:stop] = row_mean[:, 0]
    stats[1, start:stop] = np.einsum("ij,ij->i", deviation, deviation)
    return deviation


def channel_moments(row_mean, squares, length: int):
    """Per-channel mean and population variance from per-row ones, rows (N, C) of ``length``
    elements each (Chan et al.'s pairwise combination, in float64)."""
    mean = row_mean.mean(axis=0)
    shift = row_mean - mean
    variance = (squares.sum(axis=0) + length * (shift * shift).sum(axis=0)) \
        / (row_mean.shape[0] * length)
    return mean, variance, shift


def affine_rows(x, a, b, target) -> None:
    """``target`` = a x + b row by row, ``a`` and ``b`` (rows, 1) in x's dtype."""
    def fn(start, stop, step):
        np.multiply(x[start:stop], a[start:stop], out=target[start:stop])
        target[start:stop] += b[start:stop]
    for_row_chunks(x.shape[0], x.shape[1], x.itemsize, fn)


def per_row(values, rows: int, dtype):
    """Per-channel ``values`` repeated for every (image, channel) row, as a column."""
    return np.tile(values.astype(dtype), rows // values.shape[0])[:, None]


@batch_normalization.fast("cpu")
def batch_normalization_cpu(xp, X, scale, B, input_mean, input_var, *, epsilon=1e-5,
                            momentum=0.9, training_mode=0, _outputs=1, out=None):
    if not (training_mode and _suits(X, scale, B, input_mean, input_var, out)):
        return _earlier(xp, X, scale, B, input_mean, input_var, epsilon=epsilon,
                        momentum=momentum, training_mode=training_mode, _outputs=_outputs,
                        out=out)
    n, c = X.shape[:2]
    x = X.reshape(n * c, -1)
    stats = np.empty((2, n * c), dtype=np.float64)
    for_row_chunks(x.shape[0], x.shape[1], x.itemsize,
                   lambda start, stop, step: row_moments(x, stats, start, stop, step))
    mean, variance, _ = channel_moments(stats[0].reshape(n, c), stats[1].reshape(n, c),
                                        x.shape[1])
    a = scale.astype(np.float64) / np.sqrt(variance + epsilon)
    b = B.astype(np.float64) - mean * a
    y = np.empty_like(X) if out is None else out
    affine_rows(x, per_row(a, n * c, X.dtype), per_row(b, n * c, X.dtype), y.reshape(x.shape))
    if _outputs == 1:
        return y
    running = (_running(input_mean, mean, momentum), _running(input_var, variance, momentum))
    return (y,) + running[:_outputs - 1]


def _running(previous, current, momentum):
    return (previous * momentum + current * (1.0 - momentum)).astype(previous.dtype)


def _suits(X, scale, B, mean, var, out) -> bool:
    params = (scale, B, mean, var)
    return (isinstance(X, np.ndarray) and X.flags.c_contiguous and X.ndim >= 2
            and X.dtype in NATIVE and all(isinstance(p, np.ndarray) for p in params)
            and (out is None or (out.dtype == X.dtype and out.shape == X.shape
                                 and out.flags.c_contiguous
                                 and (not np.may_share_memory(out, X)
                                      or same_view(out, X)))))


def _earlier(xp, *args, out=None, **attributes):
    """The CPU path registered before this module, else the generic kernel (with ``out``
    filled by copy)."""
    earlier = next((fn for fn in _EARLIER.values() if fn is not None), None)
    if earlier is not None:
        return earlier(xp, *args, out=out, **attributes)
    result = batch_normalization(xp, *args, **attributes)
    if out is None or isinstance(result, tuple):
        return result
    np.copyto(out, result)
    return out
