"""Shape, layout and index kernels: edge cases and opset versions the ONNX node tests miss,
checked against onnxruntime, plus their plan-time inference."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import mixrt
from mixrt.ops.shape import index, shape
from mixrt.ops.ir.types import TensorType

RNG = np.random.default_rng(0)


def _model(op_type, inputs, attrs, opset, n_outputs):
    names = [name for name, _ in inputs]
    outputs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outputs, **attrs)
    graph_inputs = [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
        for name, value in inputs if name]
    graph_outputs = [helper.make_empty_tensor_value_info(n) for n in outputs]
    graph = helper.make_graph([node], "g", graph_inputs, graph_outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def run_both(op_type, inputs, opset=21, n_outputs=1, rtol=0, **attrs):
    """Run one node on mixrt and onnxruntime; ``inputs`` is a list of (name, array), with
    name '' for a skipped optional input."""
    model = _model(op_type, inputs, attrs, opset, n_outputs)
    feeds = {name: value for name, value in inputs if name}
    ours = mixrt.Session(model).run(None, feeds)
    reference = ort.InferenceSession(model.SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, want in zip(ours, reference):
        assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
        np.testing.assert_allclose(got, want, rtol=rtol)
    return ours


def i64(*values):
    return np.array(values, dtype=np.int64)


X345 = RNG.standard_normal((3, 4, 5)).astype(np.float32)


# -- shape.py -----------------------------------------------------------------------------

@pytest.mark.parametrize("attr, value", [
    ("value_float", 1.5), ("value_floats", [1.0, 2.0]), ("value_int", 7),
    ("value_ints", [1, 2, 3])])
def test_constant_value_attributes(attr, value):
    run_both("Constant", [], **{attr: value})


def test_constant_strings_and_infer():
    (out,) = mixrt.Session(_model("Constant", [], {"value_strings": ["a", "b"]}, 21, 1)) \
        .run(None, {})
    assert out.tolist() == ["a", "b"]
    (t,) = shape.constant.kernels[0].infer_fn(value_ints=[4, 5])
    assert t.dtype == np.int64 and t.shape == (2,) and t.value.tolist() == [4, 5]


def test_reshape_versions():
    run_both("Reshape", [("x", X345), ("s", i64(0, -1))], opset=13)
    run_both("Reshape", [("x", np.zeros((0, 3), np.float32)), ("s", i64(3, 0))], opset=14,
             allowzero=1)
    # Reshape-1 took the shape as an attribute.
    (out,) = mixrt.Session(_model("Reshape", [("x", X345)], {"shape": [5, -1]}, 1, 1)) \
        .run(None, {"x": X345})
    assert out.shape == (5, 12)


@pytest.mark.parametrize("opset, attrs, split", [
    (11, {"axis": 1, "split": [1, 3]}, None),
    (13, {"axis": -1}, i64(2, 3)),
    (18, {"axis": 2, "num_outputs": 2}, None),
])
def test_split_versions(opset, attrs, split):
    inputs = [("x", X345)] + ([("split", split)] if split is not None else [])
    run_both("Split", inputs, opset=opset, n_outputs=2, **attrs)


def test_squeeze_unsqueeze_versions():
    x = np.ones((1, 3, 1), np.float32)
    run_both("Squeeze", [("x", x)], opset=11, axes=[-1])
    run_both("Squeeze", [("x", x)], opset=13)
    run_both("Unsqueeze", [("x", x)], opset=11, axes=[0, 4])
    run_both("Unsqueeze", [("x", x), ("a", i64(-1, 1))], opset=13)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeezing_an_axis_longer_than_one_names_it(opset):
    x = np.ones((1, 3, 1), np.float32)
    inputs, attrs = ([("x", x)], {"axes": [1]}) if opset == 11 else ([("x", x), ("a", i64(1))], {})
    model = _model("Squeeze", inputs, attrs, opset, 1)
    # an attribute's axes meet the static shape at load; an input's when the model runs
    error = mixrt.errors.GraphError if opset == 11 else mixrt.errors.ExecutionError
    with pytest.raises(error, match=r"Squeeze axis 1 has length 3"):
        mixrt.Session(model).run(None, {name: value for name, value in inputs})


def test_expand_output_is_writable_copy():
    (out,) = run_both("Expand", [("x", np.arange(3, dtype=np.float32)), ("s", i64(2, 1, 3))])
    assert out.shape == (2, 1, 3) and out.flags.writeable


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes_with_negative_pads_and_axes(mode):
    pads = i64(1, -1, 2, 1)  # axis 0: +1/-1 ... over axes (0, 2)
    run_both("Pad", [("x", X345), ("p", pads), ("v", np.array(2.5, np.float32)),
                     ("a", i64(0, -1))], mode=mode)


def test_pad_attribute_version():
    run_both("Pad", [("x", X345)], opset=2, pads=[0, 1, 0, 0, 2, 0], value=3.0)


def test_shape_slices_and_size():
    run_both("Shape", [("x", X345)], opset=15, start=-2, end=10)
    (t,) = shape.shape.kernels[0].infer_fn(TensorType(np.dtype("float32"), (3, "n", 5)),
                                           start=0, end=1)
    assert t.shape == (1,) and t.value.tolist() == [3]
    run_both("Size", [("x", X345)])


def test_tile_and_constantofshape():
    run_both("Tile", [("x", X345), ("r", i64(2, 1, 3))])
    value = helper.make_tensor("v", onnx.TensorProto.INT32, [1], [7])
    run_both("ConstantOfShape", [("s", i64(2, 0, 3))], value=value)
    run_both("ConstantOfShape", [("s", np.zeros(0, np.int64))])


@pytest.mark.parametrize("start, limit, delta, dtype", [
    (0, 10, 3, np.int64), (10, 4, -2, np.int32), (1.0, 2.0, 0.1, np.float32),
    (5, 5, 1, np.int64), (0.0, 1.0, 0.25, np.float64)])
def test_range(start, limit, delta, dtype):
    # onnxruntime adds delta repeatedly; we compute start + i * delta, as the spec says.
    run_both("Range", [(n, np.array(v, dtype)) for n, v in
                       (("s", start), ("l", limit), ("d", delta))], rtol=1e-6)


def test_eyelike_and_trilu_batched():
    run_both("EyeLike", [("x", np.zeros((3, 5), np.int32))], k=-1,
             dtype=onnx.TensorProto.FLOAT)
    for upper in (0, 1):
        run_both("Trilu", [("x", X345), ("k", np.array(-1, np.int64))], upper=upper)


def test_onehot_float_depth_and_axis():
    run_both("OneHot", [("i", np.array([[0, -1], [7, 2]], np.int64)),
                        ("d", np.array(3.0, np.float32)), ("v", np.array([0, 5], np.int32))],
             axis=1)


def test_depth_space_round_trip_crd():
    x = RNG.standard_normal((2, 8, 3, 3)).astype(np.float32)
    (deep,) = run_both("DepthToSpace", [("x", x)], blocksize=2, mode="CRD")
    assert deep.shape == (2, 2, 6, 6)


def test_reversesequence_batch_major():
    x = np.arange(24, dtype=np.float32).reshape(3, 4, 2)
    run_both("ReverseSequence", [("x", x), ("l", i64(1, 4, 2))], batch_axis=0, time_axis=1)


def test_center_crop_pad_odd_sizes():
    run_both("CenterCropPad", [("x", X345), ("s", i64(6, 3))], opset=18, axes=[1, 2])


# -- index.py -----------------------------------------------------------------------------

def test_gather_elements_smaller_indices():
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    run_both("GatherElements", [("d", data), ("i", np.array([[2, -1]], np.int64))], axis=1)


def test_gathernd_two_batch_dims():
    data = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    indices = RNG.integers(-4, 4, (2, 3, 6, 1)).astype(np.int64)
    run_both("GatherND", [("d", data), ("i", indices)], batch_dims=2)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_duplicates(reduction):
    data = np.ones((3, 4), np.float32)
    indices = np.array([[0, 1, 0, 0], [0, 1, 0, 2]], np.int64)
    updates = np.arange(2, 10, dtype=np.float32).reshape(2, 4)
    if reduction == "none":
        indices = np.array([[0, 1, 2, 0]], np.int64)
        updates = updates[:1]
    run_both("ScatterElements", [("d", data), ("i", indices), ("u", updates)], opset=18,
             axis=0, reduction=reduction)


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_reduce_in_rounds_matches_ufunc_at(reduction):
    """The CuPy path (no ufunc.at) computed with NumPy as the array module."""
    data = RNG.standard_normal((5, 3)).astype(np.float32)
    targets = (np.array([0, 4, 0, 0, 2]),)
    updates = RNG.standard_normal((5, 3)).astype(np.float32)
    ufunc = getattr(np, index._REDUCTIONS[reduction])
    want = data.copy()
    ufunc.at(want, targets, updates)
    got = data.copy()
    index._reduce_in_rounds(np, got, targets, updates, ufunc)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_scatternd_add_duplicates():
    data = np.zeros((4, 3), np.int64)
    run_both("ScatterND", [("d", data), ("i", np.array([[1], [-1], [1]], np.int64)),
                           ("u", np.arange(9, dtype=np.int64).reshape(3, 3))],
             opset=16, reduction="add")


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ((-1, 10), (-100, -10), (0, 2), (-1, -2)),
    ((2,), (2 ** 62,), None, None),
    ((4, 0), (-6, 5), (-1, 1), (-1, 3)),
])
def test_slice_clamping(starts, ends, axes, steps):
    inputs = [("x", X345), ("s", i64(*starts)), ("e", i64(*ends))]
    if axes or steps:
        inputs.append(("a", i64(*axes)) if axes else ("", None))
    if steps:
        inputs.append(("t", i64(*steps)))
    run_both("Slice", inputs)


def test_slice_1_attributes_and_infer():
    run_both("Slice", [("x", X345)], opset=1, starts=[1, -3], ends=[100, -1], axes=[0, 2])
    (t,) = index.slice_.kernels[0].infer_fn(
        TensorType(np.dtype("float32"), (3, "n", 5)),
        TensorType(np.dtype("int64"), (1,), np.array([-2])),
        TensorType(np.dtype("int64"), (1,), np.array([2 ** 40])),
        TensorType(np.dtype("int64"), (1,), np.array([2])), None)
    assert t.shape == (3, "n", 2)


def test_compress_short_condition_and_flattened():
    run_both("Compress", [("x", X345), ("c", np.array([True, False, True]))], axis=1)
    run_both("Compress", [("x", X345), ("c", np.array([False, True, True]))])


def test_nonzero_bool_and_empty():
    run_both("NonZero", [("x", X345 > 0.5)])
    run_both("NonZero", [("x", np.zeros((2, 0), np.float32))])


@pytest.mark.parametrize("sorted_, axis", [(0, None), (0, 1), (1, -1)])
def test_unique_orders(sorted_, axis):
    x = np.array([[3, 1, 3, 1], [2, 0, 2, 0], [3, 1, 3, 1]], np.float32)
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    run_both("Unique", [("x", x)], n_outputs=4, **attrs)


def test_unique_first_output_only():
    (y,) = mixrt.Session(_model("Unique", [("x", X345)], {}, 11, 1)).run(
        None, {"x": X345})
    assert y.shape == (60,)


@pytest.mark.parametrize("largest", [0, 1])
def test_top_k_ties(largest):
    x = np.array([[3, 1, 3, 0, 1, 3], [0, 0, 0, 0, 0, 0]], np.int64)
    run_both("TopK", [("x", x), ("k", i64(4))], n_outputs=2, largest=largest)


def test_top_k_unsigned_largest_without_negation():
    x = np.array([0, 2**64 - 1, 5, 2**64 - 1], np.uint64)
    values, indices = index.top_k(np, x, i64(3))
    assert values.tolist() == [2**64 - 1, 2**64 - 1, 5] and indices.tolist() == [1, 3, 2]


def test_top_k_versions():
    run_both("TopK", [("x", X345)], opset=1, n_outputs=2, k=2, axis=1)
    run_both("TopK", [("x", X345), ("k", i64(3))], opset=10, n_outputs=2, axis=0)


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
def test_argmax_argmin_ties_last_index(op_type):
    x = np.array([[1, 5, 5], [2, 2, 0]], np.int32)
    for last in (0, 1):
        run_both(op_type, [("x", x)], axis=-1, keepdims=0, select_last_index=last)


def test_tensorscatter_circular_wraps():
    cache = np.zeros((2, 3, 4, 2), np.float32)
    update = RNG.standard_normal((2, 3, 3, 2)).astype(np.float32)
    out = index.tensor_scatter(np, cache, update, i64(2, 0), mode="circular", axis=2)
    np.testing.assert_array_equal(out[0, :, [2, 3, 0]], update[0].transpose(1, 0, 2))
    np.testing.assert_array_equal(out[1, :, :3], update[1])
    assert not out[1, :, 3].any()


def test_infer_reshape_and_gather():
    f32 = np.dtype("float32")
    (t,) = shape.reshape.kernels[0].infer_fn(
        TensorType(f32, ("b", 4, 5)), TensorType(np.dtype("int64"), (3,), np.array([0, -1, 2])),
        allowzero=0)
    assert t.shape == ("b", 10, 2)
    (t,) = index.gather.kernels[0].infer_fn(TensorType(f32, (7, 3)),
                                            TensorType(np.dtype("int64"), (2, 2)), axis=0)
    assert t.shape == (2, 2, 3)


@pytest.mark.parametrize("source, shape", [((1, 2, 1, 4, 3), (1, 2, 2, 4, 3)),
                                           ((3, 1), (2, 1, 4)), ((), (2, 2))])
def test_expand_on_the_cpu_copies_into_out_as_the_generic_kernel(source, shape):
    from mixrt.ops.shape.shape_cpu import expand_cpu
    from mixrt.ops.shape.shape import expand
    x = np.arange(int(np.prod(source)), dtype=np.float32).reshape(source)
    expected = expand(np, x, np.array(shape))
    out = np.empty(expected.shape, np.float32)
    assert expand_cpu(np, x, np.array(shape), out=out) is out
    np.testing.assert_array_equal(out, expected)
    fresh = expand_cpu(np, x, np.array(shape))
    np.testing.assert_array_equal(fresh, expected)
    assert fresh.flags.writeable and fresh.base is None  # a real copy, not the view
    words = np.array([["a"], ["b"]], dtype=object)
    np.testing.assert_array_equal(expand_cpu(np, words, np.array([2, 3])),
                                  expand(np, words, np.array([2, 3])))


@pytest.mark.parametrize("data_shape, index_shape, axis", [
    ((150, 4, 3, 3), (150, 4, 3, 3), 0), ((5, 6, 7), (3, 6, 2), 1), ((4, 9), (4, 5), -1),
    ((8,), (3,), 0)])
def test_scatter_elements_on_the_cpu_writes_as_the_generic_kernel(data_shape, index_shape,
                                                                  axis):
    from mixrt.ops.shape.shape_cpu import scatter_elements_cpu
    from mixrt.ops.shape.index import scatter_elements
    rng = np.random.default_rng(4)
    data = rng.standard_normal(data_shape).astype(np.float32)
    length = data_shape[axis]
    # distinct targets per line along the axis (duplicates are the spec's undefined case)
    along = np.argsort(rng.random(index_shape[:axis % len(data_shape)] + (length,)
                                  + index_shape[axis % len(data_shape) + 1:]),
                       axis=axis)
    indices = np.take(along, np.arange(index_shape[axis]), axis=axis)
    indices = np.where(rng.random(indices.shape) < 0.3, indices - length, indices)  # negative
    updates = rng.standard_normal(index_shape).astype(np.float32)
    expected = scatter_elements(np, data, indices, updates, axis=axis)
    out = np.empty_like(data)
    assert scatter_elements_cpu(np, data, indices, updates, axis=axis, out=out) is out
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(scatter_elements_cpu(np, data, indices, updates, axis=axis),
                                  expected)
    bad = indices.copy()
    bad.flat[0] = length
    with pytest.raises(IndexError, match="out of bounds"):
        scatter_elements_cpu(np, data, bad, updates, axis=axis)
