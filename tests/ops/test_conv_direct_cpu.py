"""Direct convolution on the panel tile (ops/conv/conv_direct_cpu.py): against the generic im2col
Conv in float64, over the geometries that change its layout (strides and phases, padding,
dilation, 1x1 read in place or from one phase, rows or channels split over the threads,
partial strips and panels), and its epilogue (bias, residual, Relu, LeakyRelu, Clip, a
post-hoc Sigmoid)."""

import ctypes
import math
import mmap
import sys
import threading
import weakref

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu, replay, workspace
from mixrt.ops.conv import (conv_direct_cpu, direct_forms, direct_layout, pointwise_rows,
                             sparse_taps)
from mixrt.ops.conv.conv import conv as reference_conv
from mixrt.ops.conv.conv_cpu import conv_cpu, direct, geometry
from mixrt.ops.nn import fused, fused_cpu
from mixrt.ops.nn.fused import activate

# the CPU's fast paths, as a CPU session binds them
fused_conv = fused.fused_conv.kernels[-1].for_device("cpu")

RNG = np.random.default_rng(11)
needs_panels = pytest.mark.skipif(jit_cpu.panel_kernels() is None,
                                  reason="the panel tile needs AVX-512 and numba")
pytestmark = needs_panels


def _kept(prepacked: dict) -> dict:
    """What a node's dict keeps per input shape (its geometry, its layouts)."""
    return prepacked.get(workspace.SHAPES_KEY, {})


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _expected(X, W, B=None, Z=None, **attributes):
    y = reference_conv(np, X.astype(np.float64), W.astype(np.float64),
                       None if B is None else B.astype(np.float64), **attributes)
    return y if Z is None else y + Z


def _direct(X, W, B=None, Z=None, limits=conv_direct_cpu.NO_ACTIVATION, **attributes):
    """Conv through the direct path, asserting that it took it."""
    attributes = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
                  "pads": None, "strides": None} | attributes
    prepacked: dict = {}
    out = direct(X, W, B, Z, limits, attributes, None, prepacked)
    assert out is not None, "the direct path did not take this convolution"
    return out, prepacked


@pytest.fixture
def every_shape(monkeypatch):
    """The direct path for every 2-D convolution of one group, 1x1 ones whatever their size
    (none as pixel rows, ops/conv/pointwise_rows.py)."""
    monkeypatch.setattr(pointwise_rows, "MAX_PIXELS", 0)
    monkeypatch.setattr(direct_forms, "POINTWISE_POSITIONS", 0)
    monkeypatch.setattr(direct_forms, "STRIDED_POINTWISE_POSITIONS", 0)
    monkeypatch.setattr(direct_forms, "POINTWISE_PANEL_BYTES", 1 << 40)


GEOMETRIES = [  # (C, H, W), (M, kh, kw), strides, pads, dilations
    ((3, 23, 19), (10, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((5, 40, 37), (16, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((3, 45, 45), (8, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),
    ((4, 33, 30), (9, 5, 3), (3, 2), (2, 0, 1, 2), (1, 1)),
    ((6, 20, 21), (12, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),
    ((5, 23, 26), (7, 3, 5), (2, 3), (2, 1, 0, 3), (2, 3)),  # dilation across stride phases
    ((16, 36, 36), (24, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),  # read in place, 1296 positions
    ((16, 9, 7), (40, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),  # in place, one partial panel
    ((8, 29, 29), (32, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),  # one phase of four
    ((7, 6, 5), (3, 2, 2), (1, 1), (0, 1, 1, 0), (1, 1)),
    ((8, 7, 7), (64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # channels split, not rows
]


@pytest.fixture(params=["tap tile", "weight on the left"])
def tap_form(request, monkeypatch):
    """Kernels of several taps through the tap tile, or with the weight on the left
    wherever their output channels come in whole strips (whatever their taps)."""
    monkeypatch.setattr(direct_forms, "LEFT_TAPS_MAX_K",
                        0 if request.param == "tap tile" else 1 << 30)
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("image, kernel, strides, pads, dilations", GEOMETRIES)
def test_direct_matches_the_reference(image, kernel, strides, pads, dilations, dtype,
                                      every_shape, tap_form):
    X, W = _rand(2, *image, dtype=dtype), _rand(kernel[0], image[0], *kernel[1:], dtype=dtype)
    B = _rand(kernel[0], dtype=dtype)
    attributes = dict(strides=list(strides), pads=list(pads), dilations=list(dilations))
    got, _ = _direct(X, W, B, **attributes)
    want = _expected(X, W, B, **attributes)
    assert got.shape == want.shape and got.dtype == dtype
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


POINTWISE = [  # (C, H, W), M, strides, pads: the weight on the left
    ((16, 14, 14), 64, (1, 1), (0, 0, 0, 0)),  # read in place, 196 outputs: a partial panel
    ((24, 7, 7), 44, (1, 1), (0, 0, 0, 0)),  # 49 outputs, a partial strip of 4 channels
    ((8, 15, 13), 32, (2, 2), (0, 0, 0, 0)),  # one phase of four copied out
    ((300, 5, 6), 96, (1, 1), (0, 0, 0, 0)),  # 300 channels: blocks of weight rows
    ((4, 1, 3), 3, (1, 1), (0, 0, 0, 0)),  # fewer outputs than a panel, channels than a strip
    ((5, 6, 6), 8, (1, 1), (1, 0, 2, 1)),  # padded: a border of bias-only outputs
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("image, m, strides, pads", POINTWISE)
@pytest.mark.parametrize("activation, params", [("", ()), ("Relu", ()), ("Clip", (-0.2, 0.3))])
def test_pointwise_with_the_weight_on_the_left(image, m, strides, pads, dtype, activation,
                                               params, every_shape):
    X, W, B = _rand(2, *image, dtype=dtype), _rand(m, image[0], 1, 1, dtype=dtype), \
        _rand(m, dtype=dtype)
    out_dims = [-(-(d + pads[i] + pads[i + 2]) // s)
                for i, (d, s) in enumerate(zip(image[1:], strides))]
    Z = _rand(2, m, *out_dims, dtype=dtype)
    prepacked: dict = {}
    got = fused_conv(np, X, W, B, Z, strides=list(strides), pads=list(pads),
                     activation=activation, activation_params=list(params),
                     _prepacked=prepacked)
    (plan,) = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
    assert not plan.taps and plan.in_place == (strides == (1, 1) and not any(pads))
    want = _expected(X, W, B, Z, strides=list(strides), pads=list(pads))
    want = np.maximum(want, 0) if activation == "Relu" else \
        np.clip(want, *params) if activation == "Clip" else want
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch, image, m", [
    (2, (24, 13, 11), 44),  # 143 outputs: 4 whole panels (f32) and part of one, 4 rows past 40
    (1, (12, 30, 23), 72),  # 690 outputs, whole strips, split by rows over the threads
])
def test_pointwise_outputs_in_column_blocks_give_the_same_bits(batch, image, m, dtype,
                                                              every_shape, monkeypatch):
    """Every strip of output channels takes a block of outputs in turn: blocks of one or
    two panels, as a small L2 gives them, match one block over all the outputs bit for bit
    and the reference, and touch nothing past the output."""
    X, W, B = _rand(batch, *image, dtype=dtype), _rand(m, image[0], 1, 1, dtype=dtype), \
        _rand(m, dtype=dtype)
    Z = _rand(batch, m, *image[1:], dtype=dtype)
    size = Z.size
    width = jit_cpu.panel_kernels().PANEL_VECTORS * jit_cpu.panel_kernels().VECTOR_BYTES \
        // np.dtype(dtype).itemsize
    got = {}
    for panels, l2 in ((None, 1 << 40), (1, 0), (2, 4 * image[0] * 2 * width * X.itemsize)):
        monkeypatch.setattr(direct_layout, "l2_bytes", lambda l2=l2: l2)
        direct_layout._GEOMETRIES.clear()
        buffer = np.full(size + 4096, 7.0, dtype)
        out = buffer[:size].reshape(Z.shape)
        prepacked: dict = {}
        # (a weight of its own: a node's 1x1 kits are kept by its weight)
        fused_conv(np, X, W.copy(), B, Z, strides=[1, 1], pads=[0] * 4, activation="Relu",
                   activation_params=[], out=out, _prepacked=prepacked)
        (plan,) = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
        assert plan.column_block == (width * panels if panels else
                                     direct_layout.column_block(image[0], X.itemsize, width))
        assert np.all(buffer[size:] == 7.0)
        got[panels] = out.copy()
    direct_layout._GEOMETRIES.clear()
    want = np.maximum(_expected(X, W, B, Z), 0)
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got[None], want, rtol=tolerance, atol=tolerance)
    assert np.array_equal(got[1], got[None]) and np.array_equal(got[2], got[None])


def test_rows_split_and_channel_split_both_cover_the_output(every_shape, monkeypatch,
                                                           tap_form):
    X, W = _rand(1, 8, 40, 40), _rand(24, 8, 3, 3)
    want = _expected(X, W, pads=[1, 1, 1, 1])
    for rows_split_min in (1, 1000):  # rows (each thread its own planes), then channels
        monkeypatch.setattr(direct_layout, "ROWS_SPLIT_MIN", rows_split_min)
        got, prepacked = _direct(X, W, pads=[1, 1, 1, 1])
        (plan,) = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
        assert plan.by_rows == (rows_split_min == 1)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation, params, limits", [
    ("", (), conv_direct_cpu.NO_ACTIVATION),
    ("Relu", (), (1.0, 0.0, math.inf)),
    ("LeakyRelu", (0.1,), (0.1, -math.inf, math.inf)),
    ("Clip", (-0.5, 0.75), (1.0, -0.5, 0.75)),
])
@pytest.mark.parametrize("kernel", [(3, 3), (1, 1)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_the_epilogue_in_the_tile_store(activation, params, limits, kernel, with_residual,
                                        every_shape, tap_form):
    assert conv_direct_cpu.activation_limits(activation, params) == limits
    X, W, B = _rand(1, 16, 24, 24), _rand(40, 16, *kernel), _rand(40)
    pad = kernel[0] // 2
    Z = _rand(1, 40, 24, 24) if with_residual else None
    out = np.full((1, 40, 24, 24), np.nan, np.float32)
    fused_conv(np, X, W, B, Z, pads=[pad] * 4, activation=activation,
               activation_params=list(params), out=out, _prepacked={})
    want = _expected(X, W, B, Z, pads=[pad] * 4)
    if activation == "Relu":
        want = np.maximum(want, 0)
    elif activation == "LeakyRelu":
        want = np.where(want < 0, want * params[0], want)
    elif activation == "Clip":
        want = np.clip(want, *params)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(jit_cpu.native_pool() is None, reason="one thread: no images to hand out")
@pytest.mark.parametrize("batch", [2, 3, 5])
@pytest.mark.parametrize("image, kernel, strides, pads, dilations", [
    GEOMETRIES[0], GEOMETRIES[1], GEOMETRIES[6], GEOMETRIES[7], GEOMETRIES[10]])
@pytest.mark.parametrize("with_residual", [False, True])
def test_whole_images_go_to_the_threads_with_the_same_bits(batch, image, kernel, strides,
                                                          pads, dilations, with_residual,
                                                          every_shape, monkeypatch):
    """A split convolution of several images hands them out whole, a run of consecutive
    images a thread (as many as divide among the threads), the rest split inside each
    image: every output the bits the same images get one at a time, residual and
    activation included."""
    handed: list[int] = []
    images_arguments = conv_direct_cpu._images_arguments
    monkeypatch.setattr(conv_direct_cpu, "_images_arguments",
                        lambda *args: handed.append(args[-2]) or images_arguments(*args))
    monkeypatch.setattr(direct_layout, "ROWS_SPLIT_MIN", 1)  # a small image splits too
    (c, h, w), (m, kh, kw) = image, kernel
    X, W, B = _rand(batch, c, h, w), _rand(m, c, kh, kw), _rand(m)
    attributes = {"auto_pad": "NOTSET", "dilations": list(dilations), "group": 1,
                  "kernel_shape": None, "pads": list(pads), "strides": list(strides)}
    shape = reference_conv(np, X[:1], W, **attributes).shape[1:]
    Z = _rand(batch, *shape) if with_residual else None
    limits = (0.0, -math.inf, 1.5)  # a Relu6-like clamp, so the epilogue runs per image
    prepacked: dict = {}
    out = np.full((batch, *shape), np.nan, np.float32)
    direct(X, W, B, Z, limits, attributes, out, prepacked)
    threads = jit_cpu.native_pool().workers + 1
    assert handed == [batch - batch % threads]
    for n in range(batch):
        one = np.full((1, *shape), np.nan, np.float32)
        direct(X[n:n + 1], W, B, None if Z is None else Z[n:n + 1], limits, attributes, one,
               prepacked)
        np.testing.assert_array_equal(out[n], one[0])
    want = np.clip(_expected(X, W, B, Z, **attributes), 0.0, 1.5)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [16, 20])  # the output channels a whole panel, or part of one
def test_a_read_only_bias_reaches_the_drivers_as_a_writable_array(m, every_shape, monkeypatch):
    """The drivers are compiled per argument type, a read-only array another type than a
    writable one: a constant bias read from the model's file reaches them in a writable
    array of the kit's, the same values, so a node's first split call at a service's
    request never loads a twin of a driver another node loaded."""
    seen: list[tuple] = []
    kernels = jit_cpu.panel_kernels()
    for name in ("native_conv", "native_conv_images"):
        driver = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *args, driver=driver: seen.append(
            (args[4].flags.writeable, args[4][:m].copy())) or driver(*args))
    X, W = _rand(2, 8, 9, 9), _rand(m, 8, 3, 3)
    attributes = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
                  "pads": [1, 1, 1, 1], "strides": None}
    for writable in (True, False):
        B = _rand(m)
        B.flags.writeable = writable
        out = np.empty((2, m, 9, 9), np.float32)
        direct(X, W, B, None, conv_direct_cpu.NO_ACTIVATION, attributes, out, {})
        np.testing.assert_allclose(out, _expected(X, W, B, **attributes), rtol=1e-4,
                                   atol=1e-4)
        assert seen and all(flag for flag, _ in seen)
        assert all(np.array_equal(values, B) for _, values in seen)
        seen.clear()


def _pass_after(X, W, B, Z, attributes, out, activation):
    """The direct form without an activation, then ``activation`` as the compiled pass
    that followed it before the parts applied the gate."""
    assert direct(X, W, B, Z, conv_direct_cpu.NO_ACTIVATION, attributes, out, {}) is not None
    assert fused.compiled_activation(out, activation, None) is not None
    return out


@pytest.mark.parametrize("activation, dtype", [
    ("HardSwish", np.float32), ("HardSwish", np.float64), ("Swish", np.float32)])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("image, kernel, strides, pads, dilations", [
    GEOMETRIES[1], GEOMETRIES[6], GEOMETRIES[7], GEOMETRIES[8], GEOMETRIES[10],
    ((3, 64, 48), (16, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1))])  # a stem, split by rows
@pytest.mark.parametrize("with_residual", [False, True])
def test_a_gated_activation_is_the_parts_with_the_pass_after_s_bits(
        image, kernel, strides, pads, dilations, batch, with_residual, activation, dtype,
        every_shape, tap_form, monkeypatch):
    """FusedConv's HardSwish (and Swish, in float32) is applied by the direct form's native
    parts to the outputs they have just stored (``_jit_conv_direct.gated``), not by a
    compiled pass over the whole output after the convolution: the same bits as that pass,
    a NaN passed on, in the node's replay too, and no pass made."""
    (c, h, w), (m, kh, kw) = image, kernel
    X, W, B = _rand(batch, c, h, w, dtype=dtype), _rand(m, c, kh, kw, dtype=dtype), \
        _rand(m, dtype=dtype)
    X[0, 0, h // 4 * 2, w // 4 * 2] = np.nan  # (read by a stride of 2 too)
    attributes = {"auto_pad": "NOTSET", "dilations": list(dilations), "group": 1,
                  "kernel_shape": None, "pads": list(pads), "strides": list(strides)}
    shape = (batch, *reference_conv(np, X[:1], W, **attributes).shape[1:])
    Z = _rand(*shape, dtype=dtype) if with_residual else None
    monkeypatch.setattr(fused_cpu, "_activated", lambda *args: pytest.fail("a pass after"))
    prepacked: dict = {}
    out = np.full(shape, 7.0, dtype)
    for scale in (1, 3):  # the second call is the node's replay, on new values
        X *= dtype(scale)
        got = fused_conv(np, X, W, B, Z, activation=activation, out=out,
                         _prepacked=prepacked, **attributes)
        want = _pass_after(X, W, B, Z, attributes, np.full(shape, 5.0, dtype), activation)
        assert got is out and replay.KEY in prepacked
        np.testing.assert_array_equal(out, want)
    assert np.isnan(out).any()
    reference = activate(np, _expected(X, W, B, Z, **attributes), activation, None)
    finite = np.isfinite(reference)
    np.testing.assert_allclose(out[finite], reference[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation", ["HardSwish", "Swish"])
def test_a_gate_on_python_s_threads_gets_the_parts_bits(activation, every_shape, monkeypatch):
    """Without the native workers a split convolution runs its parts on Python's threads
    (``conv_direct_cpu._conv_threads``), which apply the gate after each image: the bits
    of the native parts."""
    X, W, B = _rand(2, 5, 40, 37), _rand(16, 5, 3, 3), _rand(16)
    attributes = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
                  "pads": [1, 1, 1, 1], "strides": [2, 2]}
    native = fused_conv(np, X, W, B, activation=activation, _prepacked={}, **attributes)
    monkeypatch.setattr(conv_direct_cpu, "_native_pool", lambda: None)
    monkeypatch.setattr(direct_layout, "ROWS_SPLIT_MIN", 1)
    threads = fused_conv(np, X, W, B, activation=activation, _prepacked={}, **attributes)
    np.testing.assert_array_equal(threads, native)


def test_a_gate_is_left_to_the_pass_where_another_form_takes_the_convolution():
    """Only the direct form's parts apply the gate: ``direct`` declines gated limits where
    the sparse taps would take the convolution, and FusedConv then takes its way with the
    pass after."""
    X, W, B = _rand(1, 8, 6, 6), _rand(16, 8, 3, 3), _rand(16)
    attributes = {"auto_pad": "NOTSET", "dilations": [4, 4], "group": 1, "kernel_shape": None,
                  "pads": [4, 4, 4, 4], "strides": None}  # taps mostly over padding
    out = np.empty((1, 16, 6, 6), np.float32)
    assert sparse_taps.suits(X, W, 1, geometry({}, X, W, **attributes), out)
    assert direct(X, W, B, None, direct_forms.HARD_SWISH, attributes, out, {}) is None
    got = fused_conv(np, X, W, B, activation="HardSwish", _prepacked={}, **attributes)
    want = activate(np, _expected(X, W, B, **attributes), "HardSwish", None)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_activation_the_tile_cannot_apply_runs_after_it(every_shape):
    assert conv_direct_cpu.activation_limits("Sigmoid", ()) is None
    X, W, B = _rand(1, 4, 20, 20), _rand(8, 4, 3, 3), _rand(8)
    got = fused_conv(np, X, W, B, pads=[1] * 4, activation="Sigmoid", _prepacked={})
    want = 1 / (1 + np.exp(-_expected(X, W, B, pads=[1] * 4)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nan_and_inf_reach_only_the_outputs_that_read_them(every_shape):
    X, W = _rand(1, 4, 30, 30), _rand(8, 4, 3, 3)
    X[0, 2, 10, 12] = np.nan
    X[0, 1, 20, 5] = np.inf
    got, _ = _direct(X, W, pads=[1] * 4)
    want = _expected(X, W, pads=[1] * 4)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)
    # a Relu passes NaN through (it compares, it does not take a maximum)
    out = fused_conv(np, X, W, pads=[1] * 4, activation="Relu", _prepacked={})
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))


def test_the_layout_is_made_once_per_node_and_input_shape(every_shape):
    X, W = _rand(1, 32, 30, 30), _rand(16, 32, 3, 3)  # K = 288: the tap tile
    prepacked: dict = {}
    attributes = dict(pads=[1] * 4)
    conv_cpu(np, X, W, _prepacked=prepacked, **attributes)
    layouts = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
    conv_cpu(np, X * 2, W, _prepacked=prepacked, **attributes)
    assert [v for k, v in _kept(prepacked).items() if k[0] == "direct"] == layouts
    (plan,) = layouts
    assert plan.taps and not plan.left and plan.panels.shape == (1, 32 * 9, 32)  # W's transpose
    np.testing.assert_array_equal(plan.panels[0, :, :16], W.reshape(16, -1).T)
    assert not plan.panels[0, :, 16:].any()
    # a new image size's kit starts from the node's (ops/conv/tap_sizes.py): no layout
    conv_cpu(np, _rand(1, 32, 20, 20), W, _prepacked=prepacked, **attributes)
    assert [v for k, v in _kept(prepacked).items() if k[0] == "direct"] == layouts


def test_a_constant_pointwise_weight_of_whole_strips_is_read_where_it_lies(every_shape):
    """A 1x1 node's constant weight of whole strips is not copied (ResNet-50's were 50 MB
    written at the first run); one with a partial last strip is copied with zeros past M."""
    X = _rand(1, 16, 12, 12)
    for m, borrowed in ((24, True), (20, False)):
        W = _rand(m, 16, 1, 1)
        out, prepacked = _direct(X, W)
        (plan,) = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
        assert not plan.taps and np.shares_memory(plan.weights, W) == borrowed
        assert plan.weights.shape == (24, 16)
        np.testing.assert_allclose(out, _expected(X, W), rtol=1e-4, atol=1e-4)


def test_channels_not_a_multiple_of_a_strip_leave_nothing_past_them(every_shape):
    X, W, B, Z = _rand(1, 3, 17, 17), _rand(5, 3, 3, 3), _rand(5), _rand(1, 5, 17, 17)
    size = 5 * 17 * 17
    buffer = np.full(size + 4096, 7.0, np.float32)  # the output, then cells it must not touch
    out = buffer[:size].reshape(1, 5, 17, 17)
    attributes = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                      pads=[1] * 4, strides=None)
    got = direct(X, W, B, Z, conv_direct_cpu.NO_ACTIVATION, attributes, out, {})
    assert got is out
    np.testing.assert_allclose(out, _expected(X, W, B, Z, pads=[1] * 4), rtol=1e-4, atol=1e-4)
    assert np.all(buffer[size:] == 7.0)


def _before_a_guard_page(values: np.ndarray) -> np.ndarray:
    """A copy of ``values`` whose last byte sits just before a page nothing may touch: a read
    or write past it faults (and takes the test process down)."""
    page, size = mmap.PAGESIZE, values.nbytes
    pages = -(-size // page) + 1
    memory = mmap.mmap(-1, pages * page)
    start = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(start + (pages - 1) * page, page, 0) == 0  # PROT_NONE
    guarded = np.frombuffer(memory, values.dtype, values.size, (pages - 1) * page - size)
    guarded = guarded.reshape(values.shape)
    guarded[...] = values
    return guarded


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through libc")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("image, m", [((64, 7, 7), 64), ((24, 3, 5), 16), ((40, 14, 14), 8)])
def test_a_partial_panel_read_in_place_touches_nothing_past_the_image(image, m, dtype,
                                                                       every_shape):
    # the last panel of outputs (17 of 32 at 7x7) is read and finished under a mask, with
    # the image, the residual and the output each ending at a page that faults
    X = _before_a_guard_page(_rand(1, *image, dtype=dtype))
    W, B = _rand(m, image[0], 1, 1, dtype=dtype), _rand(m, dtype=dtype)
    Z = _before_a_guard_page(_rand(1, m, *image[1:], dtype=dtype))
    out = _before_a_guard_page(np.zeros((1, m, *image[1:]), dtype))
    prepacked: dict = {}
    got = fused_conv(np, X, W, B, Z, activation="Relu", _prepacked=prepacked, out=out)
    (plan,) = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
    assert not plan.taps and plan.in_place
    want = np.maximum(_expected(X, W, B, Z), 0)
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
    assert got is out or np.shares_memory(got, out)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through libc")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("image, m, kernel, stride", [((3, 45, 45), 16, 5, 2),
                                                      ((3, 17, 13), 24, 3, 1)])
def test_taps_with_the_weight_on_the_left_touch_nothing_past_the_output(image, m, kernel,
                                                                         stride, dtype):
    # the last row's last panel (a part of 32 outputs) is stored under a mask, the residual
    # read under it, with both ending at a page that faults
    X = _rand(1, *image, dtype=dtype)
    W, B = _rand(m, image[0], kernel, kernel, dtype=dtype), _rand(m, dtype=dtype)
    pads = [kernel // 2] * 4
    want = _expected(X, W, B, pads=pads, strides=[stride] * 2)
    Z = _before_a_guard_page(_rand(*want.shape, dtype=dtype))
    out = _before_a_guard_page(np.zeros(want.shape, dtype))
    prepacked: dict = {}
    got = fused_conv(np, X, W, B, Z, pads=pads, strides=[stride] * 2, activation="Relu",
                     _prepacked=prepacked, out=out)
    (plan,) = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
    assert plan.taps and plan.left
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, np.maximum(want + Z, 0), rtol=tolerance, atol=tolerance)


def test_which_convolutions_take_it():
    X, W = _rand(1, 64, 56, 56), _rand(64, 64, 3, 3)
    found = geometry({}, X, W, "NOTSET", None, 1, None, [1] * 4, None)
    out = np.empty((1, 64, 56, 56), np.float32)
    assert conv_direct_cpu.suits(X, W, 1, found, out, {})
    assert conv_direct_cpu.suits(X, W, 1, found, None, {})  # an output to be made
    assert not conv_direct_cpu.suits(X, W, 1, found, out, None)  # a computed weight
    assert not conv_direct_cpu.suits(X, W, 2, found, out, {})  # grouped
    assert not conv_direct_cpu.suits(X.astype(np.float16), W.astype(np.float16), 1, found,
                                     np.zeros(out.shape, np.float16), {})
    assert not conv_direct_cpu.suits(X, W, 1, found, out[:, :, ::2], {})  # strided output
    # a stem's few taps put the weight on the left, where its channels fill strips of 8
    for channels, m, kernel, left in [(3, 64, 7, False), (3, 64, 5, True), (3, 24, 3, True),
                                      (3, 10, 3, False), (64, 64, 3, False), (12, 32, 3, True),
                                      (16, 32, 3, False)]:
        x, w = _rand(1, channels, 32, 32), _rand(m, channels, kernel, kernel)
        prepacked = {}
        found_taps = geometry(prepacked, x, w, "NOTSET", None, 1, None, [kernel // 2] * 4,
                              [2, 2])
        assert conv_direct_cpu.suits(x, w, 1, found_taps, None, prepacked)
        plan = conv_direct_cpu.layout(prepacked, x, w, *found_taps[:2], found_taps[2],
                                      *found_taps[4:])
        assert plan.left == left, (channels, m, kernel)
    small = _rand(1, 64, 7, 7)  # any kernel of several taps, on any image
    found_small = geometry({}, small, W, "NOTSET", None, 1, None, [1] * 4, None)
    assert conv_direct_cpu.suits(small, W, 1, found_small, None, {})
    # 1x1 of stride 1: from 7x7 outputs, whatever the channels
    for image, channels, taken in [((56, 56), 64, True), ((28, 28), 512, True),
                                   ((7, 7), 2048, True), ((6, 6), 64, False),
                                   ((4, 4), 64, False)]:
        x, w = _rand(1, channels, *image), _rand(64, channels, 1, 1)
        found_1x1 = geometry({}, x, w, "NOTSET", None, 1, None, None, None)
        assert conv_direct_cpu.suits(x, w, 1, found_1x1, None, {}) == taken, (image, channels)
    # strided 1x1: the weight on the left from 28x28 outputs when 32 outputs of every input
    # channel fit L1
    for image, channels, left in [((56, 56), 256, True), ((56, 56), 512, False),
                                  ((28, 28), 256, False)]:
        x, w = _rand(1, channels, *image), _rand(64, channels, 1, 1)
        found_1x1 = geometry({}, x, w, "NOTSET", None, 1, None, None, [2, 2])
        prepacked: dict = {}
        assert conv_direct_cpu.suits(x, w, 1, found_1x1, None, prepacked)
        kernel, strides, out_dims = found_1x1[0], found_1x1[1], found_1x1[6]
        assert direct_forms._weight_on_the_left(channels, strides, out_dims) == left
        assert direct_forms._strided_pointwise(kernel, strides, channels, out_dims,
                                                  64) != left
    # a strided 1x1 the weight-on-the-left form leaves: packed into strips
    x, w = _rand(1, 1024, 14, 14), _rand(2048, 1024, 1, 1)
    found_1x1 = geometry({}, x, w, "NOTSET", None, 1, None, None, [2, 2])
    assert conv_direct_cpu.suits(x, w, 1, found_1x1, None, {})


def test_tiles_of_seven_outputs_where_outputs_come_in_sevens():
    strip_rows = jit_cpu.panel_kernels().strip_rows
    assert [strip_rows(n) for n in (49, 98, 196, 20, 64, 784, 3136, 8, 7, 1)] == \
        [7, 7, 7, 7, 8, 8, 8, 8, 7, 7]


@pytest.mark.parametrize("image", [(40, 7, 7), (24, 14, 14), (9, 5, 4)])
@pytest.mark.parametrize("split_rows", [False, True])
def test_seven_output_tiles_match_the_reference(image, split_rows, monkeypatch):
    """7x7 planes (7 tiles of 7), 14x14 ones (28 of 7) and 20 outputs (two of 7, then 6
    through the spill), with the bias, a residual and a Relu in the tile's store."""
    monkeypatch.setattr(direct_layout, "ROWS_SPLIT_MIN", 1 if split_rows else 1000)
    X, W, B = _rand(1, *image), _rand(37, image[0], 3, 3), _rand(37)
    Z = _rand(1, 37, *image[1:])
    got = fused_conv(np, X, W, B, Z, pads=[1] * 4, activation="Relu", _prepacked={})
    want = np.maximum(_expected(X, W, B, Z, pads=[1] * 4), 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


STRIDED_POINTWISE = [  # (C, H, W), M, strides, pads: packed into strips of outputs
    ((40, 14, 14), 64, (2, 2), (0, 0, 0, 0)),  # 49 outputs: six strips and one of a lane
    ((24, 13, 11), 40, (2, 3), (0, 0, 0, 0)),  # uneven strides; a partial panel
    ((17, 9, 9), 8, (2, 2), (1, 0, 0, 1)),  # padding: lanes that read zeros
    ((33, 30, 30), 36, (2, 2), (0, 0, 0, 0)),  # 15 output rows: split by rows on 2 threads
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("image, m, strides, pads", STRIDED_POINTWISE)
@pytest.mark.parametrize("with_residual", [False, True])
def test_strided_pointwise_reads_its_input_packed_into_strips(image, m, strides, pads, dtype,
                                                               with_residual, monkeypatch):
    monkeypatch.setattr(direct_layout, "ROWS_SPLIT_MIN", 4)
    X, W, B = _rand(2, *image, dtype=dtype), _rand(m, image[0], 1, 1, dtype=dtype), \
        _rand(m, dtype=dtype)
    out_dims = [(d + pads[i] + pads[i + 2] - 1) // s + 1
                for i, (d, s) in enumerate(zip(image[1:], strides))]
    Z = _rand(2, m, *out_dims, dtype=dtype) if with_residual else None
    prepacked: dict = {}
    got = fused_conv(np, X, W, B, Z, strides=list(strides), pads=list(pads),
                     activation="Relu", _prepacked=prepacked)
    (plan,) = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
    assert plan.strips and plan.taps
    want = np.maximum(_expected(X, W, B, Z, strides=list(strides), pads=list(pads)), 0)
    tolerance = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


SMALL_EXPANSIONS = [  # (N, C, H, W), M: stride-1 1x1 expansions of small planes
    ((1, 16, 6, 6), 96),  # 36 pixels: four strips and one of half its lanes
    ((3, 24, 4, 4), 72),  # two whole strips an image, three images
    ((2, 40, 7, 6), 120),  # 42 pixels; a partial panel of 32 outputs
]


@pytest.mark.parametrize("shape, m", SMALL_EXPANSIONS)
@pytest.mark.parametrize("activation, params, with_residual", [
    ("Clip", [0.0, 6.0], False), ("HardSwish", None, False), ("Relu", None, True),
    ("", None, False)])
def test_small_plane_expansions_take_the_strips_and_replay(shape, m, activation, params,
                                                           with_residual):
    """Their outputs stored transposed with the epilogue in the tile; an activation the tile
    does not apply (HardSwish) runs after it, in the replay too, at outputs under the
    elementwise programs' compiled size (3 x 72 x 16)."""
    X, W, B = _rand(*shape), _rand(m, shape[1], 1, 1), _rand(m)
    assert conv_direct_cpu.small_expansion(shape[1], shape[2:], m)
    Z = _rand(shape[0], m, *shape[2:]) if with_residual else None
    prepacked: dict = {}
    out = np.full((shape[0], m) + shape[2:], np.nan, np.float32)
    for scale in (1, 3):  # the second call is the replay, on new values in the same arrays
        X *= np.float32(scale)
        got = fused_conv(np, X, W, B, Z, activation=activation, activation_params=params,
                         out=out, _prepacked=prepacked)
        want = activate(np, _expected(X, W, B, Z), activation, params)
        assert got is out and replay.KEY in prepacked
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    (plan,) = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
    assert plan.strips and plan.taps


def test_what_small_planes_leave_to_the_pixel_rows():
    expands = conv_direct_cpu.small_expansion
    assert expands(96, (6, 6), 576) and expands(40, (4, 4), 80)
    assert not expands(576, (6, 6), 96)  # a projection
    assert not expands(160, (3, 3), 960)  # 9 pixels: two strips for one and a lane
    assert not expands(112, (5, 5), 672)  # 25 pixels: 7 lanes of 32 empty
    assert not expands(64, (7, 7), 384)  # 49: the weight on the left


def test_strips_hold_each_output_pixel_per_channel_and_zeros_past_the_last():
    kernels = jit_cpu.panel_kernels()
    x = _rand(3, 9, 9)
    packed = np.full((3, 3, 8), np.nan, np.float32)  # 2 rows of 5 outputs: two strips
    kernels.pack_strips(x, packed.reshape(-1), 2, 2, 5, 2, 2, 0, 0)
    outputs = [(oy, ox) for oy in (2, 3) for ox in range(5)]
    for q, (oy, ox) in enumerate(outputs):
        np.testing.assert_array_equal(packed[q // 8, :, q % 8], x[:, oy * 2, ox * 2])
    assert not packed[1, :, 2:].any()  # the second strip's lanes past output 10
    assert np.isnan(packed[2]).all()  # nothing written past the strips in use
    # stride 1: strips run across the image's rows
    contiguous = np.full((2, 3, 8), np.nan, np.float32)
    kernels.pack_strips(x, contiguous.reshape(-1), 7, 1, 9, 1, 1, 0, 0)
    for q in range(9):
        np.testing.assert_array_equal(contiguous[q // 8, :, q % 8], x[:, 7, q])
    assert not contiguous[1, :, 1:].any()


def test_without_the_tile_conv_takes_its_older_paths(monkeypatch):
    monkeypatch.setattr(jit_cpu, "panel_kernels", lambda: None)
    X, W = _rand(1, 8, 30, 30), _rand(16, 8, 3, 3)
    assert direct(X, W, None, None, conv_direct_cpu.NO_ACTIVATION,
                  dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                       pads=[1] * 4, strides=None), None, {}) is None
    got = conv_cpu(np, X, W, pads=[1] * 4, _prepacked={})
    np.testing.assert_allclose(got, _expected(X, W, pads=[1] * 4), rtol=1e-4, atol=1e-4)


def _kit_of(plan):
    """This thread's kit for ``plan`` (``jit_cpu.scratch_kit``'s table), or None."""
    for (owner, _), (ref, kit) in jit_cpu._thread_kits().items():
        if ref() is plan:
            return kit
    return None


def _fresh_scratch():
    """This thread's scratch buffers and kits dropped (other tests grew them already)."""
    jit_cpu._scratch.__dict__.clear()
    jit_cpu._thread_kits().clear()


def test_a_kit_is_rebuilt_when_the_planes_it_points_to_are_reallocated(every_shape):
    _fresh_scratch()
    small, large = _rand(1, 8, 12, 12), _rand(1, 8, 90, 90)
    W = _rand(16, 8, 3, 3)
    first, plan_small = _direct(small, W, pads=[1] * 4)
    (plan,) = [v for k, v in _kept(plan_small).items() if k[0] == "direct"]
    kit = _kit_of(plan)
    assert kit is not None
    # a larger image grows this thread's phase-plane buffer: every kit pointing at the old
    # one is dropped, so none keeps it alive or writes into it
    _direct(large, W, pads=[1] * 4)
    assert _kit_of(plan) is None
    again = direct(small, W, None, None, conv_direct_cpu.NO_ACTIVATION,
                   dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                        pads=[1] * 4, strides=None), None, plan_small)
    np.testing.assert_array_equal(again, first)
    rebuilt = _kit_of(plan)
    planes = jit_cpu.scratch_array("direct_planes", np.float32, (1,))
    assert rebuilt is not kit
    assert rebuilt.words[jit_cpu.panel_kernels().PLANES] == planes.ctypes.data


def test_a_pointwise_convolution_read_in_place_asks_for_no_planes(every_shape):
    _fresh_scratch()
    W3 = _rand(16, 8, 3, 3)
    W1 = _rand(24, 64, 1, 1)
    _direct(_rand(1, 8, 12, 12), W3, pads=[1] * 4)  # a small image's planes
    _direct(_rand(1, 64, 4, 4), W1)  # the 1x1's edges, of its channels
    generation = jit_cpu.scratch_generation()
    # a 1x1 convolution of stride 1 reads its image where it lies: a far larger one grows
    # no buffer, so no kit of the thread is let go
    X = _rand(2, 64, 60, 70)
    out, prepacked = _direct(X, W1)
    np.testing.assert_allclose(out, _expected(X, W1), rtol=1e-4, atol=1e-4)
    # (its kit at this size made from the node's at 4x4, whose layout reads in place)
    kit = conv_direct_cpu._pointwise_kit(X, W1, ((1, 1), (1, 1), (1, 1), None, (0, 0), (0, 0),
                                                 (60, 70)), conv_direct_cpu.NO_ACTIVATION)
    assert kit.words[jit_cpu.panel_kernels().PLANES + 1] == 0  # no planes' length
    assert jit_cpu.scratch_generation() == generation
    _fresh_scratch()  # and by the full route, on a thread with no kit of the node
    out, prepacked = _direct(_rand(1, 64, 50, 90), W1)
    (plan,) = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
    assert plan.in_place
    assert _kit_of(plan).words[jit_cpu.panel_kernels().PLANES + 1] == 0


def test_a_scratch_buffer_grows_with_room_to_spare(monkeypatch):
    """An outgrown buffer doubles (each growth lets go of the thread's kits and asks every
    bound call again); past SCRATCH_DOUBLING_BYTES it grows by a quarter."""
    _fresh_scratch()

    def held():
        return jit_cpu._scratch.__dict__["room"][np.dtype(np.float32).str].size

    first = jit_cpu.scratch_array("room", np.float32, (1000,))
    generation = jit_cpu.scratch_generation()
    grown = jit_cpu.scratch_array("room", np.float32, (1100,))
    assert jit_cpu.scratch_generation() == generation + 1
    assert grown.base is not first.base and held() >= 2000
    # within the double it kept to spare: the same buffer, no kit let go
    again = jit_cpu.scratch_array("room", np.float32, (held(),))
    assert jit_cpu.scratch_generation() == generation + 1
    assert np.shares_memory(again, grown)
    before = held()
    jit_cpu.scratch_array("room", np.float32, (before + 1,))
    assert jit_cpu.scratch_generation() == generation + 2 and held() >= 2 * before
    # past the doubling's bound: a quarter
    monkeypatch.setattr(jit_cpu, "SCRATCH_DOUBLING_BYTES", held() * 4)
    before = held()
    jit_cpu.scratch_array("room", np.float32, (before + 1,))
    assert jit_cpu.scratch_generation() == generation + 3
    assert before * 5 // 4 <= held() < 2 * before


def test_a_kit_is_never_handed_to_another_owner():
    class Owner:
        pass
    made = []

    def make():
        made.append(object())
        return made[-1]
    first, other = Owner(), Owner()
    assert jit_cpu.scratch_kit(first, "k", make) is jit_cpu.scratch_kit(first, "k", make)
    assert len(made) == 1
    # an entry under ``other``'s id whose owner is gone (ids are reused) is made again
    gone = Owner()
    jit_cpu._thread_kits()[(id(other), "k")] = (weakref.ref(gone), "stale")
    del gone
    assert jit_cpu.scratch_kit(other, "k", make) is made[-1] and len(made) == 2


def _in_threads(call, count):
    """``call(i)`` on ``count`` threads at once; the first exception any raised, re-raised."""
    errors = []

    def run(index):
        try:
            call(index)
        except Exception as exc:  # noqa: BLE001  (re-raised below)
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def test_threads_calling_one_node_at_once_each_use_their_own_kit():
    X, W, B = _rand(2, 16, 40, 40), _rand(24, 16, 3, 3), _rand(24)
    attributes = dict(pads=[1] * 4)
    prepacked: dict = {}
    expected = _expected(X, W, B, **attributes)
    results = []

    def call(_):
        for _ in range(20):
            results.append(conv_cpu(np, X, W, B, _prepacked=prepacked, **attributes))
    _in_threads(call, 4)
    assert len(results) == 80
    for got in results:
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("width", [1, 2, 3, 8, 13, 28])
@pytest.mark.parametrize("left", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_phase_planes_of_stride_two_hold_every_padded_pixel_once(width, left, dtype):
    kernels = jit_cpu.panel_kernels()
    c, height, top, sy = 3, 7, 1, 2
    x = _rand(c, height, width, dtype=dtype)
    ph, pw = -(-(height + top + 1) // sy), -(-(width + left + 1) // 2)
    planes = np.full((sy, 2, c, ph * pw + 5), np.nan, dtype)  # + the aligning cells
    kernels.phase_planes(x, planes, ph, pw, sy, 2, top, left, 0, ph)
    padded = np.zeros((c, ph * sy + 2, pw * 2 + 2), dtype)
    padded[:, top:top + height, left:left + width] = x
    for ry in range(sy):
        for rx in range(2):
            want = padded[:, ry:ry + ph * sy:sy, rx:rx + pw * 2:2][:, :ph, :pw]
            np.testing.assert_array_equal(planes[ry, rx, :, :ph * pw].reshape(c, ph, pw), want)
    assert np.isnan(planes[..., ph * pw:]).all()  # nothing past the planes' rows


# -- a weight that is not a constant (training, a gradient's convolution) ------------------

@pytest.mark.parametrize("c, kernel, strides, m", [
    (16, (3, 3), (1, 1), 40),   # tap tile, a partial last panel
    (2, (7, 7), (2, 2), 8),     # a stem: K = 98, the weight on the left
    (16, (1, 1), (1, 1), 20),   # 1x1 read in place: whole strips
    (16, (1, 1), (1, 1), 24),   # a weight of whole strips, copied all the same (repacked)
])
def test_a_weight_that_varies_is_packed_again_on_every_call(c, kernel, strides, m,
                                                            monkeypatch):
    """With the node's dict but no constant weight, a large enough call takes the direct
    path and packs its weight on each call: a weight changed in place, under the same
    address, gives the new result (no replay, no stale panels), and the caller's first
    weight is never written."""
    monkeypatch.setattr(direct_forms, "POINTWISE_POSITIONS", 0)
    pads = [k // 2 for k in kernel] * 2
    X, W = _rand(2, c, 48, 48), _rand(m, c, *kernel)
    first = W.copy()
    node: dict = {}
    taken = []
    real = conv_direct_cpu.conv
    monkeypatch.setattr(conv_direct_cpu, "conv", lambda *a, **k: taken.append(k) or real(*a, **k))
    out = np.empty((2, m) + tuple(48 // s for s in strides), np.float32)
    for step in range(3):
        got = conv_cpu(np, X, W, pads=pads, strides=list(strides), out=out, _node=node)
        assert got is out and taken[-1]["repack"]
        np.testing.assert_allclose(got, _expected(X, W, pads=pads, strides=list(strides)),
                                   rtol=1e-4, atol=1e-4)
        if step == 0:
            np.testing.assert_array_equal(W, first)
        W *= -0.5  # in place, as an optimizer updates a parameter
    assert len(taken) == 3


def test_a_small_call_with_a_weight_that_varies_keeps_the_older_paths(monkeypatch):
    """Below VARYING_MIN_POSITIONS packing does not repay itself: not the direct path."""
    X, W = _rand(1, 8, 16, 16), _rand(8, 8, 3, 3)  # 256 positions
    assert direct(X, W, None, None, conv_direct_cpu.NO_ACTIVATION,
                  dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                       pads=[1] * 4, strides=None), None, None, node={}) is None
    monkeypatch.setattr(conv_direct_cpu, "VARYING_MIN_POSITIONS", 256)
    got = direct(X, W, None, None, conv_direct_cpu.NO_ACTIVATION,
                 dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                      pads=[1] * 4, strides=None), None, None, node={})
    np.testing.assert_allclose(got, _expected(X, W, pads=[1] * 4), rtol=1e-4, atol=1e-4)


def test_threads_with_different_weights_at_once_each_pack_their_own():
    """One node run by four threads at once, each with its own weight (one Session, several
    request threads, the weight an input): each thread's layout holds its own packing."""
    X = _rand(2, 16, 32, 32)
    weights = [_rand(24, 16, 3, 3) for _ in range(4)]
    expected = [_expected(X, W, pads=[1] * 4) for W in weights]
    node: dict = {}

    def call(index):
        for _ in range(15):
            got = conv_cpu(np, X, weights[index], pads=[1] * 4, _node=node)
            np.testing.assert_allclose(got, expected[index], rtol=1e-4, atol=1e-4)
    _in_threads(call, 4)


def test_a_node_whose_weight_changes_dtype_keeps_a_layout_per_dtype():
    """An imperative op's dict serves every call with its attributes: float32, then float64
    of the same shapes (a network cast), each packed into a layout of its own dtype."""
    X, W = _rand(2, 8, 32, 32), _rand(16, 8, 3, 3)
    node: dict = {}
    for dtype in (np.float32, np.float64, np.float32):
        x, w = X.astype(dtype), W.astype(dtype)
        got = conv_cpu(np, x, w, pads=[1] * 4, _node=node)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, _expected(x, w, pads=[1] * 4), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("geometry", [GEOMETRIES[0], GEOMETRIES[6], GEOMETRIES[9]],
                         ids=["taps", "pointwise", "stem"])
def test_new_image_sizes_share_the_nodes_packed_weight(every_shape, geometry):
    """A constant weight's packed forms follow from the weight alone: the layouts of a
    node's new image sizes share them (a service's every new size packed them again), and
    each size still computes its own convolution."""
    (c, h, w), (m, kh, kw), strides, pads, dilations = geometry
    W, B = _rand(m, c, kh, kw), _rand(m)
    prepacked: dict = {}
    attributes = {"auto_pad": "NOTSET", "dilations": dilations, "group": 1,
                  "kernel_shape": None, "pads": pads, "strides": strides}
    for grow in (0, 5, 2):
        X = _rand(2, c, h + grow, w + 2 * grow)
        out = direct(X, W, B, None, conv_direct_cpu.NO_ACTIVATION, attributes, None,
                     prepacked)
        np.testing.assert_allclose(out, _expected(X, W, B, strides=strides, pads=pads,
                                                  dilations=dilations),
                                   rtol=1e-4, atol=1e-4)
    layouts = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
    # new sizes need no layout: their kits start from the first size's (an in-place 1x1's
    # in conv_direct_cpu, one with taps in ops/conv/tap_sizes.py)
    assert len(layouts) == 1
    packed = [(id(p.panels) if p.taps and not p.left else id(p.weights)) for p in layouts]
    assert len(set(packed)) == 1


def test_a_node_keeps_what_it_worked_out_for_its_latest_input_shapes_only(every_shape):
    """A service's new image sizes each add a geometry and a layout to the node: the oldest
    go past MAX_SHAPES_KEPT shapes, and a shape met again works them out again."""
    W = _rand(4, 3, 3, 3)
    prepacked: dict = {}
    sides = range(6, 6 + workspace.MAX_SHAPES_KEPT + 5)
    for side in sides:
        X = _rand(1, 3, side, side)
        got = conv_cpu(np, X, W, pads=[1] * 4, _prepacked=prepacked)
        np.testing.assert_allclose(got, _expected(X, W, pads=[1] * 4), rtol=1e-4, atol=1e-4)
    # (a layout is made at the first size alone: the others' kits start from its kit)
    shapes = [key[1] for key in _kept(prepacked) if key[0] == "geometry"]  # by C, H, W
    assert len(shapes) <= workspace.MAX_SHAPES_KEPT
    assert (3, sides[-1], sides[-1]) in shapes  # the newest kept
    assert (3, 6, 6) not in shapes  # the oldest gone
    X = _rand(1, 3, 6, 6)
    np.testing.assert_allclose(conv_cpu(np, X, W, pads=[1] * 4, _prepacked=prepacked),
                               _expected(X, W, pads=[1] * 4), rtol=1e-4, atol=1e-4)


def test_a_new_batch_of_a_known_image_size_reuses_its_geometry_and_layout(every_shape):
    """A node's geometry and layout are an image's: a batch of another size of images it has
    met works neither out again, and its answer is the convolution's."""
    W = _rand(4, 3, 3, 3)
    prepacked: dict = {}
    for batch in (1, 3, 2):
        X = _rand(batch, 3, 9, 11)
        got = conv_cpu(np, X, W, pads=[1] * 4, _prepacked=prepacked)
        np.testing.assert_allclose(got, _expected(X, W, pads=[1] * 4), rtol=1e-4, atol=1e-4)
    kinds = [key[0] for key in _kept(prepacked)]
    assert kinds.count("geometry") == 1 and kinds.count("direct") == 1


@pytest.mark.parametrize("kernel", [(3, 3), (1, 1)])
def test_nodes_of_one_geometry_share_its_layout_each_with_its_own_weight(kernel, every_shape,
                                                                         tap_form):
    """A CNN's blocks repeat their convolutions: the second node of a geometry takes the
    first one's offsets, places and parts, and computes with its own packed weight."""
    X, pads = _rand(2, 8, 21, 19), [kernel[0] // 2] * 4
    plans = []
    for _ in range(2):
        W, B = _rand(16, 8, *kernel), _rand(16)
        got, prepacked = _direct(X, W, B, pads=pads)
        np.testing.assert_allclose(got, _expected(X, W, B, pads=pads), rtol=1e-4, atol=1e-4)
        (plan,) = [v for k, v in _kept(prepacked).items() if k[0] == "direct"]
        plans.append(plan)
    first, second = plans
    assert first is not second and first.native_parts() is second.native_parts()
    assert conv_direct_cpu._weight_of(first) is not conv_direct_cpu._weight_of(second)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_pointwise_kit_at_a_new_image_size_is_the_full_routes(every_shape, dtype):
    """An in-place 1x1 convolution's kit at a new image size is made from the node's kit at
    its first size (no layout, no parts object): the very words the full route's kit has
    (the bounds in an array of their own, of the same values), and the same outputs."""
    _fresh_scratch()
    kernels = jit_cpu.panel_kernels()
    limits = (1.0, 0.0, math.inf)  # Relu
    for channels, m in ((16, 24), (64, 40), (96, 576)):
        W = _rand(m, channels, 1, 1, dtype=dtype)
        B = _rand(m, dtype=dtype)
        _direct(_rand(1, channels, 9, 11, dtype=dtype), W, B, limits=limits)  # the first
        for image in ((40, 64), (7, 5), (16, 16), (112, 96), (3, 200)):
            X = _rand(2, channels, *image, dtype=dtype)
            made = []
            real = direct_layout.layout
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(conv_direct_cpu, "layout", lambda *a, **k: made.append(1)
                              or real(*a, **k))
                out, _ = _direct(X, W, B, limits=limits)
            assert not made, "a new size of the node took its full route"
            np.testing.assert_allclose(out, np.maximum(_expected(X, W, B), 0), rtol=1e-4,
                                       atol=1e-4)
            geometry_ = ((1, 1), (1, 1), (1, 1), None, (0, 0), (0, 0), image)
            quick = conv_direct_cpu._pointwise_kit(X, W, geometry_, limits)
            plan = direct_layout.layout({}, X, W, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0),
                                        image, constant=True)
            full = conv_direct_cpu._Kit(plan, np.dtype(dtype), limits)
            # the addresses of arrays made anew: the bounds (compared by value), and the
            # epilogue's constants (this layout's node dict is a new one: another base)
            made_anew = [kernels.BOUNDS, kernels.NO_BIAS, kernels.LIMITS]
            assert np.array_equal(np.delete(quick.words, made_anew),
                                  np.delete(full.words, made_anew))
            assert np.array_equal(quick.bounds, plan.native_parts().bounds)
            assert quick.parts == full.parts


def test_a_pointwise_kit_is_not_made_for_what_the_full_route_decides(every_shape):
    _fresh_scratch()
    W = _rand(24, 16, 1, 1)
    limits = conv_direct_cpu.NO_ACTIVATION
    X = _rand(1, 16, 20, 20)
    geometry_ = ((1, 1), (1, 1), (1, 1), None, (0, 0), (0, 0), (20, 20))
    assert conv_direct_cpu._pointwise_kit(X, W, geometry_, limits) is None  # none made yet
    _direct(_rand(1, 16, 9, 9), W)
    assert conv_direct_cpu._pointwise_kit(X, W, geometry_, limits) is not None
    padded = ((1, 1), (1, 1), (1, 1), None, (1, 1), (1, 1), (22, 22))
    strided = ((1, 1), (2, 2), (1, 1), None, (0, 0), (0, 0), (10, 10))
    for other in (padded, strided):
        assert conv_direct_cpu._pointwise_kit(X, W, other, limits) is None
    assert conv_direct_cpu._pointwise_kit(X, W, geometry_, (0.1, -1.0, 1.0)) is None
    assert conv_direct_cpu._pointwise_kit(X.astype(np.float64), W, geometry_, limits) is None
