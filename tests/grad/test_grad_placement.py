"""Gradients of Compress, ReverseSequence, CenterCropPad, TensorScatter, MaxUnpool, EyeLike,
SwiGLU and CumProd (ops/shape/placement_grad.py) against float64 central differences (first and,
except CumProd, second order), symbolic shapes against static ones, and CumProd at zeros
against closed forms."""

import numpy as np
import pytest

import mixrt
from mixrt import autograd, nd
from mixrt.errors import GradientError
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available
from mixrt.runtime.graph import Graph, Node, Value

from grad.gradcheck import check_gradient
from grad.test_grad_shape_index import check_symbolic_matches_static


def _nd(value, **kwargs):
    """``nd.array`` keeping a NumPy array's dtype (these checks compute in float64);
    ``nd.array``'s own default is float32, as MXNet's."""
    return nd.array(value, dtype=getattr(value, "dtype", None), **kwargs)

rng = np.random.default_rng(29)


def randn(*shape):
    return rng.standard_normal(shape)


def ints(*values):
    return np.array(values, dtype=np.int64)


@pytest.mark.parametrize("axis, condition", [
    (0, [True, False, True]), (1, [False, True, True, False]), (-1, [True, False]),
    (None, [True, False, False, True, True, False, True]),
    (1, [True, False, True, True, True, True, True])])  # longer than the axis
def test_compress(axis, condition):
    attributes = {} if axis is None else {"axis": axis}
    inputs = [randn(3, 4, 2), np.array(condition)]
    check_gradient("Compress", inputs, attributes, constants=(1,))
    check_symbolic_matches_static("Compress", inputs, attributes, constants=(1,))


@pytest.mark.parametrize("batch_axis, time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis, time_axis):
    x = randn(4, 3, 2) if batch_axis == 1 else randn(3, 4, 2)
    check_gradient("ReverseSequence", [x, ints(4, 1, 3)],
                   {"batch_axis": batch_axis, "time_axis": time_axis}, constants=(1,))


@pytest.mark.parametrize("target, axes", [
    ([2, 5], None), ([4, 3], [1, 2]), ([1, 7], [-2, -1]), ([3], [0])])
def test_center_crop_pad(target, axes):
    attributes = {} if axes is None else {"axes": axes}
    x = randn(3, 4, 5) if axes is not None else randn(5, 2)
    inputs = [x, ints(*target)]
    check_gradient("CenterCropPad", inputs, attributes, constants=(1,), opset=18)
    check_symbolic_matches_static("CenterCropPad", inputs, attributes, constants=(1,),
                                  opset=18)


@pytest.mark.parametrize("mode, starts", [
    ("linear", None), ("linear", [0, 2]), ("circular", [4, 1])])
def test_tensor_scatter(mode, starts):
    cache, update = randn(2, 3, 6, 4), randn(2, 3, 3, 4)
    inputs = [cache, update] + ([] if starts is None else [ints(*starts)])
    constants = () if starts is None else (2,)
    check_gradient("TensorScatter", inputs, {"mode": mode, "axis": -2}, constants=constants,
                   opset=24)


def test_max_unpool_reads_the_gradient_where_max_pool_found_the_maxima():
    pooled_from = np.random.default_rng(2).permutation(32).astype(np.float64).reshape(
        1, 2, 4, 4)
    (_, indices) = mixrt.Session(_max_pool_model()).run(None, {"x": pooled_from})
    x = randn(1, 2, 2, 2)
    check_gradient("MaxUnpool", [x, indices], {"kernel_shape": [2, 2], "strides": [2, 2]},
                   constants=(1,), opset=11)
    check_gradient("MaxUnpool", [x, indices, ints(1, 2, 5, 5)],
                   {"kernel_shape": [2, 2], "strides": [2, 2]}, constants=(1, 2), opset=11)


def _max_pool_model(kernel=2, stride=2):
    node = Node("MaxPool", ["x"], ["y", "i"], name="pool", opset=12,
                attributes={"kernel_shape": [kernel, kernel], "strides": [stride, stride]})
    return Graph(nodes=[node], inputs=[Value("x", TensorType(np.dtype(np.float64),
                                                              (1, 2, 4, 4)))],
                 outputs=[Value("y"), Value("i")], name="pool")


def _overlapping_indices():
    """MaxPool 3x3 stride 1 over 4x4 maps with one large value each: all four windows pick
    it, so every index repeats."""
    pooled_from = randn(1, 2, 4, 4)
    pooled_from[0, :, 1, 2] = 10.0
    (_, indices) = mixrt.Session(_max_pool_model(3, 1)).run(None, {"x": pooled_from})
    assert len(np.unique(indices)) == 2
    return indices


def test_max_unpool_with_repeated_indices_keeps_the_last_write_and_its_gradient():
    """The forward keeps the last write to a position (onnxruntime's rule); the gradient goes
    to that write alone. Central differences see it: the overwritten X do not move Y."""
    indices = _overlapping_indices()
    x = randn(1, 2, 2, 2)
    check_gradient("MaxUnpool", [x, indices], {"kernel_shape": [3, 3], "strides": [1, 1]},
                   constants=(1,), opset=11)


def test_max_unpool_with_repeated_indices_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import helper
    indices = _overlapping_indices()
    x = randn(1, 2, 2, 2).astype(np.float32)
    node = helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[3, 3], strides=[1, 1])
    graph = helper.make_graph([node], "unpool", [
        helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape),
        helper.make_tensor_value_info("i", onnx.TensorProto.INT64, indices.shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)],
                              ir_version=8)
    feeds = {"x": x, "i": indices}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = mixrt.Session(model).run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)
    assert np.count_nonzero(got) == 2 and set(got[got != 0]) == {x[0, 0, 1, 1], x[0, 1, 1, 1]}


def test_eye_like_passes_nothing_back():
    x = _nd(randn(3, 4))
    x.attach_grad()
    with autograd.record():
        y = (nd.EyeLike(x) * 2 + x).sum()
    y.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), np.ones((3, 4)))


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu(alpha):
    check_gradient("SwiGLU", [randn(3, 5), randn(3, 5)], {"alpha": alpha}, opset=28)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_cum_prod(exclusive, reverse, axis):
    x = rng.uniform(0.5, 1.5, (4, 5)) * rng.choice([-1, 1], (4, 5))
    check_gradient("CumProd", [x, ints(axis)], {"exclusive": exclusive, "reverse": reverse},
                   constants=(1,), opset=26, second_order=False)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cum_prod_at_zeros_matches_the_product_of_the_others(exclusive, reverse):
    """dX_i = sum_j dY_j prod_{k in K_j, k != i} x_k, element by element: exact where
    X holds one or two zeros, where dividing Y by X gives NaN."""
    x = np.array([[2.0, 0.0, 3.0, -1.5, 0.5], [1.5, 0.0, 2.0, 0.0, -2.0]])
    dy = randn(2, 5)
    got = _cum_prod_grad(x, dy, exclusive, reverse)
    want = np.zeros_like(x)
    n = x.shape[1]
    for row in range(2):
        for i in range(n):
            for j in range(n):
                members = [k for k in range(n) if _in_scan(k, j, exclusive, reverse)]
                if i in members:
                    others = [x[row, k] for k in members if k != i]
                    want[row, i] += dy[row, j] * np.prod(others)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def _in_scan(k, j, exclusive, reverse):
    if reverse:
        return k > j if exclusive else k >= j
    return k < j if exclusive else k <= j


def _cum_prod_grad(x, dy, exclusive, reverse, ctx=None):
    options = {} if ctx is None else {"ctx": ctx}
    data = _nd(x, **options)
    data.attach_grad()
    with autograd.record():
        y = nd.CumProd(data, _nd(ints(1), **options), exclusive=exclusive,
                       reverse=reverse)
        (y * _nd(dy, **options)).sum().backward()
    return data.grad.asnumpy()


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")
def test_cum_prod_gradient_on_the_gpu():
    x = np.array([[2.0, 0.0, 3.0, -1.5], [1.5, 0.5, 2.0, 0.0]])
    dy = randn(2, 4)
    np.testing.assert_allclose(_cum_prod_grad(x, dy, 1, 1, ctx=mixrt.gpu(0)),
                               _cum_prod_grad(x, dy, 1, 1), rtol=1e-12)


def test_cum_prod_second_derivative_names_its_backward_kernel():
    x = _nd(randn(2, 3))
    x.attach_grad()
    with autograd.record():
        y = nd.CumProd(x, _nd(ints(1)))
        g = autograd.grad((y * y).sum(), [x], create_graph=True)[0]
        total = (g * g).sum()
    with pytest.raises(GradientError, match="CumProdGrad"):
        total.backward()


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")
def test_max_unpool_with_repeated_indices_on_the_gpu():
    """CuPy's scatter picks any of the repeated writes; the GPU must keep the last, as the
    CPU does, and give the gradient to it alone."""
    indices = _overlapping_indices()
    x, dy = randn(1, 2, 2, 2), randn(1, 2, 4, 4)

    def forward_and_grad(**options):
        data = _nd(x, **options)
        data.attach_grad()
        with autograd.record():
            y = nd.MaxUnpool(data, _nd(indices, **options), kernel_shape=[3, 3],
                             strides=[1, 1])
            (y * _nd(dy, **options)).sum().backward()
        return y.asnumpy(), data.grad.asnumpy()

    for got, want in zip(forward_and_grad(ctx=mixrt.gpu(0)), forward_and_grad()):
        np.testing.assert_array_equal(got, want)
