"""How each MXNet operator of a symbol file becomes mixrt's symbols: the translations and
their table.

    OPERATORS["Convolution"](name, [data, weight, bias], {"kernel": (3, 3), ...}) -> Symbol

Each translation is (node name, input Symbols in MXNet's order, the node's parameters as
``mixrt.sym.mxnet_json`` parsed them) -> Symbol: MXNet's layers go to mixrt's MXNet-named
layer functions (``sym.Convolution``), an op that is one ONNX operator to that operator,
the rest to a few ONNX nodes each (``slice``, ``softmax`` with a temperature, ``SwapAxis``,
``GroupNorm``). A translation takes only the parameters it knows (``no_params`` refuses the
rest) and raises GraphError, which the reader turns into a ModelLoadError naming the node.
The checks each translation makes of its node are ``mixrt/layers/op_params.py``'s, which the
fused RNN shares.

The per-op knowledge lives here, apart from the reading of the file (``mxnet_json.py``);
the fused ``RNN`` op, which array and symbol frontends share, is ``mixrt/layers/fused_rnn.py``
(``fused_rnn.py`` reads it from a file).
"""

from __future__ import annotations

import numpy as np

from mixrt import array_methods
from mixrt.base.errors import GraphError
from mixrt.layers.op_params import (check_arity, INT64_MAX, is_integer,  # noqa: F401
                                    no_params, required_param)
from mixrt.sym import mxnet_ops, shape_free, symbol_layers
from mixrt.sym.parameter_rules import shape_from, SHAPE_FROM
from mixrt.sym.symbol import call_op, constant, scalar_like


# -- the translations --------------------------------------------------------------------------

def _layer(function, input_names: tuple, required: int = 1):
    """One of mixrt's MXNet layers (``sym.Convolution``): the inputs by MXNet's names."""
    def translate(name, inputs, params):
        check_arity(inputs, required, len(input_names))
        return function(**dict(zip(input_names, inputs)), **params, name=name)
    return translate


def _onnx(op_type: str, arity: int = 1, **fixed):
    """An MXNet op that is one ONNX operator without parameters of its own."""
    def translate(name, inputs, params):
        check_arity(inputs, arity)
        no_params(params)
        return call_op("", op_type, inputs, dict(fixed), name=name)
    return translate


def _scalar_op(op_type: str, reverse: bool = False):
    """``_plus_scalar`` (x + scalar) and the reflected ``_rminus_scalar`` (scalar - x)."""
    def translate(name, inputs, params):
        check_arity(inputs, 1)
        scalar = params.pop("scalar", None)
        params.pop("is_int", None)  # MXNet 2's flag; the value's own type says it here
        no_params(params)
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float)):
            raise GraphError(f"'scalar' must be a number, got {scalar!r}")
        operands = [inputs[0], scalar_like(float(scalar), inputs[0])]
        return call_op("", op_type, operands[::-1] if reverse else operands, {}, name=name)
    return translate


def _comparison(op_type: str, negate: bool, with_scalar: bool):
    """``_greater_scalar``, ``broadcast_equal``, ...: MXNet's comparisons give 1 or 0 in the
    operand's dtype, not booleans."""
    def translate(name, inputs, params):
        check_arity(inputs, 1 if with_scalar else 2)
        operands = list(inputs)
        if with_scalar:
            scalar = required_param(params, "scalar")
            params.pop("is_int", None)
            if isinstance(scalar, bool) or not isinstance(scalar, (int, float)):
                raise GraphError(f"'scalar' must be a number, got {scalar!r}")
            operands.append(scalar_like(float(scalar), inputs[0]))
        no_params(params)
        truth = call_op("", op_type, operands, {}, name=f"{name}_compare", exact_name=True)
        one, zero = scalar_like(1.0, inputs[0]), scalar_like(0.0, inputs[0])
        choices = [zero, one] if negate else [one, zero]
        return call_op("", "Where", [truth, *choices], {}, name=name)
    return translate


def _function(function, arity: int = 1):
    """A function of mixrt.sym with MXNet's own parameters (``sym.reshape``, ``sym.split``)."""
    def translate(name, inputs, params):
        check_arity(inputs, arity)
        return function(*inputs, **params, name=name)
    return translate


def _reduce(function):
    def translate(name, inputs, params):
        check_arity(inputs, 1)
        if params.pop("exclude", False):
            raise GraphError("exclude=True (reducing all axes but the given ones) is not "
                             "supported without a known rank")
        return function(inputs[0], **params, name=name)
    return translate


def _softmax(op_type: str):
    def translate(name, inputs, params):
        check_arity(inputs, 1)
        axis, temperature = params.pop("axis", -1), params.pop("temperature", None)
        params.pop("dtype", None)  # the output dtype: the input's here
        if params.pop("use_length", False):
            raise GraphError("use_length=True is not supported")
        no_params(params)
        data = inputs[0]
        if temperature not in (None, 1, 1.0):
            data = call_op("", "Div", [data, scalar_like(float(temperature), data)], {},
                           name=f"{name}_temperature", exact_name=True)
        return call_op("", op_type, [data], {"axis": axis}, name=name)
    return translate


def _softmax_activation(name, inputs, params):
    """``channel``: softmax along axis 1; ``instance`` (the default): along the last axis,
    which is what MXNet 1.9.1 computes (for 2-D data, each instance's values)."""
    check_arity(inputs, 1)
    mode = params.pop("mode", "instance")
    no_params(params)
    if mode not in ("instance", "channel"):
        raise GraphError(f"mode must be 'instance' or 'channel', got {mode!r}")
    return call_op("", "Softmax", inputs, {"axis": 1 if mode == "channel" else -1}, name=name)


def dropout(name, inputs, params):
    check_arity(inputs, 1)
    rate, axes = params.pop("p", 0.5), params.pop("axes", ())
    mode = params.pop("mode", "training")
    params.pop("cudnn_off", None)
    no_params(params)
    if axes:
        raise GraphError(f"axes={axes} (a mask shared along axes) is not supported")
    if mode != "training":
        raise GraphError(f"mode={mode!r} is not supported (only 'training')")
    ratio = constant(np.array(rate, dtype=np.float32), name=f"{name}_ratio")
    return call_op("", "Dropout", [inputs[0], ratio], {}, name=name)


def _flatten(name, inputs, params):
    check_arity(inputs, 1)
    no_params(params)
    return call_op("", "Flatten", inputs, {"axis": 1}, name=name)


def _concat(name, inputs, params):
    count, dim = params.pop("num_args", len(inputs)), params.pop("dim", 1)
    no_params(params)
    if count != len(inputs) or not inputs:
        raise GraphError(f"num_args={count}, but the file gives {len(inputs)} input(s)")
    return call_op("", "Concat", inputs, {"axis": dim}, name=name)


def _reshape(name, inputs, params):
    check_arity(inputs, 1)
    shape, reverse = params.pop("shape", None), params.pop("reverse", False)
    for legacy in ("target_shape", "keep_highest"):
        if params.pop(legacy, None) not in (None, (), False):
            raise GraphError(f"the legacy parameter {legacy!r} is not supported; use 'shape'")
    no_params(params)
    return array_methods.reshape(inputs[0], shape, reverse=reverse, name=name)


def _slice_axis(name, inputs, params):
    check_arity(inputs, 1)
    axis, begin = required_param(params, "axis"), required_param(params, "begin")
    end = params.pop("end", None)
    no_params(params)
    return onnx_slice(name, inputs[0], [begin], [INT64_MAX if end is None else end], [axis])


def _slice(name, inputs, params):
    """MXNet's ``slice``: begin/end/step per leading axis, None for the whole axis."""
    check_arity(inputs, 1)
    begin, end = required_param(params, "begin"), required_param(params, "end")
    step = params.pop("step", ()) or (None,) * len(begin)
    no_params(params)
    if not len(begin) == len(end) == len(step):
        raise GraphError(f"begin {begin}, end {end} and step {step} differ in length")
    steps = [1 if s is None else s for s in step]
    starts = [(0 if s > 0 else -1) if b is None else b for b, s in zip(begin, steps)]
    ends = [(INT64_MAX if s > 0 else -INT64_MAX) if e is None else e
            for e, s in zip(end, steps)]
    return onnx_slice(name, inputs[0], starts, ends, list(range(len(begin))), steps)


def onnx_slice(name, data, starts, ends, axes, steps=None):
    bounds = [constant(np.array(values, dtype=np.int64), name=f"{name}_{role}")
              for role, values in (("starts", starts), ("ends", ends), ("axes", axes),
                                   ("steps", steps)) if values is not None]
    return call_op("", "Slice", [data, *bounds], {}, name=name)


def _clip(name, inputs, params):
    check_arity(inputs, 1)
    low, high = required_param(params, "a_min"), required_param(params, "a_max")
    no_params(params)
    return array_methods.clip(inputs[0], low, high, name=name)


def _where(name, inputs, params):
    check_arity(inputs, 3)
    no_params(params)
    condition = call_op("", "Cast", [inputs[0]], {"to": 9}, name=f"{name}_condition",
                        exact_name=True)  # MXNet's condition is any nonzero number
    return call_op("", "Where", [condition, inputs[1], inputs[2]], {}, name=name)


def _square(name, inputs, params):
    check_arity(inputs, 1)
    no_params(params)
    return call_op("", "Mul", [inputs[0], inputs[0]], {}, name=name)


def _upsampling(name, inputs, params):
    """Nearest-neighbour UpSampling by an integer ``scale`` (bilinear needs its weight)."""
    scale, kind = required_param(params, "scale"), required_param(params, "sample_type")
    count = params.pop("num_args", 1)
    params.pop("workspace", None)
    params.pop("multi_input_mode", None)
    no_params(params)
    if kind != "nearest" or count != 1 or len(inputs) != 1:
        raise GraphError(f"only sample_type='nearest' with one input is supported, got "
                         f"{kind!r} with {len(inputs)}")
    scales = constant(np.array([1, 1, scale, scale], dtype=np.float32), name=f"{name}_scales")
    return call_op("", "Resize", [inputs[0], None, scales],
                   {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                    "nearest_mode": "floor"}, name=name)


def _instance_norm(name, inputs, params):
    """Each sample's channel normalized over its spatial values: ONNX's InstanceNormalization."""
    check_arity(inputs, 3)
    eps = params.pop("eps", 1e-3)
    no_params(params)
    out = call_op("", "InstanceNormalization", inputs, {"epsilon": eps}, name=name)
    _shape_follows(inputs[1:], shape_from(name, 0, [["axis", 1]]))
    return out


def _layer_norm(name, inputs, params):
    """MXNet normalizes along ``axis`` alone, ONNX's LayerNormalization from ``axis`` to the
    last: the two agree for the last axis, MXNet's default and what Gluon writes."""
    check_arity(inputs, 3)
    axis, eps = params.pop("axis", -1), params.pop("eps", 1e-5)
    if params.pop("output_mean_var", False):
        raise GraphError("output_mean_var=True is not supported")
    no_params(params)
    if axis != -1:
        raise GraphError(f"axis={axis} is not supported: only the last axis (-1), whose "
                         f"index is unknown until the data's rank is")
    out = call_op("", "LayerNormalization", inputs, {"axis": -1, "epsilon": eps}, name=name)
    _shape_follows(inputs[1:], shape_from(name, 0, [["axis", -1]]))
    return out


def _group_norm(name, inputs, params):
    """MXNet's gamma and beta are per group (``num_groups`` values): the data seen as
    (N, groups, rest) is what InstanceNormalization normalizes per group."""
    check_arity(inputs, 3)
    groups, eps = params.pop("num_groups", 1), params.pop("eps", 1e-5)
    if params.pop("output_mean_var", False):
        raise GraphError("output_mean_var=True is not supported")
    no_params(params)
    if not is_integer(groups) or groups < 1:
        raise GraphError(f"num_groups must be a whole number >= 1, got {groups!r}")
    data, gamma, beta = inputs
    layout = constant(np.array([0, groups, -1], dtype=np.int64), name=f"{name}_groups")
    grouped = call_op("", "Reshape", [data, layout], {}, name=f"{name}_grouped",
                      exact_name=True)
    normed = call_op("", "InstanceNormalization", [grouped, gamma, beta], {"epsilon": eps},
                     name=f"{name}_normalized", exact_name=True)
    shape = call_op("", "Shape", [data], {}, name=f"{name}_shape", exact_name=True)
    _shape_follows([gamma, beta], shape_from(name, 0, [groups]))
    return call_op("", "Reshape", [normed, shape], {}, name=name)


def _shape_follows(parameters: list, rule: dict) -> None:
    """A parameter variable of undeclared shape (gamma, beta) gets it from the data's, as
    mixrt's own layers' parameters do, so binding with the data's shape alone works."""
    for parameter in parameters:
        node, index = parameter._outputs[0]
        declared = node.info.get("shape")
        if node.is_variable and index == 0 and SHAPE_FROM not in node.info and (
                declared is None or None in declared):
            node.info[SHAPE_FROM] = rule




def _swap_axis(name, inputs, params):
    """MXNet's SwapAxis (dims are non-negative there) for data of any rank: viewed as
    (before, dim1, between, dim2, after), transposed, and given the swapped shape back."""
    check_arity(inputs, 1)
    first, second = sorted((params.pop("dim1", 0), params.pop("dim2", 0)))
    no_params(params)
    if not (is_integer(first) and first >= 0):
        raise GraphError(f"dim1 and dim2 must be whole numbers >= 0, got {first!r}")
    data = inputs[0]
    if first == second:
        return call_op("", "Identity", [data], {}, name=name)
    shape = call_op("", "Shape", [data], {}, name=f"{name}_shape", exact_name=True)

    def dims(role, begin, end):
        return onnx_slice(f"{name}_{role}", shape, [begin], [end], [0])

    def product(role, begin, end):
        return call_op("", "ReduceProd", [dims(role, begin, end)], {"keepdims": 1},
                       name=f"{name}_{role}_size", exact_name=True)

    rest = constant(np.array([-1], dtype=np.int64), name=f"{name}_rest")
    view = call_op("", "Concat", [product("before", 0, first), dims("dim1", first, first + 1),
                                  product("between", first + 1, second),
                                  dims("dim2", second, second + 1), rest], {"axis": 0},
                   name=f"{name}_view", exact_name=True)
    viewed = call_op("", "Reshape", [data, view], {}, name=f"{name}_viewed", exact_name=True)
    swapped = call_op("", "Transpose", [viewed], {"perm": [0, 3, 2, 1, 4]},
                      name=f"{name}_swapped", exact_name=True)
    target = call_op("", "Concat", [dims("head", 0, first), dims("second", second, second + 1),
                                    dims("middle", first + 1, second),
                                    dims("first", first, first + 1),
                                    dims("tail", second + 1, INT64_MAX)], {"axis": 0},
                     name=f"{name}_target", exact_name=True)
    return call_op("", "Reshape", [swapped, target], {}, name=name)


def _cast(name, inputs, params):
    check_arity(inputs, 1)
    return mxnet_ops.FUNCTIONS["cast"](inputs[0], **params, name=name)


# -- the tables ---------------------------------------------------------------------------------

_LAYERS = {
    "Convolution": _layer(symbol_layers.Convolution, ("data", "weight", "bias"), 2),
    "Deconvolution": _layer(symbol_layers.Deconvolution, ("data", "weight", "bias"), 2),
    "FullyConnected": _layer(symbol_layers.FullyConnected, ("data", "weight", "bias"), 2),
    "Activation": _layer(symbol_layers.Activation, ("data",)),
    "LeakyReLU": _layer(symbol_layers.LeakyReLU, ("data", "gamma")),
    "BatchNorm": _layer(symbol_layers.BatchNorm,
                        ("data", "gamma", "beta", "moving_mean", "moving_var"), 5),
    "Pooling": _layer(symbol_layers.Pooling, ("data",)),
    "Embedding": _layer(symbol_layers.Embedding, ("data", "weight"), 2),
    "SoftmaxOutput": _layer(symbol_layers.SoftmaxOutput, ("data", "label")),
    "LinearRegressionOutput": _layer(symbol_layers.LinearRegressionOutput,
                                     ("data", "label")),
    "LogisticRegressionOutput": _layer(symbol_layers.LogisticRegressionOutput,
                                       ("data", "label")),
    "MAERegressionOutput": _layer(symbol_layers.MAERegressionOutput, ("data", "label")),
}
_SCALARS = {
    "_plus_scalar": ("Add", False), "_PlusScalar": ("Add", False),
    "_minus_scalar": ("Sub", False), "_MinusScalar": ("Sub", False),
    "_rminus_scalar": ("Sub", True), "_RMinusScalar": ("Sub", True),
    "_mul_scalar": ("Mul", False), "_MulScalar": ("Mul", False),
    "_div_scalar": ("Div", False), "_DivScalar": ("Div", False),
    "_rdiv_scalar": ("Div", True), "_RDivScalar": ("Div", True),
    "_power_scalar": ("Pow", False), "_PowerScalar": ("Pow", False),
    "_rpower_scalar": ("Pow", True), "_RPowerScalar": ("Pow", True),
    "_maximum_scalar": ("Max", False), "_MaximumScalar": ("Max", False),
    "_minimum_scalar": ("Min", False), "_MinimumScalar": ("Min", False),
}
# two-operand ops; broadcast_* follow NumPy's broadcasting, as ONNX's operators do
_BINARY = {
    "Add": ("elemwise_add", "_plus", "_add", "_Plus", "broadcast_add", "broadcast_plus"),
    "Sub": ("elemwise_sub", "_minus", "_sub", "_Minus", "broadcast_sub", "broadcast_minus"),
    "Mul": ("elemwise_mul", "_mul", "_Mul", "broadcast_mul"),
    "Div": ("elemwise_div", "_div", "_Div", "broadcast_div"),
    "Pow": ("_power", "_Power", "broadcast_power"),
    "Max": ("_maximum", "_Maximum", "broadcast_maximum"),
    "Min": ("_minimum", "_Minimum", "broadcast_minimum"),
}
# MXNet's comparison name -> (ONNX operator, whether its result is negated)
_COMPARISONS = {"equal": ("Equal", False), "not_equal": ("Equal", True),
                "greater": ("Greater", False), "greater_equal": ("GreaterOrEqual", False),
                "lesser": ("Less", False), "lesser_equal": ("LessOrEqual", False)}
_UNARY = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log",
          "sqrt": "Sqrt", "abs": "Abs", "negative": "Neg", "reciprocal": "Reciprocal",
          "floor": "Floor", "ceil": "Ceil", "sign": "Sign", "sin": "Sin", "cos": "Cos",
          "erf": "Erf", "_copy": "Identity", "identity": "Identity"}
_FUNCTIONS = {
    "transpose": _function(array_methods.transpose),
    "expand_dims": _function(array_methods.expand_dims),
    "squeeze": _function(array_methods.squeeze),
    "SliceChannel": _function(shape_free.FUNCTIONS["split"]),
    "split": _function(shape_free.FUNCTIONS["split"]),
    "dot": _function(shape_free.FUNCTIONS["dot"], 2),
    "batch_dot": _function(shape_free.FUNCTIONS["batch_dot"], 2),
    "zeros_like": _function(shape_free.FUNCTIONS["zeros_like"]),
    "ones_like": _function(shape_free.FUNCTIONS["ones_like"]),
    "BlockGrad": _function(mxnet_ops.FUNCTIONS["BlockGrad"]),
    "stop_gradient": _function(mxnet_ops.FUNCTIONS["BlockGrad"]),
}
_REDUCTIONS = {"sum": array_methods.sum, "mean": array_methods.mean, "max": array_methods.max,
               "min": array_methods.min, "prod": array_methods.prod}

OPERATORS = {
    **_LAYERS,
    **{op: _scalar_op(onnx, reverse) for op, (onnx, reverse) in _SCALARS.items()},
    **{op: _onnx(onnx, 2) for onnx, ops in _BINARY.items() for op in ops},
    **{op: _onnx(onnx) for op, onnx in _UNARY.items()},
    **{f"_{op}_scalar": _comparison(onnx, negate, True)
       for op, (onnx, negate) in _COMPARISONS.items()},
    **{f"{prefix}{op}": _comparison(onnx, negate, False)
       for op, (onnx, negate) in _COMPARISONS.items() for prefix in ("_", "broadcast_")},
    **_FUNCTIONS,
    **{op: _reduce(function) for op, function in _REDUCTIONS.items()},
    "sum_axis": _reduce(array_methods.sum), "max_axis": _reduce(array_methods.max),
    "min_axis": _reduce(array_methods.min),
    "softmax": _softmax("Softmax"), "log_softmax": _softmax("LogSoftmax"),
    "SoftmaxActivation": _softmax_activation,
    "Dropout": dropout, "Flatten": _flatten, "flatten": _flatten,
    "Concat": _concat, "concat": _concat,
    "Reshape": _reshape, "reshape": _reshape,
    "slice_axis": _slice_axis, "slice": _slice, "crop": _slice,
    "clip": _clip, "where": _where, "square": _square,
    "UpSampling": _upsampling, "Cast": _cast, "cast": _cast,
    "_rnn_param_concat": _concat, "SwapAxis": _swap_axis, "swapaxes": _swap_axis,
    "InstanceNorm": _instance_norm, "LayerNorm": _layer_norm, "GroupNorm": _group_norm,
}
