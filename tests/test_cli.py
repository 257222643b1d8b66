"""The mixrt command, run the way users run it: as a process."""

import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from helpers import add_model, loop_model, save


def mixrt(*args):
    return subprocess.run([sys.executable, "-c", "from mixrt.cli import main; "
                           "raise SystemExit(main())", *args], capture_output=True, text=True)


def test_info_lists_signature_and_histogram(tmp_path):
    path = save(add_model(), tmp_path / "m.onnx")
    result = mixrt("info", path)
    assert result.returncode == 0
    assert "x: float32[2x3]" in result.stdout and "1  Add" in result.stdout


def test_run_reads_npy_and_writes_outputs(tmp_path):
    path = save(add_model(), tmp_path / "m.onnx")
    x = np.random.rand(2, 3).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", x)
    result = mixrt("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--input",
                   f"y={tmp_path / 'y.npy'}", "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "z.npy"), x + x)


def test_run_refuses_pickled_input(tmp_path):
    path = save(add_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    result = mixrt("run", path, "--input", f"x={tmp_path / 'x.npy'}")
    assert result.returncode == 2
    assert "not a plain .npy array" in result.stderr and "Traceback" not in result.stderr


def _model_with_unknown_op(tmp_path):
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="mystery")
    graph = helper.make_graph([node, helper.make_node("Relu", ["y"], ["z"], name="ok")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return save(model, tmp_path / "bad.onnx")


def test_check_names_missing_op_and_node_and_exits_1(tmp_path):
    result = mixrt("check", _model_with_unknown_op(tmp_path))
    assert result.returncode == 1
    assert "mystery" in result.stdout and "Frobnicate" in result.stdout
    assert "1 of 2 nodes supported" in result.stdout


def test_check_json_and_success_exit(tmp_path):
    result = mixrt("check", save(add_model(), tmp_path / "m.onnx"), "--json")
    assert result.returncode == 0
    report = json.loads(result.stdout)
    assert report["supported"] and report["nodes"][0]["op_type"] == "Add"


def test_errors_are_one_line_without_traceback_unless_debug(tmp_path):
    result = mixrt("info", str(tmp_path / "missing.onnx"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("mixrt: error:")
    debug = mixrt("--debug", "info", str(tmp_path / "missing.onnx"))
    assert "Traceback" in debug.stderr


def _dynamic_add_model(tmp_path):
    node = helper.make_node("Add", ["x", "y"], ["s"], name="add")
    relu = helper.make_node("Relu", ["s"], ["z"], name="relu")
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 3]) for n in "xy"]
    graph = helper.make_graph([node, relu], "g", inputs,
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT,
                                                             ["batch", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return save(model, tmp_path / "dyn.onnx")


def test_plan_json_has_the_report_keys_and_draws(tmp_path):
    path = save(add_model(), tmp_path / "m.onnx")
    result = mixrt("plan", path, "--json", "--strategy", "sharing", "--png",
                   str(tmp_path / "plan.png"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"arena_bytes", "naive_bytes", "lower_bound_bytes", "strategy"} <= set(report)
    assert report["strategy"] == "sharing"
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
    # the MXNet paper's baseline: naive allocation of the model as imported
    assert report["naive_as_imported_bytes"] >= report["naive_bytes"]
    arena = report["arena_bytes"]  # 0 here: the one tensor is the graph's output
    assert report["naive_as_imported_over_arena"] == pytest.approx(
        report["naive_as_imported_bytes"] / arena if arena else 1.0, rel=1e-3)


def test_plan_of_symbolic_shapes_needs_dims(tmp_path):
    path = _dynamic_add_model(tmp_path)
    result = mixrt("plan", path)
    assert result.returncode == 2 and "--dim batch=N" in result.stderr
    result = mixrt("plan", path, "--dim", "batch=4", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["strategy"] == "greedy"


def test_compile_then_run_the_mxr(tmp_path):
    path = save(add_model(), tmp_path / "m.onnx")
    target = tmp_path / "m.mxr"
    result = mixrt("compile", path, "-o", str(target), "--opt-level", "2")
    assert result.returncode == 0, result.stderr
    assert target.exists() and "arena" in result.stdout
    x = np.random.rand(2, 3).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = mixrt("run", str(target), "--input", f"x={tmp_path / 'x.npy'}", "--input",
                   f"y={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out"),
                   "--profile", str(tmp_path / "trace.json"))
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "z.npy"), x + x)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" and e["args"]["op"] == "Add" for e in events)


def test_check_validate_compares_with_onnxruntime(tmp_path):
    path = save(add_model(), tmp_path / "m.onnx")
    result = mixrt("check", path, "--validate", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["outputs"][0]["name"] == "z"
    assert report["outputs"][0]["max_abs_error"] == 0.0


def test_check_validate_fails_on_an_unsupported_node(tmp_path):
    node = helper.make_node("NoSuchOp", ["x"], ["z"], name="mystery", domain="acme")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info("z", TensorProto.FLOAT,
                                                                       [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("acme", 1)])
    path = save(model, tmp_path / "m.onnx")
    result = mixrt("check", path, "--validate")
    assert result.returncode == 1
    assert "mystery" in result.stdout and "FAIL" in result.stdout


def test_demo_runs_the_main_job(tmp_path):
    result = mixrt("demo", "--workdir", str(tmp_path), "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[6/6]" in result.stdout and (tmp_path / "digits_task_b.mxr").exists()


def test_run_ends_a_run_past_its_timeout_naming_the_node(tmp_path):
    """``mixrt run --timeout-s`` ends a Loop whose trip count is an input: exit 2, a message
    naming the node, no traceback."""
    path = save(loop_model(size=2), tmp_path / "loop.onnx")
    np.save(tmp_path / "x.npy", np.zeros(2, np.float32))
    for trips, expected in ((3, 0), (10**9, 2)):
        np.save(tmp_path / "trips.npy", np.array(trips, np.int64))
        result = mixrt("run", path, "--input", f"trips={tmp_path / 'trips.npy'}", "--input",
                       f"x={tmp_path / 'x.npy'}", "--timeout-s", "0.5")
        assert result.returncode == expected, result.stderr
    assert "timeout of 0.5 s" in result.stderr and "node 'repeat'" in result.stderr
    assert "Traceback" not in result.stderr
