"""Gradients of the trigonometric functions, Erf, the step functions, Max/Min, Clip and the
activations against float64 finite differences (gradcheck.check_gradient). Evaluation points
stay away from kinks and ties; the tie and bound rules have their own hand-computed tests."""

import numpy as np
import pytest

import mixrt
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

from grad.gradcheck import check_gradient

rng = np.random.default_rng(5)


def randn(*shape):
    return rng.standard_normal(shape)


def away_from_zero(*shape, gap=0.1):
    """Normal samples pushed at least ``gap`` away from 0, where the kinks are."""
    x = randn(*shape)
    return np.sign(x) * (np.abs(x) + gap)


def between(low, high, *shape):
    return rng.uniform(low, high, shape)


# -- smooth unary functions ---------------------------------------------------------------------

@pytest.mark.parametrize("op_type, make", [
    ("Sin", randn), ("Cos", randn), ("Tan", lambda *s: between(-1.2, 1.2, *s)),
    ("Asin", lambda *s: between(-0.9, 0.9, *s)), ("Acos", lambda *s: between(-0.9, 0.9, *s)),
    ("Atan", randn), ("Sinh", randn), ("Cosh", randn), ("Asinh", randn),
    ("Acosh", lambda *s: between(1.2, 3.0, *s)), ("Atanh", lambda *s: between(-0.9, 0.9, *s)),
    ("Erf", randn)])
def test_trigonometric_and_erf(op_type, make):
    check_gradient(op_type, [make(3, 4)])


@pytest.mark.parametrize("op_type, opset", [
    ("Floor", 13), ("Ceil", 13), ("Round", 11), ("Sign", 13), ("Floor", 7)])
def test_step_functions_have_zero_gradient(op_type, opset):
    # x + 0.25 keeps every point off the integers and half-integers where the steps are
    x = np.round(randn(3, 4)) + 0.25
    grads = check_gradient(op_type, [x], opset=opset)
    np.testing.assert_array_equal(grads[0], 0)


# -- Max, Min, Clip -----------------------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["Max", "Min"])
def test_max_min_variadic_with_broadcast(op_type):
    check_gradient(op_type, [randn(2, 3), randn(3), randn(2, 1)])
    check_gradient(op_type, [randn(2, 3), randn(2, 3)], opset=8)
    check_gradient(op_type, [randn(2, 3)])


def sum_gradients(op_type, inputs, attributes=None, *, opset=17):
    """d sum(Y) / d every input, read from the backward graph (no finite differences)."""
    graph = Graph(name=f"sum_{op_type}", opsets={"": opset})
    names = [f"x{i}" for i in range(len(inputs))]
    for name, x in zip(names, inputs):
        graph.inputs.append(Value(name, TensorType(x.dtype, x.shape)))
    graph.nodes.append(Node(op_type, names, ["y"], name=op_type, opset=opset,
                            attributes=attributes or {}))
    graph.nodes.append(Node("ReduceSum", ["y"], ["loss"], name="loss", opset=17,
                            attributes={"keepdims": 0}))
    graph.outputs = [Value("loss")]
    joint = gradient_graph(graph, "loss", names)
    session = mixrt.Session(joint.graph, opt_level=0)
    return session.run([joint.grads[name] for name in names], dict(zip(names, inputs)))


@pytest.mark.parametrize("op_type", ["Max", "Min"])
def test_max_min_ties_split_the_gradient_equally(op_type):
    a = np.array([1.0, 2.0, 3.0, 4.0])
    b = np.array([1.0, 5.0, 3.0, -4.0])
    c = np.array([1.0, 2.0, 0.0, 4.0])
    d_a, d_b, d_c = sum_gradients(op_type, [a, b, c])
    if op_type == "Max":  # winners: all three | b | a, b | a, c
        expected = [[1 / 3, 0, 1 / 2, 1 / 2], [1 / 3, 1, 1 / 2, 0], [1 / 3, 0, 0, 1 / 2]]
    else:  # winners: all three | a, c | c | b
        expected = [[1 / 3, 1 / 2, 0, 0], [1 / 3, 0, 0, 1], [1 / 3, 1 / 2, 1, 0]]
    np.testing.assert_allclose([d_a, d_b, d_c], expected)


def test_max_tie_with_a_broadcast_operand_sums_its_shares():
    x = np.array([[0.5, 2.0], [0.5, -1.0]])
    d_x, d_bound = sum_gradients("Max", [x, np.array(0.5)])
    np.testing.assert_allclose(d_x, [[0.5, 1.0], [0.5, 0.0]])
    np.testing.assert_allclose(d_bound, 0.5 + 0.5 + 1.0)


@pytest.mark.parametrize("convention", ["inputs", "attributes"])
def test_clip(convention):
    x = np.array([[-2.0, -0.3, 0.2], [0.6, 1.7, -0.05]])
    if convention == "inputs":
        check_gradient("Clip", [x, np.array(-0.5), np.array(0.5)], constants=(1, 2))
        check_gradient("Clip", [x, None, np.array(0.5)], constants=(2,))
        check_gradient("Clip", [x, np.array(-0.5)], constants=(1,))
    else:
        check_gradient("Clip", [x], {"min": -0.5, "max": 0.5}, opset=6)
        check_gradient("Clip", [x], {"max": 0.5}, opset=6)


def test_clip_passes_the_gradient_at_its_bounds():
    x = np.array([-1.0, -0.5, 0.0, 0.5, 1.0])
    d_x, _, _ = sum_gradients("Clip", [x, np.array(-0.5), np.array(0.5)])
    np.testing.assert_array_equal(d_x, [0, 1, 1, 1, 0])


# -- activations --------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type, attributes, opset", [
    ("LeakyRelu", {}, 16), ("LeakyRelu", {"alpha": 0.3}, 6),
    ("Elu", {}, 6), ("Elu", {"alpha": 0.7}, 22),
    ("Selu", {}, 6), ("Selu", {"alpha": 1.2, "gamma": 0.8}, 22),
    ("Softplus", {}, 1), ("Softsign", {}, 22),
    ("HardSigmoid", {}, 6), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 22),
    ("ThresholdedRelu", {"alpha": 0.05}, 10), ("ThresholdedRelu", {}, 22),
    ("Shrink", {}, 9), ("Shrink", {"lambd": 0.05, "bias": 0.3}, 9),
    ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
    ("Mish", {}, 18), ("Swish", {}, 24), ("Swish", {"alpha": 1.3}, 24)])
def test_activation(op_type, attributes, opset):
    # |x| > 0.1 and no |x| near 0.5 or 1: off the kinks of every activation here
    x = np.array([[-2.2, -1.3, -0.7, -0.3], [0.3, 0.8, 1.4, 2.6], [-0.15, 0.15, 3.5, -4.0]])
    check_gradient(op_type, [x], attributes, opset=opset)


@pytest.mark.parametrize("alpha", [1.0, 1.5])
def test_celu_against_its_derivative(alpha):
    """Celu is float32-only (a float64 Celu is an invalid model), too narrow for finite
    differences: its backward is checked against the closed form, 1 for x > 0 and
    exp(x / alpha) below."""
    x = np.array([[-2.2, -1.3, -0.7, -0.3], [0.3, 0.8, 1.4, 2.6], [-0.15, 0.15, 3.5, -4.0]],
                 dtype=np.float32)
    (d_x,) = sum_gradients("Celu", [x], {"alpha": alpha}, opset=12)
    wide = x.astype(np.float64)
    expected = np.where(wide > 0, 1.0, np.exp(wide / alpha))
    assert d_x.dtype == np.float32
    np.testing.assert_allclose(d_x, expected, rtol=2e-6)


def test_hard_swish_on_all_three_pieces():
    check_gradient("HardSwish", [np.array([-4.0, -2.5, -0.5, 0.3, 2.5, 4.0])], opset=14)


@pytest.mark.parametrize("slope_shape", [(4,), (3, 1), (1,), ()])
def test_prelu_slope_gradient_is_summed_to_its_shape(slope_shape):
    check_gradient("PRelu", [away_from_zero(3, 4), randn(*slope_shape)], opset=16)


def test_prelu_opset7():
    check_gradient("PRelu", [away_from_zero(2, 3), randn(3)], opset=7)
