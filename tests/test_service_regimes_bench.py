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


COMMANDS = [{"regime": "hot", "first": 0, "count": 3},
            {"regime": "new-shape", "first": 0, "count": 2},
            {"regime": "new-shape", "first": 2, "count": 1},
            {"regime": "sizes-again", "first": 0, "count": 3}]


@pytest.mark.parametrize("runtime", ["mixrt", "onnxruntime"])
def test_child_serves_blocks_at_its_parents_word(runtime, tiny_spec, tmp_path):
    if runtime == "onnxruntime":
        pytest.importorskip("onnxruntime")
    env = dict(os.environ, MIXRT_CACHE_DIR=str(tmp_path / "mixrt"),
               NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    commands = "".join(json.dumps(c) + "\n" for c in COMMANDS + [{"end": True}])
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "_service_children.py"), "serve", "--runtime",
         runtime, "--spec", str(tiny_spec), "--regimes", "hot", "new-shape", "sizes-again",
         "--requests", json.dumps({"hot": 3})],
        input=commands, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [next(iter(line)) for line in lines] == ["ready"] + ["block"] * 4 + ["result"]
    ready = lines[0]["ready"]
    assert ready["runtime"] == runtime and runtime in ready["versions"]
    assert ready["requests"]["hot"] == 3 and ready["requests"]["new-shape"] == 200
    for command, line in zip(COMMANDS, lines[1:5]):
        found = line["block"]
        assert found["n"] == command["count"] == len(found["times_ms"])
        assert found["p50_ms"] > 0 and found["p99_ms"] >= found["p50_ms"]
        assert found["placement"] in ("near", "far") and len(found["hand_off_ns"]) == 2
        assert found["compile_wait_after_s"] >= 0


# -- the parent's blocks -----------------------------------------------------------------------

def test_a_regimes_requests_split_into_consecutive_blocks():
    import service_regimes
    assert service_regimes.blocks_of(10, 4) == [(0, 3), (3, 3), (6, 2), (8, 2)]
    assert service_regimes.blocks_of(2, 4) == [(0, 1), (1, 1)]
    assert service_regimes.blocks_of(40, 1) == [(0, 40)]


def _fake_blocks(monkeypatch, far_calls=()):
    """service_regimes.block answering from made-up children: each call's placement far
    where its index (from 0) is in ``far_calls``, its one time the call's index."""
    import service_regimes
    calls = []

    def block(child, regime, first, count):
        index = len(calls)
        calls.append((child, regime, first, count))
        placement = "far" if index in far_calls else "near"
        return {"n": 1, "times_ms": [float(index)], "p50_ms": float(index),
                "p99_ms": float(index), "placement": placement, "hand_off_ns": [40, 40]}
    monkeypatch.setattr(service_regimes, "block", block)
    monkeypatch.setattr(service_regimes, "FAR_WAIT_S", 0.0)
    return service_regimes, calls


def test_blocks_alternate_between_the_runtimes_and_their_order_too(monkeypatch):
    service_regimes, calls = _fake_blocks(monkeypatch)
    found = service_regimes.regime_in_blocks({"onnxruntime": "O", "mixrt": "M"}, "hot", 8, 4)
    assert [(child, first, count) for child, _, first, count in calls] == [
        ("O", 0, 2), ("M", 0, 2), ("M", 2, 2), ("O", 2, 2),
        ("O", 4, 2), ("M", 4, 2), ("M", 6, 2), ("O", 6, 2)]
    assert found["onnxruntime"]["times_ms"] == [0.0, 3.0, 4.0, 7.0]
    assert found["mixrt"]["blocks_p50_ms"] == [1.0, 2.0, 5.0, 6.0]
    assert found["mixrt"]["n"] == 4 and found["mixrt"]["placement"] == "near"


def test_a_pair_of_blocks_on_far_cores_is_timed_again_except_where_shapes_stay_met(
        monkeypatch):
    service_regimes, calls = _fake_blocks(monkeypatch, far_calls={1})
    found = service_regimes.regime_in_blocks({"onnxruntime": "O", "mixrt": "M"}, "hot", 2, 1)
    assert len(calls) == 4  # the pair again: mixrt's first block was on far cores
    assert found["mixrt"]["times_ms"] == [3.0] and found["onnxruntime"]["times_ms"] == [2.0]
    assert found["mixrt"]["attempts"] == 2 and found["mixrt"]["placement"] == "near"
    service_regimes, calls = _fake_blocks(monkeypatch, far_calls={1})
    found = service_regimes.regime_in_blocks(
        {"onnxruntime": "O", "mixrt": "M"}, "new-shape", 2, 1)
    assert len(calls) == 2 and found["mixrt"]["placement"] == "far"


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


def test_a_p50_ratio_is_the_median_of_the_paired_blocks_ratios():
    """A slow stretch that caught two of mixrt's blocks and one of onnxruntime's moves the
    pooled p50s, not the pairs' median; without blocks (or unpaired) the pooled ratio."""
    model = _model("resnet", (40.8, 50.9), (25.9, 46.0), "paced-100ms")
    mine = model["mixrt"]["regimes"]["paced-100ms"]
    theirs = model["onnxruntime"]["regimes"]["paced-100ms"]
    assert report.ratios(model, "paced-100ms")[0] == pytest.approx(40.8 / 25.9)
    mine["blocks_p50_ms"] = [30.7, 30.8, 50.9, 50.9]
    theirs["blocks_p50_ms"] = [24.4, 25.4, 26.7, 46.0]
    p50, p99 = report.ratios(model, "paced-100ms")
    pairs = sorted([30.7 / 24.4, 30.8 / 25.4, 50.9 / 26.7, 50.9 / 46.0])
    assert p50 == pytest.approx((pairs[1] + pairs[2]) / 2) and p99 == pytest.approx(50.9 / 46.0)
    theirs["blocks_p50_ms"] = [24.4, 25.4, 26.7]  # not paired: the pooled ratio
    assert report.ratios(model, "paced-100ms")[0] == pytest.approx(40.8 / 25.9)


def test_rounds_of_blocks_keep_every_rounds_blocks_paired():
    first, second = _round([1.0, 2.0]), _round([3.0, 4.0])
    first["regimes"]["hot"]["blocks_p50_ms"] = [1.0, 2.0]
    second["regimes"]["hot"]["blocks_p50_ms"] = [3.0, 4.0]
    merged = report.merged_rounds([first, second])["regimes"]["hot"]
    assert merged["blocks_p50_ms"] == [1.0, 2.0, 3.0, 4.0]
    assert merged["rounds_p50_ms"] == [1.5, 3.5]


def test_a_child_that_says_nothing_fails_naming_itself_and_the_wait(monkeypatch, tmp_path):
    import service_regimes
    from _kv_processes import BenchError, Child
    monkeypatch.setattr(service_regimes, "LINE_TIMEOUT_S", 1.0)
    child = Child("tiny:mixrt", [sys.executable, "-c", "import time; time.sleep(30)"],
                  dict(os.environ), tmp_path)
    try:
        with pytest.raises(BenchError, match=r"tiny:mixrt: no line within 1 s"):
            service_regimes.answer(child, "ready")
    finally:
        child.stop()


def test_new_shape_requests_are_told_apart_by_what_was_met_before():
    """A shape never met, an image size met at another batch, the very shape met: the
    kinds follow the requests' order, start over past the last shape, and each round of
    fresh processes meets the shapes afresh."""
    shapes = [{"batch": 1, "height": 64}, {"batch": 2, "height": 64},
              {"batch": 1, "height": 64}, {"batch": 1, "height": 96}]
    new, size_met, shape_met = report.MET
    assert report.met_before(shapes, 6) == [new, size_met, shape_met, new, shape_met,
                                            shape_met]

    def timed(times):
        pooled = times + times
        return {"rounds": 2, "regimes": {"new-shape": {
            "n": len(pooled), "times_ms": pooled, "p50_ms": report.percentile(pooled, 50),
            "p99_ms": report.percentile(pooled, 99)}}}
    models = [{"label": "a", "sizes": "made up", "new_shapes": shapes,
               "mixrt": timed([9.0, 6.0, 3.0, 11.0]),
               "onnxruntime": timed([3.0, 3.0, 3.0, 3.0]), "agreement": {"agrees": True}}]
    text = report.met_table(models)
    # per round: two new sizes (9 and 11 ms: p50 10), one new batch, one repeat
    assert "| a | 4: 10.0 / 3.00 = 3.33 | 2: 6.00 / 3.00 = 2.00 | 2: 3.00 / 3.00 = 1.00 |" \
        in text
    tables = report.tables({"models": models, "regimes": ["new-shape"]})
    assert "by what was met before" in tables
