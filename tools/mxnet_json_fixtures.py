"""Writes tests/data/mxnet_json/: small models saved by MXNet 1.x itself (``-symbol.json`` in
MXNet's graph format and ``-0000.params``) and MXNet's outputs for a fixed input, so
tests/test_mxnet_json.py can check that mixrt reads MXNet's files and computes the same.

Runs only under MXNet 1.9.1 (not mixrt):  python tools/mxnet_json_fixtures.py [out_dir]

Each model <name> gives <name>-symbol.json, <name>-0000.params and <name>-expected.npz with
the input ("data") and every output ("output0", "output1", ...), all in inference mode.
"""

from __future__ import annotations

import os
import sys

import mxnet as mx
import numpy as np

SEED = 20261124


def mlp():
    data = mx.sym.Variable("data")
    net = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
    net = mx.sym.Activation(net, act_type="relu", name="relu1")
    net = mx.sym.FullyConnected(net, num_hidden=8, name="fc2")
    net = mx.sym.Activation(net, act_type="tanh", name="tanh2")
    net = mx.sym.FullyConnected(net, num_hidden=4, name="fc3")
    return mx.sym.SoftmaxOutput(net, name="softmax"), (2, 10)


def lenet():
    data = mx.sym.Variable("data")
    net = mx.sym.Convolution(data, kernel=(5, 5), num_filter=6, name="conv1")
    net = mx.sym.Activation(net, act_type="tanh")
    net = mx.sym.Pooling(net, pool_type="max", kernel=(2, 2), stride=(2, 2))
    net = mx.sym.Convolution(net, kernel=(3, 3), num_filter=8, pad=(1, 1), name="conv2")
    net = mx.sym.Activation(net, act_type="sigmoid")
    net = mx.sym.Pooling(net, pool_type="avg", kernel=(3, 3), stride=(2, 2),
                         pooling_convention="full")
    net = mx.sym.Flatten(net)
    net = mx.sym.FullyConnected(net, num_hidden=24, name="fc1")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.FullyConnected(net, num_hidden=10, name="fc2")
    return mx.sym.softmax(net, axis=-1, name="prob"), (2, 1, 20, 20)


def conv_bn_block(data, channels, stride, name):
    """A residual block: conv-bn-relu-conv-bn plus the (projected) shortcut."""
    body = mx.sym.Convolution(data, kernel=(3, 3), pad=(1, 1), stride=(stride, stride),
                              num_filter=channels, no_bias=True, name=name + "_conv1")
    body = mx.sym.BatchNorm(body, fix_gamma=False, eps=1e-5, name=name + "_bn1")
    body = mx.sym.Activation(body, act_type="relu", name=name + "_relu1")
    body = mx.sym.Convolution(body, kernel=(3, 3), pad=(1, 1), num_filter=channels,
                              no_bias=True, name=name + "_conv2")
    body = mx.sym.BatchNorm(body, fix_gamma=False, eps=1e-5, name=name + "_bn2")
    shortcut = data
    if stride != 1:
        shortcut = mx.sym.Convolution(data, kernel=(1, 1), stride=(stride, stride),
                                      num_filter=channels, no_bias=True, name=name + "_sc")
    return mx.sym.Activation(body + shortcut, act_type="relu", name=name + "_out")


def resnet_thumb():
    data = mx.sym.Variable("data")
    net = mx.sym.Convolution(data, kernel=(3, 3), pad=(1, 1), num_filter=8, no_bias=True,
                             name="conv0")
    net = mx.sym.BatchNorm(net, name="bn0")  # fix_gamma=True: MXNet's default
    net = mx.sym.Activation(net, act_type="relu")
    net = conv_bn_block(net, 8, 1, "stage1_unit1")
    net = conv_bn_block(net, 12, 2, "stage2_unit1")
    net = mx.sym.Pooling(net, global_pool=True, pool_type="avg", kernel=(1, 1), name="pool")
    net = mx.sym.Flatten(net)
    net = mx.sym.FullyConnected(net, num_hidden=5, name="fc")
    return mx.sym.SoftmaxOutput(net, name="softmax"), (2, 3, 16, 16)


def ops_mix():
    """The elementwise, scalar and shape ops user code writes between layers."""
    data = mx.sym.Variable("data")
    x = mx.sym.Convolution(data, kernel=(1, 1), num_filter=4, name="proj")
    x = mx.sym.LeakyReLU(x, act_type="leaky", slope=0.1, name="leaky")
    y = mx.sym.LeakyReLU(x, act_type="elu", slope=0.5, name="elu")
    z = mx.sym.LeakyReLU(x, act_type="prelu", name="prelu")
    x = mx.sym.Concat(x, y, z, dim=1, name="cat")
    x = (x * 0.5 + 1.0) / 2.0 - 0.25
    x = 1.0 - x
    x = 2.0 / (mx.sym.abs(x) + 1.0)
    x = x ** 2.0
    x = mx.sym.clip(x, a_min=0.0, a_max=3.0)
    x = mx.sym.Pooling(x, kernel=(3, 3), stride=(1, 1), pad=(1, 1), pool_type="avg",
                       count_include_pad=False, name="avgpool")
    x = mx.sym.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="sum", name="sumpool")
    x = mx.sym.transpose(x, axes=(0, 2, 3, 1))
    x = mx.sym.Reshape(x, shape=(0, -1, 4), name="reshape")  # MXNet's codes: 0 keeps
    parts = mx.sym.split(x, num_outputs=2, axis=2, name="halves")
    x = mx.sym.broadcast_mul(parts[0], mx.sym.exp(parts[1] * -1.0))
    x = mx.sym.slice_axis(x, axis=1, begin=1, end=None, name="rows")
    s = mx.sym.sum(x, axis=1, keepdims=True)
    m = mx.sym.mean(x, axis=(1, 2), keepdims=False)
    x = mx.sym.broadcast_sub(x, s)
    x = mx.sym.Flatten(x)
    x = mx.sym.Dropout(x, p=0.3)
    x = mx.sym.FullyConnected(x, num_hidden=3, name="head")
    x = mx.sym.log_softmax(x)
    return mx.sym.Group([x, mx.sym.expand_dims(m, axis=1)]), (2, 2, 6, 6)


def layers_mix():
    """Less common layers: Deconvolution, UpSampling, SoftmaxActivation, slice, where,
    squeeze, BlockGrad, Cast, batch_dot and a regression output."""
    data = mx.sym.Variable("data")
    x = mx.sym.Deconvolution(data, kernel=(2, 2), stride=(2, 2), num_filter=3, name="deconv")
    x = mx.sym.UpSampling(x, scale=2, sample_type="nearest", num_args=1, name="up")
    x = mx.sym.SoftmaxActivation(x, mode="channel", name="chan_softmax")
    x = mx.sym.slice(x, begin=(None, 1, 2), end=(None, None, -2), step=(None, 1, 2))
    x = mx.sym.where(x > 0.3, x, mx.sym.zeros_like(x))
    x = mx.sym.BlockGrad(mx.sym.Cast(x, dtype="float32"))
    x = mx.sym.Reshape(x, shape=(0, -3, -1), name="rows")
    x = mx.sym.batch_dot(x, x, transpose_b=True)
    x = mx.sym.SoftmaxActivation(x, name="inst_softmax")
    x = mx.sym.sqrt(mx.sym.square(x) + 1.0)
    x = mx.sym.expand_dims(mx.sym.max(x, axis=2), axis=1)
    x = mx.sym.squeeze(x, axis=1)
    return mx.sym.LinearRegressionOutput(x, name="regression"), (2, 2, 3, 3)


def norms():
    """InstanceNorm, LayerNorm and GroupNorm, with MXNet's parameter shapes."""
    data = mx.sym.Variable("data")
    x = mx.sym.InstanceNorm(data, eps=1e-4, name="inorm")
    x = mx.sym.GroupNorm(x, num_groups=2, name="gnorm")
    x = mx.sym.LayerNorm(x, name="lnorm")
    return mx.sym.Activation(x, act_type="softrelu"), (2, 4, 3, 5)


def flat_rnn():
    """sym.RNN over one flat parameter vector: 2 bidirectional tanh layers, then a head."""
    data = mx.sym.Variable("data")
    x = mx.sym.RNN(data, mx.sym.Variable("rnn_parameters"), mx.sym.Variable("rnn_state"),
                   state_size=4, num_layers=2, bidirectional=True, mode="rnn_tanh",
                   name="rnn")
    return mx.sym.FullyConnected(x, num_hidden=2, flatten=False, name="head"), (5, 2, 3)


def gluon_net():
    net = mx.gluon.nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(mx.gluon.nn.Conv2D(6, 3, padding=1, activation="relu"),
                mx.gluon.nn.BatchNorm(),
                mx.gluon.nn.MaxPool2D(2),
                mx.gluon.nn.Conv2D(8, 3, strides=2, use_bias=False),
                mx.gluon.nn.LeakyReLU(0.2),
                mx.gluon.nn.GlobalAvgPool2D(),
                mx.gluon.nn.Flatten(),
                mx.gluon.nn.Dense(12, activation="sigmoid"),
                mx.gluon.nn.Dropout(0.5),
                mx.gluon.nn.Dense(3))
    return net, (2, 3, 12, 12)


def gluon_lstm():
    """A 2-layer bidirectional LSTM (MXNet's fused RNN op) given its begin states."""
    return mx.gluon.rnn.LSTM(5, num_layers=2, bidirectional=True, input_size=3,
                             prefix="lstm_"), [(4, 2, 3), (4, 2, 5), (4, 2, 5)]


def gluon_gru():
    """A one-layer GRU in NTC layout, with its default (zero) begin state."""
    return mx.gluon.rnn.GRU(4, layout="NTC", input_size=3, prefix="gru_"), [(2, 5, 3)]


def _random_params(symbol, shape, rng):
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=shape)
    args = {n: mx.nd.array(rng.normal(0, 0.5, s)) for n, s in
            zip(symbol.list_arguments(), arg_shapes) if n != "data" and not n.endswith("label")}
    aux = {}
    for n, s in zip(symbol.list_auxiliary_states(), aux_shapes):
        values = rng.uniform(0.5, 1.5, s) if n.endswith("var") else rng.normal(0, 0.2, s)
        aux[n] = mx.nd.array(values)
    return args, aux


def save_symbol_model(out, name, symbol, shape, rng):
    args, aux = _random_params(symbol, shape, rng)
    prefix = os.path.join(out, name)
    mx.model.save_checkpoint(prefix, 0, symbol, args, aux)
    data = rng.normal(0, 1, shape).astype(np.float32)
    executor = symbol.simple_bind(mx.cpu(), grad_req="null", data=shape)
    for key, value in {**args, **aux}.items():
        target = executor.arg_dict.get(key, executor.aux_dict.get(key))
        value.copyto(target)
    outputs = executor.forward(is_train=False, data=mx.nd.array(data))
    _save_expected(prefix, data, outputs)


def save_gluon_model(out, name, net, shapes, rng):
    """``shapes``: one input's, or a list of each input's (data0, data1, ...)."""
    net.initialize(mx.init.Normal(0.5))
    net.hybridize()
    several = isinstance(shapes, list)
    inputs = [rng.normal(0, 1, s).astype(np.float32) for s in (shapes if several else [shapes])]
    _call(net, inputs)  # the first call builds the graph
    for param in net.collect_params().values():
        values = rng.uniform(0.5, 1.5, param.shape) if param.name.endswith("var") \
            else rng.normal(0, 0.4, param.shape)
        param.set_data(mx.nd.array(values))
    outputs = _call(net, inputs)
    net.export(os.path.join(out, name))
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    outputs = [o for item in outputs for o in (item if isinstance(item, list) else [item])]
    if several:
        _save_expected(os.path.join(out, name), inputs[0], outputs,
                       {f"data{i}": a for i, a in enumerate(inputs)})
    else:
        _save_expected(os.path.join(out, name), inputs[0], outputs)


def _call(net, inputs):
    """The data, and the begin states (a list, as Gluon's rnn layers take them) if given."""
    arrays = [mx.nd.array(a) for a in inputs]
    return net(arrays[0], arrays[1:]) if len(arrays) > 1 else net(arrays[0])


def _save_expected(prefix, data, outputs, inputs=None):
    arrays = {f"output{i}": o.asnumpy() for i, o in enumerate(outputs)}
    np.savez(prefix + "-expected.npz", data=data, **(inputs or {}), **arrays)


def main(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.RandomState(SEED)
    for builder in (mlp, lenet, resnet_thumb, ops_mix, layers_mix,
                    norms, flat_rnn):
        symbol, shape = builder()
        save_symbol_model(out, builder.__name__, symbol, shape, rng)
    for builder in (gluon_net, gluon_lstm, gluon_gru):
        net, shape = builder()
        save_gluon_model(out, builder.__name__, net, shape, rng)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "data", "mxnet_json"))
