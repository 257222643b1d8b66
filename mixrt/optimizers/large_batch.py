"""MXNet's large-batch optimizers: LARS, LAMB and LBSGD, with MXNet's rules and defaults.

LARS and LAMB scale each layer's rate by a trust ratio of norms; MXNet computes the norms in
float32 and so do these (LAMB's by its definition's ``norm``, as a parameter server does).
"""

from __future__ import annotations

import logging
import math
import os

import numpy as np

from mixrt import nd, optimizer_ops as ops
from mixrt.ops.device import array_module
from mixrt.optimizers.base import ImplUpdates, Optimizer, register, zeros_like
from mixrt.optimizers.sgd import SGD, listed
from mixrt.runtime.training.optimizers import definitions
from mixrt.runtime.training.optimizers import lamb as lamb_definition

_NO_TRUST_RATIO = ("gamma", "beta", "bias")  # LARS leaves these layers' rates alone


def _norm(array, scale: float = 1.0) -> float:
    values = array._read().astype(np.float32) * np.float32(scale)
    return float(np.sqrt(np.float32((values * values).sum())))


@register
class LARS(SGD):
    """SGD with layer-wise adaptive rate scaling (You et al., 2017): the rate of each
    weight that is not a bias, beta or gamma is ``lr * eta * |w| / (|g| + wd |w| + eps)``.
    With ``momentum_correction`` the momentum follows the rate's changes."""

    def __init__(self, momentum=0.0, lazy_update=True, eta=0.001, eps=0,
                 momentum_correction=True, **kwargs):
        super().__init__(momentum=momentum, lazy_update=lazy_update, **kwargs)
        self.momentum_correction = momentum_correction
        self.eta, self.eps = eta, eps
        self.skip = 0
        self.last_lr = None
        self.cur_lr = None

    def _get_lrs(self, indices):
        if self.cur_lr is not None:
            self.last_lr = self.cur_lr
        lr = self.lr_scheduler(self.num_update) if self.lr_scheduler is not None else self.lr
        if self.cur_lr is None:
            self.last_lr = lr
        self.cur_lr = lr
        return [lr * self._multiplier(index, "lr_mult") for index in indices]

    @staticmethod
    def _decays_by_default(name: str) -> bool:
        return name.endswith("_weight")

    def _name(self, index) -> str:
        return self.idx2name.get(index, str(index))

    def _trust_lr(self, index, weight, grad, lr, wd) -> float:
        if self._name(index).endswith(_NO_TRUST_RATIO):
            return lr
        weight_norm, grad_norm = _norm(weight), _norm(grad, self.rescale_grad)
        if weight_norm > 0.0 and grad_norm > 0.0:
            return lr * self.eta * weight_norm / (grad_norm + wd * weight_norm + self.eps)
        return lr

    def _update_impl(self, indices, weights, grads, states, multi_precision=False):
        indices, weights, grads, states = listed(indices, weights, grads, states)
        self._update_count(indices)
        lrs, wds = self._get_lrs(indices), self._get_wds(indices)
        momentum = self.momentum
        if self.momentum > 0 and self.momentum_correction and self.last_lr != 0:
            momentum = self.momentum * (self.cur_lr / self.last_lr)
        for index, weight, grad, state, lr, wd in zip(indices, weights, grads, states, lrs,
                                                      wds):
            lr = self._trust_lr(index, weight, grad, lr, wd)
            self._step(weight, grad, state, lr, wd, multi_precision, self._options(momentum))

    def spec(self) -> dict:
        self._no_twin()  # its trust ratio is not SGD's


@register
class LAMB(ImplUpdates, Optimizer):
    """LAMB (You et al., 2019): Adam's direction plus decoupled weight decay, scaled per
    layer by ``|w| / |direction|`` (``|w|`` held to ``[lower_bound, upper_bound]``;
    runtime/training/optimizers/lamb.py)."""

    definition = definitions()["lamb"]

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-6,
                 lower_bound=None, upper_bound=None, bias_correction=True, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.lower_bound, self.upper_bound = lower_bound, upper_bound
        self.bias_correction = bias_correction
        self.aggregate_num = max(1, min(45, int(os.getenv(
            "MXNET_OPTIMIZER_AGGREGATION_SIZE", "45"))))

    def _update_impl(self, index, weight, grad, state, multi_precision=False):
        for idx, weight_, grad_, state_ in zip(*listed(index, weight, grad, state)):
            self._update_count(idx)
            lr, wd = self._get_lr(idx), self._get_wd(idx)
            self._lamb_step(idx, weight_, grad_, state_, lr, wd, multi_precision)

    def _lamb_step(self, index, weight, grad, state, lr, wd, multi_precision) -> None:
        options = {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon,
                   "bias_correction": self.bias_correction, "wd": wd,
                   "rescale_grad": self.rescale_grad,
                   "clip_gradient": self.clip_gradient if self.clip_gradient else -1.0,
                   "t": self._index_update_count[index]}
        bounds = {"lower_bound": self.lower_bound or -1.0,
                  "upper_bound": self.upper_bound or -1.0}
        if multi_precision:
            master, (mean, var) = state
            g = ops.mp_lamb_update_phase1(weight, grad, mean, var, master, **options)
            ops.mp_lamb_update_phase2(weight, g, _norm_array(master), _norm_array(g), master,
                                      lr=lr, out=weight, **bounds)
        else:
            mean, var = state
            g = ops.lamb_update_phase1(weight, grad, mean, var, **options)
            ops.lamb_update_phase2(weight, g, _norm_array(weight), _norm_array(g), lr=lr,
                                   out=weight, **bounds)

    def engine_hyper(self) -> dict:
        return dict(super().engine_hyper(), lower_bound=_acting(self.lower_bound),
                    upper_bound=_acting(self.upper_bound),
                    bias_correction=bool(self.bias_correction))


def _acting(bound):
    """A bound of LAMB's that MXNet's phase 2 applies (set and > 0), else None."""
    return bound if bound and bound > 0 else None


def _norm_array(array):
    """LAMB's norm (``lamb.norm``, which a parameter server computes too)."""
    data = array._read()
    return nd.array([lamb_definition.norm(array_module(data), data)], ctx=array.ctx)


@register
class LBSGD(Optimizer):
    """Large-batch SGD: gradients are summed over ``batch_scale`` updates, and the rate
    is warmed up by ``warmup_strategy`` ('linear', 'power2', 'sqrt', or 'lars' for a
    trust ratio) over ``warmup_epochs``."""

    def __init__(self, momentum=0.0, multi_precision=False, warmup_strategy="linear",
                 warmup_epochs=5, batch_scale=1, updates_per_epoch=32, begin_epoch=0,
                 num_epochs=60, **kwargs):
        super().__init__(**kwargs)
        logging.info("Running Large-Batch SGD Algorithm")
        self.momentum, self.multi_precision = momentum, multi_precision
        self.warmup_strategy, self.warmup_epochs = warmup_strategy, warmup_epochs
        self.batch_scale, self.updates_per_epoch = batch_scale, updates_per_epoch
        self.init_updates = begin_epoch * updates_per_epoch
        self.num_epochs = num_epochs
        self.lbmult, self.cumgrads, self.adaptive, self.admult = 1, {}, False, 1

    def create_state(self, index, weight):
        return None if self.momentum == 0.0 else zeros_like(weight)

    def _get_lbmult(self, nup):
        warmup = self.warmup_epochs * self.updates_per_epoch
        most = float(self.batch_scale)
        if nup >= warmup:
            return most
        if warmup <= 1:
            return 1.0
        shapes = {"linear": lambda: nup / warmup, "power2": lambda: nup * nup / warmup ** 2,
                  "sqrt": lambda: math.sqrt(float(nup) / warmup)}
        shape = shapes.get(self.warmup_strategy)
        return 1.0 if shape is None else 1.0 + (most - 1) * shape()

    def _get_lars(self, weight, g, wd):
        weight2, grad2 = _squared(weight), _squared(g)
        lars = math.sqrt(weight2 / (grad2 + wd * weight2 + 1e-18))
        return min(max(lars, 0.01), 100)

    def _cumulate_gradient(self, grad, index):
        summed = self.cumgrads.get(index)
        if summed and summed["num_cums"] > 0:
            summed = {"cum_grad": summed["cum_grad"] + grad,
                      "num_cums": summed["num_cums"] + 1}
        else:
            summed = {"cum_grad": grad, "num_cums": self.init_updates + 1}
        self.cumgrads[index] = summed
        return summed

    def update(self, index, weight, grad, state):
        lr, wd = self._get_lr(index), self._get_wd(index)  # before the count, as MXNet
        self._update_count(index)
        summed = self._cumulate_gradient(grad, index)
        if summed["num_cums"] % self.batch_scale != 0:
            ops.sgd_update(weight, grad, out=weight, lr=0.0, wd=wd)
            return
        grad = summed["cum_grad"] / self.batch_scale
        lr *= self._get_lars(weight, grad, wd) if self.warmup_strategy == "lars" else \
            self._get_lbmult(summed["num_cums"])
        options = {"rescale_grad": self.rescale_grad,
                   "clip_gradient": self.clip_gradient if self.clip_gradient else -1.0}
        if state is None:
            ops.sgd_update(weight, grad, out=weight, lr=lr, wd=wd, **options)
        else:
            ops.sgd_mom_update(weight, grad, state, out=weight, lr=lr, wd=wd,
                               momentum=self.momentum if self.momentum > 0 else 0.0,
                               **options)
        self.cumgrads[index]["cum_grad"] = 0


def _squared(array) -> float:
    values = array.asnumpy()
    return float((values * values).sum())


__all__ = ["LARS", "LAMB", "LBSGD"]
