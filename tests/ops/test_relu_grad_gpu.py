"""ReluGrad on a GPU as one kernel (ops/elementwise/activation_grad.py's relu_grad_gpu): the
generic ``where(Y > 0, dY, 0)``'s values, inf and NaN in dY included, into ``out`` or over dY
itself; its CUDA C compiled by NVRTC as CuPy wraps it."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import nvrtc, nvrtc_compile
from mixrt.ops.device import gpu_available
from mixrt.ops.elementwise.activation_grad import (RELU_GRAD_GPU, SELECT_PREAMBLE, relu_grad,
                                                   relu_grad_gpu)

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")


def _operands(shape, dtype):
    rng = np.random.default_rng(3)
    y = np.maximum(rng.standard_normal(shape), 0).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    flat_y, flat_dy = y.reshape(-1), dy.reshape(-1)
    flat_y[:4], flat_dy[:4] = (0, 0, 0, 1), (np.inf, np.nan, -np.inf, np.nan)
    return dy, y


@needs_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(7,), (2, 3, 5, 4)])
def test_one_kernel_gives_the_generic_values(shape, dtype):
    import cupy  # noqa: PLC0415
    dy, y = _operands(shape, dtype)
    want = relu_grad(np, dy, y)
    got = relu_grad_gpu(cupy, cupy.asarray(dy), cupy.asarray(y))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(cupy.asnumpy(got), want)


@needs_gpu
def test_into_out_and_over_dy_itself():
    import cupy  # noqa: PLC0415
    dy, y = _operands((4, 9), np.float32)
    want = relu_grad(np, dy, y)
    out = cupy.full(dy.shape, 7, dtype=np.float32)
    assert relu_grad_gpu(cupy, cupy.asarray(dy), cupy.asarray(y), out=out) is out
    np.testing.assert_array_equal(cupy.asnumpy(out), want)
    in_place = cupy.asarray(dy)
    assert relu_grad_gpu(cupy, in_place, cupy.asarray(y), out=in_place) is in_place
    np.testing.assert_array_equal(cupy.asnumpy(in_place), want)


@needs_gpu
def test_mixed_dtypes_take_the_generic_kernel():
    import cupy  # noqa: PLC0415
    dy, y = _operands((3, 5), np.float32)
    got = relu_grad_gpu(cupy, cupy.asarray(dy), cupy.asarray(y.astype(np.float64)))
    np.testing.assert_array_equal(cupy.asnumpy(got), relu_grad(np, dy, y.astype(np.float64)))


@pytest.mark.skipif(nvrtc() is None, reason="NVRTC is not installed")
@pytest.mark.parametrize("value_type", ["float", "double"])
def test_its_cuda_compiles(value_type):
    """The body with its preamble as CuPy wraps an ElementwiseKernel's (the fake CuPy only
    interprets it; a GPU run checks what it computes)."""
    _, _, body = RELU_GRAD_GPU
    source = (f"typedef {value_type} T;\n{SELECT_PREAMBLE}\n"
              f'extern "C" __global__ void kernel(const T* dys, const T* ys, T* dxs) {{\n'
              f"const T dy = dys[threadIdx.x]; const T y = ys[threadIdx.x]; T dx;\n{body}\n"
              f"dxs[threadIdx.x] = dx; }}")
    status, log = nvrtc_compile(source)
    assert status == 0, log


@needs_gpu
def test_relu_and_sum_write_into_out():
    """Relu and Sum on a GPU fill the arena's view given as ``out`` (ops/elementwise/
    elementwise_gpu.py); float16 Sum, which accumulates wider, is filled from the generic
    kernel's value."""
    import cupy  # noqa: PLC0415
    from mixrt.ops.elementwise.activation import relu
    from mixrt.ops.elementwise.elementwise import sum_
    from mixrt.ops.elementwise.elementwise_gpu import relu_gpu, sum_gpu
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    x[0, 0] = np.nan
    out = cupy.empty_like(cupy.asarray(x))
    assert relu_gpu(cupy, cupy.asarray(x), out=out) is out
    np.testing.assert_array_equal(cupy.asnumpy(out), relu(np, x))
    for dtype in (np.float32, np.float16):
        parts = [rng.standard_normal((3, 6)).astype(dtype) for _ in range(3)]
        out = cupy.empty((3, 6), dtype=dtype)
        assert sum_gpu(cupy, *(cupy.asarray(p) for p in parts), out=out) is out
        np.testing.assert_array_equal(cupy.asnumpy(out), sum_(np, *parts))
