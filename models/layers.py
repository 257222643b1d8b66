"""Layers for the symbol model zoo: each declares its parameters' shapes, names them as MXNet
does (``conv1_weight``, ``bn1_gamma``, ``bn1_moving_mean``) and returns a Symbol.

ONNX operators do not say how many channels they produce, so a layer is told its input
width; the zoo's builders thread it through.
"""

from __future__ import annotations

from mixrt import sym
from mixrt.initializer import MSRAPrelu, Xavier


def dense(x, in_units: int, units: int, name: str, *, bias: bool = True):
    """x (N, in_units) -> (N, units): ``x W^T + b`` as one Gemm."""
    weight = sym.Variable(f"{name}_weight", shape=(units, in_units), init=Xavier())
    if not bias:
        return sym.Gemm(x, weight, transB=1, name=name)
    return sym.Gemm(x, weight, sym.Variable(f"{name}_bias", shape=(units,)), transB=1,
                    name=name)


def dense_nd(x, in_units: int, units: int, name: str):
    """A dense layer over the last axis of an N-d input: MatMul then Add (Gemm is 2-d)."""
    weight = sym.Variable(f"{name}_weight", shape=(in_units, units), init=Xavier())
    bias = sym.Variable(f"{name}_bias", shape=(units,))
    return sym.Add(sym.MatMul(x, weight, name=f"{name}_matmul"), bias, name=name)


def conv2d(x, in_channels: int, channels: int, kernel: int, name: str, *, stride: int = 1,
           pad: int = 0, bias: bool = False):
    """A square 2-d convolution, He-initialized (the ResNet paper's choice)."""
    weight = sym.Variable(f"{name}_weight", shape=(channels, in_channels, kernel, kernel),
                          init=MSRAPrelu(factor_type="in", slope=0.0))
    inputs = [x, weight]
    if bias:
        inputs.append(sym.Variable(f"{name}_bias", shape=(channels,)))
    return sym.Conv(*inputs, kernel_shape=[kernel, kernel], strides=[stride, stride],
                    pads=[pad] * 4, name=name)


def batch_norm(x, channels: int, name: str, *, momentum: float = 0.9,
               epsilon: float = 1e-5):
    """BatchNormalization with gamma/beta parameters and running statistics as auxiliary
    states (the executor updates them in training forwards)."""
    shape = (channels,)
    return sym.BatchNormalization(
        x, sym.Variable(f"{name}_gamma", shape=shape), sym.Variable(f"{name}_beta", shape=shape),
        sym.Variable(f"{name}_moving_mean", shape=shape, aux=True),
        sym.Variable(f"{name}_moving_var", shape=shape, aux=True),
        epsilon=epsilon, momentum=momentum, name=name)


def layer_norm(x, units: int, name: str, *, epsilon: float = 1e-5, stash_type: int = 1):
    """LayerNormalization over the last axis. ONNX computes the statistics in float32
    (``stash_type`` 1) whatever the input's type; 11 keeps a float64 model in float64."""
    shape = (units,)
    return sym.LayerNormalization(x, sym.Variable(f"{name}_gamma", shape=shape),
                                  sym.Variable(f"{name}_beta", shape=shape), axis=-1,
                                  epsilon=epsilon, stash_type=stash_type, name=name)


def max_pool(x, kernel: int, stride: int, name: str, *, pad: int = 0):
    return sym.MaxPool(x, kernel_shape=[kernel, kernel], strides=[stride, stride],
                       pads=[pad] * 4, name=name)


def with_loss(logits, label: str = "label", name: str = "loss"):
    """The symbol to train: (mean softmax cross-entropy against int64 ``label``, the logits
    behind a BlockGrad so that metrics can read them without being differentiated)."""
    labels = sym.Variable(label, dtype="int64")
    loss = sym.SoftmaxCrossEntropyLoss(logits, labels, reduction="mean", name=name)
    return sym.Group([loss, sym.mixrt.BlockGrad(logits, name=f"{name}_logits")])
