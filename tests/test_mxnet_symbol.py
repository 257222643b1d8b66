"""mx.sym as MXNet 1.x code writes it: naming and attribute scopes, MXNet's arguments and
attributes on any op, MXNet's structure queries, and shape inference with unknown dimensions
both ways. Expected values are MXNet 1.9.1's."""

import pickle

import numpy as np
import pytest

import mixrt
from mixrt import sym
from mixrt.attribute import AttrScope
from mixrt.base import MXNetError, NotImplementedForSymbol
from mixrt.errors import GraphError, ShapeError
from mixrt.name import NameManager, Prefix


def _shapes(symbol, **given):
    args, outs, _ = symbol.infer_shape(**given)
    return dict(zip(symbol.list_arguments(), args)), outs


# -- names and attributes ---------------------------------------------------------------------

def test_name_manager_counts_per_hint_and_prefix_prepends():
    data = sym.Variable("data")
    with NameManager():
        first = sym.FullyConnected(data, num_hidden=4)
        second = sym.FullyConnected(data, num_hidden=4)
    assert (first.name, second.name) == ("fullyconnected0", "fullyconnected1")
    with Prefix("mynet_"):
        net = sym.FullyConnected(data, num_hidden=10, name="fc1")
    assert net.list_arguments() == ["data", "mynet_fc1_weight", "mynet_fc1_bias"]


def test_attr_scope_reaches_variables_and_ops_and_inner_scopes_win():
    with AttrScope(group="4", data="great"):
        data = sym.Variable("data", attr={"dtype": "data", "group": "1"})
        other = sym.Variable("data2")
        with AttrScope(__init_bias__="0.0"):
            fc = sym.FullyConnected(data, num_hidden=10, name="fc2")
    assert other.attr("group") == "4" and data.attr("group") == "1"
    assert data.attr("dtype") == "data"
    assert fc.attr("__init_bias__") == "0.0" and fc.attr("data") == "great"
    with pytest.raises(GraphError, match="must be a string"):
        AttrScope(group=4)


def test_op_attributes_are_stored_not_passed_to_the_kernel():
    data = sym.Variable("data")
    fc = sym.FullyConnected(data, num_hidden=10, name="fc1", lr_mult=0, wd_mult=0.5,
                            ctx_group="dev1", __layout__="NC")
    attributes = fc.list_attr()
    assert attributes["__lr_mult__"] == "0" and attributes["lr_mult"] == "0"
    assert attributes["__wd_mult__"] == "0.5" and attributes["ctx_group"] == "dev1"
    assert attributes["__layout__"] == "NC"
    assert fc.attr_dict()["fc1_weight"]["__lr_mult__"] == "0"  # made by the layer: MXNet's
    relu = sym.Relu(data, attr={"__mood__": "calm"})
    assert relu.attr("__mood__") == "calm"
    assert relu.eval(data=np.array([-1.0, 2.0], np.float32))[0].tolist() == [0.0, 2.0]
    with pytest.raises(GraphError, match="dict of strings"):
        sym.Relu(data, attr={"mood": 3})


def test_mxnet_argument_names_on_onnx_ops():
    data = sym.Variable("data")
    cast = sym.Cast(data=data, dtype="float16")
    assert cast.infer_type(data=np.float32)[1] == [np.float16]
    flat = sym.Flatten(data=data)
    assert flat.infer_shape(data=(2, 3, 4))[1] == [(2, 12)]
    joined = sym.Concat(data, data, num_args=2, dim=0)
    assert joined.infer_shape(data=(2, 3))[1] == [(4, 3)]
    assert sym.Concat(data, data).infer_shape(data=(2, 3))[1] == [(2, 6)]  # MXNet's dim=1
    with pytest.raises(GraphError, match="num_args=3 but 2 inputs"):
        sym.Concat(data, data, num_args=3)


def test_a_symbol_as_a_bool_raises_mxnets_error():
    with pytest.raises(NotImplementedForSymbol):
        bool(sym.Variable("x"))
    assert issubclass(NotImplementedForSymbol, MXNetError)


def test_mx_real_t_is_float32():
    assert mixrt.base.mx_real_t is np.float32


# -- structure ---------------------------------------------------------------------------------

def test_a_layer_is_one_node_to_children_and_internals():
    data = sym.Variable("data")
    fc1 = sym.FullyConnected(data=data, name="fc1", num_hidden=10)
    net = sym.FullyConnected(data=fc1, name="fc2", num_hidden=100)
    assert net.get_children().list_outputs() == ["fc1_output", "fc2_weight", "fc2_bias"]
    assert net.get_children().get_children().list_outputs() == \
        ["data", "fc1_weight", "fc1_bias"]
    assert net.get_children()["fc2_weight"].get_children() is None
    assert net.get_internals().list_outputs() == [
        "data", "fc1_weight", "fc1_bias", "fc1_output", "fc2_weight", "fc2_bias",
        "fc2_output"]
    sliced = sym.SliceChannel(data, num_outputs=3, name="slice")
    assert sliced.list_outputs() == ["slice_output0", "slice_output1", "slice_output2"]
    assert sym.Concat(*list(sliced)).get_children().list_outputs() == sliced.list_outputs()


def test_compose_takes_a_name_and_pickle_goes_through_json():
    net = sym.FullyConnected(name="fc3", num_hidden=10)
    net = sym.FullyConnected(data=sym.Activation(data=net, act_type="relu"), name="fc4",
                             num_hidden=20)
    composed = net(fc3_data=sym.Variable("x"), name="composed")
    assert composed.name == "composed" and net.name == "fc4"
    assert composed.list_arguments()[0] == "x"
    copy = pickle.loads(pickle.dumps(composed))
    assert copy.tojson() == composed.tojson()


# -- shape inference ---------------------------------------------------------------------------

def test_elementwise_operands_share_one_shape():
    a, b = sym.Variable("a", shape=(0, 10)), sym.Variable("b", shape=(12, 0))
    args, _ = _shapes(a + b)
    assert args == {"a": (12, 10), "b": (12, 10)}
    known, unknown = sym.Variable("known", shape=(2, 3)), sym.Variable("unknown")
    args, outs = _shapes(sym.elemwise_add(known, unknown))
    assert args["unknown"] == (2, 3) and outs == [(2, 3)]


def test_output_shapes_are_read_back_through_layers():
    a = sym.Variable("a", shape=(0, 10))
    args, _ = _shapes(sym.FullyConnected(data=a, num_hidden=21) + sym.Variable("c", (5, 0)))
    assert args["a"] == (5, 10) and args["c"] == (5, 21)
    image = sym.Variable("image", shape=(0, 10, 0, 0))
    conv = sym.Convolution(data=image, num_filter=21, kernel=(3, 3), pad=(1, 1))
    args, _ = _shapes(conv + sym.Variable("o", shape=(5, 21, 32, 32)))
    assert args["image"] == (5, 10, 32, 32)
    x, y = sym.Variable("x", shape=(0, 10)), sym.Variable("y", shape=(0, 5))
    joined = sym.Variable("d", shape=(2, 0)) + sym.Concat(x, y, num_args=2, dim=1)
    args, _ = _shapes(joined)
    assert (args["x"], args["y"], args["d"]) == ((2, 10), (2, 5), (2, 15))
    parts = sym.SliceChannel(data=a, num_outputs=10, axis=1, squeeze_axis=True)
    args, _ = _shapes(parts[1] + sym.Variable("e", shape=(5,)))
    assert args["a"] == (5, 10)


def test_a_weight_learns_its_shape_through_ops_and_conflicts_are_mxnet_errors():
    w, shift = sym.Variable("weight"), sym.Variable("wshift", shape=(1,))
    like = sym._internal._identity_with_attr_like_rhs(sym.broadcast_add(w, shift), w)
    net = sym.FullyConnected(data=sym.Variable("data"), weight=like, num_hidden=11,
                             no_bias=True)
    assert _shapes(net, data=(7, 100))[0]["weight"] == (11, 100)
    mlp = sym.FullyConnected(sym.Variable("data"), name="fc1", num_hidden=1000)
    with pytest.raises(MXNetError, match="1000"):
        mlp.infer_shape(data=(100, 100), fc1_weight=(1, 100))
    with pytest.raises(ShapeError):
        sym.elemwise_add(sym.Variable("p", shape=(2, 3)),
                         sym.Variable("q", shape=(3, 2))).infer_shape()


def test_loose_arithmetic_still_broadcasts():
    a, b = sym.Variable("a", shape=(4, 3)), sym.Variable("b", shape=(1, 3))
    assert (a + b).infer_shape()[1] == [(4, 3)]


# -- functions built without shapes ------------------------------------------------------------

def test_zeros_ones_like_and_batch_take_values():
    x = sym.Variable("x")
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert sym.zeros_like(x).name.startswith("zeros_like")
    np.testing.assert_array_equal(sym.zeros_like(x).eval(x=data)[0], np.zeros((3, 4)))
    np.testing.assert_array_equal(sym.ones_like(x).eval(x=data)[0], np.ones((3, 4)))
    taken = sym.batch_take(x, sym.Variable("idx"))
    out = taken.eval(x=data, idx=np.array([0, 9, -2], np.int32))[0]
    np.testing.assert_array_equal(out, [0.0, 7.0, 8.0])  # MXNet clips the indices


# -- functions built without shapes, fluent methods, creators ----------------------------------

def _run(symbol, **arrays):
    return [np.asarray(out.asnumpy()) for out in symbol.eval(**arrays)]


def test_dot_batch_dot_and_pick_infer_with_unknown_dimensions():
    x, y = sym.Variable("x"), sym.Variable("y")
    assert sym.dot(x, y).infer_shape_partial(x=(0, 3, 4), y=(4, 5))[1] == [(0, 3, 5)]
    assert sym.dot(x, y, transpose_a=True, transpose_b=True).infer_shape(
        x=(4, 3, 2), y=(6, 4))[1] == [(2, 3, 6)]
    assert sym.batch_dot(x, y).infer_shape_partial(x=(0, 3, 4), y=(0, 4, 5))[1] == [(0, 3, 5)]
    assert sym.batch_dot(x, y, transpose_b=True).infer_shape(x=(2, 3, 4), y=(2, 5, 4))[1] \
        == [(2, 3, 5)]
    assert sym.pick(x, y, axis=1).infer_shape_partial(x=(0, 3, 3), y=(0, 3))[1] == [(0, 3)]
    # an rhs of three axes, its shape declared: lhs's last axis with rhs's first
    with NameManager():
        three = sym.dot(sym.Variable("p", shape=(2, 3)), sym.Variable("q", shape=(3, 4, 5)))
    assert three.name == "dot0" and three.infer_shape()[1] == [(2, 4, 5)]


def test_dot_of_two_vectors_has_shape_one_and_pick_clips_or_wraps():
    p, q = sym.Variable("p"), sym.Variable("q")
    vector = np.array([1.0, 2.0, 3.0], np.float32)
    (out,) = _run(sym.dot(p, q), p=vector, q=vector + 3)
    assert out.shape == (1,) and out[0] == 32.0
    data = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    index = np.array([4, -1], np.float32)
    np.testing.assert_array_equal(_run(sym.pick(p, q, axis=0), p=data, q=index)[0], [5, 2])
    np.testing.assert_array_equal(
        _run(sym.pick(p, q, axis=0, mode="wrap"), p=data, q=index)[0], [3, 6])
    with pytest.raises(GraphError, match="mode"):
        sym.pick(p, q, mode="raise")


def test_creators_nan_reductions_and_argmax_channel():
    zeros = sym.zeros((3, 3))
    assert zeros.name.startswith("_zeros") and zeros.infer_shape()[1] == [(3, 3)]
    assert sym.ones((2,), dtype="int32").infer_type()[1] == [np.int32]
    np.testing.assert_array_equal(_run(sym.full((2, 2), 7.5))[0], np.full((2, 2), 7.5))
    with pytest.raises(GraphError, match="shape"):
        sym.zeros((2, -1))
    x = sym.Variable("x")
    data = np.array([[1, np.nan, 3], [np.nan, np.nan, 2]], np.float32)
    np.testing.assert_array_equal(_run(sym.nansum(x, axis=1), x=data)[0], [4, 2])
    np.testing.assert_array_equal(_run(x.nanprod(), x=data)[0], 6)
    np.testing.assert_array_equal(
        _run(sym.argmax_channel(x), x=np.array([[1, 5, 3], [7, 2, 2]], np.float32))[0], [1, 0])


def test_fluent_methods_take_name_and_name_nodes_as_mxnet():
    with NameManager():
        a = sym.Variable("a")
        names = [a.abs().name, a.sum(axis=1).name, a.expand_dims(axis=1).name,
                 sym.arctan(a).name, a.zeros_like().name, a.nansum().name]
        assert a.split(num_outputs=2).list_outputs() == ["split0_output0", "split0_output1"]
    assert names == ["abs0", "sum0", "expand_dims0", "arctan0", "zeros_like0", "nansum0"]
    assert a.abs(name="magnitude").name == "magnitude"
    assert a.flatten(name="flat").name == "flat"
    assert a.reshape((2, 3), name="r").name == "r"
    assert sym.relu(a, name="act").name == "act"
    data = np.array([[-1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(_run(abs(a), a=data)[0], [[1.0, 2.0]])
    # a function built from several nodes is one node to MXNet's structure queries
    assert sym.arctan(a, name="t").get_internals().list_outputs() == ["a", "t_output"]


def test_plot_network_warns_of_names_used_twice_and_draws_each_node():
    from mixrt import viz  # noqa: PLC0415  (needs the graphviz package)
    net = sym.FullyConnected(sym.Variable("data"), name="fc", num_hidden=8)
    net = sym.FullyConnected(sym.Activation(net, act_type="relu", name="relu1"), name="fc",
                             num_hidden=3)
    with pytest.warns(RuntimeWarning, match="same name.*Repeated names: .*fc"):
        dot = viz.plot_network(net, shape={"data": (4, 5)}, hide_weights=False)
    assert dot.source.count("label=fc_weight ") == 2
    assert 'label="8x5"' in dot.source and 'label="3x8"' in dot.source  # each weight its own


def test_variable_keeps_double_underscore_attributes():
    v = sym.Variable("x", __layout__="NCHW", attr={"a": "b"})
    assert v.list_attr() == {"a": "b", "__layout__": "NCHW"}
    assert sym.load_json(v.tojson()).attr("__layout__") == "NCHW"
    with pytest.raises(GraphError, match="__<key>__"):
        sym.Variable("x", layout="NCHW")


@pytest.mark.parametrize("normalization, expected", [("null", 2.0), ("batch", 1.0),
                                                     ("valid", 2.0 / 3)])
def test_make_loss_passes_data_and_backpropagates_the_scale(normalization, expected):
    x = sym.Variable("x")
    head = sym.MakeLoss(x, grad_scale=2.0, normalization=normalization, valid_thresh=0.5)
    data = np.array([[0.1, 0.7, 1.0], [0.2, 0.3, 0.9]], np.float32)
    executor = head.simple_bind("cpu", x=(2, 3))
    np.testing.assert_array_equal(executor.forward(is_train=True, x=data)[0].asnumpy(), data)
    executor.backward()
    np.testing.assert_allclose(executor.grad_dict["x"].asnumpy(), np.full((2, 3), expected),
                               rtol=1e-6)
    with pytest.raises(GraphError, match="normalization"):
        sym.MakeLoss(x, normalization="mean")
