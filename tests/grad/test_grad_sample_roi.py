"""Gradients of GridSample, AffineGrid (ops/image/image_sample_grad.py), RoiAlign and MaxRoiPool
(ops/pool/roi_pool_grad.py):
against float64 central finite differences, first and second order (gradcheck), over every
mode, padding mode, align_corners, 4-D and 5-D inputs and the opset versions; GridSample
against PyTorch's autograd (dX and dGrid); the GPU kernels against the CPU ones; and a tiny
spatial transformer (AffineGrid -> GridSample) whose theta learns by SGD.

Finite differences need a loss that is smooth around the point: the grids here put every
sample at least 0.15 pixel away from an integer and from a half-integer position (the
kinks of the linear/cubic weights, the nearest rounding, the border clamp and the
reflection folds), and random images make RoI max ties improbable.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt import autograd, nd
from mixrt.errors import GradientError
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph
from mixrt.runtime.session import load_graph

from grad.gradcheck import check_gradient


def _nd(value, **kwargs):
    """``nd.array`` keeping a NumPy array's dtype (these checks compute in float64);
    ``nd.array``'s own default is float32, as MXNet's."""
    return nd.array(value, dtype=getattr(value, "dtype", None), **kwargs)

rng = np.random.default_rng(11)
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")


def randn(*shape):
    return rng.standard_normal(shape)


def smooth_grid(batch, positions, spatial, align_corners, seed=0):
    """A (batch, *positions, D) grid whose pixel coordinates are k + f, k from 2 pixels
    before the image to 2 after it and f in [0.15, 0.35] or [0.65, 0.85]: away from every
    kink of every mode and padding (see the module docstring)."""
    local = np.random.default_rng(seed)
    shape = (batch, *positions)
    columns = []
    for size in reversed(spatial):  # grid[..., 0] indexes the innermost axis
        whole = local.integers(-2, size + 2, shape)
        fraction = local.uniform(0.15, 0.35, shape) + 0.5 * local.integers(0, 2, shape)
        pixel = whole + fraction
        columns.append(pixel * 2 / (size - 1) - 1 if align_corners
                       else (2 * pixel + 1) / size - 1)
    return np.stack(columns, axis=-1)


# -- GridSample against finite differences ---------------------------------------------------

@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_4d(mode, padding_mode, align_corners):
    """dX and dGrid, and their gradients (second order), at opset 20."""
    x = randn(2, 2, 4, 5)
    grid = smooth_grid(2, (3, 2), (4, 5), align_corners)
    check_gradient("GridSample", [x, grid], {"mode": mode, "padding_mode": padding_mode,
                                             "align_corners": align_corners}, opset=20)


@pytest.mark.parametrize("mode,padding_mode,align_corners", [
    ("linear", "zeros", 0), ("linear", "reflection", 1), ("linear", "border", 0),
    ("nearest", "reflection", 0), ("cubic", "border", 1), ("cubic", "zeros", 0)])
def test_grid_sample_5d(mode, padding_mode, align_corners):
    x = randn(1, 2, 3, 4, 3)
    grid = smooth_grid(1, (2, 1, 3), (3, 4, 3), align_corners, seed=1)
    check_gradient("GridSample", [x, grid], {"mode": mode, "padding_mode": padding_mode,
                                             "align_corners": align_corners}, opset=22)


@pytest.mark.parametrize("opset,mode", [(16, "bilinear"), (16, "bicubic"), (16, "nearest"),
                                        (22, "linear"), (22, "cubic")])
def test_grid_sample_opset_versions(opset, mode):
    x = randn(1, 3, 3, 4)
    grid = smooth_grid(1, (2, 3), (3, 4), 0, seed=2)
    check_gradient("GridSample", [x, grid], {"mode": mode, "padding_mode": "border"},
                   opset=opset)


def test_grid_sample_default_attributes_and_a_constant_grid():
    """Only dX is built when the grid is a constant (one GridSampleGrad node)."""
    x = randn(1, 2, 5, 5)
    grid = smooth_grid(1, (4, 4), (5, 5), 0, seed=3)
    check_gradient("GridSample", [x, grid], {}, constants=(1,), opset=16)


# -- GridSample against PyTorch --------------------------------------------------------------

def sampling_graph(x, grid, attributes, opset=20):
    """Y = GridSample(x, grid); loss = sum(Y * r)."""
    graph = Graph(name="grid_sample", opsets={"": opset, "mixrt": 1})
    graph.inputs += [Value("x", TensorType(x.dtype, x.shape)),
                     Value("grid", TensorType(grid.dtype, grid.shape)),
                     Value("r", TensorType(x.dtype, None))]
    graph.nodes += [
        Node("GridSample", ["x", "grid"], ["y"], name="sample", attributes=attributes,
             opset=opset),
        Node("Mul", ["y", "r"], ["m"], name="weigh", opset=17),
        Node("ReduceSum", ["m"], ["loss"], name="loss", opset=17, attributes={"keepdims": 0})]
    graph.outputs = [Value("loss"), Value("y")]
    return graph


def sampling_gradients(x, grid, attributes, weights, device="cpu"):
    """(Y, dX, dGrid) of sum(GridSample(x, grid) * weights) through gradient_graph."""
    joint = gradient_graph(sampling_graph(x, grid, attributes), "loss", ["x", "grid"])
    session = mixrt.Session(joint.graph, opt_level=0, device=device)
    outputs = session.run(["y", joint.grads["x"], joint.grads["grid"]],
                          {"x": x, "grid": grid, "r": weights})
    return [np.asarray(o.get() if hasattr(o, "get") else o) for o in outputs]


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_matches_torch_autograd(mode, padding_mode, align_corners):
    x, grid = randn(2, 3, 5, 6), rng.uniform(-1.3, 1.3, (2, 4, 7, 2))
    compare_with_torch(x, grid, randn(2, 3, 4, 7), mode, padding_mode, align_corners)


def compare_with_torch(x, grid, weights, mode, padding_mode, align_corners):
    """Y, dX and dGrid of sum(Y * weights) against torch's grid_sample and autograd."""
    torch = pytest.importorskip("torch")
    ours = sampling_gradients(x, grid, {"mode": mode, "padding_mode": padding_mode,
                                        "align_corners": int(align_corners)}, weights)
    tx, tgrid = torch.tensor(x, requires_grad=True), torch.tensor(grid, requires_grad=True)
    ty = torch.nn.functional.grid_sample(tx, tgrid, mode=mode, padding_mode=padding_mode,
                                         align_corners=align_corners)
    (ty * torch.tensor(weights)).sum().backward()
    for got, want in zip(ours, (ty.detach(), tx.grad, tgrid.grad)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode,padding_mode", [("bilinear", "reflection"),
                                               ("nearest", "border")])
def test_grid_sample_5d_matches_torch_autograd(mode, padding_mode):
    x, grid = randn(1, 2, 4, 3, 5), rng.uniform(-1.2, 1.2, (1, 2, 3, 4, 3))
    compare_with_torch(x, grid, randn(1, 2, 2, 3, 4), mode, padding_mode, False)


@pytest.mark.parametrize("mode,padding_mode", [("bilinear", "zeros"), ("bicubic", "reflection")])
def test_a_gradient_penalty_on_the_grid_matches_torch_double_backward(mode, padding_mode):
    """mixrt.autograd with create_graph: d/d(x, grid) of |dLoss/dGrid|^2."""
    torch = pytest.importorskip("torch")
    x0, g0 = randn(1, 2, 5, 6), rng.uniform(-1.1, 1.1, (1, 3, 4, 2))
    w0 = randn(1, 2, 3, 4)
    x, grid = _nd(x0), _nd(g0)
    x.attach_grad()
    grid.attach_grad()
    with autograd.record():
        loss = (nd.GridSample(x, grid, mode=mode, padding_mode=padding_mode) * _nd(w0)).sum()
        dgrid = autograd.grad(loss, [grid], create_graph=True)[0]
        penalty = (dgrid * dgrid).sum()
    penalty.backward()
    tx, tgrid = torch.tensor(x0, requires_grad=True), torch.tensor(g0, requires_grad=True)
    ty = torch.nn.functional.grid_sample(tx, tgrid, mode=mode, padding_mode=padding_mode,
                                         align_corners=False)
    (tdgrid,) = torch.autograd.grad((ty * torch.tensor(w0)).sum(), [tgrid], create_graph=True)
    (tdgrid * tdgrid).sum().backward()
    np.testing.assert_allclose(dgrid.asnumpy(), tdgrid.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(x.grad.asnumpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(grid.grad.asnumpy(), tgrid.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_a_third_derivative_through_a_grid_is_refused_by_name():
    graph = Graph(name="third", opsets={"": 17, "mixrt": 1})
    for name in ("dy", "x", "grid", "direction"):
        graph.inputs.append(Value(name, TensorType(np.dtype(np.float64), None)))
    graph.nodes += [Node("GridSampleGradGrad", ["dy", "x", "grid", "direction"], ["g"],
                         name="gg", domain="mixrt", opset=1, attributes={"wrt": "grid"}),
                    Node("ReduceSum", ["g"], ["loss"], name="loss", opset=17)]
    graph.outputs = [Value("loss")]
    with pytest.raises(GradientError, match="GridSampleGradGrad"):
        gradient_graph(graph, "loss", ["grid"])


# -- AffineGrid -------------------------------------------------------------------------------

@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid(align_corners):
    check_gradient("AffineGrid", [randn(2, 2, 3), np.array([2, 1, 3, 4], dtype=np.int64)],
                   {"align_corners": align_corners}, constants=(1,), opset=20)
    check_gradient("AffineGrid", [randn(1, 3, 4), np.array([1, 1, 2, 3, 2], dtype=np.int64)],
                   {"align_corners": align_corners}, constants=(1,), opset=20)


# -- RoiAlign and MaxRoiPool ------------------------------------------------------------------

# RoIs inside, reaching past the left and bottom edges, and smaller than a pixel
ROIS = np.array([[0.3, 0.7, 4.6, 5.2], [-1.4, 1.2, 3.3, 7.9], [2.1, 0.2, 6.8, 3.1],
                 [3.2, 2.5, 3.6, 2.8]])
BATCHES = np.array([0, 1, 1, 0], dtype=np.int64)


@pytest.mark.parametrize("sampling_ratio", [0, 2])
@pytest.mark.parametrize("coordinate_mode", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align(mode, coordinate_mode, sampling_ratio):
    attributes = {"mode": mode, "coordinate_transformation_mode": coordinate_mode,
                  "output_height": 2, "output_width": 3, "sampling_ratio": sampling_ratio,
                  "spatial_scale": 0.9}
    check_gradient("RoiAlign", [randn(2, 2, 6, 7), ROIS, BATCHES], attributes,
                   constants=(1, 2), opset=16)


@pytest.mark.parametrize("opset,mode", [(10, "avg"), (10, "max"), (22, "avg"), (22, "max")])
def test_roi_align_opset_versions(opset, mode):
    check_gradient("RoiAlign", [randn(2, 3, 5, 6), ROIS * 0.8, BATCHES],
                   {"mode": mode, "output_height": 3, "output_width": 2, "spatial_scale": 1.0},
                   constants=(1, 2), opset=opset)


def test_roi_align_avg_is_the_adjoint_of_its_gradient():
    """<RoiAlign(X), dY> = <X, dX> exactly: avg mode is linear in X."""
    x, dy = randn(2, 2, 6, 7), randn(4, 2, 2, 3)
    attributes = {"mode": "avg", "output_height": 2, "output_width": 3, "sampling_ratio": 3}
    graph = Graph(name="roi", opsets={"": 16, "mixrt": 1})
    graph.inputs += [Value("x", TensorType(x.dtype, x.shape)),
                     Value("r", TensorType(dy.dtype, dy.shape))]
    graph.initializers.update(rois=ROIS, batches=BATCHES)
    graph.nodes += [Node("RoiAlign", ["x", "rois", "batches"], ["y"], name="align",
                         attributes=attributes, opset=16),
                    Node("Mul", ["y", "r"], ["m"], name="weigh", opset=17),
                    Node("ReduceSum", ["m"], ["loss"], name="loss", opset=17,
                         attributes={"keepdims": 0})]
    graph.outputs = [Value("loss")]
    joint = gradient_graph(graph, "loss", ["x"])
    loss, dx = mixrt.Session(joint.graph, opt_level=0).run(["loss", joint.grads["x"]],
                                                           {"x": x, "r": dy})
    np.testing.assert_allclose(float(loss), float((x * dx).sum()), rtol=1e-12)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_no_rois_give_a_zero_gradient(mode):
    attributes = {"mode": mode, "output_height": 2, "output_width": 3}
    (dx,) = backward_node("RoiAlignGrad", {"dY": np.zeros((0, 2, 2, 3)), "X": randn(1, 2, 4, 4),
                                           "rois": np.zeros((0, 4)),
                                           "batches": np.zeros(0, dtype=np.int64)},
                          ["dx"], attributes, "cpu")
    np.testing.assert_array_equal(dx, np.zeros((1, 2, 4, 4)))


@pytest.mark.parametrize("opset", [1, 22])
def test_max_roi_pool(opset):
    rois = np.concatenate([BATCHES[:, None], ROIS * 1.1], axis=1)
    check_gradient("MaxRoiPool", [randn(2, 2, 6, 7), rois],
                   {"pooled_shape": [2, 3], "spatial_scale": 0.9}, constants=(1,), opset=opset)


# -- the GPU kernels --------------------------------------------------------------------------

def backward_node(op_type, inputs: dict, outputs: list, attributes, device, opset=1):
    """One mixrt-domain kernel run on ``device``, fed float32 inputs (ints kept)."""
    graph = Graph(name=op_type, opsets={"": 22, "mixrt": 1})
    feeds = {}
    for name, value in inputs.items():
        value = value.astype(np.float32) if value.dtype.kind == "f" else value
        graph.inputs.append(Value(name, TensorType(value.dtype, value.shape)))
        feeds[name] = value
    graph.nodes.append(Node(op_type, list(inputs), outputs, name="k", domain="mixrt",
                            opset=opset, attributes=attributes))
    graph.outputs = [Value(name) for name in outputs]
    results = mixrt.Session(graph, opt_level=0, device=device).run(None, feeds)
    return [np.asarray(r.get() if hasattr(r, "get") else r) for r in results]


GPU_CASES = [
    ("GridSampleGrad", {"dY": randn(2, 3, 4, 5), "X": randn(2, 3, 6, 7),
                        "grid": rng.uniform(-1.2, 1.2, (2, 4, 5, 2))},
     ["dx", "dgrid"], {"mode": "cubic", "padding_mode": "reflection"}),
    ("GridSampleGradGrad", {"dY": randn(1, 2, 3, 4), "X": randn(1, 2, 5, 5),
                            "grid": rng.uniform(-1, 1, (1, 3, 4, 2)),
                            "d": randn(1, 3, 4, 2)}, ["g"], {"wrt": "grid"}),
    ("RoiAlignGrad", {"dY": randn(4, 2, 2, 3), "X": randn(2, 2, 6, 7), "rois": ROIS,
                      "batches": BATCHES}, ["dx"],
     {"mode": "max", "output_height": 2, "output_width": 3}),
    ("RoiAlignGrad", {"dY": randn(4, 2, 2, 3), "X": randn(2, 2, 6, 7), "rois": ROIS,
                      "batches": BATCHES}, ["dx"],
     {"mode": "avg", "output_height": 2, "output_width": 3}),
    ("RoiAlignRouted", {"V": randn(2, 2, 6, 7), "X": randn(2, 2, 6, 7), "rois": ROIS,
                        "batches": BATCHES}, ["y"],
     {"mode": "max", "output_height": 3, "output_width": 2, "sampling_ratio": 2}),
    ("MaxRoiPoolGrad", {"dY": randn(4, 2, 2, 2), "X": randn(2, 2, 6, 7),
                        "rois": np.concatenate([BATCHES[:, None], ROIS], axis=1)}, ["dx"],
     {"pooled_shape": [2, 2]}),
    ("MaxRoiPoolRouted", {"V": randn(2, 2, 6, 7), "X": randn(2, 2, 6, 7),
                          "rois": np.concatenate([BATCHES[:, None], ROIS], axis=1)}, ["y"],
     {"pooled_shape": [3, 2]}),
    ("AffineGridGrad", {"dgrid": randn(2, 3, 4, 2), "theta": randn(2, 2, 3)}, ["dtheta"],
     {"align_corners": 1}),
]


@needs_gpu
@pytest.mark.parametrize("op_type,inputs,outputs,attributes", GPU_CASES,
                         ids=[f"{case[0]}-{k}" for k, case in enumerate(GPU_CASES)])
def test_gpu_matches_cpu(op_type, inputs, outputs, attributes):
    want = backward_node(op_type, inputs, outputs, attributes, "cpu")
    got = backward_node(op_type, inputs, outputs, attributes, "gpu:0")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


# -- a spatial transformer learns its theta ---------------------------------------------------

def spatial_transformer(image: np.ndarray) -> onnx.ModelProto:
    """loss = mean((GridSample(image, AffineGrid(theta)) - target)^2), opset 20."""
    shape = list(image.shape)
    nodes = [
        helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=0),
        helper.make_node("GridSample", ["image", "grid"], ["y"], mode="linear",
                         padding_mode="zeros", align_corners=0),
        helper.make_node("Sub", ["y", "target"], ["diff"]),
        helper.make_node("Mul", ["diff", "diff"], ["square"]),
        helper.make_node("ReduceMean", ["square"], ["loss"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "stn",
        [helper.make_tensor_value_info("theta", TensorProto.FLOAT, [1, 2, 3]),
         helper.make_tensor_value_info("target", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [onnx.numpy_helper.from_array(image, "image"),
         onnx.numpy_helper.from_array(np.array(shape, dtype=np.int64), "size")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)],
                              ir_version=9)
    onnx.checker.check_model(model)
    return model


def test_a_spatial_transformer_trains_its_theta():
    ys, xs = np.meshgrid(np.linspace(-1, 1, 12), np.linspace(-1, 1, 12), indexing="ij")
    # two blobs of different sizes: no symmetry lets another theta give the same picture
    blobs = (np.exp(-((xs - 0.3) ** 2 + (ys + 0.2) ** 2 * 2) / 0.15)
             + 0.6 * np.exp(-((xs + 0.35) ** 2 + (ys - 0.3) ** 2) / 0.05))
    image = blobs[None, None].astype(np.float32)
    graph = load_graph(spatial_transformer(image))
    forward = mixrt.Session(graph, opt_level=0)
    truth = np.array([[[0.9, -0.15, 0.2], [0.1, 1.05, -0.15]]], dtype=np.float32)
    target = forward.run(["y"], {"theta": truth, "target": np.zeros_like(image)})[0]

    joint = gradient_graph(graph, "loss", ["theta"])
    session = mixrt.Session(joint.graph)
    start = theta = np.array([[[1, 0, 0], [0, 1, 0]]], dtype=np.float32)
    losses = []
    for _ in range(40):
        loss, grad = session.run(["loss", joint.grads["theta"]],
                                 {"theta": theta, "target": target})
        losses.append(float(loss))
        theta = theta - 1.0 * grad
    assert losses[-1] < 0.01 * losses[0], losses
    assert np.abs(theta - truth).max() < 0.75 * np.abs(start - truth).max(), theta
    assert all(later <= earlier * 1.001 for earlier, later in zip(losses, losses[1:])), losses
