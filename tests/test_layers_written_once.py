"""MXNet's layers are written once (mixrt/layers/) and serve nd, sym and Gluon: the front
ends' functions are bindings of the same definitions, and where the symbol front end knows
no shapes (so it takes the shape-free compositions) it computes what the NDArray one does."""

import inspect

import numpy as np
import pytest

from mixrt import layers, nd, sym
from mixrt.gluon import nn


def test_nd_and_sym_bind_every_shared_layer_with_one_signature():
    for name, definition in layers.LAYERS.items():
        expected = list(inspect.signature(definition).parameters)[1:]
        for frontend in (nd, sym):
            bound = getattr(frontend, name)
            assert bound.definition is definition, (frontend.__name__, name)
            assert list(inspect.signature(bound).parameters) == expected


def _data(shape):
    values = np.sin(np.arange(int(np.prod(shape))) * 1.3 + 0.2).reshape(shape)
    return values.astype(np.float64)


def _array(values):
    """An NDArray keeping float64 (nd.array makes float32 of NumPy data, as MXNet's does)."""
    return nd.array(values, dtype=values.dtype)


def _symbol_forward(build, data: np.ndarray) -> np.ndarray:
    net = build(sym.Variable("data"))
    executor = net.simple_bind("cpu", data=data.shape, type_dict={"data": "float64"})
    return np.asarray(executor.forward(data=data)[0])


POOLS = {  # the settings that take the written-out padding (MXNet's values, not ONNX's)
    "max_full": dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), pooling_convention="full"),
    "max_pad_as_kernel": dict(kernel=(2, 2), stride=(2, 2), pad=(2, 2)),
    "avg_full": dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg",
                     pooling_convention="full"),
    "avg_full_exclude_pad": dict(kernel=(3, 2), stride=(2, 3), pad=(1, 1), pool_type="avg",
                                 pooling_convention="full", count_include_pad=False),
    "sum_full": dict(kernel=(2, 2), stride=(3, 3), pool_type="sum",
                     pooling_convention="full"),
    "lp2": dict(kernel=(2, 2), stride=(1, 1), pad=(1, 1), pool_type="lp", p_value=2),
    "lp3_full": dict(kernel=(3,), stride=(2,), pool_type="lp", p_value=3,
                     pooling_convention="full"),
    "lp1_global": dict(global_pool=True, pool_type="lp", p_value=1),
    "sum_global": dict(global_pool=True, pool_type="sum"),
}


@pytest.mark.parametrize("case", sorted(POOLS))
def test_symbol_pooling_computes_what_the_ndarray_one_does(case):
    arguments = POOLS[case]
    shape = (2, 3, 7) if len(arguments.get("kernel", (0, 0))) == 1 else (2, 3, 7, 6)
    data = _data(shape)
    expected = nd.Pooling(_array(data), **arguments).asnumpy()
    got = _symbol_forward(lambda x: sym.Pooling(x, name="p", **arguments), data)
    # a window wholly in the padding: the dtype's lowest value on NDArrays; a symbol does
    # not know its dtype while it is built, and gives float32's (documented in pooling.py)
    empty = expected == np.finfo(np.float64).min
    assert np.all(got[empty] == np.finfo(np.float32).min)
    np.testing.assert_allclose(got[~empty], expected[~empty], rtol=1e-12, atol=1e-12)


def test_a_window_wholly_in_the_padding_gives_the_lowest_value_as_mxnet():
    data = _data((1, 1, 2, 2))
    out = nd.Pooling(_array(data), kernel=(2, 2), stride=(2, 2), pad=(2, 2)).asnumpy()
    assert out[0, 0, 0, 0] == np.finfo(np.float64).min
    assert out[0, 0, 1, 1] == data.max()


def test_gluon_ceil_mode_pools_are_mxnets_full_convention():
    data = nd.array(_data((1, 2, 7, 7)).astype(np.float32))
    for block, pool_type in ((nn.MaxPool2D(3, 2, 1, ceil_mode=True), "max"),
                             (nn.AvgPool2D(3, 2, 1, ceil_mode=True), "avg")):
        expected = nd.Pooling(data, kernel=(3, 3), stride=(2, 2), pad=(1, 1),
                              pool_type=pool_type, pooling_convention="full")
        np.testing.assert_allclose(block(data).asnumpy(), expected.asnumpy(), rtol=1e-6)
        block.hybridize()
        np.testing.assert_allclose(block(data).asnumpy(), expected.asnumpy(), rtol=1e-6)


def test_deconvolution_target_shape_splits_the_surplus_as_mxnet_on_both_front_ends():
    data, weight = _data((1, 2, 4, 4)), _data((2, 3, 3, 3))
    arguments = dict(kernel=(3, 3), stride=(2, 2), num_filter=3, target_shape=(8, 7))
    expected = nd.Deconvolution(_array(data), _array(weight), **arguments).asnumpy()
    assert expected.shape == (1, 3, 8, 7)
    net = sym.Deconvolution(sym.Variable("data"), name="d", **arguments)
    executor = net.simple_bind("cpu", data=data.shape, type_dict={"data": "float64"})
    executor.copy_params_from({"d_weight": _array(weight)})
    got = np.asarray(executor.forward(data=data)[0])
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # MXNet's split: (4 - 1) * 2 + 3 = 9 rows, 1 too many: pad 1 in front, none behind
    full = nd.Deconvolution(_array(data), _array(weight), kernel=(3, 3), stride=(2, 2),
                            num_filter=3).asnumpy()
    np.testing.assert_allclose(expected[:, :, :, :], full[:, :, 1:9, 1:8], rtol=1e-12)
