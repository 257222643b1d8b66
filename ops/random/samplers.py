"""MXNet's samplers as mixrt-domain operators: the distributions ONNX lacks, per-element
parameters, integers, multinomial draws with their log-probabilities, and shuffling.

* ``SampleUniform``, ``SampleNormal``, ``SampleGamma``, ``SampleExponential``,
  ``SamplePoisson``, ``SampleNegativeBinomial``, ``SampleGeneralizedNegativeBinomial``: the
  parameters are tensors of one shape P and ``shape`` is the number of samples drawn for
  each parameter set, so the output has shape P + shape (MXNet's ``_sample_*``). A scalar
  parameter is a 0-d tensor, which gives MXNet's ``_random_*`` (output shape ``shape``).
* ``RandomInteger``: integers uniform in [low, high) (MXNet's ``_random_randint``).
* ``SampleMultinomial``: class indices drawn from the probabilities along the last axis of
  ``data``, and on request their log-probabilities (MXNet's ``_sample_multinomial``).
* ``Shuffle``: ``data`` with its first axis permuted at random (MXNet's ``_shuffle``).

Where the draws come from: on the CPU, the host stream that ``mixrt.random.seed`` reseeds
(``random.unseeded_generator``, which ONNX's random ops without a ``seed`` use too); on a
GPU, CuPy's generator of the current device, which ``mixrt.random.seed`` reseeds per device
(``ctx=gpu(i)`` only that one). The same seed therefore repeats a device's draws, as in
MXNet, though the CPU and a GPU give different values.

The optional ``key`` input: constant folding and the per-signature values a plan freezes
treat a node as a function of its inputs unless it is one of ONNX's random ops, which they
know by name. A sampler whose parameters are all constants would be folded into one fixed
draw. ``mixrt.sym`` therefore gives each sampler node a ``key`` computed by a
``RandomUniform`` node; its values are not read, it only makes the node depend on a random
op. Imperative calls, which nothing folds, leave it out.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS, to_numpy_dtype
from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.random.random import unseeded_generator

FLOAT32, INT32 = 1, 6  # ONNX's element types: the default sample and index dtypes
# up to this many classes a multinomial draw compares against every cumulative probability
# at once; past it, a binary search per row costs less than the (rows, samples, classes) table
_COMPARED_CLASSES = 64


def device_stream(xp):
    """The generator a sampler draws from on the device ``xp`` computes on."""
    # a branch, not a kernel: the device picks the random stream (same distributions);
    # NumPy's Generator and the cupy.random module share the methods used here
    return unseeded_generator() if xp is np else xp.random


def _draw_shape(params, shape) -> tuple:
    return tuple(params[0].shape) + tuple(int(d) for d in (shape or ()))


def _per_sample(xp, param, shape):
    """``param`` in float64 with one trailing axis of length 1 per sample axis, so that it
    broadcasts against the draws (P + shape)."""
    extra = (1,) * len(shape or ())
    return xp.asarray(param, dtype=np.float64).reshape(tuple(param.shape) + extra)


def _check_same_shapes(op_type: str, params) -> None:
    shapes = [tuple(p.shape) for p in params]
    if any(s != shapes[0] for s in shapes[1:]):
        raise ValueError(f"{op_type}: the parameters must have one shape, got {shapes}")


def _sampled(xp, op_type, params, shape, dtype, draw):
    """Run ``draw(stream, *per-sample params, size)`` and cast to ``dtype``."""
    _check_same_shapes(op_type, params)
    size = _draw_shape(params, shape)
    values = draw(device_stream(xp), *[_per_sample(xp, p, shape) for p in params], size)
    return xp.asarray(values).astype(to_numpy_dtype(dtype), copy=False)


# -- the continuous and counting distributions -----------------------------------------------

def _uniform(stream, low, high, size):
    return low + (high - low) * stream.random(size)


def _normal(stream, mu, sigma, size):
    return mu + sigma * stream.standard_normal(size)


def _gamma(stream, alpha, beta, size):
    return stream.gamma(alpha, beta, size)  # alpha the shape, beta the scale


def _exponential(stream, lam, size):
    return stream.standard_exponential(size) / lam  # lam the rate


def _poisson(stream, lam, size):
    return stream.poisson(lam, size)


def _negative_binomial(stream, k, p, size):
    """Failures before the k-th success, success probability p: a Poisson draw whose rate
    is Gamma(k, (1 - p) / p), which also covers a real-valued k."""
    return stream.poisson(stream.gamma(k, (1.0 - p) / p, size))


def _generalized_negative_binomial(stream, mu, alpha, size):
    """Mean mu, variance mu + alpha mu^2: a Poisson draw whose rate is
    Gamma(1 / alpha, alpha mu); alpha = 0 is the Poisson distribution of mean mu (the gamma
    draw, of scale 0, is then 0 and mu is added instead)."""
    undispersed = alpha <= 0
    rate = stream.gamma(1.0 / (alpha + undispersed), alpha * mu, size)
    return stream.poisson(rate + mu * undispersed)


@op("SampleUniform", domain=MIXRT, dtypes=FLOATS, random=True)
def sample_uniform(xp, low, high, key=None, *, shape=None, dtype=FLOAT32):
    """Uniform in [low, high) per parameter pair."""
    return _sampled(xp, "SampleUniform", [low, high], shape, dtype, _uniform)


@op("SampleNormal", domain=MIXRT, dtypes=FLOATS, random=True)
def sample_normal(xp, mu, sigma, key=None, *, shape=None, dtype=FLOAT32):
    """Normal with mean mu and standard deviation sigma per parameter pair."""
    return _sampled(xp, "SampleNormal", [mu, sigma], shape, dtype, _normal)


@op("SampleGamma", domain=MIXRT, dtypes=FLOATS, random=True)
def sample_gamma(xp, alpha, beta, key=None, *, shape=None, dtype=FLOAT32):
    """Gamma with shape alpha and scale beta (mean alpha beta) per parameter pair."""
    return _sampled(xp, "SampleGamma", [alpha, beta], shape, dtype, _gamma)


@op("SampleExponential", domain=MIXRT, dtypes=FLOATS, random=True)
def sample_exponential(xp, lam, key=None, *, shape=None, dtype=FLOAT32):
    """Exponential with rate lam (mean 1 / lam) per parameter."""
    return _sampled(xp, "SampleExponential", [lam], shape, dtype, _exponential)


@op("SamplePoisson", domain=MIXRT, dtypes=FLOATS, random=True)
def sample_poisson(xp, lam, key=None, *, shape=None, dtype=FLOAT32):
    """Poisson counts of mean lam per parameter, as floats."""
    return _sampled(xp, "SamplePoisson", [lam], shape, dtype, _poisson)


@op("SampleNegativeBinomial", domain=MIXRT, dtypes=FLOATS, random=True)
def sample_negative_binomial(xp, k, p, key=None, *, shape=None, dtype=FLOAT32):
    """Failures before the k-th success with success probability p (mean k (1 - p) / p)."""
    return _sampled(xp, "SampleNegativeBinomial", [k, p], shape, dtype, _negative_binomial)


@op("SampleGeneralizedNegativeBinomial", domain=MIXRT, dtypes=FLOATS, random=True)
def sample_generalized_negative_binomial(xp, mu, alpha, key=None, *, shape=None,
                                         dtype=FLOAT32):
    """Counts of mean mu and dispersion alpha (variance mu + alpha mu^2)."""
    return _sampled(xp, "SampleGeneralizedNegativeBinomial", [mu, alpha], shape, dtype,
                    _generalized_negative_binomial)


SAMPLERS = (sample_uniform, sample_normal, sample_gamma, sample_exponential, sample_poisson,
            sample_negative_binomial, sample_generalized_negative_binomial)


def _sample_type(params, shape, dtype) -> list:
    """P + shape, P the parameters' shape (one shape, where inference knows them)."""
    known = [tuple(p.shape) for p in params if p.shape is not None]
    if any(s != known[0] for s in known if _static(s) and _static(known[0])):
        raise ValueError(f"the parameters must have one shape, got {known}")
    extra = tuple(int(d) for d in (shape or ()))
    return [TensorType(to_numpy_dtype(dtype), known[0] + extra if known else None)]


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def _infer_one_parameter(param, key=None, *, shape=None, dtype=FLOAT32, **_):
    return _sample_type([param], shape, dtype)


def _infer_two_parameters(first, second, key=None, *, shape=None, dtype=FLOAT32, **_):
    return _sample_type([first, second], shape, dtype)


for _handle in SAMPLERS:
    _handle.infer(_infer_one_parameter if _handle in (sample_exponential, sample_poisson)
                  else _infer_two_parameters)


# -- integers ------------------------------------------------------------------------------

@op("RandomInteger", domain=MIXRT, random=True)
def random_integer(xp, key=None, *, low=0, high=1, shape=None, dtype=INT32):
    """Integers uniform in [low, high)."""
    stream = device_stream(xp)
    size = tuple(int(d) for d in (shape or ()))
    # NumPy's Generator names it integers, CuPy (like NumPy's legacy RandomState) randint
    draw = getattr(stream, "integers", None) or stream.randint
    values = draw(int(low), int(high), size)
    return xp.asarray(values).astype(to_numpy_dtype(dtype), copy=False)


@random_integer.infer
def _(key=None, *, shape=None, dtype=INT32, **_):
    return [TensorType(to_numpy_dtype(dtype), tuple(int(d) for d in (shape or ())))]


# -- multinomial -----------------------------------------------------------------------------

@op("SampleMultinomial", domain=MIXRT, dtypes=FLOATS, random=True)
def sample_multinomial(xp, data, key=None, *, shape=None, get_prob=0, dtype=INT32):
    """For each distribution along the last axis of ``data`` (probabilities summing to 1),
    ``prod(shape)`` class indices; output shape ``data.shape[:-1] + shape``, or (1,) where
    that is empty (MXNet has no 0-d arrays). With ``get_prob`` a second output holds
    log(data[index]) in data's dtype.

    A draw is the first class whose cumulative probability exceeds a uniform number in
    [0, 1) (the last class if none does), MXNet's rule, so the probabilities are used as
    given, not normalised."""
    if data.ndim < 1 or data.shape[-1] < 1:
        raise ValueError(f"SampleMultinomial: data needs a last axis of classes, got shape "
                         f"{data.shape}")
    classes = data.shape[-1]
    drawn = _multinomial_shape(tuple(data.shape), shape)
    rows = data.reshape(-1, classes)
    cumulative = xp.cumsum(rows.astype(np.float64), axis=1)
    per_row = math.prod(int(d) for d in (shape or ()))
    uniform = xp.asarray(device_stream(xp).random((rows.shape[0], per_row)))
    picked = xp.minimum(_first_exceeding(xp, cumulative, uniform), classes - 1)
    samples = picked.reshape(drawn).astype(to_numpy_dtype(dtype), copy=False)
    if not get_prob:
        return samples
    chosen = xp.take_along_axis(rows, picked, axis=1)
    return samples, xp.log(chosen).reshape(drawn).astype(data.dtype, copy=False)


def _multinomial_shape(data_shape: tuple, shape) -> tuple:
    drawn = tuple(data_shape[:-1]) + tuple(int(d) for d in (shape or ()))
    return drawn or (1,)


def _first_exceeding(xp, cumulative, uniform):
    """Per row, how many cumulative probabilities are <= each uniform number: the index of
    the first that exceeds it."""
    if cumulative.shape[1] <= _COMPARED_CLASSES:
        return (uniform[:, :, None] >= cumulative[:, None, :]).sum(axis=2)
    # a binary search per row (the cumulative sums rise: probabilities are not negative)
    rows = [xp.searchsorted(cumulative[r], uniform[r], side="right")
            for r in range(cumulative.shape[0])]
    return xp.stack(rows) if rows else xp.zeros(uniform.shape, dtype=np.int64)


@sample_multinomial.infer
def _(data, key=None, *, shape=None, get_prob=0, dtype=INT32, **_):
    drawn = None if data.shape is None else _multinomial_shape(tuple(data.shape), shape)
    samples = TensorType(to_numpy_dtype(dtype), drawn)
    return [samples, TensorType(data.dtype, drawn)] if get_prob else [samples]


# -- shuffling --------------------------------------------------------------------------------

@op("Shuffle", domain=MIXRT, random=True)
def shuffle(xp, data, key=None):
    """``data`` with its first axis in a random order (each order equally likely)."""
    if data.ndim < 1:
        raise ValueError("Shuffle: data must have at least one axis, got a 0-d array")
    return data[xp.asarray(device_stream(xp).permutation(data.shape[0]))]


@shuffle.infer
def _(data, key=None, **_):
    if data.shape is not None and len(data.shape) < 1:
        raise ValueError("Shuffle: data must have at least one axis, got a 0-d array")
    return [TensorType(data.dtype, data.shape)]
