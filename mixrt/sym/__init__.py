"""mixrt.sym: build graphs by composing symbols (the MXNet paper's deep embedding).

    from mixrt import sym
    data = sym.Variable("data")
    net = sym.Gemm(data, sym.Variable("fc1_weight", shape=(128, 784)), transB=1, name="fc1")
    net = sym.Relu(net)
    net.infer_shape(data=(32, 784))
    executor = net.simple_bind("cpu", data=(32, 784))

Every operator mixrt registers is a function here, generated from the registry: the ONNX
default domain at the top level (``sym.Conv``, ``sym.Softmax``), the other domains under a
namespace (``sym.ml``, ``sym.mixrt``, ``sym.preview_training``, ``sym.preview``).

MXNet 1.x's layers whose names ONNX does not use are here too, with MXNet's arguments
(``sym.FullyConnected``, ``sym.Convolution``, ``sym.BatchNorm``, ``sym.SoftmaxOutput``, ...;
see ``mixrt.sym.mxnet_layers``).
"""

from __future__ import annotations

from mixrt.array_methods import (clip, concat, dot, exp, expand_dims, flatten,  # noqa: F401
                                 log, log_softmax, max, maximum, mean, min, minimum, relu,
                                 reshape, sigmoid, softmax, sqrt, square, squeeze, stack, sum,
                                 tanh, transpose, where)
from mixrt.sym.executor import Executor
from mixrt.sym.mxnet_layers import (Activation, BatchNorm, Convolution, Deconvolution,
                                    Embedding, FullyConnected, LeakyReLU,
                                    LinearRegressionOutput, LogisticRegressionOutput,
                                    MAERegressionOutput, Pooling, SoftmaxOutput)
from mixrt.sym.ops import OPSET, generate, install
from mixrt.sym.serialize import load, load_json
from mixrt.sym.symbol import Group, Symbol, Variable, constant, prefix, var

OPERATORS = install(globals(), generate())  # after the MXNet layers: ONNX's names win


def __getattr__(name: str):
    """An op registered after this module was imported (a user's custom op) gets its
    function on first use."""
    from mixrt.ops.registry import REGISTRY  # noqa: PLC0415
    from mixrt.sym.ops import make_function  # noqa: PLC0415
    if REGISTRY.has_op("", name):
        function = globals()[name] = make_function("", name)
        return function
    raise AttributeError(f"module 'mixrt.sym' has no attribute {name!r} (no operator "
                         f"{name!r} is registered)")

__all__ = ["Executor", "Group", "OPSET", "Symbol", "Variable", "constant", "load",
           "load_json", "prefix", "var", *OPERATORS,
           # MXNet's layers (mixrt.sym.mxnet_layers.LAYERS)
           "Activation", "BatchNorm", "Convolution", "Deconvolution", "Embedding",
           "FullyConnected", "LeakyReLU", "LinearRegressionOutput", "LogisticRegressionOutput",
           "MAERegressionOutput", "Pooling", "SoftmaxOutput"]
