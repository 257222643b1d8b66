"""The engine's kinds that run MXNet's own update rules (``runtime/training/update_rules.py``):
``mxnet_sgd``, ``mxnet_adam``, ``mxnet_rmsprop``, ``mxnet_adagrad``, ``mxnet_ftrl``,
``mxnet_signum`` and ``mxnet_lamb``, which ``mixrt.optimizer``'s sgd, nag, adam, rmsprop
(centered or not), adagrad, ftrl, signum and lamb name in their ``spec()``, so that a
parameter server steps as the worker's process does. They are built by name as the other
kinds are (``runtime/training/optimizer.py``).
"""

from __future__ import annotations

from mixrt.runtime.training import optimizer_kernels, update_rules
from mixrt.ops.device import array_module
from mixrt.runtime.training.lr_scheduler import real_param
from mixrt.runtime.training.optimizer_base import Optimizer, _flag, _key


class _MXNetRule(Optimizer):
    """A kind that runs one of MXNet's update operators (``runtime/training/update_rules.py``),
    so a parameter server takes the very steps ``mixrt.optimizer``'s optimizer of that name
    takes in the worker's process: the gradient's rescale and clip happen inside the rule, in
    MXNet's order, and every hyper-parameter is rounded to a C float as MXNet's operators take
    it (a float64 weight computes in double with those values)."""

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
    """MXNet's RMSProp (``mixrt.optimizer``'s ``rmsprop``): weight decay and clipping on
    the gradient, epsilon inside the square root, ``clip_weights`` on the new weight;
    with ``centered``, Graves' form (``rmspropalex_update``), whose step keeps a momentum
    ``gamma2``."""

    name = "mxnet_rmsprop"
    default_learning_rate = 0.001

    def __init__(self, *, gamma1=0.9, gamma2=0.9, epsilon=1e-8, centered=False,
                 clip_weights=None, **common):
        self.gamma1 = real_param(self._owner, "gamma1", gamma1, low=0.0, high=1.0)
        self.gamma2 = real_param(self._owner, "gamma2", gamma2, low=0.0, high=1.0)
        self.epsilon = real_param(self._owner, "epsilon", epsilon, low=0.0)
        self.centered = _flag(self._owner, "centered", centered)
        self.clip_weights = None if clip_weights is None else real_param(
            self._owner, "clip_weights", clip_weights, low=0.0, low_open=True)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"gamma1": self.gamma1, "gamma2": self.gamma2, "epsilon": self.epsilon,
                "centered": self.centered, "clip_weights": self.clip_weights}

    def state_slots(self) -> tuple[str, ...]:
        return ("n", "g", "delta") if self.centered else ("n",)

    def _mxnet_step(self, xp, weight, grad, state, lr, wd, t):
        clipped_weights = self.clip_weights is not None
        hyper = dict(gamma1=self.gamma1, epsilon=self.epsilon, clip_weights=self.clip_weights,
                     **self._hyper(lr, wd))
        if self.centered:
            rule = update_rules.rmsprop_centered(self._clipped, clipped_weights)
            return update_rules.mxnet_step(rule, xp, weight, grad, state, gamma2=self.gamma2,
                                           **hyper)
        rule = update_rules.rmsprop(self._clipped, clipped_weights)
        return update_rules.mxnet_step(rule, xp, weight, grad, state, **hyper)


class MXNetAdaGrad(_MXNetRule):
    """MXNet's AdaGrad (``mixrt.optimizer``'s ``adagrad``), which MXNet writes as NDArray
    operations: its scalars are the doubles of its Python cast to the weight's dtype, not
    C floats (the clip bound excepted: ``clip`` takes a C float)."""

    name = "mxnet_adagrad"

    def __init__(self, *, epsilon=1e-7, **common):
        self.epsilon = real_param(self._owner, "epsilon", epsilon, low=0.0)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"epsilon": self.epsilon}

    def state_slots(self) -> tuple[str, ...]:
        return ("history",)

    def _mxnet_step(self, xp, weight, grad, state, lr, wd, t):
        return update_rules.mxnet_step(
            update_rules.adagrad(self._clipped), xp, weight, grad, state,
            exact={"lr": lr, "wd": wd, "epsilon": self.epsilon,
                   "rescale_grad": self.rescale_grad}, clip_gradient=self.clip_gradient)


class MXNetFtrl(_MXNetRule):
    """MXNet's FTRL-Proximal (``mixrt.optimizer``'s ``ftrl``): ``z`` and ``n`` accumulate
    and the weight is solved afresh from them each step."""

    name = "mxnet_ftrl"
    default_learning_rate = 0.1

    def __init__(self, *, lamda1=0.01, beta=1.0, **common):
        self.lamda1 = real_param(self._owner, "lamda1", lamda1, low=0.0)
        self.beta = real_param(self._owner, "beta", beta, low=0.0)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"lamda1": self.lamda1, "beta": self.beta}

    def state_slots(self) -> tuple[str, ...]:
        return ("z", "n")

    def _mxnet_step(self, xp, weight, grad, state, lr, wd, t):
        return update_rules.mxnet_step(update_rules.ftrl(self._clipped), xp, weight, grad,
                                       state, lamda1=self.lamda1, beta=self.beta,
                                       **self._hyper(lr, wd))


class MXNetSignum(_MXNetRule):
    """MXNet's Signum (``mixrt.optimizer``'s ``signum``): steps by the sign of a momentum;
    with ``momentum`` 0, signSGD, by the sign of the gradient (no state)."""

    name = "mxnet_signum"

    def __init__(self, *, momentum=0.9, wd_lh=0.0, **common):
        self.momentum = real_param(self._owner, "momentum", momentum, low=0.0)
        self.wd_lh = real_param(self._owner, "wd_lh", wd_lh, low=0.0)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"momentum": self.momentum, "wd_lh": self.wd_lh}

    def state_slots(self) -> tuple[str, ...]:
        return ("mom",) if self.momentum else ()

    def _mxnet_step(self, xp, weight, grad, state, lr, wd, t):
        if not self.momentum:
            return update_rules.mxnet_step(update_rules.signsgd(), xp, weight, grad, {},
                                           lr=lr, wd=wd)
        return update_rules.mxnet_step(update_rules.signum(self._clipped), xp, weight, grad,
                                       state, momentum=self.momentum, wd_lh=self.wd_lh,
                                       **self._hyper(lr, wd))


class MXNetLAMB(_MXNetRule):
    """MXNet's LAMB (``mixrt.optimizer``'s ``lamb``): Adam's direction with decoupled
    weight decay (``lamb_update_phase1``), then a step scaled by the trust ratio of the
    weight's norm to the direction's (``lamb_update_phase2``). The norms are
    ``update_rules.lamb_norm``'s, as in the worker's process: a server holding a key whole
    takes the worker's steps bit for bit."""

    name = "mxnet_lamb"
    default_learning_rate = 0.001

    def __init__(self, *, beta1=0.9, beta2=0.999, epsilon=1e-6, lower_bound=None,
                 upper_bound=None, bias_correction=True, **common):
        self.beta1 = real_param(self._owner, "beta1", beta1, low=0.0, high=1.0, high_open=True)
        self.beta2 = real_param(self._owner, "beta2", beta2, low=0.0, high=1.0, high_open=True)
        self.epsilon = real_param(self._owner, "epsilon", epsilon, low=0.0)
        self.lower_bound = _bound(self._owner, "lower_bound", lower_bound)
        self.upper_bound = _bound(self._owner, "upper_bound", upper_bound)
        self.bias_correction = _flag(self._owner, "bias_correction", bias_correction)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon,
                "lower_bound": self.lower_bound, "upper_bound": self.upper_bound,
                "bias_correction": self.bias_correction}

    def state_slots(self) -> tuple[str, ...]:
        return ("mean", "var")

    def _mxnet_step(self, xp, weight, grad, state, lr, wd, t):
        direction = update_rules.mxnet_values(
            update_rules.lamb_direction(self._clipped, self.bias_correction), xp, weight,
            grad, state, exact=self._powers(weight.dtype, t), wd=wd, beta1=self.beta1,
            beta2=self.beta2, epsilon=self.epsilon, rescale_grad=self.rescale_grad,
            clip_gradient=self.clip_gradient)["direction"]
        new_weight = weight.copy()
        update_rules.lamb_trust_step(
            xp, new_weight, direction, lr, update_rules.lamb_norm(xp, weight),
            update_rules.lamb_norm(xp, direction), self.lower_bound, self.upper_bound)
        return new_weight

    def _powers(self, dtype, t) -> dict:
        return {"beta1_t": update_rules.lamb_power(self.beta1, t, dtype),
                "beta2_t": update_rules.lamb_power(self.beta2, t, dtype)}


def _bound(owner: str, name: str, value):
    """LAMB's bound on the weight's norm: None (MXNet's Python passes none for 0 too)."""
    return None if not value else real_param(owner, name, value, low=0.0, low_open=True)


__all__ = ["MXNetSGD", "MXNetAdam", "MXNetRMSProp", "MXNetAdaGrad", "MXNetFtrl",
           "MXNetSignum", "MXNetLAMB"]
