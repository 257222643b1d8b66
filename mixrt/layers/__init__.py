"""MXNet 1.x's layers, written once for every front end: ``nd.Convolution`` runs them on
NDArrays, ``sym.Convolution`` builds them into a Symbol's graph, and Gluon's layers call
them through ``F`` from ``hybrid_forward``, so they run imperatively or hybridize.

Each layer is a function of the front end's :class:`~mixrt.layers.call.LayerCall` class
and MXNet's arguments, composed of registered ONNX ops (so it runs on any device, exports,
and differentiates like any op). :func:`bind` gives a front end its version.
"""

from __future__ import annotations

import inspect

from mixrt.layers.activation import Activation, Embedding, LeakyReLU
from mixrt.layers.convolution import Convolution, Deconvolution, FullyConnected
from mixrt.layers.normalization import BatchNorm
from mixrt.layers.output import SoftmaxOutput
from mixrt.layers.pooling import Pooling

LAYERS = {function.__name__: function for function in (
    FullyConnected, Convolution, Deconvolution, Pooling, BatchNorm, Activation, LeakyReLU,
    Embedding, SoftmaxOutput)}


def bind(function, frontend):
    """``function`` (a layer) called with ``frontend`` (a LayerCall class) first, under the
    layer's name, signature and documentation."""
    def layer(*args, **kwargs):
        return function(frontend, *args, **kwargs)

    signature = inspect.signature(function)
    layer.__name__ = layer.__qualname__ = function.__name__
    layer.__doc__ = function.__doc__
    layer.definition = function  # the one definition every front end binds
    layer.__signature__ = signature.replace(parameters=list(
        signature.parameters.values())[1:])
    return layer


def bind_all(frontend) -> dict:
    """Every layer bound to ``frontend``, by name."""
    return {name: bind(function, frontend) for name, function in LAYERS.items()}
