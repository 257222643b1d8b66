"""1x1 convolutions over small planes as pixel rows against the packed weight
(ops/conv/pointwise_rows.py): Conv and FusedConv against the generic convolution, replayed."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.conv import pointwise_rows
from mixrt.ops.conv.conv import conv
from mixrt.ops.conv.conv_cpu import conv_cpu
from mixrt.ops.nn import fused
from mixrt.ops.nn.fused import activate

fused_conv = fused.fused_conv.kernels[-1].for_device("cpu")
RNG = np.random.default_rng(12)
ATTRIBUTES = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                  strides=None)
# the panel tile (AVX-512) or, without it, the BLAS's product (pointwise_rows._blas_action)
TILE = jit_cpu.panel_kernels() is not None


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("batch, channels, outputs, side", [(1, 192, 1152, 3), (3, 480, 80, 6),
                                                           (2, 1152, 192, 2),
                                                           (2, 80, 480, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation, params, residual", [("", None, False),
                                                          ("Relu", None, True),
                                                          ("HardSigmoid", [0.2, 0.5], False)])
def test_fused_rows_match_the_generic_convolution_and_replay(batch, channels, outputs, side,
                                                            dtype, activation, params,
                                                            residual):
    X = _rand(batch, channels, side, side, dtype=dtype)
    W, B = _rand(outputs, channels, 1, 1, dtype=dtype), _rand(outputs, dtype=dtype)
    Z = _rand(batch, outputs, side, side, dtype=dtype) if residual else None
    prepacked: dict = {}
    assert pointwise_rows.suits(X, W, 1, None, None, "NOTSET", None, prepacked)
    out = np.full((batch, outputs, side, side), np.nan, dtype)
    for scale in (1, 3):  # the second call is the replay, on new values in the same arrays
        X *= dtype(scale)
        expected = conv(np, X, W, B, **ATTRIBUTES) + (0 if Z is None else Z)
        expected = activate(np, expected, activation, params)
        got = fused_conv(np, X, W, B, Z, activation=activation, activation_params=params,
                         out=out, _prepacked=prepacked, **ATTRIBUTES)
        assert got is out and replay.KEY in prepacked
        tolerance = 1e-4 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance * channels)


def test_plain_rows_into_a_new_array_and_what_they_leave_to_the_other_forms():
    X, W, B = _rand(2, 64, 4, 4), _rand(96, 64, 1, 1), _rand(96)
    np.testing.assert_allclose(conv_cpu(np, X, W, B, _prepacked={}, **ATTRIBUTES),
                               conv(np, X, W, B, **ATTRIBUTES), rtol=1e-4, atol=1e-3)
    some = {}
    assert not pointwise_rows.suits(X, W, 1, None, None, "NOTSET", None, None)  # W varies
    # 7x7 and larger: the direct form's on the tile, the BLAS's planes without it
    assert pointwise_rows.suits(_rand(1, 64, 7, 7), W, 1, None, None, "NOTSET", None,
                                some) is not TILE
    assert not pointwise_rows.suits(_rand(1, 64, 1, 1), W, 1, None, None, "NOTSET", None, some)
    assert not pointwise_rows.suits(X, W, 1, [1, 1, 1, 1], None, "NOTSET", None, some)
    assert not pointwise_rows.suits(X, W, 1, None, [2, 2], "NOTSET", None, some)
    assert not pointwise_rows.suits(X, _rand(96, 64, 3, 3), 1, None, None, "NOTSET", None, some)
    # small products too: the banded form's Python was most of their time
    assert pointwise_rows.suits(_rand(1, 8, 4, 4), _rand(8, 8, 1, 1), 1, None, None,
                                "NOTSET", None, some)
    # expansions of whole strips of pixels go to the direct form's strips, where it exists
    assert pointwise_rows.suits(_rand(1, 8, 4, 4), _rand(16, 8, 1, 1), 1, None, None,
                                "NOTSET", None, some) is not TILE


@pytest.mark.parametrize("batch, channels, outputs, side", [(1, 16, 72, 24), (2, 24, 40, 12),
                                                           (1, 96, 576, 3), (3, 40, 8, 5)])
@pytest.mark.parametrize("activation, params, residual", [("", None, False),
                                                          ("Relu", None, True),
                                                          ("HardSwish", None, False)])
def test_without_the_tile_the_blas_forms_match_and_replay(monkeypatch, batch, channels,
                                                          outputs, side, activation, params,
                                                          residual):
    """The BLAS's rows (up to MAX_PIXELS) and planes (beyond) where the tile is missing, on
    any CPU: the generic convolution's values, on the first call and the replay."""
    monkeypatch.setattr(jit_cpu, "panel_kernels", lambda: None)
    X, W, B = _rand(batch, channels, side, side), _rand(outputs, channels, 1, 1), _rand(outputs)
    Z = _rand(batch, outputs, side, side) if residual else None
    prepacked: dict = {}
    assert pointwise_rows.suits(X, W, 1, None, None, "NOTSET", None, prepacked)
    out = np.full((batch, outputs, side, side), np.nan, np.float32)
    for scale in (1, 3):
        X *= np.float32(scale)
        expected = conv(np, X, W, B, **ATTRIBUTES) + (0 if Z is None else Z)
        expected = activate(np, expected, activation, params)
        got = fused_conv(np, X, W, B, Z, activation=activation, activation_params=params,
                         out=out, _prepacked=prepacked, **ATTRIBUTES)
        assert got is out and replay.KEY in prepacked
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * channels)
    plain = conv_cpu(np, X, W, B, _prepacked={}, **ATTRIBUTES)
    np.testing.assert_allclose(plain, conv(np, X, W, B, **ATTRIBUTES), rtol=1e-4,
                               atol=1e-4 * channels)


def test_without_the_tile_large_planes_keep_the_banded_form(monkeypatch):
    monkeypatch.setattr(jit_cpu, "panel_kernels", lambda: None)
    W = _rand(64, 32, 1, 1)
    assert pointwise_rows.suits(_rand(1, 32, 64, 64), W, 1, None, None, "NOTSET", None, {})
    # 2 x 64 x 96 x 96 float32 outputs: 4.7 MB, past PLANES_MAX_BYTES
    assert not pointwise_rows.suits(_rand(2, 32, 96, 96), W, 1, None, None, "NOTSET", None, {})


@pytest.mark.skipif(not TILE or not jit_cpu.NATIVE_POOL_PLATFORM,
                    reason="the one compiled call runs on the panel tile with the native pool")
@pytest.mark.parametrize("activation, params", [("", None), ("Relu", None),
                                                ("Clip", [0.0, 6.0]), ("LeakyRelu", [0.1])])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("batch, channels, outputs, side", [(1, 576, 96, 6), (2, 64, 64, 3)])
def test_the_one_compiled_call_gives_the_separate_calls_bits(monkeypatch, activation, params,
                                                             residual, batch, channels,
                                                             outputs, side):
    """Relu, Clip, LeakyRelu or no activation: the pixel rows, their product and the
    epilogue in one compiled call (pointwise_rows._compiled_action), the same bits as the
    transposes, product and epilogue pass it replaced, NaN and infinities included."""
    X = _rand(batch, channels, side, side)
    X[0, 0, 0, 0], X[-1, 1, -1, -1] = np.nan, np.inf
    W, B = _rand(outputs, channels, 1, 1), _rand(outputs)
    Z = _rand(batch, outputs, side, side) if residual else None
    made = []
    real = pointwise_rows._compiled_action
    monkeypatch.setattr(pointwise_rows, "_compiled_action",
                        lambda *args: made.append(1) or real(*args))
    monkeypatch.setattr(pointwise_rows, "_banded_action", lambda *args: None)

    def run(prepacked):
        out = np.full((batch, outputs, side, side), -7.0, np.float32)
        return fused_conv(np, X, W, B, Z, activation=activation, activation_params=params,
                          out=out, _prepacked=prepacked, **ATTRIBUTES)
    compiled = run({})
    assert made
    monkeypatch.setattr(pointwise_rows, "_compiled_action", lambda *args: None)
    separate = run({})
    np.testing.assert_array_equal(compiled, separate)
    assert np.isnan(compiled).any()


@pytest.mark.skipif(not TILE or not jit_cpu.NATIVE_POOL_PLATFORM,
                    reason="the bands run on the panel tile with the native pool")
@pytest.mark.parametrize("activation, params", [("", None), ("Relu", None),
                                                ("Clip", [0.0, 6.0]), ("LeakyRelu", [0.1]),
                                                ("HardSigmoid", [0.2, 0.5]),
                                                ("HardSwish", None)])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("batch, channels, outputs, side, dtype", [
    (4, 576, 96, 6, np.float32), (8, 240, 40, 6, np.float32), (6, 64, 64, 5, np.float32),
    (4, 120, 72, 6, np.float64)])
def test_bands_of_pixel_rows_give_the_separate_calls_bits(monkeypatch, activation, params,
                                                         residual, batch, channels, outputs,
                                                         side, dtype):
    """A split product's pixel rows in bands (pointwise_rows._banded_action), each band
    copied in, multiplied and finished (a clamp, HardSigmoid, HardSwish) by the thread that
    took it: the same bits as the transposes, product and epilogue pass, NaN and infinities
    included, on the first call and its replay."""
    X = _rand(batch, channels, side, side, dtype=dtype)
    X[0, 0, 0, 0], X[-1, 1, -1, -1] = np.nan, np.inf
    W, B = _rand(outputs, channels, 1, 1, dtype=dtype), _rand(outputs, dtype=dtype)
    Z = _rand(batch, outputs, side, side, dtype=dtype) if residual else None
    made = []
    real = pointwise_rows._banded_action
    monkeypatch.setattr(pointwise_rows, "_banded_action",
                        lambda *args: made.append(real(*args)) or made[-1])

    def run(prepacked, out):
        return fused_conv(np, X, W, B, Z, activation=activation, activation_params=params,
                          out=out, _prepacked=prepacked, **ATTRIBUTES).copy()
    prepacked, out = {}, np.full((batch, outputs, side, side), -7.0, dtype)
    banded = run(prepacked, out)
    assert made and made[0] is not None
    first = X.copy()
    X[0, 2] *= 3  # the replay, on new values in the same arrays
    replayed = run(prepacked, out)
    monkeypatch.setattr(pointwise_rows, "_banded_action", lambda *args: None)
    monkeypatch.setattr(pointwise_rows, "_compiled_action", lambda *args: None)
    np.testing.assert_array_equal(replayed, run({}, np.empty_like(out)))
    X[...] = first
    np.testing.assert_array_equal(banded, run({}, np.empty_like(out)))
    assert np.isnan(banded).any()


@pytest.mark.skipif(not TILE or not jit_cpu.NATIVE_POOL_PLATFORM,
                    reason="both row forms run on the panel tile with the native pool")
def test_row_forms_share_the_thread_s_scratch_and_outlive_its_reallocation():
    """The pixel rows and products are this thread's scratch, not buffers each call keeps:
    nodes of two sizes, the one compiled call's and the bands', take the same buffers, and a
    call made before a larger size reallocated them (its prepared addresses then stale)
    gives the bits it gave before, on new values too."""
    def node(batch, channels, outputs, side):
        X = _rand(batch, channels, side, side)
        W, B = _rand(outputs, channels, 1, 1), _rand(outputs)
        return X, W, B, np.empty((batch, outputs, side, side), np.float32)

    limits = (1.0, 0.0, 6.0)  # a Clip to 0..6
    small, large = node(1, 64, 64, 3), node(8, 576, 96, 6)
    banded = pointwise_rows._banded_action(*large[:3], None, {}, limits)
    compiled = pointwise_rows._compiled_action(*small[:3], None, {}, limits)
    assert banded is not None and compiled is not None

    def reference(X, W, B, _):
        return np.clip(conv_cpu(np, X, W, B, **ATTRIBUTES), 0.0, 6.0)
    for X, W, B, out in (small, large):
        (compiled if X is small[0] else banded)(X, W, B, None, out)
        np.testing.assert_allclose(out, reference(X, W, B, out), rtol=1e-4, atol=1e-4)
    before = jit_cpu.scratch_generation()
    jit_cpu.scratch_array("pixel_rows", np.float32, (4 * large[0].size,))  # a larger size's
    assert jit_cpu.scratch_generation() != before
    for X, W, B, out in (large, small):
        X *= -1.5  # new values in the same arrays: the replays' and bound calls' case
        (compiled if X is small[0] else banded)(X, W, B, None, out)
        np.testing.assert_allclose(out, reference(X, W, B, out), rtol=1e-4, atol=1e-4)
        # the call's pixel rows went where this thread's scratch now lies
        rows = jit_cpu.scratch_array("pixel_rows", np.float32, (X.size,))
        np.testing.assert_array_equal(
            rows.reshape(-1, X.shape[1]), X.transpose(0, 2, 3, 1).reshape(-1, X.shape[1]))


@pytest.mark.skipif(not TILE or not jit_cpu.NATIVE_POOL_PLATFORM,
                    reason="the bands run on the panel tile with the native pool")
@pytest.mark.parametrize("batch, channels, outputs, side", [
    (1, 576, 96, 6),  # 36 pixel rows: the panels' parts balance better
    (8, 1152, None, 3),  # a weight past what a core's L2 holds for every band to read
    (8, 16, 16, 6)])  # a product not split at all
def test_few_rows_and_large_weights_keep_the_split_by_panels(batch, channels, outputs, side):
    if outputs is None:  # just past the bands' largest weight on this machine
        outputs = pointwise_rows.band_weight_bytes() // (channels * 4) + 16
    X = _rand(batch, channels, side, side)
    W, B = _rand(outputs, channels, 1, 1), _rand(outputs)
    limits = (1.0, 0.0, np.inf)
    assert pointwise_rows._banded_action(X, W, B, None, {}, limits) is None


@pytest.mark.skipif(not TILE or jit_cpu.native_pool() is None,
                    reason="the bands need the panel tile and the native pool")
def test_the_bands_take_weights_up_to_three_quarters_of_a_core_s_l2(monkeypatch):
    """EfficientNet-B0's 1152 -> 192 (0.9 MB) goes in bands where a core's L2 holds it with
    room for the bands' rows (2 MB), and split by panels where it nearly fills it (1 MB);
    without a size from the system the old 256 KB stands as the floor."""
    threads = jit_cpu.native_pool().workers + 1
    rows = pointwise_rows.BAND_STRIPS * threads * jit_cpu.panel_kernels().STRIP_ROWS
    X = _rand(-(-rows // 9), 1152, 3, 3)  # pixel rows enough for a band a thread
    W, B = _rand(192, 1152, 1, 1), _rand(192)
    limits = (1.0, 0.0, np.inf)
    for l2, banded in ((2 << 20, True), (1 << 20, False), (0, False)):
        monkeypatch.setattr(pointwise_rows, "l2_bytes", lambda l2=l2: l2)
        taken = pointwise_rows._banded_action(X, W, B, None, {}, limits)
        assert (taken is not None) == banded, l2
    assert pointwise_rows.band_weight_bytes() == pointwise_rows.BAND_WEIGHT_BYTES


@pytest.mark.skipif(not TILE or not jit_cpu.NATIVE_POOL_PLATFORM,
                    reason="the bands and the one compiled call run on the panel tile")
@pytest.mark.parametrize("form", ["_banded_action", "_compiled_action"])
def test_a_residual_that_is_the_output_itself_is_added_before_it_is_overwritten(form):
    """The planner may give a node's output the residual's own memory: each output is read
    and written in turn, not moved into place before its residual is read."""
    X = _rand(6, 240, 6, 6)
    W, B = _rand(40, 240, 1, 1), _rand(40)
    Z = _rand(6, 40, 6, 6)
    limits = (1.0, 0.0, np.inf)
    action = getattr(pointwise_rows, form)(X, W, B, Z, {}, limits)
    assert action is not None
    expected = np.maximum(np.einsum("mc,ncp->nmp", W[:, :, 0, 0].astype(np.float64),
                                    X.reshape(6, 240, 36).astype(np.float64))
                          + B[None, :, None] + Z.reshape(6, 40, 36), 0)
    in_place = Z.copy()
    action(X, W, B, in_place, in_place)
    np.testing.assert_allclose(in_place.reshape(6, 40, 36), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not TILE or jit_cpu.native_pool() is None,
                    reason="the bands need the panel tile and the native pool")
def test_a_node_the_bands_may_take_at_another_size_compiles_their_entry(monkeypatch):
    """A 1x1 convolution whose weight the bands take warms their part entry at its full
    route, whatever its plane (here one the direct form takes), where compiling is allowed;
    under a loading run (compiling forbidden) it asks nothing, and a weight too large for
    the bands warms nothing."""
    from mixrt.ops.compiled import jit_tier  # noqa: PLC0415
    module = jit_cpu.load(pointwise_rows.BAND_PARTS)
    monkeypatch.setattr(pointwise_rows, "_BAND_ENTRIES_WARM", set())
    X = _rand(1, 96, 12, 12)  # 144 pixels: not this form's plane
    prepacked: dict = {}
    assert not pointwise_rows.suits(X, _rand(576, 96, 1, 1), 1, None, None, "NOTSET", None,
                                    prepacked)
    with jit_tier.loading_only() as misses:
        pointwise_rows.warm_bands(X, _rand(576, 96, 1, 1), 1, prepacked)
    assert misses == [] and pointwise_rows._BAND_ENTRIES_WARM == set()
    past = pointwise_rows.band_weight_bytes() // (96 * 4) + 16  # outputs past the bands'
    pointwise_rows.warm_bands(X, _rand(past, 96, 1, 1), 1, prepacked)
    assert pointwise_rows._BAND_ENTRIES_WARM == set()
    pointwise_rows.warm_bands(X, _rand(576, 96, 1, 1), 1, prepacked)
    assert pointwise_rows._BAND_ENTRIES_WARM == {"<f4"}
    assert "not compiled" not in repr(module.part_f)


@pytest.mark.skipif(not TILE or jit_cpu.native_pool() is None,
                    reason="the bands need the panel tile and the native pool")
def test_a_serving_run_only_loads_the_bands_entry(monkeypatch):
    """In a process that compiles in the background, a serving run's full route asks the
    cache for the bands' entry with compiling forbidden (compiled there, it would be ~1 s
    in a request), once: one in no cache is left to the child."""
    from mixrt.ops.compiled import jit_tier  # noqa: PLC0415
    from mixrt.ops.panels import native_parts  # noqa: PLC0415
    asked = []

    class NotCached:
        @property
        def address(self):
            asked.append(jit_tier.compile_misses() is not None)  # under loading_only?
            raise jit_tier.CompileForbidden("part_f is in no cache")

    monkeypatch.setattr(pointwise_rows, "_BAND_ENTRIES_WARM", set())
    monkeypatch.setattr(jit_tier, "background_compiles", lambda: True)
    monkeypatch.setattr(native_parts, "part_entry", lambda module, suffix: NotCached())
    X, W = _rand(1, 96, 12, 12), _rand(576, 96, 1, 1)
    pointwise_rows.warm_bands(X, W, 1, {})
    pointwise_rows.warm_bands(X, W, 1, {})
    assert asked == [True] and pointwise_rows._BAND_ENTRIES_WARM == {"<f4"}
