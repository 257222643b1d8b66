"""MXNet's Signum and signSGD (``signum_update``, SignumKernel; ``signsgd_update``,
SignSGDKernel; Bernstein et al., 2018): a step by the sign of a momentum or, with
``momentum`` 0, of the gradient (no state; rescaling and clipping keep the sign)."""

from __future__ import annotations

import functools

from mixrt.runtime.training import update_rules as rules
from mixrt.runtime.training.optimizers.definition import (GRADIENT, REQUIRED, Definition,
                                                          Hyper, Operator, clips, common)


@functools.lru_cache(maxsize=None)
def signsgd() -> rules.Rule:
    return rules.Rule("signsgd", ("weight",), ("grad",), ("lr", "wd"), (
        "weight = (1 - lr * wd) * weight - lr * sign(grad)",))


@functools.lru_cache(maxsize=None)
def signum(clipped: bool) -> rules.Rule:
    """The momentum of ``-(wd * w + g)`` scaled by ``1 - momentum``, term by term; ``wd_lh``
    decays the weight apart."""
    g = "clip(rescale_grad * grad, clip_gradient)" if clipped else "rescale_grad * grad"
    return rules.Rule("signum", ("weight", "mom"), ("grad",),
                      rules.scalars(clipped, "lr", "wd", "momentum", "wd_lh"), (
                          f"mom = momentum * mom - (1 - momentum) * wd * weight"
                          f" - (1 - momentum) * {g}",
                          "weight = (1 - lr * wd_lh) * weight + lr * sign(mom)"))


def _signsgd_step(xp, weight, reads, states, params, in_place):
    return rules.mxnet_step(signsgd(), xp, weight, reads["grad"], {}, lr=params["lr"],
                            wd=params["wd"])


def _signum_step(xp, weight, reads, states, params, in_place):
    return rules.mxnet_step(signum(clips(params)), xp, weight, reads["grad"], states,
                            **params)


def _engine_step(kind, xp, weight, grad, state, lr, wd, t):
    params = dict(lr=lr, wd=wd, **common(kind))
    if not kind.momentum:
        return _signsgd_step(xp, weight, {"grad": grad}, {}, params, True)
    return _signum_step(xp, weight, {"grad": grad}, state,
                        dict(params, momentum=kind.momentum, wd_lh=kind.wd_lh), True)


DEFINITION = Definition(
    name="signum",
    hyper=(Hyper.real("momentum", 0.9, low=0.0), Hyper.real("wd_lh", 0.0, low=0.0)),
    slots=lambda hyper: ("mom",) if hyper["momentum"] else (),
    step=_engine_step,
    operators=(
        Operator("signsgd_update", (), (("lr", REQUIRED), ("wd", 0.0), *GRADIENT),
                 _signsgd_step),
        Operator("signum_update", ("mom",), (("lr", REQUIRED), ("momentum", 0.0),
                                             ("wd", 0.0), *GRADIENT, ("wd_lh", 0.0)),
                 _signum_step)))
