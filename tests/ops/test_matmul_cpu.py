"""Dense products on the CPU (ops/nn/matmul_cpu.py): the packed-panel kernels for a constant
weight, and without them the few-rows forms; each gives what matmul gives, for MatMul, Gemm
(every transA/transB) and the fused kernels, with and without a prepacked B."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu, jit_tier
from mixrt.ops.conv import direct_forms
from mixrt.ops.nn import row_kernels
from mixrt.ops.nn import matmul_cpu, product_parts
from mixrt.ops.nn.nn_cpu import gemm_cpu, mat_mul_cpu
from mixrt.ops.nn import fused
from helpers import until_the_worker_joins

# the CPU's fast paths, as a CPU session binds them
fused_gemm = fused.fused_gemm.kernels[-1].for_device("cpu")
fused_mat_mul = fused.fused_mat_mul.kernels[-1].for_device("cpu")

RNG = np.random.default_rng(5)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.fixture
def no_panels(monkeypatch):
    """The products as on a machine without the panel kernels (no AVX-512, or MIXRT_JIT=0)."""
    monkeypatch.setattr(jit_cpu, "panel_kernels", lambda: None)


@pytest.mark.parametrize("rows", [2, 8, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_few_rows_matches_and_keeps_its_packed_weight(rows, dtype, no_panels):
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
def test_gemm_every_transposition(transA, transB, no_panels):
    A = _rand(300, 8) if transA else _rand(8, 300)
    B = _rand(400, 300) if transB else _rand(300, 400)
    C = _rand(400)
    expected = 0.5 * ((A.T if transA else A) @ (B.T if transB else B)) + 2.0 * C
    out = np.full((8, 400), np.nan, np.float32)
    gemm_cpu(np, A, B, C, alpha=0.5, beta=2.0, transA=transA, transB=transB, out=out,
             _prepacked={})
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("transB", [0])  # (a transposed weight: the panels, below)
@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)])
def test_a_small_one_row_gemm_gives_the_general_paths_bits(transB, alpha, beta, monkeypatch):
    """A decoder step's one-row Gemm goes straight to the BLAS; the result is what the
    general path (the panels and few-rows checks, which do not take it) computes."""
    # a weight under SPLIT_WEIGHT_BYTES: a larger one takes the split panels
    A, B, C = _rand(1, 64), _rand(384, 64) if transB else _rand(64, 384), _rand(384)
    assert B.nbytes < matmul_cpu.SPLIT_WEIGHT_BYTES
    fast, general = np.empty((1, 384), np.float32), np.empty((1, 384), np.float32)
    assert matmul_cpu.small_one_row(A, B, 0, transB, fast)
    gemm_cpu(np, A, B, C, alpha=alpha, beta=beta, transB=transB, out=fast, _prepacked={})
    monkeypatch.setattr(matmul_cpu, "small_one_row", lambda *args: False)
    gemm_cpu(np, A, B, C, alpha=alpha, beta=beta, transB=transB, out=general, _prepacked={})
    np.testing.assert_array_equal(fast, general)
    np.testing.assert_allclose(fast, alpha * (A @ (B.T if transB else B)) + beta * C,
                               rtol=1e-4, atol=1e-4)


def test_fused_kernels_take_the_few_rows_path(no_panels):
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
def test_up_to_eight_rows_take_the_compiled_loop(rows, dtype, n, monkeypatch, no_panels):
    A, B = _rand(rows, 700, dtype=dtype), _rand(700, n, dtype=dtype)
    calls = []
    real = row_kernels.few_rows_product
    monkeypatch.setattr(row_kernels, "few_rows_product", lambda *a: calls.append(1) or real(*a))
    splits = []
    real_split = row_kernels.parallel_for
    monkeypatch.setattr(row_kernels, "parallel_for",
                        lambda parts, fn: splits.append(len(parts)) or real_split(parts, fn))
    out = np.full((rows, n), np.nan, dtype)
    assert mat_mul_cpu(np, A, B, out=out, _prepacked={}) is out and calls
    # a sum of 700 rounded products drifts as the square root of its length, as the panels'
    # test allows; a flat 2e-5 failed once in CI, on an entry near zero (-0.0274, off by 2.1e-5)
    tolerance = (1e-5 if dtype == np.float32 else 1e-12) * np.sqrt(A.shape[1])
    np.testing.assert_allclose(out, A.astype(np.float64) @ B, rtol=tolerance, atol=tolerance)
    assert bool(splits) == (B.size >= row_kernels.SPLIT_WEIGHT)


@pytest.mark.skipif(not jit_cpu.enabled(), reason="numba is not importable")
def test_compiled_few_rows_pass_nans_and_infinities_to_their_rows_only(no_panels):
    _assert_specials_reach_their_cells_only(rows=3, k=64, n=300)


def _assert_specials_reach_their_cells_only(rows, k, n):
    """A NaN in row 1 of A and an inf in B's column 7: NaN in row 1, +-inf (or NaN where inf
    meets inf * 0) in column 7, finite values elsewhere."""
    A, B = _rand(rows, k), _rand(k, n)
    A[1, 10] = np.nan
    B[5, 7] = np.inf
    out = np.empty((rows, n), np.float32)
    mat_mul_cpu(np, A, B, out=out, _prepacked={})
    with np.errstate(invalid="ignore"):
        want = A @ B
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(out[finite], want[finite], rtol=2e-5, atol=2e-4)


def test_nine_rows_keep_the_transposed_blas_product(monkeypatch, no_panels):
    A, B = _rand(9, 300), _rand(300, 400)
    monkeypatch.setattr(row_kernels, "few_rows_product",
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


# -- packed panels -------------------------------------------------------------------------------

needs_panels = pytest.mark.skipif(jit_cpu.panel_kernels() is None,
                                  reason="panel kernels need numba and AVX-512")


@needs_panels
@pytest.mark.parametrize("rows", [2, 7, 8, 9, 63, 128, 301])  # strips of 8 and their tails
# under a panel, one, a padded last one: one vector's lanes or fewer of it (the half tile),
# exactly one vector, more than one
@pytest.mark.parametrize("n", [5, 32, 40, 48, 56, 100, 768])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_panel_product_matches_float64(rows, n, dtype):
    k = max(1, (1 << 21) // (rows * n))  # enough work to take the panels
    A, B = _rand(rows, k, dtype=dtype), _rand(k, n, dtype=dtype)
    out = np.full((rows, n), np.nan, dtype)
    assert matmul_cpu.panels_suit(A, B, out, {})
    assert mat_mul_cpu(np, A, B, out=out, _prepacked={}) is out
    tolerance = 1e-5 * np.sqrt(k) if dtype == np.float32 else 1e-12 * np.sqrt(k)
    np.testing.assert_allclose(out, A.astype(np.float64) @ B, rtol=tolerance, atol=tolerance)


@needs_panels
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 130])  # whole strips and tails, row blocks
@pytest.mark.parametrize("k", [1, 42, 129, 300])  # one K block, two, a short last one
@pytest.mark.parametrize("n", [7, 32, 40, 96, 101])  # whole panels, padded last ones
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_bias_added_in_the_tile_gives_the_bits_of_adding_it_after(rows, k, n, dtype):
    """The biased tile adds each column's bias to the finished sum in its register: the
    one addition ``c += bias`` after the product makes, so the same bits."""
    kernels = jit_cpu.panel_kernels()
    A, B, bias = _rand(rows, k, dtype=dtype), _rand(k, n, dtype=dtype), _rand(n, dtype=dtype)
    bias[::3] *= 1e6  # large against the sums: an addition made inside the sums would show
    panels = matmul_cpu.pack_panels(B)
    spill = np.zeros((kernels.DENSE_ROWS, panels.shape[2]), dtype)
    after = np.full((rows, n), np.nan, dtype)
    none = np.zeros(0, dtype)
    kernels.panel_product(A, panels, after, 0, len(panels), spill, none, none)
    after += bias
    inside = np.full((rows, n), np.nan, dtype)
    kernels.panel_product(A, panels, inside, 0, len(panels), spill, bias, none)
    assert inside.tobytes() == after.tobytes()


@needs_panels
@pytest.mark.parametrize("rows", [9, 11, 12, 25, 121, 250])  # wide strips, tails, row blocks
@pytest.mark.parametrize("k", [42, 300])
@pytest.mark.parametrize("n", [40, 96, 101])  # a half panel last, whole panels, a padded one
@pytest.mark.parametrize("biased", [True, False])
def test_a_row_has_the_same_bits_in_any_strip(rows, k, n, biased):
    """Each output's sum is the same sequence of multiply-adds whichever strip of 1-12 rows
    computes it (and whatever the next panel's prefetch brought): the product of many rows is
    the products of each row alone, bit for bit, as a service's batch must be."""
    kernels = jit_cpu.panel_kernels()
    A, B = _rand(rows, k), _rand(k, n)
    bias = _rand(n) if biased else np.zeros(0, np.float32)
    panels = matmul_cpu.pack_panels(B)
    spill = np.zeros((kernels.DENSE_ROWS, panels.shape[2]), np.float32)
    none = np.zeros(0, np.float32)
    together = np.full((rows, n), np.nan, np.float32)
    kernels.panel_product(A, panels, together, 0, len(panels), spill, bias, none)
    alone = np.full((rows, n), np.nan, np.float32)
    for i in range(rows):
        kernels.panel_product(A[i:i + 1], panels, alone[i:i + 1], 0, len(panels), spill, bias,
                              none)
    assert together.tobytes() == alone.tobytes()
    expected = A.astype(np.float64) @ B + (bias if biased else 0)
    np.testing.assert_allclose(together, expected, rtol=1e-4, atol=1e-4)


@needs_panels
@pytest.mark.parametrize("rows", [1, 8, 13])  # a strip, whole and with a tail
@pytest.mark.parametrize("n", [7, 40, 96])  # a half panel, a padded last one, whole panels
@pytest.mark.parametrize("activation, params", [("Relu", None), ("LeakyRelu", [0.1]),
                                                ("Clip", [-0.5, 0.75])])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("biased", [True, False])
def test_an_activation_applied_in_the_tile_gives_the_layer_s_values(rows, n, activation,
                                                                    params, dtype, biased):
    """A dense layer's Relu, LeakyRelu or Clip applied as the tile is stored (after the
    bias) gives what the layer's separate pass gives; NaN passes through as there."""
    from mixrt.ops.nn.fused import add_and_activate_cpu
    kernels = jit_cpu.panel_kernels()
    A, B = _rand(rows, 42, dtype=dtype), _rand(42, n, dtype=dtype)
    A[0, 0] = np.nan  # row 0 is NaN throughout: the clamp's comparisons pass it
    bias = _rand(n, dtype=dtype) if biased else np.zeros(0, dtype)
    panels = matmul_cpu.pack_panels(B)
    spill = np.zeros((kernels.DENSE_ROWS, panels.shape[2]), dtype)
    apart = np.empty((rows, n), dtype)
    kernels.panel_product(A, panels, apart, 0, len(panels), spill, bias, np.zeros(0, dtype))
    add_and_activate_cpu(apart, None, None, activation, params)
    inside = np.full((rows, n), -7.0, dtype)
    limits = direct_forms.layer_limits(activation, params, dtype)
    kernels.panel_product(A, panels, inside, 0, len(panels), spill, bias, limits)
    np.testing.assert_array_equal(inside, apart)
    assert np.isnan(inside[0]).all()


def test_only_the_piecewise_linear_activations_have_limits():
    assert direct_forms.layer_limits("", None, np.float32) is None
    assert direct_forms.layer_limits("Gelu", None, np.float32) is None
    assert direct_forms.layer_limits("Relu", None, np.int32) is None  # no panels for ints
    relu = direct_forms.layer_limits("Relu", None, np.float32)
    assert relu.dtype == np.float32 and list(relu) == [0.0, np.inf, 1.0]
    assert direct_forms.layer_limits("Relu", None, np.float32) is relu  # one array a kind
    assert list(direct_forms.layer_limits("Clip", [-1, 6], np.float64)) == [-1.0, 6.0, 1.0]


@needs_panels
def test_panels_are_packed_once_per_weight(monkeypatch):
    A, B = _rand(128, 300), _rand(300, 100)
    prepacked: dict = {}
    made = []
    real = matmul_cpu.pack_panels
    monkeypatch.setattr(matmul_cpu, "pack_panels", lambda w: made.append(1) or real(w))
    for scale in (1.0, -2.0):
        out = np.empty((128, 100), np.float32)
        mat_mul_cpu(np, A * np.float32(scale), B, out=out, _prepacked=prepacked)
        np.testing.assert_allclose(out, (A * np.float32(scale)) @ B, rtol=1e-4, atol=1e-4)
    width = matmul_cpu.panel_width(np.float32)
    panels = prepacked["panels"]
    assert made == [1] and panels.shape == (-(-100 // width), 300, width)
    assert panels.ctypes.data % 64 == 0
    assert not panels[-1, :, 100 % width:].any()  # the padded columns are zeros


@needs_panels
def test_large_products_are_split_over_threads(monkeypatch):
    monkeypatch.setenv("MIXRT_NATIVE_POOL", "0")
    A, B = _rand(2, 128, 768), _rand(768, 768)
    assert A.size * 768 >= matmul_cpu.PANEL_SPLIT_WORK
    splits = []
    real = matmul_cpu.parallel_for
    monkeypatch.setattr(matmul_cpu, "parallel_for",
                        lambda parts, fn: splits.append(parts) or real(parts, fn))
    out = np.empty((2, 128, 768), np.float32)
    mat_mul_cpu(np, A, B, out=out, _prepacked={})
    np.testing.assert_allclose(out, A @ B, rtol=1e-4, atol=1e-3)
    (parts,) = splits
    assert parts[0][0] == 0 and parts[-1][1] == -(-768 // matmul_cpu.panel_width(np.float32))


@needs_panels
@pytest.mark.skipif(not jit_cpu.NATIVE_POOL_PLATFORM, reason="the native pool is Linux x86-64")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_through_the_native_pool_the_worker_takes_panels_and_the_bits_stay(monkeypatch, dtype):
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    A, B = _rand(3, 100, 500).astype(dtype), _rand(500, 330).astype(dtype)
    prepacked: dict = {}
    monkeypatch.setenv("MIXRT_NATIVE_POOL", "0")
    expected = mat_mul_cpu(np, A, B, out=np.empty((3, 100, 330), dtype), _prepacked=prepacked)
    monkeypatch.setenv("MIXRT_NATIVE_POOL", "1")
    kernels, native = jit_cpu.panel_kernels(), jit_cpu.native_pool()

    def product_matches():
        out = mat_mul_cpu(np, A, B, out=np.empty((3, 100, 330), dtype), _prepacked=prepacked)
        np.testing.assert_array_equal(out, expected)

    until_the_worker_joins(native.block, kernels.JOINED, product_matches)


@pytest.mark.parametrize("count, rows", [(3, 36), (2, 36), (5, 9), (30, 9), (1, 1), (3, 7),
                                         (2, 300), (8, 64), (12, 137), (14, 200), (27, 8),
                                         (13, 300), (48, 37)])
def test_native_parts_cover_every_panel_and_row_once(count, rows, monkeypatch):
    """Every (panel, row) is in one part, rows in bands of whole strips; claimed in order
    by two threads, the parts leave neither with more than an even share and a fraction
    of a unit: 12 panels (BERT's hidden 384) as eight runs were 1, 2, 1, 2, ... panels,
    and one thread claimed 7 of the 12; 3 panels for 2 threads were 2 and 1."""
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    table = product_parts.native_parts(count, rows, 8).reshape(-1, 4)
    covered = np.zeros((count, rows), int)
    for p0, p1, r0, r1 in table:
        assert 0 <= p0 < p1 <= count and 0 <= r0 < r1 <= rows
        assert r0 % 8 == 0 and (r1 % 8 == 0 or r1 == rows)
        covered[p0:p1, r0:r1] += 1
    assert (covered == 1).all()
    assert len(table) <= product_parts.NATIVE_PARTS_PER_THREAD * 2
    strips = -(-rows // 8)
    sizes = [(p1 - p0) * -(-(r1 - r0) // 8) for p0, p1, r0, r1 in table]
    ends = [0, 0]
    for size in sizes:  # claimed in order by whichever thread is free first
        ends[ends.index(min(ends))] += size
    # two runs of panels, or two bands of strips, reach this much: nothing worse is taken
    assert max(ends) <= count * strips / 2 + min(count, strips) / 2
    if count * strips > 1:
        assert len(table) >= 2
    if (count, rows) == (12, 137):  # even: six runs of two panels (or more parts)
        assert max(ends) == 12 * 18 // 2


@needs_panels
@pytest.mark.skipif(not jit_cpu.NATIVE_POOL_PLATFORM, reason="the native pool is Linux x86-64")
def test_few_panels_split_over_rows_give_the_one_thread_bits(monkeypatch):
    """A 1x1 convolution's 36 pixel rows against 96 output channels (3 panels): split in
    bands of rows between the threads, each cell is the same sum as on one thread."""
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    A, B = _rand(36, 576), _rand(576, 96)
    kernels = jit_cpu.panel_kernels()
    panels = matmul_cpu.pack_panels(B)
    expected = np.empty((36, 96), np.float32)
    kernels.panel_product(A, panels, expected, 0, panels.shape[0],
                          np.empty((8, 32), np.float32), np.zeros(0, np.float32),
                          np.zeros(0, np.float32))
    call = matmul_cpu.panel_call(A, B, {})
    native = jit_cpu.native_pool()

    def product_matches():
        out = np.full((36, 96), np.nan, np.float32)
        call(A, out)
        np.testing.assert_array_equal(out, expected)

    until_the_worker_joins(native.block, kernels.JOINED, product_matches)


@needs_panels
@pytest.mark.skipif(not jit_cpu.NATIVE_POOL_PLATFORM, reason="the native pool is Linux x86-64")
@pytest.mark.parametrize("rows, k, n, shared", [(137, 384, 384, True), (24, 96, 384, True),
                                                (11, 768, 384, False), (760, 64, 64, False),
                                                (36, 576, 96, False)])
def test_parts_over_the_same_rows_read_them_packed_once(rows, k, n, shared, monkeypatch):
    """Runs of panels over one band of rows (BERT's hidden 384: twelve panels, six runs of
    two) read A's whole strips as the threads packed them once for all the parts
    (``native_packed_product``), its last rows in place; each cell, its bias and its
    activation (a leaky ReLU6) as on one thread. Fewer rows than a strip, parts of rows
    of their own, or runs of one panel (which read A in place) go as they did."""
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    monkeypatch.setattr(product_parts, "l2_bytes", lambda: 1 << 40)  # parts by work alone
    A, B, bias = _rand(rows, k), _rand(k, n), _rand(n)
    limits = np.array([-6, 6, 0.1], np.float32)
    kernels = jit_cpu.panel_kernels()
    panels = matmul_cpu.pack_panels(B)
    expected = np.empty((rows, n), np.float32)
    kernels.panel_product(A, panels, expected, 0, panels.shape[0],
                          np.empty((12, 32), np.float32), bias, limits)
    packed = []
    real = kernels.native_packed_product
    monkeypatch.setattr(kernels, "native_packed_product",
                        lambda *args: packed.append(args[-1]) or real(*args))
    call = matmul_cpu.panel_call(A, B, {}, bias, limits)
    native = jit_cpu.native_pool()

    def product_matches():
        out = np.full((rows, n), np.nan, np.float32)
        call(A, out)
        np.testing.assert_array_equal(out, expected)

    until_the_worker_joins(native.block, kernels.JOINED, product_matches)
    assert bool(packed) == shared and all(0 < packs <= rows // 12 for packs in packed)


@needs_panels
@pytest.mark.skipif(not jit_cpu.NATIVE_POOL_PLATFORM, reason="the native pool is Linux x86-64")
def test_the_packed_entry_is_loaded_for_the_types_a_request_passes(monkeypatch):
    """The first kit against a packed weight loads the packed product's entry for the very
    types a product whose parts share rows later calls it with (numba keeps an entry per
    argument types: another would be loaded in that request), once per dtype, from the
    cache only."""
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    monkeypatch.setattr(product_parts, "l2_bytes", lambda: 1 << 40)
    kernels = jit_cpu.panel_kernels()
    real = kernels.native_packed_product
    asked, called = [], []

    class Spy:  # the entry as the loader and a product see it
        def compile(self, signature):
            asked.append((signature, jit_tier.compile_misses() is not None))

        def __call__(self, *args):
            called.append(args)
            return real(*args)

    monkeypatch.setattr(kernels, "native_packed_product", Spy())
    monkeypatch.setattr(product_parts, "_PACKED_LOADED", set())
    A, B, bias = _rand(137, 384), _rand(384, 384), _rand(384)
    call = matmul_cpu.panel_call(A, B, {}, bias)
    matmul_cpu.panel_call(A, _rand(384, 96), {}, bias)  # another weight: loaded already
    native = jit_cpu.native_pool()
    out = np.empty((137, 384), np.float32)
    until_the_worker_joins(native.block, kernels.JOINED, lambda: call(A, out))
    import numba  # noqa: PLC0415
    assert len(asked) == 1 and asked[0][1]  # once, compiling forbidden
    assert called and asked[0][0] == tuple(numba.typeof(value) for value in called[0])


@pytest.mark.parametrize("rows, bands", [(752, True), (19, False)])
def test_operands_past_a_core_s_l2_are_parted_by_what_they_read(rows, bands, monkeypatch):
    """Past a core's L2, a product's parts are weighed by what they read as well as their
    work: at many rows each thread takes bands of its own rows through every panel (runs of
    panels over the same rows read strips another core packed); at a strip or two, runs of
    panels (a band would read the whole weight for a few rows). Within L2 the parts are as
    the work alone lays them out."""
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    monkeypatch.setattr(product_parts, "l2_bytes", lambda: 1 << 20)
    operands = 12 * 32 * 1536 * 4 + -(-rows // 12) * 16 * 1536 * 4  # 12 panels, K 1536
    parts = product_parts.native_parts(12, rows, 12, 32, operands).reshape(-1, 4)
    runs = {(int(p0), int(p1)) for p0, p1 in parts[:, :2]}
    assert (runs == {(0, 12)}) == bands and len(parts) >= 2
    covered = np.zeros((12, rows), int)
    for p0, p1, r0, r1 in parts:
        covered[p0:p1, r0:r1] += 1
    assert (covered == 1).all()
    within = product_parts.native_parts(12, rows, 12, 32, 1 << 19).reshape(-1, 4)
    assert within.tolist() == product_parts.native_parts(12, rows, 12).reshape(-1, 4).tolist()


@pytest.mark.parametrize("count, rows", [(12, 137), (12, 19), (3, 36), (48, 7), (1, 500)])
def test_shared_packs_answers_each_parts_table_as_its_rows_say(count, rows, monkeypatch):
    """shared_packs is answered once per (shared) parts table: the same answer as the
    table's rows give, for every table, asked again or after others."""
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")

    def from_rows(table, rows, strip):
        parts = table.reshape(-1, 4)
        bands = {(int(r0), int(r1)) for r0, r1 in parts[:, 2:]}
        packing = bool((parts[:, 1] - parts[:, 0] > 1).any())
        if rows // strip == 0 or not packing or len(bands) == len(parts):
            return 0
        return min(rows // strip, len(parts))

    for strip in (12, 8):
        table = product_parts.native_parts(count, rows, strip)
        expected = from_rows(table, rows, strip)
        assert product_parts.shared_packs(table, rows, strip) == expected
        other = np.array([0, count, 0, rows], np.int64)  # a table of its own: one part
        assert product_parts.shared_packs(other, rows, strip) == 0
        assert product_parts.shared_packs(table, rows, strip) == expected


@needs_panels
def test_panels_pass_nans_and_infinities_to_their_cells_only(monkeypatch):
    taken = []
    real = matmul_cpu.panel_product
    monkeypatch.setattr(matmul_cpu, "panel_product", lambda *a: taken.append(1) or real(*a))
    _assert_specials_reach_their_cells_only(rows=20, k=1000, n=70)
    assert taken


@needs_panels
@pytest.mark.parametrize("transB", [0, 1])
def test_gemm_and_fused_kernels_take_the_panels(transB, monkeypatch):
    taken = []
    real = matmul_cpu.panel_product
    monkeypatch.setattr(matmul_cpu, "panel_product", lambda *a: taken.append(1) or real(*a))
    A, W, bias = _rand(40, 784), _rand(512, 784), _rand(512)
    B = W if transB else np.ascontiguousarray(W.T)
    out = np.empty((40, 512), np.float32)
    gemm_cpu(np, A, B, bias, alpha=0.5, transB=transB, out=out, _prepacked={})
    np.testing.assert_allclose(out, 0.5 * (A @ W.T) + bias, rtol=1e-4, atol=1e-3)
    fused_gemm(np, A, B, bias, transB=transB, activation="Relu", out=out, _prepacked={})
    np.testing.assert_allclose(out, np.maximum(A @ W.T + bias, 0), rtol=1e-4, atol=1e-3)
    Z = _rand(40, 512)
    fused_mat_mul(np, A, np.ascontiguousarray(W.T), bias, Z, out=out, _prepacked={})
    np.testing.assert_allclose(out, A @ W.T + bias + Z, rtol=1e-4, atol=1e-3)
    assert len(taken) == 3


def test_panels_need_a_constant_weight_and_plain_layouts():
    A, B = _rand(64, 400), _rand(400, 300)
    out = np.empty((64, 300), np.float32)
    assert not matmul_cpu.panels_suit(A, B, out, None)  # a weight computed in the graph
    assert not matmul_cpu.panels_suit(_rand(64, 800)[:, ::2], B, out, {})  # strided rows
    assert not matmul_cpu.panels_suit(A, B, np.empty((64, 600), np.float32)[:, ::2], {})
    assert not matmul_cpu.panels_suit(A.astype(np.float16), B.astype(np.float16),
                                      np.zeros((64, 300), np.float16), {})
    small = _rand(100, 300)  # under SPLIT_WEIGHT_BYTES
    assert not matmul_cpu.panels_suit(_rand(1, 100), small, out[:1], {})  # one row: a gemv
    assert not matmul_cpu.panels_suit(_rand(8, 100), small, out[:8], {})  # too little work
    assert not matmul_cpu.panels_suit(_rand(4, 8), _rand(8, 8), out[:4, :8], {})  # tiny


@needs_panels
@pytest.mark.parametrize("activation", ["", "Relu"])
def test_one_row_through_a_transposed_weight_takes_the_panels(activation, monkeypatch):
    """A PyTorch Linear's Gemm (transB) at batch 1, however small: the panels, not the
    BLAS's gemv and an epilogue pass after it, and the bits that row gets inside a batch
    of rows through the same panels."""
    W, bias = _rand(169, 32), _rand(169)  # far under every panel threshold at one row
    assert 32 * 169 < matmul_cpu.PANEL_MIN_WORK
    x = _rand(5, 32)
    assert not matmul_cpu.small_one_row(x[:1], W, 0, 1, np.empty((1, 169), np.float32))
    taken = []
    real = matmul_cpu.panel_product
    monkeypatch.setattr(matmul_cpu, "panel_product", lambda *a: taken.append(1) or real(*a))
    prepacked: dict = {}
    one, rows = np.empty((1, 169), np.float32), np.empty((5, 169), np.float32)
    fused_gemm(np, x[:1], W, bias, transB=1, activation=activation, out=one,
               _prepacked=prepacked)
    fused_gemm(np, x, W, bias, transB=1, activation=activation, out=rows, _prepacked=prepacked)
    assert taken == [1, 1]
    np.testing.assert_array_equal(one[0], rows[0])
    want = x[:1] @ W.T + bias
    np.testing.assert_allclose(one, np.maximum(want, 0) if activation else want, rtol=1e-5,
                               atol=1e-5)


@needs_panels
@pytest.mark.skipif(not jit_cpu.NATIVE_POOL_PLATFORM, reason="the native pool is Linux x86-64")
def test_one_row_through_a_large_layer_takes_the_split_panels(monkeypatch):
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    W, bias = _rand(2048, 784), _rand(2048)  # a Gemm's transB weight, the MLP's first layer
    x = _rand(1, 784)
    assert 784 * 2048 >= matmul_cpu.ONE_ROW_WORK
    assert matmul_cpu.panels_suit(x, W.T, np.empty((1, 2048), np.float32), {})
    taken = []
    real = matmul_cpu.panel_product
    monkeypatch.setattr(matmul_cpu, "panel_product", lambda *a: taken.append(1) or real(*a))
    out = np.empty((1, 2048), np.float32)
    fused_gemm(np, x, W, bias, transB=1, activation="Relu", out=out, _prepacked={})
    np.testing.assert_allclose(out, np.maximum(x @ W.T + bias, 0), rtol=1e-4, atol=1e-4)
    assert taken == [1]
    monkeypatch.setenv("MIXRT_NATIVE_POOL", "0")  # no native pool to split it: a gemv,
    # where the weight is not a transposed one (that takes the panels on one thread)
    assert not matmul_cpu.panels_suit(x, np.ascontiguousarray(W.T), out, {})
    assert matmul_cpu.panels_suit(x, W.T, out, {})


@needs_panels
@pytest.mark.skipif(not jit_cpu.NATIVE_POOL_PLATFORM, reason="the native pool is Linux x86-64")
@pytest.mark.parametrize("rows", [1, 4])
def test_a_weight_the_workers_stream_takes_the_split_panels_whatever_the_work(rows,
                                                                             monkeypatch):
    """A few rows through a 256 x 256 layer: far less work than the panels' thresholds, but a
    weight that two threads stream from memory at twice one's rate."""
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    A, W = _rand(rows, 256), _rand(256, 256)
    out = np.full((rows, 256), np.nan, np.float32)
    assert rows * W.size < min(matmul_cpu.ONE_ROW_WORK, matmul_cpu.PANEL_MIN_WORK)
    assert matmul_cpu.streamed(W) and not matmul_cpu.one_row_blas(A, W, out)
    assert matmul_cpu.panels_suit(A, W, out, {})
    split = []
    kernels = jit_cpu.panel_kernels()
    real = kernels.native_product
    monkeypatch.setattr(kernels, "native_product", lambda *a: split.append(1) or real(*a))
    assert mat_mul_cpu(np, A, W, out=out, _prepacked={}) is out
    np.testing.assert_allclose(out, A @ W, rtol=1e-4, atol=1e-4)
    assert split == [1]
    monkeypatch.setenv("MIXRT_NATIVE_POOL", "0")  # nobody to share the stream with
    assert not matmul_cpu.streamed(W) and not matmul_cpu.panels_suit(A, W, out, {})


@needs_panels
def test_panels_are_off_with_mixrt_jit_0(monkeypatch):
    monkeypatch.setenv("MIXRT_JIT", "0")
    assert jit_cpu.panel_kernels() is None


@needs_panels
@pytest.mark.parametrize("shape", [(12, 128, 64, 128), (12, 128, 128, 64), (3, 21, 700, 45),
                                   (2, 30, 1000, 20)])  # (stack, m, K, N): N under a panel
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("split", [False, True])
def test_stacks_of_products_take_the_panels_in_place(shape, dtype, split, monkeypatch):
    """Attention's per-head products: B is read in place, no packing, no BLAS; on one
    thread or split over the threads."""
    monkeypatch.setattr(matmul_cpu, "STACK_SPLIT_WORK", 1 if split else 1 << 40)
    stack, m, k, n = shape
    A, B = _rand(1, stack, m, k, dtype=dtype), _rand(1, stack, k, n, dtype=dtype)
    out = np.full((1, stack, m, n), np.nan, dtype)
    assert matmul_cpu.stacks_suit(A, B, out)
    monkeypatch.setattr(matmul_cpu.np, "matmul", lambda *a, **k: pytest.fail("took the BLAS"))
    assert mat_mul_cpu(np, A, B, out=out) is out
    tolerance = 1e-5 * np.sqrt(k) if dtype == np.float32 else 1e-12 * np.sqrt(k)
    want = np.einsum("...mk,...kn->...mn", A.astype(np.float64), B.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance)


def test_stacks_that_broadcast_or_are_strided_keep_numpy_s_product():
    A, B = _rand(4, 64, 300), _rand(4, 300, 80)
    out = np.empty((4, 64, 80), np.float32)
    assert not matmul_cpu.stacks_suit(A, _rand(1, 300, 80), out)  # broadcast over the stack
    assert not matmul_cpu.stacks_suit(A, _rand(4, 300, 160)[..., ::2], out)
    assert not matmul_cpu.stacks_suit(A, B, np.empty((4, 64, 160), np.float32)[..., ::2])
    assert not matmul_cpu.stacks_suit(A, B, A[:, :, :80])  # out overlaps an input
    assert not matmul_cpu.stacks_suit(_rand(4, 1, 300), _rand(4, 300, 80), out[:, :1])


def test_a_gemm_without_out_takes_the_same_product_forms(monkeypatch):
    # a graph output gets no out= from the executor: a classifier's logits at batch 8
    A, B, C = _rand(8, 300), _rand(400, 300), _rand(400)
    calls = []
    original = matmul_cpu.panel_call
    monkeypatch.setattr(matmul_cpu, "panel_call", lambda *a: calls.append(1) or original(*a))
    got = gemm_cpu(np, A, B, C, transB=1, _prepacked={})
    assert got.shape == (8, 400)
    assert calls or jit_cpu.panel_kernels() is None
    np.testing.assert_allclose(got, A @ B.T + C, rtol=1e-4, atol=1e-3)


@needs_panels
@pytest.mark.parametrize("rows, n", [(1, 2048), (8, 100), (64, 256), (301, 1000)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("split", [False, True])
def test_a_bias_added_in_the_panels_gives_the_bits_of_adding_it_after(rows, n, dtype, split,
                                                                       monkeypatch):
    """biased_panel_product: each finished tile plus the bias (a last panel past N through
    its spill, one thread or split with the native worker) equals the product, then += bias."""
    monkeypatch.setattr(matmul_cpu, "PANEL_SPLIT_WORK", 1 if split else 1 << 40)
    if split:  # (one row takes the panels only split: from ONE_ROW_WORK multiply-adds)
        monkeypatch.setattr(matmul_cpu, "ONE_ROW_WORK", 1)
    k = max(64, (1 << 21) // (rows * n))
    A, B, bias = _rand(rows, k, dtype=dtype), _rand(k, n, dtype=dtype), _rand(n, dtype=dtype)
    prepacked: dict = {}
    out = np.full((rows, n), np.nan, dtype)
    assert matmul_cpu.biased_panel_product(A, B, bias, out, prepacked)
    expected = np.full((rows, n), np.nan, dtype)
    matmul_cpu.panel_product(A, B, expected, prepacked)
    expected += bias
    np.testing.assert_array_equal(out, expected)


@needs_panels
def test_a_bias_the_panels_cannot_add_is_left_to_the_caller():
    A, B = _rand(64, 256), _rand(256, 256)
    out = np.zeros((64, 256), np.float32)
    for bias in (_rand(1, 256), _rand(256, dtype=np.float64), _rand(128), _rand(512)[::2]):
        assert not matmul_cpu.biased_panel_product(A, B, bias, out, {})
    assert not out.any()
    bias = _rand(256)
    fused = fused_mat_mul(np, A, B, bias, out=out, _prepacked={})
    np.testing.assert_allclose(fused, A @ B + bias, rtol=1e-4, atol=1e-4)


@needs_panels
@pytest.mark.parametrize("transB", [0, 1])
def test_gemm_with_a_bias_row_adds_it_in_the_panels(transB):
    """Gemm and FusedGemm with C one value per column (alpha = beta = 1) take the biased
    panels: the bits of the product, then += C."""
    A, C = _rand(64, 256), _rand(300)
    B = _rand(300, 256) if transB else _rand(256, 300)
    expected = np.empty((64, 300), np.float32)
    matmul_cpu.panel_product(A, B.T if transB else B, expected, {})
    expected += C
    for kernel in (gemm_cpu, fused_gemm):
        out = np.full((64, 300), np.nan, np.float32)
        assert kernel(np, A, B, C, transB=transB, out=out, _prepacked={}) is out
        np.testing.assert_array_equal(out, expected)


# -- graph outputs: the executor passes no out= -------------------------------------------------

def _stacked_only(monkeypatch):
    """Counts the BLAS calls NumPy's matmul makes a product: one per stacked row of A when
    the leading axes are not merged."""
    calls = []
    real = np.matmul

    def counting(a, b, *args, **kwargs):
        calls.append(np.shape(a))
        return real(a, b, *args, **kwargs)
    monkeypatch.setattr(matmul_cpu.np, "matmul", counting)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_graph_output_product_merges_leading_axes_like_a_planned_one(dtype, monkeypatch):
    A, B = _rand(2, 16, 64, dtype=dtype), _rand(64, 1000, dtype=dtype)
    prepacked: dict = {}
    for _ in range(3):  # the replay, if one is kept, writes into each call's new array
        got = mat_mul_cpu(np, A, B, _prepacked=prepacked)
        assert got.shape == (2, 16, 1000) and got.dtype == dtype
        np.testing.assert_allclose(got, A @ B, rtol=1e-4, atol=1e-3)
    previous = mat_mul_cpu(np, A, B, _prepacked=prepacked)
    assert mat_mul_cpu(np, A, B, _prepacked=prepacked) is not previous  # never handed twice
    calls = _stacked_only(monkeypatch)
    mat_mul_cpu(np, A, B, _prepacked={})
    assert all(len(shape) == 2 for shape in calls)  # one product over 32 rows, not two of 16


def test_graph_output_fused_products_match():
    A, B = _rand(2, 16, 64), _rand(64, 100)
    bias = _rand(100)
    np.testing.assert_allclose(fused_mat_mul(np, A, B, bias, None, activation="Relu"),
                               np.maximum(A @ B + bias, 0), rtol=1e-4, atol=1e-3)
    A2, B2, C = _rand(100, 32), _rand(64, 100), _rand(64)
    np.testing.assert_allclose(fused_gemm(np, A2, B2, C, transA=1, transB=1),
                               A2.T @ B2.T + C, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(gemm_cpu(np, A2, B2, C, transA=1, transB=1, alpha=0.5),
                               0.5 * A2.T @ B2.T + C, rtol=1e-4, atol=1e-3)


def test_graph_output_mixed_or_mismatched_operands_take_the_generic_product():
    A, B = _rand(4, 8), _rand(8, 3, dtype=np.float64)
    np.testing.assert_allclose(mat_mul_cpu(np, A, B), A @ B, rtol=1e-5)
    with pytest.raises(ValueError):
        mat_mul_cpu(np, _rand(4, 8), _rand(7, 3))


@pytest.mark.parametrize("form", ["eight_rows", "eight_rows_by_one"])
@pytest.mark.parametrize("k_len, n, n0, n1", [(256, 256, 0, 256), (64, 7, 0, 7), (33, 50, 3, 41)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_both_few_rows_loops_give_the_product_over_their_columns(form, k_len, n, n0, n1, dtype):
    """Each CPU runs one of the two forms (row_kernels.few_rows_kernel: the pair of weight
    rows where AVX-512 holds its sixteen sums, one row on AVX2): both checked here, against
    float64, columns n0..n1 written and the others left."""
    kernels = jit_cpu.load(row_kernels.FEW_ROWS_KERNELS)
    rng = np.random.default_rng(k_len + n)
    a = rng.standard_normal((8, k_len)).astype(dtype)
    bt = rng.standard_normal((n, k_len)).astype(dtype)
    out = np.full((8, n), -7.0, dtype)
    getattr(kernels, form)(a, bt, out, n0, n1)
    reference = a.astype(np.float64) @ bt.T.astype(np.float64)
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(out[:, n0:n1], reference[:, n0:n1], rtol=tolerance,
                               atol=tolerance * np.sqrt(k_len))
    assert np.all(out[:, :n0] == -7.0) and np.all(out[:, n1:] == -7.0)


@needs_panels
def test_a_transposed_weight_takes_the_panels_below_their_work_threshold():
    """Gemm's transposed weight (a PyTorch Linear's): the few-rows and BLAS forms over it
    took 2-5x the panels' time below PANEL_MIN_WORK, so a few rows take the panels whatever
    the work; an untransposed weight keeps the threshold."""
    A, W = _rand(8, 100), _rand(300, 100)  # under SPLIT_WEIGHT_BYTES, as the test above
    out = np.full((8, 300), np.nan, np.float32)
    assert A.size * W.shape[0] < matmul_cpu.PANEL_MIN_WORK
    assert matmul_cpu.panels_suit(A, W.T, out, {})
    assert not matmul_cpu.panels_suit(A, np.ascontiguousarray(W.T), out, {})
    assert matmul_cpu.gemm_product(A, W, 0, 1, out, {}) is out
    np.testing.assert_allclose(out, A.astype(np.float64) @ W.T, rtol=1e-5, atol=1e-5)
