"""MXNet's parameter initializers (``mx.init``/``mx.initializer``): Zero, One, Constant,
Uniform, Normal, Orthogonal, Xavier, MSRAPrelu, Bilinear, LSTMBias, FusedRNN, Load and Mixed,
with ``InitDesc``, ``register``, ``alias``, ``create`` and ``dumps``.

Two ways to call one (``mixrt/initializer_base.py`` has the rules):

* MXNet's, ``init(desc, arr)``: fills ``arr`` (an NDArray or a NumPy array) in place; an
  ``InitDesc``'s own ``__init__`` attribute wins, else the name picks the rule as in MXNet.
* mixrt's, ``init(name, shape, dtype)``: returns a new NumPy array (Gluon's Parameters and
  ``sym``'s executors call this form).

    init = mixrt.initializer.Xavier(magnitude=2.0)
    weight = init("fc1_weight", (256, 784), "float32")
    init(mixrt.initializer.InitDesc("fc1_weight"), nd_array)        # in place

Random rules draw from ``mixrt.random.generator()`` (``mixrt.random.seed`` fixes them); the
numbers are not MXNet's, their distributions are.
"""

from __future__ import annotations

import json
import logging
import re

import numpy as np

from mixrt.random_streams import generator as random_generator
from mixrt.base.errors import InputError, ShapeError
from mixrt.initializer_base import (InitDesc, Initializer, InitializerError,  # noqa: F401
                                    _fill, _host, _shape_of, alias, bilinear_kernel, create,
                                    register, role_of, starting_value)


@register
@alias("zeros")
class Zero(Initializer):
    fills_every_role = True

    def __init__(self):
        super().__init__()

    def _init_weight(self, _, arr):
        _fill(arr, 0)


@register
@alias("ones")
class One(Initializer):
    fills_every_role = True

    def __init__(self):
        super().__init__()

    def _init_weight(self, _, arr):
        _fill(arr, 1)


@register
class Constant(Initializer):
    """Every element set to ``value`` (a number, or an array of the parameter's shape)."""

    fills_every_role = True

    def __init__(self, value=0.0):
        super().__init__(value=value)
        self.value = value

    def _init_weight(self, _, arr):
        _fill(arr, _host(self.value) if hasattr(self.value, "shape") else self.value)

    def dumps(self) -> str:
        value = self._kwargs["value"]
        if not np.isscalar(value):
            value = _host(value).tolist()
        return json.dumps(["constant", {"value": value}])


@register
class Uniform(Initializer):
    """Weights uniform in ``[-scale, scale]``."""

    def __init__(self, scale=0.07):
        super().__init__(scale=scale)
        self.scale = scale

    def _init_weight(self, _, arr):
        _fill(arr, random_generator().uniform(-self.scale, self.scale, _shape_of(arr)))


@register
class Normal(Initializer):
    """Weights normal with mean 0 and standard deviation ``sigma``."""

    def __init__(self, sigma=0.01):
        super().__init__(sigma=sigma)
        self.sigma = sigma

    def _init_weight(self, _, arr):
        _fill(arr, random_generator().normal(0.0, self.sigma, _shape_of(arr)))


@register
class Orthogonal(Initializer):
    """Saxe et al. (2013): the orthogonal factor of a random (out, in) matrix, scaled."""

    def __init__(self, scale=1.414, rand_type="uniform"):
        super().__init__(scale=scale, rand_type=rand_type)
        self.scale = scale
        self.rand_type = rand_type

    def _init_weight(self, _, arr):
        shape = _shape_of(arr)
        rows, columns = shape[0], int(np.prod(shape[1:]))
        generator = random_generator()
        if self.rand_type == "uniform":
            draw = generator.uniform(-1.0, 1.0, (rows, columns))
        elif self.rand_type == "normal":
            draw = generator.normal(0.0, 1.0, (rows, columns))
        else:
            raise InitializerError(f"Orthogonal: rand_type must be 'uniform' or 'normal', "
                                   f"got {self.rand_type!r}")
        u, _, v = np.linalg.svd(draw, full_matrices=False)
        _fill(arr, self.scale * (u if u.shape == draw.shape else v).reshape(shape))


def fans(shape: tuple) -> tuple[int, int]:
    """(fan_in, fan_out) of a dense (out, in) or convolution (out, in, *kernel) weight."""
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


@register
class Xavier(Initializer):
    """Glorot & Bengio (2010): variance ``magnitude / factor``, the factor being the fan in,
    the fan out or their mean; uniform or gaussian. Needs at least 2-D weights."""

    def __init__(self, rnd_type="uniform", factor_type="avg", magnitude=3):
        super().__init__(rnd_type=rnd_type, factor_type=factor_type, magnitude=magnitude)
        if rnd_type not in ("uniform", "gaussian"):
            raise InitializerError(f"Xavier: Unknown random type {rnd_type!r}; choose "
                                   f"'uniform' or 'gaussian'")
        if factor_type not in ("avg", "in", "out"):
            raise InitializerError(f"Xavier: Incorrect factor type {factor_type!r}; choose "
                                   f"'avg', 'in' or 'out'")
        self.rnd_type, self.factor_type = rnd_type, factor_type
        self.magnitude = float(magnitude)

    def _init_weight(self, name, arr):
        shape = _shape_of(arr)
        if len(shape) < 2:
            raise InitializerError(f"Xavier initializer cannot be applied to vector {name}. "
                                   f"It requires at least 2D.")
        fan_in, fan_out = fans(shape)
        factor = {"avg": (fan_in + fan_out) / 2.0, "in": fan_in, "out": fan_out}[
            self.factor_type]
        scale = np.sqrt(self.magnitude / factor)
        generator = random_generator()
        _fill(arr, generator.uniform(-scale, scale, shape) if self.rnd_type == "uniform"
              else generator.normal(0.0, scale, shape))


@register
class MSRAPrelu(Xavier):
    """He et al. (2015): gaussian, variance ``2 / ((1 + slope^2) factor)``."""

    def __init__(self, factor_type="avg", slope=0.25):
        super().__init__("gaussian", factor_type, 2.0 / (1 + slope ** 2))
        self._kwargs = {"factor_type": factor_type, "slope": slope}
        self.slope = slope


@register
class Bilinear(Initializer):
    """The bilinear upsampling filter, for Deconvolution weights."""

    def __init__(self):
        super().__init__()

    def _init_weight(self, _, arr):
        _fill(arr, bilinear_kernel(_shape_of(arr)))


@register
class LSTMBias(Initializer):
    """Zero biases but the forget gate's (the second quarter), which get ``forget_bias``."""

    def __init__(self, forget_bias=1.0):
        super().__init__(forget_bias=forget_bias)
        self.forget_bias = forget_bias

    def _init_weight(self, name, arr):
        values = np.zeros(_shape_of(arr))
        hidden = _shape_of(arr)[0] // 4
        values[hidden:2 * hidden] = self.forget_bias
        _fill(arr, values)


_GATES = {"lstm": ["_i", "_f", "_c", "_o"], "gru": ["_r", "_z", "_o"],
          "rnn_relu": [""], "rnn_tanh": [""]}


@register
class FusedRNN(Initializer):
    """Initializes a fused RNN's single parameter vector piece by piece, as MXNet's
    ``FusedRNNCell`` unpacks it: each gate's i2h and h2h weights by ``init`` (or the
    global initializer), biases zero, LSTM forget-gate biases ``forget_bias``."""

    def __init__(self, init, num_hidden, num_layers, mode, bidirectional=False,
                 forget_bias=1.0):
        if isinstance(init, str):
            init = create(init)
        if mode not in _GATES:
            raise InitializerError(f"FusedRNN: mode must be one of {sorted(_GATES)}, got "
                                   f"{mode!r}")
        super().__init__(init=init.dumps() if init is not None else None,
                         num_hidden=num_hidden, num_layers=num_layers, mode=mode,
                         bidirectional=bidirectional, forget_bias=forget_bias)
        self._init, self._num_hidden, self._num_layers = init, num_hidden, num_layers
        self._mode, self._bidirectional, self._forget_bias = mode, bidirectional, forget_bias

    def _init_weight(self, desc, arr):
        values = np.zeros(int(np.prod(_shape_of(arr))), np.float64)
        global_init = getattr(desc, "global_init", None)
        for name, piece in self._pieces(values):
            if self._mode == "lstm" and name.endswith("_f_bias"):
                piece[...] = self._forget_bias
                continue
            chosen = self._init or global_init
            if chosen is None:
                raise InitializerError(f"FusedRNN {desc}: no init given and no global "
                                       f"initializer to use for {name}")
            chosen(InitDesc(name, global_init=global_init), piece)
        _fill(arr, values.reshape(_shape_of(arr)))

    def _pieces(self, values) -> list:
        """(name, view) of each weight and bias inside the flat parameter vector."""
        gates, hidden = _GATES[self._mode], self._num_hidden
        directions = ["l", "r"] if self._bidirectional else ["l"]
        both = len(directions)
        per_layer_rest = (both * hidden + hidden) * hidden * len(gates) * both
        biases = self._num_layers * both * len(gates) * 2 * hidden
        first_in = (values.size - biases - (self._num_layers - 1) * per_layer_rest) \
            // (both * len(gates) * hidden) - hidden
        pieces, start = [], 0

        def take(name, shape):
            nonlocal start
            size = int(np.prod(shape))
            pieces.append((name, values[start:start + size].reshape(shape)))
            start += size
        for layer in range(self._num_layers):
            inputs = first_in if layer == 0 else both * hidden
            for direction in directions:
                for gate in gates:
                    take(f"{direction}{layer}_i2h{gate}_weight", (hidden, inputs))
                for gate in gates:
                    take(f"{direction}{layer}_h2h{gate}_weight", (hidden, hidden))
        for layer in range(self._num_layers):
            for direction in directions:
                for kind in ("i2h", "h2h"):
                    for gate in gates:
                        take(f"{direction}{layer}_{kind}{gate}_bias", (hidden,))
        if start != values.size or first_in <= 0:
            raise ShapeError(f"FusedRNN: {values.size} parameters do not fit a {self._mode} "
                             f"of {self._num_layers} layers with {hidden} hidden units")
        return pieces


class Load:
    """Values from saved parameters (a dict of arrays, or a file ``mixrt.nd.load`` reads:
    ``mixrt.init`` lends it), with ``arg:``/``aux:`` prefixes dropped; names not found go
    to ``default_init``."""

    file_loader = None  # mixrt.init hands in mixrt.nd.load (this module is below mixrt.nd)

    def __init__(self, param, default_init=None, verbose=False):
        if isinstance(param, str):
            if Load.file_loader is None:
                raise InputError("Load: reading a parameter file needs mixrt.nd: use "
                                 "mixrt.init.Load, or pass the dict mixrt.nd.load returns")
            param = Load.file_loader(param)
        if not isinstance(param, dict):
            raise InputError(f"Load takes a dict of arrays or a file name, got "
                             f"{type(param).__name__}")
        self.param = {(name[4:] if name.startswith(("arg:", "aux:")) else name): value
                      for name, value in param.items()}
        self.default_init = default_init
        self.verbose = verbose

    def __call__(self, name, arr=None, dtype="float32"):
        if arr is None or isinstance(arr, (tuple, list)):
            made = np.zeros(tuple(arr or ()), np.dtype(dtype))
            self(str(name), made)
            return made
        if name in self.param:
            saved = _host(self.param[name])
            if saved.shape != _shape_of(arr):
                raise ShapeError(f"Parameter {name} cannot be initialized from loading. Shape "
                                 f"mismatch, target {_shape_of(arr)} vs loaded {saved.shape}")
            _fill(arr, saved)
            if self.verbose:
                logging.info("Initialized %s by loading", name)
            return None
        if self.default_init is None:
            raise InputError(f"Cannot Initialize {name}. Not found in loaded param and no "
                             f"default Initializer is provided.")
        self.default_init(name, arr)
        if self.verbose:
            logging.info("Initialized %s by default", name)
        return None


class Mixed:
    """The first initializer whose regular expression matches the name."""

    def __init__(self, patterns, initializers):
        if len(patterns) != len(initializers):
            raise InputError(f"Mixed: {len(patterns)} patterns for {len(initializers)} "
                             f"initializers")
        self.map = list(zip([re.compile(p) for p in patterns], initializers))

    def __call__(self, name, arr=None, dtype="float32"):
        for pattern, init in self.map:
            if pattern.match(name):
                return init(name, arr, dtype) if arr is None or isinstance(
                    arr, (tuple, list)) else init(name, arr)
        raise InitializerError(f"Parameter name {name} did not match any pattern. Consider "
                               f"add a \".*\" pattern at the and with default Initializer.")


INITIALIZERS = {cls.__name__: cls for cls in (Uniform, Normal, Constant, Zero, One, Xavier,
                                              MSRAPrelu, Orthogonal, Bilinear, LSTMBias,
                                              FusedRNN)}

__all__ = ["InitDesc", "Initializer", "register", "alias", "create", "Load", "Mixed", "Zero",
           "One", "Constant", "Uniform", "Normal", "Orthogonal", "Xavier", "MSRAPrelu",
           "Bilinear", "LSTMBias", "FusedRNN", "InitializerError"]
