"""GPU paths of ONNX's RandomNormal and RandomUniform (and their Like forms): without a
``seed`` attribute they draw from CuPy's generator of the current device, the stream that
``mixrt.random.seed`` reseeds per GPU (``ctx=mixrt.gpu(i)`` only that one's), as MXNet's
samplers (``ops/random/samplers.py``) and Dropout's masks do there; and the draws are made on
the device rather than on the host and copied. With a ``seed`` they keep the generic kernels'
host draws, so that one seed gives one result on every device.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import to_numpy_dtype
from mixrt.ops.random.random import (random_normal, random_normal_like, random_uniform,
                                     random_uniform_like)


def _typed(values, dtype, like=None):
    target = np.dtype(like) if dtype is None else to_numpy_dtype(dtype)
    return values.astype(target, copy=False)


@random_normal.fast("gpu")
def random_normal_gpu(xp, *, dtype=1, mean=0.0, scale=1.0, seed=None, shape=None):
    if seed is not None or shape is None:  # the host draw of a seed; the generic error
        return random_normal(xp, dtype=dtype, mean=mean, scale=scale, seed=seed, shape=shape)
    return _typed(mean + scale * xp.random.standard_normal(tuple(shape)), dtype)


@random_uniform.fast("gpu")
def random_uniform_gpu(xp, *, dtype=1, high=1.0, low=0.0, seed=None, shape=None):
    if seed is not None or shape is None:
        return random_uniform(xp, dtype=dtype, high=high, low=low, seed=seed, shape=shape)
    return _typed(low + (high - low) * xp.random.random(tuple(shape)), dtype)


@random_normal_like.fast("gpu")
def random_normal_like_gpu(xp, input, *, dtype=None, mean=0.0, scale=1.0, seed=None):
    if seed is not None:
        return random_normal_like(xp, input, dtype=dtype, mean=mean, scale=scale, seed=seed)
    return _typed(mean + scale * xp.random.standard_normal(input.shape), dtype, input.dtype)


@random_uniform_like.fast("gpu")
def random_uniform_like_gpu(xp, input, *, dtype=None, high=1.0, low=0.0, seed=None):
    if seed is not None:
        return random_uniform_like(xp, input, dtype=dtype, high=high, low=low, seed=seed)
    return _typed(low + (high - low) * xp.random.random(input.shape), dtype, input.dtype)
