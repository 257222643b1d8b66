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


@needs_jit
@pytest.mark.parametrize("rows, k, n, tiny", [
    (1, 64, 64, True), (1, 256, 128, True),  # one row: always, within TINY_WORK
    (3, 32, 10, True), (12, 16, 64, True),  # below the panel product's call
    (16, 32, 10, False), (66, 32, 10, False), (4, 128, 10, False),  # each pass adds up
    (66, 64, 64, False)])  # past TINY_WORK
def test_the_tiny_layer_is_taken_where_its_estimate_is_below_the_panels(rows, k, n, tiny,
                                                                       monkeypatch):
    """The layer's form follows the two forms' cost estimates (``tiny_layer_suits``): a
    64-32-10 MLP's last layer at 66 rows took 7.5 us tiny against 2.5 through the panels.
    Whichever it takes, the node gives the float64 answer, and its bound call the same
    bits as the kernel."""
    from mixrt.ops.nn import bound_products, fused_cpu
    taken = []
    monkeypatch.setattr(fused_cpu, "_tiny_layer",
                        lambda *args, _tiny=fused_cpu._tiny_layer: taken.append(1) or _tiny(*args))
    A, B = RNG.standard_normal((rows, k)).astype(np.float32), \
        RNG.standard_normal((k, n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    assert fused_cpu.tiny_layer_suits(A, B) is tiny
    out = np.empty((rows, n), np.float32)
    fused_mat_mul(np, A, B, bias, activation="Relu", out=out, _prepacked={})
    assert bool(taken) is tiny
    exact = np.maximum(A.astype(np.float64) @ B + bias, 0)
    np.testing.assert_allclose(out, exact, rtol=1e-5, atol=1e-5 * k)
    bound = bound_products.bind_fused_mat_mul([A, B, bias], np.empty_like(out),
                                              {"activation": "Relu"})
    np.testing.assert_array_equal(bound(A, B, bias), out)
