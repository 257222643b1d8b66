"""ONNX ModelProto -> Graph.

Everything read from the file is distrusted: a parse failure, an unknown element type, a
tensor whose bytes do not match its shape, or an external-data entry that points outside the
model's folder ends in a :class:`ModelLoadError` naming the tensor or node, never in a
protobuf, NumPy or OS exception.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from mixrt.base.errors import ModelLoadError
from mixrt.importers import proto
from mixrt.importers.external_data import read_external_tensor
from mixrt.importers.functions import (subgraphs_of, expand_schema_functions,
                                      inline_model_functions)
# UndeclaredDomainWarning is imported from here by callers that catch it
from mixrt.importers.onnxruntime_leniency import (  # noqa: F401
    UndeclaredDomainWarning, check_repeated_initializer, declare_undeclared_domains,
    drop_repeated_constants, lenient_node)
from mixrt.ops.ir.dtypes import is_known_onnx_type, to_numpy_dtype, to_onnx_type
from mixrt.ops.ir.registry import REGISTRY, canonical_domain
from mixrt.ops.ir.types import MapType, OptionalType, SequenceType, TensorType
from mixrt.importers.tensors import to_array
from mixrt.ops.device import aligned
from mixrt.runtime.graph import Graph, Node, Value

# Opsets of the default domain this importer understands.
MIN_OPSET, MAX_OPSET = 1, 28
MAX_MODEL_BYTES = 2**31 - 1  # protobuf's own limit


# AttributeProto.AttributeType's and TensorProto.DataLocation's values (onnx-ml.proto)
(FLOAT, INT, STRING, TENSOR, GRAPH, FLOATS, INTS, STRINGS, TENSORS, GRAPHS, SPARSE_TENSOR,
 SPARSE_TENSORS, TYPE_PROTO, TYPE_PROTOS) = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)
EXTERNAL = 1


def load_model_proto(source) -> tuple[object, Path | None]:
    """A ModelProto from a path, bytes or a ModelProto (onnx's own, or parsed by
    ``importers/proto.py`` without onnx), and the folder external data lives in."""
    if proto.is_model_proto(source):
        return source, None
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _parse(bytes(source), "<bytes>"), None
    path = Path(os.fspath(source))
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # reading a FIFO blocks, /dev/zero never ends
            raise ModelLoadError(f"{path}: not a regular file; expected an ONNX model file")
        size = info.st_size
        if size > MAX_MODEL_BYTES:
            raise ModelLoadError(f"{path}: {size} bytes is over protobuf's 2 GiB limit; "
                                 f"store large weights as external data")
        data = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read model file ({exc.strerror or exc})") from exc
    return _parse(data, str(path)), path.resolve().parent


def _source_of(source) -> dict:
    """Where the model came from, for a compiled .mxr to name (``mixrt info``): the file's
    absolute path, size and modification time. The writer hashes the file when it saves a
    .mxr (runtime/format/writer.py), so loading a model pays nothing for it."""
    if not isinstance(source, (str, os.PathLike)):
        return {}
    path = Path(os.fspath(source)).resolve()
    info = path.stat()
    return {"source_path": str(path), "source_bytes": info.st_size,
            "source_mtime_ns": info.st_mtime_ns}


def _parse(data: bytes, origin: str):
    model = proto.message("ModelProto")()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # DecodeError, RuntimeWarning-as-error, ValueError
        raise ModelLoadError(f"{origin}: not a valid ONNX model ({type(exc).__name__}: "
                             f"{exc})") from exc
    if not model.HasField("graph"):
        raise ModelLoadError(f"{origin}: the file parsed but holds no graph; "
                             f"expected an ONNX ModelProto")
    return model


def import_model(source) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into a Graph."""
    model, base_dir = load_model_proto(source)
    opsets = _opsets(model)
    try:
        _check_names(model.graph)
        graph_proto = inline_model_functions(model, owned=not proto.is_model_proto(source))
        declare_undeclared_domains(graph_proto, opsets, _first_node_of)
        expand_schema_functions(graph_proto, opsets, _has_kernel,
                                lambda node, types: _infer_proto_types(node, types, opsets))
        graph = _convert_graph(graph_proto, opsets, base_dir)
    except ModelLoadError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, UnicodeError,
            RecursionError, MemoryError) as exc:
        raise ModelLoadError(f"model graph {model.graph.name!r} is malformed: "
                             f"{type(exc).__name__}: {exc}") from exc
    graph.opsets = opsets
    # the IR version decides whether initializers listed as inputs may be overridden by feeds
    # (from IR 4 on; before, every initializer had to be listed), which constant folding needs
    graph.metadata.update(ir_version=int(model.ir_version),
                          source_opset=int(opsets.get("", 0)),
                          producer=f"{model.producer_name} {model.producer_version}".strip(),
                          **_source_of(source))
    return graph


def _check_names(graph) -> None:
    """Protobuf hands back bytes for a string field that is not valid UTF-8; every name we
    use as a dict key or pass to onnx.defs must be text."""
    for node in graph.node:
        fields = [node.op_type, node.domain, node.name, *node.input, *node.output]
        if not all(isinstance(f, str) for f in fields):
            raise ModelLoadError(f"node {node.name!r} has a name, op type or edge that is not "
                                 f"valid UTF-8 text")
        for attr in node.attribute:
            if not isinstance(attr.name, str):
                raise ModelLoadError(f"node {node.name!r} has an attribute name that is not "
                                     f"valid UTF-8 text")
        for sub in subgraphs_of(node):
            _check_names(sub)
    values = [*graph.input, *graph.output, *graph.value_info]
    names = [v.name for v in values] + [t.name for t in graph.initializer]
    if not all(isinstance(n, str) for n in names):
        raise ModelLoadError(f"graph {graph.name!r} has a value name that is not valid UTF-8")


def _opsets(model) -> dict[str, int]:
    opsets = {}
    for entry in model.opset_import:
        opsets[canonical_domain(entry.domain)] = int(entry.version)
    if "" not in opsets:
        if model.opset_import:
            opsets[""] = MAX_OPSET  # only custom domains declared: default domain unused
        else:
            raise ModelLoadError("model declares no opset_import; expected at least the "
                                 "default domain's version")
    version = opsets[""]
    if not MIN_OPSET <= version <= MAX_OPSET:
        raise ModelLoadError(f"model uses default-domain opset {version}; mixrt reads "
                             f"opsets {MIN_OPSET}..{MAX_OPSET}")
    return opsets


def _first_node_of(graph, domain: str):
    for node in graph.node:
        if canonical_domain(node.domain) == domain:
            return node
        for sub in subgraphs_of(node):
            found = _first_node_of(sub, domain)
            if found is not None:
                return found
    return None


def _convert_graph(proto, opsets: dict[str, int], base_dir: Path | None,
                   ) -> Graph:
    graph = Graph(name=proto.name or "main", opsets=opsets)
    for tensor in proto.initializer:
        _add_initializer(graph, tensor.name, tensor_to_array(tensor, base_dir))
    for sparse in proto.sparse_initializer:
        _add_initializer(graph, sparse.values.name, _sparse_to_dense(sparse, base_dir))
    graph.inputs = [Value(v.name, value_type(v.type, v.name)) for v in proto.input]
    graph.outputs = [Value(v.name, value_type(v.type, v.name)) for v in proto.output]
    for info in proto.value_info:
        graph.value_types[info.name] = value_type(info.type, info.name)
    graph.nodes = [lenient_node(_convert_node(n, opsets, base_dir)) for n in proto.node]
    drop_repeated_constants(graph)
    return graph


def _add_initializer(graph: Graph, name: str, value: np.ndarray) -> None:
    if name in graph.initializers:  # onnxruntime keeps one of equal values (a warning)
        check_repeated_initializer(graph.name, name, graph.initializers[name], value)
    graph.initializers[name] = value


def _convert_node(proto, opsets: dict[str, int], base_dir: Path | None,
                  ) -> Node:
    domain = canonical_domain(proto.domain)
    if domain not in opsets:
        raise ModelLoadError(f"node {proto.name or proto.op_type!r} uses domain "
                             f"{proto.domain!r}, which the model's opset_import does not "
                             f"declare")
    node = Node(op_type=proto.op_type, inputs=list(proto.input), outputs=list(proto.output),
                name=proto.name, domain=domain, opset=opsets[domain])
    for attribute in proto.attribute:
        if attribute.ref_attr_name:
            raise ModelLoadError(f"node {node.label!r}: attribute {attribute.name!r} refers "
                                 f"to a function attribute outside any function")
        node.attributes[attribute.name] = _attribute_value(attribute, node, opsets, base_dir)
    return node


def _attribute_value(attr, node: Node, opsets, base_dir):
    t = attr.type  # AttributeProto.AttributeType's values
    if t == FLOAT:
        return float(attr.f)
    if t == INT:
        return int(attr.i)
    if t == STRING:
        return _decode(attr.s)
    if t == TENSOR:
        return tensor_to_array(attr.t, base_dir)
    if t == GRAPH:
        return _convert_graph(attr.g, opsets, base_dir)
    if t == SPARSE_TENSOR:
        return _sparse_to_dense(attr.sparse_tensor, base_dir)
    if t == TYPE_PROTO:
        return attr.tp
    if t == FLOATS:
        return [float(v) for v in attr.floats]
    if t == INTS:
        return [int(v) for v in attr.ints]
    if t == STRINGS:
        return [_decode(v) for v in attr.strings]
    if t == TENSORS:
        return [tensor_to_array(v, base_dir) for v in attr.tensors]
    if t == GRAPHS:
        return [_convert_graph(g, opsets, base_dir) for g in attr.graphs]
    if t == TYPE_PROTOS:
        return list(attr.type_protos)
    raise ModelLoadError(f"node {node.label!r}: attribute {attr.name!r} has unknown type {t}")


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def tensor_to_array(tensor, base_dir: Path | None) -> np.ndarray:
    """A TensorProto's data as a NumPy array (external data read safely)."""
    name = tensor.name or "<unnamed>"
    if not is_known_onnx_type(tensor.data_type):
        raise ModelLoadError(f"tensor {name!r} has unknown element type {tensor.data_type}")
    if any(d < 0 for d in tensor.dims):
        raise ModelLoadError(f"tensor {name!r} has a negative dimension {list(tensor.dims)}")
    if tensor.data_location == EXTERNAL:
        return read_external_tensor(tensor, base_dir)
    try:
        array = to_array(tensor)
    except Exception as exc:
        raise ModelLoadError(f"tensor {name!r}: its data does not match its dtype "
                             f"{to_numpy_dtype(tensor.data_type).name} and shape "
                             f"{list(tensor.dims)} ({type(exc).__name__}: {exc})") from exc
    return aligned(array)  # BLAS and the compiled loops read aligned weights faster


def _sparse_to_dense(sparse, base_dir: Path | None) -> np.ndarray:
    values = tensor_to_array(sparse.values, base_dir)
    indices = tensor_to_array(sparse.indices, base_dir).astype(np.int64)
    shape = tuple(int(d) for d in sparse.dims)
    name = sparse.values.name or "<sparse>"
    dense = np.zeros(shape, dtype=values.dtype)
    try:
        if indices.ndim == 1:
            dense.reshape(-1)[indices] = values
        else:
            dense[tuple(indices.T)] = values
    except (IndexError, ValueError) as exc:
        raise ModelLoadError(f"sparse tensor {name!r}: indices do not fit shape {shape}") \
            from exc
    return dense


def value_type(type_proto, name: str = ""):
    """TensorType / SequenceType / OptionalType / MapType from a TypeProto; None when
    unset."""
    which = type_proto.WhichOneof("value")
    if which == "tensor_type" or which == "sparse_tensor_type":
        tt = getattr(type_proto, which)
        if tt.elem_type == 0:
            dtype = None
        elif not is_known_onnx_type(tt.elem_type):
            raise ModelLoadError(f"value {name!r} has unknown element type {tt.elem_type}")
        else:
            dtype = to_numpy_dtype(tt.elem_type)
        shape = None
        if tt.HasField("shape"):
            shape = tuple(_dim(d) for d in tt.shape.dim)
        return TensorType(dtype, shape)
    if which == "sequence_type":
        return SequenceType(value_type(type_proto.sequence_type.elem_type, name))
    if which == "optional_type":
        return OptionalType(value_type(type_proto.optional_type.elem_type, name))
    if which == "map_type":
        return MapType(_map_key_dtype(type_proto.map_type.key_type, name),
                       value_type(type_proto.map_type.value_type, name))
    return None


def _map_key_dtype(elem_type: int, name: str):
    """A map's key dtype: ONNX allows integer types and strings; 0 is unknown."""
    if elem_type == 0:
        return None
    if not is_known_onnx_type(elem_type):
        raise ModelLoadError(f"value {name!r} has unknown map key type {elem_type}")
    return to_numpy_dtype(elem_type)


def _dim(dim):
    """An int, a symbol's name, or None (unknown). Exporters write ``dim_value: -1`` for "any
    size"; onnxruntime reads every negative size as unknown, and so do we (0 is a real empty
    dimension)."""
    if dim.HasField("dim_value"):
        return int(dim.dim_value) if dim.dim_value >= 0 else None
    if dim.HasField("dim_param") and dim.dim_param:
        return dim.dim_param
    return None


# -- types for schema-function expansion ------------------------------------------------------

def _has_kernel(domain: str, op_type: str, opset: int) -> bool:
    return REGISTRY.find(domain, op_type, opset) is not None


def _infer_proto_types(node, input_types: list, opsets) -> list:
    """Output TypeProtos of a kernel-backed node, from its op's infer function; [] if unknown."""
    domain = canonical_domain(node.domain)
    kernel = REGISTRY.find(domain, node.op_type, opsets.get(domain, 0))
    if kernel is None or kernel.infer_fn is None:
        return []
    try:
        converted = _convert_node(node, opsets, None)
        inputs = [value_type(t) if name else None for name, t in zip(node.input, input_types)]
        outputs = kernel.infer_fn(*inputs, **converted.attributes)
        return [_type_proto(proto.sibling(node, "TypeProto"), t) for t in outputs]
    except Exception:  # inference is best effort here; the kernel decides at run time
        return []


def _type_proto(type_class, value):
    if not isinstance(value, TensorType) or value.dtype is None:
        return None
    try:
        elem = to_onnx_type(value.dtype)
    except KeyError:
        return None
    shape = None if value.shape is None else [d if isinstance(d, (int, str)) else None
                                              for d in value.shape]
    return proto.tensor_type(type_class, elem, shape)
