"""The in-place CPU fast paths of LRN, MaxPool and AveragePool equal the generic kernels
whether ``out`` is absent, disjoint from X, X itself (LRN) or X's buffer reinterpreted with
the smaller output shape (pooling), and a planned session really places them over their input.

Blocks and plane groups are shrunk (BLOCK_BYTES) so that small tensors cross several of them:
the rolling LRN window and the group-by-group pooling are what an in-place run depends on.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.ops.pool import inplace_cpu
from mixrt.ops.pool.inplace_cpu import average_pool_cpu, lrn_cpu, max_pool_cpu
from mixrt.ops.nn.norm import lrn
from mixrt.ops.pool.pool import average_pool, max_pool
from mixrt.ops.ir.registry import REGISTRY

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True, params=["1", "0"], ids=["jit", "numpy"])
def jit_mode(request, monkeypatch):
    """2-D pooling runs the compiled loop of ops/compiled/jit_cpu.py when numba is there; with
    MIXRT_JIT=0 it takes the NumPy paths below, which must stay right too."""
    monkeypatch.setenv("MIXRT_JIT", request.param)
    return request.param


@pytest.fixture(params=[1 << 30, 3 * 1024, 1], ids=["one-block", "small-blocks", "one-plane"])
def block_bytes(request, monkeypatch):
    monkeypatch.setattr(inplace_cpu, "BLOCK_BYTES", request.param)
    monkeypatch.setattr(inplace_cpu, "SEPARABLE_BLOCK_BYTES", request.param)
    return request.param


def _prefix_view(buffer, shape):
    """``buffer``'s memory from its first byte, reshaped to ``shape`` (what the planner hands
    a kernel whose output starts at its input's offset)."""
    return buffer.reshape(-1)[:int(np.prod(shape))].reshape(shape)


def _runs(fast, generic, X, attrs, alias):
    """(expected, [results]) for out=None, a disjoint out, and an ``alias``ed out."""
    expected = generic(np, X, **attrs)
    results = [fast(np, X.copy(), **attrs)]
    out = np.full_like(expected, np.nan)
    assert fast(np, X, **attrs, out=out) is out
    results.append(out)
    buffer = X.copy()
    aliased = alias(buffer, expected.shape)
    assert fast(np, buffer, **attrs, out=aliased) is aliased
    results.append(aliased)
    return expected, results


# -- LRN -----------------------------------------------------------------------------------------

LRN_CASES = [
    ((2, 13, 7, 9), dict(size=5, alpha=1e-3, beta=0.75, bias=1.5)),
    ((1, 96, 6, 6), dict(size=5, alpha=1e-4, beta=0.75, bias=1.0)),
    ((3, 4, 5), dict(size=3, alpha=0.5, beta=0.5, bias=2.0)),
    ((1, 6, 4, 4), dict(size=6, alpha=2e-2, beta=1.0, bias=1.0)),
    ((2, 3, 3, 3), dict(size=9, alpha=1e-2, beta=2.0, bias=0.5)),
    ((1, 7), dict(size=2, alpha=1e-1, beta=0.3, bias=1.0)),
    ((1, 5, 2, 3, 2), dict(size=1, alpha=1.0, beta=0.75, bias=3)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,attrs", LRN_CASES)
def test_lrn_matches_generic_in_every_placement(shape, attrs, dtype, block_bytes):
    X = RNG.standard_normal(shape).astype(dtype) * 3
    expected, results = _runs(lrn_cpu, lrn, X, attrs, lambda buffer, _: buffer)
    for result in results:
        np.testing.assert_allclose(result, expected, rtol=1e-6 if dtype == np.float32
                                   else 1e-13, atol=0)


def test_lrn_with_numpy_scalar_attributes_runs_the_generic_kernel():
    X = RNG.standard_normal((1, 8, 3, 3)).astype(np.float32)
    attrs = dict(size=3, alpha=np.float64(1e-2), beta=0.75, bias=1.0)
    out = np.empty_like(X)
    lrn_cpu(np, X, **attrs, out=out)
    np.testing.assert_array_equal(out, lrn(np, X, **attrs))


def test_lrn_out_overlapping_x_elsewhere_is_still_right():
    buffer = RNG.standard_normal(2 * 4 * 3 * 3 + 5).astype(np.float32)
    X = buffer[:72].reshape(2, 4, 3, 3)
    expected = lrn(np, X.copy(), size=3)
    out = buffer[5:77].reshape(2, 4, 3, 3)  # starts five elements in: no in-place guarantee
    lrn_cpu(np, X, size=3, out=out)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_lrn_narrow_float_falls_back_and_copies():
    X = RNG.standard_normal((1, 6, 4, 4)).astype(np.float16)
    out = np.empty_like(X)
    assert lrn_cpu(np, X, size=3, out=out) is out
    np.testing.assert_array_equal(out, lrn(np, X, size=3))


# -- pooling ---------------------------------------------------------------------------------------

POOL_CASES = [
    ((1, 6, 11, 11), dict(kernel_shape=[3, 3], strides=[2, 2])),  # AlexNet pool1
    ((1, 5, 13, 13), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    ((2, 3, 9, 8), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),  # same size
    ((1, 4, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((2, 3, 10, 7), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 2, 1],
                         ceil_mode=1)),
    ((1, 3, 9, 9), dict(kernel_shape=[2, 3], dilations=[2, 2], strides=[1, 2])),
    ((1, 2, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 7, 6), dict(kernel_shape=[4, 2], strides=[3, 1], auto_pad="SAME_LOWER")),
    ((1, 2, 5, 5), dict(kernel_shape=[3, 3], strides=[3, 3], ceil_mode=1)),
    ((1, 3, 12), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),  # 1-D
    ((1, 2, 5, 6, 4), dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[0, 1, 0, 1, 0, 1])),
    ((1, 4, 7, 7), dict(kernel_shape=[7, 7])),  # global-like
    ((1, 2, 3, 3), dict(kernel_shape=[1, 1])),
]


def _random_pool_case(rng):
    nd = int(rng.integers(1, 4))
    kernel = [int(k) for k in rng.integers(1, 4, nd)]
    dilations = [int(d) for d in rng.integers(1, 3, nd)]
    strides = [int(s) for s in rng.integers(1, 4, nd)]
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    pads = [int(rng.integers(0, k)) for k in kernel * 2]
    in_dims = [int(s + rng.integers(0, 6)) for s in span]
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 6)), *in_dims)
    return shape, dict(kernel_shape=kernel, strides=strides, dilations=dilations, pads=pads,
                       ceil_mode=int(rng.integers(0, 2)))


RANDOM_POOL_CASES = [_random_pool_case(np.random.default_rng(seed)) for seed in range(24)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,attrs", POOL_CASES + RANDOM_POOL_CASES)
def test_max_pool_matches_generic_in_every_placement(shape, attrs, dtype, block_bytes):
    X = RNG.standard_normal(shape).astype(dtype)
    expected, results = _runs(max_pool_cpu, max_pool, X, attrs, _prefix_view)
    for result in results:
        np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("shape,attrs", POOL_CASES + RANDOM_POOL_CASES)
def test_average_pool_matches_generic_in_every_placement(shape, attrs, include_pad,
                                                         block_bytes):
    X = RNG.standard_normal(shape).astype(np.float32)
    attrs = dict(attrs, count_include_pad=include_pad)
    expected, results = _runs(average_pool_cpu, average_pool, X, attrs, _prefix_view)
    for result in results:  # 2-D sums run columns then rows: last-bit differences near zero
        np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-6)


def test_max_pool_keeps_nan_and_infinities():
    X = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    X[0, 0, 1, 1], X[0, 1, 4, 4], X[0, 1, 0, 0] = np.nan, -np.inf, np.inf
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    expected, results = _runs(max_pool_cpu, max_pool, X, attrs, _prefix_view)
    for result in results:
        np.testing.assert_array_equal(result, expected)


def test_max_pool_with_indices_returns_the_generic_pair():
    X = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2], _outputs=2)
    values, indices = max_pool_cpu(np, X, **attrs, out=np.empty((1, 3, 3, 3), np.float32))
    expected_values, expected_indices = max_pool(np, X, **attrs)
    np.testing.assert_array_equal(values, expected_values)
    np.testing.assert_array_equal(indices, expected_indices)


@pytest.mark.parametrize("dtype", [np.float16, np.int8])
def test_max_pool_other_dtypes_fall_back_and_copy(dtype):
    X = (RNG.standard_normal((1, 2, 5, 5)) * 20).astype(dtype)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2])
    out = np.empty((1, 2, 2, 2), dtype)
    assert max_pool_cpu(np, X, **attrs, out=out) is out
    np.testing.assert_array_equal(out, max_pool(np, X, **attrs))


def test_pool_out_overlapping_x_past_its_start_is_still_right():
    buffer = RNG.standard_normal(200).astype(np.float32)
    X = buffer[:2 * 3 * 5 * 5].reshape(2, 3, 5, 5)
    attrs = dict(kernel_shape=[2, 2])
    expected = max_pool(np, X.copy(), **attrs)
    out = buffer[7:7 + expected.size].reshape(expected.shape)
    max_pool_cpu(np, X, **attrs, out=out)
    np.testing.assert_array_equal(out, expected)


def test_pool_on_a_strided_input():
    X = RNG.standard_normal((2, 6, 9, 9)).astype(np.float32)[:, ::2, :, ::-1]
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    out = np.empty((2, 3, 5, 5), np.float32)
    max_pool_cpu(np, X, **attrs, out=out)
    np.testing.assert_array_equal(out, max_pool(np, X, **attrs))


# -- wiring ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("op_type,fast", [("LRN", lrn_cpu), ("MaxPool", max_pool_cpu),
                                          ("AveragePool", average_pool_cpu)])
def test_fast_paths_serve_every_opset(op_type, fast):
    for kernel in REGISTRY.versions("", op_type):
        assert kernel.for_device("cpu") is fast


def _relu_lrn_pool_model():
    """Relu -> LRN -> MaxPool -> Relu: LRN and MaxPool both read tensors they are last to."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("LRN", ["a"], ["b"], size=5, alpha=1e-2, beta=0.75, bias=1.0),
        helper.make_node("MaxPool", ["b"], ["c"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "lrn_pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 12, 11, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12, 5, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_planned_session_runs_lrn_and_max_pool_over_their_inputs(monkeypatch):
    monkeypatch.setattr(inplace_cpu, "BLOCK_BYTES", 1024)
    session = mixrt.Session(_relu_lrn_pool_model(), opt_level=0, strategy="inplace")
    for seed in range(3):  # the first run discovers, the later ones use the arena
        x = np.random.default_rng(seed).standard_normal((2, 12, 11, 11)).astype(np.float32)
        pooled = max_pool(np, lrn(np, np.maximum(x, 0), size=5, alpha=1e-2),
                          kernel_shape=[3, 3], strides=[2, 2])
        (y,) = session.run(None, {"x": x})
        np.testing.assert_allclose(y, np.maximum(pooled, 0), rtol=1e-6, atol=0)
    plan = session.memory_plan({"x": x})
    assert {("a", "b"), ("b", "c")} <= set(plan.inplace)
    assert plan.offsets["a"] == plan.offsets["b"] == plan.offsets["c"]
