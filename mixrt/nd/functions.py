"""The NDArray operations that are not registered ops: indexing and device copies, written
as autograd Functions so that gradients flow through them."""

from __future__ import annotations

from mixrt.autograd import Function
from mixrt.nd.ndarray import NDArray
from mixrt.runtime.device import add_at


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
        shape, dtype, ctx = self.source
        dx = ctx.xp.zeros(shape, dtype=dtype)
        add_at(ctx.xp, dx, self.key, dy._read())
        return NDArray(dx, ctx)


class CopyToDevice(Function):
    """The one way across devices; the gradient comes back to the source device."""

    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx

    def forward(self, x: NDArray) -> NDArray:
        self.source = x.ctx
        return NDArray(self.ctx.device.put(x._read()).copy(), self.ctx)

    def backward(self, dy: NDArray) -> NDArray:
        return NDArray(self.source.device.put(dy._read()).copy(), self.source)
