"""Normalization layers beside BatchNorm and LayerNorm: InstanceNorm (each sample's
channel by itself) and GroupNorm (each sample's groups of channels), with MXNet 1.x's
arguments, defaults and parameter shapes."""

from __future__ import annotations

from mixrt.base.errors import InputError
from mixrt.gluon.hybrid import HybridBlock, static_shape
from mixrt.gluon.nn.basic_layers import PerChannelNorm, _axis_index


class InstanceNorm(PerChannelNorm):
    """Normalize each (sample, channel) over the other axes by its own mean and (biased)
    variance, then ``* gamma + beta`` per channel (``axis``: the channels). MXNet's
    default leaves ``gamma`` fixed at one (``scale=False``)."""

    def __init__(self, axis: int = 1, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = False, beta_initializer="zeros", gamma_initializer="ones",
                 in_channels: int = 0, **kwargs):
        super().__init__(axis, epsilon, center, scale, beta_initializer, gamma_initializer,
                         in_channels, **kwargs)

    def hybrid_forward(self, F, x, gamma, beta):
        rank = len(static_shape(x))
        if rank < 3:
            raise InputError(f"{self.name}: InstanceNorm needs an input of 3 or more "
                             f"dimensions, got {rank}")
        axis = _axis_index(self._axis, rank, "InstanceNorm")
        if axis == 1:
            return F.InstanceNormalization(x, gamma, beta, epsilon=self._epsilon, name="fwd")
        swapped = F.swapaxes(x, dim1=1, dim2=axis)
        y = F.InstanceNormalization(swapped, gamma, beta, epsilon=self._epsilon, name="fwd")
        return F.swapaxes(y, dim1=1, dim2=axis)

    def __repr__(self) -> str:
        return f"InstanceNorm(eps={self._epsilon}, axis={self._axis}, " \
               f"center={self._center}, scale={self._scale}, " \
               f"in_channels={self.gamma.shape[0] or None})"


class GroupNorm(HybridBlock):
    """Split the channels (axis 1) of each sample into ``num_groups`` groups and normalize
    each group over its channels and the spatial axes; then ``* gamma + beta`` per group
    (MXNet 1.x's parameters are one per group, shape ``(num_groups,)``)."""

    def __init__(self, num_groups: int = 1, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = True, beta_initializer="zeros", gamma_initializer="ones",
                 prefix=None, params=None):
        if int(num_groups) < 1:
            raise InputError(f"GroupNorm: num_groups must be >= 1, got {num_groups}")
        super().__init__(prefix=prefix, params=params)
        self._num_groups, self._epsilon = int(num_groups), float(epsilon)
        self._center, self._scale = bool(center), bool(scale)
        self.gamma = self.params.get("gamma", shape=(num_groups,), init=gamma_initializer,
                                     grad_req="write" if scale else "null")
        self.beta = self.params.get("beta", shape=(num_groups,), init=beta_initializer,
                                    grad_req="write" if center else "null")

    def hybrid_forward(self, F, x, gamma, beta):
        shape = static_shape(x)
        if len(shape) < 2 or shape[1] % self._num_groups:
            raise InputError(f"{self.name}: the input's channels (axis 1 of {shape}) must "
                             f"be a multiple of num_groups={self._num_groups}")
        grouped = F.reshape(x, shape=(0, self._num_groups, -1))
        mean = F.mean(grouped, axis=2, keepdims=True)
        centered = F.broadcast_sub(grouped, mean)
        variance = F.mean(F.square(centered), axis=2, keepdims=True)
        normed = F.broadcast_div(centered, F.sqrt(variance + self._epsilon))
        scaled = F.broadcast_add(F.broadcast_mul(normed, F.reshape(gamma, shape=(1, -1, 1))),
                                 F.reshape(beta, shape=(1, -1, 1)))
        return F.reshape_like(scaled, x)

    def __repr__(self) -> str:
        return f"GroupNorm(eps={self._epsilon}, num_groups={self._num_groups}, " \
               f"center={self._center}, scale={self._scale})"
