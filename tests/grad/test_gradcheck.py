"""The checker itself (tests/grad/gradcheck.py): the second order's projected differences
accept the true gradient and refuse one with a single element off by 1% of the gradient's
largest (a projection sums every element's tolerance, so an error far below the largest
element's scale may pass where the element-by-element check would have refused it)."""

from __future__ import annotations

import numpy as np
import pytest

import mixrt
from grad.gradcheck import _check_along_directions
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value


def cube_sum_session():
    """penalty = sum(x * x * x), whose gradient is 3 x^2."""
    graph = Graph()
    graph.inputs = [Value("x", TensorType(np.float64, (4, 5)))]
    graph.nodes = [Node("Mul", ["x", "x"], ["xx"], name="square", opset=17),
                   Node("Mul", ["xx", "x"], ["xxx"], name="cube", opset=17),
                   Node("ReduceSum", ["xxx"], ["penalty"], name="sum", opset=17,
                        attributes={"keepdims": 0})]
    graph.outputs = [Value("penalty")]
    return mixrt.Session(graph, opt_level=0)


@pytest.mark.parametrize("wrong", [None, (0, 0), (3, 4), (2, 1)])
def test_projected_differences_refuse_one_wrong_element(wrong):
    x = np.random.default_rng(0).standard_normal((4, 5))
    gradient = 3 * x * x
    if wrong is not None:
        gradient[wrong] += 0.01 * np.abs(gradient).max()
    check = lambda: _check_along_directions(  # noqa: E731
        cube_sum_session(), {"x": x}, "x", gradient, np.random.default_rng(1),
        rtol=1e-4, atol=1e-6, label="cube")
    if wrong is None:
        check()
    else:
        with pytest.raises(AssertionError, match="cube, direction"):
            check()
