"""Odd functions (erf, tanh, sigmoid less a half) in float32 as ``x P(u) / Q(u)``,
``u = (x / limit)^2``.

NumPy's float32 tanh is a SIMD call, but numba reaches tanh, erf and exp through scalar libm calls
that LLVM cannot vectorize: a compiled FusedElementwise loop with one of them ran GPT-2's tanh-form
GELU at ~60 ns an element. A rational function is only multiplies, adds, one divide and two clips,
so the compiled loop (``ops/elementwise/jit_elementwise.py``) vectorizes it, and the NumPy path of
``ops/elementwise/fused_elementwise.py`` evaluates the same polynomials in the same order, so both
paths give the same bits.

Each fit is least squares on the relative error, reweighted by the denominator until it
settles (Loeb's iteration), against ``math``'s float64 function. Beyond ``limit`` the float32
result is ±1 (erfc(4) = 1.5e-8 and 1 - tanh(9) = 3e-8 are under half an ulp of 1.0f), so the
input is clipped there and the result clipped to [-1, 1]. Evaluated in float32 both stay
within ~6 ulp of the correctly rounded value (3e-7 absolute); NaN stays NaN. The sigmoid is
a half plus the rational of its odd part, clipped to +-0.5 (:func:`evaluate_sigmoid32`):
within ~2e-7 absolute, as 1 + tanh(x / 2) halved was before it.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from mixrt.ops.elementwise.simd_cpu import clip_

def _sigmoid_odd(x: float) -> float:
    """Sigmoid less a half: odd, so fitted as the others are (see :func:`evaluate_sigmoid32`)."""
    return 1.0 / (1.0 + math.exp(-x)) - 0.5


# name -> (float64 reference, clip limit, numerator degree, denominator degree) in u
FUNCTIONS = {
    "Erf": (math.erf, 4.0, 6, 4),
    "Tanh": (math.tanh, 9.0, 5, 4),
    # past 18 the float32 sigmoid is 1 (or under 1.6e-8, within the fit's error of 0)
    "Sigmoid": (_sigmoid_odd, 18.0, 4, 4),
}


@functools.cache
def coefficients(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(P, Q) of ``name`` as float32, lowest degree first, Q(0) = 1."""
    function, limit, p_degree, q_degree = FUNCTIONS[name]
    x = np.concatenate([np.linspace(0.0, limit, 2000)[1:],
                        limit * np.sin(np.linspace(0.0, np.pi / 2, 2000))[1:]])
    u = (x / limit) ** 2
    g = np.array([function(v) for v in x]) / x
    weights = np.ones_like(u)
    for _ in range(12):
        design = np.hstack([u[:, None] ** np.arange(p_degree + 1),
                            -g[:, None] * u[:, None] ** np.arange(1, q_degree + 1)])
        solution = np.linalg.lstsq(design * weights[:, None], g * weights, rcond=None)[0]
        p = solution[:p_degree + 1]
        q = np.concatenate([[1.0], solution[p_degree + 1:]])
        weights = 1.0 / np.abs(g * np.polynomial.polynomial.polyval(u, q))
    return p.astype(np.float32), q.astype(np.float32)


def limit(name: str) -> float:
    return FUNCTIONS[name][1]


def evaluate_float32(name: str, x, target, u, numerator):
    """``name`` of float32 ``x`` into ``target``; ``u`` and ``numerator`` are scratch
    buffers of target's shape (``target`` may be ``x`` itself)."""
    bound = limit(name)
    below, above = np.less_equal(x, -bound), np.greater_equal(x, bound)  # before target
    _rational32(name, x, target, u, numerator)
    clip_(target, -1.0, 1.0, target)
    np.copyto(target, np.float32(-1.0), where=below)  # saturated, where rounding gave
    np.copyto(target, np.float32(1.0), where=above)  # 0.99999994: GELU's 1 + tanh is 0 there
    return target


def evaluate_sigmoid32(x, target, u, numerator):
    """Sigmoid of float32 ``x`` into ``target`` as a half plus its own odd rational: ``x`` is
    clipped to +-18, the rational's value to +-0.5, then a half is added (NaN stays NaN).
    Within ~2e-7 of 1 / (1 + exp(-x)), as ``(1 + tanh(x / 2)) / 2`` through the tanh
    rational was (which it replaced on 2026-12-05): the same accuracy in about two thirds
    of the operations (one clip of the input, no saturation, no scaling after), so a
    compiled SiLU pass over 0.5 M values on one thread went ~258 -> ~174 us. ``u`` and
    ``numerator`` are scratch buffers of target's shape (``target`` may be ``x``)."""
    _rational32("Sigmoid", x, target, u, numerator)
    clip_(target, -0.5, 0.5, target)
    target += np.float32(0.5)
    return target


def _rational32(name: str, x, target, u, numerator) -> None:
    """``x P(u) / Q(u)`` of ``name`` into ``target``, x clipped to the limit first (NaN
    stays NaN)."""
    p, q = coefficients(name)
    bound = limit(name)
    clip_(x, -bound, bound, target)
    np.multiply(target, target, out=u)
    u *= np.float32(1.0 / bound ** 2)
    _horner32(u, p, numerator)
    target *= numerator
    np.divide(target, _horner32(u, q, numerator), out=target)


def _horner32(u, coefficients_, result):
    np.multiply(u, coefficients_[-1], out=result)
    result += coefficients_[-2]
    for c in coefficients_[-3::-1]:
        result *= u
        result += c
    return result


def numba_source(name: str, function: str, literal) -> list[str]:
    """Source lines of an inlined numba function ``function(x)`` computing ``name`` in the
    order of operations of :func:`evaluate_float32`; ``literal(value)`` is the caller's
    template. Each clip is two selects against a literal, ``low if v < low else v``: a NaN
    fails the comparison and passes through, so LLVM makes each side one min or max,
    where NumPy's NaN-propagating maximum took four instructions a side (~8% of SiLU)."""
    p, q = coefficients(name)
    bound = limit(name)
    low, high = literal(-bound), literal(bound)
    if name == "Sigmoid":  # evaluate_sigmoid32's order: the odd part clipped, a half added
        tail = ["    s = T(-0.5) if r < T(-0.5) else r",
                "    s = T(0.5) if s > T(0.5) else s",
                "    return s + T(0.5)"]
    else:
        tail = ["    s = T(-1.0) if r < T(-1.0) else r",
                "    s = T(1.0) if s > T(1.0) else s",
                f"    return T(-1.0) if x <= {low} else (T(1.0) if x >= {high} else s)"]
    return [
        "@njit(inline='always', error_model='numpy')",
        f"def {function}(x):",
        f"    a = {low} if x < {low} else x",
        f"    c = {high} if a > {high} else a",
        f"    u = c * c * {literal(1.0 / bound ** 2)}",
        f"    top = {_horner_source(p, literal)}",
        f"    bottom = {_horner_source(q, literal)}",
        "    r = (c * top) / bottom",
        *tail,
        "",
    ]


def _horner_source(coefficients_, literal) -> str:
    """u * c[-1] + c[-2], then * u + c for the rest: _horner32's order."""
    text = f"(u * {literal(coefficients_[-1])} + {literal(coefficients_[-2])})"
    for c in coefficients_[-3::-1]:
        text = f"({text} * u + {literal(c)})"
    return text
