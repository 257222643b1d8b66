"""Concats whose inputs the plan lays inside their output (runtime/concat_in_place.py): the
producers write in place, the Concat copies nothing, and the results are the plain ones."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.ops.shape.shape_cpu import in_place
from mixrt.runtime.concat_in_place import concat_in_place


def fire(nested=False):
    """x -> two convolutions (1x1 and 3x3) -> Relu each -> Concat on channels -> a 1x1
    convolution; ``nested``: the Concat joined again with a third branch (DenseNet's
    blocks), the first Concat read by a Relu before."""
    rng = np.random.default_rng(3)
    weights = {"wa": rng.standard_normal((16, 8, 1, 1)), "wb": rng.standard_normal((16, 8, 3, 3)),
               "wc": rng.standard_normal((16, 8, 1, 1)), "wd": rng.standard_normal((4, 48, 1, 1)),
               "we": rng.standard_normal((4, 32, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"]),
             helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]), helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("Concat", ["ar", "br"], ["c"], axis=1)]
    if nested:
        nodes += [helper.make_node("Relu", ["c"], ["cr"]),
                  helper.make_node("Conv", ["x", "wc"], ["k"]),
                  helper.make_node("Concat", ["c", "k"], ["c2"], axis=1),
                  helper.make_node("Conv", ["c2", "wd"], ["y"]),
                  helper.make_node("Conv", ["cr", "we"], ["z"])]
        outputs = ["y", "z"]
    else:
        nodes.append(helper.make_node("Conv", ["c", "we"], ["y"]))
        outputs = ["y"]
    graph = helper.make_graph(
        nodes, "fire", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                      ["n", 8, "h", "w"])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        initializer=[numpy_helper.from_array(v.astype(np.float32) * 0.2, k)
                     for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(shape, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _plain(model, feeds):
    """A fresh session's first run: the discovery run, without an arena."""
    return mixrt.Session(model, opt_level=0).run(None, feeds)


def _plan(session, shape):
    return next(plan for plan in session._plans.values()
                if plan.signature[0][1][0] == shape)


@pytest.mark.parametrize("nested", [False, True])
def test_inputs_are_made_inside_the_concat_at_batch_1(nested):
    session = mixrt.Session(fire(nested), opt_level=0)
    shape = (1, 8, 8, 10)  # each branch's 16 x 8 x 10 floats: 5,120 bytes, aligned
    for seed in range(3):
        for got, expected in zip(session.run(None, _feeds(shape, seed)),
                                 _plain(fire(nested), _feeds(shape, seed))):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    plan = _plan(session, shape)
    slots = plan.slots
    assert slots["ar"].offset == slots["c"].offset
    assert slots["br"].offset == slots["c"].offset + 16 * 8 * 10 * 4
    lives = {life.name for life in plan.memory.lifetimes}
    assert not lives & {"ar", "br"}
    if nested:  # the first Concat lies inside the second, the third branch after it
        assert slots["c"].offset == slots["c2"].offset
        assert slots["k"].offset == slots["c2"].offset + 32 * 8 * 10 * 4
        assert "c2" in lives and not lives & {"c", "k"}
    else:
        assert "c" in lives


def test_no_concat_in_place_where_its_parts_are_not_contiguous():
    session = mixrt.Session(fire(), opt_level=0)
    shape = (2, 8, 4, 4)  # two images: each one's channels of both branches interleave
    for seed in range(2):
        np.testing.assert_allclose(session.run(None, _feeds(shape, seed))[0],
                                   _plain(fire(), _feeds(shape, seed))[0], rtol=1e-6,
                                   atol=1e-6)
    lives = {life.name for life in _plan(session, shape).memory.lifetimes}
    assert {"ar", "br", "c"} <= lives


def test_a_part_that_would_start_unaligned_is_not_laid_inside():
    node = helper.make_node("Concat", ["p", "q"], ["c"], axis=1)
    node = type("Node", (), {"inputs": node.input, "outputs": node.output,
                             "attributes": {"axis": 1}})

    def shaped(*shape):
        return np.empty(shape, np.float32)
    aligned = {"p": shaped(1, 16, 5, 5), "q": shaped(1, 3, 5, 5), "c": shaped(1, 19, 5, 5)}
    assert concat_in_place(node, aligned)  # q starts at 1,600 bytes: 25 x 64
    unaligned = {"p": shaped(1, 3, 5, 5), "q": shaped(1, 16, 5, 5), "c": shaped(1, 19, 5, 5)}
    assert not concat_in_place(node, unaligned)  # q would start at 300 bytes
    batched = {"p": shaped(2, 16, 5, 5), "q": shaped(2, 16, 5, 5), "c": shaped(2, 32, 5, 5)}
    assert not concat_in_place(node, batched)


def test_the_kernel_copies_nothing_only_where_the_parts_are_in_place():
    out = np.zeros((1, 6, 2), np.float32)
    parts = [out[:, :2], out[:, 2:]]
    assert in_place(parts, out, 1)
    assert not in_place(parts[::-1], out, 1)  # in place, but in the other order
    assert not in_place([out[:, :2], out[:, 3:]], out, 1)  # a gap
    wide = np.zeros((2, 4), np.float32)  # consecutive bytes, but rows interleave on axis 1
    flat = wide.reshape(-1)
    assert not in_place([flat[:4].reshape(2, 2), flat[4:].reshape(2, 2)], wide, 1)
    assert in_place([wide[:1], wide[1:]], wide, 0)
