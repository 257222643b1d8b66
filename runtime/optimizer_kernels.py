"""The optimizers' updates on a GPU as one CuPy launch per parameter.

``runtime/optimizer.py`` writes each update as array expressions, which on the CPU are a few
NumPy passes over memory the cache holds, and on a GPU a launch each: SGD with momentum and
weight decay six per parameter, Adam about a dozen, most of a ResNet-18 step's 11.7 ms outside
its nodes on an H200. Here the same arithmetic, in the same order with the same float32
scalars, is one ``ElementwiseKernel`` per parameter that reads and writes the weight and its
state in place. (The GPU's compiler may contract a product and a sum into one fused
multiply-add, so the GPU's bits may differ from the CPU's in the last place.) LAMB, RMSProp
and AdaGrad keep their array expressions.

Each function returns False, doing nothing, where the arrays are not CuPy's.
"""

from __future__ import annotations

import functools

import numpy as np


def sgd(xp, weight, grad, momentum_buffer, lr: float, wd: float, momentum: float,
        nesterov: bool) -> bool:
    """``SGD._apply``: ``g = grad + wd * w``; with momentum ``buf = momentum * buf + g``,
    ``w -= lr * (g + momentum * buf if nesterov else buf)``, else ``w -= lr * g``."""
    if not _on_gpu(xp):
        return False
    lines = [_decayed_gradient(wd)]
    if momentum_buffer is None:
        lines.append("w = w - lr * d;")
        _kernel(xp, "T g, T lr, T wd", "T w", lines, "mixrt_sgd")(grad, lr, wd, weight)
        return True
    lines.append("buf = momentum * buf + d;")
    lines.append("w = w - lr * (d + momentum * buf);" if nesterov else "w = w - lr * buf;")
    _kernel(xp, "T g, T lr, T wd, T momentum", "T w, T buf", lines, "mixrt_sgd_momentum")(
        grad, lr, wd, momentum, weight, momentum_buffer)
    return True


def adam(xp, weight, grad, mean, var, *, step_size: float, correction: float, beta1: float,
         beta2: float, epsilon: float, wd: float = 0.0, decay: float | None = None) -> bool:
    """``_AdamMoments._adam_step`` after Adam's L2 term (``wd``) or AdamW's decoupled
    shrink (``decay``, the factor ``1 - lr * wd``): the moments, then ``w -= step_size *
    (mean / (sqrt(var) / correction + epsilon))``, ``correction`` being ``sqrt(1 -
    beta2^t)``."""
    if not _on_gpu(xp):
        return False
    lines = ["w = w * decay;"] if decay is not None else []
    lines += [_decayed_gradient(wd),
              "mean = beta1 * mean + keep1 * d;",
              "var = beta2 * var + keep2 * (d * d);",
              "const T denom = sqrt(var) / correction + epsilon;",
              "w = w - step_size * (mean / denom);"]
    kernel = _kernel(xp, "T g, T wd, T decay, T beta1, T keep1, T beta2, T keep2, "
                         "T correction, T epsilon, T step_size", "T w, T mean, T var", lines,
                     "mixrt_adam")
    kernel(grad, wd, 1.0 if decay is None else decay, beta1, 1 - beta1, beta2, 1 - beta2,
           correction, epsilon, step_size, weight, mean, var)
    return True


def _decayed_gradient(wd: float) -> str:
    # without weight decay the gradient is taken as it is, as _with_l2 does (0 * inf is NaN)
    return "const T d = g + wd * w;" if wd else "const T d = g;"


def _on_gpu(xp) -> bool:
    return xp is not np and hasattr(xp, "ElementwiseKernel")


def _kernel(xp, inputs: str, outputs: str, lines: list[str], name: str):
    return _compiled(xp, inputs, outputs, "\n".join(lines), name)


@functools.lru_cache(maxsize=64)
def _compiled(xp, inputs: str, outputs: str, body: str, name: str):
    """One kernel per body (a handful: each optimizer's flags pick one), compiled by CuPy
    on its first launch and kept."""
    return xp.ElementwiseKernel(inputs, outputs, body, name)
