"""Fusion of a matrix product or convolution with what follows it (opt_level 2):

* ``Conv [-> Add/Sum(residual)] [-> activation]`` becomes ``mixrt::FusedConv(X, W, B, Z)``
  (ResNet's conv, folded batch norm, shortcut add and Relu: one kernel);
* ``Gemm -> activation`` becomes ``mixrt::FusedGemm``;
* ``MatMul [-> Add(constant bias)] [-> Add(residual)] [-> activation]`` becomes
  ``mixrt::FusedMatMul(A, B, bias, Z)`` (a transformer's dense layer and residual add).

A step is absorbed only when the value between them has one reader and is not a graph
output, its dtype is one the fused kernels serve (float32, float64), and the residual or
bias does not broadcast the product to a bigger shape (the fused kernel adds it in place).
Activations: those in :data:`mixrt.ops.nn.fused.ACTIVATIONS`, with constant parameters that a
float32 attribute holds exactly, and after a convolution ``Mul(y, Sigmoid(y))`` (SiLU,
EfficientNet's) as "Swish".
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.conv.windows import CONV_ATTRIBUTES
from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.nn.fused import ACTIVATIONS
from mixrt.ops.ir.types import broadcast_or_none
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (NameMaker, constant_scopes, dtype_of, kernel_for,
                                          read_counts, remove_nodes)

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_GEMM_ATTRIBUTES = ("alpha", "beta", "transA", "transB")
_FLT_MAX = float(np.finfo(np.float32).max)


def fuse_products(graph: Graph, ir_version: int | None) -> int:
    """Fuse Conv, Gemm and MatMul with their followers; returns how many fused nodes."""
    types = infer_types(graph)
    fused = 0
    for g, constants in constant_scopes(graph, ir_version):
        index = None  # the graph's readers, made at its first product (_Readers)
        for node in list(g.nodes):
            if node.domain != "" or len(node.outputs) != 1:
                continue
            maker = _MAKERS.get(node.op_type)
            if maker is not None and dtype_of(types.get(node.outputs[0])) in FLOAT_DTYPES \
                    and kernel_for(node) is not None:
                index = index or _Readers(g)
                fused += maker(g, node, constants, types, index)
    if fused:
        graph.opsets.setdefault(MIXRT, 1)
    return fused


# -- the chain after a product ----------------------------------------------------------------

class _Readers:
    """One graph's read counts and, per value, a node reading it (the only one where the
    count is 1), made once per graph: a fusion keeps every surviving value's count (the
    values it absorbs had one reader each, and the fused node reads what the absorbed nodes
    read), so only the readers of the fused node's inputs change (:meth:`fused`). Swin-T's
    77 products each made their own, ~1 ms apiece."""

    def __init__(self, g: Graph):
        self.g, self.counts = g, read_counts(g)
        self.names: NameMaker | None = None  # made for the first constant a fusion adds
        self.readers = {n: node for node in g.nodes for n in node.inputs if n}

    def fused(self, node: Node) -> None:
        for name in node.inputs:
            if name:
                self.readers[name] = node


class _Follow:
    """Walks from a product through the values only it reads."""

    def __init__(self, index: _Readers, start: Node):
        self.index = index
        self.absorbed: list[Node] = []
        self.value = start.outputs[0]

    def next_node(self) -> Node | None:
        """The single reader of the current value, if the value is private to the chain."""
        y, index = self.value, self.index
        if index.counts[y] != 1 or y in index.g.output_names:
            return None
        return index.readers.get(y)

    def take(self, node: Node) -> None:
        self.absorbed.append(node)
        self.value = node.outputs[0]


def _residual(node: Node | None, y: str, types: dict) -> str | None:
    """The other addend of ``Add(y, Z)``/``Sum(y, Z)`` when adding it keeps y's shape."""
    if node is None or node.domain != "" or node.op_type not in ("Add", "Sum"):
        return None
    if len(node.inputs) != 2 or node.inputs.count(y) != 1 or len(node.outputs) != 1:
        return None
    if kernel_for(node) is None:
        return None
    z = node.inputs[1] if node.inputs[0] == y else node.inputs[0]
    if not z or not _adds_in_place(types.get(y), types.get(z)):
        return None
    return z


def _adds_in_place(y_type, z_type) -> bool:
    """y + z has y's shape and dtype (so it can be computed into y's buffer). Dims of y that
    inference left unknown are fine where z is 1 or absent (a bias of (768,) over a
    (?, 128, 768) product: the BERT encoder's shapes lose their batch dim after the first
    dynamic Reshape); anywhere z has a dim other than 1, y must have that same dim."""
    y_shape, z_shape = getattr(y_type, "shape", None), getattr(z_type, "shape", None)
    if y_shape is None or z_shape is None or len(z_shape) > len(y_shape) \
            or dtype_of(y_type) != dtype_of(z_type):
        return False
    if None not in y_shape and None not in z_shape:
        return broadcast_or_none(y_shape, z_shape) == tuple(y_shape)
    aligned = y_shape[len(y_shape) - len(z_shape):]
    return all(z == 1 or (z is not None and z == y) for y, z in zip(aligned, z_shape))


def activation_of(node: Node | None, constants: dict) -> tuple[str, list[float]] | None:
    """(name, params) when ``node`` is an activation a fused kernel can apply."""
    if node is None or node.domain != "" or node.op_type not in ACTIVATIONS:
        return None
    if len(node.outputs) != 1 or not node.inputs or not node.inputs[0]:
        return None
    if kernel_for(node) is None:
        return None
    attributes = node.attributes
    if node.op_type == "LeakyRelu":
        params = [attributes.get("alpha", 0.01)]
    elif node.op_type == "HardSigmoid":
        params = [attributes.get("alpha", 0.2), attributes.get("beta", 0.5)]
    elif node.op_type == "Clip":
        params = clip_bounds(node, constants)
        if params is None:
            return None
    else:
        params = []
    if not all(float32_exact(p) for p in params):
        return None
    return node.op_type, [float(p) for p in params]


def clip_bounds(node: Node, constants: dict) -> list[float] | None:
    if node.opset < 11:
        return [node.attributes.get("min", -_FLT_MAX), node.attributes.get("max", _FLT_MAX)]
    bounds = []
    for index, default in ((1, -np.inf), (2, np.inf)):
        name = node.inputs[index] if len(node.inputs) > index else ""
        if not name:
            bounds.append(default)
        elif name in constants and constants[name].size == 1:
            bounds.append(float(constants[name].reshape(-1)[0]))
        else:
            return None
    return bounds


def float32_exact(value) -> bool:
    """An attribute is a float32 in ONNX; a value it cannot hold would change the result."""
    value = float(value)
    return np.isnan(value) or float(np.float32(value)) == value


def _activation_step(follow: _Follow, constants: dict,
                     swish: bool = False) -> tuple[str, list[float]]:
    """The activation after the chain, taken; ``swish``: SiLU's pair too (a convolution's:
    after a dense layer fuse_elementwise joins the pair with what follows, Llama's gate
    times its up projection, in one pass)."""
    node = follow.next_node()
    found = activation_of(node, constants)
    if found is None or node.inputs[0] != follow.value:
        return _swish_step(follow) if swish else ("", [])
    follow.take(node)
    return found


def _swish_step(follow: _Follow) -> tuple[str, list[float]]:
    """("Swish", []) when the value's two readers are ``s = Sigmoid(y)`` and ``Mul(y, s)``
    (SiLU, as PyTorch exports it), taking both; else ("", [])."""
    y, index = follow.value, follow.index
    if index.counts[y] != 2 or y in index.g.output_names or "Swish" not in ACTIVATIONS:
        return "", []
    readers = [node for node in index.g.nodes if y in node.inputs]
    sigmoid = next((n for n in readers if n.op_type == "Sigmoid" and not n.domain), None)
    mul = next((n for n in readers if n.op_type == "Mul" and not n.domain), None)
    if sigmoid is None or mul is None or len(readers) != 2 or len(mul.inputs) != 2 \
            or sorted(mul.inputs) != sorted([y, sigmoid.outputs[0]]) \
            or index.counts[sigmoid.outputs[0]] != 1 \
            or sigmoid.outputs[0] in index.g.output_names \
            or kernel_for(sigmoid) is None or kernel_for(mul) is None:
        return "", []
    follow.take(sigmoid)
    follow.take(mul)
    return "Swish", []


# -- the three products --------------------------------------------------------------------------

def _fuse_conv(g: Graph, conv: Node, constants: dict, types: dict, index: _Readers) -> int:
    follow = _Follow(index, conv)
    inputs = (list(conv.inputs) + ["", ""])[:3]
    z = _residual(follow.next_node(), follow.value, types)
    if z is not None:
        follow.take(follow.next_node())
        inputs.append(z)
    activation, params = _activation_step(follow, constants, swish=True)
    if not follow.absorbed:
        return 0
    attributes = {k: v for k, v in conv.attributes.items() if k in CONV_ATTRIBUTES}
    _replace(g, conv, follow, "FusedConv", _trim(inputs), attributes, activation, params)
    return 1


def _fuse_gemm(g: Graph, gemm: Node, constants: dict, types: dict, index: _Readers) -> int:
    follow = _Follow(index, gemm)
    activation, params = _activation_step(follow, constants)
    if not follow.absorbed:
        return 0
    attributes = {k: v for k, v in gemm.attributes.items() if k in _GEMM_ATTRIBUTES}
    inputs = list(gemm.inputs)
    if len(inputs) > 2 and inputs[2] in constants:
        inputs[2] = _per_column(g, inputs[2], constants, index)
    _replace(g, gemm, follow, "FusedGemm", inputs, attributes, activation, params)
    return 1


def _fuse_matmul(g: Graph, matmul: Node, constants: dict, types: dict, index: _Readers) -> int:
    y_type = types.get(matmul.outputs[0])
    a_dtype = dtype_of(types.get(matmul.inputs[0]))
    if not getattr(y_type, "rank", None) or a_dtype != dtype_of(types.get(matmul.inputs[1])):
        return 0  # a 1-D @ 1-D product is a scalar, which nothing can be added into in place
    follow = _Follow(index, matmul)
    inputs = list(matmul.inputs) + ["", ""]
    bias = _residual(follow.next_node(), follow.value, types)
    if bias is not None and bias in constants:
        follow.take(follow.next_node())
        inputs[2] = _per_column(g, bias, constants, index)
    z = _residual(follow.next_node(), follow.value, types)
    if z is not None:
        follow.take(follow.next_node())
        inputs[3] = z
    activation, params = _activation_step(follow, constants)
    if not follow.absorbed:
        return 0
    _replace(g, matmul, follow, "FusedMatMul", _trim(inputs), {}, activation, params)
    return 1


def _per_column(g: Graph, name: str, constants: dict, index: _Readers) -> str:
    """A constant bias of shape (1, ..., 1, N) as a (N,) constant of its own (the bias of a
    product whose rank the fusion checked is at least the bias's: the same sums). The
    panels add a bias of one value a column in their tiles, and the node's rows route
    keeps it for a new number of rows; a scikit-learn MLP's (1, N) intercepts took the
    full route and a pass of their own at every new batch size (2026-12-04)."""
    value = constants[name]
    if value.ndim <= 1 or any(dim != 1 for dim in value.shape[:-1]):
        return name
    if index.names is None:
        index.names = NameMaker(g)
    flat = index.names(f"{name}_columns")
    g.initializers[flat] = constants[flat] = np.ascontiguousarray(value.reshape(-1))
    return flat


_MAKERS = {"Conv": _fuse_conv, "Gemm": _fuse_gemm, "MatMul": _fuse_matmul}


def _replace(g, product, follow, op_type, inputs, attributes, activation, params) -> None:
    if activation:
        attributes["activation"] = activation
        attributes["activation_params"] = params
    last = follow.absorbed[-1]
    fused = Node(op_type, inputs, [last.outputs[0]], product.name, MIXRT, 1, attributes)
    at = g.nodes.index(last)  # the last absorbed node runs after every input is ready
    g.nodes[at] = fused
    remove_nodes(g, [product, *follow.absorbed[:-1]])
    follow.index.fused(fused)
    g.opsets.setdefault(MIXRT, 1)


def _trim(inputs: list[str]) -> list[str]:
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs
