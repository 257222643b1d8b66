"""A bound panel product (ops/nn/panel_calls.py's ``bound_to``): on an arena's view, its
kernel called through the overload entry of exactly its arguments with those arguments
made once; on a feed, the call on its input alone. Either way, every run gives the bits
the kernels give when called afresh."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.compiled import entry_points
from helpers import unbound_run


def _mlp(inputs: int, widths: tuple, outputs: int):
    """Gemm + Relu layers over the feed, the first reading the feed itself."""
    rng = np.random.default_rng(3)
    nodes, initializers, previous = [], [], "x"
    for index, (k, n) in enumerate(zip((inputs, *widths), (*widths, outputs))):
        w, b = f"w{index}", f"b{index}"
        initializers += [
            numpy_helper.from_array((rng.standard_normal((k, n)) * 0.2).astype(np.float32), w),
            numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np.float32), b)]
        nodes += [helper.make_node("Gemm", [previous, w, b], [f"g{index}"]),
                  helper.make_node("Relu", [f"g{index}"], [f"r{index}"])]
        previous = f"r{index}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", inputs])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("rows", [11, 300])  # one thread; split over the native pool
def test_bound_products_give_the_bits_of_unbound_ones(rows, monkeypatch):
    session = mixrt.Session(_mlp(349, (34, 96), 264))
    reference = mixrt.Session(_mlp(349, (34, 96), 264))
    rng = np.random.default_rng(rows)
    for _ in range(6):  # the first runs record and bind, the later ones run bound
        feeds = {"x": rng.standard_normal((rows, 349)).astype(np.float32)}
        got = session.run(None, feeds)[0]
        np.testing.assert_array_equal(got, unbound_run(reference, feeds, monkeypatch))


def test_a_product_on_the_arena_is_prepared_once_and_one_on_a_feed_is_not(monkeypatch):
    """Once bound, runs prepare no product: the ones on the arena's views call what their
    binding prepared, the one on the feed (a new array each run) is not prepared at all."""
    prepared = []
    fixed_call = entry_points.fixed_call

    def counted(kernel, *arguments):
        prepared.append(arguments)
        return fixed_call(kernel, *arguments)
    monkeypatch.setattr("mixrt.ops.nn.panel_calls.fixed_call", counted)
    session = mixrt.Session(_mlp(256, (192, 160), 128))  # each product large enough for
    rng = np.random.default_rng(0)                          # the panels at 16 rows
    for _ in range(4):
        session.run(None, {"x": rng.standard_normal((16, 256)).astype(np.float32)})
    made = len(prepared)
    feeds = [{"x": rng.standard_normal((16, 256)).astype(np.float32)} for _ in range(5)]
    for feed in feeds:
        session.run(None, feed)
    assert made == 2  # the two products on the arena's views, not the one on the feed
    assert len(prepared) == made
    assert all(feeds[0]["x"] is not arguments[0] for arguments in prepared)
