"""mixrt's symbol JSON, without pickle: written from a Symbol's nodes, read back into them.

    {"format": "mixrt.symbol", "version": 1,
     "nodes": [{"op": "Conv", "name": "conv1", "domain": "", "opset": 21,
                "inputs": [[0, 0], [1, 0], null], "attrs": {...}, "num_outputs": 1,
                "info": {...}}, ...],
     "heads": [[5, 0]]}

Nodes are listed in dependency order and refer to earlier nodes by index. ``op`` is null for
a variable and "" for a constant. Arrays (constants, tensor attributes) are stored as dtype,
shape and base64 of their little-endian bytes. A loaded file is checked before use: every
index, every op and every array must make sense, or ModelLoadError says what is wrong where.

This module knows the nodes (``symbol_nodes.SymNode``), not the Symbol class: it reads a
symbol's ``_topological()`` nodes and ``_outputs`` and gives back the output entries a
Symbol is made of, so the class (``Symbol.tojson``, an unpickled Symbol) imports it as any
module. Reading a file, MXNet 1.x's own format included, is ``serialize.py``'s.
"""

from __future__ import annotations

import base64
import json
import math

import numpy as np

from mixrt.base.errors import GraphError, ModelLoadError
from mixrt.ops.ir.dtypes import ONNX_TYPE_NAMES, to_numpy_dtype
from mixrt.ops.ir.registry import REGISTRY
from mixrt.runtime.graph import Graph
from mixrt.sym.symbol_nodes import ATTRIBUTES, SymNode

FORMAT, VERSION = "mixrt.symbol", 1
# the whole symbol's attributes, as MXNet's JSON has them: the MXNet API version whose
# (legacy) shape semantics the symbol follows
SYMBOL_ATTRIBUTES = {"mxnet_version": ["int", 10901]}
MAX_OUTPUTS = 2 ** 16  # a node's outputs are named one by one: 10**12 of them would hang
# the dtypes a tensor can have: ONNX's, less strings (object arrays hold pointers, not data)
TENSOR_DTYPES = {to_numpy_dtype(code).name: to_numpy_dtype(code) for code in ONNX_TYPE_NAMES
                 if not to_numpy_dtype(code).hasobject}


def to_json(symbol) -> str:
    """``symbol`` (a Symbol: its nodes and outputs) as mixrt's symbol JSON."""
    nodes = symbol._topological()
    index = {id(node): i for i, node in enumerate(nodes)}
    entries = [_node_entry(node, index) for node in nodes]
    heads = [[index[id(node)], i] for node, i in symbol._outputs]
    return json.dumps({"format": FORMAT, "version": VERSION, "nodes": entries, "heads": heads,
                       "attrs": dict(SYMBOL_ATTRIBUTES)}, indent=1)


def _node_entry(node: SymNode, index: dict) -> dict:
    return {"op": node.op, "name": node.name, "domain": node.domain, "opset": node.opset,
            "inputs": [None if e is None else [index[id(e[0])], e[1]] for e in node.inputs],
            "attrs": {k: _encode(v, f"{node.name}.{k}") for k, v in node.attrs.items()},
            "num_outputs": node.num_outputs,
            "info": {k: _encode(v, f"{node.name}.{k}") for k, v in node.info.items()}}


def _encode(value, where: str):
    if isinstance(value, np.ndarray):
        if value.dtype.name not in TENSOR_DTYPES:  # object bytes are pointers, not data
            raise GraphError(f"{where}: a {value.dtype} tensor cannot be saved as symbol "
                             f"JSON; export the model to ONNX instead")
        data = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<"), copy=False)
        return {"__tensor__": {"dtype": value.dtype.name, "shape": list(value.shape),
                               "data": base64.b64encode(data.tobytes()).decode("ascii")}}
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [_encode(v, where) for v in value]
    if isinstance(value, Graph):
        raise GraphError(f"{where}: a subgraph attribute cannot be saved as symbol JSON; "
                         f"export the model to ONNX instead")
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str, dict)):
        return value
    raise GraphError(f"{where}: cannot save a {type(value).__name__} attribute as JSON")


def parsed(text, source: str):
    """The JSON document of symbol text (``source`` names it in errors). json.loads, as the
    readers of a document, recurses once per level of nesting: the caller turns a
    RecursionError into a ModelLoadError (:func:`too_deep`) around both."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise ModelLoadError(f"{source}: symbol JSON is text, got {type(text).__name__}")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"{source}: not symbol JSON: {error}") from None


def too_deep(source: str) -> ModelLoadError:
    return ModelLoadError(f"{source}: symbol JSON nested too deeply")


def is_mixrt_document(document) -> bool:
    return isinstance(document, dict) and document.get("format") == FORMAT


def outputs_of(document, source: str) -> list:
    """The output entries ``(node, index)`` of a mixrt symbol document, its nodes checked
    and rebuilt (what a Symbol is made of)."""
    if not is_mixrt_document(document):
        raise ModelLoadError(f"{source}: not a mixrt symbol file (expected \"format\": "
                             f"\"{FORMAT}\")")
    if document.get("version") != VERSION:
        raise ModelLoadError(f"{source}: symbol format version {document.get('version')!r}; "
                             f"this mixrt reads version {VERSION}")
    nodes: list[SymNode] = []
    for position, entry in enumerate(_list(document, "nodes", source)):
        nodes.append(_node(entry, nodes, f"{source}: node {position}"))
    heads = [_reference(head, nodes, f"{source}: heads") for head in
             _list(document, "heads", source)]
    if not heads:
        raise ModelLoadError(f"{source}: the symbol has no outputs (\"heads\" is empty)")
    return heads


def outputs_from_text(text, source: str) -> list:
    """:func:`outputs_of` the mixrt symbol JSON ``text``."""
    try:
        return outputs_of(parsed(text, source), source)
    except RecursionError:
        raise too_deep(source) from None


def _list(document: dict, key: str, source: str) -> list:
    value = document.get(key)
    if not isinstance(value, list):
        raise ModelLoadError(f"{source}: {key!r} must be a list")
    return value


def _node(entry, earlier: list[SymNode], where: str) -> SymNode:
    if not isinstance(entry, dict):
        raise ModelLoadError(f"{where}: expected an object")
    op, name = entry.get("op"), entry.get("name")
    if not isinstance(name, str) or not name:
        raise ModelLoadError(f"{where}: missing or empty \"name\"")
    where = f"{where} ({name!r})"
    domain, opset = entry.get("domain", ""), entry.get("opset", 0)
    num_outputs, inputs = entry.get("num_outputs", 1), entry.get("inputs", [])
    if not isinstance(domain, str) or not _whole(opset) or not _whole(num_outputs) \
            or not 1 <= num_outputs <= MAX_OUTPUTS or not isinstance(inputs, list):
        raise ModelLoadError(f"{where}: bad domain, opset, num_outputs (1..{MAX_OUTPUTS}) "
                             f"or inputs (a list)")
    if op is not None and not isinstance(op, str):
        raise ModelLoadError(f"{where}: \"op\" is an operator name, null (a variable) or "
                             f"\"\" (a constant), got {_brief(op)}")
    if op in (None, "") and (inputs or num_outputs != 1):
        raise ModelLoadError(f"{where}: a variable or constant has no inputs and 1 output")
    if op and REGISTRY.find(domain, op, opset) is None:
        raise ModelLoadError(f"{where}: operator {domain or 'ai.onnx'}::{op} at opset {opset} "
                             f"is not implemented by this mixrt")
    inputs = [None if ref is None else _reference(ref, earlier, where) for ref in inputs]
    attrs = {k: _decode(v, f"{where}.{k}") for k, v in _dict(entry, "attrs", where).items()}
    info = {k: _decode(v, f"{where}.{k}") for k, v in _dict(entry, "info", where).items()}
    if op == "" and not isinstance(info.get("value"), np.ndarray):
        raise ModelLoadError(f"{where}: a constant needs a tensor \"value\"")
    if op is None:
        _check_variable(info, where)
    _check_attributes(info.get(ATTRIBUTES, {}), where)
    return SymNode(op, name, inputs, attrs, domain, opset, num_outputs, info)


def _whole(value) -> bool:
    return type(value) is int and value >= 0


def _check_variable(info: dict, where: str) -> None:
    """What binding reads from a variable's declaration: a shape of whole numbers or nulls
    (unknown), a dtype name, multipliers (other keys are the user's own ``attr``)."""
    shape = info.get("shape")
    if shape is not None and (not isinstance(shape, list) or not all(
            d is None or _whole(d) for d in shape)):
        raise ModelLoadError(f"{where}: \"shape\" must be a list of whole numbers or nulls, "
                             f"got {_brief(shape)}")
    if shape is not None:
        info["shape"] = tuple(shape)  # as Variable() declares it
    if "dtype" in info and (not isinstance(info["dtype"], str)
                            or info["dtype"] not in TENSOR_DTYPES):
        raise ModelLoadError(f"{where}: \"dtype\" {_brief(info['dtype'])} is not one of "
                             f"{sorted(TENSOR_DTYPES)}")
    for key in ("lr_mult", "wd_mult"):
        value = info.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value < float("inf"):
            raise ModelLoadError(f"{where}: \"{key}\" must be a finite number >= 0, got "
                                 f"{_brief(value)}")


def _check_attributes(attributes, where: str) -> None:
    if not isinstance(attributes, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()):
        raise ModelLoadError(f"{where}: {ATTRIBUTES!r} must map strings to strings, got "
                             f"{_brief(attributes)}")


def _dict(entry: dict, key: str, where: str) -> dict:
    value = entry.get(key, {})
    if not isinstance(value, dict):
        raise ModelLoadError(f"{where}: {key!r} must be an object")
    return value


def _reference(ref, earlier: list[SymNode], where: str):
    if (not isinstance(ref, list) or len(ref) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in ref)):
        raise ModelLoadError(f"{where}: a reference is [node index, output index], got "
                             f"{_brief(ref)}")
    node_index, output = ref
    if not 0 <= node_index < len(earlier):
        raise ModelLoadError(f"{where}: refers to node {node_index}, but only nodes 0.."
                             f"{len(earlier) - 1} come before it")
    node = earlier[node_index]
    if not 0 <= output < node.num_outputs:
        raise ModelLoadError(f"{where}: node {node.name!r} has {node.num_outputs} outputs; "
                             f"output {output} was asked for")
    return node, output


def _decode(value, where: str):
    if isinstance(value, list):
        return [_decode(v, where) for v in value]
    if isinstance(value, dict) and "__tensor__" in value:
        return _tensor(value["__tensor__"], where)
    if isinstance(value, dict) and "__bytes__" in value:
        return _base64(value["__bytes__"], where)
    return value


def _tensor(fields, where: str) -> np.ndarray:
    if not isinstance(fields, dict) or set(fields) != {"dtype", "shape", "data"}:
        raise ModelLoadError(f"{where}: a tensor is {{\"dtype\", \"shape\", \"data\"}}")
    name, shape = fields["dtype"], fields["shape"]
    dtype = TENSOR_DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:  # np.dtype() would also take "V8", "M8[s]", field lists, ...
        raise ModelLoadError(f"{where}: tensor dtype {_brief(name)} is not one of "
                             f"{sorted(TENSOR_DTYPES)}")
    if not isinstance(shape, list) or not all(_whole(d) for d in shape):
        raise ModelLoadError(f"{where}: tensor shape must be a list of whole numbers, got "
                             f"{_brief(shape)}")
    data = _base64(fields["data"], where)
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if len(data) != expected:
        raise ModelLoadError(f"{where}: tensor of shape {shape} and dtype {dtype.name} needs "
                             f"{expected} bytes; the file has {len(data)}")
    try:
        return np.frombuffer(data, dtype.newbyteorder("<")).reshape(shape).astype(dtype)
    except ValueError as error:  # an empty tensor with a dimension past 2**63, or > 64 axes
        raise ModelLoadError(f"{where}: tensor shape {_brief(shape)} is not possible "
                             f"({error})") from None


def _brief(value) -> str:
    """A hostile file's value for a message, cut short (it may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


def _base64(text, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (TypeError, ValueError) as error:
        raise ModelLoadError(f"{where}: bad base64 data ({error})") from None
