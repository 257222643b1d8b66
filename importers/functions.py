"""Inlining ONNX functions into the calling graph.

Two kinds of function reach us: the model's own (``ModelProto.functions``), which a model can
call like any op, and the bodies ONNX's schemas give many standard ops (Swish, Attention, ...).
Both are expanded the same way: the call node is replaced by the body's nodes, with the body's
internal names made unique, its formal inputs and outputs wired to the call's actual ones,
and attribute references (``ref_attr_name``) replaced by the call's attribute values.
"""

from __future__ import annotations

import itertools
from collections import deque

from mixrt.base.errors import ModelLoadError
from mixrt.importers import proto
from mixrt.ops.ir.registry import canonical_domain

MAX_EXPANSION_DEPTH = 32  # a function calling itself (directly or not) would never end
_call_ids = itertools.count()


def inline_model_functions(model, owned: bool):
    """The model's main graph with every call of a model-local function expanded. ``owned``:
    the model was parsed for this load, so its graph may be changed in place and is not
    copied (a copy holds every weight twice); a caller's ModelProto is copied first."""
    functions = {(canonical_domain(f.domain), f.name, f.overload): f for f in model.functions}
    if owned and not functions:
        return model.graph
    graph = type(model.graph)()
    graph.CopyFrom(model.graph)
    if functions:
        _inline_in_graph(graph, functions, depth=0)
    return graph


def _inline_in_graph(graph, functions: dict, depth: int) -> None:
    if depth > MAX_EXPANSION_DEPTH:
        raise ModelLoadError(f"model functions nest deeper than {MAX_EXPANSION_DEPTH} "
                             f"levels (recursive function?)")
    expanded, changed = [], False
    for node in graph.node:
        key = (canonical_domain(node.domain), node.op_type, node.overload)
        function = functions.get(key)
        if function is None:
            for sub in subgraphs_of(node):
                _inline_in_graph(sub, functions, depth)
            expanded.append(node)
            continue
        expanded.extend(expand_call(node, function))
        changed = True
    del graph.node[:]
    graph.node.extend(expanded)
    if changed:  # bodies may call further functions
        _inline_in_graph(graph, functions, depth + 1)


def expand_call(call, function) -> list:
    """The body of ``function`` as nodes wired to ``call``'s inputs, outputs and attributes."""
    if len(call.input) > len(function.input) or len(call.output) > len(function.output):
        raise ModelLoadError(
            f"node {call.name or call.op_type!r} calls function {function.name!r} with "
            f"{len(call.input)} inputs/{len(call.output)} outputs; it takes at most "
            f"{len(function.input)}/{len(function.output)}")
    prefix = f"{function.name}_{next(_call_ids)}__"
    renames = {formal: "" for formal in function.input}
    renames.update(zip(function.input, call.input))
    renames.update({formal: "" for formal in function.output})
    renames.update(zip(function.output, call.output))
    attributes = {a.name: a for a in function.attribute_proto}
    attributes.update({a.name: a for a in call.attribute})
    nodes = []
    for body_node in function.node:
        node = type(call)()
        node.CopyFrom(body_node)
        _rename_node(node, renames, prefix)
        _bind_attributes(node, attributes)
        if not node.name:
            node.name = f"{call.name or call.op_type}/{body_node.op_type}"
        nodes.append(node)
    return nodes


def _rename_node(node, renames: dict, prefix: str) -> None:
    def rename(name: str) -> str:
        if not name:
            return name
        return renames[name] if name in renames else prefix + name

    node.input[:] = [rename(n) for n in node.input]
    node.output[:] = [rename(n) for n in node.output]
    for sub in subgraphs_of(node):
        _rename_outer_references(sub, rename)


def _rename_outer_references(graph, rename) -> None:
    """Rename the names a subgraph reads from its enclosing function body."""
    local = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    local.update(o for n in graph.node for o in n.output)
    for node in graph.node:
        node.input[:] = [n if (not n or n in local) else rename(n) for n in node.input]
        for sub in subgraphs_of(node):
            _rename_outer_references(sub, rename)
    for output in graph.output:
        if output.name not in local:
            output.name = rename(output.name)


def _bind_attributes(node, attributes: dict) -> None:
    bound = []
    for attr in node.attribute:
        if attr.ref_attr_name:
            actual = attributes.get(attr.ref_attr_name)
            if actual is None:
                continue  # caller did not set it and the function gives no default
            copy = type(attr)()
            copy.CopyFrom(actual)
            copy.name = attr.name
            bound.append(copy)
        else:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                for inner in sub.node:
                    _bind_attributes(inner, attributes)
            bound.append(attr)
    del node.attribute[:]
    node.attribute.extend(bound)


def schema_function(call, opset: int, input_types: list):
    """The function body ONNX's schema gives ``call``'s op at ``opset`` (a FunctionProto of
    ``call``'s own classes), or None.

    ``input_types`` are TypeProtos of the call's inputs (needed by context-dependent
    functions such as Attention, whose body depends on input ranks and dtypes). Only a model
    with a node that has no kernel gets here, so only such a model imports onnx's schemas.
    """
    import onnx.defs  # noqa: PLC0415  (heavy: the function bodies live in its registry)
    domain = canonical_domain(call.domain)
    function_class = proto.sibling(call, "FunctionProto")
    try:
        schema = onnx.defs.get_schema(call.op_type, opset, domain)
    except Exception:  # SchemaError for unknown ops; TypeError for non-text names
        return None
    try:
        version = _newest_at_most(schema.function_opset_versions, opset)
        if schema.has_function and version is not None:
            body = _as_function(function_class,
                                schema.get_function_with_opset_version(version))
            if body.node:
                return body
        version = _newest_at_most(schema.context_dependent_function_opset_versions, opset)
        if schema.has_context_dependent_function and version is not None:
            raw = schema.get_context_dependent_function_with_opset_version(
                version, call.SerializeToString(),
                [t.SerializeToString() for t in input_types])
            body = _as_function(function_class, raw) if raw else None
            if body is not None and body.node:
                return body
    except Exception:  # the schema refused these types/attributes
        return None
    return None


def _newest_at_most(versions, opset: int) -> int | None:
    eligible = [v for v in versions if v <= opset]
    return max(eligible) if eligible else None


def _as_function(function_class, body):
    """A schema's function body (onnx's FunctionProto, or its serialized bytes) as a
    ``function_class``: the call's graph can hold only nodes of its own classes."""
    if isinstance(body, function_class):
        return body
    function = function_class()
    function.ParseFromString(body if isinstance(body, bytes) else body.SerializeToString())
    return function


# -- standard ops without a kernel, expanded from their schema's function body ----------------

def expand_schema_functions(graph, opsets: dict[str, int], has_kernel,
                            infer_output_types) -> None:
    """Replace nodes whose op has no kernel (``has_kernel(domain, op, opset)`` is false) by
    the function body ONNX's schema defines for them, in place, subgraphs included.

    ``infer_output_types(node, input_type_protos)`` gives the TypeProtos of a kernel-backed
    node's outputs, so context-dependent bodies further down see their input types.
    """
    if all(_has_own_kernel(n, opsets, has_kernel) for n in graph.node):
        # the common case: nothing to expand here, so skip the type bookkeeping
        for node in graph.node:
            for sub in subgraphs_of(node):
                expand_schema_functions(sub, opsets, has_kernel, infer_output_types)
        return
    type_class = proto.sibling(graph, "TypeProto")
    types = {v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)}
    for tensor in graph.initializer:
        types[tensor.name] = proto.tensor_type(type_class, tensor.data_type, tensor.dims)
    pending, done, depth = deque(_copy(n) for n in graph.node), [], {}
    while pending:
        node = pending.popleft()
        for sub in subgraphs_of(node):
            expand_schema_functions(sub, opsets, has_kernel, infer_output_types)
        domain = canonical_domain(node.domain)
        opset = opsets.get(domain)
        input_types = [types.get(name, type_class()) for name in node.input]
        body = None
        if opset is not None and not has_kernel(domain, node.op_type, opset):
            level = depth.get(id(node), 0)
            if level < MAX_EXPANSION_DEPTH:
                body = schema_function(node, opset, input_types)
        if body is None:
            done.append(node)
            for name, type_proto in zip(node.output, infer_output_types(node, input_types)):
                if name and type_proto is not None:
                    types[name] = type_proto
            continue
        expanded = expand_call(node, body)
        for inner in expanded:
            depth[id(inner)] = depth.get(id(node), 0) + 1
            if canonical_domain(inner.domain) not in opsets:
                opsets[canonical_domain(inner.domain)] = _body_opset(body, inner.domain)
        pending.extendleft(reversed(expanded))
    del graph.node[:]
    graph.node.extend(done)


def _body_opset(body, domain: str) -> int:
    for entry in body.opset_import:
        if canonical_domain(entry.domain) == canonical_domain(domain):
            return int(entry.version)
    return 1


def _has_own_kernel(node, opsets: dict[str, int], has_kernel) -> bool:
    opset = opsets.get(canonical_domain(node.domain))
    return opset is None or has_kernel(canonical_domain(node.domain), node.op_type, opset)


def subgraphs_of(node) -> list:
    """The GRAPH and GRAPHS attribute values of a node."""
    found = []
    for attr in node.attribute:
        found.extend(([attr.g] if attr.HasField("g") else []) + list(attr.graphs))
    return found


def _copy(node):
    copy = type(node)()
    copy.CopyFrom(node)
    return copy
