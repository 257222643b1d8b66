"""The engine's ``sgd`` (torch.optim.SGD's rule, dampening 0): the kind, and its update on a
GPU as one CuPy launch a weight (``one_launch``) or every weight of a step at once
(``many``), the same arithmetic in the same order, compiled without fused multiply-adds so
the GPU's bits are the CPU's. MXNet's SGD, whose buffer keeps ``-lr``, is ``sgd.py``."""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import OptimizerError
from mixrt.runtime.training import optimizer_kernels as kernels
from mixrt.runtime.training.lr_scheduler import real_param
from mixrt.runtime.training.optimizer_base import Optimizer, _flag, with_l2


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
        many(xp, weights, grads, buffers, lrs, wds,
                                   momentum=self.momentum, nesterov=self.nesterov,
                                   rescale=self.rescale_grad, clip=self.clip_gradient)
        return True

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        if one_launch(xp, weight, grad, state.get("momentum"), lr, wd,
                                 self.momentum, self.nesterov):
            return  # on a GPU: one launch
        g = with_l2(grad, weight, wd)
        if not self.momentum:
            weight -= lr * g
            return
        buf = state["momentum"]
        buf *= self.momentum
        buf += g
        weight -= lr * (g + self.momentum * buf if self.nesterov else buf)


# -- on a GPU --------------------------------------------------------------------------------

def one_launch(xp, weight, grad, momentum_buffer, lr: float, wd: float, momentum: float,
               nesterov: bool) -> bool:
    """``SGD._apply``: ``g = grad + wd * w``; with momentum ``buf = momentum * buf + g``,
    ``w -= lr * (g + momentum * buf if nesterov else buf)``, else ``w -= lr * g``."""
    if not kernels.on_gpu(xp):
        return False
    lines = [kernels.decayed_gradient(wd)]
    if momentum_buffer is None:
        lines.append("w = w - lr * d;")
        kernels.elementwise(xp, "T g, T lr, T wd", "T w", lines, "mixrt_sgd")(grad, lr, wd, weight)
        return True
    lines.append("buf = momentum * buf + d;")
    lines.append("w = w - lr * (d + momentum * buf);" if nesterov else "w = w - lr * buf;")
    kernel = kernels.elementwise(xp, "T g, T lr, T wd, T momentum", "T w, T buf", lines,
                                 "mixrt_sgd_momentum")
    kernel(grad, lr, wd, momentum, weight, momentum_buffer)
    return True


SGD_SOURCE = kernels.sgd_source("mixrt_sgd_many", """\
        const T wd = wds[lo];
        const T d = wd != 0 ? g + wd * w[j] : g;
#if MOMENTUM
        T* buf = (T*)buffers[lo];
        const T b = momentum * buf[j] + d;
        buf[j] = b;
#if NESTEROV
        w[j] = w[j] - lrs[lo] * (d + momentum * b);
#else
        w[j] = w[j] - lrs[lo] * b;
#endif
#else
        w[j] = w[j] - lrs[lo] * d;
#endif
""")


def source(dtype, **flags) -> str:
    """The multi-tensor kernel's CUDA C for ``dtype``, ``flags`` compiled in (MOMENTUM,
    NESTEROV, CLIP)."""
    return kernels.with_defines(dtype, flags, SGD_SOURCE % {"locate": kernels.LOCATE})


def many(xp, weights, grads, buffers, lrs, wds, *, momentum: float, nesterov: bool,
         rescale: float, clip: float | None) -> None:
    """``one_launch`` for every weight at once (``buffers`` None without momentum), each with its
    own lr and wd, after the gradient's rescale and clip."""
    dtype = weights[0].dtype
    flags = dict(MOMENTUM=momentum != 0, NESTEROV=nesterov, CLIP=clip is not None)
    kernel = kernels.raw_kernel(xp, source(dtype, **flags), "mixrt_sgd_many")
    tables = [kernels.addresses(xp, weights), kernels.addresses(xp, grads),
              kernels.addresses(xp, buffers if buffers is not None else weights)]
    starts, total = kernels.tensor_starts(xp, weights)
    scalar = dtype.type
    kernel(kernels.grid(total), (kernels.THREADS,), (
        *tables, starts, kernels.value_table(xp, lrs, dtype),
        kernels.value_table(xp, wds, dtype), np.int32(len(weights)), np.int64(total),
        scalar(momentum), scalar(rescale), scalar(clip or 0)))


KINDS = (SGD,)
