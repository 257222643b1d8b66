"""Graph -> .mxr file, through the flatc-generated builder functions.

Names, op types and every other string go into one string table and are referred to by
index, so a name used by a hundred nodes is stored and decoded once. Numeric tensors
(initializers and TENSOR attributes alike) go to the data section after the header, each at
a multiple of 64 bytes, so the reader can map them without copying; string tensors and
TYPE_PROTO attributes stay in the header. A TensorType's plan-time ``value`` is not stored:
inference recomputes it from the initializers.

The file is written to a temporary name and renamed into place, so a reader that has the old
file memory-mapped keeps seeing the old bytes (rewriting a mapped file in place would change
weights under a running session, or crash it with SIGBUS when the file shrinks).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib import metadata as package_metadata
from pathlib import Path

import flatbuffers
import numpy as np

from mixrt.base.errors import GraphError
from mixrt.ops.ir.dtypes import to_onnx_type
from mixrt.ops.ir.types import MapType, OptionalType, SequenceType, TensorType
from mixrt.runtime.graph import Graph, Node

from . import mixrt_generated as fb
from .layout import (ALIGNMENT, CHECKSUM_CHUNK, FORMAT_VERSION, MAGIC, MAP_KEY_TYPES,
                     MAX_OPT_LEVEL, ChunkedCrc, align, data_offset, pack_preamble)

INT64 = (-(1 << 63), (1 << 63) - 1)
# metadata keys the file stores in their own fields; load_mxr sets them from those fields
NATIVE_METADATA = ("producer", "producer_version", "source_opset", "opt_level",
                   "format_version")


def save_mxr(graph: Graph, path, *, producer: str = "mixrt", opt_level: int = 0,
             producer_version: str | None = None) -> None:
    """Write ``graph`` (its initializers, ``plans`` and ``metadata`` included) to ``path``.

    GraphError names what cannot be stored (an attribute of an unknown kind, a dtype ONNX has
    no code for, a plan without an offset for one of its tensors); OSError is the file
    system's."""
    if sys.byteorder != "little":
        raise GraphError(".mxr files are little-endian; this machine is big-endian")
    if isinstance(opt_level, bool) or not isinstance(opt_level, int) \
            or not 0 <= opt_level <= MAX_OPT_LEVEL:
        raise GraphError(f"opt_level {opt_level!r} is not an optimization level; expected "
                         f"0..{MAX_OPT_LEVEL}")
    writer = _Writer()
    header = writer.model(graph, producer, _version(producer_version), opt_level)
    _write_atomically(Path(os.fspath(path)), header, writer)


def _version(given: str | None) -> str:
    if given is not None:
        return given
    try:
        return package_metadata.version("mixrt")
    except package_metadata.PackageNotFoundError:
        return ""


def _write_atomically(path: Path, header: bytes, writer: "_Writer") -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(pack_preamble(header))
            handle.write(header)
            handle.write(bytes(data_offset(len(header)) - handle.tell()))
            for piece in writer.data_pieces():
                handle.write(piece)
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


class _Writer:
    def __init__(self):
        self.b = flatbuffers.Builder(1 << 16)
        self.strings: dict[str, int] = {}
        self.arrays: list[tuple[int, np.ndarray]] = []  # (offset in the data section, array)
        self.data_length = 0

    # -- the whole file -----------------------------------------------------------------

    def model(self, graph: Graph, producer: str, version: str, opt_level: int) -> bytes:
        b = self.b
        root = self.graph(graph, "main graph")
        plans = self.tables([self.plan(plan, i) for i, plan in enumerate(graph.plans)])
        meta = self.tables([self.key_value(k, v) for k, v in
                            _with_provenance(graph.metadata).items()
                            if k not in NATIVE_METADATA])
        opsets = self.tables([self.opset(d, v) for d, v in
                              _source_opsets(graph).items()])
        checksums = self.numbers(self.checksums(), "<u4")
        names = (self.text(producer), self.text(version))
        blob, ends = self.string_table()
        fb.ModelStart(b)
        fb.ModelAddFormatVersion(b, FORMAT_VERSION)
        fb.ModelAddProducerName(b, names[0])
        fb.ModelAddProducerVersion(b, names[1])
        fb.ModelAddSourceOpsets(b, opsets)
        fb.ModelAddOptLevel(b, opt_level)
        fb.ModelAddStringBlob(b, blob)
        fb.ModelAddStringEnds(b, ends)
        fb.ModelAddGraph(b, root)
        fb.ModelAddPlans(b, plans)
        fb.ModelAddMetadata(b, meta)
        fb.ModelAddDataLength(b, self.data_length)
        fb.ModelAddChecksumKind(b, fb.ChecksumKind.Crc32)
        fb.ModelAddChecksumChunk(b, CHECKSUM_CHUNK)
        fb.ModelAddDataChecksums(b, checksums)
        b.Finish(fb.ModelEnd(b), file_identifier=MAGIC)
        return bytes(b.Output())

    def data_pieces(self):
        """The data section as byte pieces: zero padding, then each array, in order."""
        position = 0
        for offset, array in self.arrays:
            yield bytes(offset - position)
            view = memoryview(array.reshape(-1).view(np.uint8))
            yield view
            position = offset + len(view)

    def checksums(self) -> list[int]:
        crc = ChunkedCrc(CHECKSUM_CHUNK)
        for piece in self.data_pieces():
            crc.update(piece)
        return crc.finish()

    # -- primitives ---------------------------------------------------------------------

    def text(self, value) -> int:
        if not isinstance(value, str):
            raise GraphError(f"expected a string to store, got {type(value).__name__} "
                             f"{value!r:.60}")
        index = self.strings.get(value)
        if index is None:
            index = self.strings[value] = len(self.strings)
        return index

    def texts(self, values) -> int:
        return self.numbers([self.text(v) for v in values], "<u4")

    def numbers(self, values, dtype) -> int:
        return self.b.CreateNumpyVector(np.asarray(values, dtype=dtype).reshape(-1))

    def tables(self, offsets: list[int]) -> int:
        self.b.StartVector(4, len(offsets), 4)
        for offset in reversed(offsets):
            self.b.PrependUOffsetTRelative(offset)
        return self.b.EndVector()

    def string_table(self) -> tuple[int, int]:
        try:
            encoded = [s.encode("utf-8") for s in self.strings]
        except UnicodeEncodeError as error:
            raise GraphError(f"string {error.object!r:.60} cannot be stored as UTF-8 "
                             f"({error.reason})") from None
        ends = np.cumsum([len(e) for e in encoded], dtype=np.int64)
        if len(ends) and ends[-1] >= 1 << 32:
            raise GraphError("the model's strings exceed 4 GiB")
        blob = self.b.CreateByteVector(b"".join(encoded))
        return blob, self.numbers(ends, "<u4")

    # -- graphs -------------------------------------------------------------------------

    def graph(self, graph: Graph, where: str) -> int:
        if not isinstance(graph, Graph):
            raise GraphError(f"{where}: expected a Graph, got {type(graph).__name__}")
        b = self.b
        inputs = self.tables([self.value_info(v.name, v.type) for v in graph.inputs])
        outputs = self.tables([self.value_info(v.name, v.type) for v in graph.outputs])
        nodes = self.tables([self.node(node, graph.name) for node in graph.nodes])
        initializers = self.tables([self.tensor(array, name, f"initializer {name!r}")
                                    for name, array in graph.initializers.items()])
        value_types = self.tables([self.value_info(name, t)
                                   for name, t in graph.value_types.items()])
        opsets = self.tables([self.opset(d, v) for d, v in graph.opsets.items()])
        fb.GraphStart(b)
        fb.GraphAddName(b, self.text(graph.name))
        fb.GraphAddInputs(b, inputs)
        fb.GraphAddOutputs(b, outputs)
        fb.GraphAddNodes(b, nodes)
        fb.GraphAddInitializers(b, initializers)
        fb.GraphAddValueTypes(b, value_types)
        fb.GraphAddOpsets(b, opsets)
        return fb.GraphEnd(b)

    def opset(self, domain: str, version) -> int:
        fb.OpsetIdStart(self.b)
        fb.OpsetIdAddDomain(self.b, self.text(domain))
        fb.OpsetIdAddVersion(self.b, _int64(version, f"opset of domain {domain!r}"))
        return fb.OpsetIdEnd(self.b)

    def value_info(self, name: str, value_type) -> int:
        type_offset = self.value_type(value_type, name, 0)
        fb.ValueInfoStart(self.b)
        fb.ValueInfoAddName(self.b, self.text(name))
        if type_offset:
            fb.ValueInfoAddType(self.b, type_offset)
        return fb.ValueInfoEnd(self.b)

    def value_type(self, value_type, name: str, depth: int) -> int:
        """The ValueType table's offset, 0 (absent) for an unknown type."""
        if value_type is None:
            return 0
        if depth > 32:
            raise GraphError(f"value {name!r}: its type nests more than 32 levels deep")
        if isinstance(value_type, TensorType):
            return self.tensor_type(value_type, name)
        if isinstance(value_type, (SequenceType, OptionalType)):
            element = self.value_type(value_type.element, name, depth + 1)
            kind = (fb.TypeKind.Sequence if isinstance(value_type, SequenceType)
                    else fb.TypeKind.Optional)
            fb.ValueTypeStart(self.b)
            fb.ValueTypeAddKind(self.b, kind)
            if element:
                fb.ValueTypeAddElement(self.b, element)
            return fb.ValueTypeEnd(self.b)
        if isinstance(value_type, MapType):
            return self.map_type(value_type, name, depth)
        raise GraphError(f"value {name!r} has type {value_type!r:.80}; expected a "
                         "TensorType, SequenceType, OptionalType, MapType or None")

    def map_type(self, value_type: MapType, name: str, depth: int) -> int:
        key = 0 if value_type.key is None else _onnx_code(value_type.key, f"value {name!r} key")
        if key and key not in MAP_KEY_TYPES:
            raise GraphError(f"value {name!r} has type {value_type}; ONNX map keys are "
                             "integers or strings")
        values = self.value_type(value_type.value, name, depth + 1)
        fb.ValueTypeStart(self.b)
        fb.ValueTypeAddKind(self.b, fb.TypeKind.Map)
        fb.ValueTypeAddKeyType(self.b, key)
        if values:
            fb.ValueTypeAddElement(self.b, values)
        return fb.ValueTypeEnd(self.b)

    def tensor_type(self, value_type: TensorType, name: str) -> int:
        elem = 0 if value_type.dtype is None else _onnx_code(value_type.dtype, f"value {name!r}")
        dims = kinds = 0
        if value_type.shape is not None:
            values, codes = zip(*(self.dim(d, name) for d in value_type.shape)) \
                if value_type.shape else ((), ())
            dims, kinds = self.numbers(values, "<i8"), self.numbers(codes, "u1")
        b = self.b
        fb.ValueTypeStart(b)
        fb.ValueTypeAddKind(b, fb.TypeKind.Tensor)
        fb.ValueTypeAddElemType(b, elem)
        fb.ValueTypeAddHasShape(b, value_type.shape is not None)
        if value_type.shape is not None:
            fb.ValueTypeAddDims(b, dims)
            fb.ValueTypeAddDimKinds(b, kinds)
        return fb.ValueTypeEnd(b)

    def dim(self, dim, name: str) -> tuple[int, int]:
        if dim is None:
            return 0, fb.DimKind.Unknown
        if isinstance(dim, str):
            return self.text(dim), fb.DimKind.Symbolic
        return _int64(dim, f"a dimension of value {name!r}"), fb.DimKind.Known

    # -- nodes and attributes -----------------------------------------------------------

    def node(self, node: Node, graph_name: str) -> int:
        if not isinstance(node, Node):
            raise GraphError(f"graph {graph_name!r} holds a {type(node).__name__}, "
                             "expected a Node")
        attributes = self.tables([self.attribute(node, key, value)
                                  for key, value in node.attributes.items()])
        inputs, outputs = self.texts(node.inputs), self.texts(node.outputs)
        b = self.b
        fb.NodeStart(b)
        fb.NodeAddOpType(b, self.text(node.op_type))
        fb.NodeAddDomain(b, self.text(node.domain))
        fb.NodeAddName(b, self.text(node.name))
        fb.NodeAddOpset(b, _int64(node.opset, f"node {node.label!r} opset"))
        fb.NodeAddInputs(b, inputs)
        fb.NodeAddOutputs(b, outputs)
        fb.NodeAddAttributes(b, attributes)
        return fb.NodeEnd(b)

    def attribute(self, node: Node, key: str, value) -> int:
        where = f"node {node.label!r} attribute {key!r}"
        kind = _attribute_kind(value, where)
        fields = self.attribute_fields(kind, value, where)
        b = self.b
        fb.AttributeStart(b)
        fb.AttributeAddName(b, self.text(key))
        fb.AttributeAddKind(b, kind)
        for add, field in fields:
            add(b, field)
        return fb.AttributeEnd(b)

    def attribute_fields(self, kind: int, value, where: str) -> list:
        """(generated add function, value) pairs, vectors built before the table starts."""
        k = fb.AttrKind
        if kind == k.Float:
            return [(fb.AttributeAddF, float(value))]
        if kind == k.Int:
            return [(fb.AttributeAddI, _int64(value, where))]
        if kind == k.String:
            return [(fb.AttributeAddS, self.text(value))]
        many = value if isinstance(value, (list, tuple)) else [value]
        if kind == k.Floats:
            return [(fb.AttributeAddFloats, self.numbers([float(v) for v in many], "<f8"))]
        if kind == k.Ints:
            return [(fb.AttributeAddInts, self.numbers([_int64(v, where) for v in many],
                                                       "<i8"))]
        if kind == k.Strings:
            return [(fb.AttributeAddStrings, self.texts(many))]
        if kind in (k.Tensor, k.Tensors):
            tensors = [self.tensor(v, "", f"{where} tensor {i}") for i, v in enumerate(many)]
            return [(fb.AttributeAddTensors, self.tables(tensors))]
        if kind in (k.Graph, k.Graphs):
            graphs = [self.graph(v, f"{where} graph {i}") for i, v in enumerate(many)]
            return [(fb.AttributeAddGraphs, self.tables(graphs))]
        blobs = [self.blob(v.SerializeToString()) for v in many]
        return [(fb.AttributeAddTypeProtos, self.tables(blobs))]

    def blob(self, data: bytes) -> int:
        vector = self.b.CreateByteVector(data)
        fb.BlobStart(self.b)
        fb.BlobAddData(self.b, vector)
        return fb.BlobEnd(self.b)

    # -- tensors ------------------------------------------------------------------------

    def tensor(self, array, name: str, where: str) -> int:
        if not isinstance(array, np.ndarray):
            raise GraphError(f"{where} is a {type(array).__name__}; expected a NumPy array "
                             "(move device arrays to the host before saving)")
        code = _onnx_code(array.dtype, where)
        dims = self.numbers(array.shape, "<i8")
        strings = offset = 0
        if array.dtype == object:
            if not all(isinstance(v, str) for v in array.flat):
                raise GraphError(f"{where} is an object array holding something other than "
                                 "str; only string tensors can be stored")
            strings = self.texts(array.ravel(order="C"))
        else:
            offset = self.place(array)
        b = self.b
        fb.TensorStart(b)
        fb.TensorAddName(b, self.text(name))
        fb.TensorAddElemType(b, code)
        fb.TensorAddDims(b, dims)
        if strings:
            fb.TensorAddStrings(b, strings)
        else:
            fb.TensorAddOffset(b, offset)
            fb.TensorAddLength(b, array.nbytes)
        return fb.TensorEnd(b)

    def place(self, array: np.ndarray) -> int:
        """Give ``array`` the next 64-aligned offset of the data section."""
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("="))
        array = np.ascontiguousarray(array)
        offset = align(self.data_length, ALIGNMENT)
        self.arrays.append((offset, array))
        self.data_length = offset + array.nbytes
        return offset

    # -- plans and metadata -------------------------------------------------------------

    def plan(self, plan, index: int) -> int:
        where = f"memory plan {index}"
        strategy = getattr(fb.Strategy, str(getattr(plan, "strategy", "")), None)
        if strategy is None or not isinstance(strategy, int):
            raise GraphError(f"{where} has strategy {getattr(plan, 'strategy', None)!r}; "
                             "the file knows naive, inplace, sharing and greedy")
        lives = list(plan.lifetimes)
        if set(plan.offsets) != {life.name for life in lives}:
            raise GraphError(f"{where}: its offsets and lifetimes name different tensors")
        try:
            signature = json.dumps(plan.signature, default=_plain_number)
        except (TypeError, ValueError) as error:
            raise GraphError(f"{where}: signature {plan.signature!r:.80} cannot be stored "
                             f"as JSON ({error})") from None
        columns = [self.texts([life.name for life in lives]),
                   self.numbers([life.size for life in lives], "<u8"),
                   self.numbers([life.first for life in lives], "<i8"),
                   self.numbers([life.last for life in lives], "<i8"),
                   self.numbers([plan.offsets[life.name] for life in lives], "<u8"),
                   self.texts([pair[0] for pair in plan.inplace]),
                   self.texts([pair[1] for pair in plan.inplace])]
        b = self.b
        fb.MemoryPlanStart(b)
        fb.MemoryPlanAddStrategy(b, strategy)
        fb.MemoryPlanAddArenaBytes(b, plan.arena_bytes)
        fb.MemoryPlanAddNaiveBytes(b, plan.naive_bytes)
        fb.MemoryPlanAddLowerBoundBytes(b, plan.lower_bound_bytes)
        fb.MemoryPlanAddAlignment(b, getattr(plan, "alignment", ALIGNMENT))
        fb.MemoryPlanAddSignature(b, self.text(signature))
        for add, column in zip((fb.MemoryPlanAddNames, fb.MemoryPlanAddSizes,
                                fb.MemoryPlanAddFirsts, fb.MemoryPlanAddLasts,
                                fb.MemoryPlanAddOffsets, fb.MemoryPlanAddInplaceInputs,
                                fb.MemoryPlanAddInplaceOutputs), columns):
            add(b, column)
        return fb.MemoryPlanEnd(b)

    def key_value(self, key, value) -> int:
        try:
            text, is_json = json.dumps(value, default=_plain_number), True
        except (TypeError, ValueError):
            text, is_json = str(value), False
        fb.KeyValueStart(self.b)
        fb.KeyValueAddKey(self.b, self.text(str(key)))
        fb.KeyValueAddValue(self.b, self.text(text))
        fb.KeyValueAddIsJson(self.b, is_json)
        return fb.KeyValueEnd(self.b)


def _with_provenance(metadata: dict) -> dict:
    """The metadata to store, naming the model file the graph was imported from by its name,
    size and SHA-256 (``mixrt info`` prints them). The importer notes the file's absolute
    path and modification time; the hash is taken here, at compile time rather than at
    every load, when the file is still the one that was read. The absolute path itself is
    not stored: a .mxr is shipped to other machines, where it would only leak this one's
    folders."""
    path = metadata.get("source_path")
    stored = {k: v for k, v in metadata.items() if k not in ("source_path", "source_mtime_ns")}
    if path is None:
        return stored
    stored["source_name"] = os.path.basename(path)
    if metadata.get("producer"):  # the exporter that wrote it (the .mxr's producer is mixrt)
        stored["source_producer"] = metadata["producer"]
    digest = _file_sha256(path, metadata.get("source_bytes"), metadata.get("source_mtime_ns"))
    if digest is not None:
        stored["source_sha256"] = digest
    return stored


def _file_sha256(path: str, size, mtime_ns) -> str | None:
    """The file's SHA-256, or None when it is gone or changed since it was imported."""
    try:
        info = os.stat(path)
        if (info.st_size, info.st_mtime_ns) != (size, mtime_ns):
            return None
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return None


def _plain_number(value):
    """json.dumps hook: NumPy scalars in a plan signature (dims, say) as Python numbers."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _source_opsets(graph: Graph) -> dict:
    """The opsets the model was imported at: metadata["source_opset"] when a compiler
    recorded it (a {domain: version} dict, or one default-domain version), else the
    graph's own."""
    source = graph.metadata.get("source_opset")
    if isinstance(source, dict):
        return source
    if isinstance(source, int) and not isinstance(source, bool):
        return {"": source}
    return graph.opsets


def _attribute_kind(value, where: str) -> int:
    k = fb.AttrKind
    single = _single_kind(value)
    if single:
        return single
    if isinstance(value, (list, tuple)):
        kinds = {_single_kind(v) for v in value}
        if not value or kinds == {k.Int}:
            return k.Ints
        if kinds <= {k.Int, k.Float}:
            return k.Floats
        plural = {k.String: k.Strings, k.Tensor: k.Tensors, k.Graph: k.Graphs,
                  k.TypeProto: k.TypeProtos}
        if len(kinds) == 1 and next(iter(kinds)) in plural:
            return plural[next(iter(kinds))]
    raise GraphError(f"{where} is {type(value).__name__} {value!r:.80}; a .mxr file stores "
                     "ints, floats, strings, arrays, graphs, onnx TypeProtos and lists of one "
                     "of those")


def _single_kind(value) -> int:
    k = fb.AttrKind
    if isinstance(value, (bool, int, np.integer)):
        return k.Int
    if isinstance(value, (float, np.floating)):
        return k.Float
    if isinstance(value, str):
        return k.String
    if isinstance(value, np.ndarray):
        return k.Tensor
    if isinstance(value, Graph):
        return k.Graph
    if type(value).__name__ == "TypeProto" and hasattr(value, "SerializeToString"):
        return k.TypeProto
    return 0


def _onnx_code(dtype, where: str) -> int:
    try:
        return to_onnx_type(np.dtype(dtype).newbyteorder("="))
    except (KeyError, TypeError):
        raise GraphError(f"{where} has dtype {dtype}, which has no ONNX element type") \
            from None


def _int64(value, where: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise GraphError(f"{where} is {value!r:.60}; expected an integer") from None
    if not INT64[0] <= number <= INT64[1]:
        raise GraphError(f"{where} is {number}, outside the int64 range")
    return number
