"""A product node's rows route (ops/nn/matmul_cpu.py, RowsRoute): at a new number of rows, a
FusedMatMul or MatMul against a constant weight goes straight to its panels, with the bits
of the full route, and only where the full route would have gone there too."""

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mixrt.ops.compiled import jit_cpu, workspace
from mixrt.ops.ir.registry import CONSTANT_INPUTS
from mixrt.ops.nn import fused_cpu, matmul_cpu
from mixrt.ops.nn.matmul_cpu import ROWS_ROUTE
from mixrt.runtime.session import Session

pytestmark = pytest.mark.skipif(jit_cpu.native_pool() is None or jit_cpu.panel_kernels()
                                is None, reason="the panels and the native pool (AVX-512)")
RNG = np.random.default_rng(11)


def _node() -> dict:
    """A node's prepacked dict, its weight and bias inputs constants (runtime/binding.py)."""
    return {CONSTANT_INPUTS: frozenset({1, 2})}


def _operands(rows: int, k: int = 128, n: int = 256, lead: int = 1):
    A = RNG.standard_normal((lead, rows, k)).astype(np.float32)
    return A, np.empty((lead, rows, n), np.float32)


def _fused(node, A, B, bias, out):
    with jit_cpu.native_run(True):
        return fused_cpu.fused_mat_mul_cpu(np, A, B, bias, out=out, _prepacked=node)


def _settled(n: int):
    """A weight (128 x n), its bias and a node whose first call, at 40 rows, took the full
    route (and kept its rows route)."""
    B = (RNG.standard_normal((128, n)) * 0.1).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    node = _node()
    A, out = _operands(40, n=n)
    _fused(node, A, B, bias, out)
    return B, bias, node


@pytest.fixture
def full_routes(monkeypatch):
    """One entry per call the rows route left to the full route (it declined or had none)."""
    calls = []
    original = matmul_cpu.rows_route

    def spied(*args):
        taken = original(*args)
        if not taken:
            calls.append(1)
        return taken
    monkeypatch.setattr(matmul_cpu, "rows_route", spied)
    return calls


def test_new_rows_take_the_route_with_the_full_routes_bits(full_routes):
    B, bias, node = _settled(256)
    assert ROWS_ROUTE in node and len(full_routes) == 1
    for rows in (17, 64, 9, 300, 33):
        A, out = _operands(rows)
        _fused(node, A, B, bias, out)
        fresh = np.empty_like(out)  # the full route, on a node of its own
        _fused(_node(), A, B, bias, fresh)
        np.testing.assert_array_equal(out, fresh)
        np.testing.assert_allclose(out, A @ B + bias, rtol=1e-5, atol=1e-4)
    # each new number of rows: one full route for the fresh node only
    assert len(full_routes) == 1 + 5


def test_the_route_keeps_out_of_what_the_full_route_sends_elsewhere(full_routes):
    # a weight under SPLIT_WEIGHT_BYTES (not streamed): few rows go to the few-rows form
    B, bias, node = _settled(192)
    declined = len(full_routes)
    cases = [_operands(3, n=192),  # 3 x 128 x 192: under PANEL_MIN_WORK
             _operands(1, n=192)]  # one row: the BLAS's
    wide = RNG.standard_normal((1, 50, 256)).astype(np.float32)
    cases.append((wide[:, :, :128], np.empty((1, 50, 192), np.float32)))  # A not contiguous
    for A, out in cases:
        _fused(node, A, B, bias, out)
        np.testing.assert_allclose(out, A @ B + bias, rtol=1e-5, atol=1e-4)
    assert len(full_routes) == declined + len(cases)
    A, out = _operands(64, n=192)  # past the thresholds again: the route
    _fused(node, A, B, bias, out)
    np.testing.assert_allclose(out, A @ B + bias, rtol=1e-5, atol=1e-4)
    assert len(full_routes) == declined + len(cases)


def test_an_output_over_its_input_takes_the_full_route(full_routes):
    B, bias, node = _settled(128)
    declined = len(full_routes)
    A = RNG.standard_normal((1, 60, 128)).astype(np.float32)
    want = A @ B + bias
    _fused(node, A, B, bias, A)  # an in-place plan's output over its input
    np.testing.assert_allclose(A, want, rtol=1e-5, atol=1e-4)
    assert len(full_routes) == declined + 1


def test_another_thread_takes_the_full_route(full_routes):
    B, bias, node = _settled(256)
    A, out = _operands(70)
    worker = threading.Thread(target=_fused, args=(node, A, B, bias, out))
    worker.start()
    worker.join()
    np.testing.assert_allclose(out, A @ B + bias, rtol=1e-5, atol=1e-4)
    assert len(full_routes) == 2


def test_a_sessions_new_lengths_take_their_products_rows_routes(full_routes):
    """A two-layer dense stack with a dynamic length: after its first lengths, a new length's
    products take their rows routes, and every answer matches NumPy's."""
    w1 = (RNG.standard_normal((64, 192)) * 0.1).astype(np.float32)
    b1 = RNG.standard_normal(192).astype(np.float32)
    w2 = (RNG.standard_normal((192, 64)) * 0.1).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m"]),
             helper.make_node("Neg", ["m"], ["y"])]
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, name) for name, w in (("w1", w1), ("b1", b1), ("w2", w2))])
    session = Session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                        ir_version=9).SerializeToString())
    for length in (40, 64, 90):
        session.run(None, {"x": RNG.standard_normal((1, length, 64)).astype(np.float32)})
    before = len(full_routes)
    for length in (41, 77, 128, 55, 200):
        x = RNG.standard_normal((1, length, 64)).astype(np.float32)
        (y,) = session.run(None, {"x": x})
        np.testing.assert_allclose(y, -(np.maximum(x @ w1 + b1, 0) @ w2), rtol=1e-4, atol=1e-4)
    assert len(full_routes) == before  # every product of every new length: its rows route


def _gemm(node, A, B, bias, out):
    from mixrt.ops.nn import nn_cpu
    with jit_cpu.native_run(True):
        return nn_cpu.gemm_cpu(np, A, B, bias, transB=1, out=out, _prepacked=node)


def test_a_gemm_with_a_transposed_weight_takes_its_rows_route(full_routes):
    """A PyTorch Linear's Gemm (transB): its weight's transposed view is made anew each call,
    yet the route is kept by the weight the node has, and new rows get the full route's
    bits; a bias that is not the recorded one, or alpha, sends it the full way."""
    B = (RNG.standard_normal((320, 128)) * 0.1).astype(np.float32)  # (N, K): 160 KB
    bias = RNG.standard_normal(320).astype(np.float32)
    # the scratch grown first to the largest call's: a route made before a scratch grows
    # declines after (its generation changed), and how much a call grows it depends on the
    # machine's split
    _gemm(_node(), np.zeros((300, 128), np.float32), B, bias, np.empty((300, 320), np.float32))
    node = _node()
    A = RNG.standard_normal((40, 128)).astype(np.float32)
    _gemm(node, A, B, bias, np.empty((40, 320), np.float32))
    assert ROWS_ROUTE in node and node[ROWS_ROUTE].source is B
    routed = len(full_routes)
    for rows in (17, 64, 9, 300):
        A = RNG.standard_normal((rows, 128)).astype(np.float32)
        out = np.empty((rows, 320), np.float32)
        _gemm(node, A, B, bias, out)
        fresh = np.empty_like(out)
        _gemm(_node(), A, B, bias, fresh)  # the full route, on a node of its own
        np.testing.assert_array_equal(out, fresh)
        np.testing.assert_allclose(out, A @ B.T + bias, rtol=1e-5, atol=1e-4)
    assert len(full_routes) == routed + 4  # the fresh nodes' only
    other = bias.copy()  # equal values, another array: not the route's bias
    A = RNG.standard_normal((23, 128)).astype(np.float32)
    out = np.empty((23, 320), np.float32)
    _gemm(node, A, B, other, out)
    np.testing.assert_allclose(out, A @ B.T + other, rtol=1e-5, atol=1e-4)
    assert len(full_routes) == routed + 5
    from mixrt.ops.nn import nn_cpu
    with jit_cpu.native_run(True):
        nn_cpu.gemm_cpu(np, A, B, bias, alpha=0.5, transB=1, out=out, _prepacked=node)
    np.testing.assert_allclose(out, 0.5 * (A @ B.T) + bias, rtol=1e-5, atol=1e-4)


def _fused_gemm(node, A, B, bias, out, activation="Relu", params=None):
    with jit_cpu.native_run(True):
        return fused_cpu.fused_gemm_cpu(np, A, B, bias, transB=1, activation=activation,
                                        activation_params=params, out=out, _prepacked=node)


def test_a_relu_layer_is_one_product_its_replay_and_rows_route(full_routes):
    """A FusedGemm with a Relu (or Clip): the activation applied in the tiles after the
    bias, so the layer's product is the whole node: its replay, and its rows route at a new
    number of rows, with the bits of the full route; a Tanh's layer keeps its pass."""
    from mixrt.ops.compiled import replay
    B = (RNG.standard_normal((320, 128)) * 0.1).astype(np.float32)
    bias = RNG.standard_normal(320).astype(np.float32)
    for activation, params, want in (
            ("Relu", None, lambda y: np.maximum(y, 0)),
            ("Clip", [-0.25, 0.5], lambda y: np.clip(y, -0.25, 0.5))):
        # this thread's scratch grown for the largest rows first: a growth lets the routes
        # go (the suite's earlier tests on this worker may or may not have grown it)
        _fused_gemm(_node(), np.ones((64, 128), np.float32), B, bias,
                    np.empty((64, 320), np.float32), activation, params)
        node = _node()
        A = RNG.standard_normal((40, 128)).astype(np.float32)
        out = np.empty((40, 320), np.float32)
        _fused_gemm(node, A, B, bias, out, activation, params)
        np.testing.assert_allclose(out, want(A @ B.T + bias), rtol=1e-5, atol=1e-4)
        assert node[ROWS_ROUTE].limits is not None and replay.KEY in node
        routed = len(full_routes)
        for rows in (17, 64, 9):
            A = RNG.standard_normal((rows, 128)).astype(np.float32)
            out = np.empty((rows, 320), np.float32)
            _fused_gemm(node, A, B, bias, out, activation, params)
            fresh = np.empty_like(out)
            _fused_gemm(_node(), A, B, bias, fresh, activation, params)  # the full route
            np.testing.assert_array_equal(out, fresh)
            np.testing.assert_allclose(out, want(A @ B.T + bias), rtol=1e-5, atol=1e-4)
        assert len(full_routes) == routed + 3  # the fresh nodes' only
    node = _node()  # a Tanh is no clamp: the pass after the product, no route nor replay
    A = RNG.standard_normal((40, 128)).astype(np.float32)
    out = np.empty((40, 320), np.float32)
    _fused_gemm(node, A, B, bias, out, "Tanh")
    np.testing.assert_allclose(out, np.tanh(A @ B.T + bias), rtol=1e-5, atol=1e-5)
    assert replay.KEY not in node


def test_rows_met_again_take_the_call_made_for_them(monkeypatch):
    """A number of rows the route met before (a shape that comes back, its plan's second run
    not bound yet) takes the call made then, with the full route's bits; a route keeps the
    calls of its last few numbers of rows (``workspace.MAX_SHAPES_KEPT``), all made from
    the one kit of what they share (the panels, bias, spill buffers)."""
    monkeypatch.setattr(workspace, "MAX_SHAPES_KEPT", 3)
    B, bias, node = _settled(256)
    made, kits, original = [], set(), matmul_cpu._call_at

    def counted(kit, rows):
        made.append(rows)
        kits.add(id(kit))
        return original(kit, rows)
    monkeypatch.setattr(matmul_cpu, "_call_at", counted)
    sequence = (17, 64, 17, 9, 64, 33, 17, 17)
    calls = [_operands(rows) for rows in sequence]
    for A, out in calls:
        _fused(node, A, B, bias, out)
    # 33 let 17 go (the oldest), and 17 let 64 go
    kept = node[ROWS_ROUTE].calls[workspace.SHAPES_KEY]
    assert made == [17, 64, 9, 33, 17] and sorted(kept) == [9, 17, 33]
    assert kits == {id(node[ROWS_ROUTE].kit)}
    monkeypatch.setattr(matmul_cpu, "_call_at", original)
    for A, out in calls:
        fresh = np.empty_like(out)
        _fused(_node(), A, B, bias, fresh)  # the full route, on a node of its own
        np.testing.assert_array_equal(out, fresh)
        np.testing.assert_allclose(out, A @ B + bias, rtol=1e-5, atol=1e-4)
