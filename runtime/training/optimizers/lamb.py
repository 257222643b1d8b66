"""MXNet's LAMB (You et al., 2019; ``lamb_update_phase1`` and ``lamb_update_phase2``,
LambUpdatePhaseOneKernel and LambUpdatePhaseTwoKernel, and their ``mp_`` forms): Adam's
direction with decoupled weight decay, then a step scaled by the trust ratio of the weight's
norm to the direction's. The norms are ``norm``'s wherever LAMB runs (this process, a
parameter server): a server holding a key whole takes the worker's steps bit for bit."""

from __future__ import annotations

import functools

import numpy as np

from mixrt.runtime.training import update_rules as rules
from mixrt.runtime.training.optimizers.definition import (GRADIENT, REQUIRED, Definition,
                                                          Hyper, Operator, clips, common)


@functools.lru_cache(maxsize=None)
def direction(clipped: bool, bias_correction: bool) -> rules.Rule:
    """Phase one: Adam's moments and the direction ``direction`` (the weight is read, not
    written). ``beta1_t`` and ``beta2_t`` are ``std::pow(beta, t)`` in the dtype; the first
    correction divides by the double ``1. - beta1_t`` (a double literal in MXNet's kernel),
    the second in the dtype."""
    corrected = ("mean_hat = narrowed(widened(mean) / (1 - widened(beta1_t)))",
                 "var_hat = var / (1 - beta2_t)",
                 "direction = mean_hat / (sqrt(var_hat) + epsilon) + wd * weight")
    plain = ("direction = mean / (sqrt(var) + epsilon) + wd * weight",)
    return rules.Rule("lamb_direction", ("weight", "mean", "var"), ("grad",),
                      rules.scalars(clipped, "wd", "beta1", "beta2", "beta1_t", "beta2_t",
                                    "epsilon"), (
                          *rules.rescaled_first(clipped),
                          "mean = beta1 * mean + (1 - beta1) * g",
                          "var = beta2 * var + (1 - beta2) * g * g",
                          *(corrected if bias_correction else plain)))


STEP = rules.Rule("lamb_step", ("weight",), ("direction",), ("lr", "r1", "r2"), (
    "rate = lr * r1 / r2",  # LambUpdatePhaseTwoKernel: the rate in the dtype, then the step
    "weight = weight - rate * direction"))


def power(beta: float, t: int, dtype) -> float:
    """``std::pow(beta, t)`` of phase one (the C float ``beta`` raised in double, as C++
    promotes it), in the weight's dtype."""
    return float(np.dtype(dtype).type(rules.as_mxnet_scalar(beta) ** int(t)))


def norm(xp, array) -> float:
    """The L2 norm of the trust ratio, as mixrt computes it wherever LAMB runs (the same
    NumPy reduction in the same order, so the same bits): the squares summed in float32 over
    the flattened array, then the square root. A GPU's reduction (CuPy's) adds in another
    order."""
    values = xp.ascontiguousarray(array, dtype=np.float32).reshape(-1)
    return float(xp.sqrt((values * values).sum()))  # float32 throughout


def trust_step(xp, weight, direction_, lr, r1: float, r2: float, lower_bound=None,
               upper_bound=None) -> None:
    """Phase two in place on ``weight``: ``r1`` (the weight's norm) held to the bounds
    MXNet's Python passes (those set and > 0), the rate ``lr * r1 / r2`` in the dtype,
    ``lr`` alone where either norm is 0."""
    dtype = weight.dtype.type
    r1 = dtype(r1)
    if lower_bound is not None and lower_bound > 0:
        r1 = max(r1, dtype(rules.as_mxnet_scalar(lower_bound)))
    if upper_bound is not None and upper_bound > 0:
        r1 = min(r1, dtype(rules.as_mxnet_scalar(upper_bound)))
    if r1 == 0 or r2 == 0:
        r1, r2 = 1.0, 1.0  # lr * 1 / 1 is lr, as the kernel's ``lr * 1.0f``
    rules.run(STEP, xp, weight.dtype, {"weight": weight}, {"direction": direction_},
              {"lr": rules.as_mxnet_scalar(lr), "r1": float(r1), "r2": float(dtype(r2))})


# -- the steps -----------------------------------------------------------------------------

def _direction_step(xp, weight, reads, states, params, in_place):
    """Phase one's value: the direction (``mean`` and ``var`` updated in place)."""
    p = dict(params)
    t, bias_correction = p.pop("t"), bool(p.pop("bias_correction"))
    powers = {"beta1_t": power(p["beta1"], t, weight.dtype),
              "beta2_t": power(p["beta2"], t, weight.dtype)}
    return rules.mxnet_values(direction(clips(p), bias_correction), xp, weight, reads["grad"],
                              states, exact=powers, **p)["direction"]


def _trust_step(xp, weight, reads, states, params, in_place):
    """Phase two's new weight, ``r1`` and ``r2`` read from their one-value arrays."""
    value = weight.copy()
    first, second = (float(reads[name].reshape(-1)[0]) for name in ("r1", "r2"))
    trust_step(xp, value, reads["g"].astype(weight.dtype, copy=False), params["lr"], first,
               second, params["lower_bound"], params["upper_bound"])
    return value


def _engine_step(kind, xp, weight, grad, state, lr, wd, t):
    found = _direction_step(xp, weight, {"grad": grad}, state, dict(
        t=t, bias_correction=kind.bias_correction, wd=wd, beta1=kind.beta1, beta2=kind.beta2,
        epsilon=kind.epsilon, **common(kind)), False)
    new_weight = weight.copy()
    trust_step(xp, new_weight, found, lr, norm(xp, weight), norm(xp, found),
               kind.lower_bound, kind.upper_bound)
    return new_weight


_PHASE1 = (("t", REQUIRED), ("wd", REQUIRED), ("beta1", 0.9), ("beta2", 0.999),
           ("epsilon", 1e-6), ("bias_correction", True), *GRADIENT)
_PHASE2 = (("lr", REQUIRED), ("lower_bound", -1.0), ("upper_bound", -1.0))
_TRUST_READS = ("g", "r1", "r2")

DEFINITION = Definition(
    name="lamb",
    hyper=(Hyper.real("beta1", 0.9, low=0.0, high=1.0, high_open=True),
           Hyper.real("beta2", 0.999, low=0.0, high=1.0, high_open=True),
           Hyper.real("epsilon", 1e-6, low=0.0),
           Hyper.optional("lower_bound", zero_is_none=True, low=0.0, low_open=True),
           Hyper.optional("upper_bound", zero_is_none=True, low=0.0, low_open=True),
           Hyper.flag("bias_correction", True)),
    slots=lambda hyper: ("mean", "var"),
    step=_engine_step,
    default_learning_rate=0.001,
    operators=(
        Operator("lamb_update_phase1", ("mean", "var"), _PHASE1, _direction_step,
                 returns="direction"),
        Operator("lamb_update_phase2", (), _PHASE2, _trust_step, reads=_TRUST_READS),
        Operator("mp_lamb_update_phase1", ("mean", "var"), _PHASE1, _direction_step,
                 master=True, returns="direction"),
        Operator("mp_lamb_update_phase2", (), _PHASE2, _trust_step, reads=_TRUST_READS,
                 master=True)))
