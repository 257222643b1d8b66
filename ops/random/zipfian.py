"""``mixrt::SampleUniqueZipfian``: distinct classes from the approximate Zipfian
(log-uniform) distribution over [0, range_max), per row (MXNet's ``_sample_unique_zipfian``,
the candidate sampler of sampled softmax).

A draw is ``floor(exp(u * log(range_max + 1))) - 1`` with ``u`` uniform in [0, 1), so class
``k`` comes with probability ``log((k + 2) / (k + 1)) / log(range_max + 1)``. Draws repeat
until a row holds ``num_sampled`` distinct classes; the second output counts the draws each
row took (what the sampled softmax's expected counts are computed from). The classes keep
the order they were first drawn in.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.random.samplers import device_stream

_MIN_CHUNK = 1024  # draws taken at a time while a row is still short of distinct classes


@op("SampleUniqueZipfian", domain=MIXRT, random=True)
def sample_unique_zipfian(xp, key=None, *, range_max: int = 1, shape=(1,)):
    rows, num_sampled = _checked(range_max, shape)
    stream = device_stream(np) if xp is np else np.random.default_rng(
        int(xp.random.randint(0, 2 ** 31)))
    classes = np.empty((rows, num_sampled), dtype=np.int64)
    tries = np.empty(rows, dtype=np.int64)
    for row in range(rows):
        classes[row], tries[row] = _unique_row(stream, range_max, num_sampled)
    return xp.asarray(classes), xp.asarray(tries)


def _unique_row(stream, range_max: int, num_sampled: int) -> tuple[np.ndarray, int]:
    log_range = math.log(range_max + 1)
    drawn = np.empty(0, dtype=np.int64)
    while True:
        chunk = max(_MIN_CHUNK, 2 * num_sampled)
        values = np.exp(stream.random(chunk) * log_range).astype(np.int64) - 1
        drawn = np.concatenate([drawn, values])  # each in [0, range_max)
        _, first = np.unique(drawn, return_index=True)
        if len(first) >= num_sampled:
            first = np.sort(first)[:num_sampled]
            return drawn[first], int(first[-1]) + 1


def _checked(range_max, shape) -> tuple[int, int]:
    shape = tuple(int(d) for d in shape)
    if len(shape) != 2:
        raise ValueError(f"SampleUniqueZipfian: shape must be (batch_size, num_sampled), "
                         f"got {shape}")
    if range_max < 1 or shape[1] > range_max:
        raise ValueError(f"SampleUniqueZipfian: num_sampled ({shape[1]}) must be at most "
                         f"range_max ({range_max}), which must be positive")
    return shape


@sample_unique_zipfian.infer
def _(key=None, *, range_max: int = 1, shape=(1,), **_):
    rows, num_sampled = _checked(range_max, shape)
    return [TensorType(np.dtype(np.int64), (rows, num_sampled)),
            TensorType(np.dtype(np.int64), (rows,))]


@sample_unique_zipfian.grad
def _(b, node, dy):
    return [None] * len(node.inputs)
