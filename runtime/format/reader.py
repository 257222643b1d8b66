""".mxr file -> Graph, trusting nothing in the file.

Order of checks: the preamble (magic, version, its own CRC), the header's CRC, the padding,
the data section's CRCs (their list read from the root table alone), so that damage is
reported as damage before anything is interpreted; then the whole flatbuffer through the
bounds-checked decoder; and only then the meaning: every string index, element type, shape
against byte length, tensor offset against the data section, plan entry, and finally
``Graph.validate``. Any failure is a ModelLoadError naming the file and what was wrong.

Numeric tensors become read-only NumPy arrays over the memory map (or over the bytes the
caller passed), so loading allocates nothing in proportion to the weights.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np

from mixrt.base.errors import GraphError, ModelLoadError
from mixrt.ops.ir.dtypes import is_known_onnx_type, to_numpy_dtype
from mixrt.ops.ir.types import MapType, OptionalType, SequenceType, TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.memory import MemoryPlan, TensorLife, check_plan

from . import mixrt_generated as fb
from .decode import DecodeError, Decoder
from .layout import (ALIGNMENT, FORMAT_VERSION, MAP_KEY_TYPES, MAX_OPT_LEVEL, PREAMBLE_SIZE,
                     chunk_count, data_offset, unpack_preamble)
from .schema import load_schema

MAX_RANK = 64  # NumPy's limit
PARALLEL_CHECKSUM_BYTES = 32 << 20  # below this, threads cost more than they save

_CHECKSUM_FIELDS = ("data_length", "checksum_kind", "checksum_chunk", "data_checksums")
_ERRORS = (DecodeError, GraphError, ValueError, TypeError, KeyError, IndexError,
           OverflowError, struct.error, UnicodeDecodeError, RecursionError, MemoryError)


@cache
def _decoder() -> Decoder:
    return Decoder(load_schema())


def load_mxr(source) -> Graph:
    """The Graph stored in a .mxr file (a path) or in its bytes."""
    origin = "<bytes>" if isinstance(source, (bytes, bytearray, memoryview)) \
        else os.fspath(source)
    try:
        return _load(_open(source, origin))
    except ModelLoadError as error:
        raise ModelLoadError(f"{origin}: {error}") from None
    except _ERRORS as error:
        raise ModelLoadError(f"{origin}: not a valid .mxr file: {error}") from error


def _open(source, origin):
    """A read-only buffer over the whole file: a memory map, or the caller's bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return memoryview(source).cast("B").toreadonly()
    try:
        with open(origin, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < PREAMBLE_SIZE:
                raise ModelLoadError(f"the file is {size} bytes; a .mxr file has at least "
                                     f"a {PREAMBLE_SIZE}-byte preamble")
            return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as error:
        raise ModelLoadError(f"cannot read the file ({error.strerror or error})") from error


def _load(buffer) -> Graph:
    if sys.byteorder != "little":
        raise ModelLoadError(".mxr files are little-endian; this machine is big-endian")
    header, start = _header(buffer)
    # every checksum before any structure: damage is reported as damage, and cheaply
    _verify_data(buffer, start, _decoder().decode(header, _CHECKSUM_FIELDS))
    model = _decoder().decode(header)
    if model["format_version"] != FORMAT_VERSION:
        raise ModelLoadError(f"the header says format version {model['format_version']}, "
                             f"the preamble {FORMAT_VERSION}")
    strings = _strings(model)
    graph = _GraphReader(strings, buffer, start, model["data_length"]).graph(model["graph"])
    graph.metadata = _metadata(model, strings)
    plans = [_plan(p, i, graph, strings) for i, p in enumerate(model["plans"])]
    _validate(graph, bool(plans))
    graph.plans = plans
    return graph


def _header(buffer) -> tuple[bytes, int]:
    """The flatbuffer (checksum verified) and where the data section starts."""
    _, length, crc = unpack_preamble(buffer[:PREAMBLE_SIZE])
    start = data_offset(length)
    if start > len(buffer):
        raise ModelLoadError(f"the preamble promises a {length}-byte header, but the file "
                             f"ends at byte {len(buffer)} (truncated?)")
    header = bytes(buffer[PREAMBLE_SIZE:PREAMBLE_SIZE + length])
    if zlib.crc32(header) != crc:
        raise ModelLoadError(f"the header (bytes {PREAMBLE_SIZE}..{PREAMBLE_SIZE + length}) "
                             "fails its checksum; the file is damaged")
    if any(buffer[PREAMBLE_SIZE + length:start]):
        raise ModelLoadError("the padding after the header is not zero")
    return header, start


def _verify_data(buffer, start: int, model: dict) -> None:
    length, chunk, crcs = model["data_length"], model["checksum_chunk"], model["data_checksums"]
    if start + length != len(buffer):
        raise ModelLoadError(f"the header promises {length} bytes of weights from byte {start}"
                             f", but the file is {len(buffer)} bytes (truncated or extended?)")
    if chunk < 1 or len(crcs) != chunk_count(length, chunk):
        raise ModelLoadError(f"{len(crcs)} data checksums for {length} bytes in chunks of "
                             f"{chunk}; they do not match")
    with memoryview(buffer) as view:
        spans = [view[start + i:start + min(i + chunk, length)] for i in range(0, length, chunk)]
        if length >= PARALLEL_CHECKSUM_BYTES and len(spans) > 1 and (os.cpu_count() or 1) > 1:
            with ThreadPoolExecutor(min(len(spans), os.cpu_count(), 8)) as pool:
                found = list(pool.map(zlib.crc32, spans))  # zlib releases the GIL
        else:
            found = [zlib.crc32(span) for span in spans]
        for span in spans:
            span.release()
    bad = [i for i, (a, b) in enumerate(zip(found, crcs.tolist())) if a != b]
    if bad:
        first = start + bad[0] * chunk
        raise ModelLoadError(f"the weight data fails its checksum in {len(bad)} chunk(s), the "
                             f"first at bytes {first}..{first + chunk}; the file is damaged")


def _strings(model: dict) -> list[str]:
    blob, ends = model["string_blob"], model["string_ends"].astype(np.int64)
    if len(ends) and (np.any(np.diff(ends, prepend=0) < 0) or ends[-1] > len(blob)):
        raise ModelLoadError("the string table's end offsets are not increasing within its "
                             f"{len(blob)} bytes")
    raw, strings, begin = blob.tobytes(), [], 0
    try:
        for end in ends.tolist():
            strings.append(raw[begin:end].decode("utf-8"))
            begin = end
    except UnicodeDecodeError:
        raise ModelLoadError(f"string {len(strings)} of the string table is not UTF-8") \
            from None
    return strings


def _text(strings: list[str], index: int, what: str) -> str:
    if index >= len(strings):
        raise ModelLoadError(f"{what} refers to string {index}, but the string table holds "
                             f"{len(strings)}")
    return strings[index]


def _texts(strings: list[str], indices: np.ndarray, what: str) -> list[str]:
    if len(indices) and int(indices.max()) >= len(strings):
        raise ModelLoadError(f"{what} refers to string {int(indices.max())}, but the string "
                             f"table holds {len(strings)}")
    return [strings[i] for i in indices.tolist()]


class _GraphReader:
    """Turns the decoded tables into Graph objects, checking what the decoder cannot know."""

    def __init__(self, strings: list[str], buffer, start: int, length: int):
        self.strings, self.buffer, self.start, self.length = strings, buffer, start, length

    def text(self, index: int, what: str) -> str:
        return _text(self.strings, index, what)

    def texts(self, indices: np.ndarray, what: str) -> list[str]:
        return _texts(self.strings, indices, what)

    def graph(self, table: dict | None) -> Graph:
        if table is None:
            raise ModelLoadError("a graph is missing from the header")
        graph = Graph(name=self.text(table["name"], "a graph name"))
        where = f"graph {graph.name!r}"
        graph.inputs = [self.value_info(v, where) for v in table["inputs"]]
        graph.outputs = [self.value_info(v, where) for v in table["outputs"]]
        graph.initializers = _unique(((t.name, t.array) for t in
                                      (self.tensor(t, f"{where} initializer")
                                       for t in table["initializers"])), f"{where} initializer")
        graph.value_types = _unique(((v.name, v.type) for v in
                                     (self.value_info(v, where) for v in table["value_types"])),
                                    f"{where} value type")
        graph.opsets = _unique(((self.text(o["domain"], f"{where} opset"), o["version"])
                                for o in table["opsets"]), f"{where} opset domain")
        graph.nodes = [self.node(n, where) for n in table["nodes"]]
        return graph

    def value_info(self, table: dict, where: str) -> Value:
        name = self.text(table["name"], f"{where} value name")
        return Value(name, self.value_type(table["type"], f"{where} value {name!r}"))

    def value_type(self, table: dict | None, where: str):
        if table is None:
            return None
        if table["key_type"] and table["kind"] != fb.TypeKind.Map:
            raise ModelLoadError(f"{where}: a type that is not a map has key type "
                                 f"{table['key_type']}")
        if table["kind"] == fb.TypeKind.Unknown:
            return None
        if table["kind"] == fb.TypeKind.Map:
            return MapType(_map_key(table["key_type"], where),
                           self.value_type(table["element"], where))
        if table["kind"] == fb.TypeKind.Sequence:
            return SequenceType(self.value_type(table["element"], where))
        if table["kind"] == fb.TypeKind.Optional:
            return OptionalType(self.value_type(table["element"], where))
        dtype = None if table["elem_type"] == 0 else _dtype(table["elem_type"], where)
        if not table["has_shape"]:
            return TensorType(dtype, None)
        dims, kinds = table["dims"], table["dim_kinds"]
        if len(dims) != len(kinds) or len(dims) > MAX_RANK:
            raise ModelLoadError(f"{where}: {len(dims)} dims but {len(kinds)} dim kinds "
                                 f"(at most {MAX_RANK})")
        return TensorType(dtype, tuple(self.dim(int(d), int(k), where)
                                       for d, k in zip(dims.tolist(), kinds.tolist())))

    def dim(self, value: int, kind: int, where: str):
        if kind == fb.DimKind.Known:
            return value if value >= 0 else None  # a negative size means unknown, as in ONNX
        if kind == fb.DimKind.Unknown:
            return None
        if value < 0:
            raise ModelLoadError(f"{where}: symbolic dim refers to string {value}")
        return self.text(value, f"{where} symbolic dim")

    def node(self, table: dict, where: str) -> Node:
        node = Node(op_type=self.text(table["op_type"], f"{where} op type"),
                    inputs=self.texts(table["inputs"], f"{where} node inputs"),
                    outputs=self.texts(table["outputs"], f"{where} node outputs"),
                    name=self.text(table["name"], f"{where} node name"),
                    domain=self.text(table["domain"], f"{where} node domain"),
                    opset=table["opset"])
        here = f"{where} node {node.label!r}"
        node.attributes = _unique(((self.text(a["name"], f"{here} attribute name"),
                                    self.attribute(a, here)) for a in table["attributes"]),
                                  f"{here} attribute")
        return node

    def attribute(self, table: dict, where: str):
        k, kind = fb.AttrKind, table["kind"]
        where = f"{where} attribute {self.text(table['name'], where)!r}"
        if kind == k.Float:
            return table["f"]
        if kind == k.Int:
            return table["i"]
        if kind == k.String:
            return self.text(table["s"], where)
        if kind == k.Floats:
            return table["floats"].tolist()
        if kind == k.Ints:
            return table["ints"].tolist()
        if kind == k.Strings:
            return self.texts(table["strings"], where)
        if kind in (k.Tensor, k.Tensors):
            values = [self.tensor(t, where).array for t in table["tensors"]]
        elif kind in (k.Graph, k.Graphs):
            values = [self.graph(g) for g in table["graphs"]]
        elif kind in (k.TypeProto, k.TypeProtos):
            values = [_type_proto(blob["data"], where) for blob in table["type_protos"]]
        else:
            raise ModelLoadError(f"{where} has no kind")
        if kind in (k.Tensor, k.Graph, k.TypeProto):
            if len(values) != 1:
                raise ModelLoadError(f"{where} holds {len(values)} values, expected 1")
            return values[0]
        return values

    def tensor(self, table: dict, where: str) -> "_Named":
        name = self.text(table["name"], where)
        where = f"{where} {name!r}" if name else where
        dtype = _dtype(table["elem_type"], where)
        dims = table["dims"]
        if len(dims) > MAX_RANK or (dims < 0).any():
            raise ModelLoadError(f"{where} has shape {dims.tolist()}; expected at most "
                                 f"{MAX_RANK} dims, none negative")
        shape = tuple(dims.tolist())
        count = math.prod(shape)
        if dtype == object:
            return _Named(name, self.string_tensor(table["strings"], shape, count, where))
        return _Named(name, self.numeric_tensor(table, dtype, shape, count, where))

    def string_tensor(self, indices, shape, count: int, where: str) -> np.ndarray:
        if len(indices) != count:
            raise ModelLoadError(f"{where} has shape {list(shape)} but {len(indices)} strings")
        array = np.empty(count, dtype=object)
        array[:] = self.texts(indices, where)
        return array.reshape(shape)

    def numeric_tensor(self, table, dtype, shape, count: int, where: str) -> np.ndarray:
        offset, length = table["offset"], table["length"]
        if length != count * dtype.itemsize:
            raise ModelLoadError(f"{where}: {length} bytes do not hold shape {list(shape)} of "
                                 f"{dtype.name} ({count * dtype.itemsize} bytes)")
        if offset % ALIGNMENT or offset + length > self.length:
            raise ModelLoadError(f"{where}: bytes {offset}..{offset + length} are not a "
                                 f"{ALIGNMENT}-aligned range of the {self.length}-byte data "
                                 "section")
        if count == 0:
            array = np.empty(shape, dtype)
            array.flags.writeable = False
            return array
        return np.ndarray(shape, dtype, buffer=self.buffer, offset=self.start + offset)


class _Named:
    __slots__ = ("name", "array")

    def __init__(self, name: str, array: np.ndarray):
        self.name, self.array = name, array


def _unique(pairs, what: str) -> dict:
    result = {}
    for key, value in pairs:
        if key in result:
            raise ModelLoadError(f"{what} {key!r} appears twice")
        result[key] = value
    return result


def _dtype(code: int, where: str) -> np.dtype:
    if not is_known_onnx_type(code):
        raise ModelLoadError(f"{where} has element type {code}, which ONNX does not define")
    return to_numpy_dtype(code)


def _map_key(code: int, where: str) -> np.dtype | None:
    if code == 0:
        return None
    if code not in MAP_KEY_TYPES:
        raise ModelLoadError(f"{where} is a map with key type {code}; ONNX map keys are "
                             f"integers or strings (codes {sorted(MAP_KEY_TYPES)})")
    return to_numpy_dtype(code)


def _type_proto(data: np.ndarray, where: str):
    import onnx  # noqa: PLC0415  (heavy; only models with TYPE_PROTO attributes need it)
    proto = onnx.TypeProto()
    try:
        proto.ParseFromString(data.tobytes())
    except Exception as error:  # protobuf's DecodeError and friends
        raise ModelLoadError(f"{where}: not a valid onnx TypeProto ({error})") from None
    return proto


def _metadata(model: dict, strings: list[str]) -> dict:
    metadata = {}
    for entry in model["metadata"]:
        key = _text(strings, entry["key"], "a metadata key")
        value = _text(strings, entry["value"], f"metadata {key!r}")
        metadata[key] = json.loads(value) if entry["is_json"] else value
    if model["opt_level"] > MAX_OPT_LEVEL:
        raise ModelLoadError(f"opt_level {model['opt_level']} is not 0..{MAX_OPT_LEVEL}")
    metadata.update(
        producer=_text(strings, model["producer_name"], "the producer"),
        producer_version=_text(strings, model["producer_version"], "the producer version"),
        source_opset=_unique(((_text(strings, o["domain"], "a source opset"), o["version"])
                              for o in model["source_opsets"]), "source opset domain"),
        opt_level=model["opt_level"], format_version=model["format_version"])
    return metadata


def _plan(table: dict, index: int, graph: Graph, strings: list[str]) -> MemoryPlan:
    where = f"memory plan {index}"
    columns = [table[key] for key in ("names", "sizes", "firsts", "lasts", "offsets")]
    if len({len(c) for c in columns}) > 1 \
            or len(table["inplace_inputs"]) != len(table["inplace_outputs"]):
        raise ModelLoadError(f"{where}: its columns have different lengths")
    names = _texts(strings, columns[0], where)
    arena, steps = table["arena_bytes"], len(graph.nodes)
    known = _value_names(graph)
    lifetimes, offsets = [], {}
    for name, size, first, last, offset in zip(names, *(c.tolist() for c in columns[1:])):
        if name not in known:
            raise ModelLoadError(f"{where} places {name!r}, which is not a value of the graph")
        if not -1 <= first <= last <= steps or offset + size > arena:
            raise ModelLoadError(f"{where}: tensor {name!r} (steps {first}..{last}, bytes "
                                 f"{offset}..{offset + size}) does not fit {steps} steps and "
                                 f"a {arena}-byte arena")
        if name in offsets:
            raise ModelLoadError(f"{where} places {name!r} twice")
        lifetimes.append(TensorLife(name, size, first, last))
        offsets[name] = offset
    inplace = list(zip(_texts(strings, table["inplace_inputs"], where),
                       _texts(strings, table["inplace_outputs"], where)))
    signature = _tuples(json.loads(_text(strings, table["signature"], where)))
    strategy = load_schema().enums["Strategy"].names[table["strategy"]]
    plan = MemoryPlan(strategy, arena, table["naive_bytes"], table["lower_bound_bytes"],
                      offsets, lifetimes, inplace, signature, alignment=table["alignment"])
    check_plan(plan)  # GraphError: overlapping tensors, misaligned offsets, bad pairs
    return plan


def _value_names(graph: Graph) -> set[str]:
    names = set(graph.input_names) | set(graph.output_names) | set(graph.initializers)
    names.update(out for node in graph.nodes for out in node.outputs if out)
    return names


def _tuples(value):
    """JSON lists back into the tuples a plan signature is made of (it is a dict key)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        raise ModelLoadError("a plan signature holds a JSON object; expected lists and scalars")
    return value


def _validate(graph: Graph, has_plans: bool) -> None:
    order = [id(node) for node in graph.nodes]
    try:
        graph.validate()
    except GraphError as error:
        raise ModelLoadError(f"the stored graph is invalid: {error}") from None
    if has_plans and order != [id(node) for node in graph.nodes]:
        raise ModelLoadError("the nodes are not stored in schedule order, but the memory "
                             "plans' step numbers refer to that order")
