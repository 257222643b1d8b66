"""Nodes that compute the same values, merged into the first of them (opt_level 1, exact).

Exported transformers repeat work per layer: a BERT encoder's every layer turns the same
attention mask into the same additive bias (``Where(mask, 0, -inf)``, its constants a copy
per layer), and each copy is a step of every run (~20-40 us a step of a small request's,
cold). A node is a duplicate of an earlier one when both run the same op, version and
attributes over the same inputs: the same values by name, or constants with the same dtype,
shape and bytes where they are small (MAX_VALUE_BYTES; a larger constant by its name alone,
so that loading never hashes a model's weights). The duplicate's readers read the first's
outputs instead, and the duplicate goes; its constants, read by nothing then, go with the
unused initializers.

Not merged: random ops (their draws differ), nodes with subgraphs, nodes without a kernel
here, nodes that write a graph output (the graph's outputs keep their names), and any node
of a training graph whose backward pass recomputes activations on purpose (``RECOMPUTES``).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.registry import REGISTRY
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.rewrite import (constant_scopes, kernel_for, remove_nodes,
                                          replace_reads_many)

MAX_VALUE_BYTES = 1024  # constants up to this size are compared by value, larger by name
MAX_LIST = 256  # list attributes up to this long are compared; a node with a longer one stays
# a graph's metadata key: its repeats are meant (autodiff's mirror recomputes activations in
# the backward pass so that the forward's die early; merged back, they would live on)
RECOMPUTES = "recomputes"


class _Unkeyable(Exception):
    """An attribute this pass does not compare (the node is left as it is)."""


def merge_duplicate_nodes(graph: Graph, ir_version: int | None) -> int:
    """Merge every node that repeats an earlier one of its graph; returns how many went
    (none where the graph's repeats are meant, ``RECOMPUTES``)."""
    if graph.metadata.get(RECOMPUTES):
        return 0
    merged = 0
    for g, constants in constant_scopes(graph, ir_version):
        merged += _merge_in(g, constants)
    return merged


def _merge_in(g: Graph, constants: dict) -> int:
    first_of: dict = {}
    renames: dict[str, str] = {}
    doomed: list[Node] = []
    outputs = set(g.output_names)
    for node in g.nodes:
        key = _key(node, constants, renames, outputs)
        if key is None:
            continue
        first = first_of.setdefault(key, node)
        if first is node or not _covers(first, node):
            continue
        for mine, theirs in zip(node.outputs, first.outputs):
            if mine:
                renames[mine] = theirs
                g.value_types.pop(mine, None)
        doomed.append(node)
    if doomed:
        remove_nodes(g, doomed)
        replace_reads_many(g, renames)
    return len(doomed)


def _key(node: Node, constants: dict, renames: dict, outputs: set):
    """What makes ``node``'s outputs what they are, or None where it may not be merged."""
    if any(o in outputs for o in node.outputs) or node.subgraphs() \
            or REGISTRY.is_random(node.domain, node.op_type) \
            or kernel_for(node) is None:
        return None
    try:
        attributes = tuple(sorted((name, _frozen(value))
                                  for name, value in node.attributes.items()))
    except _Unkeyable:
        return None
    inputs = tuple(_input_key(renames.get(name, name), constants) for name in node.inputs)
    return node.domain, node.op_type, node.opset, len(node.outputs), inputs, attributes


def _input_key(name: str, constants: dict):
    value = constants.get(name) if name else None
    if isinstance(value, np.ndarray) and value.nbytes <= MAX_VALUE_BYTES:
        return "value", value.dtype.str, value.shape, value.tobytes()
    return "name", name


def _frozen(value):
    """An attribute as a hashable value that equals another's exactly when the attribute
    does (a float NaN equals nothing: such nodes are not merged). A long list or a large
    array is not compared (_Unkeyable): a tree ensemble's node lists hold 10^5 numbers, and
    this pass runs in each round of the exact passes."""
    if isinstance(value, (bool, int, float, str, bytes)) or value is None:
        return type(value).__name__, value
    if isinstance(value, np.ndarray) and value.nbytes <= MAX_VALUE_BYTES:
        return "array", value.dtype.str, value.shape, value.tobytes()
    if isinstance(value, (list, tuple)) and len(value) <= MAX_LIST:
        return "list", tuple(_frozen(v) for v in value)
    if isinstance(value, np.generic):
        return _frozen(value.item())
    raise _Unkeyable(type(value).__name__)


def _covers(first: Node, node: Node) -> bool:
    """Does ``first`` make every output ``node`` makes (an optional output it left out
    cannot stand in for one the duplicate writes)?"""
    return all(theirs or not mine for mine, theirs in zip(node.outputs, first.outputs))
