"""Binding: every node of a graph (its subgraphs' too) paired with the kernel that runs it.

A :class:`~mixrt.runtime.session.Session` binds its graph once, at construction: each node's
kernel is looked up for its domain, op, opset and device, and its attributes are checked
against the kernel's signature, so an unsupported model fails when it is loaded, naming the
node, not halfway through a request. What binding settles (the kernel's function, the
attributes it is called with, the inputs it reads, whether it writes into ``out=``) is
fixed for the session's life; the run loop (``runtime/run_loop.py``) and the plans
(``runtime/executor.py``) only read it. It stands apart from the session because it knows
nothing of feeds, plans or runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from mixrt.ops.device import Device
from mixrt.ops.ir.registry import CONSTANT_INPUTS, lookup_kernel
from mixrt.runtime.graph import Graph, Node, outer_scope_reads


@dataclass
class BoundNode:
    node: Node
    fn: Callable
    attributes: dict[str, Any]
    subgraphs: dict[str, Any]  # attribute name -> BoundGraph or list[BoundGraph]
    inputs: list[str]  # trailing missing optional inputs dropped
    writes_into: bool = False  # the kernel takes ``out=``
    reads: list[str] = field(default_factory=list)  # inputs + subgraphs' outer-scope reads
    host_inputs: frozenset = frozenset()  # input indices the kernel only reads on the host

    @property
    def label(self) -> str:
        return self.node.label


@dataclass
class BoundGraph:
    graph: Graph
    nodes: list[BoundNode] = field(default_factory=list)
    constants: dict[str, Any] = field(default_factory=dict)  # initializers on the device


def bind_graph(graph: Graph, device: Device) -> BoundGraph:
    """Look up and check a kernel for every node (subgraphs included)."""
    bound = BoundGraph(graph, constants={k: device.put(v, f"initializer {k!r}") for k, v in
                                         graph.initializers.items()})
    for node in graph.nodes:
        kernel = lookup_kernel(node, device)
        attributes, subgraphs = {}, {}
        for key, value in node.attributes.items():
            if isinstance(value, Graph):
                subgraphs[key] = bind_graph(value, device)
            elif isinstance(value, list) and value and all(isinstance(v, Graph) for v in value):
                subgraphs[key] = [bind_graph(v, device) for v in value]
            else:
                attributes[key] = value
        if kernel.wants_output_count:
            attributes["_outputs"] = len(node.outputs)
        if kernel.wants_prepacked(device.kind) and len(node.inputs) > 1 \
                and node.inputs[1] in graph.initializers:
            # the weight is a constant of this session: its kernel may keep a repacked copy
            attributes["_prepacked"] = {CONSTANT_INPUTS: frozenset(
                i for i, name in enumerate(node.inputs) if name in graph.initializers)}
        if kernel.wants_node_state(device.kind):
            attributes["_node"] = {}
        inputs = list(node.inputs)
        while inputs and not inputs[-1]:
            inputs.pop()
        reads = [n for n in inputs if n]
        for sub in node.subgraphs():
            reads.extend(outer_scope_reads(sub))
        bound.nodes.append(BoundNode(node, kernel.for_device(device.kind), attributes,
                                     subgraphs, inputs, kernel.writes_into(device.kind),
                                     list(dict.fromkeys(reads)), kernel.host_inputs))
    return bound
