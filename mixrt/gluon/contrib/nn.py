"""MXNet 1.x's ``gluon.contrib.nn``: ``Concurrent``/``HybridConcurrent`` (children applied
to the same input, outputs concatenated), ``Identity``, ``SyncBatchNorm`` and the
``PixelShuffle`` layers."""

from __future__ import annotations

from numbers import Integral

from mixrt import nd
from mixrt.base.errors import InputError
from mixrt.gluon.block import Block, ChildChain
from mixrt.gluon.hybrid import HybridBlock, static_shape
from mixrt.gluon.nn.basic_layers import BatchNorm


class Concurrent(ChildChain, Block):
    """Every child applied to the same input; their outputs joined along ``axis``."""

    def __init__(self, axis: int = -1, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self.axis = int(axis)

    def forward(self, x):
        return nd.concat(*[block(x) for block in self._children.values()], dim=self.axis)


class HybridConcurrent(ChildChain, HybridBlock):
    """Every child applied to the same input; their outputs joined along ``axis``."""

    def __init__(self, axis: int = -1, prefix=None, params=None):
        super().__init__(prefix=prefix, params=params)
        self.axis = int(axis)

    def hybrid_forward(self, F, x):
        return F.concat(*[block(x) for block in self._children.values()], dim=self.axis)


class Identity(HybridBlock):
    """The input, unchanged (a branch of a Concurrent that keeps it)."""

    def hybrid_forward(self, F, x):
        del F
        return x


class SyncBatchNorm(BatchNorm):
    """BatchNorm whose batch statistics are meant to be shared by ``num_devices`` devices
    each holding part of the batch (MXNet's cross-device BatchNorm). mixrt computes each
    device's part by itself, so the statistics are the batch's only on one device; with
    more, each part is normalized by its own, as BatchNorm does."""

    def __init__(self, in_channels: int = 0, num_devices: int | None = None,
                 momentum: float = 0.9, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = True, use_global_stats: bool = False,
                 beta_initializer="zeros", gamma_initializer="ones",
                 running_mean_initializer="zeros", running_variance_initializer="ones",
                 **kwargs):
        if num_devices is not None and int(num_devices) < 1:
            raise InputError(f"SyncBatchNorm: num_devices must be >= 1, got {num_devices}")
        super().__init__(axis=1, momentum=momentum, epsilon=epsilon, center=center,
                         scale=scale, use_global_stats=use_global_stats,
                         beta_initializer=beta_initializer,
                         gamma_initializer=gamma_initializer,
                         running_mean_initializer=running_mean_initializer,
                         running_variance_initializer=running_variance_initializer,
                         in_channels=in_channels, **kwargs)
        self.num_devices = 1 if num_devices is None else int(num_devices)


class _PixelShuffle(HybridBlock):
    """Move ``factor`` blocks of channels into each spatial axis: (N, C * prod(f), *S) ->
    (N, C, *(S_i * f_i))."""

    _dims = 2

    def __init__(self, factor, **kwargs):
        dims = self._dims
        factors = (factor,) * dims if isinstance(factor, Integral) else tuple(factor)
        if len(factors) != dims or not all(isinstance(f, Integral) and f >= 1
                                           for f in factors):
            raise InputError(f"{type(self).__name__}: factor must be an int >= 1 or {dims} "
                             f"of them, got {factor!r}")
        super().__init__(**kwargs)
        self._factors = tuple(int(f) for f in factors)

    def hybrid_forward(self, F, x):
        shape = static_shape(x)
        dims, factors = self._dims, self._factors
        if len(shape) != dims + 2:
            raise InputError(f"{self.name}: expects a {dims + 2}-D input, got {shape}")
        # (N, C, f1, ..., fd, S1, ..., Sd) -> (N, C, S1, f1, ..., Sd, fd) -> merged
        split = F.reshape(x, shape=(0, -4, -1, _product(factors), *shape[2:]))
        split = F.reshape(split, shape=(0, 0, *factors, *shape[2:]))
        order = [0, 1] + [a for i in range(dims) for a in (2 + dims + i, 2 + i)]
        moved = F.transpose(split, axes=tuple(order))
        return F.reshape(moved, shape=(0, 0, *(s * f for s, f in zip(shape[2:], factors))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._factors})"


def _product(values) -> int:
    result = 1
    for value in values:
        result *= value
    return result


class PixelShuffle1D(_PixelShuffle):
    _dims = 1


class PixelShuffle2D(_PixelShuffle):
    _dims = 2


class PixelShuffle3D(_PixelShuffle):
    _dims = 3


__all__ = ["Concurrent", "HybridConcurrent", "Identity", "SyncBatchNorm", "PixelShuffle1D",
           "PixelShuffle2D", "PixelShuffle3D"]
