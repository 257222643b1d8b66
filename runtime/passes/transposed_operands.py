"""A scale moved before the transpose of a product's second operand.

PyTorch exports ``scaled_dot_product_attention`` as ``(q * s) @ (k^T * s)`` with ``s`` the
square root of the scale: a Transpose of the keys' last two axes, a Mul by a one-element
constant, then the MatMul. The planner reads a transposed operand in place, as a strided
view the BLAS takes transposed, only where the Transpose feeds the product directly
(``runtime/executor.py``, ``_transposed_operands``); with the Mul between, the keys were
copied transposed on every run: a decoder step's key cache of 513 positions, 4 heads of 64,
81 us of NumPy's strided copy where the product takes ~9.

``Mul(Transpose(x), c)`` becomes ``Transpose(Mul(x, c))`` for a one-element constant ``c``
of no higher rank: the same values, each the same product, in another order.
"""

from __future__ import annotations

import numpy as np

from mixrt.runtime.graph import Graph
from mixrt.runtime.passes.rewrite import (NameMaker, constant_scopes, consumers, read_counts)


def scale_before_transpose(graph: Graph, ir_version: int | None) -> int:
    """Move each one-element scale of a product's transposed operand before its Transpose;
    returns how many."""
    moved, names = 0, NameMaker(graph)
    for g, constants in constant_scopes(graph, ir_version):
        counts, readers = read_counts(g), consumers(g)
        producers = {name: node for node in g.nodes for name in node.outputs if name}
        outputs = set(g.output_names)
        for mul in list(g.nodes):
            transpose, scale = _scaled_transpose(mul, producers, constants, counts, outputs)
            if transpose is None or not _read_as_operand(mul.outputs[0], readers):
                continue
            _swap(g, transpose, mul, scale, names)
            moved += 1
    return moved


def _scaled_transpose(mul, producers: dict, constants: dict, counts, outputs: set):
    """(the Transpose, the scale's name) when ``mul`` multiplies a Transpose of the last two
    axes, read by it alone, by a one-element constant of no higher rank; else (None, None)."""
    if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.inputs) != 2:
        return None, None
    for position in (0, 1):
        source, scale = mul.inputs[position], mul.inputs[1 - position]
        transpose = producers.get(source)
        value = constants.get(scale)
        if transpose is None or value is None or np.size(value) != 1 \
                or transpose.op_type != "Transpose" or transpose.domain not in ("", "ai.onnx") \
                or counts[source] != 1 or source in outputs:
            continue
        perm = transpose.attributes.get("perm")
        if swaps_last_two(perm) and np.ndim(value) <= len(perm):
            return transpose, scale
    return None, None


def swaps_last_two(perm) -> bool:
    """Is ``perm`` a Transpose's swap of the last two axes (the others in place)?"""
    if perm is None:
        return False
    rank = len(perm)
    return rank >= 2 and list(perm) == [*range(rank - 2), rank - 1, rank - 2]


def takes_transposed(node, name: str) -> bool:
    """Does ``node`` read ``name`` only as a MatMul's second operand, which the BLAS takes
    transposed as a strided view?"""
    return node.op_type == "MatMul" and node.domain in ("", "ai.onnx") \
        and len(node.inputs) > 1 and list(node.inputs).count(name) == 1 \
        and node.inputs[1] == name


def _read_as_operand(name: str, readers: dict) -> bool:
    found = readers.get(name, [])
    return bool(found) and all(takes_transposed(node, name) for node in found)


def _swap(g: Graph, transpose, mul, scale: str, names: NameMaker) -> None:
    """``y = Mul(Transpose(x), c)`` into ``m = Mul(x, c)``, ``y = Transpose(m)``: the Mul
    takes the Transpose's place in the node order, the Transpose the Mul's."""
    scaled, result = names(f"{mul.outputs[0]}_untransposed"), mul.outputs[0]
    first = mul.inputs.index(transpose.outputs[0])
    mul.inputs = [transpose.inputs[0], scale] if first == 0 else [scale, transpose.inputs[0]]
    mul.outputs = [scaled]
    transpose.inputs, transpose.outputs = [scaled], [result]
    at_transpose, at_mul = g.nodes.index(transpose), g.nodes.index(mul)
    g.nodes[at_transpose], g.nodes[at_mul] = mul, transpose
