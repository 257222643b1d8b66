"""Squeeze-excite blocks as one ``mixrt::SqueezeExcite`` node (opt_level 2; the op:
``ops/nn/squeeze_excite.py``)::

    s = GlobalAveragePool(x), or ReduceMean(x) over axes 2 and 3 keeping them (timm's
        blocks, and TensorFlow's through tf2onnx)
    h = Conv or FusedConv(s, W1, B1), 1x1, its activation (or none)
    g = Conv or FusedConv(h, W2, B2), 1x1, its activation (or none)
    y = Mul(x, g) or Mul(g, x)

as MobileNetV3, EfficientNet and RegNet-Y export them, once the product fusion has taken
each convolution's activation. Four nodes become one: at a service's image sizes they
cost more to dispatch than to compute (a MobileNetV3-small at 96 x 160: nine blocks of
~20 us, ~2-8 us of it arithmetic), and at each new image size each took its kernel's full
route. The weights and biases must be constants, the convolutions plain 1x1 ones (no
group, padding, stride, dilation or residual), and every value inside read only by the
pattern and not a graph output.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.nn.fused import ACTIVATIONS
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (PatternMatch, constant_ints, dtype_of,
                                          fuse_into_mixrt, kernel_for, remove_nodes)

_FLOATS = (np.float32, np.float64)
_SQUEEZES = ("GlobalAveragePool", "ReduceMean")


def fuse_squeeze_excites(graph: Graph, ir_version: int | None) -> int:
    """Replace each squeeze-excite pattern by one node; returns how many."""
    types = infer_types(graph)
    return sum(fuse_into_mixrt(graph, ir_version, types, squeeze, _Match)
               for squeeze in _SQUEEZES)


class _Match(PatternMatch):
    def _only_reader(self, name: str) -> Node | None:
        """The one node reading ``name``, where ``name`` is private (of any op type)."""
        found = self.readers.get(name, [])
        return found[0] if len(found) == 1 and self._private(name) else None

    def at(self, pool: Node) -> "_Match | None":
        return self if self._matches(pool) else None

    def _matches(self, pool: Node) -> bool:
        x = pool.inputs[0] if pool.inputs else ""
        x_type = self.types.get(x)
        if not x or dtype_of(x_type) not in _FLOATS or len(getattr(x_type, "shape", None) or ()) != 4 \
                or len(pool.outputs) != 1 or not self._over_the_plane(pool):
            return False
        self.pool, self.x = pool, x
        self.squeeze = self._only_reader(pool.outputs[0])
        self.excite = self.squeeze and self._pointwise(self.squeeze, pool.outputs[0]) \
            and self._only_reader(self.squeeze.outputs[0])
        if not self.excite or not self._pointwise(self.excite, self.squeeze.outputs[0]):
            return False
        self.mul = self._only_reader(self.excite.outputs[0])
        if self.mul is None or self.mul.domain or self.mul.op_type != "Mul" \
                or sorted(self.mul.inputs) != sorted([x, self.excite.outputs[0]]) \
                or kernel_for(self.mul) is None:
            return False
        w1, w2 = self.constants[self.squeeze.inputs[1]], self.constants[self.excite.inputs[1]]
        channels = self.types[x].shape[1]
        return w1.shape[1] == w2.shape[0] and w2.shape[1] == w1.shape[0] \
            and channels == w1.shape[1] and w1.dtype == w2.dtype == dtype_of(x_type)

    def _over_the_plane(self, pool: Node) -> bool:
        """A GlobalAveragePool, or a ReduceMean over axes 2 and 3 (or -2 and -1) keeping them
        (its axes an attribute, or from opset 18 a constant input)."""
        if pool.op_type == "GlobalAveragePool":
            return len(pool.inputs) == 1
        a = pool.attributes
        if int(a.get("keepdims", 1)) != 1 or int(a.get("noop_with_empty_axes", 0)):
            return False
        axes = a.get("axes")
        if axes is None and len(pool.inputs) > 1:
            axes = constant_ints(self.constants, pool.inputs[1])
        return axes is not None and sorted(int(v) % 4 for v in axes) == [2, 3]

    def _pointwise(self, node: Node, reads: str) -> bool:
        """A plain 1x1 convolution of ``reads`` by a constant weight and bias (no residual),
        with an activation the fused op applies."""
        if not (node.op_type == "Conv" and not node.domain
                or node.op_type == "FusedConv" and node.domain == MIXRT):
            return False
        inputs = list(node.inputs) + ["", ""]
        if len(node.outputs) != 1 or inputs[0] != reads or any(inputs[3:]) \
                or inputs[1] not in self.constants or inputs[2] and inputs[2] not in self.constants:
            return False
        w = self.constants[inputs[1]]
        a = node.attributes
        return (w.ndim == 4 and w.shape[2:] == (1, 1) and int(a.get("group", 1)) == 1
                and not any(a.get("pads") or ()) and all(int(v) == 1 for v in a.get("strides") or ())
                and all(int(v) == 1 for v in a.get("dilations") or ())
                and _text(a.get("auto_pad", "NOTSET")) in ("NOTSET", "VALID")
                and (not a.get("activation") or _text(a["activation"]) in ACTIVATIONS))

    def replace(self) -> None:
        squeeze, excite = self.squeeze.inputs, self.excite.inputs
        attributes = {}
        for number, node in ((1, self.squeeze), (2, self.excite)):
            activation = _text(node.attributes.get("activation", ""))
            if activation:
                attributes[f"activation{number}"] = activation
                attributes[f"activation{number}_params"] = list(
                    node.attributes.get("activation_params") or [])
        inputs = [self.x, squeeze[1], squeeze[2] if len(squeeze) > 2 else "",
                  excite[1], excite[2] if len(excite) > 2 else ""]
        fused = Node("SqueezeExcite", inputs, [self.mul.outputs[0]], self.pool.name, MIXRT, 1,
                     attributes)
        self.g.nodes[self.g.nodes.index(self.mul)] = fused
        remove_nodes(self.g, [self.pool, self.squeeze, self.excite])


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
