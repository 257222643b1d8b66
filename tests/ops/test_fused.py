"""The mixrt-domain fused kernels against the unfused ops they replace, with and without an
``out`` buffer; FusedElementwise's program checks and its generated CUDA source."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest

from mixrt.ops import REGISTRY
from mixrt.ops.elementwise import elementwise_gpu, fused_elementwise as fe
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available

RNG = np.random.default_rng(3)


def kernel(op_type: str, domain: str = "mixrt", opset: int = 1):
    return REGISTRY.find(domain, op_type, opset)


def onnx_op(op_type: str, *args, opset: int = 17, **attributes):
    return kernel(op_type, "", opset).fn(np, *args, **attributes)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


ACTIVATIONS = [("Relu", [], {}), ("LeakyRelu", [0.1], {"alpha": 0.1}),
               ("Sigmoid", [], {}), ("Tanh", [], {}),
               ("HardSigmoid", [0.3, 0.4], {"alpha": 0.3, "beta": 0.4}),
               ("HardSwish", [], {}), ("Swish", [], {})]


def unfused_activation(name, y, attributes):
    if name == "Swish":
        return y * onnx_op("Sigmoid", y)
    return onnx_op(name, y, opset=22 if name.startswith("Hard") else 17, **attributes)


# -- FusedConv, FusedGemm, FusedMatMul ---------------------------------------------------------

@pytest.mark.parametrize("name, params, attributes", ACTIVATIONS)
def test_fused_conv_is_conv_plus_residual_plus_activation(name, params, attributes):
    x, w, b, z = rand(2, 4, 5, 5), rand(6, 2, 3, 3), rand(6), rand(2, 6, 5, 5)
    conv = dict(pads=[1, 1, 1, 1], group=2)
    want = unfused_activation(name, onnx_op("Conv", x, w, b, **conv) + z, attributes)
    fused = kernel("FusedConv").fn
    got = fused(np, x, w, b, z, activation=name, activation_params=params, **conv)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    out = np.empty_like(want)
    assert fused(np, x, w, b, z, activation=name, activation_params=params, out=out,
                 **conv) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_out_that_reuses_the_residual_buffer_reads_it_first():
    x, w, z = rand(1, 2, 4, 4), rand(2, 2, 3, 3), rand(1, 2, 4, 4)
    want = np.maximum(onnx_op("Conv", x, w, pads=[1, 1, 1, 1]) + z, 0)
    got = kernel("FusedConv").fn(np, x, w, None, z, pads=[1, 1, 1, 1], activation="Relu",
                                 out=z)
    assert got is z
    np.testing.assert_allclose(z, want, rtol=1e-6)
    a, b, r = rand(3, 4), rand(4, 4), rand(3, 4)
    want = onnx_op("MatMul", a, b) + r
    assert kernel("FusedMatMul").fn(np, a, b, None, r, out=r) is r
    np.testing.assert_allclose(r, want, rtol=1e-6)


@pytest.mark.parametrize("z_shape", [(1, 4, 1, 1), (2, 4, 5, 1)])
def test_fused_conv_with_a_broadcast_residual(z_shape):
    x, w, z = rand(2, 3, 5, 5), rand(4, 3, 3, 3), rand(*z_shape)
    want = np.maximum(onnx_op("Conv", x, w, pads=[1, 1, 1, 1]) + z, 0)
    got = kernel("FusedConv").fn(np, x, w, None, z, pads=[1, 1, 1, 1], activation="Relu")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fused_conv_1d_and_3d():
    for x, w in ((rand(2, 3, 9), rand(4, 3, 3)), (rand(1, 2, 4, 5, 6), rand(3, 2, 2, 2, 2))):
        want = np.tanh(onnx_op("Conv", x, w))
        np.testing.assert_allclose(kernel("FusedConv").fn(np, x, w, activation="Tanh"), want,
                                   rtol=1e-5, atol=1e-6)


def test_fused_conv_without_bias_or_activation_and_clip():
    x, w = rand(1, 3, 4, 4), rand(2, 3, 1, 1)
    fused = kernel("FusedConv").fn
    np.testing.assert_array_equal(fused(np, x, w), onnx_op("Conv", x, w))
    want = np.clip(onnx_op("Conv", x, w), -0.5, 0.25)
    np.testing.assert_array_equal(
        fused(np, x, w, activation="Clip", activation_params=[-0.5, 0.25]), want)


def test_unknown_activation_names_the_choices():
    with pytest.raises(ValueError, match="expected one of Relu"):
        kernel("FusedConv").fn(np, rand(1, 1, 2, 2), rand(1, 1, 1, 1), activation="Mish")


def test_fused_gemm_matches_gemm_then_relu():
    a, b, c = rand(5, 3), rand(4, 5), rand(4)
    attributes = dict(alpha=0.5, beta=2.0, transA=1, transB=1)
    want = np.maximum(onnx_op("Gemm", a, b, c, **attributes), 0)
    out = np.empty((3, 4), np.float32)
    got = kernel("FusedGemm").fn(np, a, b, c, activation="Relu", out=out, **attributes)
    assert got is out
    np.testing.assert_array_equal(got, want)


def test_fused_matmul_adds_bias_and_activates_in_place():
    a, b, bias = rand(2, 3, 4), rand(4, 5), rand(5)
    want = np.tanh(onnx_op("MatMul", a, b) + bias)
    np.testing.assert_allclose(kernel("FusedMatMul").fn(np, a, b, bias, activation="Tanh"),
                               want, rtol=1e-6)


def test_fused_kernels_infer_their_shapes():
    f32 = np.dtype(np.float32)
    conv = kernel("FusedConv").infer_fn(TensorType(f32, ("n", 3, 8, 8)), TensorType(
        f32, (4, 3, 3, 3)), None, None, strides=[2, 2], activation="Relu",
        activation_params=[])
    assert conv[0].shape == ("n", 4, 3, 3)
    gemm = kernel("FusedGemm").infer_fn(TensorType(f32, (5, 3)), TensorType(f32, (4, 5)),
                                        transA=1, transB=1)
    assert gemm[0].shape == (3, 4)
    matmul = kernel("FusedMatMul").infer_fn(TensorType(f32, ("b", 7, 4)),
                                            TensorType(f32, (4, 2)), TensorType(f32, (2,)))
    assert matmul[0].shape == ("b", 7, 2)
    elementwise = kernel("FusedElementwise").infer_fn(
        TensorType(f32, (3, 1)), TensorType(f32, (1, 4)), ops=["Add"], operands=[0, 1])
    assert elementwise[0].shape == (3, 4)


# -- FusedElementwise -------------------------------------------------------------------------

GELU = dict(ops=["Scalar", "Div", "Erf", "Scalar", "Add", "Mul", "Scalar", "Mul"],
            operands=[0, 1, 2, 3, 4, 0, 5, 6, 7],
            params=[math.sqrt(2.0), 1.0, 0.5])


def gelu_reference(x):
    erf = onnx_op("Erf", x / np.float32(math.sqrt(2.0)))
    return x * (erf + np.float32(1.0)) * np.float32(0.5)


# Below x = -2, 1 + erf cancels: one float32 ulp of erf (~6e-8) is a few 1e-6 of the sum, so
# two correct float32 programs differ there by more than rtol 1e-6 (x = -2.33: 1.4e-7 on
# 0.0233). Over 3,000 draws of 3 x N(0, 1) the largest difference was 9.5e-7.
GELU_TOLERANCE = dict(rtol=1e-6, atol=1e-6)


def test_gelu_program_matches_the_unfused_ops():
    x = rand(4, 7)
    fused = kernel("FusedElementwise").fn
    np.testing.assert_allclose(fused(np, x, **GELU), gelu_reference(x), **GELU_TOLERANCE)


def test_program_computes_into_out_without_touching_inputs():
    x = rand(3, 5)
    kept = x.copy()
    out = np.empty_like(x)
    got = kernel("FusedElementwise").fn(np, x, **GELU, out=out)
    assert got is out and np.array_equal(x, kept)
    np.testing.assert_allclose(out, gelu_reference(x), **GELU_TOLERANCE)


def test_out_aliasing_an_input_still_gives_the_right_answer():
    x = rand(3, 5)
    want = gelu_reference(x)
    apart = kernel("FusedElementwise").fn(np, x, **GELU)
    got = kernel("FusedElementwise").fn(np, x, **GELU, out=x)  # the planner reused x
    np.testing.assert_array_equal(got, apart)  # the same bits as into a buffer of its own
    np.testing.assert_allclose(got, want, **GELU_TOLERANCE)


def test_every_step_matches_its_onnx_op():
    x = rand(2, 6) * 3
    y = rand(2, 6)
    positive = np.abs(x) + np.float32(0.1)
    cases = [("Add", [x, y], []), ("Sub", [x, y], []), ("Mul", [x, y], []),
             ("Div", [x, y], []), ("Max", [x, y], []), ("Min", [x, y], []),
             ("Neg", [x], []), ("Abs", [x], []), ("Exp", [x], []), ("Log", [positive], []),
             ("Sqrt", [positive], []), ("Reciprocal", [y], []), ("Floor", [x], []),
             ("Ceil", [x], []), ("Tanh", [x], []), ("Erf", [x], []), ("Relu", [x], []),
             ("Sigmoid", [x], []), ("Pow", [x], [2.0]), ("Pow", [positive], [0.7]),
             ("Clip", [x], [-0.5, 0.5]), ("LeakyRelu", [x], [0.2]),
             ("HardSigmoid", [x], [0.3, 0.4])]
    for name, args, params in cases:
        got = kernel("FusedElementwise").fn(np, *args, ops=[name],
                                            operands=list(range(len(args))), params=params)
        np.testing.assert_allclose(got, _unfused(name, args, params), rtol=2e-6, atol=1e-7,
                                   err_msg=name)


def _unfused(name, args, params):
    if name == "Pow":
        return onnx_op("Pow", args[0], np.float32(params[0]))
    if name == "Clip":
        return onnx_op("Clip", args[0], np.float32(params[0]), np.float32(params[1]))
    if name in ("LeakyRelu", "HardSigmoid"):
        names = ["alpha", "beta"]
        return onnx_op(name, args[0], opset=22, **dict(zip(names, params)))
    return onnx_op(name, *args, opset=13)


def test_float32_erf_is_within_a_few_ulp_and_bounded():
    x = np.linspace(-6, 6, 120_001).astype(np.float32)
    want = np.array([math.erf(float(v)) for v in x])
    got = kernel("FusedElementwise").fn(np, x, ops=["Erf"], operands=[0]).astype(np.float64)
    ulps = np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32))
    assert ulps.max() <= 8 and np.abs(got).max() <= 1.0
    special = kernel("FusedElementwise").fn(np, np.float32([np.nan, np.inf, -np.inf, -0.0]),
                                            ops=["Erf"], operands=[0])
    assert np.isnan(special[0]) and special[1:3].tolist() == [1.0, -1.0]
    assert np.signbit(special[3])


def test_big_inputs_run_block_by_block_with_broadcast_operands():
    x, bias = rand(3, 200, 300), rand(300)
    fused = kernel("FusedElementwise").fn
    # relu(x + bias) * x: bias broadcasts along the rows the blocks are cut from
    got = fused(np, x, bias, ops=["Add", "Relu", "Mul"], operands=[0, 1, 2, 3, 0])
    np.testing.assert_array_equal(got, np.maximum(x + bias, 0) * x)
    out = x.copy()
    assert fused(np, out, bias, ops=["Add", "Relu", "Mul"], operands=[0, 1, 2, 3, 0],
                 out=out) is out
    np.testing.assert_array_equal(out, got)


def test_broadcasting_intermediates_get_buffers_of_their_own_shape():
    row, column = rand(1, 5), rand(4, 1)
    # exp(column) is (4, 1); adding the row widens it to (4, 5); then relu in place
    got = kernel("FusedElementwise").fn(np, row, column, ops=["Exp", "Add", "Relu"],
                                        operands=[1, 2, 0, 3])
    np.testing.assert_allclose(got, np.maximum(np.exp(column) + row, 0), rtol=1e-6)


@pytest.mark.parametrize("attributes, message", [
    (dict(ops=["Nope"], operands=[0]), "unknown op 'Nope'"),
    (dict(ops=["Add"], operands=[0, 5]), r"reads registers \[0, 5\]"),
    (dict(ops=["Neg"], operands=[0, 0]), "left over"),
    (dict(ops=["Pow"], operands=[0]), "needs 1 operands and 1 params"),
])
def test_malformed_programs_are_rejected_with_the_reason(attributes, message):
    with pytest.raises(ValueError, match=message):
        kernel("FusedElementwise").fn(np, rand(2), **attributes)


def test_cuda_source_is_one_expression_per_step():
    program = fe.program(tuple(GELU["ops"]), tuple(GELU["operands"]), tuple(GELU["params"]), 1)
    in_params, out_params, body = program.cuda_source()
    assert (in_params, out_params) == ("T in0", "T out0")
    assert body.splitlines() == [
        f"const T r1 = ((T){math.sqrt(2.0)!r});",
        "const T r2 = (in0 / r1);",
        "const T r3 = erf(r2);",
        "const T r4 = ((T)1.0);",
        "const T r5 = (r3 + r4);",
        "const T r6 = (in0 * r5);",
        "const T r7 = ((T)0.5);",
        "const T r8 = (r6 * r7);",
        "out0 = r8;",
    ]


def test_clip_with_open_bounds_drops_that_side_in_cuda():
    program = fe.program(("Clip",), (0,), (-math.inf, 6.0), 1)
    assert "mx_min(in0, ((T)6.0))" in program.cuda_source()[2]
    with pytest.raises(ValueError, match="not finite"):
        fe.program(("Pow",), (0,), (math.inf,), 1).cuda_source()


def test_one_cuda_kernel_per_distinct_program(monkeypatch):
    built = []

    class FakeKernel:
        def __init__(self, in_params, out_params, operation, name, preamble):
            built.append(name)

        def __call__(self, *arrays):
            return arrays[-1]

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ElementwiseKernel=FakeKernel))
    elementwise_gpu.cuda_kernel.cache_clear()
    fused = kernel("FusedElementwise").for_device("gpu")
    fake_xp = types.SimpleNamespace(__name__="cupy")
    x = rand(3)
    for _ in range(3):
        fused(fake_xp, x, **GELU)
        fused(fake_xp, x, ops=["Relu", "Exp"], operands=[0, 1])
    elementwise_gpu.cuda_kernel.cache_clear()
    assert len(built) == 2 and all(n.startswith("mixrt_fused_") for n in built)


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_gelu_on_the_gpu_matches_the_cpu():
    import cupy
    x = rand(64, 33)
    fused = kernel("FusedElementwise").fn
    got = fused(cupy, cupy.asarray(x), **GELU)
    np.testing.assert_allclose(cupy.asnumpy(got), fused(np, x, **GELU), rtol=1e-5, atol=1e-6)
    out = cupy.empty(x.shape, cupy.float32)
    assert fused(cupy, cupy.asarray(x), **GELU, out=out) is out
    relu = kernel("FusedConv").fn(cupy, cupy.asarray(rand(1, 2, 4, 4)),
                                  cupy.asarray(rand(3, 2, 3, 3)), activation="LeakyRelu",
                                  activation_params=[0.1])
    assert relu.shape == (1, 3, 2, 2)
