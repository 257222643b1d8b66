"""Each node's operand types against its ONNX schema, before anything runs.

NumPy would run ``Add(float32, float64)`` by promoting to float64, ``Sqrt(int32)`` by
computing in float64 and ``Conv(int32)`` in integers: a model the ONNX spec calls invalid
would return values of a type nobody declared. onnxruntime refuses such a model when it
loads it, naming the node; so does mixrt, with a ``GraphError`` that names the node, the
input, its type and what the schema allows.

Two rules, both from the schema in force at the node's opset, and a third of the op's own:

* an input's type is one the input's type constraint allows;
* inputs bound to one type parameter (``T`` of Add's ``A`` and ``B``, every input of a
  homogeneous variadic such as Concat's) have one type;
* attributes the op refuses whatever its inputs (``OpHandle.check``: a regular expression
  RE2 does not accept) are the model's error, at load.

Only types that are known are checked (declared inputs, initializers, value_info, and what
inference derives from them); nodes of domains ONNX has no schema for (``mixrt``, custom
ops) are left alone.

Shapes are checked too, where they are wholly known: a top-level node whose present inputs
all have static shapes is shown to its op's infer function, and an infer function that
refuses them (a Conv weight with the wrong channel count, GroupNormalization-21 given
opset 18's per-group scale, operands that do not broadcast) is the model's error, reported
at load rather than as a kernel failure on the first run. Symbolic and unknown dims are not
guessed at: those nodes are checked by their kernels when they run.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np

from mixrt.base.errors import GraphError
from mixrt.ops.ir import onnx_schemas
from mixrt.ops.ir.dtypes import ONNX_TYPE_NAMES, to_onnx_type
from mixrt.ops.ir.registry import REGISTRY
from mixrt.ops.ir.types import MapType, OptionalType, SequenceType, TensorType
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_attributes, infer_node, infer_types
from mixrt.runtime.passes.rewrite import static_shape

_VARIADIC = onnx_schemas.VARIADIC


def check_operand_types(graph: Graph, types: dict | None = None) -> None:
    """Raise GraphError at the first node whose operands break its schema's constraints,
    or whose static operand shapes its op refuses."""
    types = infer_types(graph) if types is None else types
    top_level = {id(node) for node in graph.nodes}
    for node in graph.all_nodes():
        problem = operand_problem(node, types, shapes=id(node) in top_level)
        if problem:
            raise GraphError(f"node {node.label!r} ({node.domain or 'ai.onnx'}::"
                             f"{node.op_type}, opset {node.opset}): {problem}")


def operand_problem(node: Node, types: dict, *, shapes: bool) -> str | None:
    """What is wrong with the node's operand types, and with their shapes when ``shapes``
    (top-level nodes: a body's values are typed from what its op guessed), or None."""
    problem = attribute_problem(node) or operand_type_problem(node, types)
    return problem if problem or not shapes else operand_shape_problem(node, types)


def attribute_problem(node: Node) -> str | None:
    """What the node's kernel refuses in its attributes whatever its operands (a pattern
    RE2 does not accept: ``OpHandle.check``), or None."""
    kernel = REGISTRY.find(node.domain, node.op_type, node.opset)
    if kernel is None or kernel.check_fn is None:
        return None
    try:
        kernel.check_fn(**infer_attributes(kernel, node))
    except ValueError as error:
        return str(error)
    return None


def operand_shape_problem(node: Node, types: dict) -> str | None:
    """What the node's infer function refuses in its operands' shapes, when every present
    input is a tensor of static shape and known dtype (else None: nothing to go on).
    Only ValueError counts: it is how the ops' shape rules say no; anything else an infer
    function raises says it could not tell."""
    kernel = REGISTRY.find(node.domain, node.op_type, node.opset)
    if kernel is None or kernel.infer_fn is None or node.subgraphs():
        return None
    inputs = [types.get(name) if name else None for name in node.inputs]
    if not all(t is None or _static(t) for t in inputs):
        return None
    try:
        kernel.infer_fn(*inputs, **infer_attributes(kernel, node))
    except ValueError as error:
        shapes = ", ".join(f"{name!r} {types[name]}" for name in node.inputs if name)
        return f"{error} (operands: {shapes})"
    except Exception:  # noqa: BLE001  (an infer function's own limits are not the model's)
        return None
    return None


def _static(value_type) -> bool:
    return isinstance(value_type, TensorType) and value_type.dtype is not None and \
        static_shape(value_type) is not None


def operand_type_problem(node: Node, types: dict) -> str | None:
    """What is wrong with the node's operand types, or None (also when unknown)."""
    schema = _schema(node)
    if schema is None:
        return None
    allowed_by_param = {param: {_canonical(t) for t in allowed}
                        for param, allowed in schema.type_constraints.items()}
    bound: dict[str, tuple[str, str]] = {}  # type parameter -> (type, first input with it)
    for index, name in enumerate(node.inputs):
        formal = _formal(schema, index)
        actual = type_string(types.get(name)) if name else None
        if formal is None or actual is None:
            continue
        allowed = allowed_by_param.get(formal.type_str, {formal.type_str})
        if actual not in allowed:
            return (f"input {index} ({formal.name}) {name!r} is {actual}; "
                    f"{node.op_type}-{schema.since_version} accepts {_listed(allowed)}")
        if formal.type_str not in allowed_by_param or not _binds_one_type(formal):
            continue
        first = bound.setdefault(formal.type_str, (actual, name))
        if first[0] != actual:
            return (f"inputs {first[1]!r} ({first[0]}) and {name!r} ({actual}) must have one "
                    f"type (both are {formal.type_str} in {node.op_type}-"
                    f"{schema.since_version}); insert a Cast")
    return None


def version_accepting(node: Node, types: dict) -> int:
    """The node's opset, or else the first later version of its op that accepts its operand
    types and differs from it in nothing else: opset 22 added bfloat16 to most float ops
    (Sin, Cos, Softplus, Round, Conv, the pools, ...) and changed nothing more, so a node
    written at an older opset (a backward node at autodiff's BACKWARD_OPSET, a node the
    mixed-precision rewrite moved to bfloat16) needs their opset-22 versions. When none
    does, the node keeps its opset and the type check names it. Default domain only."""
    if operand_type_problem(node, types) is None:
        return node.opset
    from onnx import defs  # noqa: PLC0415  (the attributes' defaults: autodiff, not loading)
    base = _signature(node.op_type, node.opset)
    for version in range(node.opset + 1, defs.onnx_opset_version() + 1):
        if _signature(node.op_type, version) != base:
            break
        candidate = dataclasses.replace(node, opset=version)
        if operand_type_problem(candidate, types) is None \
                and REGISTRY.find("", node.op_type, version) is not None:
            return version
    return node.opset


@functools.cache
def _signature(op_type: str, version: int) -> tuple | None:
    """Everything of the ONNX schema in force at ``version`` but its type constraints: the
    inputs and outputs, and each attribute's type, whether it is required and its default.
    The defaults catch the versions that changed meaning under the same names (Softmax-13's
    axis, GridSample-20's mode values)."""
    from onnx import defs  # noqa: PLC0415
    try:
        schema = defs.get_schema(op_type, version)
    except defs.SchemaError:
        return None
    attributes = tuple(sorted((name, int(a.type), a.required,
                               a.default_value.SerializeToString())
                              for name, a in schema.attributes.items()))
    return (tuple((p.name, p.option, p.type_str) for p in schema.inputs),
            tuple(p.name for p in schema.outputs), attributes)


def promote_mixed_floats(graph: Graph) -> Graph:
    """The graph with a Cast before each float operand that shares a type parameter with a
    wider float (``Gemm(float64 data, float32 weight)`` reads ``Cast(weight, to=DOUBLE)``),
    as NumPy would promote and as ``mixrt.nd`` does through recorded Casts: a hybridized
    block fed float64 data computes what the same block computes imperatively, in a graph the
    spec allows (its backward then returns each gradient in its own parameter's dtype).
    Top-level nodes only; the graph is changed in place and returned."""
    types = infer_types(graph)
    taken = set(graph.initializers) | set(graph.input_names) | \
        {o for n in graph.nodes for o in n.outputs}
    made: dict[tuple[str, str], str] = {}  # (source, dtype) -> its cast, made once
    nodes = []
    for node in graph.nodes:
        for index, dtype in _promotions(node, types).items():
            source = node.inputs[index]
            if (source, dtype.name) not in made:
                cast = _cast(graph, source, dtype, taken)
                nodes.append(cast)
                taken.add(cast.outputs[0])
                types[cast.outputs[0]] = TensorType(dtype, types[source].shape)
                made[source, dtype.name] = cast.outputs[0]
            node.inputs[index] = made[source, dtype.name]
        for name, value_type in zip(node.outputs, infer_node(node, types)):
            if name:
                types[name] = value_type
        nodes.append(node)
    graph.nodes = nodes
    return graph


def _promotions(node: Node, types: dict) -> dict[int, np.dtype]:
    """Input index -> the float dtype it must be cast to."""
    wanted = {}
    for group in shared_type_groups(node, types):
        floats = [(index, dtype) for index, dtype in group
                  if dtype is not None and dtype.kind == "f"]
        if floats:
            common = np.result_type(*(dtype for _, dtype in floats))
            wanted.update({index: common for index, dtype in floats if dtype != common})
    return wanted


def shared_type_groups(node: Node, types: dict) -> list[list[tuple[int, np.dtype | None]]]:
    """The node's inputs grouped by the schema's type parameter they are bound to (each
    group must hold one type), as (input index, dtype or None when not a known tensor);
    empty when ONNX has no schema for the node."""
    schema = _schema(node)
    if schema is None:
        return []
    params = set(schema.type_constraints)
    groups: dict[str, list[tuple[int, np.dtype | None]]] = {}
    for index, name in enumerate(node.inputs):
        formal = _formal(schema, index)
        if not name or formal is None or formal.type_str not in params or \
                not _binds_one_type(formal):
            continue
        value_type = types.get(name)
        dtype = np.dtype(value_type.dtype) if isinstance(value_type, TensorType) and \
            value_type.dtype is not None else None
        groups.setdefault(formal.type_str, []).append((index, dtype))
    return [group for group in groups.values() if len(group) > 1]


def _cast(graph: Graph, source: str, dtype: np.dtype, taken: set) -> Node:
    name = f"{source}_as_{dtype.name}"
    while name in taken:
        name += "_"
    return Node("Cast", [source], [name], name, "", graph.opsets.get("", 21),
                {"to": to_onnx_type(dtype)})


def type_string(value_type) -> str | None:
    """ONNX's spelling of a value's type (``tensor(float)``, ``seq(tensor(int64))``,
    ``map(int64,tensor(float))``), or None when it is not known."""
    if isinstance(value_type, TensorType):
        name = _element_name(value_type.dtype)
        return None if name is None else f"tensor({name})"
    if isinstance(value_type, MapType):
        key, value = _element_name(value_type.key), type_string(value_type.value)
        return None if key is None or value is None else f"map({key},{value})"
    if isinstance(value_type, SequenceType):
        inner = type_string(value_type.element)
        return None if inner is None else f"seq({inner})"
    if isinstance(value_type, OptionalType):
        inner = type_string(value_type.element)
        return None if inner is None else f"optional({inner})"
    return None


def _element_name(dtype) -> str | None:
    if dtype is None:
        return None
    try:
        return ONNX_TYPE_NAMES[to_onnx_type(dtype)]
    except (KeyError, ValueError, TypeError):
        return None


_MAP_IN_SCHEMA = re.compile(r"map\((\w+),\s*(\w+)\)")


def _canonical(type_str: str) -> str:
    """A schema's type string as type_string spells it: the ai.onnx.ml schemas write a map's
    values as a bare element type (``map(string, float)``, ``seq(map(int64, float))``), ONNX's
    checker and onnxruntime as a tensor type (``map(string,tensor(float))``)."""
    return _MAP_IN_SCHEMA.sub(lambda m: f"map({m[1]},tensor({m[2]}))", type_str)


def _schema(node: Node):
    """The schema in force at the node's opset; None when ONNX has none (also for an opset
    or a name a damaged file made up: the kernel lookup reports those)."""
    if not 0 < node.opset < 2 ** 31 or not isinstance(node.op_type, str):
        return None
    return onnx_schemas.get_schema(node.op_type, node.opset, node.domain)


def _formal(schema, index: int):
    """The schema's formal input that the node's ``index``-th input fills."""
    if index < len(schema.inputs):
        return schema.inputs[index]
    if schema.inputs and schema.inputs[-1].option == _VARIADIC:
        return schema.inputs[-1]
    return None


def _binds_one_type(formal) -> bool:
    """A heterogeneous variadic (Loop's and Scan's state) binds each element on its own."""
    return formal.option != _VARIADIC or formal.is_homogeneous


def _listed(allowed: set[str]) -> str:
    names = sorted(allowed)
    return ", ".join(names) if len(names) <= 8 else ", ".join(names[:8]) + ", ..."
