"""``mixrt.onnxruntime`` against onnxruntime itself: the same calls on the same models give
the same answers, descriptions and files, and every option either does what it says or is
named in a warning (or refused)."""

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as real
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
import mixrt.onnxruntime as ort
from mixrt.errors import InputError, ModelLoadError, OnnxruntimeOptionWarning, RunTerminated

from helpers import loop_model, save, weighted_model

ROOT = Path(__file__).resolve().parents[2]


def _mlp(symbolic: str = "batch"):
    """A two-layer MLP with a symbolic batch, a MatMul+Add+Relu that mixrt's passes fuse,
    and model metadata to describe."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu1"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [symbolic, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [symbolic, 3])],
        [w1, b1, w2], doc_string="two layers")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="tests", doc_string="an MLP", domain="mixrt.test",
                              model_version=3)
    helper.set_model_props(model, {"owner": "mixrt", "task": "tests"})
    model.ir_version = 9  # what the onnxruntime compared against reads
    return model


@pytest.fixture
def mlp_path(tmp_path):
    return save(_mlp(), tmp_path / "mlp.onnx")


def _x(rows=5):
    return np.random.default_rng(1).standard_normal((rows, 4)).astype(np.float32)


def _both(path, **kwargs):
    return (ort.InferenceSession(path, **kwargs),
            real.InferenceSession(path, providers=["CPUExecutionProvider"]))


# -- runs and descriptions ------------------------------------------------------------------

def test_runs_and_descriptions_match_onnxruntime(mlp_path):
    mine, theirs = _both(mlp_path)
    for ours, reference in ((mine.get_inputs(), theirs.get_inputs()),
                            (mine.get_outputs(), theirs.get_outputs())):
        assert [(a.name, a.type, a.shape) for a in ours] == \
               [(a.name, a.type, a.shape) for a in reference]
    x = _x()
    np.testing.assert_allclose(mine.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mine.run(["y"], {"x": x.tolist()})[0],
                               theirs.run(["y"], {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_model_metadata_matches_onnxruntime(mlp_path):
    mine, theirs = _both(mlp_path)
    ours, reference = mine.get_modelmeta(), theirs.get_modelmeta()
    for field in ("producer_name", "graph_name", "domain", "description",
                  "graph_description", "version", "custom_metadata_map"):
        assert getattr(ours, field) == getattr(reference, field), field


def test_overridable_initializers_are_not_inputs(tmp_path):
    model = weighted_model(np.arange(6, dtype=np.float32).reshape(2, 3))
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3]))
    model.ir_version = 9
    path = save(model, tmp_path / "w.onnx")
    mine, theirs = _both(path)
    assert [a.name for a in mine.get_inputs()] == [a.name for a in theirs.get_inputs()] == ["x"]
    assert [a.name for a in mine.get_overridable_initializers()] == ["w"]
    x, w = np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32)
    np.testing.assert_array_equal(mine.run(None, {"x": x, "w": w})[0],
                                  theirs.run(None, {"x": x, "w": w})[0])


def test_ort_values_and_io_binding(mlp_path):
    session, reference = _both(mlp_path)
    x = _x(3)
    expected = reference.run(None, {"x": x})[0]
    value = ort.OrtValue.ortvalue_from_numpy(x)
    assert (value.shape(), value.data_type(), value.element_type(),
            value.device_name()) == ([3, 4], "tensor(float)", 1, "cpu")
    np.testing.assert_allclose(session.run(None, {"x": value})[0], expected, rtol=1e-5)
    (out,) = session.run_with_ort_values(["y"], {"x": value})
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)

    binding = session.io_binding()
    binding.bind_cpu_input("x", x)
    target = ort.OrtValue.ortvalue_from_shape_and_type([3, 3], np.float32)
    binding.bind_ortvalue_output("y", target)
    session.run_with_iobinding(binding)
    np.testing.assert_allclose(target.numpy(), expected, rtol=1e-5)  # written in place
    assert binding.get_outputs()[0] is target

    buffer = np.zeros((3, 3), np.float32)  # the caller's own memory, by address
    binding.bind_output("y", "cpu", 0, np.float32, [3, 3], buffer.ctypes.data)
    session.run_with_iobinding(binding)
    np.testing.assert_allclose(buffer, expected, rtol=1e-5)
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], expected, rtol=1e-5)


def test_run_async_calls_back_with_the_outputs(mlp_path):
    session = ort.InferenceSession(mlp_path)
    done, got = threading.Event(), []

    def callback(outputs, data, error):
        got.append((outputs, data, error))
        done.set()
    session.run_async(None, {"x": _x()}, callback, "token")
    assert done.wait(30)
    outputs, data, error = got[0]
    assert error == "" and data == "token" and outputs[0].shape == (5, 3)

    done.clear()
    session.run_async(None, {"x": np.ones((2, 5), np.float32)}, callback, None)
    assert done.wait(30)
    assert got[1][0] is None and "InvalidArgument" in got[1][2]


# -- providers ------------------------------------------------------------------------------

def test_a_provider_this_machine_lacks_falls_back_with_a_warning(mlp_path):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has a GPU: CUDA would be chosen")
    with pytest.warns(OnnxruntimeOptionWarning, match="'CUDAExecutionProvider' is not "
                                                      "available"):
        session = ort.InferenceSession(
            mlp_path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    with pytest.warns(OnnxruntimeOptionWarning, match="OpenVINOExecutionProvider"):
        ort.InferenceSession(mlp_path, providers=["OpenVINOExecutionProvider"])


def test_an_unknown_provider_is_refused_as_onnxruntime_refuses_it(mlp_path):
    with pytest.raises(RuntimeError, match="Unknown Provider Type: NoSuchProvider"):
        ort.InferenceSession(mlp_path, providers=["NoSuchProvider"])
    session = ort.InferenceSession(mlp_path)
    with pytest.raises(RuntimeError, match="Unknown Provider Type: Other"):
        session.set_providers(["Other"])
    with pytest.raises(ValueError):
        ort.InferenceSession(mlp_path, providers=["CPUExecutionProvider"], provider_options=3)


def test_provider_options_mixrt_cannot_apply_are_named(mlp_path):
    with pytest.warns(OnnxruntimeOptionWarning, match="arena_extend_strategy"):
        session = ort.InferenceSession(
            mlp_path, providers=[("CPUExecutionProvider", {"arena_extend_strategy": 1})])
    assert session.get_provider_options() == {
        "CPUExecutionProvider": {"arena_extend_strategy": "1"}}


def test_providers_added_to_the_options_choose_the_device(mlp_path):
    options = ort.SessionOptions()
    options.add_provider("CPUExecutionProvider", {"use_arena": "0"})
    with pytest.warns(OnnxruntimeOptionWarning, match="use_arena"):
        session = ort.InferenceSession(mlp_path, options)
    assert session.get_provider_options() == {"CPUExecutionProvider": {"use_arena": "0"}}
    with pytest.warns(OnnxruntimeOptionWarning, match="InferenceSession\\(\\)'s are used"):
        ort.InferenceSession(mlp_path, options, providers=["CPUExecutionProvider"])


@pytest.mark.gpu
def test_cuda_provider_runs_on_its_device_id(mlp_path):
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("no GPU: CuPy finds none")
    session = ort.InferenceSession(
        mlp_path, providers=[("CUDAExecutionProvider", {"device_id": 0}),
                             "CPUExecutionProvider"])
    assert str(session._session.device) == "gpu:0"
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    x = _x()
    expected = real.InferenceSession(mlp_path, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    on_gpu = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    assert on_gpu.device_name() == "cuda"
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", on_gpu)
    binding.bind_output("y", "cuda", 0)
    session.run_with_iobinding(binding)
    (out,) = binding.get_outputs()
    assert out.device_name() == "cuda"
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-5)


def test_mixrt_session_honours_providers_and_refuses_options_it_would_drop(mlp_path):
    session = mixrt.Session(mlp_path, providers=["CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(InputError, match="mixrt.onnxruntime.InferenceSession"):
        mixrt.Session(mlp_path, sess_options=real.SessionOptions())
    with pytest.raises(InputError, match="give one of the two"):
        mixrt.Session(mlp_path, "cpu", providers=["CPUExecutionProvider"])


# -- session options ------------------------------------------------------------------------

def _ops(session) -> list[str]:
    return [node.op_type for node in session._session.graph.nodes]


def test_optimization_level_and_memory_reuse_choose_mixrt_settings(mlp_path):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_mem_reuse = False
    plain = ort.InferenceSession(mlp_path, options)
    assert _ops(plain) == ["MatMul", "Add", "Relu", "MatMul"]  # no pass ran
    assert plain._session.strategy == "naive"
    optimized = ort.InferenceSession(mlp_path)
    assert len(_ops(optimized)) < 4 and optimized._session.strategy == "greedy"
    x = _x()
    np.testing.assert_allclose(plain.run(None, {"x": x})[0], optimized.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def test_options_mixrt_cannot_honour_are_named_once(mlp_path, monkeypatch):
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.add_session_config_entry("session.some_unknown_switch", "1")
    options.intra_op_num_threads = 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ort.InferenceSession(mlp_path, options)
    said = " | ".join(str(w.message) for w in caught
                      if issubclass(w.category, OnnxruntimeOptionWarning))
    for name in ("ORT_PARALLEL", "PRIORITY_BASED", "session.some_unknown_switch",
                 "intra_op_num_threads=1"):
        assert name in said
    assert os.environ["MIXRT_INTRA_OP_THREADS"] == "1"  # the process's kernel threads


def test_errors_only_logging_keeps_the_warnings_quiet(mlp_path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.use_deterministic_compute = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ort.InferenceSession(mlp_path, options)


def test_optimized_model_is_written_and_runs_alike(mlp_path, tmp_path):
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "out" / "optimized.onnx")
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", "weights.bin")
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "64")
    session = ort.InferenceSession(mlp_path, options)
    assert (tmp_path / "out" / "weights.bin").is_file()
    written = onnx.load(options.optimized_model_filepath)  # external data read back
    x = _x()
    again = real.InferenceSession(written.SerializeToString(),
                                  providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(again.run(None, {"x": x})[0], session.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def test_free_dimensions_and_initializers_are_set_before_loading(mlp_path):
    options = ort.SessionOptions()
    options.add_free_dimension_override_by_name("batch", 7)
    options.add_initializer("b1", ort.OrtValue.ortvalue_from_numpy(np.zeros(8, np.float32)))
    session = ort.InferenceSession(mlp_path, options)
    assert session.get_inputs()[0].shape == [7, 4]
    reference = _mlp()
    reference.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.zeros(8, np.float32),
                                                                    "b1"))
    x = _x(7)
    expected = real.InferenceSession(reference.SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-5)
    options.add_initializer("nope", ort.OrtValue.ortvalue_from_numpy(np.zeros(1)))
    with pytest.raises(ort.InvalidArgument, match="'nope'"):
        ort.InferenceSession(mlp_path, options)


def test_external_initializers_from_arrays_and_files_in_memory(tmp_path):
    weight = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = weighted_model(weight, {"location": "kept_elsewhere.bin", "offset": 0,
                                    "length": weight.nbytes})
    path = save(model, tmp_path / "external.onnx")  # the .bin is never written
    x = np.ones((2, 3), np.float32)
    by_array = ort.SessionOptions()
    by_array.add_external_initializers(["w"], [ort.OrtValue.ortvalue_from_numpy(weight)])
    np.testing.assert_array_equal(ort.InferenceSession(path, by_array).run(None, {"x": x})[0],
                                  weight)
    by_file = ort.SessionOptions()
    by_file.add_external_initializers_from_files_in_memory(
        ["kept_elsewhere.bin"], [weight.tobytes()], [weight.nbytes])
    np.testing.assert_array_equal(ort.InferenceSession(path, by_file).run(None, {"x": x})[0],
                                  weight)


def test_session_options_from_the_model_when_asked(tmp_path, monkeypatch):
    model = _mlp()
    helper.set_model_props(model, {"ort_config": json.dumps(
        {"session_options": {"graph_optimization_level": 0, "enable_profiling": 1}})})
    path = save(model, tmp_path / "configured.onnx")
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    monkeypatch.chdir(tmp_path)
    session = ort.InferenceSession(path)
    assert session.get_session_options().enable_profiling is True
    assert _ops(session) == ["MatMul", "Add", "Relu", "MatMul"]
    os.remove(session.end_profiling())


def test_custom_op_libraries_and_the_ort_format_are_refused(mlp_path):
    options = ort.SessionOptions()
    with pytest.raises(ort.NotImplemented, match="custom-op library"):
        options.register_custom_ops_library("libcustom.so")
    options.add_session_config_entry("session.load_model_format", "ORT")
    with pytest.raises(ort.NotImplemented, match="ORT format"):
        ort.InferenceSession(mlp_path, options)


# -- profiling ------------------------------------------------------------------------------

def test_end_profiling_writes_onnxruntime_s_trace_layout(mlp_path, tmp_path):
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "trace_")
    session = ort.InferenceSession(mlp_path, options)
    session.run(None, {"x": _x()})
    path = session.end_profiling()
    assert Path(path).name.startswith("trace_")
    lines = Path(path).read_text().splitlines()
    assert lines[0] == "[" and lines[-1] == "]"
    events = json.loads(Path(path).read_text())
    assert events and all(e["ph"] == "X" and {"pid", "tid", "dur", "ts", "name", "args"}
                          <= set(e) for e in events)
    assert any(e["cat"] == "Node" for e in events)
    assert session.get_profiling_start_time_ns() <= time.time_ns()


# -- run options and errors -----------------------------------------------------------------

def test_terminate_ends_a_run_as_a_fail_that_is_a_run_terminated(tmp_path):
    path = save(loop_model(), tmp_path / "loop.onnx")
    session = ort.InferenceSession(path)
    options = ort.RunOptions()
    feeds = {"trips": np.array(10**9, np.int64), "x": np.zeros(4, np.float32)}
    threading.Timer(0.3, lambda: setattr(options, "terminate", True)).start()
    with pytest.raises(ort.Fail) as ended:
        session.run(None, feeds, options)
    assert isinstance(ended.value, RunTerminated)
    options.terminate = False
    small = {"trips": np.array(3, np.int64), "x": np.zeros(4, np.float32)}
    np.testing.assert_array_equal(session.run(None, small, options)[0], np.full(4, 3.0))


def test_errors_are_onnxruntime_s_classes_and_mixrt_s(tmp_path, mlp_path):
    with pytest.raises(ort.NoSuchFile) as missing:
        ort.InferenceSession(tmp_path / "absent.onnx")
    assert isinstance(missing.value, (FileNotFoundError, ModelLoadError))
    with pytest.raises(ort.InvalidProtobuf) as damaged:
        ort.InferenceSession(b"\x08\x07not a model at all")
    assert isinstance(damaged.value, ModelLoadError)
    session = ort.InferenceSession(mlp_path)
    with pytest.raises(ValueError, match=r"Required inputs \(\['x'\]\) are missing"):
        session.run(None, {})
    with pytest.raises(ort.InvalidArgument) as wrong:
        session.run(None, {"x": np.ones((2, 4), np.int32)})
    assert isinstance(wrong.value, InputError) and "'x'" in str(wrong.value)
    assert str(wrong.value).startswith("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ")


def test_module_functions_answer_as_onnxruntime_s(mlp_path):
    assert ort.get_all_providers()[-1] == "CPUExecutionProvider"
    assert "CPUExecutionProvider" in ort.get_available_providers()
    assert ort.get_device() in ("CPU", "GPU")
    assert ort.__version__.startswith("1.")
    messages = []
    ort.set_default_logger_callback(lambda *record: messages.append(record), severity=0)
    try:
        ort.InferenceSession(mlp_path)
    finally:
        ort.set_default_logger_callback(None)
        ort.set_default_logger_severity(2)
    assert messages and all(isinstance(part, (int, str)) for part in messages[0])
    with pytest.raises(RuntimeError):
        ort.set_default_logger_severity(7)


# -- the alias ------------------------------------------------------------------------------

def test_the_onnxruntime_alias_serves_mixrt(mlp_path):
    script = (
        "import onnxruntime, numpy as np, mixrt.onnxruntime as ort\n"
        "from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument\n"
        "from onnxruntime.capi import _pybind_state as C\n"
        "import onnxruntime.backend as backend\n"
        "assert onnxruntime.InferenceSession is ort.InferenceSession\n"
        "assert Fail is ort.Fail and C.OrtValue is ort.OrtValue\n"
        f"rep = backend.prepare({mlp_path!r})\n"
        "print(rep.run(np.ones((2, 4), np.float32))[0].shape)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "compat" / "onnxruntime"))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(2, 3)"


def test_a_dropped_session_is_freed_without_the_cycle_collector(mlp_path):
    """No reference cycle runs through an InferenceSession (nor an OrtValue): dropped, its
    mixrt session and weights go at once, as mixrt.Session's do."""
    import gc
    import weakref
    session = ort.InferenceSession(mlp_path)
    session.run(None, {"x": _x()})
    session._sess.run(None, {"x": _x()})
    inner = weakref.ref(session._session)
    value = ort.OrtValue.ortvalue_from_numpy(_x())
    held = weakref.ref(value)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del session, value
        assert inner() is None and held() is None
    finally:
        if enabled:
            gc.enable()
