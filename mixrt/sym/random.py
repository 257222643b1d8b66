"""MXNet's random samplers as symbols: ``mx.sym.random.*`` and the flat names
``sym.random_uniform``, ``sym.uniform``, ``sym.sample_gamma``, ``sym.shuffle``, ...
(:data:`FLAT`).

    noise = sym.random.normal(0, 0.1, shape=(32, 100))          # (32, 100) float32
    y = sym.Variable("x") + noise
    draws = sym.random.gamma(sym.Variable("alpha"), sym.Variable("beta"), shape=5)

The arguments are ``mixrt.nd.random``'s (``mixrt/sampling.py`` reads and checks them once for
both) without ``ctx`` and ``out``; number parameters need ``shape``. A bound executor draws
fresh values at every forward, and ``mixrt.random.seed`` repeats them. Nodes are named as
MXNet names them (``_random_uniform0``, ``_sample_gamma1``) unless ``name=`` says otherwise.
Bad arguments raise GraphError naming the function and argument.

Each sampler node of the ``mixrt`` domain gets a ``key`` input from a RandomUniform node
(``<node>_key``): constant folding and the values a plan freezes per input signature
recognise ONNX's random ops only, and would otherwise take a sampler whose parameters are
constants for a constant (``ops/random/samplers.py`` says more).
"""

from __future__ import annotations

import numpy as np

from mixrt import sampling
from mixrt.base.errors import GraphError
from mixrt.ops.ir.registry import MIXRT
from mixrt.sym.symbol import call_op, layer_name, Symbol


class _SymbolBuilder(sampling.Builder):
    """The samplers' ops as nodes of a symbol."""

    error = GraphError
    array_type = Symbol

    def op(self, domain, op_type, inputs, attributes, *, ctx=None, name=None, label=None,
           num_outputs=1):
        node_name = layer_name(label, name) if label is not None else name
        if domain == MIXRT and op_type in sampling.DRAWING_OPS:
            inputs = list(inputs) + [self._key(node_name)]
        return call_op(domain, op_type, inputs, attributes, name=node_name,
                       num_outputs=num_outputs)

    @staticmethod
    def _key(node_name):
        return call_op("", "RandomUniform", [], {"shape": [1]},
                       name=None if node_name is None else f"{node_name}_key")

    def scalar(self, value, ctx):
        return np.asarray(value, dtype=np.float64)

    def both_outputs(self, result):
        return result  # one symbol with both outputs, as MXNet's


_SYMBOLS = _SymbolBuilder()


def _only_name(fn: str, kwargs: dict):
    """MXNet's symbol functions pass extra keywords to their op: here ``name``, and
    ``attr`` (MXNet's node attributes, which mixrt's nodes do not keep) and ``ctx`` (a
    symbol's device is the one it is bound on) are taken and dropped."""
    unknown = sorted(set(kwargs) - {"name", "attr", "ctx"})
    if unknown:
        raise GraphError(f"{fn}: unknown argument {unknown[0]!r}")
    return kwargs.get("name")


def _draw(distribution, fn, params, shape, dtype, kwargs):
    return sampling.draw(_SYMBOLS, distribution, fn, params, shape, dtype,
                         name=_only_name(fn, kwargs), default_shape=None)


# -- mx.sym.random ---------------------------------------------------------------------------

def uniform(low=0, high=1, shape=None, dtype=None, **kwargs):
    """Samples uniform in [low, high)."""
    return _draw(sampling.UNIFORM, "uniform", dict(low=low, high=high), shape, dtype, kwargs)


def normal(loc=0, scale=1, shape=None, dtype=None, **kwargs):
    """Samples of a normal distribution of mean ``loc``, standard deviation ``scale``."""
    return _draw(sampling.NORMAL, "normal", dict(loc=loc, scale=scale), shape, dtype, kwargs)


def randn(*shape, **kwargs):
    """``normal`` with the shape given as positional ints."""
    loc, scale = kwargs.pop("loc", 0), kwargs.pop("scale", 1)
    dtype = kwargs.pop("dtype", None)
    return _draw(sampling.NORMAL, "randn", dict(loc=loc, scale=scale), shape or None, dtype,
                 kwargs)


def randint(low, high, shape=None, dtype=None, **kwargs):
    """Integers uniform in [low, high), int32 unless ``dtype='int64'``."""
    return sampling.randint(_SYMBOLS, "randint", low, high, shape, dtype,
                            name=_only_name("randint", kwargs), default_shape=None)


def poisson(lam=1, shape=None, dtype=None, **kwargs):
    return _draw(sampling.POISSON, "poisson", dict(lam=lam), shape, dtype, kwargs)


def exponential(scale=1, shape=None, dtype=None, **kwargs):
    """Samples of an exponential distribution of scale ``scale`` (mean ``scale``)."""
    fn = "exponential"
    if sampling.is_number(scale) and not scale > 0:
        raise GraphError(f"{fn}: scale must be > 0, got scale={scale!r}")
    rate = 1.0 / scale if isinstance(scale, Symbol) or sampling.is_number(scale) else scale
    return _draw(sampling.EXPONENTIAL, fn, dict(scale=rate), shape, dtype, kwargs)


def gamma(alpha=1, beta=1, shape=None, dtype=None, **kwargs):
    return _draw(sampling.GAMMA, "gamma", dict(alpha=alpha, beta=beta), shape, dtype, kwargs)


def negative_binomial(k=1, p=1, shape=None, dtype=None, **kwargs):
    return _draw(sampling.NEGATIVE_BINOMIAL, "negative_binomial", dict(k=k, p=p), shape,
                 dtype, kwargs)


def generalized_negative_binomial(mu=1, alpha=1, shape=None, dtype=None, **kwargs):
    return _draw(sampling.GENERALIZED_NEGATIVE_BINOMIAL, "generalized_negative_binomial",
                 dict(mu=mu, alpha=alpha), shape, dtype, kwargs)


def multinomial(data, shape=None, get_prob=True, dtype="int32", **kwargs):
    """Class indices from the probabilities along ``data``'s last axis; with ``get_prob``
    (the default for symbols, as in MXNet) a second output holds their log-probabilities."""
    return sampling.multinomial(_SYMBOLS, "multinomial", data, shape, get_prob, dtype,
                                name=_only_name("multinomial", kwargs))


def shuffle(data, **kwargs):
    """``data`` with its first axis in a random order, drawn again at every forward."""
    return sampling.shuffle(_SYMBOLS, "shuffle", data, name=_only_name("shuffle", kwargs))


def _like(distribution, fn, data, params, kwargs):
    return sampling.draw_like(_SYMBOLS, distribution, fn, data, params,
                              name=_only_name(fn, kwargs))


def uniform_like(data=None, low=0, high=1, **kwargs):
    return _like(sampling.UNIFORM, "uniform_like", data, dict(low=low, high=high), kwargs)


def normal_like(data=None, loc=0, scale=1, **kwargs):
    return _like(sampling.NORMAL, "normal_like", data, dict(loc=loc, scale=scale), kwargs)


def gamma_like(data=None, alpha=1, beta=1, **kwargs):
    return _like(sampling.GAMMA, "gamma_like", data, dict(alpha=alpha, beta=beta), kwargs)


def exponential_like(data=None, lam=1, **kwargs):
    """``lam`` is the rate here, as in MXNet."""
    return _like(sampling.EXPONENTIAL, "exponential_like", data, dict(lam=lam), kwargs)


def poisson_like(data=None, lam=1, **kwargs):
    return _like(sampling.POISSON, "poisson_like", data, dict(lam=lam), kwargs)


def negative_binomial_like(data=None, k=1, p=1, **kwargs):
    return _like(sampling.NEGATIVE_BINOMIAL, "negative_binomial_like", data, dict(k=k, p=p),
                 kwargs)


def generalized_negative_binomial_like(data=None, mu=1, alpha=1, **kwargs):
    return _like(sampling.GENERALIZED_NEGATIVE_BINOMIAL, "generalized_negative_binomial_like",
                 data, dict(mu=mu, alpha=alpha), kwargs)


# -- the flat names: MXNet's operators themselves ----------------------------------------------

def random_uniform(low=0, high=1, shape=None, dtype=None, **kwargs):
    return _draw(sampling.UNIFORM, "random_uniform", dict(low=low, high=high), shape, dtype,
                 kwargs)


def random_normal(loc=0, scale=1, shape=None, dtype=None, **kwargs):
    return _draw(sampling.NORMAL, "random_normal", dict(loc=loc, scale=scale), shape, dtype,
                 kwargs)


def random_gamma(alpha=1, beta=1, shape=None, dtype=None, **kwargs):
    return _draw(sampling.GAMMA, "random_gamma", dict(alpha=alpha, beta=beta), shape, dtype,
                 kwargs)


def random_exponential(lam=1, shape=None, dtype=None, **kwargs):
    """``lam`` is the rate (mean ``1 / lam``)."""
    return _draw(sampling.EXPONENTIAL, "random_exponential", dict(lam=lam), shape, dtype,
                 kwargs)


def random_poisson(lam=1, shape=None, dtype=None, **kwargs):
    return _draw(sampling.POISSON, "random_poisson", dict(lam=lam), shape, dtype, kwargs)


def random_negative_binomial(k=1, p=1, shape=None, dtype=None, **kwargs):
    return _draw(sampling.NEGATIVE_BINOMIAL, "random_negative_binomial", dict(k=k, p=p),
                 shape, dtype, kwargs)


def random_generalized_negative_binomial(mu=1, alpha=1, shape=None, dtype=None, **kwargs):
    return _draw(sampling.GENERALIZED_NEGATIVE_BINOMIAL,
                 "random_generalized_negative_binomial", dict(mu=mu, alpha=alpha), shape,
                 dtype, kwargs)


def random_randint(low, high, shape=None, dtype=None, **kwargs):
    return sampling.randint(_SYMBOLS, "random_randint", low, high, shape, dtype,
                            name=_only_name("random_randint", kwargs), default_shape=None)


def _sample(distribution, fn, params, shape, dtype, kwargs):
    """A sample_* operator: its parameters must be symbols."""
    for arg, value in params.items():
        if not isinstance(value, Symbol):
            raise GraphError(f"{fn}: {arg} must be a Symbol, got {type(value).__name__}")
    return _draw(distribution, fn, params, shape, dtype, kwargs)


def sample_uniform(low, high, shape=None, dtype=None, **kwargs):
    return _sample(sampling.UNIFORM, "sample_uniform", dict(low=low, high=high), shape, dtype,
                   kwargs)


def sample_normal(mu, sigma, shape=None, dtype=None, **kwargs):
    return _sample(sampling.NORMAL, "sample_normal", dict(mu=mu, sigma=sigma), shape, dtype,
                   kwargs)


def sample_gamma(alpha, beta, shape=None, dtype=None, **kwargs):
    return _sample(sampling.GAMMA, "sample_gamma", dict(alpha=alpha, beta=beta), shape,
                   dtype, kwargs)


def sample_exponential(lam, shape=None, dtype=None, **kwargs):
    """``lam`` holds rates."""
    return _sample(sampling.EXPONENTIAL, "sample_exponential", dict(lam=lam), shape, dtype,
                   kwargs)


def sample_poisson(lam, shape=None, dtype=None, **kwargs):
    return _sample(sampling.POISSON, "sample_poisson", dict(lam=lam), shape, dtype, kwargs)


def sample_negative_binomial(k, p, shape=None, dtype=None, **kwargs):
    return _sample(sampling.NEGATIVE_BINOMIAL, "sample_negative_binomial", dict(k=k, p=p),
                   shape, dtype, kwargs)


def sample_generalized_negative_binomial(mu, alpha, shape=None, dtype=None, **kwargs):
    return _sample(sampling.GENERALIZED_NEGATIVE_BINOMIAL,
                   "sample_generalized_negative_binomial", dict(mu=mu, alpha=alpha), shape,
                   dtype, kwargs)


def sample_multinomial(data, shape=None, get_prob=False, dtype="int32", **kwargs):
    return sampling.multinomial(_SYMBOLS, "sample_multinomial", data, shape, get_prob, dtype,
                                name=_only_name("sample_multinomial", kwargs))


# -- densities: MXNet's random_pdf_* ---------------------------------------------------------

def _pdf(distribution, sample, params, is_log, kwargs):
    return sampling.pdf(_SYMBOLS, distribution, sample, params, is_log,
                        name=_only_name(f"random_pdf_{distribution}", kwargs))


def random_pdf_uniform(sample=None, low=None, high=None, is_log=False, **kwargs):
    return _pdf("uniform", sample, dict(low=low, high=high), is_log, kwargs)


def random_pdf_normal(sample=None, mu=None, sigma=None, is_log=False, **kwargs):
    return _pdf("normal", sample, dict(mu=mu, sigma=sigma), is_log, kwargs)


def random_pdf_gamma(sample=None, alpha=None, beta=None, is_log=False, **kwargs):
    """``beta`` is the rate, as in MXNet's random_pdf_gamma."""
    return _pdf("gamma", sample, dict(alpha=alpha, beta=beta), is_log, kwargs)


def random_pdf_exponential(sample=None, lam=None, is_log=False, **kwargs):
    return _pdf("exponential", sample, dict(lam=lam), is_log, kwargs)


def random_pdf_poisson(sample=None, lam=None, is_log=False, **kwargs):
    return _pdf("poisson", sample, dict(lam=lam), is_log, kwargs)


def random_pdf_negative_binomial(sample=None, k=None, p=None, is_log=False, **kwargs):
    return _pdf("negative_binomial", sample, dict(k=k, p=p), is_log, kwargs)


def random_pdf_generalized_negative_binomial(sample=None, mu=None, alpha=None, is_log=False,
                                             **kwargs):
    return _pdf("generalized_negative_binomial", sample, dict(mu=mu, alpha=alpha), is_log,
                kwargs)


def random_pdf_dirichlet(sample=None, alpha=None, is_log=False, **kwargs):
    return _pdf("dirichlet", sample, dict(alpha=alpha), is_log, kwargs)


__all__ = list(sampling.RANDOM_NAMES)
FLAT = sampling.flat_functions(globals())  # mixrt.sym's top-level names
