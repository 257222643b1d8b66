"""MXNet's random samplers on NDArrays: ``mx.nd.random.*`` (also ``mx.random.*``) and the
flat names ``nd.random_uniform``, ``nd.uniform``, ``nd.sample_gamma``, ``nd.shuffle``, ...
(:data:`FLAT`).

    mx.random.seed(42)
    x = nd.random.uniform(-1, 1, shape=(2, 3))              # float32, shape (2, 3)
    y = nd.random.normal(nd.array([0, 5]), nd.array([1, 2]), shape=100)   # shape (2, 100)
    k, logp = nd.random.multinomial(probs, shape=8, get_prob=True)

Parameters are all numbers (``shape`` samples, ``(1,)`` by default, on ``ctx``) or all
NDArrays of one shape P (``shape`` samples per element, output P + shape, on their device).
``dtype`` is float32 unless given (randint: int32; multinomial: int32 indices); ``out=``
receives the samples (its shape and dtype serve when ``shape``/``dtype`` are left out).
``mixrt.random.seed`` makes the draws repeat. What each call builds and checks is
``mixrt/sampling.py``'s; bad arguments raise InputError naming the function and argument.

Under ``autograd.record()`` the parameters get no gradient (zero, as MXNet 1.x gives), a
multinomial's log-probabilities send theirs to ``data``, and ``shuffle`` has none.
"""

from __future__ import annotations

import numpy as np

from mixrt import dispatch, sampling
from mixrt.base.errors import InputError
from mixrt.context import as_context
from mixrt.nd.mxnet_args import _made_on
from mixrt.nd.ndarray import NDArray
from mixrt.runtime.engine import get_engine


class _ArrayBuilder(sampling.Builder):
    """The samplers' ops run now, on NDArrays."""

    error = InputError
    array_type = NDArray
    takes_out = True

    def op(self, domain, op_type, inputs, attributes, *, ctx=None, name=None, label=None,
           num_outputs=1):
        if any(isinstance(value, NDArray) for value in inputs):  # their device decides
            result = dispatch.invoke(domain, op_type, inputs, attributes, num_outputs)
        else:
            with as_context(ctx):
                result = dispatch.invoke(domain, op_type, inputs, attributes, num_outputs)
        return _carry_stream_failure(result)

    def scalar(self, value, ctx):
        return _made_on(as_context(ctx), "asarray", value, dtype=np.float64)

    def context_of(self, value):
        return value.ctx

    def as_float(self, fn, arg, value):
        return value if value.dtype.kind == "f" else value.astype(np.float32)

    def shape_of(self, value):
        return value.shape

    def dtype_of(self, value):
        return value.dtype

    def written(self, fn, result, out):
        if out is None:
            return result
        if not isinstance(out, NDArray):
            raise InputError(f"{fn}: out must be an NDArray, got {type(out).__name__}")
        if out.shape != result.shape or out.dtype != result.dtype:
            raise InputError(f"{fn}: out is {out.dtype}{list(out.shape)} and the samples "
                             f"are {result.dtype}{list(result.shape)}")
        return result.copyto(out)

    def refused(self, fn, message, shape, dtype, ctx, out):
        """MXNet checks the parameters as the sampler runs, asynchronously: the call returns
        its array, and the error comes at the next wait on it (``wait_to_read``,
        ``asnumpy``, ``waitall``) or on what is computed from it. The array holds NaN (or
        zeros for integers) meanwhile; ``out`` keeps what it held."""
        ctx = as_context(ctx) if out is None else out.ctx
        if out is None:
            fill = np.nan if np.dtype(dtype).kind == "f" else 0
            out = _made_on(ctx, "full", tuple(shape), fill, dtype=dtype)
        error = InputError(f"{fn}: {message}")

        def run():
            raise error
        # behind an earlier failure of the stream not raised yet, that one is carried on
        earlier = _failed_stream.get(str(ctx))
        if earlier is not None and get_engine().failure_of(earlier) is None:
            earlier = None
        get_engine().push(run, reads=[] if earlier is None else [earlier],
                          writes=[out.engine_var()], name=f"_random_{fn}")
        _failed_stream[str(ctx)] = out.engine_var()
        return out


# Per device, the engine tag of the last sampler MXNet's checks refused. MXNet's samplers
# share one random resource, which a failed sampler leaves failed: every later draw on the
# device carries that error until a wait raises it (MXNet 1.9.1: after normal(0, -1),
# normal(0, 1).asnumpy() raises, and then neither raises again).
_failed_stream: dict = {}


def _carry_stream_failure(result):
    arrays = list(result) if isinstance(result, (tuple, list)) else [result]
    earlier = _failed_stream.get(str(arrays[0].ctx))
    failure = None if earlier is None else get_engine().failure_of(earlier)
    if failure is not None:
        get_engine().inherit(failure, [a.engine_var() for a in arrays])
    return result


_ARRAYS = _ArrayBuilder()


def _only_name(fn: str, kwargs: dict):
    """MXNet's samplers pass extra keywords to their op, which knows only ``name``."""
    unknown = sorted(set(kwargs) - {"name"})
    if unknown:
        raise InputError(f"{fn}: unknown argument {unknown[0]!r}")
    return kwargs.get("name")


def _draw(distribution, fn, params, shape, dtype, ctx, out, kwargs, default_shape=(1,)):
    return sampling.draw(_ARRAYS, distribution, fn, params, shape, dtype, ctx=ctx, out=out,
                         name=_only_name(fn, kwargs), default_shape=default_shape)


# -- mx.nd.random ------------------------------------------------------------------------------

def uniform(low=0, high=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples uniform in [low, high)."""
    return _draw(sampling.UNIFORM, "uniform", dict(low=low, high=high), shape, dtype, ctx,
                 out, kwargs)


def normal(loc=0, scale=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples of a normal distribution of mean ``loc``, standard deviation ``scale``."""
    return _draw(sampling.NORMAL, "normal", dict(loc=loc, scale=scale), shape, dtype, ctx,
                 out, kwargs)


def randn(*shape, **kwargs):
    """``normal`` with the shape given as positional ints (``randn(2, 3, loc=1)``)."""
    loc, scale = kwargs.pop("loc", 0), kwargs.pop("scale", 1)
    dtype, ctx, out = kwargs.pop("dtype", None), kwargs.pop("ctx", None), kwargs.pop("out", None)
    return _draw(sampling.NORMAL, "randn", dict(loc=loc, scale=scale), shape or None, dtype,
                 ctx, out, kwargs, default_shape=None)


def randint(low, high, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Integers uniform in [low, high), int32 unless ``dtype='int64'``."""
    return sampling.randint(_ARRAYS, "randint", low, high, shape, dtype, ctx=ctx, out=out,
                            name=_only_name("randint", kwargs))


def poisson(lam=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Poisson counts of mean ``lam``, as floats."""
    return _draw(sampling.POISSON, "poisson", dict(lam=lam), shape, dtype, ctx, out, kwargs)


def exponential(scale=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples of an exponential distribution of scale ``scale`` (mean ``scale``, rate
    ``1 / scale``)."""
    fn = "exponential"
    if sampling.is_number(scale) and not scale > 0:
        raise InputError(f"{fn}: scale must be > 0, got scale={scale!r}")
    rate = 1.0 / scale if isinstance(scale, NDArray) or sampling.is_number(scale) else scale
    return _draw(sampling.EXPONENTIAL, fn, dict(scale=rate), shape, dtype, ctx, out, kwargs)


def gamma(alpha=1, beta=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Samples of a gamma distribution of shape ``alpha`` and scale ``beta``."""
    return _draw(sampling.GAMMA, "gamma", dict(alpha=alpha, beta=beta), shape, dtype, ctx,
                 out, kwargs)


def negative_binomial(k=1, p=1, shape=None, dtype=None, ctx=None, out=None, **kwargs):
    """Failures before the ``k``-th success, success probability ``p``, as floats."""
    return _draw(sampling.NEGATIVE_BINOMIAL, "negative_binomial", dict(k=k, p=p), shape,
                 dtype, ctx, out, kwargs)


def generalized_negative_binomial(mu=1, alpha=1, shape=None, dtype=None, ctx=None, out=None,
                                  **kwargs):
    """Counts of mean ``mu`` and dispersion ``alpha`` (variance mu + alpha mu^2)."""
    return _draw(sampling.GENERALIZED_NEGATIVE_BINOMIAL, "generalized_negative_binomial",
                 dict(mu=mu, alpha=alpha), shape, dtype, ctx, out, kwargs)


def multinomial(data, shape=None, get_prob=False, out=None, dtype="int32", **kwargs):
    """Class indices drawn from the probabilities along ``data``'s last axis; shape
    ``data.shape[:-1] + shape``. With ``get_prob``, ``[indices, log-probabilities]``."""
    return sampling.multinomial(_ARRAYS, "multinomial", data, shape, get_prob, dtype,
                                out=out, name=_only_name("multinomial", kwargs))


def shuffle(data, **kwargs):
    """A copy of ``data`` with its first axis in a random order (``out=`` receives it)."""
    out = kwargs.pop("out", None)
    return sampling.shuffle(_ARRAYS, "shuffle", data, out=out,
                            name=_only_name("shuffle", kwargs))


# -- the *_like samplers: data's shape, dtype and device ----------------------------------------

def _like(distribution, fn, data, params, out, kwargs):
    return sampling.draw_like(_ARRAYS, distribution, fn, data, params, out=out,
                              name=_only_name(fn, kwargs))


def uniform_like(data=None, low=0, high=1, out=None, **kwargs):
    return _like(sampling.UNIFORM, "uniform_like", data, dict(low=low, high=high), out, kwargs)


def normal_like(data=None, loc=0, scale=1, out=None, **kwargs):
    return _like(sampling.NORMAL, "normal_like", data, dict(loc=loc, scale=scale), out, kwargs)


def gamma_like(data=None, alpha=1, beta=1, out=None, **kwargs):
    return _like(sampling.GAMMA, "gamma_like", data, dict(alpha=alpha, beta=beta), out, kwargs)


def exponential_like(data=None, lam=1, out=None, **kwargs):
    """Note: ``lam`` is the rate here, as in MXNet (``exponential`` takes the scale)."""
    return _like(sampling.EXPONENTIAL, "exponential_like", data, dict(lam=lam), out, kwargs)


def poisson_like(data=None, lam=1, out=None, **kwargs):
    return _like(sampling.POISSON, "poisson_like", data, dict(lam=lam), out, kwargs)


def negative_binomial_like(data=None, k=1, p=1, out=None, **kwargs):
    return _like(sampling.NEGATIVE_BINOMIAL, "negative_binomial_like", data, dict(k=k, p=p),
                 out, kwargs)


def generalized_negative_binomial_like(data=None, mu=1, alpha=1, out=None, **kwargs):
    return _like(sampling.GENERALIZED_NEGATIVE_BINOMIAL,
                 "generalized_negative_binomial_like", data, dict(mu=mu, alpha=alpha), out,
                 kwargs)


# -- the flat names: MXNet's operators themselves ------------------------------------------------
# (number parameters with the operators' own names and defaults, ``shape`` required unless
# ``out`` gives it; the sample_* forms take arrays, one sample per element by default)

def random_uniform(low=0, high=1, shape=None, ctx=None, dtype=None, out=None, **kwargs):
    return _draw(sampling.UNIFORM, "random_uniform", dict(low=low, high=high), shape, dtype,
                 ctx, out, kwargs, default_shape=None)


def random_normal(loc=0, scale=1, shape=None, ctx=None, dtype=None, out=None, **kwargs):
    return _draw(sampling.NORMAL, "random_normal", dict(loc=loc, scale=scale), shape, dtype,
                 ctx, out, kwargs, default_shape=None)


def random_gamma(alpha=1, beta=1, shape=None, ctx=None, dtype=None, out=None, **kwargs):
    return _draw(sampling.GAMMA, "random_gamma", dict(alpha=alpha, beta=beta), shape, dtype,
                 ctx, out, kwargs, default_shape=None)


def random_exponential(lam=1, shape=None, ctx=None, dtype=None, out=None, **kwargs):
    """``lam`` is the rate (mean ``1 / lam``)."""
    return _draw(sampling.EXPONENTIAL, "random_exponential", dict(lam=lam), shape, dtype,
                 ctx, out, kwargs, default_shape=None)


def random_poisson(lam=1, shape=None, ctx=None, dtype=None, out=None, **kwargs):
    return _draw(sampling.POISSON, "random_poisson", dict(lam=lam), shape, dtype, ctx, out,
                 kwargs, default_shape=None)


def random_negative_binomial(k=1, p=1, shape=None, ctx=None, dtype=None, out=None,
                             **kwargs):
    return _draw(sampling.NEGATIVE_BINOMIAL, "random_negative_binomial", dict(k=k, p=p),
                 shape, dtype, ctx, out, kwargs, default_shape=None)


def random_generalized_negative_binomial(mu=1, alpha=1, shape=None, ctx=None, dtype=None,
                                         out=None, **kwargs):
    return _draw(sampling.GENERALIZED_NEGATIVE_BINOMIAL,
                 "random_generalized_negative_binomial", dict(mu=mu, alpha=alpha), shape,
                 dtype, ctx, out, kwargs, default_shape=None)


def random_randint(low, high, shape=None, ctx=None, dtype=None, out=None, **kwargs):
    return sampling.randint(_ARRAYS, "random_randint", low, high, shape, dtype, ctx=ctx,
                            out=out, name=_only_name("random_randint", kwargs),
                            default_shape=None)


def _sample(distribution, fn, params, shape, dtype, out, kwargs):
    """A sample_* operator: its parameters must be NDArrays."""
    for arg, value in params.items():
        if not isinstance(value, NDArray):
            raise InputError(f"{fn}: {arg} must be an NDArray, got {type(value).__name__}")
    return _draw(distribution, fn, params, shape, dtype, None, out, kwargs)


def sample_uniform(low, high, shape=None, dtype=None, out=None, **kwargs):
    return _sample(sampling.UNIFORM, "sample_uniform", dict(low=low, high=high), shape,
                   dtype, out, kwargs)


def sample_normal(mu, sigma, shape=None, dtype=None, out=None, **kwargs):
    return _sample(sampling.NORMAL, "sample_normal", dict(mu=mu, sigma=sigma), shape, dtype,
                   out, kwargs)


def sample_gamma(alpha, beta, shape=None, dtype=None, out=None, **kwargs):
    return _sample(sampling.GAMMA, "sample_gamma", dict(alpha=alpha, beta=beta), shape,
                   dtype, out, kwargs)


def sample_exponential(lam, shape=None, dtype=None, out=None, **kwargs):
    """``lam`` holds rates (means ``1 / lam``)."""
    return _sample(sampling.EXPONENTIAL, "sample_exponential", dict(lam=lam), shape, dtype,
                   out, kwargs)


def sample_poisson(lam, shape=None, dtype=None, out=None, **kwargs):
    return _sample(sampling.POISSON, "sample_poisson", dict(lam=lam), shape, dtype, out,
                   kwargs)


def sample_negative_binomial(k, p, shape=None, dtype=None, out=None, **kwargs):
    return _sample(sampling.NEGATIVE_BINOMIAL, "sample_negative_binomial", dict(k=k, p=p),
                   shape, dtype, out, kwargs)


def sample_generalized_negative_binomial(mu, alpha, shape=None, dtype=None, out=None,
                                         **kwargs):
    return _sample(sampling.GENERALIZED_NEGATIVE_BINOMIAL,
                   "sample_generalized_negative_binomial", dict(mu=mu, alpha=alpha), shape,
                   dtype, out, kwargs)


def sample_multinomial(data, shape=None, get_prob=False, dtype="int32", out=None, **kwargs):
    return sampling.multinomial(_ARRAYS, "sample_multinomial", data, shape, get_prob, dtype,
                                out=out, name=_only_name("sample_multinomial", kwargs))


# -- densities: MXNet's random_pdf_* ---------------------------------------------------------
# (the density of each sample under the distribution of the parameters above it; is_log
# gives its log; differentiable in the sample and the parameters)

def _pdf(distribution, sample, params, is_log, out, kwargs):
    return sampling.pdf(_ARRAYS, distribution, sample, params, is_log, out=out,
                        name=_only_name(f"random_pdf_{distribution}", kwargs))


def random_pdf_uniform(sample=None, low=None, high=None, is_log=False, out=None, **kwargs):
    return _pdf("uniform", sample, dict(low=low, high=high), is_log, out, kwargs)


def random_pdf_normal(sample=None, mu=None, sigma=None, is_log=False, out=None, **kwargs):
    return _pdf("normal", sample, dict(mu=mu, sigma=sigma), is_log, out, kwargs)


def random_pdf_gamma(sample=None, alpha=None, beta=None, is_log=False, out=None, **kwargs):
    """``beta`` is the rate, as in MXNet's random_pdf_gamma."""
    return _pdf("gamma", sample, dict(alpha=alpha, beta=beta), is_log, out, kwargs)


def random_pdf_exponential(sample=None, lam=None, is_log=False, out=None, **kwargs):
    return _pdf("exponential", sample, dict(lam=lam), is_log, out, kwargs)


def random_pdf_poisson(sample=None, lam=None, is_log=False, out=None, **kwargs):
    return _pdf("poisson", sample, dict(lam=lam), is_log, out, kwargs)


def random_pdf_negative_binomial(sample=None, k=None, p=None, is_log=False, out=None,
                                 **kwargs):
    return _pdf("negative_binomial", sample, dict(k=k, p=p), is_log, out, kwargs)


def random_pdf_generalized_negative_binomial(sample=None, mu=None, alpha=None, is_log=False,
                                             out=None, **kwargs):
    return _pdf("generalized_negative_binomial", sample, dict(mu=mu, alpha=alpha), is_log,
                out, kwargs)


def random_pdf_dirichlet(sample=None, alpha=None, is_log=False, out=None, **kwargs):
    return _pdf("dirichlet", sample, dict(alpha=alpha), is_log, out, kwargs)


__all__ = list(sampling.RANDOM_NAMES)
FLAT = sampling.flat_functions(globals())  # mixrt.nd's top-level names
