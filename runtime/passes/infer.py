"""Shape and dtype inference over a Graph, from each op's ``infer`` function.

Types the model declares (inputs, outputs, value_info, initializers) win over inferred ones;
inference fills the gaps. It never touches tensor data (only initializers' shapes and, for
shape-computing ops such as Reshape, constant values known at plan time).

A control-flow op's infer function sees each GRAPH attribute as a ``BodyTypes``: it can ask
what the body outputs given types for the body's inputs, in the scope of the enclosing graph.
That is how a Loop learns its carried states' types (a fixed point over iterations, in
``ops/control/control.py``), and the body's own values are typed with the inputs the op settled on.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from mixrt.ops.ir.registry import REGISTRY
from mixrt.ops.ir.types import UNKNOWN, OptionalType, SequenceType, TensorType
from mixrt.runtime.graph import Graph, Node, Value


class _PassMemo:
    """The optimizer's record of the last types inferred for the graph it rewrites, and
    whether the graph is still as they describe it (the passes since reported no change)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.types: dict | None = None
        self.reusable = False


_memo = threading.local()


@contextmanager
def types_between_passes(graph: Graph):
    """Within this block, a pass's first ``infer_types(graph)`` reuses the types the previous
    pass inferred when that pass (and any since) changed nothing: ~14 passes each inferring
    the whole graph was half of a transformer's load. The optimizer reports each pass's
    count with :func:`after_pass`."""
    previous = getattr(_memo, "current", None)
    _memo.current = _PassMemo(graph)
    try:
        yield
    finally:
        _memo.current = previous


def after_pass(graph: Graph, changes: int) -> None:
    """A pass on ``graph`` made ``changes`` rewrites: with none, what it inferred still holds."""
    memo = getattr(_memo, "current", None)
    if memo is None or memo.graph is not graph:
        return
    memo.reusable = not changes and memo.types is not None
    if changes:
        memo.types = None


def infer_types(graph: Graph, outer: dict | None = None, settle=None,
                inputs: dict | None = None) -> dict[str, object]:
    """Name -> TensorType/SequenceType/OptionalType (or None when unknown); see
    :func:`_inferred_types`. Between the optimizer's passes, a graph no pass has changed is
    not inferred again (:func:`types_between_passes`)."""
    memo = getattr(_memo, "current", None)
    if memo is None or memo.graph is not graph or outer or settle or inputs:
        return _inferred_types(graph, outer, settle, inputs)
    if memo.reusable:
        # once per pass: a later call in the same pass may follow its own rewrites
        memo.reusable = False
        return dict(memo.types)
    memo.types = _inferred_types(graph)
    return dict(memo.types)


def _inferred_types(graph: Graph, outer: dict | None = None, settle=None,
                    inputs: dict | None = None) -> dict[str, object]:
    """Name -> TensorType/SequenceType/OptionalType (or None when unknown), subgraphs'
    values included.

    ``outer`` types the names the graph reads from an enclosing scope; ``inputs`` types
    the graph's own inputs where a body's op knows them (its declarations fill the rest). A
    body input hides an outer value of its name.

    ``settle(node, types)``, when given, runs after each top-level node is inferred and may
    return ``{output name: array}`` for outputs whose data is known at that point (the
    executor's shape arithmetic, fixed by one input signature); those outputs are typed with
    their value, so the Reshape downstream knows its output shape."""
    types: dict[str, object] = dict(outer or {})
    for name, array in graph.initializers.items():
        types[name] = TensorType(array.dtype, tuple(array.shape), value=array)
    for value in graph.inputs:
        if value.name not in graph.initializers:
            types[value.name] = refined(value.type, (inputs or {}).get(value.name))
    for node in graph.nodes:
        outputs, inner = _infer_with_bodies(node, types)
        for name, value_type in zip(node.outputs, outputs):
            if name:
                types[name] = refined(graph.value_types.get(name), value_type)
        types.update(inner)
        for name, array in ((settle(node, types) if settle else None) or {}).items():
            types[name] = TensorType(array.dtype, tuple(array.shape), value=array)
    for value in graph.outputs:
        if value.type is not None:
            types[value.name] = refined(value.type, types.get(value.name))
    return types


def refined(declared, inferred):
    """What is known of a value from its declaration and from inference together.

    Inference follows from the inputs by the ops' own rules, which are what the kernels
    compute, so it wins wherever it says something: a declaration that disagrees (a stale
    value_info, a body that declares scalars where vectors flow) must not let a pass remove
    a Reshape that is not a no-op. onnxruntime too keeps the inferred shape over a
    conflicting declaration. The declaration fills what inference leaves open: the dtype,
    the rank, an unknown dim, and the name of a symbolic dim (the model's names read better
    than inference's). A declared number where inference has a symbol is not taken: nothing
    checks it against the inputs."""
    if inferred is None or _says_nothing(inferred):
        return declared if declared is not None else inferred
    for kind in (SequenceType, OptionalType):
        if isinstance(declared, kind) and isinstance(inferred, kind):
            return kind(refined(declared.element, inferred.element))
    if not (isinstance(declared, TensorType) and isinstance(inferred, TensorType)):
        return inferred
    dtype = inferred.dtype if inferred.dtype is not None else declared.dtype
    if inferred.shape is None or declared.shape is None or \
            len(inferred.shape) != len(declared.shape):
        shape = inferred.shape if inferred.shape is not None else declared.shape
    else:
        shape = tuple(_refined_dim(d, i) for d, i in zip(declared.shape, inferred.shape))
    keeps_value = shape == inferred.shape and dtype == inferred.dtype
    return TensorType(dtype, shape, value=inferred.value if keeps_value else None)


def _says_nothing(value_type) -> bool:
    return isinstance(value_type, TensorType) and value_type.dtype is None and \
        value_type.shape is None


def _refined_dim(declared, inferred):
    if inferred is None:
        return declared
    if isinstance(inferred, str) and isinstance(declared, str):
        return declared
    return inferred


def without_body_declarations(graph: Graph) -> Graph:
    """The graph with every subgraph's declared types dropped (inputs, outputs, value_info):
    what inference then says of control-flow values follows from the top-level inputs alone,
    so a body that declares a shape its values do not have (the ONNX backend's loop16 case
    does) cannot make the session plan for that shape."""
    return replace(graph, nodes=[_undeclared_bodies(node) for node in graph.nodes])


def _undeclared_bodies(node: Node) -> Node:
    if not node.subgraphs():
        return node
    # a Loop hands its body the iteration number and condition with the rank the body
    # declares for them (ops/control/control.py), so those two declarations are facts, not claims
    kept = 2 if node.op_type == "Loop" and node.domain == "" else 0
    attributes = {key: _undeclared(value, kept) if isinstance(value, Graph) else value
                  for key, value in node.attributes.items()}
    return replace(node, attributes=attributes)


def _undeclared(body: Graph, kept: int = 0) -> Graph:
    return replace(body, inputs=[v if i < kept else Value(v.name)
                                 for i, v in enumerate(body.inputs)],
                   outputs=[Value(v.name) for v in body.outputs], value_types={},
                   nodes=[_undeclared_bodies(node) for node in body.nodes])


def infer_node(node: Node, types: dict) -> list:
    """The node's output types, or an empty list when its op cannot say."""
    return _infer_with_bodies(node, types)[0]


class BodyTypes:
    """A GRAPH attribute as infer functions see it. ``infer(*input_types)`` types the body
    with its inputs typed as given (where the body does not declare them) in the enclosing
    scope, and returns its output types; ``types`` keeps the body's values from the last
    call, which is the one the op's infer function settled on."""

    def __init__(self, graph: Graph, outer: dict):
        self.graph, self._outer = graph, outer
        self.input_names, self.output_names = graph.input_names, graph.output_names
        self.types: dict | None = None

    def infer(self, *input_types) -> list:
        self.types = infer_types(self.graph, self._outer,
                                 inputs=dict(zip(self.input_names, input_types)))
        return [self.types.get(name) for name in self.output_names]


def _infer_with_bodies(node: Node, types: dict) -> tuple[list, dict]:
    """The node's output types, and the types of the values inside its subgraphs."""
    kernel = REGISTRY.find(node.domain, node.op_type, node.opset)
    bodies = {key: BodyTypes(value, types) for key, value in node.attributes.items()
              if isinstance(value, Graph)}
    outputs = []
    if kernel is not None and kernel.infer_fn is not None:
        inputs = [_input_type(kernel, index, name, types)
                  for index, name in enumerate(node.inputs)]
        attributes = infer_attributes(kernel, node, bodies)
        try:
            outputs = list(kernel.infer_fn(*inputs, **attributes))
        except Exception:  # an infer function that cannot handle unknowns says nothing
            outputs = []
            for body in bodies.values():  # typed from inputs the op never settled on
                body.types = None
    inner: dict = {}
    for body in bodies.values():
        _merge_body(inner, body.types if body.types is not None
                    else infer_types(body.graph, types))
    return outputs, inner


def _merge_body(inner: dict, body_types: dict) -> None:
    """Add one body's values to its siblings'. Sibling bodies may reuse a name (a
    BeamSearch's encoder and decoder both have their ``logits``, an If's branches their
    temporaries); where the two disagree the name is left untyped, so no pass plans for one
    body's shape in the other (a residual Add fused in place over a (batch, 1, vocab)
    product that was (batch, 2, vocab) in the other body failed when it ran)."""
    for name, value_type in body_types.items():
        if name in inner and not _same_type(inner[name], value_type):
            inner[name] = None
        else:
            inner[name] = value_type


def _same_type(a, b) -> bool:
    """Two inferred types say the same of a value (dtype and shape; known data aside)."""
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        return a.dtype == b.dtype and a.shape == b.shape
    for kind in (SequenceType, OptionalType):
        if isinstance(a, kind) and isinstance(b, kind):
            return _same_type(a.element, b.element)
    return a is b


def infer_attributes(kernel, node: Node, bodies: dict | None = None) -> dict:
    """The keyword arguments of the kernel's infer function for this node: its attributes
    (GRAPH ones as ``bodies`` give them) and the output count where the kernel asks."""
    attributes = {**node.attributes, **(bodies or {})}
    if kernel.wants_output_count:
        attributes["_outputs"] = len(node.outputs)
    return attributes


def _input_type(kernel, index: int, name: str, types: dict):
    """What an infer function gets for one input: None for an absent optional input, and
    for a present one its type, UNKNOWN where inference has none and the input is optional
    (so that the function does not take it for absent: a DFT axis of unknown value is not
    the default axis)."""
    if not name:
        return None
    found = types.get(name)
    if found is None and kernel.infers_optional_input(index):
        return UNKNOWN
    return found


def first_input_dtype(node: Node, types: dict) -> str | None:
    """The dtype name of the node's first present input, when known."""
    for name in node.inputs:
        if name:
            value_type = types.get(name)
            if isinstance(value_type, TensorType) and value_type.dtype is not None:
                return value_type.dtype.name
            return None
    return None


def with_input_shapes(graph: Graph, feeds: dict) -> Graph:
    """The graph with its inputs typed by the feeds' concrete shapes, for shape inference
    (declared intermediate types are dropped: they may carry symbolic dims, and a body's
    declarations may claim a shape its values do not have)."""
    inputs = []
    for value in graph.inputs:
        fed = feeds.get(value.name)
        if fed is not None and hasattr(fed, "shape"):
            value = Value(value.name, TensorType(np.dtype(fed.dtype), tuple(fed.shape)))
        inputs.append(value)
    return without_body_declarations(replace(graph, inputs=inputs, value_types={}))
