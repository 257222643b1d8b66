"""benchmarks/service_regimes.py: its child, as a real process under each runtime, on a tiny
model built here (MatMul, Add, Relu with a symbolic batch; no torch), and its verdicts on
made-up numbers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import _service_report as report  # noqa: E402


def _tiny_model(path: Path) -> None:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["product"]),
             helper.make_node("Add", ["product", "b"], ["shifted"]),
             helper.make_node("Relu", ["shifted"], ["y"])]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("service")
    _tiny_model(folder / "tiny.onnx")
    spec = {"name": "tiny", "path": str(folder / "tiny.onnx"), "seed": 5,
            "inputs": [{"name": "x", "kind": "normal", "dtype": "float32",
                        "axes": ["batch", 16]}],
            "hot": {"batch": 2}, "compare": {"batch": 3},
            "new_shapes": [{"batch": 1}, {"batch": 7}, {"batch": 4}]}
    (folder / "spec.json").write_text(json.dumps(spec))
    return folder / "spec.json"


@pytest.mark.parametrize("runtime", ["mixrt", "onnxruntime"])
def test_child_times_each_regime(runtime, tiny_spec, tmp_path):
    if runtime == "onnxruntime":
        pytest.importorskip("onnxruntime")
    env = dict(os.environ, MIXRT_CACHE_DIR=str(tmp_path / "mixrt"),
               NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "_service_children.py"), "time", "--runtime", runtime,
         "--spec", str(tiny_spec), "--regimes", "hot", "new-shape", "sizes-again",
         "--requests", json.dumps({"hot": 3, "new-shape": 3, "sizes-again": 3})],
        capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [line["regime"] for line in lines[:-1]] == ["hot", "new-shape", "sizes-again"]
    result = lines[-1]["result"]
    assert result["runtime"] == runtime and runtime in result["versions"]
    for regime in ("hot", "new-shape", "sizes-again"):
        found = result["regimes"][regime]
        assert found["n"] == 3 and len(found["times_ms"]) == 3
        assert found["p50_ms"] > 0 and found["p99_ms"] >= found["p50_ms"]
        assert found["placement"] in ("near", "far") and len(found["hand_off_ns"]) == 2
        assert found["attempts"] == 1 or regime == "hot"


# -- the verdicts ------------------------------------------------------------------------------

def _model(label: str, ours: tuple, theirs: tuple, regime: str = "hot") -> dict:
    def measured(p50, p99):
        return {"regimes": {regime: {"n": 60, "p50_ms": p50, "p99_ms": p99}}}
    return {"label": label, "sizes": "made up", "mixrt": measured(*ours),
            "onnxruntime": measured(*theirs), "agreement": {"agrees": True, "detail": "ok"}}


def test_geomean():
    assert report.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert report.geomean([]) is None


def test_a_model_at_2_1x_fails_no_model_above_2x():
    models = [_model("a", (1.0, 2.0), (1.0, 2.0)), _model("b", (1.0, 2.0), (1.0, 2.0)),
              _model("c", (2.1, 2.0), (1.0, 2.0))]
    found = report.verdict(models, "hot")
    assert found["geomean_p50"] == pytest.approx(2.1 ** (1 / 3))  # 1.28: over 1.2 as well
    assert found["worst"] == "c" and found["worst_p50"] == pytest.approx(2.1)
    assert found["checks"] == {"geomean p50 <= 1.2x": False, "geomean p99 <= 1.5x": True,
                               "no model above 2x (p50)": False}
    assert not found["passed"]


def test_every_target_met_passes():
    models = [_model("a", (1.1, 2.8), (1.0, 2.0)), _model("b", (0.9, 2.0), (1.0, 2.0))]
    found = report.verdict(models, "hot")
    assert found["geomean_p50"] == pytest.approx((1.1 * 0.9) ** 0.5)
    assert found["geomean_p99"] == pytest.approx(1.4 ** 0.5)
    assert found["passed"]


def test_a_model_without_results_fails_the_regime():
    models = [_model("a", (1.0, 1.0), (1.0, 1.0)),
              {"label": "broken", "sizes": "", "mixrt": {"failure": "exit 1"},
               "onnxruntime": {"regimes": {"hot": {"n": 3, "p50_ms": 1, "p99_ms": 1}}}}]
    found = report.verdict(models, "hot")
    assert found["missing"] == ["broken"] and not found["passed"]
    assert "failed" in report.regime_table(models, "hot")


def test_tables_show_ratios_and_verdicts():
    models = [_model("a", (3.0, 6.0), (1.0, 2.0))]
    text = report.tables({"models": models, "regimes": ["hot"]})
    assert "| a | made up | 60 | 3.00 | 6.00 | 1.00 | 2.00 | 3.00 | 3.00 | yes (ok) | – |" in text
    assert "| hot | 3.00 | 3.00 | a: 3.00x | FAIL | FAIL | FAIL | FAIL | 0 |" in text


def test_the_cores_column_names_the_runtime_timed_on_far_cores():
    models = [_model("a", (3.0, 6.0), (1.0, 2.0)), _model("b", (1.0, 1.0), (1.0, 1.0))]
    for model, ours in zip(models, ("far", "near")):
        model["mixrt"]["regimes"]["hot"]["placement"] = ours
        model["onnxruntime"]["regimes"]["hot"]["placement"] = "near"
    assert report.cores(models[0], "hot") == "far: mixrt"
    assert report.cores(models[1], "hot") == "near"
    assert report.verdict(models, "hot")["far"] == 1
    text = report.tables({"models": models, "regimes": ["hot"]})
    assert "| yes (ok) | far: mixrt |" in text and "| yes (ok) | near |" in text


def test_a_regime_timed_on_far_cores_is_timed_again_until_near(monkeypatch):
    import _service_children as children
    probes = iter([250.0, 40.0, 45.0, 42.0])  # before/after each try: far, then near twice
    monkeypatch.setattr(children, "hand_off_ns", lambda: next(probes))
    monkeypatch.setattr(children, "FAR_WAIT_S", 0.0)
    monkeypatch.setattr(children, "SETTLE_S", 0.0)
    runs = []
    found = children.timed_in_near_placement(
        "hot", lambda: runs.append(1) or [0.001, 0.002], lambda: 0.0)
    assert len(runs) == 2 and found["attempts"] == 2
    assert found["placement"] == "near" and found["hand_off_ns"] == [45, 42]
    # a regime whose shapes stay met is timed once, its placement recorded
    probes = iter([250.0, 260.0])
    found = children.timed_in_near_placement("new-shape", lambda: [0.001], lambda: 0.0)
    assert found["attempts"] == 1 and found["placement"] == "far"


def test_the_placement_probe_measures_a_hand_off():
    import _placement
    ns = _placement.hand_off_ns(rounds=200, tries=1)
    assert 0 < ns < 1e6
    assert _placement.placement(ns) in ("near", "far")
    assert _placement.placement(_placement.FAR_NS + 1) == "far"


def test_new_shape_is_taken_apart_into_first_sight_and_kernels_outside_the_verdicts():
    def measured(new, again):
        return {"regimes": {"new-shape": {"n": 60, "p50_ms": new, "p99_ms": new},
                            "sizes-again": {"n": 60, "p50_ms": again, "p99_ms": again}}}
    models = [{"label": "a", "sizes": "made up", "mixrt": measured(6.0, 2.0),
               "onnxruntime": measured(1.5, 1.0), "agreement": {"agrees": True}}]
    text = report.tables({"models": models, "regimes": ["new-shape", "sizes-again"]})
    # mixrt's first sight 3x its sizes met before, onnxruntime's 1.5x; 2x at those sizes
    assert "| a | 3.00 | 1.50 | 2.00 | 4.00 |" in text
    summary = text.split("\n\n")[0]
    assert "| new-shape |" in summary and "sizes-again" not in summary


def _round(times: list, placement: str = "near") -> dict:
    return {"runtime": "mixrt", "versions": {"mixrt": "0"},
            "regimes": {"hot": {"n": len(times), "times_ms": times,
                                "p50_ms": report.percentile(times, 50),
                                "p99_ms": report.percentile(times, 99),
                                "placement": placement, "attempts": 1}}}


def test_rounds_pool_their_requests_per_regime():
    """--rounds: each runtime's rounds merged into one result whose p50 and p99 are over
    every round's requests (NumPy's linear percentile), far if any round was, each round's
    p50 kept beside."""
    first, second = [1.0, 2.0, 3.0], [10.0, 20.0, 30.0, 40.0]
    merged = report.merged_rounds([_round(first), _round(second, "far")])
    hot = merged["regimes"]["hot"]
    assert hot["n"] == 7 and hot["times_ms"] == first + second
    assert hot["p50_ms"] == pytest.approx(float(np.percentile(first + second, 50)))
    assert hot["p99_ms"] == pytest.approx(float(np.percentile(first + second, 99)))
    assert hot["placement"] == "far" and hot["attempts"] == 2
    assert hot["rounds_p50_ms"] == [2.0, 25.0] and merged["rounds"] == 2
    assert report.merged_rounds([_round(first)]) == _round(first)


def test_a_failed_round_fails_the_merged_result():
    failure = {"failure": "the child crashed"}
    assert report.merged_rounds([_round([1.0]), failure]) == failure
