"""What an Executor shows a monitor (MXNet's ``set_monitor_callback``), per layer.

MXNet's executor calls the monitor with every node's outputs after the forward
(``fc_0_output``) and, after the backward, with the gradient each node passes to each of its
inputs (``fc_0_backward_output0`` .. ``2`` for data, weight and bias; one input gives
``act_0_backward_output``). mixrt compiles a layer into several ONNX nodes whose values the
planned sessions do not keep, so while a monitor is installed the executor runs a second
graph that keeps them:

* forward: the bound graph with every layer's output added to the graph outputs;
* backward: the bound graph with each layer input that some node computes read as
  ``value + zeros`` (a new input, ``<value>_monitor_zeros``), differentiated with respect to
  those zeros and to the arguments the layers read; the gradient of ``value + zeros`` with
  respect to the zeros is the gradient the value receives.

A value several layers read receives the sum of their gradients, which is what each of them
reports here (MXNet reports each reader's own share). In training mode the second graph
draws its own Dropout masks. Nothing of this runs while no monitor is installed.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import copy_graph
from mixrt.runtime.training.program import LOSS_OPSET
from mixrt.sym.symbol import MXNET_OP, Symbol, _layer_inputs

ZEROS = "{}_monitor_zeros"
PERTURBED = "{}_monitor_read"
# MXNet's names of its layers' inputs (their FListInputNames), which an op hook watching
# inputs reports them by (``<node>_weight``); other operators' inputs are ``input<i>``
INPUT_NAMES = {
    "FullyConnected": ("data", "weight", "bias"), "Convolution": ("data", "weight", "bias"),
    "Deconvolution": ("data", "weight", "bias"), "Pooling": ("data",),
    "BatchNorm": ("data", "gamma", "beta", "moving_mean", "moving_var"),
    "LayerNorm": ("data", "gamma", "beta"), "InstanceNorm": ("data", "gamma", "beta"),
    "GroupNorm": ("data", "gamma", "beta"), "Embedding": ("data", "weight"),
    "Dropout": ("data",), "Flatten": ("data",), "SoftmaxOutput": ("data", "label"),
    "LinearRegressionOutput": ("data", "label"), "LogisticRegressionOutput": ("data", "label"),
    "MAERegressionOutput": ("data", "label"), "RNN": ("data", "parameters", "state",
                                                      "state_cell", "sequence_length"),
}


class Layer:
    """One node of ``get_internals()`` that is an operator: its name, MXNet's operator (or
    its own op where it was made for none), its output values and the values of its inputs,
    in MXNet's order."""

    def __init__(self, node):
        self.name = node.name
        self.op = node.info.get(MXNET_OP) or node.op
        self.outputs = [node.output_name(i) for i in range(node.num_outputs)]
        self.inputs = [entry[0].output_name(entry[1]) for entry in _layer_inputs(node)]

    def input_labels(self) -> list[str]:
        """The inputs as MXNet's op hook names them: ``<layer>_<input name>``."""
        names = INPUT_NAMES.get(self.op, ())
        return [f"{self.name}_{names[i] if i < len(names) else f'input{i}'}"
                for i in range(len(self.inputs))]

    def gradient_names(self) -> list[str]:
        """MXNet's names of the gradients this layer passes back, one per input."""
        if len(self.inputs) == 1:
            return [f"{self.name}_backward_output"]
        return [f"{self.name}_backward_output{i}" for i in range(len(self.inputs))]


def layers_of(symbol: Symbol) -> list[Layer]:
    found, seen = [], set()
    for node, _ in symbol.get_internals()._outputs:
        if not node.is_variable and id(node) not in seen:
            seen.add(id(node))
            found.append(Layer(node))
    return found


def with_layer_outputs(graph: Graph, layers: list[Layer]) -> Graph:
    """A copy of ``graph`` whose outputs are every layer's outputs after its own."""
    kept = copy_graph(graph)
    present = set(kept.output_names)
    extra = [name for layer in layers for name in layer.outputs if name not in present]
    kept.outputs = kept.outputs + [Value(name) for name in dict.fromkeys(extra)]
    return kept


def perturbed(graph: Graph, layers: list[Layer]) -> tuple[Graph, dict[str, str]]:
    """A copy of ``graph`` in which every computed value a layer reads is read as
    ``value + zeros``, and {value: the zeros input whose gradient is the value's}."""
    result = copy_graph(graph)
    types = infer_types(result)
    graph_inputs = {v.name for v in result.inputs} | set(result.initializers)
    read = dict.fromkeys(name for layer in layers for name in layer.inputs)
    zeros = {}
    for value in read:
        value_type = types.get(value)
        if value in graph_inputs or not _is_float(value_type):
            continue
        zeros[value] = ZEROS.format(value)
        result.inputs.append(Value(zeros[value], value_type))
        _read_through_add(result, value, zeros[value])
    return result, zeros


def _read_through_add(graph: Graph, value: str, zeros: str) -> None:
    """Every node reading ``value`` reads ``value + zeros`` instead (the graph's outputs
    stay as they are: their head gradients are the executor's)."""
    sum_name = PERTURBED.format(value)
    for node in graph.nodes:
        node.inputs = [sum_name if name == value else name for name in node.inputs]
    graph.nodes.append(Node("Add", [value, zeros], [sum_name], name=sum_name,
                            opset=LOSS_OPSET))
    graph.toposort()


def read_names(zeros: dict[str, str]) -> dict[str, str]:
    """{value: the name its readers read it by} for the values :func:`perturbed` reads
    through zeros."""
    return {value: PERTURBED.format(value) for value in zeros}


def differentiable_inputs(graph: Graph, layers: list[Layer]) -> list[str]:
    """The float graph inputs some layer reads (arguments: data, weights, labels)."""
    types = infer_types(graph)
    read = {name for layer in layers for name in layer.inputs}
    return [v.name for v in graph.inputs if v.name in read and _is_float(types.get(v.name))]


def zeros_feeds(graph: Graph, zeros: dict[str, str], xp) -> dict:
    types = infer_types(graph)
    return {name: xp.zeros(tuple(int(d) for d in types[name].shape),
                           np.dtype(types[name].dtype)) for name in zeros.values()}


def _is_float(value_type) -> bool:
    return isinstance(value_type, TensorType) and value_type.dtype is not None and \
        np.dtype(value_type.dtype).kind == "f"
