"""Gradients of convolutions, pools and normalizations (ops/conv/conv_grad.py, ops/nn/norm_grad.py)
against float64 finite differences, across their attribute spaces; a ResNet-like block against
torch.autograd where PyTorch is importable; and a check that the kernels never import CuPy."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mixrt
from grad.gradcheck import check_gradient
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

rng = np.random.default_rng(11)


def randn(*shape):
    return rng.standard_normal(shape)


def positive(*shape):
    return rng.uniform(0.5, 2.0, shape)


def distinct(*shape):
    """Values with no two alike, so every max-pool window has one clear maximum (finite
    differences are meaningless at a tie)."""
    return rng.permutation(np.prod(shape)).reshape(shape) * 0.1 + randn(*shape) * 0.01


# -- Conv ---------------------------------------------------------------------------------

@pytest.mark.parametrize("x_shape, w_shape, attributes", [
    ((2, 3, 7), (4, 3, 3), {}),
    ((2, 3, 8), (4, 3, 3), {"strides": [2], "pads": [1, 2], "dilations": [2]}),
    ((1, 4, 7), (4, 2, 2), {"group": 2, "auto_pad": "SAME_UPPER", "strides": [2]}),
], ids=["plain", "strided-padded-dilated", "grouped-same-upper"])
def test_conv_1d(x_shape, w_shape, attributes):
    check_gradient("Conv", [randn(*x_shape), randn(*w_shape), randn(w_shape[0])], attributes)


@pytest.mark.parametrize("attributes", [
    {},
    {"pads": [1, 1, 1, 1]},
    {"pads": [1, 0, 2, 1], "strides": [2, 1]},
    {"strides": [2, 2], "dilations": [1, 2], "pads": [0, 2, 1, 1]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 1]},
    {"auto_pad": "VALID", "strides": [1, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "dilations": [2, 2]},
], ids=["plain", "pads", "asymmetric-pads-strides", "dilations", "same-upper",
        "same-lower", "valid", "kernel-shape-attribute"])
def test_conv_2d(attributes):
    check_gradient("Conv", [randn(2, 2, 6, 5), randn(3, 2, 3, 3), randn(3)], attributes)


@pytest.mark.parametrize("channels, out_channels, group", [
    (4, 6, 2), (3, 3, 3), (3, 6, 3)], ids=["grouped", "depthwise", "depthwise-multiplier"])
def test_conv_2d_groups(channels, out_channels, group):
    w = randn(out_channels, channels // group, 3, 3)
    check_gradient("Conv", [randn(2, channels, 5, 5), w, randn(out_channels)],
                   {"group": group, "pads": [1, 1, 1, 1], "strides": [2, 1]})


def test_conv_2d_pointwise_without_bias_at_old_opsets():
    for opset in (1, 11):
        check_gradient("Conv", [randn(2, 3, 4, 4), randn(5, 3, 1, 1)], {"strides": [2, 2]},
                       opset=opset)


@pytest.mark.parametrize("attributes", [
    {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 1]},
    {"dilations": [2, 1, 1], "group": 2, "auto_pad": "SAME_UPPER"},
], ids=["padded-strided", "dilated-grouped-same"])
def test_conv_3d(attributes):
    group = attributes.get("group", 1)
    w = randn(2, 2 // group, 2, 2, 2)
    check_gradient("Conv", [randn(1, 2, 4, 4, 3), w, randn(2)], attributes)


def test_conv_grad_in_batch_parts_matches_one_part(monkeypatch):
    """Big batches build their columns a few samples at a time; the sums must not change."""
    from mixrt.ops.conv import conv_grad
    x, w, dy = randn(3, 4, 5, 5), randn(6, 2, 3, 3), randn(3, 6, 3, 3)
    attributes = {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}
    whole = conv_grad.conv_grad(np, dy, x, w, bias_grad=1, **attributes)
    monkeypatch.setattr(conv_grad, "_COLUMNS_BUDGET", 1)
    parts = conv_grad.conv_grad(np, dy, x, w, bias_grad=1, **attributes)
    for got, want in zip(parts, whole):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_first_layer_input_gradient_is_dropped_by_the_optimizer():
    """dX and dW come from separate nodes, so a graph that differentiates only the weights
    never computes the first convolution's input gradient."""
    from mixrt.runtime.passes import optimize
    shapes = {"x": (1, 2, 4, 4), "w1": (2, 2, 3, 3), "w2": (2, 2, 1, 1)}
    graph = Graph(name="two_convs", opsets={"": 17})
    graph.inputs = [Value(k, TensorType(np.dtype(np.float64), s)) for k, s in shapes.items()]
    graph.nodes = [Node("Conv", ["x", "w1"], ["c1"], name="conv1", opset=17),
                   Node("Conv", ["c1", "w2"], ["c2"], name="conv2", opset=17),
                   Node("ReduceSum", ["c2"], ["loss"], name="sum", opset=17,
                        attributes={"keepdims": 0})]
    graph.outputs = [Value("loss")]
    joint = optimize(gradient_graph(graph, "loss", ["w1", "w2"]).graph, 1)
    flags = sorted((n.attributes["input_grad"], n.inputs[2]) for n in joint.nodes
                   if n.op_type == "ConvGrad")
    assert flags == [(0, "w1"), (0, "w2"), (1, "w2")]


# -- ConvTranspose ------------------------------------------------------------------------

@pytest.mark.parametrize("x_shape, w_shape, attributes", [
    ((2, 3, 4), (3, 2, 3), {"strides": [2], "pads": [1, 0], "output_padding": [1]}),
    ((2, 2, 3, 3), (2, 3, 3, 3), {}),
    ((1, 4, 3, 3), (4, 1, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 0, 1],
                                  "dilations": [1, 2]}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [7, 6]}),
    ((1, 2, 3, 2), (2, 2, 2, 2), {"strides": [2, 3], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 3, 2), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 2, 3, 2), (2, 1, 2, 2, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 0]}),
], ids=["1d-output-padding", "2d-plain", "2d-grouped-dilated", "2d-output-shape",
        "2d-same-upper-short-kernel", "2d-same-lower", "3d"])
def test_conv_transpose(x_shape, w_shape, attributes):
    out_channels = w_shape[1] * attributes.get("group", 1)
    check_gradient("ConvTranspose", [randn(*x_shape), randn(*w_shape), randn(out_channels)],
                   attributes)


def test_conv_transpose_without_bias():
    check_gradient("ConvTranspose", [randn(1, 2, 3, 3), randn(2, 2, 2, 2)],
                   {"strides": [2, 2]}, opset=11)


# -- pools ----------------------------------------------------------------------------------

POOL_CASES = [
    ((2, 2, 7), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((2, 2, 6, 5), {"kernel_shape": [2, 2]}),
    ((1, 2, 6, 5), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 6, 5), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1],
                    "ceil_mode": 1}),
    ((1, 2, 7, 6), {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [2, 1],
                    "ceil_mode": 1}),
    ((1, 2, 5, 5), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 5, 4), {"kernel_shape": [2, 3], "strides": [2, 1], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 4, 3, 4), {"kernel_shape": [2, 2, 3], "strides": [2, 1, 2],
                       "pads": [1, 0, 1, 0, 1, 1]}),
]
POOL_IDS = ["1d", "2d-plain", "2d-padded", "2d-ceil", "2d-dilated-ceil", "2d-same-upper",
            "2d-same-lower", "3d"]


@pytest.mark.parametrize("x_shape, attributes", POOL_CASES, ids=POOL_IDS)
def test_max_pool(x_shape, attributes):
    check_gradient("MaxPool", [distinct(*x_shape)], attributes)


def test_max_pool_indices_output_carries_no_gradient():
    check_gradient("MaxPool", [distinct(1, 2, 5, 5)],
                   {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                   outputs=2, loss_outputs=[0])


def test_max_pool_at_older_opsets():
    check_gradient("MaxPool", [distinct(1, 2, 5, 5)], {"kernel_shape": [2, 2]}, opset=7)
    check_gradient("MaxPool", [distinct(1, 2, 5, 5)],
                   {"kernel_shape": [2, 2], "ceil_mode": 1, "strides": [2, 2]}, opset=10)


def test_max_pool_ties_go_to_the_first_maximum():
    """Overlapping windows of equal values: each window's gradient lands on its first
    (row-major) element, as PyTorch does, not shared among the ties."""
    x = np.zeros((1, 1, 3, 3))
    got = _symbolic_grad("MaxPool", x, {"kernel_shape": [2, 2]}, np.ones((1, 1, 2, 2)))
    want = np.zeros((1, 1, 3, 3))
    want[0, 0, :2, :2] = 1.0
    np.testing.assert_array_equal(got, want)


def test_global_max_pool_ties_go_to_the_first_maximum():
    x = np.array([[[[1.0, 3.0], [3.0, 0.0]]]])
    got = _symbolic_grad("GlobalMaxPool", x, {}, np.full((1, 1, 1, 1), 2.0))
    np.testing.assert_array_equal(got, [[[[0.0, 2.0], [0.0, 0.0]]]])


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("x_shape, attributes", POOL_CASES, ids=POOL_IDS)
def test_average_pool(x_shape, attributes, count_include_pad):
    check_gradient("AveragePool", [randn(*x_shape)],
                   {**attributes, "count_include_pad": count_include_pad}, opset=19)


def test_average_pool_at_opset_7():
    check_gradient("AveragePool", [randn(1, 2, 5, 5)],
                   {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
                   opset=7)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("x_shape, attributes", [POOL_CASES[2], POOL_CASES[3], POOL_CASES[0]],
                         ids=["2d-padded", "2d-ceil", "1d"])
def test_lp_pool(x_shape, attributes, p):
    # ceil_mode windows have no expansion (AveragePool does not count their overhang as
    # padding), so their LpPoolGrad has no gradient of its own
    check_gradient("LpPool", [randn(*x_shape)], {**attributes, "p": p}, opset=18,
                   second_order=not attributes.get("ceil_mode"))


@pytest.mark.parametrize("op_type, make", [
    ("GlobalAveragePool", randn), ("GlobalMaxPool", distinct), ("GlobalLpPool", randn)])
@pytest.mark.parametrize("x_shape", [(2, 3, 5), (2, 2, 3, 4), (1, 2, 2, 3, 2)],
                         ids=["1d", "2d", "3d"])
def test_global_pools(op_type, make, x_shape):
    check_gradient(op_type, [make(*x_shape)])


def test_global_lp_pool_p3():
    check_gradient("GlobalLpPool", [randn(2, 2, 3, 3)], {"p": 3})


# -- BatchNormalization -------------------------------------------------------------------

def _batch_norm_inputs(*x_shape, params=None):
    channels = params or (x_shape[1],)
    return [randn(*x_shape), positive(*channels), randn(*channels), randn(*channels),
            positive(*channels)]


@pytest.mark.parametrize("opset, attributes", [
    (15, {}), (15, {"training_mode": 0, "epsilon": 1e-3}), (14, {}), (9, {}),
    (7, {"spatial": 1}), (6, {})])
@pytest.mark.parametrize("x_shape", [(3, 2), (2, 3, 4), (2, 2, 3, 2)], ids=["2d", "3d", "4d"])
def test_batch_norm_inference(opset, attributes, x_shape):
    """X, scale, B and the running mean and var all get gradients (y is affine in X)."""
    check_gradient("BatchNormalization", _batch_norm_inputs(*x_shape), attributes,
                   opset=opset)


def test_batch_norm_inference_per_activation_statistics():
    inputs = _batch_norm_inputs(3, 2, 4, params=(2, 4))
    check_gradient("BatchNormalization", inputs, {"spatial": 0}, opset=7)


@pytest.mark.parametrize("opset", [14, 15])
@pytest.mark.parametrize("x_shape", [(4, 3), (2, 3, 4), (2, 2, 3, 3)], ids=["2d", "3d", "4d"])
def test_batch_norm_training(opset, x_shape):
    """Batch statistics: dX goes through the batch mean and variance; the running mean and
    var inputs do not reach Y (zero gradient) and the running outputs are not differentiated."""
    check_gradient("BatchNormalization", _batch_norm_inputs(*x_shape),
                   {"training_mode": 1, "momentum": 0.8}, opset=opset, outputs=3,
                   loss_outputs=[0])


@pytest.mark.parametrize("opset", [7, 9])
def test_batch_norm_training_by_outputs_before_opset_14(opset):
    check_gradient("BatchNormalization", _batch_norm_inputs(2, 3, 2, 3), {"epsilon": 1e-3},
                   opset=opset, outputs=5, loss_outputs=[0])


# -- Layer, Instance and Group normalization ----------------------------------------------

@pytest.mark.parametrize("axis, with_bias", [(-1, True), (1, True), (0, False), (2, False)])
def test_layer_norm(axis, with_bias):
    x = randn(2, 3, 4)
    normalized = x.shape[axis:]
    inputs = [x, positive(*normalized), randn(*normalized) if with_bias else None]
    check_gradient("LayerNormalization", inputs, {"axis": axis, "stash_type": 11})


def test_layer_norm_broadcast_scale_and_statistics_outputs():
    """A scale broadcast over part of the normalized shape; Mean and InvStdDev in the loss."""
    x = randn(2, 3, 4)
    check_gradient("LayerNormalization", [x, positive(1, 4), randn(4)],
                   {"axis": 1, "stash_type": 11, "epsilon": 1e-3}, outputs=3)


@pytest.mark.parametrize("x_shape", [(2, 3, 5), (2, 2, 3, 3), (1, 2, 2, 2, 3)],
                         ids=["1d", "2d", "3d"])
def test_instance_norm(x_shape):
    c = x_shape[1]
    check_gradient("InstanceNormalization", [randn(*x_shape), positive(c), randn(c)],
                   {"epsilon": 1e-3})


@pytest.mark.parametrize("num_groups", [1, 2, 4])
def test_group_norm(num_groups):
    check_gradient("GroupNormalization", [randn(2, 4, 3, 2), positive(4), randn(4)],
                   {"num_groups": num_groups, "stash_type": 11}, opset=21)


def test_group_norm_opset_18_per_group_parameters():
    check_gradient("GroupNormalization", [randn(2, 4, 3), positive(2), randn(2)],
                   {"num_groups": 2, "epsilon": 1e-3}, opset=18)


# -- LRN and LpNormalization --------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_lrn(size):
    check_gradient("LRN", [randn(2, 5, 3, 2)],
                   {"size": size, "alpha": 0.3, "beta": 0.6, "bias": 1.5})


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_lp_normalization(p, axis):
    check_gradient("LpNormalization", [randn(3, 4, 2)], {"p": p, "axis": axis})


# -- RMSNormalization and MeanVarianceNormalization: gradients from their expansions ------

@pytest.mark.parametrize("axis, scale_shape", [(-1, (4,)), (1, (3, 4)), (0, (2, 3, 4))])
def test_rms_normalization(axis, scale_shape):
    check_gradient("RMSNormalization", [randn(2, 3, 4), randn(*scale_shape)],
                   {"axis": axis, "epsilon": 1e-3, "stash_type": 11}, opset=23)


@pytest.mark.parametrize("axes", [None, [1], [0, 1, 2, 3]])
def test_mean_variance_normalization(axes):
    attributes = {} if axes is None else {"axes": axes}
    check_gradient("MeanVarianceNormalization", [randn(2, 3, 2, 2)], attributes, opset=13,
                   rtol=1e-4)


# -- helpers --------------------------------------------------------------------------------

def _symbolic_grad(op_type, x, attributes, upstream):
    """d sum(Y * upstream) / dX of a one-node graph, run through a Session."""
    graph = Graph(name="tie", opsets={"": 17})
    graph.inputs = [Value("x", TensorType(x.dtype, x.shape)),
                    Value("r", TensorType(upstream.dtype, upstream.shape))]
    graph.nodes = [Node(op_type, ["x"], ["y"], name="pool", opset=17, attributes=attributes),
                   Node("Mul", ["y", "r"], ["m"], name="weigh", opset=17),
                   Node("ReduceSum", ["m"], ["loss"], name="sum", opset=17,
                        attributes={"keepdims": 0})]
    graph.outputs = [Value("loss")]
    joint = gradient_graph(graph, "loss", ["x"])
    return mixrt.Session(joint.graph).run([joint.grads["x"]], {"x": x, "r": upstream})[0]


# -- a ResNet-like block against torch.autograd -------------------------------------------

def _resnet_block_graph(shapes):
    """conv 3x3 -> BatchNorm (training) -> Relu -> MaxPool 3x3/2 -> grouped conv 3x3/2 with
    bias -> GlobalAveragePool, loss = sum(out * r)."""
    graph = Graph(name="block", opsets={"": 15})
    graph.inputs = [Value(name, TensorType(np.dtype(np.float32), shape))
                    for name, shape in shapes.items()]
    graph.nodes = [
        Node("Conv", ["x", "w1"], ["c1"], name="conv1", opset=15,
             attributes={"pads": [1, 1, 1, 1]}),
        Node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["bn"],
             name="bn", opset=15, attributes={"training_mode": 1, "epsilon": 1e-5}),
        Node("Relu", ["bn"], ["act"], name="relu", opset=15),
        Node("MaxPool", ["act"], ["pooled"], name="pool", opset=15,
             attributes={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        Node("Conv", ["pooled", "w2", "b2"], ["c2"], name="conv2", opset=15,
             attributes={"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 2}),
        Node("GlobalAveragePool", ["c2"], ["out"], name="gap", opset=15),
        Node("Mul", ["out", "r"], ["weighted"], name="weigh", opset=15),
        Node("ReduceSum", ["weighted"], ["loss"], name="sum", opset=15,
             attributes={"keepdims": 0}),
    ]
    graph.outputs = [Value("loss")]
    return graph


def _torch_block(torch, feeds):
    functional = torch.nn.functional
    leaves = {k: torch.tensor(v, requires_grad=k in ("x", "w1", "gamma", "beta", "w2", "b2"))
              for k, v in feeds.items()}
    t = leaves
    y = functional.conv2d(t["x"], t["w1"], padding=1)
    y = functional.batch_norm(y, t["mean"].clone(), t["var"].clone(), t["gamma"], t["beta"],
                              training=True, eps=1e-5)
    y = functional.max_pool2d(functional.relu(y), 3, stride=2, padding=1)
    y = functional.conv2d(y, t["w2"], t["b2"], stride=2, padding=1, groups=2)
    loss = (y.mean(dim=(2, 3), keepdim=True) * t["r"]).sum()
    loss.backward()
    return {k: v.grad.numpy() for k, v in leaves.items() if v.grad is not None}


@pytest.mark.parametrize("opt_level", [0, 2])
def test_resnet_block_matches_torch_autograd(opt_level):
    torch = pytest.importorskip("torch")
    block_rng = np.random.default_rng(3)
    shapes = {"x": (2, 16, 16, 16), "w1": (16, 16, 3, 3), "gamma": (16,), "beta": (16,),
              "mean": (16,), "var": (16,), "w2": (32, 8, 3, 3), "b2": (32,),
              "r": (2, 32, 1, 1)}
    feeds = {k: block_rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    feeds["w1"] *= 0.1
    feeds["w2"] *= 0.1
    feeds["var"] = np.abs(feeds["var"]) + 0.5
    wrt = ["x", "w1", "gamma", "beta", "w2", "b2"]
    joint = gradient_graph(_resnet_block_graph(shapes), "loss", wrt)
    session = mixrt.Session(joint.graph, opt_level=opt_level)
    got = dict(zip(wrt, session.run([joint.grads[w] for w in wrt], feeds)))
    want = _torch_block(torch, feeds)
    for name in wrt:
        scale = float(np.abs(want[name]).max())
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5 * scale,
                                   err_msg=f"d loss / d {name}")


# -- no CuPy on a CPU machine ---------------------------------------------------------------

def test_backward_kernels_never_import_cupy():
    """On a machine without CuPy the kernels must not try to import it: run a
    conv/pool/norm backward graph in a fresh interpreter that refuses any cupy import."""
    script = textwrap.dedent("""
        import sys
        tried = []
        class RefuseCupy:
            def find_spec(self, name, path=None, target=None):
                if name == "cupy" or name.startswith("cupy."):
                    tried.append(name)
                    raise ImportError("cupy is not installed here")
                return None
        sys.meta_path.insert(0, RefuseCupy())
        sys.path.insert(0, sys.argv[1])
        from grad.gradcheck import check_gradient
        import numpy as np
        rng = np.random.default_rng(0)
        r = lambda *s: rng.standard_normal(s)
        check_gradient("Conv", [r(1, 2, 4, 4), r(2, 1, 3, 3), r(2)],
                       {"group": 2, "pads": [1, 1, 1, 1]})
        check_gradient("ConvTranspose", [r(1, 2, 3, 3), r(2, 1, 2, 2)], {"strides": [2, 2]})
        for op_type in ("MaxPool", "AveragePool", "LpPool"):
            check_gradient(op_type, [r(1, 1, 4, 4)], {"kernel_shape": [2, 2]})
        for op_type in ("GlobalAveragePool", "GlobalMaxPool", "LRN"):
            check_gradient(op_type, [r(1, 3, 3, 3)], {"size": 3} if op_type == "LRN" else {})
        check_gradient("BatchNormalization", [r(2, 2, 3), r(2), r(2), r(2), r(2) ** 2 + 1],
                       {"training_mode": 1}, outputs=3, loss_outputs=[0])
        check_gradient("LayerNormalization", [r(2, 3), r(3), r(3)], {"stash_type": 11})
        assert not tried and "cupy" not in sys.modules, tried
    """)
    tests_dir = str(__import__("pathlib").Path(__file__).parents[1])
    result = subprocess.run([sys.executable, "-c", script, tests_dir], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
