"""MXNet's SGD and NAG (``sgd_update``, ``sgd_mom_update``, ``nag_mom_update``, their ``mp_``
and ``multi_`` forms; SGDKernel, SGDMomKernel, MultiSGDKernel, NAGMomKernel): the rules, the
engine's ``mxnet_sgd`` kind (``nesterov`` for NAG) and its one-launch GPU step.

MXNet keeps ``-lr`` inside the momentum buffer (``mom = momentum * mom - lr * wd * w - lr *
g``, ``w += mom``), which follows a changing rate otherwise than PyTorch's buffer. Without
momentum, MXNet's SGD optimizer steps as its multi-tensor operator does (``multi_sgd``) and
its NAG as ``sgd_update`` does; the two round differently.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.runtime.training import optimizer_kernels as kernels
from mixrt.runtime.training import update_rules as rules
from mixrt.runtime.training.optimizers.definition import (GRADIENT, REQUIRED, Definition,
                                                          Hyper, Operator, clips, common)


# -- the rules -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def sgd(clipped: bool) -> rules.Rule:
    """MXNet's ``sgd_update`` (SGDKernel)."""
    return rules.Rule("sgd", ("weight",), ("grad",), rules.scalars(clipped, "lr", "wd"), (
        f"weight = (1 - lr * wd) * weight - {rules.gradient_term(clipped, 'lr')}",))


@functools.lru_cache(maxsize=None)
def multi_sgd(clipped: bool) -> rules.Rule:
    """MXNet's ``multi_sgd_update`` (MultiSGDKernel without momentum), which MXNet's SGD
    optimizer runs on every dense weight, even one alone: the momentum form with a zero
    buffer and momentum, ``w + (0 * 0 - lr * wd * w - lr * g)``, which rounds otherwise
    than ``sgd_update``'s ``(1 - lr * wd) * w - lr * g``."""
    return rules.Rule("multi_sgd", ("weight",), ("grad",), rules.scalars(clipped, "lr", "wd"), (
        f"mom = 0 * 0 - lr * wd * weight - {rules.gradient_term(clipped, 'lr')}",
        "weight = weight + mom"))


@functools.lru_cache(maxsize=None)
def sgd_mom(clipped: bool) -> rules.Rule:
    """MXNet's ``sgd_mom_update`` (SGDMomKernel; multi_sgd_mom_update's is the same):
    ``-lr`` lives inside the momentum buffer."""
    return rules.Rule("sgd_mom", ("weight", "mom"), ("grad",),
                      rules.scalars(clipped, "lr", "wd", "momentum"), (
                          f"mom = momentum * mom - lr * wd * weight"
                          f" - {rules.gradient_term(clipped, 'lr')}",
                          "weight = weight + mom"))


@functools.lru_cache(maxsize=None)
def nag_mom(clipped: bool, in_place: bool) -> rules.Rule:
    """MXNet's ``nag_mom_update`` (NAGMomKernel). The kernel writes the new weight before it
    updates the momentum, which reads the weight again: in place (``out`` is the weight, as
    in MXNet's NAG optimizer, or the float32 copy of the ``mp_`` form) it reads the new
    one, and MXNet's NAG's numbers depend on it."""
    g = "clip(rescale_grad * grad, clip_gradient)" if clipped else "rescale_grad * grad"
    return rules.Rule("nag_mom", ("weight", "mom"), ("grad",),
                      rules.scalars(clipped, "lr", "wd", "momentum"), (
                          "mom = momentum * mom",
                          f"out = weight - mom + (momentum + 1) * (mom - lr * ({g} + wd * weight))",
                          *(("weight = out",) if in_place else ()),
                          f"mom = mom - lr * ({g} + wd * weight)"))


# -- the steps -----------------------------------------------------------------------------

def _plain_step(rule):
    """An operator's step without momentum by ``rule`` (``sgd`` or ``multi_sgd``)."""
    def step(xp, weight, reads, states, params, in_place):
        return rules.mxnet_step(rule(clips(params)), xp, weight, reads["grad"], {}, **params)
    return step


_SGD_STEP, _MULTI_SGD_STEP = _plain_step(sgd), _plain_step(multi_sgd)


def _momentum_step(xp, weight, reads, states, params, in_place):
    return rules.mxnet_step(sgd_mom(clips(params)), xp, weight, reads["grad"], states,
                            **params)


def _nag_step(xp, weight, reads, states, params, in_place):
    return rules.mxnet_step(nag_mom(clips(params), in_place), xp, weight, reads["grad"],
                            states, **params)


def _engine_step(kind, xp, weight, grad, state, lr, wd, t):
    params = dict(lr=lr, wd=wd, **common(kind))
    if not kind.momentum:  # MXNet's SGD: its multi-tensor operator; NAG: sgd_update
        step = _SGD_STEP if kind.nesterov else _MULTI_SGD_STEP
        return step(xp, weight, {"grad": grad}, {}, params, False)
    step = _nag_step if kind.nesterov else _momentum_step
    return step(xp, weight, {"grad": grad}, state, dict(params, momentum=kind.momentum), True)


# -- every weight of a GPU in one launch ---------------------------------------------------

def source(dtype, *, MOMENTUM: bool, CLIP: bool) -> str:  # noqa: N803 (the C macros' names)
    """The multi-tensor kernel's CUDA C: ``sgd_mom`` (``multi_sgd`` without momentum)
    written as C, which rescales and clips the gradient itself in MXNet's order: the same
    text NumPy runs."""
    rule = sgd_mom(bool(CLIP)) if MOMENTUM else multi_sgd(bool(CLIP))
    pointers = {"weight": "((T*)weights[lo])[j]", "mom": "((T*)buffers[lo])[j]",
                "grad": "((const T*)grads[lo])[j]"}
    step = "        const T lr = lrs[lo];\n        const T wd = wds[lo];\n" + \
        rules.cuda_statements(rule, pointers.get, pointers.get)
    return kernels.with_defines(dtype, dict(MOMENTUM=MOMENTUM, CLIP=CLIP), rules.CUDA_HELPERS
                                + kernels.sgd_head("mixrt_mxnet_sgd_many", MXNET_SCALARS)
                                + kernels.FIND_TENSOR + step + "    }\n}\n")


MXNET_SCALARS = "const T rescale_grad, const T clip_gradient"


def _engine_step_many(kind, xp, weights, grads, states, lrs, wds, counts) -> bool:
    """MXNet's ``sgd_mom_update`` or ``multi_sgd_update`` for every weight at once, each with
    its own lr and wd; the hyper-parameters rounded to C floats as MXNet's operators take
    them."""
    moms = [s["mom"] for s in states] if kind.momentum else None
    many(xp, weights, grads, moms, lrs, wds, momentum=kind.momentum,
         rescale=kind.rescale_grad, clip=kind.clip_gradient)
    return True


def many(xp, weights, grads, moms, lrs, wds, *, momentum: float, rescale: float,
         clip: float | None) -> None:
    """The one launch (``moms`` None: without momentum), also MXNet's SGD class's."""
    dtype = weights[0].dtype
    kernel = kernels.raw_kernel(xp, source(dtype, MOMENTUM=moms is not None,
                                           CLIP=clip is not None), "mixrt_mxnet_sgd_many")
    starts, total = kernels.tensor_starts(xp, weights)
    scalar, f32 = dtype.type, rules.as_mxnet_scalar
    kernel(kernels.grid(total), (kernels.THREADS,), (
        kernels.addresses(xp, weights), kernels.addresses(xp, grads),
        kernels.addresses(xp, moms if moms is not None else weights), starts,
        kernels.value_table(xp, [f32(v) for v in lrs], dtype),
        kernels.value_table(xp, [f32(v) for v in wds], dtype),
        np.int32(len(weights)), np.int64(total), scalar(f32(momentum)), scalar(f32(rescale)),
        scalar(f32(clip or 0))))


# -- the definition ------------------------------------------------------------------------

_PLAIN = (("lr", REQUIRED), ("wd", 0.0), *GRADIENT)
_MOMENTUM = (("lr", REQUIRED), ("momentum", 0.0), ("wd", 0.0), *GRADIENT)

DEFINITION = Definition(
    name="sgd",
    hyper=(Hyper.real("momentum", 0.0, low=0.0), Hyper.flag("nesterov", False)),
    slots=lambda hyper: ("mom",) if hyper["momentum"] else (),
    step=_engine_step,
    step_many=_engine_step_many,
    takes_many=lambda kind: not kind.nesterov,  # MXNet's NAG has no multi-tensor form
    operators=(
        Operator("sgd_update", (), _PLAIN, _SGD_STEP, lazy="flag"),
        Operator("sgd_mom_update", ("mom",), _MOMENTUM, _momentum_step, lazy="flag",
                 multi="multi_sgd_mom_update"),
        Operator("mp_sgd_update", (), _PLAIN, _SGD_STEP, master=True, lazy="flag"),
        Operator("mp_sgd_mom_update", ("mom",), _MOMENTUM, _momentum_step, master=True,
                 lazy="flag", multi="multi_mp_sgd_mom_update"),
        Operator("nag_mom_update", ("mom",), _MOMENTUM, _nag_step),
        Operator("mp_nag_mom_update", ("mom",), _MOMENTUM, _nag_step, master=True),
        # one weight of MXNet's multi_sgd_update (not MXNet's name: its operator takes lists)
        Operator("one_multi_sgd_update", (), _PLAIN, _MULTI_SGD_STEP, lazy="flag",
                 multi="multi_sgd_update"),
        Operator("one_multi_mp_sgd_update", (), _PLAIN, _MULTI_SGD_STEP, master=True,
                 lazy="flag", multi="multi_mp_sgd_update")))
