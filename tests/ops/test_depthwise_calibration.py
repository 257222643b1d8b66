"""The depthwise forms' cost model fitted on this machine (ops/conv/depthwise_calibration.py,
depthwise_timing.py) and read by the picks (depthwise_costs.py)."""

import json

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import depthwise_calibration as calibration
from mixrt.ops.conv import depthwise_costs as costs

RNG = np.random.default_rng(5)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache of the test's own, the picks made again from its weights (and from this
    machine's again after the test)."""
    monkeypatch.setenv("MIXRT_CACHE_DIR", str(tmp_path))
    costs.use_weights(None)
    yield tmp_path
    monkeypatch.undo()
    costs._MEASURES.clear()
    costs.use_weights(None)


def _geometries(count):
    for _ in range(count):
        k, s = int(RNG.choice([3, 5, 7])), int(RNG.choice([1, 2]))
        yield (k, k), (s, s), (1, 1), (int(RNG.integers(1, 80)), int(RNG.integers(1, 130)))


def _samples(weights, count=300, noise=0.0):
    """Each form's times as ``weights`` model them, at random geometries."""
    found = []
    for kernel, strides, dilations, out_dims in _geometries(count):
        fits = kernel[0] * kernel[1] + costs.LOOP_REGISTERS <= 32
        for form in calibration.FORMS:
            x = calibration.features(form, kernel, strides, dilations, out_dims, 16, fits)
            found.append((form, x, float(weights[form] @ x) * (1 + noise * RNG.uniform(-1, 1))))
    return found


def test_the_fit_finds_the_weights_that_made_the_times():
    made = {form: RNG.uniform(0.05, 5.0, len(units))
            for form, units in calibration.UNITS.items()}
    found = calibration.fit(_samples(made))
    for form in calibration.FORMS:
        np.testing.assert_allclose(found[form], made[form], rtol=1e-6)


def test_the_fitted_weights_are_never_negative_and_model_noisy_times_closely():
    made = {form: RNG.uniform(0.0, 2.0, len(units)) for form, units in calibration.UNITS.items()}
    made["rows"][2] = 0.0  # a unit that costs nothing here: not fitted below zero
    samples = _samples(made, noise=0.05)
    found = calibration.fit(samples)
    assert all(np.all(weights >= 0) for weights in found.values())
    for form, x, ns in samples:
        assert abs(found[form] @ x - ns) <= 0.1 * ns + 1e-9


def test_weights_kept_per_cpu_come_back_and_damaged_files_are_refused(tmp_path):
    where = calibration.path(tmp_path, "Some CPU @ 2.0GHz / model 7")
    assert where.parent == tmp_path / "depthwise_costs" and "/" not in where.name
    assert calibration.load(where) is None  # none kept
    weights = {form: np.arange(1.0, len(units) + 1) for form, units in calibration.UNITS.items()}
    calibration.save(weights, where)
    kept = calibration.load(where)
    assert all(np.array_equal(kept[form], weights[form]) for form in calibration.FORMS)
    for damaged in ("{", json.dumps({"rows": [1.0]}),
                    json.dumps({**{f: [1.0] * len(u) for f, u in calibration.UNITS.items()},
                                "flat": [1.0, -2.0, 3.0]})):
        where.write_text(damaged)
        assert calibration.load(where) is None


def test_the_picks_follow_the_weights_kept_for_this_cpu(own_cache):
    assert costs.weights() is costs.SHIPPED  # none kept in this cache
    window, out_dims = ((3, 3), (2, 2), (1, 1)), (9, 6)
    assert costs.small_plane_form(*window, out_dims, 4, True) == "channels"
    dear_channels = {**costs.SHIPPED, "channels": costs.SHIPPED["channels"] * 100}
    calibration.save(dear_channels, costs.calibration_path())
    assert costs.calibrated_since()  # kept since this process read the shipped ones
    assert costs.small_plane_form(*window, out_dims, 4, True) == "channels"  # kept picks
    costs.use_weights(None)
    assert costs.small_plane_form(*window, out_dims, 4, True) != "channels"
    assert not costs.calibrated_since()


def test_a_process_told_to_measures_once_where_the_cache_has_none(own_cache):
    made = {form: RNG.uniform(0.1, 3.0, len(units)) for form, units in calibration.UNITS.items()}
    calls = []
    costs.measure_where_missing(lambda: calls.append(1) or _samples(made, count=60))
    found = costs.weights()
    assert calls == [1] and costs.calibration_path().is_file()
    for form in calibration.FORMS:
        np.testing.assert_allclose(found[form], made[form], rtol=1e-6)
    costs.use_weights(None)
    costs.weights()
    assert calls == [1]  # read from the cache, not measured again


def test_a_measuring_that_fails_leaves_the_shipped_weights_and_no_file(own_cache):
    def failing():
        raise RuntimeError("a form did not compile")
    costs.measure_where_missing(failing)
    assert costs.weights() is costs.SHIPPED
    assert not costs.calibration_path().exists()


@pytest.mark.skipif(jit_cpu.panel_kernels() is None, reason="the compiled forms")
def test_every_form_is_timed_on_the_same_bits():
    from mixrt.ops.conv import depthwise_timing  # noqa: PLC0415 (compiles the forms)
    samples = depthwise_timing.measure(geometries=((3, 1, (6, 10)), (3, 2, (4, 40))),
                                       repeats=3)
    forms = [form for form, _, _ in samples]
    assert forms == ["rows", "blocks", "channels", "flat", "rows", "blocks", "channels"]
    assert all(ns > 0 and x.shape == (len(calibration.UNITS[form]),)
               for form, x, ns in samples)
