"""MXNet's autograd where mixrt's tape used to refuse what MXNet computes (values from
MXNet 1.9.1 for the same calls, 2026-11-24)."""

from __future__ import annotations

import numpy as np
import pytest

from mixrt import autograd, gluon, nd
from mixrt.errors import GradientError


def _second_order(op, x_values):
    x = nd.array(x_values)
    x.attach_grad()
    with autograd.record():
        y = op(x)
        dx = autograd.grad(y, x, create_graph=True, retain_graph=True)[0]
    dx.backward()
    return dx.asnumpy(), x.grad.asnumpy()


@pytest.mark.parametrize("op", [lambda x: nd.radians(x), lambda x: 3 * x + 1,
                                lambda x: nd.clip(x, 0.2, 0.8)])
def test_the_gradient_of_a_linear_function_differentiates_to_zero(op):
    # MXNet keeps such a gradient in the recorded graph: its own gradient is zero
    dx, ddx = _second_order(op, [0.5, 0.1])
    assert dx.shape == (2,)
    np.testing.assert_array_equal(ddx, [0.0, 0.0])


def test_radians_first_and_second_order_as_mxnet():
    dx, ddx = _second_order(nd.radians, [0.5, -1.0])
    np.testing.assert_allclose(dx, [0.01745329, 0.01745329], rtol=1e-6)
    np.testing.assert_array_equal(ddx, [0.0, 0.0])


def test_two_gradients_of_one_dense_layer_share_its_forward():
    # the first grad (create_graph=False) frees what it read; the second still passes
    # through the weight's Transpose, whose gradient reads nothing saved
    net = gluon.nn.Dense(2, flatten=False, in_units=3)
    net.initialize()
    x = nd.array(np.arange(12.0).reshape(2, 2, 3))
    x.attach_grad()
    with autograd.record():
        y = net(x)
        head = nd.ones_like(y)
        x_grad = autograd.grad(y, x, head_grads=head, create_graph=True,
                               retain_graph=True)[0]
        w = net.weight.data()
        autograd.grad(x_grad, w, head_grads=nd.ones_like(x_grad), create_graph=False)
        w_grad = autograd.grad(y, w, head_grads=head, create_graph=True,
                               retain_graph=True)[0]
    np.testing.assert_allclose(w_grad.asnumpy(), np.tile(
        np.arange(12.0).reshape(4, 3).sum(axis=0), (2, 1)))


def test_a_freed_node_whose_gradient_reads_saved_values_is_still_refused():
    x = nd.array([1.0, 2.0])
    x.attach_grad()
    with autograd.record():
        y = nd.exp(x)
    y.backward()
    with pytest.raises(GradientError, match="freed"):
        y.backward()


def test_get_symbol_gives_the_recorded_computation():
    x, z = nd.ones((1,)), nd.ones((1,))
    x.attach_grad()
    z.attach_grad()
    with autograd.record():
        y = x * x + 2 * z - 1
    symbol = autograd.get_symbol(y)
    assert symbol.list_arguments() == ["var0", "var1"]
    executor = symbol.bind("cpu", {"var0": nd.array([3.0]), "var1": nd.array([2.0])})
    np.testing.assert_allclose(executor.forward()[0].asnumpy(), [12.0])
    with autograd.record():
        y = x * x + 2 * x - 1
    assert autograd.get_symbol(y).list_arguments() == ["var0"]


def test_get_symbol_refuses_what_has_no_recording():
    with pytest.raises(GradientError, match="not computed under"):
        autograd.get_symbol(nd.ones((2,)))


def test_a_second_backward_from_a_freed_head_is_refused_as_in_mxnet():
    x = nd.ones((2, 2))
    x.attach_grad()
    with autograd.record():
        y = x + 1  # its gradient reads nothing saved, and still: the graph is gone
    y.backward()
    with pytest.raises(GradientError, match="freed"):
        y.backward()
