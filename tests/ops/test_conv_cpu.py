"""The CPU fast paths of Conv (ops/conv/conv_cpu.py, im2col_cpu.py, shifted_cpu.py) against the
generic kernel: im2col bands and shift-and-add, with padding, dilation, batches and the fused
epilogue."""

import numpy as np
import pytest

import mixrt.ops.conv.conv_cpu as conv_cpu
import mixrt.ops.conv.padding_cpu as padding_cpu
import mixrt.ops.conv.shifted_cpu as shifted_cpu
from mixrt.ops.compiled import workspace
from mixrt.ops.conv.conv import conv
from mixrt.ops.nn import fused

# the CPU's fast paths, as a CPU session binds them
fused_conv = fused.fused_conv.kernels[-1].for_device("cpu")

CASES = [  # x shape, w shape, attributes
    ((1, 16, 9, 9), (4, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 12, 8, 11), (3, 12, 3, 3), dict(pads=[0, 2, 1, 0])),
    ((1, 8, 10, 10), (4, 8, 3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2])),
    ((1, 8, 10, 7), (2, 8, 5, 3), dict(pads=[2, 1, 2, 1])),
    ((1, 6, 7, 7), (3, 6, 2, 2), dict()),
    ((3, 10, 6, 6), (5, 10, 1, 3), dict(pads=[0, 1, 0, 1], dilations=[1, 2])),
    # small outputs: several images' columns share one matmul, one image's goes straight in
    ((1, 8, 14, 14), (6, 8, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    ((3, 8, 13, 13), (6, 8, 1, 1), dict(strides=[2, 2])),
]


@pytest.fixture(params=["im2col", "shift_add"])
def method(request, monkeypatch):
    """Force one of the two stride-1 algorithms, whatever the channel counts."""
    never, always = 10 ** 9, 0
    chosen = always if request.param == "shift_add" else never
    monkeypatch.setattr(shifted_cpu, "SHIFT_ADD_RATIO", chosen)
    monkeypatch.setattr(shifted_cpu, "SHIFT_ADD_PIXELS", chosen)
    return request.param


@pytest.mark.parametrize("x_shape, w_shape, attrs", CASES)
def test_fast_conv_matches_generic(method, x_shape, w_shape, attrs):
    rng = np.random.default_rng(0)
    X = rng.standard_normal(x_shape).astype(np.float32)
    W = rng.standard_normal(w_shape).astype(np.float32)
    B = rng.standard_normal(w_shape[0]).astype(np.float32)
    expected = conv(np, X, W, B, **attrs)
    out = np.full(expected.shape, np.nan, np.float32)  # every element must be written
    got = conv_cpu.conv_cpu(np, X, W, B, out=out, **attrs)
    assert got is out
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("x_shape, w_shape, attrs", CASES[:3])
def test_fused_epilogue_runs_once_per_output(method, x_shape, w_shape, attrs):
    """Residual and ReLU applied by the epilogue exactly once on every element."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal(x_shape).astype(np.float32)
    W = rng.standard_normal(w_shape).astype(np.float32)
    plain = conv(np, X, W, None, **attrs)
    Z = rng.standard_normal(plain.shape).astype(np.float32)
    got = fused_conv(np, X, W, None, Z, activation="Relu", **attrs)
    np.testing.assert_allclose(got, np.maximum(plain + Z, 0), rtol=1e-5, atol=1e-4)


def test_shift_add_chosen_for_few_output_channels():
    x, w = np.zeros((128, 56, 56), np.float32), np.zeros((32, 128 * 9), np.float32)
    assert conv_cpu._shift_add_suits(x, w, (3, 3), (1, 1), (56, 56))
    assert not conv_cpu._shift_add_suits(x, w, (3, 3), (2, 2), (28, 28))  # strided: im2col
    assert not conv_cpu._shift_add_suits(x, w, (1, 1), (1, 1), (56, 56))  # 1x1: one matmul
    many = np.zeros((512, 7, 7), np.float32)
    assert not conv_cpu._shift_add_suits(many, np.zeros((512, 512 * 9)), (3, 3), (1, 1), (7, 7))


def test_padding_borders_are_zero_when_the_buffer_held_another_image():
    """Padding buffers are kept between calls and only their interiors are written: a padded
    call after other images of non-zero values must still see zeros around its image."""
    rng = np.random.default_rng(4)
    big = np.full((8, 20, 20), 7.0, np.float32)
    conv_cpu._padded(big, [0, 0], [3, 3])  # leaves 7s across the buffer
    small = rng.standard_normal((3, 5, 6)).astype(np.float32)
    padded = conv_cpu._padded(small, [2, 1], [1, 3])
    expected = np.pad(small, ((0, 0), (2, 1), (1, 3)))
    np.testing.assert_array_equal(padded, expected)
    X = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    W = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    conv_cpu._padded(np.full((16, 30, 30), 5.0, np.float32), [1, 1], [1, 1])
    np.testing.assert_allclose(conv_cpu.conv_cpu(np, X, W, pads=[1, 1, 1, 1]),
                               conv(np, X, W, pads=[1, 1, 1, 1]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_shape, w_shape, attrs", CASES)
def test_prepacked_weights_give_the_same_result_and_are_kept(method, x_shape, w_shape, attrs):
    rng = np.random.default_rng(1)
    X = rng.standard_normal(x_shape).astype(np.float32)
    W = rng.standard_normal(w_shape).astype(np.float32)
    expected = conv(np, X, W, **attrs)
    prepacked: dict = {}
    first = conv_cpu.conv_cpu(np, X, W, _prepacked=prepacked, **attrs)
    # weight layouts (named by strings), and under tuple keys the replay and what the node
    # works out per input shape (workspace.SHAPES_KEY: its geometry)
    kept = {key: value.copy() if isinstance(key, str) else value
            for key, value in prepacked.items()}
    second = conv_cpu.conv_cpu(np, X * 2, W, _prepacked=prepacked, **attrs)
    np.testing.assert_allclose(first, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(second, 2 * expected, rtol=1e-4, atol=1e-4)
    assert prepacked.keys() == kept.keys()  # made once, reused, not rewritten
    assert all(np.array_equal(prepacked[k], kept[k]) for k in kept if isinstance(k, str))
    assert all(prepacked[k] is kept[k] for k in kept if not isinstance(k, str))
    shapes = prepacked[workspace.SHAPES_KEY]  # what it works out per input shape
    assert any(key[0] == "geometry" for key in shapes)


def test_sessions_prepack_constant_conv_weights_only():
    from onnx import TensorProto, helper, numpy_helper

    import mixrt
    from mixrt.ops.ir.registry import CONSTANT_INPUTS
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 4, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    conv_node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    constant = helper.make_model(
        helper.make_graph([conv_node], "c", [x], [y], [numpy_helper.from_array(weight, "w")]),
        opset_imports=[helper.make_opsetid("", 17)])
    fed = helper.make_model(helper.make_graph([conv_node], "f", [x, w], [y]),
                            opset_imports=[helper.make_opsetid("", 17)])
    image = rng.standard_normal((1, 4, 16, 16)).astype(np.float32)
    expected = conv(np, image, weight, pads=[1, 1, 1, 1])

    session = mixrt.Session(constant.SerializeToString(), opt_level=0)
    (node,) = session._bound.nodes
    # bound with only the positions of its constant inputs (the weight's)
    assert node.attributes["_prepacked"] == {CONSTANT_INPUTS: frozenset({1})}
    for _ in range(2):
        np.testing.assert_allclose(session.run(None, {"x": image})[0], expected, rtol=1e-4,
                                   atol=1e-4)
    assert set(node.attributes["_prepacked"]) - {CONSTANT_INPUTS}, \
        "the constant weight was not kept repacked"

    session = mixrt.Session(fed.SerializeToString(), opt_level=0)
    (node,) = session._bound.nodes
    assert "_prepacked" not in node.attributes  # a fed weight may differ every run
    for scale in (1.0, -2.0):
        got = session.run(None, {"x": image, "w": weight * np.float32(scale)})[0]
        np.testing.assert_allclose(got, expected * scale, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kept_bytes", [padding_cpu.PADDING_BYTES_KEPT, 1])
def test_kept_paddings_stay_zero_across_shapes_pads_and_evictions(kept_bytes, monkeypatch):
    """Convs of one input shape with different pads, im2col, kernel rows and shift-and-add
    (whose padded planes carry a zero spill) interleaved, with every padding kept or each
    one evicted by the next: all equal the generic kernel, call after call."""
    monkeypatch.setattr(padding_cpu, "PADDING_BYTES_KEPT", kept_bytes)
    monkeypatch.setitem(workspace.workspace_state(), "paddings", {})
    rng = np.random.default_rng(6)
    cases = [((1, 8, 12, 12), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1])),  # kernel rows
             ((1, 8, 12, 12), (2, 8, 3, 3), dict(pads=[1, 1, 1, 1])),  # shift-and-add
             ((1, 8, 12, 12), (16, 8, 3, 3), dict(pads=[2, 0, 0, 2])),
             ((1, 8, 12, 12), (4, 8, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
             ((2, 8, 7, 7), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1]))]  # batched columns
    for _ in range(3):
        for x_shape, w_shape, attrs in cases:
            X = rng.standard_normal(x_shape).astype(np.float32) + 5  # nothing near zero
            W = rng.standard_normal(w_shape).astype(np.float32)
            np.testing.assert_allclose(conv_cpu.conv_cpu(np, X, W, **attrs),
                                       conv(np, X, W, **attrs), rtol=1e-5, atol=1e-4)
    kept = workspace.workspace_state()["paddings"]
    # kept: 12x12 with pads 1 (kernel rows, strided im2col), with pads (2, 0, 0, 2), with pads 1
    # and a spill (shift-and-add), 7x7 with pads 1
    assert len(kept) == (1 if kept_bytes == 1 else 4)


def test_few_input_channels_keep_im2col_over_kernel_rows():
    """VGG's first layer (3 -> 64, 3x3, stride 1): kernel rows would multiply K = 9 rows at a
    time, im2col one K = 27 product; 8 input channels and more take kernel rows."""
    rng = np.random.default_rng(8)
    for channels, rows in ((3, False), (7, False), (8, True), (16, True)):
        X = rng.standard_normal((1, channels, 12, 12)).astype(np.float32)
        W = rng.standard_normal((64, channels, 3, 3)).astype(np.float32)
        assert conv_cpu._KernelRows.suit(X, W, (3, 3), (1, 1), (12, 12)) is rows
        assert conv_cpu._KernelRows.suit(X, W, (3, 3), (1, 1), (12, 12), forward=False)
        np.testing.assert_allclose(conv_cpu.conv_cpu(np, X, W, pads=[1, 1, 1, 1]),
                                   conv(np, X, W, pads=[1, 1, 1, 1]), rtol=1e-5, atol=1e-4)


def test_a_new_image_sizes_geometry_is_conv_geometrys():
    """A node's geometry at a new image size is worked out from what it kept of another
    size (its kernel, strides, dilations, pads): the same answer as ``conv_geometry``'s,
    pads that follow the image (auto_pad SAME_*) included, in 1, 2 and 3 dimensions."""
    from mixrt.ops.conv.conv import conv_geometry
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(400):
        nd, group = int(rng.integers(1, 4)), int(rng.integers(1, 3))
        kernel = [int(k) for k in rng.integers(1, 5, nd)]
        W = np.zeros((2 * group, 4, *kernel), np.float32)
        auto_pad = str(rng.choice(["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
        pads = [int(p) for p in rng.integers(0, 3, 2 * nd)] if auto_pad == "NOTSET" else None
        strides = [int(s) for s in rng.integers(1, 4, nd)]
        dilations = [int(d) for d in rng.integers(1, 3, nd)]
        for _ in range(3):  # the node's first size, then new ones
            X = np.zeros((1, 4 * group, *rng.integers(1, 24, nd)), np.float32)
            want = conv_geometry(X, W, auto_pad, dilations, group, kernel, pads, strides)
            got = conv_cpu._shared_window(X, W, auto_pad, dilations, group, kernel, pads,
                                          strides)
            assert [list(v) if isinstance(v, (list, tuple)) else v for v in got] \
                == [list(v) if isinstance(v, (list, tuple)) else v for v in want]
            checked += 1
    assert checked == 1200
