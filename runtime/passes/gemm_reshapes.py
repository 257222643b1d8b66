"""A dense layer between a flattening and an unflattening Reshape, as PyTorch exports GPT-2's
Conv1D, made a MatMul over the unflattened input (opt_level 2)::

    a = Reshape(x, [rows, K])      x (..., K), rows the product of its leading dims
    g = Gemm(a, B, C)              B (K, N) a constant, no transposes, alpha = beta = 1,
                                   C a constant of N values (or none)
    y = Reshape(g, [..., N])       x's leading dims, then N

becomes ``y = Add(MatMul(x, B), C)``, the same products and the same bias addition, which
``fuse_products`` (next) takes as one FusedMatMul, with a residual Add after it too. A
one-token decoder step runs four such layers a block: two reshapes, and the residual's Add
after two of them, went with each. The shapes must be known and say so; both reshaped values
must be read only by the pattern. Not before opset 7 (Add's broadcasting came then).
"""

from __future__ import annotations

import math

from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.fuse import FLOAT_DTYPES
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (GraphIndex, NameMaker, PatternMatch, dtype_of,
                                          remove_nodes, replace_matches)


def unflatten_dense_layers(graph: Graph, ir_version: int | None) -> int:
    """Replace each reshaped Gemm by MatMul and Add; returns how many."""
    types = infer_types(graph)

    def match_at(g, constants, index: GraphIndex, gemm: Node):
        match = _Match(g, constants, types, index)
        return match if match.at(gemm) else None
    return replace_matches(graph, ir_version,
                           lambda node: node.op_type == "Gemm" and not node.domain,
                           match_at)


class _Match(PatternMatch):

    def at(self, gemm: Node) -> bool:
        if gemm.opset < 7 or len(gemm.outputs) != 1 or not self._plain(gemm, "Gemm") \
                or any(gemm.attributes.get(name, 0) for name in ("transA", "transB")) \
                or gemm.attributes.get("alpha", 1.0) != 1.0 \
                or gemm.attributes.get("beta", 1.0) != 1.0:
            return False
        inputs = list(gemm.inputs) + [""] * (3 - len(gemm.inputs))
        weight = self.constants.get(inputs[1])
        flatten = self._producer(inputs[0], "Reshape")
        unflatten = self._reader(gemm.outputs[0], "Reshape")
        if weight is None or weight.ndim != 2 or flatten is None or unflatten is None:
            return False
        self.x, self.weight, self.bias = flatten.inputs[0], inputs[1], inputs[2]
        self.gemm, self.flatten, self.unflatten = gemm, flatten, unflatten
        return self._bias_suits(weight.shape[1]) and self._shapes_suit(weight.shape)

    def _bias_suits(self, columns: int) -> bool:
        if not self.bias:
            return True
        bias = self.constants.get(self.bias)
        return bias is not None and bias.size == columns and bias.shape[-1:] == (columns,) \
            and bias.ndim <= 2

    def _shapes_suit(self, weight_shape) -> bool:
        """x (..., K) with every dim known, its flattened form (rows, K), and the result
        x's leading dims and N; float, as the fused products serve."""
        x, flat, y = (self._known(name) for name in (self.x, self.flatten.outputs[0],
                                                     self.unflatten.outputs[0]))
        k, n = weight_shape
        return x is not None and flat is not None and y is not None and len(x) >= 2 \
            and x[-1] == k and flat == (math.prod(x[:-1]), k) and y == x[:-1] + (n,) \
            and dtype_of(self.types.get(self.x)) in FLOAT_DTYPES

    def _known(self, name: str) -> tuple | None:
        found = self.types.get(name)
        shape = None if found is None else found.shape
        return tuple(shape) if shape is not None and all(isinstance(d, int)
                                                         for d in shape) else None

    def replace(self) -> None:
        gemm, output = self.gemm, self.unflatten.outputs[0]
        product = output if not self.bias else NameMaker(self.g)(f"{output}/product")
        nodes = [Node("MatMul", [self.x, self.weight], [product], gemm.name, "", gemm.opset,
                      {})]
        if self.bias:
            nodes.append(Node("Add", [product, self.bias], [output], f"{gemm.name}/bias", "",
                              gemm.opset, {}))
        at = self.g.nodes.index(self.unflatten)
        self.g.nodes[at:at + 1] = nodes
        remove_nodes(self.g, [self.flatten, gemm])
