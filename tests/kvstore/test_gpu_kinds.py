"""The GPU kinds of the KVStore: ``device`` (kvstore/local.py) and ``nccl`` (kvstore/nccl.py).

Without CuPy or a GPU only the first group runs: the ``nccl`` store's refusals, with the
reason it gives (CuPy missing, no GPU, no NCCL), checked through a stand-in ``cupy`` module
where the real one is absent. Everything else needs a GPU (``nccl``: CuPy built with NCCL)
and skips with that reason; the two-device tests need two GPUs.
"""

import sys
import types

import numpy as np
import pytest

from mixrt.errors import DeviceUnavailableError, KVStoreError, ShapeError
from mixrt.kvstore import nccl as nccl_store
from mixrt.kvstore.local import LocalStore
from mixrt.kvstore.nccl import NCCLStore
from mixrt.runtime.training import optimizer as optim
from mixrt.ops.device import gpu_count

GPUS = gpu_count()


def _nccl_usable() -> bool:
    if GPUS == 0:
        return False
    try:
        from cupy.cuda import nccl
    except Exception:
        return False
    return bool(getattr(nccl, "available", False))


HAS_NCCL = _nccl_usable()

needs_gpu = pytest.mark.skipif(
    GPUS < 1, reason="needs an NVIDIA GPU and CuPy (mixrt[gpu]); this machine has none")
needs_2_gpus = pytest.mark.skipif(
    GPUS < 2, reason=f"needs 2 NVIDIA GPUs and CuPy; this machine has {GPUS}")
needs_nccl = pytest.mark.skipif(
    not HAS_NCCL, reason="needs an NVIDIA GPU and CuPy with NCCL; this machine has none")
needs_nccl_2 = pytest.mark.skipif(
    not HAS_NCCL or GPUS < 2,
    reason=f"needs 2 NVIDIA GPUs and CuPy with NCCL; this machine has {GPUS} GPU(s)"
           f"{'' if HAS_NCCL else ' and no usable NCCL'}")


def _cupy():
    import cupy
    return cupy


def _sync_all(cp) -> None:
    for device in range(GPUS):
        cp.cuda.Device(device).synchronize()


def _sgd_momentum(weight, summed_grads, lr, momentum):
    """torch.optim.SGD (dampening 0, no weight decay) in float64 NumPy."""
    weight = np.array(weight, dtype=np.float64)
    buf = None
    for grad in summed_grads:
        grad = np.asarray(grad, dtype=np.float64)
        buf = grad if buf is None else momentum * buf + grad
        weight -= lr * buf
    return weight


# -- no GPU needed: how the nccl store refuses ------------------------------------------

def _stand_in_cupy(monkeypatch, *, gpus=2, nccl_available=True):
    """A ``cupy`` module with just enough for NCCLStore's checks (no GPU behind it)."""
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = nccl_available
    for name, code in [("NCCL_SUM", 0), ("NCCL_INT32", 2), ("NCCL_INT64", 4),
                       ("NCCL_FLOAT16", 6), ("NCCL_FLOAT32", 7), ("NCCL_FLOAT64", 8)]:
        setattr(nccl, name, code)

    class ndarray:  # noqa: N801  (CuPy's name)
        def __init__(self, shape, dtype):
            self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    cupy.ndarray, cupy.cuda, cuda.nccl = ndarray, cuda, nccl
    for name, module in [("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.nccl", nccl)]:
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(nccl_store, "gpu_count", lambda: gpus)
    return cupy


@pytest.mark.skipif(GPUS > 0, reason="this machine has a GPU; the refusal needs none")
def test_nccl_store_without_gpu_says_why():
    with pytest.raises(DeviceUnavailableError) as info:
        NCCLStore()
    message = str(info.value)
    assert "'nccl'" in message and "'local' or 'device'" in message
    assert "CuPy is not importable" in message or "no CUDA device" in message


def test_nccl_store_reason_cupy_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    with pytest.raises(DeviceUnavailableError, match="CuPy is not importable"):
        NCCLStore()


def test_nccl_store_reason_no_gpu(monkeypatch):
    _stand_in_cupy(monkeypatch, gpus=0)
    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        NCCLStore()


def test_nccl_store_reason_cupy_without_nccl(monkeypatch):
    _stand_in_cupy(monkeypatch, nccl_available=False)
    with pytest.raises(DeviceUnavailableError, match=r"without it \(cupy.cuda.nccl.available"):
        NCCLStore()


def test_nccl_store_refusals_before_gpu_work(monkeypatch):
    cupy = _stand_in_cupy(monkeypatch)
    kv = NCCLStore()
    assert kv.type == "nccl"
    with pytest.raises(KVStoreError, match="needs GPU arrays .*numpy.ndarray.*'local' or"):
        kv.init("w", np.zeros(3, np.float32))
    with pytest.raises(KVStoreError, match="'flags'.*dtype bool"):
        kv.init("flags", cupy.ndarray((3,), np.bool_))
    with pytest.raises(KVStoreError, match="'z'.*dtype complex64"):
        kv.init("z", cupy.ndarray((3,), np.complex64))
    with pytest.raises(KVStoreError, match="never initialized"):
        kv.push("w", [cupy.ndarray((3,), np.float32)])
    with pytest.raises(KVStoreError, match="needs `out`"):
        kv.pull("w")
    with pytest.raises(KVStoreError, match="compression"):
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})


# -- the device kind on GPUs -------------------------------------------------------------

@needs_gpu
def test_device_kind_sums_a_list_on_the_gpu():
    cp = _cupy()
    kv = LocalStore("device")
    first = cp.zeros((2, 3), cp.float32)
    kv.init("w", first)
    kv.push("w", [cp.full((2, 3), 1.5, cp.float32),
                  cp.arange(6, dtype=cp.float32).reshape(2, 3)])
    out = cp.empty((2, 3), cp.float32)
    kv.pull("w", out=out)
    _sync_all(cp)
    np.testing.assert_array_equal(out.get(), 1.5 + np.arange(6).reshape(2, 3))
    stored = kv._store["w"]  # on the GPU of the array it was initialized with
    assert isinstance(stored, cp.ndarray) and stored.device.id == first.device.id


@needs_gpu
def test_device_kind_sgd_matches_numpy():
    cp = _cupy()
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    steps = [[rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2)]
             for _ in range(3)]
    kv = LocalStore("device")
    kv.init(7, cp.asarray(w0))
    kv.set_optimizer(optim.create("sgd", learning_rate=0.1, momentum=0.9))
    for grads in steps:
        kv.push(7, [cp.asarray(g) for g in grads])
    out = cp.empty((3, 4), cp.float32)
    kv.pull(7, out=out)
    _sync_all(cp)
    expected = _sgd_momentum(w0, [sum(grads) for grads in steps], 0.1, 0.9)
    np.testing.assert_allclose(out.get(), expected, rtol=1e-5, atol=1e-5)
    assert isinstance(kv._store["7"], cp.ndarray)


@needs_gpu
def test_device_kind_mixed_host_and_gpu_pushes():
    cp = _cupy()
    kv = LocalStore("device")
    kv.init("gpu", cp.zeros(4, cp.float32))   # kept on the GPU
    kv.init("host", np.zeros(4, np.float32))  # host values are summed on the CPU
    kv.push("gpu", [np.ones(4, np.float32), cp.full(4, 2.0, cp.float32)])
    kv.push("host", [cp.full(4, 3.0, cp.float32), np.ones(4, np.float32)])
    for key, expected in [("gpu", 3.0), ("host", 4.0)]:
        on_gpu, on_host = cp.zeros(4, cp.float32), np.zeros(4, np.float32)
        kv.pull(key, out=[on_gpu, on_host])
        _sync_all(cp)
        np.testing.assert_array_equal(on_gpu.get(), expected)
        np.testing.assert_array_equal(on_host, expected)
    assert isinstance(kv._store["gpu"], cp.ndarray)
    assert isinstance(kv._store["host"], np.ndarray)


@needs_gpu
def test_a_host_value_pulls_into_a_strided_gpu_view():
    """CuPy's ``set`` takes contiguous targets only; a strided view is filled another way."""
    cp = _cupy()
    kv = LocalStore("device")
    kv.init("h", np.arange(6, dtype=np.float32).reshape(2, 3))  # kept on the host
    target = cp.zeros((3, 2), cp.float32)
    kv.pull("h", out=target.T)  # (2, 3), not contiguous
    _sync_all(cp)
    np.testing.assert_array_equal(target.get().T, np.arange(6).reshape(2, 3))


@needs_2_gpus
def test_device_kind_two_gpus():
    cp = _cupy()
    grads, outs = [], []
    for device in (0, 1):
        with cp.cuda.Device(device):
            grads.append(cp.full((2, 2), device + 1.0, cp.float32))
            outs.append(cp.zeros((2, 2), cp.float32))
    with cp.cuda.Device(0):
        weight = cp.zeros((2, 2), cp.float32)
    kv = LocalStore("device")
    kv.init("w", weight)
    kv.push("w", grads)
    kv.pull("w", out=outs)
    _sync_all(cp)
    for device, out in enumerate(outs):
        assert out.device.id == device
        np.testing.assert_array_equal(out.get(), 3.0)
    assert kv._store["w"].device.id == 0
    np.testing.assert_array_equal(grads[1].get(), 2.0)


# -- the nccl kind on one GPU: the mechanics ---------------------------------------------

@needs_nccl
def test_nccl_one_gpu_push_pull_pushpull():
    cp = _cupy()
    with NCCLStore() as kv:
        weight = cp.arange(6, dtype=cp.float32).reshape(2, 3)
        kv.init("w", weight)
        weight += 100  # the store keeps its own copy
        grad = cp.full((2, 3), 0.5, cp.float32)
        kv.push("w", [grad])
        out = cp.zeros((2, 3), cp.float32)
        kv.pull("w", out=[out])
        np.testing.assert_array_equal(out.get(), 0.5)
        np.testing.assert_array_equal(grad.get(), 0.5)  # only read
        host = np.zeros((2, 3), np.float32)
        kv.pushpull("w", [cp.full((2, 3), 2.0, cp.float32)], out=[host])
        np.testing.assert_array_equal(host, 2.0)


@needs_nccl
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
def test_nccl_one_gpu_dtypes(dtype):
    cp = _cupy()
    with NCCLStore() as kv:
        kv.init(3, cp.zeros(5, dtype))
        kv.push(3, [cp.full(5, 3, dtype)])
        out = cp.zeros(5, dtype)
        kv.pull(3, out=out)
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out.get(), np.full(5, 3, dtype))


@needs_nccl
def test_nccl_one_gpu_strided_arrays():
    cp = _cupy()
    with NCCLStore() as kv:
        kv.init("t", cp.zeros((4, 3), cp.float32))
        grad = cp.arange(12, dtype=cp.float32).reshape(3, 4).T  # not C-contiguous
        kv.push("t", [grad])
        out = cp.zeros((3, 4), cp.float32).T
        kv.pull("t", out=out)
        np.testing.assert_array_equal(out.get(), np.arange(12).reshape(3, 4).T)


@needs_nccl
def test_nccl_one_gpu_sgd_matches_numpy():
    cp = _cupy()
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal(6).astype(np.float32)
    grads = [rng.standard_normal(6).astype(np.float32) for _ in range(3)]
    with NCCLStore() as kv:
        kv.init("w", cp.asarray(w0))
        kv.set_optimizer(optim.create("sgd", learning_rate=0.05, momentum=0.9))
        for grad in grads:
            kv.push("w", [cp.asarray(grad)])
        out = cp.zeros(6, cp.float32)
        kv.pull("w", out=out)
        np.testing.assert_allclose(out.get(), _sgd_momentum(w0, grads, 0.05, 0.9),
                                   rtol=1e-5, atol=1e-5)


@needs_nccl
def test_nccl_one_gpu_errors():
    cp = _cupy()
    with NCCLStore() as kv:
        with pytest.raises(KVStoreError, match="needs GPU arrays"):
            kv.init("n", np.zeros(3, np.float32))
        with pytest.raises(KVStoreError, match="'b'.*dtype bool"):
            kv.init("b", cp.zeros(3, cp.bool_))
        kv.init("w", cp.zeros(3, cp.float32))
        with pytest.raises(KVStoreError, match="needs GPU arrays"):
            kv.push("w", [np.ones(3, np.float32)])
        with pytest.raises(KVStoreError, match="GPUs \\[0, 0\\].*one array per device"):
            kv.push("w", [cp.ones(3, cp.float32), cp.ones(3, cp.float32)])
        with pytest.raises(ShapeError):
            kv.push("w", [cp.ones(4, cp.float32)])
        with pytest.raises(KVStoreError, match="dtype float64"):
            kv.push("w", [cp.ones(3, cp.float64)])
        with pytest.raises(KVStoreError, match="compression"):
            kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})


# -- the nccl kind across GPUs -----------------------------------------------------------

def _per_device(cp, make, devices=(0, 1)):
    arrays = []
    for device in devices:
        with cp.cuda.Device(device):
            arrays.append(make(device))
    return arrays


@needs_nccl_2
def test_nccl_two_gpus_sum_and_broadcast():
    cp = _cupy()
    shape = (3, 5)
    grads = _per_device(cp, lambda d: cp.full(shape, d + 1.0, cp.float32))
    outs = _per_device(cp, lambda d: cp.zeros(shape, cp.float32))
    with NCCLStore() as kv:
        kv.init("w", grads[0] * 0)
        kv.push("w", grads)
        kv.pull("w", out=outs)
        for device, out in enumerate(outs):
            assert out.device.id == device
            np.testing.assert_array_equal(out.get(), 3.0)
        for device, grad in enumerate(grads):  # the store's buffers took the sum
            np.testing.assert_array_equal(grad.get(), device + 1.0)
        # devices in the other order: rank 0 is GPU 1, the broadcast's root is rank 1
        grads = _per_device(cp, lambda d: cp.full(shape, 10.0 * (d + 1), cp.float32))
        kv.push("w", grads[::-1])
        kv.pull("w", out=outs[::-1])
        for out in outs:
            np.testing.assert_array_equal(out.get(), 30.0)
        with cp.cuda.Device(1):  # one array on the other GPU: a peer copy
            single = cp.zeros(shape, cp.float32)
        kv.pull("w", out=single)
        np.testing.assert_array_equal(single.get(), 30.0)


@needs_nccl_2
def test_nccl_store_on_a_gpu_outside_the_push():
    cp = _cupy()
    with NCCLStore() as kv:
        with cp.cuda.Device(1):
            kv.init("w", cp.zeros(4, cp.float64))
        with cp.cuda.Device(0):
            grad = cp.full(4, 2.5, cp.float64)
        kv.push("w", [grad])  # summed on GPU 0, copied to the store's GPU 1
        outs = _per_device(cp, lambda d: cp.zeros(4, cp.float64))
        kv.pull("w", out=outs)
        for out in outs:
            np.testing.assert_array_equal(out.get(), 2.5)


@needs_nccl_2
def test_nccl_two_gpus_sgd_matches_numpy():
    cp = _cupy()
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    steps = [[rng.standard_normal((4, 3)).astype(np.float32) for _ in range(2)]
             for _ in range(3)]
    with NCCLStore() as kv:
        with cp.cuda.Device(0):
            kv.init("w", cp.asarray(w0))
        kv.set_optimizer(optim.create("sgd", learning_rate=0.1, momentum=0.9))
        for grads in steps:
            kv.push("w", _per_device(cp, lambda d, grads=grads: cp.asarray(grads[d])))
        outs = _per_device(cp, lambda d: cp.zeros((4, 3), cp.float32))
        kv.pull("w", out=outs)
        expected = _sgd_momentum(w0, [sum(grads) for grads in steps], 0.1, 0.9)
        for out in outs:
            np.testing.assert_allclose(out.get(), expected, rtol=1e-5, atol=1e-5)
        momentum = kv.optimizer.states["w"]["momentum"]
        assert isinstance(momentum, cp.ndarray) and momentum.device.id == 0


@needs_nccl_2
def test_nccl_two_gpus_errors():
    cp = _cupy()
    with NCCLStore() as kv:
        kv.init("w", cp.zeros(3, cp.float32))
        on_0 = _per_device(cp, lambda d: cp.ones(3, cp.float32), devices=(0, 0))
        with pytest.raises(KVStoreError, match="one array per device"):
            kv.push("w", on_0)
        on_1 = _per_device(cp, lambda d: cp.ones(3, cp.float32), devices=(1,))
        with pytest.raises(KVStoreError, match="needs GPU arrays"):
            kv.push("w", [on_1[0], np.ones(3, np.float32)])
        wrong = _per_device(cp, lambda d: cp.ones(3, cp.float32 if d == 0 else cp.float64))
        with pytest.raises(KVStoreError, match="dtype float64"):
            kv.push("w", wrong)
