"""Shape and dtype inference over a Graph, from each op's ``infer`` function.

Types the model declares (inputs, outputs, value_info, initializers) win over inferred ones;
inference fills the gaps. It never touches tensor data (only initializers' shapes and, for
shape-computing ops such as Reshape, constant values known at plan time).
"""

from __future__ import annotations

from mixrt.ops.registry import REGISTRY
from mixrt.ops.types import TensorType
from mixrt.runtime.graph import Graph, Node


def infer_types(graph: Graph, outer: dict | None = None, settle=None) -> dict[str, object]:
    """Name -> TensorType/SequenceType/OptionalType (or None when unknown), subgraphs'
    values included.

    ``settle(node, types)``, when given, runs after each top-level node is inferred and may
    return ``{output name: array}`` for outputs whose data is known at that point (the
    executor's shape arithmetic, fixed by one input signature); those outputs are typed with
    their value, so the Reshape downstream knows its output shape."""
    types: dict[str, object] = dict(outer or {})
    for name, array in graph.initializers.items():
        types[name] = TensorType(array.dtype, tuple(array.shape), value=array)
    for value in graph.inputs:
        if value.type is not None and value.name not in graph.initializers:
            types[value.name] = value.type
    for node in graph.nodes:
        for name, value_type in zip(node.outputs, infer_node(node, types)):
            if name:
                types[name] = graph.value_types.get(name) or value_type
        for sub in node.subgraphs():
            types.update(infer_types(sub, types))
        for name, array in ((settle(node, types) if settle else None) or {}).items():
            types[name] = TensorType(array.dtype, tuple(array.shape), value=array)
    for value in graph.outputs:
        if value.type is not None:
            types[value.name] = value.type
    return types


def infer_node(node: Node, types: dict) -> list:
    """The node's output types, or an empty list when its op cannot say."""
    kernel = REGISTRY.find(node.domain, node.op_type, node.opset)
    if kernel is None or kernel.infer_fn is None:
        return []
    inputs = [types.get(name) if name else None for name in node.inputs]
    attributes = {k: v for k, v in node.attributes.items() if not isinstance(v, Graph)}
    if kernel.wants_output_count:
        attributes["_outputs"] = len(node.outputs)
    try:
        return list(kernel.infer_fn(*inputs, **attributes))
    except Exception:  # an infer function that cannot handle unknowns says nothing
        return []


def first_input_dtype(node: Node, types: dict) -> str | None:
    """The dtype name of the node's first present input, when known."""
    for name in node.inputs:
        if name:
            value_type = types.get(name)
            if isinstance(value_type, TensorType) and value_type.dtype is not None:
                return value_type.dtype.name
            return None
    return None
