"""A convolution node's call kept for an image size it has met (ops/compiled/image_routes.py):
another batch of that size takes it, with the full route's bits; what the call cannot take
(an output over an input, another thread, a lapsed stand-in) takes the full route."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mixrt.ops.compiled import image_routes, jit_cpu, jit_tier
from mixrt.ops.conv.conv_cpu import conv_cpu
from mixrt.ops.nn.fused_cpu import fused_conv_cpu

RNG = np.random.default_rng(11)

pytestmark = pytest.mark.skipif(not jit_cpu.enabled(), reason="compiled kernels are off")


def constant(array):
    array = np.ascontiguousarray(array, np.float32)
    array.flags.writeable = False  # as a session's constants are
    return array


class Node:
    """A convolution node as a session runs it: constant weight and bias, its own dict."""

    def __init__(self, channels=16, out_channels=24, kernel=3, group=1, activation="Relu"):
        self.W = constant(RNG.standard_normal((out_channels, channels // group, kernel, kernel))
                          / kernel)
        self.B = constant(RNG.standard_normal(out_channels))
        self.group, self.kernel, self.activation = group, kernel, activation
        self.prepacked = {}

    def __call__(self, X, out=None, Z=None, prepacked=None, fused=True):
        pad = self.kernel // 2
        attributes = dict(kernel_shape=[self.kernel] * 2, pads=[pad] * 4, strides=[1, 1],
                          dilations=[1, 1], group=self.group)
        if out is None:
            out = np.empty((X.shape[0], self.W.shape[0], *X.shape[2:]), np.float32)
        node = self.prepacked if prepacked is None else prepacked
        if not fused:
            return conv_cpu(np, X, self.W, self.B, out=out, _prepacked=node, **attributes)
        return fused_conv_cpu(np, X, self.W, self.B, Z, activation=self.activation, out=out,
                              _prepacked=node, **attributes)


@pytest.fixture
def hits(monkeypatch):
    counted = []
    ran = image_routes.ran

    def counting(*arguments, **options):
        took = ran(*arguments, **options)
        counted.append(took)
        return took
    monkeypatch.setattr(image_routes, "ran", counting)
    return counted


def images(n, height=20, width=24, channels=16):
    return RNG.standard_normal((n, channels, height, width)).astype(np.float32)


def full_route(node, X, **kwargs):
    """The node's output by its full route alone (a dict of its own, nothing kept)."""
    return node(X, prepacked={}, **kwargs)


@pytest.mark.parametrize("activation", ["Relu", "HardSwish", ""])
def test_another_batch_of_a_met_size_takes_the_kept_call_with_the_same_bits(hits, activation):
    node = Node(activation=activation)
    node(images(1))
    if not node.prepacked.get(image_routes.ROUTES):
        pytest.skip("the direct convolution does not run here (no panel tile)")
    X = images(3)
    y = node(X)
    assert hits[-1] is True
    assert np.array_equal(y, full_route(node, X))


def test_a_plain_conv_keeps_its_call_too(hits):
    node = Node(activation="")
    node(images(2), fused=False)
    if not node.prepacked.get(image_routes.ROUTES):
        pytest.skip("the direct convolution does not run here (no panel tile)")
    X = images(5)
    y = node(X, fused=False)
    assert hits[-1] is True
    assert np.array_equal(y, full_route(node, X, fused=False))


def test_a_residual_is_added_and_an_output_over_it_takes_the_full_route(hits):
    node = Node(channels=24)
    first = images(1, channels=24)
    node(first, Z=images(1, channels=24))
    if not node.prepacked.get(image_routes.ROUTES):
        pytest.skip("the direct convolution does not run here (no panel tile)")
    X, Z = images(2, channels=24), images(2, channels=24)
    y = node(X, Z=Z)
    assert hits[-1] is True
    assert np.array_equal(y, full_route(node, X, Z=Z))
    expected = full_route(node, X, Z=Z.copy())
    in_place = Z.copy()
    y = node(X, out=in_place, Z=in_place)
    assert hits[-1] is False
    assert np.array_equal(y, expected)


def test_other_sizes_and_threads_take_the_full_route(hits):
    node = Node()
    node(images(1))
    if not node.prepacked.get(image_routes.ROUTES):
        pytest.skip("the direct convolution does not run here (no panel tile)")
    X = images(2, height=12, width=10)  # a size not met
    y = node(X)
    assert hits[-1] is False
    assert np.array_equal(y, full_route(node, X))
    found = []
    thread = threading.Thread(target=lambda: found.append(node(images(2))))
    thread.start()
    thread.join()
    assert hits[-1] is False  # the kept call holds the first thread's kit


def test_a_node_keeps_its_last_image_sizes():
    node = Node(channels=8, out_channels=8)
    for size in range(8, 8 + image_routes.MAX_ROUTES + 4):
        node(images(1, height=size, width=9, channels=8))
    routes = node.prepacked.get(image_routes.ROUTES)
    if not routes:
        pytest.skip("the direct convolution does not run here (no panel tile)")
    assert len(routes) == image_routes.MAX_ROUTES
    assert ((8, 8, 9), True, (1, 1, 1, 1)) not in routes  # the first let go


def test_a_depthwise_node_takes_its_kept_call_in_loading_runs_alone(hits):
    node = Node(channels=16, out_channels=16, group=16)
    node(images(1))  # compiles what the node needs (compiling allowed)
    with jit_tier.using(True, misses=[]):  # a signature's first run: compiling forbidden
        node(images(1, height=14, width=18))
        if not node.prepacked.get(image_routes.ROUTES):
            pytest.skip("the depthwise loop does not run here")
        X = images(3, height=14, width=18)
        y = node(X)
        assert hits[-1] is True
    assert np.array_equal(y, full_route(node, X))
    node(images(2, height=14, width=18))  # not a loading run: the full route
    assert hits[-1] is False


def kept_stand_in(loaded: set) -> tuple:
    """A node's dict with a depthwise stand-in kept for X's size (a flat form named
    "geometry", loaded once in ``loaded``), X, W and the calls the kept one makes."""
    prepacked, calls = {}, []
    X, W = images(1), constant(np.ones((2, 16, 1, 1)))
    out = np.empty((1, 2, 20, 24), np.float32)
    image_routes.stash(prepacked, out, lambda *arrays: calls.append(arrays),
                       image_routes.How(records=True, loading_only=True))
    image_routes.amend(prepacked, out, ("geometry", loaded), "a flat form")
    image_routes.keep(prepacked, X, (W, None), None, out, None)
    return prepacked, X, W, calls


def test_a_stand_in_lapses_once_its_flat_form_is_loaded():
    loaded = set()
    prepacked, X, W, calls = kept_stand_in(loaded)
    B = None
    again = np.empty((1, 2, 20, 24), np.float32)
    misses = []
    with jit_tier.using(True, misses=misses):
        assert image_routes.ran(prepacked, X, (W, B), None, again, None)
        assert len(calls) == 1 and misses == [jit_tier.OPTIONAL + "a flat form"]
        loaded.add("geometry")
        assert not image_routes.ran(prepacked, X, (W, B), None, again, None)
    assert len(calls) == 1


def test_a_serving_run_takes_a_stand_in_while_its_flat_form_is_in_no_cache(monkeypatch):
    """In a process that compiles in the background, a run that may compile (a size's
    second run, serving) takes a depthwise node's kept call as a loading run does: a
    stand-in while the flat form it stands in for is in no cache (once a child compiled
    it, the full route, which loads it), a size-free form always; where the process
    compiles in the foreground, the full route."""
    cached = set()
    prepacked, X, W, calls = kept_stand_in(set())
    monkeypatch.setattr(image_routes, "compiled_before", lambda name: name in cached)
    again = np.empty((1, 2, 20, 24), np.float32)
    monkeypatch.setenv("MIXRT_COMPILE", "background")
    with jit_tier.using(True):  # compiling allowed on this thread: not a loading run
        assert image_routes.ran(prepacked, X, (W, None), None, again, None)
        assert len(calls) == 1 and calls[0][-1] is again
        cached.add("geometry")
        assert not image_routes.ran(prepacked, X, (W, None), None, again, None)
        cached.clear()
        monkeypatch.setenv("MIXRT_COMPILE", "foreground")
        assert not image_routes.ran(prepacked, X, (W, None), None, again, None)
        free = np.empty((1, 3, 20, 24), np.float32)  # a size-free form's call, no stand-in
        image_routes.stash(prepacked, free, lambda *arrays: calls.append(arrays),
                           image_routes.How(records=True, loading_only=True))
        image_routes.keep(prepacked, X, (W, None), None, free, None)
        assert not image_routes.ran(prepacked, X, (W, None), None, free, None)
        monkeypatch.setenv("MIXRT_COMPILE", "background")
        assert image_routes.ran(prepacked, X, (W, None), None, free, None)
    assert len(calls) == 2


def test_a_squeeze_excite_node_keeps_one_call_for_every_size_in_place_or_apart(hits):
    from mixrt.ops.ir.registry import CONSTANT_INPUTS
    from mixrt.ops.nn.squeeze_excite_cpu import squeeze_excite_cpu
    channels, hidden = 24, 8
    weights = (constant(RNG.standard_normal((hidden, channels, 1, 1)) / 4),
               constant(RNG.standard_normal(hidden)),
               constant(RNG.standard_normal((channels, hidden, 1, 1)) / 2),
               constant(RNG.standard_normal(channels)))
    attributes = dict(activation1="Relu", activation2="HardSigmoid",
                      activation2_params=[1 / 6, 0.5])
    prepacked = {CONSTANT_INPUTS: frozenset({1, 2, 3, 4})}

    def run(X, out, node):
        return squeeze_excite_cpu(np, X, *weights, out=out, _prepacked=node, **attributes)
    first = images(1, 6, 10, channels)
    run(first, np.empty_like(first), prepacked)
    assert prepacked.get(image_routes.ROUTES)
    for n, height, width in ((4, 6, 10), (2, 6, 10), (3, 9, 5)):  # any size: one route
        X = images(n, height, width, channels)
        expected = run(X, np.empty_like(X), {CONSTANT_INPUTS: frozenset({1, 2, 3, 4})})
        y = run(X, np.empty_like(X), prepacked)
        assert hits[-1] is True
        assert np.array_equal(y, expected)
        in_place = X.copy()
        y = run(in_place, in_place, prepacked)  # out the very input: as its plan may have it
        assert hits[-1] is True
        assert np.array_equal(y, expected)


def cnn_model(path):
    """Conv + HardSwish (a pass after the tile), a depthwise Conv + Relu, a 1x1 Conv: what a
    mobile network's block is made of."""
    from onnx import TensorProto, helper, numpy_helper
    c = lambda name, shape: numpy_helper.from_array(  # noqa: E731
        (RNG.standard_normal(shape) / 3).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w2", "b2"], ["d"], pads=[1, 1, 1, 1], group=16),
             helper.make_node("Relu", ["d"], ["e"]),
             helper.make_node("Conv", ["e", "w3"], ["y"])]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                       ["n", 8, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [c("w1", (16, 8, 3, 3)), c("b1", (16,)), c("w2", (16, 1, 3, 3)), c("b2", (16,)),
         c("w3", (24, 16, 1, 1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_a_session_serves_new_batches_of_a_met_size_with_the_bits_of_a_fresh_one(tmp_path,
                                                                                 hits):
    from mixrt.runtime.session import Session
    path = cnn_model(tmp_path / "block.onnx")
    session = Session(path)
    session.run(None, {"x": images(1, 18, 22, 8)})
    session.wait_compiled(timeout=600)
    session.run(None, {"x": images(1, 18, 22, 8)})
    for n in (3, 5):
        X = images(n, 18, 22, 8)
        fresh = Session(path)
        fresh.run(None, {"x": X})
        fresh.wait_compiled(timeout=600)
        expected = fresh.run(None, {"x": X})[0]
        del hits[:]
        for _ in range(4):  # a first run (kept calls), a second (recorded), then bound
            got = session.run(None, {"x": X})[0]
            assert np.array_equal(got, expected)
        assert any(hits)


def test_a_kept_depthwise_call_that_would_compile_takes_the_full_route():
    def forbidden(*arrays):
        raise jit_tier.CompileForbidden("another split's part entry")
    prepacked = {}
    X, W = images(1), constant(np.ones((16, 1, 3, 3)))
    out = np.empty_like(X)
    image_routes.stash(prepacked, out, forbidden,
                       image_routes.How(records=True, loading_only=True, tied=False))
    image_routes.keep(prepacked, X, (W, None), None, out, None)
    with jit_tier.using(True, misses=[]):
        assert not image_routes.ran(prepacked, images(2), (W, None), None,
                                    np.empty((2, 16, 20, 24), np.float32), None)


def test_tied_calls_kept_over_old_scratch_buffers_are_let_go(monkeypatch):
    node = Node()
    node(images(1))
    routes = node.prepacked.get(image_routes.ROUTES)
    if not routes:
        pytest.skip("the direct convolution does not run here (no panel tile)")
    generation = jit_cpu.scratch_generation()
    monkeypatch.setattr(jit_cpu, "scratch_generation", lambda: generation + 1)
    X = images(2, height=12, width=10)
    y = node(X)  # a full route after a reallocation: the old size's kept call goes
    assert list(routes) == [((16, 12, 10), (12, 10), True, (1, 1, 1, 1))]
    assert np.array_equal(y, full_route(node, X))
