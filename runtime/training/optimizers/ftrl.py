"""MXNet's FTRL-Proximal (``ftrl_update``, FtrlUpdateKernel, McMahan et al. 2013): ``z`` and
``n`` accumulate and the weight is solved afresh from them each step, 0 where ``|z| <=
lamda1``. MXNet's operator is lazy on a row_sparse gradient whatever it is told."""

from __future__ import annotations

import functools

from mixrt.runtime.training import update_rules as rules
from mixrt.runtime.training.optimizers.definition import (GRADIENT, REQUIRED, Definition,
                                                          Hyper, Operator, clips, common)


@functools.lru_cache(maxsize=None)
def ftrl(clipped: bool) -> rules.Rule:
    return rules.Rule("ftrl", ("weight", "z", "n"), ("grad",),
                      rules.scalars(clipped, "lr", "wd", "lamda1", "beta"), (
                          *rules.rescaled_first(clipped),
                          "z = z + (g - (sqrt(n + g * g) - sqrt(n)) * weight / lr)",
                          "n = n + g * g",
                          "weight = (sign(z) * lamda1 - z) / ((beta + sqrt(n)) / lr + wd)"
                          " * greater(absolute(z), lamda1)"))


def _step(xp, weight, reads, states, params, in_place):
    return rules.mxnet_step(ftrl(clips(params)), xp, weight, reads["grad"], states, **params)


def _engine_step(kind, xp, weight, grad, state, lr, wd, t):
    params = dict(lr=lr, wd=wd, lamda1=kind.lamda1, beta=kind.beta, **common(kind))
    return _step(xp, weight, {"grad": grad}, state, params, True)


DEFINITION = Definition(
    name="ftrl",
    hyper=(Hyper.real("lamda1", 0.01, low=0.0), Hyper.real("beta", 1.0, low=0.0)),
    slots=lambda hyper: ("z", "n"),
    step=_engine_step,
    default_learning_rate=0.1,
    operators=(Operator("ftrl_update", ("z", "n"), (
        ("lr", REQUIRED), ("lamda1", 0.01), ("beta", 1.0), ("wd", 0.0), *GRADIENT), _step,
        lazy="always"),))
