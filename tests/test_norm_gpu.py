"""Training-mode BatchNormalization and its gradient as fused GPU kernels (ops/nn/norm_gpu.py)
against the generic kernels on the CPU: every output (Y, the running and the batch
statistics; dX, dscale, dB), float16/32/64, 2-D to 5-D inputs, and a batch whose mean is
large against its spread (where a one-pass E[x^2] - E[x]^2 would cancel). On the fake CuPy the kernels'
C is evaluated by tests/fake_cupy/cupy/_kernels.py; on a GPU by CUDA."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import nvrtc, nvrtc_compile

from mixrt.ops.device import gpu_available
from mixrt.ops.nn.norm import batch_normalization
from mixrt.ops.nn.norm_grad import batch_norm_grad
from mixrt.ops.nn.norm_gpu import batch_norm_grad_gpu, batch_normalization_gpu

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
RNG = np.random.default_rng(17)
SHAPES = [(4, 3, 5, 6), (8, 5), (2, 4, 7), (2, 3, 2, 3, 4), (1, 6, 1, 1)]
TOLERANCE = {"float64": 1e-10, "float32": 2e-5, "float16": 1e-2}


def _inputs(shape, dtype, offset=0.0, spread=1.0):
    c = shape[1]
    x = (offset + spread * RNG.standard_normal(shape)).astype(dtype)
    params = [RNG.standard_normal(c).astype(dtype), RNG.standard_normal(c).astype(dtype),
              RNG.standard_normal(c).astype(dtype), RNG.uniform(0.5, 2, c).astype(dtype)]
    return x, params


def _close(actual, expected, dtype):
    import cupy  # noqa: PLC0415
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(cupy.asnumpy(actual).astype(np.float64),
                               np.asarray(expected).astype(np.float64), rtol=tolerance,
                               atol=tolerance)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_training_forward_and_gradient_match_the_generic_kernels(shape, dtype):
    import cupy  # noqa: PLC0415
    x, params = _inputs(shape, dtype)
    attributes = dict(epsilon=1e-3, momentum=0.8, training_mode=1)
    expected = batch_normalization(np, x, *params, **attributes, _outputs=5)
    on_gpu = [cupy.asarray(v) for v in [x, *params]]
    got = batch_normalization_gpu(cupy, *on_gpu, **attributes, _outputs=5)
    for actual, wanted in zip(got, expected, strict=True):
        _close(actual, wanted, dtype)
    dy = RNG.standard_normal(shape).astype(dtype)
    expected = batch_norm_grad(np, dy, x, params[0], epsilon=1e-3, training_mode=1)
    got = batch_norm_grad_gpu(cupy, cupy.asarray(dy), on_gpu[0], on_gpu[1], epsilon=1e-3,
                              training_mode=1)
    for actual, wanted in zip(got, expected, strict=True):
        assert actual.dtype == wanted.dtype and actual.shape == wanted.shape
        _close(actual, wanted, dtype)


@needs_gpu
def test_a_large_mean_keeps_its_variance():
    """Values 1000 +- 0.01 in float32: E[x^2] - E[x]^2 would lose the variance entirely
    (float32 holds ~7 digits of 10^6); the two passes keep it to float32 rounding."""
    import cupy  # noqa: PLC0415
    x, params = _inputs((16, 4, 8, 8), "float32", offset=1000.0, spread=0.01)
    got = batch_normalization_gpu(cupy, *(cupy.asarray(v) for v in [x, *params]),
                                  training_mode=1, _outputs=5)
    exact_var = x.astype(np.float64).var(axis=(0, 2, 3))
    np.testing.assert_allclose(cupy.asnumpy(got[4]), exact_var, rtol=2e-3)
    y = cupy.asnumpy(got[0]).astype(np.float64)
    normalized = (y - params[1].reshape(1, -1, 1, 1)) / params[0].reshape(1, -1, 1, 1)
    np.testing.assert_allclose(normalized.std(axis=(0, 2, 3)),
                               np.sqrt(exact_var / (exact_var + 1e-5)), rtol=1e-2)


@needs_gpu
def test_the_output_lands_in_the_view_given_and_inference_mode_is_the_generic_one():
    import cupy  # noqa: PLC0415
    x, params = _inputs((2, 3, 4, 4), "float32")
    on_gpu = [cupy.asarray(v) for v in [x, *params]]
    out = cupy.empty(x.shape, dtype=np.float32)
    assert batch_normalization_gpu(cupy, *on_gpu, training_mode=1, out=out) is out
    _close(out, batch_normalization(np, x, *params, training_mode=1), "float32")
    _close(batch_normalization_gpu(cupy, *on_gpu), batch_normalization(np, x, *params),
           "float32")
    expected = batch_norm_grad(np, x, x, *params[:1], *params[2:], _outputs=5)
    got = batch_norm_grad_gpu(cupy, on_gpu[0], on_gpu[0], on_gpu[1], *on_gpu[3:], _outputs=5)
    for actual, wanted in zip(got, expected, strict=True):
        _close(actual, wanted, "float32")


LAYER_CASES = [((6, 16), -1, True), ((2, 5, 12), -1, True), ((2, 3, 4, 5), 2, False),
               ((3, 7), -1, False)]


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("shape, axis, bias", LAYER_CASES, ids=str)
def test_layer_normalization_and_its_gradient_match_the_generic_kernels(shape, axis, bias,
                                                                        dtype):
    import cupy  # noqa: PLC0415
    from mixrt.ops.nn.norm import layer_normalization  # noqa: PLC0415
    from mixrt.ops.nn.norm_grad import layer_norm_grad  # noqa: PLC0415
    from mixrt.ops.nn.norm_gpu import layer_norm_grad_gpu, layer_normalization_gpu  # noqa
    x = (3.0 + RNG.standard_normal(shape)).astype(dtype)
    normalized = shape[axis % len(shape):]
    scale = RNG.standard_normal(normalized).astype(dtype)
    b = RNG.standard_normal(normalized).astype(dtype) if bias else None
    on_gpu = [None if v is None else cupy.asarray(v) for v in (x, scale, b)]
    expected = layer_normalization(np, x, scale, b, axis=axis, epsilon=1e-4, _outputs=3)
    got = layer_normalization_gpu(cupy, *on_gpu, axis=axis, epsilon=1e-4, _outputs=3)
    # the forward's statistics are float32 (stash_type 1) whatever X's type
    stash = "float32" if dtype == "float64" else dtype
    for actual, wanted in zip(got, expected, strict=True):
        assert actual.shape == wanted.shape and actual.dtype == wanted.dtype
        _close(actual, wanted, stash)
    dy = RNG.standard_normal(shape).astype(dtype)
    outputs = 3 if bias else 2
    expected = layer_norm_grad(np, dy, x, scale, b, axis=axis, epsilon=1e-4, _outputs=outputs)
    got = layer_norm_grad_gpu(cupy, cupy.asarray(dy), *on_gpu, axis=axis, epsilon=1e-4,
                              _outputs=outputs)
    for actual, wanted in zip(got, expected, strict=True):
        assert actual.shape == wanted.shape and actual.dtype == wanted.dtype
        _close(actual, wanted, dtype)


def _kernel_specs():
    from mixrt.ops.nn import norm_gpu  # noqa: PLC0415
    return {name: spec for name, spec in vars(norm_gpu).items()
            if name.startswith("_") and name.isupper() and isinstance(spec, tuple)
            and len(spec) == 3 and all(isinstance(part, str) for part in spec)}


def _as_cuda(spec, value_type: str) -> str:
    """A kernel body (ElementwiseKernel) or a mapped expression (ReductionKernel) as CuPy
    wraps it: each parameter a variable of its type (T and F both ``value_type``)."""
    inputs, outputs, code = spec
    declared = [p.split() for p in f"{inputs}, {outputs}".split(",")]
    names = " ".join(f"{kind} {name} = 0;" for kind, name in declared)
    body = code if ";" in code else f"{declared[-1][1]} = {code};"  # a reduction's map
    return (f"typedef {value_type} T; typedef {value_type} F;\n"
            f'extern "C" __global__ void kernel(F* sink) {{ {names}\n{body}\n'
            f"sink[0] = (F){declared[-1][1]}; }}")


@pytest.mark.skipif(nvrtc() is None, reason="NVRTC is not installed")
@pytest.mark.parametrize("value_type", ["float", "double"])
def test_the_fused_kernels_cuda_compiles(value_type):
    """Every body and mapped expression of the fused normalizations, compiled by NVRTC as
    CuPy wraps them (the fake CuPy only interprets them; a GPU run checks what they
    compute)."""
    specs = _kernel_specs()
    assert len(specs) >= 14
    for name, spec in specs.items():
        status, log = nvrtc_compile(_as_cuda(spec, value_type))
        assert status == 0, f"{name}: {log}"


@needs_gpu
def test_the_batch_norm_gradient_writes_dx_into_out():
    import cupy  # noqa: PLC0415
    rng = np.random.default_rng(4)
    x, dy = (rng.standard_normal((3, 4, 5, 5)).astype(np.float32) for _ in range(2))
    scale = rng.standard_normal(4).astype(np.float32)
    operands = [cupy.asarray(a) for a in (dy, x, scale)]
    plain = batch_norm_grad_gpu(cupy, *operands, training_mode=1)
    out = cupy.full(x.shape, 7, dtype=np.float32)
    got = batch_norm_grad_gpu(cupy, *operands, training_mode=1, out=out)
    assert got[0] is out
    for mine, reference in zip(got, plain, strict=True):
        np.testing.assert_array_equal(cupy.asnumpy(mine), cupy.asnumpy(reference))
    # inference mode takes the generic kernel, and still fills out
    mean, var = cupy.zeros(4, np.float32), cupy.ones(4, np.float32)
    got = batch_norm_grad_gpu(cupy, *operands, mean, var, out=out)
    assert got[0] is out
    np.testing.assert_allclose(cupy.asnumpy(out), batch_norm_grad(
        np, dy, x, scale, np.zeros(4, np.float32), np.ones(4, np.float32))[0], rtol=1e-5)
