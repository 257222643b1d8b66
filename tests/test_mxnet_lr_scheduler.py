"""mx.lr_scheduler against MXNet 1.9.1: each scheduler's rate at updates 0..12 (printed by
MXNet 1.9.1 for the same constructors, 2026-11-24). MXNet's schedulers keep state and
assume the update count only grows (asked about an earlier count they do not go back);
mixrt's compute each count afresh, so both agree on a growing count, which is how an
optimizer asks."""

import pytest

from mixrt import lr_scheduler as L

CASES = {
    "factor": lambda: L.FactorScheduler(step=3, factor=0.5, base_lr=0.1),
    "factor_stop": lambda: L.FactorScheduler(step=2, factor=0.1, stop_factor_lr=1e-3,
                                             base_lr=1.0),
    "factor_warm": lambda: L.FactorScheduler(step=3, factor=0.5, base_lr=0.1, warmup_steps=4,
                                             warmup_begin_lr=0.01),
    "multi": lambda: L.MultiFactorScheduler(step=[2, 5, 7], factor=0.5, base_lr=0.1),
    "poly": lambda: L.PolyScheduler(max_update=8, base_lr=0.1, pwr=2, final_lr=0.01),
    "poly_warm": lambda: L.PolyScheduler(max_update=8, base_lr=0.1, pwr=1, warmup_steps=3,
                                         warmup_mode="constant", warmup_begin_lr=0.05),
    "cosine": lambda: L.CosineScheduler(max_update=8, base_lr=0.1, final_lr=0.01),
    "cosine_warm": lambda: L.CosineScheduler(max_update=10, base_lr=0.1, final_lr=0.0,
                                             warmup_steps=3),
}

EXPECTED = {
    'factor': [0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125, 0.0125, 0.0125],
    'factor_stop': [1.0, 1.0, 1.0, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 0.001, 0.001, 0.001,
                    0.001],
    'factor_warm': [0.01, 0.0325, 0.055, 0.0775, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125,
                    0.0125, 0.0125],
    'multi': [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125, 0.0125, 0.0125,
              0.0125],
    'poly': [0.1, 0.07890625, 0.060625, 0.04515625, 0.0325, 0.02265625, 0.015625, 0.01140625,
             0.01, 0.01, 0.01, 0.01, 0.01],
    'poly_warm': [0.05, 0.05, 0.05, 0.1, 0.08, 0.06, 0.04, 0.02, 0.0, 0.0, 0.0, 0.0, 0.0],
    'cosine': [0.1, 0.096574579, 0.0868198052, 0.0722207545, 0.055, 0.0377792455,
               0.0231801948, 0.013425421, 0.01, 0.01, 0.01, 0.01, 0.01],
    'cosine_warm': [0.0, 0.0333333333, 0.0666666667, 0.1, 0.0950484434, 0.0811744901,
                    0.0611260467, 0.0388739533, 0.0188255099, 0.0049515566, 0.0, 0.0, 0.0],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rates_match_mxnet_on_a_growing_count(name):
    scheduler = CASES[name]()
    assert [scheduler(i) for i in range(13)] == pytest.approx(EXPECTED[name], abs=1e-9)
