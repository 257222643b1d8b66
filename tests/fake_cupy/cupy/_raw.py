"""RawKernel on the fake: CUDA C it cannot compile is refused, except mixrt's multi-tensor
optimizer kernels (runtime/training/optimizers/: torch_sgd, torch_adam, sgd), which the fake runs as NumPy
written here from the update rules (torch.optim's SGD and Adam/AdamW; MXNet's SGD from
its rule text itself, runtime/training/optimizers/sgd.py), reading the weights, gradients and
states at the addresses in the kernel's tables (host memory, on the fake). So the tables,
the per-tensor scalars and the arguments' order are checked; the CUDA C is compiled by
NVRTC in tests/test_optimizer.py, run for the host by tests/test_optimizer_parity.py
(built as C++), and run as CUDA only on a GPU."""

from __future__ import annotations

import ctypes
import re

import numpy as _np

from cupy._core import ndarray, unwrap
from mixrt.runtime.training import update_rules
from mixrt.runtime.training.optimizers import sgd as mxnet_sgd

launches: dict = {}  # kernel name -> launches so far (tests count them)


class RawKernel:
    def __new__(cls, code, name, options=(), backend="nvrtc", **kwargs):
        emulated = _EMULATIONS.get(name)
        if emulated is None:
            raise NotImplementedError("fake CuPy cannot compile CUDA C")
        flags = {key: int(value) for key, value in
                 re.findall(r"^#define (\w+) (\d+)$", code, re.MULTILINE)}
        return _Emulated(name, emulated, flags)


class _Emulated:
    def __init__(self, name, run, flags):
        self.name, self._run, self._flags = name, run, flags

    def __call__(self, grid, block, args, **options):
        if not all(isinstance(a, (ndarray, _np.generic)) for a in args):
            raise TypeError(f"{self.name}: arguments are device arrays and NumPy scalars")
        launches[self.name] = launches.get(self.name, 0) + 1
        self._run(self._flags, *(unwrap(a) if isinstance(a, ndarray) else a for a in args))


def _tensors(starts, total):
    ends = list(starts[1:]) + [total]
    return [int(e - s) for s, e in zip(starts, ends)]


def _at(address, count, dtype):
    """The ``count`` values of ``dtype`` at ``address``, writable in place."""
    dtype = _np.dtype(dtype)
    memory = (ctypes.c_byte * (count * dtype.itemsize)).from_address(int(address))
    return _np.frombuffer(memory, dtype=dtype)


def _gradient(flags, address, count, dtype, rescale, clip):
    g = _at(address, count, dtype) * rescale
    return _np.clip(g, -clip, clip) if flags["CLIP"] else g


def _sgd(flags, weights, grads, buffers, starts, lrs, wds, tensors, total, momentum, rescale,
         clip):
    dtype = lrs.dtype
    for k, count in enumerate(_tensors(starts[:tensors], total)):
        w = _at(weights[k], count, dtype)
        g = _gradient(flags, grads[k], count, dtype, rescale, clip)
        d = g + wds[k] * w if wds[k] else g
        if not flags["MOMENTUM"]:
            w[...] = w - lrs[k] * d
            continue
        buf = _at(buffers[k], count, dtype)
        buf[...] = momentum * buf + d
        w[...] = w - lrs[k] * (d + momentum * buf if flags["NESTEROV"] else buf)


def _mxnet_sgd(flags, weights, grads, moms, starts, lrs, wds, tensors, total, momentum,
               rescale, clip):
    """MXNet's rule, as the kernel's source is written from it: runtime/training/update_rules.py's
    ``sgd_mom`` (``multi_sgd`` without momentum), which rescales and clips the gradient
    itself."""
    dtype = lrs.dtype
    clipped = bool(flags["CLIP"])
    rule = mxnet_sgd.sgd_mom(clipped) if flags["MOMENTUM"] else mxnet_sgd.multi_sgd(clipped)
    for k, count in enumerate(_tensors(starts[:tensors], total)):
        arrays = {"weight": _at(weights[k], count, dtype)}
        if flags["MOMENTUM"]:
            arrays["mom"] = _at(moms[k], count, dtype)
        update_rules.run(rule, _np, dtype, arrays, {"grad": _at(grads[k], count, dtype)},
                         dict(lr=lrs[k], wd=wds[k], momentum=momentum, rescale_grad=rescale,
                              clip_gradient=clip))


def _adam(flags, weights, grads, means, variances, starts, step_sizes, corrections, wds,
          tensors, total, beta1, keep1, beta2, keep2, epsilon, rescale, clip):
    dtype = step_sizes.dtype
    for k, count in enumerate(_tensors(starts[:tensors], total)):
        w = _at(weights[k], count, dtype)
        g = _gradient(flags, grads[k], count, dtype, rescale, clip)
        if flags["DECOUPLED"]:
            if wds[k]:
                w *= wds[k]
            d = g
        else:
            d = g + wds[k] * w if wds[k] else g
        mean, var = _at(means[k], count, dtype), _at(variances[k], count, dtype)
        mean[...] = beta1 * mean + keep1 * d
        var[...] = beta2 * var + keep2 * (d * d)
        w[...] = w - step_sizes[k] * (mean / (_np.sqrt(var) / corrections[k] + epsilon))


_EMULATIONS = {"mixrt_sgd_many": _sgd, "mixrt_mxnet_sgd_many": _mxnet_sgd,
               "mixrt_adam_many": _adam}
