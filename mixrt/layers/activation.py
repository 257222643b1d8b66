"""MXNet's ``Activation``, ``LeakyReLU`` and ``Embedding``."""

from __future__ import annotations

import numpy as np

from mixrt.initializer import Constant
from mixrt.layers.call import ShapeRule

_INT64 = 7  # onnx.TensorProto.INT64
ACTIVATIONS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softrelu": "Softplus",
               "softsign": "Softsign"}
LEAKY_TYPES = ("leaky", "elu", "selu", "gelu", "prelu", "rrelu")
# SELU's constants (Klambauer et al.), as MXNet has them
_SELU_ALPHA, _SELU_LAMBDA = 1.6732632423543772, 1.0507009873554805


def Activation(frontend, data=None, act_type=None, name=None, **unknown):
    """Elementwise ``act_type``: relu, sigmoid, tanh, softrelu (``log(1 + exp(x))``) or
    softsign (``x / (1 + |x|)``)."""
    layer = frontend("Activation", name, unknown)
    if act_type is None:
        raise layer.error(f"act_type is required, one of {list(ACTIVATIONS)}")
    act_type = layer.choice("act_type", act_type, ACTIVATIONS)
    return layer.node(ACTIVATIONS[act_type], [layer.data(data)])


def LeakyReLU(frontend, data=None, gamma=None, act_type="leaky", slope=0.25,
              lower_bound=0.125, upper_bound=0.334, name=None, **unknown):
    """``leaky``: ``slope * x`` below 0; ``elu``: ``slope * (exp(x) - 1)`` below 0;
    ``selu``; ``gelu`` (the erf form); ``prelu``: a learned slope per channel (axis 1),
    ``gamma`` of shape (channels,) or (1,) (``<layer>_gamma``, initialized to 0.25 as MXNet
    does, on a symbol); ``rrelu`` outside training only, with the slope
    ``(lower_bound + upper_bound) / 2`` (in training MXNet draws slopes at random, which is
    not supported). Below and at 0 the gradient is the slope's, as MXNet's."""
    layer = frontend("LeakyReLU", name, unknown)
    act_type = layer.choice("act_type", act_type, LEAKY_TYPES)
    data = layer.data(data)
    if act_type == "selu":
        return layer.node("Selu", [data], alpha=_SELU_ALPHA, gamma=_SELU_LAMBDA)
    if act_type == "gelu":
        return layer.node("Gelu", [data])
    if act_type == "prelu":
        return _prelu(layer, data, gamma)
    if act_type == "rrelu":
        return _rrelu(layer, data, lower_bound, upper_bound)
    slope = layer.number("slope", slope)
    zero = layer.scalar(0.0, data, "zero")
    positive = layer.node("Greater", [data, zero], "positive")
    if act_type == "leaky":
        below = layer.node("Mul", [data, layer.scalar(slope, data, "slope")], "below")
        return layer.node("Where", [positive, data, below])
    # elu: exp of the non-positive part only, so a large x cannot make inf * 0
    clamped = layer.node("Where", [positive, zero, data], "clamped")
    expm1 = layer.node("Sub", [layer.node("Exp", [clamped], "exp"),
                               layer.scalar(1.0, data, "one")], "expm1")
    below = layer.node("Mul", [expm1, layer.scalar(slope, data, "slope")], "below")
    return layer.node("Where", [positive, data, below])


def _rrelu(layer, data, lower_bound, upper_bound):
    if layer.in_training() is not False:
        raise layer.error("act_type='rrelu' draws random slopes in training, which is not "
                          "supported; use it outside training (NDArrays) or another act_type")
    slope = (layer.number("lower_bound", lower_bound)
             + layer.number("upper_bound", upper_bound)) / 2
    return layer.node("LeakyRelu", [data], alpha=slope)


def _prelu(layer, data, gamma):
    """Slopes per channel on data seen as (batch, channels, rest): the data's rank may not
    be known here, but (channels, 1) broadcasts against that view whatever it is."""
    grouped = layer.node("Reshape", [data, layer.ints([0, 0, -1])], "grouped")
    gamma = layer.parameter("gamma", gamma, rule=ShapeRule("grouped", grouped,
                                                           (["axis", 1],)),
                            init=Constant(0.25), single_ok=True)
    slopes = layer.node("Reshape", [gamma, layer.ints([-1, 1])], "slopes")
    positive = layer.node("Greater", [grouped, layer.scalar(0.0, data, "zero")], "positive")
    below = layer.node("Mul", [grouped, slopes], "below")
    chosen = layer.node("Where", [positive, grouped, below], "chosen")
    return layer.node("Reshape", [chosen, layer.node("Shape", [data], "shape")])


def Embedding(frontend, data=None, weight=None, input_dim=None, output_dim=None,
              dtype="float32", sparse_grad=False, name=None, **unknown):
    """Rows of ``weight`` (input_dim, output_dim) at the indices in ``data`` (floats index,
    truncated; indices outside [0, input_dim) are clipped, as MXNet does). ``sparse_grad``
    is accepted; the gradient is dense."""
    layer = frontend("Embedding", name, unknown)
    input_dim = layer.count("input_dim", input_dim)
    output_dim = layer.count("output_dim", output_dim)
    layer.flag("sparse_grad", sparse_grad)
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise layer.error(f"dtype={dtype!r} is not a dtype") from None
    if dtype.kind != "f":
        raise layer.error(f"dtype must be a float type, got {dtype}")
    weight = layer.parameter("weight", weight, shape=(input_dim, output_dim),
                             dtype=None if dtype == np.float32 else dtype)
    index = layer.node("Cast", [layer.data(data)], "index", to=_INT64)
    clipped = layer.node("Clip", [index, layer.ints(0), layer.ints(input_dim - 1)], "clipped")
    return layer.node("Gather", [weight, clipped], axis=0)
