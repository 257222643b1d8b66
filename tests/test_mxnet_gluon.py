"""mixrt.gluon's blocks and layers as MXNet 1.x documents them: names, shared parameters,
hooks, parameter files, hybridized inputs, channels-last layouts and the layers added for
MXNet's API (values checked against MXNet 1.9.1)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mixrt import autograd, init, nd, sym
from mixrt.errors import InputError, ShapeError
from mixrt.gluon import Block, HybridBlock, SymbolBlock, Trainer, nn
from mixrt.gluon.contrib import nn as contrib_nn
from mixrt.ops.conv import conv_grad_cpu


class _TwoDense(Block):
    def __init__(self, in_units=0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense0 = nn.Dense(5, in_units=in_units)
            self.dense1 = nn.Dense(5, in_units=in_units)

    def forward(self, x):
        return self.dense1(self.dense0(x))


def test_a_block_made_with_params_of_another_shares_them_by_name():
    net1 = _TwoDense(prefix="net1_", in_units=5)
    net2 = _TwoDense(prefix="net2_", params=net1.collect_params())
    assert list(net2.collect_params()) == ["net1_dense0_weight", "net1_dense0_bias",
                                           "net1_dense1_weight", "net1_dense1_bias"]
    assert net2.dense0.weight is net1.dense0.weight
    net1.initialize()
    assert net2(nd.zeros((3, 5))).shape == (3, 5)


def test_symbols_made_in_a_name_scope_take_the_block_prefix():
    model = nn.Dense(128, activation="tanh", in_units=10, flatten=False, prefix="test_")
    out = model(sym.var("data"))
    assert out.list_outputs() == ["test_tanh_fwd_output"]
    assert out.infer_shape(data=(2, 3, 10))[1] == [(2, 3, 128)]
    assert nn.Activation("relu").name.startswith("relu")


def test_attributes_keep_their_block_or_parameter_type():
    block = Block()
    block.child = Block()
    block.child = Block()  # another Block is fine
    with pytest.raises(TypeError, match="child"):
        block.child = (2,)


def test_blocks_in_a_plain_list_are_reported():
    class Listed(Block):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Dense(2), nn.Dense(3)]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Listed().collect_params()
    assert any("unregistered container" in str(w.message) for w in caught)


def test_hooks_detach_and_apply_visits_children_first():
    calls = []
    block = nn.Dense(3)
    block.initialize()
    handle = block.register_forward_hook(lambda b, x, y: calls.append("after"))
    with block.register_forward_pre_hook(lambda b, x: calls.append("before")):
        block(nd.ones((2, 4)))
    handle.detach()
    block(nd.ones((2, 4)))
    assert calls == ["before", "after"]
    net = nn.HybridSequential(prefix="test_")
    with net.name_scope():
        net.add(nn.Dense(10), nn.Dropout(0.5))
    visited = []
    net.apply(lambda b: visited.append(b.name))
    assert visited == ["test_dense0", "test_dropout0", "test"]


def test_sequential_slices_are_of_the_same_type():
    for net in (nn.Sequential(), nn.HybridSequential()):
        layers = [nn.Dense(10) for _ in range(3)]
        net.add(*layers)
        assert net[-1] is layers[2]
        part = net[1:3]
        assert type(part) is type(net) and len(part) == 2 and part[0] is layers[1]


def test_parameters_are_saved_in_mxnet_format_by_attribute_path(tmp_path):
    net = _TwoDense(prefix="a_", in_units=5)
    net.initialize()
    net.save_parameters(tmp_path / "p.params")
    stored = nd.load(str(tmp_path / "p.params"))
    assert sorted(stored) == ["dense0.bias", "dense0.weight", "dense1.bias",
                              "dense1.weight"]
    other = _TwoDense(prefix="b_")  # another prefix, shapes still unknown
    other.load_parameters(tmp_path / "p.params")
    np.testing.assert_array_equal(other.dense1.weight.data().asnumpy(),
                                  net.dense1.weight.data().asnumpy())


def test_deduplicate_writes_a_shared_parameter_once(tmp_path):
    class Holder(Block):
        def __init__(self, params=None):
            super().__init__(params=params)
            with self.name_scope():
                self.weight = self.params.get("weight", shape=(2, 2))

    class Pair(Block):
        def __init__(self, first, second):
            super().__init__()
            self.first, self.second = first, second

    first = Holder()
    pair = Pair(first, Holder(first.collect_params()))
    pair.initialize()
    pair.save_parameters(tmp_path / "once.params", deduplicate=True)
    pair.save_parameters(tmp_path / "twice.params")
    assert len(nd.load(str(tmp_path / "once.params"))) == 1
    assert len(nd.load(str(tmp_path / "twice.params"))) == 2
    again = Holder()
    Pair(again, Holder(again.collect_params())).load_parameters(tmp_path / "once.params")
    np.testing.assert_array_equal(again.weight.data().asnumpy(),
                                  first.weight.data().asnumpy())


def test_dtype_source_saved_takes_the_files_dtype(tmp_path):
    net = nn.Dense(4, in_units=3)
    net.initialize()
    net.cast("float16")
    net.save_parameters(tmp_path / "half.params")
    net.cast("float32")
    net.load_parameters(tmp_path / "half.params", cast_dtype=True, dtype_source="saved")
    assert net.weight.dtype == np.float16


class _Optional(HybridBlock):
    def hybrid_forward(self, F, a, b=None):
        return a if b is None else a + b


def test_hybridized_inputs_may_be_none_and_keep_their_structure():
    block = _Optional()
    block.hybridize()
    x = nd.ones((4,))
    np.testing.assert_array_equal(block(x, None).asnumpy(), np.ones(4))
    np.testing.assert_array_equal(block(x).asnumpy(), np.ones(4))  # b's default
    with pytest.raises(ValueError, match="structure"):
        block(x, x)  # b was None when it was hybridized
    with pytest.raises(ValueError):
        block(x, 1)  # a hybridized block takes arrays, not numbers
    with pytest.raises(ValueError, match="mix"):
        _Optional()(x, sym.var("b"))
    assert _Optional()(x, 1).asnumpy().tolist() == [2.0] * 4  # imperatively, numbers pass


def test_a_child_added_after_hybridizing_is_traced():
    net = nn.HybridSequential()
    net.add(nn.Dense(10, flatten=False))
    net.hybridize()
    net.initialize()
    assert net(nd.ones((2, 3, 5))).shape == (2, 3, 10)
    net.add(nn.Flatten())
    assert net(nd.ones((2, 3, 5))).shape == (2, 30)


def test_channels_last_convolution_equals_channels_first():
    x = np.random.RandomState(0).uniform(-1, 1, (2, 4, 7, 6)).astype(np.float32)
    first = nn.Conv2D(3, (3, 2), in_channels=4)
    last = nn.Conv2D(3, (3, 2), in_channels=4, layout="NHWC")
    first.initialize()
    last.initialize()
    assert last.weight.shape == (3, 3, 2, 4)
    last.weight.set_data(first.weight.data().asnumpy().transpose(0, 2, 3, 1))
    expected = first(nd.array(x)).asnumpy().transpose(0, 2, 3, 1)
    got = last(nd.array(x.transpose(0, 2, 3, 1))).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    pool = nn.MaxPool2D(3, ceil_mode=True, layout="NHWC")
    assert pool(nd.zeros((2, 10, 10, 2))).shape == (2, 4, 4, 2)
    with pytest.raises(Exception, match="layout"):
        nn.Conv2D(3, 3, layout="NCWH")


def test_instance_and_group_norm_values():
    x = np.random.RandomState(1).uniform(-1, 1, (2, 4, 3)).astype(np.float32)
    group = nn.GroupNorm(num_groups=2)
    group.initialize()
    assert group.gamma.shape == (2,)  # one per group, as MXNet 1.x
    group.gamma.set_data(np.array([2, 3], np.float32))
    group.beta.set_data(np.array([1, -1], np.float32))
    grouped = x.reshape(2, 2, -1)
    normed = (grouped - grouped.mean(2, keepdims=True)) / np.sqrt(
        grouped.var(2, keepdims=True) + 1e-5)
    expected = normed * np.array([2, 3]).reshape(1, 2, 1) + np.array([1, -1]).reshape(1, 2, 1)
    np.testing.assert_allclose(group(nd.array(x)).asnumpy(), expected.reshape(x.shape),
                               rtol=1e-4, atol=1e-5)
    inst = nn.InstanceNorm(axis=-1)
    inst.initialize()
    y = inst(nd.array(x)).asnumpy()
    assert inst.gamma.shape == (3,) and inst.gamma.grad_req == "null"  # scale=False
    moved = x.transpose(0, 2, 1)
    reference = (moved - moved.mean(2, keepdims=True)) / np.sqrt(
        moved.var(2, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, reference.transpose(0, 2, 1), rtol=1e-4, atol=1e-5)


def test_reflection_pad_and_pixel_shuffle_values():
    x = np.arange(2 * 8 * 3 * 3, dtype=np.float32).reshape(2, 8, 3, 3)
    pad = nn.ReflectionPad2D(2)
    np.testing.assert_array_equal(
        pad(nd.array(x)).asnumpy(), np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), "reflect"))
    shuffle = contrib_nn.PixelShuffle2D(2)
    y = shuffle(nd.array(x))
    assert y.shape == (2, 2, 6, 6)
    # MXNet 1.9.1's values
    np.testing.assert_array_equal(y.asnumpy()[1, 1, :2], [[108, 117, 109, 118, 110, 119],
                                                          [126, 135, 127, 136, 128, 137]])


def test_dropout_axes_share_one_draw():
    x = nd.ones((6, 5, 4))
    layer = nn.Dropout(0.5, axes=(1,))
    with autograd.train_mode():
        y = layer(x).asnumpy()
    assert (y == y[:, :1, :]).all() and set(np.unique(y)) <= {0.0, 2.0}
    layer.hybridize()
    with autograd.train_mode():
        y = layer(x).asnumpy()
    assert (y == y[:, :1, :]).all() and set(np.unique(y)) <= {0.0, 2.0}
    np.testing.assert_array_equal(layer(x).asnumpy(), x.asnumpy())  # inference: identity


def test_hybrid_concurrent_joins_its_children():
    net = contrib_nn.HybridConcurrent(axis=1)
    net.add(nn.Dense(3), contrib_nn.Identity())
    net.initialize()
    assert net(nd.ones((2, 4))).shape == (2, 7)
    net.hybridize()
    assert net(nd.ones((2, 4))).shape == (2, 7)


def test_summary_counts_parameters_and_refuses_hybridized(capsys):
    net = nn.HybridSequential()
    net.add(nn.Dense(4, in_units=3), nn.Dense(2))
    net.initialize()
    net.summary(nd.ones((5, 3)))
    printed = capsys.readouterr().out
    assert "Total params: 26" in printed and "Dense-2" in printed
    net.hybridize()
    with pytest.raises(AssertionError):
        net.summary(nd.ones((5, 3)))


class _StatesOut(HybridBlock):
    """Returns (output, [state, state]) as a recurrent layer's unroll does."""

    def hybrid_forward(self, F, x):
        return x * 2, [x + 1, (x - 1, x * 0)]


def test_a_hybridized_block_returns_its_nested_outputs_as_they_were():
    block = _StatesOut()
    x = nd.array([[1.0, 2.0]])
    eager = block(x)
    block.hybridize()
    traced = block(x)
    assert isinstance(traced, tuple) and isinstance(traced[1], list)
    assert isinstance(traced[1][1], tuple) and len(traced[1][1]) == 2
    for got, want in zip((traced[0], traced[1][0], *traced[1][1]),
                         (eager[0], eager[1][0], *eager[1][1])):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())


def test_export_writes_mxnets_symbol_and_params_files_and_onnx(tmp_path):
    net = nn.HybridSequential()
    net.add(nn.Dense(4, in_units=3), nn.BatchNorm(in_channels=4))
    net.initialize()
    net.hybridize()
    x = nd.array(np.random.default_rng(0).normal(size=(2, 3)))
    out = net(x)
    paths = net.export(str(tmp_path / "net"), epoch=3)
    assert paths["symbol"].endswith("net-symbol.json")
    assert paths["params"].endswith("net-0003.params")
    assert {"onnx", "mxr"} <= paths.keys()
    saved = nd.load(paths["params"])
    assert f"arg:{net[0].weight.name}" in saved
    assert f"aux:{net[1].running_mean.name}" in saved
    assert not any(k.startswith("arg:") and k.endswith("running_var") for k in saved)
    back = SymbolBlock.imports(paths["symbol"], ["data"], paths["params"])
    np.testing.assert_allclose(back(x).asnumpy(), out.asnumpy(), rtol=1e-6)


def test_a_parameters_variable_carries_its_initializer():
    dense = nn.Dense(3, in_units=2, bias_initializer=init.Constant(0.5))
    bias = dense.bias.var()
    assert bias is dense.bias.var()  # one Variable while the parameter is unchanged
    assert bias.list_attr()["__init__"] == init.Constant(0.5).dumps()
    assert "__init__" not in dense.weight.var().list_attr()  # no initializer of its own


def _conv_input_grad(dy, w, x_shape, stride, dilate, pad):
    """dL/dX of a 2-D convolution, window by window (the reference)."""
    n, c, h, wd = x_shape
    kh, kw = w.shape[2:]
    dx = np.zeros((n, c, h + 2 * pad, wd + 2 * pad))
    for oy in range(dy.shape[2]):
        for ox in range(dy.shape[3]):
            rows = slice(oy * stride, oy * stride + (kh - 1) * dilate + 1, dilate)
            cols = slice(ox * stride, ox * stride + (kw - 1) * dilate + 1, dilate)
            dx[:, :, rows, cols] += np.einsum("nm,mckl->nckl", dy[:, :, oy, ox], w)
    return dx[:, :, pad:pad + h, pad:pad + wd]


@pytest.mark.parametrize("size, kernel, stride, dilate, pad", [
    (224, 224, 1, 1, 0),  # MXNet's test_conv2d_16c: as a flipped convolution, 112 GiB
    (24, 20, 1, 1, 1),    # a few positions, padded
    (7, 5, 2, 1, 0),      # strided, more taps than positions
    (7, 3, 1, 3, 0),      # dilated to the image's size
])
def test_conv_input_grad_of_a_kernel_as_large_as_the_image(size, kernel, stride, dilate, pad,
                                                           monkeypatch):
    def convolved(*_args):
        raise AssertionError("dX convolved over padding")
    # dY has a few positions: dX folds W^T dY back, never convolves dY's padded image with
    # the whole flipped kernel (for 224x224, 112 GiB of partial products)
    monkeypatch.setattr(conv_grad_cpu, "_stride_one_conv", convolved)
    rng = np.random.default_rng(1)
    x = nd.array(rng.uniform(-1, 1, (1, 3, size, size)))
    w = nd.array(rng.uniform(-1, 1, (16, 3, kernel, kernel)))
    x.attach_grad()
    with autograd.record():
        y = nd.Convolution(x, w, kernel=(kernel, kernel), stride=(stride, stride),
                           dilate=(dilate, dilate), pad=(pad, pad), num_filter=16, no_bias=True)
    dy = rng.uniform(-1, 1, y.shape)
    y.backward(nd.array(dy))
    want = _conv_input_grad(dy, w.asnumpy(), x.shape, stride, dilate, pad)
    np.testing.assert_allclose(x.grad.asnumpy(), want, rtol=1e-4, atol=1e-4)


class _AddConstant(HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.const = self.params.get_constant("const", [[1, 2], [3, 4]])

    def hybrid_forward(self, F, x, const):
        return x + const


@pytest.mark.parametrize("hybridize", [False, True])
def test_a_constant_keeps_its_value_through_training(hybridize):
    block = _AddConstant()
    block.initialize(init.Uniform(5.0))  # a Constant's own value wins over the block's
    if hybridize:
        block.hybridize()
    trainer = Trainer(block.collect_params(), "sgd", {"learning_rate": 1.0})
    x = nd.ones((2, 2))
    x.attach_grad()
    with autograd.record():
        y = block(x)
    y.backward()
    trainer.step(1)
    assert block.const.grad_req == "null" and block.const.dtype == np.float32
    np.testing.assert_array_equal(block.const.data().asnumpy(), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(y.asnumpy(), [[2, 3], [4, 5]])
    np.testing.assert_array_equal(x.grad.asnumpy(), np.ones((2, 2)))


def test_get_constant_finds_the_constant_and_checks_what_it_is_given():
    block = _AddConstant(prefix="b_")
    assert block.params.get_constant("const") is block.const
    with pytest.raises(KeyError, match="b_other"):
        block.params.get_constant("other")
    with pytest.raises(ShapeError, match="shape"):
        block.params.get_constant("const", [1, 2, 3])
    block.params.get("weight", shape=(2,))
    with pytest.raises(InputError, match="not a Constant"):
        block.params.get_constant("weight", [1, 2])


def test_a_parameters_gradient_list_follows_grad_req():
    dense = nn.Dense(2, in_units=3)
    assert dense.weight._grad is None  # not initialized
    dense.initialize()
    assert len(dense.weight._grad) == 1
    dense.collect_params().setattr("grad_req", "null")
    assert dense.weight._grad is None
    dense.collect_params().setattr("grad_req", "write")
    assert dense.weight._grad[0].shape == (2, 3)
