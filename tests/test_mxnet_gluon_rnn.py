"""mixrt.gluon.rnn's cells as MXNet 1.9.1 has them: output names of an unrolled symbol,
stacks, bidirectional, residual, zoneout and dropout cells, ``valid_length``, and the
layers' MXNet parameter attributes and ``_unfuse``."""

import mixrt  # noqa: F401  (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import autograd, initializer, nd, sym
from mixrt.errors import InputError
from mixrt.gluon import rnn

RNG = np.random.default_rng(5)


def rand(*shape):
    return nd.array(RNG.standard_normal(shape).astype(np.float32))


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(getattr(a, "asnumpy", lambda: a)()),
                               np.asarray(getattr(b, "asnumpy", lambda: b)()),
                               rtol=rtol, atol=atol)


@pytest.mark.parametrize("cell_cls", [rnn.RNNCell, rnn.LSTMCell, rnn.GRUCell])
def test_unrolled_symbols_are_named_as_mxnet_names_them(cell_cls):
    cell = cell_cls(8, prefix="rnn_")
    outputs, _ = cell.unroll(3, [sym.Variable(f"rnn_t{i}_data") for i in range(3)])
    group = sym.Group(outputs)
    assert group.list_outputs() == ["rnn_t0_out_output", "rnn_t1_out_output",
                                    "rnn_t2_out_output"]
    _, shapes, _ = group.infer_shape(**{f"rnn_t{i}_data": (4, 5) for i in range(3)})
    assert shapes == [(4, 8)] * 3


def test_stack_and_bidirectional_names():
    stack = rnn.SequentialRNNCell()
    stack.add(rnn.LSTMCell(6, prefix="s0_"))
    stack.add(rnn.ResidualCell(rnn.LSTMCell(6, prefix="s1_")))
    stack.add(rnn.GRUCell(6, prefix="s2_"))
    outputs, states = stack.unroll(2, [sym.Variable("a"), sym.Variable("b")])
    assert sym.Group(outputs).list_outputs() == ["s2_t0_out_output", "s2_t1_out_output"]
    assert len(states) == 5 and len(stack) == 3
    bi = rnn.BidirectionalCell(rnn.LSTMCell(6, prefix="l_"), rnn.LSTMCell(6, prefix="r_"),
                               output_prefix="bi_")
    outputs, _ = bi.unroll(2, [sym.Variable("a"), sym.Variable("b")])
    group = sym.Group(outputs)
    assert group.list_outputs() == ["bi_t0_output", "bi_t1_output"]
    assert group.infer_shape(a=(3, 4), b=(3, 4))[1] == [(3, 12), (3, 12)]


def test_a_stack_steps_as_its_cells_do():
    cells = [rnn.LSTMCell(5, input_size=4), rnn.GRUCell(3, input_size=5)]
    stack = rnn.HybridSequentialRNNCell()
    for cell in cells:
        stack.add(cell)
    stack.initialize(initializer.Uniform(0.5))
    x = rand(2, 4)
    states = stack.begin_state(batch_size=2)
    assert [s.shape for s in states] == [(2, 5), (2, 5), (2, 3)]
    out, new_states = stack(x, states)
    h, lstm_states = cells[0](x, states[:2])
    want, gru_states = cells[1](h, states[2:])
    close(out, want)
    assert len(new_states) == 3
    close(new_states[2], gru_states[0])


def test_bidirectional_is_the_left_cell_and_the_reversed_right_cell():
    left, right = rnn.GRUCell(3, input_size=4), rnn.GRUCell(3, input_size=4)
    bi = rnn.BidirectionalCell(left, right)
    bi.initialize(initializer.Uniform(0.5))
    x = rand(2, 5, 4)  # NTC
    outputs, states = bi.unroll(5, x, merge_outputs=True)
    want_left, left_states = left.unroll(5, x, merge_outputs=True)
    want_right, right_states = right.unroll(5, nd.flip(x, axis=1), merge_outputs=True)
    close(outputs, np.concatenate([want_left.asnumpy(),
                                   want_right.asnumpy()[:, ::-1]], axis=2))
    close(states[0], left_states[0])
    close(states[1], right_states[0])
    with pytest.raises(InputError, match="cannot be stepped"):
        bi(x[:, 0], None)


def test_valid_length_masks_outputs_and_picks_final_states():
    for cell in (rnn.LSTMCell(4, input_size=3),
                 rnn.BidirectionalCell(rnn.RNNCell(4, input_size=3),
                                       rnn.RNNCell(4, input_size=3))):
        cell.initialize(initializer.Uniform(0.5))
        x, lengths = rand(3, 6, 3), [2, 6, 4]
        outputs, states = cell.unroll(6, x, merge_outputs=True,
                                      valid_length=nd.array(lengths))
        for i, length in enumerate(lengths):
            alone, alone_states = cell.unroll(length, x[i:i + 1, :length],
                                              merge_outputs=True)
            close(outputs[i:i + 1, :length], alone, rtol=1e-4, atol=1e-5)
            assert np.all(outputs[i, length:].asnumpy() == 0)
            for state, alone_state in zip(states, alone_states):
                close(state[i:i + 1], alone_state, rtol=1e-4, atol=1e-5)


def test_residual_cell_adds_the_input():
    cell = rnn.ResidualCell(rnn.GRUCell(4, input_size=4))
    cell.initialize(initializer.Zero())  # a zero GRU outputs zeros: the input comes out
    x = rand(2, 3, 4)
    outputs, _ = cell.unroll(3, x, merge_outputs=True)
    close(outputs, x)
    step, _ = cell(x[:, 0], cell.begin_state(batch_size=2))
    close(step, x[:, 0])


def test_zoneout_and_dropout_change_nothing_outside_training():
    base = rnn.LSTMCell(4, input_size=3)
    zoneout = rnn.ZoneoutCell(base, zoneout_outputs=0.5, zoneout_states=0.5)
    zoneout.initialize(initializer.Uniform(0.5))
    x = rand(2, 4, 3)
    close(zoneout.unroll(4, x, merge_outputs=True)[0],
          base.unroll(4, x, merge_outputs=True)[0])
    outputs_only = rnn.ZoneoutCell(base, zoneout_outputs=0.5)
    with autograd.record():  # training: each unit is the new output or the previous one
        zoned, _ = outputs_only.unroll(4, x, merge_outputs=True)
    plain, zoned = base.unroll(4, x, merge_outputs=True)[0].asnumpy(), zoned.asnumpy()
    previous = np.concatenate([np.zeros_like(zoned[:, :1]), zoned[:, :-1]], axis=1)
    assert np.all((zoned == plain) | (zoned == previous))
    assert np.any(zoned != plain)  # some units did zone out
    dropout = rnn.DropoutCell(0.5)
    close(dropout.unroll(4, x, merge_outputs=True)[0], x)
    with pytest.raises(InputError, match="rate"):
        rnn.DropoutCell(1.5)
    with pytest.raises(InputError, match="Bidirectional"):
        rnn.ZoneoutCell(rnn.BidirectionalCell(rnn.RNNCell(2), rnn.RNNCell(2)))


def test_hybridized_unroll_gives_the_same_outputs_and_gradients():
    stack = rnn.HybridSequentialRNNCell()
    stack.add(rnn.LSTMCell(4, input_size=3))
    stack.add(rnn.RNNCell(4, input_size=4))
    stack.initialize(initializer.Uniform(0.5))
    x = rand(2, 3, 3)
    results = []
    for hybrid in (False, True):
        stack.hybridize(hybrid)
        x.attach_grad()
        with autograd.record():
            out, _ = stack.unroll(3, x, merge_outputs=True)
        out.backward()
        results.append((out.asnumpy(), x.grad.asnumpy().copy()))
    close(results[0][0], results[1][0])
    close(results[0][1], results[1][1])


def test_layer_parameters_are_attributes_and_unfuse_shares_them():
    layer = rnn.LSTM(3, num_layers=2, bidirectional=True, input_size=4, prefix="lstm0_")
    assert layer.l0_i2h_weight is layer.collect_params()["lstm0_l0_i2h_weight"]
    assert layer.r1_h2h_bias.shape == (12,)
    stack = layer._unfuse()
    assert sorted(stack.collect_params()) == sorted(layer.collect_params())
    layer.initialize(initializer.Uniform(0.5))
    x = rand(5, 2, 4)  # TNC
    want = layer(x)
    got, _ = stack.unroll(5, x, layout="TNC", merge_outputs=True)
    close(got, want, rtol=1e-4, atol=1e-5)


# LSTM(3, projection_size=2, input_size=2, bidirectional=True): MXNet 1.9.1's outputs and
# final states for parameters sin(arange + i) / 2 (i: the parameter's place by name) and
# input cos(arange(12)) as (T=3, N=2, C=2)
LSTMP_OUT = [[[-0.115662, 0.108669, 0.021754, -0.023202], [0.122356, -0.126079, 0.080156,
                                                          -0.082026]],
             [[-0.020866, 0.016369, 0.054495, -0.061208], [-0.071857, 0.065667, 0.020416,
                                                          -0.023983]],
             [[0.096597, -0.09964, 0.070579, -0.069594], [0.034118, -0.039799, 0.050409,
                                                         -0.056556]]]
LSTMP_H = [[[0.096597, -0.09964], [0.034118, -0.039799]],
           [[0.021754, -0.023202], [0.080156, -0.082026]]]
LSTMP_C = [[[0.29095, 0.045313, -0.141181], [0.101332, 0.134148, -0.038984]],
           [[0.106323, -0.10858, 0.185304], [-0.054489, 0.288766, -0.013713]]]


def test_projected_lstm_layer_matches_mxnet_imperative_and_hybridized():
    layer = rnn.LSTM(3, projection_size=2, input_size=2, bidirectional=True, prefix="p_")
    layer.initialize()
    for i, (_, param) in enumerate(sorted(layer.collect_params().items())):
        size = int(np.prod(param.shape))
        param.set_data(nd.array(np.sin(np.arange(size) + i).reshape(param.shape) * 0.5))
    assert layer.l0_h2r_weight.shape == (2, 3) and layer.r0_h2h_weight.shape == (12, 2)
    x = nd.array(np.cos(np.arange(12)).reshape(3, 2, 2))
    for hybrid in (False, True):
        layer.hybridize(hybrid)
        out, (h, c) = layer(x, layer.begin_state(2))
        close(out, LSTMP_OUT, atol=2e-6)
        close(h, LSTMP_H, atol=2e-6)
        close(c, LSTMP_C, atol=2e-6)
        assert layer(x).shape == (3, 2, 4)


def test_projected_cell_and_refusals():
    cell = rnn.LSTMPCell(4, 2, input_size=3)
    cell.initialize(initializer.Uniform(0.5))
    assert [s.shape for s in cell.begin_state(5)] == [(5, 2), (5, 4)]
    outputs, states = cell.unroll(3, rand(5, 3, 3), merge_outputs=True)
    assert outputs.shape == (5, 3, 2) and states[1].shape == (5, 4)
    with pytest.raises(InputError, match="projection_size"):
        rnn.GRU(3, projection_size=2)
    with pytest.raises(InputError, match="projection_size"):
        rnn.LSTMPCell(3, 0)


def test_variational_dropout_keeps_one_mask_per_sequence():
    base = rnn.LSTMCell(6, input_size=3)
    cell = rnn.VariationalDropoutCell(base, drop_outputs=0.5)
    cell.initialize(initializer.Uniform(0.5))
    x = rand(4, 5, 3)
    close(cell.unroll(5, x, merge_outputs=True)[0], base.unroll(5, x, merge_outputs=True)[0])
    with autograd.record():
        outputs, _ = cell.unroll(5, x, merge_outputs=True)
    dropped = outputs.asnumpy() == 0
    assert dropped.any() and not dropped.all()
    assert all((dropped[:, t] == dropped[:, 0]).all() for t in range(5))  # every step
    with pytest.raises(InputError, match="drop_states"):
        rnn.VariationalDropoutCell(rnn.BidirectionalCell(rnn.RNNCell(2), rnn.RNNCell(2)),
                                   drop_states=0.5)


def test_symbolic_unroll_with_valid_length_infers_every_shape():
    """What a Module binds from: the data's and lengths' shapes settle the weights'."""
    cell = rnn.RNNCell(7)
    outputs, states = cell.unroll(5, sym.var("data"), valid_length=sym.var("length"),
                                  merge_outputs=True)
    group = sym.Group([outputs, states[0]])
    arg_shapes, out_shapes, _ = group.infer_shape(data=(4, 5, 3), length=(4,))
    assert dict(zip(group.list_arguments(), arg_shapes))[cell.prefix + "i2h_weight"] == (7, 3)
    assert out_shapes == [(4, 5, 7), (4, 7)]
