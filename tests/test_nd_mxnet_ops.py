"""MXNet's operator names in mixrt.nd (mixrt/nd/mxnet_ops.py): FullyConnected, Activation,
LeakyReLU, softmax, one_hot, pick, take, split, slice, topk, sort, broadcast_*, dot, norm,
tile, repeat, flip, round, BlockGrad, Embedding, SequenceMask, ... and the NDArray methods.

Every expected value below was produced by real MXNet 1.9.1 (CPU) running the same code,
gradients included (``_with_grad``: the gradient of ``sum(y * w)`` for a fixed ``w``), shapes
and dtypes too (a full reduction has shape (1,), argmax gives float32 indices, since
2026-11-24). MXNet's own bugs are checked against finite differences instead (selu's
gradient below 0; sort's backward raises in MXNet).
"""

from __future__ import annotations

import numpy as np
import pytest

import mixrt
from mixrt import autograd as ag
from mixrt import nd
from mixrt.errors import InputError
from mixrt.ops.device import gpu_available


def _x():
    return nd.array([[0.5, -1.5, 2.0, 0.0], [3.0, -0.25, 1.0, -2.0], [1.5, 2.5, -3.0, 0.75]])


def _weights(y):
    return nd.array((np.arange(y.size).reshape(y.shape) % 5 + 1).astype("float32"))


def _with_grad(f, grad=True):
    x = _x()
    x.attach_grad()
    with ag.record():
        y = f(x)
        s = (y * _weights(y)).sum()
    s.backward()
    return [y, x.grad] if grad else [y]


def _case_fc():
    W = nd.array([[0.1,0.2,-0.3,0.4],[0.5,-0.6,0.7,0.8]]); b = nd.array([0.01, -0.02])
    return _with_grad(lambda x: nd.FullyConnected(x, W, b, num_hidden=2))


def _case_fc_nobias():
    W = nd.array([[0.1,0.2,-0.3,0.4],[0.5,-0.6,0.7,0.8]])
    return _with_grad(lambda x: nd.FullyConnected(x.reshape((3,2,2)), W, num_hidden=2, no_bias=True))


def _case_fc_noflat():
    W = nd.array([[0.1,0.2],[-0.3,0.4],[0.5,-0.6]]); b = nd.array([0.01, -0.02, 0.03])
    return _with_grad(lambda x: nd.FullyConnected(x.reshape((3,2,2)), W, b, num_hidden=3, flatten=False))


def _case_act_relu():
    return _with_grad(lambda x: nd.Activation(x, act_type='relu'))


def _case_act_sigmoid():
    return _with_grad(lambda x: nd.Activation(x, act_type='sigmoid'))


def _case_act_tanh():
    return _with_grad(lambda x: nd.Activation(x, act_type='tanh'))


def _case_act_softrelu():
    return _with_grad(lambda x: nd.Activation(x, act_type='softrelu'))


def _case_act_softsign():
    return _with_grad(lambda x: nd.Activation(x, act_type='softsign'))


def _case_lrelu_leaky():
    return _with_grad(lambda x: nd.LeakyReLU(x, act_type='leaky', slope=0.1))


def _case_lrelu_elu():
    return _with_grad(lambda x: nd.LeakyReLU(x, act_type='elu', slope=0.7))


def _case_lrelu_selu():
    return _with_grad(lambda x: nd.LeakyReLU(x, act_type='selu'), grad=False)


def _case_lrelu_gelu():
    return _with_grad(lambda x: nd.LeakyReLU(x, act_type='gelu'))


def _case_lrelu_prelu():
    return _with_grad(lambda x: nd.LeakyReLU(x, gamma=nd.array([0.1, 0.2, 0.3, 0.4]), act_type='prelu'))


def _case_softmax():
    return _with_grad(lambda x: nd.softmax(x, axis=0))


def _case_softmax_t():
    return _with_grad(lambda x: nd.softmax(x, temperature=2.0))


def _case_log_softmax():
    return _with_grad(lambda x: nd.log_softmax(x, axis=1, temperature=0.5))


def _case_softmax_len():
    return _with_grad(lambda x: nd.softmax(x, nd.array([2, 4, 1], dtype='int32'), axis=1, use_length=True))


def _case_one_hot():
    r = nd.one_hot(nd.array([1, 0, 3, -1, 5]), 4)
    return r


def _case_one_hot_opts():
    r = nd.one_hot(nd.array([[1, 2], [0, 2]]), 3, on_value=5, off_value=-1, dtype='int32')
    return r


def _case_pick():
    return _with_grad(lambda x: nd.pick(x, nd.array([0, 3, 1]), axis=1))


def _case_pick_keep_wrap():
    return _with_grad(lambda x: nd.pick(x, nd.array([5, -1, 2, 0]), axis=0, keepdims=True, mode='wrap'))


def _case_pick_clip():
    return _with_grad(lambda x: nd.pick(x, nd.array([7, -2, 1])))


def _case_take():
    return _with_grad(lambda x: nd.take(x, nd.array([[2, 0], [1, 2]])))


def _case_take_axis_wrap():
    return _with_grad(lambda x: nd.take(x, nd.array([5, -1, 0]), axis=1, mode='wrap'))


def _case_take_clip():
    return _with_grad(lambda x: nd.take(x, nd.array([7, -3]), axis=1))


def _case_split():
    x = _x()
    r = nd.split(x, num_outputs=2, axis=1)
    return r


def _case_split_sq():
    x = _x()
    r = nd.split(x, num_outputs=3, axis=0, squeeze_axis=True)
    return r


def _case_split_grad():
    return _with_grad(lambda x: nd.split(x, num_outputs=2)[1])


def _case_slice_axis():
    return _with_grad(lambda x: nd.slice_axis(x, axis=1, begin=1, end=-1))


def _case_slice_axis_none():
    x = _x()
    r = nd.slice_axis(x, axis=0, begin=-2, end=None)
    return r


def _case_slice():
    return _with_grad(lambda x: nd.slice(x, begin=(1, None), end=(None, 3)))


def _case_slice_step():
    return _with_grad(lambda x: nd.slice(x, begin=(None, 3), end=(None, 0), step=(2, -2)))


def _case_slice_negstep_none():
    x = _x()
    r = nd.slice(x, begin=(None, None), end=(None, None), step=(-1, -3))
    return r


def _case_topk_idx():
    x = _x()
    r = nd.topk(x, k=2)
    return r


def _case_topk_both():
    x = _x()
    r = nd.topk(x, axis=0, k=2, ret_typ='both', is_ascend=True, dtype='int32')
    return r


def _case_topk_mask():
    x = _x()
    r = nd.topk(x, k=2, ret_typ='mask')
    return r


def _case_topk_none():
    x = _x()
    r = nd.topk(x, axis=None, k=3, ret_typ='value')
    return r


def _case_topk_grad():
    return _with_grad(lambda x: nd.topk(x, k=2, ret_typ='value'))


def _case_sort():
    x = _x()
    r = nd.sort(x)
    return r


def _case_sort_desc():
    x = _x()
    r = nd.sort(x, axis=0, is_ascend=False)
    return r


def _case_argsort():
    x = _x()
    r = nd.argsort(x, axis=1)
    return r


def _case_argsort_desc_int():
    x = _x()
    r = nd.argsort(x, axis=0, is_ascend=False, dtype='int64')
    return r


def _case_broadcast_to():
    return _with_grad(lambda x: nd.broadcast_to(nd.slice_axis(x, axis=0, begin=1, end=2), shape=(3, 0)))


def _case_broadcast_like():
    x = _x()
    r = nd.broadcast_like(nd.array([[1.0], [2.0], [3.0]]), x)
    return r


def _case_broadcast_like_axes():
    r = nd.broadcast_like(nd.array([[1.0, 2.0, 3.0, 4.0]]), nd.zeros((2, 5)), lhs_axes=(0,), rhs_axes=(0,))
    return r


def _case_broadcast_axis():
    r = nd.broadcast_axis(nd.array([[1.0], [2.0]]), axis=1, size=3)
    return r


def _case_broadcast_add():
    return _with_grad(lambda x: nd.broadcast_add(x, nd.array([[1.0], [2.0], [3.0]])))


def _case_broadcast_mul():
    return _with_grad(lambda x: nd.broadcast_mul(x, nd.array([[1.0, 2.0, 3.0, 4.0]])))


def _case_broadcast_sub():
    x = _x()
    r = nd.broadcast_sub(x, nd.array([[1.0], [2.0], [3.0]]))
    return r


def _case_broadcast_div():
    x = _x()
    r = nd.broadcast_div(x, nd.array([[1.0, 2.0, 4.0, 8.0]]))
    return r


def _case_broadcast_max():
    x = _x()
    r = nd.broadcast_maximum(x, nd.array([[1.0], [0.0], [2.0]]))
    return r


def _case_broadcast_power():
    x = _x()
    r = nd.broadcast_power(nd.abs(x), nd.array([[2.0], [0.5], [1.0]]))
    return r


def _case_broadcast_greater():
    x = _x()
    r = nd.broadcast_greater(x, nd.array([[0.5], [0.0], [1.0]]))
    return r


def _case_broadcast_equal():
    x = _x()
    r = nd.broadcast_equal(x, nd.array([[0.5, -0.25, 1.0, 0.0]]))
    return r


def _case_batch_dot():
    a = nd.array(np.arange(12).reshape(2,2,3).astype('float32')/4); b = nd.array(np.arange(12).reshape(2,3,2).astype('float32')/3 - 1)
    a.attach_grad(); b.attach_grad()
    with ag.record():
        y = nd.batch_dot(a, b)
        s = (y * nd.array(np.arange(8).reshape(2,2,2).astype('float32'))).sum()
    s.backward()
    r = [y, a.grad, b.grad, nd.batch_dot(a, a, transpose_b=True), nd.batch_dot(b, b, transpose_a=True)]
    return r


def _case_dot():
    W = nd.array([[0.1,0.2,-0.3,0.4],[0.5,-0.6,0.7,0.8]])
    return _with_grad(lambda x: nd.dot(x, W, transpose_b=True))


def _case_dot_ta():
    x = _x()
    r = nd.dot(x, x, transpose_a=True)
    return r


def _case_dot_nd():
    x = _x()
    r = nd.dot(x.reshape((3, 2, 2)), nd.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    return r


def _case_norm():
    return _with_grad(lambda x: nd.norm(x, axis=1))


def _case_norm_l1():
    return _with_grad(lambda x: nd.norm(x, ord=1, axis=0, keepdims=True))


def _case_norm_all():
    x = _x()
    r = nd.norm(x)
    return r


def _case_norm_tuple():
    x = _x()
    r = nd.norm(x.reshape((3,2,2)), axis=(1, 2))
    return r


def _case_argmax():
    x = _x()
    r = [nd.argmax(x, axis=1), nd.argmin(x, axis=0, keepdims=True)]
    return r


def _case_tile():
    return _with_grad(lambda x: nd.tile(x, reps=(2, 1)))


def _case_tile_short():
    r = nd.tile(nd.array([1.0, 2.0]), reps=(2, 2))
    return r


def _case_tile_long():
    r = nd.tile(nd.array([[1.0, 2.0]]), reps=(3,))
    return r


def _case_repeat():
    return _with_grad(lambda x: nd.repeat(x, repeats=2, axis=1))


def _case_repeat_none():
    r = nd.repeat(nd.array([[1.0, 2.0], [3.0, 4.0]]), repeats=2)
    return r


def _case_flip():
    return _with_grad(lambda x: nd.flip(x, axis=1))


def _case_reverse2():
    x = _x()
    r = nd.reverse(x, axis=(0, 1))
    return r


def _case_round():
    r = [nd.round(nd.array([2.5, -2.5, 0.5, -0.5, 1.4, -1.6])), nd.rint(nd.array([2.5, -2.5, 0.5, 1.5])), nd.fix(nd.array([2.7, -2.7])), nd.sign(nd.array([-2.0, 0.0, 3.0])), nd.floor(nd.array([-1.5, 1.5])), nd.ceil(nd.array([-1.5, 1.5]))]
    return r


def _case_round_grad():
    return _with_grad(lambda x: nd.round(x) + nd.floor(x) + nd.ceil(x) + nd.sign(x) + x)


def _case_blockgrad():
    return _with_grad(lambda x: nd.BlockGrad(x) * x + nd.stop_gradient(x * 2))


def _case_embedding():
    w = nd.array(np.arange(15).reshape(5, 3).astype('float32') / 10)
    w.attach_grad()
    with ag.record():
        y = nd.Embedding(nd.array([[0, 2], [4, 2]]), w, input_dim=5, output_dim=3)
        s = (y * nd.array(np.arange(12).reshape(2,2,3).astype('float32'))).sum()
    s.backward()
    r = [y, w.grad]
    return r


def _case_seqmask():
    return _with_grad(lambda x: nd.SequenceMask(x.reshape((3, 2, 2)), sequence_length=nd.array([1, 3]), use_sequence_length=True, value=-1.0))


def _case_seqmask_ax1():
    x = _x()
    r = nd.SequenceMask(x, sequence_length=nd.array([2, 4, 1]), use_sequence_length=True, axis=1)
    return r


def _case_seqmask_off():
    x = _x()
    r = nd.SequenceMask(x.reshape((3,2,2)))
    return r


def _case_methods():
    x = _x()
    r = [x.topk(k=1, ret_typ='value'), x.pick(nd.array([1,1,1])), nd.array([1,2]).one_hot(3), x.take(nd.array([1])), x.slice_axis(axis=1, begin=0, end=2), x.broadcast_to((3,4)), x.norm(axis=0), x.tile((1,2)), x.repeat(2, axis=0), x.flip(0), x.sort(), x.argsort(), x.sign(), x.floor(), x.ceil(), x.round()] + x.split(2, axis=1)
    return r


def _case_clip():
    return _with_grad(lambda x: nd.clip(x, -1.0, 2.0))


EXPECTED = {
    'fc': [((3, 2), 'float32', [[-0.84, 2.53], [-0.84, 0.73], [1.86, -2.27]]), ((3, 4), 'float32', [[1.1, -1, 1.1, 2], [2.3, -1.8, 1.9, 4.4], [1, 0.4, -0.8, 2.8]])],
    'fc_nobias': [((3, 2), 'float32', [[-0.85, 2.55], [-0.85, 0.75], [1.85, -2.25]]), ((3, 4), 'float32', [[1.1, -1, 1.1, 2], [2.3, -1.8, 1.9, 4.4], [1, 0.4, -0.8, 2.8]])],
    'fc_noflat': [((3, 2, 3), 'float32', [[[-0.24, -0.77, 1.18], [0.21, -0.62, 1.03]], [[0.26, -1.02, 1.68], [-0.29, -1.12, 1.73]], [[0.66, 0.53, -0.72], [-0.14, 1.18, -1.92]]]), ((3, 4), 'float32', [[1, -0.8000001, -0.6, 2.2], [1.3, -0.8000001, 1.2, 0.1999999], [1.6, -0.8000001, 1, -0.8000001]])],
    'act_relu': [((3, 4), 'float32', [[0.5, 0, 2, 0], [3, 0, 1, 0], [1.5, 2.5, 0, 0.75]]), ((3, 4), 'float32', [[1, 0, 3, 0], [5, 0, 2, 0], [4, 5, 0, 2]])],
    'act_sigmoid': [((3, 4), 'float32', [[0.6224594, 0.1824255, 0.8807971, 0.5], [0.9525741, 0.4378235, 0.7310586, 0.1192029], [0.8175745, 0.9241418, 0.04742587, 0.6791787]]), ((3, 4), 'float32', [[0.2350037, 0.2982929, 0.3149807, 1], [0.2258833, 0.2461341, 0.3932239, 0.3149807], [0.5965858, 0.3505186, 0.04517666, 0.43579]])],
    'act_tanh': [((3, 4), 'float32', [[0.4621172, -0.9051483, 0.9640276, 0], [0.9950548, -0.2449187, 0.7615942, -0.9640276], [0.9051483, 0.9866143, -0.9950548, 0.6351489]]), ((3, 4), 'float32', [[0.7864477, 0.3614132, 0.2119524, 4], [0.04932991, 0.9400148, 0.8399486, 0.2119524], [0.7228265, 0.1329612, 0.009865982, 1.193172]])],
    'act_softrelu': [((3, 4), 'float32', [[0.974077, 0.2014133, 2.126928, 0.6931472], [3.048587, 0.5759394, 1.313262, 0.1269281], [1.701413, 2.57889, 0.04858732, 1.136871]]), ((3, 4), 'float32', [[0.6224594, 0.3648511, 2.642391, 2], [4.762871, 0.4378235, 1.462117, 0.3576088], [3.270298, 4.620709, 0.04742587, 1.358357]])],
    'act_softsign': [((3, 4), 'float32', [[0.3333333, -0.6, 0.6666667, 0], [0.75, -0.2, 0.5, -0.6666667], [0.6, 0.7142857, -0.75, 0.4285714]]), ((3, 4), 'float32', [[0.4444444, 0.32, 0.3333333, 4], [0.3125, 0.64, 0.5, 0.3333333], [0.64, 0.4081632, 0.0625, 0.6530612]])],
    'lrelu_leaky': [((3, 4), 'float32', [[0.5, -0.15, 2, 0], [3, -0.025, 1, -0.2], [1.5, 2.5, -0.3, 0.75]]), ((3, 4), 'float32', [[1, 0.2, 3, 0.4], [5, 0.1, 2, 0.3], [4, 5, 0.1, 2]])],
    'lrelu_elu': [((3, 4), 'float32', [[0.5, -0.5438089, 2, 0], [3, -0.1548394, 1, -0.6052653], [1.5, 2.5, -0.665149, 0.75]]), ((3, 4), 'float32', [[1, 0.3123822, 3, 2.8], [5, 0.5451605, 2, 0.2842041], [4, 5, 0.03485095, 2]])],
    'lrelu_selu': [((3, 4), 'float32', [[0.5253505, -1.365814, 2.101402, 0], [3.152103, -0.3888902, 1.050701, -1.520167], [1.576051, 2.626753, -1.670569, 0.7880257]])],
    'lrelu_gelu': [((3, 4), 'float32', [[0.3457312, -0.1002109, 1.9545, 0], [2.99595, -0.1003234, 0.8413447, -0.0455001], [1.399789, 2.484476, -0.004049867, 0.5800295]]), ((3, 4), 'float32', [[0.8674951, -0.2549383, 3.255696, 2], [5.059728, 0.3046267, 2.166631, -0.2556956], [4.509877, 5.188055, -0.01194561, 1.998452]])],
    'lrelu_prelu': [((3, 4), 'float32', [[0.5, -0.3, 2, 0], [3, -0.05, 1, -0.8], [1.5, 2.5, -0.9, 0.75]]), ((3, 4), 'float32', [[1, 0.4, 3, 1.6], [5, 0.2, 2, 1.2], [4, 5, 0.3, 2]])],
    'softmax': [((3, 4), 'float32', [[0.06289002, 0.01692377, 0.7274752, 0.3074714], [0.7661572, 0.05906976, 0.2676232, 0.04161172], [0.1709528, 0.9240065, 0.004901689, 0.6509169]]), ((3, 4), 'float32', [[-0.2249882, -0.04591335, 0.2018209, 0.4130711], [0.3237114, -0.2193231, -0.1933774, 0.01429137], [-0.09872302, 0.2652359, -0.008443519, -0.4273622]])],
    'softmax_t': [((3, 4), 'float32', [[0.2345392, 0.08628213, 0.4965194, 0.1826593], [0.6072102, 0.1195668, 0.2233801, 0.04984285], [0.2905786, 0.4790831, 0.03062676, 0.1997115]]), ((3, 4), 'float32', [[-0.1908326, -0.02706234, 0.09252668, 0.1253683], [0.3789276, -0.1645183, -0.1956706, -0.01873858], [0.001775456, 0.2424688, -0.045753, -0.1984913]])],
    'log_softmax': [((3, 4), 'float32', [[-3.066737, -7.066737, -0.06673735, -4.066737], [-0.01966983, -6.51967, -4.01967, -10.01967], [-2.153193, -0.1531926, -11.15319, -3.653193]]), ((3, 4), 'float32', [[1.068543, 3.98294, -12.70882, 7.657336], [-11.57149, 1.967569, 3.604904, 5.999021], [5.213291, -10.59115, 1.999656, 3.378201]])],
    'softmax_len': [((3, 4), 'float32', [[0.880797, 0.1192029, 0, 0], [0.8468494, 0.03283591, 0.1146086, 0.005706026], [1, 0, 0, 0]]), ((3, 4), 'float32', [[-0.1049935, 0.1049936, 0, 0], [0.4120619, -0.1153663, -0.2880593, -0.008635601], [0, 0, 0, 0]])],
    'one_hot': ((5, 4), 'float32', [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]),
    'one_hot_opts': ((2, 2, 3), 'int32', [[[-1, 5, -1], [-1, -1, 5]], [[5, -1, -1], [-1, -1, 5]]]),
    'pick': [((3,), 'float32', [0.5, -2, 2.5]), ((3, 4), 'float32', [[1, 0, 0, 0], [0, 0, 0, 2], [0, 3, 0, 0]])],
    'pick_keep_wrap': [((1, 4), 'float32', [[1.5, 2.5, -3, 0]]), ((3, 4), 'float32', [[0, 0, 0, 4], [0, 0, 0, 0], [1, 2, 3, 0]])],
    'pick_clip': [((3,), 'float32', [0, 3, 2.5]), ((3, 4), 'float32', [[0, 0, 0, 1], [2, 0, 0, 0], [0, 3, 0, 0]])],
    'take': [((2, 2, 4), 'float32', [[[1.5, 2.5, -3, 0.75], [0.5, -1.5, 2, 0]], [[3, -0.25, 1, -2], [1.5, 2.5, -3, 0.75]]]), ((3, 4), 'float32', [[5, 1, 2, 3], [4, 5, 1, 2], [4, 6, 8, 5]])],
    'take_axis_wrap': [((3, 3), 'float32', [[-1.5, 0, 0.5], [-0.25, -2, 3], [2.5, 0.75, 1.5]]), ((3, 4), 'float32', [[3, 1, 0, 2], [1, 4, 0, 5], [4, 2, 0, 3]])],
    'take_clip': [((3, 2), 'float32', [[0, 0.5], [-2, 3], [0.75, 1.5]]), ((3, 4), 'float32', [[2, 0, 0, 1], [4, 0, 0, 3], [1, 0, 0, 5]])],
    'split': [((3, 2), 'float32', [[0.5, -1.5], [3, -0.25], [1.5, 2.5]]), ((3, 2), 'float32', [[2, 0], [1, -2], [-3, 0.75]])],
    'split_sq': [((4,), 'float32', [0.5, -1.5, 2, 0]), ((4,), 'float32', [3, -0.25, 1, -2]), ((4,), 'float32', [1.5, 2.5, -3, 0.75])],
    'split_grad': [((3, 2), 'float32', [[2, 0], [1, -2], [-3, 0.75]]), ((3, 4), 'float32', [[0, 0, 1, 2], [0, 0, 3, 4], [0, 0, 5, 1]])],
    'slice_axis': [((3, 2), 'float32', [[-1.5, 2], [-0.25, 1], [2.5, -3]]), ((3, 4), 'float32', [[0, 1, 2, 0], [0, 3, 4, 0], [0, 5, 1, 0]])],
    'slice_axis_none': ((2, 4), 'float32', [[3, -0.25, 1, -2], [1.5, 2.5, -3, 0.75]]),
    'slice': [((2, 3), 'float32', [[3, -0.25, 1], [1.5, 2.5, -3]]), ((3, 4), 'float32', [[0, 0, 0, 0], [1, 2, 3, 0], [4, 5, 1, 0]])],
    'slice_step': [((2, 2), 'float32', [[0, -1.5], [0.75, 2.5]]), ((3, 4), 'float32', [[0, 2, 0, 1], [0, 0, 0, 0], [0, 4, 0, 3]])],
    'slice_negstep_none': ((3, 2), 'float32', [[0.75, 1.5], [-2, 3], [0, 0.5]]),
    'topk_idx': ((3, 2), 'float32', [[2, 0], [0, 2], [1, 0]]),
    'topk_both': [((2, 4), 'float32', [[0.5, -1.5, -3, -2], [1.5, -0.25, 1, 0]]), ((2, 4), 'int32', [[0, 0, 2, 1], [2, 1, 1, 0]])],
    'topk_mask': ((3, 4), 'float32', [[1, 0, 1, 0], [1, 0, 1, 0], [1, 1, 0, 0]]),
    'topk_none': ((3,), 'float32', [3, 2.5, 2]),
    'topk_grad': [((3, 2), 'float32', [[2, 0.5], [3, 1], [2.5, 1.5]]), ((3, 4), 'float32', [[2, 0, 1, 0], [3, 0, 4, 0], [1, 5, 0, 0]])],
    'sort': ((3, 4), 'float32', [[-1.5, 0, 0.5, 2], [-2, -0.25, 1, 3], [-3, 0.75, 1.5, 2.5]]),
    'sort_desc': ((3, 4), 'float32', [[3, 2.5, 2, 0.75], [1.5, -0.25, 1, 0], [0.5, -1.5, -3, -2]]),
    'argsort': ((3, 4), 'float32', [[1, 3, 0, 2], [3, 1, 2, 0], [2, 3, 0, 1]]),
    'argsort_desc_int': ((3, 4), 'int64', [[1, 2, 0, 2], [2, 1, 1, 0], [0, 0, 2, 1]]),
    'broadcast_to': [((3, 4), 'float32', [[3, -0.25, 1, -2], [3, -0.25, 1, -2], [3, -0.25, 1, -2]]), ((3, 4), 'float32', [[0, 0, 0, 0], [10, 8, 6, 9], [0, 0, 0, 0]])],
    'broadcast_like': ((3, 4), 'float32', [[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]]),
    'broadcast_like_axes': ((2, 4), 'float32', [[1, 2, 3, 4], [1, 2, 3, 4]]),
    'broadcast_axis': ((2, 3), 'float32', [[1, 1, 1], [2, 2, 2]]),
    'broadcast_add': [((3, 4), 'float32', [[1.5, -0.5, 3, 1], [5, 1.75, 3, 0], [4.5, 5.5, 0, 3.75]]), ((3, 4), 'float32', [[1, 2, 3, 4], [5, 1, 2, 3], [4, 5, 1, 2]])],
    'broadcast_mul': [((3, 4), 'float32', [[0.5, -3, 6, 0], [3, -0.5, 3, -8], [1.5, 5, -9, 3]]), ((3, 4), 'float32', [[1, 4, 9, 16], [5, 2, 6, 12], [4, 10, 3, 8]])],
    'broadcast_sub': ((3, 4), 'float32', [[-0.5, -2.5, 1, -1], [1, -2.25, -1, -4], [-1.5, -0.5, -6, -2.25]]),
    'broadcast_div': ((3, 4), 'float32', [[0.5, -0.75, 0.5, 0], [3, -0.125, 0.25, -0.25], [1.5, 1.25, -0.75, 0.09375]]),
    'broadcast_max': ((3, 4), 'float32', [[1, 1, 2, 1], [3, 0, 1, 0], [2, 2.5, 2, 2]]),
    'broadcast_power': ((3, 4), 'float32', [[0.25, 2.25, 4, 0], [1.732051, 0.5, 1, 1.414214], [1.5, 2.5, 3, 0.75]]),
    'broadcast_greater': ((3, 4), 'float32', [[0, 0, 1, 0], [1, 0, 1, 0], [1, 1, 0, 0]]),
    'broadcast_equal': ((3, 4), 'float32', [[1, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]]),
    'batch_dot': [((2, 2, 2), 'float32', [[[0.08333336, 0.3333333], [-0.6666665, 0.3333333]], [[9.083334, 10.83333], [12.83333, 15.33333]]]), ((2, 2, 3), 'float32', [[[-0.6666666, 0, 0.6666666], [-4, -0.6666666, 2.666667]], [[10.66667, 16.66667, 22.66667], [15.33333, 24, 32.66667]]]), ((2, 3, 2), 'float32', [[[1.5, 2.25], [2, 3.25], [2.5, 4.25]], [[19.5, 23.25], [22, 26.25], [24.5, 29.25]]]), ((2, 2, 2), 'float32', [[[0.3125, 0.875], [0.875, 3.125]], [[9.3125, 13.25], [13.25, 18.875]]]), ((2, 2, 2), 'float32', [[[1.222222, 0.8888888], [0.8888888, 0.8888888]], [[9.222222, 10.88889], [10.88889, 12.88889]]])],
    'dot': [((3, 2), 'float32', [[-0.85, 2.55], [-0.85, 0.7499999], [1.85, -2.25]]), ((3, 4), 'float32', [[1.1, -1, 1.1, 2], [2.3, -1.8, 1.9, 4.4], [1, 0.4, -0.8, 2.8]])],
    'dot_ta': ((4, 4), 'float32', [[11.5, 2.25, -0.5, -4.875], [2.25, 8.5625, -10.75, 2.375], [-0.5, -10.75, 14, -4.25], [-4.875, 2.375, -4.25, 4.5625]]),
    'dot_nd': ((3, 2, 3), 'float32', [[[-5.5, -6.5, -7.5], [2, 4, 6]], [[2, 4.75, 7.5], [-7, -8, -9]], [[11.5, 15.5, 19.5], [0, -2.25, -4.5]]]),
    'norm': [((3,), 'float32', [2.54951, 3.75, 4.25]), ((3, 4), 'float32', [[0.1961161, -0.5883484, 0.7844645, 0], [1.6, -0.1333333, 0.5333334, -1.066667], [1.058824, 1.764706, -2.117647, 0.5294118]])],
    'norm_l1': [((1, 4), 'float32', [[5, 4.25, 6, 2.75]]), ((3, 4), 'float32', [[1, -2, 3, 0], [1, -2, 3, -4], [1, 2, -3, 4]])],
    'norm_all': ((1,), 'float32', [6.214901]),
    'norm_tuple': ((3,), 'float32', [2.54951, 3.75, 4.25]),
    'argmax': [((3,), 'float32', [2, 0, 1]), ((1, 4), 'float32', [[0, 0, 2, 1]])],
    'tile': [((6, 4), 'float32', [[0.5, -1.5, 2, 0], [3, -0.25, 1, -2], [1.5, 2.5, -3, 0.75], [0.5, -1.5, 2, 0], [3, -0.25, 1, -2], [1.5, 2.5, -3, 0.75]]), ((3, 4), 'float32', [[4, 6, 8, 5], [7, 4, 6, 8], [5, 7, 4, 6]])],
    'tile_short': ((2, 4), 'float32', [[1, 2, 1, 2], [1, 2, 1, 2]]),
    'tile_long': ((1, 6), 'float32', [[1, 2, 1, 2, 1, 2]]),
    'repeat': [((3, 8), 'float32', [[0.5, 0.5, -1.5, -1.5, 2, 2, 0, 0], [3, 3, -0.25, -0.25, 1, 1, -2, -2], [1.5, 1.5, 2.5, 2.5, -3, -3, 0.75, 0.75]]), ((3, 4), 'float32', [[3, 7, 6, 5], [9, 3, 7, 6], [5, 9, 3, 7]])],
    'repeat_none': ((8,), 'float32', [1, 1, 2, 2, 3, 3, 4, 4]),
    'flip': [((3, 4), 'float32', [[0, 2, -1.5, 0.5], [-2, 1, -0.25, 3], [0.75, -3, 2.5, 1.5]]), ((3, 4), 'float32', [[4, 3, 2, 1], [3, 2, 1, 5], [2, 1, 5, 4]])],
    'reverse2': ((3, 4), 'float32', [[0.75, -3, 2.5, 1.5], [-2, 1, -0.25, 3], [0, 2, -1.5, 0.5]]),
    'round': [((6,), 'float32', [3, -3, 1, -1, 1, -2]), ((4,), 'float32', [2, -3, 0, 1]), ((2,), 'float32', [2, -2]), ((3,), 'float32', [-1, 0, 1]), ((2,), 'float32', [-2, 1]), ((2,), 'float32', [-1, 2])],
    'round_grad': [((3, 4), 'float32', [[3.5, -7.5, 9, 0], [13, -2.25, 5, -9], [7.5, 11.5, -13, 3.75]]), ((3, 4), 'float32', [[1, 2, 3, 4], [5, 1, 2, 3], [4, 5, 1, 2]])],
    'blockgrad': [((3, 4), 'float32', [[1.25, -0.75, 8, 0], [15, -0.4375, 3, 0], [5.25, 11.25, 3, 2.0625]]), ((3, 4), 'float32', [[0.5, -3, 6, 0], [15, -0.25, 2, -6], [6, 12.5, -3, 1.5]])],
    'embedding': [((2, 2, 3), 'float32', [[[0, 0.1, 0.2], [0.6, 0.7, 0.8]], [[1.2, 1.3, 1.4], [0.6, 0.7, 0.8]]]), ((5, 3), 'float32', [[0, 1, 2], [0, 0, 0], [12, 14, 16], [0, 0, 0], [6, 7, 8]])],
    'seqmask': [((3, 2, 2), 'float32', [[[0.5, -1.5], [2, 0]], [[-1, -1], [1, -2]], [[-1, -1], [-3, 0.75]]]), ((3, 4), 'float32', [[1, 2, 3, 4], [0, 0, 2, 3], [0, 0, 1, 2]])],
    'seqmask_ax1': ((3, 4), 'float32', [[0.5, -1.5, 0, 0], [3, -0.25, 1, -2], [1.5, 0, 0, 0]]),
    'seqmask_off': ((3, 2, 2), 'float32', [[[0.5, -1.5], [2, 0]], [[3, -0.25], [1, -2]], [[1.5, 2.5], [-3, 0.75]]]),
    'methods': [((3, 1), 'float32', [[2], [3], [2.5]]), ((3,), 'float32', [-1.5, -0.25, 2.5]), ((2, 3), 'float32', [[0, 1, 0], [0, 0, 1]]), ((1, 4), 'float32', [[3, -0.25, 1, -2]]), ((3, 2), 'float32', [[0.5, -1.5], [3, -0.25], [1.5, 2.5]]), ((3, 4), 'float32', [[0.5, -1.5, 2, 0], [3, -0.25, 1, -2], [1.5, 2.5, -3, 0.75]]), ((4,), 'float32', [3.391165, 2.926175, 3.741657, 2.136001]), ((3, 8), 'float32', [[0.5, -1.5, 2, 0, 0.5, -1.5, 2, 0], [3, -0.25, 1, -2, 3, -0.25, 1, -2], [1.5, 2.5, -3, 0.75, 1.5, 2.5, -3, 0.75]]), ((6, 4), 'float32', [[0.5, -1.5, 2, 0], [0.5, -1.5, 2, 0], [3, -0.25, 1, -2], [3, -0.25, 1, -2], [1.5, 2.5, -3, 0.75], [1.5, 2.5, -3, 0.75]]), ((3, 4), 'float32', [[1.5, 2.5, -3, 0.75], [3, -0.25, 1, -2], [0.5, -1.5, 2, 0]]), ((3, 4), 'float32', [[-1.5, 0, 0.5, 2], [-2, -0.25, 1, 3], [-3, 0.75, 1.5, 2.5]]), ((3, 4), 'float32', [[1, 3, 0, 2], [3, 1, 2, 0], [2, 3, 0, 1]]), ((3, 4), 'float32', [[1, -1, 1, 0], [1, -1, 1, -1], [1, 1, -1, 1]]), ((3, 4), 'float32', [[0, -2, 2, 0], [3, -1, 1, -2], [1, 2, -3, 0]]), ((3, 4), 'float32', [[1, -1, 2, 0], [3, -0, 1, -2], [2, 3, -3, 1]]), ((3, 4), 'float32', [[1, -2, 2, 0], [3, -0, 1, -2], [2, 3, -3, 1]]), ((3, 2), 'float32', [[0.5, -1.5], [3, -0.25], [1.5, 2.5]]), ((3, 2), 'float32', [[2, 0], [1, -2], [-3, 0.75]])],
    'clip': [((3, 4), 'float32', [[0.5, -1, 2, 0], [2, -0.25, 1, -1], [1.5, 2, -1, 0.75]]), ((3, 4), 'float32', [[1, 0, 3, 4], [0, 1, 2, 0], [4, 0, 0, 2]])],
}


def _flatten(value):
    if isinstance(value, (list, tuple)) and not (len(value) == 3 and isinstance(value[1], str)):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_matches_mxnet(name):
    got = _flatten(globals()[f"_case_{name}"]())
    expected = _flatten(EXPECTED[name])
    assert len(got) == len(expected)
    for array, (shape, dtype, values) in zip(got, expected):
        assert isinstance(array, nd.NDArray)
        assert array.shape == shape and str(array.dtype) == dtype
        np.testing.assert_allclose(array.asnumpy(), np.array(values, dtype=dtype).reshape(shape),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_matches_mxnet_on_the_gpu(name):
    with mixrt.gpu(0):  # every array of the case is made there
        got = _flatten(globals()[f"_case_{name}"]())
    for array, (shape, dtype, values) in zip(got, _flatten(EXPECTED[name])):
        assert array.ctx == mixrt.gpu(0) and array.shape == shape and str(array.dtype) == dtype
        np.testing.assert_allclose(array.asnumpy(), np.array(values, dtype=dtype).reshape(shape),
                                   rtol=1e-5, atol=1e-6)


# -- gradients against finite differences (float64) ---------------------------------------------

def _numeric_grad(f, x0, eps=1e-6):
    grad = np.zeros_like(x0)
    for i in np.ndindex(x0.shape):
        up, down = x0.copy(), x0.copy()
        up[i] += eps
        down[i] -= eps
        grad[i] = (f(nd.array(up, dtype="float64")).asnumpy().sum()
                   - f(nd.array(down, dtype="float64")).asnumpy().sum()) / (2 * eps)
    return grad


@pytest.mark.parametrize("f", [
    lambda x: nd.LeakyReLU(x, act_type="selu"),
    lambda x: nd.LeakyReLU(x, act_type="elu", slope=0.5),
    lambda x: nd.LeakyReLU(x, act_type="gelu"),
    lambda x: nd.Activation(x, act_type="softrelu"),
    lambda x: nd.sort(x, axis=0) * nd.array(np.arange(12.0).reshape(3, 4)),
    lambda x: nd.topk(x, k=2, ret_typ="value", is_ascend=True) * 3,
    lambda x: nd.norm(x, axis=1),
    lambda x: nd.softmax(x, axis=0, temperature=3.0) * nd.array(np.arange(12.0).reshape(3, 4)),
    lambda x: nd.repeat(x, 3, axis=0) * nd.array(np.arange(36.0).reshape(9, 4)),
], ids=["selu", "elu", "gelu", "softrelu", "sort", "topk", "norm", "softmax", "repeat"])
def test_gradients_match_finite_differences(f):
    x0 = np.array([[0.5, -1.5, 2.0, 0.3], [3.0, -0.25, 1.0, -2.0], [1.5, 2.5, -3.0, 0.75]])
    x = nd.array(x0, dtype="float64")  # nd.array's default is float32, as MXNet's
    x.attach_grad()
    with ag.record():
        y = f(x).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), _numeric_grad(f, x0), rtol=1e-5, atol=1e-6)


def test_prelu_gamma_gradient_matches_mxnet():
    x = nd.array([[0.5, -1.5, 0.0], [-2.0, 1.0, 3.0]])
    gamma = nd.array([0.1, 0.2, 0.3])
    x.attach_grad()
    gamma.attach_grad()
    with ag.record():
        y = nd.LeakyReLU(x, gamma=gamma, act_type="prelu")
        s = (y * nd.array([[1, 2, 3], [4, 5, 6]])).sum()
    s.backward()
    np.testing.assert_allclose(gamma.grad.asnumpy(), [-8.0, -3.0, 0.0])  # MXNet 1.9.1
    np.testing.assert_allclose(x.grad.asnumpy(), [[1.0, 0.4, 0.9], [0.4, 5.0, 6.0]], rtol=1e-6)


def test_softrelu_is_stable_for_large_inputs():
    out = nd.Activation(nd.array([-100.0, 100.0]), act_type="softrelu").asnumpy()
    np.testing.assert_allclose(out, [0.0, 100.0], atol=1e-6)


def test_block_grad_stops_the_gradient_only_through_itself():
    x = nd.array([1.0, 2.0])
    x.attach_grad()
    with ag.record():
        y = (nd.BlockGrad(x) * x).sum()
    y.backward()
    assert x.grad.asnumpy().tolist() == [1.0, 2.0]


def test_names_are_functions_and_methods_and_do_not_shadow_onnx_ops():
    from mixrt.nd import mxnet_ops
    assert not set(mxnet_ops.FUNCTIONS) & set(nd.OPERATORS)
    for name in mxnet_ops.FUNCTIONS:
        assert callable(getattr(nd, name)) and name in nd.__all__
    x = _x()
    for name in mxnet_ops.METHODS:
        assert callable(getattr(x, name))
    assert x.softmax(0).shape == (3, 4)  # axis first, as mixrt's method had it
    np.testing.assert_allclose(x.softmax(axis=1, temperature=2.0).asnumpy(),
                               nd.softmax(x / 2.0).asnumpy(), rtol=1e-6)
    assert x.norm().shape == (1,)  # MXNet has no 0-d results


# -- typed errors naming the argument -------------------------------------------------------------

@pytest.mark.parametrize("call, words", [
    (lambda x: nd.FullyConnected(x, nd.ones((2, 4)), nd.ones(2)), "num_hidden"),
    (lambda x: nd.FullyConnected(x, nd.ones((2, 3)), nd.ones(2), num_hidden=2), "weight"),
    (lambda x: nd.FullyConnected(x, nd.ones((2, 4)), num_hidden=2), "bias"),
    (lambda x: nd.FullyConnected(x, nd.ones((2, 4)), nd.ones(3), num_hidden=2), "bias"),
    (lambda x: nd.Activation(x, act_type="swish"), "act_type"),
    (lambda x: nd.Activation(x), "act_type"),
    (lambda x: nd.LeakyReLU(x, act_type="prelu", gamma=nd.ones(3)), "gamma"),
    (lambda x: nd.LeakyReLU(x, act_type="foo"), "act_type"),
    (lambda x: nd.softmax(x, axis=2), "axis"),
    (lambda x: nd.softmax(x, use_length=True), "length"),
    (lambda x: nd.softmax(x, dtype="int32"), "dtype"),
    (lambda x: nd.log_softmax(x, temperature=0), "temperature"),
    (lambda x: nd.one_hot(x), "depth"),
    (lambda x: nd.one_hot(x, 0), "depth"),
    (lambda x: nd.one_hot(x, 3, dtype="nope"), "dtype"),
    (lambda x: nd.pick(x, nd.array([0, 1])), "index"),
    (lambda x: nd.pick(x, nd.array([0, 1, 2]), mode="raise"), "mode"),
    (lambda x: nd.pick(x, [0, 1, 2]), "index"),
    (lambda x: nd.take(x, nd.array([3]), mode="raise"), "out of range"),
    (lambda x: nd.take(x, nd.array([0]), mode="nearest"), "mode"),
    (lambda x: nd.take(x, nd.array([0]), axis=2), "axis"),
    (lambda x: nd.split(x, 3), "num_outputs"),
    (lambda x: nd.split(x, 2, squeeze_axis=True), "squeeze_axis"),
    (lambda x: nd.split(x), "num_outputs"),
    (lambda x: nd.slice_axis(x, 1, 3, 2), "begin"),
    (lambda x: nd.slice_axis(x, 5, 0, 1), "axis"),
    (lambda x: nd.slice(x, (0, 0), (1,)), "begin"),
    (lambda x: nd.slice(x, (0,), (1,), step=(0,)), "step"),
    (lambda x: nd.slice(x, (0, 0, 0), (1, 1, 1)), "begin"),
    (lambda x: nd.flip(x, axis=3), "axis"),
    (lambda x: nd.topk(x, k=5), "k"),
    (lambda x: nd.topk(x, ret_typ="values"), "ret_typ"),
    (lambda x: nd.topk(x, k=1.5), "k"),
    (lambda x: nd.sort(x, axis=-3), "axis"),
    (lambda x: nd.argsort(x, dtype="foo"), "dtype"),
    (lambda x: nd.argmax(x, axis=2), "axis"),
    (lambda x: nd.broadcast_to(x, (3, 4, 1)), "shape"),
    (lambda x: nd.broadcast_to(x, (6, 4)), "shape"),
    (lambda x: nd.broadcast_like(x, nd.ones((3, 4)), lhs_axes=(0,)), "rhs_axes"),
    (lambda x: nd.broadcast_add(x, nd.ones((2, 4))), "broadcast"),
    (lambda x: nd.broadcast_mul(x, nd.ones(3)), "dimensions"),
    (lambda x: nd.broadcast_axis(x, axis=(0,), size=(2, 3)), "size"),
    (lambda x: nd.dot(x, x), "rhs"),
    (lambda x: nd.batch_dot(x, x), "3-D"),
    (lambda x: nd.batch_dot(x.reshape((1, 3, 4)), x.reshape((1, 3, 4))), "transpose_b"),
    (lambda x: nd.norm(x, ord=3), "ord"),
    (lambda x: nd.norm(x, axis=(0, 5)), "axis"),
    (lambda x: nd.tile(x, reps=(-1, 1)), "reps"),
    (lambda x: nd.repeat(x, repeats=1.5), "repeats"),
    (lambda x: nd.round([1.5]), "data"),
    (lambda x: nd.Embedding(nd.array([0]), x, input_dim=3, output_dim=3), "weight"),
    (lambda x: nd.Embedding(nd.array([0]), x), "input_dim"),
    (lambda x: nd.SequenceMask(x, use_sequence_length=True), "sequence_length"),
    (lambda x: nd.SequenceMask(x, nd.array([1, 2]), use_sequence_length=True), "sequence_length"),
    (lambda x: nd.SequenceMask(x, axis=2), "axis"),
    (lambda x: nd.LeakyReLU(x, act_type="rrelu"), "rrelu"),
])
def test_bad_arguments_raise_input_errors_naming_them(call, words):
    with ag.record():  # rrelu is refused in training mode only
        with pytest.raises(InputError, match=words):
            call(_x())


def test_rrelu_outside_training_uses_the_mean_slope():
    out = nd.LeakyReLU(nd.array([-1.0, 2.0]), act_type="rrelu", lower_bound=0.1,
                       upper_bound=0.3)
    np.testing.assert_allclose(out.asnumpy(), [-0.2, 2.0], rtol=1e-6)
