"""MXNet's FTML (Zheng & Kwok, 2017; ``ftml_update``), state ``(d, v, z)``, at step ``t`` (1 on
the first update). MXNet's class runs in the worker's process only: it has no engine kind."""

from __future__ import annotations

from mixrt.runtime.training.optimizers.definition import (REQUIRED, Definition, Operator,
                                                          clips)
from mixrt.runtime.training.update_rules import as_mxnet_scalar as f32


def _with_decay(xp, weight, grad, params):
    """``rescale_grad * g + wd * w``, then clipped (FTML's order)."""
    g = grad.astype(weight.dtype, copy=False) * f32(params["rescale_grad"]) \
        + f32(params["wd"]) * weight
    if clips(params, "clip_grad"):
        g = xp.clip(g, -f32(params["clip_grad"]), f32(params["clip_grad"]))
    return g


def _step(xp, weight, reads, states, params, in_place):
    g = _with_decay(xp, weight, reads["grad"], params)
    beta1, beta2, lr, t = f32(params["beta1"]), f32(params["beta2"]), f32(params["lr"]), \
        int(params["t"])
    d, v, z = states["d"], states["v"], states["z"]
    v[...] = beta2 * v + (1 - beta2) * (g * g)
    d_t = (1 - beta1 ** t) / lr * (xp.sqrt(v / (1 - beta2 ** t)) + float(params["epsilon"]))
    z[...] = beta1 * z + (1 - beta1) * g - (d_t - beta1 * d) * weight
    d[...] = d_t
    return -z / d_t


DEFINITION = Definition(
    name="ftml",
    slots=lambda hyper: ("d", "v", "z"),
    operators=(Operator("ftml_update", ("d", "v", "z"), (
        ("lr", REQUIRED), ("t", REQUIRED), ("beta1", 0.6), ("beta2", 0.999), ("epsilon", 1e-8),
        ("wd", 0.0), ("rescale_grad", 1.0), ("clip_grad", -1.0)), _step),))
