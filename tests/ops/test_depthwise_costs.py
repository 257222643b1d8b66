"""The size-free form a depthwise convolution takes where its flat form is in no cache (a
service's new image size) or the plane is too wide for it: the row form or the block form
of one-channel groups, by ops/conv/depthwise_costs.py's model of their work."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu, jit_tier
from mixrt.ops.conv import depthwise_common, depthwise_costs, depthwise_table, jit_depthwise
from mixrt.ops.conv import jit_grouped_blocks as grouped_blocks
from mixrt.ops.conv.conv import conv
from mixrt.ops.nn import fused

fused_conv = fused.fused_conv.kernels[-1].for_device("cpu")
RNG = np.random.default_rng(47)
needs_jit = pytest.mark.skipif(not jit_cpu.enabled(), reason="the compiled tier is off")


@pytest.fixture(autouse=True)
def _shipped_weights():
    """The model with its shipped weights, whatever this machine measured (the picks below
    are the ones those weights make; tests/ops/test_depthwise_calibration.py tests a
    machine's own)."""
    depthwise_costs.use(depthwise_table.SHIPPED)
    yield
    depthwise_costs.use(None)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("kernel, stride, out_dims, blocks", [
    ((5, 5), 1, (12, 20), True),     # MobileNetV3's late stages: narrow rows, many taps
    ((5, 5), 2, (6, 10), True),
    ((7, 7), 1, (20, 30), True),
    ((3, 3), 1, (9, 9), True),       # rows narrower than a vector are all scalar
    ((3, 3), 1, (112, 112), False),  # wide rows: the row form's four-vector loop
    ((3, 3), 2, (56, 56), False),
])
def test_the_model_picks_the_form_that_measured_faster(kernel, stride, out_dims, blocks):
    """Geometries where the two forms' times differed by 13% or more, one thread
    (2026-11-29: 5x5 over 12 x 20, rows 152 us, blocks 96; 3x3 over 112 x 112, 170 and
    226)."""
    picked = depthwise_costs.blocks_cheaper(kernel, (stride, stride), (1, 1), out_dims, 4)
    assert picked == blocks


@pytest.mark.parametrize("kernel, stride, out_dims, channels", [
    ((3, 3), 1, (4, 4), True),      # 144 channels, one thread: 4.1 us against the flat 5.7
    ((3, 3), 2, (6, 8), True),      # MobileNetV2's stride 2 at 96 x 128: 9.7 against 13.3
    ((3, 3), 2, (12, 16), True),    # 33.5 against 46.8
    ((5, 5), 2, (18, 18), True),    # 96.6 against 126.4
    ((5, 5), 1, (20, 24), False),   # a 5x5 kernel's wider planes: 124.7 against 97.3
    ((5, 5), 1, (28, 28), False),   # 183.5 against 160.5
])
def test_the_channels_model_picks_the_form_that_measured_faster(kernel, stride, out_dims,
                                                                channels):
    """Geometries where the channels form and the flat form differed by 10% or more, one
    thread, replayed calls, 144 channels (2026-11-30): the model's two costs, as
    ``small_plane_form`` weighs them, order the forms as they measured."""
    window = (kernel, (stride, stride), (1, 1), out_dims, 4)
    picked = depthwise_costs.channels_ns(*window) < depthwise_costs.flat_ns(*window)
    assert picked == channels


@pytest.mark.parametrize("out_dims, form", [
    ((10, 16), "free"),  # MobileNetV2's 3x3 at 4 x 160 x 256: rows 128 ns a plane, flat 167
    ((20, 32), "free"),  # rows 433, flat 628
    ((10, 12), "flat"),  # rows past whole vectors one output at a time: 356, flat 201
    ((14, 14), "flat"),
])
def test_a_narrow_plane_takes_the_rows_where_they_are_whole_vectors(monkeypatch, out_dims,
                                                                   form):
    """Among the narrow planes' forms (the channels form left out), the rows where each
    row is whole 16-float vectors, the flat form where its rows would end in scalars (one
    thread, 2026-12-01, Xeon with AVX-512)."""
    monkeypatch.setattr(depthwise_costs, "_lanes", lambda itemsize: 64 // itemsize)
    pick = depthwise_costs.small_plane_form.__wrapped__
    assert pick((3, 3), (1, 1), (1, 1), out_dims, 4, False) == form


def test_the_channels_form_is_picked_only_below_both_others():
    """The channels form where its model is below the flat form's and the size-free
    forms' (MobileNetV3's 5x5 over 7 x 7, where it measured fastest), never where the node
    cannot take it."""
    window = ((5, 5), (1, 1), (1, 1))
    costs = [depthwise_costs.channels_ns(*window, (7, 7), 4),
             depthwise_costs.flat_ns(*window, (7, 7), 4),
             depthwise_costs.row_ns(*window, (7, 7), 4),
             depthwise_costs.block_ns(*window, (7, 7), 4)]
    assert costs[0] < min(costs[1:])
    assert depthwise_costs.small_plane_form(*window, (7, 7), 4, True) == "channels"
    assert depthwise_costs.small_plane_form(*window, (7, 7), 4, False) != "channels"


def test_the_model_counts_the_rows_remainder_and_the_blocks_phases():
    """A row one output past four vectors costs a scalar a tap more than one of four
    vectors; the block form copies the whole padded plane into its phases."""
    lanes = depthwise_costs._lanes(4)
    row = [depthwise_costs.row_ns((3, 3), (1, 1), (1, 1), (10, width), 4)
           for width in (4 * lanes, 4 * lanes + 1)]
    _, _, scalar, row_copy = depthwise_table.SHIPPED["rows"]["fits"]
    copy = row_copy * 12  # the padded plane's one more column
    assert row[1] - row[0] == pytest.approx(10 * 9 * scalar + copy)
    stride_two = depthwise_costs.block_ns((3, 3), (2, 2), (1, 1), (10, lanes), 4)
    stride_one = depthwise_costs.block_ns((3, 3), (1, 1), (1, 1), (10, lanes), 4)
    assert stride_two > stride_one  # fewer vectors, but a plane ~3x larger to copy


def test_a_kernel_whose_weights_spill_costs_more_a_tap_on_the_rows():
    """The row form's weights for 5x5 kernels and up (which spill the registers) are dearer a
    tap than a 3x3 kernel's, on the same row."""
    copy = depthwise_table.SHIPPED["rows"]["fits"][3]  # a padded cell, either kernel
    three = depthwise_costs.row_ns((3, 3), (1, 1), (1, 1), (1, 100), 4) - copy * 3 * 102
    five = depthwise_costs.row_ns((5, 5), (1, 1), (1, 1), (1, 100), 4) - copy * 5 * 104
    assert five / 25 > three / 9


def _fresh(tmp_path, monkeypatch) -> None:
    """A cache of this test's own, nothing warmed or loaded before."""
    from mixrt.ops.compiled import generated  # noqa: PLC0415
    monkeypatch.setenv("MIXRT_CACHE_DIR", str(tmp_path))
    depthwise_common.WARM.clear()
    depthwise_common.LOADED_AHEAD.clear()
    monkeypatch.setattr(generated, "_marked", set())
    monkeypatch.setattr(jit_depthwise, "_FLAT_LOADED", set())
    monkeypatch.setattr(jit_depthwise, "_PARTS_WARM", set())
    monkeypatch.setattr(jit_depthwise, "small_plane_form", lambda *args: "flat")  # no channels
    monkeypatch.setattr(jit_depthwise, "CHANNELS_FALLBACK_PIXELS", -1)
    for cached in (jit_depthwise._compiled, jit_depthwise._flat_text,
                   jit_depthwise._flat_module, grouped_blocks.module):
        cached.cache_clear()


def _forms_taken(monkeypatch) -> list:
    """The module prefixes of the forms ``_planes`` runs from now on."""
    taken = []
    real = jit_depthwise._planes

    def planes(module, *rest):
        taken.append(module.__name__.rsplit("_", 1)[0])
        return real(module, *rest)
    monkeypatch.setattr(jit_depthwise, "_planes", planes)
    return taken


def _rows_only(monkeypatch, call):
    """``call()`` with the model preferring the rows everywhere (their bits: the reference
    the block form's are compared with, as the flat form's are elsewhere)."""
    with monkeypatch.context() as patched:
        patched.setattr(jit_depthwise, "blocks_cheaper", lambda *args: False)
        return call()


@needs_jit
def test_a_new_size_takes_the_block_form_warmed_with_the_node_and_the_rows_bits(
        tmp_path, monkeypatch):
    """A 5x5 kernel's node warms its block form with its row form where compiling is
    allowed; a size whose flat form is in no cache takes the blocks in a run that may not
    compile (the rows of a 12 x 20 output ran ~1.6x their time), with no miss but the flat
    form's optional one and the rows' bits. A plane wider than the flat form takes them
    too. (Its first size is too wide for the flat form: nothing compiled per size.)"""
    _fresh(tmp_path, monkeypatch)
    W, B = _rand(24, 1, 5, 5), _rand(24)
    attributes = dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1])

    def depthwise(X):
        return fused_conv(np, X, W, B, group=24, activation="HardSwish", **attributes)

    taken = _forms_taken(monkeypatch)
    depthwise(_rand(1, 24, 10, 40))  # compiling allowed: the rows and the blocks
    assert taken == ["mixrt_grouped_blocks"]
    for height, width in ((12, 20), (9, 40)):
        X = _rand(1, 24, height, width)
        taken.clear()
        with jit_tier.loading_only() as misses:
            got = depthwise(X)
        assert taken == ["mixrt_grouped_blocks"]
        assert all(jit_tier.is_optional(miss) for miss in misses)  # the flat form's, if any
        with jit_tier.loading_only():
            rows = _rows_only(monkeypatch, lambda: depthwise(X))
        np.testing.assert_array_equal(got, rows)
        activated = fused.activate(np, conv(np, X, W, B, group=24, **attributes), "HardSwish",
                                   None)
        np.testing.assert_allclose(got, activated, rtol=1e-5, atol=1e-5)


@needs_jit
def test_blocks_never_warmed_leave_the_rows_and_an_optional_miss(tmp_path, monkeypatch):
    """A node whose blocks no run compiled yet (a cache older than them, or another
    process's) runs the rows at a size that would take the blocks, with their bits, and
    notes an optional miss for the compiler."""
    _fresh(tmp_path, monkeypatch)
    W, B = _rand(16, 1, 5, 5), _rand(16)
    attributes = dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[2, 2])
    X = _rand(2, 16, 23, 19)
    real_blocks = jit_depthwise._blocks_form
    monkeypatch.setattr(jit_depthwise, "_blocks_form", lambda *args: None)  # none warmed
    fused_conv(np, _rand(1, 16, 9, 80), W, B, group=16, **attributes)  # the rows compiled
    monkeypatch.setattr(jit_depthwise, "_blocks_form", real_blocks)
    taken = _forms_taken(monkeypatch)
    with jit_tier.loading_only() as misses:
        got = fused_conv(np, X, W, B, group=16, **attributes)
    assert taken == ["mixrt_grouped_blocks", "mixrt_depthwise"]  # tried, then the rows
    assert misses and all(jit_tier.is_optional(miss) for miss in misses)
    with jit_tier.loading_only():
        rows = _rows_only(monkeypatch, lambda: fused_conv(np, X, W, B, group=16, **attributes))
    np.testing.assert_array_equal(got, rows)
    np.testing.assert_allclose(got, conv(np, X, W, B, group=16, **attributes), rtol=1e-5,
                               atol=1e-5)


@needs_jit
def test_a_loading_run_loads_the_size_free_forms_ahead_once(tmp_path, monkeypatch):
    """A process started over a warm cache runs a signature's first run as a loading run
    and its later runs bound: no run met the size-free forms' warmers, and a new size's
    request loaded a form's entry there (4-7 ms). A loading run loads them ahead, as a
    run that may compile warms them, and asks once a process."""
    _fresh(tmp_path, monkeypatch)
    W, B = _rand(24, 1, 5, 5), _rand(24)
    attributes = dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1])

    def depthwise(X):
        return fused_conv(np, X, W, B, group=24, activation="HardSwish", **attributes)

    depthwise(_rand(1, 24, 10, 40))  # compiling allowed: the rows, blocks and channels
    warmed = set(depthwise_common.WARM)
    assert len(warmed) == 3
    depthwise_common.WARM.clear()  # as a process that loaded none of them
    asked = []
    real = jit_depthwise._warm_rows
    monkeypatch.setattr(jit_depthwise, "_warm_rows",
                        lambda *arguments: (asked.append(arguments[0]), real(*arguments)))
    with jit_tier.loading_only() as misses:
        depthwise(_rand(1, 24, 12, 20))
    assert depthwise_common.WARM == warmed and len(asked) == 2
    assert all(jit_tier.is_optional(miss) for miss in misses)  # the flat form's
    asked.clear()
    with jit_tier.loading_only() as misses:
        depthwise(_rand(1, 24, 9, 33))
    assert asked == [] and all(jit_tier.is_optional(miss) for miss in misses)


@needs_jit
def test_a_form_in_no_cache_is_loaded_ahead_without_a_miss(tmp_path, monkeypatch):
    """A size-free form no run compiled (the blocks, here) is not a miss of the loading
    run that tries to load it ahead (a miss sends a run's signature to be compiled, a
    form's own not even to an idle child): the optional misses left are the size's flat
    form's and its own try of the blocks, which falls back to the rows."""
    _fresh(tmp_path, monkeypatch)
    W, B = _rand(16, 1, 5, 5), _rand(16)
    attributes = dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[2, 2])
    real_blocks = jit_depthwise._blocks_form
    monkeypatch.setattr(jit_depthwise, "_blocks_form", lambda *args: None)  # none warmed
    fused_conv(np, _rand(1, 16, 9, 80), W, B, group=16, **attributes)  # the rows compiled
    monkeypatch.setattr(jit_depthwise, "_blocks_form", real_blocks)
    depthwise_common.WARM.clear()
    with jit_tier.loading_only() as misses:
        fused_conv(np, _rand(2, 16, 23, 19), W, B, group=16, **attributes)
    assert all(jit_tier.is_optional(miss) for miss in misses)
    assert len([miss for miss in misses if jit_depthwise.FLAT_PREFIX not in miss]) == 1
    assert any(key[0].__name__.startswith("mixrt_grouped_blocks")
               for key in depthwise_common.LOADED_AHEAD if hasattr(key[0], "__name__"))


@needs_jit
def test_a_narrow_plane_the_model_gives_the_rows_compiles_no_flat_form(tmp_path, monkeypatch):
    """Where the model picks the size-free forms for a plane the flat form could take, the
    rows run it at its first size and no flat form is generated for the size, with the
    flat form's bits."""
    _fresh(tmp_path, monkeypatch)
    # the model itself, uncached: its picks under these lanes are not kept for other tests
    monkeypatch.setattr(jit_depthwise, "small_plane_form",
                        depthwise_costs.small_plane_form.__wrapped__)
    monkeypatch.setattr(jit_depthwise, "blocks_cheaper", lambda *args: False)
    monkeypatch.setattr(depthwise_costs, "_lanes", lambda itemsize: 64 // itemsize)
    W, B = _rand(16, 1, 3, 3), _rand(16)
    attributes = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=16)
    X = _rand(2, 16, 10, 16)
    taken = _forms_taken(monkeypatch)
    got = fused_conv(np, X, W, B, activation="Relu", **attributes)
    assert taken == ["mixrt_depthwise"]
    assert not list((tmp_path / "jit").glob(f"{jit_depthwise.FLAT_PREFIX}_*.py"))
    monkeypatch.setattr(jit_depthwise, "small_plane_form", lambda *args: "flat")
    taken.clear()
    flat = fused_conv(np, X, W, B, activation="Relu", **attributes)
    assert taken == [jit_depthwise.FLAT_PREFIX]
    np.testing.assert_array_equal(got, flat)


@needs_jit
def test_a_wide_three_by_three_plane_keeps_the_rows_and_writes_no_blocks(tmp_path,
                                                                        monkeypatch):
    """Where the model prefers the rows and the kernel is 3x3, the block form is neither
    taken nor written."""
    _fresh(tmp_path, monkeypatch)
    W, B = _rand(8, 1, 3, 3), _rand(8)
    taken = _forms_taken(monkeypatch)
    X = _rand(1, 8, 70, 90)
    got = fused_conv(np, X, W, B, group=8, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    assert taken == ["mixrt_depthwise"]
    assert not list((tmp_path / "jit").glob(f"{grouped_blocks.PREFIX}_*.py"))
    np.testing.assert_allclose(got, conv(np, X, W, B, group=8, kernel_shape=[3, 3],
                                         pads=[1, 1, 1, 1]), rtol=1e-5, atol=1e-5)


@needs_jit
def test_a_serving_run_compiles_no_block_form(tmp_path, monkeypatch):
    """Where sessions compile in the background, a run that may compile is a serving run:
    a node whose block form is in no cache (warmed before any of its sizes picked it, or a
    cache older than the form) takes its rows there, with their bits, and the block form is
    not compiled in the serving thread (~1 s a node); a run that compiles warms it."""
    _fresh(tmp_path, monkeypatch)
    W, B = _rand(12, 1, 5, 5), _rand(12)
    attributes = dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1])
    X = _rand(1, 12, 9, 40)  # too wide for the flat form: the rows or the blocks
    real_blocks = jit_depthwise._blocks_form
    monkeypatch.setattr(jit_depthwise, "_blocks_form", lambda *args: None)
    rows = fused_conv(np, X, W, B, group=12, **attributes)  # the rows, compiled here
    monkeypatch.setattr(jit_depthwise, "_blocks_form", real_blocks)
    blocks = grouped_blocks.module((5, 5), (1, 1), (1, 1), "", 1)
    taken = _forms_taken(monkeypatch)
    monkeypatch.setenv("MIXRT_COMPILE", "background")
    served = fused_conv(np, X, W, B, group=12, **attributes)
    assert taken == ["mixrt_depthwise"] and blocks.run.signatures == []
    np.testing.assert_array_equal(served, rows)
    monkeypatch.setenv("MIXRT_COMPILE", "foreground")  # the compile child's run
    taken.clear()
    np.testing.assert_array_equal(fused_conv(np, X, W, B, group=12, **attributes), rows)
    assert taken == ["mixrt_grouped_blocks"] and blocks.run.signatures
