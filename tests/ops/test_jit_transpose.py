"""Transposes in registers (ops/panels/_jit_transpose.py): blocks of up to one vector's lanes
each way, whole and at the edges, moved bit for bit, nothing written outside them."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu

pytest.importorskip("numba")
TILE = jit_cpu.panel_kernels() is not None
pytestmark = pytest.mark.skipif(not TILE, reason="the blocks are the panel tile's kind of "
                                "kernel: x86-64 with AVX-512")


@pytest.fixture(scope="module")
def transpose():
    from mixrt.ops.panels._jit_transpose import transpose
    return transpose


def _values(shape, dtype):
    values = np.random.default_rng(7).standard_normal(shape).astype(dtype)
    flat = values.reshape(-1)
    flat[0] = -0.0
    flat[-1] = np.inf
    # a NaN with a payload of its own: moved, never computed, it keeps its bits
    payload = np.array([0x7FC01234 if dtype == np.float32 else 0x7FF8000000001234],
                       np.uint32 if dtype == np.float32 else np.uint64).view(dtype)[0]
    flat[len(flat) // 2] = payload
    return values


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows, columns", [(16, 16), (8, 8), (576, 48), (960, 12), (37, 21),
                                           (1, 5), (7, 1), (33, 9), (5, 3072)])
def test_blocks_move_every_value_bit_for_bit_and_nothing_else(transpose, dtype, rows,
                                                               columns):
    """A (rows, columns) matrix at an offset in a flat source, its transpose at an offset
    in a flat target between sentinels: the same bits (a NaN's payload, -0.0), and the
    sentinels untouched (the edge blocks load and store under masks)."""
    source = _values(rows * columns + 40, dtype)
    target = np.full(rows * columns + 64, 3.25, dtype)
    transpose(source, 40, columns, target, 32, rows, rows, columns)
    moved = target[32:32 + rows * columns].reshape(columns, rows)
    expected = source[40:].reshape(rows, columns).T
    np.testing.assert_array_equal(moved.view(np.uint8), np.ascontiguousarray(expected)
                                  .view(np.uint8))
    assert (target[:32] == 3.25).all() and (target[32 + rows * columns:] == 3.25).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_block_within_wider_rows_reads_and_writes_only_its_own(transpose, dtype):
    """Source and target rows longer than the block (a band's pixels of one image): only the
    block's rows and columns are read into place, the rest of the target stays as it was."""
    source = _values((40, 50), dtype)
    target = np.full((30, 60), -1.5, dtype)
    transpose(source.reshape(-1), 3 * 50 + 4, 50, target.reshape(-1), 2 * 60 + 5, 60, 19, 23)
    np.testing.assert_array_equal(target[2:25, 5:24], source[3:22, 4:27].T)
    kept = np.ones(target.shape, bool)
    kept[2:25, 5:24] = False
    assert (target[kept] == -1.5).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(5, 576, 48), (3, 960, 12), (2, 7, 3), (1, 1, 1)])
def test_swap_last_axes_is_numpys_transpose(dtype, shape):
    source = _values(shape, dtype)
    target = np.empty((shape[0], shape[2], shape[1]), dtype)
    jit_cpu.panel_kernels().swap_last_axes(source, target)
    np.testing.assert_array_equal(target.view(np.uint8),
                                  np.ascontiguousarray(source.transpose(0, 2, 1)).view(np.uint8))
