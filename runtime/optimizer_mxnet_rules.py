"""The engine's kinds that run MXNet's own update operators (``runtime/update_rules.py``):
``mxnet_sgd``, ``mxnet_adam`` and ``mxnet_rmsprop``, which ``mixrt.optimizer``'s sgd, nag,
adam and rmsprop name in their ``spec()``, so that a parameter server steps as the worker's
process does. They are built by name as the other kinds are (``runtime/optimizer.py``).
"""

from __future__ import annotations

from mixrt.runtime import optimizer_kernels, update_rules
from mixrt.ops.device import array_module
from mixrt.runtime.lr_scheduler import real_param
from mixrt.runtime.optimizer_base import Optimizer, _flag, _key


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


__all__ = ["MXNetSGD", "MXNetAdam", "MXNetRMSProp"]
