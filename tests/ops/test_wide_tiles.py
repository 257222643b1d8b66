"""The wide tiles of a product of a few rows (``ops/panels/_jit_dense_tiles.WIDE_ACROSS``): panels
side by side in one tile, each output's sum the same sequence as one panel's tile makes."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.nn import matmul_cpu

SHAPES = [(187, 872), (107, 187), (64, 40), (33, 100), (5, 300), (300, 64), (129, 257)]


@pytest.fixture(scope="module")
def kernels():
    found = jit_cpu.panel_kernels()
    if found is None:
        pytest.skip("no packed-panel kernels on this CPU")
    return found


def _product(kernels, A, B, bias, limits):
    panels = matmul_cpu.pack_panels(B)
    out = np.full((A.shape[0], B.shape[1]), np.nan, A.dtype)
    spill = np.empty((kernels.DENSE_ROWS, panels.shape[2]), A.dtype)
    kernels.panel_product(A, panels, out, 0, panels.shape[0], spill, bias, limits)
    return out


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("k, n", SHAPES)
@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_a_few_rows_match_the_exact_product_and_their_rows_in_a_strip(kernels, rows, k, n,
                                                                       biased, relu):
    """Every column, the last panel's padding included, against float64; and each row's
    bits the same as the row's beside eleven others in a whole strip (the batch invariance
    ``mixrt serve`` relies on)."""
    rng = np.random.default_rng(rows * 1000 + k + n)
    A = rng.normal(size=(rows, k)).astype(np.float32)
    B = rng.normal(size=(n, k)).astype(np.float32).T  # a Gemm's transposed weight
    bias = rng.normal(size=n).astype(np.float32) if biased else np.zeros(0, np.float32)
    limits = np.array([0, np.inf, 0], np.float32) if relu else np.zeros(0, np.float32)
    out = _product(kernels, A, B, bias, limits)
    expected = A.astype(np.float64) @ B + (bias if biased else 0)
    if relu:
        expected = np.maximum(expected, 0)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    strip = np.concatenate([A, rng.normal(size=(kernels.DENSE_ROWS, k)).astype(np.float32)])
    np.testing.assert_array_equal(_product(kernels, strip, B, bias, limits)[:rows], out)


def test_a_part_of_the_panels_takes_only_its_own_columns(kernels):
    """A native part's panels p0..p1 (the wide tiles within them, the rest one by one):
    nothing outside its columns is written."""
    rng = np.random.default_rng(3)
    A = rng.normal(size=(2, 96)).astype(np.float32)
    B = rng.normal(size=(96, 20 * 32)).astype(np.float32)
    panels = matmul_cpu.pack_panels(B)
    spill = np.empty((kernels.DENSE_ROWS, panels.shape[2]), np.float32)
    out = np.full((2, B.shape[1]), -7.0, np.float32)
    kernels.panel_product(A, panels, out, 3, 14, spill, np.zeros(0, np.float32),
                          np.zeros(0, np.float32))
    np.testing.assert_allclose(out[:, 96:448], A @ B[:, 96:448], rtol=1e-4, atol=1e-3)
    assert (out[:, :96] == -7.0).all() and (out[:, 448:] == -7.0).all()
