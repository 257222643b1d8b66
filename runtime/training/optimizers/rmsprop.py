"""MXNet's RMSProp (``rmsprop_update``, RMSPropUpdateKernel, Tieleman and Hinton) and, with
``centered``, Graves' form (``rmspropalex_update``, RMSPropAlexUpdateKernel), whose step keeps
a momentum ``gamma2``: weight decay and clipping on the gradient, epsilon inside the square
root, ``clip_weights`` on the new weight."""

from __future__ import annotations

import functools

from mixrt.runtime.training import update_rules as rules
from mixrt.runtime.training.optimizers.definition import (GRADIENT, REQUIRED, Definition,
                                                          Hyper, Operator, clips, common)


@functools.lru_cache(maxsize=None)
def rmsprop(clipped: bool, clipped_weights: bool) -> rules.Rule:
    return rules.Rule("rmsprop", ("weight", "n"), ("grad",),
                      rules.scalars(clipped, "lr", "wd", "gamma1", "epsilon")
                      + (("clip_weights",) if clipped_weights else ()), (
                          "g = rescale_grad * grad + wd * weight",
                          *(("g = clip(g, clip_gradient)",) if clipped else ()),
                          "n = (1 - gamma1) * (g * g) + gamma1 * n",
                          "weight = weight - lr * (g / sqrt(n + epsilon))",
                          *(("weight = clip(weight, clip_weights)",) if clipped_weights
                            else ())))


@functools.lru_cache(maxsize=None)
def rmsprop_centered(clipped: bool, clipped_weights: bool) -> rules.Rule:
    """Running means of ``g * g`` (``n``) and of ``g`` (``g``); the step ``delta`` keeps a
    momentum ``gamma2``. Its square is ``(1 - gamma1) * g * g``, left to right, unlike
    ``rmsprop``'s ``(1 - gamma1) * (g * g)``."""
    return rules.Rule("rmsprop_centered", ("weight", "n", "g", "delta"), ("grad",),
                      rules.scalars(clipped, "lr", "wd", "gamma1", "gamma2", "epsilon")
                      + (("clip_weights",) if clipped_weights else ()), (
                          "rescaled = rescale_grad * grad + wd * weight",
                          *(("rescaled = clip(rescaled, clip_gradient)",) if clipped else ()),
                          "n = (1 - gamma1) * rescaled * rescaled + gamma1 * n",
                          "g = (1 - gamma1) * rescaled + gamma1 * g",
                          "delta = gamma2 * delta - lr * rescaled / sqrt(n - g * g + epsilon)",
                          "weight = weight + delta",
                          *(("weight = clip(weight, clip_weights)",) if clipped_weights
                            else ())))


def _step(xp, weight, reads, states, params, in_place):
    rule = rmsprop(clips(params), clips(params, "clip_weights"))
    return rules.mxnet_step(rule, xp, weight, reads["grad"], states, **params)


def _centered_step(xp, weight, reads, states, params, in_place):
    rule = rmsprop_centered(clips(params), clips(params, "clip_weights"))
    return rules.mxnet_step(rule, xp, weight, reads["grad"], states, **params)


def _engine_step(kind, xp, weight, grad, state, lr, wd, t):
    params = dict(lr=lr, wd=wd, gamma1=kind.gamma1, epsilon=kind.epsilon,
                  clip_weights=-1.0 if kind.clip_weights is None else kind.clip_weights,
                  **common(kind))
    if kind.centered:
        return _centered_step(xp, weight, {"grad": grad}, state,
                              dict(params, gamma2=kind.gamma2), True)
    return _step(xp, weight, {"grad": grad}, state, params, True)


_TAIL = (("epsilon", 1e-8), ("wd", 0.0), *GRADIENT, ("clip_weights", -1.0))

DEFINITION = Definition(
    name="rmsprop",
    hyper=(Hyper.real("gamma1", 0.9, low=0.0, high=1.0),
           Hyper.real("gamma2", 0.9, low=0.0, high=1.0),
           Hyper.real("epsilon", 1e-8, low=0.0), Hyper.flag("centered", False),
           Hyper.optional("clip_weights", low=0.0, low_open=True)),
    slots=lambda hyper: ("n", "g", "delta") if hyper["centered"] else ("n",),
    step=_engine_step,
    default_learning_rate=0.001,
    operators=(
        Operator("rmsprop_update", ("n",), (("lr", REQUIRED), ("gamma1", 0.95), *_TAIL),
                 _step),
        Operator("rmspropalex_update", ("n", "g", "delta"),
                 (("lr", REQUIRED), ("gamma1", 0.95), ("gamma2", 0.9), *_TAIL),
                 _centered_step)))
