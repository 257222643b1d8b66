"""MXNet 1.x's layer symbols (``sym.FullyConnected``, ``sym.Convolution``, ``sym.BatchNorm``,
``sym.SoftmaxOutput``, ...) with MXNet's argument names, defaults and parameter names.

    data = sym.Variable("data")
    fc1 = sym.FullyConnected(data, num_hidden=128, name="fc1")     # fc1_weight, fc1_bias
    net = sym.SoftmaxOutput(sym.Activation(fc1, act_type="relu"), name="softmax")
    net.infer_shape(data=(32, 784))    # fc1_weight (128, 784), softmax_label (32,)

The layers are ``mixrt/layers/``'s, written once for NDArrays, symbols and Gluon;
:class:`SymbolCall` is how they build here. Each is composed of registered ONNX ops (so it
exports, binds and differentiates like any symbol) under one name: the node that gives the
layer's output is named after the layer (``fc1``, output ``fc1_output``), the others
``<layer>_<role>``. Without ``name=`` a layer gets MXNet's automatic one
(``fullyconnected0``, ``convolution1``). Parameters left out become Variables named
MXNet's way (``<layer>_weight``, ``_bias``, ``_gamma``, ``_beta``; the running statistics
``_moving_mean``/``_moving_var`` are auxiliary states) whose shapes follow
from the data's (``mixrt.sym.parameter_rules.SHAPE_FROM``), so ``infer_shape(data=...)`` and
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

Here ``SoftmaxOutput``'s ``out_grad`` and ``smooth_alpha`` are refused (the loss
Module.from_symbol attaches has neither), as is ``BatchNorm``'s ``output_mean_var``.

Names that ``mixrt.sym`` already has as ONNX operators (``Flatten``, ``Concat``, ``Dropout``,
``Reshape``, ``LRN``, ``Pad``, ``Cast``, ...) keep their ONNX meaning; only names ONNX does not
use are defined here. Bad arguments raise GraphError naming the layer and the argument.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import numpy as np

from mixrt import layers
from mixrt.base.errors import GraphError
from mixrt.layers.call import LayerCall, ShapeRule
from mixrt.sym.parameter_rules import shape_from, SHAPE_FROM
from mixrt.sym.symbol import (ATTRIBUTES, call_op, constant, INPUT_ORDER, LAYER, layer_name,
                               MXNET_OP, MXNET_PARAMS, prefixed, split_symbol_attributes,
                               variable_named, Symbol)

# node.info key of an *Output layer's head: what Module.from_symbol trains it with
OUTPUT_INFO = "mxnet_output"


# -- the shared layers, as symbols -------------------------------------------------------------

class SymbolCall(LayerCall):
    """A layer of ``mixrt/layers/`` built into a Symbol's graph: its nodes named after the
    layer, the parameters left out made as Variables whose shapes follow from the data's."""

    error_type = GraphError

    def __init__(self, kind: str, name, unknown: dict | None = None):
        # attr=, lr_mult=, __layout__=, ...: attributes of the layer's nodes and of the
        # parameters it makes, not arguments of the layer
        unknown, self.attributes = split_symbol_attributes(unknown or {})
        self._data_nodes: set[int] = set()  # the nodes given as the layer's data
        super().__init__(kind, name, unknown)

    def full_name(self, kind: str, given: str | None) -> str:
        self.base = layer_name(kind, given)
        return prefixed(self.base)

    def node_name(self, role: str | None = None) -> str:
        return self.name if role is None else f"{self.name}_{role}"

    def node(self, op_type: str, inputs, role: str | None = None, **attributes) -> Symbol:
        """One node of the layer: named after it (``fc1``) or ``<layer>_<role>``, marked as
        the layer's (``LAYER``: the layer is one node to MXNet's structure queries)."""
        base = self.base if role is None else f"{self.base}_{role}"
        made = call_op("", op_type, list(inputs), attributes, name=base, exact_name=True)
        node = made._outputs[0][0]
        node.info[LAYER] = self.name
        node.info[MXNET_OP] = self.kind
        if self.attributes:
            node.info[ATTRIBUTES] = dict(self.attributes)
        self._data_first(node)
        return made

    def _data_first(self, node) -> None:
        """MXNet lists a layer's data before its parameters (Embedding: data, weight):
        the inputs that are or come from the layer's data go first in the listed order."""
        from_data = [i for i, entry in enumerate(node.inputs)
                     if entry is not None and self._reaches_data(entry[0])]
        order = from_data + [i for i in range(len(node.inputs)) if i not in from_data]
        if order != sorted(order):
            node.info[INPUT_ORDER] = order

    def _reaches_data(self, node) -> bool:
        """Whether ``node`` is the layer's data or one of the layer's nodes computed
        from it."""
        if id(node) in self._data_nodes:
            return True
        return node.info.get(LAYER) == self.name and any(
            entry is not None and self._reaches_data(entry[0]) for entry in node.inputs)

    def scalar(self, value: float, like: Symbol, role: str) -> Symbol:
        """A number in ``like``'s dtype (stored in it when the graph is lowered)."""
        return self.node("CastLike", [constant(np.float64(value)), like], role)

    def ints(self, values) -> Symbol:
        return constant(np.asarray(values, dtype=np.int64))

    def symbol(self, argument: str, value) -> Symbol:
        if not isinstance(value, Symbol) or len(value) != 1:
            raise self.error(f"{argument} must be a single-output Symbol, got {value!r}")
        return value

    def data(self, value, argument: str = "data") -> Symbol:
        """The data input; left out, a Variable ``<layer>_data`` (as MXNet makes one)."""
        data = variable_named(self.node_name(argument)) if value is None \
            else self.symbol(argument, value)
        self._data_nodes.add(id(data._outputs[0][0]))
        return data

    def parameter(self, role: str, given, *, rule: ShapeRule | None = None, shape=None,
                  aux: bool = False, init=None, dtype=None, single_ok: bool = False,
                  source: dict | None = None):
        """``given``, or a new Variable ``<layer>_<role>`` with what is known of its shape
        and the rule that completes it from the data's (``rule``, or ``source``: a
        ``shape_from`` record as it is)."""
        if rule is not None:
            source = shape_from(self.node_name(rule.reader), 0, list(rule.dims),
                                rule.min_float_bits)
        if given is not None:
            given = self.symbol(role, given)
            _adopt(given, source)
            if source is None and shape is not None and None not in tuple(shape):
                _declare_shape(given, tuple(shape))
            return given
        if source is not None and shape is not None and None in tuple(shape):
            # a shape the data completes is the data's to give: until then MXNet knows
            # nothing of it (``()``), and neither does its ``__shape__`` attribute
            shape = None
        made = variable_named(self.node_name(role), shape, dtype, init, aux=aux,
                              attr=None if source is None else {SHAPE_FROM: source})
        if self.attributes:
            made._outputs[0][0].info[ATTRIBUTES] = dict(self.attributes)
        return made

    def batch_normalization(self, x, scale, beta, mean, var, eps, momentum, output_mean_var,
                            role):
        """One BatchNormalization node: the executor runs it in training or inference
        mode as the symbol is bound, and writes the running statistics back."""
        if output_mean_var:
            raise self.error("output_mean_var=True is not supported")
        return self.node("BatchNormalization", [x, scale, beta, mean, var], role,
                         epsilon=eps, momentum=momentum), []

    def softmax_output(self, data, label, options):
        return _softmax_output(self, data, label, options)


def _adopt(given: Symbol, source: dict | None) -> None:
    """A value of unknown shape passed as a parameter (a bare Variable, or a cast or sum of
    one) gets the shape rule of the parameter it stands for (what MXNet's backward shape
    inference gives it, and checks it against)."""
    node = given._outputs[0][0]
    declared = node.info.get("shape")
    if source is None or node.is_constant or given._outputs[0][1] != 0 or \
            SHAPE_FROM in node.info or (
            declared is not None and all(d is not None for d in declared)):
        return
    node.info[SHAPE_FROM] = source


def _declare_shape(given: Symbol, shape: tuple) -> None:
    """A bare Variable of unknown shape passed as a parameter whose shape the layer's
    arguments fix (Embedding's weight: (input_dim, output_dim)) takes that shape, which
    MXNet's shape inference gives it."""
    node = given._outputs[0][0]
    if node.is_variable and node.info.get("shape") is None:
        node.info["shape"] = shape


# FullyConnected, Convolution, Deconvolution, Pooling, BatchNorm, Activation, LeakyReLU,
# Embedding, SoftmaxOutput
globals().update(layers.bind_all(SymbolCall))


# -- output layers -----------------------------------------------------------------------------

def _softmax_output(layer: SymbolCall, data: Symbol, label, options) -> Symbol:
    """The softmax, with the record Module.from_symbol reads to attach MXNet's loss."""
    if options.out_grad:
        raise layer.error("out_grad=True is not supported")
    if options.smooth_alpha != 0:
        raise layer.error("smooth_alpha (label smoothing) is not supported")
    trained = {"grad_scale": options.grad_scale, "ignore_label": options.ignore_label,
               "use_ignore": options.use_ignore, "normalization": options.normalization,
               "multi_output": options.multi_output, "preserve_shape": options.preserve_shape}
    if not options.flattened:
        prediction = layer.node("Softmax", [data], "prob", axis=options.axis)
        label_dims = [["axis", 0], ["axes", 2, None]] if options.multi_output else \
            [["axes", 0, -1]]
        return _output_head(layer, prediction, label, shape_from(prediction.name, 0,
                                                                 label_dims),
                            prediction.name, trained)
    # softmax over (batch, everything else), in the data's shape; the loss reads the
    # flattened data
    flat = layer.node("Flatten", [data], "flatten", axis=1)
    soft = layer.node("Softmax", [flat], "softmax", axis=1)
    prediction = layer.node("Reshape", [soft, layer.node("Shape", [data], "shape")], "prob")
    return _output_head(layer, prediction, label, shape_from(flat.name, 0, [["axes", 0, -1]]),
                        soft.name, trained)


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
    layer = SymbolCall(kind, name, unknown)
    options = {"grad_scale": layer.number("grad_scale", grad_scale)}
    data = layer.data(data)
    prediction = layer.node(op_type, [data], "prediction")
    return _output_head(layer, prediction, label, shape_from(
        prediction.name, 0, [["axes", 0, None]]), prediction.name, options)


def _output_head(layer: SymbolCall, prediction: Symbol, label, label_shape: dict, logits: str,
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


# -- the parameters a layer was given, as MXNet keeps them ---------------------------------------

# the layers' inputs (Symbols), which are not parameters
_INPUTS = ("data", "weight", "bias", "gamma", "beta", "moving_mean", "moving_var", "label")


def _recording_parameters(function):
    """``function`` (a layer) recording the parameters it was given, as strings, on the
    layer's output node and on the Variables it made for the inputs left out: MXNet keeps
    them in the node's attributes (``list_attr()`` is ``{"num_hidden": "10"}``) and copies
    them onto the variables it creates (``fc_weight``'s attributes hold them too)."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def layer(*args, **kwargs):
        result = function(*args, **kwargs)
        given = signature.bind_partial(*args, **kwargs).arguments
        parameters = {key: str(value) for key, value in given.items()
                      if key not in (*_INPUTS, "name", "unknown") and value is not None
                      and signature.parameters[key].kind is not inspect.Parameter.VAR_KEYWORD}
        if parameters:
            _record_on(result, parameters, [v for v in given.values() if isinstance(v, Symbol)])
        return result
    return layer


def _record_on(result: Symbol, parameters: dict, inputs: list) -> None:
    given = {id(node) for symbol in inputs for node in symbol._topological()}
    head = result._outputs[0][0]
    for node in result._topological():
        if node is head or (node.is_variable and id(node) not in given):
            node.info[MXNET_PARAMS] = dict(parameters)


for _name in LAYERS:
    globals()[_name] = _recording_parameters(globals()[_name])
