"""MXNet's ``random_pdf_*``: the density (or, with ``is_log``, its log) of samples under
per-element distributions, and its gradient, as ``mixrt::RandomPdf``.

The parameters share one shape P, and ``sample`` has shape P + E: each parameter set scores
the samples below it; the output has the sample's shape (a Dirichlet's parameters and
samples end in the axis of its k categories, which the output loses). Every input has one
float dtype, the output's.

The formulas are MXNet 1.9.1's (``beta`` of a gamma is its rate; nothing checks that a
sample lies in the support: a uniform's density is 1 / (high - low) everywhere, an
exponential's lam exp(-lam x) at negative x too). The discrete distributions' densities
take real samples through log Gamma, and pass no gradient to them, as in MXNet. One
departure: a generalized negative binomial of dispersion alpha = 0 is its Poisson limit
(MXNet gives NaN).

The gradient (``ops/random/pdf_grad.py``) reaches the sample and every parameter, each
parameter's summed over the samples it scores.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.random.special import digamma, lgamma

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


# -- the log-densities and their derivatives (sample, first, second), in float64 -------------

def _uniform(xp, x, low, high):
    width = high - low
    log_f = -xp.log(width) + 0.0 * x
    return log_f, (0.0 * x, 1.0 / width + 0.0 * x, -1.0 / width + 0.0 * x)


def _normal(xp, x, mu, sigma):
    z = (x - mu) / sigma
    log_f = -0.5 * z * z - xp.log(sigma) - _HALF_LOG_2PI
    return log_f, (-z / sigma, z / sigma, (z * z - 1.0) / sigma)


def _gamma(xp, x, alpha, beta):
    """alpha the shape, beta the rate."""
    with np.errstate(divide="ignore", invalid="ignore"):
        log_x = xp.log(x)
        log_f = alpha * xp.log(beta) + (alpha - 1.0) * log_x - beta * x - lgamma(xp, alpha)
        gradients = ((alpha - 1.0) / x - beta, xp.log(beta) + log_x - digamma(xp, alpha),
                     alpha / beta - x)
    return log_f, gradients


def _exponential(xp, x, lam, _=None):
    return xp.log(lam) - lam * x, (-lam + 0.0 * x, 1.0 / lam - x)


def _poisson(xp, x, lam, _=None):
    with np.errstate(divide="ignore", invalid="ignore"):
        log_f = x * xp.log(lam) - lam - lgamma(xp, x + 1.0)
        return log_f, (0.0 * x, x / lam - 1.0)


def _negative_binomial(xp, x, k, p):
    """Failures x before the k-th success, success probability p."""
    with np.errstate(divide="ignore", invalid="ignore"):
        log_f = lgamma(xp, x + k) - lgamma(xp, x + 1.0) - lgamma(xp, k) + k * xp.log(p) \
            + x * xp.log1p(-p)
        gradients = (0.0 * x, digamma(xp, x + k) - digamma(xp, k) + xp.log(p),
                     k / p - x / (1.0 - p))
    return log_f, gradients


def _generalized_negative_binomial(xp, x, mu, alpha):
    """The negative binomial of k = 1 / alpha, p = 1 / (1 + alpha mu) (mean mu); at
    alpha = 0 the Poisson of mean mu, whose derivative in alpha is ((x - mu)^2 - x) / 2."""
    dispersed = alpha > 0
    a = xp.where(dispersed, alpha, 1.0)  # the Poisson limit is taken below, not here
    k, spread = 1.0 / a, 1.0 + a * mu
    with np.errstate(divide="ignore", invalid="ignore"):
        log_nb = lgamma(xp, x + k) - lgamma(xp, x + 1.0) - lgamma(xp, k) - k * xp.log(spread) \
            + x * xp.log(a * mu / spread)
        d_mu = x / mu - (1.0 + a * x) / spread
        d_alpha = (xp.log(spread) - digamma(xp, x + k) + digamma(xp, k)) / (a * a) \
            + (x - mu) / (a * spread)
        log_poisson, (_, d_mu_poisson) = _poisson(xp, x, mu)
    log_f = xp.where(dispersed, log_nb, log_poisson)
    return log_f, (0.0 * x, xp.where(dispersed, d_mu, d_mu_poisson),
                   xp.where(dispersed, d_alpha, 0.5 * ((x - mu) ** 2 - x)))


def _dirichlet(xp, x, alpha, _=None):
    """x and alpha end in the axis of the k categories (summed over: one density each)."""
    total = alpha.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_x = xp.log(x)
        log_f = lgamma(xp, total)[..., 0] + ((alpha - 1.0) * log_x
                                             - lgamma(xp, alpha)).sum(axis=-1)
        gradients = ((alpha - 1.0) / x, digamma(xp, total) - digamma(xp, alpha) + log_x)
    return log_f, gradients


DENSITIES = {"uniform": _uniform, "normal": _normal, "gamma": _gamma,
             "exponential": _exponential, "poisson": _poisson,
             "negative_binomial": _negative_binomial,
             "generalized_negative_binomial": _generalized_negative_binomial,
             "dirichlet": _dirichlet}
PARAMETER_COUNTS = {"exponential": 1, "poisson": 1, "dirichlet": 1}  # the others: 2


def density_of(distribution: str):
    found = DENSITIES.get(distribution)
    if found is None:
        raise ValueError(f"RandomPdf: distribution {distribution!r} is not one of "
                         f"{sorted(DENSITIES)}")
    return found


def aligned_inputs(xp, sample, params, distribution):
    """float64 copies, each parameter with length-1 axes where the sample has the extra
    axes E, so that it broadcasts over the samples it scores."""
    categories = 1 if distribution == "dirichlet" else 0
    shape = tuple(params[0].shape)
    lead = len(shape) - categories
    extra = sample.ndim - len(shape)
    if extra < 0 or tuple(sample.shape[:lead]) != shape[:lead] or (
            categories and sample.shape[-1] != shape[-1]):
        raise ValueError(f"RandomPdf: the parameters' shape {shape} must begin the "
                         f"sample's {tuple(sample.shape)}"
                         + (" and end it (the categories)" if categories else ""))
    if any(tuple(p.shape) != shape for p in params[1:]):
        raise ValueError(f"RandomPdf: the parameters must have one shape, got "
                         f"{[tuple(p.shape) for p in params]}")
    aligned = tuple(shape[:lead]) + (1,) * extra + tuple(shape[lead:])
    return (xp.asarray(sample, dtype=np.float64),
            [xp.asarray(p, dtype=np.float64).reshape(aligned) for p in params])


@op("RandomPdf", domain=MIXRT, dtypes=FLOATS)
def random_pdf(xp, sample, first, second=None, *, distribution="normal", is_log=0):
    """The density of ``sample`` under the distributions of parameters ``first`` (and
    ``second``); ``distribution``: one of :data:`DENSITIES`."""
    params = [p for p in (first, second) if p is not None]
    x, aligned = aligned_inputs(xp, sample, params, distribution)
    log_f, _ = density_of(distribution)(xp, x, *aligned)
    result = log_f if is_log else xp.exp(log_f)
    return xp.asarray(result).astype(sample.dtype, copy=False)


@random_pdf.infer
def _(sample, first, second=None, *, distribution="normal", **_):
    if sample.shape is None:
        return [TensorType(sample.dtype, None)]
    return [TensorType(sample.dtype, tuple(sample.shape[:-1]) if distribution == "dirichlet"
                       else tuple(sample.shape))]
