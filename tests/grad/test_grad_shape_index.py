"""Gradients of the shape, layout, cast, Where, Einsum and gather/scatter ops against float64
finite differences (gradcheck.check_gradient), plus the same gradients built for inputs
whose dims are symbolic (the Shape-node paths) compared with the static ones."""

import numpy as np
import pytest

import mixrt
from mixrt.errors import GradientError
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

from grad.gradcheck import check_gradient

rng = np.random.default_rng(11)


def randn(*shape):
    return rng.standard_normal(shape)


def ints(*values):
    return np.array(values, dtype=np.int64)


# -- a one-node graph whose input dims may be symbolic ------------------------------------------

def weighted_gradients(op_type, inputs, attributes=None, *, constants=(), opset=17,
                       outputs=1, symbolic=False):
    """d sum_k sum(Y_k * W_k) / d every fed float input, W_k fixed; with ``symbolic`` the
    graph declares each fed input with named dims only, so no gradient sees a static shape."""
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    outs = [f"y{k}" for k in range(outputs)]
    graph = Graph(name=f"symbolic_{op_type}", opsets={"": opset, "mixrt": 1})
    feeds = {}
    for i, x in enumerate(inputs):
        if x is None:
            continue
        if i in constants:
            graph.initializers[names[i]] = np.asarray(x)
            continue
        dims = tuple(f"n{i}_{d}" for d in range(x.ndim)) if symbolic else x.shape
        graph.inputs.append(Value(names[i], TensorType(x.dtype, dims)))
        feeds[names[i]] = x
    graph.nodes.append(Node(op_type, names, outs, name=op_type, opset=opset,
                            attributes=attributes or {}))
    graph.outputs = [Value(name) for name in outs]
    values = mixrt.Session(graph, opt_level=0).run(None, feeds)
    terms = []
    for k, value in enumerate(values):
        feeds[f"w{k}"] = np.linspace(-1.0, 2.0, value.size).reshape(value.shape).astype(
            value.dtype)
        graph.inputs.append(Value(f"w{k}", TensorType(value.dtype, None)))
        graph.nodes.append(Node("Mul", [outs[k], f"w{k}"], [f"m{k}"], name=f"m{k}", opset=17))
        graph.nodes.append(Node("ReduceSum", [f"m{k}"], [f"s{k}"], name=f"s{k}", opset=17,
                                attributes={"keepdims": 0}))
        terms.append(f"s{k}")
    graph.nodes.append(Node("Sum", terms, ["loss"], name="loss", opset=17))
    wrt = [name for name, x in zip(names, inputs)
           if name in feeds and np.asarray(x).dtype.kind == "f"]
    joint = gradient_graph(graph, "loss", wrt)
    grads = mixrt.Session(joint.graph, opt_level=0).run([joint.grads[w] for w in wrt], feeds)
    return dict(zip(wrt, grads))


def check_symbolic_matches_static(op_type, inputs, attributes=None, **options):
    static = weighted_gradients(op_type, inputs, attributes, **options)
    symbolic = weighted_gradients(op_type, inputs, attributes, symbolic=True, **options)
    assert static.keys() == symbolic.keys()
    for name, grad in static.items():
        np.testing.assert_allclose(symbolic[name], grad, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{op_type}: d loss / d {name}")


# -- reshaping ops ------------------------------------------------------------------------------

def test_identity():
    check_gradient("Identity", [randn(2, 3)])


@pytest.mark.parametrize("target, allowzero", [
    (ints(4, 0, -1), 0), (ints(-1), 0), (ints(3, 2, 4), 1)])
def test_reshape(target, allowzero):
    check_gradient("Reshape", [randn(2, 3, 4), target], {"allowzero": allowzero},
                   constants=(1,))


def test_reshape_attribute_convention():
    check_gradient("Reshape", [randn(2, 3), None], {"shape": [3, 2]}, opset=1)


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_flatten(axis):
    check_gradient("Flatten", [randn(2, 3, 2)], {"axis": axis})


def test_squeeze_both_conventions():
    check_gradient("Squeeze", [randn(2, 1, 3, 1), ints(-1, 1)], constants=(1,))
    check_gradient("Squeeze", [randn(2, 1, 3, 1)])
    check_gradient("Squeeze", [randn(2, 1, 3)], {"axes": [1]}, opset=11)


def test_unsqueeze_both_conventions():
    check_gradient("Unsqueeze", [randn(2, 3), ints(0, -1)], constants=(1,))
    check_gradient("Unsqueeze", [randn(2, 3)], {"axes": [1]}, opset=11)


@pytest.mark.parametrize("perm", [None, [1, 2, 0], [2, 0, 1]])
def test_transpose(perm):
    check_gradient("Transpose", [randn(2, 3, 4)], {} if perm is None else {"perm": perm})


def test_expand_sums_over_broadcast_axes():
    check_gradient("Expand", [randn(3, 1), ints(2, 3, 4)], constants=(1,))
    check_gradient("Expand", [randn(2, 3), ints(3, 1, 1)], constants=(1,))


# -- Concat, Split ------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [1, -1])
def test_concat(axis):
    shapes = [(2, 1, 2), (2, 3, 2), (2, 2, 2)] if axis == 1 else [(2, 3, 1), (2, 3, 3)]
    check_gradient("Concat", [randn(*s) for s in shapes], {"axis": axis})


def test_concat_of_one_input():
    check_gradient("Concat", [randn(2, 3)], {"axis": 0})


def test_split_sizes_as_input_and_unused_output():
    check_gradient("Split", [randn(2, 5), ints(2, 3)], {"axis": 1}, constants=(1,),
                   outputs=2)
    check_gradient("Split", [randn(2, 5), ints(1, 1, 3)], {"axis": -1}, constants=(1,),
                   outputs=3, loss_outputs=[0, 2])


def test_split_sizes_as_attribute_and_equal_parts():
    check_gradient("Split", [randn(4, 3)], {"split": [1, 3]}, opset=11, outputs=2)
    check_gradient("Split", [randn(4, 3)], {"axis": 0}, opset=11, outputs=2)
    check_gradient("Split", [randn(4, 3)], {"split": [2, 2]}, opset=1, outputs=2)


def test_split_num_outputs():
    check_gradient("Split", [randn(2, 5)], {"axis": 1, "num_outputs": 3}, opset=18,
                   outputs=3, loss_outputs=[1, 2])


# -- Slice, Pad, Tile ---------------------------------------------------------------------------

@pytest.mark.parametrize("starts, ends, axes, steps", [
    (ints(1, 0), ints(3, 2), None, None),
    (ints(0, 1), ints(2, 100), ints(0, -1), ints(1, 2)),
    (ints(-1, 3), ints(-100, 0), ints(1, 2), ints(-1, -2)),
    (ints(2), ints(0), ints(1), ints(-1))])
def test_slice(starts, ends, axes, steps):
    inputs = [randn(3, 3, 4), starts, ends, axes, steps]
    check_gradient("Slice", inputs, constants=(1, 2, 3, 4), opset=13)


def test_slice_attribute_convention():
    check_gradient("Slice", [randn(3, 4)], {"starts": [1, 0], "ends": [3, -1], "axes": [0, 1]},
                   opset=9)
    check_gradient("Slice", [randn(3, 4)], {"starts": [1], "ends": [2]}, opset=1)


def test_pad_constant_with_crop_and_value():
    pads = ints(0, 1, -1, 1, 0, 2)
    check_gradient("Pad", [randn(2, 3, 4), pads], constants=(1,))
    check_gradient("Pad", [randn(2, 3), ints(1, 1, 0, 2), np.array(0.5)], constants=(1, 2))


def test_pad_axes_input():
    check_gradient("Pad", [randn(2, 3), ints(1, -1), None, ints(-1)], constants=(1, 3),
                   opset=18)


@pytest.mark.parametrize("mode, opset", [("reflect", 11), ("edge", 13), ("wrap", 19)])
def test_pad_copying_modes_add_copies_back(mode, opset):
    check_gradient("Pad", [randn(3, 4), ints(2, 1, 1, 3)], {"mode": mode}, constants=(1,),
                   opset=opset)


def test_pad_attribute_convention():
    check_gradient("Pad", [randn(2, 3)], {"pads": [0, 1, 1, 2], "value": 1.5}, opset=7)
    check_gradient("Pad", [randn(3, 3)], {"pads": [1, 2, 2, 0], "mode": "reflect"}, opset=7)
    check_gradient("Pad", [randn(2, 3)], {"paddings": [1, 0, 0, 1]}, opset=1)


def test_tile():
    check_gradient("Tile", [randn(2, 1, 3), ints(2, 3, 1)], constants=(1,))
    check_gradient("Tile", [randn(3), ints(1)], constants=(1,))


# -- Cast, CastLike, Where ----------------------------------------------------------------------

def test_cast_between_float64_tensors():
    check_gradient("Cast", [randn(2, 3)], {"to": 11})
    check_gradient("CastLike", [randn(2, 3), np.zeros(1)], constants=(1,))


def test_cast_to_float32_casts_the_gradient_back():
    # float32 is too coarse for finite differences; the gradient of sum(W * cast(x)) is W
    x = randn(2, 3)
    grad = weighted_gradients("Cast", [x], {"to": 1})["x0"]
    assert grad.dtype == np.float64
    np.testing.assert_allclose(grad, np.linspace(-1, 2, 6).reshape(2, 3), rtol=1e-6)
    grad = weighted_gradients("CastLike", [x, np.zeros(1, np.float32)], constants=(1,))["x0"]
    np.testing.assert_allclose(grad, np.linspace(-1, 2, 6).reshape(2, 3), rtol=1e-6)


def test_cast_through_an_integer_stops_the_gradient():
    graph = Graph(name="cast_chain", opsets={"": 17})
    graph.inputs.append(Value("x", TensorType(np.dtype(np.float64), (3,))))
    graph.nodes.append(Node("Cast", ["x"], ["i"], name="to_int", opset=17, attributes={"to": 7}))
    graph.nodes.append(Node("Cast", ["i"], ["f"], name="to_float", opset=17,
                            attributes={"to": 11}))
    graph.nodes.append(Node("Mul", ["f", "x"], ["loss"], name="loss", opset=17))
    graph.outputs = [Value("loss")]
    joint = gradient_graph(graph, "loss", ["x"])
    x = np.array([1.5, -2.25, 3.0])
    grad, = mixrt.Session(joint.graph, opt_level=0).run([joint.grads["x"]], {"x": x})
    np.testing.assert_array_equal(grad, np.trunc(x))  # d (trunc(x) x) = trunc(x) only


def test_where_condition_gets_no_gradient():
    condition = np.array([[True], [False], [True]])
    check_gradient("Where", [condition, randn(3, 4), randn(4)], constants=(0,))


# -- Einsum -------------------------------------------------------------------------------------

@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),                          # implicit output
    ("ij->ji", [(2, 3)]),
    ("i,j->ij", [(2,), (3,)]),
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]),
    ("...ij,...jk->...ik", [(3, 2, 2), (1, 2, 3)]),       # broadcast batch dims
    ("b...j,...j->b...", [(2, 1, 3), (4, 3)]),
    ("ij,k->i", [(2, 3), (4,)]),                          # labels summed inside one operand
    ("bii->b", [(2, 3, 3)]),                              # trace
    ("bii->bi", [(2, 3, 3)]),                             # diagonal
    ("ii,ij->j", [(3, 3), (3, 2)])])
def test_einsum(equation, shapes):
    check_gradient("Einsum", [randn(*s) for s in shapes], {"equation": equation})


# -- Gather family ------------------------------------------------------------------------------

@pytest.mark.parametrize("axis, indices", [
    (0, ints(3, 0, 3, -1)),                                    # repeated and negative
    (1, np.array([[2, -1], [0, 2]])),
    (-1, np.array(-2)),                                        # a scalar index
    (1, np.zeros((0,), np.int64))])
def test_gather_adds_up_repeated_indices(axis, indices):
    check_gradient("Gather", [randn(4, 3, 2) if axis == 1 else randn(4, 3), indices],
                   {"axis": axis}, constants=(1,))


def test_gather_elements():
    indices = np.array([[0, -1, 1], [2, 2, 0]])
    check_gradient("GatherElements", [randn(3, 3), indices], {"axis": 1}, constants=(1,))
    check_gradient("GatherElements", [randn(3, 3), indices], {"axis": 0}, constants=(1,))


def test_gather_nd():
    check_gradient("GatherND", [randn(2, 3, 2), np.array([[0, 1], [1, -1], [0, 1]])],
                   constants=(1,))
    check_gradient("GatherND", [randn(2, 3, 2), np.array([[[1], [1]], [[0], [2]]])],
                   {"batch_dims": 1}, constants=(1,))
    check_gradient("GatherND", [randn(2, 3, 2), np.array([[1, 1], [0, 1]])],
                   {"batch_dims": 1}, constants=(1,))


@pytest.mark.parametrize("opset, attributes, k", [
    (1, {"axis": 1, "k": 2}, None), (10, {"axis": 0}, 2), (11, {"axis": -1, "largest": 0}, 3),
    (24, {"axis": 1, "sorted": 0}, 1)])
def test_top_k(opset, attributes, k):
    """The values' gradient goes back to where they were taken from; distinct inputs keep
    the chosen positions stable under the finite differences."""
    x = rng.permutation(12).reshape(3, 4) * 0.25 + randn(3, 4) * 0.01
    inputs = [x] if k is None else [x, ints(k)]
    check_gradient("TopK", inputs, attributes, opset=opset, outputs=2, loss_outputs=[0],
                   constants=() if k is None else (1,))


# -- CumSum, Trilu --------------------------------------------------------------------------

@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_cum_sum(axis, reverse, exclusive):
    check_gradient("CumSum", [randn(3, 4), np.array(axis, dtype=np.int64)],
                   {"exclusive": exclusive, "reverse": reverse}, constants=(1,), opset=14)


@pytest.mark.parametrize("upper, k", [(1, None), (0, 1), (1, -2)])
def test_trilu(upper, k):
    inputs = [randn(2, 3, 4)] + ([] if k is None else [np.array(k, dtype=np.int64)])
    check_gradient("Trilu", inputs, {"upper": upper}, constants=(1,) if k is not None else ())


# -- Scatter family -----------------------------------------------------------------------------

@pytest.mark.parametrize("op_type, opset", [("ScatterElements", 16), ("Scatter", 9)])
def test_scatter_elements(op_type, opset):
    indices = np.array([[1, 0, -1], [3, 2, 1]])  # no duplicates: 'none' is then order-free
    check_gradient(op_type, [randn(4, 3), indices, randn(2, 3)], {"axis": 0},
                   constants=(1,), opset=opset)


def test_scatter_elements_add_with_duplicates():
    indices = np.array([[1, 0, 1], [1, 0, 1]])
    check_gradient("ScatterElements", [randn(4, 3), indices, randn(2, 3)],
                   {"axis": 1, "reduction": "add"}, constants=(1,))


def test_scatter_nd():
    check_gradient("ScatterND", [randn(3, 4), np.array([[2], [0]]), randn(2, 4)],
                   constants=(1,))
    check_gradient("ScatterND", [randn(3, 4), np.array([[2, 1], [0, -1], [2, 1]]), randn(3)],
                   {"reduction": "add"}, constants=(1,))


def test_scatter_with_mul_reduction_has_no_gradient():
    with pytest.raises(GradientError, match="reduction 'mul'"):
        check_gradient("ScatterND", [randn(3), np.array([[1]]), randn(1)],
                       {"reduction": "mul"}, constants=(1,))


# -- symbolic dims: the Shape-node paths agree with the static ones -----------------------------

@pytest.mark.parametrize("op_type, inputs, attributes, constants", [
    ("Reshape", [randn(2, 3, 2), ints(3, -1)], {}, (1,)),
    ("Flatten", [randn(2, 3, 2)], {"axis": 2}, ()),
    ("Unsqueeze", [randn(2, 3), ints(1)], {}, (1,)),
    ("Expand", [randn(3, 1), ints(2, 3, 4)], {}, (1,)),
    ("Concat", [randn(2, 1), randn(2, 3)], {"axis": -1}, ()),
    ("Concat", [randn(1, 2), randn(3, 2)], {"axis": 0}, ()),
    ("Slice", [randn(3, 4), ints(2, -1), ints(-100, 0), ints(0, 1), ints(-1, -2)], {},
     (1, 2, 3, 4)),
    ("Pad", [randn(2, 3), ints(1, -1, 0, 2)], {}, (1,)),
    ("Pad", [randn(3, 4), ints(1, 2, 2, 1)], {"mode": "reflect"}, (1,)),
    ("Tile", [randn(2, 3), ints(2, 2)], {}, (1,)),
    ("Where", [np.array([True, False, True]), randn(2, 3), randn(3)], {}, (0,)),
    ("Einsum", [randn(3, 3), randn(2,)], {"equation": "ii,j->ij"}, ()),
    ("Gather", [randn(4, 2), ints(1, 1, -1)], {}, (1,)),
    ("GatherElements", [randn(3, 2), np.array([[2, 0], [2, 2]])], {}, (1,)),
    ("ScatterND", [randn(3, 2), np.array([[1]]), randn(1, 2)], {}, (1,)),
    ("ScatterElements", [randn(3, 2), np.array([[1, 0]]), randn(1, 2)], {}, (1,))])
def test_symbolic_dims(op_type, inputs, attributes, constants):
    check_symbolic_matches_static(op_type, inputs, attributes, constants=constants)


def test_symbolic_dims_split_with_an_unused_output():
    check_symbolic_matches_static("Split", [randn(2, 5), ints(2, 3)], {"axis": 1},
                                  constants=(1,), outputs=2)
