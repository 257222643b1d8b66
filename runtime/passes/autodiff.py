"""Symbolic reverse-mode differentiation: the backward graph of a Graph (the MXNet paper's
figure 4).

``gradient_graph(graph, loss, wrt)`` returns a new graph that computes the original outputs,
the loss and d loss / d w for every name in ``wrt``. The backward half is made of ordinary
nodes, so the optimizer passes and the memory planner treat forward and backward as one graph
and the executor runs both in one planned arena.

Each op's gradient sits beside its forward in ``ops/`` (``@fn.grad``)::

    @relu.grad
    def _(b, node, dy):          # b: GradBuilder, dy: one gradient name (or None) per output
        return [b.emit("ReluGrad", dy[0], node.outputs[0], domain=MIXRT)]

and returns one gradient name per input (None where the input is not differentiable or no
gradient is needed). Gradients reaching one tensor from several consumers are summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixrt.base.errors import GradientError
from mixrt.ops.ir.dtypes import to_onnx_type
from mixrt.ops.ir.registry import REGISTRY
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value, node_reads
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.merge_duplicates import RECOMPUTES
from mixrt.runtime.passes.rewrite import NameMaker, copy_graph, eliminate_dead_nodes
from mixrt.runtime.passes.typecheck import version_accepting
from mixrt.runtime.passes.infer import infer_node

MIXRT = "mixrt"
# backward nodes in the default domain are emitted at this opset whatever the model's own:
# one calling convention for every gradient (ReduceSum takes axes as an input from 13 on,
# the other reductions take them as an attribute until 18)
BACKWARD_OPSET = 17
DIFFERENTIABLE_KINDS = "fc"  # float and complex dtypes carry gradients; ints and bools do not


def is_differentiable_dtype(dtype) -> bool:
    """Float and complex dtypes, and ml_dtypes' bfloat16 (NumPy kind "V", mixed precision's
    low type); not ints, bools or the 8-bit float storage types."""
    dtype = np.dtype(dtype)
    return dtype.kind in DIFFERENTIABLE_KINDS or dtype.name == "bfloat16"


@dataclass
class GradientGraph:
    """The result of :func:`gradient_graph`: the joint graph, the loss it computes and the
    output name of each gradient (``grads[w]`` is d loss / d w, shaped like ``w``)."""

    graph: Graph
    loss: str
    grads: dict[str, str]
    backward_values: frozenset = frozenset()  # values the backward nodes produce


# ops cheap and deterministic enough to recompute in backward instead of keeping their outputs
# alive from the forward pass (MXNet's "mirror"); Conv, MatMul and Dropout are never among them
MIRROR_OPS = frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Gelu", "Elu", "Softplus",
                        "Clip", "BatchNormalization", "Add", "Sub", "Mul", "Div", "Identity",
                        "Flatten", "Reshape"})


def gradient_graph(graph: Graph, loss: str, wrt: list[str], *,
                   keep_outputs: bool = True, mirror: frozenset | None = None,
                   seeds: dict[str, str] | None = None,
                   differentiable_backward: bool = False) -> GradientGraph:
    """The forward graph plus the backward nodes for d ``loss`` / d ``wrt``.

    ``loss`` names a float tensor of the graph (any shape: its gradient seed is all ones, so a
    non-scalar loss is differentiated as its sum). Every name in ``wrt`` must be a graph input
    or initializer of a float type; initializers in ``wrt`` become graph inputs so a training
    loop can feed updated weights without recompiling.

    ``mirror``: op types (see ``MIRROR_OPS``) whose outputs the backward pass recomputes
    from their inputs instead of reading the forward's, so those activations die as soon as
    the forward pass is done with them: memory traded for a second run of cheap ops.

    ``seeds`` (``{value: graph input}``), when given, replaces the all-ones seed: the result
    is the vector-Jacobian product sum_i seed_i . d value_i / d w over several values (what
    ``Executor.backward(out_grads)`` needs); ``loss`` is then just the first of them.

    ``differentiable_backward``: the backward nodes are to be differentiated again (a
    gradient of a gradient). An op whose backward is a fused kernel with no gradient of its
    own but which has an expansion (``@op.expansion``: its forward in ops that have
    gradients) is then differentiated through that expansion instead. An op with an
    expansion and no gradient function (RMSNormalization) always is."""
    joint = copy_graph(graph)
    joint.toposort()
    _promote_to_inputs(joint, wrt)
    types = infer_types(joint)
    targets = list(seeds) if seeds else [loss]
    for target in targets:
        _check_request(joint, types, target, wrt)
    builder = GradBuilder(joint, types, differentiable_backward=differentiable_backward)
    needed = _nodes_between(joint, set(wrt), set(targets), builder.differentiable)
    if seeds:
        partials: dict[str, list[str]] = {value: [seed] for value, seed in seeds.items()}
    else:
        partials = {loss: [builder.ones_like(loss)]}
    _backpropagate(builder, needed, partials)
    grads = {w: _gradient_output(builder, w, partials.get(w)) for w in wrt}
    keep = joint.outputs if keep_outputs else []
    joint.outputs = list(keep)
    if loss not in joint.output_names:
        joint.outputs.append(Value(loss, types.get(loss)))
    joint.outputs.extend(Value(grads[w], types.get(w)) for w in wrt)
    backward = builder.nodes if not mirror else _mirrored(joint.nodes, builder, mirror)
    if mirror:  # its recomputed copies are not to be merged back into the forward's nodes
        joint.metadata[RECOMPUTES] = True
    joint.nodes.extend(backward)
    joint.initializers.update(builder.constants)
    joint.opsets.setdefault(MIXRT, 1)
    joint.toposort()
    # gradient functions emit a gradient for every input; those of constants and labels
    # reach no output and are dropped here, before anything runs them
    eliminate_dead_nodes(joint)
    backward_values = {out for node in backward for out in node.outputs if out}
    return GradientGraph(joint, loss, grads, frozenset(backward_values))


class GradBuilder:
    """What a gradient function writes backward nodes with: fresh names, typed constants and
    the shape helpers every broadcasting op needs."""

    def __init__(self, graph: Graph, types: dict, *, differentiable_backward: bool = False):
        self.types = types
        self.differentiable_backward = differentiable_backward
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self._names = NameMaker(graph)

    # -- what is known about a value -----------------------------------------------------

    def type(self, name: str) -> TensorType | None:
        value_type = self.types.get(name)
        return value_type if isinstance(value_type, TensorType) else None

    def dtype(self, name: str) -> np.dtype | None:
        value_type = self.type(name)
        return None if value_type is None else value_type.dtype

    def shape(self, name: str) -> tuple | None:
        """The static shape, or None when any dimension is unknown or symbolic."""
        value_type = self.type(name)
        if value_type is None or value_type.shape is None:
            return None
        if not all(isinstance(d, int) for d in value_type.shape):
            return None
        return tuple(value_type.shape)

    def rank(self, name: str) -> int | None:
        value_type = self.type(name)
        return None if value_type is None else value_type.rank

    def known_rank(self, node: Node, name: str) -> int:
        """The rank of ``name``, or a GradientError naming ``node`` when inference lost it
        (gradients that permute or unsqueeze axes cannot be built without it)."""
        rank = self.rank(name)
        if rank is None:
            raise GradientError(f"node {node.label!r}: the gradient of {node.op_type} needs "
                                f"the rank of {name!r}, which shape inference could not find",
                                node=node.label, op_type=node.op_type)
        return rank

    def differentiable(self, name: str) -> bool:
        dtype = self.dtype(name)
        return dtype is None or is_differentiable_dtype(dtype)

    # -- autodiff itself, for the gradients of ops that hold subgraphs ---------------------
    # (runtime/passes/control_gradients.py: If, Scan and Loop differentiate their bodies)

    differentiable_dtype = staticmethod(is_differentiable_dtype)

    @staticmethod
    def gradient_graph(graph: Graph, loss: str, wrt: list[str], **options) -> "GradientGraph":
        return gradient_graph(graph, loss, wrt, **options)

    @staticmethod
    def gradient_targets(node: Node) -> list[str]:
        return gradient_targets(node)

    # -- emitting nodes ------------------------------------------------------------------

    def fresh(self, base: str) -> str:
        """A value name no other value of the graph has."""
        return self._names(base)

    def emit(self, op_type: str, *inputs, domain: str = "", outputs: int = 1,
             opset: int | None = None, **attributes):
        """Append a backward node; returns its output name (a tuple when ``outputs`` > 1).
        ``None`` inputs become ONNX's missing-optional marker. ``opset``: for a default-domain
        op whose attributes are newer than BACKWARD_OPSET (Resize-19's). A default-domain
        node whose operand types its opset refuses moves to a later version that accepts
        them, if one changes nothing else (``typecheck.version_accepting``)."""
        names = [self._names(f"{op_type.lower()}_grad") for _ in range(outputs)]
        if opset is None:
            opset = 1 if domain == MIXRT else BACKWARD_OPSET
        node = Node(op_type, ["" if i is None else i for i in inputs], names,
                    name=names[0], domain=domain, opset=opset, attributes=attributes)
        if not domain:
            node.opset = version_accepting(node, self.types)
        self.nodes.append(node)
        for name, value_type in zip(names, _infer(node, self.types)):
            self.types[name] = value_type
        return names[0] if outputs == 1 else tuple(names)

    def forward_output(self, node: Node, index: int, base: str) -> str:
        """Output ``index`` of forward ``node``, added to the node when the model did not ask
        for it (Dropout's mask, SoftmaxCrossEntropyLoss's log-probabilities)."""
        while len(node.outputs) <= index:
            node.outputs.append("")
        if not node.outputs[index]:
            node.outputs[index] = self._names(base)
            for name, value_type in zip(node.outputs, _infer(node, self.types)):
                if name and name not in self.types:
                    self.types[name] = value_type
        return node.outputs[index]

    def constant(self, value, like: str) -> str:
        """A constant initializer with ``like``'s dtype (float64 when unknown)."""
        return self.array(np.asarray(value, dtype=self.dtype(like) or np.dtype(np.float64)))

    def cast(self, name: str | None, dtype) -> str | None:
        """``name`` cast to ``dtype`` when its dtype is known and differs (None stays None)."""
        have = None if name is None else self.dtype(name)
        if have is None or dtype is None or have == np.dtype(dtype):
            return name
        return self.emit("Cast", name, to=to_onnx_type(dtype))

    def ints(self, values) -> str:
        """An int64 constant (axes, shapes, permutations)."""
        return self.array(np.asarray(values, dtype=np.int64), base="grad_ints")

    def array(self, value: np.ndarray, base: str = "grad_const") -> str:
        """A constant initializer holding ``value`` as it is (a subgraph's initializer)."""
        array = np.asarray(value)
        name = self._names(base)
        self.constants[name] = array
        self.types[name] = TensorType(array.dtype, tuple(array.shape), value=array)
        return name

    # -- shared gradient pieces ----------------------------------------------------------

    def ones_like(self, name: str) -> str:
        shape = self.shape(name)
        if shape is not None:
            return self.constant(np.ones(shape), like=name)
        return self.emit("Expand", self.constant(1.0, like=name), self.emit("Shape", name))

    def sum_to(self, grad: str, like: str) -> str:
        """``grad`` summed over the axes along which ``like`` was broadcast, reshaped to
        ``like``'s shape: the gradient of every broadcasting op."""
        grad_shape, like_shape = self.shape(grad), self.shape(like)
        if grad_shape is not None and grad_shape == like_shape:
            return grad
        return self.emit("SumToShapeOf", grad, like, domain=MIXRT)

    def accumulate(self, parts: list[str] | None) -> str | None:
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else self.emit("Sum", *parts)

    def mul(self, a: str, b: str) -> str:
        return self.emit("Mul", a, b)

    def neg(self, a: str) -> str:
        return self.emit("Neg", a)


def _mirrored(forward: list[Node], builder: GradBuilder, ops: frozenset) -> list[Node]:
    """The backward nodes, with each read of a mirrored forward output redirected to a copy of
    its producer placed just before the first backward node that needs it."""
    producer = {out: n for n in forward for out in n.outputs if out}
    recomputed: dict[str, str] = {}
    result: list[Node] = []

    def recompute(name: str) -> str:
        node = producer.get(name)
        if node is None or node.op_type not in ops or node.domain:
            return name
        if name not in recomputed:
            inputs = [recompute(i) if i else i for i in node.inputs]
            outputs = [builder.fresh(f"{out}_again") if out else "" for out in node.outputs]
            result.append(Node(node.op_type, inputs, outputs, name=builder.fresh(
                f"{node.label}_again"), domain=node.domain, opset=node.opset,
                attributes=dict(node.attributes)))
            recomputed.update((out, again) for out, again in zip(node.outputs, outputs) if out)
        return recomputed[name]

    for node in builder.nodes:
        node.inputs = [recompute(name) if name else name for name in node.inputs]
        result.append(node)
    return result


def _infer(node: Node, types: dict) -> list:
    return infer_node(node, types)


def _promote_to_inputs(graph: Graph, wrt: list[str]) -> None:
    """Initializers we differentiate with respect to become graph inputs (and stop being
    constants a pass could fold away)."""
    listed = set(graph.input_names)
    for name in wrt:
        if name in graph.initializers:
            array = graph.initializers.pop(name)
            if name not in listed:
                graph.inputs.append(Value(name, TensorType(array.dtype, tuple(array.shape))))
            else:
                for value in graph.inputs:
                    if value.name == name and value.type is None:
                        value.type = TensorType(array.dtype, tuple(array.shape))


def _check_request(graph: Graph, types: dict, loss: str, wrt: list[str]) -> None:
    produced = {out for node in graph.nodes for out in node.outputs if out}
    known = produced | set(graph.input_names) | set(graph.initializers)
    if loss not in known:
        raise GradientError(f"loss {loss!r} is not a value of graph {graph.name!r}; values "
                            f"it could be: {sorted(graph.output_names)}")
    for name in [loss, *wrt]:
        value_type = types.get(name)
        if name != loss and name not in graph.input_names:
            raise GradientError(f"cannot differentiate with respect to {name!r}: it is not "
                                f"an input or initializer of graph {graph.name!r}")
        if isinstance(value_type, TensorType) and value_type.dtype is not None \
                and not is_differentiable_dtype(value_type.dtype):
            raise GradientError(f"{name!r} has dtype {np.dtype(value_type.dtype).name}; "
                                f"gradients need a float tensor")


def _nodes_between(graph: Graph, sources: set[str], targets: set[str],
                   differentiable) -> list[Node]:
    """Nodes (in order) that depend on a source through float values and that a target
    depends on: only they need backward nodes. An integer or boolean value carries no
    gradient, so what is computed from it alone (ConstantOfShape of a Shape, a mask from a
    comparison) is a constant of the backward pass, whatever op computes it."""
    tainted = set(sources)
    forward = []
    for node in graph.nodes:
        if any(name in tainted for name in node_reads(node)):
            tainted.update(out for out in node.outputs if out and differentiable(out))
            forward.append(node)
    wanted, needed = set(targets), []
    for node in reversed(forward):
        if any(out in wanted for out in node.outputs if out):
            wanted.update(node_reads(node))
            needed.append(node)
    return list(reversed(needed))


def gradient_targets(node: Node) -> list[str]:
    """What a node's gradient function returns gradients for, in order: its inputs, then
    (for If, Loop, Scan) the names its subgraphs read from the enclosing graph, which are
    inputs too, only unlisted."""
    if not node.subgraphs():
        return node.inputs
    captured = dict.fromkeys(node_reads(node))
    return [*node.inputs, *(name for name in captured if name not in node.inputs)]


def _backpropagate(builder: GradBuilder, nodes: list[Node], partials: dict) -> None:
    """Walk ``nodes`` backward from the gradients in ``partials`` ({value: [gradient
    names]}), adding each input's gradient to it; a node's output gradients are summed and
    removed once the walk reaches the node."""
    for node in reversed(nodes):
        dys = [builder.accumulate(partials.pop(name, None)) if name else None
               for name in node.outputs]
        if all(dy is None for dy in dys):
            continue
        for name, dx in zip(gradient_targets(node), _input_grads(builder, node, dys)):
            if name and dx is not None and builder.differentiable(name):
                partials.setdefault(name, []).append(dx)


def _input_grads(builder: GradBuilder, node: Node, dys: list) -> list:
    kernel = REGISTRY.find(node.domain, node.op_type, node.opset)
    if kernel is not None and kernel.expand_fn is not None and (
            builder.differentiable_backward or kernel.grad_fn is None):
        grads = _grads_through_expansion(builder, node, dys, kernel.expand_fn)
        if grads is not None:
            return grads
    if kernel is None or kernel.grad_fn is None:
        raise GradientError(f"node {node.label!r}: {node.domain or 'ai.onnx'}::"
                            f"{node.op_type} has no gradient definition; the ops that have "
                            f"one are listed by mixrt.runtime.passes.autodiff."
                            f"differentiable_ops()", node=node.label, op_type=node.op_type)
    grads = list(kernel.grad_fn(builder, node, dys))
    return grads + [None] * (len(gradient_targets(node)) - len(grads))


def _grads_through_expansion(builder: GradBuilder, node: Node, dys: list,
                             expand_fn) -> list | None:
    """The node's input gradients through its forward written again in differentiable ops
    (recomputed in the backward pass) and walked backward like the graph itself; None when
    the expansion does not cover this node's attributes."""
    start = len(builder.nodes)
    outputs = expand_fn(builder, node)
    if outputs is None:
        del builder.nodes[start:]
        return None
    written = builder.nodes[start:]
    partials = {out: [dy] for out, dy in zip(outputs, dys) if out and dy is not None}
    _backpropagate(builder, written, partials)
    grads, seen = [], set()
    # an input read twice gets its summed gradient once; the names an inlined subgraph
    # reads from the enclosing graph (gradient_targets) get theirs after the inputs
    for name in gradient_targets(node):
        grads.append(builder.accumulate(partials.get(name)) if name and name not in seen
                     else None)
        seen.add(name)
    return grads


def _gradient_output(builder: GradBuilder, name: str, parts: list[str] | None) -> str:
    """An output name for d loss / d ``name``: zeros when the loss does not depend on it."""
    grad = builder.accumulate(parts)
    if grad is None:
        grad = builder.emit("Mul", name, builder.constant(0.0, like=name))
    return builder.emit("Identity", grad)


@dataclass
class SplitGradient:
    """A joint graph cut in two (see :func:`split_forward_backward`)."""

    forward: Graph  # the model's outputs, then ``saved``
    backward: Graph  # reads ``saved`` (and the seeds and inputs it needs); outputs the grads
    saved: list[str]  # forward values the backward reads, in the forward's output order


def split_forward_backward(gradient: GradientGraph) -> SplitGradient:
    """Cut the joint graph between its forward and backward nodes, so that a caller can run
    the forward alone (reading its outputs before it knows the head gradients) and the
    backward later, from the forward values it saved.  Each half is planned on its own."""
    joint = gradient.graph
    is_backward = [any(out in gradient.backward_values for out in node.outputs if out)
                   for node in joint.nodes]
    forward_nodes = [n for n, back in zip(joint.nodes, is_backward) if not back]
    backward_nodes = [n for n, back in zip(joint.nodes, is_backward) if back]
    forward_values = {out for node in forward_nodes for out in node.outputs if out}
    backward_reads = list(dict.fromkeys(name for node in backward_nodes for name in
                                        node_reads(node)))
    saved = [name for name in backward_reads if name in forward_values]
    grad_names = set(gradient.grads.values())
    types = infer_types(joint)

    def values(names):
        return [Value(name, types.get(name)) for name in names]

    model_outputs = [v.name for v in joint.outputs if v.name not in grad_names]
    forward = Graph(f"{joint.name}_forward", inputs=[
        v for v in joint.inputs if v.name in _read_names(forward_nodes, model_outputs)],
        outputs=values(dict.fromkeys(model_outputs + saved)), nodes=forward_nodes,
        opsets=dict(joint.opsets))
    backward_inputs = [v for v in joint.inputs if v.name in backward_reads]
    backward = Graph(f"{joint.name}_backward",
                     inputs=backward_inputs + values(saved),
                     outputs=[v for v in joint.outputs if v.name in grad_names],
                     nodes=backward_nodes, opsets=dict(joint.opsets))
    for part in (forward, backward):
        wanted = _read_names(part.nodes, part.output_names)
        part.initializers = {k: v for k, v in joint.initializers.items() if k in wanted}
        part.inputs = [v for v in part.inputs if v.name not in part.initializers]
    return SplitGradient(forward, backward, saved)


def _read_names(nodes: list[Node], outputs: list[str]) -> set[str]:
    return {name for node in nodes for name in node_reads(node)} | set(outputs)


def differentiable_ops() -> list[str]:
    """``domain::op`` of every registered op with a gradient definition, sorted."""
    found = {f"{k.domain or 'ai.onnx'}::{k.op_type}" for k in REGISTRY.all_kernels()
             if k.grad_fn is not None or k.expand_fn is not None}
    return sorted(found)


# -- ONNX's Gradient operator -----------------------------------------------------------------

TRAINING_DOMAIN = "ai.onnx.preview.training"


def expand_gradient_ops(graph: Graph) -> Graph:
    """Replace each ``ai.onnx.preview.training::Gradient`` node (d y / d xs of the graph
    around it) with the backward nodes that compute it; other graphs come back unchanged."""
    if not any(n.op_type == "Gradient" and n.domain == TRAINING_DOMAIN for n in graph.nodes):
        return graph
    result = copy_graph(graph)
    for node in [n for n in result.nodes if n.op_type == "Gradient"
                 and n.domain == TRAINING_DOMAIN]:
        _expand_one(result, node)
    result.toposort()
    return result


def _expand_one(graph: Graph, gradient: Node) -> None:
    xs = [_text(x) for x in gradient.attributes.get("xs", [])]
    y = _text(gradient.attributes.get("y", ""))
    if not xs or not y or len(xs) != len(gradient.outputs):
        raise GradientError(f"node {gradient.label!r}: Gradient needs attributes xs (one per "
                            f"output, got {len(xs)} for {len(gradient.outputs)}) and y",
                            node=gradient.label, op_type="Gradient")
    forward = copy_graph(graph)
    forward.nodes = [n for n in forward.nodes if n.op_type != "Gradient"]
    forward.outputs = [Value(y)]
    joint = gradient_graph(forward, y, xs, keep_outputs=False)
    known = {out for n in graph.nodes for out in n.outputs}
    prefix = f"{gradient.label}/"
    rename = {}
    for node in joint.graph.nodes:
        if any(out in known for out in node.outputs if out):
            continue  # a forward node the graph already has
        for i, out in enumerate(node.outputs):
            if out:
                rename[out] = node.outputs[i] = prefix + out
        node.inputs = [rename.get(name, name) for name in node.inputs]
        node.name = prefix + node.name
        graph.nodes.append(node)
    for name, array in joint.graph.initializers.items():
        if name not in graph.initializers and name not in graph.input_names:
            graph.initializers[prefix + name] = array
            rename[name] = prefix + name
    for node in graph.nodes:
        if node.name.startswith(prefix):
            node.inputs = [rename.get(name, name) for name in node.inputs]
    graph.nodes.remove(gradient)
    for x, out in zip(xs, gradient.outputs):
        graph.nodes.append(Node("Identity", [rename[joint.grads[x]]], [out],
                                name=f"{prefix}{out}", opset=BACKWARD_OPSET))
    graph.opsets.setdefault(MIXRT, 1)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
