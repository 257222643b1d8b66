"""2-bit gradient compression: parameters, MXNet's quantization and bit layout, error
feedback, and its use by the ``device`` KVStore."""

import json
import math

import numpy as np
import pytest

from mixrt.errors import KVStoreError
from mixrt.kvstore.compression import TwoBitCompressor, check_params, create_compressor
from mixrt.kvstore.local import LocalStore
from mixrt.ops.device import gpu_available

DTYPES = [np.float16, np.float32, np.float64]
SIZES = [0, 1, 3, 4, 5, 1000]


def reference_step(residual, grad, threshold):
    """MXNet's quantize_2bit one element at a time: the packed bytes, the new residual."""
    quantum = residual.dtype.type(threshold)
    flat_residual = residual.reshape(-1).copy()
    flat_grad = grad.reshape(-1)
    packed = np.zeros((flat_grad.size + 3) // 4, dtype=np.uint8)
    for i in range(flat_grad.size):
        flat_residual[i] = flat_residual[i] + flat_grad[i]
        code = 0
        if flat_residual[i] >= quantum:
            code = 0b11
            flat_residual[i] = flat_residual[i] - quantum
        elif flat_residual[i] <= -quantum:
            code = 0b10
            flat_residual[i] = flat_residual[i] + quantum
        packed[i // 4] |= code << (6 - 2 * (i % 4))
    return packed, flat_residual.reshape(residual.shape)


# -- parameters -------------------------------------------------------------------------

@pytest.mark.parametrize("params, expected", [
    ({"type": "2bit", "threshold": 0.25}, {"type": "2bit", "threshold": 0.25}),
    ({"type": "2bit"}, {"type": "2bit", "threshold": 0.5}),
    ({"type": "2bit", "threshold": 2}, {"type": "2bit", "threshold": 2.0}),
    ({"type": "2bit", "threshold": np.float32(0.5)}, {"type": "2bit", "threshold": 0.5}),
    ({"type": " 2BIT "}, {"type": "2bit", "threshold": 0.5}),
    ({"type": "none"}, {"type": "none"}),
])
def test_check_params_normalizes(params, expected):
    normalized = check_params(params)
    assert normalized == expected
    assert type(normalized.get("threshold", 0.0)) is float
    assert json.loads(json.dumps(normalized)) == expected


@pytest.mark.parametrize("params, named", [
    ([("type", "2bit")], "dict"),
    ({"threshold": 0.5}, "'type'"),
    ({"type": "1bit"}, "'1bit'"),
    ({"type": 2}, "2"),
    ({"type": "2bit", "threshold": 0}, "threshold"),
    ({"type": "2bit", "threshold": -0.5}, "-0.5"),
    ({"type": "2bit", "threshold": math.nan}, "nan"),
    ({"type": "2bit", "threshold": math.inf}, "inf"),
    ({"type": "2bit", "threshold": "0.5"}, "'0.5'"),
    ({"type": "2bit", "threshold": True}, "True"),
    ({"type": "2bit", "threshold": None}, "None"),
    ({"type": "2bit", "thresh": 0.5}, "'thresh'"),
    ({"type": "none", "threshold": 0.5}, "'threshold'"),
])
def test_check_params_refuses_and_names_the_entry(params, named):
    with pytest.raises(KVStoreError) as caught:
        check_params(params)
    assert named in str(caught.value)


def test_errors_list_the_valid_types_and_keys():
    with pytest.raises(KVStoreError, match=r"\['2bit', 'none'\]"):
        check_params({"type": "1bit"})
    with pytest.raises(KVStoreError, match=r"\['type', 'threshold'\]"):
        check_params({"type": "2bit", "thresh": 0.5})


def test_create_compressor():
    assert create_compressor({"type": "none"}) is None
    compressor = create_compressor({"type": "2bit", "threshold": 0.25})
    assert isinstance(compressor, TwoBitCompressor)
    assert compressor.threshold == 0.25
    assert compressor.spec() == {"type": "2bit", "threshold": 0.25}
    assert create_compressor({"type": "2bit"}).spec() == {"type": "2bit", "threshold": 0.5}
    with pytest.raises(KVStoreError):
        TwoBitCompressor(0.0)


# -- quantization and packing -----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", SIZES)
def test_compress_matches_the_per_element_reference(size, dtype):
    rng = np.random.default_rng(size)
    compressor = TwoBitCompressor(0.5)
    residual = np.zeros(size, dtype=dtype)
    for step in range(3):  # later steps start from a non-zero residual
        grad = rng.normal(scale=0.7, size=size).astype(dtype)
        expected_packed, residual = reference_step(residual, grad, 0.5)
        packed = compressor.compress("w", grad)
        np.testing.assert_array_equal(packed, expected_packed, err_msg=f"step {step}")
        np.testing.assert_array_equal(compressor._residuals["w"], residual)


@pytest.mark.parametrize("dtype", DTYPES)
def test_threshold_is_rounded_to_the_gradient_dtype(dtype):
    # 0.1 is not exact in any binary dtype: both sides must use the same rounded quantum
    rng = np.random.default_rng(7)
    grad = rng.normal(scale=0.2, size=37).astype(dtype)
    compressor = TwoBitCompressor(0.1)
    expected_packed, expected_residual = reference_step(np.zeros_like(grad), grad, 0.1)
    packed = compressor.compress("w", grad)
    np.testing.assert_array_equal(packed, expected_packed)
    np.testing.assert_array_equal(compressor._residuals["w"], expected_residual)
    values = compressor.decompress(packed, grad.size, dtype)
    quantum = float(np.dtype(dtype).type(0.1))
    assert set(np.unique(np.abs(values)).tolist()) <= {0.0, quantum}


def test_bit_layout_is_mxnets():
    grad = np.array([0.6, -0.7, 0.1, 0.5, -0.5, 2.0], dtype=np.float32)
    packed = TwoBitCompressor(0.5).compress("w", grad)
    # first value in the two most significant bits; 11 = +t, 10 = -t, 00 = 0; padding 00
    assert packed.tolist() == [0b11_10_00_11, 0b10_11_00_00]


@pytest.mark.parametrize("size", SIZES)
def test_packed_size_and_dtype(size):
    compressor = TwoBitCompressor()
    packed = compressor.compress("w", np.ones(size, dtype=np.float32))
    assert packed.dtype == np.uint8 and packed.ndim == 1
    assert packed.size == TwoBitCompressor.packed_nbytes(size) == math.ceil(size / 4)
    if size % 4:  # the pairs past the last value stay zero
        assert packed[-1] & ((1 << (8 - 2 * (size % 4))) - 1) == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (5,), (3, 7), (2, 3, 4)])
def test_roundtrip_gives_only_three_values_shaped_like_the_gradient(shape, dtype):
    rng = np.random.default_rng(1)
    grad = rng.normal(scale=1.0, size=shape).astype(dtype)
    compressor = TwoBitCompressor(0.5)
    out = compressor.roundtrip("w", grad)
    assert out.shape == grad.shape and out.dtype == grad.dtype
    assert set(np.unique(out).tolist()) <= {-0.5, 0.0, 0.5}
    packed = TwoBitCompressor(0.5).compress("w", grad)
    flat = compressor.decompress(packed, grad.size, dtype)
    assert flat.shape == (grad.size,) and flat.dtype == dtype
    np.testing.assert_array_equal(flat, out.reshape(-1))


def test_non_contiguous_gradients_compress_in_c_order():
    grad = np.random.default_rng(2).normal(size=(6, 5)).astype(np.float32).T
    out = TwoBitCompressor().roundtrip("w", grad)
    np.testing.assert_array_equal(out, TwoBitCompressor().roundtrip("w", grad.copy()))


def test_decompress_checks_its_input():
    compressor = TwoBitCompressor()
    with pytest.raises(KVStoreError, match="2 bytes"):
        compressor.decompress(np.zeros(3, dtype=np.uint8), 5, np.float32)
    with pytest.raises(KVStoreError, match="uint8"):
        compressor.decompress(np.zeros(2, dtype=np.int8), 5, np.float32)
    with pytest.raises(KVStoreError, match="int32"):
        compressor.decompress(np.zeros(2, dtype=np.uint8), 5, np.int32)


def test_unsupported_gradients_are_refused():
    compressor = TwoBitCompressor()
    with pytest.raises(KVStoreError, match="'w'.*int32"):
        compressor.compress("w", np.ones(4, dtype=np.int32))
    with pytest.raises(KVStoreError, match="float16"):
        TwoBitCompressor(1e6).compress("w", np.ones(4, dtype=np.float16))  # rounds to inf


# -- error feedback ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-4), (np.float64, 1e-12)])
def test_nothing_is_lost_sent_plus_residual_is_the_gradient_sum(dtype, tolerance):
    rng = np.random.default_rng(3)
    compressor = TwoBitCompressor(0.5)
    sent_total = np.zeros(500)
    grad_total = np.zeros(500)
    for _ in range(50):
        grad = rng.normal(scale=0.8, size=500).astype(dtype)  # some values beyond 2t
        sent_total += compressor.roundtrip("w", grad)
        grad_total += grad
    residual = compressor._residuals["w"]
    np.testing.assert_allclose(sent_total + residual, grad_total, rtol=0, atol=tolerance)


def test_each_step_leaves_less_than_t_behind_where_nothing_was_sent():
    rng = np.random.default_rng(4)
    compressor = TwoBitCompressor(0.5)
    for _ in range(30):
        sent = compressor.roundtrip("w", rng.normal(scale=1.0, size=400))
        residual = compressor._residuals["w"]
        assert np.all(np.abs(residual[sent == 0]) < 0.5)
        # a sent value leaves what exceeded t, with the sign of what was sent
        assert np.all(residual[sent > 0] >= 0) and np.all(residual[sent < 0] <= 0)


def test_gradients_within_t_keep_the_residual_within_t():
    rng = np.random.default_rng(5)
    compressor = TwoBitCompressor(0.5)
    for _ in range(100):
        compressor.compress("w", rng.uniform(-0.5, 0.5, size=300))
        assert np.all(np.abs(compressor._residuals["w"]) < 0.5)


def test_one_threshold_per_step_so_large_gradients_build_up_a_residual():
    # MXNet sends at most t per step: a steady 3t gradient leaves 2t more behind each time
    compressor = TwoBitCompressor(0.5)
    for step in range(1, 5):
        sent = compressor.roundtrip("w", np.array([1.5, -1.5]))
        assert sent.tolist() == [0.5, -0.5]
        assert compressor._residuals["w"].tolist() == [1.0 * step, -1.0 * step]


def test_keys_have_separate_residuals():
    grad = np.full(8, 0.3, dtype=np.float32)
    compressor = TwoBitCompressor(0.5)
    assert not compressor.roundtrip("a", grad).any()  # 0.3 < t: held back
    assert compressor.roundtrip("a", grad).tolist() == [0.5] * 8  # 0.6 >= t
    assert not compressor.roundtrip("b", grad).any()  # "b" starts from zero


def test_reset_drops_residuals():
    grad = np.full(4, 0.3)
    compressor = TwoBitCompressor(0.5)
    compressor.compress("a", grad)
    compressor.compress("b", grad)
    compressor.reset("a")
    assert not compressor.roundtrip("a", grad).any()
    assert compressor.roundtrip("b", grad).all()
    compressor.reset()
    assert not compressor.roundtrip("b", grad).any()
    compressor.reset("never-seen")  # nothing to drop is not an error


def test_shape_or_dtype_change_for_a_key_is_refused():
    compressor = TwoBitCompressor()
    compressor.compress("layer1.weight", np.ones((2, 3), dtype=np.float32))
    with pytest.raises(KVStoreError, match="'layer1.weight'"):
        compressor.compress("layer1.weight", np.ones((3, 2), dtype=np.float32))
    with pytest.raises(KVStoreError, match="'layer1.weight'.*float64"):
        compressor.compress("layer1.weight", np.ones((2, 3), dtype=np.float64))
    compressor.reset("layer1.weight")
    compressor.compress("layer1.weight", np.ones((3, 2), dtype=np.float64))


# -- GPU --------------------------------------------------------------------------------

@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [0, 5, 1001])
def test_gpu_matches_cpu(size, dtype):
    import cupy  # noqa: PLC0415  (only where a GPU is)
    rng = np.random.default_rng(6)
    on_cpu, on_gpu = TwoBitCompressor(0.5), TwoBitCompressor(0.5)
    for _ in range(3):
        grad = rng.normal(scale=0.7, size=size).astype(dtype)
        packed_cpu = on_cpu.compress("w", grad)
        packed_gpu = on_gpu.compress("w", cupy.asarray(grad))
        assert isinstance(packed_gpu, cupy.ndarray)
        np.testing.assert_array_equal(packed_gpu.get(), packed_cpu)
        np.testing.assert_array_equal(on_gpu._residuals["w"].get(), on_cpu._residuals["w"])
        values = on_gpu.decompress(packed_gpu, size, dtype)
        assert isinstance(values, cupy.ndarray)
        np.testing.assert_array_equal(values.get(),
                                      on_cpu.decompress(packed_cpu, size, dtype))
    with pytest.raises(KVStoreError, match=r"'w'.*gpu:\d"):
        on_gpu.compress("w", rng.normal(size=size).astype(dtype))  # residual is on the GPU


# -- the device KVStore -----------------------------------------------------------------

def test_device_store_sums_the_roundtrips_of_each_array():
    rng = np.random.default_rng(8)
    kv = LocalStore("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init("w", np.zeros((4, 5), dtype=np.float32))
    expected = TwoBitCompressor(0.5)  # one residual per device, as the store keeps
    out = np.empty((4, 5), dtype=np.float32)
    for _ in range(3):  # later pushes also check that the residuals carry over
        a, b = (rng.normal(scale=0.6, size=(4, 5)).astype(np.float32) for _ in range(2))
        kv.push("w", [a, b])
        kv.pull("w", out)
        np.testing.assert_array_equal(
            out, expected.roundtrip("device 0", a) + expected.roundtrip("device 1", b))


def test_device_store_with_type_none_pushes_uncompressed():
    kv = LocalStore("device")
    kv.set_gradient_compression({"type": "none"})
    kv.init("w", np.zeros(3))
    kv.push("w", [np.full(3, 0.1), np.full(3, 0.2)])
    out = np.empty(3)
    kv.pull("w", out)
    np.testing.assert_allclose(out, 0.3)


def test_local_store_refuses_compression():
    with pytest.raises(KVStoreError, match="'local'"):
        LocalStore("local").set_gradient_compression({"type": "2bit", "threshold": 0.5})
