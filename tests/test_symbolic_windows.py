"""Symbolic image sizes through strided windows: a convolution or pool over a named dim
gives a named output dim, the same name for the same arithmetic, so a residual Add after
strided convolutions is seen to keep its shape and joins the convolution before it, at
every image size a model's export leaves open."""

from __future__ import annotations

import itertools

import pytest

from mixrt.ops.conv.windows import inferred_out_dims, window_geometry
from mixrt.runtime.passes import optimize
from mixrt.runtime.passes.infer import infer_types
from test_passes import checked, graph_of, node, ops, rand

WINDOWS = [  # kernel, stride, dilation, pads, auto_pad, ceil_mode
    (3, 1, 1, [1, 1], "NOTSET", False),
    (3, 2, 1, [1, 1], "NOTSET", False),
    (1, 2, 1, [0, 0], "NOTSET", False),
    (7, 2, 1, [3, 3], "NOTSET", False),
    (3, 2, 1, [0, 1], "NOTSET", False),
    (3, 1, 2, [0, 0], "NOTSET", False),
    (5, 3, 1, [2, 2], "VALID", False),
    (3, 2, 1, None, "SAME_UPPER", False),
    (4, 3, 1, None, "SAME_LOWER", False),
    (3, 2, 1, [1, 1], "NOTSET", True),
    (3, 1, 1, [1, 1], "NOTSET", True),
]


def _evaluated(dim: str, size: int) -> int:
    """The symbolic dim's value where its input dim ``h`` is ``size`` (test-only eval)."""
    return eval(dim, {"__builtins__": {}}, {"h": size})  # noqa: S307


@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_a_named_dim_gives_the_expression_the_sizes_would(window):
    kernel, stride, dilation, pads, auto_pad, ceil_mode = window
    pads = None if pads is None else [pads[0], pads[1]]
    [symbolic] = inferred_out_dims(["h"], [kernel], [stride], [dilation], pads, auto_pad,
                                   ceil_mode)
    if ceil_mode and stride > 1:
        assert symbolic is None  # a last partial window: not one expression of h
        return
    assert isinstance(symbolic, str)
    span = (kernel - 1) * dilation + 1
    for size in range(span, 60):
        _, _, [want] = window_geometry([size], [kernel], [stride], [dilation], pads, auto_pad,
                                       ceil_mode)
        assert _evaluated(symbolic, size) == want, (symbolic, size)


def test_the_same_arithmetic_gives_the_same_name_and_a_kept_size_keeps_it():
    def out(dim, kernel, stride, pads):
        return inferred_out_dims([dim], [kernel], [stride], [1], pads, "NOTSET")[0]

    # ResNet's downsample (1x1, stride 2) and its main path's 3x3 (stride 2, pads 1)
    assert out("h", 1, 2, [0, 0]) == out("h", 3, 2, [1, 1]) == "(h+1)//2"
    assert out("h", 3, 1, [1, 1]) == "h"
    halved_twice = out(out("h", 3, 2, [1, 1]), 3, 2, [1, 1])
    assert halved_twice == "((h+1)//2+1)//2" and _evaluated(halved_twice, 37) == 10
    assert out("image height", 3, 1, [0, 0]) == "(image height)-2"
    assert inferred_out_dims([None, 9], [3, 3], [2, 2], [1, 1], [1, 1, 1, 1], "NOTSET") == \
        [None, 5]


def _strided_residual_block(downsample: bool):
    """A ResNet block over an image of open size: a stride-2 3x3 (and BatchNorm folded
    away), a 3x3, and the Add of the block's input brought down by a stride-2 1x1 (or, with
    no downsample, a stride-1 block after a stride-2 stem: MobileNetV2's shape)."""
    if downsample:
        nodes = [node("Conv", ["x", "W1"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
                 node("Relu", ["a"], ["r"]),
                 node("Conv", ["r", "W2"], ["b"], pads=[1, 1, 1, 1]),
                 node("Conv", ["x", "D"], ["d"], strides=[2, 2]),
                 node("Add", ["b", "d"], ["s"]), node("Relu", ["s"], ["y"])]
        weights = {"W1": rand(6, 4, 3, 3), "W2": rand(6, 6, 3, 3), "D": rand(6, 4, 1, 1)}
    else:
        nodes = [node("Conv", ["x", "W1"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
                 node("Conv", ["a", "W2"], ["b"]),
                 node("Add", ["a", "b"], ["y"])]
        weights = {"W1": rand(6, 4, 3, 3), "W2": rand(6, 6, 1, 1)}
    return graph_of(nodes, [("x", ["batch", 4, "height", "width"])],
                    [("y", ["batch", 6, None, None])], weights)


@pytest.mark.parametrize("downsample", [True, False])
def test_a_residual_after_strided_convolutions_joins_the_convolution(downsample):
    g = _strided_residual_block(downsample)
    types = infer_types(g)
    assert types["y"].shape == ("batch", 6, "(height+1)//2", "(width+1)//2")
    optimized = optimize(g, 2)
    assert "Add" not in ops(optimized)
    fused = [n for n in optimized.nodes if n.op_type == "FusedConv" and len(n.inputs) == 4]
    assert len(fused) == 1  # the residual rides on one convolution's output
    for batch, height, width in itertools.product([1, 2], [9, 16], [7, 12]):
        checked(g, {"x": rand(batch, 4, height, width)}, 2, rtol=1e-4, atol=1e-4)


def test_addends_of_different_arithmetic_are_not_taken_for_one_shape():
    # a 3x3 halving with pads, (h+1)//2, and a 2x2 halving without, h//2: one size at even
    # heights only, so nothing lets the fusion assume it
    nodes = [node("Conv", ["x", "W1"], ["a"], pads=[1, 0, 1, 0], strides=[2, 1]),
             node("Conv", ["x", "W2"], ["b"], strides=[2, 1]),
             node("Add", ["a", "b"], ["y"])]
    g = graph_of(nodes, [("x", [1, 4, "height", 5])], [("y", [1, 6, None, 5])],
                 {"W1": rand(6, 4, 3, 1), "W2": rand(6, 4, 2, 1)})
    types = infer_types(g)
    assert (types["a"].shape[2], types["b"].shape[2]) == ("(height+1)//2", "height//2")
    optimized = checked(g, {"x": rand(1, 4, 10, 5)}, 2, rtol=1e-4, atol=1e-4)
    assert not any(n.op_type == "FusedConv" and len(n.inputs) == 4 for n in optimized.nodes)
