"""Gradients of arithmetic, activations, products, softmax and losses against float64 finite
differences (gradcheck.check_gradient)."""

import numpy as np
import pytest

import mixrt
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

from grad.gradcheck import check_gradient

rng = np.random.default_rng(7)


def randn(*shape):
    return rng.standard_normal(shape)


def positive(*shape):
    return rng.uniform(0.5, 2.0, shape)


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_binary_with_broadcast(op_type):
    check_gradient(op_type, [randn(2, 3, 4), positive(3, 1)])
    check_gradient(op_type, [positive(4), positive(2, 3, 4)])


@pytest.mark.parametrize("op_type, make", [
    ("Neg", randn), ("Exp", randn), ("Log", positive), ("Sqrt", positive),
    ("Reciprocal", positive), ("Abs", randn), ("Relu", randn), ("Sigmoid", randn),
    ("Tanh", randn)])
def test_unary(op_type, make):
    check_gradient(op_type, [make(3, 5)])


def test_zero_d_operands_get_zero_d_gradients():
    check_gradient("Add", [randn(2, 3), np.array(1.5)])
    check_gradient("Mul", [np.array(0.7), np.array(-1.2)])
    check_gradient("ReduceSum", [np.array(2.0)], {"keepdims": 0}, opset=11)


def test_pow_both_operands():
    check_gradient("Pow", [positive(3, 4), randn(4)])


def test_sum_and_mean_variadic():
    check_gradient("Sum", [randn(2, 3), randn(3), randn(1, 3)])
    check_gradient("Mean", [randn(2, 3), randn(2, 3)])


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4, 3)),
    ((3, 4), (4,)), ((4,), (4,))])
def test_matmul(a_shape, b_shape):
    check_gradient("MatMul", [randn(*a_shape), randn(*b_shape)])


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm(trans_a, trans_b):
    a = randn(4, 3) if trans_a else randn(3, 4)
    b = randn(5, 4) if trans_b else randn(4, 5)
    check_gradient("Gemm", [a, b, randn(5)],
                   {"alpha": 0.7, "beta": 1.3, "transA": trans_a, "transB": trans_b})


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_family(op_type, axis):
    check_gradient(op_type, [randn(3, 4, 2)], {"axis": axis})


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
def test_softmax_family_opset11_coerces_to_2d(op_type):
    check_gradient(op_type, [randn(3, 4, 2)], {"axis": 1}, opset=11)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_softmax_cross_entropy(reduction):
    labels = np.array([0, 2, 1, 2])
    check_gradient("SoftmaxCrossEntropyLoss", [randn(4, 3), labels],
                   {"reduction": reduction}, constants=(1,))


def test_softmax_cross_entropy_weights_ignore_index_and_log_prob_output():
    labels = np.array([[0, 2], [1, -1], [2, 2]])
    check_gradient("SoftmaxCrossEntropyLoss", [randn(3, 3, 2), labels, positive(3)],
                   {"ignore_index": -1}, constants=(1,), wrt=[0], outputs=2)


def test_nll_loss():
    labels = np.array([1, 0, 2])
    check_gradient("NegativeLogLikelihoodLoss", [randn(3, 3), labels, positive(3)],
                   {"reduction": "mean"}, constants=(1,), wrt=[0])


def test_dropout_inference_is_identity():
    check_gradient("Dropout", [randn(3, 4)], opset=7)
    check_gradient("Dropout", [randn(3, 4)])


REDUCTIONS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op_type", REDUCTIONS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_axes_attribute(op_type, keepdims):
    x = positive(2, 3, 4)  # positive and tie-free: every reduction is smooth here
    check_gradient(op_type, [x], {"axes": [1, -1], "keepdims": keepdims}, opset=11)
    check_gradient(op_type, [x], {"keepdims": keepdims}, opset=11)


@pytest.mark.parametrize("op_type", REDUCTIONS)
def test_reductions_axes_input(op_type):
    x = positive(2, 3, 4)
    opset = 13 if op_type == "ReduceSum" else 18
    check_gradient(op_type, [x, np.array([0, 2])], {"keepdims": 0}, constants=(1,),
                   opset=opset)
    check_gradient(op_type, [x, np.array([], dtype=np.int64)], {"noop_with_empty_axes": 1},
                   constants=(1,), opset=opset)


def test_reduce_max_splits_ties_equally():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]])
    g = Graph(opsets={"": 17})
    g.inputs = [Value("x")]
    g.nodes = [Node("ReduceMax", ["x"], ["m"], opset=17, attributes={"axes": [1]}),
               Node("ReduceSum", ["m"], ["loss"], opset=17, attributes={"keepdims": 0})]
    g.outputs = [Value("loss")]
    joint = gradient_graph(g, "loss", ["x"])
    (grad,) = mixrt.Session(joint.graph, opt_level=0).run([joint.grads["x"]], {"x": x})
    np.testing.assert_array_equal(grad, [[0, 0.5, 0.5], [1, 0, 0]])


def test_values_computed_from_integers_alone_are_constants_of_the_backward():
    # PyTorch's exporter writes an LSTM's zero initial state as ConstantOfShape(Shape(x)):
    # the shape is an integer, so the state carries no gradient and ConstantOfShape (which
    # has no gradient definition) needs none
    nodes = [Node("Shape", ["x"], ["shape"], name="shape", opset=17),
             Node("ConstantOfShape", ["shape"], ["zeros"], name="zeros", opset=17,
                  attributes={"value": np.array([0.5])}),
             Node("Mul", ["x", "zeros"], ["y"], name="mul", opset=17),
             Node("ReduceSum", ["y"], ["loss"], name="loss", opset=17,
                  attributes={"keepdims": 0})]
    graph = Graph(nodes=nodes, inputs=[Value("x", TensorType(np.dtype(np.float64), (2, 3)))],
                  outputs=[Value("loss")], name="g")
    joint = gradient_graph(graph, "loss", ["x"])
    x = np.arange(6.0).reshape(2, 3)
    (dx,) = mixrt.Session(joint.graph).run([joint.grads["x"]], {"x": x})
    np.testing.assert_array_equal(dx, np.full((2, 3), 0.5))
