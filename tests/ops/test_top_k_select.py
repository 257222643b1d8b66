"""TopK of k entries of a long axis by selection (ops/shape/top_k_select.py): the same
indices, in the same order, as the stable sort of the whole axis, whatever the ties, signed
zeros, NaN, dtype and axis; and as onnxruntime's."""

from __future__ import annotations

import zlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.ops.shape import index, top_k_select


def _by_sorting(x, k, axis, largest):
    indices = index._sorted_top_k(np, x, k, axis, largest)
    return np.take_along_axis(x, indices, axis=axis), indices


def _case(generator, dtype, ties: bool):
    shape = [int(generator.integers(1, 4)), int(generator.integers(64, 260))]
    if generator.random() < 0.3:
        shape.insert(0, 2)
    if np.dtype(dtype).kind in "iub":
        high = 2 if dtype == np.bool_ else (4 if ties else 100)
        return generator.integers(0, high, size=shape).astype(dtype)
    x = generator.standard_normal(shape).astype(dtype)
    if ties:
        x = np.round(x * 2).astype(dtype)
    flat = x.reshape(-1)
    for special in (np.nan, -np.nan, -0.0, 0.0, np.inf, -np.inf):
        flat[generator.integers(0, flat.size, 2)] = special
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int32,
                                   np.uint8, np.int8, np.uint64, np.bool_])
@pytest.mark.parametrize("ties", [False, True])
def test_selection_gives_the_sorted_indices(dtype, ties):
    generator = np.random.default_rng(zlib.crc32(f"{np.dtype(dtype).str} {ties}".encode()))
    for _ in range(12):
        x = _case(generator, dtype, ties)
        axis = int(generator.integers(0, x.ndim))
        if x.shape[axis] < top_k_select.SELECT_FROM_LENGTH:
            axis = x.ndim - 1
        k = int(generator.integers(1, x.shape[axis] // top_k_select.SELECT_MOST_SHARE + 1))
        for largest in (0, 1):
            assert top_k_select.suits(np.moveaxis(x, axis, -1), k)
            values, indices = index._top_k(np, x, k, axis, largest)
            expected_values, expected = _by_sorting(x, k, axis, largest)
            np.testing.assert_array_equal(indices, expected)
            assert indices.dtype == np.int64
            np.testing.assert_array_equal(values.view(np.uint8), expected_values.view(np.uint8))


def test_short_axes_large_k_and_other_floats_keep_the_sort():
    import ml_dtypes
    assert not top_k_select.suits(np.zeros((3, 63), np.float32), 2)
    assert not top_k_select.suits(np.zeros((3, 100), np.float32), 26)
    assert not top_k_select.suits(np.zeros((3, 100), ml_dtypes.bfloat16), 2)
    assert not top_k_select.suits(np.zeros((0, 100), np.float32), 2)


@pytest.mark.parametrize("largest", [0, 1])
def test_a_long_axis_matches_onnxruntime(largest):
    x = np.round(np.random.default_rng(7).standard_normal((6, 500)) * 3).astype(np.float32)
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1,
                            largest=largest)
    graph = helper.make_graph(
        [node], "top_k", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 500])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, [6, 7]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, [6, 7])],
        [helper.make_tensor("k", TensorProto.INT64, [1], [7])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    ours = mixrt.Session(data).run(None, {"x": x})
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])
