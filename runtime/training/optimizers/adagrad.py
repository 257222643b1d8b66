"""MXNet's AdaGrad on a dense gradient, which its Python writes as NDArray operations
(``history[:] += square(grad)``; ``div = grad / sqrt(history + eps)``; ``weight[:] += (div +
weight * wd) * -lr``): its scalars are doubles cast to the dtype, not C floats; the clip
bound is one (``clip``'s ``real_t``). MXNet has no operator for it; the optimizer class and
the engine's ``mxnet_adagrad`` run the rule below."""

from __future__ import annotations

import functools

from mixrt.runtime.training import update_rules as rules
from mixrt.runtime.training.optimizers.definition import Definition, Hyper


@functools.lru_cache(maxsize=None)
def adagrad(clipped: bool) -> rules.Rule:
    return rules.Rule("adagrad", ("weight", "history"), ("grad",),
                      rules.scalars(clipped, "lr", "wd", "epsilon"), (
                          *rules.rescaled_first(clipped),
                          "history = history + g * g",
                          "div = g / sqrt(history + epsilon)",
                          "weight = weight + (div + weight * wd) * -lr"))


def step(xp, weight, grad, history, *, lr, wd, epsilon, rescale_grad, clip_gradient):
    """The new weight (``history`` updated in place); ``clip_gradient`` None: no clipping
    (MXNet's Python clips on ``is not None``)."""
    return rules.mxnet_step(adagrad(clip_gradient is not None), xp, weight, grad,
                            {"history": history}, clip_gradient=clip_gradient,
                            exact={"lr": lr, "wd": wd, "epsilon": epsilon,
                                   "rescale_grad": rescale_grad})


def _engine_step(kind, xp, weight, grad, state, lr, wd, t):
    return step(xp, weight, grad, state["history"], lr=lr, wd=wd, epsilon=kind.epsilon,
                rescale_grad=kind.rescale_grad, clip_gradient=kind.clip_gradient)


DEFINITION = Definition(
    name="adagrad",
    hyper=(Hyper.real("epsilon", 1e-7, low=0.0),),
    slots=lambda hyper: ("history",),
    step=_engine_step)
