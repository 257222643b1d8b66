"""The NDArray operations that are not registered ops: indexing, device copies and MXNet's
``%``, written as autograd Functions so that gradients flow through them.

They make their results with ``type(x)(data, ctx)`` (the NDArray class of their input), so
this module does not import ``ndarray.py``, which imports it.
"""

from __future__ import annotations

import numpy as np

from mixrt import dispatch, tape
from mixrt.ops.device import add_at


def _is_array(value) -> bool:
    return hasattr(value, "_read") and hasattr(value, "ctx")


class Index(tape.Function):
    """``x[key]``: NumPy indexing forward (``view``, when given, is the result already cut
    from ``x``'s memory: MXNet's basic indexing shares it); backward adds the gradient into
    zeros at ``key`` (``add.at``, so an index that repeats gets every contribution)."""

    def __init__(self, key, view=None):
        super().__init__()
        self.key = key
        self.view = view

    def forward(self, x):
        self.source = (x.shape, x.dtype, x.ctx)
        if self.view is not None:
            return type(x)(self.view, x.ctx)
        picked = x._read()[self.key]
        xp = x.ctx.xp
        return type(x)(picked.copy() if isinstance(picked, xp.ndarray) else xp.asarray(picked),
                       x.ctx)

    def backward(self, dy):
        shape, dtype, _ = self.source
        return IndexAdd(self.key, shape, dtype)(dy)  # a Function, so create_graph sees it


class IndexAdd(tape.Function):
    """Index's backward: ``dy`` added into zeros at ``key``. Its own backward reads
    ``key`` again, so gradients of gradients through indexing flow (autograd's
    create_graph records this Function like any other)."""

    def __init__(self, key, shape: tuple, dtype):
        super().__init__()
        self.key, self.shape, self.dtype = key, shape, dtype

    def forward(self, dy):
        xp = dy.ctx.xp
        dx = xp.zeros(self.shape, dtype=self.dtype)
        add_at(xp, dx, self.key, dy._read())
        return type(dy)(dx, dy.ctx)

    def backward(self, ddx):
        return Index(self.key)(ddx)


class CopyToDevice(tape.Function):
    """The one way across devices; the gradient comes back to the source device."""

    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx

    def forward(self, x):
        self.source = x.ctx
        return copied_to(x, self.ctx)

    def backward(self, dy):
        return copied_to(dy, self.source)


def copied_to(x, ctx):
    """A copy of ``x`` on ``ctx``, made there (``put`` leaves an array already there as it
    is, and a GPU copy goes to the current GPU)."""
    with ctx.device.active():
        return type(x)(ctx.device.put(x._read()).copy(), ctx)


class FloorMod(tape.Function):
    """``a % b`` of float arrays as MXNet (and Python) compute it: the result takes the sign
    of ``b`` (``-1 % 2 == 1``; ``x % 0 == 0``, as MXNet). ONNX's ``Mod`` on floats is C's
    ``fmod`` (the sign of ``a``) and has no gradient; this one has MXNet's: ``1`` for ``a``,
    ``-floor(a / b)`` for ``b``. Either side may be a Python number (no gradient)."""

    def forward(self, a, b):
        like = a if _is_array(a) else b
        ctx = dispatch._common_context("Mod", [a, b])  # DeviceMismatchError for two devices
        xp = ctx.xp
        self.shapes = [v.shape if _is_array(v) else None for v in (a, b)]
        ra, rb = (v._read() if _is_array(v) else xp.asarray(v, dtype=like.dtype)
                  for v in (a, b))
        self.saved = (ra, rb, ctx, type(like))
        with np.errstate(divide="ignore", invalid="ignore"):
            out = xp.mod(ra, rb)
            out = xp.where(rb == 0, xp.zeros((), dtype=out.dtype), out)
        return type(like)(out, ctx)

    def backward(self, dy):
        ra, rb, ctx, array_type = self.saved
        xp, g = ctx.xp, dy._read()
        with np.errstate(divide="ignore", invalid="ignore"):
            quotient = xp.where(rb == 0, xp.zeros((), dtype=g.dtype), xp.floor(ra / rb))
        grads = (g, -g * quotient)
        return tuple(None if shape is None else
                     array_type(_sum_to(xp, grad, shape).astype(raw.dtype), ctx)
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
