"""mixrt-domain nodes written back as standard ONNX nodes, so an optimized graph exports.

The optimizer (``runtime/passes/fuse*.py``) folds chains of standard ops into fused kernels
of the ``mixrt`` domain. Each of them is an exact composition of ONNX ops, which this module
unfolds again:

* ``FusedConv(X, W, B, Z)``   -> Conv [-> Add(Z)] [-> activation]
* ``FusedConvPool(X, W, B)``  -> Conv [-> activation] [-> LRN] -> MaxPool/AveragePool
* ``FusedGemm(A, B, C)``      -> Gemm [-> activation]
* ``FusedMatMul(A, B, b, Z)`` -> MatMul [-> Add(b)] [-> Add(Z)] [-> activation]
* ``FusedAttention(Q, K, V, mask)`` -> [Gathers repeating K's and V's heads (kv_repeat)]
  -> Transposes of Q, K, V (of those not heads first) -> MatMul [-> Mul(scale)]
  [-> Add(mask)] -> Softmax [-> Where(IsNaN, 0)] -> MatMul -> Transpose
* ``FusedRotary(X, cos, sin)`` -> X * cos + Concat(Neg(second half), first half) * sin, the
  halves cut by Split
* ``FusedElementwise``        -> one node per step of its register program, its literals
  as 0-d initializers
* ``PairwiseSquaredDistances(X, R)`` -> Sub(Unsqueeze(X, 0), Unsqueeze(R, 1)) ->
  ReduceSumSquare over the features [-> Sqrt]: the kNN Scan's steps all at once
* ``TokenCounts(X)``          -> [StringNormalizer (its case change)] -> com.microsoft::
  Tokenizer (no marks) -> Flatten -> TfIdfVectorizer
* ``MXReshape(X)``            -> Reshape(X, Concat of X's dims picked by Gather from Shape(X),
  multiplied (-3) or divided (-4 with -1) as its plan says, and its fixed sizes); where a
  moved, merged or split dimension could be 0 at run time, X first goes through a shape
  whose 0s Reshape's "0 copies" rule reads correctly (``_zero_safe_source``)

The new nodes are written at the graph's default-domain opset (the one the fused nodes'
originals had), in that opset's form (Clip's bounds as attributes before opset 11, as inputs
after), so the exporter retargets them like every other node. A mixrt-domain op without a
decomposition here (the gradient ops of a training graph, say) is an :class:`ExportError`
that names the node.
"""

from __future__ import annotations

import numpy as np
from onnx import defs

from mixrt.base.errors import ExportError
from mixrt.ops.conv.windows import CONV_ATTRIBUTES
from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.nn.fused import ACTIVATIONS
from mixrt.ops.text.contrib_text import MICROSOFT
from mixrt.ops.text.token_counts import COUNTING, CUTTING, NORMALIZING
from mixrt.ops.attention.fused_attention import QUERY_PERM, input_perms
from mixrt.ops.elementwise.fused_elementwise import Program
from mixrt.ops.shape.shape_mxnet import COPY, DIVIDE, FIXED, INFER, MERGE, reshape_plan
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import NameMaker, copy_graph, dtype_of, each_graph

_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})
# Arithmetic with NumPy broadcasting (what the fused kernels do) starts at opset 7; before,
# Add/Mul/... broadcast only when told to, along other rules. Erf arrived at opset 9.
BROADCASTING_OPSET = 7
_ERF_OPSET = 9
_RESHAPE_OPSET = 5  # the target shape as an input


def _opset_needed(op_type: str) -> int:
    if op_type == "Erf":
        return _ERF_OPSET
    if op_type == "Reshape":
        return _RESHAPE_OPSET
    if op_type in ("IsNaN", "Where"):  # FusedAttention's guard: both first defined at 9
        return 9
    return BROADCASTING_OPSET if op_type in _BINARY else 1


def decompose_graph(graph: Graph) -> Graph:
    """A copy of ``graph`` in which every mixrt-domain node is replaced by standard ones."""
    if not any(node.domain == MIXRT for node in graph.all_nodes()):
        return graph
    result = copy_graph(graph)
    unfold = _Unfolder(result)
    for g in each_graph(result):
        nodes = []
        for node in g.nodes:
            nodes.extend(unfold(g, node) if node.domain == MIXRT else [node])
        g.nodes = nodes
        g.opsets.pop(MIXRT, None)
    return result


class _Unfolder:
    """Turns one mixrt node into its standard nodes, adding constants to its graph."""

    def __init__(self, graph: Graph):
        # the opset the fused nodes' originals had (a graph of mixrt ops alone has none)
        self.opset = int(graph.opsets.get("", defs.onnx_opset_version()))
        self.types = infer_types(graph)
        self.fresh = NameMaker(graph)

    def __call__(self, g: Graph, node: Node) -> list[Node]:
        unfold = _DECOMPOSITIONS.get(node.op_type)
        if unfold is None:
            raise ExportError(f"node {node.label!r}: mixrt::{node.op_type} has no standard "
                              f"ONNX decomposition; mixrt can export "
                              f"{', '.join('mixrt::' + op for op in _DECOMPOSITIONS)}")
        self.graph, self.node, self.emitted = g, node, []
        unfold(self, node)
        return self.emitted

    # -- building blocks used by the decompositions -------------------------------------------

    def emit(self, op_type: str, inputs: list[str], output: str | None = None,
             **attributes) -> str:
        """Append a default-domain node; returns its output (a fresh name unless given)."""
        needed = _opset_needed(op_type)
        if self.opset < needed:
            raise ExportError(f"node {self.node.label!r}: writing mixrt::{self.node.op_type} "
                              f"as standard ops needs {op_type} as opset {needed} defines "
                              f"it; the graph is at opset {self.opset}")
        output = output or self.fresh(f"{self.node.outputs[0]}/{op_type.lower()}")
        name = self.fresh(f"{self.node.name}/{op_type}") if self.node.name else ""
        self.emitted.append(Node(op_type, inputs, [output], name, "", self.opset, attributes))
        return output

    def constant(self, value: float, what: str) -> str:
        """A 0-d initializer of the node's dtype holding ``value``."""
        name = self.fresh(f"{self.node.outputs[0]}/{what}")
        self.graph.initializers[name] = np.array(value, dtype=self.dtype())
        return name

    def ints(self, values, what: str) -> str:
        """A 1-d int64 initializer holding ``values``."""
        name = self.fresh(f"{self.node.outputs[0]}/{what}")
        self.graph.initializers[name] = np.asarray(values, dtype=np.int64)
        return name

    def dtype(self) -> np.dtype:
        for name in (self.node.outputs[0], *self.node.inputs):
            dtype = dtype_of(self.types.get(name)) if name else None
            if dtype is not None:
                return dtype
        raise ExportError(f"node {self.node.label!r}: the dtype of mixrt::"
                          f"{self.node.op_type} is unknown, so its constants cannot be "
                          f"written; declare the type of {self.node.outputs[0]!r}")

    def activation(self, x: str) -> None:
        """The node's ``activation`` attribute applied to ``x``, writing the node's output."""
        kind = self.node.attributes["activation"]
        params = [float(p) for p in self.node.attributes.get("activation_params") or ()]
        if kind not in ACTIVATIONS or len(params) != len(ACTIVATIONS[kind][1]):
            raise ExportError(f"node {self.node.label!r}: activation {kind!r} with params "
                              f"{params} is not one of the fused kernels' activations "
                              f"({', '.join(ACTIVATIONS)})")
        unary_step(self, kind, x, params, self.node.outputs[0])


def unary_step(unfold: _Unfolder, op_type: str, x: str, params: list[float],
               output: str | None = None) -> str:
    """One elementwise op with its constants (the fused kernels' activations and unary
    program steps), in the form the opset wants."""
    if op_type == "LeakyRelu":
        return unfold.emit(op_type, [x], output, alpha=params[0])
    if op_type == "HardSigmoid":
        return unfold.emit(op_type, [x], output, alpha=params[0], beta=params[1])
    if op_type == "Swish":  # SiLU: ONNX has no operator of its own for it
        return unfold.emit("Mul", [x, unfold.emit("Sigmoid", [x], None)], output)
    if op_type == "HardSwish" and unfold.opset < 14:  # HardSwish came in opset 14
        gate = unfold.emit("HardSigmoid", [x], None, alpha=1 / 6, beta=0.5)
        return unfold.emit("Mul", [x, gate], output)
    if op_type == "Pow":
        return unfold.emit(op_type, [x, unfold.constant(params[0], "exponent")], output)
    if op_type == "Clip":
        return _clip(unfold, x, params, output)
    if params:
        raise ExportError(f"node {unfold.node.label!r}: {op_type} takes no parameters, "
                          f"got {params}")
    return unfold.emit(op_type, [x], output)


def _clip(unfold: _Unfolder, x: str, params: list[float], output: str | None) -> str:
    low, high = params
    if unfold.opset < 11:  # bounds were attributes until opset 11
        return unfold.emit("Clip", [x], output, min=low, max=high)
    bounds = [unfold.constant(value, what) if np.isfinite(value) else ""
              for value, what in ((low, "min"), (high, "max"))]
    while bounds and not bounds[-1]:
        bounds.pop()
    return unfold.emit("Clip", [x, *bounds], output)


# -- the decompositions ----------------------------------------------------------------------

def _has_activation(node: Node) -> bool:
    return bool(node.attributes.get("activation"))


def _product_then(unfold: _Unfolder, y: str, addends: list[str]) -> None:
    """``y`` plus each addend in turn, then the activation; the last node writes the
    fused node's output."""
    output = unfold.node.outputs[0]
    for index, addend in enumerate(addends):
        last = index == len(addends) - 1 and not _has_activation(unfold.node)
        y = unfold.emit("Add", [y, addend], output if last else None)
    if _has_activation(unfold.node):
        unfold.activation(y)


def _product_output(unfold: _Unfolder, addends: list[str]) -> str | None:
    """The product writes the node's output itself when nothing follows it."""
    return None if addends or _has_activation(unfold.node) else unfold.node.outputs[0]


def _fused_conv(unfold: _Unfolder, node: Node) -> None:
    x, w, bias, z = (list(node.inputs) + ["", "", ""])[:4]
    attributes = {k: v for k, v in node.attributes.items()
                  if k not in ("activation", "activation_params")}
    addends = [z] if z else []
    conv_inputs = [x, w] + ([bias] if bias else [])
    y = unfold.emit("Conv", conv_inputs, _product_output(unfold, addends), **attributes)
    _product_then(unfold, y, addends)


def _fused_conv_pool(unfold: _Unfolder, node: Node) -> None:
    a = node.attributes
    conv_attributes = {k: v for k, v in a.items() if k in CONV_ATTRIBUTES}
    y = unfold.emit("Conv", list(node.inputs[:3]), None, **conv_attributes)
    if a.get("activation"):
        kind = a["activation"]
        params = [float(p) for p in a.get("activation_params") or ()]
        if kind not in ACTIVATIONS or len(params) != len(ACTIVATIONS[kind][1]):
            raise ExportError(f"node {node.label!r}: activation {kind!r} with params "
                              f"{params} is not one of the fused kernels' activations")
        y = unary_step(unfold, kind, y, params)
    if a.get("lrn_size"):
        y = unfold.emit("LRN", [y], None, size=int(a["lrn_size"]),
                        alpha=float(a.get("lrn_alpha", 1e-4)),
                        beta=float(a.get("lrn_beta", 0.75)), bias=float(a.get("lrn_bias", 1.0)))
    pool = {"kernel_shape": list(a["pool_kernel_shape"]),
            "strides": list(a.get("pool_strides") or (1, 1)),
            "pads": list(a.get("pool_pads") or (0, 0, 0, 0))}
    if a.get("pool_ceil_mode"):
        pool["ceil_mode"] = 1
    if a.get("pool_count_include_pad"):
        pool["count_include_pad"] = 1
    unfold.emit(a.get("pool", "MaxPool"), [y], node.outputs[0], **pool)


def _fused_gemm(unfold: _Unfolder, node: Node) -> None:
    attributes = {k: v for k, v in node.attributes.items()
                  if k not in ("activation", "activation_params")}
    y = unfold.emit("Gemm", list(node.inputs), _product_output(unfold, []), **attributes)
    _product_then(unfold, y, [])


def _fused_mat_mul(unfold: _Unfolder, node: Node) -> None:
    a, b, bias, z = (list(node.inputs) + ["", ""])[:4]
    addends = [name for name in (bias, z) if name]
    y = unfold.emit("MatMul", [a, b], _product_output(unfold, addends))
    _product_then(unfold, y, addends)


def _fused_attention(unfold: _Unfolder, node: Node) -> None:
    q, k, v, mask = (list(node.inputs) + [""])[:4]
    try:
        q_perm, k_perm, v_perm = input_perms(node.attributes.get("heads_first"))
    except ValueError as exc:
        raise ExportError(f"node {node.label!r}: {exc}") from exc

    k, v = (_repeated_heads(unfold, node, name) for name in (k, v))

    def laid_out(name, perm):
        return name if perm is None else unfold.emit("Transpose", [name], perm=list(perm))
    scores = unfold.emit("MatMul", [laid_out(q, q_perm), laid_out(k, k_perm)])
    scale = float(node.attributes.get("scale", 1.0))
    if scale != 1.0:
        scores = unfold.emit("Mul", [scores, unfold.constant(scale, "scale")])
    if mask:
        scores = unfold.emit("Add", [scores, mask])
    # the last of four axes: the same for Softmax before opset 13 (which flattens from it)
    probabilities = unfold.emit("Softmax", [scores], axis=3)
    if int(node.attributes.get("nan_to_zero", 0)):
        probabilities = unfold.emit("Where", [unfold.emit("IsNaN", [probabilities]),
                                              unfold.constant(0.0, "zero"), probabilities])
    product = unfold.emit("MatMul", [probabilities, laid_out(v, v_perm)])
    unfold.emit("Transpose", [product], node.outputs[0], perm=list(QUERY_PERM))


def _repeated_heads(unfold: _Unfolder, node: Node, name: str) -> str:
    """A heads-first K or V with each head repeated ``kv_repeat`` times in a row: a Gather
    of heads [0, 0, 1, 1, ...] along axis 1 (its head count must be known)."""
    repeat = int(node.attributes.get("kv_repeat", 1))
    if repeat == 1:
        return name
    shape = getattr(unfold.types.get(name), "shape", None)
    heads = shape[1] if shape is not None and len(shape) == 4 else None
    if not isinstance(heads, int):
        raise ExportError(f"node {node.label!r}: writing FusedAttention's kv_repeat as a "
                          f"Gather needs the head count of {name!r}, which is not known")
    indices = unfold.ints([h // repeat for h in range(heads * repeat)], "heads")
    return unfold.emit("Gather", [name, indices], axis=1)


def _fused_rotary(unfold: _Unfolder, node: Node) -> None:
    x, cos, sin = node.inputs
    first, second = _halves(unfold, node, x)
    rotated = unfold.emit("Concat", [unfold.emit("Neg", [second]), first], axis=-1
                          if unfold.opset >= 11 else _rank(unfold, node, x) - 1)
    unfold.emit("Add", [unfold.emit("Mul", [x, cos]), unfold.emit("Mul", [rotated, sin])],
                node.outputs[0])


def _halves(unfold: _Unfolder, node: Node, x: str) -> list[str]:
    """The two halves of x's last axis, by one Split in the opset's form."""
    axis = -1 if unfold.opset >= 11 else _rank(unfold, node, x) - 1
    attributes = {"axis": axis}
    if unfold.opset >= 18:
        attributes["num_outputs"] = 2
    halves = [unfold.fresh(f"{node.outputs[0]}/half") for _ in range(2)]
    name = unfold.fresh(f"{node.name}/Split") if node.name else ""
    unfold.emitted.append(Node("Split", [x], halves, name, "", unfold.opset, attributes))
    return halves


def _rank(unfold: _Unfolder, node: Node, name: str) -> int:
    shape = getattr(unfold.types.get(name), "shape", None)
    if shape is None:
        raise ExportError(f"node {node.label!r}: writing mixrt::{node.op_type} before "
                          f"opset 11 needs the rank of {name!r}, which is not known")
    return len(shape)


def _fused_elementwise(unfold: _Unfolder, node: Node) -> None:
    program_of = [tuple(node.attributes.get(key, ())) for key in ("ops", "operands", "params")]
    try:
        program = Program(*program_of, len(node.inputs))
    except ValueError as exc:
        raise ExportError(f"node {node.label!r}: {exc}") from exc
    registers = list(node.inputs)
    last = len(program.steps) - 1
    for index, step in enumerate(program.steps):
        output = node.outputs[0] if index == last and step.op != "Scalar" else None
        registers.append(_program_step(unfold, step, registers, output))
    if registers[-1] != node.outputs[0]:  # a program that ends in a literal
        unfold.emit("Identity", [registers[-1]], node.outputs[0])


def _program_step(unfold: _Unfolder, step, registers: list[str], output) -> str:
    if step.op == "Scalar":
        return unfold.constant(step.params[0], "literal")
    operands = [registers[r] for r in step.operands]
    if step.op in _BINARY:
        return unfold.emit(step.op, operands, output)
    return unary_step(unfold, step.op, operands[0], list(step.params), output)


def _block_grad(unfold: _Unfolder, node: Node) -> None:
    # a stop-gradient matters only to mixrt's autodiff; in an exported model it is a no-op
    unfold.emit("Identity", [node.inputs[0]], node.outputs[0])


def _mx_reshape(unfold: _Unfolder, node: Node) -> None:
    x = node.inputs[0]
    known = unfold.types.get(x)
    if known is None or known.shape is None:
        raise ExportError(f"node {node.label!r}: mixrt::MXReshape needs the rank of its "
                          f"input {x!r} to be written as ONNX Reshape; declare its shape")
    try:
        plan = reshape_plan(len(known.shape), node.attributes["shape"],
                            bool(node.attributes.get("reverse", 0)))
    except ValueError as exc:
        raise ExportError(f"node {node.label!r}: {exc}") from None
    dims = unfold.emit("Shape", [x])
    parts = [_planned_part(unfold, dims, piece) for piece in plan.pieces]
    target = unfold.emit("Concat", parts, axis=0) if len(parts) > 1 else parts[0]
    source = _zero_safe_source(unfold, x, plan) if _zero_may_misread(plan) else x
    unfold.emit("Reshape", [source, target], node.outputs[0])


def _zero_may_misread(plan) -> bool:
    """Whether a size read at run time could be 0 at an output position whose input
    dimension is another one. Reshape (without allowzero, which opsets before 14 lack)
    takes a 0 in its target as "copy the input's dimension at this position": right for a
    dimension copied to its own position, wrong (or out of range) for one that moved, was
    merged or was split."""
    return any(piece.kind not in (FIXED, INFER) and not (piece.kind == COPY
                                                         and piece.index == position)
               for position, piece in enumerate(plan.pieces))


def _zero_safe_source(unfold: _Unfolder, x: str, plan) -> str:
    """``x`` as a tensor of the output's rank shaped (n, s, s, ...), n its element count
    and s = sign(n): all zeros when x is empty, so every 0 the target copies is a 0, and
    (n, 1, 1, ...) otherwise, where the target has no 0 to copy. The zeros come from
    slicing, not from a Reshape, which would misread them the same way."""
    rank = len(plan.pieces)
    column = unfold.emit("Reshape", [x, unfold.ints([-1] + [1] * (rank - 1), "column")])
    if rank == 1:
        return column
    sign = unfold.emit("Sign", [unfold.emit("Shape", [unfold.emit("Reshape", [
        x, unfold.ints([-1], "flat")])])])
    ends = unfold.emit("Concat", [sign] * (rank - 1), axis=0) if rank > 2 else sign
    return unfold.emit("Slice", [column, unfold.ints([0] * (rank - 1), "start"), ends,
                                 unfold.ints(list(range(1, rank)), "axis")])


def _planned_part(unfold: _Unfolder, dims: str, piece) -> str:
    """One output dimension of an MXReshape plan as a 1-element int64 tensor. A fixed size
    or the inferred one is a constant (ONNX's -1 infers as MXNet's does); the others are
    read from the input's shape when the model runs."""
    if piece.kind in (FIXED, INFER):
        if piece.kind == FIXED and piece.value == 0:
            raise ExportError(f"node {unfold.node.label!r}: a -4 split into a size 0 "
                              f"means 'copy' to ONNX Reshape")
        return unfold.ints([piece.value if piece.kind == FIXED else -1], "size")
    dim = unfold.emit("Gather", [dims, unfold.ints([piece.index], "dim")], axis=0)
    if piece.kind == MERGE:
        following = unfold.ints([piece.index + 1], "dim")
        return unfold.emit("Mul", [dim, unfold.emit("Gather", [dims, following], axis=0)])
    if piece.kind == DIVIDE:
        return unfold.emit("Div", [dim, unfold.ints([piece.value], "size")])
    return dim


def _pairwise_squared_distances(unfold: _Unfolder, node: Node) -> None:
    x, r = node.inputs
    difference = unfold.emit("Sub", [_unsqueezed(unfold, x, 0), _unsqueezed(unfold, r, 1)])
    root = node.attributes.get("root", 0)
    sums = None if root else node.outputs[0]
    if unfold.opset >= 18:  # reductions take their axes as an input from opset 18
        sums = unfold.emit("ReduceSumSquare", [difference, unfold.ints([2], "axes")], sums,
                           keepdims=0)
    else:
        sums = unfold.emit("ReduceSumSquare", [difference], sums, axes=[2], keepdims=0)
    if root:
        unfold.emit("Sqrt", [sums], node.outputs[0])


def _token_counts(unfold: _Unfolder, node: Node) -> None:
    a = node.attributes
    texts = node.inputs[0]
    normalizing = {name: a[name] for name in NORMALIZING if name in a}
    if normalizing:
        texts = unfold.emit("StringNormalizer", [texts], **normalizing)
    cutting = {name: a[name] for name in CUTTING if name in a}
    tokens = unfold.fresh(f"{node.outputs[0]}/tokens")
    name = unfold.fresh(f"{node.name}/Tokenizer") if node.name else ""
    unfold.emitted.append(Node("Tokenizer", [texts], [tokens], name, MICROSOFT, 1,
                               {"mark": 0, **cutting}))
    unfold.graph.opsets.setdefault(MICROSOFT, 1)
    counting = {name: a[name] for name in COUNTING if name in a}
    unfold.emit("TfIdfVectorizer", [unfold.emit("Flatten", [tokens], axis=1)],
                node.outputs[0], **counting)


def _unsqueezed(unfold: _Unfolder, x: str, axis: int) -> str:
    if unfold.opset >= 13:  # Unsqueeze takes its axes as an input from opset 13
        return unfold.emit("Unsqueeze", [x, unfold.ints([axis], "axes")])
    return unfold.emit("Unsqueeze", [x], axes=[axis])


_DECOMPOSITIONS = {
    "BlockGrad": _block_grad,
    "MXReshape": _mx_reshape,
    "FusedConv": _fused_conv,
    "FusedConvPool": _fused_conv_pool,
    "FusedGemm": _fused_gemm,
    "FusedMatMul": _fused_mat_mul,
    "FusedAttention": _fused_attention,
    "FusedElementwise": _fused_elementwise,
    "FusedRotary": _fused_rotary,
    "PairwiseSquaredDistances": _pairwise_squared_distances,
    "TokenCounts": _token_counts,
}
