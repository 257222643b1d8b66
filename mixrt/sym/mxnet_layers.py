"""MXNet 1.x's layer symbols (``sym.FullyConnected``, ``sym.Convolution``, ``sym.BatchNorm``,
``sym.SoftmaxOutput``, ...) with MXNet's argument names, defaults and parameter names.

    data = sym.Variable("data")
    fc1 = sym.FullyConnected(data, num_hidden=128, name="fc1")     # fc1_weight, fc1_bias
    net = sym.SoftmaxOutput(sym.Activation(fc1, act_type="relu"), name="softmax")
    net.infer_shape(data=(32, 784))    # fc1_weight (128, 784), softmax_label (32,)

Each layer is composed of registered ONNX ops (so it exports, binds and differentiates like
any symbol) under one name: the node that gives the layer's output is named after the
layer (``fc1``, output ``fc1_output``), the others ``<layer>_<role>``. Without ``name=`` a
layer gets MXNet's automatic one (``fullyconnected0``, ``convolution1``). Parameters left out
become Variables named MXNet's way (``<layer>_weight``, ``_bias``, ``_gamma``, ``_beta``; the
running statistics ``_moving_mean``/``_moving_var`` are auxiliary states) whose shapes follow
from the data's (``mixrt.sym.ops.SHAPE_FROM``), so ``infer_shape(data=...)`` and
``simple_bind`` need nothing else. A bare Variable passed as a parameter (a shared weight)
learns the same rule when it has no shape of its own.

The ``*Output`` layers (SoftmaxOutput, LinearRegressionOutput, LogisticRegressionOutput,
MAERegressionOutput) compute MXNet's forward value (softmax / identity / sigmoid) and take a
label Variable ``<layer>_label`` that the forward value does not depend on (it is read for
its size only, so it is an argument with an inferred shape, as in MXNet). Deliberate
difference: MXNet's backward of these layers is its loss gradient, whatever the head
gradient; an Executor here differentiates the forward value like any other output. Train
them with :meth:`mixrt.module.Module.from_symbol`, which reads the layer
(:func:`output_layer`) and attaches the loss whose gradient is MXNet's.

Names that ``mixrt.sym`` already has as ONNX operators (``Flatten``, ``Concat``, ``Dropout``,
``Reshape``, ``LRN``, ``Pad``, ``Cast``, ...) keep their ONNX meaning; only names ONNX does not
use are defined here. Bad arguments raise GraphError naming the layer and the argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mixrt.base.errors import GraphError
from mixrt.initializer import Constant
from mixrt.sym.ops import call_op, layer_name, shape_from, SHAPE_FROM
from mixrt.sym.symbol import constant, prefixed, variable_named, Symbol

# node.info key of an *Output layer's head: what Module.from_symbol trains it with
OUTPUT_INFO = "mxnet_output"
_INT64 = 7  # onnx.TensorProto.INT64
# performance hints MXNet takes and mixrt has no use for
_IGNORED = ("workspace", "cudnn_tune", "cudnn_off")


# -- one layer being built ---------------------------------------------------------------------

class _Layer:
    """A layer's name (given or automatic), its nodes' names, and argument checks whose
    errors name the function, the layer and the argument."""

    def __init__(self, kind: str, name, unknown: dict | None = None):
        if name is not None and (not isinstance(name, str) or not name):
            raise GraphError(f"{kind}: name must be a non-empty string, got {name!r}")
        self.kind = kind
        self.base = layer_name(kind, name)
        self.name = prefixed(self.base)
        unknown = {k: v for k, v in (unknown or {}).items() if k not in _IGNORED}
        if unknown:
            raise self.error(f"unknown argument(s) {sorted(unknown)}")

    def error(self, message: str) -> GraphError:
        return GraphError(f"{self.kind} {self.name!r}: {message}")

    def node_name(self, role: str | None = None) -> str:
        return self.name if role is None else f"{self.name}_{role}"

    def node(self, op_type: str, inputs, role: str | None = None, **attributes) -> Symbol:
        """One op of the layer: its output node (``role`` None) or ``<layer>_<role>``."""
        base = self.base if role is None else f"{self.base}_{role}"
        return call_op("", op_type, list(inputs), attributes, name=base)

    def scalar(self, value: float, like: Symbol, role: str) -> Symbol:
        """A number in ``like``'s dtype (stored in it when the graph is lowered)."""
        return self.node("CastLike", [constant(np.float64(value)), like], role)

    def ints(self, values) -> Symbol:
        return constant(np.asarray(values, dtype=np.int64))

    # -- inputs ---------------------------------------------------------------------------

    def symbol(self, argument: str, value) -> Symbol:
        if not isinstance(value, Symbol) or len(value) != 1:
            raise self.error(f"{argument} must be a single-output Symbol, got {value!r}")
        return value

    def data(self, value, argument: str = "data") -> Symbol:
        """The data input; left out, a Variable ``<layer>_data`` (as MXNet makes one)."""
        if value is None:
            return variable_named(self.node_name(argument))
        return self.symbol(argument, value)

    def parameter(self, role: str, given, *, shape=None, source: dict | None = None,
                  aux: bool = False, init=None, dtype=None) -> Symbol:
        """``given``, or a new Variable ``<layer>_<role>`` with what is known of its shape
        and the rule that completes it from the data's."""
        if given is not None:
            given = self.symbol(role, given)
            _adopt(given, source)
            return given
        return variable_named(self.node_name(role), shape, dtype, init, aux=aux,
                              attr=None if source is None else {SHAPE_FROM: source})

    # -- arguments ------------------------------------------------------------------------

    def count(self, argument: str, value, minimum: int = 1) -> int:
        if value is None:
            raise self.error(f"{argument} is required")
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or value < minimum:
            raise self.error(f"{argument} must be an int >= {minimum}, got {value!r}")
        return int(value)

    def number(self, argument: str, value, *, positive: bool = False) -> float:
        if isinstance(value, (bool, np.bool_)) or not isinstance(
                value, (int, float, np.integer, np.floating)) or not math.isfinite(value) \
                or (positive and value <= 0):
            kind = "a positive" if positive else "a finite"
            raise self.error(f"{argument} must be {kind} number, got {value!r}")
        return float(value)

    def flag(self, argument: str, value) -> bool:
        if not isinstance(value, (bool, np.bool_)) and value not in (0, 1):
            raise self.error(f"{argument} must be True or False, got {value!r}")
        return bool(value)

    def choice(self, argument: str, value, allowed) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise self.error(f"{argument}={value!r} is not one of {list(allowed)}")
        return value

    def shape(self, argument: str, value, *, length=None, default=None,
              minimum: int = 0) -> tuple:
        """A tuple of ints (an int is a 1-tuple, as MXNet reads it); ``()`` or None means
        ``default`` repeated ``length`` times."""
        if value is None or (isinstance(value, (tuple, list)) and not value):
            if default is None:
                raise self.error(f"{argument} is required")
            return (default,) * length
        items = (value,) if isinstance(value, (int, np.integer)) else value
        if not isinstance(items, (tuple, list)) or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                and v >= minimum for v in items):
            raise self.error(f"{argument} must be a tuple of ints >= {minimum}, got "
                             f"{value!r}")
        if length is not None and len(items) != length:
            raise self.error(f"{argument}={tuple(items)} has {len(items)} dimensions; the "
                             f"kernel has {length}")
        return tuple(int(v) for v in items)

    def layout(self, value, spatial: int) -> None:
        wanted = "NC" + "DHW"[3 - spatial:]
        if value is not None and value != wanted:
            raise self.error(f"layout={value!r} is not supported; only {wanted!r} (channels "
                             f"first) for a {spatial}-d kernel")

    def kernel(self, value) -> tuple:
        kernel = self.shape("kernel", value, minimum=1)
        if not 1 <= len(kernel) <= 3:
            raise self.error(f"kernel must have 1 to 3 dimensions, got {kernel}")
        return kernel


def _adopt(given: Symbol, source: dict | None) -> None:
    """A bare Variable of unknown shape passed as a parameter gets the shape rule of the
    parameter it stands for (what MXNet's backward shape inference gives it)."""
    node = given._outputs[0][0]
    declared = node.info.get("shape")
    if source is None or not node.is_variable or SHAPE_FROM in node.info or (
            declared is not None and all(d is not None for d in declared)):
        return
    node.info[SHAPE_FROM] = source


# -- dense, convolution, pooling -------------------------------------------------------------

def FullyConnected(data=None, weight=None, bias=None, num_hidden=None, no_bias=False,
                   flatten=True, name=None, **unknown) -> Symbol:
    """``data @ weight.T + bias`` with ``weight`` (num_hidden, in_units). ``flatten``
    (default) flattens the data to (batch, in_units) first; ``flatten=False`` applies to the
    last axis and keeps the others."""
    layer = _Layer("FullyConnected", name, unknown)
    num_hidden = layer.count("num_hidden", num_hidden)
    no_bias, flatten = layer.flag("no_bias", no_bias), layer.flag("flatten", flatten)
    data = layer.data(data)
    # the node reading the data (flattened or not) and the axis holding in_units
    reader = layer.node_name() if flatten else layer.node_name(None if no_bias else "matmul")
    weight = layer.parameter("weight", weight, shape=(num_hidden, None), source=shape_from(
        reader, 0, [num_hidden, ["axis", 1 if flatten else -1]]))
    bias = None if no_bias else layer.parameter(
        "bias", bias, shape=(num_hidden,), source=shape_from(reader, 0, [num_hidden]))
    if flatten:
        rows = layer.node("Flatten", [data], "flatten", axis=1)
        return layer.node("Gemm", [rows, weight] + ([] if no_bias else [bias]), transB=1)
    transposed = layer.node("Transpose", [weight], "weight_t", perm=[1, 0])
    product = layer.node("MatMul", [data, transposed], None if no_bias else "matmul")
    return product if no_bias else layer.node("Add", [product, bias])


def _window_arguments(layer: _Layer, kernel, stride, dilate, pad) -> dict:
    spatial = len(kernel)
    stride = layer.shape("stride", stride, length=spatial, default=1, minimum=1)
    dilate = layer.shape("dilate", dilate, length=spatial, default=1, minimum=1)
    pad = layer.shape("pad", pad, length=spatial, default=0)
    return {"kernel_shape": list(kernel), "strides": list(stride), "dilations": list(dilate),
            "pads": list(pad) * 2}


def _filters(layer, num_filter, num_group) -> tuple[int, int]:
    """Convolution's and Deconvolution's num_filter and num_group: counts, one a multiple
    of the other."""
    num_filter = layer.count("num_filter", num_filter)
    num_group = layer.count("num_group", num_group)
    if num_filter % num_group:
        raise layer.error(f"num_filter={num_filter} is not a multiple of "
                          f"num_group={num_group}")
    return num_filter, num_group


def Convolution(data=None, weight=None, bias=None, kernel=None, stride=(), dilate=(), pad=(),
                num_filter=None, num_group=1, no_bias=False, layout=None, name=None,
                **unknown) -> Symbol:
    """1-, 2- or 3-d convolution over channels-first data; ``weight`` is
    (num_filter, channels / num_group, *kernel)."""
    layer = _Layer("Convolution", name, unknown)
    kernel = layer.kernel(kernel)
    window = _window_arguments(layer, kernel, stride, dilate, pad)
    num_filter, num_group = _filters(layer, num_filter, num_group)
    no_bias = layer.flag("no_bias", no_bias)
    layer.layout(layout, len(kernel))
    data = layer.data(data)
    reader = layer.node_name()
    weight = layer.parameter("weight", weight, shape=(num_filter, None, *kernel),
                             source=shape_from(reader, 0, [num_filter, ["axis", 1, num_group],
                                                           *kernel]))
    bias = None if no_bias else layer.parameter(
        "bias", bias, shape=(num_filter,), source=shape_from(reader, 0, [num_filter]))
    inputs = [data, weight] + ([] if no_bias else [bias])
    return layer.node("Conv", inputs, group=num_group, **window)


def Deconvolution(data=None, weight=None, bias=None, kernel=None, stride=(), dilate=(),
                  pad=(), adj=(), target_shape=(), num_filter=None, num_group=1,
                  no_bias=True, layout=None, name=None, **unknown) -> Symbol:
    """Transposed convolution; ``weight`` is (channels, num_filter / num_group, *kernel).
    ``adj`` adds to the output's far side; ``target_shape`` (the output's spatial size)
    replaces ``pad`` and ``adj`` (ONNX ConvTranspose's ``output_shape``). As in MXNet,
    ``no_bias`` defaults to True: no bias unless ``no_bias=False``."""
    layer = _Layer("Deconvolution", name, unknown)
    kernel = layer.kernel(kernel)
    window = _window_arguments(layer, kernel, stride, dilate, pad)
    adj = layer.shape("adj", adj, length=len(kernel), default=0)
    if any(a >= s for a, s in zip(adj, window["strides"])):
        raise layer.error(f"adj={adj} must be smaller than stride={tuple(window['strides'])}")
    num_filter, num_group = _filters(layer, num_filter, num_group)
    no_bias = layer.flag("no_bias", no_bias)
    layer.layout(layout, len(kernel))
    if target_shape:
        window["output_shape"] = list(layer.shape("target_shape", target_shape,
                                                  length=len(kernel), minimum=1))
        del window["pads"]
    elif any(adj):
        window["output_padding"] = list(adj)
    data = layer.data(data)
    reader = layer.node_name()
    per_group = num_filter // num_group
    weight = layer.parameter("weight", weight, shape=(None, per_group, *kernel),
                             source=shape_from(reader, 0, [["axis", 1], per_group, *kernel]))
    bias = None if no_bias else layer.parameter(
        "bias", bias, shape=(num_filter,), source=shape_from(reader, 0, [num_filter]))
    inputs = [data, weight] + ([] if no_bias else [bias])
    return layer.node("ConvTranspose", inputs, group=num_group, **window)


_POOL_TYPES = ("max", "avg", "sum")
_CONVENTIONS = ("valid", "full")


def Pooling(data=None, kernel=(), pool_type="max", global_pool=False,
            pooling_convention="valid", stride=(), pad=(), count_include_pad=None,
            layout=None, name=None, **unknown) -> Symbol:
    """Max, average or sum pooling over channels-first data. ``stride`` defaults to 1,
    ``pad`` to 0; ``pooling_convention="full"`` rounds the output size up (windows may
    reach past the padding); ``count_include_pad`` (default True) makes the average divide
    by the whole window, pads included; ``global_pool`` pools all of each channel."""
    layer = _Layer("Pooling", name, unknown)
    pool_type = layer.choice("pool_type", pool_type, _POOL_TYPES)
    convention = layer.choice("pooling_convention", pooling_convention, _CONVENTIONS)
    include_pad = True if count_include_pad is None else layer.flag("count_include_pad",
                                                                    count_include_pad)
    if layer.flag("global_pool", global_pool):
        return _global_pool(layer, layer.data(data), pool_type)
    kernel = layer.kernel(kernel)
    layer.layout(layout, len(kernel))
    window = _window_arguments(layer, kernel, stride, (), pad)
    del window["dilations"]
    data = layer.data(data)
    if pool_type == "max":
        return layer.node("MaxPool", [data], ceil_mode=int(convention == "full"), **window)
    if pool_type == "avg":
        return layer.node("AveragePool", [data], ceil_mode=int(convention == "full"),
                          count_include_pad=int(include_pad), **window)
    # sum: a whole-window average times the window's size. "full" rounds up by padding the
    # far side by stride - 1 more (zeros: they add nothing) instead of ceil_mode, whose
    # average would not divide the overhanging windows by the whole window
    if convention == "full":
        spatial = len(kernel)
        window["pads"] = window["pads"][:spatial] + [
            p + s - 1 for p, s in zip(window["pads"][spatial:], window["strides"])]
    average = layer.node("AveragePool", [data], "average", count_include_pad=1, **window)
    return layer.node("Mul", [average, layer.scalar(math.prod(kernel), data, "size")])


def _global_pool(layer: _Layer, data: Symbol, pool_type: str) -> Symbol:
    if pool_type == "max":
        return layer.node("GlobalMaxPool", [data])
    if pool_type == "avg":
        return layer.node("GlobalAveragePool", [data])
    # sum: the average times the number of pooled elements (the data's rank is not known
    # here, so no ReduceSum over "every axis after the channels")
    average = layer.node("GlobalAveragePool", [data], "average")
    sizes = layer.node("Shape", [data], "spatial_shape", start=2)
    count = layer.node("ReduceProd", [sizes], "count", keepdims=0)
    return layer.node("Mul", [average, layer.node("CastLike", [count, data], "size")])


# -- normalization and activations -------------------------------------------------------------

def BatchNorm(data=None, gamma=None, beta=None, moving_mean=None, moving_var=None, eps=1e-3,
              momentum=0.9, fix_gamma=True, use_global_stats=False, output_mean_var=False,
              axis=1, name=None, **unknown) -> Symbol:
    """Batch normalization over ``axis`` (the channels). In training (``is_train``, fit)
    it uses the batch's statistics and updates the running ones (auxiliary states
    ``<layer>_moving_mean``/``_moving_var``: ``moving = moving * momentum + batch * (1 -
    momentum)``), else the running ones. ``fix_gamma`` (MXNet's default) scales by 1 and
    gives ``gamma`` no gradient; ``use_global_stats`` uses the running statistics in
    training too (and leaves them as they are)."""
    layer = _Layer("BatchNorm", name, unknown)
    eps = layer.number("eps", eps, positive=True)
    momentum = layer.number("momentum", momentum)
    fix_gamma = layer.flag("fix_gamma", fix_gamma)
    use_global_stats = layer.flag("use_global_stats", use_global_stats)
    if layer.flag("output_mean_var", output_mean_var):
        raise layer.error("output_mean_var=True is not supported")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise layer.error(f"axis must be an int, got {axis!r}")
    axis = int(axis)
    data = layer.data(data)
    plain = axis == 1 and not use_global_stats
    # the node that reads the data: the statistics' shape is the data's channel count
    reader = layer.node_name() if plain else layer.node_name("channels_middle")
    # MXNet keeps a BatchNorm's parameters float32 for float16 data
    source = shape_from(reader, 0, [["axis", axis]], min_float_bits=32)
    gamma = layer.parameter("gamma", gamma, source=source)
    beta = layer.parameter("beta", beta, source=source)
    mean = layer.parameter("moving_mean", moving_mean, source=source, aux=True)
    var = layer.parameter("moving_var", moving_var, source=source, aux=True)
    scale = _ones_like(layer, gamma) if fix_gamma else gamma
    if plain:
        return layer.node("BatchNormalization", [data, scale, beta, mean, var],
                          epsilon=eps, momentum=momentum)
    middle = _channels_in_middle(layer, data, axis)
    if use_global_stats:
        normalized = _normalized_by(layer, middle, scale, beta, mean, var, eps)
    else:
        normalized = layer.node("BatchNormalization", [middle, scale, beta, mean, var],
                                "norm", epsilon=eps, momentum=momentum)
    return layer.node("Reshape", [normalized, layer.node("Shape", [data], "shape")])


def _ones_like(layer: _Layer, gamma: Symbol) -> Symbol:
    """Ones of gamma's shape and dtype, read from gamma's shape only: no gradient reaches
    gamma, whatever its value (MXNet's fix_gamma)."""
    one = layer.scalar(1.0, gamma, "one")
    return layer.node("Expand", [one, layer.node("Shape", [gamma], "gamma_shape")],
                      "gamma_fixed")


def _channels_in_middle(layer: _Layer, data: Symbol, axis: int) -> Symbol:
    """The data as (before, channels, after) (the data's rank is not known here, so the
    target shape is computed from its shape)."""
    before = layer.node("ReduceProd", [layer.node("Shape", [data], "shape_before", end=axis)],
                        "before", keepdims=1)
    channels = layer.node("Shape", [data], "shape_channels", start=axis,
                          **({} if axis == -1 else {"end": axis + 1}))
    target = layer.node("Concat", [before, channels, layer.ints([-1])], "middle_shape",
                        axis=0)
    return layer.node("Reshape", [data, target], "channels_middle")


def _normalized_by(layer, middle, scale, beta, mean, var, eps) -> Symbol:
    """(x - mean) / sqrt(var + eps) * scale + beta with the given statistics, on data
    shaped (before, channels, after)."""
    def column(value, role):
        return layer.node("Reshape", [value, layer.ints([-1, 1])], f"{role}_column")
    centered = layer.node("Sub", [middle, column(mean, "mean")], "centered")
    spread = layer.node("Sqrt", [layer.node("Add", [column(var, "var"), layer.scalar(
        eps, var, "eps")], "var_eps")], "std")
    scaled = layer.node("Mul", [layer.node("Div", [centered, spread], "standard"),
                                column(scale, "scale")], "scaled")
    return layer.node("Add", [scaled, column(beta, "beta")], "norm")


_ACTIVATIONS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softrelu": "Softplus",
                "softsign": "Softsign"}


def Activation(data=None, act_type=None, name=None, **unknown) -> Symbol:
    """Elementwise ``act_type``: relu, sigmoid, tanh, softrelu (``log(1 + exp(x))``) or
    softsign (``x / (1 + |x|)``)."""
    layer = _Layer("Activation", name, unknown)
    if act_type is None:
        raise layer.error(f"act_type is required, one of {list(_ACTIVATIONS)}")
    act_type = layer.choice("act_type", act_type, _ACTIVATIONS)
    return layer.node(_ACTIVATIONS[act_type], [layer.data(data)])


_LEAKY_TYPES = ("leaky", "elu", "selu", "gelu", "prelu")
# SELU's constants (Klambauer et al.), as MXNet has them
_SELU_ALPHA, _SELU_LAMBDA = 1.6732632423543772, 1.0507009873554805


def LeakyReLU(data=None, gamma=None, act_type="leaky", slope=0.25, name=None,
              **unknown) -> Symbol:
    """``leaky``: ``slope * x`` below 0; ``elu``: ``slope * (exp(x) - 1)`` below 0;
    ``selu``; ``gelu`` (the erf form); ``prelu``: a learned slope per channel (axis 1),
    ``<layer>_gamma`` of shape (channels,), initialized to 0.25 as MXNet does. Below and at
    0 the gradient is the slope's, as MXNet's. ``rrelu`` (random slopes in training) is not
    supported."""
    unknown = {k: v for k, v in unknown.items() if k not in ("lower_bound", "upper_bound")}
    layer = _Layer("LeakyReLU", name, unknown)
    if act_type == "rrelu":
        raise layer.error("act_type='rrelu' (random slopes while training) is not supported")
    act_type = layer.choice("act_type", act_type, _LEAKY_TYPES)
    data = layer.data(data)
    if act_type == "selu":
        return layer.node("Selu", [data], alpha=_SELU_ALPHA, gamma=_SELU_LAMBDA)
    if act_type == "gelu":
        return layer.node("Gelu", [data])
    if act_type == "prelu":
        return _prelu(layer, data, gamma)
    slope = layer.number("slope", slope)
    zero = layer.scalar(0.0, data, "zero")
    positive = layer.node("Greater", [data, zero], "positive")
    if act_type == "leaky":
        below = layer.node("Mul", [data, layer.scalar(slope, data, "slope")], "below")
        return layer.node("Where", [positive, data, below])
    # elu: exp of the non-positive part only, so a large x cannot make inf * 0
    clamped = layer.node("Where", [positive, zero, data], "clamped")
    expm1 = layer.node("Sub", [layer.node("Exp", [clamped], "exp"),
                               layer.scalar(1.0, data, "one")], "expm1")
    below = layer.node("Mul", [expm1, layer.scalar(slope, data, "slope")], "below")
    return layer.node("Where", [positive, data, below])


def _prelu(layer: _Layer, data: Symbol, gamma) -> Symbol:
    """Slopes per channel on data seen as (batch, channels, rest): the data's rank is not
    known here, but (channels, 1) broadcasts against that view whatever it is."""
    grouped = layer.node("Reshape", [data, layer.ints([0, 0, -1])], "grouped")
    gamma = layer.parameter("gamma", gamma, source=shape_from(grouped.name, 0, [["axis", 1]]),
                            init=Constant(0.25))
    slopes = layer.node("Reshape", [gamma, layer.ints([-1, 1])], "slopes")
    positive = layer.node("Greater", [grouped, layer.scalar(0.0, data, "zero")], "positive")
    below = layer.node("Mul", [grouped, slopes], "below")
    chosen = layer.node("Where", [positive, grouped, below], "chosen")
    return layer.node("Reshape", [chosen, layer.node("Shape", [data], "shape")])


def Embedding(data=None, weight=None, input_dim=None, output_dim=None, dtype="float32",
              sparse_grad=False, name=None, **unknown) -> Symbol:
    """Rows of ``weight`` (input_dim, output_dim) at the indices in ``data`` (floats index,
    truncated; indices outside [0, input_dim) are clipped, as MXNet does). ``sparse_grad``
    is accepted; the gradient is dense."""
    layer = _Layer("Embedding", name, unknown)
    input_dim = layer.count("input_dim", input_dim)
    output_dim = layer.count("output_dim", output_dim)
    layer.flag("sparse_grad", sparse_grad)
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise layer.error(f"dtype={dtype!r} is not a dtype") from None
    if dtype.kind != "f":
        raise layer.error(f"dtype must be a float type, got {dtype}")
    weight = layer.parameter("weight", weight, shape=(input_dim, output_dim),
                             dtype=None if dtype == np.float32 else dtype)
    index = layer.node("Cast", [layer.data(data)], "index", to=_INT64)
    clipped = layer.node("Clip", [index, constant(np.int64(0)),
                                  constant(np.int64(input_dim - 1))], "clipped")
    return layer.node("Gather", [weight, clipped], axis=0)


# -- output layers -----------------------------------------------------------------------------

_NORMALIZATIONS = ("null", "batch", "valid")


def SoftmaxOutput(data=None, label=None, grad_scale=1.0, ignore_label=-1.0,
                  multi_output=False, use_ignore=False, preserve_shape=False,
                  normalization="null", out_grad=False, smooth_alpha=0.0, name=None,
                  **unknown) -> Symbol:
    """Forward: softmax over everything but the batch axis (over axis 1 for 2-d data),
    over axis 1 with ``multi_output``, over the last axis with ``preserve_shape``. The label
    ``<layer>_label`` has the data's shape without the last axis ((batch,) for 2-d data),
    without axis 1 with ``multi_output``. ``grad_scale``, ``use_ignore``/``ignore_label`` and
    ``normalization`` shape the loss Module.from_symbol trains with."""
    layer = _Layer("SoftmaxOutput", name, unknown)
    options = {"grad_scale": layer.number("grad_scale", grad_scale),
               "ignore_label": layer.number("ignore_label", ignore_label),
               "use_ignore": layer.flag("use_ignore", use_ignore),
               "normalization": layer.choice("normalization", normalization,
                                             _NORMALIZATIONS),
               "multi_output": layer.flag("multi_output", multi_output)}
    preserve_shape = layer.flag("preserve_shape", preserve_shape)
    if layer.flag("out_grad", out_grad):
        raise layer.error("out_grad=True is not supported")
    if layer.number("smooth_alpha", smooth_alpha) != 0:
        raise layer.error("smooth_alpha (label smoothing) is not supported")
    options["preserve_shape"] = preserve_shape
    data = layer.data(data)
    if options["multi_output"] or preserve_shape:
        prediction = layer.node("Softmax", [data], "prob",
                                axis=1 if options["multi_output"] else -1)
        label_dims = [["axis", 0], ["axes", 2, None]] if options["multi_output"] else \
            [["axes", 0, -1]]
        return _output_head(layer, prediction, label, shape_from(prediction.name, 0,
                                                                 label_dims),
                            prediction.name, options)
    # softmax over (batch, everything else), in the data's shape; the loss reads the
    # flattened data
    flat = layer.node("Flatten", [data], "flatten", axis=1)
    soft = layer.node("Softmax", [flat], "softmax", axis=1)
    prediction = layer.node("Reshape", [soft, layer.node("Shape", [data], "shape")], "prob")
    return _output_head(layer, prediction, label, shape_from(flat.name, 0, [["axes", 0, -1]]),
                        soft.name, options)


def LinearRegressionOutput(data=None, label=None, grad_scale=1.0, name=None,
                           **unknown) -> Symbol:
    """Forward: the data; trained with half the squared error (MXNet's gradient is
    ``pred - label``, over the outputs per sample); label ``<layer>_label`` shaped like the
    data."""
    return _regression("LinearRegressionOutput", "Identity", data, label, grad_scale, name,
                       unknown)


def LogisticRegressionOutput(data=None, label=None, grad_scale=1.0, name=None,
                             **unknown) -> Symbol:
    """Forward: sigmoid of the data; trained with binary cross-entropy on the data as
    logits; label ``<layer>_label`` shaped like the data."""
    return _regression("LogisticRegressionOutput", "Sigmoid", data, label, grad_scale, name,
                       unknown)


def MAERegressionOutput(data=None, label=None, grad_scale=1.0, name=None,
                        **unknown) -> Symbol:
    """Forward: the data; trained with the absolute error; label ``<layer>_label`` shaped
    like the data."""
    return _regression("MAERegressionOutput", "Identity", data, label, grad_scale, name,
                       unknown)


def _regression(kind, op_type, data, label, grad_scale, name, unknown) -> Symbol:
    layer = _Layer(kind, name, unknown)
    options = {"grad_scale": layer.number("grad_scale", grad_scale)}
    data = layer.data(data)
    prediction = layer.node(op_type, [data], "prediction")
    return _output_head(layer, prediction, label, shape_from(
        prediction.name, 0, [["axes", 0, None]]), prediction.name, options)


def _output_head(layer: _Layer, prediction: Symbol, label, label_shape: dict, logits: str,
                 options: dict) -> Symbol:
    """The layer's output: ``prediction`` plus a zero made from the label's size (so the
    label is an argument of the symbol, and only its shape matters), recorded for
    :func:`output_layer`. Input 0 of node ``logits`` is what the loss reads."""
    label = layer.parameter("label", label, source=label_shape)
    size = layer.node("Size", [label], "label_size")
    nothing = layer.node("Mul", [size, constant(np.int64(0))], "label_unused")
    zero = layer.node("CastLike", [nothing, prediction], "label_zero")
    head = layer.node("Add", [prediction, zero])
    label_node = label._outputs[0][0]
    head._outputs[0][0].info[OUTPUT_INFO] = {
        "kind": layer.kind, "prediction": prediction.name,
        "logits": [logits, 0], "label": label_node.name if label_node.is_variable else None,
        "options": options}
    return head


@dataclass(frozen=True)
class OutputLayer:
    """An ``*Output`` layer at a symbol's head: what it computes and what trains it."""

    kind: str  # "SoftmaxOutput", "LinearRegressionOutput", ...
    prediction: Symbol  # the forward value (softmax probabilities, ...), without the label
    logits: Symbol  # the layer's input, which the loss reads
    label: str | None  # the label Variable's name (None: the label is not a Variable)
    options: dict  # grad_scale; SoftmaxOutput's normalization, use_ignore, ignore_label,
    # multi_output, preserve_shape


def output_layer(symbol: Symbol) -> OutputLayer | None:
    """The ``*Output`` layer whose output is ``symbol`` (a single output), else None."""
    if not isinstance(symbol, Symbol) or len(symbol) != 1:
        return None
    head = symbol._outputs[0][0]
    record = head.info.get(OUTPUT_INFO)
    if record is None:
        return None
    nodes = {node.name: node for node in symbol._topological()}
    try:
        prediction = nodes[record["prediction"]]
        reader, index = record["logits"]
        logits = nodes[reader].inputs[index]
        kind, label, options = record["kind"], record["label"], dict(record["options"])
    except (KeyError, TypeError, ValueError, IndexError):
        raise GraphError(f"node {head.name!r}: its {OUTPUT_INFO!r} record does not describe "
                         f"an output layer of this symbol: {record!r}") from None
    if logits is None or not isinstance(kind, str) or not (label is None or label in nodes):
        raise GraphError(f"node {head.name!r}: its {OUTPUT_INFO!r} record names values this "
                         f"symbol does not have: {record!r}")
    return OutputLayer(kind, Symbol([(prediction, 0)]), Symbol([logits]), label, options)


LAYERS = ("FullyConnected", "Convolution", "Deconvolution", "Pooling", "BatchNorm",
          "Activation", "LeakyReLU", "Embedding", "SoftmaxOutput", "LinearRegressionOutput",
          "LogisticRegressionOutput", "MAERegressionOutput")
