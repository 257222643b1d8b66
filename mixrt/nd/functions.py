"""The NDArray operations that are not registered ops: indexing and device copies, written
as autograd Functions so that gradients flow through them."""

from __future__ import annotations

import numpy as np

from mixrt.autograd import Function
from mixrt.nd.dispatch import _common_context
from mixrt.nd.ndarray import NDArray
from mixrt.ops.device import add_at


class Index(Function):
    """``x[key]``: NumPy indexing forward; backward adds the gradient into zeros at ``key``
    (``add.at``, so an index that repeats gets every contribution)."""

    def __init__(self, key):
        super().__init__()
        self.key = key

    def forward(self, x: NDArray) -> NDArray:
        self.source = (x.shape, x.dtype, x.ctx)
        picked = x._read()[self.key]
        xp = x.ctx.xp
        return NDArray(picked.copy() if isinstance(picked, xp.ndarray) else xp.asarray(picked),
                       x.ctx)

    def backward(self, dy: NDArray) -> NDArray:
        shape, dtype, _ = self.source
        return IndexAdd(self.key, shape, dtype)(dy)  # a Function, so create_graph sees it


class IndexAdd(Function):
    """Index's backward: ``dy`` added into zeros at ``key``. Its own backward reads
    ``key`` again, so gradients of gradients through indexing flow (autograd's
    create_graph records this Function like any other)."""

    def __init__(self, key, shape: tuple, dtype):
        super().__init__()
        self.key, self.shape, self.dtype = key, shape, dtype

    def forward(self, dy: NDArray) -> NDArray:
        xp = dy.ctx.xp
        dx = xp.zeros(self.shape, dtype=self.dtype)
        add_at(xp, dx, self.key, dy._read())
        return NDArray(dx, dy.ctx)

    def backward(self, ddx: NDArray) -> NDArray:
        return Index(self.key)(ddx)


class CopyToDevice(Function):
    """The one way across devices; the gradient comes back to the source device."""

    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx

    def forward(self, x: NDArray) -> NDArray:
        self.source = x.ctx
        return _copied_to(x, self.ctx)

    def backward(self, dy: NDArray) -> NDArray:
        return _copied_to(dy, self.source)


def _copied_to(x: NDArray, ctx) -> NDArray:
    """A copy of ``x`` on ``ctx``, made there (``put`` leaves an array already there as it
    is, and a GPU copy goes to the current GPU)."""
    with ctx.device.active():
        return NDArray(ctx.device.put(x._read()).copy(), ctx)


class FloorMod(Function):
    """``a % b`` of float arrays as MXNet (and Python) compute it: the result takes the sign
    of ``b`` (``-1 % 2 == 1``; ``x % 0 == 0``, as MXNet). ONNX's ``Mod`` on floats is C's
    ``fmod`` (the sign of ``a``) and has no gradient; this one has MXNet's: ``1`` for ``a``,
    ``-floor(a / b)`` for ``b``. Either side may be a Python number (no gradient)."""

    def forward(self, a, b):
        like = a if isinstance(a, NDArray) else b
        ctx = _common_context("Mod", [a, b])  # DeviceMismatchError for two devices
        xp = ctx.xp
        self.shapes = [v.shape if isinstance(v, NDArray) else None for v in (a, b)]
        ra, rb = (v._read() if isinstance(v, NDArray) else xp.asarray(v, dtype=like.dtype)
                  for v in (a, b))
        self.saved = (ra, rb, ctx)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = xp.mod(ra, rb)
            out = xp.where(rb == 0, xp.zeros((), dtype=out.dtype), out)
        return NDArray(out, ctx)

    def backward(self, dy: NDArray):
        ra, rb, ctx = self.saved
        xp, g = ctx.xp, dy._read()
        with np.errstate(divide="ignore", invalid="ignore"):
            quotient = xp.where(rb == 0, xp.zeros((), dtype=g.dtype), xp.floor(ra / rb))
        grads = (g, -g * quotient)
        return tuple(None if shape is None else
                     NDArray(_sum_to(xp, grad, shape).astype(raw.dtype), ctx)
                     for grad, shape, raw in zip(grads, self.shapes, (ra, rb)))


def _sum_to(xp, grad, shape):
    """``grad`` summed over the axes broadcasting added to ``shape``."""
    grad = xp.asarray(grad)
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return xp.broadcast_to(grad, shape)
