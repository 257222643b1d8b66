"""Dense layers too small for the product forms (ops/nn/fused_cpu.py's tiny layers) as one
compiled call: against float64, with a NaN kept by the Relu, and NumPy's calls where the
output overlaps the input."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.nn import fused
from mixrt.ops.nn.fused_cpu import tiny_layer_call

fused_mat_mul = fused.fused_mat_mul.kernels[-1].for_device("cpu")
RNG = np.random.default_rng(5)
needs_jit = pytest.mark.skipif(not jit_cpu.enabled(), reason="compiled kernels are off")


@needs_jit
@pytest.mark.parametrize("rows, k, n, activation, bias_shape", [
    (1, 64, 64, "Relu", (1, 64)), (2, 64, 32, "Relu", (32,)), (1, 32, 10, "", (1, 10)),
    (3, 17, 5, "", None)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_tiny_layer_is_one_compiled_call_and_matches_float64(rows, k, n, activation,
                                                              bias_shape, dtype):
    A, B = RNG.standard_normal((rows, k)).astype(dtype), RNG.standard_normal((k, n)).astype(dtype)
    bias = None if bias_shape is None else RNG.standard_normal(bias_shape).astype(dtype)
    A[0, 0] = np.nan  # row 0 is NaN throughout, through the Relu too
    out = np.full((rows, n), 7.0, dtype)
    assert tiny_layer_call(A, B, bias, activation, out) is not None
    got = fused_mat_mul(np, A, B, bias, activation=activation, out=out)
    exact = A.astype(np.float64) @ B + (0 if bias is None else bias.astype(np.float64))
    if activation:
        exact = np.where(np.isnan(exact), exact, np.maximum(exact, 0))
    assert got is out
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, exact, rtol=tolerance, atol=tolerance * k)
    assert np.isnan(out[0]).all()


def test_an_output_over_its_input_keeps_numpy_s_calls():
    A = RNG.standard_normal((2, 8)).astype(np.float32)
    B = RNG.standard_normal((8, 8)).astype(np.float32)
    expected = np.maximum(A @ B, 0)
    assert tiny_layer_call(A, B, None, "Relu", A) is None
    np.testing.assert_allclose(fused_mat_mul(np, A, B, activation="Relu", out=A), expected,
                               rtol=1e-6, atol=1e-6)
