"""Map types (ai.onnx.ml maps, ZipMap's sequences of maps) through the .mxr file, ONNX export
and ``mixrt check --validate``, on the committed skl2onnx models that have them.

The .mxr schema stores a map as ValueType kind Map: its key type's ONNX element code in
``key_type`` (the last field, so older files keep their layout) and its values' type in
``element``. The reader refuses a key type ONNX does not allow for maps; a reader older than
Map refuses the file through its enum check instead of misreading it.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt import cli
from mixrt.errors import GraphError, ModelLoadError
from mixrt.exporters.coverage import validate
from mixrt.exporters.onnx import export_model
from mixrt.importers.onnx import value_type
from mixrt.ops.ir.dtypes import to_numpy_dtype
from mixrt.ops.ir.types import MapType, OptionalType, SequenceType, tensor
from mixrt.runtime.format import load_mxr, mixrt_generated as fb, save_mxr
from mixrt.runtime.format.decode import DecodeError, Decoder
from mixrt.runtime.format.layout import MAP_KEY_TYPES, PREAMBLE_SIZE
from mixrt.runtime.format.schema import SCHEMA_PATH, load_schema, parse_schema
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.typecheck import type_string

from test_mxr import reseal, same_graph
from test_mxr_fuzz import field_position, header_of
from test_sklearn_exports import DATA, MANIFEST, _assert_same, _runs

MAP_MODELS = sorted(stem for stem, info in MANIFEST["made"].items()
                    if info["zipmap"] or "DictVectorizer" in info["ml_ops"])
DICT_MODEL = "dict_tree_iris"  # map(string, float) in, seq(map(int64, float)) out
SEQ_OF_MAPS = SequenceType(MapType(np.dtype(np.int64), tensor(np.float32)))


def _compiled(stem: str, tmp_path, opt_level: int = 2):
    """(session over the .onnx, session over its compiled .mxr, the .mxr path)."""
    session = mixrt.Session((DATA / f"{stem}.onnx").read_bytes(), opt_level=opt_level)
    path = tmp_path / f"{stem}.mxr"
    save_mxr(session.graph, path, opt_level=opt_level)
    return session, mixrt.Session(str(path)), path


def _assert_runs_like(session, stem: str) -> None:
    """onnxruntime's stored outputs, within test_sklearn_exports' tolerances."""
    for index, (feeds, expected) in enumerate(_runs(stem)):
        got = session.run(None, feeds)
        assert len(got) == len(expected)
        for output, (mine, theirs) in enumerate(zip(got, expected)):
            _assert_same(mine, theirs, f"{stem} run {index} output {output}")


def test_every_map_model_is_found():
    assert len(MAP_MODELS) >= 20 and DICT_MODEL in MAP_MODELS
    assert "dict_logreg_iris.nozipmap" in MAP_MODELS  # map input, tensor outputs


# -- .mxr round trip --------------------------------------------------------------------------

@pytest.mark.parametrize("stem", MAP_MODELS)
def test_compiled_map_model_runs_as_onnxruntime(stem, tmp_path):
    source, compiled, path = _compiled(stem, tmp_path)
    graph = load_mxr(path)
    assert same_graph(source.graph, graph)
    kinds = {type(v.type) for v in (*graph.inputs, *graph.outputs)}
    assert kinds & {MapType, SequenceType}
    _assert_runs_like(compiled, stem)
    # the .mxr runs exactly as the session it was compiled from
    for feeds, _ in _runs(stem):
        for mine, theirs in zip(compiled.run(None, feeds), source.run(None, feeds)):
            if isinstance(theirs, list):
                assert mine == theirs
            else:
                np.testing.assert_array_equal(mine, theirs)
    assert [a.type for a in compiled.get_inputs()] == [a.type for a in source.get_inputs()]
    assert [a.type for a in compiled.get_outputs()] == [a.type for a in source.get_outputs()]


def test_map_types_round_trip_with_every_key_type(tmp_path):
    """Every ONNX map key type, an unknown key, unknown values, maps in sequences and
    optionals, and a map whose values are sequences."""
    types = {f"k{code}": MapType(to_numpy_dtype(code), tensor(np.float32))
             for code in sorted(MAP_KEY_TYPES)}
    types.update(unknown_key=MapType(None, tensor(np.float64)),
                 unknown_values=MapType(np.dtype(np.int64), None),
                 strings=MapType(np.dtype(object), tensor(object)),
                 nested=MapType(np.dtype(np.int32), SequenceType(tensor(np.float32, (2,)))),
                 optional=OptionalType(SequenceType(MapType(np.dtype(object),
                                                            tensor(np.int64)))),
                 seq=SEQ_OF_MAPS)
    graph = Graph(name="maps", inputs=[Value(n, t) for n, t in types.items()],
                  outputs=[Value(f"{n}_out", t) for n, t in types.items()],
                  nodes=[Node("Identity", [n], [f"{n}_out"], name=n) for n in types],
                  opsets={"": 21})
    graph.value_types = {f"{n}_out": t for n, t in types.items()}
    path = tmp_path / "maps.mxr"
    save_mxr(graph, path)
    loaded = load_mxr(path)
    assert [v.type for v in loaded.inputs] == list(types.values())
    assert loaded.value_types == graph.value_types


def test_writer_refuses_a_key_type_onnx_maps_do_not_have(tmp_path):
    graph = Graph(name="g", inputs=[Value("m", MapType(np.dtype(np.float32),
                                                       tensor(np.float32)))],
                  outputs=[Value("y")], nodes=[Node("Identity", ["m"], ["y"])],
                  opsets={"": 21})
    with pytest.raises(GraphError, match=r"'m'.*map\(float32,float32\).*integers or strings"):
        save_mxr(graph, tmp_path / "bad.mxr")
    assert not (tmp_path / "bad.mxr").exists()


def test_cli_compiles_and_runs_map_models(tmp_path, capsys):
    out = tmp_path / "dict.mxr"
    assert cli.main(["compile", str(DATA / f"{DICT_MODEL}.onnx"), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "no memory plan stored: map input(s) input (map(string,float32))" in printed
    _assert_runs_like(mixrt.Session(str(out)), DICT_MODEL)

    rows, zipmap = tmp_path / "x.npy", tmp_path / "tree.mxr"
    feeds, expected = _runs("tree_iris_names")[0]
    np.save(rows, feeds["X"])
    assert cli.main(["compile", str(DATA / "tree_iris_names.onnx"), "-o", str(zipmap),
                     "--input", f"X={rows}"]) == 0
    assert "memory plan: greedy" in capsys.readouterr().out
    compiled = mixrt.Session(str(zipmap))
    assert len(compiled.graph.plans) == 1  # planned for the rows given
    _assert_runs_like(compiled, "tree_iris_names")  # string labels: map(string, float)


# -- hostile and older readers ------------------------------------------------------------------

def _map_type_position(data: bytes, field: str) -> int:
    """File position of a field of the first input's ValueType (a map)."""
    _, model = header_of(data)
    value_type = model.Graph().Inputs(0).Type()
    assert value_type.Kind() == fb.TypeKind.Map
    return PREAMBLE_SIZE + field_position(value_type, "ValueType", field)


@pytest.fixture(scope="module")
def dict_mxr(tmp_path_factory) -> bytes:
    tmp = tmp_path_factory.mktemp("maps")
    return _compiled(DICT_MODEL, tmp)[2].read_bytes()


@pytest.mark.parametrize("code", [1, 9, 10, 11, 16, 99, -1, 2**31 - 1])
def test_reader_refuses_a_key_type_onnx_maps_do_not_have(dict_mxr, code):
    damaged = bytearray(dict_mxr)
    position = _map_type_position(dict_mxr, "key_type")
    assert struct.unpack_from("<i", damaged, position)[0] == TensorProto.STRING
    struct.pack_into("<i", damaged, position, code)
    with pytest.raises(ModelLoadError, match=rf"map with key type {code}; ONNX map keys"):
        load_mxr(bytes(reseal(damaged)))


@pytest.mark.parametrize("code", sorted(MAP_KEY_TYPES - {TensorProto.STRING}))
def test_reader_takes_every_onnx_map_key_type(dict_mxr, code):
    damaged = bytearray(dict_mxr)
    struct.pack_into("<i", damaged, _map_type_position(dict_mxr, "key_type"), code)
    graph = load_mxr(bytes(reseal(damaged)))
    assert graph.inputs[0].type.key == onnx.helper.tensor_dtype_to_np_dtype(code)


def test_reader_refuses_a_key_type_on_a_type_that_is_not_a_map(dict_mxr):
    damaged = bytearray(dict_mxr)
    damaged[_map_type_position(dict_mxr, "kind")] = fb.TypeKind.Sequence
    with pytest.raises(ModelLoadError, match="not a map has key type 8"):
        load_mxr(bytes(reseal(damaged)))


def test_resealed_flips_of_a_map_file_end_in_model_load_error_or_a_valid_graph(dict_mxr):
    """Every header byte flipped and resealed: a typed refusal or a graph that validates,
    never another exception; every flip of the key type's bytes is refused (no other
    integer code is a map key type one bit away from string's 8)."""
    start = PREAMBLE_SIZE
    end = start + struct.unpack_from("<Q", dict_mxr, 8)[0]
    key_type = _map_type_position(dict_mxr, "key_type")
    refused = set()
    for position in range(start, end):
        damaged = bytearray(dict_mxr)
        damaged[position] ^= 0xFF if position % 2 else 0x01
        try:
            load_mxr(bytes(reseal(damaged)))
        except ModelLoadError:
            refused.add(position)
    assert set(range(key_type, key_type + 4)) <= refused
    assert len(refused) > (end - start) // 3  # most of this header is attribute data


def _older_schema() -> str:
    """mixrt.fbs as it was before maps: no Map kind, no key_type field."""
    text = SCHEMA_PATH.read_text(encoding="utf-8")
    older = re.sub(r"\n\s*key_type: int;[^\n]*", "", text.replace("Optional, Map }",
                                                                  "Optional }"))
    assert "Map" not in re.sub(r"//[^\n]*", "", older).replace("MapType", "") \
        and older.count("\n") < text.count("\n")
    return older


def test_an_older_reader_refuses_a_map_file_and_reads_the_rest(dict_mxr, tmp_path):
    older = Decoder(parse_schema(_older_schema()))
    header, _ = header_of(dict_mxr)
    with pytest.raises(DecodeError, match=r"ValueType.kind holds 4, which is not one of its "
                                          r"enum's values \[0, 1, 2, 3\]"):
        older.decode(header)
    # a file without maps is written as before: the older schema decodes all of it
    plain = _compiled("tree_iris.nozipmap", tmp_path)[2].read_bytes()
    header, _ = header_of(plain)
    assert older.decode(header)["graph"]["outputs"]
    current = Decoder(load_schema()).decode(header)
    assert all(v["type"]["key_type"] == 0 for v in current["graph"]["value_types"]
               if v["type"] is not None)


# -- ONNX export ----------------------------------------------------------------------------------

def _exported_runs_like_onnxruntime(model: onnx.ModelProto, stem: str) -> None:
    onnx.checker.check_model(model, full_check=True)
    assert {o.domain for o in model.opset_import} >= {"ai.onnx.ml"}
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for index, (feeds, expected) in enumerate(_runs(stem)):
        got = session.run(names, feeds)
        for output, (mine, theirs) in enumerate(zip(got, expected)):
            _assert_same(mine, theirs, f"{stem} exported, run {index} output {output}")


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("stem", MAP_MODELS)
def test_export_of_a_map_model_runs_in_onnxruntime(stem, opset):
    graph = mixrt.Session((DATA / f"{stem}.onnx").read_bytes(), opt_level=0).graph
    model = export_model(graph, opset)
    opsets = {o.domain: o.version for o in model.opset_import}
    assert opsets.get("", opset) == opset  # absent when only ai.onnx.ml nodes are left
    _exported_runs_like_onnxruntime(model, stem)
    original = onnx.load(DATA / f"{stem}.onnx")
    for mine, theirs in zip([*model.graph.input, *model.graph.output],
                            [*original.graph.input, *original.graph.output]):
        # map_type and sequence_type as skl2onnx wrote them (onnx's version converter may
        # add a scalar shape to a map's value type, which type_string does not spell)
        assert mine.type.WhichOneof("value") == theirs.type.WhichOneof("value")
        assert type_string(value_type(mine.type)) == type_string(value_type(theirs.type))


@pytest.mark.parametrize("stem", [DICT_MODEL, "tree_iris_names", "svc_rbf_cancer"])
def test_export_of_a_compiled_map_model(stem, tmp_path):
    """From the .mxr (optimized, fused ml graph) back to ONNX, with the CLI."""
    path = _compiled(stem, tmp_path)[2]
    out = tmp_path / "out.onnx"
    assert cli.main(["export", str(path), "-o", str(out), "--opset", "21"]) == 0
    _exported_runs_like_onnxruntime(onnx.load(out), stem)


# -- mixrt check --validate ---------------------------------------------------------------------

@pytest.mark.parametrize("stem", ["dict_tree_iris", "dict_logreg_iris.nozipmap"])
def test_check_validate_draws_a_dictvectorizers_map(stem, capsys):
    assert cli.main(["check", str(DATA / f"{stem}.onnx"), "--validate"]) == 0
    printed = capsys.readouterr().out
    assert "PASS" in printed and "comparison not run" not in printed
    report = validate(str(DATA / f"{stem}.onnx"))
    assert report.ok and len(report.outputs) == 2
    assert report.outputs[0].shape == [1]  # one map: one row


def test_check_validate_on_a_compiled_map_model(dict_mxr, tmp_path, capsys):
    path = tmp_path / "dict.mxr"
    path.write_bytes(dict_mxr)
    assert cli.main(["check", str(path), "--validate"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_check_validate_names_a_map_it_cannot_draw(tmp_path, capsys):
    """A CastMap's map has no vocabulary to draw keys from: a typed error, no traceback."""
    graph = helper.make_graph(
        [helper.make_node("CastMap", ["m"], ["y"], domain="ai.onnx.ml", cast_to="TO_FLOAT")],
        "castmap",
        [helper.make_value_info("m", helper.make_map_type_proto(
            TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None)))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1),
                                                    helper.make_opsetid("", 21)])
    path = tmp_path / "castmap.onnx"
    onnx.save(model, path)
    assert cli.main(["check", str(path), "--validate"]) == 1
    printed = capsys.readouterr().out
    assert re.search(r"comparison not run: InputError: input 'm' is a map "
                     r"\(map\(int64,float32\)\); random maps are drawn only for a "
                     r"DictVectorizer's input", printed), printed
    report = validate(str(path), {"m": {3: 1.5, 1: 2.0}})
    assert report.error is None and report.outputs[0].shape == [1, 2]


# -- the CLI on scikit-learn's models: unnamed batch dims, map inputs, ml-only graphs ---------------

def test_compile_of_an_unnamed_batch_dim_stores_no_plan(tmp_path, capsys):
    # skl2onnx declares X as [None, 4]: compile used to ask for --dim NAME=N, with no name
    out = tmp_path / "tree.mxr"
    assert cli.main(["compile", str(DATA / "tree_iris.onnx"), "-o", str(out)]) == 0
    assert "X[0] (unnamed)" in capsys.readouterr().out
    feeds, expected = _runs("tree_iris")[0]
    for got, want in zip(mixrt.Session(str(out)).run(None, feeds), expected):
        _assert_same(got, want, "tree_iris from the .mxr")


def test_plan_says_what_to_give_for_unnamed_dims_and_maps(capsys):
    assert cli.main(["plan", str(DATA / "tree_iris.onnx")]) == 2
    assert "no size and no name; give the input with --input X=" in capsys.readouterr().err
    assert cli.main(["plan", str(DATA / "dict_tree_iris.onnx")]) == 2
    assert "is a map, which --input (.npy arrays) cannot give" in capsys.readouterr().err


def test_export_of_an_ml_only_graph_declares_the_asked_opset(tmp_path):
    compiled, out = tmp_path / "d.mxr", tmp_path / "d17.onnx"
    assert cli.main(["compile", str(DATA / "dict_tree_iris.onnx"), "-o", str(compiled)]) == 0
    assert cli.main(["export", str(compiled), "-o", str(out), "--opset", "17"]) == 0
    model = onnx.load(out)
    assert {(o.domain, o.version) for o in model.opset_import} >= {("", 17)}
    onnx.checker.check_model(model, full_check=True)
    ort.InferenceSession(str(out))
