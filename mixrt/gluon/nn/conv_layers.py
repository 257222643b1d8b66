"""Convolution and pooling layers (1-D, 2-D and 3-D); MXNet's arguments and defaults.

ONNX computes channels first (NCW, NCHW, NCDHW); the channels-last layouts MXNet offers
(NWC, NHWC, NDHWC) are computed by transposing the input to channels first and the output
back. Convolution weights are (channels, in_channels / groups, *kernel_size) channels first
and (channels, *kernel_size, in_channels / groups) channels last; transposed convolution
weights swap the first and the channel axis's roles (in_channels first), as in MXNet and
ONNX. ``in_channels=0`` is learnt from the first input.
"""

from __future__ import annotations

from numbers import Integral

from mixrt.base.errors import InputError
from mixrt.gluon.hybrid import HybridBlock, static_shape
from mixrt.gluon.nn.activations import activation_child

_LAYOUTS = {1: "NCW", 2: "NCHW", 3: "NCDHW"}
_CHANNELS_LAST = {1: "NWC", 2: "NHWC", 3: "NDHWC"}


def _check_layout(layout: str | None, dims: int, where: str) -> bool:
    """Whether ``layout`` (None: channels first) puts the channels last."""
    if layout is None or layout == _LAYOUTS[dims]:
        return False
    if layout == _CHANNELS_LAST[dims]:
        return True
    raise InputError(f"{where}: layout {layout!r} is not one of "
                     f"{[_LAYOUTS[dims], _CHANNELS_LAST[dims]]}")


def _to_channels_first(rank: int) -> tuple:
    return (0, rank - 1, *range(1, rank - 1))


def _to_channels_last(rank: int) -> tuple:
    return (0, *range(2, rank), 1)


def _channels_first(F, x, channels_last: bool, rank: int):
    return F.transpose(x, axes=_to_channels_first(rank)) if channels_last else x


def _channels_back(F, y, channels_last: bool, rank: int):
    return F.transpose(y, axes=_to_channels_last(rank)) if channels_last else y


def _tuple(value, dims: int, what: str, where: str) -> tuple:
    values = (value,) * dims if isinstance(value, Integral) else tuple(value)
    if len(values) != dims or not all(isinstance(v, Integral) for v in values):
        raise InputError(f"{where}: {what} must be an int or {dims} ints, got {value!r}")
    return tuple(int(v) for v in values)


class _Conv(HybridBlock):
    """The convolutions: ``Conv`` or ``ConvTranspose`` over ``dims`` spatial axes."""

    _dims = 2
    _transposed = False

    @classmethod
    def _alias(cls) -> str:
        return "conv"

    def __init__(self, channels: int, kernel_size, strides=1, padding=0, dilation=1,
                 groups: int = 1, layout: str | None = None, activation: str | None = None,
                 use_bias: bool = True, weight_initializer=None, bias_initializer="zeros",
                 in_channels: int = 0, **kwargs):
        output_padding = kwargs.pop("output_padding", 0)  # given by the transposed ones
        where = type(self).__name__
        if output_padding and not self._transposed:
            raise InputError(f"{where}: output_padding is for transposed convolutions")
        dims = self._dims
        channels_last = _check_layout(layout, dims, where)
        if groups < 1 or channels % groups or in_channels % groups:
            raise InputError(f"{where}: channels ({channels}) and in_channels "
                             f"({in_channels}) must be multiples of groups ({groups})")
        super().__init__(**kwargs)
        self._channels_last, self._layout = channels_last, layout or _LAYOUTS[dims]
        self._channels, self._groups = int(channels), int(groups)
        self._kernel = _tuple(kernel_size, dims, "kernel_size", where)
        self._strides = _tuple(strides, dims, "strides", where)
        self._padding = _tuple(padding, dims, "padding", where)
        self._dilation = _tuple(dilation, dims, "dilation", where)
        self._output_padding = _tuple(output_padding, dims, "output_padding", where)
        self.act = activation_child(self, activation)
        self.weight = self.params.get("weight", shape=self._weight_shape(in_channels),
                                      init=weight_initializer)
        self.bias = self.params.get("bias", shape=(channels,), init=bias_initializer) \
            if use_bias else None

    def _weight_shape(self, in_channels: int) -> tuple:
        if self._transposed:
            outer, inner = in_channels, self._channels // self._groups
        else:
            outer, inner = self._channels, in_channels // self._groups
        if self._channels_last:
            return (outer, *self._kernel, inner)
        return (outer, inner, *self._kernel)

    def infer_shape(self, x, *args) -> None:
        shape = static_shape(x)
        if len(shape) != self._dims + 2:
            raise InputError(f"{self.name}: expects a {self._dims + 2}-D input "
                             f"({self._layout}), got shape {shape}")
        in_channels = shape[-1] if self._channels_last else shape[1]
        if in_channels % self._groups:
            raise InputError(f"{self.name}: {in_channels} input channels are not a multiple "
                             f"of groups={self._groups}")
        self.weight.shape = self._weight_shape(in_channels)

    def hybrid_forward(self, F, x, weight, bias=None):
        options = {"kernel": self._kernel, "stride": self._strides, "pad": self._padding,
                   "dilate": self._dilation, "num_filter": self._channels,
                   "num_group": self._groups, "no_bias": bias is None}
        rank = self._dims + 2
        x = _channels_first(F, x, self._channels_last, rank)
        weight = _channels_first(F, weight, self._channels_last, rank)
        if self._transposed:
            y = F.Deconvolution(x, weight, bias, adj=self._output_padding, name="fwd",
                                **options)
        else:
            y = F.Convolution(x, weight, bias, name="fwd", **options)
        y = _channels_back(F, y, self._channels_last, rank)
        return y if self.act is None else self.act(y)

    def __repr__(self) -> str:
        shape = self.weight.shape
        inner = shape[-1] if self._channels_last else shape[1]
        in_channels = shape[0] if self._transposed else inner * self._groups
        return f"{type(self).__name__}({in_channels or None} -> {self._channels}, " \
               f"kernel_size={self._kernel}, stride={self._strides})"


class Conv1D(_Conv):
    _dims = 1


class Conv2D(_Conv):
    _dims = 2


class Conv3D(_Conv):
    _dims = 3


class _ConvTranspose(_Conv):
    """``output_padding`` adds rows at the end of each spatial axis, to pick among the
    output sizes a strided convolution maps to the same input size."""

    _transposed = True

    def __init__(self, channels: int, kernel_size, strides=1, padding=0, output_padding=0,
                 dilation=1, groups: int = 1, layout: str | None = None,
                 activation: str | None = None, use_bias: bool = True,
                 weight_initializer=None, bias_initializer="zeros", in_channels: int = 0,
                 **kwargs):
        super().__init__(channels, kernel_size, strides, padding, dilation, groups, layout,
                         activation, use_bias, weight_initializer, bias_initializer,
                         in_channels, output_padding=output_padding, **kwargs)


class Conv1DTranspose(_ConvTranspose):
    _dims = 1


class Conv2DTranspose(_ConvTranspose):
    _dims = 2


class Conv3DTranspose(_ConvTranspose):
    _dims = 3


# -- pooling -----------------------------------------------------------------------------------

class _Pool(HybridBlock):
    """Max or average pooling over windows of ``pool_size`` (``strides``: by default the
    window size; ``ceil_mode``: keep a last, partial window)."""

    _dims = 2
    _pool_type = "max"

    @classmethod
    def _alias(cls) -> str:
        return "pool"

    def __init__(self, pool_size=2, strides=None, padding=0, ceil_mode: bool = False,
                 layout: str | None = None, count_include_pad: bool = True, **kwargs):
        where = type(self).__name__
        dims = self._dims
        self._channels_last = _check_layout(layout, dims, where)
        self._layout = layout or _LAYOUTS[dims]
        super().__init__(**kwargs)
        self._kernel = _tuple(pool_size, dims, "pool_size", where)
        self._strides = self._kernel if strides is None else _tuple(strides, dims,
                                                                     "strides", where)
        self._padding = _tuple(padding, dims, "padding", where)
        self._ceil_mode = bool(ceil_mode)
        self._count_include_pad = bool(count_include_pad)

    def hybrid_forward(self, F, x):
        # MXNet's Gluon pools are its Pooling layer: ceil_mode is the "full" convention
        rank = self._dims + 2
        x = _channels_first(F, x, self._channels_last, rank)
        y = F.Pooling(x, kernel=self._kernel, stride=self._strides, pad=self._padding,
                      pool_type=self._pool_type,
                      pooling_convention="full" if self._ceil_mode else "valid",
                      count_include_pad=self._count_include_pad, name="fwd")
        return _channels_back(F, y, self._channels_last, rank)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self._kernel}, stride={self._strides}, " \
               f"padding={self._padding}, ceil_mode={self._ceil_mode}, global_pool=False, " \
               f"pool_type={self._pool_type}, layout={self._layout})"


class MaxPool1D(_Pool):
    _dims, _pool_type = 1, "max"


class MaxPool2D(_Pool):
    _dims, _pool_type = 2, "max"


class MaxPool3D(_Pool):
    _dims, _pool_type = 3, "max"


class AvgPool1D(_Pool):
    _dims, _pool_type = 1, "avg"


class AvgPool2D(_Pool):
    _dims, _pool_type = 2, "avg"


class AvgPool3D(_Pool):
    _dims, _pool_type = 3, "avg"


class _GlobalPool(HybridBlock):
    """One value per channel: (N, C, ...) -> (N, C, 1, ...)."""

    _dims = 2
    _pool_type = "avg"

    @classmethod
    def _alias(cls) -> str:
        return "pool"

    def __init__(self, layout: str | None = None, **kwargs):
        self._channels_last = _check_layout(layout, self._dims, type(self).__name__)
        self._layout = layout or _LAYOUTS[self._dims]
        super().__init__(**kwargs)

    def hybrid_forward(self, F, x):
        rank = self._dims + 2
        x = _channels_first(F, x, self._channels_last, rank)
        y = F.Pooling(x, pool_type=self._pool_type, global_pool=True, name="fwd")
        return _channels_back(F, y, self._channels_last, rank)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(global_pool=True, pool_type={self._pool_type}, " \
               f"layout={self._layout})"


class GlobalAvgPool1D(_GlobalPool):
    _dims, _pool_type = 1, "avg"


class GlobalAvgPool2D(_GlobalPool):
    _dims, _pool_type = 2, "avg"


class GlobalAvgPool3D(_GlobalPool):
    _dims, _pool_type = 3, "avg"


class GlobalMaxPool1D(_GlobalPool):
    _dims, _pool_type = 1, "max"


class GlobalMaxPool2D(_GlobalPool):
    _dims, _pool_type = 2, "max"


class GlobalMaxPool3D(_GlobalPool):
    _dims, _pool_type = 3, "max"


# -- padding -----------------------------------------------------------------------------------

class ReflectionPad2D(HybridBlock):
    """Pad the two spatial axes of an NCHW input by reflecting it at its borders (the
    border row itself not repeated). ``padding``: one int for every side, or MXNet's
    8-tuple of (before, after) per axis, whose first four (N and C) must be 0."""

    def __init__(self, padding=0, **kwargs):
        if isinstance(padding, Integral):
            padding = (0, 0, 0, 0) + (int(padding),) * 4
        padding = tuple(padding)
        if len(padding) != 8 or any(padding[:4]) or not all(
                isinstance(p, Integral) and p >= 0 for p in padding):
            raise InputError(f"ReflectionPad2D: padding must be an int >= 0 or 8 ints "
                             f"(before, after per axis of NCHW, 0 for N and C), got "
                             f"{padding!r}")
        super().__init__(**kwargs)
        self._padding = tuple(int(p) for p in padding)

    def hybrid_forward(self, F, x):
        return F.pad(x, mode="reflect", pad_width=self._padding, name="fwd")

    def __repr__(self) -> str:
        return f"ReflectionPad2D(padding={self._padding})"
