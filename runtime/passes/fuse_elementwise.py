"""Fusion of connected elementwise ops into one ``mixrt::FusedElementwise`` (opt_level 2).

A group grows backwards from its last node (the root, whose output is the group's only
output) through producers whose output every reader of which is already in the group and
which is not a graph output: GELU's diamond (``x`` read by both the Div and the final Mul)
joins whole, a LayerNorm's tail from ``+ eps`` to ``+ beta`` too. Groups never create a
cycle: only the root's value leaves the group, and every member runs before the root.

A node is fusible when its op has a step in :data:`mixrt.ops.elementwise.fused_elementwise.OPS`,
every operand and its result share one dtype the kernel serves, and its constants fit a float32
attribute exactly. A one-element constant operand that cannot widen the result becomes a literal in
the program (a ``Scalar`` step) instead of an input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.elementwise.fused_elementwise import OPS
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.fuse import FLOAT_DTYPES, clip_bounds, float32_exact
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (constant_scopes, dtype_of, kernel_for, read_counts,
                                          remove_nodes)

_RENAMED = {"Sum": "Add", "Max": "Max", "Min": "Min"}  # variadic ops, when given two inputs
_BINARY = {"Add", "Sub", "Mul", "Div", "Sum", "Max", "Min"}
_ATTRIBUTES = {"LeakyRelu": {"alpha"}, "HardSigmoid": {"alpha", "beta"}, "Clip": {"min", "max"}}


@dataclass
class _Step:
    """One node as a program step: its op, operands (value names, or floats for literals)
    and parameters."""

    op: str
    operands: list
    params: list


def fuse_elementwise(graph: Graph, ir_version: int | None) -> int:
    """Replace each group of two or more fusible nodes; returns how many groups."""
    types = infer_types(graph)
    fused = 0
    for g, constants in constant_scopes(graph, ir_version):
        fused += _fuse_in(g, constants, types)
    if fused:
        graph.opsets.setdefault(MIXRT, 1)
    return fused


def _fuse_in(g: Graph, constants: dict, types: dict) -> int:
    steps = {id(n): s for n in g.nodes if (s := step_of(n, constants, types)) is not None}
    if len(steps) < 2:
        return 0
    counts = read_counts(g)
    producer = {out: node for node in g.nodes for out in node.outputs if out}
    grouped: set[int] = set()
    fused = 0
    for root in reversed(list(g.nodes)):
        if id(root) not in steps or id(root) in grouped:
            continue
        group = _grow(g, root, steps, grouped, counts, producer)
        grouped.update(id(n) for n in group)
        if len(group) >= 2:
            _replace(g, group, steps)
            fused += 1
    return fused


def _grow(g, root, steps, grouped, counts, producer) -> list[Node]:
    group, members = [root], {id(root)}
    changed = True
    while changed:
        changed = False
        reads = {}
        for node in group:
            for name in _variables(steps[id(node)]):
                reads[name] = reads.get(name, 0) + 1
        for name, slots in reads.items():
            p = producer.get(name)
            if p is None or id(p) in members or id(p) in grouped or id(p) not in steps:
                continue
            if counts[name] == slots and name not in g.output_names:
                group.append(p)
                members.add(id(p))
                changed = True
    order = {id(n): i for i, n in enumerate(g.nodes)}
    return sorted(group, key=lambda n: order[id(n)])


def _variables(step: _Step) -> list[str]:
    return [o for o in step.operands if isinstance(o, str)]


# -- nodes as steps -------------------------------------------------------------------------------

def step_of(node: Node, constants: dict, types: dict) -> _Step | None:
    """The node as a program step, or None when it cannot join a fused group."""
    op_type = node.op_type
    if node.domain != "" or len(node.outputs) != 1 or node.subgraphs():
        return None
    if op_type not in OPS and op_type not in _RENAMED or op_type == "Scalar":
        return None
    if set(node.attributes) - _ATTRIBUTES.get(op_type, set()) or kernel_for(node) is None:
        return None  # legacy broadcast/axis/consumed_inputs forms stay as they are
    out_type = types.get(node.outputs[0])
    dtype = dtype_of(out_type)
    if dtype not in FLOAT_DTYPES:
        return None
    if op_type in _BINARY:
        return _binary_step(node, constants, types, dtype, getattr(out_type, "rank", None))
    return _unary_step(node, constants, types, dtype)


def _binary_step(node, constants, types, dtype, rank) -> _Step | None:
    if len(node.inputs) != 2 or node.opset < 7 or not all(node.inputs):
        return None
    operands, (a, b) = [], node.inputs
    for name, other in ((a, b), (b, a)):
        literal = _literal(name, other, constants, types, dtype, rank)
        if literal is not None:
            operands.append(literal)
        elif dtype_of(types.get(name)) == dtype:
            operands.append(name)
        else:
            return None
    if not any(isinstance(o, str) for o in operands):
        return None  # all constant: folding's business
    return _Step(_RENAMED.get(node.op_type, node.op_type), operands, [])


def _literal(name, other, constants, types, dtype, rank) -> float | None:
    """A one-element constant's value, when inlining it cannot change the result's shape
    or value."""
    c = constants.get(name)
    if c is None or c.size != 1 or c.dtype != dtype or other in constants:
        return None
    value = float(c.reshape(-1)[0])
    other_rank = getattr(types.get(other), "rank", None)
    if not np.isfinite(value) or not float32_exact(value):
        return None
    if c.ndim and (other_rank is None or rank is None or c.ndim > other_rank):
        return None
    return value


def _unary_step(node, constants, types, dtype) -> _Step | None:
    x = node.inputs[0] if node.inputs else ""
    if not x or dtype_of(types.get(x)) != dtype or x in constants:
        return None
    op_type, attributes = node.op_type, node.attributes
    if op_type == "Pow":
        params = _exponent(node, constants, types)
    elif op_type == "Clip":
        params = clip_bounds(node, constants)
    elif op_type == "LeakyRelu":
        params = [attributes.get("alpha", 0.01)]
    elif op_type == "HardSigmoid":
        params = [attributes.get("alpha", 0.2), attributes.get("beta", 0.5)]
    else:
        params = [] if len(node.inputs) == 1 else None
    if params is None or not all(float32_exact(p) for p in params):
        return None
    return _Step(op_type, [x], [float(p) for p in params])


def _exponent(node, constants, types) -> list[float] | None:
    """Pow's exponent as a parameter: a finite one-element constant that does not widen x."""
    if len(node.inputs) != 2 or node.opset < 7 or node.inputs[1] not in constants:
        return None
    c = constants[node.inputs[1]]
    x_rank = getattr(types.get(node.inputs[0]), "rank", None)
    if c.size != 1 or c.dtype.kind != "f" or x_rank is None or c.ndim > x_rank:
        return None
    value = float(c.reshape(-1)[0])
    return [value] if np.isfinite(value) else None


# -- a group as one node ---------------------------------------------------------------------------

def _replace(g: Graph, group: list[Node], steps: dict) -> None:
    inputs, registers = [], {}
    for node in group:  # the group's inputs: every variable read not computed inside it
        for name in _variables(steps[id(node)]):
            inside = any(name in member.outputs for member in group)
            if not inside and name not in registers:
                registers[name] = len(inputs)
                inputs.append(name)
    ops, operands, params, literals = [], [], [], {}
    for node in group:
        step = steps[id(node)]
        reads = []
        for operand in step.operands:
            if isinstance(operand, str):
                reads.append(registers[operand])
                continue
            if operand not in literals:
                literals[operand] = len(inputs) + len(ops)
                ops.append("Scalar")
                params.append(operand)
            reads.append(literals[operand])
        ops.append(step.op)
        operands.extend(reads)
        params.extend(step.params)
        registers[node.outputs[0]] = len(inputs) + len(ops) - 1
    root = group[-1]
    fused = Node("FusedElementwise", inputs, [root.outputs[0]], root.name, MIXRT, 1,
                 {"ops": ops, "operands": operands, "params": params})
    g.nodes[g.nodes.index(root)] = fused
    remove_nodes(g, group[:-1])
    g.opsets.setdefault(MIXRT, 1)
