"""MIXRT_BATCH_INVARIANT=1: each row's result is the same bits whatever rows are beside it.

``mixrt serve`` joins concurrent requests along the first axis; under the switch every dense
product against a constant weight (and attention's stacked products) takes the packed-panel
kernels, whose per-row sums do not depend on how many rows share the run. Each model here
runs rows 0..7 one at a time and joined 2, 3, 5 and 8 at once, and every row must come back
byte for byte the same. The compiled tier only (tests/conftest.py: MIXRT_COMPILE=foreground).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.nn import row_kernels

ROWS = 8
JOINED = (2, 3, 5, 8)
FLOAT = TensorProto.FLOAT

needs_panels = pytest.mark.skipif(
    jit_cpu.panel_kernels() is None,
    reason="the packed-panel kernels are unavailable here (MIXRT_JIT=0, no numba, no "
           "AVX-512, or the NumPy tier): MIXRT_BATCH_INVARIANT has nothing to route to")


@pytest.fixture
def invariant(monkeypatch):
    monkeypatch.setenv("MIXRT_BATCH_INVARIANT", "1")


def _model(nodes, inputs, outputs, weights=()) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(w, name) for name, w in weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _value(name, shape):
    return helper.make_tensor_value_info(name, FLOAT, shape)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _weights(shape, seed):
    return (_rng(seed).standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


# -- the models: (model bytes, feeds of ROWS rows) ------------------------------------------------

def gemm_case(k, n, trans_b):
    w = _weights((n, k) if trans_b else (k, n), 1)
    b = _weights((n,), 2)
    model = _model([helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=trans_b)],
                   [_value("x", ["n", k])], [_value("y", ["n", n])], [("W", w), ("b", b)])
    return model, {"x": _rng(3).standard_normal((ROWS, k)).astype(np.float32)}


def matmul_2d_case():
    k, n = 128, 96
    model = _model([helper.make_node("MatMul", ["x", "W"], ["y"])],
                   [_value("x", ["n", k])], [_value("y", ["n", n])],
                   [("W", _weights((k, n), 4))])
    return model, {"x": _rng(5).standard_normal((ROWS, k)).astype(np.float32)}


def matmul_3d_case(seq=5):
    k, n = 64, 48
    model = _model([helper.make_node("MatMul", ["x", "W"], ["y"])],
                   [_value("x", ["n", seq, k])], [_value("y", ["n", seq, n])],
                   [("W", _weights((k, n), 6))])
    return model, {"x": _rng(7).standard_normal((ROWS, seq, k)).astype(np.float32)}


def mlp_case():
    """MatMul+Add+Relu twice: fused to FusedMatMul, small enough for the tiny-layer path
    (which the switch turns off)."""
    k, h, n = 32, 16, 10
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "W2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["y"])]
    weights = [("W1", _weights((k, h), 8)), ("b1", _weights((h,), 9)),
               ("W2", _weights((h, n), 10)), ("b2", _weights((n,), 11))]
    model = _model(nodes, [_value("x", ["n", k])], [_value("y", ["n", n])], weights)
    return model, {"x": _rng(12).standard_normal((ROWS, k)).astype(np.float32)}


def conv_case():
    c, f = 3, 8
    nodes = [helper.make_node("Conv", ["x", "W", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    weights = [("W", _weights((f, c, 3, 3), 13)), ("b", _weights((f,), 14))]
    model = _model(nodes, [_value("x", ["n", c, 12, 12])], [_value("y", ["n", f, 12, 12])],
                   weights)
    return model, {"x": _rng(15).standard_normal((ROWS, c, 12, 12)).astype(np.float32)}


def attention_stacks_case():
    """softmax(Q K^T / sqrt(d)) V on (batch, heads, seq, d) inputs: both products are
    between two computed tensors (attention's stacks)."""
    heads, seq, d = 2, 16, 8
    shape = ["n", heads, seq, d]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["scaled"]),
             helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    scale = np.array(1 / np.sqrt(d), np.float32)
    model = _model(nodes, [_value(name, shape) for name in "qkv"], [_value("y", shape)],
                   [("scale", scale)])
    rng = _rng(16)
    return model, {name: rng.standard_normal((ROWS, heads, seq, d)).astype(np.float32)
                   for name in "qkv"}


def attention_block_case():
    """A self-attention block: constant-weight projections of x (batch, seq, D), heads
    split by Reshape/Transpose, the stacked products, Softmax, heads joined, an output
    projection."""
    heads, seq, d = 2, 16, 16
    dim = heads * d
    nodes = []
    weights = [(f"W{p}", _weights((dim, dim), 17 + i)) for i, p in enumerate("qkvo")]
    weights += [("split", np.array([0, 0, heads, d], np.int64)),
                ("join", np.array([0, 0, dim], np.int64)),
                ("scale", np.array(1 / np.sqrt(d), np.float32))]
    for p in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"W{p}"], [f"{p}_flat"]),
                  helper.make_node("Reshape", [f"{p}_flat", "split"], [f"{p}_heads"])]
    nodes += [helper.make_node("Transpose", ["q_heads"], ["q"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k_heads"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v_heads"], ["v"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["scaled"]),
              helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o_heads"]),
              helper.make_node("Transpose", ["o_heads"], ["o_seq"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o_seq", "join"], ["o"]),
              helper.make_node("MatMul", ["o", "Wo"], ["y"])]
    model = _model(nodes, [_value("x", ["n", seq, dim])], [_value("y", ["n", seq, dim])],
                   weights)
    return model, {"x": _rng(21).standard_normal((ROWS, seq, dim)).astype(np.float32)}


def layer_norm_output_case():
    """A LayerNormalization writing the graph's output, 64 KiB a row: one row fits the size
    up to which a graph output gets an arena slot (its kernel then writes into ``out=``),
    two do not. The kernel without ``out=`` took NumPy's passes until 2026-12-01 (a BERT
    encoder's last layer: 4.8e-7 apart); it makes its output and takes the compiled loop
    now, so its rows are the same bits with or without the switch."""
    seq, dim = 64, 256
    nodes = [helper.make_node("Add", ["x", "shift"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "scale", "bias"], ["y"],
                              axis=-1, epsilon=1e-12)]
    weights = [("shift", _weights((dim,), 22)), ("scale", _weights((dim,), 23) + 1),
               ("bias", _weights((dim,), 24))]
    model = _model(nodes, [_value("x", ["n", seq, dim])], [_value("y", ["n", seq, dim])],
                   weights)
    return model, {"x": (_rng(25).standard_normal((ROWS, seq, dim)) * 3).astype(np.float32)}


CASES = {
    **{f"gemm_{k}x{n}_transB{t}": (gemm_case, (k, n, t))
       for k, n in ((64, 10), (256, 256), (2048, 1000)) for t in (0, 1)},
    "matmul_2d": (matmul_2d_case, ()),
    "matmul_3d": (matmul_3d_case, ()),
    "matmul_3d_seq1": (matmul_3d_case, (1,)),
    "mlp": (mlp_case, ()),
    "conv": (conv_case, ()),
    "attention_stacks": (attention_stacks_case, ()),
    "attention_block": (attention_block_case, ()),
    "layer_norm_output": (layer_norm_output_case, ()),
}


def row_mismatches(model: bytes, feeds: dict) -> list:
    """(joined rows, row, output) for each row whose bytes differ joined from alone."""
    session = mixrt.load(model)
    alone = [session.run(None, {name: a[i:i + 1] for name, a in feeds.items()})
             for i in range(ROWS)]
    mismatches = []
    for count in JOINED:
        joined = session.run(None, {name: a[:count] for name, a in feeds.items()})
        for i in range(count):
            for index, (together, single) in enumerate(zip(joined, alone[i])):
                assert together[i].shape == single[0].shape
                if np.ascontiguousarray(together[i]).tobytes() \
                        != np.ascontiguousarray(single[0]).tobytes():
                    mismatches.append((count, i, index))
    return mismatches


@needs_panels
@pytest.mark.parametrize("case", list(CASES))
def test_rows_are_the_same_bits_alone_and_joined(invariant, case):
    build, args = CASES[case]
    model, feeds = build(*args)
    assert row_mismatches(model, feeds) == []


@needs_panels
def test_outputs_are_still_right_under_the_switch(invariant):
    """The invariant forms compute the same products (to float32 rounding)."""
    model, feeds = gemm_case(64, 10, 1)
    w = numpy_helper.to_array(onnx.load_from_string(model).graph.initializer[0])
    b = numpy_helper.to_array(onnx.load_from_string(model).graph.initializer[1])
    (y,) = mixrt.load(model).run(None, feeds)
    np.testing.assert_allclose(y, feeds["x"] @ w.T + b, rtol=1e-5, atol=1e-5)
    model, feeds = attention_stacks_case()
    (y,) = mixrt.load(model).run(None, feeds)
    q, k, v = feeds["q"], feeds["k"], feeds["v"]
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(y, p @ v, rtol=1e-5, atol=1e-5)


@needs_panels
@pytest.mark.parametrize("case", ["gemm_64x10_transB0", "matmul_2d"])
def test_without_the_switch_small_products_differ(monkeypatch, case):
    """The test above can fail: without the switch a small product's one row takes another
    kernel than several rows do, and the bits differ (seen on an AVX-512 machine)."""
    monkeypatch.delenv("MIXRT_BATCH_INVARIANT", raising=False)
    build, args = CASES[case]
    model, feeds = build(*args)
    assert row_mismatches(model, feeds) != []


@needs_panels
def test_a_layer_norm_graph_output_is_the_same_bits_without_the_switch(monkeypatch):
    """Without ``out=`` (an output past the arena's slots) the kernel makes its output and
    takes the same compiled loop as with one, so a row's bits do not depend on how many
    rows came (nor on the kernel's choice of where to write)."""
    monkeypatch.delenv("MIXRT_BATCH_INVARIANT", raising=False)
    model, feeds = layer_norm_output_case()
    assert row_mismatches(model, feeds) == []


def test_a_small_softmax_row_has_the_same_bits_wherever_its_arrays_lie():
    """The compiled softmax of short rows (a classifier's scores) summed each row in the
    loop that stored it: LLVM then chose its vector or its scalar loop at run time by
    whether the input and output arrays overlapped, and the two sum in other orders, so a
    row alone and the same row in a batch (other addresses) could differ in the last bit
    (41 of 1,600 rows here before the sum got a loop of its own)."""
    if not jit_cpu.enabled():
        pytest.skip("the compiled kernels are off")
    kernel = jit_cpu.load(row_kernels.ROW_KERNELS).softmax_small
    rng = np.random.default_rng(0)
    for _ in range(200):
        width = int(rng.integers(2, 60))
        x = (rng.standard_normal((8, width)) * 5).astype(np.float32)
        joined = np.empty_like(x)
        kernel(x.reshape(-1), joined.reshape(-1), 8, width)
        in_place = x.copy()
        kernel(in_place.reshape(-1), in_place.reshape(-1), 8, width)
        assert in_place.tobytes() == joined.tobytes()
        for row in range(8):
            alone, source = np.empty((1, width), np.float32), x[row:row + 1].copy()
            kernel(source.reshape(-1), alone.reshape(-1), 1, width)
            assert alone.tobytes() == joined[row:row + 1].tobytes(), (width, row)
