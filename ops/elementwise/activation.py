"""Activation functions.

Each is computed in the input's compute dtype (float32 for float16/bfloat16, see
:func:`mixrt.ops.elementwise.elementwise.compute_dtype`) and rounded back once. Attribute constants
are turned into scalars of that dtype first, so a float32 tensor is never promoted to float64.
"""

from __future__ import annotations

import math

from mixrt.ops.ir.dtypes import FLOATS, INTS, NUMERIC, SIGNED_INTS
from mixrt.ops.ir.registry import IN_PLACE
from mixrt.ops.elementwise.elementwise import erf_values, in_compute_dtype, quiet, registered
from mixrt.ops.ir.types import broadcast_like_first, same_as_input


def activation(op_type, *versions, dtypes=FLOATS, memory=None):
    return registered(op_type, *versions, dtypes=dtypes, infer=same_as_input, memory=memory)


def _sigmoid(xp, x):
    """1 / (1 + e^-x) without overflow: exp only ever sees -|x|."""
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(xp, x):
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|), which neither overflows nor loses small x."""
    return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


def _scalar(x, value):
    return x.dtype.type(value)


@activation("Relu", 6, 13, 14, dtypes=FLOATS | SIGNED_INTS, memory=IN_PLACE)
def relu(xp, X):
    return in_compute_dtype(xp, X, lambda x: xp.maximum(x, _scalar(x, 0)))


@activation("LeakyRelu", 6, 16, memory=IN_PLACE)
def leaky_relu(xp, X, *, alpha=0.01):
    return in_compute_dtype(xp, X, lambda x: xp.where(x >= 0, x, x * _scalar(x, alpha)))


@registered("PRelu", 7, 9, 16, dtypes=FLOATS | INTS, infer=broadcast_like_first)
def prelu(xp, X, slope):
    """slope broadcasts to X, unidirectionally."""
    return in_compute_dtype(xp, X, lambda x: xp.where(x < 0, x * slope.astype(x.dtype), x))


@registered("PRelu", 6, dtypes=FLOATS, infer=same_as_input)
def prelu_6(xp, X, slope):
    """Before broadcasting rules, a 1-D slope held one value per channel (axis 1)."""
    if slope.ndim == 1 and slope.size > 1 and X.ndim >= 2 and slope.size == X.shape[1]:
        slope = slope.reshape((-1,) + (1,) * (X.ndim - 2))
    return prelu(xp, X, slope)


@activation("Elu", 6, 22)
def elu(xp, X, *, alpha=1.0):
    def f(x):
        with quiet(xp):
            return xp.where(x >= 0, x, _scalar(x, alpha) * xp.expm1(x))
    return in_compute_dtype(xp, X, f)


@activation("Selu", 6, 22)
def selu(xp, X, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    def f(x):
        with quiet(xp):
            negative = _scalar(x, alpha) * xp.expm1(x)
        return _scalar(x, gamma) * xp.where(x > 0, x, negative)
    return in_compute_dtype(xp, X, f)


@activation("Celu", 12, 28)
def celu(xp, X, *, alpha=1.0):
    def f(x):
        a = _scalar(x, alpha)
        with quiet(xp):
            negative = a * xp.expm1(x / a)
        return xp.maximum(x, _scalar(x, 0)) + xp.minimum(negative, _scalar(x, 0))
    return in_compute_dtype(xp, X, f)


@activation("HardSigmoid", 6, 22)
def hard_sigmoid(xp, X, *, alpha=0.2, beta=0.5):
    return in_compute_dtype(
        xp, X, lambda x: xp.clip(_scalar(x, alpha) * x + _scalar(x, beta), 0, 1))


@activation("HardSwish", 14, 22)
def hard_swish(xp, X):
    return in_compute_dtype(
        xp, X, lambda x: x * xp.clip(x * _scalar(x, 1 / 6) + _scalar(x, 0.5), 0, 1))


@activation("Sigmoid", 6, 13, memory=IN_PLACE)
def sigmoid(xp, X):
    return in_compute_dtype(xp, X, lambda x: _sigmoid(xp, x))


@activation("Tanh", 6, 13, memory=IN_PLACE)
def tanh(xp, X):
    return in_compute_dtype(xp, X, xp.tanh)


@activation("Softplus", 1, 22)
def softplus(xp, X):
    return in_compute_dtype(xp, X, lambda x: _softplus(xp, x))


@activation("Softsign", 1, 22)
def softsign(xp, X):
    return in_compute_dtype(xp, X, lambda x: x / (1 + xp.abs(x)))


@activation("ThresholdedRelu", 10, 22)
def thresholded_relu(xp, X, *, alpha=1.0):
    return in_compute_dtype(
        xp, X, lambda x: xp.where(x > _scalar(x, alpha), x, _scalar(x, 0)))


@activation("Shrink", 9, dtypes=NUMERIC)
def shrink(xp, X, *, bias=0.0, lambd=0.5):
    """Integers are shrunk in float64 (bias and lambd are floats) and cast back."""
    x = X.astype("float64") if X.dtype.kind in "iu" else X

    def f(x):
        zero = _scalar(x, 0)
        shrunk = xp.where(x > _scalar(x, lambd), x - _scalar(x, bias), zero)
        return xp.where(x < _scalar(x, -lambd), x + _scalar(x, bias), shrunk)
    return in_compute_dtype(xp, x, f).astype(X.dtype, copy=False)


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


@activation("Gelu", 20)
def gelu(xp, X, *, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")

    def f(x):
        if approximate == "tanh":
            inner = _scalar(x, _SQRT_2_OVER_PI) * (x + _scalar(x, 0.044715) * x * x * x)
            return _scalar(x, 0.5) * x * (1 + xp.tanh(inner))
        return _scalar(x, 0.5) * x * (1 + erf_values(xp, x * _scalar(x, 1 / math.sqrt(2))))
    return in_compute_dtype(xp, X, f)


@activation("Swish", 24)
def swish(xp, X, *, alpha=1.0):
    return in_compute_dtype(xp, X, lambda x: x * _sigmoid(xp, _scalar(x, alpha) * x))


@activation("Mish", 18, 22)
def mish(xp, X):
    return in_compute_dtype(xp, X, lambda x: x * xp.tanh(_softplus(xp, x)))
