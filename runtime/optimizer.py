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
weight decay enters (L2 on the gradient, or decoupled): see each class.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping

import numpy as np

from mixrt.base.errors import DeviceMismatchError, OptimizerError, ShapeError
from mixrt.runtime import lr_scheduler as schedulers
from mixrt.runtime import optimizer_kernels, update_rules
from mixrt.ops.device import array_module, to_host
from mixrt.runtime.lr_scheduler import LRScheduler, real_param, reject_unknown

STATE_FORMAT = 1  # bumped when the layout of state_dict() changes


class Optimizer:
    """Base class: hyper-parameters shared by every kind, counts, spec and checkpoints.

    A kind defines ``name``, ``hyper_params()`` (its own spec entries, set before calling
    ``Optimizer.__init__``), ``state_slots()`` and ``_apply(xp, weight, grad, state, lr, wd,
    t)``, which sees the rescaled and clipped gradient, this key's rate and decay and its
    update count ``t`` (1 on the first update).
    """

    name = ""
    default_learning_rate = 0.01
    default_wd = 0.0
    _COMMON = ("learning_rate", "wd", "rescale_grad", "clip_gradient", "lr_scheduler",
               "lr_mult", "wd_mult")

    def __init__(self, *, learning_rate=None, wd=None, rescale_grad=1.0, clip_gradient=None,
                 lr_scheduler=None, lr_mult=None, wd_mult=None, **unknown):
        reject_unknown(self._owner, unknown, self._COMMON + tuple(self.hyper_params()))
        self.lr_scheduler = _scheduler(self._owner, lr_scheduler)
        self._base_lr = self._pick_learning_rate(learning_rate)
        self.wd = real_param(self._owner, "wd", self.default_wd if wd is None else wd, low=0.0)
        self.rescale_grad = real_param(self._owner, "rescale_grad", rescale_grad)
        self.clip_gradient = None if clip_gradient is None else real_param(
            self._owner, "clip_gradient", clip_gradient, low=0.0, low_open=True)
        self.lr_mult = _multipliers(self._owner, "lr_mult", lr_mult)
        self.wd_mult = _multipliers(self._owner, "wd_mult", wd_mult)
        self.counts: dict[str, int] = {}
        self.num_update = 0
        self.states: dict[str, dict] = {}

    @property
    def _owner(self) -> str:
        return f"optimizer {self.name!r}"

    def _pick_learning_rate(self, learning_rate) -> float:
        """One source of truth: the scheduler's base_lr when there is a scheduler."""
        if self.lr_scheduler is None:
            chosen = self.default_learning_rate if learning_rate is None else learning_rate
            return real_param(self._owner, "learning_rate", chosen, low=0.0)
        base = self.lr_scheduler.base_lr
        if learning_rate is not None and \
                real_param(self._owner, "learning_rate", learning_rate, low=0.0) != base:
            raise OptimizerError(
                f"{self._owner}: learning_rate={learning_rate!r} disagrees with the "
                f"lr_scheduler's base_lr={base!r}; set the rate on the scheduler only")
        return base

    # -- what a kind defines ------------------------------------------------------------

    def hyper_params(self) -> dict:
        return {}

    def state_slots(self) -> tuple[str, ...]:
        return ()

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        raise NotImplementedError

    # -- learning rate ------------------------------------------------------------------

    @property
    def learning_rate(self) -> float:
        """The rate at the current ``num_update`` (before a key's ``lr_mult``)."""
        if self.lr_scheduler is None:
            return self._base_lr
        return self.lr_scheduler(self.num_update)

    def set_learning_rate(self, learning_rate: float) -> None:
        if self.lr_scheduler is not None:
            raise OptimizerError(f"{self._owner} follows its lr_scheduler; change the "
                                 f"scheduler instead of setting learning_rate")
        self._base_lr = real_param(self._owner, "learning_rate", learning_rate, low=0.0)

    # -- updates ------------------------------------------------------------------------

    def create_state(self, key, weight) -> dict:
        """This kind's state for one weight: ``{slot: array like weight}`` (maybe empty)."""
        return {slot: array_module(weight).zeros_like(weight) for slot in self.state_slots()}

    def update(self, key, weight, grad, state: dict) -> None:
        """One update of ``weight`` (and ``state``) in place from ``grad``."""
        key = _key(key)
        self._check(key, weight, grad, state)
        lr, wd, t = self._advance(key)
        self._apply(array_module(weight), weight, self._rescaled_clipped(grad), state, lr, wd,
                    t)

    def _advance(self, key: str) -> tuple:
        """Count an update of ``key``: (its lr and wd, after lr_mult and wd_mult; its
        update count)."""
        t = self.counts[key] = self.counts.get(key, 0) + 1
        self.num_update = max(self.num_update, t)
        return (self.learning_rate * self.lr_mult.get(key, 1.0),
                self.wd * self.wd_mult.get(key, 1.0), t)

    def step(self, key, weight, grad) -> None:
        """``update`` with the state this optimizer keeps for ``key`` (made on first use;
        after ``load_state_dict`` moved to the weight's device on first use)."""
        key = _key(key)
        self.update(key, weight, grad, self._kept_state(key, weight))

    def _kept_state(self, key: str, weight) -> dict:
        state = self.states.get(key)
        state = self.create_state(key, weight) if state is None else \
            _state_like(key, state, weight)
        self.states[key] = state
        return state

    def step_many(self, items) -> None:
        """``step`` for each ``(key, weight, grad)``, in order. On a GPU, sgd, adam and adamw
        update every weight of one device and float dtype in one launch
        (``runtime/optimizer_kernels.py``), each with the lr, wd and update count ``step``
        would give it; the other kinds, and arrays those kernels do not take, step one by
        one."""
        items = list(items)
        entries = self._many_entries(items) if len(items) > 1 else None
        if entries is None or not self._apply_many(*entries):
            for key, weight, grad in items:
                self.step(key, weight, grad)

    def _apply_many(self, xp, weights, grads, states, lrs, wds, counts) -> bool:
        """The multi-tensor update of :meth:`step_many` (the kinds that have one)."""
        return False

    def _many_entries(self, items):
        """(xp, weights, grads, states, lrs, wds, update counts) of ``items`` with their
        counts advanced as ``update`` advances them, or None, nothing changed, where the
        multi-tensor kernels cannot take them (not one GPU, not one float dtype)."""
        weights, grads = [w for _, w, _ in items], [g for _, _, g in items]
        xp = array_module(weights[0])
        if type(self)._apply_many is Optimizer._apply_many \
                or not optimizer_kernels.many_on_gpu(xp, weights[0].dtype, weights + grads):
            return None  # the cheap refusals first: a CPU step comes here every time
        devices = {getattr(getattr(w, "device", None), "id", None) for w in weights + grads}
        if len(devices) != 1 or any(array_module(a) is not xp for a in weights + grads):
            return None
        keys = [_key(key) for key, _, _ in items]
        states = [self._kept_state(key, weight) for key, weight in zip(keys, weights)]
        for key, weight, grad, state in zip(keys, weights, grads, states):
            self._check(key, weight, grad, state)
        if not optimizer_kernels.many_on_gpu(xp, weights[0].dtype,
                                             [a for s in states for a in s.values()]):
            return None
        lrs, wds, counts = zip(*(self._advance(key) for key in keys))
        return xp, weights, grads, states, list(lrs), list(wds), list(counts)

    def _rescaled_clipped(self, grad):
        if self.rescale_grad != 1.0:
            grad = grad * self.rescale_grad
        if self.clip_gradient is not None:
            grad = array_module(grad).clip(grad, -self.clip_gradient, self.clip_gradient)
        return grad

    def _check(self, key, weight, grad, state) -> None:
        if array_module(weight) is not array_module(grad):
            raise DeviceMismatchError(f"key {key!r}: the weight and its gradient are on "
                                      f"different devices")
        if grad.shape != weight.shape:
            raise ShapeError(f"key {key!r}: gradient shape {grad.shape} does not match the "
                             f"weight's {weight.shape}")
        if weight.dtype.kind != "f" or grad.dtype != weight.dtype:
            raise OptimizerError(f"key {key!r}: weight and gradient must share one floating "
                                 f"dtype, got {weight.dtype} and {grad.dtype}")
        if set(state) != set(self.state_slots()):
            raise OptimizerError(f"key {key!r}: {self._owner} needs a state with slots "
                                 f"{list(self.state_slots())}, got {sorted(state)}")

    # -- spec ---------------------------------------------------------------------------

    def spec(self) -> dict:
        """``{"name", "params"}`` of plain JSON values; ``from_spec`` rebuilds this optimizer
        (hyper-parameters only: counts and states travel in ``state_dict``)."""
        params = {
            "learning_rate": self._base_lr, "wd": self.wd, "rescale_grad": self.rescale_grad,
            "clip_gradient": self.clip_gradient,
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.spec(),
            "lr_mult": dict(self.lr_mult), "wd_mult": dict(self.wd_mult),
        }
        params.update(self.hyper_params())
        return {"name": self.name, "params": params}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({json.dumps(self.spec()['params'])})"

    # -- checkpoints --------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """The kept states and counts as host arrays: ``"state{i}.{slot}"`` for the i-th
        key, plus ``"meta"``, a 0-d unicode array holding JSON (the spec, the keys, the
        counts), so ``numpy.savez(path, **state_dict)`` writes a checkpoint that loads
        with ``allow_pickle=False``."""
        keys = sorted(self.states)
        meta = {"format": STATE_FORMAT, "optimizer": self.spec(), "keys": keys,
                "counts": dict(self.counts)}
        arrays = {"meta": np.array(json.dumps(meta))}
        for index, key in enumerate(keys):
            for slot, value in self.states[key].items():
                arrays[f"state{index}.{slot}"] = np.array(to_host(value))  # a copy
        return arrays

    def load_state_dict(self, arrays: Mapping) -> None:
        """Restore what ``state_dict`` saved (from a dict or ``numpy.load``'s NpzFile).
        Hyper-parameters may differ from the saved ones; the state slots may not."""
        meta = read_meta(arrays)
        if meta["optimizer"]["name"] != self.name:
            raise OptimizerError(f"the checkpoint holds {meta['optimizer']['name']!r} state, "
                                 f"which {self._owner} cannot continue from")
        keys = meta["keys"]
        if len(set(keys)) != len(keys):  # two entries for one key: one would be dropped
            raise OptimizerError(f"the checkpoint lists a key twice: {keys}")
        expected = {f"state{i}.{slot}" for i in range(len(keys)) for slot in self.state_slots()}
        found = set(arrays) - {"meta"}
        if found != expected:
            raise OptimizerError(
                f"the checkpoint's arrays do not fit {self._owner} with slots "
                f"{list(self.state_slots())}: missing {sorted(expected - found)}, "
                f"unexpected {sorted(found - expected)}")
        if any(np.asarray(arrays[name]).dtype.kind != "f" for name in expected):
            raise OptimizerError("the checkpoint holds a state array that is not floating")
        self.states = {key: {slot: np.array(arrays[f"state{i}.{slot}"])
                             for slot in self.state_slots()} for i, key in enumerate(keys)}
        self.counts = dict(meta["counts"])
        self.num_update = max(self.counts.values(), default=0)


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
        GPU (``runtime/optimizer_kernels.py``); False, nothing done, elsewhere."""
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


class _MXNetRule(Optimizer):
    """A kind that runs one of MXNet's update operators (``runtime/update_rules.py``), so a
    parameter server takes the very steps ``mixrt.optimizer``'s optimizer of that name takes
    in the worker's process: the gradient's rescale and clip happen inside the rule, in
    MXNet's order, and every hyper-parameter is rounded to a C float as MXNet's operators
    take it (a float64 weight computes in double with those values)."""

    def update(self, key, weight, grad, state: dict) -> None:
        key = _key(key)
        self._check(key, weight, grad, state)
        lr, wd, t = self._advance(key)
        weight[...] = self._mxnet_step(array_module(weight), weight, grad, state, lr, wd, t)

    def _hyper(self, lr, wd) -> dict:
        return {"lr": lr, "wd": wd, "rescale_grad": self.rescale_grad,
                "clip_gradient": self.clip_gradient}

    @property
    def _clipped(self) -> bool:
        return self.clip_gradient is not None


class MXNetSGD(_MXNetRule):
    """MXNet's SGD (``mixrt.optimizer``'s ``sgd``, or its ``nag`` with ``nesterov``): ``-lr``
    lives in the momentum buffer (``mom = momentum * mom - lr * wd * w - lr * g``,
    ``w += mom``), which follows a changing rate differently from ``sgd``'s buffer.
    Without momentum, MXNet's SGD steps as its multi-tensor operator does and its NAG as
    ``sgd_update`` does, which round differently."""

    name = "mxnet_sgd"

    def __init__(self, *, momentum=0.0, nesterov=False, **common):
        self.momentum = real_param(self._owner, "momentum", momentum, low=0.0)
        self.nesterov = _flag(self._owner, "nesterov", nesterov)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"momentum": self.momentum, "nesterov": self.nesterov}

    def state_slots(self) -> tuple[str, ...]:
        return ("mom",) if self.momentum else ()

    def _mxnet_step(self, xp, weight, grad, state, lr, wd, t):
        hyper = self._hyper(lr, wd)
        if not self.momentum:  # MXNet's SGD: its multi-tensor operator; NAG: sgd_update
            rule = update_rules.sgd(self._clipped) if self.nesterov else \
                update_rules.multi_sgd(self._clipped)
            return update_rules.mxnet_step(rule, xp, weight, grad, {}, **hyper)
        rule = update_rules.nag_mom(self._clipped, True) if self.nesterov else \
            update_rules.sgd_mom(self._clipped)
        return update_rules.mxnet_step(rule, xp, weight, grad, state,
                                       momentum=self.momentum, **hyper)

    def _apply_many(self, xp, weights, grads, states, lrs, wds, counts) -> bool:
        if self.nesterov:
            return False  # MXNet's NAG has no multi-tensor form
        optimizer_kernels.mxnet_sgd_many(
            xp, weights, grads, [s["mom"] for s in states] if self.momentum else None, lrs,
            wds, momentum=self.momentum, rescale=self.rescale_grad, clip=self.clip_gradient)
        return True


class MXNetAdam(_MXNetRule):
    """MXNet's Adam (``mixrt.optimizer``'s ``adam``): the bias corrections folded into the
    rate in Python floats, weight decay added to the gradient before clipping, epsilon
    after the square root of the uncorrected second moment."""

    name = "mxnet_adam"
    default_learning_rate = 0.001

    def __init__(self, *, beta1=0.9, beta2=0.999, epsilon=1e-8, **common):
        self.beta1 = real_param(self._owner, "beta1", beta1, low=0.0, high=1.0, high_open=True)
        self.beta2 = real_param(self._owner, "beta2", beta2, low=0.0, high=1.0, high_open=True)
        self.epsilon = real_param(self._owner, "epsilon", epsilon, low=0.0)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}

    def state_slots(self) -> tuple[str, ...]:
        return ("mean", "var")

    def _mxnet_step(self, xp, weight, grad, state, lr, wd, t):
        rate = update_rules.mxnet_adam_rate(lr, self.beta1, self.beta2, t)
        return update_rules.mxnet_step(
            update_rules.adam(self._clipped), xp, weight, grad, state,
            beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon, **self._hyper(rate, wd))


class MXNetRMSProp(_MXNetRule):
    """MXNet's RMSProp (``mixrt.optimizer``'s ``rmsprop``, not centered): weight decay and
    clipping on the gradient, epsilon inside the square root, ``clip_weights`` on the new
    weight."""

    name = "mxnet_rmsprop"
    default_learning_rate = 0.001

    def __init__(self, *, gamma1=0.9, epsilon=1e-8, clip_weights=None, **common):
        self.gamma1 = real_param(self._owner, "gamma1", gamma1, low=0.0, high=1.0)
        self.epsilon = real_param(self._owner, "epsilon", epsilon, low=0.0)
        self.clip_weights = None if clip_weights is None else real_param(
            self._owner, "clip_weights", clip_weights, low=0.0, low_open=True)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"gamma1": self.gamma1, "epsilon": self.epsilon,
                "clip_weights": self.clip_weights}

    def state_slots(self) -> tuple[str, ...]:
        return ("n",)

    def _mxnet_step(self, xp, weight, grad, state, lr, wd, t):
        rule = update_rules.rmsprop(self._clipped, self.clip_weights is not None)
        return update_rules.mxnet_step(
            rule, xp, weight, grad, state, gamma1=self.gamma1, epsilon=self.epsilon,
            clip_weights=self.clip_weights, **self._hyper(lr, wd))


# -- building optimizers --------------------------------------------------------------------

OPTIMIZERS = {cls.name: cls for cls in (SGD, Adam, AdamW, RMSProp, AdaGrad, LAMB, MXNetSGD,
                                         MXNetAdam, MXNetRMSProp)}


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


def read_meta(arrays: Mapping) -> dict:
    """The JSON metadata of a ``state_dict`` (spec, keys, counts), checked."""
    if "meta" not in arrays:
        raise OptimizerError("not an optimizer checkpoint: it has no 'meta' entry")
    try:
        meta = json.loads(np.asarray(arrays["meta"]).item())
    except (ValueError, TypeError, RecursionError) as exc:  # deep nesting: RecursionError
        raise OptimizerError(f"the checkpoint's 'meta' entry is not JSON: "
                             f"{type(exc).__name__}: {exc}") from None
    found = meta.get("format") if isinstance(meta, dict) else None
    if found != STATE_FORMAT:
        raise OptimizerError(f"the checkpoint's format is {found!r}; this mixrt reads "
                             f"format {STATE_FORMAT}")
    spec, keys, counts = meta.get("optimizer"), meta.get("keys"), meta.get("counts")
    if not (isinstance(spec, dict) and isinstance(spec.get("name"), str)
            and isinstance(keys, list) and all(isinstance(k, str) for k in keys)
            and isinstance(counts, dict) and all(
                type(c) is int and c >= 0 for c in counts.values())):
        raise OptimizerError("the checkpoint's 'meta' entry lacks a well-formed optimizer "
                             "spec, key list or update counts")
    return meta


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


def _key(key) -> str:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise OptimizerError(f"an optimizer key is a str or an int, got {key!r}")
    return str(key)


def _flag(owner: str, name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise OptimizerError(f"{owner}: {name} must be True or False, got {value!r}")
    return bool(value)


def _optional_bound(owner: str, name: str, value):
    return None if value is None else real_param(owner, name, value, low=0.0)


def _multipliers(owner: str, name: str, value) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise OptimizerError(f"{owner}: {name} maps keys to multipliers, got {value!r}")
    return {_key(k): real_param(owner, f"{name}[{k!r}]", v, low=0.0) for k, v in value.items()}


def _scheduler(owner: str, value):
    """A scheduler object, or one rebuilt from its spec (what a JSON spec carries)."""
    if value is None or isinstance(value, LRScheduler):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("name"), str):  # a list: TypeError
        return schedulers.from_spec(dict(value))
    raise OptimizerError(f"{owner}: lr_scheduler must be an LRScheduler or its spec, got "
                         f"{value!r}")


def _state_like(key: str, state: dict, weight) -> dict:
    """``state`` on the weight's device and in its dtype (a loaded checkpoint is on the host
    and may come from a float64 run); the same arrays when they already are."""
    for slot, value in state.items():
        if value.shape != weight.shape:
            raise ShapeError(f"key {key!r}: the kept {slot!r} state has shape {value.shape}, "
                             f"the weight {weight.shape}")
    xp = array_module(weight)
    if all(array_module(v) is xp and v.dtype == weight.dtype for v in state.values()):
        return state
    with weight.device if xp is not np else contextlib.nullcontext():  # CuPy: its GPU
        return {slot: xp.asarray(to_host(v) if xp is np else v, dtype=weight.dtype)
                for slot, v in state.items()}


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSProp", "AdaGrad", "LAMB", "MXNetSGD",
           "MXNetAdam", "MXNetRMSProp", "OPTIMIZERS",
           "create", "from_spec", "from_state_dict", "read_meta", "clip_global_norm"]
