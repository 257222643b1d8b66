"""Random operators: RandomNormal/Uniform(+Like), Bernoulli, Multinomial.

Values are drawn on the host from NumPy generators and moved to the device: with a ``seed``
attribute a fresh generator seeded from it makes the node deterministic (every run gives the
same values); without one, draws come from a module-level generator that
``mixrt.random.seed`` reseeds (:func:`reseed`). ONNX says outputs may
differ between implementations even with a seed, so only reproducibility within mixrt holds.
"""

from __future__ import annotations

import struct

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS, to_numpy_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType

_GENERATOR = np.random.default_rng()


def reseed(value: int) -> None:
    """Reseed the stream unseeded random ops draw from (``mixrt.random.seed`` calls this);
    its own stream, so that drawing dropout masks does not shift parameter initialization."""
    global _GENERATOR
    _GENERATOR = np.random.default_rng([int(value), 0x6f7073])


def unseeded_generator() -> np.random.Generator:
    """Where random ops without a ``seed`` attribute draw from (Dropout's masks included)."""
    return _GENERATOR


def _generator(seed):
    if seed is None:
        return _GENERATOR
    # The seed is a float attribute: use all its bits so that 1.0 and 1.5 differ.
    return np.random.default_rng(struct.unpack("<Q", struct.pack("<d", float(seed)))[0])


def _output_dtype(dtype, like=None):
    if dtype is None:
        return np.dtype(like) if like is not None else np.dtype(np.float32)
    return to_numpy_dtype(dtype)


def _finish(xp, values, dtype):
    """Host float64 draws -> device array of the requested dtype."""
    return xp.asarray(values.astype(dtype))


@op("RandomNormal", since=22, random=True)
@op("RandomNormal", since=1, random=True)
def random_normal(xp, *, dtype=1, mean=0.0, scale=1.0, seed=None, shape=None):
    if shape is None:
        raise ValueError("RandomNormal requires the 'shape' attribute")
    values = _generator(seed).normal(mean, scale, size=tuple(shape))
    return _finish(xp, values, _output_dtype(dtype))


@op("RandomUniform", since=22, random=True)
@op("RandomUniform", since=1, random=True)
def random_uniform(xp, *, dtype=1, high=1.0, low=0.0, seed=None, shape=None):
    if shape is None:
        raise ValueError("RandomUniform requires the 'shape' attribute")
    values = _generator(seed).uniform(low, high, size=tuple(shape))
    return _finish(xp, values, _output_dtype(dtype))


@op("RandomNormalLike", since=22, random=True)
@op("RandomNormalLike", since=1, random=True)
def random_normal_like(xp, input, *, dtype=None, mean=0.0, scale=1.0, seed=None):
    values = _generator(seed).normal(mean, scale, size=input.shape)
    return _finish(xp, values, _output_dtype(dtype, input.dtype))


@op("RandomUniformLike", since=22, random=True)
@op("RandomUniformLike", since=1, random=True)
def random_uniform_like(xp, input, *, dtype=None, high=1.0, low=0.0, seed=None):
    values = _generator(seed).uniform(low, high, size=input.shape)
    return _finish(xp, values, _output_dtype(dtype, input.dtype))


@op("Bernoulli", since=22, dtypes=FLOATS, random=True)
@op("Bernoulli", since=15, dtypes=FLOATS, random=True)
def bernoulli(xp, input, *, dtype=None, seed=None):
    """1 with probability p (the input), else 0: a uniform draw below p."""
    draws = xp.asarray(_generator(seed).random(size=input.shape))
    return (draws < input.astype(np.float64)).astype(_output_dtype(dtype, input.dtype))


@op("Multinomial", since=22, dtypes=FLOATS, random=True)
@op("Multinomial", since=7, dtypes=FLOATS, random=True)
def multinomial(xp, input, *, dtype=6, sample_size=1, seed=None):
    """Class indices drawn per batch row from softmax(input) (the input holds log-odds)."""
    logits = input.astype(np.float64)
    probs = xp.exp(logits - logits.max(axis=1, keepdims=True))
    cdf = xp.cumsum(probs, axis=1)
    cdf = cdf / cdf[:, -1:]
    draws = xp.asarray(_generator(seed).random(size=(input.shape[0], sample_size)))
    # The sample is the first class whose cumulative probability exceeds the draw.
    classes = (draws[:, :, None] >= cdf[:, None, :]).sum(axis=-1)
    return xp.minimum(classes, input.shape[1] - 1).astype(_output_dtype(dtype))


def _shape_of_attr(*_, dtype=1, shape=None, **__):
    return [TensorType(_output_dtype(dtype), None if shape is None else tuple(shape))]


def _shape_of_input(input, *_, dtype=None, **__):
    return [TensorType(_output_dtype(dtype, input.dtype), input.shape)]


random_normal.infer(_shape_of_attr)
random_uniform.infer(_shape_of_attr)
random_normal_like.infer(_shape_of_input)
random_uniform_like.infer(_shape_of_input)
bernoulli.infer(_shape_of_input)


@multinomial.infer
def _infer_multinomial(input, *, dtype=6, sample_size=1, **_):
    batch = None if input.shape is None else input.shape[0]
    return [TensorType(_output_dtype(dtype), (batch, sample_size))]
