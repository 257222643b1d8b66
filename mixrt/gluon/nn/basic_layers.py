"""The basic layers: Dense, Dropout, BatchNorm, LayerNorm, Embedding, Flatten and the
Lambda wrappers, with MXNet's arguments and defaults.

A dimension a layer can learn from its first input (``in_units``, ``in_channels``) may be
left 0: the parameter is created with that 0 and ``infer_shape`` fills it in on the first
call, when the parameter is also initialized.

Dropout and BatchNorm behave differently in training (``autograd.record()`` or
``autograd.train_mode()``). Imperatively they read ``autograd.is_training()``; traced, they
are written in inference form and the hybridized executor switches them to training and
writes BatchNorm's running statistics back (``mixrt.sym.training_graphs.training_graph``), so both
modes compute the same thing.
"""

from __future__ import annotations

import numpy as np

from mixrt import autograd, nd, sym
from mixrt.base.errors import InputError
from mixrt.gluon.block import Block
from mixrt.gluon.hybrid import static_shape, HybridBlock
from mixrt.gluon.nn.activations import activation_child


def is_symbolic(F) -> bool:
    """Whether ``hybrid_forward`` is being traced (``F`` is ``mixrt.sym``)."""
    return F is sym


class Dense(HybridBlock):
    """``activation(x W^T + b)``, with ``weight`` of shape (units, in_units).
    ``flatten=True``: an (N, d1, d2, ...) input is read as (N, d1*d2*...); ``False``: the
    layer applies to the last axis and keeps the others."""

    def __init__(self, units: int, activation: str | None = None, use_bias: bool = True,
                 flatten: bool = True, dtype="float32", weight_initializer=None,
                 bias_initializer="zeros", in_units: int = 0, **kwargs):
        super().__init__(**kwargs)
        self._units, self._flatten = int(units), bool(flatten)
        self._activation = activation
        self.act = activation_child(self, activation)
        self.weight = self.params.get("weight", shape=(units, in_units), dtype=dtype,
                                      init=weight_initializer)
        self.bias = self.params.get("bias", shape=(units,), dtype=dtype,
                                    init=bias_initializer) if use_bias else None

    def infer_shape(self, x, *args) -> None:
        shape = static_shape(x)
        in_units = int(np.prod(shape[1:])) if self._flatten else shape[-1]
        self.weight.shape = (self._units, in_units)

    def hybrid_forward(self, F, x, weight, bias=None):
        y = F.FullyConnected(x, weight, bias, num_hidden=self._units, no_bias=bias is None,
                             flatten=self._flatten, name="fwd")
        return y if self.act is None else self.act(y)

    def __repr__(self) -> str:
        shape = self.weight.shape
        act = f", Activation({self._activation})" if self._activation else ""
        return f"Dense({shape[1] or None} -> {shape[0]}{act})"


class Dropout(HybridBlock):
    """In training, zero each element with probability ``rate`` and scale the survivors by
    ``1 / (1 - rate)``; outside training, the identity. ``axes``: one draw is shared along
    these axes (variational dropout: whole channels or time steps dropped together)."""

    def __init__(self, rate: float, axes=(), **kwargs):
        if not 0.0 <= rate < 1.0:
            raise InputError(f"Dropout: rate must be in [0, 1), got {rate}")
        axes = (axes,) if isinstance(axes, int) else tuple(axes)
        if not all(isinstance(a, (int, np.integer)) for a in axes):
            raise InputError(f"Dropout: axes must be ints, got {axes!r}")
        super().__init__(**kwargs)
        self._rate, self._axes = float(rate), tuple(int(a) for a in axes)

    def hybrid_forward(self, F, x):
        if not self._axes or self._rate == 0.0:
            return dropout(F, x, self._rate)
        # the mask is drawn on x's shape with the shared axes cut to 1, then broadcast;
        # ONNX Dropout of ones gives 0 or 1 / (1 - rate) there, so training switches alike
        compact = x
        for axis in self._axes:
            compact = F.slice_axis(compact, axis=axis, begin=0, end=1)
        mask = dropout(F, F.ones_like(compact), self._rate)
        return F.broadcast_mul(x, mask)

    def __repr__(self) -> str:
        axes = f", axes={self._axes}" if self._axes else ""
        return f"Dropout(p = {self._rate}{axes})"


def dropout(F, x, rate: float):
    """ONNX Dropout: traced without its training switch (the executor sets it), run
    imperatively only while training."""
    if rate == 0.0:
        return x
    ratio = np.array(rate, dtype=np.float32)
    if is_symbolic(F):
        return F.Dropout(x, ratio)
    if not autograd.is_training():
        return x
    return F.Dropout(x, ratio, np.array(True))


class BatchNorm(HybridBlock):
    """Normalize each channel (``axis``) by the batch's mean and variance while training
    and by the running statistics otherwise; ``running = momentum * running +
    (1 - momentum) * batch`` after each training batch (population variance, as the ONNX
    kernel computes it). ``use_global_stats``: always the running statistics."""

    def __init__(self, axis: int = 1, momentum: float = 0.9, epsilon: float = 1e-5,
                 center: bool = True, scale: bool = True, use_global_stats: bool = False,
                 beta_initializer="zeros", gamma_initializer="ones",
                 running_mean_initializer="zeros", running_variance_initializer="ones",
                 in_channels: int = 0, **kwargs):
        super().__init__(**kwargs)
        self._axis, self._momentum, self._epsilon = int(axis), float(momentum), float(epsilon)
        self._use_global_stats = bool(use_global_stats)
        self.gamma = self.params.get("gamma", shape=(in_channels,), init=gamma_initializer,
                                     grad_req="write" if scale else "null")
        self.beta = self.params.get("beta", shape=(in_channels,), init=beta_initializer,
                                    grad_req="write" if center else "null")
        self.running_mean = self.params.get("running_mean", shape=(in_channels,),
                                            init=running_mean_initializer, grad_req="null",
                                            differentiable=False)
        self.running_var = self.params.get("running_var", shape=(in_channels,),
                                           init=running_variance_initializer,
                                           grad_req="null", differentiable=False)

    def infer_shape(self, x, *args) -> None:
        shape = static_shape(x)
        channels = shape[_axis_index(self._axis, len(shape), "BatchNorm")]
        for param in (self.gamma, self.beta, self.running_mean, self.running_var):
            param.shape = (channels,)

    def hybrid_forward(self, F, x, gamma, beta, running_mean, running_var):
        # MXNet's BatchNorm layer: in training (autograd's on NDArrays, the executor's on a
        # hybridized graph) the batch's statistics, and the running ones updated
        return F.BatchNorm(x, gamma, beta, running_mean, running_var, eps=self._epsilon,
                           momentum=self._momentum, fix_gamma=False,
                           use_global_stats=self._use_global_stats, axis=self._axis)

    def __repr__(self) -> str:
        return f"BatchNorm(axis={self._axis}, eps={self._epsilon}, " \
               f"momentum={self._momentum}, in_channels={self.gamma.shape[0] or None})"


def _axis_index(axis: int, rank: int, where: str) -> int:
    if not -rank <= axis < rank:
        raise InputError(f"{where}: axis {axis} is out of range for a {rank}-D input")
    return axis % rank


def _moved(rank: int, source: int, destination: int) -> list:
    order = [a for a in range(rank) if a != source]
    order.insert(destination, source)
    return order


class PerChannelNorm(HybridBlock):
    """A normalization scaled by ``gamma`` and shifted by ``beta``, both the size of the
    input's ``axis`` (learned unless ``scale``/``center`` is off): LayerNorm, InstanceNorm."""

    def __init__(self, axis: int, epsilon: float, center: bool, scale: bool,
                 beta_initializer, gamma_initializer, in_channels: int, **kwargs):
        super().__init__(**kwargs)
        self._axis, self._epsilon = int(axis), float(epsilon)
        self._center, self._scale = bool(center), bool(scale)
        self.gamma = self.params.get("gamma", shape=(in_channels,), init=gamma_initializer,
                                     grad_req="write" if scale else "null")
        self.beta = self.params.get("beta", shape=(in_channels,), init=beta_initializer,
                                    grad_req="write" if center else "null")

    def infer_shape(self, x, *args) -> None:
        shape = static_shape(x)
        channels = shape[_axis_index(self._axis, len(shape), type(self).__name__)]
        self.gamma.shape = self.beta.shape = (channels,)


class LayerNorm(PerChannelNorm):
    """Normalize each sample over ``axis`` (by default the last), then scale by ``gamma``
    and shift by ``beta`` (shape: that axis)."""

    def __init__(self, axis: int = -1, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = True, beta_initializer="zeros", gamma_initializer="ones",
                 in_channels: int = 0, **kwargs):
        super().__init__(axis, epsilon, center, scale, beta_initializer, gamma_initializer,
                         in_channels, **kwargs)

    def hybrid_forward(self, F, x, gamma, beta):
        rank = len(static_shape(x))
        axis = _axis_index(self._axis, rank, "LayerNorm")
        # MXNet normalizes in the data's own precision (float16 widened to float32); ONNX's
        # default stash_type would compute a float64 network's statistics in float32.
        stash = 11 if np.dtype(self.gamma.dtype) == np.float64 else 1
        if axis == rank - 1:
            return F.LayerNormalization(x, gamma, beta, axis=-1, epsilon=self._epsilon,
                                        stash_type=stash)
        perm = _moved(rank, axis, rank - 1)  # ONNX normalizes the trailing axes
        y = F.LayerNormalization(F.Transpose(x, perm=perm), gamma, beta, axis=-1,
                                 epsilon=self._epsilon, stash_type=stash)
        return F.Transpose(y, perm=[int(a) for a in np.argsort(perm)])


class Embedding(HybridBlock):
    """Rows of ``weight`` (input_dim, output_dim) picked by integer indices (any shape;
    float indices are truncated, as in MXNet): output shape ``x.shape + (output_dim,)``."""

    def __init__(self, input_dim: int, output_dim: int, dtype="float32",
                 weight_initializer=None, sparse_grad: bool = False, **kwargs):
        del sparse_grad  # gradients are dense in mixrt
        super().__init__(**kwargs)
        self._input_dim, self._output_dim = int(input_dim), int(output_dim)
        self.weight = self.params.get("weight", shape=(input_dim, output_dim), dtype=dtype,
                                      init=weight_initializer)

    def hybrid_forward(self, F, x, weight):
        return F.Embedding(x, weight, input_dim=self._input_dim, output_dim=self._output_dim)

    def __repr__(self) -> str:
        return f"Embedding({self._input_dim} -> {self._output_dim})"


class Flatten(HybridBlock):
    """(N, d1, d2, ...) -> (N, d1*d2*...)."""

    def hybrid_forward(self, F, x):
        return F.Flatten(x, axis=1)

    def __repr__(self) -> str:
        return "Flatten"


class HybridLambda(HybridBlock):
    """A function ``f(F, x, *args)`` as a hybridizable layer (or the name of an op/function
    of ``F``, such as ``"relu"`` or ``"Tanh"``)."""

    def __init__(self, function, **kwargs):
        super().__init__(**kwargs)
        if isinstance(function, str):
            name = function
            function = lambda F, *args: getattr(F, name)(*args)  # noqa: E731
        elif not callable(function):
            raise InputError(f"HybridLambda takes a function or an op name, got {function!r}")
        self._function = function

    def hybrid_forward(self, F, x, *args):
        return self._function(F, x, *args)


class Lambda(Block):
    """A function ``f(x, *args)`` of NDArrays as a layer (or the name of an ``nd``
    function)."""

    def __init__(self, function, **kwargs):
        super().__init__(**kwargs)
        if isinstance(function, str):
            function = getattr(nd, function)
        elif not callable(function):
            raise InputError(f"Lambda takes a function or an nd function's name, got "
                             f"{function!r}")
        self._function = function

    def forward(self, x, *args):
        return self._function(x, *args)
