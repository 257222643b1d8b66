"""MXNet's special functions on NDArrays: ``gamma``, ``gammaln`` and ``erfinv``, with their
gradients (``gamma * digamma``, ``digamma``, ``sqrt(pi) / 2 * exp(erfinv(x)^2)``).

No ONNX operator computes them, so they are autograd Functions on the device's array module,
computed in float64 and returned in the input's dtype: the Lanczos series (g = 7, nine terms,
about 1e-15 relative) with the reflection formula below 1/2; digamma by its recurrence up to 6
and the asymptotic series there; erfinv by Giles' approximation polished with two Newton steps
on ``erf``. They are NDArray-only (``mixrt.sym`` has no graph for them).
"""

from __future__ import annotations

import math

import numpy as np

from mixrt import tape
from mixrt.nd.mxnet_args import _array
from mixrt.ops.elementwise.elementwise import erf_values

_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012,
            9.9843695780195716e-6, 1.5056327351493116e-7)


def _lgamma_right(xp, x):
    """log|Gamma(x)| for x >= 1/2."""
    x = x - 1.0
    total = xp.full_like(x, _LANCZOS[0])
    for i, coefficient in enumerate(_LANCZOS[1:], start=1):
        total = total + coefficient / (x + i)
    t = x + 7.5
    return 0.5 * math.log(2 * math.pi) + (x + 0.5) * xp.log(t) - t + xp.log(total)


def _lgamma(xp, x):
    """log|Gamma(x)|, the reflection formula below 1/2."""
    left = x < 0.5
    safe = xp.where(left, 1.0 - x, x)
    right = _lgamma_right(xp, safe)
    with np.errstate(divide="ignore", invalid="ignore"):
        reflected = math.log(math.pi) - xp.log(xp.abs(xp.sin(math.pi * x))) - right
    return xp.where(left, reflected, right)


def _gamma(xp, x):
    """Gamma(x): exp(lgamma) with the sign of sin(pi x) below 0 (Gamma alternates there)."""
    magnitude = xp.exp(_lgamma(xp, x))
    negative = (x < 0) & (xp.floor(x) % 2 == 1)
    return xp.where(negative, -magnitude, magnitude)


def _digamma(xp, x):
    """psi(x) = d lgamma / dx."""
    left = x < 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = xp.where(left, math.pi / xp.tan(math.pi * x), 0.0)
    x = xp.where(left, 1.0 - x, x)
    result = xp.zeros_like(x)
    for _ in range(6):  # psi(x) = psi(x + 1) - 1/x until x >= 6
        small = x < 6
        result = result - xp.where(small, 1.0 / x, 0.0)
        x = xp.where(small, x + 1.0, x)
    inverse = 1.0 / (x * x)
    series = inverse * (1 / 12 - inverse * (1 / 120 - inverse * (1 / 252 - inverse * (
        1 / 240 - inverse / 132))))
    return result + xp.log(x) - 0.5 / x - series - shift


def _erfinv(xp, y):
    """Giles (2010), then two Newton steps on erf (whose derivative is 2/sqrt(pi) e^-x^2)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        w = -xp.log((1.0 - y) * (1.0 + y))
        central = w < 5.0
        a = xp.where(central, w - 2.5, xp.sqrt(xp.where(central, 5.0, w)) - 3.0)
        p = xp.where(central, 2.81022636e-08, -0.000200214257)
        for c, t in ((3.43273939e-07, 0.000100950558), (-3.5233877e-06, 0.00134934322),
                     (-4.39150654e-06, -0.00367342844), (0.00021858087, 0.00573950773),
                     (-0.00125372503, -0.0076224613), (-0.00417768164, 0.00943887047),
                     (0.246640727, 1.00167406), (1.50140941, 2.83297682)):
            p = xp.where(central, c, t) + p * a
        x = p * y
        for _ in range(2):
            x = x - (erf_values(xp, x) - y) / (2 / math.sqrt(math.pi) * xp.exp(-x * x))
    return xp.where(xp.abs(y) == 1, xp.copysign(xp.inf, y), x)


class _Special(tape.Function):
    """y = value(x), dy/dx = slope(x, y), in float64, returned in x's dtype."""

    def __init__(self, value, slope):
        super().__init__()
        self.value, self.slope = value, slope

    def forward(self, x):
        xp, raw = x.ctx.xp, x._read()
        self.wide = raw.astype(np.float64)
        self.out = self.value(xp, self.wide)
        return type(x)(self.out.astype(raw.dtype), x.ctx)

    def backward(self, dy):
        xp, grad = dy.ctx.xp, dy._read()
        slope = self.slope(xp, self.wide, self.out)
        return type(dy)((grad.astype(np.float64) * slope).astype(grad.dtype), dy.ctx)


def gamma(data, name=None):
    """MXNet's ``gamma``: the gamma function."""
    data = _array("gamma", "data", data)
    return _Special(_gamma, lambda xp, x, y: y * _digamma(xp, x))(data)


def gammaln(data, name=None):
    """MXNet's ``gammaln``: log|gamma(x)|."""
    data = _array("gammaln", "data", data)
    return _Special(_lgamma, lambda xp, x, y: _digamma(xp, x))(data)


def erfinv(data, name=None):
    """MXNet's ``erfinv``: the inverse of ``erf`` on (-1, 1) (+-inf at +-1)."""
    data = _array("erfinv", "data", data)
    return _Special(_erfinv, lambda xp, x, y: math.sqrt(math.pi) / 2 * xp.exp(y * y))(data)


FUNCTIONS = ["gamma", "gammaln", "erfinv"]
