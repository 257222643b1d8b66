"""CumSum's CPU form (ops/reduce/reduce_cpu.py): a forward, inclusive scan in the input's own
dtype is one np.cumsum into the plan's view, with the generic scan's bits; the other scans
take the generic kernel. A RoBERTa-style position numbering (the mask's CumSum) runs bound
and gives the same numbers as NumPy's."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.reduce.reduce import cum_sum
from mixrt.ops.reduce.reduce_cpu import bind_cum_sum, cum_sum_cpu
from test_bound_calls import _bound_ops

RNG = np.random.default_rng(5)


def _values(shape, dtype):
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    return RNG.integers(-50, 50, shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.int64, np.float32, np.float64])
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_the_plain_scan_gives_the_generic_kernels_bits(dtype, axis):
    """Narrow integers wrap around as the generic scan's (summed in their own type)."""
    x = _values((3, 5, 7), dtype) * (9 if np.dtype(dtype).kind in "iu" else 1)
    out = np.empty_like(x)
    got = cum_sum_cpu(np, x, np.array(axis), out=out)
    assert got is out
    np.testing.assert_array_equal(got, cum_sum(np, x, np.array(axis)))


@pytest.mark.parametrize("exclusive, reverse", [(1, 0), (0, 1), (1, 1)])
def test_other_scans_and_dtypes_take_the_generic_kernel(exclusive, reverse):
    x = _values((4, 6), np.int64)
    out = np.empty_like(x)
    got = cum_sum_cpu(np, x, np.array(1), exclusive=exclusive, reverse=reverse, out=out)
    np.testing.assert_array_equal(got, cum_sum(np, x, np.array(1), exclusive=exclusive,
                                               reverse=reverse))
    half = RNG.standard_normal((4, 6)).astype(np.float16)  # summed wider than it is stored
    got = cum_sum_cpu(np, half, np.array(1), out=np.empty_like(half))
    np.testing.assert_array_equal(got, cum_sum(np, half, np.array(1)))
    assert bind_cum_sum([half, np.array(1)], np.empty_like(half), {}) is None
    assert bind_cum_sum([x, np.array(1)], np.empty_like(x), {"reverse": 1}) is None


def test_a_bound_scan_with_another_axis_takes_the_kernel():
    x = _values((4, 6), np.int32)
    out = np.empty_like(x)
    call = bind_cum_sum([x, np.array(1)], out, {})
    np.testing.assert_array_equal(call(x, np.array(1)), np.cumsum(x, axis=1))
    np.testing.assert_array_equal(call(x, np.array(0)), np.cumsum(x, axis=0))


def _positions_model():
    """RoBERTa's position ids: (ids != pad) as int32, its CumSum over the tokens, times the
    mask again, plus the pad index, as int64."""
    nodes = [helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
             helper.make_node("Not", ["is_pad"], ["kept"]),
             helper.make_node("Cast", ["kept"], ["mask"], to=TensorProto.INT32),
             helper.make_node("CumSum", ["mask", "axis"], ["running"]),
             helper.make_node("Mul", ["running", "mask"], ["numbered"]),
             helper.make_node("Cast", ["numbered"], ["wide"], to=TensorProto.INT64),
             helper.make_node("Add", ["wide", "pad"], ["positions"])]
    graph = helper.make_graph(
        nodes, "positions",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "length"])],
        [helper.make_tensor_value_info("positions", TensorProto.INT64, ["batch", "length"])],
        [numpy_helper.from_array(np.array(1, np.int64), "pad"),
         numpy_helper.from_array(np.array(1, np.int64), "axis")])
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


def test_positions_run_bound_with_numpys_numbers():
    session = mixrt.Session(_positions_model())
    for length in (9, 23, 9, 9, 23):  # each length's third run is bound
        ids = RNG.integers(0, 6, (3, length))
        mask = (ids != 1).astype(np.int64)
        (got,) = session.run(None, {"ids": ids})
        np.testing.assert_array_equal(got, np.cumsum(mask, axis=1) * mask + 1)
    assert "CumSum" in _bound_ops(session)
