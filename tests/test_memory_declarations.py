"""What an op may do with memory is declared where its kernel is registered (``@op(...,
memory=...)``, ``random=True``) and the planner reads that, not a list of op names: an op of
a test domain, registered once without a declaration and once with one, is planned each
way."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.ops.ir.registry import (IN_PLACE, REGISTRY, RESHAPE, SHRINKING_IN_PLACE, SLICES,
                                   VIEW, op)
from mixrt.ops.ir.types import same_as_input

DOMAIN = "test.memory"


@pytest.fixture
def doubling_ops():
    """``Double`` (2x, elementwise, into ``out=``) declared IN_PLACE, ``DoubleAside`` the
    same kernel undeclared, and ``Same`` (its input itself) declared VIEW; removed after."""
    def double(xp, X, *, out=None):
        return xp.multiply(X, 2, out=out)

    def same(xp, X):
        return X
    handles = [op("Double", 1, domain=DOMAIN, memory=IN_PLACE)(double),
               op("DoubleAside", 1, domain=DOMAIN)(double),
               op("Same", 1, domain=DOMAIN, memory=VIEW)(same)]
    for handle in handles:
        handle.infer(same_as_input)
    yield
    for name in ("Double", "DoubleAside", "Same"):
        REGISTRY._ops.pop((DOMAIN, name))
    REGISTRY.forget_properties()


def _chain(middle: str):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node(middle, ["r"], ["d"], domain=DOMAIN),
             helper.make_node("Neg", ["d"], ["y"])]
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    return helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def _plan(middle: str):
    session = mixrt.Session(_chain(middle), opt_level=0)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    factor = 1 if middle == "Same" else 2
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], -factor * np.maximum(x, 0))
    return session.memory_plan({"x": x})


def test_a_declared_in_place_op_writes_over_its_dying_input(doubling_ops):
    assert ("r", "d") in _plan("Double").inplace
    assert ("r", "d") not in _plan("DoubleAside").inplace


def test_a_declared_view_gets_no_slot_of_its_own(doubling_ops):
    assert "d" not in {life.name for life in _plan("Same").lifetimes}
    assert "d" in {life.name for life in _plan("DoubleAside").lifetimes}


def test_the_onnx_ops_declare_what_the_planner_read_from_its_lists():
    expected = {
        RESHAPE: ("Reshape", "Flatten", "Squeeze", "Unsqueeze"), VIEW: ("Identity",),
        SLICES: ("Split",), SHRINKING_IN_PLACE: ("MaxPool", "AveragePool"),
        IN_PLACE: ("Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp",
                   "Neg", "Abs", "Sqrt", "Clip", "Erf", "BatchNormalization", "LRN")}
    for kind, names in expected.items():
        for name in names:
            for domain in ("", "ai.onnx"):  # as a node spells the default domain either way
                assert REGISTRY.memory_of(domain, name) == kind, name
            assert all(k.memory == kind for k in REGISTRY.versions("", name)), name
    assert REGISTRY.memory_of("mixrt", "FusedElementwise") == IN_PLACE
    assert REGISTRY.memory_of("mixrt", "BlockGrad") == VIEW
    assert REGISTRY.memory_of("", "MatMul") is None
    for name in ("RandomNormal", "RandomUniformLike", "Bernoulli", "Multinomial", "Dropout"):
        assert REGISTRY.is_random("", name), name
    assert not REGISTRY.is_random("", "Add")


def test_an_unknown_memory_kind_is_refused():
    with pytest.raises(ValueError, match="memory kind 'alias'"):
        op("Nothing", 1, domain=DOMAIN, memory="alias")
