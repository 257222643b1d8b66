"""RMS normalization as Llama-style exports spell it, fused into one
``SimplifiedLayerNormalization`` (opt_level 2; the op: ``ops/attention/contrib_norm.py``)::

    p = Pow(x, 2) or Mul(x, x)
    r = ReduceMean(p, axes=[-1], keepdims=1)
    s = Sqrt(Add(r, eps)), eps a scalar constant
    n = Mul(x, Div(1, s)) or Mul(x, Reciprocal(s)) or Div(x, s), in either order
    y = Mul(n, w) or Mul(w, n), w a constant over the last axis

Seven nodes become one: a one-token decoder step runs nine of these, and at its sizes each
node costs more to dispatch than to compute. Every value inside must be read only by the
pattern and must not be a graph output; x and w are what the fused node reads.
"""

from __future__ import annotations

import numpy as np

from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (GraphIndex, constant_ints, dtype_of, kernel_for,
                                          remove_nodes, replace_matches)


def fuse_rms_norms(graph: Graph, ir_version: int | None) -> int:
    """Replace each RMS normalization pattern by one node; returns how many."""
    types = infer_types(graph)

    def match_at(g, constants, index, reduce):
        match = _Match(g, constants, types, index)
        return match if match.at(reduce) else None
    return replace_matches(graph, ir_version,
                           lambda node: node.op_type == "ReduceMean" and not node.domain,
                           match_at)


class _Match:
    def __init__(self, g: Graph, constants: dict, types: dict, index: GraphIndex):
        self.g, self.constants, self.types = g, constants, types
        self.counts, self.producers, self.readers = index.counts, index.producers, index.readers
        self.covered: list[Node] = []

    def _plain(self, node: Node | None, *op_types: str) -> bool:
        return (node is not None and not node.domain and node.op_type in op_types
                and len(node.outputs) == 1 and kernel_for(node) is not None)

    def _private(self, name: str) -> bool:
        return self.counts[name] == 1 and name not in self.g.output_names

    def _reader(self, name: str, *op_types: str) -> Node | None:
        found = self.readers.get(name, [])
        if len(found) != 1 or not self._private(name) or not self._plain(found[0], *op_types):
            return None
        self.covered.append(found[0])
        return found[0]

    def _scalar(self, name: str) -> float | None:
        c = self.constants.get(name)
        return None if c is None or c.size != 1 or c.dtype.kind != "f" else float(c.reshape(-1)[0])

    def _other(self, node: Node, name: str) -> str:
        a, b = node.inputs
        return b if a == name else a

    def at(self, reduce: Node) -> bool:
        x = self._squared(reduce)
        if x is None or not self._last_axis(reduce, x):
            return False
        add = self._reader(reduce.outputs[0], "Add")
        if add is None or len(add.inputs) != 2:
            return False
        self.epsilon = self._scalar(self._other(add, reduce.outputs[0]))
        sqrt = self._reader(add.outputs[0], "Sqrt")
        if self.epsilon is None or sqrt is None:
            return False
        normalized = self._normalized(sqrt.outputs[0], x)
        scale = normalized and self._reader(normalized, "Mul")
        if not scale or len(scale.inputs) != 2:
            return False
        self.weight = self._other(scale, normalized)
        w = self.constants.get(self.weight)
        last = (self.types.get(x).shape or [None])[-1]
        self.x, self.output = x, scale.outputs[0]
        return (w is not None and w.ndim == 1 and w.shape[0] == last
                and w.dtype == dtype_of(self.types.get(x)))

    def _squared(self, reduce: Node) -> str | None:
        """x of ``ReduceMean(x^2)``, with that square covered."""
        if not reduce.inputs or reduce.attributes.get("keepdims", 1) != 1:
            return None
        square = self.producers.get(reduce.inputs[0])
        if not self._plain(square, "Pow", "Mul") or not self._private(reduce.inputs[0]):
            return None
        x, other = square.inputs[0], square.inputs[1]
        if square.op_type == "Pow" and self._scalar(other) != 2.0 \
                or square.op_type == "Mul" and other != x:
            return None
        centered = self.producers.get(x)
        if centered is not None and centered.op_type == "Sub" and any(
                getattr(self.producers.get(v), "op_type", "") == "ReduceMean"
                for v in centered.inputs):
            return None  # a LayerNorm's variance: the elementwise fusion takes its tail
        x_type = self.types.get(x)
        if dtype_of(x_type) != np.float32 or not getattr(x_type, "shape", None):
            return None
        self.covered += [square, reduce]
        return x

    def _last_axis(self, reduce: Node, x: str) -> bool:
        axes = reduce.attributes.get("axes")
        if axes is None and len(reduce.inputs) > 1:
            axes = constant_ints(self.constants, reduce.inputs[1])
        rank = len(self.types.get(x).shape)
        return axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1)

    def _normalized(self, root: str, x: str) -> str | None:
        """The value x / root (float32 x: the op computes in float32), through Div(1, root) or Reciprocal(root) then Mul by x, or
        Div(x, root); None when the pattern's readers differ."""
        found = self._reader(root, "Div", "Reciprocal")
        if found is None:
            return None
        if found.op_type == "Div" and found.inputs == [x, root]:
            return found.outputs[0]
        if found.op_type == "Div" and (found.inputs[1] != root
                                       or self._scalar(found.inputs[0]) != 1.0):
            return None
        mul = self._reader(found.outputs[0], "Mul")
        if mul is None or len(mul.inputs) != 2 or self._other(mul, found.outputs[0]) != x:
            return None
        return mul.outputs[0]

    def replace(self) -> None:
        last = self.covered[-1]
        fused = Node("SimplifiedLayerNormalization", [self.x, self.weight], [self.output],
                     last.name, "", last.opset, {"axis": -1, "epsilon": self.epsilon})
        self.g.nodes[self.g.nodes.index(last)] = fused
        remove_nodes(self.g, self.covered[:-1])
