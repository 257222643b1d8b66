"""The gradient of Resize (10 to 19) and Upsample (7, 9) with respect to X: against float64
central finite differences (gradcheck.check_gradient) over the modes, coordinate modes,
scales up and down, sizes, axes, antialiasing and cropping; against PyTorch's interpolate
backward where the two resamplings are the same; on symbolic dims, a fed scales input,
integer data, float32/float16, an empty output, the GPU, and through mixrt.nd autograd and a
hybridized gluon block. Each test runs on both of ResizeGrad's paths (matrix, tap by tap)."""

import numpy as np
import pytest

import mixrt
from mixrt import autograd, gluon, nd
from mixrt.ops.image import image_grad
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

from grad.gradcheck import check_gradient


def _nd(value, **kwargs):
    """``nd.array`` keeping a NumPy array's dtype (these checks compute in float64);
    ``nd.array``'s own default is float32, as MXNet's."""
    return nd.array(value, dtype=getattr(value, "dtype", None), **kwargs)

rng = np.random.default_rng(5)
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")


@pytest.fixture(autouse=True, params=["dense", "taps"])
def transpose_by(request, monkeypatch):
    """Every test twice: ResizeGrad transposing each axis by one matrix product (what these
    short axes get), then tap by tap (what long axes get)."""
    if request.param == "taps":
        monkeypatch.setattr(image_grad, "_DENSE_OUTPUTS_PER_TAP", 0)
    return request.param


def randn(*shape):
    return rng.standard_normal(shape)


def f32(*values):
    return np.array(values, dtype=np.float32)


def i64(*values):
    return np.array(values, dtype=np.int64)


def check_resize(x, roi=None, scales=None, sizes=None, opset=19, **attributes):
    """Resize's dX against finite differences; roi, scales and sizes are initializers."""
    inputs = [x, roi, scales, sizes]
    while inputs[-1] is None:
        inputs.pop()
    return check_gradient("Resize", inputs, attributes, constants=(1, 2, 3), opset=opset)


# -- against finite differences ------------------------------------------------------------------

UP, DOWN, MIXED = f32(1, 1, 2, 1.5), f32(1, 1, 0.6, 0.75), f32(1, 1, 1.7, 0.45)


@pytest.mark.parametrize("scales", [UP, DOWN, MIXED], ids=["up", "down", "mixed"])
@pytest.mark.parametrize("coordinate_mode", [
    "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_modes_and_coordinate_modes(mode, coordinate_mode, scales):
    check_resize(randn(1, 2, 4, 5), scales=scales, mode=mode,
                 coordinate_transformation_mode=coordinate_mode)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor",
                                          "ceil"])
def test_nearest_modes(nearest_mode):
    check_resize(randn(2, 5, 6), scales=f32(1, 1.5, 0.5), nearest_mode=nearest_mode,
                 coordinate_transformation_mode="half_pixel")


def test_sizes_with_axes():
    check_resize(randn(2, 3, 5, 4), sizes=i64(7, 3), axes=[-2, 3], mode="linear")


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_keep_aspect_ratio_policy(policy):
    check_resize(randn(1, 2, 4, 6), sizes=i64(7, 7), axes=[2, 3], mode="cubic",
                 keep_aspect_ratio_policy=policy)


def test_one_axis_unchanged_and_a_single_output():
    # pytorch_half_pixel and align_corners sample index 0 when the output has one element
    check_resize(randn(2, 5, 3), scales=f32(1, 0.2, 1), mode="linear",
                 coordinate_transformation_mode="pytorch_half_pixel")
    check_resize(randn(2, 5, 3), scales=f32(1, 0.2, 2), mode="cubic",
                 coordinate_transformation_mode="align_corners")


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [f32(1, 1, 0.45, 0.6), f32(1, 1, 1.5, 0.3)])
def test_antialias(mode, scales):
    check_resize(randn(1, 2, 9, 10), scales=scales, mode=mode, antialias=1)


@pytest.mark.parametrize("antialias", [0, 1])
def test_cubic_exclude_outside(antialias):
    check_resize(randn(1, 1, 5, 6), scales=f32(1, 1, 1.6, 0.5), mode="cubic", exclude_outside=1,
                 cubic_coeff_a=-0.5, antialias=antialias)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_crop_and_resize_with_extrapolation(mode):
    """The roi reaches outside the input on both sides: those outputs are
    extrapolation_value, a constant, and pass no gradient back."""
    roi = f32(0, 0, -0.3, 0.2, 1, 1, 0.7, 1.4)
    check_resize(randn(1, 2, 5, 4), roi, f32(1, 1, 1.4, 1.5), mode=mode,
                 coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=2.5)


def test_extrapolated_outputs_pass_no_gradient():
    """Outputs 0 to 3 sample -1, 0.5, 2 and 3.5: only 1 and 2 are inside [0, 2]."""
    _, grad, _ = resize_gradient(randn(1, 3), {"roi": f32(0, -0.5, 1, 1.75),
                                               "sizes": i64(1, 4)},
                                 {"mode": "linear", "extrapolation_value": 7.0,
                                  "coordinate_transformation_mode": "tf_crop_and_resize"},
                                 weights=np.array([[10.0, 1.0, 2.0, 20.0]]))
    np.testing.assert_allclose(grad, [[0.5, 0.5, 2.0]], rtol=1e-12)


def test_crop_and_resize_with_axes_and_sizes():
    check_resize(randn(2, 5, 4), f32(0.1, -0.2, 0.8, 0.9), sizes=i64(6, 3), axes=[1, 2],
                 mode="linear", coordinate_transformation_mode="tf_crop_and_resize")


def test_resize_11_and_13():
    check_resize(randn(1, 2, 3, 4), f32(0, 0, 0.2, 0.1, 1, 1, 0.9, 1.0), f32(1, 1, 2.5, 1.5),
                 opset=11, mode="cubic", coordinate_transformation_mode="tf_crop_and_resize")
    check_resize(randn(1, 2, 3, 4), None, None, i64(1, 2, 5, 3), opset=13, mode="linear")


@pytest.mark.parametrize("op_type,opset,mode", [
    ("Upsample", 9, "nearest"), ("Upsample", 9, "linear"), ("Upsample", 9, "bilinear"),
    ("Resize", 10, "nearest"), ("Resize", 10, "linear")])
def test_upsample_9_and_resize_10(op_type, opset, mode):
    check_gradient(op_type, [randn(1, 2, 3, 4), f32(1, 1, 2.7, 0.7)], {"mode": mode},
                   constants=(1,), opset=opset)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_7(mode):
    # 0.7 is 0.699999988 as float32, so 10 * 0.7 floors to 6: the gradient must agree
    check_gradient("Upsample", [randn(2, 10)], {"mode": mode, "scales": [1.0, 0.7]}, opset=7)
    check_gradient("Upsample", [randn(1, 3, 2)], {"mode": mode, "scales": [1.0, 2.0, 3.0]},
                   opset=7)


# -- against PyTorch ------------------------------------------------------------------------------

def resize_graph(x_type, extra: dict, attributes: dict, opset: int = 19,
                 op_type: str = "Resize", fed: tuple = ()):
    """Y = Resize(x, roi, scales, sizes); loss = sum(Y * r). ``extra`` maps roi/scales/sizes
    to arrays: initializers, or graph inputs when named in ``fed``."""
    graph = Graph(name="resize", opsets={"": opset, "mixrt": 1})
    graph.inputs.append(Value("x", x_type))
    names = ["x"]
    for name in ("roi", "scales", "sizes"):
        value = extra.get(name)
        names.append("" if value is None else name)
        if name in fed:
            graph.inputs.append(Value(name, TensorType(value.dtype, value.shape)))
        elif value is not None:
            graph.initializers[name] = value
    while not names[-1]:
        names.pop()
    graph.inputs.append(Value("r", TensorType(x_type.dtype, None)))
    graph.nodes += [
        Node(op_type, names, ["y"], name="resize", attributes=attributes, opset=opset),
        Node("Mul", ["y", "r"], ["m"], name="weigh", opset=17),
        Node("ReduceSum", ["m"], ["loss"], name="loss", opset=17, attributes={"keepdims": 0})]
    graph.outputs = [Value("loss"), Value("y")]
    return graph


def resize_gradient(x, extra: dict, attributes: dict, *, weights=None, opset=19,
                    symbolic=False, fed=(), device="cpu"):
    """(Y, d sum(Y * weights) / dX) through gradient_graph and a Session; weights default
    to fixed random ones."""
    dims = tuple(f"d{i}" for i in range(x.ndim)) if symbolic else x.shape
    graph = resize_graph(TensorType(x.dtype, dims), extra, attributes, opset, fed=fed)
    y = mixrt.Session(graph, opt_level=0).run(["y"], {"x": x, "r": np.zeros(1, x.dtype),
                                                      **{k: extra[k] for k in fed}})[0]
    if weights is None:
        weights = np.random.default_rng(1).standard_normal(y.shape).astype(x.dtype)
    joint = gradient_graph(graph, "loss", ["x"])
    session = mixrt.Session(joint.graph, opt_level=0, device=device)
    feeds = {"x": x, "r": weights, **{k: extra[k] for k in fed}}
    (grad,) = session.run([joint.grads["x"]], feeds)
    return y, np.asarray(grad) if device == "cpu" else _host(grad), weights


def _host(array):
    return array.get() if hasattr(array, "get") else np.asarray(array)


TORCH_CASES = {  # torch interpolate arguments: the ONNX attributes of the same resampling
    "nearest": ({"mode": "nearest"}, {"mode": "nearest", "nearest_mode": "floor",
                                      "coordinate_transformation_mode": "asymmetric"}),
    "nearest-exact": ({"mode": "nearest-exact"}, {
        "mode": "nearest", "nearest_mode": "round_prefer_ceil"}),
    "bilinear": ({"mode": "bilinear", "align_corners": False}, {"mode": "linear"}),
    "bilinear-corners": ({"mode": "bilinear", "align_corners": True}, {
        "mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    "bicubic": ({"mode": "bicubic", "align_corners": False}, {"mode": "cubic"}),
    "bicubic-corners": ({"mode": "bicubic", "align_corners": True}, {
        "mode": "cubic", "coordinate_transformation_mode": "align_corners"}),
    "bilinear-antialias": ({"mode": "bilinear", "antialias": True}, {
        "mode": "linear", "antialias": 1, "exclude_outside": 1}),
    "bicubic-antialias": ({"mode": "bicubic", "antialias": True}, {  # PIL's a = -0.5
        "mode": "cubic", "antialias": 1, "exclude_outside": 1, "cubic_coeff_a": -0.5}),
}


@pytest.mark.parametrize("size", [(14, 18), (5, 13), (3, 4)], ids=["up", "mixed", "down"])
@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_matches_torch_interpolate_backward(case, size):
    torch = pytest.importorskip("torch")
    theirs, ours = TORCH_CASES[case]
    x = randn(2, 3, 7, 9)
    y, grad, weights = resize_gradient(x, {"sizes": i64(2, 3, *size)}, ours)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.interpolate(tx, size=size, **theirs)
    (ty * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_matches_torch_trilinear_with_scale_factor():
    torch = pytest.importorskip("torch")
    x = randn(1, 2, 3, 4, 5)
    _, grad, weights = resize_gradient(x, {"scales": f32(1, 1, 2, 1.5, 0.5)}, {"mode": "linear"})
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.interpolate(tx, scale_factor=(2, 1.5, 0.5), mode="trilinear")
    (ty * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=1e-12, atol=1e-12)


# -- graphs, dtypes and devices -------------------------------------------------------------------

def test_symbolic_dims_and_fed_scales_match_the_static_gradient():
    x, extra = randn(2, 3, 4, 5), {"scales": f32(1, 1, 1.5, 0.7)}
    attributes = {"mode": "cubic", "antialias": 1}
    _, static, weights = resize_gradient(x, extra, attributes)
    _, symbolic, _ = resize_gradient(x, extra, attributes, weights=weights, symbolic=True,
                                     fed=("scales",))
    np.testing.assert_allclose(symbolic, static, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype,tolerance", [(np.float32, 1e-5), (np.float16, 1e-2)])
def test_a_narrower_float_keeps_its_dtype(dtype, tolerance):
    x = randn(2, 3, 8, 6)
    extra, attributes = {"scales": f32(1, 1, 2, 0.5)}, {"mode": "linear"}
    _, want, weights = resize_gradient(x, extra, attributes)
    _, got, _ = resize_gradient(x.astype(dtype), extra, attributes, weights=weights.astype(dtype))
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_an_empty_output_gives_a_zero_gradient():
    _, grad, _ = resize_gradient(randn(2, 3, 4), {"scales": f32(1, 1, 0.1)}, {"mode": "linear"})
    np.testing.assert_array_equal(grad, np.zeros((2, 3, 4)))


def test_an_integer_input_gets_no_gradient():
    """x -> Cast(int32) -> Resize -> Cast(float): the integer Resize builds no backward."""
    graph = Graph(name="int_resize", opsets={"": 19, "mixrt": 1})
    graph.inputs.append(Value("x", TensorType(np.dtype(np.float64), (1, 4))))
    graph.initializers["scales"] = f32(1, 2)
    graph.nodes += [
        Node("Cast", ["x"], ["xi"], name="to_int", opset=19, attributes={"to": 6}),
        Node("Resize", ["xi", "", "scales"], ["yi"], name="resize", opset=19,
             attributes={"mode": "linear"}),
        Node("Cast", ["yi"], ["y"], name="to_float", opset=19, attributes={"to": 11}),
        Node("ReduceSum", ["y"], ["loss"], name="loss", opset=17, attributes={"keepdims": 0})]
    graph.outputs = [Value("loss")]
    joint = gradient_graph(graph, "loss", ["x"])
    assert not [n for n in joint.graph.nodes if n.op_type == "ResizeGrad"]
    (grad,) = mixrt.Session(joint.graph, opt_level=0).run([joint.grads["x"]],
                                                            {"x": np.array([[1.0, 2.0, 3.0, 4.0]])})
    np.testing.assert_array_equal(grad, np.zeros((1, 4)))


@needs_gpu
@pytest.mark.parametrize("extra,attributes", [
    ({"scales": f32(1, 1, 2, 2)}, {"mode": "nearest"}),
    ({"sizes": i64(1, 2, 300, 4)}, {"mode": "linear"}),
    ({"roi": f32(0, 0, -0.2, 0.1, 1, 1, 1.1, 0.9), "scales": f32(1, 1, 1.5, 0.6)},
     {"mode": "cubic", "coordinate_transformation_mode": "tf_crop_and_resize"}),
])
def test_gpu_matches_cpu(extra, attributes):
    x = randn(1, 2, 5, 6).astype(np.float32)
    _, want, weights = resize_gradient(x, extra, attributes)
    _, got, _ = resize_gradient(x, extra, attributes, weights=weights, device="gpu:0")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- imperative and hybridized training -----------------------------------------------------------

@pytest.fixture(params=["cpu", pytest.param("gpu", marks=needs_gpu)])
def ctx(request):
    context = mixrt.cpu() if request.param == "cpu" else mixrt.gpu(0)
    with context:
        yield context


def test_nd_autograd_through_resize_matches_finite_differences(ctx):
    data = randn(1, 2, 3, 4)
    scales = _nd(f32(1, 1, 2, 1.5))
    weights = _nd(np.random.default_rng(2).standard_normal((1, 2, 6, 6)))

    def loss_of(values):
        return float((nd.Resize(_nd(values), None, scales, mode="cubic") * weights)
                     .sum())

    x = _nd(data)
    x.attach_grad()
    with autograd.record():
        loss = (nd.Resize(x, None, scales, mode="cubic") * weights).sum()
    loss.backward()
    numeric = np.zeros_like(data)
    for index in np.ndindex(data.shape):
        up, down = data.copy(), data.copy()
        up[index] += 1e-6
        down[index] -= 1e-6
        numeric[index] = (loss_of(up) - loss_of(down)) / 2e-6
    np.testing.assert_allclose(x.grad.asnumpy(), numeric, rtol=1e-6, atol=1e-8)


class ConvUp(gluon.HybridBlock):
    """A U-Net decoder's step: a convolution, then a bilinear upsampling."""

    def __init__(self):
        super().__init__()
        self.conv = gluon.nn.Conv2D(3, kernel_size=3, padding=1)

    def hybrid_forward(self, F, x):
        return F.Resize(self.conv(x), None, f32(1, 1, 2, 2), mode="linear")


def conv_up_gradients(hybrid: bool, data: np.ndarray):
    mixrt.random.seed(3)
    block = ConvUp()
    block.initialize()
    if hybrid:
        block.hybridize()
    x = _nd(data)
    x.attach_grad()
    with autograd.record():
        loss = (block(x) ** 2).sum()
    loss.backward()
    return x.grad.asnumpy(), block.conv.weight.grad().asnumpy()


def test_a_hybridized_block_that_upsamples_trains_as_the_imperative_one():
    data = randn(2, 2, 5, 4).astype(np.float32)
    imperative = conv_up_gradients(False, data)
    hybridized = conv_up_gradients(True, data)
    for got, want in zip(hybridized, imperative):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.abs(imperative[1]).max() > 0
