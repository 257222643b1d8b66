"""Hostile .mxr files: a byte-flip and truncation sweep over three reference files, headers
crafted to attack the reader, and the bounds-checked decoder on its own.

Every case must end in ModelLoadError or in a load whose Session.run gives the original
outputs: never another exception, a crash, a hang or a huge allocation.

Two sweeps per reference file:

* raw: flip every byte (every 7th in files over 64 KiB) and truncate at every KiB plus
  the boundaries of the layout. The checksums catch all of these, which is the point: it
  proves every byte of the file is covered.
* resealed: flip every header byte (every 7th..37th in larger headers, see
  ``resealed_stride``) and then recompute
  the checksums, the way a hostile file would carry valid ones. This reaches the bounds-
  checked decoder and the semantic checks behind the checksums. A resealed flip may leave
  a *different valid* model (an attribute value changed, say); such a load must still give
  a Graph that validates, and a Session over it may only fail with a MixrtError.
"""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
from onnx import TensorProto, helper

from mixrt.errors import MixrtError, ModelLoadError
from mixrt.importers.onnx import import_model
from mixrt.models.zoo import light_model
from mixrt.ops.ir.types import TensorType
from mixrt.runtime import memory
from mixrt.runtime.format import load_mxr, mixrt_generated as fb, save_mxr
from mixrt.runtime.format.decode import DecodeError, Decoder
from mixrt.runtime.format.layout import PREAMBLE_SIZE, data_offset
from mixrt.runtime.format.schema import load_schema, parse_schema
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.session import Session

from test_mxr import (assert_same_outputs, reseal, same_graph, save_load, squeezenet_file,
                      synthetic_plan)

MASKS = (0xFF, 0x01, 0x80, 0x10, 0x7F)  # rotated per position: whole-byte and single-bit


def control_flow_model():
    """A Loop whose body holds an If (two levels of subgraphs, each with initializers and an
    outer-scope read), a scan output, an Optional with a TYPE_PROTO attribute and strings."""
    f32 = TensorProto.FLOAT
    const = helper.make_tensor
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["v_in", "w"], ["then_out"])], "then", [],
        [helper.make_tensor_value_info("then_out", f32, [2])])
    else_branch = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "half"], ["else_out"])], "else", [],
        [helper.make_tensor_value_info("else_out", f32, [2])],
        initializer=[const("half", f32, [2], [0.5, 0.25])])
    body = helper.make_graph(
        [helper.make_node("Mod", ["iter", "two"], ["rem"]),
         helper.make_node("Equal", ["rem", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["v_out"], then_branch=then_branch,
                          else_branch=else_branch),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["v_out"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", f32, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", f32, [2]),
         helper.make_tensor_value_info("scan", f32, [2])],
        initializer=[const("two", TensorProto.INT64, [], [2]),
                     const("zero", TensorProto.INT64, [], [0])])
    sequence_type = helper.make_sequence_type_proto(helper.make_tensor_type_proto(f32, None))
    nodes = [
        helper.make_node("Loop", ["trips", "go", "x"], ["v_final", "scans"], body=body),
        helper.make_node("Optional", [], ["nothing"], type=sequence_type),
        helper.make_node("OptionalHasElement", ["nothing"], ["has"]),
        helper.make_node("StringNormalizer", ["words"], ["normalized"],
                         case_change_action="UPPER", stopwords=["the"]),
    ]
    graph = helper.make_graph(
        nodes, "control",
        [helper.make_tensor_value_info("x", f32, [2])],
        [helper.make_tensor_value_info("v_final", f32, [2]),
         helper.make_tensor_value_info("scans", f32, ["trips", 2]),
         helper.make_tensor_value_info("has", TensorProto.BOOL, []),
         helper.make_tensor_value_info("normalized", TensorProto.STRING, [None])],
        initializer=[const("trips", TensorProto.INT64, [], [5]),
                     const("go", TensorProto.BOOL, [], [True]),
                     const("w", f32, [2], [1.0, -2.0]),
                     const("words", TensorProto.STRING, [3], [b"the", b"cat", b"sat"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return import_model(model), {"x": np.array([1.0, 2.0], np.float32)}


def squeezenet():
    zoo = light_model("squeezenet")
    return import_model(zoo.path), zoo.inputs


def alexnet_with_plans():
    zoo = light_model("bvlc_alexnet")
    graph = import_model(zoo.path)
    graph.plans = [synthetic_plan(graph, "greedy"), synthetic_plan(graph, "inplace")]
    graph.metadata = {"source_opset": {"": 9}, "passes": ["fold"]}
    return graph, zoo.inputs


class Reference:
    def __init__(self, name: str, make, tmp: Path):
        graph, self.feeds = make()
        path = tmp / f"{name}.mxr"
        save_mxr(graph, path, opt_level=1)
        self.name, self.data = name, path.read_bytes()
        self.graph = load_mxr(self.data)
        self.outputs = Session(self.graph).run(None, self.feeds)
        self.header_length = struct.unpack_from("<Q", self.data, 8)[0]
        self.reset()

    def reset(self) -> None:
        self.loaded = self.different = self.refused = self.identical_runs = 0

    def check_raw(self, data: bytes) -> None:
        """ModelLoadError, or a load that runs exactly like the original."""
        try:
            graph = load_mxr(data)
        except ModelLoadError:
            self.refused += 1
            return
        self.loaded += 1
        assert_same_outputs(self.outputs, Session(graph).run(None, self.feeds))

    def check_resealed(self, data: bytes) -> None:
        """ModelLoadError, or a valid Graph: the original one (its run is the original's),
        or another whose Session fails, if at all, with a MixrtError."""
        try:
            graph = load_mxr(data)
        except ModelLoadError:
            self.refused += 1
            return
        self.loaded += 1
        if same_graph(self.graph, graph) and graph.plans == self.graph.plans:
            if self.identical_runs < 3:  # equal graphs run equally; spot-check it
                self.identical_runs += 1
                assert_same_outputs(self.outputs, Session(graph).run(None, self.feeds))
            return
        self.different += 1
        try:
            Session(graph)
        except MixrtError:
            pass


REFERENCES = {"squeezenet": squeezenet, "control_flow": control_flow_model,
              "alexnet_plans": alexnet_with_plans}


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fuzz")
    return {name: Reference(name, make, tmp) for name, make in REFERENCES.items()}


def flips(data: bytes, start: int, end: int, stride: int):
    for position in range(start, end, stride):
        damaged = bytearray(data)
        damaged[position] ^= MASKS[position % len(MASKS)]
        yield damaged


def resealed_stride(length: int, most: int = 1500) -> int:
    """Every byte of a small header; else the smallest prime step (so positions do not
    keep landing on the same byte of each 4-byte word) that keeps the sweep near ``most``
    cases: each resealed case decodes the whole header."""
    if length <= 4096:
        return 1
    return next((p for p in (7, 11, 13, 17, 19, 23, 29, 31) if length / p <= most), 37)


def cut_points(ref: Reference) -> list[int]:
    size = len(ref.data)
    header_end = PREAMBLE_SIZE + ref.header_length
    odd = [0, 1, 4, 23, 63, 64, 65, header_end - 1, header_end, data_offset(ref.header_length),
           data_offset(ref.header_length) + 1, size - 1]
    return sorted({p for p in [*range(0, size, 1024), *odd] if 0 <= p < size})


@pytest.mark.parametrize("name", REFERENCES)
def test_raw_flips_and_truncations(name, references):
    ref = references[name]
    ref.reset()
    stride = 7 if len(ref.data) > 64 << 10 else 1
    start, cases = time.perf_counter(), 0
    for damaged in flips(ref.data, 0, len(ref.data), stride):
        ref.check_raw(bytes(damaged))
        cases += 1
    for cut in cut_points(ref):
        ref.check_raw(ref.data[:cut])
        cases += 1
    print(f"\n{name}: {len(ref.data)} bytes, {cases} raw cases in "
          f"{time.perf_counter() - start:.1f} s; {ref.refused} refused, {ref.loaded} loaded")
    assert ref.loaded == 0  # the checksums cover every byte


@pytest.mark.parametrize("name", REFERENCES)
def test_resealed_header_flips(name, references):
    ref = references[name]
    ref.reset()
    stride = resealed_stride(ref.header_length)
    start, cases = time.perf_counter(), 0
    for damaged in flips(ref.data, PREAMBLE_SIZE, PREAMBLE_SIZE + ref.header_length, stride):
        ref.check_resealed(bytes(reseal(damaged)))
        cases += 1
    print(f"\n{name}: {ref.header_length}-byte header, {cases} resealed flips in "
          f"{time.perf_counter() - start:.1f} s; {ref.refused} refused, {ref.loaded} loaded "
          f"({ref.different} as a different valid model)")
    assert ref.refused > cases // 2  # most damage must be caught by the structural checks


# -- crafted headers (valid checksums, hostile structure) ---------------------------------

def header_of(data) -> tuple[bytes, fb.Model]:
    """The header bytes and the generated accessor over them (positions are header-relative,
    the file position is PREAMBLE_SIZE more)."""
    length = struct.unpack_from("<Q", data, 8)[0]
    header = bytes(data[PREAMBLE_SIZE:PREAMBLE_SIZE + length])
    return header, fb.Model.GetRootAs(header, 0)


def slot(table: str, field: str) -> int:
    """The vtable slot of a field, as generated code passes it to ``_tab.Offset``."""
    names = [f.name for f in load_schema().tables[table]]
    return 4 + 2 * names.index(field)


def field_position(obj, table: str, field: str) -> int:
    """Header position of a field's inline value (a scalar, or a uoffset)."""
    offset = obj._tab.Offset(slot(table, field))
    assert offset, f"{table}.{field} is absent"
    return obj._tab.Pos + offset


def vector_position(obj, table: str, field: str) -> int:
    """Header position of a vector's first element."""
    return obj._tab.Vector(obj._tab.Offset(slot(table, field)))


@pytest.fixture()
def squeezenet_bytes(tmp_path) -> bytearray:
    return squeezenet_file(tmp_path)


def test_other_format_version_is_named(squeezenet_bytes):
    struct.pack_into("<I", squeezenet_bytes, 4, 7)
    with pytest.raises(ModelLoadError, match="format version 7"):
        load_mxr(bytes(reseal(squeezenet_bytes)))


def test_string_index_out_of_range(squeezenet_bytes):
    header, model = header_of(squeezenet_bytes)
    node = model.Graph().Nodes(0)
    struct.pack_into("<I", squeezenet_bytes, PREAMBLE_SIZE + field_position(node, "Node",
                                                                            "op_type"), 10**6)
    with pytest.raises(ModelLoadError, match="string 1000000"):
        load_mxr(bytes(reseal(squeezenet_bytes)))


def test_huge_shape_claim_fails_without_allocating(squeezenet_bytes):
    header, model = header_of(squeezenet_bytes)
    tensor = model.Graph().Initializers(0)
    dims = vector_position(tensor, "Tensor", "dims")
    struct.pack_into("<q", squeezenet_bytes, PREAMBLE_SIZE + dims, 2**60)
    tracemalloc.start()
    with pytest.raises(ModelLoadError, match="bytes do not hold shape"):
        load_mxr(bytes(reseal(squeezenet_bytes)))
    assert tracemalloc.get_traced_memory()[1] < 20e6
    tracemalloc.stop()


def test_huge_vector_length_claim(squeezenet_bytes):
    header, model = header_of(squeezenet_bytes)
    node = model.Graph().Nodes(0)
    inputs = vector_position(node, "Node", "inputs")
    struct.pack_into("<I", squeezenet_bytes, PREAMBLE_SIZE + inputs - 4, 2**32 - 1)
    with pytest.raises(ModelLoadError, match="claims 4294967295 items"):
        load_mxr(bytes(reseal(squeezenet_bytes)))


def test_shared_subgraph_table_is_refused(tmp_path):
    """Two GRAPH attributes pointing at one table: harmless here, but sharing is how a small
    file would describe an exponentially large graph, so the decoder refuses any."""
    branch = Graph(name="b", outputs=[Value("c", None)], nodes=[
        Node("Constant", [], ["c"], opset=21, attributes={"value": np.ones(1, np.float32)})])
    graph = Graph(nodes=[Node("If", ["cond"], ["y"], opset=21, attributes={
        "then_branch": branch, "else_branch": Graph(name="e", outputs=[Value("c", None)])})],
        inputs=[Value("cond", None)], outputs=[Value("y", None)], opsets={"": 21})
    path = tmp_path / "if.mxr"
    save_mxr(graph, path)
    data = bytearray(path.read_bytes())
    header, model = header_of(data)
    node = model.Graph().Nodes(0)
    then, other = node.Attributes(0), node.Attributes(1)
    element = vector_position(other, "Attribute", "graphs")
    then_element = vector_position(then, "Attribute", "graphs")
    then_table = then_element + struct.unpack_from("<I", header, then_element)[0]
    assert then_table > element  # offsets point forward; the builder wrote "then" first
    struct.pack_into("<I", data, PREAMBLE_SIZE + element, then_table - element)
    with pytest.raises(ModelLoadError, match="referenced twice"):
        load_mxr(bytes(reseal(data)))


def test_deeply_nested_subgraphs(tmp_path):
    def nest(depth):
        graph = Graph(name=f"g{depth}", outputs=[Value("c", None)])
        inner = {"then_branch": nest(depth - 1), "else_branch": Graph(name="e")} if depth \
            else {}
        graph.nodes = [Node("If" if depth else "Constant", ["cond"] if depth else [], ["c"],
                            opset=21, attributes=inner or {"value": np.ones(1)})]
        return graph
    def model(depth):
        graph = nest(depth)
        graph.inputs = [Value("cond", TensorType(np.dtype(bool), ()))]
        return graph
    assert same_graph(model(8), save_load(model(8), tmp_path, "ok.mxr"))
    with pytest.raises(ModelLoadError, match="nest"):
        save_load(model(60), tmp_path, "deep.mxr")


@pytest.mark.parametrize("damage, message", [
    (lambda plan: plan.lifetimes.append(memory.TensorLife("ghost", 1, 0, 0)) or
     plan.offsets.__setitem__("ghost", 0), "not a value of the graph"),
    (lambda plan: plan.offsets.__setitem__(plan.lifetimes[0].name, plan.arena_bytes),
     "does not fit"),
    (lambda plan: plan.offsets.__setitem__(plan.lifetimes[1].name,
                                           plan.offsets[plan.lifetimes[0].name]),
     "share arena bytes|in-place"),
    (lambda plan: setattr(plan, "lifetimes", [memory.TensorLife(
        plan.lifetimes[0].name, 1, 5, 2)] + plan.lifetimes[1:]), "does not fit"),
])
def test_invalid_plans_are_refused(damage, message, tmp_path):
    graph = import_model(light_model("squeezenet").path)
    plan = synthetic_plan(graph, "naive")
    damage(plan)
    graph.plans = [plan]
    with pytest.raises(ModelLoadError, match=message):
        save_load(graph, tmp_path)


def test_unsortable_graph_is_a_load_error(tmp_path):
    graph = Graph(nodes=[Node("Relu", ["b"], ["a"], opset=21), Node("Relu", ["a"], ["b"],
                                                                   opset=21)])
    with pytest.raises(ModelLoadError, match="cycle"):
        save_load(graph, tmp_path)


# -- the checked decoder on its own --------------------------------------------------------------

TINY = """
enum Color : ubyte { Red = 0, Green, Blue }
table Item { kids: [Item]; child: Item; color: Color; values: [int]; }
root_type Item;
file_identifier "TINY";
"""


def tiny(build) -> bytes:
    builder = flatbuffers.Builder(64)
    builder.Finish(build(builder), file_identifier=b"TINY")
    return bytes(builder.Output())


def item(builder, kids=None, color=0, values=None):
    vector = None
    if kids is not None:
        builder.StartVector(4, len(kids), 4)
        for kid in reversed(kids):
            builder.PrependUOffsetTRelative(kid)
        vector = builder.EndVector()
    numbers = builder.CreateNumpyVector(np.asarray(values, "<i4")) if values else None
    builder.StartObject(4)
    if vector is not None:
        builder.PrependUOffsetTRelativeSlot(0, vector, 0)
    if numbers is not None:
        builder.PrependUOffsetTRelativeSlot(3, numbers, 0)
    builder.PrependUint8Slot(2, color, 0)
    return builder.EndObject()


def test_decoder_reads_a_good_buffer():
    decoder = Decoder(parse_schema(TINY))
    root = decoder.decode(tiny(lambda b: item(b, [item(b, color=2), item(b)], values=[7, 8])))
    assert [kid["color"] for kid in root["kids"]] == [2, 0]
    assert root["values"].tolist() == [7, 8] and root["child"] is None


def test_decoder_refuses_shared_tables():
    def build(builder):
        leaf = item(builder)
        return item(builder, [leaf, leaf])
    with pytest.raises(DecodeError, match="referenced twice"):
        Decoder(parse_schema(TINY)).decode(tiny(build))


def test_decoder_limits_depth():
    def build(builder):
        node = item(builder)
        for _ in range(40):
            node = item(builder, [node])
        return node
    with pytest.raises(DecodeError, match="nest more than 30"):
        Decoder(parse_schema(TINY), max_depth=30).decode(tiny(build))


def test_decoder_refuses_bad_enum_and_wild_offsets():
    decoder = Decoder(parse_schema(TINY))
    with pytest.raises(DecodeError, match="enum"):
        decoder.decode(tiny(lambda b: item(b, color=9)))
    good = tiny(lambda b: item(b, [item(b)]))
    for position in range(0, len(good)):
        for value in (0xFF, 0x80, 0x01):
            damaged = bytearray(good)
            damaged[position] ^= value
            try:
                decoder.decode(bytes(damaged))
            except DecodeError:
                pass
