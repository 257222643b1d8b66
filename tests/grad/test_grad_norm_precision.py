"""The expansions of the normalizations (ops/norm_expansion.py) and of the reductions and
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

import mixrt
from grad.gradcheck import _add_loss, _add_quadratic_loss, _one_node_graph, _weighted_sum
from mixrt.ops.types import TensorType
from mixrt.runtime.graph import Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

rng = np.random.default_rng(23)
LARGE = 300.0  # float16 holds it; its square (9e4) is past float16's 65504


def large(*shape):
    return rng.standard_normal(shape) * LARGE


def near_one(*shape):
    return rng.uniform(0.5, 1.5, shape)


def positive(*shape):
    return rng.uniform(0.5, 2.0, shape) * LARGE


# op, inputs, attributes, opset, the indices differentiated
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


def _as(inputs, dtype):
    return [np.asarray(x, dtype=dtype) for x in inputs]


def _first_order(case, dtype, differentiable_backward=False, rounded_to=np.float16):
    """d loss / d inputs in ``dtype``; returns the joint graph, the differentiated
    names, the feeds and the gradients. ``case``: a CASES key or such a tuple."""
    op_type, inputs, attributes, opset, wrt = CASES[case] if isinstance(case, str) else case
    # every run sees the same rounded values, whatever dtype it computes in
    inputs = _as(_as(inputs, rounded_to), dtype)
    graph, names = _one_node_graph(op_type, inputs, dict(attributes), (), "", opset, 1)
    feeds = {names[i]: x for i, x in enumerate(inputs)}
    # a quadratic loss when the result is differentiated again, so that no second
    # derivative (a bias's) is zero by construction
    weights = (_add_quadratic_loss(graph, [0], feeds, seed=5) if differentiable_backward
               else _add_loss(graph, [0], inputs, names, seed=5))
    feeds.update({k: v.astype(rounded_to).astype(dtype) for k, v in weights.items()})
    wrt_names = [names[i] for i in wrt]
    joint = gradient_graph(graph, "loss", wrt_names,
                           differentiable_backward=differentiable_backward)
    grads = mixrt.Session(joint.graph, opt_level=0).run(
        [joint.grads[w] for w in wrt_names], feeds)
    return joint, wrt_names, feeds, grads


def _second_order(case, dtype):
    """d sum_i <d loss / d x_i, V_i> / d inputs, the first order built to be differentiated."""
    joint, wrt_names, feeds, first = _first_order(case, dtype, differentiable_backward=True)
    directions = np.random.default_rng(6)
    terms = []
    for k, (name, value) in enumerate(zip(wrt_names, first)):
        feeds[f"v{k}"] = directions.standard_normal(value.shape).astype(dtype)
        joint.graph.inputs.append(Value(f"v{k}", TensorType(np.dtype(dtype), value.shape)))
        terms.append(_weighted_sum(joint.graph, joint.grads[name], f"v{k}", f"p{k}"))
    joint.graph.nodes.append(Node("Sum", terms, ["penalty"], name="penalty", opset=17))
    joint.graph.outputs = [Value("penalty")]
    second = gradient_graph(joint.graph, "penalty", wrt_names)
    return mixrt.Session(second.graph, opt_level=0).run(
        [second.grads[w] for w in wrt_names], feeds)


def _assert_close(got, reference, label, tolerance=2e-2):
    for k, (g, r) in enumerate(zip(got, reference)):
        g = np.asarray(g, dtype=np.float64)
        assert np.isfinite(g).all(), f"{label}: gradient {k} is not finite"
        scale = np.abs(r).max()
        assert scale > 0, f"{label}: reference gradient {k} is all zeros"
        error = np.abs(g - r).max() / scale
        assert error < tolerance, f"{label}: gradient {k} off by {error:.3g} of its largest"


@pytest.mark.parametrize("case", ["rms", "rms-axis1", "mvn"])
def test_float16_first_order_through_the_expansion(case):
    *_, reference = _first_order(case, np.float64)
    *_, got = _first_order(case, np.float16)
    _assert_close(got, reference, case)


@pytest.mark.parametrize("case", list(CASES))
def test_float16_second_order(case):
    _assert_close(_second_order(case, np.float16), _second_order(case, np.float64), case)


def test_rms_normalization_statistics_follow_stash_type():
    """stash_type 11 (double) on float32 input: the expansion's square and mean run in
    float64, as the forward's do, so a value whose square overflows float32 still
    normalizes to a finite gradient."""
    op_type, (x, scale), _, opset, wrt = CASES["rms"]
    huge = (op_type, [x * 1e18, scale], {"stash_type": 11}, opset, wrt)
    *_, reference = _first_order(huge, np.float64, rounded_to=np.float32)
    *_, got = _first_order(huge, np.float32, rounded_to=np.float32)
    _assert_close(got, reference, "stash_type 11", tolerance=1e-4)
