"""Constant folding: a node whose inputs are all known before any feed arrives runs once, at
compile time, on the CPU with its registered kernel, and its outputs become initializers.

Known inputs are constant initializers (see :mod:`rewrite` for which are), Constant nodes
and outputs folded before. Shape and Size fold too when shape inference knows their input's
static shape (Session rejects a feed whose shape contradicts a declared static dim, so the
answer cannot change at run time).

What never folds, and why:

* random ops: their value is meant to change per run;
* ops with subgraphs: the body may read feeds, and running it here buys little;
* a node producing a graph output: the output stays a computed value, owned by the run;
* a node whose kernel rejects its dtype or attributes, or raises: it stays, so the same
  error reaches the user at load or run time, as without the pass;
* sequence or optional results (lists, None), and results over ``MAX_FOLDED_BYTES``: a
  runtime holds an Expand/ConstantOfShape of that size only for a moment, a folded one
  stays resident.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.registry import REGISTRY
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (constant_initializers, kernel_for,
                                          overridable_initializers)

NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                              "RandomUniformLike", "Bernoulli", "Multinomial", "Dropout"})
MAX_FOLDED_BYTES = 1 << 30


def fold_constants(graph: Graph, ir_version: int | None, outer: dict | None = None) -> int:
    """Evaluate every foldable node (subgraphs included); returns how many folded."""
    constants = dict(outer or {})
    for value in graph.inputs:  # a body input shadows an outer constant of its name
        constants.pop(value.name, None)
    constants.update(constant_initializers(graph, ir_version))
    protected = set(graph.output_names)
    kept, folded = [], 0
    for node in graph.nodes:
        values = _evaluate(node, constants, protected)
        if values is None:
            for sub in node.subgraphs():
                folded += fold_constants(sub, 3, constants)  # a body's initializers are fixed
            kept.append(node)
            continue
        for name, value in zip(node.outputs, values):
            if name:
                graph.initializers[name] = constants[name] = value
        folded += 1
    graph.nodes = kept
    return folded


def _evaluate(node: Node, constants: dict, protected: set) -> list | None:
    """The node's output arrays if it can be folded, else None."""
    if node.op_type in NONDETERMINISTIC and node.domain == "" or node.subgraphs() \
            or REGISTRY.is_random(node.domain, node.op_type):  # (MXNet's samplers too)
        return None
    if any(o in protected for o in node.outputs) or not any(node.outputs):
        return None
    if any(name and name not in constants for name in node.inputs):
        return None
    first = next((constants[n] for n in node.inputs if n), None)
    kernel = kernel_for(node, getattr(first, "dtype", None))
    if kernel is None:
        return None
    args = [constants[name] if name else None for name in _trimmed(node.inputs)]
    attributes = dict(node.attributes)
    if kernel.wants_output_count:
        attributes["_outputs"] = len(node.outputs)
    try:
        with np.errstate(all="ignore"):
            result = kernel.fn(np, *args, **attributes)
    except Exception:  # the run would fail the same way; leave the node to report it
        return None
    results = result if isinstance(result, tuple) else (result,)
    arrays = [_as_constant(r) for r in results]
    named = [a for a, name in zip(arrays, node.outputs) if name]
    if len(arrays) < len(node.outputs) or any(a is None for a in named):
        return None
    return arrays


def _trimmed(inputs: list[str]) -> list[str]:
    inputs = list(inputs)
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs


def _as_constant(value):
    """A C-contiguous NumPy array, or None for what cannot be an initializer."""
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray) or value.nbytes > MAX_FOLDED_BYTES:
        return None
    return value if value.flags.c_contiguous else value.copy()


# -- Shape and Size from static shapes ---------------------------------------------------------

def fold_static_shapes(graph: Graph, ir_version: int | None) -> int:
    """Shape/Size nodes of the top-level graph whose input's shape inference knows, and
    the shape arithmetic downstream of them, evaluated in the same walk: a value found
    makes the next Reshape's output shape static, so the Shape after it folds too. (Folding
    only the Shape nodes, then leaving their arithmetic to the next round's
    fold_constants, took Swin-T eight rounds of both passes, each inferring the graph.)"""
    protected = set(graph.output_names)
    settled: dict[str, np.ndarray] = {}

    def settle(node: Node, types: dict) -> dict | None:
        found = _settled(node, types, protected)
        if found:
            settled.update(found)
        return found

    infer_types(_without_overridable(graph, ir_version), settle=settle)
    kept, folded = [], 0
    for node in graph.nodes:
        named = [name for name in node.outputs if name]
        if not named or not all(name in settled for name in named):
            kept.append(node)
            continue
        for name in named:
            graph.initializers[name] = settled[name]
        folded += 1
    graph.nodes = kept
    return folded


def _settled(node: Node, types: dict, protected: set) -> dict | None:
    """A Shape/Size node's output from its input's static shape, or the outputs of a node
    whose every input has a known value (from such a node, upstream), evaluated."""
    if node.op_type in ("Shape", "Size") and node.domain == "" \
            and node.outputs[0] not in protected:
        value = getattr(types.get(node.outputs[0]), "value", None)
        return None if value is None else {node.outputs[0]: np.array(value, dtype=np.int64)}
    known = {}
    for name in node.inputs:
        value = getattr(types.get(name), "value", None) if name else None
        if name and not isinstance(value, np.ndarray):
            return None
        if name:
            known[name] = value
    if not known:
        return None  # a Constant: fold_constants takes those
    values = _evaluate(node, known, protected)
    if values is None:
        return None
    return {name: value for name, value in zip(node.outputs, values) if name}


def _without_overridable(graph: Graph, ir_version: int | None) -> Graph:
    """A view of the graph for inference in which an overridable initializer is known only
    by its declared input type (a feed may replace its value and shape)."""
    override = overridable_initializers(graph, ir_version)
    if not override:
        return graph
    return Graph(graph.name, graph.inputs, graph.outputs, graph.nodes,
                 {k: v for k, v in graph.initializers.items() if k not in override},
                 graph.value_types, graph.opsets)
