"""The engine's ``adam`` and ``adamw`` (torch.optim.Adam's and AdamW's rules, no amsgrad): the
moments they share with LAMB (``torch_lamb.py``), the two kinds, and their update on a GPU
as one CuPy launch a weight (``one_launch``) or every weight of a step at once (``many``),
the same arithmetic in the same order, compiled without fused multiply-adds. MXNet's Adam,
whose rate folds the bias corrections, is ``adam.py``."""

from __future__ import annotations

import numpy as np

from mixrt.runtime.training import optimizer_kernels as kernels
from mixrt.runtime.training.lr_scheduler import real_param
from mixrt.runtime.training.optimizer_base import Optimizer, with_l2


class AdamMoments(Optimizer):
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
        many(
            xp, weights, grads, [s["mean"] for s in states], [s["var"] for s in states],
            [c[0] for c in corrections], [c[1] for c in corrections], wds,
            decoupled=decoupled, beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
            rescale=self.rescale_grad, clip=self.clip_gradient)
        return True

    def _fused_adam_step(self, xp, weight, grad, state, lr, t, *, wd=0.0,
                         decay=None) -> bool:
        """:meth:`_adam_step` (after Adam's L2 term or AdamW's shrink) as one launch on a
        GPU (``one_launch`` below); False, nothing done, elsewhere."""
        step_size, correction = self._bias_corrections(lr, t)
        return one_launch(
            xp, weight, grad, state["mean"], state["var"], step_size=step_size,
            correction=correction, beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
            wd=wd, decay=decay)


class Adam(AdamMoments):
    """Adam (Kingma & Ba, 2015), as torch.optim.Adam (no amsgrad). Weight decay is L2,
    added to the gradient before the moments: ``g = grad + wd * w``. For decoupled weight
    decay use ``adamw``."""

    name = "adam"

    def _apply_many(self, xp, weights, grads, states, lrs, wds, counts) -> bool:
        return self._adam_many(xp, weights, grads, states, lrs, wds, counts, decoupled=False)

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        if not self._fused_adam_step(xp, weight, grad, state, lr, t, wd=wd):
            self._adam_step(xp, weight, with_l2(grad, weight, wd), state, lr, t)


class AdamW(AdamMoments):
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


# -- on a GPU --------------------------------------------------------------------------------

def one_launch(xp, weight, grad, mean, var, *, step_size: float, correction: float,
               beta1: float, beta2: float, epsilon: float, wd: float = 0.0,
               decay: float | None = None) -> bool:
    """``AdamMoments._adam_step`` after Adam's L2 term (``wd``) or AdamW's decoupled
    shrink (``decay``, the factor ``1 - lr * wd``): the moments, then ``w -= step_size *
    (mean / (sqrt(var) / correction + epsilon))``, ``correction`` being ``sqrt(1 -
    beta2^t)``."""
    if not kernels.on_gpu(xp):
        return False
    lines = ["w = w * decay;"] if decay is not None else []
    lines += [kernels.decayed_gradient(wd),
              "mean = beta1 * mean + keep1 * d;",
              "var = beta2 * var + keep2 * (d * d);",
              "const T denom = sqrt(var) / correction + epsilon;",
              "w = w - step_size * (mean / denom);"]
    kernel = kernels.elementwise(
        xp, "T g, T wd, T decay, T beta1, T keep1, T beta2, T keep2, T correction, "
            "T epsilon, T step_size", "T w, T mean, T var", lines, "mixrt_adam")
    kernel(grad, wd, 1.0 if decay is None else decay, beta1, 1 - beta1, beta2, 1 - beta2,
           correction, epsilon, step_size, weight, mean, var)
    return True


ADAM_SOURCE = """
extern "C" __global__ void mixrt_adam_many(
        const long long* weights, const long long* grads, const long long* means,
        const long long* vars, const long long* starts, const T* step_sizes,
        const T* corrections, const T* wds, const int tensors, const long long total,
        const T beta1, const T keep1, const T beta2, const T keep2, const T epsilon,
        const T rescale, const T clip) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
%(locate)s
        const T wd = wds[lo];
#if DECOUPLED
        T weight = wd != 0 ? w[j] * wd : w[j];
        const T d = g;
#else
        T weight = w[j];
        const T d = wd != 0 ? g + wd * weight : g;
#endif
        T* mean = (T*)means[lo];
        T* var = (T*)vars[lo];
        const T m = beta1 * mean[j] + keep1 * d;
        const T v = beta2 * var[j] + keep2 * (d * d);
        mean[j] = m;
        var[j] = v;
        const T denom = sqrt(v) / corrections[lo] + epsilon;
        w[j] = weight - step_sizes[lo] * (m / denom);
    }
}
"""


def source(dtype, **flags) -> str:
    """The multi-tensor kernel's CUDA C for ``dtype``, ``flags`` compiled in (DECOUPLED
    for AdamW, CLIP)."""
    return kernels.with_defines(dtype, flags, ADAM_SOURCE % {"locate": kernels.LOCATE})


def many(xp, weights, grads, means, variances, step_sizes, corrections, wds, *,
         decoupled: bool, beta1: float, beta2: float, epsilon: float, rescale: float,
         clip: float | None) -> None:
    """``one_launch`` for every weight at once; ``wds`` are Adam's L2 coefficients or, with
    ``decoupled`` (AdamW), each weight's shrink factor 1 - lr * wd (0: none). 1 - beta1
    and 1 - beta2 are worked out here, in double, as the one-weight kernel's are."""
    dtype = weights[0].dtype
    flags = dict(DECOUPLED=decoupled, CLIP=clip is not None)
    kernel = kernels.raw_kernel(xp, source(dtype, **flags), "mixrt_adam_many")
    starts, total = kernels.tensor_starts(xp, weights)
    scalar = dtype.type
    kernel(kernels.grid(total), (kernels.THREADS,), (
        kernels.addresses(xp, weights), kernels.addresses(xp, grads),
        kernels.addresses(xp, means), kernels.addresses(xp, variances), starts,
        kernels.value_table(xp, step_sizes, dtype), kernels.value_table(xp, corrections, dtype),
        kernels.value_table(xp, wds, dtype),
        np.int32(len(weights)), np.int64(total), scalar(beta1), scalar(1 - beta1),
        scalar(beta2), scalar(1 - beta2), scalar(epsilon), scalar(rescale), scalar(clip or 0)))


KINDS = (Adam, AdamW)
