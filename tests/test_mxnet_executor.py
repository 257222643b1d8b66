"""MXNet's symbolic Executor, its DataParallelExecutorGroup and ``mx.contrib.autograd``, as
MXNet 1.9.1 documents and computes them (values worked out by hand, checked against
MXNet 1.9.1 for the same calls)."""

from __future__ import annotations

import numpy as np
import pytest

from mixrt import nd, sym
from mixrt.context import cpu
from mixrt.contrib import autograd as contrib_autograd
from mixrt.errors import GradientError, InputError
from mixrt.io import DataBatch
from mixrt.module.executor_group import split_input_slice
from mixrt.module.module import Module
from mixrt.name import NameManager


def test_bound_ndarrays_are_the_executors_own():
    """Writing into arg_dict changes the next forward; backward writes into the args_grad
    arrays given; outputs are NDArrays."""
    x, y = sym.Variable("x"), sym.Variable("y")
    lhs, rhs = nd.array([[1.0, 2.0]]), nd.array([[3.0, 4.0]])
    lhs_grad, rhs_grad = nd.zeros((1, 2)), nd.zeros((1, 2))
    executor = (x * y).bind(cpu(), args=[lhs, rhs], args_grad=[lhs_grad, rhs_grad])
    assert executor.arg_dict["x"] is lhs
    out = executor.forward()[0]
    assert isinstance(out, nd.NDArray)
    np.testing.assert_array_equal(out.asnumpy(), [[3.0, 8.0]])
    executor.arg_dict["x"][:] = 2.0
    executor.forward(is_train=True)
    np.testing.assert_array_equal(executor.outputs[0].asnumpy(), [[6.0, 8.0]])
    executor.backward([nd.ones((1, 2))])
    np.testing.assert_array_equal(lhs_grad.asnumpy(), [[3.0, 4.0]])
    np.testing.assert_array_equal(rhs_grad.asnumpy(), [[2.0, 2.0]])


def test_reshape_shares_memory_and_refuses_growth():
    x = sym.Variable("x")
    executor = sym.FullyConnected(x, num_hidden=4, name="fc").simple_bind(
        cpu(), x=(5, 4), grad_req="null")
    executor.arg_dict["x"][:] = 1
    executor.arg_dict["fc_weight"][:] = 1
    smaller = executor.reshape(x=(3, 4))
    smaller.forward()
    np.testing.assert_array_equal(smaller.outputs[0].asnumpy(), 4)
    np.testing.assert_array_equal(executor.outputs[0].asnumpy()[:3], 4)  # the same memory
    with pytest.raises(InputError, match="allow_up_sizing"):
        executor.reshape(x=(6, 4))
    assert executor.reshape(x=(6, 4), allow_up_sizing=True).arg_dict["x"].shape == (6, 4)


def test_softmax_output_backward_is_its_loss_gradient():
    """MXNet's SoftmaxOutput backward: softmax - one_hot(label), whatever the head
    gradient."""
    data = nd.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    net = sym.SoftmaxOutput(sym.Variable("data"), name="softmax")
    executor = net.simple_bind(cpu(), grad_req={"data": "write"}, data=(2, 3))
    executor.arg_dict["softmax_label"][:] = nd.array([2, 0])
    probs = executor.forward(is_train=True, data=data)[0].asnumpy()
    executor.backward()
    expected = probs - np.eye(3)[[2, 0]]
    np.testing.assert_allclose(executor.grad_dict["data"].asnumpy(), expected, rtol=1e-6)


def test_backward_after_an_inference_forward_and_debug_str():
    x = sym.Variable("x")
    executor = (x * x).simple_bind(cpu(), grad_req={"x": "write"}, x=(2,))
    with pytest.raises(GradientError, match="forward first"):
        executor.backward()
    executor.forward(x=nd.array([1.0, 3.0]))
    executor.backward()
    np.testing.assert_array_equal(executor.grad_dict["x"].asnumpy(), [2.0, 6.0])
    assert "Total 0 MB allocated" in executor.debug_str()


def test_batches_split_over_contexts_by_workload():
    assert split_input_slice(10, [1, 1]) == [slice(0, 5), slice(5, 10)]
    assert split_input_slice(9, [1, 2]) == [slice(0, 3), slice(3, 9)]
    with pytest.raises(InputError, match="no rows"):
        split_input_slice(1, [1, 1])


def test_module_on_two_contexts_gives_input_gradients_and_trains():
    """y = a + 2b on cpu(0) and cpu(1): input gradients are 1 and 2; a bias trained by
    SGD (lr 1, rescale 1/batch) on head gradients of ones moves by -1 per step."""
    a, b = sym.Variable("a"), sym.Variable("b")
    mod = Module(a + 2 * b, data_names=["b", "a"], label_names=None,
                 context=[cpu(0), cpu(1)])
    mod.bind(data_shapes=[("b", (4, 3)), ("a", (4, 3))], inputs_need_grad=True)
    mod.init_params()
    mod.forward(DataBatch(data=[nd.ones((4, 3)), nd.ones((4, 3))]), is_train=True)
    mod.backward([nd.ones((4, 3))])
    b_grad, a_grad = mod.get_input_grads()
    np.testing.assert_array_equal(a_grad.asnumpy(), 1)
    np.testing.assert_array_equal(b_grad.asnumpy(), 2)

    fc = Module(sym.FullyConnected(sym.Variable("data"), num_hidden=2, name="fc"),
                label_names=None, context=[cpu(0), cpu(1)])
    fc.bind(data_shapes=[("data", (4, 2))])
    fc.init_params()
    fc.init_optimizer(optimizer_params={"learning_rate": 1})
    for batch in (4, 6):  # the second batch size reshapes the executors
        fc.forward(DataBatch(data=[nd.ones((batch, 2))]), is_train=True)
        fc.backward([nd.ones((batch, 2))])
        fc.update()
    assert fc.get_outputs()[0].shape == (6, 2)
    # rescale_grad stays 1/4 (the bound batch): -1, then -1.5
    np.testing.assert_allclose(fc.get_params()[0]["fc_bias"].asnumpy(), -2.5)


def test_module_set_params_checks_missing_and_extra_names():
    mod = Module(sym.FullyConnected(sym.Variable("data"), num_hidden=2, name="fc"),
                 label_names=None)
    mod.bind(data_shapes=[("data", (1, 2))])
    full = {"fc_weight": nd.ones((2, 2)), "fc_bias": nd.zeros((2,))}
    mod.set_params(full, {})
    with pytest.raises(RuntimeError, match="fc_bias"):
        mod.set_params({"fc_weight": nd.ones((2, 2))}, {})
    with pytest.raises(ValueError, match="fc_2"):
        mod.set_params({**full, "fc_2": nd.ones((2,))}, {}, allow_missing=True)


def test_contrib_autograd_grad_and_loss_and_sections():
    x = nd.array([[1.0, 2.0]])
    grads, loss = contrib_autograd.grad_and_loss(lambda v: v * v)(x)
    np.testing.assert_array_equal(grads[0].asnumpy(), [[2.0, 4.0]])
    np.testing.assert_array_equal(loss.asnumpy(), [[1.0, 4.0]])
    with contrib_autograd.train_section():
        with contrib_autograd.test_section():
            assert not contrib_autograd.set_is_training(False)
    with pytest.raises(InputError, match="argument 1"):
        contrib_autograd.grad(lambda v, mode: v, argnum=1)(x, True)


def _internal_count(executor) -> int:
    return len(executor.get_optimized_symbol().get_internals())


def test_get_optimized_symbol_eliminates_common_expressions(monkeypatch):
    a, b = sym.Variable("a"), sym.Variable("b")
    values = {"a": np.array([[1.0, 2.0]], np.float32), "b": np.array([[3.0, 5.0]], np.float32)}
    net = (a + b) + (a + b)
    monkeypatch.setenv("MXNET_ELIMINATE_COMMON_EXPR", "0")
    plain = net.simple_bind(cpu(), a=(1, 2), b=(1, 2))
    monkeypatch.setenv("MXNET_ELIMINATE_COMMON_EXPR", "1")
    merged = net.simple_bind(cpu(), a=(1, 2), b=(1, 2))
    assert _internal_count(plain) == _internal_count(merged) + 1
    for executor in (plain, merged):
        out = executor.forward(is_train=True, **values)[0].asnumpy()
        np.testing.assert_array_equal(out, [[8.0, 14.0]])
        executor.backward(out_grads=[nd.ones((1, 2))])
        np.testing.assert_array_equal(executor.grad_dict["a"].asnumpy(), [[2.0, 2.0]])
    # two outputs of one value stay two arrays under their own names (a copy, as MXNet's)
    shifted = a + 1
    group = sym.Group([a * shifted, a * shifted])  # one product kept, one copy added
    grouped = group.simple_bind(cpu(), a=(1, 2))
    optimized = grouped.get_optimized_symbol()
    assert optimized.list_outputs() == group.list_outputs()
    assert len(optimized.get_internals()) == len(group.get_internals())
    # dropout draws are never merged
    drops = sym.Dropout(a) + sym.Dropout(a)
    kept = drops.simple_bind(cpu(), a=(1, 2)).get_optimized_symbol()
    assert len(kept.get_internals()) == len(drops.get_internals())


def test_simple_bind_gives_every_float_argument_a_gradient():
    data, label = sym.Variable("data"), sym.Variable("label")
    net = sym.FullyConnected(data, num_hidden=2, name="fc") + sym.Cast(label, dtype="float32")
    executor = net.simple_bind(cpu(), data=(3, 4), label=(3, 2),
                               type_dict={"label": "int32"})
    assert sorted(executor.grad_dict) == ["data", "fc_bias", "fc_weight"]
    assert net.simple_bind(cpu(), grad_req="null", data=(3, 4), label=(3, 2)).grad_dict == {}


def test_debug_str_counts_what_the_forward_keeps_for_the_backward():
    data = sym.Variable("data")
    for _ in range(4):
        data = data * data

    def allocated(net, **options):
        text = net.simple_bind(cpu(), data=(64, 1024), **options).debug_str()
        return int(text.split("Total ")[1].split(" MB")[0])
    training, inference = allocated(data), allocated(data, grad_req="null")
    assert training > inference
    # behind stop_gradient no gradient flows, so nothing is kept: the inference amount
    assert allocated(sym.stop_gradient(data)) == inference


@pytest.mark.parametrize("make_head, options, expected", [
    (sym.make_loss, {}, 1.0),
    (sym.make_loss, {"grad_scale": 2.0}, 1.0),  # make_loss has no parameters
    (sym.MakeLoss, {"grad_scale": 2.0}, 2.0),
    (sym.MakeLoss, {"normalization": "batch"}, 0.5),
    (sym.MakeLoss, {"normalization": "valid", "valid_thresh": 0.6}, 0.5),
])
def test_loss_heads_ignore_the_head_gradient_given(make_head, options, expected):
    """MXNet 1.9.1's make_loss and MakeLoss backpropagate their own gradient, whatever
    out_grads backward is given."""
    head = make_head(sym.Variable("x") * 1, **options)
    executor = head.simple_bind(cpu(), x=(2, 3))
    executor.forward(is_train=True, x=np.array([[1, -2, 0.5], [0, 3, -1]], np.float32))
    for out_grads in (None, [nd.ones((2, 3)) * 3]):
        executor.backward(out_grads)
        np.testing.assert_allclose(executor.grad_dict["x"].asnumpy(),
                                   np.full((2, 3), expected), rtol=1e-6)


def test_loss_head_output_names_are_mxnets():
    x = sym.Variable("x")
    with NameManager():  # automatic names counted from 0
        assert sym.make_loss(x).list_outputs() == ["make_loss0_loss"]
    assert sym.make_loss(x, name="foo").list_outputs() == ["foo_loss"]
    assert sym.MakeLoss(x, name="m").list_outputs() == ["m_output"]
    assert sym.load_json(sym.make_loss(x, name="bar").tojson()).list_outputs() == ["bar_loss"]


def test_monitor_sees_every_layers_outputs_and_the_gradients_it_passes_back():
    """MXNet 1.9.1's executor shows these to a monitor for this net (values from it; the
    gradient fc_0 passes to ``data``, which MXNet does not compute, is left out)."""
    net = sym.FullyConnected(sym.Variable("data"), num_hidden=2, name="fc_0")
    net = sym.Activation(net, act_type="sigmoid", name="act_0")
    net = sym.FullyConnected(net, num_hidden=2, name="fc_1")
    net = sym.Activation(net, act_type="sigmoid", name="act_1")
    net = sym.LinearRegressionOutput(net, name="softmax", grad_scale=2)
    executor = net.simple_bind(cpu(), grad_req={"fc_0_weight": "write"}, data=(1, 2),
                               softmax_label=(1, 2))
    executor.copy_params_from({"fc_0_weight": nd.array([[.15, .20], [.25, .30]]),
                               "fc_0_bias": nd.array([.35, .35]),
                               "fc_1_weight": nd.array([[.40, .45], [.50, .55]]),
                               "fc_1_bias": nd.array([.60, .60])})
    seen = {}
    executor.set_monitor_callback(
        lambda name, array: seen.setdefault(name, float(np.abs(array.asnumpy()).mean())))
    executor.forward(is_train=True, data=nd.array([[0.05, 0.10]]),
                     softmax_label=nd.array([[0.01, 0.99]]))
    executor.backward()
    want = {"fc_0_output": 0.385, "act_0_output": 0.59507716, "fc_1_output": 1.1654137,
            "act_1_output": 0.7621468, "softmax_output": 0.7621468,
            "softmax_backward_output0": 0.4792183, "softmax_backward_output1": 0.0,
            "act_1_backward_output": 0.088298395, "fc_1_backward_output0": 0.038860314,
            "fc_1_backward_output1": 0.05254436, "fc_1_backward_output2": 0.088298395,
            "act_0_backward_output": 0.009362806, "fc_0_backward_output1": 0.00070221035,
            "fc_0_backward_output2": 0.009362806}
    assert set(want) <= set(seen) and set(seen) - set(want) == {"fc_0_backward_output0"}
    for name, value in want.items():
        assert seen[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


@pytest.mark.parametrize("make, label", [
    (sym.LinearRegressionOutput, [[0.5, 0.0, 1.0], [1.0, 1.0, 0.0]]),
    (sym.MAERegressionOutput, [[0.5, 0.0, 1.0], [1.0, 1.0, 0.0]]),
    (sym.SoftmaxOutput, [2.0, 0.0])])
def test_output_layers_pass_their_labels_no_gradient(make, label):
    """MXNet 1.9.1's output layers leave a label's gradient at zero."""
    head = make(sym.Variable("data"), name="out")
    executor = head.simple_bind(cpu(), data=(2, 3))
    assert sorted(executor.grad_dict) == ["data", "out_label"]
    executor.forward(is_train=True, data=nd.array([[1, 2, 3], [0, 1, 0.5]]),
                     out_label=nd.array(label))
    executor.backward()
    assert not executor.grad_dict["out_label"].asnumpy().any()
    assert executor.grad_dict["data"].asnumpy().any()
