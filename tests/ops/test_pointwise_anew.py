"""A 1x1 convolution at a new image size (ops/conv/conv_direct_cpu.pointwise_anew): where the
node's full route took the direct form's in-place call at another size on this thread, a size
of 7x7 pixels or more takes that call made from the node's kit, with the full route's bits;
the sizes, activations, arrays and threads the full route sends elsewhere take the full
route."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import conv_cpu, conv_direct_cpu
from mixrt.ops.nn import fused_cpu
from mixrt.ops.nn.fused_cpu import fused_conv_cpu

RNG = np.random.default_rng(23)

pytestmark = pytest.mark.skipif(jit_cpu.panel_kernels() is None,
                                reason="the direct convolution's tile does not run here")


def constant(array):
    array = np.ascontiguousarray(array, np.float32)
    array.flags.writeable = False  # as a session's constants are
    return array


class Node:
    """A 1x1 convolution node as a session runs it: constant weight and bias, its own dict."""

    def __init__(self, channels=16, out_channels=24, activation="Clip"):
        self.W = constant(RNG.standard_normal((out_channels, channels, 1, 1)) / 4)
        self.B = constant(RNG.standard_normal(out_channels))
        self.activation = activation
        self.params = [0.0, 6.0] if activation == "Clip" else None
        self.prepacked = {}

    def __call__(self, X, out=None, Z=None, fused=True, **attributes):
        attributes = {"kernel_shape": [1, 1], "pads": [0, 0, 0, 0], "strides": [1, 1],
                      "dilations": [1, 1], "group": 1, **attributes}
        if out is None:
            (rows, columns), pads = X.shape[2:], attributes["pads"]
            stride = attributes["strides"][0]
            out = np.empty((X.shape[0], self.W.shape[0],
                            (rows + pads[0] + pads[2] - 1) // stride + 1,
                            (columns + pads[1] + pads[3] - 1) // stride + 1), np.float32)
        if not fused:
            return conv_cpu.conv_cpu(np, X, self.W, self.B, out=out,
                                     _prepacked=self.prepacked, **attributes)
        return fused_conv_cpu(np, X, self.W, self.B, Z, activation=self.activation,
                              activation_params=self.params, out=out,
                              _prepacked=self.prepacked, **attributes)


@pytest.fixture
def taken(monkeypatch):
    """What each call of conv_direct_cpu.pointwise_anew answered."""
    answers = []
    real = conv_direct_cpu.pointwise_anew

    def counting(*arguments):
        answer = real(*arguments)
        answers.append(answer)
        return answer
    monkeypatch.setattr(conv_direct_cpu, "pointwise_anew", counting)
    return answers


def images(n, height, width, channels=16):
    return RNG.standard_normal((n, channels, height, width)).astype(np.float32)


def full_route(monkeypatch, node, X, **kwargs):
    """The node's output at X by its full route alone (no call made from its kit)."""
    with monkeypatch.context() as patched:
        for module in (conv_cpu, fused_cpu):
            patched.setattr(module, "pointwise_anew", lambda *arguments: None)
        return node(X.copy(), **kwargs)


@pytest.mark.parametrize("fused, activation", [(True, "Clip"), (True, "Relu"), (True, ""),
                                               (False, "")])
def test_new_sizes_take_the_call_made_from_the_nodes_kit_with_the_full_routes_bits(
        monkeypatch, taken, fused, activation):
    node = Node(activation=activation)
    node(images(1, 20, 24), fused=fused)  # the full route: the node's kit on this thread
    for n, height, width in ((1, 16, 16), (3, 9, 11), (2, 7, 7), (1, 30, 2)):
        X = images(n, height, width)
        del taken[:]
        got = node(X, fused=fused)
        assert taken == [True], (height, width)
        assert np.array_equal(got, full_route(monkeypatch, node, X, fused=fused))


def test_a_residual_of_the_outputs_shape_is_added_and_another_takes_the_full_route(
        monkeypatch, taken):
    node = Node(channels=24)
    node(images(1, 12, 12, 24), Z=images(1, 12, 12, 24))
    X, Z = images(2, 10, 9, 24), images(2, 10, 9, 24)
    got = node(X, Z=Z)
    assert taken[-1] is True
    assert np.array_equal(got, full_route(monkeypatch, node, X, Z=Z))
    expected = full_route(monkeypatch, node, X, Z=Z.copy())
    over = Z.copy()
    got = node(X, out=over, Z=over)  # the output over the residual: the full route's care
    assert taken[-1] is False
    assert np.array_equal(got, expected)


def test_small_planes_other_activations_and_strided_or_padded_calls_take_the_full_route(
        monkeypatch, taken):
    node = Node()
    node(images(1, 20, 24))
    X = images(2, 6, 6)  # 36 pixels: the pixel-row product's plane
    got = node(X)
    assert taken[-1] is False
    assert np.array_equal(got, full_route(monkeypatch, node, X))
    del taken[:]
    for attributes in ({"strides": [2, 2]}, {"pads": [1, 1, 1, 1]}):
        X = images(1, 14, 14)
        expected = full_route(monkeypatch, node, X, **attributes)
        assert np.array_equal(node(X, **attributes), expected)
    assert taken == []  # not the node it takes
    after = Node(activation="Sigmoid")  # an activation in a pass after the tile
    after(images(1, 20, 24))
    X = images(1, 16, 16)
    assert np.array_equal(after(X), full_route(monkeypatch, after, X))
    assert taken == []
    gated = Node(activation="HardSwish")  # a gate the direct form's parts apply: taken
    gated(images(1, 20, 24))  # (no kit of the node's yet: its full route makes one)
    del taken[:]
    assert np.array_equal(gated(X), full_route(monkeypatch, gated, X))
    assert taken == [True]


def test_no_other_form_takes_the_sizes_the_call_from_the_kit_takes():
    """pointwise_anew stands for the full route at 7x7 pixels and more because the pixel-row
    and one-pixel forms take smaller planes only; a threshold moved past the other would
    need it to ask them first."""
    from mixrt.ops.conv import direct_forms, pointwise_rows
    assert pointwise_rows.MAX_PIXELS < direct_forms.POINTWISE_POSITIONS


def reference(node, X, pads=(0, 0, 0, 0), strides=(1, 1)):
    """The node's Conv + Clip by NumPy."""
    padded = np.pad(X, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    taken_in = padded[:, :, ::strides[0], ::strides[1]]
    y = np.einsum("nchw,mc->nmhw", taken_in, node.W[:, :, 0, 0]) + node.B[None, :, None, None]
    return np.clip(y, 0, 6)


def test_calls_with_other_strides_or_pads_at_one_input_size_get_their_own_results():
    """A node's kernel called at one input size with other strides or pads (a graph's node
    has fixed attributes; a FusedConvPool's bands call theirs with pads of their own) takes
    no geometry, layout or kept call made for the others: each answer is its own, and
    nothing is written past an output (the first call's layout and kept call were taken
    before, with NaNs in the output and the heap corrupted)."""
    node = Node()
    node(images(1, 20, 24))
    calls = [{"strides": [2, 2]}, {}, {"pads": [1, 1, 1, 1]}, {"strides": [2, 2]}, {},
             {"pads": [1, 1, 1, 1]}]
    for attributes in calls:
        X = images(1, 14, 14)
        got = node(X, **attributes)
        expected = reference(node, X, attributes.get("pads", (0, 0, 0, 0)),
                             attributes.get("strides", (1, 1)))
        assert got.shape == expected.shape
        assert np.allclose(got, expected, rtol=1e-5, atol=1e-5), attributes


def test_another_thread_makes_its_own_kit_by_the_full_route(monkeypatch, taken):
    node = Node()
    node(images(1, 20, 24))
    X = images(1, 16, 18)
    expected = full_route(monkeypatch, node, X)
    found = []
    thread = threading.Thread(target=lambda: found.append(node(X)))
    thread.start()
    thread.join()
    assert taken[-1] is False  # the kit is the first thread's
    assert np.array_equal(found[0], expected)


def pointwise_model(path):
    """A 1x1 expansion with Clip (FusedConv), a plain 1x1 projection and a residual add: a
    mobile block's 1x1 convolutions."""
    from onnx import TensorProto, helper, numpy_helper
    c = lambda name, shape: numpy_helper.from_array(  # noqa: E731
        (RNG.standard_normal(shape) / 3).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"]),
             helper.make_node("Clip", ["a", "low", "high"], ["b"]),
             helper.make_node("Conv", ["b", "w2", "b2"], ["d"]),
             helper.make_node("Add", ["d", "x"], ["y"])]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                       ["n", 16, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [c("w1", (48, 16, 1, 1)), c("b1", (48,)), c("w2", (16, 48, 1, 1)), c("b2", (16,)),
         numpy_helper.from_array(np.float32(0.0), "low"),
         numpy_helper.from_array(np.float32(6.0), "high")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_a_session_at_new_sizes_gives_the_bits_of_one_without_the_shortcut(
        tmp_path, monkeypatch, taken):
    from mixrt.runtime.session import Session
    path = pointwise_model(tmp_path / "block.onnx")
    session = Session(path)
    session.run(None, {"x": images(1, 18, 22)})
    session.wait_compiled(timeout=600)
    sizes = [(1, 9, 9), (2, 14, 11), (3, 8, 20), (1, 25, 7)]
    feeds = [images(*size) for size in sizes]
    del taken[:]
    got = [[session.run(None, {"x": X})[0] for _ in range(4)] for X in feeds]
    assert any(taken)
    with monkeypatch.context() as patched:
        for module in (conv_cpu, fused_cpu):
            patched.setattr(module, "pointwise_anew", lambda *arguments: None)
        without = Session(path)
        without.run(None, {"x": images(1, 18, 22)})
        without.wait_compiled(timeout=600)
        for runs, X in zip(got, feeds):
            expected = without.run(None, {"x": X})[0]
            for run in runs:  # first sight, second (recorded), then bound
                assert np.array_equal(run, expected)
