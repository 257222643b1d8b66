"""MXNet's Adam (``adam_update``, AdamUpdateKernel): the bias corrections folded into the rate
in Python floats, weight decay added to the gradient before clipping, epsilon after the
square root of the uncorrected second moment."""

from __future__ import annotations

import functools
import math

from mixrt.runtime.training import update_rules as rules
from mixrt.runtime.training.optimizers.definition import (GRADIENT, REQUIRED, Definition,
                                                          Hyper, Operator, clips, common)


@functools.lru_cache(maxsize=None)
def adam(clipped: bool) -> rules.Rule:
    """``lr`` comes bias-corrected (``rate``)."""
    return rules.Rule("adam", ("weight", "mean", "var"), ("grad",),
                      rules.scalars(clipped, "lr", "wd", "beta1", "beta2", "epsilon"), (
                          "g = grad * rescale_grad + weight * wd",
                          *(("g = clip(g, clip_gradient)",) if clipped else ()),
                          "mean = beta1 * mean + (1 - beta1) * g",
                          "var = beta2 * var + (1 - beta2) * g * g",
                          "weight = weight - lr * mean / (sqrt(var) + epsilon)"))


def rate(lr: float, beta1: float, beta2: float, t: int) -> float:
    """MXNet's Adam optimizer folds the bias corrections into the rate, in Python floats
    (``lr *= math.sqrt(coef2) / coef1``: math.sqrt is correctly rounded, ``** 0.5`` need
    not be)."""
    return lr * (math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t))


def _step(xp, weight, reads, states, params, in_place):
    return rules.mxnet_step(adam(clips(params)), xp, weight, reads["grad"], states, **params)


def _engine_step(kind, xp, weight, grad, state, lr, wd, t):
    params = dict(lr=rate(lr, kind.beta1, kind.beta2, t), wd=wd, beta1=kind.beta1,
                  beta2=kind.beta2, epsilon=kind.epsilon, **common(kind))
    return _step(xp, weight, {"grad": grad}, state, params, True)


DEFINITION = Definition(
    name="adam",
    hyper=(Hyper.real("beta1", 0.9, low=0.0, high=1.0, high_open=True),
           Hyper.real("beta2", 0.999, low=0.0, high=1.0, high_open=True),
           Hyper.real("epsilon", 1e-8, low=0.0)),
    slots=lambda hyper: ("mean", "var"),
    step=_engine_step,
    default_learning_rate=0.001,
    operators=(Operator("adam_update", ("mean", "var"), (
        ("lr", REQUIRED), ("beta1", 0.9), ("beta2", 0.999), ("epsilon", 1e-8), ("wd", 0.0),
        *GRADIENT), _step, lazy="flag"),))
