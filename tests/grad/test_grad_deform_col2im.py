"""Gradients of Col2Im and DeformConv (ops/conv/deform_col2im_grad.py): against float64 central
finite differences (gradcheck), over 1-D, 2-D and 3-D geometry, groups, offset groups,
strides, dilations, pads, a mask and a bias; Col2Im's second order too; DeformConv against
PyTorch's torchvision where it is installed; a deformable layer whose offsets learn by SGD;
and the GPU kernels against the CPU ones.

DeformConv is piecewise linear in its offsets, with kinks where a sampling position crosses
an integer: the offsets here keep every position at least 0.15 pixel from one.
"""

import numpy as np
import pytest

import mixrt
from mixrt.errors import GradientError
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

from grad.gradcheck import check_gradient

rng = np.random.default_rng(23)
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")


def randn(*shape):
    return rng.standard_normal(shape)


# -- Col2Im -------------------------------------------------------------------------------

@pytest.mark.parametrize("image, block, attributes", [
    ((5, 5), (2, 2), {}),
    ((6, 5), (2, 3), {"strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]}),
    ((7,), (3,), {"strides": [2], "pads": [1, 2]}),
    ((4, 3, 4), (2, 1, 2), {"dilations": [2, 1, 1], "pads": [0, 1, 0, 1, 0, 1]}),
])
def test_col2im_against_finite_differences_first_and_second_order(image, block, attributes):
    from mixrt.ops.conv.windows import window_geometry
    nd = len(image)
    strides, dilations = attributes.get("strides", [1] * nd), attributes.get("dilations", [1] * nd)
    _, _, blocks = window_geometry(list(image), list(block), strides, dilations,
                                   attributes.get("pads"))
    columns = randn(2, 3 * int(np.prod(block)), int(np.prod(blocks)))
    check_gradient("Col2Im", [columns, np.array(image, np.int64), np.array(block, np.int64)],
                   attributes, constants=(1, 2), opset=18)


# -- DeformConv ---------------------------------------------------------------------------

def smooth_offsets(shape, nd):
    """Offsets whose sampling positions (an integer tap plus the offset) sit 0.15 to 0.85
    pixel past an integer along every axis, some of them outside the image."""
    whole = rng.integers(-2, 2, shape)
    return whole + rng.uniform(0.15, 0.85, shape)


def deform_case(x_shape, w_shape, out_shape, offset_group=1, mask=True, bias=True):
    nd = len(x_shape) - 2
    n = x_shape[0]
    k = int(np.prod(w_shape[2:]))
    inputs = [randn(*x_shape), randn(*w_shape),
              smooth_offsets((n, offset_group * k * nd, *out_shape), nd),
              randn(w_shape[0]) if bias else None,
              rng.uniform(0.2, 1.2, (n, offset_group * k, *out_shape)) if mask else None]
    while inputs[-1] is None:
        inputs.pop()
    return inputs


@pytest.mark.parametrize("case, attributes", [
    (deform_case((2, 2, 4, 5), (3, 2, 2, 2), (3, 4)), {}),
    (deform_case((1, 4, 5, 5), (4, 2, 3, 3), (3, 3), offset_group=2),
     {"group": 2, "offset_group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    (deform_case((1, 2, 6, 5), (2, 2, 2, 2), (6, 3), mask=False),
     {"dilations": [2, 2], "pads": [1, 0, 1, 0]}),
    (deform_case((2, 2, 6), (3, 2, 3), (4,), bias=False), {}),
    (deform_case((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), (2, 3, 2), mask=False, bias=False), {}),
])
def test_deform_conv_against_finite_differences(case, attributes):
    """dX, dW, d offset, dB and d mask (those the case has), at opset 19."""
    check_gradient("DeformConv", case, attributes, opset=19, second_order=False)


def test_deform_conv_with_a_mask_but_no_bias_and_opset_22():
    x, w, offset, _, mask = deform_case((1, 2, 4, 4), (2, 2, 2, 2), (3, 3))
    check_gradient("DeformConv", [x, w, offset, None, mask], {}, opset=22,
                   second_order=False)


def _deform_graph(inputs, attributes):
    names = ["x", "w", "offset", "b", "mask"][:len(inputs)]
    graph = Graph(name="deform", opsets={"": 19, "mixrt": 1})
    graph.inputs = [Value(name, TensorType(np.dtype(np.float64), np.shape(value)))
                    for name, value in zip(names, inputs)]
    graph.nodes = [Node("DeformConv", names, ["y"], name="deform", opset=19,
                        attributes=attributes),
                   Node("ReduceSum", ["y"], ["loss"], name="loss", opset=13,
                        attributes={"keepdims": 0})]
    graph.outputs = [Value("loss")]
    return graph, names


def test_only_the_gradients_asked_for_are_computed():
    """Frozen weights leave the weight side out; a graph-input image keeps d offset."""
    inputs = deform_case((1, 2, 4, 4), (2, 2, 2, 2), (3, 3))
    graph, names = _deform_graph(inputs, {})
    joint = gradient_graph(graph, "loss", ["offset", "mask"])
    session = mixrt.Session(joint.graph, opt_level=2)
    kinds = [n.attributes.get("weight_grad", 0) for n in session.graph.nodes
             if n.op_type == "DeformConvGrad"]
    assert kinds == [0], kinds  # the data-side node only
    got = session.run([joint.grads["offset"], joint.grads["mask"]], dict(zip(names, inputs)))
    assert got[0].shape == inputs[2].shape and got[1].shape == inputs[4].shape


def test_second_order_through_deform_conv_is_a_clear_error():
    inputs = deform_case((1, 2, 4, 4), (2, 2, 2, 2), (3, 3), mask=False, bias=False)
    graph, _ = _deform_graph(inputs, {})
    joint = gradient_graph(graph, "loss", ["x"])
    joint.graph.outputs = [Value(joint.grads["x"])]
    summed = Node("ReduceSum", [joint.grads["x"]], ["gsum"], name="gsum", opset=13,
                  attributes={"keepdims": 0})
    joint.graph.nodes.append(summed)
    joint.graph.outputs = [Value("gsum")]
    with pytest.raises(GradientError, match="DeformConvGrad"):
        gradient_graph(joint.graph, "gsum", ["w"])


def test_deform_conv_against_torchvision():
    torch = pytest.importorskip("torch")
    ops = pytest.importorskip("torchvision.ops")
    x, w, offset, b, mask = deform_case((2, 4, 6, 6), (4, 2, 3, 3), (3, 3), offset_group=2)
    attributes = {"group": 2, "offset_group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}
    graph, names = _deform_graph([x, w, offset, b, mask], attributes)
    joint = gradient_graph(graph, "loss", names)
    got = mixrt.Session(joint.graph).run([joint.grads[n] for n in names],
                                         dict(zip(names, [x, w, offset, b, mask])))
    tensors = [torch.tensor(a, requires_grad=True) for a in (x, w, offset, b, mask)]
    # torchvision's offsets are (dy, dx) pairs per tap, as ONNX's; its weight groups follow
    # the channel count
    ops.deform_conv2d(tensors[0], tensors[2], tensors[1], tensors[3], stride=2, padding=1,
                      mask=tensors[4]).sum().backward()
    for name, mine, theirs in zip(names, got, tensors):
        np.testing.assert_allclose(mine, theirs.grad.numpy(), rtol=1e-9, atol=1e-9,
                                   err_msg=name)


def test_a_deformable_layer_learns_its_offsets():
    """The target is what a DeformConv makes with other offsets; SGD on the offsets alone
    (the image and weights fixed) brings the squared error down a hundredfold."""
    x, w = randn(1, 1, 8, 8), randn(1, 1, 3, 3)
    true_offset = np.full((1, 18, 6, 6), 0.4)
    target = _forward_values(x, w, true_offset)
    names = ["x", "w", "offset"]
    graph = Graph(name="fit", opsets={"": 19, "mixrt": 1})
    graph.inputs = [Value(n, TensorType(np.dtype(np.float64), s))
                    for n, s in zip(names + ["target"], (x.shape, w.shape, true_offset.shape,
                                                         target.shape))]
    graph.nodes = [Node("DeformConv", names, ["y"], name="deform", opset=19),
                   Node("Sub", ["y", "target"], ["diff"], name="diff", opset=14),
                   Node("Mul", ["diff", "diff"], ["sq"], name="sq", opset=14),
                   Node("ReduceSum", ["sq"], ["loss"], name="loss", opset=13,
                        attributes={"keepdims": 0})]
    graph.outputs = [Value("loss")]
    joint = gradient_graph(graph, "loss", ["offset"])
    session = mixrt.Session(joint.graph)
    offset, losses = np.full_like(true_offset, 0.1), []
    for _ in range(60):
        loss, grad = session.run(["loss", joint.grads["offset"]],
                                 {"x": x, "w": w, "offset": offset, "target": target})
        losses.append(float(loss))
        offset = offset - 0.02 * grad
    assert losses[-1] < losses[0] / 100, losses[::10]


def _forward_values(x, w, offset):
    graph = Graph(name="forward", opsets={"": 19})
    names = ["x", "w", "offset"]
    graph.inputs = [Value(n, TensorType(np.dtype(np.float64), np.shape(v)))
                    for n, v in zip(names, (x, w, offset))]
    graph.nodes = [Node("DeformConv", names, ["y"], name="deform", opset=19)]
    graph.outputs = [Value("y")]
    return mixrt.Session(graph).run(None, dict(zip(names, (x, w, offset))))[0]


@needs_gpu
def test_the_gpu_kernels_agree_with_the_cpu_ones():
    x, w, offset, b, mask = deform_case((2, 4, 5, 5), (4, 2, 3, 3), (3, 3), offset_group=2)
    attributes = {"group": 2, "offset_group": 2, "pads": [0, 0, 0, 0]}
    graph, names = _deform_graph([x, w, offset, b, mask], attributes)
    joint = gradient_graph(graph, "loss", names)
    feeds = dict(zip(names, [x, w, offset, b, mask]))
    wanted = [joint.grads[n] for n in names]
    cpu = mixrt.Session(joint.graph).run(wanted, feeds)
    gpu = mixrt.Session(joint.graph, device="gpu").run(wanted, feeds)
    for name, a, g in zip(names, cpu, gpu):
        np.testing.assert_allclose(g, a, rtol=1e-10, atol=1e-10, err_msg=name)
