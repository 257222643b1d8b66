"""MXNet 1.x's own symbol files (``prefix-symbol.json``, nnvm's graph JSON) read into a Symbol.

    {"nodes": [{"op": "null", "name": "data", "inputs": []},
               {"op": "Convolution", "name": "conv0", "attrs": {"kernel": "(3, 3)", ...},
                "inputs": [[0, 0, 0], [1, 0, 0]]}, ...],
     "arg_nodes": [0, 1], "node_row_ptr": [...], "heads": [[5, 0, 0]],
     "attrs": {"mxnet_version": ["int", 10901]}}

Each node is rebuilt by mixrt's MXNet-named symbol function for its op (``sym.Convolution``,
``sym.BatchNorm``, ...) or, where MXNet's op is one ONNX operator, by that operator, with the
node's inputs in MXNet's argument order and its parameters parsed from MXNet's strings
(``"(3, 3)"``, ``"True"``, ``"1e-05"``, ``"None"``). Node names are kept, so the arguments and
auxiliary states are named as the ``.params`` file's keys (``arg:conv0_weight``,
``aux:bn0_moving_mean``), and variables keep their declared shape, dtype, initializer and
learning-rate multipliers. Every index, op and parameter is checked: a malformed or hostile
file, or an op this reader does not know, raises ModelLoadError naming the node.
"""

from __future__ import annotations

import numpy as np

from mixrt import array_methods
from mixrt.base.errors import GraphError, MixrtError, ModelLoadError
from mixrt.sym import mxnet_ops, shape_free, symbol_layers
from mixrt.sym.ops import call_op, shape_from, SHAPE_FROM
from mixrt.sym.symbol import (constant, scalar_like, variable_named, Group, MXNET_DTYPE_CODES,
                               Symbol)

MAX_PARAMETER_TEXT = 4096  # MXNet writes short strings; a megabyte one is not a parameter
INT64_MAX = np.iinfo(np.int64).max  # "to the end" for ONNX Slice
# each RNN layer is a handful of nodes made now: a file asking for 10**11 would exhaust memory
MAX_RNN_LAYERS = 1024
# MXNet's dtype codes (mshadow's TypeFlag) in a variable's "__dtype__"
DTYPE_CODES = {code: name for name, code in MXNET_DTYPE_CODES.items()}
# a variable's attributes that are declarations rather than the user's own
DECLARATION_KEYS = ("__shape__", "__dtype__", "__init__", "__lr_mult__", "__wd_mult__")
# inputs of these ops that are auxiliary states (updated by the op, not learned)
AUXILIARY_INPUTS = {"BatchNorm": (3, 4), "_contrib_SyncBatchNorm": (3, 4)}


def is_mxnet_document(document) -> bool:
    """Whether parsed JSON has MXNet's graph layout (and not mixrt's own "format")."""
    return (isinstance(document, dict) and "format" not in document
            and all(key in document for key in ("nodes", "heads", "arg_nodes")))


def symbol_from_document(document: dict, source: str) -> Symbol:
    nodes = _list(document, "nodes", source)
    auxiliary = _auxiliary_nodes(nodes, source)
    built: list[Symbol] = []
    for index, entry in enumerate(nodes):
        where = f"{source}: node {index}"
        if not isinstance(entry, dict):
            raise ModelLoadError(f"{where}: expected an object, got {_brief(entry)}")
        built.append(_node(entry, built, index in auxiliary, where))
    heads = [_entry(head, built, f"{source}: heads") for head in _list(document, "heads",
                                                                        source)]
    if not heads:
        raise ModelLoadError(f"{source}: the symbol has no outputs (\"heads\" is empty)")
    return heads[0] if len(heads) == 1 else Group(heads)


def _list(document: dict, key: str, source: str) -> list:
    value = document.get(key)
    if not isinstance(value, list):
        raise ModelLoadError(f"{source}: {key!r} must be a list, got {_brief(value)}")
    return value


def _auxiliary_nodes(nodes: list, source: str) -> set:
    """The variables some op reads as an auxiliary state (BatchNorm's moving mean and
    variance): MXNet tells them apart by the op, not by the variable."""
    auxiliary = set()
    for entry in nodes:
        positions = AUXILIARY_INPUTS.get(entry.get("op")) if isinstance(entry, dict) else None
        inputs = entry.get("inputs") if positions else None
        if isinstance(inputs, list):
            auxiliary.update(ref[0] for position, ref in enumerate(inputs)
                             if position in positions and isinstance(ref, list) and ref
                             and _integer(ref[0]))
    return auxiliary


def _node(entry: dict, built: list[Symbol], auxiliary: bool, where: str) -> Symbol:
    op, name = entry.get("op"), entry.get("name")
    if not isinstance(name, str) or not name:
        raise ModelLoadError(f"{where}: missing or empty \"name\"")
    where = f"{where} ({name!r})"
    if not isinstance(op, str) or not op:
        raise ModelLoadError(f"{where}: \"op\" must be an operator name or \"null\", got "
                             f"{_brief(op)}")
    attrs = _attributes(entry, where)
    inputs = entry.get("inputs", [])
    if not isinstance(inputs, list):
        raise ModelLoadError(f"{where}: \"inputs\" must be a list, got {_brief(inputs)}")
    if op == "null":
        if inputs:
            raise ModelLoadError(f"{where}: a variable (op \"null\") has no inputs")
        return _variable(name, attrs, auxiliary, where)
    translate = OPERATORS.get(op)
    if translate is None:
        raise ModelLoadError(f"{where}: MXNet operator {op!r} is not supported by this "
                             f"reader")
    operands = [_entry(ref, built, where) for ref in inputs]
    params = {key: _parse(value, f"{where}.{key}") for key, value in attrs.items()
              if not _is_symbol_attribute(key)}
    try:
        symbol = translate(name, operands, params)
    except (MixrtError, TypeError, ValueError, OverflowError) as error:
        raise ModelLoadError(f"{where}: MXNet operator {op!r} with {params}: {error}") from None
    annotations = {k: v for k, v in attrs.items() if _is_symbol_attribute(k)}
    if annotations and len(symbol.list_outputs()) == 1:
        symbol._set_attr(**annotations)
    return symbol


def _attributes(entry: dict, where: str) -> dict:
    """The node's "attrs"; files of MXNet before 0.9 split them into the op's "param" and
    the user's "attr"."""
    parts = [entry["attrs"]] if "attrs" in entry else [entry.get("param", {}),
                                                      entry.get("attr", {})]
    for part in parts:
        if not isinstance(part, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in part.items()):
            raise ModelLoadError(f"{where}: \"attrs\" must map strings to strings, got "
                                 f"{_brief(part)}")
    return {key: value for part in parts for key, value in part.items()}


def _entry(ref, built: list[Symbol], where: str) -> Symbol:
    """An input reference [node, output, version] (MXNet < 1.0 writes [node, output])."""
    if not isinstance(ref, list) or len(ref) not in (2, 3) or not all(map(_integer, ref)):
        raise ModelLoadError(f"{where}: an input is [node index, output index, version], "
                             f"got {_brief(ref)}")
    node, output = ref[0], ref[1]
    if not 0 <= node < len(built):
        raise ModelLoadError(f"{where}: refers to node {node}, but only nodes 0.."
                             f"{len(built) - 1} come before it")
    outputs = len(built[node].list_outputs())
    if not 0 <= output < outputs:
        raise ModelLoadError(f"{where}: node {node} ({built[node].list_outputs()[0]!r}) has "
                             f"{outputs} output(s); output {output} was asked for")
    return built[node] if outputs == 1 else built[node][output]


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_symbol_attribute(key: str) -> bool:
    """MXNet's attributes of any node (``__lr_mult__``, ``__ctx_group__``), not op params."""
    return key.startswith("__") and key.endswith("__") and len(key) > 4


# -- variables ---------------------------------------------------------------------------------

def _variable(name: str, attrs: dict, auxiliary: bool, where: str) -> Symbol:
    shape = _parse(attrs["__shape__"], f"{where}.__shape__") if "__shape__" in attrs else None
    if shape is not None and (not isinstance(shape, tuple)
                              or not all(_integer(d) and d >= -1 for d in shape)):
        raise ModelLoadError(f"{where}: \"__shape__\" must be a tuple of whole numbers, got "
                             f"{_brief(attrs['__shape__'])}")
    dtype = _dtype(attrs["__dtype__"], where) if "__dtype__" in attrs else None
    multipliers = {key: _multiplier(attrs, key, where) for key in ("lr_mult", "wd_mult")}
    own = {k: v for k, v in attrs.items() if k not in DECLARATION_KEYS}
    try:
        # mixrt's initializers take MXNet's "__init__" as it is: a name or dumps()' JSON
        return variable_named(name, shape, dtype, attrs.get("__init__"),
                              aux=auxiliary, attr=own or None, **multipliers)
    except (MixrtError, TypeError, ValueError, OverflowError) as error:
        raise ModelLoadError(f"{where}: bad variable declaration: {error}") from None


def _dtype(text: str, where: str) -> str:
    code = _parse(text, f"{where}.__dtype__")
    if _integer(code) and code in DTYPE_CODES:
        return DTYPE_CODES[code]
    if isinstance(code, str) and code in DTYPE_CODES.values():
        return code
    raise ModelLoadError(f"{where}: \"__dtype__\" {_brief(text)} is not one of MXNet's dtype "
                         f"codes {sorted(DTYPE_CODES)}")


def _multiplier(attrs: dict, key: str, where: str):
    text = attrs.get(f"__{key}__")
    if text is None:
        return None
    value = _parse(text, f"{where}.__{key}__")
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value < float("inf"):
        raise ModelLoadError(f"{where}: \"__{key}__\" must be a finite number >= 0, got "
                             f"{_brief(text)}")
    return float(value)


# -- MXNet's parameter strings -----------------------------------------------------------------

def _parse(text: str, where: str):
    """``"(3, 3)"`` -> (3, 3), ``"True"`` -> True, ``"1e-05"`` -> 1e-05, ``"None"`` -> None;
    anything else is a string (``"relu"``, ``"float32"``)."""
    if len(text) > MAX_PARAMETER_TEXT:
        raise ModelLoadError(f"{where}: a parameter of {len(text)} characters (at most "
                             f"{MAX_PARAMETER_TEXT})")
    text = text.strip()
    if text[:1] in "([" and text[-1:] in ")]" and text:
        inner = text[1:-1].strip().rstrip(",")
        items = [item.strip() for item in inner.split(",")] if inner else []
        if any(item[:1] in "([" for item in items):
            raise ModelLoadError(f"{where}: nested tuples are not MXNet parameters: "
                                 f"{_brief(text)}")
        return tuple(_scalar(item) for item in items)
    return _scalar(text)


def _scalar(text: str):
    named = {"None": None, "True": True, "False": False, "true": True, "false": False}
    if text in named:
        return named[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


# -- the ops -----------------------------------------------------------------------------------
# Each translation is (node name, input Symbols in MXNet's order, parsed params) -> Symbol.

def _arity(inputs: list, low: int, high: int | None = None) -> None:
    high = low if high is None else high
    if not low <= len(inputs) <= high:
        expected = low if low == high else f"{low} to {high}"
        raise GraphError(f"takes {expected} input(s), the file gives {len(inputs)}")


def _layer(function, input_names: tuple, required: int = 1):
    """One of mixrt's MXNet layers (``sym.Convolution``): the inputs by MXNet's names."""
    def translate(name, inputs, params):
        _arity(inputs, required, len(input_names))
        return function(**dict(zip(input_names, inputs)), **params, name=name)
    return translate


def _onnx(op_type: str, arity: int = 1, **fixed):
    """An MXNet op that is one ONNX operator without parameters of its own."""
    def translate(name, inputs, params):
        _arity(inputs, arity)
        _no_params(params)
        return call_op("", op_type, inputs, dict(fixed), name=name)
    return translate


def _required(params: dict, key: str):
    if key not in params:
        raise GraphError(f"the parameter {key!r} is missing")
    return params.pop(key)


def _no_params(params: dict) -> None:
    if params:
        raise GraphError(f"unknown parameter(s) {sorted(params)}")


def _scalar_op(op_type: str, reverse: bool = False):
    """``_plus_scalar`` (x + scalar) and the reflected ``_rminus_scalar`` (scalar - x)."""
    def translate(name, inputs, params):
        _arity(inputs, 1)
        scalar = params.pop("scalar", None)
        params.pop("is_int", None)  # MXNet 2's flag; the value's own type says it here
        _no_params(params)
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float)):
            raise GraphError(f"'scalar' must be a number, got {scalar!r}")
        operands = [inputs[0], scalar_like(float(scalar), inputs[0])]
        return call_op("", op_type, operands[::-1] if reverse else operands, {}, name=name)
    return translate


def _comparison(op_type: str, negate: bool, with_scalar: bool):
    """``_greater_scalar``, ``broadcast_equal``, ...: MXNet's comparisons give 1 or 0 in the
    operand's dtype, not booleans."""
    def translate(name, inputs, params):
        _arity(inputs, 1 if with_scalar else 2)
        operands = list(inputs)
        if with_scalar:
            scalar = _required(params, "scalar")
            params.pop("is_int", None)
            if isinstance(scalar, bool) or not isinstance(scalar, (int, float)):
                raise GraphError(f"'scalar' must be a number, got {scalar!r}")
            operands.append(scalar_like(float(scalar), inputs[0]))
        _no_params(params)
        truth = call_op("", op_type, operands, {}, name=f"{name}_compare", exact_name=True)
        one, zero = scalar_like(1.0, inputs[0]), scalar_like(0.0, inputs[0])
        choices = [zero, one] if negate else [one, zero]
        return call_op("", "Where", [truth, *choices], {}, name=name)
    return translate


def _function(function, arity: int = 1):
    """A function of mixrt.sym with MXNet's own parameters (``sym.reshape``, ``sym.split``)."""
    def translate(name, inputs, params):
        _arity(inputs, arity)
        return function(*inputs, **params, name=name)
    return translate


def _reduce(function):
    def translate(name, inputs, params):
        _arity(inputs, 1)
        if params.pop("exclude", False):
            raise GraphError("exclude=True (reducing all axes but the given ones) is not "
                             "supported without a known rank")
        return function(inputs[0], **params, name=name)
    return translate


def _softmax(op_type: str):
    def translate(name, inputs, params):
        _arity(inputs, 1)
        axis, temperature = params.pop("axis", -1), params.pop("temperature", None)
        params.pop("dtype", None)  # the output dtype: the input's here
        if params.pop("use_length", False):
            raise GraphError("use_length=True is not supported")
        _no_params(params)
        data = inputs[0]
        if temperature not in (None, 1, 1.0):
            data = call_op("", "Div", [data, scalar_like(float(temperature), data)], {},
                           name=f"{name}_temperature", exact_name=True)
        return call_op("", op_type, [data], {"axis": axis}, name=name)
    return translate


def _softmax_activation(name, inputs, params):
    """``channel``: softmax along axis 1; ``instance`` (the default): along the last axis,
    which is what MXNet 1.9.1 computes (for 2-D data, each instance's values)."""
    _arity(inputs, 1)
    mode = params.pop("mode", "instance")
    _no_params(params)
    if mode not in ("instance", "channel"):
        raise GraphError(f"mode must be 'instance' or 'channel', got {mode!r}")
    return call_op("", "Softmax", inputs, {"axis": 1 if mode == "channel" else -1}, name=name)


def _dropout(name, inputs, params):
    _arity(inputs, 1)
    rate, axes = params.pop("p", 0.5), params.pop("axes", ())
    mode = params.pop("mode", "training")
    params.pop("cudnn_off", None)
    _no_params(params)
    if axes:
        raise GraphError(f"axes={axes} (a mask shared along axes) is not supported")
    if mode != "training":
        raise GraphError(f"mode={mode!r} is not supported (only 'training')")
    ratio = constant(np.array(rate, dtype=np.float32), name=f"{name}_ratio")
    return call_op("", "Dropout", [inputs[0], ratio], {}, name=name)


def _flatten(name, inputs, params):
    _arity(inputs, 1)
    _no_params(params)
    return call_op("", "Flatten", inputs, {"axis": 1}, name=name)


def _concat(name, inputs, params):
    count, dim = params.pop("num_args", len(inputs)), params.pop("dim", 1)
    _no_params(params)
    if count != len(inputs) or not inputs:
        raise GraphError(f"num_args={count}, but the file gives {len(inputs)} input(s)")
    return call_op("", "Concat", inputs, {"axis": dim}, name=name)


def _reshape(name, inputs, params):
    _arity(inputs, 1)
    shape, reverse = params.pop("shape", None), params.pop("reverse", False)
    for legacy in ("target_shape", "keep_highest"):
        if params.pop(legacy, None) not in (None, (), False):
            raise GraphError(f"the legacy parameter {legacy!r} is not supported; use 'shape'")
    _no_params(params)
    return array_methods.reshape(inputs[0], shape, reverse=reverse, name=name)


def _slice_axis(name, inputs, params):
    _arity(inputs, 1)
    axis, begin = _required(params, "axis"), _required(params, "begin")
    end = params.pop("end", None)
    _no_params(params)
    return _onnx_slice(name, inputs[0], [begin], [INT64_MAX if end is None else end], [axis])


def _slice(name, inputs, params):
    """MXNet's ``slice``: begin/end/step per leading axis, None for the whole axis."""
    _arity(inputs, 1)
    begin, end = _required(params, "begin"), _required(params, "end")
    step = params.pop("step", ()) or (None,) * len(begin)
    _no_params(params)
    if not len(begin) == len(end) == len(step):
        raise GraphError(f"begin {begin}, end {end} and step {step} differ in length")
    steps = [1 if s is None else s for s in step]
    starts = [(0 if s > 0 else -1) if b is None else b for b, s in zip(begin, steps)]
    ends = [(INT64_MAX if s > 0 else -INT64_MAX) if e is None else e
            for e, s in zip(end, steps)]
    return _onnx_slice(name, inputs[0], starts, ends, list(range(len(begin))), steps)


def _onnx_slice(name, data, starts, ends, axes, steps=None):
    bounds = [constant(np.array(values, dtype=np.int64), name=f"{name}_{role}")
              for role, values in (("starts", starts), ("ends", ends), ("axes", axes),
                                   ("steps", steps)) if values is not None]
    return call_op("", "Slice", [data, *bounds], {}, name=name)


def _clip(name, inputs, params):
    _arity(inputs, 1)
    low, high = _required(params, "a_min"), _required(params, "a_max")
    _no_params(params)
    return array_methods.clip(inputs[0], low, high, name=name)


def _where(name, inputs, params):
    _arity(inputs, 3)
    _no_params(params)
    condition = call_op("", "Cast", [inputs[0]], {"to": 9}, name=f"{name}_condition",
                        exact_name=True)  # MXNet's condition is any nonzero number
    return call_op("", "Where", [condition, inputs[1], inputs[2]], {}, name=name)


def _square(name, inputs, params):
    _arity(inputs, 1)
    _no_params(params)
    return call_op("", "Mul", [inputs[0], inputs[0]], {}, name=name)


def _upsampling(name, inputs, params):
    """Nearest-neighbour UpSampling by an integer ``scale`` (bilinear needs its weight)."""
    scale, kind = _required(params, "scale"), _required(params, "sample_type")
    count = params.pop("num_args", 1)
    params.pop("workspace", None)
    params.pop("multi_input_mode", None)
    _no_params(params)
    if kind != "nearest" or count != 1 or len(inputs) != 1:
        raise GraphError(f"only sample_type='nearest' with one input is supported, got "
                         f"{kind!r} with {len(inputs)}")
    scales = constant(np.array([1, 1, scale, scale], dtype=np.float32), name=f"{name}_scales")
    return call_op("", "Resize", [inputs[0], None, scales],
                   {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                    "nearest_mode": "floor"}, name=name)


def _instance_norm(name, inputs, params):
    """Each sample's channel normalized over its spatial values: ONNX's InstanceNormalization."""
    _arity(inputs, 3)
    eps = params.pop("eps", 1e-3)
    _no_params(params)
    out = call_op("", "InstanceNormalization", inputs, {"epsilon": eps}, name=name)
    _shape_follows(inputs[1:], shape_from(name, 0, [["axis", 1]]))
    return out


def _layer_norm(name, inputs, params):
    """MXNet normalizes along ``axis`` alone, ONNX's LayerNormalization from ``axis`` to the
    last: the two agree for the last axis, MXNet's default and what Gluon writes."""
    _arity(inputs, 3)
    axis, eps = params.pop("axis", -1), params.pop("eps", 1e-5)
    if params.pop("output_mean_var", False):
        raise GraphError("output_mean_var=True is not supported")
    _no_params(params)
    if axis != -1:
        raise GraphError(f"axis={axis} is not supported: only the last axis (-1), whose "
                         f"index is unknown until the data's rank is")
    out = call_op("", "LayerNormalization", inputs, {"axis": -1, "epsilon": eps}, name=name)
    _shape_follows(inputs[1:], shape_from(name, 0, [["axis", -1]]))
    return out


def _group_norm(name, inputs, params):
    """MXNet's gamma and beta are per group (``num_groups`` values): the data seen as
    (N, groups, rest) is what InstanceNormalization normalizes per group."""
    _arity(inputs, 3)
    groups, eps = params.pop("num_groups", 1), params.pop("eps", 1e-5)
    if params.pop("output_mean_var", False):
        raise GraphError("output_mean_var=True is not supported")
    _no_params(params)
    if not _integer(groups) or groups < 1:
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


# MXNet's RNN modes -> (ONNX operator, its attributes, gates, ONNX's gate order as indices
# into MXNet's, states)
_RNN_MODES = {
    "rnn_tanh": ("RNN", {"activations": ["Tanh"]}, 1, (0,), 1),
    "rnn_relu": ("RNN", {"activations": ["Relu"]}, 1, (0,), 1),
    "lstm": ("LSTM", {}, 4, (0, 3, 1, 2), 2),
    "gru": ("GRU", {"linear_before_reset": 1}, 3, (1, 0, 2), 1),
}


def _rnn(name, inputs, params):
    """MXNet's fused RNN op over (T, N, C) data, one ONNX RNN/LSTM/GRU node per layer.

    Its parameters are MXNet's (cuDNN's) layout: per layer and direction ``i2h_weight``,
    ``h2h_weight``, then all the ``i2h_bias``, ``h2h_bias`` pairs in the same order; either
    the ``_rnn_param_concat`` of the separate arrays that Gluon's rnn layers export, or
    ``sym.RNN``'s one flat vector (whose size follows from the data's width: bind it with
    its array or its shape)."""
    mode = _required(params, "mode")
    if mode not in _RNN_MODES:
        raise GraphError(f"mode must be one of {sorted(_RNN_MODES)}, got {mode!r}")
    op_type, attributes, gates, order, states = _RNN_MODES[mode]
    hidden, layers = _required(params, "state_size"), params.pop("num_layers", 1)
    for key, value, most in (("state_size", hidden, INT64_MAX),
                             ("num_layers", layers, MAX_RNN_LAYERS)):
        if not _integer(value) or not 1 <= value <= most:
            raise GraphError(f"{key} must be a whole number in 1..{most}, got {value!r}")
    directions = 2 if params.pop("bidirectional", False) else 1
    rate, state_outputs = params.pop("p", 0.0), params.pop("state_outputs", False)
    lengths = params.pop("use_sequence_length", False)
    for unsupported in ("projection_size", "lstm_state_clip_min", "lstm_state_clip_max"):
        if params.pop(unsupported, None) is not None:
            raise GraphError(f"{unsupported} is not supported")
    params.pop("lstm_state_clip_nan", None)
    params.pop("cudnn_off", None)
    _no_params(params)
    _arity(inputs, 2 + states + bool(lengths))
    data, layout = inputs[0], _RNNLayout(name, hidden, gates, order, directions)
    pieces = _rnn_pieces(name, data, inputs[1], layout, layers)
    begin = inputs[2:2 + states]
    lengths = call_op("", "Cast", [inputs[-1]], {"to": 6}, name=f"{name}_lengths",
                      exact_name=True) if lengths else None
    attributes = dict(attributes, hidden_size=hidden,
                      direction="bidirectional" if directions == 2 else "forward")
    if "activations" in attributes:
        attributes["activations"] = attributes["activations"] * directions
    sequence, finals = data, []
    for layer in range(layers):
        if layer and rate:
            sequence = _dropout(f"{name}_dropout{layer}", [sequence], {"p": rate})
        sequence, final = layout.layer(layer, sequence, pieces, begin, lengths, op_type,
                                       attributes, 1 + states)
        finals.append(final)
    output = call_op("", "Identity", [sequence], {}, name=name)
    if not state_outputs:
        return output
    stacked = [finals[0][k] if layers == 1 else call_op(
        "", "Concat", [final[k] for final in finals], {"axis": 0},
        name=f"{name}_state{k}", exact_name=True) for k in range(states)]
    return Group([output, *stacked])


def _rnn_pieces(name, data, parameters: Symbol, layout: "_RNNLayout", layers: int):
    """The weights and biases, each flattened, in MXNet's order: the inputs of the
    ``_rnn_param_concat`` Gluon exports, or else slices of the one flat vector."""
    count = layers * layout.directions * 4
    node = parameters._outputs[0][0]
    if node.op == "Concat" and len(node.inputs) == count:
        return [Symbol([entry]) for entry in node.inputs]
    return _flat_pieces(name, data, parameters, layout, layers)


def _flat_pieces(name, data, parameters, layout, layers):
    """Slices of ``sym.RNN``'s flat parameter vector. Only the first layer's input weights
    depend on the data's width C, so each bound is ``a + b * C`` with a, b known now."""
    rows, cells = layout.gates * layout.hidden, layout.directions
    sizes = []  # (constant part, multiple of C) of each piece's length
    for layer in range(layers):
        for _ in range(cells):
            sizes += [(0, rows) if layer == 0 else (rows * cells * layout.hidden, 0),
                      (rows * layout.hidden, 0)]
    sizes += [(rows, 0)] * (2 * layers * cells)
    bounds = np.cumsum([(0, 0)] + sizes, axis=0)
    shape = call_op("", "Shape", [data], {}, name=f"{name}_data_shape", exact_name=True)
    width = _onnx_slice(f"{name}_width", shape, [2], [3], [0])
    scaled = call_op("", "Mul", [width, constant(bounds[:, 1].astype(np.int64),
                                                 name=f"{name}_per_width")], {},
                     name=f"{name}_scaled", exact_name=True)
    offsets = call_op("", "Add", [scaled, constant(bounds[:, 0].astype(np.int64),
                                                   name=f"{name}_fixed")], {},
                      name=f"{name}_offsets", exact_name=True)
    pieces = []
    for i in range(len(sizes)):
        start = _onnx_slice(f"{name}_start{i}", offsets, [i], [i + 1], [0])
        end = _onnx_slice(f"{name}_end{i}", offsets, [i + 1], [i + 2], [0])
        pieces.append(call_op("", "Slice", [parameters, start, end], {},
                              name=f"{name}_piece{i}", exact_name=True))
    return pieces


class _RNNLayout:
    """Where a layer's weights, biases and states are among MXNet's, in ONNX's layout."""

    def __init__(self, name: str, hidden: int, gates: int, order: tuple, directions: int):
        self.name, self.hidden, self.gates = name, hidden, gates
        self.order, self.directions = order, directions

    def layer(self, layer, sequence, pieces, begin, lengths, op_type, attributes, outputs):
        """One layer, all directions: (T, N, directions * hidden) and its final states."""
        prefix = f"{self.name}_layer{layer}"
        cells = [layer * self.directions + d for d in range(self.directions)]
        biases = len(pieces) // 2
        weights = self._stack([self._gates(pieces[2 * c], f"{prefix}_w{c}") for c in cells],
                              f"{prefix}_W")
        recurrences = self._stack([self._gates(pieces[2 * c + 1], f"{prefix}_r{c}")
                                   for c in cells], f"{prefix}_R")
        bias = self._stack([self._concat([self._gates(pieces[biases + 2 * c + k],
                                                      f"{prefix}_b{c}_{k}", matrix=False)
                                          for k in (0, 1)], f"{prefix}_b{c}")
                            for c in cells], f"{prefix}_B")
        states = [self._state_slice(state, layer, f"{prefix}_state{k}")
                  for k, state in enumerate(begin)]
        result = call_op("", op_type, [sequence, weights, recurrences, bias, lengths, *states],
                         attributes, name=prefix, num_outputs=outputs, exact_name=True)
        y = result[0]  # (T, directions, N, hidden)
        y = call_op("", "Transpose", [y], {"perm": [0, 2, 1, 3]}, name=f"{prefix}_y",
                    exact_name=True)
        width = constant(np.array([0, 0, -1], dtype=np.int64), name=f"{prefix}_width")
        y = call_op("", "Reshape", [y, width], {}, name=f"{prefix}_out", exact_name=True)
        return y, [result[k] for k in range(1, outputs)]

    def _gates(self, piece, name, matrix=True):
        """A flattened weight (or bias) as (gates * hidden, -1) rows in ONNX's gate order."""
        rows = self.gates * self.hidden
        shape = constant(np.array([rows, -1] if matrix else [rows], dtype=np.int64),
                         name=f"{name}_shape")
        piece = call_op("", "Reshape", [piece, shape], {}, name=f"{name}_rows",
                        exact_name=True)
        if self.order == tuple(range(self.gates)):
            return piece
        sizes = constant(np.array([self.hidden] * self.gates, dtype=np.int64),
                         name=f"{name}_sizes")
        blocks = call_op("", "Split", [piece, sizes], {"axis": 0}, name=f"{name}_split",
                         num_outputs=self.gates, exact_name=True)
        return self._concat([blocks[i] for i in self.order], f"{name}_gates")

    def _concat(self, parts, name):
        return call_op("", "Concat", parts, {"axis": 0}, name=name, exact_name=True)

    def _stack(self, parts, name):
        axes = constant(np.array([0], dtype=np.int64), name=f"{name}_axes")
        lifted = [call_op("", "Unsqueeze", [part, axes], {}, name=f"{name}_{i}",
                          exact_name=True) for i, part in enumerate(parts)]
        return lifted[0] if len(lifted) == 1 else self._concat(lifted, name)

    def _state_slice(self, state, layer, name):
        first = layer * self.directions
        return _onnx_slice(name, state, [first], [first + self.directions], [0])


def _swap_axis(name, inputs, params):
    """MXNet's SwapAxis (dims are non-negative there) for data of any rank: viewed as
    (before, dim1, between, dim2, after), transposed, and given the swapped shape back."""
    _arity(inputs, 1)
    first, second = sorted((params.pop("dim1", 0), params.pop("dim2", 0)))
    _no_params(params)
    if not (_integer(first) and first >= 0):
        raise GraphError(f"dim1 and dim2 must be whole numbers >= 0, got {first!r}")
    data = inputs[0]
    if first == second:
        return call_op("", "Identity", [data], {}, name=name)
    shape = call_op("", "Shape", [data], {}, name=f"{name}_shape", exact_name=True)

    def dims(role, begin, end):
        return _onnx_slice(f"{name}_{role}", shape, [begin], [end], [0])

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
    _arity(inputs, 1)
    return mxnet_ops.FUNCTIONS["cast"](inputs[0], **params, name=name)


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
    "Dropout": _dropout, "Flatten": _flatten, "flatten": _flatten,
    "Concat": _concat, "concat": _concat,
    "Reshape": _reshape, "reshape": _reshape,
    "slice_axis": _slice_axis, "slice": _slice, "crop": _slice,
    "clip": _clip, "where": _where, "square": _square,
    "UpSampling": _upsampling, "Cast": _cast, "cast": _cast,
    "RNN": _rnn, "_rnn_param_concat": _concat, "SwapAxis": _swap_axis,
    "swapaxes": _swap_axis,
    "InstanceNorm": _instance_norm, "LayerNorm": _layer_norm, "GroupNorm": _group_norm,
}
