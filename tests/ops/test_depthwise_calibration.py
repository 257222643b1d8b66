"""This machine's weights for the depthwise convolution's cost model: measured on reference
geometries (ops/conv/depthwise_calibration.py), kept in the cache as JSON
(ops/conv/depthwise_table.py), taken by the model's picks (ops/conv/depthwise_costs.py) and
measured by a session's wait_compiled once per machine (runtime/machine_weights.py)."""

import json
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import depthwise_calibration, depthwise_costs, depthwise_table
from mixrt.runtime import machine_weights

needs_jit = pytest.mark.skipif(not jit_cpu.enabled(), reason="the compiled tier is off")
LANES = 16


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache of the test's own, the machine's weights read from it at the next pick;
    the suite's (shipped) weights again after."""
    monkeypatch.setenv("MIXRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MIXRT_CALIBRATE", "1")
    depthwise_costs.use(None)
    yield tmp_path
    monkeypatch.undo()
    depthwise_costs.use(None)


def _times_from(weights: dict, points: list[dict]) -> list[dict]:
    """Each point with the times its forms would take under ``weights``, exactly."""
    results = []
    for point in points:
        found = dict(point)
        for form in depthwise_calibration.FORMS:
            table = weights[form]
            if isinstance(table, dict):
                fits = depthwise_costs._fits(point["kernel"] ** 2)
                table = table["fits" if fits else "spills"]
            per_plane = float(np.dot(table, depthwise_calibration.counts(point, form, LANES)))
            found[f"{form}_us"] = per_plane * point["images"] * point["channels"] / 1e3
        results.append(found)
    return results


def test_the_fit_recovers_the_weights_the_times_were_made_with():
    """Times made from known weights (every weight of every set in use) are fitted back
    to those weights."""
    known = {"rows": {"fits": [0.5, 0.09, 0.07, 0.2], "spills": [1.2, 0.6, 0.12, 0.25]},
             "blocks": {"fits": [0.4, 0.2, 20.0], "spills": [0.45, 0.19, 40.0]},
             "flat": [0.36, 0.17, 5.0], "channels": [0.7, 2.2, 2.0]}
    points = depthwise_calibration.reference_points(40, 20, seed=3)
    fitted, errors = depthwise_calibration.fit(_times_from(known, points), LANES)
    for form, table in known.items():
        pairs = table.items() if isinstance(table, dict) else [(None, table)]
        for kind, values in pairs:
            got = fitted[form] if kind is None else fitted[form][kind]
            np.testing.assert_allclose(got, values, rtol=1e-3, atol=1e-3)
    assert all(error < 1e-6 for error in errors.values())


def test_a_set_without_points_keeps_the_shipped_weights():
    """No point of a set (here: no kernel whose weights spill) leaves that set shipped;
    no weight comes out negative."""
    points = [p for p in depthwise_calibration.reference_points(30, 10, seed=5)
              if p["kernel"] == 3]
    rng = np.random.default_rng(0)
    results = [{**p, **{f"{form}_us": float(rng.uniform(10, 100))
                        for form in depthwise_calibration.FORMS}} for p in points]
    fitted, _ = depthwise_calibration.fit(results, LANES)
    assert fitted["rows"]["spills"] == depthwise_table.SHIPPED["rows"]["spills"]
    assert fitted["blocks"]["spills"] == depthwise_table.SHIPPED["blocks"]["spills"]
    assert depthwise_table.valid(fitted)


def test_the_reference_geometries_cover_narrow_and_wide_rows():
    points = depthwise_calibration.reference_points()
    narrow = [p for p in points if p["out"][1] <= 32]
    wide = [p for p in points if p["out"][1] > 64]  # the row form's four-vector passes
    assert len(narrow) == depthwise_calibration.NARROW_POINTS and wide
    assert {3, 5} <= {p["kernel"] for p in points} and {1, 2} == {p["stride"] for p in points}
    assert points == depthwise_calibration.reference_points()  # the same on every machine


def test_a_kept_table_is_read_back_and_a_damaged_one_is_not(own_cache):
    key = depthwise_costs.machine_key()
    assert depthwise_table.read(key) is None
    weights = json.loads(json.dumps(depthwise_table.SHIPPED))
    weights["flat"] = [0.3, 0.1, 1.0]
    path = depthwise_table.write(key, weights, {"points": 3})
    assert depthwise_table.read(key) == weights
    for damaged in ("{not json", json.dumps({"format": 1, "weights": {"flat": [1, 2, 3]}}),
                    json.dumps({"format": 1, "weights": {**weights, "flat": [-1.0, 0, 0]}}),
                    json.dumps({"format": 99, "weights": weights})):
        path.write_text(damaged)
        assert depthwise_table.read(key) is None
    with pytest.raises(ValueError):
        depthwise_table.write(key, {"rows": []}, {})


def test_the_key_changes_with_the_vector_width():
    assert depthwise_table.machine_key(64) != depthwise_table.machine_key(32)


def test_the_picks_take_the_machine_weights_once_read(own_cache, monkeypatch):
    """A table that makes the channels form cheapest everywhere turns a pick the shipped
    weights give the row form (3x3 over 40 x 24 at stride 2, where the channels form
    measured 4x slower on an EPYC) into the channels form; MIXRT_CALIBRATE=0 keeps the
    shipped weights whatever the cache holds."""
    window = ((3, 3), (1, 1), (1, 1), (56, 24), 4)
    shipped_pick = depthwise_costs.small_plane_form(*window, True)
    weights = json.loads(json.dumps(depthwise_table.SHIPPED))
    weights["channels"] = [0.0, 0.0, 0.0]
    depthwise_table.write(depthwise_costs.machine_key(), weights, {})
    assert depthwise_costs.refresh()
    assert depthwise_costs.small_plane_form(*window, True) == "channels"
    assert shipped_pick != "channels"
    monkeypatch.setenv("MIXRT_CALIBRATE", "0")
    assert not depthwise_costs.refresh()
    assert depthwise_costs.small_plane_form(*window, True) == shipped_pick


def _depthwise_model(path) -> None:
    weight = np.random.default_rng(1).standard_normal((24, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=24, kernel_shape=[3, 3],
                          pads=[1, 1, 1, 1], strides=[2, 2])], "depthwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 24, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@needs_jit
def test_wait_compiled_measures_the_machine_once_and_routes_again(own_cache, monkeypatch):
    """A session of a model with a depthwise convolution measures the machine in a process
    of its own as it waits (here on two geometries, every form's bits the same there),
    keeps the weights fitted for this machine, lets go of the routes it picked before and
    answers with the same values; a second wait does not measure again."""
    monkeypatch.setattr(machine_weights, "CALIBRATION_ARGS", ("--points", "2"))
    monkeypatch.setattr(machine_weights, "_tried", set())
    path = own_cache / "depthwise.onnx"
    _depthwise_model(str(path))
    x = np.random.default_rng(2).standard_normal((2, 24, 30, 22)).astype(np.float32)
    session = mixrt.Session(str(path))
    before = session.run(None, {"x": x})[0]
    generation = jit_cpu.scratch_generation()
    assert session.wait_compiled(timeout=300)
    kept = json.loads(depthwise_table.table_path(depthwise_costs.machine_key()).read_text())
    assert kept["points"] == 2 and depthwise_table.valid(kept["weights"])
    assert depthwise_costs.weights() == kept["weights"]
    assert jit_cpu.scratch_generation() > generation  # the routes picked before let go
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], before)
    calls = []
    monkeypatch.setattr(machine_weights, "_measured", lambda timeout: calls.append(1))
    session.wait_compiled(timeout=60)
    assert not calls


def test_a_model_without_depthwise_convolutions_is_not_measured(own_cache, monkeypatch):
    calls = []
    monkeypatch.setattr(machine_weights, "_measured", lambda timeout: calls.append(1))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = own_cache / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    session = mixrt.Session(str(path))
    session.run(None, {"x": np.ones(2, np.float32)})
    session.wait_compiled(timeout=60)
    assert not calls and depthwise_costs.weights() is depthwise_table.SHIPPED


def _calibrated_on(monkeypatch, results: list[dict]) -> tuple[dict, dict]:
    """calibrate() on ``results`` as its measured times (no form timed here)."""
    found = iter(results)
    monkeypatch.setattr(depthwise_calibration, "measure", lambda point, rng: next(found))
    return depthwise_calibration.calibrate([dict(r) for r in results])


def test_weights_that_pick_better_on_held_out_points_are_kept(own_cache, monkeypatch):
    """Times made by weights under which the channels form is dear and the flat form
    cheap: the weights fitted on each half pick faster forms on the other half than the
    shipped ones, and are kept."""
    true = json.loads(json.dumps(depthwise_table.SHIPPED))
    true["channels"], true["flat"] = [3.0, 9.0, 9.0], [0.2, 0.1, 1.0]
    points = depthwise_calibration.reference_points()
    weights, about = _calibrated_on(monkeypatch, _times_from(true, points))
    assert about["kept"] == "measured"
    assert about["picks_us"]["held_out"] < about["picks_us"]["shipped"]
    assert depthwise_table.read(depthwise_costs.machine_key()) == weights


def test_weights_that_pick_worse_on_held_out_points_give_way_to_the_shipped(own_cache,
                                                                            monkeypatch):
    """A fit that makes the channels form look free where it is the dearest form (as a
    noisy host can) picks worse on the held-out halves: the shipped weights are kept."""
    true = json.loads(json.dumps(depthwise_table.SHIPPED))
    true["channels"] = [9.0, 9.0, 9.0]
    spoilt = json.loads(json.dumps(depthwise_table.SHIPPED))
    spoilt["channels"] = [0.0, 0.0, 0.0]
    monkeypatch.setattr(depthwise_calibration, "fit", lambda results, lanes: (spoilt, {}))
    points = depthwise_calibration.reference_points()
    weights, about = _calibrated_on(monkeypatch, _times_from(true, points))
    assert about["kept"] == "shipped" and weights == depthwise_table.SHIPPED
    assert depthwise_table.read(depthwise_costs.machine_key()) == depthwise_table.SHIPPED


def test_a_calibration_that_fails_keeps_the_shipped_weights_and_is_not_asked_again(
        own_cache, monkeypatch, tmp_path):
    """A calibration process that fails (here: its command raises) leaves the shipped
    weights kept for this machine with what it said, so no later process spends its wait
    on it; one cut short by the wait's timeout leaves nothing (a later wait may)."""
    path = tmp_path / "model.onnx"
    _depthwise_model(str(path))
    graph = mixrt.Session(str(path)).graph
    monkeypatch.setattr(machine_weights, "_COMMAND", "raise SystemExit('no forms here')")
    monkeypatch.setattr(machine_weights, "_tried", set())
    assert not machine_weights.calibrate_for(graph, None)
    kept = json.loads(depthwise_table.table_path(depthwise_costs.machine_key()).read_text())
    assert kept["kept"] == "shipped" and "no forms here" in kept["failed"]
    assert kept["weights"] == depthwise_table.SHIPPED
    depthwise_table.table_path(depthwise_costs.machine_key()).unlink()
    depthwise_costs.use(None)
    monkeypatch.setattr(machine_weights, "_COMMAND", "import time; time.sleep(30)")
    monkeypatch.setattr(machine_weights, "_tried", set())
    assert not machine_weights.calibrate_for(graph, time.monotonic() + 3.0)
    assert not depthwise_table.table_path(depthwise_costs.machine_key()).exists()
