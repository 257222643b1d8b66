"""MXNet's GroupAdaGrad (``mx.optimizer.contrib.GroupAdaGrad``, ``group_adagrad_update``):
AdaGrad with one accumulator per row, ``history`` of shape (rows, 1) gaining the row's mean
squared gradient; no weight decay. It has no engine kind."""

from __future__ import annotations

from mixrt.runtime.training.optimizers.definition import REQUIRED, Definition, Operator, clips
from mixrt.runtime.training.update_rules import as_mxnet_scalar as f32


def _step(xp, weight, reads, states, params, in_place):
    g = reads["grad"].astype(weight.dtype, copy=False) * f32(params["rescale_grad"])
    if clips(params):
        g = xp.clip(g, -f32(params["clip_gradient"]), f32(params["clip_gradient"]))
    history = states["history"]
    rows = g.reshape(g.shape[0], -1)
    history += (rows * rows).mean(axis=1).reshape(history.shape)
    scale = xp.sqrt(history.reshape(-1) + f32(params["epsilon"]))
    return weight - f32(params["lr"]) * g / scale.reshape((-1,) + (1,) * (weight.ndim - 1))


DEFINITION = Definition(
    name="groupadagrad",
    slots=lambda hyper: ("history",),
    operators=(Operator("group_adagrad_update", ("history",), (
        ("lr", REQUIRED), ("rescale_grad", 1.0), ("clip_gradient", -1.0), ("epsilon", 1e-5)),
        _step, state_shape="rows"),))
