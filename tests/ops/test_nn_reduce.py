"""Edge cases of the nn, normalization, reduce and loss kernels that the ONNX backend suite
covers thinly: opset-version differences, empty reductions, dtypes, inference shapes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mixrt.errors import UnsupportedOperatorError
from mixrt.ops import REGISTRY
from mixrt.ops.nn.nn import einsum_shape, matmul_shape
from mixrt.ops.ir.types import TensorType

RNG = np.random.default_rng(0)


def kernel(op_type: str, opset: int):
    return REGISTRY.find("", op_type, opset).fn


def infer(op_type: str, opset: int, *types, **attrs):
    return REGISTRY.find("", op_type, opset).infer_fn(*types, **attrs)


# -- softmax family: opset < 13 coerces to 2-D, 13+ normalizes one axis ------------------------

def test_softmax_old_normalizes_all_trailing_axes_new_only_one():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    old = kernel("Softmax", 11)(np, x, axis=1)
    new = kernel("Softmax", 13)(np, x, axis=1)
    np.testing.assert_allclose(old.reshape(2, -1).sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(new.sum(axis=1), 1.0, rtol=1e-6)
    assert not np.allclose(old, new)


def test_log_softmax_defaults_differ_between_versions():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    old = kernel("LogSoftmax", 1)(np, x)  # axis=1 default, here the last axis too
    new = kernel("LogSoftmax", 13)(np, x)
    np.testing.assert_allclose(old, new, rtol=1e-6)
    assert old.dtype == np.float32


def test_hardmax_old_picks_one_winner_over_flattened_trailing_axes():
    x = np.array([[[1, 5], [5, 0]]], dtype=np.float32)  # tie: the first max wins
    old = kernel("Hardmax", 11)(np, x, axis=1)
    assert old.tolist() == [[[0, 1], [0, 0]]]
    new = kernel("Hardmax", 13)(np, x, axis=1)
    assert new.tolist() == [[[0, 1], [1, 0]]]


def test_softmax_keeps_bfloat16():
    x = np.array([[1.0, 2.0, 3.0]], dtype=ml_dtypes.bfloat16)
    y = kernel("Softmax", 13)(np, x)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(y.astype(np.float32).sum(), 1.0, rtol=1e-2)


# -- matrix products ---------------------------------------------------------------------------

@pytest.mark.parametrize("a, b, expected", [
    ((3,), (3,), ()), ((3,), (2, 3, 4), (2, 4)), ((2, 1, 3, 4), (5, 4, 2), (2, 5, 3, 2)),
    ((4, 3), (3,), (4,)), (("n", 3), (3, 7), ("n", 7)),
])
def test_matmul_shape(a, b, expected):
    assert matmul_shape(a, b) == expected


def test_matmul_bfloat16_stays_bfloat16():
    a = np.ones((2, 3), dtype=ml_dtypes.bfloat16)
    assert kernel("MatMul", 13)(np, a, a.T).dtype == ml_dtypes.bfloat16


def test_gemm_int32_with_alpha_keeps_int32():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    y = kernel("Gemm", 13)(np, a, a, None, alpha=2.0, transB=1)
    assert y.dtype == np.int32
    assert y.tolist() == (2 * a @ a.T).tolist()


def test_gemm_6_accepts_broadcast_attribute():
    a = np.ones((2, 3), np.float32)
    y = kernel("Gemm", 6)(np, a, a.T, np.float32([1, 2]), broadcast=1, beta=2.0)
    assert y.tolist() == [[5, 7], [5, 7]]


@pytest.mark.parametrize("equation, shapes, expected", [
    ("ij,jk", [(2, 3), (3, 4)], (2, 4)),  # implicit: labels seen once, sorted
    ("ba", [(2, 3)], (3, 2)),
    ("...ij,...jk", [(5, 1, 2, 3), (4, 3, 6)], (5, 4, 2, 6)),
    ("...ii->...i", [(7, 3, 3)], (7, 3)),
    ("i j , j k -> k i", [(2, 3), (3, 4)], (4, 2)),
    ("Ab,bA", [(2, 3), (3, 2)], ()),
    ("ij->", [(2, 3)], ()),
])
def test_einsum_shape(equation, shapes, expected):
    assert einsum_shape(equation, shapes) == expected


def test_einsum_bfloat16_and_spaces():
    x = np.arange(6).reshape(2, 3).astype(ml_dtypes.bfloat16)
    y = kernel("Einsum", 12)(np, x, equation="ij -> j")
    assert y.dtype == ml_dtypes.bfloat16
    assert y.astype(np.float32).tolist() == [3, 5, 7]


def test_einsum_scalar_output_is_an_array():
    x = np.arange(3, dtype=np.float32)
    y = kernel("Einsum", 12)(np, x, x, equation="i,i")
    assert isinstance(y, np.ndarray) and y.shape == () and y == 5


# -- reductions --------------------------------------------------------------------------------

def test_reduce_noop_with_empty_axes():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    empty = np.array([], dtype=np.int64)
    np.testing.assert_array_equal(kernel("ReduceSum", 13)(np, x, empty, noop_with_empty_axes=1),
                                  x)
    total = kernel("ReduceSum", 13)(np, x, empty, keepdims=0)
    np.testing.assert_allclose(total, x.sum(), rtol=1e-6)
    np.testing.assert_array_equal(kernel("ReduceMean", 18)(np, x, None, noop_with_empty_axes=1),
                                  x)


# onnxruntime's results on [[1, -2, 3], [0.5, 2, -1]] (|x| for ReduceLogSum): a reduction over
# no axis still applies its elementwise part. mixrt returned x itself for all four before
# b7e4ba9 (2026-11-21).
_OVER_NO_AXIS = {"ReduceSumSquare": [1, 4, 9, 0.25, 4, 1], "ReduceL1": [1, 2, 3, 0.5, 2, 1],
                 "ReduceL2": [1, 2, 3, 0.5, 2, 1],
                 "ReduceLogSum": np.log([1, 2, 3, 0.5, 2, 1]).tolist(),
                 "ReduceLogSumExp": [1, -2, 3, 0.5, 2, -1], "ReduceProd": [1, -2, 3, 0.5, 2, -1]}


@pytest.mark.parametrize("op_type", sorted(_OVER_NO_AXIS))
def test_a_reduction_over_no_axis_keeps_its_elementwise_part(op_type):
    x = np.array([[1, -2, 3], [0.5, 2, -1]], dtype=np.float32)
    if op_type == "ReduceLogSum":
        x = np.abs(x)
    y = kernel(op_type, 18)(np, x, np.array([], dtype=np.int64), noop_with_empty_axes=1)
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_allclose(y.ravel(), _OVER_NO_AXIS[op_type], rtol=1e-6)


def test_reduce_axes_attribute_before_18():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert kernel("ReduceMax", 13)(np, x, axes=[-1], keepdims=0).tolist() == [2, 5]
    assert kernel("ReduceSum", 11)(np, x, axes=[0]).tolist() == [[3, 5, 7]]


@pytest.mark.parametrize("op_type, dtype, expected", [
    ("ReduceSum", np.float32, 0), ("ReduceProd", np.int32, 1),
    ("ReduceMax", np.float32, -np.inf), ("ReduceMin", np.float32, np.inf),
    ("ReduceMax", np.int32, np.iinfo(np.int32).min), ("ReduceMin", np.uint8, 255),
    ("ReduceLogSumExp", np.float32, -np.inf), ("ReduceLogSum", np.float64, -np.inf),
    ("ReduceL2", np.float32, 0), ("ReduceMin", np.bool_, True),
])
def test_empty_set_gives_the_identity(op_type, dtype, expected):
    x = np.zeros((2, 0, 3), dtype=dtype)
    y = kernel(op_type, 20)(np, x, np.array([1]))
    assert y.shape == (2, 1, 3) and y.dtype == dtype
    assert (y == expected).all()


def test_reduce_sum_keeps_int32_and_float16():
    x = np.full((4, 4), 2**20, dtype=np.int32)
    assert kernel("ReduceSum", 13)(np, x, np.array([1])).dtype == np.int32
    h = np.full(4096, 1.0, dtype=np.float16)  # a float16 accumulator would stop at 2048
    y = kernel("ReduceSum", 13)(np, h, None, keepdims=0)
    assert y.dtype == np.float16 and y == 4096


def test_reduce_log_sum_exp_is_stable():
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf]], dtype=np.float32)
    y = kernel("ReduceLogSumExp", 18)(np, x, np.array([1]), keepdims=0)
    np.testing.assert_allclose(y[0], 1000 + np.log(2), rtol=1e-6)
    assert y[1] == -np.inf


def test_reduce_max_bool_from_opset_20():
    assert REGISTRY.lookup("", "ReduceMax", 20, dtype="bool")
    with pytest.raises(UnsupportedOperatorError):
        REGISTRY.lookup("", "ReduceMax", 18, dtype="bool")


def test_reduce_infer_with_unknown_axes_keeps_rank():
    data = TensorType(np.dtype(np.float32), (2, 3, 4))
    axes = TensorType(np.dtype(np.int64), (1,))
    [out] = infer("ReduceSum", 13, data, axes, keepdims=1)
    assert out.shape == (None, None, None)
    [out] = infer("ReduceSum", 13, data, TensorType(axes.dtype, (1,), np.array([-1])),
                  keepdims=0)
    assert out.shape == (2, 3)


@pytest.mark.parametrize("exclusive, reverse, expected", [
    (0, 0, [[1, 3, 6], [4, 9, 15]]), (1, 0, [[0, 1, 3], [0, 4, 9]]),
    (0, 1, [[6, 5, 3], [15, 11, 6]]), (1, 1, [[5, 3, 0], [11, 6, 0]]),
])
def test_cumsum_modes(exclusive, reverse, expected):
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    y = kernel("CumSum", 14)(np, x, np.array(-1), exclusive=exclusive, reverse=reverse)
    assert y.dtype == np.int32 and y.tolist() == expected


def test_cumprod_exclusive_through_a_zero():
    x = np.array([2.0, 0.0, 3.0], dtype=np.float32)
    y = kernel("CumProd", 26)(np, x, np.array([0], dtype=np.int32), exclusive=1)
    assert y.tolist() == [1, 2, 0]


# -- normalization -----------------------------------------------------------------------------

def test_layer_norm_statistics_use_stash_type():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float16)
    scale = np.ones(4, np.float16)
    y, mean, inv_std = kernel("LayerNormalization", 17)(np, x, scale, None, _outputs=3)
    assert y.dtype == np.float16 and mean.dtype == inv_std.dtype == np.float32
    assert mean.shape == (2, 3, 1)
    types = infer("LayerNormalization", 17, TensorType(np.dtype(np.float16), (2, 3, 4)), None,
                  axis=1)
    assert [t.shape for t in types] == [(2, 3, 4), (2, 1, 1), (2, 1, 1)]
    assert types[1].dtype == np.float32


def test_group_norm_18_per_group_equals_21_per_channel():
    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    group_scale, group_bias = np.float32([2, 3]), np.float32([0.5, -1])
    old = kernel("GroupNormalization", 18)(np, x, group_scale, group_bias, num_groups=2)
    new = kernel("GroupNormalization", 21)(np, x, np.repeat(group_scale, 2),
                                           np.repeat(group_bias, 2), num_groups=2)
    np.testing.assert_allclose(old, new, rtol=1e-6)


def test_rms_norm_output_takes_scale_dtype():
    x = RNG.standard_normal((2, 4)).astype(np.float16)
    y = kernel("RMSNormalization", 23)(np, x, np.ones(4, np.float32))
    assert y.dtype == np.float32
    np.testing.assert_allclose(np.sqrt((y.astype(np.float64) ** 2).mean(axis=-1)), 1, rtol=1e-2)


def test_batch_norm_training_updates_running_statistics():
    x = RNG.standard_normal((4, 2, 3)).astype(np.float32)
    ones, zeros = np.ones(2, np.float32), np.zeros(2, np.float32)
    y, mean, var = kernel("BatchNormalization", 15)(np, x, ones, zeros, zeros, ones,
                                                     training_mode=1, momentum=0.5, _outputs=3)
    np.testing.assert_allclose(mean, 0.5 * x.mean(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(var, 0.5 + 0.5 * x.var(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(y.mean(axis=(0, 2)), 0, atol=1e-5)
    # opset 9 trains when the training outputs are requested
    outputs = kernel("BatchNormalization", 9)(np, x, ones, zeros, zeros, ones, _outputs=5)
    assert len(outputs) == 5
    np.testing.assert_allclose(outputs[0], y, rtol=1e-5, atol=1e-6)


def test_lp_normalization_zero_row_stays_zero():
    x = np.array([[0, 0], [3, 4]], dtype=np.float32)
    y = kernel("LpNormalization", 22)(np, x, axis=1, p=2)
    assert y.tolist() == [[0, 0], [0.6000000238418579, 0.800000011920929]]
    assert kernel("LpNormalization", 1)(np, x, p=1)[1].tolist() == pytest.approx([3 / 7, 4 / 7])


def test_lrn_even_size_window_is_asymmetric():
    x = np.ones((1, 3, 1, 1), dtype=np.float32)
    y = kernel("LRN", 13)(np, x, size=2, alpha=2.0, beta=1.0, bias=0.0)
    # windows [c, c+1]: channel 2 sees only itself
    np.testing.assert_allclose(y.reshape(-1), [0.5, 0.5, 1.0])


# -- dropout -----------------------------------------------------------------------------------

def test_dropout_inference_is_identity_with_all_true_mask():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    y, mask = kernel("Dropout", 13)(np, x, np.float32(0.7), None, _outputs=2)
    assert y is x and mask.dtype == np.bool_ and mask.all()
    assert kernel("Dropout", 10)(np, x, ratio=0.3) is x
    _, typed_mask = kernel("Dropout", 7)(np, x, _outputs=2)
    assert typed_mask.dtype == np.float32


def test_dropout_training_scales_survivors_and_repeats_with_a_seed():
    x = np.ones((64, 64), dtype=np.float32)
    train = kernel("Dropout", 22)
    y, mask = train(np, x, np.float32(0.75), np.bool_(True), seed=3, _outputs=2)
    assert set(np.unique(y)) <= {0.0, 4.0}
    assert (y != 0).tolist() == mask.tolist()
    assert 0.15 < mask.mean() < 0.35
    again, _ = train(np, x, np.float32(0.75), np.bool_(True), seed=3, _outputs=2)
    assert (again == y).all()


def test_unseeded_dropout_and_random_ops_follow_mixrt_random_seed():
    import mixrt.random
    x = np.ones((64, 64), dtype=np.float32)
    train = kernel("Dropout", 22)
    normal = kernel("RandomNormal", 22)

    def draws():
        mixrt.random.seed(11)
        first = train(np, x, np.float32(0.5), np.bool_(True), _outputs=2)[1]
        second = train(np, x, np.float32(0.5), np.bool_(True), _outputs=2)[1]
        return first, second, normal(np, shape=[8])
    first, second, values = draws()
    again = draws()
    assert (first == again[0]).all() and (second == again[1]).all()
    np.testing.assert_array_equal(values, again[2])
    assert (first != second).any()  # a stream, not one mask repeated
    assert 0.4 < first.mean() < 0.6
    mixrt.random.seed(12)
    assert (train(np, x, np.float32(0.5), np.bool_(True), _outputs=2)[1] != first).any()


# -- losses ------------------------------------------------------------------------------------

def test_nll_mean_divides_by_the_weight_of_counted_positions():
    log_prob = np.log(np.float32([[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]))
    target = np.array([0, 1, -100])
    weight = np.float32([1.0, 3.0])
    loss = kernel("NegativeLogLikelihoodLoss", 22)(np, log_prob, target, weight,
                                                  ignore_index=-100)
    expected = -(np.log(0.5) * 1 + np.log(0.75) * 3) / 4
    assert loss.shape == () and loss.dtype == np.float32
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    none = kernel("NegativeLogLikelihoodLoss", 13)(np, log_prob, target, None,
                                                  ignore_index=-100, reduction="none")
    assert none[2] == 0


def test_sce_log_prob_output_and_reduction_check():
    scores = RNG.standard_normal((3, 4, 2)).astype(np.float32)
    labels = np.array([[0, 1], [2, 3], [3, 0]])
    sce = kernel("SoftmaxCrossEntropyLoss", 13)
    loss, log_prob = sce(np, scores, labels, _outputs=2, reduction="sum")
    np.testing.assert_allclose(np.exp(log_prob).sum(axis=1), 1, rtol=1e-6)
    picked = np.take_along_axis(log_prob, labels[:, None], axis=1)
    np.testing.assert_allclose(loss, -picked.sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="none, sum, mean"):
        sce(np, scores, labels, reduction="average")
