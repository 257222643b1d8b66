import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.errors import (DeviceUnavailableError, InputError, MixrtError, ModelLoadError,
                          UnsupportedOperatorError)
from mixrt.ops.device import gpu_available, parse_device
from mixrt.runtime.support import support_table
from helpers import add_model, save

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")


def test_run_matches_numpy_and_accepts_path_bytes_and_proto(tmp_path):
    model = add_model()
    x, y = np.random.rand(2, 3).astype(np.float32), np.random.rand(2, 3).astype(np.float32)
    for source in (model, model.SerializeToString(), save(model, tmp_path / "m.onnx")):
        (z,) = mixrt.Session(source).run(None, {"x": x, "y": y})
        np.testing.assert_array_equal(z, x + y)


def test_signature_mirrors_onnxruntime():
    session = mixrt.load(add_model(shape=("batch", 3)))
    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == [
        ("x", "tensor(float)", ["batch", 3]), ("y", "tensor(float)", ["batch", 3])]
    assert [o.name for o in session.get_outputs()] == ["z"]


@pytest.mark.parametrize("feeds, message", [
    ({"x": np.zeros((2, 3), np.float32), "nope": np.zeros((2, 3), np.float32)},
     r"feed\(s\) \['nope'\] are not inputs"),
    ({"x": np.zeros((2, 3), np.float32)}, r"missing feed\(s\) for input\(s\) \['y'\]"),
    ({"x": np.zeros((2, 3), np.float64), "y": np.zeros((2, 3), np.float32)},
     r"input 'x' expects dtype float, got double"),
    ({"x": np.zeros((2, 3, 1), np.float32), "y": np.zeros((2, 3), np.float32)},
     r"input 'x' expects rank 2"),
    ({"x": np.zeros((2, 4), np.float32), "y": np.zeros((2, 3), np.float32)},
     r"input 'x' expects dimension 1 to be 3"),
])
def test_bad_feeds_name_the_input(feeds, message):
    session = mixrt.Session(add_model())
    with pytest.raises(InputError, match=message):
        session.run(None, feeds)


def test_symbolic_dims_must_agree_across_inputs():
    session = mixrt.Session(add_model(shape=("batch", 3)))
    with pytest.raises(InputError, match=r"'batch'=4 .* fixed 'batch'=2"):
        session.run(None, {"x": np.zeros((2, 3), np.float32), "y": np.zeros((4, 3), np.float32)})


def test_unknown_output_name():
    session = mixrt.Session(add_model())
    with pytest.raises(InputError, match=r"\['w'\] are not outputs"):
        session.run(["w"], {"x": np.zeros((2, 3), np.float32), "y": np.zeros((2, 3), np.float32)})


def test_unsupported_op_is_reported_at_load_with_node_and_versions():
    node = onnx.helper.make_node("Add", ["x", "y"], ["z"], name="old_add")
    model = add_model(opset=21)
    model.graph.node[0].CopyFrom(node)
    model.opset_import[0].version = 21
    mixrt.Session(model)  # supported
    missing = add_model()
    missing.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(UnsupportedOperatorError, match=r"node 'add_node'.*NoSuchOp.*opset 21"):
        mixrt.Session(missing)


def test_unimplemented_attribute_is_rejected_not_ignored():
    model = add_model()
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("surprise", 1))
    with pytest.raises(UnsupportedOperatorError, match=r"attribute\(s\) \['surprise'\]"):
        mixrt.Session(model)


def test_gpu_request_without_gpu_is_a_clear_error():
    if gpu_available():
        pytest.skip("checks the refusal on a machine without a GPU")
    with pytest.raises(DeviceUnavailableError, match="no CUDA GPU is usable"):
        mixrt.Session(add_model(), device="gpu:0")
    with pytest.raises(DeviceUnavailableError, match="'gpu:1'.*no CUDA GPU is usable"):
        mixrt.Session(add_model(), device=mixrt.gpu(1))  # a Context names its device too


def test_a_context_names_the_device_as_its_string_does():
    x = np.ones((2, 3), np.float32)
    (z,) = mixrt.Session(add_model(), device=mixrt.cpu()).run(None, {"x": x, "y": x})
    np.testing.assert_array_equal(z, 2 * x)


def test_garbage_bytes_are_a_model_load_error():
    with pytest.raises(ModelLoadError):
        mixrt.Session(b"\x08\x07definitely not a model")
    assert issubclass(ModelLoadError, MixrtError)


def test_numpy_unicode_and_bytes_feeds_become_onnx_strings():
    from onnx import TensorProto, helper
    node = helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="UPPER")
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    session = mixrt.Session(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 21)]))
    for feed in (np.array(["ab", "cd"]), np.array([b"ab", b"cd"])):
        (y,) = session.run(None, {"x": feed})
        assert y.dtype == object and list(y) == ["AB", "CD"]


@needs_gpu
def test_a_dtype_cupy_cannot_hold_is_refused_when_a_gpu_session_is_made():
    """float8 (or strings, int4, ...) cannot live in a CuPy array: the session says which
    node needs it when it is made, rather than a kernel failing inside a run."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], name="to_fp8", to=TensorProto.FLOAT8E4M3FN),
         helper.make_node("Cast", ["y"], ["z"], name="back", to=TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    with pytest.raises(UnsupportedOperatorError, match="'to_fp8'.*float8_e4m3fn.*CuPy cannot hold"):
        mixrt.Session(model, device="gpu")
    x = np.array([0.5, 1.0, 300.0, -2.0], np.float32)
    assert mixrt.Session(model).run(None, {"x": x})[0].tolist() == [0.5, 1.0, 288.0, -2.0]
    rows = support_table(mixrt.Session(model).graph, parse_device("gpu"))
    assert [row.node for row in rows if not row.supported] == ["to_fp8", "back"]


@needs_gpu
def test_an_out_of_range_index_on_the_gpu_raises_when_the_run_ends():
    """CuPy wraps an out-of-range index around where NumPy raises; the GPU run checks its
    indices on the device and reads the verdicts back once, when it ends."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "i"], ["g"], name="lookup"),
         helper.make_node("GatherElements", ["data", "j"], ["e"], name="pick", axis=1)], "g",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [3, 4]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("j", TensorProto.INT64, [3, 1])],
        [helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("e", TensorProto.FLOAT, [3, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    good = {"data": data, "i": np.array([2, -3]), "j": np.array([[3], [0], [-4]])}
    cpu, gpu = mixrt.Session(model), mixrt.Session(model, device="gpu")
    for _ in range(3):  # the discovery run, then planned runs
        want = cpu.run(None, good)
        for got, expected in zip(gpu.run(None, good), want):
            np.testing.assert_array_equal(got, expected)
    for name, bad, node in [("i", np.array([0, 3]), "lookup"),
                            ("i", np.array([-4, 0]), "lookup"),
                            ("j", np.array([[4], [0], [0]]), "pick")]:
        feeds = dict(good, **{name: bad})
        with pytest.raises(MixrtError):
            cpu.run(None, feeds)
        with pytest.raises(MixrtError, match=rf"node '{node}'.*index within \[-\d, \d\)"):
            gpu.run(None, feeds)
        # and the session goes on serving good runs
        np.testing.assert_array_equal(gpu.run(None, good)[0], want[0])


def test_the_first_answer_has_the_bits_of_every_later_one():
    # a signature's first run discovers its shapes with the kernels called without out=
    # buffers, where some take other paths (LayerNormalization's compiled rows, the packed
    # products); the first answer still comes from a planned run
    rng = np.random.default_rng(3)
    scale, bias = rng.standard_normal(768).astype(np.float32), rng.standard_normal(768)
    weight = rng.standard_normal((768, 768)).astype(np.float32) * 0.05
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 768])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(scale, "s"),
         onnx.numpy_helper.from_array(bias.astype(np.float32), "b"),
         onnx.numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = mixrt.Session(model.SerializeToString())
    for rows in (128, 5):  # each shape's first run, then its planned ones
        x = (rng.standard_normal((rows, 768)) * 3 + 1).astype(np.float32)
        first = session.run(None, {"x": x})[0]
        np.testing.assert_array_equal(first, session.run(None, {"x": x})[0])
        np.testing.assert_array_equal(first, session.run(None, {"x": x})[0])
