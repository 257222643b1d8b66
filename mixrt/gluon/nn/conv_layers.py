"""Convolution and pooling layers (1-D, 2-D and 3-D), channels first (NCW, NCHW, NCDHW)
as ONNX computes them; MXNet's arguments and defaults.

Convolution weights are (channels, in_channels / groups, *kernel_size); transposed
convolution weights are (in_channels, channels / groups, *kernel_size), as in MXNet and
ONNX. ``in_channels=0`` is learnt from the first input.
"""

from __future__ import annotations

from numbers import Integral

from mixrt.base.errors import InputError
from mixrt.gluon.hybrid import HybridBlock, static_shape
from mixrt.gluon.nn.activations import apply_activation, check_activation

_LAYOUTS = {1: "NCW", 2: "NCHW", 3: "NCDHW"}


def _check_layout(layout: str, dims: int, where: str) -> None:
    if layout != _LAYOUTS[dims]:
        raise InputError(f"{where}: layout {layout!r} is not supported; mixrt computes "
                         f"channels first, layout={_LAYOUTS[dims]!r} (transpose the input "
                         f"to it)")


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
        _check_layout(layout or _LAYOUTS[dims], dims, where)
        if groups < 1 or channels % groups or in_channels % groups:
            raise InputError(f"{where}: channels ({channels}) and in_channels "
                             f"({in_channels}) must be multiples of groups ({groups})")
        super().__init__(**kwargs)
        self._channels, self._groups = int(channels), int(groups)
        self._kernel = _tuple(kernel_size, dims, "kernel_size", where)
        self._strides = _tuple(strides, dims, "strides", where)
        self._padding = _tuple(padding, dims, "padding", where)
        self._dilation = _tuple(dilation, dims, "dilation", where)
        self._output_padding = _tuple(output_padding, dims, "output_padding", where)
        self._activation = None if activation is None else check_activation(activation,
                                                                             where)
        self.weight = self.params.get("weight", shape=self._weight_shape(in_channels),
                                      init=weight_initializer)
        self.bias = self.params.get("bias", shape=(channels,), init=bias_initializer) \
            if use_bias else None

    def _weight_shape(self, in_channels: int) -> tuple:
        if self._transposed:
            return (in_channels, self._channels // self._groups, *self._kernel)
        return (self._channels, in_channels // self._groups, *self._kernel)

    def infer_shape(self, x, *args) -> None:
        shape = static_shape(x)
        if len(shape) != self._dims + 2:
            raise InputError(f"{self.name}: expects a {self._dims + 2}-D input "
                             f"({_LAYOUTS[self._dims]}), got shape {shape}")
        if shape[1] % self._groups:
            raise InputError(f"{self.name}: {shape[1]} input channels are not a multiple "
                             f"of groups={self._groups}")
        self.weight.shape = self._weight_shape(shape[1])

    def hybrid_forward(self, F, x, weight, bias=None):
        options = {"kernel": self._kernel, "stride": self._strides, "pad": self._padding,
                   "dilate": self._dilation, "num_filter": self._channels,
                   "num_group": self._groups, "no_bias": bias is None}
        if self._transposed:
            y = F.Deconvolution(x, weight, bias, adj=self._output_padding, **options)
        else:
            y = F.Convolution(x, weight, bias, **options)
        return apply_activation(F, y, self._activation)

    def __repr__(self) -> str:
        shape = self.weight.shape
        in_channels = shape[0] if self._transposed else shape[1] * self._groups
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
        _check_layout(layout or _LAYOUTS[dims], dims, where)
        super().__init__(**kwargs)
        self._kernel = _tuple(pool_size, dims, "pool_size", where)
        self._strides = self._kernel if strides is None else _tuple(strides, dims,
                                                                     "strides", where)
        self._padding = _tuple(padding, dims, "padding", where)
        self._ceil_mode = bool(ceil_mode)
        self._count_include_pad = bool(count_include_pad)

    def hybrid_forward(self, F, x):
        # MXNet's Gluon pools are its Pooling layer: ceil_mode is the "full" convention
        return F.Pooling(x, kernel=self._kernel, stride=self._strides, pad=self._padding,
                         pool_type=self._pool_type,
                         pooling_convention="full" if self._ceil_mode else "valid",
                         count_include_pad=self._count_include_pad)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self._kernel}, stride={self._strides}, " \
               f"padding={self._padding}, ceil_mode={self._ceil_mode})"


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
        _check_layout(layout or _LAYOUTS[self._dims], self._dims, type(self).__name__)
        super().__init__(**kwargs)

    def hybrid_forward(self, F, x):
        return F.Pooling(x, pool_type=self._pool_type, global_pool=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


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
