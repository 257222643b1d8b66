"""Optimizers: the rules that turn a gradient into a weight update, and their saved state.

    opt = create("adam", learning_rate=1e-3, wd=1e-4)
    opt.step("fc.weight", weight, grad)     # keeps the state per key (MXNet's Updater)
    spec = opt.spec()                       # {"name": "adam", "params": {...}}: plain JSON
    numpy.savez(path, **opt.state_dict())   # flat {name: array}; loads with allow_pickle=False

A parameter-server KVStore ships the optimizer to its servers as a spec (never a pickle) and
runs it there, so ``spec()`` alone rebuilds an optimizer, and its state (moment arrays and
per-key update counts) saves as arrays plus JSON.

``update(key, weight, grad, state)`` changes ``weight`` and ``state`` in place with the
array module of ``weight`` (NumPy or CuPy), never ``grad``. Coefficients are Python floats,
which keep a float32 weight float32. Before a kind's rule runs, the gradient is multiplied by
``rescale_grad`` and clipped element-wise to ``[-clip_gradient, clip_gradient]`` (MXNet).
Keys are strings: an int key ``3`` and ``"3"`` name the same parameter, which keeps the spec
and the checkpoint JSON-able. Each key counts its updates; ``num_update`` is the largest
count (MXNet), the learning-rate schedule is evaluated at it and each key's bias corrections
use its own count. The rules match torch.optim where PyTorch has the optimizer, including how
weight decay enters (L2 on the gradient, or decoupled): see each class. The base class is in
``runtime/training/optimizer_base.py``; every kind is a file of ``runtime/training/
optimizers/`` (PyTorch's rules in its ``torch_*`` modules; the kinds that run MXNet's own
update operators, ``mxnet_sgd``, ``mxnet_adam``, ..., made from its definitions). This module
builds them by name and clips gradients by their joint norm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from mixrt.base.errors import DeviceMismatchError, OptimizerError
from mixrt.ops.device import array_module
from mixrt.runtime.training.lr_scheduler import real_param
from mixrt.runtime.training.optimizer_base import Optimizer, read_meta
from mixrt.runtime.training.optimizers import engine_kinds


# -- building optimizers --------------------------------------------------------------------

# every kind by its spec name: those of runtime/training/optimizers/, one file each
OPTIMIZERS = engine_kinds()
SGD, Adam, AdamW, RMSProp, AdaGrad, LAMB = (OPTIMIZERS[name] for name in (
    "sgd", "adam", "adamw", "rmsprop", "adagrad", "lamb"))


def create(name: str, **params) -> Optimizer:
    """An optimizer by its spec name: ``create("sgd", learning_rate=0.1, momentum=0.9)``."""
    if name not in OPTIMIZERS:
        raise OptimizerError(f"unknown optimizer {name!r}; valid names: {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name](**params)


def from_spec(spec: Mapping) -> Optimizer:
    """Rebuild an optimizer from ``optimizer.spec()`` (or that spec after a JSON trip)."""
    if not isinstance(spec, Mapping) or set(spec) != {"name", "params"} \
            or not isinstance(spec["name"], str) or not isinstance(spec["params"], Mapping):
        raise OptimizerError(f"an optimizer spec is {{'name': str, 'params': dict}}, "
                             f"got {spec!r}")
    return create(spec["name"], **spec["params"])


def from_state_dict(arrays: Mapping) -> Optimizer:
    """The optimizer a checkpoint was saved from, with its state loaded."""
    optimizer = from_spec(read_meta(arrays)["optimizer"])
    optimizer.load_state_dict(arrays)
    return optimizer


# -- gradient clipping ----------------------------------------------------------------------

def clip_global_norm(grads, max_norm: float, norm_type: float = 2.0):
    """Scale ``grads`` in place by ``min(1, max_norm / (norm + 1e-6))``, where ``norm`` is
    their joint norm, and return that norm, as torch.nn.utils.clip_grad_norm_. The norm is a
    0-d array of the grads' module and the scale is applied even when it is 1 (as PyTorch
    does), so nothing waits for a GPU."""
    grads = list(grads)
    max_norm = real_param("clip_global_norm", "max_norm", max_norm, low=0.0, low_open=True)
    if norm_type not in (2, 2.0, math.inf):
        raise OptimizerError(f"clip_global_norm: norm_type={norm_type!r} is not one of "
                             f"[2.0, inf]")
    if not grads:
        return 0.0
    xp = array_module(grads[0])
    if any(array_module(g) is not xp for g in grads):
        raise DeviceMismatchError("clip_global_norm: the gradients are on different devices")
    if norm_type == math.inf:
        total = xp.max(xp.stack([xp.abs(g).max() for g in grads]))
    else:
        total = xp.linalg.norm(xp.stack([xp.linalg.norm(g) for g in grads]))
    scale = xp.minimum(max_norm / (total + 1e-6), 1.0)
    for g in grads:
        g *= scale.astype(g.dtype)
    return total


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSProp", "AdaGrad", "LAMB", "OPTIMIZERS",
           "create", "from_spec", "from_state_dict", "read_meta", "clip_global_norm"]
