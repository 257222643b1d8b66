"""Bound calls of a ShuffleNet's and a squeeze-excite block's small steps: Slice, Concat,
the global pools and ReduceMean over trailing axes (ops/shape/shape_cpu.py,
ops/pool/inplace_cpu.py, ops/reduce/reduce_cpu.py). Bound runs give the kernels' bits; a
Slice whose numbers a graph computes anew each run, or a ReduceMean over other axes, takes
its kernel and is still right."""

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.reduce.reduce_cpu import reduce_mean_axes_input_cpu, reduce_mean_cpu
from mixrt.ops.shape.shape_cpu import bind_slice
from mixrt.runtime import run_loop
from test_bound_calls import _bound_ops

RNG = np.random.default_rng(7)


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _channel_split_block(opset=17):
    """x (1, 8, 5, 5): Relu, its channel halves by Slice, one half through a Sigmoid,
    joined again by Concat; a GlobalAveragePool and a GlobalMaxPool of that, and a
    ReduceMean over its planes."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", ["r", "zero", "four", "one"], ["low"]),
             helper.make_node("Slice", ["r", "four", "eight", "one"], ["high"]),
             helper.make_node("Sigmoid", ["high"], ["gate"]),
             helper.make_node("Concat", ["gate", "low"], ["joined"], axis=1),
             helper.make_node("GlobalAveragePool", ["joined"], ["gap"]),
             helper.make_node("GlobalMaxPool", ["joined"], ["gmp"]),
             helper.make_node("Add", ["gap", "gmp"], ["pooled"])]
    if opset >= 18:
        nodes.append(helper.make_node("ReduceMean", ["joined", "planes"], ["mean"],
                                      keepdims=0))
    else:
        nodes.append(helper.make_node("ReduceMean", ["joined"], ["mean"], axes=[2, 3],
                                      keepdims=0))
    graph = helper.make_graph(
        nodes, "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 5])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 8, 1, 1]),
         helper.make_tensor_value_info("mean", TensorProto.FLOAT, [1, 8])],
        [_ints("zero", [0]), _ints("four", [4]), _ints("eight", [8]), _ints("one", [1]),
         _ints("planes", [2, 3])])
    return helper.make_model(graph, ir_version=9,
                             opset_imports=[helper.make_opsetid("", opset)])


def _feeds(seed):
    return {"x": np.random.default_rng(seed).standard_normal((1, 8, 5, 5)).astype(np.float32)}


def _reference(feeds):
    r = np.maximum(feeds["x"], 0)
    joined = np.concatenate([1 / (1 + np.exp(-r[:, 4:])), r[:, :4]], axis=1)
    pooled = joined.mean(axis=(2, 3), keepdims=True) + joined.max(axis=(2, 3), keepdims=True)
    return pooled, joined.mean(axis=(2, 3))


@pytest.mark.parametrize("opset", [17, 18])
def test_bound_runs_give_the_kernels_bits(monkeypatch, opset):
    session = mixrt.Session(_channel_split_block(opset))
    session.run(None, _feeds(0))
    assert session.wait_compiled(timeout=300)  # the global pools bind the compiled pass
    for seed in range(4):  # the first run binds, the later ones run bound
        monkeypatch.setattr(run_loop, "BIND", False)
        expected = session.run(None, _feeds(seed))
        monkeypatch.setattr(run_loop, "BIND", True)
        got = session.run(None, _feeds(seed))
        for mine, theirs, reference in zip(got, expected, _reference(_feeds(seed))):
            np.testing.assert_array_equal(mine, theirs)
            np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-6)
    bound = _bound_ops(session)
    assert {"Slice", "Concat", "GlobalAveragePool", "GlobalMaxPool", "ReduceMean"} <= bound, \
        bound


def test_a_bound_slice_whose_numbers_change_takes_its_kernel():
    """Numbers a graph computes (not constants) are read again on each call: other ones
    slice as the kernel does, not as the bind did."""
    data = RNG.standard_normal((1, 8, 5, 5)).astype(np.float32)
    out = np.empty((1, 4, 5, 5), np.float32)
    numbers = [np.array([0]), np.array([4]), np.array([1])]
    call = bind_slice([data] + numbers, out, {})
    np.testing.assert_array_equal(call(data, *numbers), data[:, :4])
    numbers[0][...], numbers[1][...] = 4, 8  # the same shape, other channels
    np.testing.assert_array_equal(call(data, *numbers), data[:, 4:])


@pytest.mark.parametrize("shape, axes, keepdims", [
    ((2, 3, 4, 5), [2, 3], 1), ((2, 3, 4, 5), [-1, -2], 0), ((2, 3, 4, 5), [1, 2, 3], 0),
    ((2, 3, 4, 5), [3], 1), ((6, 7), [1], 0),
    ((2, 3, 4, 5), [1, 2], 1),  # not the trailing axes: the generic kernel
    ((2, 3, 4, 5), [0, 1, 2, 3], 0),  # every axis: the generic kernel
    ((2, 3, 0, 5), [2, 3], 1),  # empty planes: the generic kernel (NaN)
])
def test_reduce_mean_over_trailing_axes_agrees_with_numpy(shape, axes, keepdims):
    data = RNG.standard_normal(shape).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's "mean of empty slice"
        expected = np.mean(data, axis=tuple(axes), keepdims=bool(keepdims))
        by_attribute = reduce_mean_cpu(np, data, axes=axes, keepdims=keepdims)
        by_input = reduce_mean_axes_input_cpu(np, data, np.array(axes, np.int64),
                                              keepdims=keepdims)
    for got in (by_attribute, by_input):
        assert got.shape == expected.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    out = np.empty(expected.shape, np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        assert reduce_mean_cpu(np, data, axes=axes, keepdims=keepdims, out=out) is out
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
