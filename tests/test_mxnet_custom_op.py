"""MXNet's custom Python operators (``mixrt.operator``): registration, ``nd.Custom`` with
autograd, ``sym.Custom`` through the executor, ``assign``'s requests and the profiler's names
(MXNet 1.9.1's values for the same calls, 2026-11-24)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mixrt import autograd, gluon, init, nd, operator, profiler, sym
from mixrt.errors import InputError


class Sigmoid(operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], 1 / (1 + nd.exp(-in_data[0])))
        nd.zeros((2, 2))  # an op inside: profiled as "<op_type>::_zeros"

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        y = out_data[0]
        self.assign(in_grad[0], req[0], out_grad[0] * y * (1 - y))


@operator.register("test_sigmoid")
class SigmoidProp(operator.CustomOpProp):
    def create_operator(self, ctx, in_shapes, in_dtypes):
        return Sigmoid()


class ScaleSplit(operator.CustomOp):
    """Two outputs, ``scale * x`` and ``x + offset`` (an auxiliary state)."""

    def __init__(self, scale):
        self.scale = scale

    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0] * self.scale)
        self.assign(out_data[1], req[1], in_data[0] + aux[0])

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], out_grad[0] * self.scale + out_grad[1])


@operator.register("test_scale_split")
class ScaleSplitProp(operator.CustomOpProp):
    def __init__(self, scale):
        super().__init__(need_top_grad=True)
        self.scale = float(scale)  # MXNet hands every parameter over as a string
        self.given = scale

    def list_outputs(self):
        return ["scaled", "shifted"]

    def list_auxiliary_states(self):
        return ["offset"]

    def infer_shape(self, in_shape):
        return in_shape[:1], [in_shape[0], in_shape[0]], [in_shape[0]]

    def create_operator(self, ctx, in_shapes, in_dtypes):
        assert isinstance(self.given, str)
        return ScaleSplit(self.scale)


X = np.array([0.0, 1.0, 2.0, 3.0], dtype=np.float32)
SIGMOID = np.array([0.5, 0.7310586, 0.880797, 0.95257413], dtype=np.float32)
SIGMOID_GRAD = np.array([0.25, 0.19661193, 0.10499363, 0.04517666], dtype=np.float32)


def test_nd_custom_forward_and_backward_as_mxnet():
    x = nd.array(X)
    x.attach_grad()
    with autograd.record():
        y = nd.Custom(x, op_type="test_sigmoid")
    y.backward()
    np.testing.assert_allclose(y.asnumpy(), SIGMOID, rtol=1e-6)
    np.testing.assert_allclose(x.grad.asnumpy(), SIGMOID_GRAD, rtol=1e-6)


def test_nd_custom_with_outputs_aux_and_string_parameters():
    x, offset = nd.array(X), nd.array([10, 20, 30, 40])
    x.attach_grad()
    with autograd.record():
        scaled, shifted = nd.Custom(x, offset, op_type="test_scale_split", scale=3)
        (scaled + shifted).backward()
    np.testing.assert_allclose(scaled.asnumpy(), 3 * X)
    np.testing.assert_allclose(shifted.asnumpy(), X + [10, 20, 30, 40])
    np.testing.assert_allclose(x.grad.asnumpy(), np.full(4, 4.0))


def test_sym_custom_runs_through_the_executor():
    data = sym.Variable("data")
    net = sym.Custom(data=data, op_type="test_sigmoid", name="act")
    assert net.list_outputs() == ["act_output"]
    grad = nd.zeros(4)
    executor = net.bind("cpu", {"data": nd.array(X)}, args_grad={"data": grad})
    executor.forward(is_train=True)
    np.testing.assert_allclose(np.asarray(executor.outputs[0].asnumpy()
                                          if hasattr(executor.outputs[0], "asnumpy")
                                          else executor.outputs[0]), SIGMOID, rtol=1e-6)
    executor.backward([nd.ones(4)])
    np.testing.assert_allclose(grad.asnumpy(), SIGMOID_GRAD, rtol=1e-6)


def test_sym_custom_infers_shapes_from_the_property():
    net = sym.Custom(sym.Variable("x"), sym.Variable("off"), op_type="test_scale_split",
                     scale=2, name="ss")
    _, out_shapes, _ = net.infer_shape(x=(3, 5), off=(3, 5))
    assert list(out_shapes) == [(3, 5), (3, 5)]


@pytest.mark.parametrize("req, expected", [("null", [1, 1]), ("write", [5, 5]),
                                           ("inplace", [5, 5]), ("add", [6, 6])])
def test_assign_honours_the_request(req, expected):
    dst = nd.ones(2)
    operator.CustomOp().assign(dst, req, nd.full((2,), 5))
    np.testing.assert_array_equal(dst.asnumpy(), expected)


def test_bad_requests_and_names_are_input_errors():
    with pytest.raises(InputError, match="req must be one of"):
        operator.CustomOp().assign(nd.ones(1), "overwrite", nd.ones(1))
    with pytest.raises(InputError, match="not registered"):
        nd.Custom(nd.ones(1), op_type="no_such_custom_op")
    with pytest.raises(InputError, match="op_type"):
        nd.Custom(nd.ones(1))
    with pytest.raises(InputError, match="CustomOpProp"):
        operator.register("not_a_prop")(object)
    with pytest.raises(InputError, match="takes 2 inputs"):
        nd.Custom(nd.ones(1), op_type="test_scale_split", scale=1)


def test_property_defaults_are_mxnets():
    prop = operator.CustomOpProp()
    assert (prop.list_arguments(), prop.list_outputs(), prop.list_auxiliary_states()) == \
        (["data"], ["output"], [])
    assert prop.infer_shape([[2, 3]]) == ([[2, 3]], ([2, 3],), ())
    assert prop.infer_type([np.float32]) == ([np.float32], [np.float32], [])
    assert prop.declare_backward_dependency([1], [2], [3]) == [1, 2, 3]
    assert operator.CustomOpProp(need_top_grad=False).declare_backward_dependency(
        [1], [2], [3]) == [2, 3]


def test_profiler_names_custom_operators_as_mxnet(tmp_path):
    profiler.set_config(filename=str(tmp_path / "custom.json"), aggregate_stats=True)
    profiler.set_state("run")
    try:
        x = nd.array(X)
        x.attach_grad()
        with autograd.record():
            y = nd.Custom(x, op_type="test_sigmoid")
        y.backward()
        (x + 1).sqrt()
        stats = json.loads(profiler.dumps(format="json", reset=True))["Time"]
    finally:
        profiler.set_state("stop")
    assert {"test_sigmoid::pure_python", "_backward_test_sigmoid::pure_python",
            "test_sigmoid::_zeros"} <= set(stats["Custom Operator"])
    assert {"_plus_scalar", "sqrt"} <= set(stats["operator"])


class _DenseThenSigmoid(gluon.HybridBlock):
    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.dense = gluon.nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x):
        return F.Custom(self.dense(x), op_type="test_sigmoid")


def test_hybridized_block_runs_and_differentiates_a_custom_op():
    grads = []
    for hybridize in (False, True):
        net = _DenseThenSigmoid()
        net.initialize(init.Constant(0.1))
        if hybridize:
            net.hybridize()
        x = nd.array(np.arange(8.0).reshape(2, 4))
        with autograd.record():
            y = net(x)
        y.backward()
        grads.append(net.dense.weight.grad().asnumpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5)
    assert np.abs(grads[0]).sum() > 0
