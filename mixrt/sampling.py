"""MXNet's samplers written once: their arguments read and checked as MXNet 1.x reads them,
and the ops each one builds. ``mixrt.nd.random`` runs them on NDArrays and
``mixrt.sym.random`` builds them into symbols, each through a :class:`Builder` of its own.

Which op a call builds:

* number parameters: ``uniform`` and ``normal`` are ONNX's RandomUniform and RandomNormal
  (a symbol graph holding them exports to ONNX); the other distributions, which ONNX lacks,
  are ``mixrt::Sample*`` ops given 0-d parameters; ``randint`` is ``mixrt::RandomInteger``;
* array parameters (all of one shape P): ``mixrt::Sample*``, output P + shape;
* ``*_like``: RandomUniformLike and RandomNormalLike, the others ``mixrt::Sample*`` with the
  data's shape and dtype;
* ``multinomial``: ``mixrt::SampleMultinomial`` (ONNX's Multinomial takes log-odds of a
  2-D batch and normalises them; MXNet's takes the probabilities along the last axis of any
  array, as given, and can return their log); ``shuffle``: ``mixrt::Shuffle``.

The operators are ``ops/random/``'s. Number parameters are checked as MXNet checks them
(``scale`` of a normal must be positive, ``low <= high``, ...) and a bad one raises the
builder's error naming the function and the argument; array parameters are data, read by
no check (as in MXNet, where a negative scale in an array gives whatever the arithmetic gives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from mixrt.ops.ir.dtypes import to_onnx_type
from mixrt.ops.ir.registry import MIXRT

SAMPLE_DTYPES = ("float16", "float32", "float64")
INTEGER_DTYPES = ("int32", "int64")
# MXNet's multinomial index types, with the largest index each holds exactly
INDEX_DTYPES = {"uint8": 2 ** 8 - 1, "int32": 2 ** 31 - 1, "float16": 2 ** 11,
                "float32": 2 ** 24, "float64": 2 ** 53}
# the mixrt ops that draw (and so take a key in a symbol: ops/random/samplers.py)
DRAWING_OPS = frozenset({"SampleUniform", "SampleNormal", "SampleGamma", "SampleExponential",
                         "SamplePoisson", "SampleNegativeBinomial",
                         "SampleGeneralizedNegativeBinomial", "SampleMultinomial",
                         "RandomInteger", "Shuffle"})


class Builder:
    """How a frontend builds the samplers' ops (``mixrt.nd.random``: run now on NDArrays;
    ``mixrt.sym.random``: nodes of a symbol)."""

    error: type = ValueError  # what a bad argument raises
    array_type: type = object  # what a parameter given as an array is
    takes_out: bool = False  # whether the functions take out= (NDArrays) or not (symbols)

    def op(self, domain: str, op_type: str, inputs: list, attributes: dict, *, ctx=None,
           name=None, label=None, num_outputs: int = 1):
        """The op applied to ``inputs`` (its outputs: one, or a tuple). ``label``: MXNet's
        name for the operator (``_random_gamma``), which names a node that has no ``name``."""
        raise NotImplementedError

    def both_outputs(self, result):
        """What a two-output call returns (a list of arrays; one symbol of two outputs)."""
        return list(result)

    def scalar(self, value: float, ctx):
        """A 0-d float64 parameter on ``ctx``."""
        raise NotImplementedError

    def as_float(self, fn: str, arg: str, value):
        """An array parameter as the samplers take it (floats)."""
        return value

    def context_of(self, value):
        """The device ``value`` lives on (None for a symbol)."""
        return None

    def shape_of(self, value) -> tuple | None:
        """``value``'s shape where it is known when the call is made."""
        return None

    def dtype_of(self, value):
        return None

    def written(self, fn: str, result, out):
        """``result``, stored into ``out`` when one was given."""
        return result

    def refused(self, fn: str, message: str, shape: tuple, dtype, ctx, out):
        """Number parameters MXNet's checks refuse (``message`` says why). MXNet checks
        them when the op runs; a frontend that runs nothing now raises at once."""
        raise self.error(f"{fn}: {message}")


@dataclass(frozen=True)
class Distribution:
    """One of MXNet's distributions: its per-element op, MXNet's checks of number
    parameters (``(test, message)``: the test takes the values in order, the message names
    the arguments as ``{0}``, ``{1}``), and the ONNX op for number parameters, where there
    is one, with its attribute names."""

    mxnet_name: str
    sample_op: str
    checks: tuple[tuple[Callable, str], ...] = ()
    onnx_op: str | None = None
    onnx_attributes: tuple[str, ...] = ()
    onnx_like_op: str | None = None


UNIFORM = Distribution("uniform", "SampleUniform",
                       ((lambda low, high: low <= high, "{0} must be <= {1}"),),
                       "RandomUniform", ("low", "high"), "RandomUniformLike")
NORMAL = Distribution("normal", "SampleNormal",
                      ((lambda loc, scale: scale > 0, "{1} must be > 0"),),
                      "RandomNormal", ("mean", "scale"), "RandomNormalLike")
GAMMA = Distribution("gamma", "SampleGamma",
                     ((lambda alpha, beta: alpha > 0, "{0} must be > 0"),
                      (lambda alpha, beta: beta > 0, "{1} must be > 0")))
EXPONENTIAL = Distribution("exponential", "SampleExponential",
                           ((lambda lam: lam > 0, "{0} must be > 0"),))
POISSON = Distribution("poisson", "SamplePoisson", ((lambda lam: lam >= 0, "{0} must be >= 0"),))
# MXNet checks only k; p outside (0, 1] gives it zeros or garbage, refused here
NEGATIVE_BINOMIAL = Distribution(
    "negative_binomial", "SampleNegativeBinomial",
    ((lambda k, p: k >= 0, "{0} must be >= 0"), (lambda k, p: 0 < p <= 1, "{1} must be in (0, 1]")))
GENERALIZED_NEGATIVE_BINOMIAL = Distribution(
    "generalized_negative_binomial", "SampleGeneralizedNegativeBinomial",
    ((lambda mu, alpha: mu >= 0, "{0} must be >= 0"),
     (lambda mu, alpha: alpha >= 0, "{1} must be >= 0")))


# -- reading the arguments ---------------------------------------------------------------------

def is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and \
        not isinstance(value, (bool, np.bool_))


def read_shape(builder: Builder, fn: str, shape) -> tuple | None:
    """``shape`` (an int or a sequence of ints, each > 0, as MXNet requires) as a tuple;
    None stays None."""
    if shape is None:
        return None
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    if not isinstance(dims, (tuple, list)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise builder.error(f"{fn}: shape must be an int or a tuple of ints, got {shape!r}")
    if any(int(d) <= 0 for d in dims):
        raise builder.error(f"{fn}: every dimension of shape must be > 0, got {tuple(dims)}")
    return tuple(int(d) for d in dims)


def read_dtype(builder: Builder, fn: str, dtype, allowed, default: str) -> np.dtype:
    """``dtype`` (a name, a NumPy dtype or type; None: ``default``) if it is one of
    ``allowed``."""
    if dtype is None:
        return np.dtype(default)
    try:
        found = np.dtype(dtype)
    except TypeError as exc:
        raise builder.error(f"{fn}: dtype={dtype!r} is not a dtype; expected one of "
                            f"{list(allowed)}") from exc
    if found.name not in allowed:
        raise builder.error(f"{fn}: dtype={found.name!r} is not one of {list(allowed)}")
    return found


def _parameter_kind(builder: Builder, fn: str, params: dict) -> str:
    """"arrays" or "numbers": MXNet takes all of one kind."""
    values = list(params.values())
    if all(isinstance(v, builder.array_type) for v in values):
        return "arrays"
    if all(is_number(v) for v in values):
        return "numbers"
    kinds = ", ".join(f"{name}={type(value).__name__}" for name, value in params.items())
    raise builder.error(f"{fn}: the distribution's parameters must all be numbers or all "
                        f"be {builder.array_type.__name__}s, got {kinds}")


def _check_numbers(builder: Builder, fn: str, distribution: Distribution, params: dict):
    problem = _number_problem(distribution, params)
    if problem is not None:
        raise builder.error(f"{fn}: {problem}")


def _number_problem(distribution: Distribution, params: dict) -> str | None:
    """What MXNet's checks of the number parameters refuse, or None."""
    names, values = list(params), [float(v) for v in params.values()]
    for test, message in distribution.checks:
        if not test(*values):
            given = ", ".join(f"{n}={v!r}" for n, v in params.items())
            return f"{message.format(*names)}, got {given}"
    return None


def _out_dtype(builder, fn, dtype, out, allowed, default) -> np.dtype:
    """The dtype to draw: ``dtype``, else ``out``'s, else ``default``; one that differs
    from ``out``'s is refused, as MXNet refuses it."""
    if out is None:
        return read_dtype(builder, fn, dtype, allowed, default)
    if not isinstance(out, builder.array_type):
        raise builder.error(f"{fn}: out must be an {builder.array_type.__name__}, got "
                            f"{type(out).__name__}")
    have = np.dtype(builder.dtype_of(out))
    wanted = read_dtype(builder, fn, dtype, allowed, have.name if have.name in allowed
                        else default)
    if wanted != have:
        raise builder.error(f"{fn}: out holds {have.name} and the samples are "
                            f"{wanted.name}; give dtype={have.name!r} or an out of "
                            f"{wanted.name}")
    return wanted


def _draw_shape(builder, fn, shape, out, default):
    """The sample shape: ``shape``, else ``out``'s, else ``default`` (None: required)."""
    shape = read_shape(builder, fn, shape)
    if shape is None and out is not None:
        shape = tuple(builder.shape_of(out))
    if shape is None:
        shape = default
    if shape is None:
        raise builder.error(f"{fn}: shape is required (or out=, whose shape is taken)")
    if not shape:
        raise builder.error(f"{fn}: shape must have at least one dimension (MXNet draws no "
                            f"0-d arrays), got ()")
    return shape


# -- the samplers -----------------------------------------------------------------------------

def draw(builder: Builder, distribution: Distribution, fn: str, params: dict, shape=None,
         dtype=None, *, ctx=None, out=None, name=None, default_shape=(1,)):
    """Samples of ``distribution`` with ``params`` ({MXNet's argument name: value}), numbers
    or arrays. ``default_shape``: the sample shape when neither ``shape`` nor ``out`` gives
    one for number parameters (``nd.random.*``: (1,); the flat ``random_*``: None, required)."""
    dtype = _out_dtype(builder, fn, dtype, out, SAMPLE_DTYPES, "float32")
    if _parameter_kind(builder, fn, params) == "arrays":
        inputs = [builder.as_float(fn, arg, value) for arg, value in params.items()]
        _check_one_shape(builder, fn, params)
        attributes = {"shape": list(read_shape(builder, fn, shape) or ()),
                      "dtype": to_onnx_type(dtype)}
        result = builder.op(MIXRT, distribution.sample_op, inputs, attributes, name=name,
                            label=f"_sample_{distribution.mxnet_name}")
        return builder.written(fn, result, out)
    shape = _draw_shape(builder, fn, shape, out, default_shape)
    problem = _number_problem(distribution, params)
    if problem is not None:
        return builder.refused(fn, problem, shape, dtype, ctx, out)
    attributes = {"shape": list(shape), "dtype": to_onnx_type(dtype)}
    if distribution.onnx_op is not None:
        attributes.update({attribute: float(value) for attribute, value in
                           zip(distribution.onnx_attributes, params.values())})
        result = builder.op("", distribution.onnx_op, [], attributes, ctx=ctx, name=name,
                            label=f"_random_{distribution.mxnet_name}")
    else:
        inputs = [builder.scalar(float(value), ctx) for value in params.values()]
        result = builder.op(MIXRT, distribution.sample_op, inputs, attributes, ctx=ctx,
                            name=name, label=f"_random_{distribution.mxnet_name}")
    return builder.written(fn, result, out)


def _check_one_shape(builder: Builder, fn: str, params: dict) -> None:
    shapes = {arg: builder.shape_of(value) for arg, value in params.items()}
    known = {tuple(s) for s in shapes.values() if s is not None}
    if len(known) > 1:
        given = ", ".join(f"{arg} {shape}" for arg, shape in shapes.items())
        raise builder.error(f"{fn}: the parameter arrays must have one shape, got {given}")


def draw_like(builder: Builder, distribution: Distribution, fn: str, data, params: dict,
              *, out=None, name=None):
    """Samples with ``data``'s shape, dtype and device (MXNet's ``*_like``)."""
    if not isinstance(data, builder.array_type):
        raise builder.error(f"{fn}: data must be an {builder.array_type.__name__}, got "
                            f"{type(data).__name__}")
    if not all(is_number(v) for v in params.values()):
        raise builder.error(f"{fn}: the distribution's parameters must be numbers, got "
                            f"{params}")
    _check_numbers(builder, fn, distribution, params)
    if distribution.onnx_like_op is not None:
        attributes = {attribute: float(value) for attribute, value in
                      zip(distribution.onnx_attributes, params.values())}
        result = builder.op("", distribution.onnx_like_op, [data], attributes, name=name,
                            label=f"_random_{distribution.mxnet_name}_like")
        return builder.written(fn, result, out)
    like = builder.op("", "Shape", [data], {})
    ctx = builder.context_of(data)
    inputs = [builder.op("", "Expand", [builder.scalar(float(v), ctx), like], {})
              for v in params.values()]
    dtype = builder.dtype_of(data)
    attributes = {"dtype": to_onnx_type(dtype if dtype is not None else np.float32)}
    result = builder.op(MIXRT, distribution.sample_op, inputs, attributes, name=name,
                        label=f"_random_{distribution.mxnet_name}_like")
    if dtype is None:  # a symbol's dtype is known once it is bound: take it then
        result = builder.op("", "CastLike", [result, data], {})
    return builder.written(fn, result, out)


def randint(builder: Builder, fn: str, low, high, shape=None, dtype=None, *, ctx=None,
            out=None, name=None, default_shape=(1,)):
    """Integers uniform in [low, high) (MXNet's randint: number bounds only)."""
    for arg, value in (("low", low), ("high", high)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise builder.error(f"{fn}: {arg} must be an int, got {value!r}")
    if not int(low) < int(high):
        raise builder.error(f"{fn}: low must be < high, got low={low}, high={high}")
    dtype = _out_dtype(builder, fn, dtype, out, INTEGER_DTYPES, "int32")
    if int(high) - 1 > np.iinfo(dtype).max or int(low) < np.iinfo(dtype).min:
        raise builder.error(f"{fn}: [{low}, {high}) does not fit in {dtype.name}")
    shape = _draw_shape(builder, fn, shape, out, default_shape)
    attributes = {"low": int(low), "high": int(high), "shape": list(shape),
                  "dtype": to_onnx_type(dtype)}
    result = builder.op(MIXRT, "RandomInteger", [], attributes, ctx=ctx, name=name,
                        label="_random_randint")
    return builder.written(fn, result, out)


def multinomial(builder: Builder, fn: str, data, shape=None, get_prob=False, dtype="int32",
                *, out=None, name=None):
    """Class indices drawn from the probabilities along ``data``'s last axis, and with
    ``get_prob`` their log-probabilities (a pair)."""
    if not isinstance(data, builder.array_type):
        raise builder.error(f"{fn}: data must be an {builder.array_type.__name__}, got "
                            f"{type(data).__name__}")
    dtype = read_dtype(builder, fn, dtype, INDEX_DTYPES, "int32")
    _check_probabilities(builder, fn, data, dtype)
    attributes = {"shape": list(read_shape(builder, fn, shape) or ()),
                  "get_prob": int(bool(get_prob)), "dtype": to_onnx_type(dtype)}
    result = builder.op(MIXRT, "SampleMultinomial", [data], attributes, name=name,
                        label="_sample_multinomial", num_outputs=2 if get_prob else 1)
    if get_prob:
        if out is not None:
            raise builder.error(f"{fn}: out= takes one array; get_prob=True gives two")
        return builder.both_outputs(result)
    return builder.written(fn, result, out)


def _check_probabilities(builder: Builder, fn: str, data, dtype: np.dtype) -> None:
    shape, data_dtype = builder.shape_of(data), builder.dtype_of(data)
    if data_dtype is not None and np.dtype(data_dtype).kind != "f":
        raise builder.error(f"{fn}: data must hold floating-point probabilities, got "
                            f"{np.dtype(data_dtype).name}")
    if shape is None:
        return
    if len(shape) < 1:
        raise builder.error(f"{fn}: data must have a last axis of probabilities, got a 0-d "
                            f"array")
    if shape[-1] - 1 > INDEX_DTYPES[dtype.name]:
        raise builder.error(f"{fn}: {shape[-1]} classes do not all fit exactly in "
                            f"dtype={dtype.name!r}")


def shuffle(builder: Builder, fn: str, data, *, out=None, name=None):
    """``data`` with its first axis in a random order."""
    if not isinstance(data, builder.array_type):
        raise builder.error(f"{fn}: data must be an {builder.array_type.__name__}, got "
                            f"{type(data).__name__}")
    shape = builder.shape_of(data)
    if shape is not None and len(shape) < 1:
        raise builder.error(f"{fn}: data must have at least one axis, got a 0-d array")
    result = builder.op(MIXRT, "Shuffle", [data], {}, name=name, label="_shuffle")
    return builder.written(fn, result, out)


# -- densities ------------------------------------------------------------------------------

# MXNet's random_pdf_* parameter names, per distribution
PDF_PARAMETERS = {"uniform": ("low", "high"), "normal": ("mu", "sigma"),
                  "gamma": ("alpha", "beta"), "exponential": ("lam",), "poisson": ("lam",),
                  "negative_binomial": ("k", "p"),
                  "generalized_negative_binomial": ("mu", "alpha"), "dirichlet": ("alpha",)}


def pdf(builder: Builder, distribution: str, sample, params: dict, is_log=False, *, out=None,
        name=None):
    """The density of ``sample`` under ``params`` (arrays of one shape that begins the
    sample's; a Dirichlet's also ends it), or its log."""
    fn = f"random_pdf_{distribution}"
    arrays = {"sample": sample, **params}
    for arg, value in arrays.items():
        if not isinstance(value, builder.array_type):
            raise builder.error(f"{fn}: {arg} must be an {builder.array_type.__name__}, got "
                                f"{type(value).__name__}")
    _check_one_float_dtype(builder, fn, arrays)
    _check_pdf_shapes(builder, fn, distribution, sample, params)
    attributes = {"distribution": distribution, "is_log": int(bool(is_log))}
    result = builder.op(MIXRT, "RandomPdf", list(arrays.values()), attributes, name=name,
                        label=f"_random_pdf_{distribution}")
    return builder.written(fn, result, out)


def _check_one_float_dtype(builder: Builder, fn: str, arrays: dict) -> None:
    dtypes = {arg: builder.dtype_of(value) for arg, value in arrays.items()}
    known = {np.dtype(d) for d in dtypes.values() if d is not None}
    if len(known) > 1 or any(d.kind != "f" for d in known):
        given = ", ".join(f"{arg} {np.dtype(d).name}" for arg, d in dtypes.items()
                          if d is not None)
        raise builder.error(f"{fn}: the sample and the parameters must have one "
                            f"floating-point dtype, got {given}")


def _check_pdf_shapes(builder, fn, distribution, sample, params) -> None:
    sample_shape = builder.shape_of(sample)
    shapes = {arg: builder.shape_of(value) for arg, value in params.items()}
    known = [tuple(s) for s in shapes.values() if s is not None]
    if len(set(known)) > 1:
        raise builder.error(f"{fn}: the parameters must have one shape, got {shapes}")
    if not known or sample_shape is None:
        return
    shape, sample_shape = known[0], tuple(sample_shape)
    categories = distribution == "dirichlet"
    lead = shape[:-1] if categories else shape
    fits = len(sample_shape) >= len(shape) and sample_shape[:len(lead)] == lead and (
        not categories or (shape and sample_shape[-1:] == shape[-1:]))
    if not fits:
        where = "begin and end" if categories else "begin"
        raise builder.error(f"{fn}: the parameters' shape {shape} must {where} the sample's "
                            f"{sample_shape}")


# -- the names both front ends (mixrt.nd.random, mixrt.sym.random) export -------------------

RANDOM_NAMES = ("uniform", "normal", "randn", "randint", "poisson", "exponential", "gamma",
                "negative_binomial", "generalized_negative_binomial", "multinomial", "shuffle",
                "uniform_like", "normal_like", "gamma_like", "exponential_like",
                "poisson_like", "negative_binomial_like", "generalized_negative_binomial_like")
# what mixrt.nd and mixrt.sym hold at their top level
FLAT_NAMES = (
    "random_uniform", "random_normal", "random_gamma", "random_exponential", "random_poisson",
    "random_negative_binomial", "random_generalized_negative_binomial", "random_randint",
    "sample_uniform", "sample_normal", "sample_gamma", "sample_exponential", "sample_poisson",
    "sample_negative_binomial", "sample_generalized_negative_binomial", "sample_multinomial",
    "shuffle", *(f"random_pdf_{name}" for name in PDF_PARAMETERS))


def flat_functions(namespace: dict) -> dict:
    """A front end's top-level random names from its module ``namespace``: MXNet's
    ``uniform`` and ``normal`` there are the random_uniform and random_normal operators,
    not the random module's functions."""
    flat = {name: namespace[name] for name in FLAT_NAMES}
    flat.update(uniform=namespace["random_uniform"], normal=namespace["random_normal"])
    return flat
