"""The CPU fast path of MaxPoolGrad for 2-D pools: the generic kernel's rule (each window's dY
goes to its first maximal element in row-major tap order), computed a few planes at a time
in cache, with every tap read at unit stride.

A strided pool's taps are strided slices of the padded input, and NumPy runs strided
operands several times slower than contiguous ones. So the padded input is first split into
``stride_y * stride_x`` phase planes (phase (ry, rx) holds the padded pixels (i*sy + ry,
j*sx + rx)): tap (a, b) of every window is then a contiguous-row block of one phase plane.
The winning tap of each window is tracked as a uint8 (a later tap wins only when strictly
larger, so ``winner = max(winner, t * better)``), the gradient is scattered into phase planes
the same way round, and the phases are interleaved back into dX.

With numba the same steps run a plane at a time in one compiled call
(``_jit_max_pool_grad.max_pool_grad``), each a vectorized pass in cache; the NumPy form above,
~70 calls a chunk, remains where numba is not installed or ``MIXRT_JIT=0``.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.pool import pool
from mixrt.ops.compiled.workspace import typed_scratch
from mixrt.ops.conv.conv_grad import max_pool_grad
from mixrt.ops.compiled.parallel import parallel_rows

NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
# bytes of input planes per chunk: each chunk costs ~70 NumPy calls whatever its size (calls
# that hold the GIL the other thread waits for), so chunks must be big enough to amortize
# them, and small enough to stay in L2/L3: on ResNet's 64x112x112 batch 1 MiB took 47 ms,
# 2 MiB 42 ms, 4 MiB 44 ms
CHUNK_BYTES = 1 << 21


@max_pool_grad.fast("cpu")
def max_pool_grad_cpu(xp, dY, X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None,
                      kernel_shape=None, pads=None, strides=None, out=None):
    attributes = dict(auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                      kernel_shape=kernel_shape, pads=pads, strides=strides)
    windows = pool._windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    if not _suits(dY, X, out, windows):
        result = max_pool_grad(xp, dY, X, **attributes)
        if out is None:
            return result
        np.copyto(out, result)
        return out
    dx = np.empty_like(X) if out is None else out
    planes = (X.reshape((-1,) + X.shape[2:]), dY.reshape((-1,) + dY.shape[2:]),
              dx.reshape((-1,) + X.shape[2:]))
    if jit_cpu.enabled():
        _compiled_backward(windows, X.dtype, *planes)
        return dx
    _PhasedPool(windows, X.shape[2:], X.dtype).backward(*planes)
    return dx


def _compiled_backward(windows, dtype, x, dy, dx):
    """``_jit_max_pool_grad.max_pool_grad`` over the planes, a share per thread: the phased form
    below, a plane at a time in one compiled call, where NumPy made ~70 calls a chunk
    (ResNet's 3x3 stride-2 pool over 64 x 112 x 112 at batch 32, 2 threads: 23-24 against
    57-70 ms)."""
    kernels = jit_cpu.load("mixrt.ops.pool._jit_max_pool_grad")
    layout = _PhasedPool(windows, x.shape[1:], dtype)
    (oh, ow), (ph, pw) = layout.out, layout.plane
    shape = (*x.shape[1:], oh, ow, ph, pw)
    phased = math.prod(layout.strides) * ph * pw
    flat = [a.reshape(-1) for a in (x, dy, dx)]

    def part(p0, p1):
        planes, grads = (jit_cpu.scratch_array(name, dtype, phased)
                         for name in ("max_pool_grad_planes", "max_pool_grad_grads"))
        best = jit_cpu.scratch_array("max_pool_grad_best", dtype, oh * pw)
        winner = jit_cpu.scratch_array("max_pool_grad_winner", dtype, oh * pw)
        kernels.max_pool_grad(*flat, p0, p1, shape, tuple(windows.kernel), layout.strides,
                              tuple(windows.dilations), windows.begin[0], windows.begin[1],
                              dtype.type(pool._lowest(dtype)), planes, grads, best, winner)
    parallel_rows(x.shape[0], math.prod(x.shape[1:]), part)


def _suits(dY, X, out, windows) -> bool:
    arrays = (dY, X) if out is None else (dY, X, out)
    return (all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)
            and X.ndim == 4 and X.dtype in NATIVE and dY.dtype == X.dtype
            and (out is None or out.dtype == X.dtype and out.shape == X.shape
                 and not any(np.may_share_memory(out, a) for a in (dY, X)))
            and math.prod(windows.kernel) < 256 and 0 not in X.shape and 0 not in dY.shape)


class _PhasedPool:
    """A 2-D pool's windows laid over the phase planes of its padded input."""

    def __init__(self, windows, in_dims, dtype):
        self.windows, self.in_dims, self.dtype = windows, tuple(in_dims), np.dtype(dtype)
        self.strides = tuple(windows.strides)
        padded = [i + b + e + x for i, b, e, x in zip(in_dims, windows.begin, windows.end,
                                                      windows.extra)]
        self.plane = tuple(-(-p // s) for p, s in zip(padded, self.strides))
        self.out = tuple(windows.out)
        self.taps = [self._tap(a, b) for a in range(windows.kernel[0])
                     for b in range(windows.kernel[1])]
        self.phases = [self._phase(ry, rx) for ry in range(self.strides[0])
                       for rx in range(self.strides[1])]

    def _tap(self, a, b):
        """(phase y, phase x, rows, columns) of tap (a, b) of every window."""
        (dy, dx), (sy, sx), (oh, ow) = self.windows.dilations, self.strides, self.out
        (qy, ry), (qx, rx) = divmod(a * dy, sy), divmod(b * dx, sx)
        return ry, rx, slice(qy, qy + oh), slice(qx, qx + ow)

    def _phase(self, ry, rx):
        """Where phase (ry, rx) meets the input: (rows, columns) of the phase plane and of X,
        or None when it holds padding only."""
        spans = [self._span(r, s, b, i) for r, s, b, i in
                 zip((ry, rx), self.strides, self.windows.begin, self.in_dims)]
        if None in spans:
            return None
        (plane_rows, x_rows), (plane_cols, x_cols) = spans
        return ry, rx, (plane_rows, plane_cols), (x_rows, x_cols)

    @staticmethod
    def _span(phase, stride, begin, size):
        first = -(-(begin - phase) // stride)  # first plane index inside the input
        last = (begin + size - 1 - phase) // stride
        if last < first:
            return None
        start = first * stride + phase - begin
        count = last - first + 1
        return slice(first, first + count), slice(start, start + (count - 1) * stride + 1,
                                                  stride)

    def backward(self, x, dy, dx):
        """dx (P, H, W) of planes x (P, H, W) given dy (P, oh, ow)."""
        planes = x.shape[0]
        plane_bytes = math.prod(self.in_dims) * self.dtype.itemsize
        step = max(1, min(planes, CHUNK_BYTES // plane_bytes))
        chunks = -(-planes // step)

        def part(first, last):
            for start in range(first * step, min(last * step, planes), step):
                stop = min(start + step, planes)
                self._chunk(x[start:stop], dy[start:stop], dx[start:stop])
        parallel_rows(chunks, step * math.prod(self.in_dims), part)

    def _chunk(self, x, dy, dx):
        count = x.shape[0]
        phased = (self.strides[0], self.strides[1], count) + self.plane
        outs = (count,) + self.out
        image, grad, best, share, winner, better = typed_scratch(
            (self.dtype, phased), (self.dtype, phased), (self.dtype, outs),
            (self.dtype, outs), (np.uint8, outs), (np.bool_, outs))
        self._split(x, image)
        self._winners(image, best, winner, better)
        grad.fill(0)
        for tap, (ry, rx, rows, cols) in enumerate(self.taps):
            np.equal(winner, tap, out=better)
            np.multiply(dy, better, out=share)
            target = grad[ry, rx][:, rows, cols]
            target += share
        for phase in self.phases:
            if phase is not None:
                ry, rx, (plane_rows, plane_cols), (x_rows, x_cols) = phase
                np.copyto(dx[:, x_rows, x_cols], grad[ry, rx][:, plane_rows, plane_cols])

    def _split(self, x, image):
        """The padded planes ``x`` into phase planes (padding at the lowest value)."""
        image.fill(pool._lowest(self.dtype))
        for phase in self.phases:
            if phase is not None:
                ry, rx, (plane_rows, plane_cols), (x_rows, x_cols) = phase
                np.copyto(image[ry, rx][:, plane_rows, plane_cols], x[:, x_rows, x_cols])

    def _winners(self, image, best, winner, better):
        """The first maximal tap of each window (a later tap wins only when larger)."""
        flags = better.view(np.uint8)
        for tap, (ry, rx, rows, cols) in enumerate(self.taps):
            seen = image[ry, rx][:, rows, cols]
            if tap == 0:
                np.copyto(best, seen)
                winner.fill(0)
                continue
            np.greater(seen, best, out=better)
            np.maximum(best, seen, out=best)
            np.multiply(flags, tap, out=flags)
            np.maximum(winner, flags, out=winner)
