"""mx.init against MXNet 1.9.1: which rule a name picks (InitDesc, its own __init__, the older
plain-string rules), the deterministic initializers' values (Bilinear, LSTMBias, Constant,
FusedRNN's layout), Load, Mixed, dumps and create, errors, and the random ones' statistics.

Expected values were printed by MXNet 1.9.1 running the same calls (2026-11-24).
"""

import json
import warnings

import numpy as np
import pytest

import mixrt
import mixrt.init as init
from mixrt import nd


def filled(initializer, name, shape, attrs=None, plain=False):
    array = nd.zeros(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        initializer(name if plain else init.InitDesc(name, attrs), array)
    return array.asnumpy()


# (initializer, name, shape, own __init__ attribute, plain string name, MXNet's values)
RULES = [
    (init.Constant(5), "fc_bias", (3,), None, False, [0, 0, 0]),  # the name rule wins...
    (init.Constant(5), "fc_weight", (3,), None, False, [5, 5, 5]),
    (init.Xavier(), "fc_bias", (3,), {"__init__": init.Constant(5).dumps()}, False,
     [5, 5, 5]),                                                   # ...but not the own init
    (init.Xavier(), "bn_gamma", (3,), None, False, [1, 1, 1]),
    (init.Xavier(), "bn_beta", (3,), None, False, [0, 0, 0]),
    (init.Xavier(), "q_min", (2,), None, False, [0, 0]),
    (init.Xavier(), "q_max", (2,), None, False, [1, 1]),
    (init.Xavier(), "bn_moving_mean", (2,), None, True, [0, 0]),
    (init.Xavier(), "bn_moving_var", (2,), None, True, [1, 1]),
    (init.Xavier(), "stn_loc_bias", (6,), None, True, [1, 0, 0, 0, 1, 0]),
    (init.Xavier(), "upsampling0", (1, 1, 2, 2), None, True, [[[[1, 0], [0, 0]]]]),
    (init.One(), "x_weight", (2,), None, False, [1, 1]),
    (init.create("zeros"), "x_weight", (2,), None, False, [0, 0]),
    (init.LSTMBias(forget_bias=3.0), "lstm_weight", (8,), None, False,
     [0, 0, 3, 3, 0, 0, 0, 0]),
]


@pytest.mark.parametrize("initializer,name,shape,attrs,plain,expected", RULES,
                         ids=[f"{type(r[0]).__name__}-{r[1]}" for r in RULES])
def test_name_rules_match_mxnet(initializer, name, shape, attrs, plain, expected):
    np.testing.assert_allclose(filled(initializer, name, shape, attrs, plain), expected)


def test_unknown_names_and_vectors_are_value_errors_as_in_mxnet():
    with pytest.raises(ValueError, match="Unknown initialization pattern for bn_moving_mean"):
        filled(init.Xavier(), "bn_moving_mean", (2,))
    with pytest.raises(ValueError, match="cannot be applied to vector fc_weight"):
        filled(init.Xavier(), "fc_weight", (3,))
    with pytest.raises(ValueError, match="Incorrect factor type"):
        init.Xavier(factor_type="sideways")
    with pytest.warns(DeprecationWarning, match="InitDesc"):
        init.Zero()("fc_weight", nd.ones((2,)))


def test_bilinear_matches_mxnet():
    expected = [[[[0.111111, 0.222222, 0.333333, 0.222222, 0.111111],
                  [0.222222, 0.444444, 0.666667, 0.444444, 0.222222],
                  [0.333333, 0.666667, 1.0, 0.666667, 0.333333]]]]
    np.testing.assert_allclose(filled(init.Bilinear(), "up_weight", (1, 1, 3, 5)), expected,
                               atol=1e-6)


def test_fused_rnn_lays_its_pieces_out_as_mxnet():
    lstm = init.FusedRNN(None, num_hidden=2, num_layers=1, mode="lstm", forget_bias=4.0)
    values = filled(init.One(), "rnn_parameters", (56,), {"__init__": lstm.dumps()})
    bias = [0, 0, 4, 4, 0, 0, 0, 0]  # gates i, f, c, o; i2h then h2h
    np.testing.assert_array_equal(values, [1] * 40 + bias + bias)
    gru = init.FusedRNN(None, num_hidden=2, num_layers=2, mode="gru", bidirectional=True)
    size = 2 * 3 * 2 * (3 + 2) + 2 * 3 * 2 * (4 + 2) + 2 * 2 * 3 * 2 * 2
    values = filled(init.One(), "rnn_parameters", (size,), {"__init__": gru.dumps()})
    np.testing.assert_array_equal(values, [1] * 132 + [0] * 48)


def test_dumps_and_create_match_mxnet():
    dumped = [init.Xavier(factor_type="in", magnitude=2).dumps(), init.MSRAPrelu().dumps(),
              init.Constant(2.5).dumps(), init.Uniform().dumps(), init.Normal(0.5).dumps(),
              init.Orthogonal().dumps(), init.Zero().dumps(), init.LSTMBias().dumps(),
              init.Bilinear().dumps()]
    assert dumped == [  # MXNet 1.9.1's strings
        '["xavier", {"rnd_type": "uniform", "factor_type": "in", "magnitude": 2}]',
        '["msraprelu", {"factor_type": "avg", "slope": 0.25}]', '["constant", {"value": 2.5}]',
        '["uniform", {"scale": 0.07}]', '["normal", {"sigma": 0.5}]',
        '["orthogonal", {"scale": 1.414, "rand_type": "uniform"}]', '["zero", {}]',
        '["lstmbias", {"forget_bias": 1.0}]', '["bilinear", {}]']
    for text in dumped:
        assert init.create(text).dumps() == text
    assert init.Uniform(0.1) == init.Uniform(0.1) and init.Uniform(0.1) != init.Uniform(0.2)
    assert isinstance(init.create("ONES"), init.One)
    assert json.loads(init.Constant(nd.array([1, 2])).dumps())[1] == {"value": [1.0, 2.0]}
    with pytest.raises(ValueError, match="unknown initializer 'nope'"):
        init.create("nope")


def test_mixed_and_load_as_mxnet():
    mixed = init.Mixed([".*bias", ".*"], [init.Constant(2), init.One()])
    a, b = nd.zeros((2,)), nd.zeros((2,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mixed("fc_bias", a)
        mixed("fc_weight", b)
        load = init.Load({"arg:fc_weight": nd.ones((2,)) * 7}, default_init=init.Constant(1))
        load("fc_weight", a)
        load("fc_bias", b)
    # MXNet: Constant's name rule gives the bias 0 through Mixed and Load
    np.testing.assert_array_equal(a.asnumpy(), [7, 7])
    np.testing.assert_array_equal(b.asnumpy(), [0, 0])
    with pytest.raises(ValueError, match="did not match any pattern"):
        init.Mixed(["x.*"], [init.One()])("y", nd.zeros((1,)))
    with pytest.raises(mixrt.errors.ShapeError, match="Shape mismatch"):
        load("fc_weight", nd.zeros((3,)))


def test_load_reads_a_params_file(tmp_path):
    path = str(tmp_path / "net-0001.params")
    nd.save(path, {"arg:fc_weight": nd.ones((2, 2)) * 3})
    array = nd.zeros((2, 2))
    init.Load(path)(init.InitDesc("fc_weight"), array)
    np.testing.assert_array_equal(array.asnumpy(), np.full((2, 2), 3))


def test_random_initializers_have_mxnets_spread():
    mixrt.random.seed(0)
    # MXNet 1.9.1 (its own generator) measured 0.082, 0.201, 0.117 for these three
    a = filled(init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), "w_weight",
               (200, 300))
    assert a.std() == pytest.approx(np.sqrt(2 / 300), rel=0.02)
    a = filled(init.Xavier(), "w_weight", (200, 30, 3, 3))
    assert np.abs(a).max() == pytest.approx(np.sqrt(3 / ((270 + 1800) / 2)), rel=0.01)
    a = filled(init.MSRAPrelu(), "w_weight", (200, 300))
    assert a.std() == pytest.approx(np.sqrt(2 / 1.0625 / 250), rel=0.02)
    for shape, scale in (((6, 10), 2.0), ((10, 3), 1.414)):
        v = filled(init.Orthogonal(scale=scale), "w_weight", shape)
        gram = v @ v.T if shape[0] < shape[1] else v.T @ v
        np.testing.assert_allclose(gram, scale ** 2 * np.eye(min(shape)), atol=1e-5)


def test_mixrts_call_form_returns_new_arrays():
    weight = init.Xavier()("fc1_weight", (4, 3), "float64")
    assert weight.shape == (4, 3) and weight.dtype == np.float64
    np.testing.assert_array_equal(init.Xavier()("fc1_bias", (3,)), np.zeros(3))
    np.testing.assert_array_equal(init.Xavier()("bn_moving_var", (2,)), np.ones(2))
    np.testing.assert_array_equal(init.Constant(2)("fc1_bias", (2,)), [2, 2])
    spec = init.MSRAPrelu(slope=0.1).spec()
    assert spec == {"type": "MSRAPrelu", "factor_type": "avg", "slope": 0.1}
    assert init.create(spec).slope == 0.1
