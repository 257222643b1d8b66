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
see ``mixrt.sym.symbol_layers``), and MXNet's functions (``sym.broadcast_add``,
``sym.slice_axis``, ``sym.topk``, ...; see ``mixrt.sym.mxnet_ops``).
"""

from __future__ import annotations

from mixrt.array_methods import (clip, concat, exp, expand_dims, flatten,  # noqa: F401
                                 log, max, maximum, mean, min, minimum, prod, relu, reshape,
                                 sigmoid, sqrt, square, squeeze, stack, sum, tanh, transpose,
                                 where)
from mixrt.sym.executor import Executor
from mixrt.sym.symbol_layers import (Activation, BatchNorm, Convolution, Deconvolution,
                                    Embedding, FullyConnected, LeakyReLU,
                                    LinearRegressionOutput, LogisticRegressionOutput,
                                    MAERegressionOutput, Pooling, SoftmaxOutput)
from mixrt.op_specs import generate, install, OPSET
from mixrt.sym.ops import make_function
from mixrt.sym.serialize import load, load_json
from mixrt.sym.symbol import constant, prefix, var, Group, Symbol, Variable

OPERATORS = install(globals(), generate(make_function))  # after the MXNet layers: ONNX's names win

# MXNet's function names (F.broadcast_add, F.slice_axis, F.topk, ...): mixrt.nd's bodies run
# on the Symbol (mixrt.sym.mxnet_ops), so a hybrid_forward reads the same with F = nd
from mixrt.sym import mxnet_ops as _mxnet_ops  # noqa: E402
from mixrt.ops.ir.registry import REGISTRY

MXNET_FUNCTIONS = list(_mxnet_ops.FUNCTIONS)
globals().update(_mxnet_ops.FUNCTIONS)
_mxnet_ops.attach_methods()
from mixrt.sym import random  # noqa: E402  (MXNet's samplers, and sym.random_uniform, ...)
globals().update(random.FLAT)
from mixrt.sym.custom import Custom  # noqa: E402,F401  (MXNet's sym.Custom: mixrt.operator)
from mixrt.sym import contrib  # noqa: E402,F401  (MXNet's sym.contrib.rand_zipfian, ...)
# the MXNet functions mx.sym code calls before any shape is known, built shape-free
from mixrt.sym import shape_free as _shape_free  # noqa: E402
from mixrt.sym import _internal  # noqa: E402,F401  (MXNet's mx.sym._internal)
globals().update(_shape_free.FUNCTIONS)
MXNET_FUNCTIONS += [name for name in _shape_free.FUNCTIONS if name not in MXNET_FUNCTIONS]
globals().update(_shape_free.CREATORS)  # sym.zeros, sym.ones, sym.full: no operand
from mixrt.sym import sparse  # noqa: E402  (MXNet's mx.sym.sparse: the dense ops, by name)
sparse.__dict__.update({_name: globals()[_name] for _name in sparse.SAME_AS_DENSE})

from mixrt.sym import fused_rnn as _fused_rnn  # noqa: E402  (MXNet's fused sym.RNN)
RNN = _fused_rnn.with_onnx_rnn(RNN, _fused_rnn.fused_rnn, "mixrt.sym.fused_rnn")  # noqa: F821


def __getattr__(name: str):
    """An op registered after this module was imported (a user's custom op) gets its
    function on first use."""
    if REGISTRY.has_op("", name):
        function = globals()[name] = make_function("", name)
        return function
    raise AttributeError(f"module 'mixrt.sym' has no attribute {name!r} (no operator "
                         f"{name!r} is registered)")

__all__ = ["Executor", "Group", "OPSET", "Symbol", "Variable", "constant", "load",
           "load_json", "prefix", "var", *OPERATORS,
           # MXNet's layers (mixrt.sym.symbol_layers.LAYERS)
           "Activation", "BatchNorm", "Convolution", "Deconvolution", "Embedding",
           "FullyConnected", "LeakyReLU", "LinearRegressionOutput", "LogisticRegressionOutput",
           "MAERegressionOutput", "Pooling", "SoftmaxOutput", *MXNET_FUNCTIONS,
           *_shape_free.CREATORS]
