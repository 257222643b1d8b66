"""runtime/cublas_capture.py: the matrix products a CUDA-graph capture records (cuBLAS through
ctypes, since CuPy refuses cuBLAS while a stream captures). How a broadcast batch is split
into strided-batched calls is checked on the CPU against NumPy; the products themselves, on
a GPU, against CuPy's, outside a capture and replayed from one."""

import numpy as np
import pytest

from mixrt.runtime.cublas_capture import _batched_calls
from mixrt.ops.device import gpu_available

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
RNG = np.random.default_rng(11)

SHAPES = [((3, 4), (2, 4, 5)),              # a broadcast over b's batch (stride 0)
          ((6, 3, 4), (6, 4, 2)),           # one batch, both strided
          ((2, 1, 3, 4), (1, 5, 4, 6)),     # each broadcast along another dim: a loop
          ((4, 8, 9), (2, 4, 9, 7)),        # a convolution's groups against images
          ((1, 4, 8, 9), (2, 1, 9, 7)),
          ((2, 3, 1, 2, 5), (3, 4, 5, 2))]


def emulated_product(a, b):
    """a @ b computed the way _batched_calls lays the calls out, with NumPy doing each
    matrix product at the offsets and strides cuBLAS would be given."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    rows, inner, cols = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    c = np.full(batch + (rows, cols), np.nan)
    calls, (a_stride, b_stride, c_stride) = _batched_calls(batch, a, b, rows * cols)
    flat_a, flat_b, flat_c = a.reshape(-1), b.reshape(-1), c.reshape(-1)
    for a_at, b_at, c_at, count in calls:
        for j in range(count):
            left = flat_a[a_at + j * a_stride:][:rows * inner].reshape(rows, inner)
            right = flat_b[b_at + j * b_stride:][:inner * cols].reshape(inner, cols)
            flat_c[c_at + j * c_stride:][:rows * cols] = (left @ right).reshape(-1)
    return c


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_the_batched_calls_cover_numpys_broadcast_product(shapes):
    a = RNG.standard_normal(shapes[0])
    b = RNG.standard_normal(shapes[1])
    np.testing.assert_allclose(emulated_product(a, b), np.matmul(a, b), rtol=1e-12)


def test_an_evenly_spaced_batch_is_one_call():
    a, b = np.zeros((2, 3, 4, 5)), np.zeros((2, 3, 5, 6))
    calls, strides = _batched_calls((2, 3), a, b, 4 * 6)
    assert calls == [(0, 0, 0, 6)] and strides == (20, 30, 24)
    calls, strides = _batched_calls((2, 3), np.zeros((4, 5)), b, 4 * 6)
    assert calls == [(0, 0, 0, 6)] and strides == (0, 30, 24)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shapes", SHAPES + [((5, 7), (7, 3)), ((2, 5, 7), (7, 3))], ids=str)
def test_products_match_cupys_and_replay_from_a_graph(shapes, dtype):
    import cupy  # noqa: PLC0415
    from mixrt.runtime.cublas_capture import WORKSPACE_BYTES, CapturingModule  # noqa: PLC0415
    a = cupy.asarray(RNG.standard_normal(shapes[0]).astype(dtype))
    b = cupy.asarray(RNG.standard_normal(shapes[1]).astype(dtype))
    want = cupy.matmul(a, b).get()
    tolerance = 2e-3 if dtype == "float16" else 1e-5
    stream = cupy.cuda.Stream(non_blocking=True)
    xp = CapturingModule(cupy, stream, cupy.empty(WORKSPACE_BYTES, dtype=np.uint8))
    with stream:
        xp.prepare()
        np.testing.assert_allclose(xp.matmul(a, b).get(), want, rtol=tolerance, atol=tolerance)
        out = cupy.zeros(want.shape, dtype=dtype)
        stream.begin_capture()
        xp.matmul(a, b, out=out)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_allclose(out.get(), want, rtol=tolerance, atol=tolerance)
