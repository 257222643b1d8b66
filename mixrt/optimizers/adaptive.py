"""MXNet's adaptive-rate optimizers: Adam, Adamax, Nadam, AdaGrad, GroupAdaGrad, AdaDelta,
RMSProp, Ftrl and FTML, with MXNet's update rules, defaults and state layouts.

The kinds with a definition in ``runtime/training/optimizers/`` (Adam, AdaGrad,
GroupAdaGrad, RMSProp, Ftrl, FTML) are MXNet's signature and attribute names over it: their
states, nd operators and engine twins come from there. The kinds MXNet writes in Python
alone (AdaDelta, Adamax, Nadam) take MXNet's steps here on the arrays' own data, in the
weight's dtype. States have the weight's dtype (MXNet makes some float32 whatever the
weight, which it then cannot add to a float64 gradient).
"""

from __future__ import annotations

from mixrt.base.errors import OptimizerError
from mixrt.ops.device import array_module
from mixrt.optimizers.base import Optimizer, register, zeros_like
from mixrt.runtime.training.optimizers import adagrad, adam, definitions


def _rescaled_raw(optimizer, grad, xp, dtype):
    """``rescale_grad * grad``, clipped when ``clip_gradient`` is not None (the Python
    kinds clip on ``is not None``, the operator kinds on a non-zero value)."""
    g = grad._read().astype(dtype, copy=False) * float(optimizer.rescale_grad)
    if optimizer.clip_gradient is not None:
        g = xp.clip(g, -float(optimizer.clip_gradient), float(optimizer.clip_gradient))
    return g


@register
class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015) as MXNet has it: the bias corrections folded into the rate,
    ``lr * sqrt(1 - beta2^t) / (1 - beta1^t)``, and weight decay added to the gradient
    (runtime/training/optimizers/adam.py)."""

    definition = definitions()["adam"]

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 lazy_update=True, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.lazy_update = lazy_update

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        rate = adam.rate(lr, self.beta1, self.beta2, self._index_update_count[index])
        self._apply_operator("adam_update", weight, grad, state, lr=rate, wd=wd)


@register
class AdaGrad(Optimizer):
    """AdaGrad (Duchi et al., 2011): ``history += g^2``,
    ``w += (g / sqrt(history + eps) + wd * w) * -lr`` (runtime/training/optimizers/
    adagrad.py: MXNet writes it as NDArray arithmetic, not an operator)."""

    definition = definitions()["adagrad"]
    state_is_tuple = False

    def __init__(self, eps=1e-7, **kwargs):
        super().__init__(**kwargs)
        self.float_stable_eps = eps

    def engine_hyper(self) -> dict:
        return {"epsilon": self.float_stable_eps}

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        w = weight._write()
        w[...] = adagrad.step(array_module(w), w, grad._read(), state._write(), lr=lr, wd=wd,
                              epsilon=self.float_stable_eps, rescale_grad=self.rescale_grad,
                              clip_gradient=self.clip_gradient)


@register
class GroupAdaGrad(Optimizer):
    """AdaGrad with one accumulator per row (``mx.optimizer.contrib.GroupAdaGrad``); no
    weight decay (runtime/training/optimizers/group_adagrad.py)."""

    definition = definitions()["groupadagrad"]

    def __init__(self, eps=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.float_stable_eps = eps

    def create_state(self, index, weight):
        if len(weight.shape) != 2:
            raise OptimizerError(f"GroupAdaGrad takes 2-D weights, got {weight.shape}")
        return zeros_like(weight.reshape((weight.shape[0], 1)))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        if wd != 0:
            raise OptimizerError("Weight decay is not supported for GroupAdaGrad")
        self._apply_operator("group_adagrad_update", weight, grad, state, lr=lr,
                             epsilon=self.float_stable_eps)


@register
class RMSProp(Optimizer):
    """RMSProp (Tieleman & Hinton) or, with ``centered``, Graves' form; ``clip_weights``
    clips the weights after each step (runtime/training/optimizers/rmsprop.py)."""

    definition = definitions()["rmsprop"]

    def __init__(self, learning_rate=0.001, gamma1=0.9, gamma2=0.9, epsilon=1e-8,
                 centered=False, clip_weights=None, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.gamma1, self.gamma2 = gamma1, gamma2
        self.centered, self.epsilon, self.clip_weights = centered, epsilon, clip_weights

    def engine_hyper(self) -> dict:
        clip_weights = self.clip_weights if self.clip_weights and self.clip_weights > 0 \
            else None  # MXNet clips the weights only from a positive bound
        return dict(super().engine_hyper(), centered=bool(self.centered),
                    clip_weights=clip_weights)

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        operator = "rmspropalex_update" if self.centered else "rmsprop_update"
        self._apply_operator(operator, weight, grad, state, lr=lr, wd=wd)


@register
class AdaDelta(Optimizer):
    """AdaDelta (Zeiler, 2012): no learning rate; running means of ``g^2`` and of the
    squared steps."""

    def __init__(self, rho=0.9, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.rho, self.epsilon = rho, epsilon

    def create_state(self, index, weight):
        return (zeros_like(weight), zeros_like(weight))

    def update(self, index, weight, grad, state):
        wd = self._get_wd(index)
        self._update_count(index)
        w = weight._write()
        acc_g, acc_delta = (part._write() for part in state)
        xp = array_module(w)
        g = _rescaled_raw(self, grad, xp, w.dtype)
        acc_g *= self.rho
        acc_g += (1.0 - self.rho) * g * g
        delta = xp.sqrt(acc_delta + self.epsilon) / xp.sqrt(acc_g + self.epsilon) * g
        acc_delta *= self.rho
        acc_delta += (1.0 - self.rho) * delta * delta
        w -= delta + wd * w


@register
class Ftrl(Optimizer):
    """FTRL-Proximal (McMahan et al., 2013); state ``(z, n)``
    (runtime/training/optimizers/ftrl.py)."""

    definition = definitions()["ftrl"]

    def __init__(self, lamda1=0.01, learning_rate=0.1, beta=1, **kwargs):
        super().__init__(**kwargs)
        self.lamda1, self.beta = lamda1, beta
        self.lr = learning_rate

    def update(self, index, weight, grad, state):
        self._update_count(index)
        wd, lr = self._get_wd(index), self._get_lr(index)
        self._apply_operator("ftrl_update", weight, grad, state, lr=lr, wd=wd)


@register
class Adamax(Optimizer):
    """AdaMax (Kingma & Ba, 2015, section 7): the infinity norm in place of Adam's second
    moment. Weight decay joins the gradient before clipping."""

    def __init__(self, learning_rate=0.002, beta1=0.9, beta2=0.999, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2 = beta1, beta2

    def create_state(self, index, weight):
        return (zeros_like(weight), zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        lr /= 1.0 - self.beta1 ** self._index_update_count[index]
        w = weight._write()
        m, u = (part._write() for part in state)
        xp = array_module(w)
        g = grad._read().astype(w.dtype, copy=False) * float(self.rescale_grad) + wd * w
        if self.clip_gradient is not None:
            g = xp.clip(g, -float(self.clip_gradient), float(self.clip_gradient))
        m *= self.beta1
        m += (1.0 - self.beta1) * g
        u[...] = xp.maximum(self.beta2 * u, xp.abs(g))
        w -= lr * m / u


@register
class Nadam(Optimizer):
    """Adam with Nesterov momentum (Dozat, 2016), with its momentum schedule
    (``schedule_decay``)."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 schedule_decay=0.004, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.schedule_decay = schedule_decay
        self.m_schedule = 1.0

    def create_state(self, index, weight):
        return (zeros_like(weight), zeros_like(weight))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        t = self._index_update_count[index]
        w = weight._write()
        m, v = (part._write() for part in state)
        xp = array_module(w)
        g = grad._read().astype(w.dtype, copy=False) * float(self.rescale_grad) + wd * w
        if self.clip_gradient is not None:
            g = xp.clip(g, -float(self.clip_gradient), float(self.clip_gradient))
        momentum_t = self.beta1 * (1.0 - 0.5 * pow(0.96, t * self.schedule_decay))
        momentum_next = self.beta1 * (1.0 - 0.5 * pow(0.96, (t + 1) * self.schedule_decay))
        self.m_schedule = self.m_schedule * momentum_t
        schedule_next = self.m_schedule * momentum_next
        m *= self.beta1
        m += (1.0 - self.beta1) * g
        v *= self.beta2
        v += (1.0 - self.beta2) * g * g
        g_prime = g / (1.0 - self.m_schedule)
        m_prime = m / (1.0 - schedule_next)
        v_prime = v / (1.0 - pow(self.beta2, t))
        m_bar = (1.0 - momentum_t) * g_prime + momentum_next * m_prime
        w -= lr * m_bar / (xp.sqrt(v_prime) + self.epsilon)


@register
class FTML(Optimizer):
    """FTML (Zheng & Kwok, 2017); state ``(d, v, z)`` (runtime/training/optimizers/
    ftml.py)."""

    definition = definitions()["ftml"]

    def __init__(self, beta1=0.6, beta2=0.999, epsilon=1e-8, **kwargs):
        super().__init__(**kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        self._apply_operator("ftml_update", weight, grad, state, lr=lr, wd=wd,
                             t=self._index_update_count[index], beta1=self.beta1,
                             beta2=self.beta2, epsilon=self.epsilon,
                             clip_grad=self.clip_gradient if self.clip_gradient else -1.0)


__all__ = ["Adam", "AdaGrad", "GroupAdaGrad", "RMSProp", "AdaDelta", "Ftrl", "Adamax",
           "Nadam", "FTML"]
