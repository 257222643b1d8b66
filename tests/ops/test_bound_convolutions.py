"""A bound convolution (ops/compiled/bound_calls.py's ``bound_to``): its native calls'
arguments made once, when the arena binds it, and every later run gives the bits the
kernels give when called afresh, the feeds' contents new on each run, a residual and a bias
the run computes included."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.conv import conv_direct_cpu, pointwise_rows
from helpers import unbound_run


def _model(channels: int, outputs: int, computed_bias: bool):
    """The feed scaled (a convolution over a feed is not bound: a caller's array), a 3x3
    convolution with Relu (its bias a constant, or computed from the feed by each run), a
    1x1 convolution over its output with the first one's output added (a residual), a 1x1
    convolution to ``outputs`` channels and a 3x3 stride-2 MaxPool."""
    rng = np.random.default_rng(7)

    def weight(name, *shape):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.2).astype(np.float32), name)
    nodes = [helper.make_node("Mul", ["x", "gain"], ["scaled"]),
             helper.make_node("Conv", ["scaled", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
             helper.make_node("Add", ["c2", "r1"], ["s2"]),
             helper.make_node("Relu", ["s2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"]),
             helper.make_node("MaxPool", ["c3"], ["y"], kernel_shape=[3, 3], strides=[2, 2])]
    initializers = [weight("w1", channels, channels, 3, 3), weight("w2", channels, channels, 1, 1),
                    weight("b2", channels), weight("w3", outputs, channels, 1, 1),
                    weight("b3", outputs),
                    numpy_helper.from_array(np.array(1.5, np.float32), "gain")]
    if computed_bias:  # the feed's mean per channel through a small product
        nodes[:0] = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0, 2, 3],
                                      keepdims=0),
                     helper.make_node("MatMul", ["mean", "mix"], ["b1"])]
        initializers.append(weight("mix", channels, channels))
    else:
        initializers.append(weight("b1", channels))
    graph = helper.make_graph(
        nodes, "convolutions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", channels, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("channels, outputs", [(16, 16), (20, 24)])  # whole panels or not
@pytest.mark.parametrize("computed_bias", [False, True])
# planes of pixel rows (pointwise_rows.py: 5 x 7), small and larger ones; whole images
@pytest.mark.parametrize("batch, image", [(1, (5, 7)), (1, (12, 15)), (3, (9, 8)), (2, (30, 34))])
def test_bound_convolutions_give_the_kernels_bits_run_after_run(channels, outputs,
                                                                computed_bias, batch, image,
                                                                monkeypatch):
    model = _model(channels, outputs, computed_bias)
    # the reference a session of its own: its kernels' calls share nothing with the bound
    # ones' (a bias copied into a node's buffer, say)
    session, reference = mixrt.Session(model), mixrt.Session(model)
    rng = np.random.default_rng(batch)
    shape = (batch, channels, *image)
    for _ in range(6):  # the first runs record and bind, the later ones run bound
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        got = session.run(None, feeds)[0]
        np.testing.assert_array_equal(got, unbound_run(reference, feeds, monkeypatch))


def test_a_bound_convolution_makes_its_arguments_once(monkeypatch):
    """After binding, runs make no more of the direct convolution's prepared calls (nor the
    pixel rows' arguments): each bound step reuses what its binding made."""
    made = {"direct": 0, "rows": 0}
    prepared_init = conv_direct_cpu._Prepared.__init__

    def counted(self, *args):
        made["direct"] += 1
        prepared_init(self, *args)
    monkeypatch.setattr(conv_direct_cpu._Prepared, "__init__", counted)
    rows_scratch = pointwise_rows._rows_scratch

    def counted_rows(*args):
        made["rows"] += 1
        return rows_scratch(*args)
    monkeypatch.setattr(pointwise_rows, "_rows_scratch", counted_rows)
    session = mixrt.Session(_model(16, 16, False))
    rng = np.random.default_rng(0)
    for image, route in (((40, 44), "direct"), ((6, 7), "rows")):
        feeds = {"x": rng.standard_normal((1, 16, *image)).astype(np.float32)}
        for _ in range(4):
            session.run(None, feeds)
        before = dict(made)
        for _ in range(5):
            session.run(None, feeds)
        assert before[route] > 0  # the model's 1x1 convolutions took this route
        assert made == before, image
