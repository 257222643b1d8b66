"""Self-attention as exported models spell it, fused into ``mixrt::FusedAttention``
(opt_level 2; the op and its exact meaning: ``ops/attention/fused_attention.py``).

The pattern, walked back from each Softmax over the last axis::

    S = MatMul(Transpose(Q, [0,2,1,3]), Transpose*(K))
    S = Mul(S, c) or Div(S, c), c a scalar constant        (optional)
    S = Add(S, mask), in either order                      (optional)
    Y = Transpose(MatMul(Softmax(S, axis=-1), Transpose(V, [0,2,1,3])), [0,2,1,3])

K's side may be one Transpose [0,2,3,1] or a run of Transposes that composes to it (PyTorch
exports ``k.transpose(1, 2)`` then ``.transpose(-1, -2)``). Every value inside the pattern
must have the pattern as its only reader and must not be a graph output; Q, K, V and the mask
are what the fused node reads. The pass runs before ``fuse_products``, which would otherwise
take a scores MatMul followed by its mask Add as a MatMul with a residual.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.attention.fused_attention import KEY_PERM, QUERY_PERM
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (GraphIndex, constant_scopes, dtype_of, kernel_for,
                                          remove_nodes)


def fuse_attention(graph: Graph, ir_version: int | None) -> int:
    """Replace each attention pattern by one FusedAttention node; returns how many."""
    types = infer_types(graph)
    fused = 0
    for g, constants in constant_scopes(graph, ir_version):
        index = GraphIndex(g)
        for softmax in [n for n in g.nodes if n.op_type == "Softmax" and not n.domain]:
            match = _Match(g, constants, types, index).at(softmax)
            if match is not None:
                match.replace()
                fused += 1
                index = GraphIndex(g)  # the graph changed; a failed match changes nothing
    if fused:
        graph.opsets.setdefault(MIXRT, 1)
    return fused


class _Match:
    """One attention pattern in graph ``g``: the nodes it covers and what the fused node
    reads."""

    def __init__(self, g: Graph, constants: dict, types: dict, index: GraphIndex):
        self.g, self.constants, self.types = g, constants, types
        self.counts, self.producers, self.readers = index.counts, index.producers, index.readers
        self.covered: list[Node] = []
        self.scale, self.mask = 1.0, ""

    # -- walking ---------------------------------------------------------------------------

    def _private(self, name: str) -> bool:
        """Read once, by the pattern, and not a graph output."""
        return self.counts[name] == 1 and name not in self.g.output_names

    def _producer(self, name: str, op_type: str) -> Node | None:
        node = self.producers.get(name)
        if node is None or node.domain or node.op_type != op_type or len(node.outputs) != 1 \
                or not self._private(name) or kernel_for(node) is None:
            return None
        return node

    def _reader(self, name: str, op_type: str) -> Node | None:
        found = self.readers.get(name, [])
        if len(found) != 1 or not self._private(name):
            return None
        node = found[0]
        if node.domain or node.op_type != op_type or len(node.outputs) != 1 \
                or kernel_for(node) is None:
            return None
        return node

    def _transposed(self, name: str, perm: tuple) -> str | None:
        """The tensor that a run of private Transposes ending in ``name`` permutes by
        ``perm`` (their composition), recording them as covered."""
        run, composed = [], tuple(range(len(perm)))
        node = self._producer(name, "Transpose")
        while node is not None:
            step = node.attributes.get("perm")
            if step is None or len(step) != len(perm):
                return None
            # the run's output axis i is axis composed[i] of this node's output, which is
            # axis step[composed[i]] of its input
            composed = tuple(step[axis] for axis in composed)
            run.append(node)
            if composed == perm:
                self.covered.extend(run)
                return node.inputs[0]
            node = self._producer(node.inputs[0], "Transpose")
        return None

    def _scalar(self, name: str) -> float | None:
        value = self.constants.get(name)
        if value is None or value.size != 1 or value.ndim > 4:
            return None
        return float(np.asarray(value).reshape(-1)[0])

    # -- the pattern -----------------------------------------------------------------------

    def at(self, softmax: Node) -> "_Match | None":
        if not self._last_axis(softmax):
            return None
        scores = self._scores_product(softmax.inputs[0])
        if scores is None:
            return None
        q = self._transposed(scores.inputs[0], QUERY_PERM)
        k = self._transposed(scores.inputs[1], KEY_PERM)
        product = self._reader(softmax.outputs[0], "MatMul")
        if q is None or k is None or product is None \
                or product.inputs[0] != softmax.outputs[0]:
            return None
        v = self._transposed(product.inputs[1], QUERY_PERM)
        last = self._reader(product.outputs[0], "Transpose")
        if v is None or last is None or tuple(last.attributes.get("perm", ())) != QUERY_PERM:
            return None
        self.covered += [scores, softmax, product, last]
        self.inputs = [q, k, v] + ([self.mask] if self.mask else [])
        if not all(dtype_of(self.types.get(name)) in _DTYPES and
                   dtype_of(self.types.get(name)) == dtype_of(self.types.get(q))
                   for name in self.inputs):
            return None
        self.name, self.output = scores.name, last.outputs[0]
        return self

    def _last_axis(self, softmax: Node) -> bool:
        """Softmax over the last of 4 axes (before opset 13 ``axis`` flattens from there on,
        which for the last axis is the same)."""
        if len(softmax.outputs) != 1 or kernel_for(softmax) is None:
            return False
        axis = softmax.attributes.get("axis", -1 if softmax.opset >= 13 else 1)
        return axis in (-1, 3)

    def _scores_product(self, name: str) -> Node | None:
        """The MatMul behind Softmax's input, through an optional Add(mask) and an optional
        Mul/Div by a scalar constant; sets ``mask`` and ``scale``."""
        node = self._producer(name, "Add")
        if node is not None:
            for side in (0, 1):
                found = self._scaled_product(node.inputs[side])
                if found is not None and node.inputs[1 - side]:
                    self.mask = node.inputs[1 - side]
                    self.covered.append(node)
                    return found
            return None
        return self._scaled_product(name)

    def _scaled_product(self, name: str) -> Node | None:
        for op_type in ("Mul", "Div"):
            node = self._producer(name, op_type)
            if node is None:
                continue
            for side in ((0, 1) if op_type == "Mul" else (0,)):
                scale = self._scalar(node.inputs[1 - side])
                product = self._producer(node.inputs[side], "MatMul")
                if scale is not None and product is not None and scale != 0.0:
                    self.scale = scale if op_type == "Mul" else 1.0 / scale
                    self.covered.append(node)
                    return product
            return None
        return self._producer(name, "MatMul")

    # -- rewriting -------------------------------------------------------------------------

    def replace(self) -> None:
        attributes = {"scale": self.scale} if self.scale != 1.0 else {}
        fused = Node("FusedAttention", self.inputs, [self.output], self.name, MIXRT, 1,
                     attributes)
        last = self.covered[-1]  # the output Transpose runs after everything it reads
        self.g.nodes[self.g.nodes.index(last)] = fused
        remove_nodes(self.g, self.covered[:-1])


_DTYPES = tuple(np.dtype(name) for name in sorted(FUSED_DTYPES))
