"""MXNet 1.x's layer operators on NDArrays (``nd.Convolution``, ``nd.Pooling``,
``nd.BatchNorm``, ``nd.SoftmaxOutput``, ...), with MXNet's argument names and defaults.

As in ``mixrt.nd.mxnet_ops``, each is composed of registered ops run through
``mixrt.dispatch``: it runs on the data's device and, under ``autograd.record()``, its
gradient flows through the ops' own gradient definitions (``SoftmaxOutput`` has MXNet's own
backward, an ``autograd.Function``). Bad arguments raise ``InputError`` naming the function
and the argument. Data is channels-first (``NCW``, ``NCHW``, ``NCDHW``); a ``layout`` that
puts the channels last is refused.

Three MXNet names are already ONNX ops in ``mixrt.nd`` with other signatures: ``Dropout``,
``Concat`` and ``LRN`` (``EXTENDED``). Their ONNX calls keep working unchanged; MXNet's
spellings are accepted where they cannot be mistaken for ONNX's (``Dropout(x, p=0.5)``,
``Concat(a, b)`` or ``Concat(a, b, dim=0)``, ``LRN(x, nsize=5)``): see each docstring.
``Flatten`` needs nothing: ONNX's ``Flatten(x)`` (axis 1) is MXNet's.

MXNet's CPU quirks followed here, for its values: pooling windows that lie wholly in the
padding (``pooling_convention="full"``, or a pad as large as the kernel) give the dtype's
lowest value (max) or 0; ``BatchNorm(output_mean_var=True)``'s third output is
``1 / sqrt(var + eps)``; ``SoftmaxOutput``'s ``multi_output`` scales ``normalization="null"``
by ``1 / (spatial size)``.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt import autograd
from mixrt.base.errors import InputError
from mixrt import dispatch
from mixrt.nd.mxnet_ops import (_array, _axis, _choice, _int, _made_on, _op, _scalar, _tuple,
                                one_hot)
from mixrt.nd.ndarray import NDArray, _ints

_LAYOUTS = {1: "NCW", 2: "NCHW", 3: "NCDHW"}


# -- argument helpers --------------------------------------------------------------------------

def _float(fn: str, arg: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise InputError(f"{fn}: {arg} must be a number, got {value!r}")
    return float(value)


def _spatial_rank(fn: str, data: NDArray) -> int:
    if not 3 <= data.ndim <= 5:
        raise InputError(f"{fn}: data must be 3-D, 4-D or 5-D (batch, channel, then 1 to 3 "
                         f"spatial axes), got shape {data.shape}")
    return data.ndim - 2


def _per_axis(fn: str, arg: str, value, rank: int, default=None, minimum: int = 0) -> tuple:
    """``value`` as one int per spatial axis; empty (MXNet's ``()``) gives ``default``."""
    values = () if value is None else _tuple(fn, arg, value)
    if not values:
        if default is None:
            raise InputError(f"{fn}: {arg} is required, a tuple of {rank} ints")
        return (default,) * rank
    if len(values) != rank:
        raise InputError(f"{fn}: {arg}={values} must have {rank} entries, one per spatial "
                         f"axis of the {rank + 2}-D data")
    return tuple(_int(fn, arg, v, minimum) for v in values)


def _check_layout(fn: str, layout, rank: int) -> None:
    if layout is not None and layout != _LAYOUTS[rank]:
        raise InputError(f"{fn}: layout={layout!r} is not supported: mixrt takes "
                         f"channels-first data, {_LAYOUTS[rank]!r} for {rank + 2}-D data")


def _bias_inputs(fn: str, bias, no_bias: bool, num_filter: int) -> list:
    """``[bias]`` or ``[]``; a bias given with ``no_bias=True`` is refused, as MXNet does
    (``Deconvolution``'s ``no_bias`` is True by default)."""
    if no_bias:
        if bias is not None:
            raise InputError(f"{fn}: bias was given but no_bias=True; pass no_bias=False to "
                             f"use it")
        return []
    if bias is None:
        raise InputError(f"{fn}: bias is required unless no_bias=True")
    bias = _array(fn, "bias", bias)
    if bias.shape != (num_filter,):
        raise InputError(f"{fn}: bias must have shape (num_filter,) = ({num_filter},), got "
                         f"{bias.shape}")
    return [bias]


def _groups(fn: str, channels: int, num_filter, num_group) -> tuple[int, int]:
    if num_filter is None:
        raise InputError(f"{fn}: num_filter is required")
    num_filter = _int(fn, "num_filter", num_filter, 1)
    num_group = _int(fn, "num_group", num_group, 1)
    for what, count in (("data's channels", channels), ("num_filter", num_filter)):
        if count % num_group:
            raise InputError(f"{fn}: num_group={num_group} must divide the {what} ({count})")
    return num_filter, num_group


def _check_weight(fn: str, weight: NDArray, expected: tuple, meaning: str) -> None:
    if weight.shape != expected:
        raise InputError(f"{fn}: weight must have shape {meaning} = {expected}, got "
                         f"{weight.shape}")


def _window_attributes(kernel, stride, dilate, pad) -> dict:
    return {"kernel_shape": list(kernel), "strides": list(stride), "dilations": list(dilate),
            "pads": list(pad) * 2}


# -- convolution -------------------------------------------------------------------------------

def _window_arguments(fn, data, weight, layout, kernel, stride, dilate) -> tuple:
    """What Convolution and Deconvolution check alike: the arrays, the spatial rank, the
    layout and the per-axis kernel, stride and dilate (the last two default to 1)."""
    data, weight = _array(fn, "data", data), _array(fn, "weight", weight)
    rank = _spatial_rank(fn, data)
    _check_layout(fn, layout, rank)
    return (data, weight, rank, _per_axis(fn, "kernel", kernel, rank, minimum=1),
            _per_axis(fn, "stride", stride, rank, 1, 1),
            _per_axis(fn, "dilate", dilate, rank, 1, 1))


def Convolution(data, weight, bias=None, kernel=None, stride=(), dilate=(), pad=(),
                num_filter=None, num_group=1, workspace=1024, no_bias=False, cudnn_tune=None,
                cudnn_off=False, layout=None, name=None):
    """MXNet's ``Convolution`` (1-D, 2-D or 3-D): ``weight`` is
    ``(num_filter, channels / num_group) + kernel``; ``stride`` and ``dilate`` default to 1,
    ``pad`` (both sides of each axis) to 0. ``workspace``, ``cudnn_tune`` and ``cudnn_off``
    are accepted and ignored."""
    fn = "Convolution"
    data, weight, rank, kernel, stride, dilate = _window_arguments(
        fn, data, weight, layout, kernel, stride, dilate)
    pad = _per_axis(fn, "pad", pad, rank, 0)
    num_filter, num_group = _groups(fn, data.shape[1], num_filter, num_group)
    _check_weight(fn, weight, (num_filter, data.shape[1] // num_group) + kernel,
                  "(num_filter, channels / num_group) + kernel")
    inputs = [data, weight] + _bias_inputs(fn, bias, no_bias, num_filter)
    for size, k, d, p in zip(data.shape[2:], kernel, dilate, pad):
        if d * (k - 1) + 1 > size + 2 * p:
            raise InputError(f"{fn}: kernel={kernel} (dilate={dilate}) is larger than the "
                             f"padded data {data.shape[2:]} (pad={pad})")
    return _op("Conv", inputs, group=num_group, **_window_attributes(kernel, stride, dilate, pad))


def Deconvolution(data, weight, bias=None, kernel=None, stride=(), dilate=(), pad=(), adj=(),
                  target_shape=(), num_filter=None, num_group=1, workspace=512, no_bias=True,
                  cudnn_tune=None, cudnn_off=False, layout=None, name=None):
    """MXNet's ``Deconvolution`` (the transposed convolution, ONNX's ``ConvTranspose``):
    ``weight`` is ``(channels, num_filter / num_group) + kernel`` (input channels first);
    each output axis is ``(size - 1) * stride - 2 * pad + dilate * (kernel - 1) + 1 + adj``.
    ``target_shape`` (the output's spatial shape) overrides ``pad`` and ``adj`` as MXNet
    does: the surplus is split ``pad = ceil(surplus / 2)``, ``adj = surplus % 2``.
    ``no_bias`` is True by default, as in MXNet."""
    fn = "Deconvolution"
    data, weight, rank, kernel, stride, dilate = _window_arguments(
        fn, data, weight, layout, kernel, stride, dilate)
    num_filter, num_group = _groups(fn, data.shape[1], num_filter, num_group)
    _check_weight(fn, weight, (data.shape[1], num_filter // num_group) + kernel,
                  "(channels, num_filter / num_group) + kernel")
    inputs = [data, weight] + _bias_inputs(fn, bias, no_bias, num_filter)
    if _tuple(fn, "target_shape", target_shape):
        pad, adj = _pad_for_target(fn, data.shape[2:], kernel, stride, dilate,
                                   _per_axis(fn, "target_shape", target_shape, rank, 1, 1))
    else:
        pad = _per_axis(fn, "pad", pad, rank, 0)
        adj = _per_axis(fn, "adj", adj, rank, 0)
    if any(a >= s for a, s in zip(adj, stride)):
        raise InputError(f"{fn}: adj={adj} must be smaller than stride={stride} on every axis")
    for size, k, s, d, p, a in zip(data.shape[2:], kernel, stride, dilate, pad, adj):
        if (size - 1) * s + d * (k - 1) + 1 + a - 2 * p < 1:
            raise InputError(f"{fn}: pad={pad} leaves no output for data {data.shape[2:]}")
    return _op("ConvTranspose", inputs, group=num_group, output_padding=list(adj),
               **_window_attributes(kernel, stride, dilate, pad))


def _pad_for_target(fn, sizes, kernel, stride, dilate, target) -> tuple[tuple, tuple]:
    pads, adjs = [], []
    for size, k, s, d, t in zip(sizes, kernel, stride, dilate, target):
        surplus = (size - 1) * s + d * (k - 1) + 1 - t
        if surplus < 0:
            raise InputError(f"{fn}: target_shape={tuple(target)} is larger than the "
                             f"largest output this kernel and stride make, "
                             f"{t + surplus} on that axis")
        pads.append((surplus + 1) // 2)
        adjs.append(surplus % 2)
    return tuple(pads), tuple(adjs)


# -- pooling -----------------------------------------------------------------------------------

def Pooling(data, kernel=(), pool_type="max", global_pool=False, cudnn_off=False,
            pooling_convention="valid", stride=(), pad=(), p_value=None,
            count_include_pad=None, layout=None, name=None):
    """MXNet's ``Pooling`` (1-D, 2-D or 3-D): ``pool_type`` max, avg, sum or lp
    (``(sum x^p)^(1/p)`` for ``p_value`` 1, 2 or 3, signed as MXNet's: no absolute value).
    ``stride`` defaults to 1 and ``pad`` to 0 per axis; ``global_pool`` pools each whole
    map (``kernel``, ``stride`` and ``pad`` ignored). ``pooling_convention="valid"`` floors
    the output size, ``"full"`` ceils it (MXNet's ``"same"``, 1-D max only there, is not
    supported). An avg window's divisor counts the padding (``count_include_pad``, the
    default) but not the part past it; a window wholly in the padding gives 0 (avg, sum,
    lp) or the dtype's lowest value (max), as in MXNet."""
    fn = "Pooling"
    data = _array(fn, "data", data)
    rank = _spatial_rank(fn, data)
    _check_layout(fn, layout, rank)
    _choice(fn, "pool_type", pool_type, ("max", "avg", "sum", "lp"))
    _choice(fn, "pooling_convention", pooling_convention, ("valid", "full"))
    if pool_type == "lp" and p_value not in (1, 2, 3):
        raise InputError(f"{fn}: pool_type='lp' needs p_value 1, 2 or 3, got {p_value!r}")
    if global_pool:
        kernel, stride, pad = data.shape[2:], (1,) * rank, (0,) * rank
    else:
        kernel = _per_axis(fn, "kernel", kernel, rank, minimum=1)
        stride = _per_axis(fn, "stride", stride, rank, 1, 1)
        pad = _per_axis(fn, "pad", pad, rank, 0)
        for size, k, p in zip(data.shape[2:], kernel, pad):
            if k > size + 2 * p:
                raise InputError(f"{fn}: kernel={kernel} is larger than the padded data "
                                 f"{data.shape[2:]} (pad={pad})")
    windows = [_Windows(size, k, s, p, pooling_convention == "full")
               for size, k, s, p in zip(data.shape[2:], kernel, stride, pad)]
    if pool_type == "max":
        lowest = (np.finfo if data.dtype.kind == "f" else np.iinfo)(data.dtype).min
        return _op("MaxPool", [_padded(data, windows, lowest)], kernel_shape=list(kernel),
                   strides=list(stride))
    include_pad = True if count_include_pad is None else bool(count_include_pad)
    return _summed_pool(data, windows, pool_type, p_value, include_pad)


class _Windows:
    """One spatial axis's pooling windows, MXNet's way: ``out`` windows starting at
    ``i * stride - pad``; ``extra`` more padding at the end makes an ONNX pool without
    ceil mode give the "full" convention's last window."""

    def __init__(self, size: int, kernel: int, stride: int, pad: int, full: bool):
        span = size + 2 * pad - kernel
        self.out = (-(-span // stride) if full else span // stride) + 1
        self.extra = max(0, (self.out - 1) * stride + kernel - (size + 2 * pad))
        self.size, self.kernel, self.stride, self.pad = size, kernel, stride, pad

    def counts(self, include_pad: bool) -> np.ndarray:
        """How many entries each window averages: MXNet ends a window at the padding's
        end, and counts the padding only with ``count_include_pad``."""
        starts = np.arange(self.out) * self.stride - self.pad
        ends = np.minimum(starts + self.kernel, self.size + self.pad)
        if include_pad:
            return ends - starts
        return np.maximum(np.minimum(ends, self.size) - np.maximum(starts, 0), 0)


def _padded(data: NDArray, windows: list, fill) -> NDArray:
    """``data`` with each window's padding written out (filled with ``fill``), so that a
    plain ONNX pool (no pads, floor mode) sees MXNet's windows."""
    begins = [w.pad for w in windows]
    ends = [w.pad + w.extra for w in windows]
    if not any(begins) and not any(ends):
        return data
    pads = _ints([0, 0, *begins, 0, 0, *ends], data.ctx)
    return _op("Pad", [data, pads, _scalar(fill, data)], mode="constant")


def _summed_pool(data, windows, pool_type, p_value, include_pad) -> NDArray:
    """avg, sum and lp pooling from one ``AveragePool`` over the zero-padded data (its
    divisor is then always the kernel's size, so it gives the window's sum / size)."""
    kernel = [w.kernel for w in windows]
    powered = data
    if pool_type == "lp" and p_value > 1:
        powered = data * data if p_value == 2 else data * data * data
    means = _op("AveragePool", [_padded(powered, windows, 0)], kernel_shape=kernel,
                strides=[w.stride for w in windows])
    size = float(np.prod(kernel))
    if pool_type == "avg":
        counts = functools.reduce(np.multiply.outer, [w.counts(include_pad) for w in windows])
        # a window wholly in the padding averages nothing: 0, as MXNet gives
        factor = np.where(counts > 0, size / np.maximum(counts, 1), 0.0)
        return means * _made_on(data.ctx, "asarray", factor, dtype=data.dtype)
    sums = means * size
    if pool_type == "sum" or p_value == 1:
        return sums
    if p_value == 2:
        return _op("Sqrt", [sums])
    cube_root = _op("Pow", [_op("Abs", [sums]), _scalar(1.0 / 3.0, sums)])
    return _op("Sign", [sums]) * cube_root


# -- normalization -----------------------------------------------------------------------------

def _channel_params(fn: str, channels: int, **params) -> list:
    arrays = []
    for arg, value in params.items():
        value = _array(fn, arg, value)
        if value.shape != (channels,):
            raise InputError(f"{fn}: {arg} must have shape ({channels},), one entry per "
                             f"channel, got {value.shape}")
        arrays.append(value)
    return arrays


def _moved(data: NDArray, source: int, destination: int) -> tuple[NDArray, list]:
    """``data`` with axis ``source`` moved to ``destination``, and the perm that undoes it."""
    if source == destination:
        return data, []
    order = [a for a in range(data.ndim) if a != source]
    order.insert(destination, source)
    return data.transpose(*order), [int(a) for a in np.argsort(order)]


def _moved_back(data: NDArray, undo: list) -> NDArray:
    return data.transpose(*undo) if undo else data


def _fixed_ones(gamma: NDArray) -> NDArray:
    """Ones in ``gamma``'s place whose gradient to ``gamma`` is 0 (so ``gamma.grad`` is
    written with zeros, as MXNet's ``fix_gamma`` does, rather than left as it was)."""
    always = _made_on(gamma.ctx, "asarray", True)
    return _op("Where", [always, _scalar(1, gamma), gamma])


def BatchNorm(data, gamma, beta, moving_mean, moving_var, eps=1e-3, momentum=0.9,
              fix_gamma=True, use_global_stats=False, output_mean_var=False, axis=1,
              cudnn_off=False, min_calib_range=None, max_calib_range=None, name=None):
    """MXNet's ``BatchNorm`` over channel ``axis``. In training mode
    (``autograd.is_training()``: ``record()``, ``train_mode()``) it normalizes by the
    batch's mean and (biased) variance and updates ``moving_mean`` and ``moving_var`` in
    place, ``moving = momentum * moving + (1 - momentum) * batch`` (the same update as
    ``gluon.nn.BatchNorm``'s); otherwise, or with ``use_global_stats``, it uses the moving
    statistics. ``fix_gamma=True`` (the default) uses 1 for gamma and gives gamma a zero
    gradient. ``output_mean_var=True`` returns ``[out, mean, 1 / sqrt(var + eps)]`` (no
    gradient through the last two): MXNet's values, whose third is the inverse standard
    deviation, not the variance its documentation names.

    Differs from MXNet on purpose: MXNet's CPU operator updates the moving statistics in
    its backward pass (its GPU one in the forward, as here), so there a forward alone in
    training leaves them unchanged; with ``fix_gamma`` MXNet also overwrites ``gamma``
    with ones in place, which mixrt does not; and outside training the gradient here is
    that of the normalization computed (by the moving statistics), MXNet's only with
    ``backward(train_mode=False)`` (its default backward differentiates the batch's). ``cudnn_off`` and the calibration ranges are
    accepted and ignored."""
    fn = "BatchNorm"
    data = _array(fn, "data", data)
    if data.ndim < 2:
        raise InputError(f"{fn}: data must have at least 2 dimensions (batch, channel, ...), "
                         f"got shape {data.shape}")
    axis = _axis(fn, axis, data.ndim)
    gamma, beta, moving_mean, moving_var = _channel_params(
        fn, data.shape[axis], gamma=gamma, beta=beta, moving_mean=moving_mean,
        moving_var=moving_var)
    options = {"epsilon": _float(fn, "eps", eps), "momentum": _float(fn, "momentum", momentum)}
    if fix_gamma:
        gamma = _fixed_ones(gamma)
    x, undo = _moved(data, axis, 1)  # ONNX normalizes axis 1
    training = autograd.is_training() and not use_global_stats
    # the op reads detached statistics: the in-place update below then changes nothing the
    # tape recorded (the training-mode gradient never reads them)
    stats = [moving_mean.detach(), moving_var.detach()]
    if training:
        y, new_mean, new_var = dispatch.invoke("", "BatchNormalization",
                                               [x, gamma, beta, *stats],
                                               dict(options, training_mode=1), num_outputs=3)
    else:
        y = _op("BatchNormalization", [x, gamma, beta, *stats], **options)
    out = _moved_back(y, undo)
    if output_mean_var:
        mean, inverse_std = _batch_norm_statistics(x, stats, training, options["epsilon"])
    if training:
        with autograd.pause(train_mode=True):
            moving_mean[:] = new_mean
            moving_var[:] = new_var
    return [out, mean, inverse_std] if output_mean_var else out


def _batch_norm_statistics(x, stats, training, eps) -> tuple[NDArray, NDArray]:
    """(mean, 1 / sqrt(var + eps)) per channel (axis 1 of ``x``): the batch's in training,
    else the moving ones."""
    with autograd.pause(train_mode=autograd.is_training()):
        if training:
            axes = [0] + list(range(2, x.ndim))
            mean = x.mean(axis=axes)
            centred = x - mean.reshape((1, -1) + (1,) * (x.ndim - 2))
            var = (centred * centred).mean(axis=axes)
        else:
            mean, var = stats[0].copy(), stats[1]  # a copy: stats share the moving memory
        return mean, 1.0 / _op("Sqrt", [var + eps])


def LayerNorm(data, gamma, beta, axis=-1, eps=1e-5, output_mean_var=False, name=None):
    """MXNet's ``LayerNorm``: each slice along ``axis`` (one axis) normalized by its mean
    and (biased) variance, then ``* gamma + beta`` (shape: that axis's length).
    ``output_mean_var=True`` returns ``[out, mean, sqrt(var + eps)]``, both with ``axis``
    kept at length 1 (no gradient through them)."""
    fn = "LayerNorm"
    data = _array(fn, "data", data)
    if data.ndim < 1:
        raise InputError(f"{fn}: data must have at least one dimension")
    axis = _axis(fn, axis, data.ndim)
    gamma, beta = _channel_params(fn, data.shape[axis], gamma=gamma, beta=beta)
    eps = _float(fn, "eps", eps)
    # MXNet normalizes in the data's precision (float16 in float32); ONNX's default
    # stash_type would compute float64 data's statistics in float32
    stash = 11 if data.dtype == np.float64 else 1
    x, undo = _moved(data, axis, data.ndim - 1)  # ONNX normalizes the trailing axes
    y = _op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps, stash_type=stash)
    out = _moved_back(y, undo)
    if not output_mean_var:
        return out
    with autograd.pause(train_mode=autograd.is_training()):
        mean = data.mean(axis=axis, keepdims=True)
        centred = data - mean
        std = _op("Sqrt", [(centred * centred).mean(axis=axis, keepdims=True) + eps])
    return [out, mean, std]


def InstanceNorm(data, gamma, beta, eps=1e-3, name=None):
    """MXNet's ``InstanceNorm``: each (sample, channel) map normalized by its own mean and
    (biased) variance, then ``* gamma + beta`` per channel; data of 3 or more dimensions."""
    fn = "InstanceNorm"
    data = _array(fn, "data", data)
    if data.ndim < 3:
        raise InputError(f"{fn}: data must have at least 3 dimensions (batch, channel, "
                         f"spatial...), got shape {data.shape}")
    gamma, beta = _channel_params(fn, data.shape[1], gamma=gamma, beta=beta)
    return _op("InstanceNormalization", [data, gamma, beta], epsilon=_float(fn, "eps", eps))


# -- names ONNX already uses ---------------------------------------------------------------------

_onnx_dropout = dispatch.make_function("", "Dropout")
_onnx_concat = dispatch.make_function("", "Concat")
_onnx_lrn = dispatch.make_function("", "LRN")


def Dropout(data, *args, p=None, mode=None, axes=None, cudnn_off=None, **kwargs):
    """ONNX's ``Dropout(data, ratio, training_mode, seed=)`` as before, or MXNet's
    ``Dropout(data, p=0.5, mode="training", axes=())`` when one of MXNet's keywords
    (``p``, ``mode``, ``axes``, ``cudnn_off``) is given.

    Why only by keyword: a second positional argument already means ONNX's ``ratio``, and
    ONNX's ``Dropout(x, 0.5)`` is the identity unless ``training_mode`` is given, where
    MXNet's drops in training; so ``nd.Dropout(x)`` and ``nd.Dropout(x, 0.5)`` keep ONNX's
    meaning, and MXNet's is ``nd.Dropout(x, p=0.5)``.

    MXNet's: with ``mode="training"``, only in training mode (``autograd.is_training()``;
    the identity otherwise); with ``mode="always"``, always. Each entry is zeroed with
    probability ``p`` and the others scaled by ``1 / (1 - p)``; ``axes`` shares one draw
    along those axes. ``p`` must be in [0, 1) (MXNet's ``p=1`` gives NaN)."""
    mxnet_keywords = {key: value for key, value in (("p", p), ("mode", mode), ("axes", axes),
                                                    ("cudnn_off", cudnn_off))
                      if value is not None}
    if not mxnet_keywords:
        return _onnx_dropout(data, *args, **kwargs)
    onnx_arguments = [key for key in kwargs if key != "name"]
    if args or onnx_arguments:
        raise InputError(f"Dropout: MXNet's keywords {sorted(mxnet_keywords)} cannot be mixed "
                         f"with ONNX's arguments (ratio, training_mode, seed, positional "
                         f"inputs); got {len(args)} positional and {onnx_arguments}")
    return _mxnet_dropout(data, 0.5 if p is None else p, mode or "training", axes or ())


def _mxnet_dropout(data, p, mode, axes) -> NDArray:
    fn = "Dropout"
    data = _array(fn, "data", data)
    p = _float(fn, "p", p)
    if not 0.0 <= p < 1.0:
        raise InputError(f"{fn}: p must be in [0, 1), got {p}")
    _choice(fn, "mode", mode, ("training", "always"))
    shared = {_axis(fn, a, data.ndim, "axes") for a in _tuple(fn, "axes", axes)}
    if p == 0.0 or (mode == "training" and not autograd.is_training()):
        return _op("Identity", [data])
    ratio = _scalar(p, data)
    if not shared:
        return _onnx_dropout(data, ratio, True)
    mask_shape = tuple(1 if a in shared else d for a, d in enumerate(data.shape))
    ones = _made_on(data.ctx, "ones", mask_shape, dtype=data.dtype)
    return data * _onnx_dropout(ones, ratio, True)  # 0 or 1 / (1 - p), broadcast


def Concat(*data, dim=None, num_args=None, axis=None, **kwargs):
    """ONNX's ``Concat(*inputs, axis=)`` when ``axis`` is given, as before; otherwise
    MXNet's ``Concat(*data, dim=1, num_args=)``: the arrays joined along ``dim`` (their
    other dimensions equal). ``axis`` and ``dim`` together are refused."""
    fn = "Concat"
    if axis is not None:
        if dim is not None or num_args is not None:
            raise InputError(f"{fn}: give ONNX's axis= or MXNet's dim= (with num_args=), not "
                             f"both")
        return _onnx_concat(*data, axis=axis, **kwargs)
    if not data:
        raise InputError(f"{fn}: needs at least one array")
    arrays = [_array(fn, "data", d) for d in data]
    if num_args is not None and _int(fn, "num_args", num_args, 1) != len(arrays):
        raise InputError(f"{fn}: num_args={num_args} but {len(arrays)} arrays were given")
    first = arrays[0]
    dim = _axis(fn, 1 if dim is None else dim, first.ndim, "dim")
    for other in arrays[1:]:
        if other.ndim != first.ndim or _without(other.shape, dim) != _without(first.shape, dim):
            raise InputError(f"{fn}: data shapes {first.shape} and {other.shape} must be "
                             f"equal except along dim {dim}")
    return _onnx_concat(*arrays, axis=dim, **kwargs)


def _without(shape: tuple, axis: int) -> tuple:
    return shape[:axis] + shape[axis + 1:]


def LRN(data=None, alpha=None, beta=None, knorm=None, nsize=None, **kwargs):
    """ONNX's ``LRN(X, alpha=1e-4, beta=0.75, bias=1.0, size=)`` when ``size`` is given, as
    before; MXNet's ``LRN(data, alpha=1e-4, beta=0.75, knorm=2, nsize=)`` when ``nsize``
    is: ``x / (knorm + alpha / nsize * sum of x^2 over nsize channels)^beta``, ``nsize``
    odd (MXNet's default ``knorm`` is 2, ONNX's ``bias`` 1). Mixing the two spellings
    (``size`` with ``knorm``, ``nsize`` with ``bias``) is refused."""
    fn = "LRN"
    given = {key: value for key, value in (("alpha", alpha), ("beta", beta)) if value is not None}
    if {"size", "bias", "X"} & set(kwargs):
        if knorm is not None or nsize is not None:
            raise InputError(f"{fn}: give ONNX's size=/bias= or MXNet's nsize=/knorm=, not "
                             f"both")
        return _onnx_lrn(*([] if data is None else [data]), **given, **kwargs)
    data = _array(fn, "data", data)
    if nsize is None:
        raise InputError(f"{fn}: nsize is required (MXNet's name; ONNX's is size)")
    nsize = _int(fn, "nsize", nsize, 1)
    if nsize % 2 == 0:
        raise InputError(f"{fn}: nsize must be odd (MXNet's LRN supports odd sizes only), "
                         f"got {nsize}")
    if data.ndim < 3:
        raise InputError(f"{fn}: data must have at least 3 dimensions (batch, channel, "
                         f"spatial...), got shape {data.shape}")
    attributes = {key: _float(fn, key, value) for key, value in given.items()}
    knorm = 2.0 if knorm is None else _float(fn, "knorm", knorm)
    return _onnx_lrn(data, size=nsize, bias=knorm, **attributes, **kwargs)


# -- shapes and values -------------------------------------------------------------------------

def UpSampling(*data, scale=None, num_filter=0, sample_type=None, multi_input_mode="concat",
               num_args=None, workspace=512, name=None):
    """MXNet's ``UpSampling`` with ``sample_type="nearest"``: each 4-D (batch, channel,
    height, width) input repeated to the first input's size times ``scale`` (each must
    divide it), then concatenated along the channels (``multi_input_mode="concat"``) or
    summed (``"sum"``, equal channel counts). ``"bilinear"`` (a learned deconvolution
    there) is not supported; ``num_filter`` and ``workspace`` are accepted and ignored."""
    fn = "UpSampling"
    _choice(fn, "sample_type", sample_type, ("nearest", "bilinear"))
    if sample_type == "bilinear":
        raise InputError(f"{fn}: sample_type='bilinear' is not supported; use 'nearest', or "
                         f"Deconvolution with a bilinear weight")
    _choice(fn, "multi_input_mode", multi_input_mode, ("concat", "sum"))
    if scale is None:
        raise InputError(f"{fn}: scale is required")
    scale = _int(fn, "scale", scale, 1)
    arrays = [_array(fn, "data", d) for d in data]
    if not arrays:
        raise InputError(f"{fn}: needs at least one array")
    if num_args is not None and _int(fn, "num_args", num_args, 1) != len(arrays):
        raise InputError(f"{fn}: num_args={num_args} but {len(arrays)} arrays were given")
    for array in arrays:
        if array.ndim != 4:
            raise InputError(f"{fn}: data must be 4-D (batch, channel, height, width), got "
                             f"shape {array.shape}")
    target = tuple(size * scale for size in arrays[0].shape[2:])
    outputs = [_nearest(fn, array, target) for array in arrays]
    if len(outputs) == 1:
        return outputs[0]
    if multi_input_mode == "concat":
        return _onnx_concat(*outputs, axis=1)
    if len({o.shape for o in outputs}) != 1:
        raise InputError(f"{fn}: multi_input_mode='sum' needs the same channel count in "
                         f"every input, got {[a.shape[1] for a in arrays]}")
    return functools.reduce(lambda a, b: a + b, outputs)


def _nearest(fn: str, array: NDArray, target: tuple) -> NDArray:
    """``array`` (N, C, H, W) with each pixel repeated into a block: (N, C, *target)."""
    n, c, h, w = array.shape
    if target[0] % h or target[1] % w:
        raise InputError(f"{fn}: an input of spatial shape {(h, w)} does not divide the "
                         f"output's {target}")
    sh, sw = target[0] // h, target[1] // w
    blocks = _op("Expand", [array.reshape(n, c, h, 1, w, 1), _ints([n, c, h, sh, w, sw],
                                                                     array.ctx)])
    return blocks.reshape(n, c, h * sh, w * sw)


def clip(data, a_min, a_max, name=None):
    """MXNet's ``clip``: ``data`` limited to ``[a_min, a_max]`` (the gradient is 1 inside,
    bounds included, and 0 outside). ``a_min > a_max`` is refused. (As mixrt's ``clip``
    before it, a bound may be None, for one side only.)"""
    fn = "clip"
    data = _array(fn, "data", data)
    bounds = []
    for arg, value in (("a_min", a_min), ("a_max", a_max)):
        if value is not None and not isinstance(value, NDArray):
            value = _float(fn, arg, value)
        bounds.append(value)
    low, high = bounds
    if isinstance(low, float) and isinstance(high, float) and low > high:
        raise InputError(f"{fn}: a_min={a_min} is larger than a_max={a_max}")
    return _op("Clip", [data, low, high])


# -- SoftmaxOutput -----------------------------------------------------------------------------

def SoftmaxOutput(data, label, grad_scale=1.0, ignore_label=-1.0, multi_output=False,
                  use_ignore=False, preserve_shape=False, normalization="null",
                  out_grad=False, smooth_alpha=0.0, name=None):
    """MXNet's ``SoftmaxOutput``: forward, the softmax of ``data`` over the classes; its
    backward is MXNet's, not the softmax's: ``(softmax - one_hot(label)) * grad_scale /
    norm``, the head gradient ignored (``out_grad=True`` multiplies by it), the label's
    gradient 0. Layouts: ``data`` (batch, classes) with ``label`` (batch,);
    ``preserve_shape``: classes last, ``label`` of the leading shape; ``multi_output``:
    (batch, classes, d1, ...) with ``label`` (batch, d1, ...) or (batch, d1 * ...).
    ``norm`` is 1 for ``normalization="null"`` (``multi_output``: d1 * ..., as MXNet),
    the number of labels for ``"batch"``, the number not equal to ``ignore_label`` for
    ``"valid"`` (at least 1; counted even without ``use_ignore``, as MXNet does).
    ``use_ignore`` zeroes the gradient where the label is ``ignore_label``;
    ``smooth_alpha`` puts ``1 - smooth_alpha`` on the label's class and spreads the rest
    over the others. Labels are truncated to integers; one out of range has no class.

    Differs from MXNet: ``smooth_alpha`` with ``multi_output`` is refused (MXNet ignores
    it there), and ``out_grad=True`` multiplies by the head gradient as documented (MXNet
    1.9.1's CPU operator multiplies by its own output instead)."""
    fn = "SoftmaxOutput"
    data = _array(fn, "data", data)
    label = _array(fn, "label", label)
    _choice(fn, "normalization", normalization, ("null", "batch", "valid"))
    grad_scale = _float(fn, "grad_scale", grad_scale)
    ignore_label = _float(fn, "ignore_label", ignore_label)
    smooth_alpha = _float(fn, "smooth_alpha", smooth_alpha)
    if multi_output and preserve_shape:
        raise InputError(f"{fn}: give multi_output or preserve_shape, not both")
    if multi_output and smooth_alpha:
        raise InputError(f"{fn}: smooth_alpha with multi_output is not supported (MXNet "
                         f"ignores it there)")
    axis, label_shape, per_label = _softmax_output_layout(fn, data, multi_output,
                                                          preserve_shape)
    if label.shape != label_shape:
        flat = label_shape[:1] + (int(np.prod(label_shape[1:])),)
        if not (multi_output and label.shape == flat):
            raise InputError(f"{fn}: label must have shape {label_shape} for data "
                             f"{data.shape}, got {label.shape}")
    classes = data.shape[axis]
    if smooth_alpha and classes < 2:
        raise InputError(f"{fn}: smooth_alpha needs at least 2 classes, got {classes}")
    with autograd.pause(train_mode=autograd.is_training()):
        index = label.reshape(label_shape).astype(np.int64)
        counted = _op("Not", [_op("Equal", [index, _ints([int(ignore_label)],
                                                          index.ctx).reshape(())])])
    if normalization == "valid":  # a read back to the host: only when asked for
        norm = max(1, int(counted.astype(np.int64).sum().asscalar()))
    else:
        norm = per_label if normalization == "null" else int(np.prod(label_shape))
    settings = _SoftmaxOutputSettings(axis, classes, grad_scale / norm, smooth_alpha,
                                      bool(out_grad), counted if use_ignore else None)
    return _SoftmaxOutputFunction(settings, index)(data, label)


def _softmax_output_layout(fn, data, multi_output, preserve_shape) -> tuple[int, tuple, int]:
    """(the classes' axis, the label's shape, ``normalization="null"``'s divisor)."""
    if multi_output:
        if data.ndim < 2:
            raise InputError(f"{fn}: multi_output needs data (batch, classes, ...), got "
                             f"shape {data.shape}")
        return 1, data.shape[:1] + data.shape[2:], int(np.prod(data.shape[2:]))
    if preserve_shape:
        if data.ndim < 1:
            raise InputError(f"{fn}: data must have at least one dimension")
        return data.ndim - 1, data.shape[:-1], 1
    if data.ndim != 2:
        raise InputError(f"{fn}: data must be 2-D (batch, classes), got shape {data.shape}; "
                         f"use multi_output=True (classes on axis 1) or preserve_shape=True "
                         f"(classes last) for more dimensions")
    return 1, data.shape[:1], 1


class _SoftmaxOutputSettings:
    def __init__(self, axis, classes, scale, smooth_alpha, out_grad, counted):
        self.axis, self.classes, self.scale = axis, classes, scale
        self.smooth_alpha, self.out_grad, self.counted = smooth_alpha, out_grad, counted


class _SoftmaxOutputFunction(autograd.Function):
    """The softmax forward, with MXNet's backward (see ``SoftmaxOutput``)."""

    def __init__(self, settings: _SoftmaxOutputSettings, index: NDArray):
        super().__init__()
        self.settings, self.index = settings, index

    def forward(self, data, label):
        out = _op("Softmax", [data], axis=self.settings.axis)
        self.save_for_backward(out)
        self.label_like = (label.shape, label.dtype)
        return out

    def backward(self, head):
        s = self.settings
        out, = self.saved_tensors
        target = one_hot(self.index, s.classes, dtype=out.dtype)  # classes last
        if s.smooth_alpha:
            other = s.smooth_alpha / (s.classes - 1)
            target = target * (1.0 - s.smooth_alpha - other) + other
        if s.axis != out.ndim - 1:
            target, _ = _moved(target, target.ndim - 1, s.axis)
        grad = out - target
        if s.counted is not None:  # use_ignore: no gradient where the label is ignored
            grad = grad * s.counted.astype(out.dtype).expand_dims(s.axis)
        grad = grad * s.scale
        if s.out_grad:
            grad = grad * head
        shape, dtype = self.label_like
        return grad, _made_on(out.ctx, "zeros", shape, dtype=dtype)  # the label's: 0


FUNCTIONS = ["Convolution", "Deconvolution", "Pooling", "BatchNorm", "LayerNorm",
             "InstanceNorm", "UpSampling", "clip", "SoftmaxOutput"]

# ONNX op names given MXNet's spellings too (their ONNX calls unchanged)
EXTENDED = ["Dropout", "Concat", "LRN"]
