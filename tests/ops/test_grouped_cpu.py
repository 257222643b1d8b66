"""Grouped 1x1 convolutions on the native workers (ops/conv/grouped_cpu.py): the same values as
the generic kernel for every group count, batch, dtype and epilogue, NaN passed on, the
fallback where no BLAS is found, and a ShuffleNet-shaped block through a Session against
onnxruntime."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import conv_direct_cpu, grouped_cpu
from mixrt.ops.conv.conv import conv
from mixrt.ops.conv.conv_cpu import direct
from mixrt.ops.nn.fused import activate

RNG = np.random.default_rng(11)
pytestmark = pytest.mark.skipif(
    jit_cpu.native_pool() is None or grouped_cpu._blas() is None,
    reason="needs the native pool (numba, AVX-512, Linux x86-64, 2 threads) and a CBLAS")

CASES = [  # (C, M, size, group, batch)
    (272, 272, 14, 4, 1),  # ShuffleNet's stage-2 layer
    (24, 112, 9, 4, 2),  # more outputs than inputs per group, two images
    (30, 12, 5, 3, 2),  # three groups: the two threads take unequal shares
    (16, 16, 7, 8, 1),  # two channels a group
    (6, 10, 3, 2, 1),
]
ACTIVATIONS = [("", ()), ("Relu", ()), ("LeakyRelu", (0.1,)), ("Clip", (-0.5, 0.75))]


def _attributes(group):
    return dict(auto_pad="NOTSET", dilations=None, group=group, kernel_shape=[1, 1],
                pads=None, strides=None)


def _expected(X, W, B, Z, activation, group):
    """The generic kernels: Conv, then Add, then the activation's own op."""
    y = conv(np, X, W, B, group=group)
    return activate(np, y if Z is None else y + Z, activation[0], list(activation[1]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=lambda a: a[0] or "none")
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"c{c[0]}m{c[1]}s{c[2]}g{c[3]}n{c[4]}")
def test_the_groups_on_two_threads_match_the_generic_kernel(case, residual, activation, dtype):
    c, m, size, group, batch = case
    X = RNG.standard_normal((batch, c, size, size)).astype(dtype)
    W = RNG.standard_normal((m, c // group, 1, 1)).astype(dtype)
    B = RNG.standard_normal(m).astype(dtype)
    Z = RNG.standard_normal((batch, m, size, size)).astype(dtype) if residual else None
    limits = conv_direct_cpu.activation_limits(*activation)
    got = direct(X, W, B, Z, limits, _attributes(group), None, {})
    assert got is not None, "the grouped path did not take this convolution"
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, _expected(X, W, B, Z, activation, group),
                               rtol=tolerance, atol=tolerance)


def test_nan_and_infinity_pass_through_the_epilogue():
    X = RNG.standard_normal((1, 8, 4, 4)).astype(np.float32)
    X[0, 0, 1, 1] = np.nan  # group 0's outputs at (1, 1)
    X[0, 5, 2, 2] = np.inf  # group 1's
    W = np.abs(RNG.standard_normal((6, 4, 1, 1))).astype(np.float32)
    got = direct(X, W, None, None, conv_direct_cpu.activation_limits("Relu", ()),
                 _attributes(2), None, {})
    assert np.isnan(got[0, :3, 1, 1]).all() and not np.isnan(got[0, 3:, 1, 1]).any()
    assert np.isinf(got[0, 3:, 2, 2]).all()


def test_without_a_blas_the_batched_matmul_remains(monkeypatch):
    monkeypatch.setattr(grouped_cpu, "_blas", lambda: None)
    X = RNG.standard_normal((1, 8, 5, 5)).astype(np.float32)
    W = RNG.standard_normal((8, 4, 1, 1)).astype(np.float32)
    assert direct(X, W, None, None, conv_direct_cpu.NO_ACTIVATION, _attributes(2), None,
                  {}) is None


@pytest.mark.parametrize("why", ["strided", "padded", "3x3", "ungrouped", "aliased"])
def test_what_it_does_not_take(why):
    X = RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)
    W = RNG.standard_normal((8, 4, 1, 1)).astype(np.float32)
    attributes = _attributes(2)
    out = None
    if why == "strided":
        attributes["strides"] = [2, 2]
    elif why == "padded":
        attributes["pads"] = [1, 1, 1, 1]
    elif why == "3x3":
        W = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
        attributes["kernel_shape"] = [3, 3]
    elif why == "ungrouped":
        W, attributes["group"] = RNG.standard_normal((8, 8, 1, 1)).astype(np.float32), 1
    else:
        out = X  # the output over the input
    from mixrt.ops.conv.conv_cpu import geometry  # noqa: PLC0415
    found = geometry({}, X, W, **attributes)
    assert not grouped_cpu.suits(X, W, attributes["group"], found, out, None)


def test_a_shufflenet_block_through_a_session_matches_onnxruntime(monkeypatch):
    """Grouped 1x1 (Relu), channel shuffle, depthwise 3x3, grouped 1x1, residual Add, Relu:
    mixrt's passes fuse the activations and the residual into the grouped convolutions."""
    c, g = 48, 4
    weights = {
        "w1": RNG.standard_normal((c, c // g, 1, 1)).astype(np.float32) * 0.2,
        "b1": RNG.standard_normal(c).astype(np.float32),
        "wd": RNG.standard_normal((c, 1, 3, 3)).astype(np.float32) * 0.3,
        "w2": RNG.standard_normal((c, c // g, 1, 1)).astype(np.float32) * 0.2,
        "b2": RNG.standard_normal(c).astype(np.float32),
        "shape5": np.array([1, g, c // g, 14, 14], np.int64),
        "shape4": np.array([1, c, 14, 14], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], group=g),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Reshape", ["r1", "shape5"], ["s1"]),
        helper.make_node("Transpose", ["s1"], ["t1"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t1", "shape4"], ["s2"]),
        helper.make_node("Conv", ["s2", "wd"], ["d"], group=c, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d", "w2", "b2"], ["c2"], group=g),
        helper.make_node("Add", ["c2", "x"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "shuffle_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 14, 14])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    data = model.SerializeToString()
    x = RNG.standard_normal((1, c, 14, 14)).astype(np.float32)
    reference = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    calls = []
    real = grouped_cpu.conv
    monkeypatch.setattr(grouped_cpu, "conv", lambda *a: calls.append(a[3] is not None)
                        or real(*a))
    session = mixrt.Session(data, opt_level=2)
    assert [n.op_type for n in session.graph.nodes].count("FusedConv") >= 2
    for _ in range(3):  # the discovery run, then planned ones
        np.testing.assert_allclose(session.run(None, {"x": x})[0], reference, rtol=1e-4,
                                   atol=1e-4)
    assert True in calls and False in calls  # with the residual fused, and without
