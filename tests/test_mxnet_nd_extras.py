"""MXNet 1.9.1 odds of mx.nd and around it: the optimizer update operators under mx.nd,
out= on every operator, nd.CachedOp, mx.runtime.Features, the cpu_shared/cpu_pinned
contexts, the DataLoader's MXNet options and the type of a metric's value. Expected values
are MXNet 1.9.1's for the same calls."""
import mixrt  # noqa: F401,I001
import numpy as np
import pytest
from mixrt import autograd, gluon, metric, nd, runtime, sym
from mixrt.context import Context, cpu, cpu_pinned, cpu_shared
from mixrt.errors import InputError


def test_every_optimizer_update_operator_is_an_nd_function():
    from mixrt import optimizer_ops
    for name in optimizer_ops.FUNCTIONS:
        assert callable(getattr(nd, name)), name
    weight, grad = nd.array([1.0, -2.0, 3.0]), nd.array([0.5, -0.5, 0.0])
    nd.signsgd_update(weight, grad, lr=0.1, out=weight)
    # w - lr * sign(g) (MXNet's sign(0) is 0)
    np.testing.assert_allclose(weight.asnumpy(), [0.9, -1.9, 3.0], rtol=1e-6)


def test_out_writes_into_the_given_array_and_returns_it():
    x, out = nd.array([1.0, 2.0, -3.0]), nd.zeros((3,))
    assert nd.square(x, out=out) is out
    np.testing.assert_array_equal(out.asnumpy(), [1, 4, 9])
    view = out[1:3]
    nd.relu(x[1:3], out=view)  # a view writes through, as MXNet's does
    np.testing.assert_array_equal(out.asnumpy(), [1, 2, 0])
    with pytest.raises(InputError, match="shape"):
        nd.exp(x, out=nd.zeros((2,)))


def test_cached_op_runs_a_symbol_and_writes_out():
    op = nd.CachedOp(sym.Convolution(kernel=(3, 3), num_filter=2) + 2)
    data, weight, bias = nd.ones((1, 1, 4, 4)), nd.ones((2, 1, 3, 3)), nd.ones((2,))
    first = op(data, weight, bias)
    np.testing.assert_array_equal(first.asnumpy(), np.full((1, 2, 2, 2), 12.0))
    bias[:] = 2
    out = nd.zeros((1, 2, 2, 2))
    assert op(data, weight, bias, out=out) is out
    np.testing.assert_array_equal(out.asnumpy(), first.asnumpy() + 1)
    with pytest.raises(InputError, match="3 input"):
        op(data, weight)


def test_cached_op_records_its_ops_for_backward():
    a, b = sym.Variable("a"), sym.Variable("b")
    op = nd.CachedOp(a * b + a)
    x, y = nd.array([1.0, 2.0]), nd.array([3.0, 5.0])
    x.attach_grad()
    with autograd.record():
        z = op(x, y)
    z.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), [4.0, 6.0])  # d/dx (x*y + x) = y + 1


def test_runtime_features_are_mxnets_list():
    features = runtime.Features()
    assert runtime.Features() is features
    assert list(features)[:3] == ["CUDA", "CUDNN", "NCCL"] and len(features) == 32
    assert features.is_enabled("int64_tensor_size") is True
    # cuDNN where it loads and starts beside a GPU (the convolutions call it)
    from mixrt.base import cuda_libraries
    with_cudnn = features.is_enabled("CUDA") and cuda_libraries.cudnn()[0] is not None
    assert features.is_enabled("CUDNN") is with_cudnn
    assert repr(features["CUDNN"]) == ("✔ CUDNN" if with_cudnn else "✖ CUDNN")
    with pytest.raises(RuntimeError, match="unknown"):
        features.is_enabled("NO_SUCH_FEATURE")


def test_the_shared_and_pinned_host_contexts():
    shared = Context("cpu_shared", 0)
    assert shared == cpu_shared(0) and shared != cpu(0)
    assert (str(shared), shared.device_typeid, cpu_pinned(1).device_typeid) == \
        ("cpu_shared(0)", 5, 3)
    array = nd.zeros((1, 2, 3), ctx=shared)
    assert array.context == shared
    np.testing.assert_array_equal(array.asnumpy(), 0)
    with pytest.raises(InputError, match="context type"):
        Context("tpu", 0)


def test_the_dataloaders_mxnet_options():
    data = gluon.data.ArrayDataset(np.arange(10, dtype=np.float32))
    pinned = gluon.data.DataLoader(data, 4, pin_memory=True, pin_device_id=1)
    assert all(batch.context == cpu_pinned(1) for batch in pinned)
    for thread_pool in (True, False):
        loader = gluon.data.DataLoader(data, 3, num_workers=2, thread_pool=thread_pool,
                                       auto_reload=True)
        for _epoch in range(2):  # the second epoch was started when the first ended
            seen = np.concatenate([b.asnumpy() for b in loader])
            np.testing.assert_array_equal(seen, np.arange(10))


def test_a_metrics_value_is_a_python_float():
    pred = nd.array([[0.3, 0.7], [0, 1.0], [0.4, 0.6]])
    label = nd.array([0, 1, 1])
    acc = metric.create("acc")
    acc.update([label], [pred])
    _, value = acc.get()
    assert type(value) is float and value == 2 / 3
    assert value == np.float32(2) / 3  # the test's float32 expectation under NumPy 2
