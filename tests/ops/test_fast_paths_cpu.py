"""The CPU fast paths registered with ``@fn.fast("cpu")`` beside the generic kernels of the fused
and recurrent ops: each gives its generic function's result (the device-neutral reference a GPU
runs too), and a CPU session binds the fast one."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from mixrt.ops.attention.fused_attention import fused_attention
from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.conv import conv_pool_cpu, fused_conv_pool
from mixrt.ops.ir.registry import CONSTANT_INPUTS
from mixrt.ops.nn import fused, fused_cpu
from mixrt.ops.quant import contrib_quant_matmul as qmm
from mixrt.ops.rnn import rnn
from mixrt.ops.shape import shape_cpu
from mixrt.ops.shape.index import gather
from mixrt.ops.quant.quantize import matmul_integer
from mixrt.runtime.session import Session
from helpers import mlp_graph

RNG = np.random.default_rng(23)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _both(handle, *args, out_shape=None, dtype=np.float32, **attributes):
    """(generic, CPU fast path) on the same arguments; with ``out_shape`` each writes into an
    ``out`` of that shape, filled with NaN first."""
    results = []
    for fn in (handle.kernels[-1].fn, handle.kernels[-1].for_device("cpu")):
        if out_shape is None:
            results.append(fn(np, *args, **attributes))
        else:
            out = np.full(out_shape, np.nan, dtype)
            assert fn(np, *args, out=out, **attributes) is out
            results.append(out)
    return results


def _bound_functions(session) -> dict:
    return {node.node.op_type: node.fn for node in session._bound.nodes}


# -- FusedConv, FusedGemm, FusedMatMul (ops/nn/fused_cpu.py) -------------------------------------

ACTIVATIONS = [("", None), ("Relu", None), ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.5]),
               ("Sigmoid", None), ("HardSigmoid", [0.2, 0.5]), ("HardSwish", None),
               ("Swish", None)]


def test_the_fused_products_register_cpu_fast_paths():
    for handle in (fused.fused_conv, fused.fused_gemm, fused.fused_mat_mul):
        chosen = handle.kernels[-1].for_device("cpu")
        assert chosen is not handle.kernels[-1].fn
        assert chosen.__name__ == handle.__name__ + "_cpu"
        # on a GPU the generic kernel, but FusedConv's, whose convolution goes to cuDNN
        gpu = handle.kernels[-1].for_device("gpu")
        assert gpu is handle.kernels[-1].fn or gpu.__name__ == handle.__name__ + "_gpu"
        assert handle is not fused.fused_conv or gpu.__name__ == "fused_conv_gpu"


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=lambda a: a[0] or "none")
@pytest.mark.parametrize("x_shape, w_shape, attributes", [
    ((1, 8, 9, 9), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 3, 12, 10), (5, 3, 5, 5), dict(strides=[2, 2], pads=[2, 1, 2, 1])),
    ((1, 16, 7, 7), (32, 16, 1, 1), {}),
    ((1, 8, 8, 8), (8, 2, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
])
@pytest.mark.parametrize("with_out", [False, True])
def test_fused_conv_cpu_agrees_with_the_generic_kernel(x_shape, w_shape, attributes,
                                                       activation, with_out):
    X, W, B = _rand(*x_shape), _rand(*w_shape), _rand(w_shape[0])
    generic = fused.fused_conv.kernels[-1].fn(np, X, W, B, **attributes)
    Z = _rand(*generic.shape)
    kwargs = dict(attributes, activation=activation[0], activation_params=activation[1])
    expected, got = _both(fused.fused_conv, X, W, B, Z, _prepacked={},
                          out_shape=generic.shape if with_out else None, **kwargs)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation", ["HardSwish", "Sigmoid"])
def test_fused_conv_replays_its_activation_pass(activation):
    """An activation the direct convolution's tile does not apply runs as a pass after
    it; the node's replayed call (the same arrays again) makes that pass too, on the new
    values."""
    X, W, B = np.empty((1, 8, 28, 28), np.float32), _rand(16, 8, 3, 3), _rand(16)
    out, prepacked = np.empty((1, 16, 28, 28), np.float32), {}
    for call in range(3):
        X[...] = _rand(*X.shape)  # new values in the same arrays: calls 2 and 3 replay
        expected = fused.fused_conv.kernels[-1].fn(np, X, W, B, pads=[1] * 4,
                                                  activation=activation)
        got = fused_cpu.fused_conv_cpu(np, X, W, B, pads=[1] * 4, activation=activation,
                                       out=out, _prepacked=prepacked)
        assert got is out
        # the direct form replays (the panel tile: AVX-512); without it the banded route
        # computes each call afresh, and the values are checked either way
        assert (replay.KEY in prepacked) == (jit_cpu.panel_kernels() is not None)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_fused_conv_with_a_broadcast_residual_agrees():
    X, W = _rand(1, 4, 6, 6), _rand(6, 4, 3, 3)
    Z = _rand(6, 1, 1)
    expected, got = _both(fused.fused_conv, X, W, None, Z, pads=[1] * 4, activation="Relu")
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation", ACTIVATIONS[:4], ids=lambda a: a[0] or "none")
@pytest.mark.parametrize("rows, inner, cols, transA, transB, alpha, beta", [
    (1, 64, 32, 0, 0, 1.0, 1.0), (8, 784, 300, 0, 1, 1.0, 1.0),
    (64, 256, 300, 0, 1, 1.0, 1.0), (5, 17, 9, 1, 0, 0.5, 2.0), (100, 48, 40, 1, 1, 1.0, 0.0)])
@pytest.mark.parametrize("with_out", [False, True])
def test_fused_gemm_cpu_agrees_with_the_generic_kernel(rows, inner, cols, transA, transB,
                                                       alpha, beta, activation, with_out):
    A = _rand(inner, rows) if transA else _rand(rows, inner)
    B = _rand(cols, inner) if transB else _rand(inner, cols)
    C = _rand(cols)
    expected, got = _both(fused.fused_gemm, A, B, C, alpha=alpha, beta=beta, transA=transA,
                          transB=transB, activation=activation[0],
                          activation_params=activation[1], _prepacked={},
                          out_shape=(rows, cols) if with_out else None)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("activation", ACTIVATIONS[:4], ids=lambda a: a[0] or "none")
@pytest.mark.parametrize("a_shape, b_shape", [
    ((4, 64), (64, 32)), ((8, 784), (784, 2048)), ((2, 16, 256), (256, 300)),
    ((64, 256), (256, 300))])
@pytest.mark.parametrize("with_out", [False, True])
def test_fused_mat_mul_cpu_agrees_with_the_generic_kernel(a_shape, b_shape, activation,
                                                          with_out):
    A, B = _rand(*a_shape), _rand(*b_shape)
    out_shape = a_shape[:-1] + b_shape[-1:]
    bias, Z = _rand(b_shape[-1]), _rand(*out_shape)
    expected, got = _both(fused.fused_mat_mul, A, B, bias, Z, activation=activation[0],
                          activation_params=activation[1], _prepacked={},
                          out_shape=out_shape if with_out else None)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("activation", ["", "Relu"])
@pytest.mark.parametrize("biased", [False, True])
def test_a_tiny_dense_layer_agrees_with_the_generic_kernel_even_into_its_input(activation,
                                                                              biased):
    """Under fused_cpu.TINY_WORK the layer is three NumPy calls; ``out`` may be A's buffer
    and a NaN stays NaN through the Relu."""
    A, B = _rand(3, 16), _rand(16, 16)
    A[1, 2] = np.nan
    bias = _rand(16) if biased else None
    assert A.size * B.shape[1] < fused_cpu.TINY_WORK
    expected = fused.fused_mat_mul.kernels[-1].fn(np, A, B, bias, activation=activation)
    cpu = fused.fused_mat_mul.kernels[-1].for_device("cpu")
    got = cpu(np, A, B, bias, activation=activation, out=np.empty((3, 16), np.float32))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.isnan(got[1]).all()
    assert cpu(np, A, B, bias, activation=activation, out=A) is A
    np.testing.assert_allclose(A, expected, rtol=1e-5, atol=1e-6)


def test_the_fused_products_write_into_an_inputs_buffer_as_the_generic_kernel_does():
    """An in-place plan may hand an input's buffer as ``out``."""
    A, B, bias = _rand(8, 32), _rand(32, 32), _rand(32)
    for fn in (fused.fused_mat_mul.kernels[-1].fn,
               fused.fused_mat_mul.kernels[-1].for_device("cpu")):
        Z = _rand(8, 32)
        expected = np.maximum(A @ B + bias + Z, 0)
        assert fn(np, A, B, bias, Z, activation="Relu", out=Z) is Z
        np.testing.assert_allclose(Z, expected, rtol=1e-4, atol=1e-4)
    X, W = _rand(1, 4, 5, 5), _rand(4, 4, 3, 3)
    for fn in (fused.fused_conv.kernels[-1].fn, fused.fused_conv.kernels[-1].for_device("cpu")):
        Z = _rand(1, 4, 5, 5)
        expected = fused.fused_conv.kernels[-1].fn(np, X, W, None, Z.copy(), pads=[1] * 4)
        assert fn(np, X, W, None, Z, pads=[1] * 4, out=Z) is Z
        np.testing.assert_allclose(Z, expected, rtol=1e-4, atol=1e-4)


def _conv_relu_model() -> bytes:
    W = helper.make_tensor("w", TensorProto.FLOAT, (8, 3, 3, 3),
                           _rand(8, 3, 3, 3).ravel().tolist())
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[W])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


def test_a_cpu_session_binds_the_fused_products_cpu_fast_paths():
    model = _conv_relu_model()
    session = Session(model, opt_level=2)
    assert _bound_functions(session)["FusedConv"] is fused.fused_conv.kernels[-1].fast["cpu"]
    x = _rand(1, 3, 8, 8)
    (got,) = session.run(None, {"x": x})
    (expected,) = Session(model, opt_level=0).run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    functions = _bound_functions(Session(mlp_graph(), opt_level=2))
    assert functions["FusedGemm"] is fused.fused_gemm.kernels[-1].fast["cpu"]


# -- FusedAttention (ops/attention/attention_cpu.py) --------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch, queries, keys, heads, size, value_size, masked", [
    (1, 16, 16, 4, 8, 8, False), (2, 13, 37, 3, 20, 40, True), (1, 1, 1, 1, 1, 1, False),
    (1, 9, 70, 2, 33, 17, True)])
def test_fused_attention_cpu_agrees_with_the_generic_kernel(batch, queries, keys, heads, size,
                                                            value_size, masked, dtype):
    assert fused_attention.kernels[0].for_device("cpu").__name__ == "fused_attention_cpu"
    Q = _rand(batch, queries, heads, size, dtype=dtype)
    K = _rand(batch, keys, heads, size, dtype=dtype)
    V = _rand(batch, keys, heads, value_size, dtype=dtype)
    mask = _rand(batch, 1, 1, keys, dtype=dtype) if masked else None
    expected, got = _both(fused_attention, Q, K, V, mask, scale=0.3, dtype=dtype,
                          out_shape=(batch, queries, heads, value_size))
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)
    expected, got = _both(fused_attention, Q, K, V, mask, scale=0.3)  # no out: the composition
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)


# -- MatMulInteger, MatMulIntegerToFloat, DynamicQuantizeMatMul (ops/quant/quantize_cpu.py) ------

def _codes(dtype, shape):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


def _constants(*indices) -> dict:
    """A session node's dict where inputs ``indices`` are constants of the session (the CPU
    keeps B's layouts there and takes the VNNI product)."""
    return {CONSTANT_INPUTS: frozenset(indices)}


@pytest.mark.parametrize("a_dtype, b_dtype", [(np.uint8, np.int8), (np.int8, np.int8),
                                              (np.uint8, np.uint8)])
@pytest.mark.parametrize("a_shape, b_shape", [((5, 96), (96, 48)), ((2, 3, 40), (40, 16)),
                                              ((1, 300), (300, 64))])
@pytest.mark.parametrize("zero_points", ["none", "scalar", "per_row", "constant"])
def test_matmul_integer_cpu_agrees_with_the_generic_kernel(a_dtype, b_dtype, a_shape, b_shape,
                                                           zero_points):
    A, B = _codes(a_dtype, a_shape), _codes(b_dtype, b_shape)
    a_zero = b_zero = None
    prepacked = None
    if zero_points == "scalar":
        a_zero, b_zero = _codes(a_dtype, ()), _codes(b_dtype, ())
    elif zero_points == "per_row" and len(a_shape) == 2:
        a_zero, b_zero = _codes(a_dtype, a_shape[:1]), _codes(b_dtype, b_shape[-1:])
    elif zero_points == "constant":
        a_zero, prepacked = np.array(7, a_dtype), _constants(1)
    expected, got = _both(matmul_integer, A, B, a_zero, b_zero, _prepacked=prepacked)
    assert got.dtype == expected.dtype == np.int32
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize("a_shape, b_shape", [((5, 96), (96, 48)), ((2, 3, 40), (40, 16))])
def test_the_integer_products_to_float_agree_with_the_generic_kernels(per_column, constant,
                                                                       a_shape, b_shape):
    A, B = _codes(np.uint8, a_shape), _codes(np.int8, b_shape)
    columns = b_shape[-1]
    b_scale = (RNG.random(columns) * 0.02 if per_column else np.array(0.01)).astype(np.float32)
    b_zero = _codes(np.int8, (columns,) if per_column else ())
    bias = _rand(columns)
    a_scale, a_zero = np.array(0.02, np.float32), np.array(3, np.uint8)
    expected, got = _both(qmm.matmul_integer_to_float, A, B, a_scale, b_scale, a_zero, b_zero,
                          bias, _prepacked=_constants(1, 5) if constant else None)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    X = _rand(*a_shape)
    expected, got = _both(qmm.dynamic_quantize_matmul, X, B, b_scale, b_zero, bias,
                          _prepacked=_constants(1, 3) if constant else None)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    for handle in (matmul_integer, qmm.matmul_integer_to_float, qmm.dynamic_quantize_matmul):
        assert handle.kernels[-1].for_device("cpu").__name__ == handle.__name__ + "_cpu"


def test_qattentions_projection_takes_the_cpus_product_on_numpy():
    assert qmm.PRODUCT_TO_FLOAT["cpu"].__name__ == "integer_product_to_float_cpu"
    A, B = _codes(np.uint8, (2, 3, 40)), _codes(np.int8, (40, 24))
    args = ("QAttention", A, B, np.array(0.02, np.float32), np.array(0.01, np.float32),
            np.array(3, np.uint8), None, _rand(24))
    np.testing.assert_allclose(qmm.device_product_to_float(np, *args),
                               qmm.integer_product_to_float(np, *args), rtol=1e-6, atol=1e-6)


# -- RNN, GRU, LSTM (ops/rnn/recurrent_cpu.py) ---------------------------------------------------

RECURRENT = {"RNN": (rnn.rnn_7, rnn.rnn_14, 1, 1), "GRU": (rnn.gru_7, rnn.gru_14, 3, 1),
             "LSTM": (rnn.lstm_7, rnn.lstm_14, 4, 2)}


def _recurrent_inputs(op_type, directions, seq, batch, size, hidden, dtype, lengths):
    gates = RECURRENT[op_type][2]
    inputs = [_rand(seq, batch, size, dtype=dtype) * 0.5,
              _rand(directions, gates * hidden, size, dtype=dtype) * 0.3,
              _rand(directions, gates * hidden, hidden, dtype=dtype) * 0.3,
              _rand(directions, 2 * gates * hidden, dtype=dtype) * 0.1,
              None if not lengths else RNG.integers(1, seq + 1, batch).astype(np.int32)]
    inputs += [_rand(directions, batch, hidden, dtype=dtype) * 0.5
               for _ in range(RECURRENT[op_type][3])]
    return inputs


@pytest.mark.parametrize("op_type", list(RECURRENT))
def test_the_recurrent_ops_register_cpu_fast_paths(op_type):
    for handle in RECURRENT[op_type][:2]:
        for kernel in handle.kernels:
            assert kernel.for_device("cpu") is not kernel.fn
            assert kernel.for_device("gpu") is kernel.fn
            assert kernel.wants_prepacked("cpu")


@pytest.mark.parametrize("op_type", list(RECURRENT))
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("batch, lengths", [(1, False), (3, True), (11, False)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("attributes", [{}, {"clip": 0.8}, {"linear_before_reset": 1},
                                        {"activations": "relu"}],
                         ids=["plain", "clip", "reset_after", "relu"])
def test_the_recurrent_cpu_kernels_agree_with_the_generic_ones(op_type, direction, batch, lengths,
                                                              dtype, attributes):
    if "linear_before_reset" in attributes and op_type != "GRU":
        pytest.skip("a GRU attribute")
    if "activations" in attributes:
        if op_type != "RNN":
            pytest.skip("the RNN's other activation")
        attributes = {"activations": ["Relu"] * (2 if direction == "bidirectional" else 1)}
    directions = 2 if direction == "bidirectional" else 1
    inputs = _recurrent_inputs(op_type, directions, 6, batch, 5, 8, dtype, lengths)
    handle = RECURRENT[op_type][1]
    expected, got = _both(handle, *inputs, direction=direction, hidden_size=8, **attributes)
    tolerance = 2e-5 if dtype == np.float32 else 1e-12
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=tolerance, atol=tolerance)


def test_the_opset_7_recurrent_cpu_kernels_agree_with_the_generic_ones():
    for op_type in RECURRENT:
        inputs = _recurrent_inputs(op_type, 1, 4, 2, 3, 6, np.float32, False)
        expected, got = _both(RECURRENT[op_type][0], *inputs, hidden_size=6)
        for want, have in zip(expected, got):
            np.testing.assert_allclose(have, want, rtol=2e-5, atol=2e-5)


# -- FusedConvPool (ops/conv/conv_pool_cpu.py) ---------------------------------------------------

CONV_POOLS = {  # x shape, w shape, conv attributes, activation, lrn, pool, pool attributes
    "resnet_stem": ((1, 3, 32, 32), (8, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]),
                    "Relu", 0, "MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                               pads=[1, 1, 1, 1])),
    "zfnet_lrn": ((2, 3, 23, 23), (6, 3, 5, 5), dict(strides=[2, 2], pads=[1, 1, 1, 1]),
                  "Relu", 5, "MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                             ceil_mode=1)),
    "average": ((1, 4, 16, 16), (8, 4, 3, 3), dict(pads=[1, 1, 1, 1]), "", 0, "AveragePool",
                dict(kernel_shape=[2, 2], strides=[2, 2], count_include_pad=1)),
    "grouped": ((1, 8, 12, 12), (8, 2, 3, 3), dict(group=4, pads=[1, 1, 1, 1]), "Relu", 0,
                "MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
}


@pytest.mark.parametrize("name", list(CONV_POOLS))
@pytest.mark.parametrize("prepacked", [True, False], ids=["constant", "fed"])
@pytest.mark.parametrize("whole_image", [True, False], ids=["whole", "bands"])
def test_fused_conv_pool_cpu_agrees_with_the_generic_kernel(monkeypatch, name, prepacked,
                                                            whole_image):
    assert fused_conv_pool.fused_conv_pool.kernels[-1].for_device("cpu") is \
        conv_pool_cpu.fused_conv_pool_cpu
    if not whole_image:
        monkeypatch.setattr(conv_pool_cpu, "WHOLE_IMAGE_BYTES", 0)
    x_shape, w_shape, conv, activation, lrn, pool, pool_attributes = CONV_POOLS[name]
    X, W, B = _rand(*x_shape), _rand(*w_shape) * 0.3, _rand(w_shape[0])
    attributes = dict(conv, kernel_shape=list(w_shape[2:]), activation=activation,
                      lrn_size=lrn, pool=pool,
                      **{f"pool_{k}": v for k, v in pool_attributes.items()})
    results = []
    for fn in (fused_conv_pool.fused_conv_pool.kernels[-1].fn,
               conv_pool_cpu.fused_conv_pool_cpu):
        results.append(fn(np, X, W, B, _prepacked={} if prepacked else None, **attributes))
    np.testing.assert_allclose(results[1], results[0], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_of_a_few_indices_writes_into_out(axis):
    data = _rand(5, 6, 7)
    indices = np.array([[0, -1], [2, -3]], np.int64)
    want = gather(np, data, indices, axis=axis)
    out = np.empty_like(want)
    assert shape_cpu.gather_cpu(np, data, indices, axis=axis, out=out) is out
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(shape_cpu.gather_cpu(np, data, indices.astype(np.int32),
                                                       axis=axis), want)
    one = list(data.shape)
    one[axis] = 1
    with pytest.raises(IndexError):  # past the end, into out too
        shape_cpu.gather_cpu(np, data, np.array([data.shape[axis]]), axis=axis,
                             out=np.empty(one, np.float32))


@pytest.mark.parametrize("with_bias, with_residual", [(True, True), (True, False),
                                                      (False, False)])
def test_a_one_row_dense_layer_goes_straight_to_the_blas(with_bias, with_residual):
    """A decoder step's one-row layer: the product, then the bias and residual adds."""
    A, B = _rand(1, 1, 256), _rand(256, 768)
    bias = _rand(768) if with_bias else None
    Z = _rand(1, 1, 768) if with_residual else None
    want = A @ B + (0 if bias is None else bias) + (0 if Z is None else Z)
    out = np.empty((1, 1, 768), np.float32)
    assert fused_cpu.fused_mat_mul_cpu(np, A, B, bias, Z, out=out, _prepacked={}) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
