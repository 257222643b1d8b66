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
``runtime/training/optimizer_base.py``; the kinds that run MXNet's own update operators
(``mxnet_sgd``, ``mxnet_adam``, ...) are made from ``runtime/training/optimizers/``, one
file per optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from mixrt.base.errors import DeviceMismatchError, OptimizerError
from mixrt.runtime.training import optimizer_kernels
from mixrt.ops.device import array_module
from mixrt.runtime.training.lr_scheduler import real_param
from mixrt.runtime.training.optimizer_base import Optimizer, _flag, read_meta
from mixrt.runtime.training.optimizers import engine_kinds


# -- the kinds ------------------------------------------------------------------------------

class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum, as torch.optim.SGD
    with dampening 0. Weight decay is L2, added to the gradient::

        g = grad + wd * w
        buf = momentum * buf + g                   (buf starts at 0: the first buf is g)
        w -= lr * (g + momentum * buf  if nesterov else  buf)

    MXNet keeps ``-lr`` inside its momentum buffer instead; the two agree while the rate is
    constant, and this one is PyTorch's when a schedule changes it.
    """

    name = "sgd"

    def __init__(self, *, momentum=0.0, nesterov=False, **common):
        self.momentum = real_param(self._owner, "momentum", momentum, low=0.0)
        self.nesterov = _flag(self._owner, "nesterov", nesterov)
        if self.nesterov and self.momentum == 0:
            raise OptimizerError(f"{self._owner}: nesterov=True needs a momentum > 0")
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"momentum": self.momentum, "nesterov": self.nesterov}

    def state_slots(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def _apply_many(self, xp, weights, grads, states, lrs, wds, counts) -> bool:
        buffers = [state["momentum"] for state in states] if self.momentum else None
        optimizer_kernels.sgd_many(xp, weights, grads, buffers, lrs, wds,
                                   momentum=self.momentum, nesterov=self.nesterov,
                                   rescale=self.rescale_grad, clip=self.clip_gradient)
        return True

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        if optimizer_kernels.sgd(xp, weight, grad, state.get("momentum"), lr, wd,
                                 self.momentum, self.nesterov):
            return  # on a GPU: one launch
        g = _with_l2(grad, weight, wd)
        if not self.momentum:
            weight -= lr * g
            return
        buf = state["momentum"]
        buf *= self.momentum
        buf += g
        weight -= lr * (g + self.momentum * buf if self.nesterov else buf)


class _AdamMoments(Optimizer):
    """beta1, beta2, epsilon and the two moment slots shared by Adam, AdamW and LAMB."""

    default_learning_rate = 0.001
    default_epsilon = 1e-8

    def __init__(self, *, beta1=0.9, beta2=0.999, epsilon=None, **rest):
        self.beta1 = real_param(self._owner, "beta1", beta1, low=0.0, high=1.0, high_open=True)
        self.beta2 = real_param(self._owner, "beta2", beta2, low=0.0, high=1.0, high_open=True)
        self.epsilon = real_param(self._owner, "epsilon",
                                  self.default_epsilon if epsilon is None else epsilon, low=0.0)
        super().__init__(**rest)

    def hyper_params(self) -> dict:
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}

    def state_slots(self) -> tuple[str, ...]:
        return ("mean", "var")

    def _update_moments(self, state, g) -> tuple:
        mean, var = state["mean"], state["var"]
        mean *= self.beta1
        mean += (1 - self.beta1) * g
        var *= self.beta2
        var += (1 - self.beta2) * (g * g)
        return mean, var

    def _adam_step(self, xp, weight, g, state, lr, t) -> None:
        """torch.optim.Adam's step: bias corrections folded into the step size and the
        denominator, epsilon added after the square root."""
        mean, var = self._update_moments(state, g)
        step_size, correction = self._bias_corrections(lr, t)
        denom = xp.sqrt(var) / correction + self.epsilon
        weight -= step_size * (mean / denom)

    def _bias_corrections(self, lr, t) -> tuple[float, float]:
        """(the step size lr / (1 - beta1^t), the denominator's sqrt(1 - beta2^t))."""
        return lr / (1 - self.beta1 ** t), (1 - self.beta2 ** t) ** 0.5

    def _adam_many(self, xp, weights, grads, states, lrs, wds, counts, *,
                   decoupled: bool) -> bool:
        """Adam's (``wds`` its L2 terms) or AdamW's (``wds`` their decays) multi-tensor
        update, with each weight's bias corrections."""
        corrections = [self._bias_corrections(lr, t) for lr, t in zip(lrs, counts)]
        optimizer_kernels.adam_many(
            xp, weights, grads, [s["mean"] for s in states], [s["var"] for s in states],
            [c[0] for c in corrections], [c[1] for c in corrections], wds,
            decoupled=decoupled, beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
            rescale=self.rescale_grad, clip=self.clip_gradient)
        return True

    def _fused_adam_step(self, xp, weight, grad, state, lr, t, *, wd=0.0,
                         decay=None) -> bool:
        """:meth:`_adam_step` (after Adam's L2 term or AdamW's shrink) as one launch on a
        GPU (``runtime/training/optimizer_kernels.py``); False, nothing done, elsewhere."""
        step_size, correction = self._bias_corrections(lr, t)
        return optimizer_kernels.adam(
            xp, weight, grad, state["mean"], state["var"], step_size=step_size,
            correction=correction, beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
            wd=wd, decay=decay)


class Adam(_AdamMoments):
    """Adam (Kingma & Ba, 2015), as torch.optim.Adam (no amsgrad). Weight decay is L2,
    added to the gradient before the moments: ``g = grad + wd * w``. For decoupled weight
    decay use ``adamw``."""

    name = "adam"

    def _apply_many(self, xp, weights, grads, states, lrs, wds, counts) -> bool:
        return self._adam_many(xp, weights, grads, states, lrs, wds, counts, decoupled=False)

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        if not self._fused_adam_step(xp, weight, grad, state, lr, t, wd=wd):
            self._adam_step(xp, weight, _with_l2(grad, weight, wd), state, lr, t)


class AdamW(_AdamMoments):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW: the
    weight first shrinks by ``lr * wd`` (the decay follows the schedule), then takes Adam's
    step on the undecayed gradient. Default ``wd`` 0.01, as in PyTorch."""

    name = "adamw"
    default_wd = 0.01

    def _apply_many(self, xp, weights, grads, states, lrs, wds, counts) -> bool:
        decays = [1 - lr * wd if wd else 0.0 for lr, wd in zip(lrs, wds)]
        return self._adam_many(xp, weights, grads, states, lrs, decays, counts,
                               decoupled=True)

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        if self._fused_adam_step(xp, weight, grad, state, lr, t,
                                 decay=1 - lr * wd if wd else None):
            return
        if wd:
            weight *= 1 - lr * wd
        self._adam_step(xp, weight, grad, state, lr, t)


class RMSProp(Optimizer):
    """RMSProp as torch.optim.RMSprop (``rho`` is PyTorch's ``alpha``). Weight decay is L2,
    added to the gradient::

        g = grad + wd * w
        sq = rho * sq + (1 - rho) * g^2
        avg = sqrt(sq - ga^2) + eps, ga = rho * ga + (1 - rho) * g   (centered)
              sqrt(sq) + eps                                          (otherwise)
        buf = momentum * buf + g / avg; w -= lr * buf   (momentum > 0; else w -= lr g / avg)

    MXNet's RMSProp puts epsilon inside the square root and its centered form differs; this
    is PyTorch's.
    """

    name = "rmsprop"

    def __init__(self, *, rho=0.99, momentum=0.0, epsilon=1e-8, centered=False, **common):
        self.rho = real_param(self._owner, "rho", rho, low=0.0, high=1.0)
        self.momentum = real_param(self._owner, "momentum", momentum, low=0.0)
        self.epsilon = real_param(self._owner, "epsilon", epsilon, low=0.0)
        self.centered = _flag(self._owner, "centered", centered)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon,
                "centered": self.centered}

    def state_slots(self) -> tuple[str, ...]:
        return (("square_avg",) + (("grad_avg",) if self.centered else ())
                + (("momentum",) if self.momentum else ()))

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        g = _with_l2(grad, weight, wd)
        square_avg = state["square_avg"]
        square_avg *= self.rho
        square_avg += (1 - self.rho) * (g * g)
        if self.centered:
            grad_avg = state["grad_avg"]
            grad_avg *= self.rho
            grad_avg += (1 - self.rho) * g
            avg = xp.sqrt(square_avg - grad_avg * grad_avg) + self.epsilon
        else:
            avg = xp.sqrt(square_avg) + self.epsilon
        if not self.momentum:
            weight -= lr * (g / avg)
            return
        buf = state["momentum"]
        buf *= self.momentum
        buf += g / avg
        weight -= lr * buf


class AdaGrad(Optimizer):
    """AdaGrad (Duchi et al.) as torch.optim.Adagrad. Weight decay is L2, added to the
    gradient before it is accumulated (MXNet adds it after; this is PyTorch's)::

        g = grad + wd * w
        sum += g^2                        (sum starts at initial_accumulator_value)
        w -= lr / (1 + (t - 1) * lr_decay) * g / (sqrt(sum) + eps)
    """

    name = "adagrad"

    def __init__(self, *, epsilon=1e-10, lr_decay=0.0, initial_accumulator_value=0.0,
                 **common):
        self.epsilon = real_param(self._owner, "epsilon", epsilon, low=0.0)
        self.lr_decay = real_param(self._owner, "lr_decay", lr_decay, low=0.0)
        self.initial_accumulator_value = real_param(
            self._owner, "initial_accumulator_value", initial_accumulator_value, low=0.0)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"epsilon": self.epsilon, "lr_decay": self.lr_decay,
                "initial_accumulator_value": self.initial_accumulator_value}

    def state_slots(self) -> tuple[str, ...]:
        return ("sum",)

    def create_state(self, key, weight) -> dict:
        return {"sum": array_module(weight).full_like(weight, self.initial_accumulator_value)}

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        g = _with_l2(grad, weight, wd)
        accumulated = state["sum"]
        accumulated += g * g
        decayed_lr = lr / (1 + (t - 1) * self.lr_decay)
        weight -= decayed_lr * (g / (xp.sqrt(accumulated) + self.epsilon))


class LAMB(_AdamMoments):
    """LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning", Algorithm 2),
    one trust ratio per key (a key is one layer's tensor). Weight decay is decoupled: it
    joins Adam's direction, not the moments::

        m, v as Adam's; m^ = m / (1 - beta1^t), v^ = v / (1 - beta2^t)  (bias_correction)
        r = m^ / (sqrt(v^) + eps) + wd * w
        w -= lr * phi(||w||) / ||r|| * r,   phi clamps to [lower_bound, upper_bound]

    The ratio is 1 when either norm is 0 (MXNet). PyTorch has no LAMB; defaults are
    MXNet's (epsilon 1e-6).
    """

    name = "lamb"
    default_epsilon = 1e-6

    def __init__(self, *, bias_correction=True, lower_bound=None, upper_bound=None, **rest):
        self.bias_correction = _flag(self._owner, "bias_correction", bias_correction)
        self.lower_bound = _optional_bound(self._owner, "lower_bound", lower_bound)
        self.upper_bound = _optional_bound(self._owner, "upper_bound", upper_bound)
        if None not in (lower_bound, upper_bound) and self.lower_bound > self.upper_bound:
            raise OptimizerError(f"{self._owner}: lower_bound={lower_bound!r} is above "
                                 f"upper_bound={upper_bound!r}")
        super().__init__(**rest)

    def hyper_params(self) -> dict:
        return {**super().hyper_params(), "bias_correction": self.bias_correction,
                "lower_bound": self.lower_bound, "upper_bound": self.upper_bound}

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        mean, var = self._update_moments(state, grad)
        if self.bias_correction:
            mean = mean / (1 - self.beta1 ** t)
            var = var / (1 - self.beta2 ** t)
        direction = mean / (xp.sqrt(var) + self.epsilon)  # a new array: safe to add into
        if wd:
            direction += wd * weight
        weight -= (lr * self._trust_ratio(xp, weight, direction)) * direction

    def _trust_ratio(self, xp, weight, direction):
        """||w|| / ||r|| as a 0-d array of the weight's dtype (no host round trip)."""
        weight_norm = xp.linalg.norm(weight)
        if self.lower_bound is not None:
            weight_norm = xp.maximum(weight_norm, self.lower_bound)
        if self.upper_bound is not None:
            weight_norm = xp.minimum(weight_norm, self.upper_bound)
        direction_norm = xp.linalg.norm(direction)
        one = weight.dtype.type(1)
        usable = (weight_norm > 0) & (direction_norm > 0)
        return xp.where(usable, weight_norm / xp.where(usable, direction_norm, one), one)


# -- building optimizers --------------------------------------------------------------------

# the kinds written here, then MXNet's, one made from each of runtime/training/optimizers/
OPTIMIZERS = {cls.name: cls for cls in (SGD, Adam, AdamW, RMSProp, AdaGrad, LAMB)}
OPTIMIZERS.update(engine_kinds())


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


# -- helpers --------------------------------------------------------------------------------

def _with_l2(grad, weight, wd):
    """The gradient with L2 weight decay added (a new array: ``grad`` is never changed)."""
    return grad + wd * weight if wd else grad


def _optional_bound(owner: str, name: str, value):
    return None if value is None else real_param(owner, name, value, low=0.0)


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSProp", "AdaGrad", "LAMB", "OPTIMIZERS",
           "create", "from_spec", "from_state_dict", "read_meta", "clip_global_norm"]
