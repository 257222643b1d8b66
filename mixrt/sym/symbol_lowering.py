"""A Symbol lowered to mixrt's Graph IR (``to_graph``), which inference, binding and export
all consume: variables become graph inputs (or initializers, for the arrays given), constants
initializers, operator nodes the graph's nodes; Python numbers cast to an operand's dtype are
settled into constants of that dtype. Two nodes of one name (MXNet allows it) are renamed
apart first (``_distinct``), and the records that name nodes follow the renaming.

:class:`SymbolLowering` is one of the parts :class:`mixrt.sym.symbol.Symbol` is composed of.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.infer import infer_types
from mixrt.sym.symbol_nodes import _INFO_KEYS, DEFAULT_DTYPE, LAYER, SymNode


class SymbolLowering:
    """``to_graph`` and the renaming it needs (``self._topological()``: the nodes in order)."""

    __slots__ = ()

    def to_graph(self, params: dict | None = None, *, name: str = "sym",
                 shapes: dict | None = None, dtypes: dict | None = None) -> Graph:
        """The symbol as a Graph: variables become graph inputs (those in ``params`` become
        initializers holding the given arrays), constants initializers, outputs the graph's
        outputs. ``shapes``/``dtypes`` override variables' declared types."""
        params, shapes, dtypes = params or {}, shapes or {}, dtypes or {}
        distinct = self._distinct()
        if distinct is not self:
            return distinct.to_graph(params, name=name, shapes=shapes, dtypes=dtypes)
        graph = Graph(name)
        nodes = self._topological()
        for node in nodes:
            if node.is_variable:
                _add_variable(graph, node, params, shapes, dtypes)
            elif node.is_constant:
                graph.initializers[node.name] = node.info["value"]
            else:
                graph.nodes.append(_graph_node(node))
        graph.outputs = [Value(n.output_name(i)) for n, i in self._outputs]
        graph.opsets = _opsets(nodes)
        graph.validate()
        _settle_scalars(graph)
        return graph

    def _distinct(self) -> "Symbol":
        """This symbol, or where two nodes share a name (MXNet allows it: a layer name
        used twice), a copy whose later namesakes are ``<name>_<k>``: the names its graph
        and its inference use. The copy lists its nodes in this symbol's order."""
        nodes = self._topological()
        renamed, taken = {}, set()
        for node in nodes:
            name, k = node.name, 0
            while not taken.isdisjoint(_value_names(node, name)):
                k += 1
                name = f"{node.name}_{k}"
            if name != node.name:
                renamed[id(node)] = name
            taken.update(_value_names(node, name))
        if not renamed:
            return self
        copies: dict[int, SymNode] = {}
        for node in nodes:
            inputs = [None if e is None else (copies[id(e[0])], e[1]) for e in node.inputs]
            copies[id(node)] = SymNode(node.op, renamed.get(id(node), node.name), inputs,
                                       dict(node.attrs), node.domain, node.opset,
                                       node.num_outputs, dict(node.info))
        _rename_references(nodes, copies)
        return type(self)([(copies[id(node)], index) for node, index in self._outputs])


# -- lowering helpers ------------------------------------------------------------------------

def _rename_references(nodes: list[SymNode], copies: dict) -> None:
    """In a renamed copy, the node names that nodes' records hold (the layer a node is
    part of, the consumer a parameter's shape rule reads) follow the renaming: each means
    the namesake its node feeds, directly or through the layer's inner nodes."""
    consumers: dict[int, list] = {}
    for node in nodes:
        for entry in node.inputs:
            if entry is not None:
                consumers.setdefault(id(entry[0]), []).append(node)
    for node in nodes:
        copy = copies[id(node)]
        if isinstance(node.info.get(LAYER), str):
            copy.info[LAYER] = _fed_namesake(node, node.info[LAYER], consumers, copies)
        rule = node.info.get(_INFO_KEYS[0])
        if isinstance(rule, dict) and isinstance(rule.get("node"), str):
            copy.info[_INFO_KEYS[0]] = {
                **rule, "node": _fed_namesake(node, rule["node"], consumers, copies)}


def _fed_namesake(node: SymNode, name: str, consumers: dict, copies: dict) -> str:
    """The new name of the first node called ``name`` that ``node`` is or feeds."""
    queue, seen = [node], set()
    while queue:
        current = queue.pop(0)
        if current.name == name:
            return copies[id(current)].name
        if id(current) not in seen:
            seen.add(id(current))
            queue.extend(consumers.get(id(current), []))
    return name


def _value_names(node: SymNode, name: str) -> list[str]:
    """The names ``node``'s outputs would have were the node named ``name``."""
    return [SymNode(node.op, name, num_outputs=node.num_outputs).output_name(i)
            for i in range(node.num_outputs)]


def _add_variable(graph: Graph, node: SymNode, params, shapes, dtypes) -> None:
    if node.name in params:
        graph.initializers[node.name] = np.asarray(params[node.name])
        return
    shape = shapes.get(node.name, node.info.get("shape"))
    dtype = dtypes.get(node.name, node.info.get("dtype", DEFAULT_DTYPE))
    if shape is not None:  # a str is a symbolic dimension (partial_shapes.unknown_dim)
        shape = tuple(None if d is None or d == -1 else d if isinstance(d, str) else int(d)
                      for d in shape)
    graph.inputs.append(Value(node.name, TensorType(np.dtype(dtype), shape)))


def _graph_node(node: SymNode) -> Node:
    inputs = ["" if entry is None else entry[0].output_name(entry[1])
              for entry in node.inputs]
    while inputs and inputs[-1] == "":
        inputs.pop()
    return Node(node.op, inputs, [node.output_name(i) for i in range(node.num_outputs)],
                name=node.name, domain=node.domain, opset=node.opset,
                attributes=dict(node.attrs))


def _settle_scalars(graph: Graph) -> None:
    """Python numbers in arithmetic became CastLike(constant, operand); where inference
    knows the operand's dtype, the constant is simply stored in it, so the graph carries no
    cast (and exports to opsets older than CastLike)."""
    casts = [n for n in graph.nodes if n.op_type == "CastLike" and not n.domain
             and n.inputs[0] in graph.initializers]
    if not casts:
        return
    types = infer_types(graph)
    readers = [name for node in graph.nodes for name in node.inputs]
    for node in casts:
        dtype = getattr(types.get(node.inputs[1]), "dtype", None)
        if dtype is None or readers.count(node.inputs[0]) != 1 \
                or node.outputs[0] in graph.output_names:
            continue
        value = graph.initializers.pop(node.inputs[0])
        graph.initializers[node.outputs[0]] = value.astype(dtype)
        graph.nodes.remove(node)


def _opsets(nodes: list[SymNode]) -> dict[str, int]:
    opsets: dict[str, int] = {}
    for node in nodes:
        if not (node.is_variable or node.is_constant):
            opsets[node.domain] = max(opsets.get(node.domain, 0), node.opset)
    return opsets
