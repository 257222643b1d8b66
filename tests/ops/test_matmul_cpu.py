"""Few-rows products (ops/matmul_cpu.py): the transposed form gives what matmul gives, for
MatMul, Gemm (every transA/transB) and the fused kernels, with and without a prepacked B."""

import numpy as np
import pytest

from mixrt.ops import jit_cpu, matmul_cpu
from mixrt.ops.fast_cpu import gemm_cpu, mat_mul_cpu
from mixrt.ops.fused import fused_gemm, fused_mat_mul

RNG = np.random.default_rng(5)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("rows", [2, 8, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_few_rows_matches_and_keeps_its_packed_weight(rows, dtype):
    A, B = _rand(rows, 300, dtype=dtype), _rand(300, 400, dtype=dtype)
    assert matmul_cpu.suits(A, B)
    prepacked: dict = {}
    for scale in (1.0, 3.0):
        out = np.full((rows, 400), np.nan, dtype)
        got = mat_mul_cpu(np, A * dtype(scale), B, out=out, _prepacked=prepacked)
        assert got is out
        np.testing.assert_allclose(out, (A * dtype(scale)) @ B, rtol=1e-4, atol=1e-3)
    (packed,) = prepacked.values()
    assert packed.flags.c_contiguous and packed.shape == (400, 300)


def test_a_batch_of_sequences_merges_its_leading_axes():
    A, B = _rand(2, 3, 256), _rand(256, 512)
    out = np.empty((2, 3, 512), np.float32)
    mat_mul_cpu(np, A, B, out=out)
    np.testing.assert_allclose(out, A @ B, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("rows", [1, 65])
def test_one_row_and_many_rows_keep_the_plain_product(rows):
    assert not matmul_cpu.suits(_rand(rows, 300), _rand(300, 400))


def test_small_weights_keep_the_plain_product():
    assert not matmul_cpu.suits(_rand(8, 16), _rand(16, 16))


@pytest.mark.parametrize("transA", [0, 1])
@pytest.mark.parametrize("transB", [0, 1])
def test_gemm_every_transposition(transA, transB):
    A = _rand(300, 8) if transA else _rand(8, 300)
    B = _rand(400, 300) if transB else _rand(300, 400)
    C = _rand(400)
    expected = 0.5 * ((A.T if transA else A) @ (B.T if transB else B)) + 2.0 * C
    out = np.full((8, 400), np.nan, np.float32)
    gemm_cpu(np, A, B, C, alpha=0.5, beta=2.0, transA=transA, transB=transB, out=out,
             _prepacked={})
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


def test_fused_kernels_take_the_few_rows_path():
    A, W, bias = _rand(8, 784), _rand(2048, 784), _rand(2048)
    out = np.empty((8, 2048), np.float32)
    fused_gemm(np, A, W, bias, transB=1, activation="Relu", out=out, _prepacked={})
    np.testing.assert_allclose(out, np.maximum(A @ W.T + bias, 0), rtol=1e-4, atol=1e-3)
    Z = _rand(8, 2048)
    fused_mat_mul(np, A, np.ascontiguousarray(W.T), bias, Z, out=out, _prepacked={})
    np.testing.assert_allclose(out, A @ W.T + bias + Z, rtol=1e-4, atol=1e-3)


def test_a_stack_of_many_rows_is_one_product(monkeypatch):
    """(8, 128, K) @ (K, N), past the few-rows range: one (1024, K) product, not eight."""
    A, B, bias, Z = _rand(8, 128, 96), _rand(96, 80), _rand(80), _rand(8, 128, 80)
    assert not matmul_cpu.suits(A, B)
    shapes = []
    real = np.matmul

    def spy(a, b, out=None):
        shapes.append(a.shape)
        return real(a, b, out=out)
    monkeypatch.setattr(matmul_cpu.np, "matmul", spy)
    out = np.full((8, 128, 80), np.nan, np.float32)
    assert mat_mul_cpu(np, A, B, out=out) is out
    assert shapes == [(1024, 96)]
    monkeypatch.setattr(matmul_cpu.np, "matmul", real)
    np.testing.assert_allclose(out, A @ B, rtol=1e-4, atol=1e-3)
    fused_mat_mul(np, A, B, bias, Z, activation="Relu", out=out)
    np.testing.assert_allclose(out, np.maximum(A @ B + bias + Z, 0), rtol=1e-4, atol=1e-3)


def test_stacks_that_are_not_one_matrix_keep_numpy_s_product():
    A = _rand(4, 128, 96)[:, ::2]  # every other row: no (rows, K) view of it
    B = _rand(96, 80)
    out = np.empty((4, 64, 80), np.float32)
    assert matmul_cpu.stacked_product(A, B, out) is out
    np.testing.assert_allclose(out, A @ B, rtol=1e-4, atol=1e-3)
    wide = np.empty((4, 64, 160), np.float32)[..., :80]  # a non-contiguous output
    matmul_cpu.stacked_product(A, B, wide)
    np.testing.assert_allclose(wide, A @ B, rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(not jit_cpu.enabled(), reason="numba is not importable")
@pytest.mark.parametrize("rows", [2, 5, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [301, 1024])  # an odd last column; a weight split over threads
def test_up_to_eight_rows_take_the_compiled_loop(rows, dtype, n, monkeypatch):
    A, B = _rand(rows, 700, dtype=dtype), _rand(700, n, dtype=dtype)
    calls = []
    real = jit_cpu.few_rows_product
    monkeypatch.setattr(jit_cpu, "few_rows_product", lambda *a: calls.append(1) or real(*a))
    splits = []
    real_split = jit_cpu.parallel_for
    monkeypatch.setattr(jit_cpu, "parallel_for",
                        lambda parts, fn: splits.append(len(parts)) or real_split(parts, fn))
    out = np.full((rows, n), np.nan, dtype)
    assert mat_mul_cpu(np, A, B, out=out, _prepacked={}) is out and calls
    tolerance = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, A.astype(np.float64) @ B, rtol=tolerance, atol=tolerance)
    assert bool(splits) == (B.size >= jit_cpu.SPLIT_WEIGHT)


@pytest.mark.skipif(not jit_cpu.enabled(), reason="numba is not importable")
def test_compiled_few_rows_pass_nans_and_infinities_to_their_rows_only():
    A, B = _rand(3, 64), _rand(64, 300)
    A[1, 10] = np.nan
    B[5, 7] = np.inf  # column 7: +-inf in every row (or NaN where inf meets inf * 0)
    out = np.empty((3, 300), np.float32)
    mat_mul_cpu(np, A, B, out=out, _prepacked={})
    with np.errstate(invalid="ignore"):
        want = A @ B
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(out[finite], want[finite], rtol=2e-5, atol=2e-5)


def test_nine_rows_keep_the_transposed_blas_product(monkeypatch):
    A, B = _rand(9, 300), _rand(300, 400)
    monkeypatch.setattr(jit_cpu, "few_rows_product",
                        lambda *a: pytest.fail("nine rows took the compiled loop"))
    out = np.empty((9, 400), np.float32)
    mat_mul_cpu(np, A, B, out=out, _prepacked={})
    np.testing.assert_allclose(out, A @ B, rtol=1e-4, atol=1e-3)


def test_few_rows_into_a_strided_output_still_fill_it():
    """``out`` a strided view (every other column of a wider array): both few-rows forms write
    through a reshaped view of ``out``, so a strided one takes the plain product."""
    for rows in (4, 40):
        A, B = _rand(rows, 300), _rand(300, 400)
        wide = np.full((rows, 800), np.nan, np.float32)
        out = wide[:, ::2]
        assert matmul_cpu.product_into(A, B, out, {}) is out
        np.testing.assert_allclose(out, A @ B, rtol=1e-4, atol=1e-3)
        assert np.isnan(wide[:, 1::2]).all()
