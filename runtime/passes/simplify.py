"""Removal of nodes that pass their input through unchanged: Identity, inference Dropout,
Reshape/Expand to the input's own static shape, Transpose by the identity permutation,
Flatten at axis 1 of a matrix, Cast and CastLike to the input's own dtype, and Mul or Div
by a constant of ones that does not broadcast the input (converters write it: onnxmltools's
LightGBM classifier multiplies its probabilities by one, which left a one-node model two
steps a request).

Removing ``y = op(x)`` makes every reader of ``y`` read ``x`` (subgraph outer-scope reads
included). When ``y`` is an output of its graph the name must survive: the node producing
``x`` is made to write ``y`` instead, unless ``x`` is itself an input, initializer, outer
name or graph output, in which case an Identity stays in the node's place.
"""

from __future__ import annotations

import numpy as np

from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_node, infer_types
from mixrt.runtime.passes.rewrite import (constant_initializers, dtype_of, kernel_for,
                                          read_counts, remove_nodes, replace_reads_many,
                                          static_shape)


def remove_noops(graph: Graph, ir_version: int | None) -> int:
    """Bypass every pass-through node (subgraphs included); returns how many."""
    types = infer_types(graph)
    return _remove_in(graph, types, constant_initializers(graph, ir_version))


def _remove_in(graph: Graph, types: dict, constants: dict) -> int:
    """Bypass the pass-through nodes of ``graph``. Readers are rewired and nodes dropped in
    one sweep at the end: done node by node, Swin-T's 208 no-ops took 3 s of walks over its
    6,000 nodes. Until then a bypassed output's readers still name it, which the rules'
    type lookups (by name, from ``types``) do not mind."""
    removed = 0
    counts = _ReadCounts(graph)
    renames: dict[str, str] = {}  # a bypassed output -> the name its readers will read
    doomed: list[Node] = []
    for node in list(graph.nodes):
        for sub in node.subgraphs():
            removed += _remove_in(sub, types, {**constants, **sub.initializers})
        if _passes_through(node, types, constants, counts) and \
                _bypass(graph, node, renames, doomed):
            removed += 1
    remove_nodes(graph, doomed)
    replace_reads_many(graph, renames)
    return removed


class _ReadCounts:
    """How many places read each name, counted once, when a rule first asks (only Dropout's
    does). Counting before any bypass stays right for its question, whether an output is
    read at all: a bypass only moves reads from a node's output to its input, and the
    bypassed node, still in the graph while counted, reads that input."""

    def __init__(self, graph: Graph):
        self._graph = graph
        self._counts = None

    def __getitem__(self, name: str) -> int:
        if self._counts is None:
            self._counts = read_counts(self._graph)
        return self._counts[name]


def _passes_through(node: Node, types: dict, constants: dict, counts) -> bool:
    if node.domain != "" or not node.inputs or not node.inputs[0] or not node.outputs[0]:
        return False
    rule = _RULES.get(node.op_type)
    if rule is None or kernel_for(node, dtype_of(types.get(node.inputs[0]))) is None:
        return False  # a node binding would reject keeps its error at every level
    return rule(node, types, constants, counts)


def _identity(node, types, constants, counts) -> bool:
    return len(node.outputs) == 1


def _inference_dropout(node, types, constants, counts) -> bool:
    """Dropout before opset 12 never trains in mixrt (see ops/nn/nn.py); from 12 on it trains
    only when training_mode is given and not a constant false. Its mask must be unread."""
    if any(counts[o] for o in node.outputs[1:] if o):
        return False
    if node.opset < 12:
        return True
    mode = node.inputs[2] if len(node.inputs) > 2 else ""
    return not mode or (mode in constants and not bool(constants[mode].reshape(-1)[0]))


def _computed(node, types):
    """The output type the op's own rule gives for these inputs (a declared type for the
    output could be stale; this is what the kernel will do)."""
    found = infer_node(node, types)
    return found[0] if found else None


def _same_static_shape(node, types, constants, counts) -> bool:
    x, y = static_shape(types.get(node.inputs[0])), static_shape(_computed(node, types))
    return len(node.outputs) == 1 and x is not None and x == y


def _identity_transpose(node, types, constants, counts) -> bool:
    perm = node.attributes.get("perm")
    if perm is not None:
        return list(perm) == list(range(len(perm)))
    rank = getattr(types.get(node.inputs[0]), "rank", None)
    return rank is not None and rank <= 1  # the default reverses the axes


def _flatten_of_matrix(node, types, constants, counts) -> bool:
    """Flatten at axis 1 of a rank-2 input gives the input's own shape, whatever its dims
    (skl2onnx flattens a Tokenizer's (rows, tokens) so)."""
    rank = getattr(types.get(node.inputs[0]), "rank", None)
    axis = node.attributes.get("axis", 1)
    return len(node.outputs) == 1 and rank == 2 and axis in (1, -1)


def _single_concat(node, types, constants, counts) -> bool:
    """A Concat of one input is that input (a KV cache's concat with no past, as the
    transformers exporter writes it before every attention), where the input's rank is
    known and the axis lies in it (a Concat that would raise keeps its error)."""
    rank = getattr(types.get(node.inputs[0]), "rank", None)
    axis = node.attributes.get("axis")
    return len(node.inputs) == 1 and len(node.outputs) == 1 and rank is not None \
        and rank >= 1 and axis is not None and -rank <= int(axis) < rank


def _same_dtype(node, types, constants, counts) -> bool:
    x, y = dtype_of(types.get(node.inputs[0])), dtype_of(_computed(node, types))
    return x is not None and x == y


def _times_one(node, types, constants, counts) -> bool:
    """x * 1, 1 * x and x / 1 are x, bit for bit, for every value of an integer or IEEE
    float dtype (-0 and NaN included), where the ones have x's dtype and leave its shape as
    it is: no more axes than x has, and one element or each dim 1 or the known dim of x it
    meets. A ones constant read first is swapped behind x (Mul commutes) so that the bypass
    reads x."""
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return False
    first, second = node.inputs
    if node.op_type == "Mul" and first in constants and second not in constants:
        first, second = second, first
    ones = constants.get(second)
    x_type = types.get(first)
    dtype, rank = dtype_of(x_type), getattr(x_type, "rank", None)
    if ones is None or dtype is None or rank is None or ones.dtype != dtype \
            or ones.dtype.kind not in "iuf" or not bool(np.all(ones == 1)):
        return False
    keeps_shape = ones.ndim <= rank and (ones.size == 1 or _broadcasts_into(
        getattr(x_type, "shape", None), ones.shape))
    if keeps_shape:
        node.inputs = [first, second]
    return keeps_shape


def _broadcasts_into(shape, other) -> bool:
    """Does ``other`` broadcast against ``shape`` (a value's dims, ints or names; None:
    unknown) to ``shape`` itself, whatever its unknown dims? Each of ``other``'s dims is 1
    or the known dim it meets."""
    if shape is None or len(other) > len(shape):
        return False
    return all(o == 1 or (isinstance(d, int) and d == o)
               for o, d in zip(other[::-1], list(shape)[::-1]))


_RULES = {
    "Identity": _identity,
    "Flatten": _flatten_of_matrix,
    "Dropout": _inference_dropout,
    "Reshape": _same_static_shape,
    "Expand": _same_static_shape,
    "Transpose": _identity_transpose,
    "Concat": _single_concat,
    "Cast": _same_dtype,
    "CastLike": _same_dtype,
    "Mul": _times_one,
    "Div": _times_one,
}


def _bypass(graph: Graph, node: Node, renames: dict, doomed: list) -> bool:
    """Rewire around ``node`` (recorded in ``renames`` and ``doomed`` for the sweep); False
    when only an Identity could stand in and it is one."""
    x, y = _current_name(renames, node.inputs[0]), node.outputs[0]
    if y not in graph.output_names:
        doomed.append(node)
        renames[y] = x
        return True
    producer = next((n for n in graph.nodes if x in n.outputs
                     and not any(n is gone for gone in doomed)), None)
    if producer is not None and x not in graph.output_names:
        doomed.append(node)
        producer.outputs = [y if n == x else n for n in producer.outputs]
        renames[x] = y
        if x in graph.value_types and y not in graph.value_types:
            graph.value_types[y] = graph.value_types[x]
        graph.value_types.pop(x, None)
        return True
    if node.op_type == "Identity":
        return False
    node.op_type, node.inputs, node.outputs = "Identity", [x], [y]
    node.opset, node.attributes = graph.opsets.get("", node.opset), {}
    return True


def _current_name(renames: dict, name: str) -> str:
    """What ``name`` will be called once the pending renames are made."""
    while name in renames:
        name = renames[name]
    return name
