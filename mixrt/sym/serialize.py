"""Symbol <-> JSON, without pickle.

    {"format": "mixrt.symbol", "version": 1,
     "nodes": [{"op": "Conv", "name": "conv1", "domain": "", "opset": 21,
                "inputs": [[0, 0], [1, 0], null], "attrs": {...}, "num_outputs": 1,
                "info": {...}}, ...],
     "heads": [[5, 0]]}

Nodes are listed in dependency order and refer to earlier nodes by index. ``op`` is null for
a variable and "" for a constant. Arrays (constants, tensor attributes) are stored as dtype,
shape and base64 of their little-endian bytes. A loaded file is checked before use: every
index, every op and every array must make sense, or ModelLoadError says what is wrong where.
"""

from __future__ import annotations

import base64
import json

import numpy as np

from mixrt.errors import GraphError, ModelLoadError
from mixrt.ops.registry import REGISTRY
from mixrt.runtime.graph import Graph
from mixrt.sym.symbol import SymNode, Symbol

FORMAT, VERSION = "mixrt.symbol", 1


def to_json(symbol: Symbol) -> str:
    nodes = symbol._topological()
    index = {id(node): i for i, node in enumerate(nodes)}
    entries = [_node_entry(node, index) for node in nodes]
    heads = [[index[id(node)], i] for node, i in symbol._outputs]
    return json.dumps({"format": FORMAT, "version": VERSION, "nodes": entries, "heads": heads},
                      indent=1)


def _node_entry(node: SymNode, index: dict) -> dict:
    return {"op": node.op, "name": node.name, "domain": node.domain, "opset": node.opset,
            "inputs": [None if e is None else [index[id(e[0])], e[1]] for e in node.inputs],
            "attrs": {k: _encode(v, f"{node.name}.{k}") for k, v in node.attrs.items()},
            "num_outputs": node.num_outputs,
            "info": {k: _encode(v, f"{node.name}.{k}") for k, v in node.info.items()}}


def _encode(value, where: str):
    if isinstance(value, np.ndarray):
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


def from_json(text: str, source: str = "<string>") -> Symbol:
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"{source}: not symbol JSON: {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
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
    return Symbol(heads)


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
    num_outputs = entry.get("num_outputs", 1)
    if not isinstance(domain, str) or not isinstance(opset, int) or not isinstance(
            num_outputs, int) or num_outputs < 1:
        raise ModelLoadError(f"{where}: bad domain, opset or num_outputs")
    if op is not None and op != "" and REGISTRY.find(domain, op, opset) is None:
        raise ModelLoadError(f"{where}: operator {domain or 'ai.onnx'}::{op} at opset {opset} "
                             f"is not implemented by this mixrt")
    inputs = [None if ref is None else _reference(ref, earlier, where)
              for ref in entry.get("inputs", [])]
    attrs = {k: _decode(v, f"{where}.{k}") for k, v in _dict(entry, "attrs", where).items()}
    info = {k: _decode(v, f"{where}.{k}") for k, v in _dict(entry, "info", where).items()}
    if op == "" and not isinstance(info.get("value"), np.ndarray):
        raise ModelLoadError(f"{where}: a constant needs a tensor \"value\"")
    return SymNode(op, name, inputs, attrs, domain, opset, num_outputs, info)


def _dict(entry: dict, key: str, where: str) -> dict:
    value = entry.get(key, {})
    if not isinstance(value, dict):
        raise ModelLoadError(f"{where}: {key!r} must be an object")
    return value


def _reference(ref, earlier: list[SymNode], where: str):
    if (not isinstance(ref, list) or len(ref) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in ref)):
        raise ModelLoadError(f"{where}: a reference is [node index, output index], got {ref!r}")
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
    try:
        dtype = np.dtype(fields["dtype"]).newbyteorder("<")
        shape = tuple(int(d) for d in fields["shape"])
        data = _base64(fields["data"], where)
    except (KeyError, TypeError, ValueError) as error:
        raise ModelLoadError(f"{where}: malformed tensor ({error})") from None
    if dtype.hasobject or any(d < 0 for d in shape):
        raise ModelLoadError(f"{where}: tensor dtype {dtype} or shape {shape} not allowed")
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise ModelLoadError(f"{where}: tensor of shape {shape} and dtype {dtype.name} needs "
                             f"{expected} bytes; the file has {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def _base64(text, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (TypeError, ValueError) as error:
        raise ModelLoadError(f"{where}: bad base64 data ({error})") from None


def load_json(text: str) -> Symbol:
    """A Symbol from :meth:`Symbol.tojson` text."""
    return from_json(text)


def load(path) -> Symbol:
    """A Symbol from a file written by :meth:`Symbol.save`."""
    from pathlib import Path  # noqa: PLC0415
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"{path}: cannot read symbol file: {error}") from None
    return from_json(text, str(path))
