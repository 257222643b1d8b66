"""MXNet 1.x's layers on NDArrays (``nd.Convolution``, ``nd.Pooling``, ``nd.BatchNorm``,
``nd.SoftmaxOutput``, ...), with MXNet's argument names and defaults.

The layers MXNet's three front ends share (FullyConnected, Convolution, Deconvolution,
Pooling, BatchNorm, Activation, LeakyReLU, Embedding, SoftmaxOutput) are written once in
``mixrt/layers/``; :class:`ArrayCall` is how they run here: every op at once through
``mixrt.dispatch`` on the data's device, the parameters given as NDArrays and checked
against the shapes the data implies, the gradient under ``autograd.record()`` through the
ops' own gradient definitions (``SoftmaxOutput`` has MXNet's own backward, an
``autograd.Function``). Bad arguments raise ``InputError`` naming the layer and the
argument. Data is channels-first (``NCW``, ``NCHW``, ``NCDHW``).

The rest are MXNet's names on NDArrays only: ``LayerNorm``, ``InstanceNorm``,
``UpSampling``, ``clip``, and three that are already ONNX ops in ``mixrt.nd`` with other
signatures, ``Dropout``, ``Concat`` and ``LRN`` (``EXTENDED``). Their ONNX calls keep
working unchanged; MXNet's spellings are accepted where they cannot be mistaken for ONNX's
(``Dropout(x, p=0.5)``, ``Concat(a, b)`` or ``Concat(a, b, dim=0)``, ``LRN(x, nsize=5)``):
see each docstring. ``Flatten`` needs nothing: ONNX's ``Flatten(x)`` (axis 1) is MXNet's.

MXNet's CPU quirks followed, for its values: pooling windows that lie wholly in the padding
give the dtype's lowest value (max) or 0; ``BatchNorm(output_mean_var=True)``'s third
output is ``1 / sqrt(var + eps)``; ``SoftmaxOutput``'s ``multi_output`` scales
``normalization="null"`` by ``1 / (spatial size)``.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt import dispatch, layers, tape
from mixrt.base.errors import InputError
from mixrt.layers.call import LayerCall, ShapeRule
from mixrt.nd.mxnet_args import (_array, _axis, _choice, _int, _invoke, _made_on, _op,
                                 _scalar, _tuple)
from mixrt.nd.mxnet_indexing import one_hot
from mixrt.nd.ndarray import NDArray, _ints


# -- the shared layers, on NDArrays ------------------------------------------------------------

class ArrayCall(LayerCall):
    """A layer of ``mixrt/layers/`` called on NDArrays (or on the stand-ins for traced
    symbols that ``mixrt.sym.mxnet_ops`` passes): shapes are known, so parameters are
    checked against them, and every op runs at once."""

    error_type = InputError

    def data(self, value, argument: str = "data"):
        if value is None:
            raise self.error(f"{argument} is required")
        value = _array(self.kind, argument, value)
        self.ctx = value.ctx
        return value

    def parameter(self, role: str, given, *, rule: ShapeRule | None = None, shape=None,
                  aux: bool = False, init=None, dtype=None, single_ok: bool = False):
        if given is None:
            raise self.error(f"{role} is required")
        given = _array(self.kind, role, given)
        if single_ok and given.shape == (1,):
            return given
        expected = shape
        if rule is not None:
            expected = rule.shape(tuple(rule.of.shape))
        if expected is not None and (len(expected) != given.ndim or any(
                e is not None and e != g for e, g in zip(expected, given.shape))):
            wanted = tuple("?" if e is None else e for e in expected)
            raise self.error(f"{role} must have shape {wanted}, got {given.shape}")
        return given

    def node(self, op_type: str, inputs: list, role: str | None = None, **attributes):
        return _invoke(op_type, inputs, attributes)

    def scalar(self, value: float, like, role: str):
        return _scalar(value, like)

    def ints(self, values):
        if isinstance(values, (int, np.integer)):
            return _ints([values], self.ctx).reshape(())
        return _ints(values, self.ctx)

    def known_shape(self, value) -> tuple:
        return tuple(value.shape)

    def known_dtype(self, value) -> np.dtype:
        return value.dtype

    def in_training(self) -> bool:
        return tape.is_training()

    def batch_normalization(self, x, scale, beta, mean, var, eps, momentum, output_mean_var,
                            role):
        """In training, the batch's statistics, and ``mean`` and ``var`` updated in place
        (as ``gluon.nn.BatchNorm`` does); else the running ones."""
        options = {"epsilon": eps, "momentum": momentum}
        training = tape.is_training()
        # the op reads detached statistics: the in-place update below then changes nothing
        # the tape recorded (the training-mode gradient never reads them)
        stats = [mean.detach(), var.detach()]
        if training:
            y, new_mean, new_var = dispatch.invoke(
                "", "BatchNormalization", [x, scale, beta, *stats],
                dict(options, training_mode=1), num_outputs=3)
        else:
            y = _op("BatchNormalization", [x, scale, beta, *stats], **options)
        extra = list(_batch_norm_statistics(x, stats, training, eps)) if output_mean_var \
            else []
        if training:
            with tape.pause(train_mode=True):
                mean[:] = new_mean
                var[:] = new_var
        return y, extra

    def softmax_output(self, data, label, options):
        return _softmax_output(self, data, label, options)


# FullyConnected, Convolution, Deconvolution, Pooling, BatchNorm, Activation, LeakyReLU,
# Embedding, SoftmaxOutput
globals().update(layers.bind_all(ArrayCall))


# -- argument helpers --------------------------------------------------------------------------

def _float(fn: str, arg: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise InputError(f"{fn}: {arg} must be a number, got {value!r}")
    return float(value)


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


def _batch_norm_statistics(x, stats, training, eps) -> tuple[NDArray, NDArray]:
    """(mean, 1 / sqrt(var + eps)) per channel (axis 1 of ``x``): the batch's in training,
    else the moving ones."""
    with tape.pause(train_mode=tape.is_training()):
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
    with tape.pause(train_mode=tape.is_training()):
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
    if p == 0.0 or (mode == "training" and not tape.is_training()):
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


# -- SoftmaxOutput's backward ------------------------------------------------------------------

def _softmax_output(layer: ArrayCall, data, label, options):
    """The softmax, with MXNet's backward (``mixrt.layers.output.SoftmaxOutput``)."""
    label = layer.data(label, "label")
    shape = data.shape
    if options.flattened:
        data = data.reshape(shape[0], -1) if data.ndim != 2 else data
    axis, label_shape, per_label = _softmax_output_layout(layer, data, options)
    if label.shape != label_shape:
        flat = label_shape[:1] + (int(np.prod(label_shape[1:])),)
        if not (options.multi_output and label.shape == flat):
            raise layer.error(f"label must have shape {label_shape} for data {shape}, got "
                              f"{label.shape}")
    classes = data.shape[axis]
    if options.smooth_alpha and classes < 2:
        raise layer.error(f"smooth_alpha needs at least 2 classes, got {classes}")
    with tape.pause(train_mode=tape.is_training()):
        index = label.reshape(label_shape).astype(np.int64)
        ignored = _ints([int(options.ignore_label)], index.ctx).reshape(())
        counted = _op("Not", [_op("Equal", [index, ignored])])
    if options.normalization == "valid":  # a read back to the host: only when asked for
        norm = max(1, int(counted.astype(np.int64).sum().asscalar()))
    else:
        norm = per_label if options.normalization == "null" else int(np.prod(label_shape))
    settings = _SoftmaxOutputSettings(axis, classes, options.grad_scale / norm,
                                      options.smooth_alpha, options.out_grad,
                                      counted if options.use_ignore else None)
    out = _SoftmaxOutputFunction(settings, index)(data, label)
    return out.reshape(shape) if options.flattened else out


def _softmax_output_layout(layer, data, options) -> tuple[int, tuple, int]:
    """(the classes' axis, the label's shape, ``normalization="null"``'s divisor)."""
    if options.multi_output:
        if data.ndim < 2:
            raise layer.error(f"multi_output needs data (batch, classes, ...), got shape "
                              f"{data.shape}")
        return 1, data.shape[:1] + data.shape[2:], int(np.prod(data.shape[2:]))
    if data.ndim < 1:
        raise layer.error("data must have at least one dimension")
    if options.preserve_shape:
        return data.ndim - 1, data.shape[:-1], 1
    return 1, data.shape[:1], 1


class _SoftmaxOutputSettings:
    def __init__(self, axis, classes, scale, smooth_alpha, out_grad, counted):
        self.axis, self.classes, self.scale = axis, classes, scale
        self.smooth_alpha, self.out_grad, self.counted = smooth_alpha, out_grad, counted


class _SoftmaxOutputFunction(tape.Function):
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


FUNCTIONS = [*layers.LAYERS, "LayerNorm", "InstanceNorm", "UpSampling", "clip"]

# ONNX op names given MXNet's spellings too (their ONNX calls unchanged)
EXTENDED = ["Dropout", "Concat", "LRN"]
