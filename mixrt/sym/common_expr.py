"""Common subexpression elimination on a Symbol, as MXNet's executor does it when
``MXNET_ELIMINATE_COMMON_EXPR`` is on (its default): two nodes of one operator, the same
attributes and the same inputs compute the same value, so one of them is kept.

    (a + b) + (a + b)        ->  s = a + b; s + s

Nodes that draw random numbers (Dropout, the samplers) are each their own draw and stay
apart, and nodes that update state (BatchNormalization's running statistics) too. When two
outputs of the symbol become one value, the later one is an ``Identity`` copy carrying its
own name, so the outputs keep their names and stay distinct arrays (MXNet inserts the same
copy).
"""

from __future__ import annotations

import os

import numpy as np

from mixrt.sym.symbol import call_op, Symbol, SymNode

ENVIRONMENT = "MXNET_ELIMINATE_COMMON_EXPR"

# op types whose every node is a draw of its own, or updates a state of its own
_KEPT_APART = frozenset({
    "Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
    "Multinomial", "Bernoulli", "BatchNormalization"})


def enabled() -> bool:
    """Whether executors eliminate common expressions (``MXNET_ELIMINATE_COMMON_EXPR``,
    on unless set to 0)."""
    return os.environ.get(ENVIRONMENT, "1").strip() not in ("0", "false", "False")


def eliminate_common_expr(symbol: Symbol) -> Symbol:
    """A copy of ``symbol`` with each repeated computation done once (see above)."""
    kept: dict = {}  # a node's identity (op, attributes, inputs) -> the node kept for it
    copies: dict[int, SymNode] = {}
    for node in symbol._topological():
        inputs = [None if entry is None else (copies[id(entry[0])], entry[1])
                  for entry in node.inputs]
        key = _identity(node, inputs)
        if key is not None and key in kept:
            copies[id(node)] = kept[key]
            continue
        copy = node if node.is_variable else SymNode(
            node.op, node.name, inputs, dict(node.attrs), node.domain, node.opset,
            node.num_outputs, dict(node.info))
        copies[id(node)] = copy
        if key is not None:
            kept[key] = copy
    return Symbol(_distinct_outputs(symbol, copies))


def _identity(node: SymNode, inputs: list):
    """What makes two nodes compute the same value; None for a node never merged."""
    if node.is_variable or node.op in _KEPT_APART:
        return None
    if node.is_constant:
        value = np.asarray(node.info["value"])
        return ("constant", value.dtype.str, value.shape, value.tobytes())
    sources = tuple(None if entry is None else (id(entry[0]), entry[1]) for entry in inputs)
    return (node.domain, node.op, node.opset, node.num_outputs, _frozen(node.attrs),
            sources)


def _frozen(value):
    if isinstance(value, dict):
        return tuple(sorted((key, _frozen(item)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item) for item in value)
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    return value


def _distinct_outputs(symbol: Symbol, copies: dict) -> list:
    """The outputs after merging; one that is now another output's value, or that lost its
    name to the node it merged into, is an Identity copy under its own name."""
    outputs, seen = [], set()
    for node, index in symbol._outputs:
        entry = (copies[id(node)], index)
        key = (id(entry[0]), index)
        if key in seen or (entry[0].name != node.name and not node.is_variable):
            entry = call_op("", "Identity", [Symbol([entry])], {}, name=node.name,
                            exact_name=True)._outputs[0]
        seen.add(key)
        outputs.append(entry)
    return outputs
