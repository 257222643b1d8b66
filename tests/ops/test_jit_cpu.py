"""The numba-compiled depthwise convolutions (ops/conv/jit_depthwise.py,
ops/compiled/jit_cpu.py), 2-D pooling (ops/pool/jit_pool.py, ops/compiled/jit_cpu.py) and the
grouped 1x1 convolution equal the generic kernels over strides, dilations, asymmetric pads,
channel multipliers, ceil_mode and NaNs, are what the CPU fast paths really run, and step aside
under MIXRT_JIT=0."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.ops.compiled import jit_cpu, jit_tier, parallel
from mixrt.ops.pool import plane_pools
from mixrt.ops import REGISTRY
from mixrt.ops.nn import fused_cpu, row_kernels
from mixrt.ops.conv import conv_cpu, depthwise_common, jit_depthwise, phase_planes
from mixrt.ops.conv import jit_grouped_blocks as grouped_blocks
from mixrt.ops.pool import inplace_cpu, jit_pool
from mixrt.ops.conv.conv import conv
from mixrt.ops.pool.pool import average_pool, max_pool

RNG = np.random.default_rng(5)

pytestmark = pytest.mark.skipif(not jit_cpu.enabled(), reason="numba is not importable")

DEPTHWISE = [
    # (channels, multiplier, image, kernel, strides, dilations, pads)
    (8, 1, (12, 12), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (8, 1, (13, 11), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (5, 2, (10, 9), (3, 3), (1, 1), (2, 2), (2, 1, 0, 3)),
    (4, 3, (9, 14), (5, 5), (3, 2), (1, 1), (2, 2, 2, 2)),
    (6, 1, (7, 7), (1, 3), (1, 1), (1, 1), (0, 1, 0, 1)),
    (3, 1, (8, 8), (2, 2), (2, 1), (1, 2), (0, 0, 1, 1)),
    # stride 2 across (rows split into even and odd cells): no left pad, an odd width whose
    # last column no window reads, an odd left pad with a wide kernel
    (4, 1, (6, 10), (3, 3), (2, 2), (1, 1), (0, 0, 0, 0)),
    (4, 1, (7, 9), (3, 3), (2, 2), (1, 1), (0, 0, 1, 1)),
    (3, 2, (7, 9), (2, 4), (1, 2), (1, 1), (1, 3, 0, 2)),
    # rows of SPLIT_LOOPS_COLUMNS and more (each row's pairs in two loops), odd and even
    (3, 1, (5, 67), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (2, 1, (4, 70), (3, 3), (2, 2), (1, 1), (0, 0, 0, 0)),
]


def _recorded_calls(monkeypatch, module, name: str) -> list:
    """``module.name`` wrapped to append to the returned list on every call."""
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.fixture(params=["native", "threads"])
def split_path(request, monkeypatch):
    """A split kernel's parts on the native workers (where there are any), or on the Python
    threads of ``parallel_for``."""
    monkeypatch.setenv("MIXRT_NATIVE_POOL", "1" if request.param == "native" else "0")
    return request.param


def _recorded_splits(monkeypatch, module) -> list:
    """How many parts each split of ``module``'s kernel had, whether it went to the native
    workers (``run_parts``, or ``prepared`` where the module keeps the call) or to the Python
    threads (``parallel_for``)."""
    splits: list = []
    threads = module.parallel_for
    monkeypatch.setattr(module, "parallel_for",
                        lambda parts, fn: splits.append(len(parts)) or threads(parts, fn))
    name = "prepared" if hasattr(module, "prepared") else "run_parts"
    native = getattr(module, name)
    monkeypatch.setattr(module, name, lambda pool, kernels, arrays, scalars, parts, **keep:
                        splits.append(len(parts)) or native(pool, kernels, arrays, scalars,
                                                            parts, **keep))
    return splits


@pytest.fixture(params=["rows", "flat"])
def depthwise_form(request, monkeypatch):
    """The direct loop's row form (every output width above FLAT_MAX_WIDTH) or its flat
    form (every width under it)."""
    _take_depthwise_form(monkeypatch, request.param)
    return request.param


def _take_depthwise_form(monkeypatch, form: str) -> None:
    """Every output width above FLAT_MAX_WIDTH (the rows), or under it with the cost
    model's pick among the narrow planes' forms made the flat form."""
    monkeypatch.setattr(jit_depthwise, "FLAT_MAX_WIDTH", 0 if form == "rows" else 1 << 30)
    if form == "flat":
        monkeypatch.setattr(jit_depthwise, "small_plane_form", lambda *args: "flat")


def _count_compiled_depthwise(monkeypatch, direct: bool) -> list:
    """Route every depthwise convolution to the direct loop (ops/conv/jit_depthwise.py) or to the
    phase planes (ops/compiled/jit_cpu.py), and record the calls."""
    if not direct:
        monkeypatch.setattr(depthwise_common, "suits", lambda *a: False)
    module = jit_depthwise if direct else phase_planes
    return _recorded_calls(monkeypatch, module, "depthwise_conv")


def _in_both_dtypes(cases: list, doubles: tuple, name) -> list:
    """Every case in float32, those at ``doubles`` (positions) in float64 too: a kernel is
    generated and compiled per geometry and dtype (~1-3 s each from an empty cache), and the
    float64 source is the float32 one with other types and vector lanes, so float64 takes
    the geometries whose rows leave remainders at either lane count, not every one."""
    return [pytest.param(case, dtype, id=f"{name(case)}-{dtype.__name__}")
            for at, case in enumerate(cases)
            for dtype in ((np.float32, np.float64) if at in doubles else (np.float32,))]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "phase-planes"])
# two images in float32 only: the planes' count (images x channels) does not meet the dtype
@pytest.mark.parametrize("case, batch, dtype", [
    pytest.param(*param.values[:1], batch, *param.values[1:], id=f"{param.id}-b{batch}")
    for param in _in_both_dtypes(DEPTHWISE, (1, 2, 3, 8),
                                 lambda c: f"c{c[0]}x{c[1]}-k{c[3]}-s{c[4]}")
    for batch in ((1, 2) if param.values[1] == np.float32 else (1,))])
def test_depthwise_matches_generic_conv(case, batch, dtype, direct, depthwise_form,
                                        monkeypatch):
    calls = _count_compiled_depthwise(monkeypatch, direct)
    channels, multiplier, image, kernel, strides, dilations, pads = case
    X = RNG.standard_normal((batch, channels) + image).astype(dtype)
    W = RNG.standard_normal((channels * multiplier, 1) + kernel).astype(dtype)
    B = RNG.standard_normal(channels * multiplier).astype(dtype)
    attrs = dict(group=channels, kernel_shape=list(kernel), strides=list(strides),
                 dilations=list(dilations), pads=list(pads))
    for bias in (B, None):
        expected = conv(np, X, W, bias, **attrs)
        got = conv_cpu.conv_cpu(np, X, W, bias, **attrs)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2


def test_depthwise_special_values_propagate_as_in_the_reference(depthwise_form, monkeypatch):
    """NaN and inf in the image and the weights: a tap over the zero padding still
    multiplies its weight (inf * 0 is NaN in the zero-padded reference too)."""
    calls = _count_compiled_depthwise(monkeypatch, True)
    X = RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
    X[0, 0, 4, 4] = np.nan
    X[0, 1, 0, 0] = np.inf
    W = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)
    W[2, 0, 0, 0] = np.inf  # reaches the padding from the top-left outputs
    attrs = dict(group=4, pads=[1, 1, 1, 1])
    with np.errstate(invalid="ignore"):  # inf * 0 in the reference's matmul
        expected = conv(np, X, W, None, **attrs)
    got = conv_cpu.conv_cpu(np, X, W, None, **attrs)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=1e-5)
    assert np.isnan(got[0, 2, 0, 0]) and calls


def test_depthwise_split_over_threads_matches_generic(monkeypatch, split_path,
                                                      depthwise_form):
    calls = _count_compiled_depthwise(monkeypatch, True)
    splits = _recorded_splits(monkeypatch, jit_depthwise)
    X = RNG.standard_normal((2, 48, 40, 40)).astype(np.float32)
    W = RNG.standard_normal((96, 1, 3, 3)).astype(np.float32)
    attrs = dict(group=48, pads=[1, 1, 1, 1])
    got = conv_cpu.conv_cpu(np, X, W, None, **attrs)
    assert got.size >= jit_depthwise.SPLIT_ELEMENTS
    np.testing.assert_allclose(got, conv(np, X, W, None, **attrs), rtol=1e-5, atol=1e-5)
    assert calls and splits == [min(192, parallel.intra_op_threads())]


def test_depthwise_output_over_its_input_takes_the_copying_kernel(monkeypatch):
    """The direct loop reads the input while writing; an output that overlaps it goes to
    the phase-plane kernel, which copies the input first."""
    direct = _count_compiled_depthwise(monkeypatch, True)
    X = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    W = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)
    expected = conv(np, X, W, None, group=4, pads=[1, 1, 1, 1])
    buffer = X.copy()
    conv_cpu.conv_cpu(np, buffer, W, group=4, pads=[1, 1, 1, 1], out=buffer)
    np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-5)
    assert not direct


@pytest.mark.parametrize("case", DEPTHWISE, ids=lambda c: f"c{c[0]}x{c[1]}-k{c[3]}-s{c[4]}")
def test_depthwise_forms_give_the_same_bits(case, monkeypatch):
    """The row and flat forms add the same products in the same order."""
    channels, multiplier, image, kernel, strides, dilations, pads = case
    X = RNG.standard_normal((2, channels) + image).astype(np.float32)
    W = RNG.standard_normal((channels * multiplier, 1) + kernel).astype(np.float32)
    B = RNG.standard_normal(channels * multiplier).astype(np.float32)
    attrs = dict(group=channels, kernel_shape=list(kernel), strides=list(strides),
                 dilations=list(dilations), pads=list(pads))
    results = []
    for form in ("rows", "flat"):
        _take_depthwise_form(monkeypatch, form)
        results.append(conv_cpu.conv_cpu(np, X, W, B, **attrs))
    np.testing.assert_array_equal(results[0], results[1])


def test_depthwise_flat_source_reads_each_tap_at_its_phase():
    """Stride 2 by 1, dilation 1: the padded plane (5 + 2 rows, 4 + 2 columns, reaching
    as far as 2 * 2 + 3 - 1 = 6 rows) is two row phases of 4 x 6 cells; tap (1, 2) starts in
    the odd phase, two cells in."""
    plane = jit_depthwise.FlatPlane((3, 3), (2, 1), (1, 1), (5, 4, 1, 1, 3, 4))
    assert (plane.phase_rows, plane.phase_width, plane.phases) == (4, 6, 2)
    assert plane.length == 32 and plane.plane == 32 + 1 * 6 + 2
    assert plane.offset(1, 2) == plane.plane + 2 and plane.offset(2, 0) == 6
    text = jit_depthwise.flat_source(plane)
    assert f"w0_1_2 * ps[uint64(k + {plane.plane + 2})]" in text
    held = plane.phases * plane.plane  # a group's second plane starts past the first's phases
    assert f"w1_1_2 * ps[uint64(k + {held + plane.plane + 2})]" in \
        jit_depthwise.flat_source(plane, "", 2)
    with pytest.raises(ValueError):
        jit_depthwise.FlatPlane((3, 3), (1, 1), (1, 1), (5, "4; import os", 1, 1, 3, 4))


def test_depthwise_source_holds_only_literals():
    text = jit_depthwise.source((2, 3), (1, 3), (2, 1))
    assert "r1 = (i * 1 + 2) * wp" in text and "w1_2 * pad[uint64(r1 + k * 3 + 2)]" in text
    text = jit_depthwise.source((2, 3), (1, 2), (2, 1))  # stride 2: even cells, then odd
    assert "w1_1 * pad[uint64(r1 + k + 0 + half)]" in text \
        and "w1_2 * pad[uint64(r1 + k + 1)]" in text
    with pytest.raises(ValueError):
        jit_depthwise.source((3, 3), (1, "1; import os"), (1, 1))


def test_depthwise_conv_takes_the_compiled_loop_unless_turned_off(monkeypatch):
    calls = _count_compiled_depthwise(monkeypatch, True)
    X = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    W = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)
    first = conv_cpu.conv_cpu(np, X, W, group=4, pads=[1, 1, 1, 1])
    assert calls == [1]
    monkeypatch.setenv("MIXRT_JIT", "0")
    second = conv_cpu.conv_cpu(np, X, W, group=4, pads=[1, 1, 1, 1])
    assert calls == [1]
    np.testing.assert_allclose(first, second, rtol=1e-5, atol=1e-6)


NARROW_GROUPS = [
    # (groups, input channels per group, output channels per group, image, kernel, strides,
    # dilations, pads)
    (6, 8, 8, (12, 12), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # RegNet's stride-2 block
    (3, 8, 8, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (4, 2, 3, (9, 11), (3, 3), (1, 1), (2, 2), (2, 1, 0, 3)),
    (2, 3, 1, (10, 9), (5, 5), (3, 2), (1, 1), (2, 2, 2, 2)),
    (5, 4, 2, (6, 40), (1, 3), (1, 1), (1, 1), (0, 1, 0, 1)),  # wider than FLAT_MAX_WIDTH
    (3, 2, 2, (9, 13), (3, 3), (1, 3), (1, 1), (0, 2, 1, 1)),  # stride 3 across, left pad 2
    # rows of PHASE_LOOPS_COLUMNS and more: copied a phase at a time
    (2, 4, 2, (5, 66), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (2, 2, 1, (4, 71), (3, 3), (1, 3), (1, 1), (0, 2, 1, 1)),
]


def _narrow_group_case(case, dtype) -> tuple:
    """(X, W, B, the Conv attributes) of a NARROW_GROUPS case, two images."""
    groups, width, outputs, image, kernel, strides, dilations, pads = case
    X = RNG.standard_normal((2, groups * width) + image).astype(dtype)
    W = RNG.standard_normal((groups * outputs, width) + kernel).astype(dtype)
    B = RNG.standard_normal(groups * outputs).astype(dtype)
    return X, W, B, dict(group=groups, kernel_shape=list(kernel), strides=list(strides),
                         dilations=list(dilations), pads=list(pads))


NARROW_GROUP_DTYPES = _in_both_dtypes(NARROW_GROUPS, (0, 3),
                                     lambda c: f"g{c[0]}x{c[1]}-k{c[4]}-s{c[5]}")


@pytest.mark.parametrize("case, dtype", NARROW_GROUP_DTYPES)
def test_narrow_groups_take_the_block_form_and_match_generic_conv(case, dtype, monkeypatch):
    calls = _count_compiled_depthwise(monkeypatch, True)
    blocks = _recorded_calls(monkeypatch, grouped_blocks, "module")
    X, W, B, attrs = _narrow_group_case(case, dtype)
    for bias in (B, None):
        got = conv_cpu.conv_cpu(np, X, W, bias, **attrs)
        np.testing.assert_allclose(got, conv(np, X, W, bias, **attrs), rtol=1e-5, atol=1e-5)
    assert len(calls) == 2 and len(blocks) == 2


def _flat_form(X, W, B, attrs, activation=("", [])):
    """The flat form of a grouped convolution's geometry (``jit_depthwise.flat_source`` with
    the group's width, generated per image size: the form groups took before the block
    form), as the reference of the block form's bits."""
    kernel, strides, dilations, _, begin, _, (oh, ow) = conv_cpu.conv_geometry(
        X, W, "NOTSET", attrs["dilations"], attrs["group"], attrs["kernel_shape"],
        attrs["pads"], attrs["strides"])
    (n, channels, height, width), (m, group_width) = X.shape, W.shape[:2]
    image = (height, width, begin[0], begin[1], oh, ow)
    text, cells = jit_depthwise._flat_text(tuple(kernel), tuple(strides), tuple(dilations),
                                           image, activation[0], group_width)
    out = np.empty((n * m, oh, ow), X.dtype)
    constants = depthwise_common.activation_constants(*activation, X.dtype)
    jit_depthwise._flat_module(text).run(
        X.reshape(n * channels, height, width), W.reshape(m, -1), B, out, constants,
        m // (channels // group_width), m, begin[0], begin[1], 0, n * m,
        np.empty((1, cells), X.dtype))
    return out.reshape(n, m, oh, ow)


@pytest.mark.parametrize("case, dtype", NARROW_GROUP_DTYPES)
def test_narrow_groups_block_form_gives_the_flat_forms_bits(case, dtype):
    """The block form sums each output's taps over the group's planes in the flat form's
    order, product by product: the same bits, at every image size from one module."""
    X, W, B, attrs = _narrow_group_case(case, dtype)
    np.testing.assert_array_equal(conv_cpu.conv_cpu(np, X, W, B, **attrs),
                                  _flat_form(X, W, B, attrs))


@pytest.mark.parametrize("name, params", [("Relu", []), ("Clip", [-0.5, 0.75]),
                                          ("HardSwish", []), ("Swish", [])])
def test_narrow_groups_block_form_applies_fused_activation(name, params):
    """FusedConv's bias and activation stored by the grouped block form as by the flat one
    (stride 2, an output wider than a block's row)."""
    X = RNG.standard_normal((1, 16, 9, 40)).astype(np.float32)
    W = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32)
    B = RNG.standard_normal(16).astype(np.float32)
    attributes = dict(group=2, pads=[1, 1, 1, 1], strides=[2, 2], dilations=[1, 1],
                      kernel_shape=[3, 3], auto_pad="NOTSET")
    blocks = conv_cpu.depthwise_activated(X, W, B, attributes, (name, params), None, {})
    np.testing.assert_array_equal(blocks, _flat_form(X, W, B, attributes, (name, params)))
    if name == "Relu":
        expected = np.maximum(conv(np, X, W, B, group=2, pads=[1, 1, 1, 1], strides=[2, 2]), 0)
        np.testing.assert_allclose(blocks, expected, rtol=1e-5, atol=1e-5)


def test_one_block_module_serves_every_image_size(monkeypatch):
    """A service's new image size compiles nothing: the block form is one module per kernel,
    strides, dilations, activation and group width, its layout worked out at the call."""
    W = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32)
    attrs = dict(group=2, kernel_shape=[3, 3], strides=[1, 1], dilations=[1, 1],
                 pads=[1, 1, 1, 1])
    made, real = [], grouped_blocks.compiled
    monkeypatch.setattr(grouped_blocks, "compiled",
                        lambda text, prefix: made.append(text) or real(text, prefix=prefix))
    grouped_blocks.module.cache_clear()
    for size in [(7, 7), (13, 29), (40, 9), (7, 7)]:
        X = RNG.standard_normal((1, 16) + size).astype(np.float32)
        np.testing.assert_allclose(conv_cpu.conv_cpu(np, X, W, None, **attrs),
                                   conv(np, X, W, None, **attrs), rtol=1e-5, atol=1e-5)
    assert len(made) == 1
    text = grouped_blocks.source((3, 3), (2, 1), (1, 1), "Relu", 8)
    assert "offsets[71]" in text and "tap_block(ps, k, offsets, ws, channel * 72, 72" in text
    with pytest.raises(ValueError):
        grouped_blocks.source((3, 3), (1, "1; import os"), (1, 1), "", 8)
    with pytest.raises(ValueError):
        grouped_blocks.source((3, 3), (1, 1), (1, 1), "import os", 8)


def test_wide_groups_keep_the_generic_path(monkeypatch):
    calls = _count_compiled_depthwise(monkeypatch, True)
    X = RNG.standard_normal((1, 2 * (jit_depthwise.MAX_GROUP_WIDTH + 1), 6, 6))
    W = RNG.standard_normal((4, jit_depthwise.MAX_GROUP_WIDTH + 1, 3, 3))
    got = conv_cpu.conv_cpu(np, X, W, group=2, pads=[1, 1, 1, 1])
    np.testing.assert_allclose(got, conv(np, X, W, group=2, pads=[1, 1, 1, 1]), rtol=1e-6)
    assert not calls


DEPTHWISE_ACTIVATIONS = [("Relu", []), ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.75]),
                         ("HardSigmoid", [0.3, 0.4]), ("HardSwish", []), ("Swish", [])]


def _unfused(name, params, y):
    if name == "Swish":  # Sigmoid and Mul, as fuse_elementwise would have made them
        kernel = REGISTRY.find("mixrt", "FusedElementwise", 1).for_device("cpu")
        return kernel(np, y, ops=("Sigmoid", "Mul"), operands=(0, 0, 1), params=())
    names = {"LeakyRelu": ["alpha"], "Clip": [], "HardSigmoid": ["alpha", "beta"]}
    attributes = dict(zip(names.get(name, []), params))
    bounds = [np.float32(p) for p in params] if name == "Clip" else []
    return REGISTRY.find("", name, 22).fn(np, y, *bounds, **attributes)


# each (group width, form) pair is generated and compiled per activation (~3 s a case): each
# activation in two of the four pairs, each pair with three activations, rather than all 24
FUSED_DEPTHWISE_CASES = [(activation, width, form)
                         for k, activation in enumerate(DEPTHWISE_ACTIVATIONS)
                         for width, form in ((1, "rows"), (4, "flat"), (1, "flat"),
                                             (4, "rows"))[k % 2::2][:2]]


@pytest.mark.parametrize("activation, width, form", FUSED_DEPTHWISE_CASES,
                         ids=lambda value: value[0] if isinstance(value, tuple) else str(value))
def test_fused_depthwise_applies_its_activation_in_the_loop(activation, width, form,
                                                              monkeypatch):
    """FusedConv's bias and activation as the depthwise (or narrow grouped) loop stores
    each sum: the same bits as the Conv and the activation's own kernel, NaN included."""
    _take_depthwise_form(monkeypatch, form)
    taken = _recorded_calls(monkeypatch, fused_cpu, "depthwise_activated")
    X = RNG.standard_normal((2, 24, 9, 9)).astype(np.float32) * 4
    X[0, 1, 4, 4] = np.nan
    W = RNG.standard_normal((24, width, 3, 3)).astype(np.float32)
    B = RNG.standard_normal(24).astype(np.float32)
    attrs = dict(group=24 // width, pads=[1, 1, 1, 1], strides=[2, 1])
    name, params = activation
    want = _unfused(name, params, conv_cpu.conv_cpu(np, X, W, B, **attrs))
    out, prepacked = np.empty_like(want), {}
    for _ in range(2):  # the second call replays the first
        got = fused_cpu.fused_conv_cpu(np, X, W, B, activation=name, activation_params=params,
                                       out=out, _prepacked=prepacked, **attrs)
        np.testing.assert_array_equal(got, want)
    assert taken and np.isnan(want).any()


GROUPED = [
    # (channels, out channels, group, image, auto_pad)
    (8, 12, 4, (5, 6), "NOTSET"),
    (24, 112, 4, (7, 7), "VALID"),
    (6, 6, 3, (4,), "SAME_UPPER"),  # 1-D
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", GROUPED, ids=lambda c: f"c{c[0]}-m{c[1]}-g{c[2]}-{c[4]}")
def test_grouped_pointwise_is_one_batched_matmul(case, dtype):
    """ShuffleNet's grouped 1x1 convolutions, into a given output and a fresh one, with a
    bias and with the epilogue FusedConv passes."""
    channels, m, group, image, auto_pad = case
    X = RNG.standard_normal((2, channels) + image).astype(dtype)
    W = RNG.standard_normal((m, channels // group) + (1,) * len(image)).astype(dtype)
    B = RNG.standard_normal(m).astype(dtype)
    assert conv_cpu._grouped_pointwise(X, W, group, None, None, None, auto_pad, None)
    expected = conv(np, X, W, B, group=group, auto_pad=auto_pad)
    got = conv_cpu.conv_cpu(np, X, W, B, group=group, auto_pad=auto_pad)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    out = np.full_like(expected, np.nan)
    seen = []

    def epilogue(y, image, start, stop):
        seen.append((image, start, stop))
        np.maximum(y, 0, out=y)
    conv_cpu.conv_bands(X, W, B, group=group, auto_pad=auto_pad, out=out, epilogue=epilogue)
    np.testing.assert_allclose(out, np.maximum(expected, 0), rtol=1e-5, atol=1e-5)
    length = int(np.prod(image))
    assert seen == [(0, 0, length), (1, 0, length)]


def test_grouped_convolutions_that_need_windows_keep_the_generic_kernel():
    X = RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)
    W = RNG.standard_normal((8, 2, 1, 1)).astype(np.float32)
    assert not conv_cpu._grouped_pointwise(X, W, 4, None, [1, 1, 1, 1], None, "NOTSET", None)
    assert not conv_cpu._grouped_pointwise(X, W, 4, None, None, [2, 2], "NOTSET", None)
    assert not conv_cpu._grouped_pointwise(X, W[:, :, :1], 4, [3, 3], None, None, "NOTSET",
                                           None)
    for pads, strides in (([1, 1, 1, 1], None), (None, [2, 2])):
        np.testing.assert_allclose(
            conv_cpu.conv_cpu(np, X, W, group=4, pads=pads, strides=strides),
            conv(np, X, W, group=4, pads=pads, strides=strides), rtol=1e-5, atol=1e-5)


POOLS = [
    # (image, kernel, strides, dilations, pads, ceil_mode)
    ((111, 111), (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 0),
    ((12, 12), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 0),
    ((9, 10), (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), 1),
    ((10, 10), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),
    ((11, 9), (3, 2), (3, 1), (2, 1), (1, 0, 2, 1), 0),
    # stride 1, dilated, output as large as the input: the separable loop, per plane
    ((10, 13), (3, 3), (1, 1), (2, 2), (2, 2, 2, 2), 0),
    # stride and dilation 1, output as large as the input: the chunked loop (_whole_source)
    ((12, 12), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 0),
    ((6, 9), (2, 3), (1, 1), (1, 1), (1, 0, 0, 2), 0),
    ((7, 7), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 0),
    ((5, 8), (3, 5), (1, 1), (1, 1), (2, 1, 0, 3), 0),  # all the padding on one side
    ((4, 9), (4, 2), (1, 1), (1, 1), (1, 0, 2, 1), 0),
]


def _count_compiled_pools(monkeypatch, separable: bool) -> list:
    """Route every compiled pool to the separable loop (ops/pool/jit_pool.py) or to the phase
    planes (ops/compiled/jit_cpu.py), whatever the width rule says, and record the calls."""
    if separable:
        monkeypatch.setattr(jit_pool, "NARROW_ROWS", 0)
    else:
        monkeypatch.setattr(jit_pool, "suits", lambda *a: False)
    return _recorded_calls(monkeypatch, jit_pool if separable else plane_pools, "pool2d")


@pytest.mark.parametrize("separable", [True, False], ids=["separable", "phase-planes"])
@pytest.mark.parametrize("case, dtype", _in_both_dtypes(
    POOLS, (0, 4, 5, 9), lambda c: f"{c[0]}-k{c[1]}-s{c[2]}-c{c[5]}"))
def test_pools_match_generic(case, dtype, separable, monkeypatch):
    calls = _count_compiled_pools(monkeypatch, separable)
    image, kernel, strides, dilations, pads, ceil_mode = case
    X = RNG.standard_normal((2, 3) + image).astype(dtype)
    last = image[0] - 1
    X[0, 1, min(2, last), 2] = np.nan
    X[0, 2, -1, 1] = np.nan  # in the last rows: a border row where there are pads
    X[1, 0, 0, 0] = np.inf
    X[1, 1, min(3, last), 0] = -np.inf
    attrs = dict(kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
                 ceil_mode=ceil_mode)
    expected = max_pool(np, X, dilations=list(dilations), **attrs)
    got = inplace_cpu.max_pool_cpu(np, X, dilations=list(dilations), **attrs)
    np.testing.assert_array_equal(got, expected)
    for include_pad in (0, 1):
        if dilations != (1, 1):
            continue  # AveragePool's dilations arrived in opset 19; the generic rule covers them
        expected = average_pool(np, X, count_include_pad=include_pad, **attrs)
        got = inplace_cpu.average_pool_cpu(np, X, count_include_pad=include_pad, **attrs)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert calls, "the compiled pool was not used"


def test_tiny_pool_outputs_keep_the_numpy_path(monkeypatch):
    """A 7x7 window pooled to 1x1 (ShuffleNet's last pool) is faster in NumPy."""
    for module in (plane_pools, jit_pool):
        monkeypatch.setattr(module, "pool2d", lambda *a: pytest.fail("compiled pool used"))
    X = RNG.standard_normal((1, 8, 7, 7)).astype(np.float32)
    got = inplace_cpu.average_pool_cpu(np, X, kernel_shape=[7, 7])
    np.testing.assert_allclose(got, X.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("separable", [True, False], ids=["separable", "phase-planes"])
@pytest.mark.parametrize("window", [dict(strides=[2, 2]), dict(strides=[1, 1], pads=[1] * 4)],
                         ids=["shrinking", "same-size"])
def test_pool_output_over_its_input_is_right(window, separable, monkeypatch):
    """The planner may place a pool's output at its input's first byte."""
    calls = _count_compiled_pools(monkeypatch, separable)
    X = RNG.standard_normal((1, 6, 9, 9)).astype(np.float32)
    X[0, 3, 4, 4] = np.nan
    expected = max_pool(np, X, kernel_shape=[3, 3], **window)
    buffer = X.copy()
    out = buffer.reshape(-1)[:expected.size].reshape(expected.shape)
    inplace_cpu.max_pool_cpu(np, buffer, kernel_shape=[3, 3], out=out, **window)
    np.testing.assert_array_equal(out, expected)
    assert calls


@pytest.mark.parametrize("maximum", [True, False], ids=["max", "average"])
def test_shrinking_pool_over_its_input_split_over_the_workers(maximum, monkeypatch):
    """Output at the input's first byte, big enough to split: each thread's output planes
    overlap input planes of the other's, so both write a scratch that is copied over the
    input after; NaN in the first and last planes."""
    monkeypatch.setenv("MIXRT_NATIVE_POOL", "1")
    splits = _recorded_splits(monkeypatch, jit_pool)
    X = RNG.standard_normal((1, 64, 55, 55)).astype(np.float32)
    X[0, 0, 1, 1] = X[0, 63, 54, 54] = np.nan
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2])
    expected = (max_pool(np, X, **attrs) if maximum else average_pool(np, X, **attrs))
    buffer = X.copy()
    out = buffer.reshape(-1)[:expected.size].reshape(expected.shape)
    if maximum:
        inplace_cpu.max_pool_cpu(np, buffer, out=out, **attrs)
    else:
        inplace_cpu.average_pool_cpu(np, buffer, out=out, **attrs)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    threads = 1 if jit_cpu.native_pool() is None else parallel.intra_op_threads()
    assert splits == ([] if threads == 1 else [threads])


def test_separable_pool_split_over_threads_matches_generic(monkeypatch, split_path):
    """Big enough to be split over the intra-op threads by planes, NaNs in both halves."""
    calls = _count_compiled_pools(monkeypatch, True)
    X = RNG.standard_normal((2, 32, 65, 65)).astype(np.float32)
    assert X.size >= jit_pool.SPLIT_ELEMENTS
    splits = _recorded_splits(monkeypatch, jit_pool)
    X[0, 1, 5, 7] = X[1, 31, 64, 64] = np.nan
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(inplace_cpu.max_pool_cpu(np, X, **attrs),
                                  max_pool(np, X, **attrs))
    np.testing.assert_allclose(inplace_cpu.average_pool_cpu(np, X, **attrs),
                               average_pool(np, X, **attrs), rtol=1e-6, atol=1e-6)
    assert len(calls) == 2 and splits == [min(64, parallel.intra_op_threads())] * 2


@pytest.mark.parametrize("image", [(3, 3), (2, 6), (3, 4)],
                         ids=["all-edges", "fewer-rows-than-window", "two-inner-columns"])
def test_small_planes_in_the_stride_1_loops(image, monkeypatch):
    """Planes too small for the compiled pools' size rule, straight into jit_pool: 3x3 has
    only edge rows and columns; 2 rows (fewer than the window) take the per-plane loop."""
    chosen = _recorded_calls(monkeypatch, jit_pool, "_compiled_whole")
    X = RNG.standard_normal((3, 5) + image).astype(np.float32)
    X[1, 2, 0, -1] = np.nan
    attrs = dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1), (1, 1), image)
    got = jit_pool.pool2d(X, np.empty_like(X), geometry, True)
    np.testing.assert_array_equal(got, max_pool(np, X, **attrs))
    got = jit_pool.pool2d(X, np.empty_like(X), geometry, False, 9)
    np.testing.assert_allclose(got, average_pool(np, X, count_include_pad=1, **attrs),
                               rtol=1e-6, atol=1e-6)
    assert bool(chosen) == (image[0] >= 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chunked_pool_across_chunks_and_threads_matches_generic(dtype, monkeypatch, split_path):
    """The stride-1 loop over many planes: chunks of three planes and a short last one (the
    flat runs cross plane boundaries inside a chunk, never across chunks), then a call big
    enough to be split over the threads; NaN and infinities on edge rows and columns."""
    chosen = _recorded_calls(monkeypatch, jit_pool, "_compiled_whole")
    monkeypatch.setattr(jit_pool, "CHUNK_ELEMENTS", 3 * 7 * 7 + 5)
    X = RNG.standard_normal((2, 40, 7, 7)).astype(dtype)
    X[0, 4, 0, 3] = np.nan  # top edge row, second chunk
    X[1, 17, 6, 6] = np.nan  # a corner
    X[1, 39, 3, 0] = np.inf  # left edge column of the last plane
    X[0, 0, 3, 3] = -np.inf
    attrs = dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    expected = max_pool(np, X, **attrs)
    np.testing.assert_array_equal(inplace_cpu.max_pool_cpu(np, X, **attrs), expected)
    for include_pad in (0, 1):
        np.testing.assert_allclose(
            inplace_cpu.average_pool_cpu(np, X, count_include_pad=include_pad, **attrs),
            average_pool(np, X, count_include_pad=include_pad, **attrs), rtol=1e-6, atol=1e-6)
    # over its own input, as the planner places it: NaN chunks redo their runs before writing
    buffer = X.copy()
    inplace_cpu.max_pool_cpu(np, buffer, out=buffer, **attrs)
    np.testing.assert_array_equal(buffer, expected)
    assert len(chosen) == 4
    monkeypatch.undo()
    chosen = _recorded_calls(monkeypatch, jit_pool, "_compiled_whole")
    splits = _recorded_splits(monkeypatch, jit_pool)
    X = RNG.standard_normal((1, 96, 56, 56)).astype(dtype)
    X[0, 95, 55, 0] = np.nan
    assert X.size >= jit_pool.SPLIT_ELEMENTS
    np.testing.assert_array_equal(inplace_cpu.max_pool_cpu(np, X, **attrs),
                                  max_pool(np, X, **attrs))
    assert chosen and splits == [min(96, parallel.intra_op_threads())]


def test_separable_pool_source_holds_only_literals():
    text = jit_pool.source((3, 2), (2, 1), (1, 2), True)
    assert "m = m if m > row[b + 2] else row[b + 2]" in text  # kw=2 taps, dilation 2
    text = jit_pool.source((3, 3), (2, 2), (1, 1), False)  # stride 2: split into even, odd
    assert "m = m + odd[k + 0]" in text and "m = m + even[k + 1]" in text
    with pytest.raises(ValueError):
        jit_pool.source((3, "1; import os"), (1, 1), (1, 1), True)
    text = jit_pool.whole_source((3, 3), (1, 2), False)
    assert "m = m + h2[n]" in text and "ys[uint64(base + r0 + 1)] = m" in text
    with pytest.raises(ValueError):
        jit_pool.whole_source((3, 3), (1, "0; import os"), False)


def test_shufflenet_like_block_matches_onnxruntime(tmp_path):
    """Depthwise Conv, MaxPool and AveragePool in one planned session, against onnxruntime."""
    c = 8
    weights = [helper.make_tensor("w", TensorProto.FLOAT, [c, 1, 3, 3],
                                  RNG.standard_normal(c * 9).astype(np.float32)),
               helper.make_tensor("b", TensorProto.FLOAT, [c],
                                  RNG.standard_normal(c).astype(np.float32))]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["d"], group=c, pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["d"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["r"], ["a"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["m", "a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    path = tmp_path / "block.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    x = RNG.standard_normal((2, c, 28, 28)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    for level in (0, 2):
        got = mixrt.Session(str(path), opt_level=level).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# -- LayerNormalization -----------------------------------------------------------------------

def _layer_norm_reference(x, scale, bias, axis, epsilon):
    axes = tuple(range(axis, x.ndim))
    wide = x.astype(np.float64)
    mean = wide.mean(axis=axes, keepdims=True)
    variance = ((wide - mean) ** 2).mean(axis=axes, keepdims=True)
    result = (wide - mean) / np.sqrt(variance + epsilon) * scale
    return result + (0 if bias is None else bias)


@pytest.mark.parametrize("shape, axis", [((1, 128, 768), -1), ((3, 5, 7), 1), ((2, 1), -1),
                                         ((4, 3, 2, 6), 2), ((33,), 0)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_matches_float64_and_runs_compiled(shape, axis, with_bias, monkeypatch):
    from mixrt.ops.nn.nn_cpu import layer_normalization_cpu
    x = (RNG.standard_normal(shape) * 3 + 1).astype(np.float32)
    normalized = shape[axis % len(shape):]
    scale = RNG.standard_normal(normalized).astype(np.float32)
    bias = RNG.standard_normal(normalized).astype(np.float32) if with_bias else None
    calls = []
    real = row_kernels.layer_norm
    monkeypatch.setattr(row_kernels, "layer_norm", lambda *a: calls.append(1) or real(*a))
    out = np.empty_like(x)
    got = layer_normalization_cpu(np, x, scale, bias, axis=axis, epsilon=1e-5, out=out)
    assert got is out and calls
    want = _layer_norm_reference(x, scale, bias, axis % x.ndim, 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    monkeypatch.setenv("MIXRT_JIT", "0")
    numpy_path = layer_normalization_cpu(np, x, scale, bias, axis=axis, epsilon=1e-5,
                                         out=np.empty_like(x))
    np.testing.assert_allclose(got, numpy_path, rtol=1e-5, atol=2e-6)
    assert len(calls) == 1


def test_layer_norm_in_place_nan_rows_and_broadcast_scales():
    from mixrt.ops.nn.nn_cpu import layer_normalization_cpu
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    x[2, 5] = np.nan
    scale, bias = RNG.standard_normal(16).astype(np.float32), np.zeros(16, np.float32)
    want = _layer_norm_reference(x, scale, bias, 1, 1e-5)
    got = layer_normalization_cpu(np, x, scale, bias, axis=1, out=x)  # the planner reused x
    assert got is x
    assert np.isnan(x[2]).all() and not np.isnan(x[[0, 1, 3]]).any()
    np.testing.assert_allclose(x[[0, 1, 3]], want[[0, 1, 3]], rtol=1e-5, atol=2e-6)
    # a scale that broadcasts over the normalized axes is left to the NumPy path
    y = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    one = np.float32([[1.5]])
    got = layer_normalization_cpu(np, y, one, None, axis=1, out=np.empty_like(y))
    np.testing.assert_allclose(got, _layer_norm_reference(y, one, None, 1, 1e-5), rtol=1e-5,
                               atol=2e-6)


# -- softmax -------------------------------------------------------------------------------------

def _softmax_reference(x):
    wide = x.astype(np.float64)
    shifted = np.exp(wide - wide.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("shape", [(1, 12, 128, 128), (3, 7), (5, 1), (2, 9, 8), (4, 17),
                                   (1, 1000)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_matches_float64_and_runs_compiled(shape, dtype, monkeypatch):
    from mixrt.ops.nn import nn_cpu
    from mixrt.ops.nn.nn_cpu import softmax_cpu
    x = (RNG.standard_normal(shape) * 4).astype(dtype)
    calls = []
    real = row_kernels.softmax_rows
    monkeypatch.setattr(row_kernels, "softmax_rows", lambda *a: calls.append(1) or real(*a))
    small = x.ndim == 2 and x.size <= nn_cpu.SMALL_SOFTMAX  # one call, nothing else asked
    if small:
        kernels = jit_cpu.load(row_kernels.ROW_KERNELS)
        real_small = kernels.softmax_small
        monkeypatch.setattr(kernels, "softmax_small",
                            lambda *a: calls.append(1) or real_small(*a))
    out = np.full_like(x, np.nan)
    assert softmax_cpu(np, x, axis=-1, out=out) is out and calls
    if small:
        assert softmax_cpu(np, out, axis=-1, out=out) is out  # in place: x is out
        np.testing.assert_allclose(out, _softmax_reference(_softmax_reference(x)).astype(dtype),
                                   rtol=1e-5, atol=1e-6)
        softmax_cpu(np, x, axis=-1, out=out)
    tolerance = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(out, _softmax_reference(x), rtol=tolerance * 4, atol=tolerance)
    monkeypatch.setenv("MIXRT_JIT", "0")
    numpy_path = softmax_cpu(np, x, axis=-1, out=np.empty_like(x))
    np.testing.assert_allclose(out, numpy_path, rtol=tolerance * 4, atol=tolerance)


@pytest.mark.parametrize("shape, axis, coerced", [
    ((1, 1000, 1, 1), 1, False),  # a classifier's scores, opset 13: the axes after are 1
    ((3, 10, 1, 1), -3, False),
    ((1, 1000, 1, 1), 1, True),  # SqueezeNet's, opset 1-12: the axes from 1 on, flattened
    ((2, 3, 4, 5), 1, True),
    ((2, 3, 4, 5), 2, True),
    ((2, 3, 4, 5), 0, True),
])
def test_softmax_over_row_views_runs_compiled(shape, axis, coerced, monkeypatch):
    from mixrt.ops.nn.nn_cpu import softmax_coerced_cpu, softmax_cpu
    from mixrt.ops.nn.nn import softmax, softmax_coerced
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    fast, generic = (softmax_coerced_cpu, softmax_coerced) if coerced else (softmax_cpu, softmax)
    calls = []
    real = row_kernels.softmax_rows
    monkeypatch.setattr(row_kernels, "softmax_rows", lambda *a: calls.append(1) or real(*a))
    want = generic(np, x.astype(np.float64), axis=axis)
    out = np.full_like(x, np.nan)
    assert fast(np, x, axis=axis, out=out) is out and calls
    np.testing.assert_allclose(out, want, rtol=4e-6, atol=1e-6)
    made = fast(np, x, axis=axis)  # no planned buffer: one is made
    assert made.dtype == x.dtype
    np.testing.assert_allclose(made, want, rtol=4e-6, atol=1e-6)


def test_softmax_into_a_strided_buffer_writes_every_element():
    from mixrt.ops.nn.nn_cpu import softmax_cpu
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    spaced = np.full((4, 3, 4), np.nan, np.float32)
    out = spaced[::2]  # its rows cannot be one (6, 4) view: a reshape of it is a copy
    assert softmax_cpu(np, x, axis=-1, out=out) is out
    np.testing.assert_allclose(out, _softmax_reference(x), rtol=4e-6, atol=1e-7)
    assert np.isnan(spaced[1::2]).all()


def test_softmax_of_a_strided_input_runs_compiled_on_a_copy_of_its_rows(monkeypatch):
    from mixrt.ops.nn.nn_cpu import softmax_coerced_cpu, softmax_cpu
    from mixrt.ops.nn.nn import softmax, softmax_coerced
    x = RNG.standard_normal((5, 6, 4)).astype(np.float32).transpose(1, 0, 2)  # not contiguous
    calls = []
    real = row_kernels.softmax_rows
    monkeypatch.setattr(row_kernels, "softmax_rows", lambda *a: calls.append(1) or real(*a))
    for fast, generic, axis in ((softmax_cpu, softmax, -1), (softmax_coerced_cpu,
                                                              softmax_coerced, 1)):
        out = np.full(x.shape, np.nan, np.float32)
        assert fast(np, x, axis=axis, out=out) is out
        np.testing.assert_allclose(out, generic(np, x.astype(np.float64), axis=axis),
                                   rtol=4e-6, atol=1e-7)
    assert len(calls) == 2


def test_softmax_in_place_and_special_values_row_by_row():
    """A NaN anywhere in a row (in any of the max's eight lanes, or past them) makes that row
    NaN, as NumPy's max does; +inf makes its row NaN (inf - inf); a row of -inf is NaN; a row
    with a -inf among finite scores (a masked key) gives it 0. Other rows are untouched."""
    from mixrt.ops.nn.nn_cpu import softmax_cpu
    x = RNG.standard_normal((8, 19)).astype(np.float32)
    x[0, 0] = np.nan  # the first element: every lane starts from it
    x[1, 5] = np.nan  # inside the eight lanes
    x[2, 17] = np.nan  # past the last full group of eight
    x[3, 3] = np.inf
    x[4, :] = -np.inf
    x[5, 7] = -np.inf
    want = _softmax_reference(x[[5, 6, 7]])
    with np.errstate(invalid="ignore"):
        got = softmax_cpu(np, x, axis=-1, out=x)  # the planner reused the input
    assert got is x
    assert np.isnan(x[:5]).all()
    assert x[5, 7] == 0 and not np.isnan(x[5:]).any()
    np.testing.assert_allclose(x[5:], want, rtol=1e-6, atol=1e-7)


# -- pools with one window per plane -------------------------------------------------------------

def _spy_whole_plane(monkeypatch):
    calls = []
    real = plane_pools.whole_plane_pool
    monkeypatch.setattr(plane_pools, "whole_plane_pool",
                        lambda *a: calls.append(a[2]) or real(*a))
    return calls


@pytest.mark.parametrize("shape", [(1, 2048, 7, 7), (2, 5, 13, 13), (3, 4, 9), (1, 3, 2, 3, 4),
                                   (2, 3, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_pools_match_the_generic_kernels_and_run_compiled(shape, dtype, monkeypatch):
    from mixrt.ops.pool.inplace_cpu import global_average_pool_cpu, global_max_pool_cpu
    from mixrt.ops.pool.pool import global_average_pool, global_max_pool
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    calls = _spy_whole_plane(monkeypatch)
    out = np.full(shape[:2] + (1,) * (len(shape) - 2), np.nan, dtype)
    assert global_average_pool_cpu(np, x, out=out) is out
    np.testing.assert_allclose(out, global_average_pool(np, x), rtol=1e-6, atol=1e-6)
    assert global_max_pool_cpu(np, x, out=out) is out
    np.testing.assert_array_equal(out, global_max_pool(np, x))
    assert calls == [False, True]


@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (0, 0, 1, 1), (1, 0, 0, 1)])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_pool_windows_that_cover_the_plane_reduce_it_whole(pads, count_include_pad,
                                                             monkeypatch):
    """Inception v1's last pool is 7x7 over a 6x6 plane with pads (0, 0, 1, 1): one window,
    padding inside it. The max ignores the pads; the average counts them only with
    count_include_pad."""
    kernel = [7, 7]
    image = tuple(k - p - q for k, p, q in zip(kernel, pads[:2], pads[2:]))
    x = RNG.standard_normal((2, 6) + image).astype(np.float32)
    calls = _spy_whole_plane(monkeypatch)
    attributes = dict(kernel_shape=kernel, pads=list(pads))
    got = inplace_cpu.average_pool_cpu(np, x, count_include_pad=count_include_pad,
                                       out=np.empty((2, 6, 1, 1), np.float32), **attributes)
    want = average_pool(np, x, count_include_pad=count_include_pad, **attributes)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    got = inplace_cpu.max_pool_cpu(np, x, out=np.empty((2, 6, 1, 1), np.float32), **attributes)
    np.testing.assert_array_equal(got, max_pool(np, x, **attributes))
    assert calls == [False, True]


def test_whole_plane_max_passes_nans_on_and_works_over_its_input():
    x = RNG.standard_normal((1, 5, 7, 7)).astype(np.float32)
    x[0, 0, 0, 0] = np.nan  # every lane starts from it
    x[0, 1, 2, 3] = np.nan  # inside the eight lanes
    x[0, 2, 6, 6] = np.nan  # past the last full group of eight
    x[0, 3, 4, 4] = np.inf
    want_max = max_pool(np, x, kernel_shape=[7, 7])
    want_mean = average_pool(np, x, kernel_shape=[7, 7])
    assert np.isnan(want_max[0, :3]).all() and want_max[0, 3] == np.inf
    buffer = x.copy()
    over = buffer.reshape(-1)[:5].reshape(1, 5, 1, 1)  # the planner's shrinking pair
    assert inplace_cpu.max_pool_cpu(np, buffer, kernel_shape=[7, 7], out=over) is over
    np.testing.assert_array_equal(over, want_max)
    buffer = x.copy()
    over = buffer.reshape(-1)[:5].reshape(1, 5, 1, 1)
    assert inplace_cpu.average_pool_cpu(np, buffer, kernel_shape=[7, 7], out=over) is over
    np.testing.assert_allclose(over, want_mean, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("attributes", [dict(kernel_shape=[3, 3]),
                                        dict(kernel_shape=[4, 4], dilations=[2, 2]),
                                        dict(kernel_shape=[7, 7], strides=[2, 2],
                                             pads=[1, 1, 1, 1])])
def test_pools_with_more_windows_keep_their_loops(attributes, monkeypatch):
    x = RNG.standard_normal((1, 3, 7, 7)).astype(np.float32)
    calls = _spy_whole_plane(monkeypatch)
    got = inplace_cpu.max_pool_cpu(np, x, **attributes)
    np.testing.assert_array_equal(got, max_pool(np, x, **attributes))
    assert got.shape[2:] != (1, 1) or attributes.get("dilations")
    assert calls == []


def test_the_panel_tile_and_its_pool_follow_mixrt_jit_as_it_is_set(monkeypatch):
    """MIXRT_JIT is read when asked, as every switch: a process that loaded the tile and
    sets MIXRT_JIT=0 later gets neither the tile nor the native pool, and has them back
    when it sets it again."""
    monkeypatch.delenv("MIXRT_JIT", raising=False)
    loaded = jit_cpu.panel_kernels()
    if loaded is None:
        pytest.skip("no panel tile here (AVX-512 and numba)")
    monkeypatch.setenv("MIXRT_JIT", "0")
    assert jit_cpu.panel_kernels() is None and jit_cpu.native_pool() is None
    with parallel.pinned():  # within a run, read once: the same answers
        assert jit_cpu.panel_kernels() is None and jit_cpu.loaded_native_pool() is None
    monkeypatch.setenv("MIXRT_JIT", "1")
    assert jit_cpu.panel_kernels() is loaded
