"""Standard nodes rewritten for a target opset that lacks their op or their form, so a model
built at a recent opset (``mixrt.sym`` builds at 21) still exports to older ones:

* LayerNormalization (opset 17) below 17: ReduceMean, Sub, Mul, Add, Sqrt, Div;
* Gelu (opset 20) below 20: the erf form, or the tanh form for ``approximate="tanh"``;
* BatchNormalization in inference form (opset 14/15 added ``training_mode``) below 14: the
  same node without the attribute, as opset 9 defines it;
* Mish (opset 18) below 18: x * tanh(softplus(x));
* Split with ``num_outputs`` (opset 18) below 18: an equal split as it is, an unequal one
  (a smaller last part) with its sizes spelled out, where the split axis's size is known;
* Pad (``axes`` input from opset 18, ``wrap`` from 19) below 18: the same node when it has
  no ``axes`` (onnx's converter has no adapter for it), or pads spelled out for every axis
  when the axes and pads are constants and the rank is known;
* the reductions that took ``axes`` as an input at opset 18 (ReduceMean, ReduceMax, ...)
  below 18: the ``axes`` attribute, when the input is a constant or absent (PyTorch's
  torch.export exporter writes them so; without this the whole model would go through
  onnx's converter, which cannot take a node another rewrite already wrote at the target);
* any node that sets, to its default value, an attribute a later opset added (Reshape's
  ``allowzero``, AveragePool's ``dilations`` of ones): the same node without it.

Each rewrite is exact, applies only to the forms it names (LayerNormalization with its Mean
and InvStdDev outputs unused) and writes its nodes at the target opset, so the retargeting
step leaves them alone. Anything else is left for the exporter's own retargeting, which
names the node when it cannot be expressed.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import defs, helper

from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import NameMaker, copy_graph, dtype_of

LAYER_NORM_OPSET, GELU_OPSET, BATCH_NORM_TRAINING_OPSET = 17, 20, 14
MISH_OPSET = SPLIT_NUM_OUTPUTS_OPSET = PAD_AXES_OPSET = 18
SPLIT_AS_INPUT_OPSET = 13  # Split's sizes: an attribute before 13, an input from 13 on
REDUCE_AXES_INPUT_OPSET = 18
AXES_BECAME_AN_INPUT_AT_18 = frozenset({
    "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})


def lower_for_opset(graph: Graph, target: int) -> Graph:
    """``graph`` itself when nothing needs rewriting for ``target``, else a rewritten copy."""
    if not any(_rewriter(node, target) for node in graph.nodes):
        return graph
    result = copy_graph(graph)
    writer = _Writer(result, target)
    nodes = []
    for node in result.nodes:
        rewrite = _rewriter(node, target)
        nodes.extend(rewrite(writer, node) if rewrite else [node])
    result.nodes = nodes
    return result


def _rewriter(node: Node, target: int):
    if node.domain:
        return None
    if node.op_type in AXES_BECAME_AN_INPUT_AT_18 and target < REDUCE_AXES_INPUT_OPSET and \
            (node.opset or target) >= REDUCE_AXES_INPUT_OPSET:
        return _reduce_with_axes_attribute  # drops noop_with_empty_axes itself
    if _defaults_the_target_lacks(node, target):
        return _without_default_attributes
    if node.op_type == "LayerNormalization" and target < LAYER_NORM_OPSET and \
            not any(node.outputs[1:]):
        return _layer_norm
    if node.op_type == "Gelu" and target < GELU_OPSET:
        return _gelu
    if node.op_type == "BatchNormalization" and target < BATCH_NORM_TRAINING_OPSET and \
            not node.attributes.get("training_mode", 0) and not any(node.outputs[1:]):
        return _batch_norm_inference
    if node.op_type == "Mish" and target < MISH_OPSET:
        return _mish
    if node.op_type == "Split" and target < SPLIT_NUM_OUTPUTS_OPSET and \
            "num_outputs" in node.attributes:
        return _split_by_count
    if node.op_type == "Pad" and target < PAD_AXES_OPSET and \
            node.attributes.get("mode", "constant") not in ("wrap", b"wrap"):
        return _pad_on_every_axis
    return None


def _defaults_the_target_lacks(node: Node, target: int) -> list[str]:
    """Attributes the node sets to their default that the op at ``target`` does not have."""
    here = schema_at(node.op_type, node.opset or target)
    there = schema_at(node.op_type, target)
    if here is None or there is None or here.since_version == there.since_version:
        return []
    names = []
    for name, value in node.attributes.items():
        if name in there.attributes or name not in here.attributes:
            continue
        default = here.attributes[name].default_value
        if default.type and _same_value(helper.get_attribute_value(default), value):
            names.append(name)
    return names


def _same_value(default, value) -> bool:
    if isinstance(default, bytes) and isinstance(value, str):
        value = value.encode()
    if isinstance(default, list) or isinstance(value, (list, tuple)):
        return list(np.ravel(default)) == list(np.ravel(value))
    return default == value


def schema_at(op_type: str, opset: int, domain: str = ""):
    """The op's ONNX schema in force at ``opset``, or None when the op did not exist yet."""
    try:
        return defs.get_schema(op_type, opset, domain)
    except defs.SchemaError:
        return None


def _without_default_attributes(writer: "_Writer", node: Node) -> list[Node]:
    dropped = set(_defaults_the_target_lacks(node, writer.target))
    attributes = {k: v for k, v in node.attributes.items() if k not in dropped}
    return [Node(node.op_type, list(node.inputs), list(node.outputs), node.name, "",
                 node.opset, attributes)]


class _Writer:
    def __init__(self, graph: Graph, target: int):
        self.graph, self.target = graph, target
        self.types = infer_types(graph)
        self.fresh = NameMaker(graph)

    def emit(self, node: Node, op_type: str, inputs: list[str], output: str | None = None,
             **attributes) -> tuple[Node, str]:
        output = output or self.fresh(f"{node.outputs[0]}/{op_type.lower()}")
        name = self.fresh(f"{node.name or node.outputs[0]}/{op_type}")
        return Node(op_type, inputs, [output], name, "", self.target, attributes), output

    def constant(self, node: Node, value: float, like: str) -> str:
        dtype = dtype_of(self.types.get(like)) or np.dtype(np.float32)
        name = self.fresh(f"{node.outputs[0]}/const")
        self.graph.initializers[name] = np.array(value, dtype=dtype)
        return name

    def rank(self, name: str) -> int | None:
        return getattr(self.types.get(name), "rank", None)


class _Chain:
    """Collects the nodes of one rewrite: ``chain(op, inputs, **attrs)`` -> output name."""

    def __init__(self, writer: _Writer, node: Node):
        self.writer, self.node, self.nodes = writer, node, []

    def __call__(self, op_type, inputs, output=None, **attributes) -> str:
        new, name = self.writer.emit(self.node, op_type, inputs, output, **attributes)
        self.nodes.append(new)
        return name

    def constant(self, value: float) -> str:
        return self.writer.constant(self.node, value, self.node.inputs[0])


def _layer_norm(writer: _Writer, node: Node) -> list[Node]:
    """y = (x - mean) / sqrt(var + eps) * scale + bias over axes axis..rank-1, computed in
    x's own type (the op's stash_type only widens float16 statistics)."""
    x, scale = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    rank = writer.rank(x)
    if rank is None:
        return [node]  # the exporter will report that LayerNormalization needs opset 17
    axis = node.attributes.get("axis", -1) % rank
    axes = list(range(axis, rank))
    chain = _Chain(writer, node)
    mean = chain("ReduceMean", [x], axes=axes, keepdims=1)
    centered = chain("Sub", [x, mean])
    variance = chain("ReduceMean", [chain("Mul", [centered, centered])], axes=axes, keepdims=1)
    epsilon = chain.constant(node.attributes.get("epsilon", 1e-5))
    deviation = chain("Sqrt", [chain("Add", [variance, epsilon])])
    normalized = chain("Div", [centered, deviation])
    if bias is None:
        chain("Mul", [normalized, scale], node.outputs[0])
    else:
        chain("Add", [chain("Mul", [normalized, scale]), bias], node.outputs[0])
    return chain.nodes


def _gelu(writer: _Writer, node: Node) -> list[Node]:
    x = node.inputs[0]
    chain = _Chain(writer, node)
    if node.attributes.get("approximate", "none") in ("tanh", b"tanh"):
        # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        cube = chain("Mul", [chain("Mul", [x, x]), x])
        inner = chain("Add", [x, chain("Mul", [cube, chain.constant(0.044715)])])
        curve = chain("Tanh", [chain("Mul", [inner, chain.constant(math.sqrt(2 / math.pi))])])
    else:  # 0.5 x (1 + erf(x / sqrt(2)))
        curve = chain("Erf", [chain("Mul", [x, chain.constant(1 / math.sqrt(2))])])
    half_x = chain("Mul", [x, chain.constant(0.5)])
    chain("Mul", [half_x, chain("Add", [curve, chain.constant(1.0)])], node.outputs[0])
    return chain.nodes


def _batch_norm_inference(writer: _Writer, node: Node) -> list[Node]:
    attributes = {k: v for k, v in node.attributes.items() if k != "training_mode"}
    return [Node(node.op_type, list(node.inputs), node.outputs[:1], node.name, "",
                 writer.target, attributes)]


def _mish(writer: _Writer, node: Node) -> list[Node]:
    chain = _Chain(writer, node)
    x = node.inputs[0]
    chain("Mul", [x, chain("Tanh", [chain("Softplus", [x])])], node.outputs[0])
    return chain.nodes


def _split_by_count(writer: _Writer, node: Node) -> list[Node]:
    """Split-18's ``num_outputs`` parts: ceil(size / n) each, the last one smaller."""
    count = int(node.attributes["num_outputs"])
    axis = int(node.attributes.get("axis", 0))
    shape = getattr(writer.types.get(node.inputs[0]), "shape", None)
    size = shape[axis] if shape is not None and -len(shape) <= axis < len(shape) else None
    attributes = {k: v for k, v in node.attributes.items() if k != "num_outputs"}
    inputs = node.inputs[:1]
    if not isinstance(size, int):
        return [node]  # the exporter will name the node and opset 18
    if size % count:
        part = -(-size // count)
        sizes = [part] * (count - 1) + [size - part * (count - 1)]
        if writer.target >= SPLIT_AS_INPUT_OPSET:
            name = writer.fresh(f"{node.outputs[0]}/split")
            writer.graph.initializers[name] = np.array(sizes, dtype=np.int64)
            inputs = inputs + [name]
        else:
            attributes["split"] = sizes
    return [Node("Split", inputs, list(node.outputs), node.name, "", writer.target,
                 attributes)]


def _pad_on_every_axis(writer: _Writer, node: Node) -> list[Node]:
    """Pad-13's form: pads for every axis (``axes`` folded in when it is constant)."""
    inputs = list(node.inputs[:3])
    axes_name = node.inputs[3] if len(node.inputs) > 3 else ""
    if axes_name:
        axes = writer.graph.initializers.get(axes_name)
        pads = writer.graph.initializers.get(node.inputs[1])
        rank = writer.rank(node.inputs[0])
        if axes is None or pads is None or rank is None:
            return [node]  # the exporter will name the node and opset 18
        full = np.zeros(2 * rank, dtype=np.int64)
        for index, axis in enumerate(int(a) % rank for a in np.ravel(axes)):
            full[axis] = pads[index]
            full[rank + axis] = pads[len(axes) + index]
        inputs[1] = writer.fresh(f"{node.outputs[0]}/pads")
        writer.graph.initializers[inputs[1]] = full
    while inputs and not inputs[-1]:
        inputs.pop()
    return [Node("Pad", inputs, list(node.outputs), node.name, "", writer.target,
                 dict(node.attributes))]


# What a reduction over no axis leaves (noop_with_empty_axes with empty axes): its
# elementwise part; the reductions not listed leave the input as it is
_ELEMENTWISE_PART = {"ReduceSumSquare": ("Mul", 2), "ReduceL1": ("Abs", 1),
                     "ReduceL2": ("Abs", 1), "ReduceLogSum": ("Log", 1)}


def _reduced_over_no_axis(writer: _Writer, node: Node) -> list[Node]:
    op_type, arity = _ELEMENTWISE_PART.get(node.op_type, ("Identity", 1))
    return [Node(op_type, node.inputs[:1] * arity, list(node.outputs), node.name, "",
                 writer.target, {})]


def _reduce_with_axes_attribute(writer: _Writer, node: Node) -> list[Node]:
    axes_name = node.inputs[1] if len(node.inputs) > 1 else ""
    axes = writer.graph.initializers.get(axes_name) if axes_name else None
    if axes_name and axes is None:
        return [node]  # axes computed at run time: the exporter names the node
    attributes = {k: v for k, v in node.attributes.items() if k != "noop_with_empty_axes"}
    listed = [] if axes is None else [int(a) for a in np.ravel(axes)]
    if not listed and node.attributes.get("noop_with_empty_axes", 0):
        return _reduced_over_no_axis(writer, node)
    if listed:
        attributes["axes"] = listed
    return [Node(node.op_type, node.inputs[:1], list(node.outputs), node.name, "",
                 writer.target, attributes)]
