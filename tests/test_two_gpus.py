"""Two GPUs: work asked of ``gpu:1`` happens on GPU 1, gives what the CPU gives, and leaves
the calling thread's current CuPy device as it was (a service's own CuPy code keeps its
device whatever mixrt was asked to use).

They run where a machine has two GPUs, and on the fake CuPy with two devices
(``FAKE_CUPY_DEVICES=2``, from tests/test_gpu_paths_on_fake_cupy.py), whose kernels refuse
an array of another GPU as CuPy does between GPUs without peer access: so every kernel must
run with its arrays' GPU current. Elsewhere they skip.
"""

from __future__ import annotations

import threading

import mixrt  # noqa: F401  (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import autograd, gluon, initializer, nd
from mixrt.kvstore.local import LocalStore
from mixrt.models import gluon_zoo
from mixrt.models.zoo import light_model_with_random_weights
from mixrt.ops.device import gpu_count, to_host

pytestmark = pytest.mark.skipif(gpu_count() < 2,
                                reason=f"needs 2 NVIDIA GPUs and CuPy; this machine has "
                                       f"{gpu_count()}")
RNG = np.random.default_rng(0)


@pytest.fixture
def cp():
    """CuPy, with a check that the test left the thread's current device as it found it."""
    import cupy
    before = cupy.cuda.runtime.getDevice()
    yield cupy
    assert cupy.cuda.runtime.getDevice() == before, "mixrt changed the current CUDA device"


def on_gpu_1(array) -> bool:
    return array.device.id == 1


def test_a_session_on_gpu_1_runs_there_from_any_thread(cp):
    model, feeds = light_model_with_random_weights("squeezenet")
    expected = mixrt.Session(model, opt_level=2).run(None, feeds)
    session = mixrt.Session(model, opt_level=2, device="gpu:1")
    results = [session.run(None, feeds) for _ in range(2)]  # discovery, then planned
    worker = threading.Thread(target=lambda: results.append(session.run(None, feeds)))
    worker.start()
    worker.join()
    for outputs in results:
        for got, want in zip(outputs, expected):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_imperative_arrays_and_gradients_on_gpu_1(cp):
    x = RNG.standard_normal((3, 4))
    results = {}
    for ctx in (mixrt.cpu(), mixrt.gpu(1)):
        a = nd.array(x, ctx=ctx)
        a.attach_grad()
        with autograd.record():
            y = (nd.exp(a * 0.5) + a[:, 1:3].sum(axis=1, keepdims=True)).mean()
        y.backward()
        assert a.grad.ctx == ctx and y.ctx == ctx
        if ctx != mixrt.cpu():
            assert on_gpu_1(a.grad._read()) and on_gpu_1(y._read())
        results[str(ctx)] = (y.asnumpy(), a.grad.asnumpy())
    (y_cpu, g_cpu), (y_gpu, g_gpu) = results.values()
    np.testing.assert_allclose(y_gpu, y_cpu, rtol=1e-6)
    np.testing.assert_allclose(g_gpu, g_cpu, rtol=1e-6)


def test_arrays_are_made_on_the_gpu_asked_for(cp):
    ctx = mixrt.gpu(1)
    made = [nd.zeros((2, 3), ctx=ctx), nd.ones(4, ctx=ctx), nd.full((2,), 7.0, ctx=ctx),
            nd.empty((3,), ctx=ctx), nd.arange(0, 5, ctx=ctx), nd.array([1.0, 2.0], ctx=ctx),
            nd.one_hot(nd.array([0, 2], ctx=ctx, dtype="int64"), 3)]
    for array in made:
        assert array.ctx == ctx and on_gpu_1(array._read())
    np.testing.assert_array_equal((made[1] * 2).asnumpy(), [2.0] * 4)


def test_arrays_move_between_gpus(cp):
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    first = nd.array(x, ctx=mixrt.gpu(0))
    second = first.as_in_context(mixrt.gpu(1))
    assert second.ctx == mixrt.gpu(1) and on_gpu_1(second._read())
    np.testing.assert_array_equal((second + 1).asnumpy(), x + 1)
    back = second.copyto(mixrt.gpu(0))
    assert back._read().device.id == 0
    np.testing.assert_array_equal(back.asnumpy(), x)
    into = nd.zeros((2, 5), ctx=mixrt.gpu(1))
    first.copyto(into)  # an NDArray of another GPU as the target
    assert on_gpu_1(into._read())
    np.testing.assert_array_equal(into.asnumpy(), x)


def test_a_gluon_network_trains_on_gpu_1_as_on_the_cpu(cp):
    x = RNG.standard_normal((4, 12))
    labels = RNG.integers(0, 5, 4)
    runs = {}
    for ctx in (mixrt.cpu(), mixrt.gpu(1)):
        for hybrid in (False, True):
            mixrt.random.seed(7)
            net = gluon_zoo.get_model("mlp", hidden=(16,), classes=5)
            net.initialize(initializer.Xavier(), ctx=ctx)
            net.cast("float64")
            net.hybridize(hybrid)
            trainer = gluon.Trainer(net.collect_params(), "sgd",
                                    {"learning_rate": 0.1, "momentum": 0.9})
            loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
            for _ in range(3):
                with autograd.record():
                    loss = loss_fn(net(nd.array(x, ctx=ctx)), nd.array(labels, ctx=ctx))
                loss.backward()
                trainer.step(4)
            params = net.collect_params().values()
            assert all(p.data().ctx == ctx for p in params)
            if ctx != mixrt.cpu():
                assert all(on_gpu_1(p.raw()) for p in params)
            runs[str(ctx), hybrid] = [p.data().asnumpy() for p in params]
    for hybrid in (False, True):
        for got, want in zip(runs["gpu(1)", hybrid], runs["cpu(0)", hybrid]):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_a_symbol_bound_to_gpu_1_runs_there(cp):
    """test_sym.py's small network (conv, BatchNorm, dense, softmax loss) bound to gpu(1):
    outputs, gradients and running statistics stay there and equal the CPU's."""
    from test_sym import _bound_small_net
    cpu, feeds = _bound_small_net()
    gpu, _ = _bound_small_net(ctx=mixrt.gpu(1))
    results = {}
    for name, executor in (("cpu", cpu), ("gpu", gpu)):
        loss = executor.forward(is_train=True, **feeds)[0]
        executor.backward()
        arrays = {name: array._read() for name, array in  # the Executor's NDArrays' data
                  {"loss": loss, **executor.grad_dict, **executor.aux_dict}.items()}
        if name == "gpu":
            assert all(on_gpu_1(a) for a in arrays.values())
        results[name] = {k: to_host(a) for k, a in arrays.items()}
    for key, expected in results["cpu"].items():
        np.testing.assert_allclose(results["gpu"][key], expected, rtol=1e-9, atol=1e-12,
                                   err_msg=key)


def test_the_device_store_sums_compressed_gradients_of_two_gpus(cp):
    grads, outs = [], []
    for device in (0, 1):
        with cp.cuda.Device(device):
            grads.append(cp.asarray(np.array([[0.7, -0.2], [0.0, -0.9]], np.float32) * (device + 1)))
            outs.append(cp.zeros((2, 2), cp.float32))
    with cp.cuda.Device(1):
        weight = cp.zeros((2, 2), cp.float32)
    kv = LocalStore("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init("w", weight)  # stored on GPU 1, the first array's
    kv.push("w", grads)
    kv.pull("w", out=outs)
    for device, out in enumerate(outs):
        assert out.device.id == device
        # each gradient quantized to -0.5, 0 or +0.5 before the sum
        np.testing.assert_array_equal(out.get(), [[1.0, 0.0], [0.0, -1.0]])
    assert kv._store["w"].device.id == 1
