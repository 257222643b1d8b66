"""Gradients of the activations (activation.py). Most are written from the forward's output
(Relu, Sigmoid, Tanh), so the backward pass keeps one tensor alive per activation, not two.
See runtime/passes/autodiff.py for the calling convention."""

from __future__ import annotations

import functools

import numpy as np

from mixrt.ops.elementwise import activation as act
from mixrt.ops.compiled.workspace import scratch_arrays
from mixrt.ops.training.grad_support import MIXRT
from mixrt.ops.elementwise.row_blocks import same_view
from mixrt.ops.compiled.parallel import parallel_rows
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType


@op("ReluGrad", since=1, domain=MIXRT)
def relu_grad(xp, dY, Y):
    """dX of Relu from its output: dY where the output is positive, else 0."""
    return xp.where(Y > 0, dY, xp.zeros((), dtype=dY.dtype))


# elements per chunk of the CPU path (its int mask stays in L2 between the passes). Chunks go
# to the intra-op threads, and each costs 3 NumPy calls that hold the GIL: at 16K elements
# the two threads ran slower than one (14.6 -> 25.2 ms on a 25.7M-element ReluGrad), at
# 256K they ran in 6.2 ms
_CHUNK = 1 << 18
_BITS = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}


@relu_grad.fast("cpu")
def relu_grad_cpu(xp, dY, Y, *, out=None):
    """``where(Y > 0, dY, 0)`` as a bitwise AND of dY with an all-ones-or-zeros mask: exactly
    the generic kernel's values (an inf or NaN in dY still gives 0 where Y <= 0, which a
    multiply by the mask would not), at a tenth of ``where``'s cost, which has no SIMD loop.
    Chunks of the flat arrays go to the intra-op threads."""
    if not _bitwise_suits(dY, Y, out):
        result = relu_grad(xp, dY, Y)
        if out is None:
            return result
        np.copyto(out, result)
        return out
    out = np.empty_like(dY) if out is None else out
    bits = _BITS[dY.dtype]
    grads, outputs, values = (a.reshape(-1) for a in (dY.view(bits), out.view(bits), Y))

    def part(start, stop):
        mask = scratch_arrays(bits, (_CHUNK,))[0]
        for begin in range(start * _CHUNK, min(stop * _CHUNK, values.size), _CHUNK):
            end = min(begin + _CHUNK, values.size)
            chunk = mask[:end - begin]
            np.greater(values[begin:end], 0, out=chunk)  # 1 or 0
            np.negative(chunk, out=chunk)  # all ones or 0
            np.bitwise_and(grads[begin:end], chunk, out=outputs[begin:end])
    parallel_rows(-(-values.size // _CHUNK), _CHUNK, part)
    return out


# On a GPU, one kernel: ``where(Y > 0, dY, 0)`` launched two there (the comparison's mask,
# then ``where``), 34 of a ResNet-18 training step's kernels and 0.8 ms on an H100. A select,
# not a product with the mask, so an inf or NaN in dY still gives 0 where Y <= 0.
SELECT_PREAMBLE = "template <typename T> __device__ T mx_select(bool c, T a, T b) { return c ? a : b; }"
RELU_GRAD_GPU = ("T dy, T y", "T dx", "dx = mx_select(y > (T)0, dy, (T)0);")


@relu_grad.fast("gpu")
def relu_grad_gpu(xp, dY, Y, *, out=None):
    """``relu_grad`` as one ElementwiseKernel, into ``out`` when given; other dtypes or
    shapes than one of both as the generic kernel computes them."""
    if dY.dtype != Y.dtype or dY.shape != Y.shape or (out is not None and out.shape != dY.shape):
        result = relu_grad(xp, dY, Y)
        if out is None:
            return result
        out[...] = result
        return out
    kernel = _relu_grad_kernel(xp.ElementwiseKernel)
    return kernel(dY, Y) if out is None else kernel(dY, Y, out)


@functools.lru_cache(maxsize=None)
def _relu_grad_kernel(make):
    inputs, outputs, body = RELU_GRAD_GPU
    return make(inputs, outputs, body, "mixrt_relu_grad", preamble=SELECT_PREAMBLE)


def _bitwise_suits(dY, Y, out) -> bool:
    arrays = (dY, Y) if out is None else (dY, Y, out)
    if not (all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)
            and dY.dtype in _BITS and all(a.dtype == dY.dtype and a.shape == dY.shape
                                          for a in arrays)):
        return False
    return out is None or not np.may_share_memory(out, Y) and (
        not np.may_share_memory(out, dY) or same_view(out, dY))


@relu_grad.infer
def _(dY: TensorType, Y: TensorType, **_):
    return [TensorType(dY.dtype, dY.shape)]


@act.relu.grad
def _(b, node, dy):
    return [b.emit("ReluGrad", dy[0], node.outputs[0], domain=MIXRT)]


@relu_grad.grad
def _(b, node, dy):
    # linear in dY with the same mask (what a gradient of a gradient needs); the mask's
    # derivative in Y is zero wherever it is defined
    return [b.emit("ReluGrad", dy[0], node.inputs[1], domain=MIXRT), None]


@act.sigmoid.grad
def _(b, node, dy):
    """d sigmoid = y (1 - y) dx."""
    y = node.outputs[0]
    one_minus = b.emit("Sub", b.constant(1.0, like=y), y)
    return [b.mul(dy[0], b.mul(y, one_minus))]


@act.tanh.grad
def _(b, node, dy):
    """d tanh = (1 - y^2) dx."""
    y = node.outputs[0]
    return [b.mul(dy[0], b.emit("Sub", b.constant(1.0, like=y), b.mul(y, y)))]
