"""Rotary position embedding as Hugging Face's Llama-family exports spell it, fused into
``mixrt::FusedRotary`` (opt_level 2; the op and its exact meaning:
``ops/attention/fused_rotary.py``). The pattern, walked from each Concat::

    x1 = Slice(x, 0, half, last axis)          x2 = Slice(x, half, end, last axis)
    r  = Concat(Neg(x2), x1, axis=-1)          (rotate_half)
    y  = Add(Mul(x, cos), Mul(r, sin))         either operand order in each

Both exporters of PyTorch write it so for queries and keys in every layer: five nodes that
a one-token decoder step spends more time dispatching than computing. Every value inside
must have the pattern as its only reader and must not be a graph output; x's last axis must
be of known even length, and cos and sin of x's dtype. The pass
runs before ``fuse_elementwise``, which would otherwise take the products and the sum.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.ir.registry import MIXRT
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (PatternMatch, constant_ints, dtype_of, fuse_into_mixrt,
                                          remove_nodes)

_DTYPES = frozenset(np.dtype(name) for name in FUSED_DTYPES)


def fuse_rotary(graph: Graph, ir_version: int | None) -> int:
    """Replace each rotary embedding pattern by one FusedRotary node; returns how many."""
    return fuse_into_mixrt(graph, ir_version, infer_types(graph), "Concat", _Match)


class _Match(PatternMatch):
    """One rotary pattern in graph ``g``: the nodes it covers and what the fused node reads."""

    def at(self, concat: Node) -> "_Match | None":
        if len(concat.inputs) != 2 or len(concat.outputs) != 1:
            return None
        negated, first_half = concat.inputs
        neg = self._producer(negated, "Neg")
        second = neg and self._producer(neg.inputs[0], "Slice")
        first = self._producer(first_half, "Slice")
        if not (second and first) or second.inputs[0] != first.inputs[0]:
            return None
        self.x = first.inputs[0]
        size = self._last_size(self.x)
        if size is None or concat.attributes.get("axis") not in (-1, self._rank - 1) \
                or self._range(first) != (0, size // 2) \
                or self._range(second) != (size // 2, size):
            return None
        self.covered += [first, second, neg, concat]
        return self if self._products(concat.outputs[0]) else None

    def _products(self, rotated: str) -> bool:
        """``Add(Mul(x, cos), Mul(rotated, sin))``: records cos, sin and the output."""
        by_sin = self._reader(rotated, "Mul")
        add = by_sin and self._reader(by_sin.outputs[0], "Add")
        if not add or len(add.inputs) != 2 or len(by_sin.inputs) != 2:
            return False
        other = add.inputs[1] if add.inputs[0] == by_sin.outputs[0] else add.inputs[0]
        by_cos = self._producer(other, "Mul")
        if by_cos is None or self.x not in by_cos.inputs:
            return False
        self.sin = _other(by_sin, rotated)
        self.cos = _other(by_cos, self.x)
        self.output, self.name = add.outputs[0], add.name
        self.covered += [by_sin, by_cos, add]
        return self._tables_fit()

    def _tables_fit(self) -> bool:
        """cos and sin of x's dtype (how they broadcast needs no check: the fused node
        broadcasts the three as the products and the sum do)."""
        dtype = dtype_of(self.types.get(self.x))
        return dtype in _DTYPES and all(dtype_of(self.types.get(table)) == dtype
                                        for table in (self.cos, self.sin))

    # -- the pieces ---------------------------------------------------------------------------

    def _last_size(self, x: str) -> int | None:
        shape = getattr(self.types.get(x), "shape", None)
        if not shape or not isinstance(shape[-1], int) or shape[-1] % 2 or shape[-1] == 0:
            return None
        self._rank = len(shape)
        return shape[-1]

    def _range(self, node: Node) -> tuple | None:
        """(start, end) a Slice keeps of x's last axis (clamped as Slice clamps them), or
        None when it slices another axis, steps, or reads values not known at load."""
        if node.opset < 10:
            starts, ends = node.attributes.get("starts"), node.attributes.get("ends")
            axes, steps = node.attributes.get("axes"), None
        else:
            starts, ends, axes, steps = (constant_ints(self.constants, name) for name in
                                         (list(node.inputs[1:]) + ["", "", ""])[:4])
            if any(name and found is None for name, found in
                   zip(node.inputs[1:], (starts, ends, axes, steps))):
                return None
        if starts is None or ends is None or len(starts) != 1 or len(ends) != 1:
            return None
        axis = (axes or [0])[0]
        if axis not in (-1, self._rank - 1) or (steps and list(steps) != [1]):
            return None
        size = self.types.get(self.x).shape[-1]
        return tuple(min(max(v + size if v < 0 else v, 0), size) for v in (starts[0], ends[0]))

    def replace(self) -> None:
        fused = Node("FusedRotary", [self.x, self.cos, self.sin], [self.output], self.name,
                     MIXRT, 1, {})
        last = self.covered[-1]  # the Add reads everything else the pattern makes
        self.g.nodes[self.g.nodes.index(last)] = fused
        remove_nodes(self.g, self.covered[:-1])


def _other(node: Node, name: str) -> str:
    a, b = node.inputs
    return b if a == name else a
