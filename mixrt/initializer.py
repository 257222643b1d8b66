"""Parameter initializers, MXNet's set: ``Xavier``, ``MSRAPrelu``, ``Normal``, ``Uniform``,
``Constant``, ``Zero``, ``One``.

An initializer is called with a parameter's name, shape and dtype and returns a new array.
Like MXNet's, it fills a parameter by its role, read from the name's suffix, before its own
rule: biases, BatchNormalization shifts and running means start at zero, scales and running
variances at one; only weights get the random rule. Randomness comes from
``mixrt.random.generator()``, so ``mixrt.random.seed`` makes it reproducible.

    init = mixrt.initializer.Xavier(magnitude=2.0)
    weight = init("fc1_weight", (256, 784), "float32")
"""

from __future__ import annotations

import math

import numpy as np

from mixrt import random_streams as mixrt_random
from mixrt.base.errors import InputError

# name suffix -> role (mixrt.sym names parameters this way: fc1_weight, bn1_moving_var)
_ROLE_BY_SUFFIX = {"bias": "zero", "beta": "zero", "mean": "zero",
                   "gamma": "one", "scale": "one", "var": "one"}


class Initializer:
    """Base: role by name, then :meth:`weight` for everything else."""

    def __call__(self, name: str, shape, dtype="float32") -> np.ndarray:
        shape, dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        role = role_of(name)
        if role == "zero":
            return np.zeros(shape, dtype)
        if role == "one":
            return np.ones(shape, dtype)
        return np.asarray(self.weight(name, shape), dtype=dtype)

    def weight(self, name: str, shape: tuple) -> np.ndarray:
        raise NotImplementedError

    def spec(self) -> dict:
        """The initializer as JSON-able data (what a Variable's ``init`` stores)."""
        return {"type": type(self).__name__, **vars(self)}


def role_of(name: str) -> str:
    """"zero", "one" or "weight", from the parameter name's suffix."""
    lowered = name.lower()
    for suffix in sorted(_ROLE_BY_SUFFIX, key=len, reverse=True):
        if lowered.endswith(suffix):
            return _ROLE_BY_SUFFIX[suffix]
    return "weight"


def fans(shape: tuple) -> tuple[int, int]:
    """(fan_in, fan_out) of a dense (out, in) or convolution (out, in, *kernel) weight."""
    if len(shape) < 2:
        size = int(np.prod(shape)) if shape else 1
        return size, size
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


class Uniform(Initializer):
    """Weights uniform in [-scale, scale]."""

    def __init__(self, scale: float = 0.07):
        self.scale = float(scale)

    def weight(self, name, shape):
        return mixrt_random.generator().uniform(-self.scale, self.scale, shape)


class Normal(Initializer):
    """Weights normal with mean 0 and standard deviation ``sigma``."""

    def __init__(self, sigma: float = 0.01):
        self.sigma = float(sigma)

    def weight(self, name, shape):
        return mixrt_random.generator().normal(0.0, self.sigma, shape)


class Constant(Initializer):
    """Every element (weights and, unlike the role rule, biases too) set to ``value``."""

    def __init__(self, value: float = 0.0):
        self.value = float(value)

    def __call__(self, name, shape, dtype="float32"):
        return np.full(tuple(int(d) for d in shape), self.value, dtype=np.dtype(dtype))

    def weight(self, name, shape):
        return np.full(shape, self.value)


class Zero(Constant):
    def __init__(self):
        super().__init__(0.0)

    def spec(self) -> dict:
        return {"type": "Zero"}


class One(Constant):
    def __init__(self):
        super().__init__(1.0)

    def spec(self) -> dict:
        return {"type": "One"}


class Xavier(Initializer):
    """Glorot & Bengio: variance ``magnitude / fan`` where fan is the input count ("in"),
    the output count ("out") or their mean ("avg"); uniform or gaussian."""

    def __init__(self, rnd_type: str = "uniform", factor_type: str = "avg",
                 magnitude: float = 3.0):
        if rnd_type not in ("uniform", "gaussian"):
            raise InputError(f"Xavier: rnd_type must be 'uniform' or 'gaussian', got "
                             f"{rnd_type!r}")
        if factor_type not in ("avg", "in", "out"):
            raise InputError(f"Xavier: factor_type must be 'avg', 'in' or 'out', got "
                             f"{factor_type!r}")
        self.rnd_type, self.factor_type, self.magnitude = rnd_type, factor_type, float(
            magnitude)

    def weight(self, name, shape):
        fan_in, fan_out = fans(shape)
        factor = {"avg": (fan_in + fan_out) / 2.0, "in": fan_in, "out": fan_out}[
            self.factor_type]
        scale = math.sqrt(self.magnitude / max(factor, 1))
        generator = mixrt_random.generator()
        if self.rnd_type == "uniform":
            return generator.uniform(-scale, scale, shape)
        return generator.normal(0.0, scale, shape)


class MSRAPrelu(Xavier):
    """He et al.: gaussian with variance 2 / ((1 + slope^2) fan) — Xavier's gaussian form
    with magnitude 2 / (1 + slope^2)."""

    def __init__(self, factor_type: str = "avg", slope: float = 0.25):
        super().__init__("gaussian", factor_type, 2.0 / (1.0 + slope ** 2))
        self.slope = float(slope)

    def spec(self) -> dict:
        return {"type": "MSRAPrelu", "factor_type": self.factor_type, "slope": self.slope}


INITIALIZERS = {cls.__name__: cls for cls in (Uniform, Normal, Constant, Zero, One, Xavier,
                                              MSRAPrelu)}


def create(spec) -> Initializer:
    """An initializer from an instance, a name ("xavier", "zeros", ...) or a spec dict."""
    if isinstance(spec, Initializer):
        return spec
    if isinstance(spec, str):
        aliases = {"zeros": "Zero", "zero": "Zero", "ones": "One", "one": "One"}
        key = aliases.get(spec.lower(), next(
            (name for name in INITIALIZERS if name.lower() == spec.lower()), None))
        if key is None:
            raise InputError(f"unknown initializer {spec!r}; known: "
                             f"{sorted(INITIALIZERS)}, 'zeros', 'ones'")
        return INITIALIZERS[key]()
    if isinstance(spec, dict) and spec.get("type") in INITIALIZERS:
        options = {k: v for k, v in spec.items() if k != "type"}
        return INITIALIZERS[spec["type"]](**options)
    raise InputError(f"an initializer is an Initializer, a name or a spec dict with a known "
                     f"'type'; got {spec!r}")
