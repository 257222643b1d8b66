"""MXNet's gradient-descent family: SGD (ccSGD), NAG, Signum, SGLD, DCASGD, LARS, LBSGD and
the ``test`` optimizer, with MXNet's update rules, defaults and state layouts.

Where MXNet passes an option to its update operator only when it is set (``if
self.clip_gradient:``), these do the same: ``clip_gradient=0`` clips nothing.
"""

from __future__ import annotations

import math
import os

import numpy as np

from mixrt import nd, optimizer_ops as ops, random as mixrt_random
from mixrt.ops.device import array_module
from mixrt.optimizers.base import ImplUpdates, Optimizer, register, warn_float16, zeros_like
from mixrt.runtime.training import optimizer_kernels as kernels
from mixrt.runtime.training.optimizers import definitions
from mixrt.runtime.training.optimizers import sgd as sgd_definition


def listed(index, weight, grad, state):
    """One update or several (MXNet's aggregated form) as four lists."""
    if isinstance(index, (list, tuple)):
        return list(index), list(weight), list(grad), list(state)
    return [index], [weight], [grad], [state]


def clipping(optimizer) -> float:
    """MXNet's operators clip when ``clip_gradient`` is set and non-zero; -1 is "no"."""
    return optimizer.clip_gradient if optimizer.clip_gradient else -1.0


def rescaled(optimizer, grad):
    """``rescale_grad * grad`` clipped (the Python-level kinds' own arithmetic)."""
    grad = grad * optimizer.rescale_grad
    if optimizer.clip_gradient is not None:
        grad = nd.clip(grad, -optimizer.clip_gradient, optimizer.clip_gradient)
    return grad


class _MomentumSGD(ImplUpdates, Optimizer):
    """What SGD, NAG and LARS share (runtime/training/optimizers/sgd.py): an optional
    momentum buffer and, with ``multi_precision``, the state ``(momentum, float32
    weight)``."""

    definition = definitions()["sgd"]
    nesterov = False

    def create_state(self, index, weight):
        return None if self.momentum == 0.0 else zeros_like(weight)

    def engine_hyper(self) -> dict:
        return {"momentum": max(self.momentum, 0.0), "nesterov": self.nesterov}

    def create_state_multi_precision(self, index, weight):
        if self.multi_precision and weight.dtype == np.float16:
            master = weight.astype(np.float32)
            return (self.create_state(index, master), master)
        warn_float16(weight, self.multi_precision, type(self).__name__)
        return self.create_state(index, weight)

    def _options(self, momentum=None) -> dict:
        momentum = self.momentum if momentum is None else momentum
        return {"rescale_grad": self.rescale_grad, "clip_gradient": clipping(self),
                "momentum": momentum if momentum > 0 else 0.0}

    def _step(self, weight, grad, state, lr, wd, multi_precision, options,
              operators=None) -> None:
        plain, with_momentum, mp_plain, mp_momentum = operators or self._operators
        momentum = options.pop("momentum")
        if not multi_precision:
            if state is None:
                plain(weight, grad, out=weight, lr=lr, wd=wd, **options)
            else:
                with_momentum(weight, grad, state, out=weight, lr=lr, wd=wd,
                              momentum=momentum, **options)
        elif state[0] is None:
            mp_plain(weight, grad, state[1], out=weight, lr=lr, wd=wd, **options)
        else:
            mp_momentum(weight, grad, state[0], state[1], out=weight, lr=lr, wd=wd,
                        momentum=momentum, **options)


@register
class SGD(_MomentumSGD):
    """SGD with optional momentum (MXNet keeps ``-lr`` in the buffer:
    ``mom = momentum * mom - lr * (grad + wd * weight)``, ``weight += mom``).
    ``lazy_update``: with a row_sparse gradient, only the rows it stores are updated."""

    _operators = (ops.sgd_update, ops.sgd_mom_update, ops.mp_sgd_update,
                  ops.mp_sgd_mom_update)
    # MXNet's SGD updates dense weights (all of a call's, even one alone) with its
    # multi-tensor operators, whose kernel rounds a step without momentum otherwise
    _dense_operators = (ops.one_multi_sgd_update, ops.sgd_mom_update,
                        ops.one_multi_mp_sgd_update, ops.mp_sgd_mom_update)
    updates_any_number = True  # on a GPU, a whole step in one launch (_step_many)

    def __init__(self, momentum=0.0, lazy_update=True, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum
        self.lazy_update = lazy_update
        self.aggregate_num = int(os.getenv("MXNET_OPTIMIZER_AGGREGATION_SIZE", "4"))

    def _update_impl(self, indices, weights, grads, states, multi_precision=False):
        indices, weights, grads, states = listed(indices, weights, grads, states)
        self._update_count(indices)
        lrs, wds = self._get_lrs(indices), self._get_wds(indices)
        if not multi_precision and self._step_many(weights, grads, states, lrs, wds):
            return
        dense = all(a.stype == "default" for a in (*weights, *grads))
        operators = self._dense_operators if dense else self._operators
        for weight, grad, state, lr, wd in zip(weights, grads, states, lrs, wds):
            self._step(weight, grad, state, lr, wd, multi_precision, self._options(),
                       operators)

    def _step_many(self, weights, grads, states, lrs, wds) -> bool:
        """Every weight in one launch where they are dense float32/float64 arrays of one GPU
        (runtime/training/optimizers/sgd.py's kernel); False, nothing done, elsewhere. A step of a
        ResNet-18 is otherwise 62 updates from Python, ~20 ms on an H100 against the
        forward and backward's 22 ms."""
        if len(weights) < 2 or any(a.stype != "default" for a in (*weights, *grads)):
            return False
        moms = None if self.momentum == 0.0 else list(states)
        raw = [w._data for w in weights] + [g._data for g in grads] + [m._data for m in moms or ()]
        xp = array_module(raw[0])
        dtype = raw[0].dtype
        if not kernels.many_on_gpu(xp, dtype, raw) or any(array_module(a) is not xp for a in raw) \
                or len({a.device.id for a in raw}) != 1:
            return False
        options = self._options()
        sgd_definition.many(
            xp, [w._write() for w in weights], [g._read() for g in grads],
            None if moms is None else [m._write() for m in moms], lrs, wds,
            momentum=options["momentum"], rescale=options["rescale_grad"],
            clip=None if options["clip_gradient"] < 0 else options["clip_gradient"])
        return True

    def _options(self, momentum=None) -> dict:
        return dict(super()._options(momentum), lazy_update=self.lazy_update)


@register
class ccSGD(SGD):  # noqa: N801 (MXNet's name)
    """Deprecated in MXNet: SGD under another name."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)


@register
class NAG(_MomentumSGD):
    """Nesterov accelerated SGD: ``mom = momentum * mom - lr * g'``,
    ``weight += momentum * mom - lr * g'`` with ``g' = grad + wd * weight``."""

    _operators = (ops.sgd_update, ops.nag_mom_update, ops.mp_sgd_update,
                  ops.mp_nag_mom_update)

    nesterov = True  # its engine twin: mxnet_sgd with nesterov (momentum 0: sgd_update)

    def __init__(self, momentum=0.0, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum

    def update_multi_precision(self, index, weight, grad, state):
        use = self.multi_precision and weight.dtype == np.float16 and \
            isinstance(state, (tuple, list))
        self._update_impl(index, weight, grad, state, multi_precision=use)

    def _update_impl(self, index, weight, grad, state, multi_precision=False):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        self._step(weight, grad, state, lr, wd, multi_precision, self._options())


@register
class Signum(Optimizer):
    """signSGD (``momentum`` 0) or Signum (Bernstein et al., 2018): steps by the sign of
    the gradient or of its momentum; ``wd_lh`` is decoupled weight decay
    (runtime/training/optimizers/signum.py)."""

    definition = definitions()["signum"]
    state_is_tuple = False

    def __init__(self, learning_rate=0.01, momentum=0.9, wd_lh=0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.momentum = momentum
        self.wd_lh = wd_lh

    def engine_hyper(self) -> dict:
        return {"momentum": self.momentum, "wd_lh": self.wd_lh or 0.0}

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        if state is None:
            self._apply_operator("signsgd_update", weight, grad, None, lr=lr, wd=wd)
        else:
            self._apply_operator("signum_update", weight, grad, state, lr=lr, wd=wd,
                                 momentum=self.momentum if self.momentum > 0 else 0.0)


@register
class SGLD(Optimizer):
    """Stochastic gradient Langevin dynamics: half a gradient step plus Gaussian noise of
    variance ``lr``, drawn by ``mixrt.random.normal`` as MXNet draws it with
    ``mx.random.normal`` (so ``mixrt.random.seed`` gives the same noise to the same calls)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        grad = rescaled(self, grad)
        weight[:] = weight + (-lr / 2) * (grad + wd * weight)
        weight[:] = weight + mixrt_random.normal(0, math.sqrt(lr), shape=weight.shape,
                                                 dtype=weight.dtype, ctx=weight.ctx)


@register
class DCASGD(Optimizer):
    """Delay-compensated asynchronous SGD (Zheng et al., 2016); state ``(momentum or
    None, previous weight)``."""

    def __init__(self, momentum=0.0, lamda=0.04, **kwargs):
        super().__init__(**kwargs)
        self.momentum = momentum
        self.weight_previous = {}
        self.lamda = lamda

    def create_state(self, index, weight):
        momentum = None if self.momentum == 0.0 else zeros_like(weight)
        return (momentum, weight.copy())

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        grad = rescaled(self, grad)
        mom, previous = state
        step = -lr * (grad + wd * weight + self.lamda * grad * grad * (weight - previous))
        if mom is not None:
            mom[:] = mom * self.momentum + step
            step = mom
        previous[:] = weight
        weight[:] = weight + step


@register
class Test(Optimizer):
    """MXNet's test optimizer: ``weight += rescale_grad * grad``; the state copies the
    weight."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def create_state(self, index, weight):
        return nd.zeros(weight.shape, weight.ctx)

    def update(self, index, weight, grad, state):
        weight[:] = weight + grad * self.rescale_grad
        state[:] = weight


__all__ = ["SGD", "ccSGD", "NAG", "Signum", "SGLD", "DCASGD", "Test"]
