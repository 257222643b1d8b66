"""The Graph IR every frontend produces and every backend consumes.

Its operator set is ONNX's: a node carries (domain, op type, opset version, attributes), so
importing and exporting ONNX translate names and versions, never meaning. A graph owns its
values (typed edges), nodes, initializers (weights) and, through GRAPH attributes, subgraphs.
A subgraph may read names from the graphs that enclose it (ONNX's outer scope).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mixrt.base.errors import GraphError
from mixrt.ops.ir.types import TensorType


@dataclass
class Value:
    """A named edge: a graph input or output, or an intermediate."""

    name: str
    type: Any = None  # TensorType | SequenceType | OptionalType | None (unknown)

    def __str__(self) -> str:
        return f"{self.name}: {self.type or '?'}"


@dataclass
class Node:
    op_type: str
    inputs: list[str]  # "" marks a missing optional input
    outputs: list[str]  # "" marks an output the model does not want
    name: str = ""
    domain: str = ""
    opset: int = 0  # version of the node's domain in force for this node
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How errors name the node: its name, else its op and first output."""
        if self.name:
            return self.name
        first = next((o for o in self.outputs if o), "?")
        return f"{self.op_type}->{first}"

    def subgraphs(self) -> list["Graph"]:
        found = []
        for value in self.attributes.values():
            if isinstance(value, Graph):
                found.append(value)
            elif isinstance(value, list) and value and isinstance(value[0], Graph):
                # an ONNX list attribute holds one type; checking every element of a tree
                # ensemble's node lists (10^5 numbers) on each pass made loading take seconds
                found.extend(value)
        return found


@dataclass
class Graph:
    name: str = "main"
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    initializers: dict[str, Any] = field(default_factory=dict)  # name -> numpy array
    value_types: dict[str, Any] = field(default_factory=dict)  # known types of intermediates
    opsets: dict[str, int] = field(default_factory=dict)  # domain -> version
    # what a compiled (.mxr) model carries beyond the graph: precomputed memory plans
    # (mixrt.runtime.memory.MemoryPlan, one per input-shape signature) and provenance
    # (producer, source_opset, opt_level, ...); both empty for a freshly imported model
    plans: list = field(default_factory=list)
    metadata: dict = field(default_factory=dict)

    # -- queries --------------------------------------------------------------------------

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.outputs]

    def feed_inputs(self) -> list[Value]:
        """Inputs a caller must (or may) feed: graph inputs that are not initializers."""
        return [v for v in self.inputs if v.name not in self.initializers]

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    def type_of(self, name: str):
        for value in (*self.inputs, *self.outputs):
            if value.name == name and value.type is not None:
                return value.type
        if name in self.value_types:
            return self.value_types[name]
        if name in self.initializers:
            array = self.initializers[name]
            return TensorType(array.dtype, tuple(array.shape))
        return None

    def all_nodes(self):
        """Every node, subgraphs' nodes included (depth first)."""
        for node in self.nodes:
            yield node
            for sub in node.subgraphs():
                yield from sub.all_nodes()

    # -- ordering and validation ---------------------------------------------------------

    def toposort(self, outer_names: frozenset = frozenset()) -> None:
        """Order nodes so each runs after its producers; GraphError names a node in a cycle
        or one that reads a name nothing defines."""
        inputs = set(self.input_names)
        defined = set(outer_names) | inputs | set(self.initializers)
        producer = {}
        for node in self.nodes:
            for out in node.outputs:
                if not out:
                    continue
                if out in producer or out in self.initializers or out in inputs:
                    raise GraphError(f"graph {self.name!r}: output {out!r} of node "
                                     f"{node.label!r} is already defined elsewhere; "
                                     f"each name must have exactly one producer")
                producer[out] = node
        ordered, state = [], {}

        def visit(node: Node, chain: list[Node]) -> None:
            mark = state.get(id(node))
            if mark == "done":
                return
            if mark == "active":
                cycle = " -> ".join(n.label for n in chain[chain.index(node):] + [node])
                raise GraphError(f"graph {self.name!r} has a cycle: {cycle}")
            state[id(node)] = "active"
            for name in node_reads(node):
                if name in producer:
                    visit(producer[name], chain + [node])
                elif name not in defined:
                    raise GraphError(f"graph {self.name!r}: node {node.label!r} reads "
                                     f"{name!r}, which no input, initializer or node defines")
            state[id(node)] = "done"
            ordered.append(node)

        for node in self.nodes:
            visit(node, [])
        self.nodes = ordered
        inner = frozenset(defined | set(producer))
        for node in self.nodes:
            for sub in node.subgraphs():
                sub.toposort(inner)
        for out in self.output_names:
            if out not in inner:
                raise GraphError(f"graph {self.name!r}: output {out!r} is never produced")

    def validate(self) -> None:
        """Raise GraphError on a dangling input, a duplicate output or a cycle."""
        self.toposort()


def node_reads(node: Node) -> list[str]:
    """Names a node reads, its subgraphs' outer-scope reads included."""
    names = [n for n in node.inputs if n]
    for sub in node.subgraphs():
        names.extend(outer_scope_reads(sub))
    return names


def outer_scope_reads(graph: Graph) -> list[str]:
    """Names a subgraph reads that it does not define itself."""
    defined = set(graph.input_names) | set(graph.initializers)
    defined.update(out for node in graph.nodes for out in node.outputs if out)
    reads = []
    for node in graph.nodes:
        reads.extend(n for n in node_reads(node) if n not in defined)
    reads.extend(n for n in graph.output_names if n not in defined)
    return list(dict.fromkeys(reads))
