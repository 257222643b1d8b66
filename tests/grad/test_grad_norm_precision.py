"""The expansions of the normalizations (ops/nn/norm_expansion.py) and of the reductions and
pools that square (ReduceL2, ReduceLogSumExp, LpPool, GlobalLpPool) compute in the precision
their forwards do: float16 activations of a size that float16 holds but whose squares it does not
(|x| in the hundreds, common in a transformer's residual stream) still get the gradients that
float64 gives, first order where the expansion is the gradient (RMSNormalization,
MeanVarianceNormalization) and second order for the rest.

The reference is the same graph run in float64 on the float16-rounded inputs; the tolerance is
relative to the largest gradient, a few float16 roundings' worth."""

from __future__ import annotations

import numpy as np
import pytest

from grad.gradcheck import assert_near_reference, gradients_in, second_order_in

rng = np.random.default_rng(23)
LARGE = 300.0  # float16 holds it; its square (9e4) is past float16's 65504


def large(*shape):
    return rng.standard_normal(shape) * LARGE


def near_one(*shape):
    return rng.uniform(0.5, 1.5, shape)


def positive(*shape):
    return rng.uniform(0.5, 2.0, shape) * LARGE


# (op, inputs, attributes, opset, the indices differentiated): gradcheck's spec
CASES = {
    "rms": ("RMSNormalization", [large(2, 3, 16), near_one(16)], {}, 23, [0, 1]),
    "rms-axis1": ("RMSNormalization", [large(2, 3, 16), near_one(3, 16)], {"axis": 1}, 23,
                  [0, 1]),
    "mvn": ("MeanVarianceNormalization", [large(2, 3, 4, 4)], {}, 13, [0]),
    "layer": ("LayerNormalization", [large(2, 3, 16), near_one(16), near_one(16)], {}, 17,
              [0, 1, 2]),
    "batch-training": ("BatchNormalization",
                       [large(4, 3, 5), near_one(3), near_one(3), np.zeros(3), np.ones(3)],
                       {"training_mode": 1}, 15, [0, 1, 2]),
    "batch-inference": ("BatchNormalization",
                        [large(4, 3, 5), near_one(3), near_one(3), large(3), positive(3)],
                        {}, 15, [0, 1, 2, 3, 4]),
    "instance": ("InstanceNormalization", [large(2, 3, 16), near_one(3), near_one(3)], {}, 17,
                 [0, 1, 2]),
    "group-18": ("GroupNormalization", [large(2, 4, 8), near_one(2), near_one(2)],
                 {"num_groups": 2}, 18, [0, 1, 2]),
    "group-21": ("GroupNormalization", [large(2, 4, 8), near_one(4), near_one(4)],
                 {"num_groups": 2}, 21, [0, 1, 2]),
    "lrn": ("LRN", [large(2, 5, 3, 3)], {"size": 3, "alpha": 1e-4}, 17, [0]),
    "lp2": ("LpNormalization", [large(3, 8)], {"p": 2}, 17, [0]),
    # the reductions and pools whose expansions square or exponentiate
    "l2": ("ReduceL2", [large(3, 8)], {"axes": [1]}, 17, [0]),
    "l2-axes-input": ("ReduceL2", [large(3, 8)], {}, 18, [0]),
    "log-sum-exp": ("ReduceLogSumExp", [large(3, 8) / 30], {"axes": [1]}, 17, [0]),
    "lp-pool": ("LpPool", [large(1, 2, 6, 6)], {"kernel_shape": [2, 2], "p": 2}, 18, [0]),
    "global-lp-pool": ("GlobalLpPool", [large(1, 2, 6, 6)], {"p": 2}, 17, [0]),
}


@pytest.mark.parametrize("case", ["rms", "rms-axis1", "mvn"])
def test_float16_first_order_through_the_expansion(case):
    reference = gradients_in(CASES[case], np.float64, rounded_to=np.float16)
    got = gradients_in(CASES[case], np.float16, rounded_to=np.float16)
    assert_near_reference(got, reference, case)


@pytest.mark.parametrize("case", list(CASES))
def test_float16_second_order(case):
    spec = CASES[case]
    assert_near_reference(second_order_in(spec, np.float16, rounded_to=np.float16),
                          second_order_in(spec, np.float64, rounded_to=np.float16), case)


def test_rms_normalization_statistics_follow_stash_type():
    """stash_type 11 (double) on float32 input: the expansion's square and mean run in
    float64, as the forward's do, so a value whose square overflows float32 still
    normalizes to a finite gradient."""
    op_type, (x, scale), _, opset, wrt = CASES["rms"]
    huge = (op_type, [x * 1e18, scale], {"stash_type": 11}, opset, wrt)
    reference = gradients_in(huge, np.float64, rounded_to=np.float32)
    got = gradients_in(huge, np.float32, rounded_to=np.float32)
    assert_near_reference(got, reference, "stash_type 11", tolerance=1e-4)


@pytest.mark.parametrize("case", ["layer", "group-21"])
def test_fused_gradients_follow_stash_type(case):
    """The fused LayerNormalizationGrad and GroupNormalizationGrad recompute the statistics in
    the forward's stash_type when it is wider than X's: float32 input at 1e18 with stash_type
    11 gives the float64 gradient, not inf or NaN from a float32 x * x."""
    op_type, inputs, attributes, opset, wrt = CASES[case]
    huge = (op_type, [inputs[0] * 1e18, *inputs[1:]], {**attributes, "stash_type": 11}, opset,
            wrt)
    reference = gradients_in(huge, np.float64, rounded_to=np.float32)
    got = gradients_in(huge, np.float32, rounded_to=np.float32)
    assert_near_reference(got, reference, f"{case} stash_type 11", tolerance=1e-4)
