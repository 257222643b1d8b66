"""Learning-rate schedules: values at chosen updates, MXNet's decay timing, specs, errors."""

import json
import math

import pytest

from mixrt import lr_scheduler
from mixrt.errors import OptimizerError


def test_factor_decays_after_each_step_and_stops_at_stop_factor_lr():
    schedule = lr_scheduler.FactorScheduler(step=3, factor=0.5, stop_factor_lr=0.1, base_lr=1.0)
    expected = {0: 1.0, 1: 1.0, 3: 1.0, 4: 0.5, 6: 0.5, 7: 0.25, 10: 0.125, 13: 0.1, 100: 0.1}
    for num_update, lr in expected.items():
        assert schedule(num_update) == lr, num_update


def test_multifactor_decays_past_each_listed_step():
    schedule = lr_scheduler.MultiFactorScheduler(step=[2, 5], factor=0.1, base_lr=1.0)
    expected = {1: 1.0, 2: 1.0, 3: 0.1, 5: 0.1, 6: 0.01, 50: 0.01}
    for num_update, lr in expected.items():
        assert schedule(num_update) == pytest.approx(lr, rel=1e-15), num_update


def test_cosine_goes_from_base_to_final_and_stays():
    schedule = lr_scheduler.CosineScheduler(max_update=10, base_lr=1.0, final_lr=0.1)
    assert schedule(0) == 1.0
    assert schedule(5) == pytest.approx(0.55, rel=1e-15)
    assert schedule(10) == pytest.approx(0.1, rel=1e-15)
    assert schedule(25) == pytest.approx(0.1, rel=1e-15)
    assert schedule(3) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 0.3)) / 2)


def test_poly_follows_the_power_of_the_remaining_fraction():
    schedule = lr_scheduler.PolyScheduler(max_update=10, pwr=2, base_lr=1.0, final_lr=0.0)
    assert [schedule(n) for n in (0, 5, 10, 11)] == pytest.approx([1.0, 0.25, 0.0, 0.0])


def test_linear_warmup_then_the_schedule_measured_from_its_end():
    schedule = lr_scheduler.CosineScheduler(max_update=10, base_lr=1.0, final_lr=0.1,
                                            warmup_steps=2, warmup_begin_lr=0.0)
    assert [schedule(n) for n in (0, 1, 2)] == pytest.approx([0.0, 0.5, 1.0])
    assert schedule(6) == pytest.approx(0.55)  # halfway through the 8 decay updates


def test_constant_warmup_holds_the_begin_rate():
    schedule = lr_scheduler.FactorScheduler(step=10, factor=0.5, base_lr=1.0, warmup_steps=3,
                                            warmup_begin_lr=0.01, warmup_mode="constant")
    assert [schedule(n) for n in (0, 2, 3)] == [0.01, 0.01, 1.0]


def _mxnet_style_factor(step, factor, stop, base, updates):
    """MXNet's stateful loop, written out, to check when the closed form decays."""
    count, lr, out = 0, base, []
    for num_update in updates:
        while num_update > count + step:
            count += step
            lr = max(lr * factor, stop)
        out.append(lr)
    return out


def _mxnet_style_multifactor(steps, factor, base, updates):
    index, lr, out = 0, base, []
    for num_update in updates:
        while index < len(steps) and num_update > steps[index]:
            index += 1
            lr *= factor
        out.append(lr)
    return out


def test_decays_happen_at_the_updates_mxnet_decays_at():
    updates = list(range(1, 60))
    factor = lr_scheduler.FactorScheduler(step=7, factor=0.7, stop_factor_lr=0.05, base_lr=0.9)
    assert [factor(n) for n in updates] == pytest.approx(
        _mxnet_style_factor(7, 0.7, 0.05, 0.9, updates), rel=1e-12)
    multi = lr_scheduler.MultiFactorScheduler(step=[4, 9, 30], factor=0.3, base_lr=0.2)
    assert [multi(n) for n in updates] == pytest.approx(
        _mxnet_style_multifactor([4, 9, 30], 0.3, 0.2, updates), rel=1e-12)


SCHEDULES = [
    ("factor", dict(step=5, factor=0.9, stop_factor_lr=1e-3, base_lr=0.3, warmup_steps=4)),
    ("multifactor", dict(step=[3, 8], factor=0.5, base_lr=0.1, warmup_mode="constant",
                         warmup_steps=2, warmup_begin_lr=0.01)),
    ("cosine", dict(max_update=40, base_lr=0.2, final_lr=0.01, warmup_steps=5)),
    ("poly", dict(max_update=40, pwr=1.5, base_lr=0.2)),
]


@pytest.mark.parametrize("name,params", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_spec_round_trips_through_json(name, params):
    schedule = lr_scheduler.create(name, **params)
    rebuilt = lr_scheduler.from_spec(json.loads(json.dumps(schedule.spec())))
    assert type(rebuilt) is type(schedule)
    assert rebuilt.spec() == schedule.spec()
    assert [rebuilt(n) for n in range(60)] == [schedule(n) for n in range(60)]
    for key, value in params.items():
        assert schedule.spec()["params"][key] == value


@pytest.mark.parametrize("call,fragment", [
    (lambda: lr_scheduler.create("linear"), "'cosine'"),
    (lambda: lr_scheduler.create("factor", step=2, gamma=0.5), "'stop_factor_lr'"),
    (lambda: lr_scheduler.create("factor"), "step"),
    (lambda: lr_scheduler.FactorScheduler(step=2, factor=1.5), "factor=1.5"),
    (lambda: lr_scheduler.FactorScheduler(step=0), "step"),
    (lambda: lr_scheduler.FactorScheduler(step=2.5), "step"),
    (lambda: lr_scheduler.MultiFactorScheduler(step=[5, 3]), "increasing"),
    (lambda: lr_scheduler.MultiFactorScheduler(step=[]), "non-empty"),
    (lambda: lr_scheduler.CosineScheduler(max_update=10, warmup_steps=10), "warmup_steps=10"),
    (lambda: lr_scheduler.CosineScheduler(max_update=10, warmup_mode="cubic"), "'linear'"),
    (lambda: lr_scheduler.CosineScheduler(max_update=10, base_lr=float("nan")), "base_lr"),
    (lambda: lr_scheduler.from_spec({"name": "cosine"}), "spec"),
])
def test_bad_schedules_raise_a_typed_error_naming_the_value(call, fragment):
    with pytest.raises(OptimizerError) as caught:
        call()
    assert fragment in str(caught.value)
