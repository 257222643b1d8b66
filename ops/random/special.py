"""log Gamma and digamma on NumPy or CuPy arrays (NumPy has neither, and SciPy is no
dependency of mixrt): what the densities of ``ops/random/pdf.py`` and their gradients need.
Both work in float64 and reflect arguments below 1/2, so they hold on the whole real line
(log Gamma is +inf at 0 and the negative integers, where Gamma has its poles).
"""

from __future__ import annotations

import math

import numpy as np

# Lanczos's approximation with g = 7 and nine terms: relative error below 1e-15 for x >= 1/2
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012,
            9.9843695780195716e-6, 1.5056327351493116e-7)
# the asymptotic series of digamma, in powers of 1 / x^2 (Bernoulli numbers B_2k / 2k),
# accurate to 1e-12 from x = 6, where the recurrence below brings every argument
_DIGAMMA_SERIES = (-1.0 / 12, 1.0 / 120, -1.0 / 252, 1.0 / 240, -1.0 / 132, 691.0 / 32760)
_DIGAMMA_FROM = 6.0


def lgamma(xp, x):
    """log |Gamma(x)|."""
    x = xp.asarray(x, dtype=np.float64)
    reflected = x < 0.5
    z = xp.where(reflected, 1.0 - x, x) - 1.0
    series = _LANCZOS[0] + sum(c / (z + i) for i, c in enumerate(_LANCZOS[1:], 1))
    t = z + _LANCZOS_G + 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        direct = 0.5 * math.log(2 * math.pi) + (z + 0.5) * xp.log(t) - t + xp.log(series)
        # Gamma(x) Gamma(1 - x) = pi / sin(pi x)
        mirrored = math.log(math.pi) - xp.log(xp.abs(xp.sin(math.pi * x))) - direct
    return xp.where(reflected, mirrored, direct)


def digamma(xp, x):
    """d/dx log Gamma(x)."""
    x = xp.asarray(x, dtype=np.float64)
    reflected = x < 0.5
    y = xp.where(reflected, 1.0 - x, x)
    shift = xp.zeros_like(y)
    for _ in range(int(_DIGAMMA_FROM)):  # psi(y) = psi(y + 1) - 1 / y
        small = y < _DIGAMMA_FROM
        shift = shift - xp.where(small, 1.0 / y, 0.0)
        y = xp.where(small, y + 1.0, y)
    inverse_square = 1.0 / (y * y)
    tail = xp.zeros_like(y)
    for coefficient in reversed(_DIGAMMA_SERIES):
        tail = (tail + coefficient) * inverse_square
    direct = shift + xp.log(y) - 0.5 / y + tail
    with np.errstate(divide="ignore", invalid="ignore"):
        # psi(1 - x) - psi(x) = pi / tan(pi x)
        mirrored = direct - math.pi / xp.tan(math.pi * x)
    return xp.where(reflected, mirrored, direct)
