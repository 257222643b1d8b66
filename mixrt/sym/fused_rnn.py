"""MXNet's fused recurrent operator as a symbol: ``sym.RNN(data, parameters, state,
state_cell, state_size=..., num_layers=..., mode=...)``, and the ``RNN`` node of MXNet's
symbol files.

    data = mx.sym.Variable("data")                       # (T, N, C)
    net = mx.sym.RNN(data, state_size=16, num_layers=2, mode="lstm", name="lstm")
    # arguments: data, lstm_parameters, lstm_state, lstm_state_cell

The operator is written once for arrays and symbols (``mixrt/layers/fused_rnn.py``): one
ONNX RNN, GRU or LSTM node per layer over slices of the one flat ``parameters`` vector, in
MXNet's (cuDNN's) layout. Here it is written into a Symbol's graph (:class:`SymbolWriter`).
The inputs left out become Variables named MXNet's way (``<name>_parameters``,
``<name>_state``, ``<name>_state_cell``). Variables without a shape of their own (these, or
bare ones given) learn it from the data's, as MXNet infers it: the states (layers x
directions, batch, state_size), the flat parameters' length from the data's width. With
``state_outputs`` the outputs are MXNet's: ``<name>_output``, ``<name>_state_output`` and,
for an LSTM, ``<name>_statecell_output``. A symbol file's ``RNN`` node (``mxnet_rnn``, in
``OPERATORS`` for ``mixrt.sym.mxnet_json``) takes Gluon's exported ``_rnn_param_concat`` of
the separate weights as well.

``sym.RNN`` called without MXNet's keywords (``state_size``, ``mode``, ...) is still ONNX's
RNN operator, whose name it shares.
"""

from __future__ import annotations

from mixrt.base.errors import GraphError
from mixrt.layers import fused_rnn as layer
from mixrt.layers.fused_rnn import (GATES, INPUTS, PARAMETERS, input_names,  # noqa: F401
                                    is_mxnet_call, with_onnx_rnn)
from mixrt.sym.parameter_rules import shape_from, SHAPE_FROM
from mixrt.sym.symbol import (call_op, constant, Group, layer_name, MXNET_OP, prefixed,
                               variable_named, Symbol)


class SymbolWriter:
    """The fused RNN's ops as nodes of a Symbol's graph, named as the layer says."""

    @staticmethod
    def call(op_type, inputs, attributes, name, exact_name=False, num_outputs=None):
        return call_op("", op_type, list(inputs), dict(attributes), name=name,
                       exact_name=exact_name, num_outputs=num_outputs)

    @staticmethod
    def constant(array, name):
        return constant(array, name=name)

    @staticmethod
    def group(outputs):
        return Group(outputs)

    @staticmethod
    def pieces(parameters: Symbol, count: int):
        """The inputs of the ``_rnn_param_concat`` (a Concat) Gluon exports, if it is one."""
        node = parameters._outputs[0][0]
        if node.op == "Concat" and len(node.inputs) == count:
            return [Symbol([entry]) for entry in node.inputs]
        return None


def mxnet_rnn(name, inputs, params):
    """A symbol file's ``RNN`` node: its inputs in MXNet's order, its parameters."""
    return layer.fused_rnn(SymbolWriter, name, inputs, params)


OPERATORS = {"RNN": mxnet_rnn}


def fused_rnn(*args, name=None, **kwargs) -> Symbol:
    """MXNet's ``sym.RNN``: inputs positionally or by name (``data``, ``parameters``,
    ``state``, ``state_cell``, ``sequence_length``), MXNet's parameters by keyword."""
    given = dict(zip(INPUTS, args))
    if len(args) > len(INPUTS):
        raise GraphError(f"RNN takes at most {len(INPUTS)} inputs, got {len(args)}")
    for key in INPUTS:
        if key in kwargs:
            if key in given:
                raise GraphError(f"RNN: {key} given both positionally and by name")
            given[key] = kwargs.pop(key)
    unknown = sorted(set(kwargs) - set(PARAMETERS))
    if unknown:
        raise GraphError(f"RNN: unknown arguments {unknown}; MXNet's RNN takes "
                         f"{list(INPUTS)} and {list(PARAMETERS)}")
    base = layer_name("RNN", name)
    full = prefixed(base)
    inputs = [_input(full, key, given.get(key)) for key in input_names(kwargs)]
    for key, value in zip(input_names(kwargs), inputs):
        rule = _shape_rule(key, base, kwargs)
        if rule is not None and _shapeless_variable(value):
            value._outputs[0][0].info[SHAPE_FROM] = rule
    built = mxnet_rnn(base, inputs, dict(kwargs))
    outputs = list(built) if len(built) > 1 else [built]
    head = outputs[0]._outputs[0][0]
    head.name = full  # the layer's name, whatever the name manager makes of it a second time
    head.info[MXNET_OP] = "RNN"
    states = [call_op("", "Identity", [state], {}, name=f"{full}_{label}", exact_name=True)
              for state, label in zip(outputs[1:], ("state", "statecell"))]
    return Group([outputs[0], *states]) if states else outputs[0]


def _shape_rule(key: str, base: str, params: dict) -> dict | None:
    """Where the shape of input ``key`` comes from, as MXNet infers it from the data's
    (T, N, C): the states (layers x directions, N, state_size); the flat parameters
    C * gates * state_size * directions plus the rest of the weights and the biases. The
    first layer's node reads the data as its input 0."""
    layers, size = params.get("num_layers", 1), params.get("state_size")
    if not (isinstance(layers, int) and isinstance(size, int)):
        return None  # the operator refuses them when it is built
    directions = 2 if params.get("bidirectional") else 1
    if key in ("state", "state_cell"):
        dims = [layers * directions, ["axis", 1], size]
    elif key == "parameters":
        rows = GATES.get(params.get("mode"), 1) * size
        later_inputs = rows * directions * size * directions * (layers - 1)
        recurrent = rows * size * directions * layers
        biases = 2 * rows * directions * layers
        dims = [["linear", 2, rows * directions, later_inputs + recurrent + biases]]
    else:
        return None
    return shape_from(f"{base}_layer0", 0, dims)


def _shapeless_variable(symbol: Symbol) -> bool:
    """A Variable with no shape of its own and no rule for one (a bare ``Variable('x')``)."""
    node = symbol._outputs[0][0]
    return node.is_variable and node.info.get("shape") is None and SHAPE_FROM not in node.info


def _input(layer: str, key: str, value) -> Symbol:
    """The given input, or MXNet's Variable for it (``<layer>_<key>``)."""
    if value is None:
        return variable_named(f"{layer}_{key}")
    if not isinstance(value, Symbol) or len(value) != 1:
        raise GraphError(f"RNN {layer!r}: {key} must be a single-output Symbol, got "
                         f"{value!r}")
    return value
