"""The CPU fast paths of the backward kernels (ops/conv/conv_grad_cpu.py, pool_grad_cpu.py,
norm_grad_cpu.py, activation_grad.py), of Conv (conv_cpu.py) and of training-mode
BatchNormalization (norm_cpu.py) against the
generic kernels, which tests/grad checks against finite differences: same values, written
into ``out``, across the attribute spaces that route to each path, inline and split over the
intra-op threads."""

import numpy as np
import pytest

import mixrt.ops.conv.conv_cpu as conv_cpu
import mixrt.ops.conv.conv_grad_cpu as conv_grad_cpu
import mixrt.ops.conv.direct_forms as direct_forms
import mixrt.ops.conv.im2col_cpu as im2col_cpu
import mixrt.ops.conv.shifted_cpu as shifted_cpu
from mixrt.ops.elementwise.activation_grad import relu_grad, relu_grad_cpu
from mixrt.ops.conv.conv import conv
from mixrt.ops.conv.conv_grad import conv_grad, max_pool_grad
from mixrt.ops.nn import fused
import mixrt.ops.nn.norm_cpu as norm_cpu
from mixrt.ops.nn.norm import batch_normalization
from mixrt.ops.nn.norm_grad import batch_norm_grad
from mixrt.ops.nn.norm_grad_cpu import batch_norm_grad_cpu
from mixrt.ops.pool.pool import max_pool
from mixrt.ops.pool.pool_grad_cpu import max_pool_grad_cpu

# the CPU's fast paths, as a CPU session binds them
fused_conv = fused.fused_conv.kernels[-1].for_device("cpu")

rng = np.random.default_rng(5)


@pytest.fixture(autouse=True, params=["inline", "split"])
def intra_op(request, monkeypatch):
    """Every case twice: run inline, and with even tiny work split over the intra-op
    threads (parts of rows, channels or planes written by different threads)."""
    import mixrt.ops.compiled.parallel as parallel
    if request.param == "split":
        monkeypatch.setattr(parallel, "MIN_ELEMENTS", 0)
        monkeypatch.setattr(parallel, "intra_op_threads", lambda: 2)
    return request.param


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# -- ConvGrad -----------------------------------------------------------------------------

CONV_CASES = [  # x shape, w shape, attributes; the comment names the dX path taken
    ((2, 3, 7, 7), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),  # flipped convolution
    ((2, 5, 9, 8), (4, 5, 3, 2), dict(pads=[2, 0, 1, 1])),  # flipped, asymmetric pads
    ((3, 4, 9, 9), (5, 4, 3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2])),  # flipped
    ((2, 3, 8, 9), (4, 3, 3, 2), dict(pads=[1, 0, 2, 1], strides=[2, 1])),  # folded
    ((2, 4, 10, 10), (6, 4, 1, 1), dict(strides=[2, 2])),  # folded, unused last rows
    ((2, 3, 11, 11), (4, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),  # folded
    ((2, 3, 5, 5), (4, 3, 2, 2), dict(pads=[3, 3, 3, 3])),  # pads past the kernel: folded
    ((2, 3, 6, 7), (4, 3, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),  # folded
    ((2, 3, 6, 6), (4, 3, 3, 3), dict(auto_pad="SAME_LOWER", dilations=[1, 2])),  # flipped
    ((2, 8, 6, 6), (8, 8, 1, 1), dict()),  # pointwise
]


def _conv_case(x_shape, w_shape, attributes, dtype=np.float32):
    x, w = randn(*x_shape, dtype=dtype), randn(*w_shape, dtype=dtype)
    dy = randn(*conv(np, x, w, **attributes).shape, dtype=dtype)
    return dy, x, w


@pytest.mark.parametrize("parts", [False, True])
@pytest.mark.parametrize("x_shape, w_shape, attributes", CONV_CASES)
def test_conv_grad_matches_generic(monkeypatch, x_shape, w_shape, attributes, parts):
    """All three gradients from one call; with ``parts`` the batch is taken an image at a
    time (partial products added, the last part shorter than the others)."""
    if parts:
        monkeypatch.setattr(conv_grad_cpu, "PART_BYTES", 1)
        monkeypatch.setattr(conv_grad_cpu, "PART_COLUMNS", 1)
        x_shape = (5,) + x_shape[1:]
    dy, x, w = _conv_case(x_shape, w_shape, attributes)
    want = conv_grad(np, dy, x, w, bias_grad=1, **attributes)
    got = conv_grad_cpu.conv_grad_cpu(np, dy, x, w, bias_grad=1, **attributes)
    for g, e in zip(got, want):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, attributes",
                         [case for case in CONV_CASES if "strides" not in case[2]])
def test_conv_grad_input_grad_through_the_direct_convolution(monkeypatch, x_shape, w_shape,
                                                              attributes):
    """With the session's node dict, a stride-1 dX (the flipped convolution) takes the
    direct path (its weight packed on each call; every size here), wherever the panel tile
    runs, and matches the generic kernel's."""
    from mixrt.ops.compiled import jit_cpu
    from mixrt.ops.conv import conv_direct_cpu
    monkeypatch.setattr(conv_direct_cpu, "VARYING_MIN_POSITIONS", 0)
    monkeypatch.setattr(direct_forms, "POINTWISE_POSITIONS", 0)
    taken = []
    real = conv_direct_cpu.conv
    monkeypatch.setattr(conv_direct_cpu, "conv", lambda *a, **k: taken.append(1) or real(*a, **k))
    dy, x, w = _conv_case(x_shape, w_shape, attributes)
    want = conv_grad(np, dy, x, w, weight_grad=0, **attributes)
    node: dict = {}
    for _ in range(2):  # the second call packs into the layout the first one made
        got = conv_grad_cpu.conv_grad_cpu(np, dy, x, w, weight_grad=0, _node=node,
                                          **attributes)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    defaults = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                    strides=None)
    kernel, strides, dilations, _, begin, end, out_dims = conv_cpu.conv_geometry(
        x, w, **(defaults | attributes))
    flipped = conv_grad_cpu._flipped_pads(conv_grad_cpu._Window(kernel, strides, dilations,
                                                                 begin, end, out_dims))
    assert bool(taken) == (flipped is not None and jit_cpu.panel_kernels() is not None)


STRIDED_CASES = [case for case in CONV_CASES if "strides" in case[2]] + [
    ((2, 8, 10, 10), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),  # even size
    ((1, 5, 13, 13), (7, 5, 5, 5), dict(pads=[0, 1, 2, 2], strides=[3, 2])),  # 6 phases
    ((2, 3, 9, 9), (4, 3, 2, 2), dict(pads=[3, 3, 3, 3], strides=[2, 2])),  # crops: folded
]


@pytest.mark.parametrize("x_shape, w_shape, attributes", STRIDED_CASES)
def test_strided_input_grad_phase_by_phase_matches_generic(monkeypatch, x_shape, w_shape,
                                                           attributes):
    """dX of a strided convolution, one stride-1 convolution per output phase (every size
    here), a phase no tap reaches zero-filled; where a phase would read dY from past its
    first row (pads past the kernel), the folded columns instead."""
    from mixrt.ops.compiled import jit_cpu
    from mixrt.ops.conv import conv_direct_cpu
    monkeypatch.setattr(conv_grad_cpu, "PHASE_MIN_POSITIONS", 0)
    monkeypatch.setattr(conv_direct_cpu, "VARYING_MIN_POSITIONS", 0)
    taken = []
    real = conv_grad_cpu._phase_input_grad
    monkeypatch.setattr(conv_grad_cpu, "_phase_input_grad",
                        lambda *a: taken.append(1) or real(*a))
    dy, x, w = _conv_case(x_shape, w_shape, attributes, dtype=np.float64)
    want = conv_grad(np, dy, x, w, weight_grad=0, **attributes)
    out = np.full(x.shape, np.nan)  # every element written, the zero phases too
    got = conv_grad_cpu.conv_grad_cpu(np, dy, x, w, weight_grad=0, out=out, _node={},
                                      **attributes)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    crops = attributes.get("pads") == [3, 3, 3, 3] and w_shape[2] == 2
    assert bool(taken) == (jit_cpu.panel_kernels() is not None and not crops)


PANEL_CASES = [  # x shape, w shape, attributes: dW through the panel tile
    ((2, 8, 9, 9), (5, 8, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((5, 16, 11, 11), (40, 16, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),  # 2 panels
    ((2, 8, 12, 12), (33, 8, 5, 5), dict(pads=[2, 2, 2, 2], strides=[2, 2])),
    ((1, 16, 10, 10), (70, 16, 3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2])),  # 3 panels
    ((3, 8, 9, 8), (8, 8, 3, 2), dict(pads=[2, 0, 1, 1], strides=[2, 1])),
    ((2, 8, 9, 9), (16, 8, 2, 2), dict()),  # no padding
]


@pytest.mark.parametrize("group_bytes", [1, 1 << 22])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x_shape, w_shape, attributes", PANEL_CASES)
def test_panel_weight_grad_matches_generic(monkeypatch, x_shape, w_shape, attributes, dtype,
                                           group_bytes):
    """dW through the panel tile, every size: strides, dilation, uneven pads, output
    channels past a whole panel; the batch split between the threads, or (one image) the
    panels; images one at a time or in groups (a last group short). Its scratch starts full
    of NaN: the cells it reads but does not write (each plane's alignment, the slack past
    the last) must be zeroed, not read stale."""
    from mixrt.ops.compiled import jit_cpu
    if jit_cpu.panel_kernels() is None:
        pytest.skip("the panel tile needs AVX-512 and numba")
    monkeypatch.setattr(conv_grad_cpu, "PANEL_WEIGHT_GRAD_MIN_K", 0)
    monkeypatch.setattr(conv_grad_cpu, "PANEL_WEIGHT_GRAD_GROUP_BYTES", group_bytes)
    taken = []
    real = conv_grad_cpu.panel_weight_grad_into
    monkeypatch.setattr(conv_grad_cpu, "panel_weight_grad_into",
                        lambda *a: taken.append(1) or real(*a))
    for name in ("weight_grad_planes", "weight_grad_panels"):
        jit_cpu.scratch_array(name, dtype, (1 << 16,)).fill(np.nan)
    dy, x, w = _conv_case(x_shape, w_shape, attributes, dtype=dtype)
    want = conv_grad(np, dy, x, w, input_grad=0, **attributes)
    got = conv_grad_cpu.conv_grad_cpu(np, dy, x, w, input_grad=0, **attributes)
    assert taken and got.dtype == dtype
    tolerance = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * np.abs(want).max())


def test_panel_weight_grad_parts():
    """Halves of the batch while each thread gets two images, else halves of the panels;
    one part where there is nothing to split."""
    import mixrt.ops.compiled.parallel as parallel
    threads = parallel.intra_op_threads()
    if threads != 2:
        pytest.skip("the parts below are two threads'")
    assert conv_grad_cpu._weight_grad_parts(32, 2) == [(0, 16, 0, 2), (16, 32, 0, 2)]
    assert conv_grad_cpu._weight_grad_parts(3, 8) == [(0, 3, 0, 4), (0, 3, 4, 8)]
    assert conv_grad_cpu._weight_grad_parts(1, 1) == [(0, 1, 0, 1)]


@pytest.mark.parametrize("flags", [dict(input_grad=1, weight_grad=0),
                                   dict(input_grad=0, weight_grad=1),
                                   dict(input_grad=0, weight_grad=1, bias_grad=1)])
def test_conv_grad_writes_its_first_gradient_into_out(flags):
    x_shape, w_shape, attributes = CONV_CASES[3]
    dy, x, w = _conv_case(x_shape, w_shape, attributes)
    want = conv_grad(np, dy, x, w, **attributes, **flags)
    first = want[0] if isinstance(want, tuple) else want
    out = np.full(first.shape, np.nan, np.float32)  # every element must be written
    got = conv_grad_cpu.conv_grad_cpu(np, dy, x, w, out=out, **attributes, **flags)
    got_first = got[0] if isinstance(got, tuple) else got
    assert got_first is out
    np.testing.assert_allclose(out, first, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, attributes", [
    ((2, 4, 6, 6), (6, 2, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),  # grouped
    ((2, 3, 9), (4, 3, 3), dict(pads=[1, 1])),  # 1-D
])
def test_conv_grad_falls_back_to_generic(x_shape, w_shape, attributes):
    dy, x, w = _conv_case(x_shape, w_shape, attributes)
    want = conv_grad(np, dy, x, w, **attributes)
    out = np.empty_like(x)
    got = conv_grad_cpu.conv_grad_cpu(np, dy, x, w, out=out, **attributes)
    assert got[0] is out
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)


def test_conv_grad_keeps_float64():
    x_shape, w_shape, attributes = CONV_CASES[0]
    dy, x, w = _conv_case(x_shape, w_shape, attributes, dtype=np.float64)
    got = conv_grad_cpu.conv_grad_cpu(np, dy, x, w, **attributes)
    want = conv_grad(np, dy, x, w, **attributes)
    for g, e in zip(got, want):
        assert g.dtype == np.float64
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


# -- Conv's batched columns ---------------------------------------------------------------

@pytest.mark.parametrize("batch_pixels", [0, 10 ** 6])
@pytest.mark.parametrize("x_shape, w_shape, attributes", CONV_CASES[:6])
def test_conv_batched_and_per_image_match_generic(monkeypatch, batch_pixels, x_shape,
                                                  w_shape, attributes):
    monkeypatch.setattr(im2col_cpu, "BATCH_PIXELS", batch_pixels)
    monkeypatch.setattr(im2col_cpu, "BAND_BYTES", 4096)  # several parts, a short last one
    monkeypatch.setattr(shifted_cpu, "SHIFT_ADD_RATIO", 10 ** 9)
    monkeypatch.setattr(shifted_cpu, "SHIFT_ADD_PIXELS", 10 ** 9)
    x, w, b = randn(5, *x_shape[1:]), randn(*w_shape), randn(w_shape[0])
    want = conv(np, x, w, b, **attributes)
    out = np.full(want.shape, np.nan, np.float32)
    assert conv_cpu.conv_cpu(np, x, w, b, out=out, **attributes) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    z = randn(*want.shape)
    fused = fused_conv(np, x, w, None, z, activation="Relu", **attributes)
    np.testing.assert_allclose(fused, np.maximum(want - b[:, None, None] + z, 0), rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, attributes", CONV_CASES[:3])
def test_shift_add_forward_and_input_grad_match_generic(monkeypatch, x_shape, w_shape,
                                                        attributes):
    """Shift-and-add (its runs summed per block of output channels), for the forward and for
    the flipped convolution that gives dX."""
    monkeypatch.setattr(shifted_cpu, "SHIFT_ADD_RATIO", 0)
    monkeypatch.setattr(shifted_cpu, "SHIFT_ADD_PIXELS", 0)
    dy, x, w = _conv_case(x_shape, w_shape, attributes)
    np.testing.assert_allclose(conv_cpu.conv_cpu(np, x, w, **attributes),
                               conv(np, x, w, **attributes), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        conv_grad_cpu.conv_grad_cpu(np, dy, x, w, weight_grad=0, **attributes),
        conv_grad(np, dy, x, w, weight_grad=0, **attributes), rtol=1e-4, atol=1e-4)


STRIDE_ONE = [case for case in CONV_CASES if case[2].get("strides", [1])[0] == 1]


@pytest.mark.parametrize("x_shape, w_shape, attributes", STRIDE_ONE)
def test_kernel_rows_match_generic(monkeypatch, x_shape, w_shape, attributes):
    """One matmul per kernel row over row-shifted copies: forward, fused epilogue, and the
    flipped convolution that gives dX."""
    monkeypatch.setattr(shifted_cpu, "KERNEL_ROWS_PIXELS", 0)
    dy, x, w = _conv_case(x_shape, w_shape, attributes)
    b = randn(w_shape[0])
    want = conv(np, x, w, b, **attributes)
    np.testing.assert_allclose(conv_cpu.conv_cpu(np, x, w, b, **attributes), want,
                               rtol=1e-5, atol=1e-4)
    z = randn(*want.shape)
    np.testing.assert_allclose(fused_conv(np, x, w, b, z, activation="Relu", **attributes),
                               np.maximum(want + z, 0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        conv_grad_cpu.conv_grad_cpu(np, dy, x, w, weight_grad=0, **attributes),
        conv_grad(np, dy, x, w, weight_grad=0, **attributes), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, attributes", STRIDE_ONE)
def test_kernel_row_weight_grad_matches_generic(monkeypatch, x_shape, w_shape, attributes):
    """dW by kernel rows, two images to a part over a batch of five (a shorter last part,
    whose left-over rows must add nothing)."""
    monkeypatch.setattr(shifted_cpu, "KERNEL_ROWS_PIXELS", 0)
    monkeypatch.setattr(conv_grad_cpu, "_parts", lambda n, size, length: (
        [(start, min(start + 2, n)) for start in range(0, n, 2)], 2))
    dy, x, w = _conv_case((5,) + x_shape[1:], w_shape, attributes)
    np.testing.assert_allclose(
        conv_grad_cpu.conv_grad_cpu(np, dy, x, w, input_grad=0, **attributes),
        conv_grad(np, dy, x, w, input_grad=0, **attributes), rtol=1e-4, atol=1e-4)


def test_kernel_rows_chosen_for_resnet_layers():
    x, w = np.zeros((2, 64, 56, 56), np.float32), np.zeros((64, 64, 3, 3), np.float32)
    assert conv_cpu._KernelRows.suit(x, w, (3, 3), (1, 1), (56, 56))
    assert not conv_cpu._KernelRows.suit(x, w, (3, 3), (2, 2), (28, 28))  # strided
    assert not conv_cpu._KernelRows.suit(x, w[:, :, :1, :1], (1, 1), (1, 1), (56, 56))
    few = np.zeros((32, 128, 3, 3), np.float32)  # 128 -> 32 channels: shift-and-add
    assert not conv_cpu._KernelRows.suit(np.zeros((2, 128, 56, 56)), few, (3, 3), (1, 1),
                                         (56, 56))
    small = np.zeros((2, 512, 7, 7), np.float32)  # 7x7: batched columns
    assert not conv_cpu._KernelRows.suit(small, np.zeros((512, 512, 3, 3)), (3, 3), (1, 1),
                                         (7, 7))


STRIDED = [case for case in CONV_CASES if case[2].get("strides", [1])[0] > 1] + [
    ((2, 3, 12, 11), (4, 3, 3, 3), dict(strides=[3, 2], dilations=[2, 1], pads=[2, 1, 0, 2]))]


@pytest.mark.parametrize("x_shape, w_shape, attributes", STRIDED)
def test_phase_plane_columns_match_generic(monkeypatch, x_shape, w_shape, attributes):
    """Strided columns taken from the image's stride phases (the stem's path), forward and
    weight gradient."""
    monkeypatch.setattr(im2col_cpu, "PHASE_TAPS", 0)
    monkeypatch.setattr(im2col_cpu, "BATCH_PIXELS", 0)
    dy, x, w = _conv_case(x_shape, w_shape, attributes)
    np.testing.assert_allclose(conv_cpu.conv_cpu(np, x, w, **attributes),
                               conv(np, x, w, **attributes), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        conv_grad_cpu.conv_grad_cpu(np, dy, x, w, input_grad=0, **attributes),
        conv_grad(np, dy, x, w, input_grad=0, **attributes), rtol=1e-4, atol=1e-4)


# -- MaxPoolGrad --------------------------------------------------------------------------

POOL_CASES = [
    ((2, 3, 9, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((2, 3, 10, 11), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 1, 1],
                          ceil_mode=1)),
    ((2, 3, 10, 11), dict(kernel_shape=[2, 2])),
    ((1, 2, 12, 12), dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2],
                          pads=[2, 2, 2, 2])),
    ((1, 2, 12, 13), dict(kernel_shape=[3, 3], strides=[3, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 7, 7), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    ((1, 1, 5, 5), dict(kernel_shape=[5, 5], pads=[4, 4, 4, 4], strides=[4, 4])),
]


@pytest.fixture(params=["compiled", "numpy"])
def pool_form(request, monkeypatch):
    """MaxPoolGrad's compiled loop, and the NumPy phased form it takes without numba."""
    from mixrt.ops.compiled import jit_cpu
    if request.param == "numpy":
        monkeypatch.setattr(jit_cpu, "enabled", lambda: False)
    elif not jit_cpu.enabled():
        pytest.skip("numba is not installed")
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rectified", [False, True])
@pytest.mark.parametrize("x_shape, attributes", POOL_CASES)
def test_max_pool_grad_matches_generic(monkeypatch, x_shape, attributes, rectified, dtype,
                                       pool_form):
    """Rectified inputs are mostly zeros: ties everywhere, each window's gradient going to
    its first maximum; the sums, tap by tap, equal the generic kernel's to the bit. Chunks
    of one plane exercise the NumPy form's chunking."""
    import mixrt.ops.pool.pool_grad_cpu as pool_grad_cpu
    monkeypatch.setattr(pool_grad_cpu, "CHUNK_BYTES", 1)
    x = randn(*x_shape, dtype=dtype)
    x = np.maximum(x, 0) if rectified else x
    dy = randn(*max_pool(np, x, **attributes).shape, dtype=dtype)
    want = max_pool_grad(np, dy, x, **attributes)
    out = np.full(x.shape, np.nan, dtype)
    assert max_pool_grad_cpu(np, dy, x, out=out, **attributes) is out
    np.testing.assert_array_equal(out, want)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("x_shape, attributes", POOL_CASES[:2])
def test_max_pool_grad_special_values_as_the_generic(x_shape, attributes, pool_form):
    """A NaN in a window keeps any later tap from winning; an infinite dy reaches every tap
    of its window as NaN (dy times zero), as the generic kernel's masks give."""
    x = randn(*x_shape)
    x[0, 0, 1, 1], x[0, 1, 4, 5], x[1, 2, 0, 0] = np.nan, np.inf, -np.inf
    dy = randn(*max_pool(np, x, **attributes).shape)
    dy[0, 0, 0, 0], dy[1, 1, 1, 1] = np.inf, np.nan
    np.testing.assert_array_equal(max_pool_grad_cpu(np, dy, x, **attributes),
                                  max_pool_grad(np, dy, x, **attributes))


def test_max_pool_grad_falls_back_for_1d_pools():
    x = randn(2, 3, 9)
    attributes = dict(kernel_shape=[3], strides=[2])
    dy = randn(*max_pool(np, x, **attributes).shape)
    np.testing.assert_array_equal(max_pool_grad_cpu(np, dy, x, **attributes),
                                  max_pool_grad(np, dy, x, **attributes))


# -- BatchNormalizationGrad ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x_shape", [(4, 3, 5, 5), (6, 4), (2, 3, 4, 5, 6), (3, 5, 40, 40)])
def test_batch_norm_training_grad_matches_generic(monkeypatch, x_shape, dtype):
    """An offset mean (the variance must not come from E[x^2] - E[x]^2) and small chunks."""
    monkeypatch.setattr(norm_cpu, "CHUNK_BYTES", 64)
    x = randn(*x_shape, dtype=dtype) * 3 + 50
    dy, scale = randn(*x_shape, dtype=dtype), randn(x_shape[1], dtype=dtype)
    want = batch_norm_grad(np, dy, x, scale, training_mode=1)
    out = np.full(x.shape, np.nan, dtype)
    got = batch_norm_grad_cpu(np, dy, x, scale, training_mode=1, out=out)
    assert got[0] is out
    tolerance = 1e-10 if dtype == np.float64 else 2e-4
    for g, e in zip(got, want):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=tolerance, atol=tolerance * np.abs(e).max())


@pytest.mark.parametrize("outputs", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x_shape", [(4, 3, 5, 5), (6, 4), (2, 3, 4, 5, 6), (3, 5, 40, 40)])
def test_batch_norm_training_forward_matches_generic(monkeypatch, x_shape, dtype, outputs):
    monkeypatch.setattr(norm_cpu, "CHUNK_BYTES", 64)
    x = randn(*x_shape, dtype=dtype) * 3 + 50
    params = [randn(x_shape[1], dtype=dtype) for _ in range(3)]
    params.append(np.abs(randn(x_shape[1], dtype=dtype)) + 0.5)
    attributes = dict(training_mode=1, momentum=0.8, epsilon=1e-3, _outputs=outputs)
    want = batch_normalization(np, x, *params, **attributes)
    out = np.full(x.shape, np.nan, dtype)
    got = norm_cpu.batch_normalization_cpu(np, x, *params, out=out, **attributes)
    want, got = (want,) if outputs == 1 else want, (got,) if outputs == 1 else got
    assert got[0] is out
    tolerance = 1e-10 if dtype == np.float64 else 2e-5
    for g, e in zip(got, want, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=tolerance, atol=tolerance * np.abs(e).max())


def test_batch_norm_forward_in_place_and_inference():
    """Training mode may write over X (an in-place plan); inference mode keeps the earlier
    CPU path's values."""
    x, params = randn(2, 3, 4, 4), [randn(3), randn(3), randn(3), np.abs(randn(3)) + 0.5]
    want = batch_normalization(np, x, *params, training_mode=1)
    assert norm_cpu.batch_normalization_cpu(np, x, *params, training_mode=1, out=x) is x
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)
    out = np.empty_like(x)
    norm_cpu.batch_normalization_cpu(np, x, *params, out=out)
    np.testing.assert_allclose(out, batch_normalization(np, x, *params), rtol=1e-6,
                               atol=1e-6)


def test_batch_norm_inference_grad_takes_the_generic_kernel():
    x, dy, scale = randn(2, 3, 4, 4), randn(2, 3, 4, 4), randn(3)
    mean, var = randn(3), np.abs(randn(3)) + 0.5
    want = batch_norm_grad(np, dy, x, scale, mean, var, _outputs=5)
    got = batch_norm_grad_cpu(np, dy, x, scale, mean, var, _outputs=5)
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)


# -- ReluGrad -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 40, 41)])
def test_relu_grad_matches_generic(monkeypatch, shape, dtype):
    """Including dY's inf and NaN where Y is 0 (they must give 0, as ``where`` does); in
    chunks of 64 elements, the last one shorter."""
    import mixrt.ops.elementwise.activation_grad as activation_grad
    monkeypatch.setattr(activation_grad, "_CHUNK", 64)
    y = np.maximum(randn(*shape), 0).astype(dtype)
    dy = randn(*shape).astype(dtype)
    flat_y, flat_dy = y.reshape(-1), dy.reshape(-1)
    flat_y[:3], flat_dy[:3] = 0, (np.inf, np.nan, -np.inf)
    out = np.full(shape, 7, dtype)
    got = relu_grad_cpu(np, dy, y, out=out)
    assert got is out
    np.testing.assert_array_equal(got, relu_grad(np, dy, y))
    np.testing.assert_array_equal(relu_grad_cpu(np, dy, y), relu_grad(np, dy, y))


def test_relu_grad_in_place_over_dy():
    y, dy = np.maximum(randn(4, 50), 0), randn(4, 50)
    want = relu_grad(np, dy, y)
    assert relu_grad_cpu(np, dy, y, out=dy) is dy
    np.testing.assert_array_equal(dy, want)
