"""Graph -> ONNX ModelProto at a chosen opset: the importer's inverse.

    model = export_model(graph, opset=17)        # an onnx.ModelProto, checked
    save_model(graph, "model.onnx", opset=17)

Export runs in three steps:

1. mixrt-domain nodes (the optimizer's fused kernels) are unfolded into standard ops
   (``exporters/decompose.py``), so a graph read from a compiled ``.mxr`` exports too;
2. the default-domain opset is retargeted. Ops newer than the target that have an exact
   older form (LayerNormalization, Gelu, inference BatchNormalization) are rewritten first
   (``exporters/lower.py``). A node whose op has the same definition at its
   own opset and at the target (``since_version`` of both schemas) is only relabelled; when
   some op changed in between, onnx's version converter adapts the whole model, and a node it
   cannot adapt, or whose op did not exist yet at the target, is an :class:`ExportError`
   that names the node and the lowest opset that can express it;
3. the ModelProto is built with onnx's own helpers (tensors through ``numpy_helper``,
   attributes typed by the op's schema where a Python value is ambiguous) and must pass
   ``onnx.checker.check_model(full_check=True)``.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from importlib import metadata as package_metadata
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, defs, helper, numpy_helper, version_converter

from mixrt.base.errors import ExportError
from mixrt.exporters.decompose import decompose_graph
from mixrt.exporters.lower import lower_for_opset
from mixrt.exporters.lower import schema_at as _schema_at
from mixrt.ops.ir.dtypes import to_onnx_type
from mixrt.ops.ir.types import MapType, OptionalType, SequenceType, TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import ir_version_of, overridable_initializers

MAX_PROTO_BYTES = 2**31 - 1  # protobuf cannot serialize (or check) a bigger message
MIN_IR_VERSION = 4  # from IR 4 on an initializer need not be listed as a graph input


def export_model(graph: Graph, opset: int | None = None, *,
                 producer: str = "mixrt", check: bool = True) -> onnx.ModelProto:
    """``graph`` as an ONNX model whose default domain is at ``opset`` (None: the graph's
    own). Raises ExportError for what the target cannot express, and (``check``) where
    onnx's full checker refuses the result (a model whose own declared shapes contradict
    its operators is refused so too)."""
    graph = decompose_graph(graph)
    source = _default_opset(graph)
    target = source if opset is None else _checked_target(opset)
    graph = lower_for_opset(graph, target)
    write_at, pending = _opset_plan(graph, source, target)
    model = _model_proto(graph, write_at, declare_default=opset is not None)
    if pending:
        model = _converted(model, graph, target, pending)
    _describe(model, graph, producer)
    if check:
        _check(model)
    return model


def save_model(graph: Graph, path, opset: int | None = None) -> onnx.ModelProto:
    """Export ``graph`` and write it to ``path``; weights past protobuf's 2 GiB limit go to
    one external-data file beside it. Returns the exported model."""
    model = export_model(graph, opset)
    path = Path(os.fspath(path))
    if model.ByteSize() <= MAX_PROTO_BYTES:
        onnx.save_model(model, path)
        return model
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data")
    _check(str(path))
    return model


# -- which opset the nodes are written at ----------------------------------------------------

def _default_opset(graph: Graph) -> int:
    if "" in graph.opsets:
        return int(graph.opsets[""])
    versions = [node.opset for node in graph.all_nodes() if node.domain == "" and node.opset]
    if versions:
        return max(versions)
    if any(node.domain == "" for node in graph.all_nodes()):
        raise ExportError(f"graph {graph.name!r} declares no default-domain opset; pass "
                          f"the opset to export at")
    return defs.onnx_opset_version()  # nothing in the default domain: any version will do


def _checked_target(opset) -> int:
    known = defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, numbers.Integral) \
            or not 1 <= opset <= known:
        raise ExportError(f"cannot export at opset {opset!r}: onnx {onnx.__version__} "
                          f"defines default-domain opsets 1..{known}")
    return int(opset)


# Changes onnx's version converter gets wrong (onnx 1.23): such a node is refused rather than
# written with another meaning.
_UNSOUND_CONVERSIONS = {
    "GroupNormalization": "onnx's converter treats the opset 21 change of scale and bias from "
                          "per group to per channel as compatible",
}


def _opset_plan(graph: Graph, source: int, target: int) -> tuple[int, list[Node]]:
    """(opset the model is written at, nodes the version converter must adapt).

    With nothing to adapt the nodes are written straight at the target; otherwise at the
    graph's opset, which the converter then takes to the target."""
    pending = []
    types = None
    for node in _default_domain_nodes(graph):
        at = node.opset or source
        here = _schema(node, at)
        there = _schema_at(node.op_type, target)
        if there is None:
            raise _inexpressible(node, target, _first_version(node.op_type), "did not exist yet")
        if here.since_version == there.since_version:
            continue
        types = types if types is not None else infer_types(graph)
        if _only_types_changed(node, here, there, types):
            continue
        if node.op_type in _UNSOUND_CONVERSIONS:
            raise _inexpressible(node, target, here.since_version,
                                 _UNSOUND_CONVERSIONS[node.op_type])
        pending.append(node)
    if not pending:
        return target, []
    for node in _default_domain_nodes(graph):
        at = node.opset or source
        if at != source and _schema(node, at).since_version != \
                _schema(node, source).since_version:
            raise ExportError(f"node {node.label!r}: {node.op_type} is at opset {at} while "
                              f"the graph is at {source}, and the op changed in between; "
                              f"export at opset {at} or rebuild the node at {source}")
    return source, pending


def _first_version(op_type: str) -> int:
    """The opset that introduced a default-domain op."""
    return min(schema.since_version for schema in defs.get_all_schemas_with_history()
               if schema.name == op_type and schema.domain in ("", "ai.onnx"))


def _only_types_changed(node: Node, here, there, types: dict) -> bool:
    """Whether ``node`` may simply be written at the other version: the op's inputs and
    outputs are the same in both schemas, so are the attributes the node can carry there
    (types and defaults), and every type the node uses is allowed by the other one. Most opset bumps only add types (Relu 14 took
    integers, BatchNormalization 15 split its type parameter, Identity 16 took optionals),
    and onnx's version converter has no adapter for many of them."""
    if node.op_type in _UNSOUND_CONVERSIONS or _uses_newer_values(node, there):
        return False
    if _signature(here) != _signature(there) or not _same_attributes(node, here, there):
        return False
    for formals, names in ((there.inputs, node.inputs), (there.outputs, node.outputs)):
        for index, name in enumerate(names):
            if not name or not formals:
                continue
            formal = formals[min(index, len(formals) - 1)]
            value_type = types.get(name)
            if not isinstance(value_type, TensorType) or value_type.dtype is None:
                return False  # a sequence, an optional or an unknown type: let onnx decide
            if _type_string(value_type.dtype) not in _allowed(there, formal.type_str):
                return False
    return True


def _signature(schema) -> tuple:
    def formals(params):
        return tuple((p.name, str(p.option)) for p in params)
    return formals(schema.inputs), formals(schema.outputs)


def _same_attributes(node: Node, here, there) -> bool:
    """The target defines every attribute it has as the node's version does, and the node
    sets none that the target lacks (``lower_for_opset`` drops those left at default)."""
    if not set(there.attributes) <= set(here.attributes):
        return False
    if any(_attribute_definition(here, n) != _attribute_definition(there, n)
           for n in there.attributes):
        return False
    return set(node.attributes) <= set(there.attributes)


def _attribute_definition(schema, name: str) -> tuple:
    a = schema.attributes[name]
    return str(a.type), a.required, a.default_value.SerializeToString()


def _allowed(schema, type_str: str) -> set[str]:
    for constraint in schema.type_constraints:
        if constraint.type_param_str == type_str:
            return set(constraint.allowed_type_strs)
    return {type_str}  # a concrete type such as tensor(int64)


def _type_string(dtype) -> str:
    """ONNX's spelling of a tensor type in schemas: tensor(float), tensor(int64), ..."""
    try:
        return f"tensor({onnx.TensorProto.DataType.Name(to_onnx_type(dtype)).lower()})"
    except KeyError:
        return "tensor(unknown)"


def _uses_newer_values(node: Node, there) -> bool:
    """Attribute values a later opset added without changing the signature."""
    return node.op_type == "Pad" and there.since_version < 19 and \
        node.attributes.get("mode") in ("wrap", b"wrap")


def _default_domain_nodes(graph: Graph):
    return (node for node in graph.all_nodes() if node.domain == "")


def _schema(node: Node, opset: int):
    schema = _schema_at(node.op_type, opset)
    if schema is None:
        raise ExportError(f"node {node.label!r}: {node.op_type} is not an ONNX operator at "
                          f"opset {opset}")
    return schema


def _inexpressible(node: Node, target: int, lowest: int, why: str) -> ExportError:
    return ExportError(f"node {node.label!r}: {node.op_type} cannot be exported at opset "
                       f"{target} ({why}); the lowest opset that can express it is {lowest}")


def _converted(model: onnx.ModelProto, graph: Graph, target: int,
               pending: list[Node]) -> onnx.ModelProto:
    try:
        return version_converter.convert_version(model, target)
    except Exception as exc:  # the converter raises bare RuntimeErrors and asserts
        culprit = _unconvertible_node(graph, target, pending)
        if culprit is None:
            labels = ", ".join(n.label for n in pending[:5])
            raise ExportError(f"onnx's version converter cannot take the graph from opset "
                              f"{_default_opset(graph)} to {target} (nodes to adapt: "
                              f"{labels}{', ...' if len(pending) > 5 else ''}): "
                              f"{_first_line(exc)}") from exc
        node, reason = culprit
        lowest = _schema(node, node.opset or _default_opset(graph)).since_version
        raise _inexpressible(node, target, lowest,
                             f"the version converter cannot adapt it: {reason}") from exc


def _unconvertible_node(graph: Graph, target: int, pending: list[Node]):
    """The first node the converter fails on by itself, with the converter's reason."""
    source = _default_opset(graph)
    types = infer_types(graph)
    for node in pending:
        inputs = [_value_info(name, types.get(name)) for name in dict.fromkeys(node.inputs)
                  if name]
        outputs = [_value_info(name, types.get(name)) for name in node.outputs if name]
        lone = helper.make_graph([_node_proto(node, {"": source})], "lone", inputs, outputs)
        try:
            version_converter.convert_version(
                helper.make_model(lone, opset_imports=[helper.make_opsetid("", source)]),
                target)
        except Exception as exc:
            return node, _first_line(exc)
    return None


def _first_line(exc: Exception) -> str:
    """The message of an onnx error without its C++ file and assertion text."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text.rpartition("failed: ")[2] if "Assertion" in text else text


# -- the ModelProto --------------------------------------------------------------------------

def _model_proto(graph: Graph, opset: int, declare_default: bool = False) -> onnx.ModelProto:
    opsets = _opsets_used(graph, opset)
    if declare_default:  # asked for by the caller: written even when no node needs it
        opsets.setdefault("", opset)
    proto = _graph_proto(graph, opsets, top=True)
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    return helper.make_model(proto, opset_imports=imports, ir_version=_ir_version(imports))


def _opsets_used(graph: Graph, default_opset: int) -> dict[str, int]:
    """Domain -> version for every domain a node uses. The default domain is left out when
    no node uses it (the importer stands in its newest opset when a model declares only
    other domains, which would needlessly demand the newest IR version)."""
    opsets = {}
    for node in graph.all_nodes():
        if node.domain in opsets:
            continue
        version = default_opset if not node.domain else graph.opsets.get(node.domain) \
            or node.opset
        if not version:
            raise ExportError(f"node {node.label!r}: the graph declares no opset for "
                              f"domain {node.domain!r}")
        opsets[node.domain] = int(version)
    return opsets or {"": default_opset}


def _ir_version(imports) -> int:
    return max(MIN_IR_VERSION, helper.find_min_ir_version_for(imports, ignore_unknown=True))


def _graph_proto(graph: Graph, opsets: dict, *, top: bool = False) -> onnx.GraphProto:
    inferred = _interface_types(graph) if top else {}
    constants = _constant_initializers(graph) if top else set()
    inputs = [v for v in graph.inputs if v.name not in constants]
    produced = {out for node in graph.nodes for out in node.outputs if out}
    interface = set(graph.input_names) | set(graph.output_names)
    return helper.make_graph(
        nodes=[_node_proto(node, opsets) for node in graph.nodes],
        name=graph.name,
        inputs=[_value_info(v.name, v.type or inferred.get(v.name), required=top)
                for v in inputs],
        outputs=[_value_info(v.name, _fuller(v.type, inferred.get(v.name)), required=top)
                 for v in graph.outputs],
        initializer=[_tensor_proto(array, name) for name, array in graph.initializers.items()],
        value_info=[_value_info(name, value_type)
                    for name, value_type in graph.value_types.items()
                    if name in produced and name not in interface
                    and _type_proto(value_type) is not None])


def _constant_initializers(graph: Graph) -> set[str]:
    """Initializers listed as inputs only because IR < 4 demanded it: they are constants,
    and at the IR version we write, listing them would make them overridable."""
    listed = set(graph.initializers) & set(graph.input_names)
    return listed - overridable_initializers(graph, ir_version_of(graph))


def _interface_types(graph: Graph) -> dict:
    """Inferred types, for graph inputs and outputs that declare no type or rank (ONNX
    requires both on a model's interface)."""
    if all(_complete(v.type) for v in (*graph.inputs, *graph.outputs)):
        return {}
    # inference lets a declared output type win; here the declaration is what is missing
    undeclared = dataclasses.replace(graph, outputs=[Value(v.name) for v in graph.outputs])
    return infer_types(undeclared)


def _complete(value_type) -> bool:
    if isinstance(value_type, TensorType):
        return value_type.dtype is not None and value_type.shape is not None
    if isinstance(value_type, (SequenceType, OptionalType)):
        return _complete(value_type.element)
    if isinstance(value_type, MapType):  # ONNX declares a map's values without a shape
        values = value_type.value
        return value_type.key is not None and (
            values.dtype is not None if isinstance(values, TensorType) else _complete(values))
    return False


def _fuller(declared, inferred):
    return declared if _complete(declared) or not _complete(inferred) else inferred


def _node_proto(node: Node, opsets: dict) -> onnx.NodeProto:
    proto = helper.make_node(node.op_type, node.inputs, node.outputs, name=node.name or None,
                             domain=node.domain or None)
    schema = _schema_at(node.op_type, opsets.get(node.domain, 0), node.domain)
    declared = schema.attributes if schema is not None else {}
    for name in sorted(node.attributes):
        kind = declared[name].type.value if name in declared else None
        proto.attribute.append(_attribute(node, name, node.attributes[name], kind, opsets))
    return proto


# -- attributes --------------------------------------------------------------------------------

def _attribute(node: Node, name: str, value, kind: int | None, opsets: dict):
    """An AttributeProto of the schema's type ``kind`` (None: the value's own kind)."""
    kind = kind if kind is not None else _kind_of(value)
    if kind is None:
        raise ExportError(f"node {node.label!r}: attribute {name!r} holds "
                          f"{type(value).__name__}, which no ONNX attribute type can carry")
    try:
        encoded = _encode(value, kind, opsets)
        return helper.make_attribute(name, encoded, attr_type=kind)
    except (TypeError, ValueError) as exc:
        wanted = AttributeProto.AttributeType.Name(kind)
        raise ExportError(f"node {node.label!r}: attribute {name!r} = {value!r:.60} cannot "
                          f"be written as {wanted} ({exc})") from exc


_SCALAR_KINDS = (  # checked in order: bool is an int, every int is a number
    ((bool, np.bool_, numbers.Integral), AttributeProto.INT),
    (numbers.Real, AttributeProto.FLOAT),
    ((str, bytes), AttributeProto.STRING),
    (np.ndarray, AttributeProto.TENSOR),
    (Graph, AttributeProto.GRAPH),
    (onnx.TypeProto, AttributeProto.TYPE_PROTO),
)
_LIST_OF = {AttributeProto.INT: AttributeProto.INTS, AttributeProto.FLOAT: AttributeProto.FLOATS,
            AttributeProto.STRING: AttributeProto.STRINGS,
            AttributeProto.TENSOR: AttributeProto.TENSORS,
            AttributeProto.GRAPH: AttributeProto.GRAPHS,
            AttributeProto.TYPE_PROTO: AttributeProto.TYPE_PROTOS}
_ELEMENT_OF = {**{many: one for one, many in _LIST_OF.items()},
               AttributeProto.SPARSE_TENSORS: AttributeProto.SPARSE_TENSOR}


def _kind_of(value) -> int | None:
    """The attribute type a value has without a schema to ask (a custom domain's op)."""
    if isinstance(value, (list, tuple)):
        if not value:
            return AttributeProto.INTS  # nothing says otherwise; ints are the common case
        kinds = {_kind_of(v) for v in value}
        if kinds == {AttributeProto.INT, AttributeProto.FLOAT}:
            return AttributeProto.FLOATS
        return _LIST_OF.get(kinds.pop()) if len(kinds) == 1 else None
    for types, kind in _SCALAR_KINDS:
        if isinstance(value, types):
            return kind
    return None


def _encode(value, kind: int, opsets: dict):
    """``value`` as the Python/proto value make_attribute expects for ``kind``."""
    element = _ELEMENT_OF.get(kind)
    if element is None:
        return _encode_one(value, kind, opsets)
    if isinstance(value, np.ndarray) and element != AttributeProto.TENSOR:
        value = value.reshape(-1).tolist()  # INTS/FLOATS given as an array
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return [_encode_one(v, element, opsets) for v in value]


def _encode_one(value, kind: int, opsets: dict):
    if kind == AttributeProto.INT:
        return _exact_int(value)
    if kind == AttributeProto.FLOAT:
        return float(value)
    if kind == AttributeProto.STRING:
        if not isinstance(value, (str, bytes)):
            raise TypeError(f"expected text, got {type(value).__name__}")
        return value
    if kind == AttributeProto.TENSOR:
        return _tensor_proto(np.asarray(value), "")
    if kind == AttributeProto.SPARSE_TENSOR:
        return _sparse_proto(np.asarray(value))
    if kind == AttributeProto.GRAPH:
        if not isinstance(value, Graph):
            raise TypeError(f"expected a graph, got {type(value).__name__}")
        return _graph_proto(value, opsets)
    return value  # TYPE_PROTO: the importer kept onnx's own TypeProto


def _exact_int(value) -> int:
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and float(value).is_integer():
        return int(value)
    raise TypeError(f"{value!r} is not a whole number")


# -- tensors and types -------------------------------------------------------------------------

def _tensor_proto(array, name: str) -> onnx.TensorProto:
    array = np.asarray(array)
    try:
        return numpy_helper.from_array(array, name)
    except (TypeError, ValueError, KeyError) as exc:
        raise ExportError(f"tensor {name or '<attribute>'!r} of dtype {array.dtype} cannot be "
                          f"written as an ONNX tensor ({exc})") from exc


def _sparse_proto(dense: np.ndarray) -> onnx.SparseTensorProto:
    """The non-zero elements of ``dense`` and their flat positions (ONNX's 1-D index form)."""
    flat = dense.reshape(-1)
    positions = np.flatnonzero(flat).astype(np.int64)
    return helper.make_sparse_tensor(_tensor_proto(flat[positions], ""),
                                     _tensor_proto(positions, ""), list(dense.shape))


def _value_info(name: str, value_type, *, required: bool = False) -> onnx.ValueInfoProto:
    type_proto = _type_proto(value_type)
    if type_proto is None:
        if required:
            raise ExportError(f"graph input or output {name!r} has no known type "
                              f"({value_type or 'nothing declared'}); an ONNX model must "
                              f"declare the element type and rank of its interface")
        return onnx.ValueInfoProto(name=name)
    return helper.make_value_info(name, type_proto)


def _type_proto(value_type) -> onnx.TypeProto | None:
    """The TypeProto of a TensorType/SequenceType/OptionalType/MapType; None when unknown."""
    if isinstance(value_type, MapType):
        values = _type_proto(value_type.value)
        if value_type.key is None or values is None:
            return None
        return helper.make_map_type_proto(_element_type(value_type.key), values)
    if isinstance(value_type, (SequenceType, OptionalType)):
        element = _type_proto(value_type.element)
        if element is None:
            return None
        if isinstance(value_type, SequenceType):
            return helper.make_sequence_type_proto(element)
        return helper.make_optional_type_proto(element)
    if not isinstance(value_type, TensorType) or value_type.dtype is None:
        return None
    shape = None if value_type.shape is None else [_dim(d) for d in value_type.shape]
    return helper.make_tensor_type_proto(_element_type(value_type.dtype), shape)


def _element_type(dtype) -> int:
    try:
        return to_onnx_type(dtype)
    except KeyError:
        raise ExportError(f"dtype {dtype} has no ONNX element type") from None


def _dim(dim):
    if isinstance(dim, numbers.Integral):
        return int(dim)
    return dim if isinstance(dim, str) and dim else None


# -- provenance and the final check --------------------------------------------------------------

# metadata facts about the file a graph came from, not about the model: not carried over
# facts about the file the graph was read from, not about the model: the ONNX file written
# has its own (the importer's absolute source path in particular stays on this machine)
_FILE_FACTS = ("ir_version", "format_version", "source_path", "source_mtime_ns")


def _describe(model: onnx.ModelProto, graph: Graph, producer: str) -> None:
    """Producer, IR version, doc string and metadata_props (the converter resets some)."""
    model.producer_name = producer
    model.producer_version = _mixrt_version()
    model.ir_version = _ir_version(model.opset_import)
    model.doc_string = str(graph.metadata.get("doc_string", ""))
    del model.metadata_props[:]
    entries = {}
    for key, value in sorted(graph.metadata.items()):
        if key in _FILE_FACTS or key == "doc_string":
            continue
        if key in ("producer", "producer_version"):
            key = f"source_{key}"  # mixrt writes this file; who wrote the model goes here
            if key in graph.metadata:  # a .mxr already names the producer before it
                continue
        entries[key] = value if isinstance(value, str) else json.dumps(value, default=str)
    for key, text in sorted(entries.items()):
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=text))


def _mixrt_version() -> str:
    try:
        return package_metadata.version("mixrt")
    except package_metadata.PackageNotFoundError:
        return ""


def _check(model) -> None:
    """onnx's full check (strict shape inference included); a model past protobuf's limit
    is checked from its file by save_model instead."""
    if isinstance(model, onnx.ModelProto) and model.ByteSize() > MAX_PROTO_BYTES:
        return
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"the exported model fails onnx's checker: {_first_line(exc)}") \
            from exc
