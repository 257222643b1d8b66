"""Depthwise convolutions over small planes with the channels side by side (the channels
form of ops/conv/jit_depthwise.py): the same bits as its flat form, against the generic
convolution, split and replayed."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.conv import depthwise_common, jit_depthwise, jit_depthwise_channels
from mixrt.ops.conv.conv import conv
from mixrt.ops.nn import fused
from mixrt.ops.nn.fused import activate

fused_conv = fused.fused_conv.kernels[-1].for_device("cpu")
RNG = np.random.default_rng(31)
needs_jit = pytest.mark.skipif(not jit_cpu.enabled(), reason="the compiled tier is off")


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _flat_form(monkeypatch, call):
    """``call()`` with this form turned off (the flat or row form takes the convolution)."""
    with monkeypatch.context() as patched:
        patched.setattr(jit_depthwise, "small_plane_form", lambda *args: "flat")
        return call()


GEOMETRIES = [  # (batch, channels, side, kernel, stride, dilation)
    (1, 1152, 3, 5, 1, 1),  # EfficientNet-B0's last stage at 96 x 96
    (2, 70, 6, 3, 2, 1),    # a last block of 6 channels, two images
    (1, 130, 5, 3, 1, 2),   # dilated: taps reach over the padding on both sides
    (3, 64, 4, 7, 1, 1),    # a kernel wider than the plane
    (1, 24, 6, 2, 2, 1),    # an even kernel, asymmetric padding (below)
]
ACTIVATIONS = [("", None), ("Relu", None), ("HardSwish", None), ("Clip", [-0.5, 0.75])]
# Each case compiles a flat form of its own (one per geometry, activation and dtype, ~11 s on
# a 2-core machine): every geometry with the activation that has parameters, every activation
# on one geometry, in float32; float64 on two geometries (the dtype decides only the loads'
# and stores' types, the geometry the loops' bounds and padding, the activation the store).
CASES = [geometry + (np.float32, "Clip", [-0.5, 0.75]) for geometry in GEOMETRIES] \
    + [geometry + (np.float64, "Clip", [-0.5, 0.75]) for geometry in GEOMETRIES[:2]] \
    + [GEOMETRIES[1] + (np.float32,) + activation for activation in ACTIVATIONS[:3]] \
    + [(1, 64, 48, 3, 2, 1, np.float32, "Relu", None)]  # three bands of rows (BAND_BYTES)


@needs_jit
@pytest.mark.parametrize("batch, channels, side, kernel, stride, dilation, dtype, activation, "
                         "params", CASES)
def test_same_bits_as_the_flat_form_and_the_reference(monkeypatch, batch, channels, side,
                                                      kernel, stride, dilation, dtype,
                                                      activation, params):
    X = _rand(batch, channels, side, side, dtype=dtype)
    W, B = _rand(channels, 1, kernel, kernel, dtype=dtype), _rand(channels, dtype=dtype)
    reach = (kernel - 1) * dilation
    pads = [reach // 2, reach // 2, reach - reach // 2, reach - reach // 2]
    attributes = dict(auto_pad="NOTSET", dilations=[dilation] * 2, group=channels,
                      kernel_shape=[kernel] * 2, pads=pads, strides=[stride] * 2)
    expected = activate(np, conv(np, X, W, B, **attributes), activation, params)
    # the form's bits are tested here, not the model's pick (which float64 may not make)
    monkeypatch.setattr(jit_depthwise, "small_plane_form", lambda *args: "channels")

    def run(prepacked):
        out = np.full(expected.shape, np.nan, dtype)
        got = fused_conv(np, X, W, B, activation=activation, activation_params=params,
                         out=out, _prepacked=prepacked, **attributes)
        assert got is out
        return out
    prepacked: dict = {}
    here = run(prepacked)
    assert any(key[0] == "depthwise_channels_last" for key in prepacked if type(key) is tuple)
    tolerance = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(here, expected, rtol=tolerance, atol=tolerance * kernel ** 2)
    np.testing.assert_array_equal(here, _flat_form(monkeypatch, lambda: run({})))


@needs_jit
def test_the_call_replays_on_new_values_and_split_over_the_workers():
    X, W, B = _rand(8, 1152, 3, 3), _rand(1152, 1, 5, 5), _rand(1152)
    attributes = dict(auto_pad="NOTSET", dilations=None, group=1152, kernel_shape=[5, 5],
                      pads=[2, 2, 2, 2], strides=None)
    prepacked: dict = {}
    out = np.empty((8, 1152, 3, 3), np.float32)
    for scale in (1.0, -2.0):  # the second call is the replay, on new values in X
        X *= np.float32(scale)
        fused_conv(np, X, W, B, activation="Relu", out=out, _prepacked=prepacked,
                   **attributes)
        assert replay.KEY in prepacked
        expected = activate(np, conv(np, X, W, B, **attributes), "Relu", None)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


@needs_jit
def test_a_nan_weight_over_the_padding_gives_nan_as_the_padded_reference_does():
    X, W = _rand(1, 16, 3, 3), _rand(16, 1, 3, 3)
    W[5, 0, 0, 0] = np.inf  # top-left tap: over the padding for the first row and column
    attributes = dict(auto_pad="NOTSET", dilations=None, group=16, kernel_shape=[3, 3],
                      pads=[1, 1, 1, 1], strides=None)
    out = np.empty((1, 16, 3, 3), np.float32)
    fused_conv(np, X, W, None, out=out, _prepacked={}, **attributes)
    with np.errstate(invalid="ignore"):
        expected = conv(np, X, W, None, **attributes)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    assert np.isnan(out[0, 5, 0, 0])


def test_what_it_leaves_to_the_other_forms():
    X, W = _rand(1, 32, 8, 8), _rand(32, 1, 3, 3)
    out = np.empty((1, 32, 8, 8), np.float32)
    suits = jit_depthwise_channels.channels_suit
    one = (1, 1)
    assert suits(X, W, out, (3, 3), one, one, (8, 8))  # 64 outputs of a 3x3: modelled cheaper
    wide = _rand(1, 32, 24, 32)  # a 5x5 kernel over 24 x 32 outputs: the flat form's
    assert not suits(wide, _rand(32, 1, 5, 5), np.empty((1, 32, 24, 32), np.float32), (5, 5),
                     one, one, (24, 32))
    assert not suits(X, _rand(64, 1, 3, 3), np.empty((1, 64, 4, 4), np.float32), (3, 3),
                     one, one, (4, 4))  # two outputs per channel
    assert not suits(X.astype(np.float16), W.astype(np.float16),
                     np.empty((1, 32, 4, 4), np.float16), (3, 3), one, one, (4, 4))
    assert not suits(X, _rand(32, 1, 9, 9), np.empty((1, 32, 4, 4), np.float32), (9, 9),
                     one, one, (4, 4))  # past depthwise_common.MAX_TAPS
    assert depthwise_common.MAX_TAPS < 9


@needs_jit
@pytest.mark.parametrize("stride", [1, 2])
def test_a_flat_form_in_no_cache_is_answered_by_the_row_form_with_its_bits(monkeypatch, stride):
    """A new image size's flat form (generated per plane geometry) may not compile in a
    session's first run of that size: the row form, one per kernel, stands in with the
    flat form's very bits, and the miss is left for the background compiler."""
    from mixrt.ops.compiled import jit_tier  # noqa: PLC0415
    X, W, B = _rand(2, 40, 13, 11), _rand(40, 1, 3, 3), _rand(40)
    attributes = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride])
    flat = _flat_form(monkeypatch, lambda: fused_conv(np, X, W, B, group=40, **attributes))

    def in_no_cache(*_):
        raise jit_tier.CompileForbidden("the flat form of this geometry is in no cache")

    with monkeypatch.context() as patched:
        patched.setattr(jit_depthwise, "_flat_planes", in_no_cache)
        rows = _flat_form(patched, lambda: fused_conv(np, X, W, B, group=40, **attributes))
    np.testing.assert_array_equal(rows, flat)
    reference = conv(np, X, W, B, group=40, **attributes)
    np.testing.assert_allclose(rows, reference, rtol=1e-5, atol=1e-5)


def _fresh_compile_caches(tmp_path, monkeypatch) -> None:
    """A cache of this test's own, and nothing this process compiled or marked before:
    whatever other tests compiled is warmed and marked again here."""
    from mixrt.ops.compiled import generated  # noqa: PLC0415
    monkeypatch.setenv("MIXRT_CACHE_DIR", str(tmp_path))
    depthwise_common.WARM.clear()
    monkeypatch.setattr(generated, "_marked", set())
    monkeypatch.setattr(jit_depthwise, "_FLAT_LOADED", set())
    monkeypatch.setattr(jit_depthwise, "_PARTS_WARM", set())
    for cached in (jit_depthwise._compiled, jit_depthwise._flat_text,
                   jit_depthwise._flat_module):
        cached.cache_clear()


@needs_jit
def test_a_new_size_in_no_cache_takes_the_row_form_compiled_with_the_node(tmp_path,
                                                                          monkeypatch):
    """Where compiling is allowed (the background compiler's run), a node that takes its
    flat form compiles its row and channels forms too, so that a run that may not compile
    serves every other size from them: a size whose flat form was never compiled is not
    even tried (its module is not written), its miss noted as optional, and its sum has
    the same bits."""
    from mixrt.ops.compiled import jit_tier  # noqa: PLC0415
    _fresh_compile_caches(tmp_path, monkeypatch)
    W, B = _rand(8, 1, 3, 3), _rand(8)
    # a geometry no other test compiles: dilation 2 across, 1 down
    attributes = dict(kernel_shape=[3, 3], pads=[1, 2, 1, 2], dilations=[1, 2])

    def depthwise(side, batch=1, X=None):
        X = _rand(batch, 8, side, side) if X is None else X
        return _flat_form(monkeypatch, lambda: fused_conv(np, X, W, B, group=8,
                                                          **attributes)), X

    depthwise(12)  # the flat form, compiled here; and the row form with it
    for side, batch in ((40, 1), (40, 3)):  # wider than the flat form: the rows, one or all threads
        with jit_tier.loading_only() as misses:
            got, X = depthwise(side, batch)
        assert misses == []
        np.testing.assert_allclose(got, conv(np, X, W, B, group=8, **attributes),
                                   rtol=1e-5, atol=1e-5)
    with jit_tier.loading_only() as misses:  # a new flat geometry: the rows stand in
        got, X = depthwise(14)
    assert misses and all(jit_tier.is_optional(miss) for miss in misses)
    flat, _ = depthwise(14, X=X)  # compiling allowed: the flat form itself
    np.testing.assert_array_equal(got, flat)

    def rows_refused(*_):
        raise AssertionError("a plane this small takes the channels form, not the rows")

    with monkeypatch.context() as patched, jit_tier.loading_only() as misses:
        patched.setattr(jit_depthwise, "_planes", rows_refused)
        got, X = depthwise(8)  # 8 x 8 outputs: the channels form, compiled with the node too
    assert misses and all(jit_tier.is_optional(miss) for miss in misses)
    np.testing.assert_array_equal(got, depthwise(8, X=X)[0])
    written = {path.name for path in (tmp_path / "jit").glob("mixrt_depthwise_flat_*.py")}
    modules = {name for name in written if "_part_" not in name}
    assert len(modules) == 3  # 12, 14 and 8, each written only once it could compile
    # each with its part entry's module where there are native workers
    assert len(written) == (6 if jit_cpu.native_pool() is not None else 3)


def _counted_flat_sources(monkeypatch, attributes: dict):
    """``(made, depthwise, W, B)``: the geometries whose flat source ``_flat_text`` made,
    and ``depthwise(side, X=None) -> (out, X)``, an 8-channel depthwise FusedConv of
    ``attributes`` over a side x side image (X when given) through its flat form."""
    W, B = _rand(8, 1, 3, 3), _rand(8)
    made = []
    real_text = jit_depthwise._flat_text
    monkeypatch.setattr(jit_depthwise, "_flat_text",
                        lambda *geometry: made.append(geometry) or real_text(*geometry))

    def depthwise(side, X=None):
        X = _rand(1, 8, side, side) if X is None else X
        return _flat_form(monkeypatch, lambda: fused_conv(np, X, W, B, group=8,
                                                          **attributes)), X
    return made, depthwise, W, B


@needs_jit
def test_a_size_first_run_asks_its_flat_forms_geometry_before_making_its_source(
        tmp_path, monkeypatch):
    """A loading run of a new size asks whether the geometry's flat form was compiled by
    the geometry's own marker: a geometry never compiled is answered by the row form
    without its source being made; once compiled (marked under both names), a loading run
    of that size takes the flat form, with the bits it gives where compiling is allowed."""
    from mixrt.ops.compiled import jit_tier  # noqa: PLC0415
    _fresh_compile_caches(tmp_path, monkeypatch)
    attributes = dict(kernel_shape=[3, 3], pads=[2, 1, 2, 1], dilations=[2, 1])
    made, depthwise, W, B = _counted_flat_sources(monkeypatch, attributes)

    depthwise(13)  # compiling allowed: the flat form of 13, and the row form with it
    assert len(made) == 1
    markers = {path.name for path in (tmp_path / "jit").glob("mixrt_depthwise_flat_with_parts_*")}
    assert len(markers) == 1
    with jit_tier.loading_only() as misses:  # 17: never compiled, its source never made
        got, X = depthwise(17)
    assert len(made) == 1 and misses and all(jit_tier.is_optional(m) for m in misses)
    np.testing.assert_allclose(got, conv(np, X, W, B, group=8, **attributes),
                               rtol=1e-5, atol=1e-5)
    with jit_tier.loading_only() as misses:  # 13 again: the flat form, loaded
        again, X = depthwise(13)
    assert misses == [] and len(made) == 2
    np.testing.assert_array_equal(again, depthwise(13, X=X)[0])


@needs_jit
def test_a_first_run_leaves_a_flat_form_in_the_cache_to_the_sizes_next_run(
        tmp_path, monkeypatch):
    """A process over a warm cache (a flat form compiled and marked, not loaded here): a
    size's loading run takes the row form, with no miss and without making the source
    (loading it was ~6 ms a node at every new size's first request); the size's next run
    loads the flat form, with the same bits."""
    from mixrt.ops.compiled import jit_tier  # noqa: PLC0415
    _fresh_compile_caches(tmp_path, monkeypatch)
    attributes = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], dilations=[2, 2])
    made, depthwise = _counted_flat_sources(monkeypatch, attributes)[:2]

    depthwise(15)  # compiled and marked, as an earlier process would have left it
    assert len(made) == 1
    jit_depthwise._FLAT_LOADED.clear()  # this process: nothing loaded
    with jit_tier.loading_only() as misses:
        first, X = depthwise(15)
    assert misses == [] and len(made) == 1  # the rows: no source made, nothing missed
    again, _ = depthwise(15, X=X)  # the next run: the flat form, loaded
    assert len(made) == 2 and jit_depthwise._FLAT_LOADED
    np.testing.assert_array_equal(first, again)


@needs_jit
def test_a_serving_run_compiles_no_flat_form_and_loads_one_with_its_part_entry(
        tmp_path, monkeypatch):
    """Where sessions compile in the background, a run that may compile is a serving run
    on the compiled tier: a geometry never compiled takes the row form there, its flat
    source never made (compiled in the serving thread, ~1-2 s a node); one compiled
    elsewhere at a batch of one, which does not split, loads there at a batch that splits
    over the native workers, its part entry compiled with it (a MobileNetV3's image size
    coming back at another batch compiled six part entries in its request: 5.6 s)."""
    from mixrt.ops.compiled import generated  # noqa: PLC0415
    from mixrt.ops.panels import native_parts  # noqa: PLC0415
    _fresh_compile_caches(tmp_path, monkeypatch)
    attributes = dict(kernel_shape=[3, 3], pads=[2, 2, 2, 2], dilations=[2, 2],
                      strides=[1, 1])
    made, depthwise, W, B = _counted_flat_sources(monkeypatch, attributes)

    def batch(images, side):
        return _rand(images, 8, side, side)

    monkeypatch.setenv("MIXRT_COMPILE", "background")
    X = batch(1, 11)
    served, _ = depthwise(11, X=X)
    assert made == [] and not list((tmp_path / "jit").glob("mixrt_depthwise_flat_*.py"))
    np.testing.assert_allclose(served, conv(np, X, W, B, group=8, **attributes),
                               rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("MIXRT_COMPILE", "foreground")  # the compile child: one image
    flat, _ = depthwise(11, X=X)
    np.testing.assert_array_equal(served, flat)
    assert len(made) == 1
    if jit_cpu.native_pool() is None:
        return  # no workers: no part entry to load
    # another process over that cache: nothing of it loaded here
    monkeypatch.setattr(jit_depthwise, "_FLAT_LOADED", set())
    monkeypatch.setattr(jit_depthwise, "_PARTS_WARM", set())
    for cached in (jit_depthwise._flat_module, native_parts.part_entry,
                   generated.kernel_module):
        cached.cache_clear()
    monkeypatch.setenv("MIXRT_COMPILE", "background")
    images = -(-native_parts.SPLIT_ELEMENTS // (8 * 11 * 11)) + 1  # enough to split
    X = batch(images, 11)
    served, _ = depthwise(11, X=X)
    assert jit_depthwise._FLAT_LOADED  # the flat form, its part entry loaded, not compiled
    monkeypatch.setenv("MIXRT_COMPILE", "foreground")
    np.testing.assert_array_equal(served, depthwise(11, X=X)[0])
