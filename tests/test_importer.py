"""The importer against hostile input: every case ends in a MixrtError or a correct load."""

import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixrt
from mixrt.errors import MixrtError, ModelLoadError
from mixrt.importers.onnx import import_model
from helpers import save, weighted_model

WEIGHT = np.arange(6, dtype=np.float32).reshape(2, 3)


def _seed_model_bytes() -> bytes:
    """A model with an initializer, attributes and a subgraph, so mutations hit every part."""
    from onnx import TensorProto, helper, numpy_helper
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 3])])
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"], name="mul"),
             helper.make_node("Transpose", ["m"], ["tr"], perm=[1, 0], name="tr"),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(
        nodes, "seed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("tr", TensorProto.FLOAT, [3, 2])],
        initializer=[numpy_helper.from_array(WEIGHT, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return model.SerializeToString()


SEED = _seed_model_bytes()


def _load_or_typed_error(data: bytes) -> None:
    try:
        import_model(data)
    except MixrtError:
        pass


def test_every_truncation_is_handled():
    for cut in range(len(SEED)):  # several hundred prefixes of a valid model
        _load_or_typed_error(SEED[:cut])
    assert len(SEED) > 300


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SEED) - 1), st.integers(0, 255)),
                min_size=1, max_size=8))
def test_byte_mutations_are_handled(mutations):
    data = bytearray(SEED)
    for position, value in mutations:
        data[position] = value
    _load_or_typed_error(bytes(data))


def test_random_bytes_and_splices_are_handled():
    rng = random.Random(1234)
    for _ in range(200):
        start = rng.randrange(len(SEED))
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        _load_or_typed_error(SEED[:start] + junk + SEED[start:])


def test_valid_external_data_loads(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8 + WEIGHT.tobytes())
    model = weighted_model(WEIGHT, {"location": "weights.bin", "offset": 8,
                                    "length": WEIGHT.nbytes})
    path = save(model, tmp_path / "m.onnx")
    (y,) = mixrt.Session(path).run(None, {"x": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(y, WEIGHT)


def _external_case(tmp_path, entries):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (tmp_path / "secret.bin").write_bytes(WEIGHT.tobytes())  # outside the model folder
    (model_dir / "weights.bin").write_bytes(WEIGHT.tobytes())
    os.symlink(tmp_path / "secret.bin", model_dir / "link.bin")
    return save(weighted_model(WEIGHT, entries), model_dir / "m.onnx")


HOSTILE_ENTRIES = {
    "parent": ({"location": "../secret.bin"}, "climbs out"),
    "nested_parent": ({"location": "sub/../../secret.bin"}, "climbs out"),
    "absolute": ({"location": "/etc/passwd"}, "is absolute"),
    "symlink_escape": ({"location": "link.bin"}, "outside the model's folder"),
    "missing": ({"location": "nope.bin"}, "not found"),
    "huge_offset": ({"location": "weights.bin", "offset": 2**63}, "runs past the end"),
    "huge_length": ({"location": "weights.bin", "length": 2**64 + 5}, "runs past the end"),
    "negative_offset": ({"location": "weights.bin", "offset": -1}, "negative"),
    "wrong_length": ({"location": "weights.bin", "length": 4}, "need 24"),
    "nan_offset": ({"location": "weights.bin", "offset": "12abc"}, "not an integer"),
    "no_location": ({"offset": 0}, "no 'location'"),
    "nul_byte": ({"location": "weights.bin\x00.txt"}, "NUL"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_ENTRIES))
def test_hostile_external_data_is_refused_naming_the_tensor(tmp_path, case):
    entries, message = HOSTILE_ENTRIES[case]
    path = _external_case(tmp_path, entries)
    with pytest.raises(ModelLoadError, match=rf"tensor 'w'.*{message}"):
        import_model(path)


def test_external_data_needs_a_model_folder():
    model = weighted_model(WEIGHT, {"location": "weights.bin"})
    with pytest.raises(ModelLoadError, match="not loaded from a file"):
        import_model(model.SerializeToString())


@settings(max_examples=60, deadline=None)
@given(location=st.text(min_size=1, max_size=30), offset=st.integers(-2**70, 2**70),
       length=st.integers(-2**70, 2**70))
def test_random_external_entries_never_escape(tmp_path_factory, location, offset, length):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "weights.bin").write_bytes(WEIGHT.tobytes())
    path = save(weighted_model(WEIGHT, {"location": location, "offset": offset,
                                        "length": length}), root / "m.onnx")
    try:
        graph = import_model(path)
    except ModelLoadError:
        return
    # only a location inside the folder with a correct offset and length can load
    np.testing.assert_array_equal(graph.initializers["w"], WEIGHT)


def test_opset_out_of_range_is_refused():
    model = weighted_model(WEIGHT)
    model.opset_import[0].version = 99
    with pytest.raises(ModelLoadError, match="opset 99"):
        import_model(model)


def test_model_local_function_is_inlined():
    from onnx import TensorProto, helper
    body = [helper.make_node("Mul", ["a", "a"], ["sq"]),
            helper.make_node("Add", ["sq", "a"], ["out"])]
    function = helper.make_function("custom", "SquarePlus", ["a"], ["out"], body,
                                    [helper.make_opsetid("", 21)])
    graph = helper.make_graph([helper.make_node("SquarePlus", ["x"], ["y"], domain="custom")],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, functions=[function], opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("custom", 1)])
    x = np.array([1, 2, 3], np.float32)
    (y,) = mixrt.Session(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, x * x + x)
