"""mixrt::FusedRotary (ops/attention/fused_rotary.py): the compiled CPU pass gives the
composition's bits, in place too, and hands what it does not take to the composition."""

from __future__ import annotations

import numpy as np
import pytest

from mixrt.ops.attention.fused_rotary import fused_rotary
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.ir.types import TensorType

fused_rotary_cpu = fused_rotary.kernels[0].for_device("cpu")
RNG = np.random.default_rng(17)
needs_jit = pytest.mark.skipif(not jit_cpu.enabled(), reason="the compiled pass needs numba")


def composition(x, cos, sin):
    """What the exported graph computes, one ONNX op at a time."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([np.negative(x[..., half:]), x[..., :half]], axis=-1)
    return np.add(np.multiply(x, cos), np.multiply(rotated, sin))


TABLES = [  # x's shape, cos's and sin's
    ((1, 4, 1, 64), (1, 1, 1, 64)),  # a decoder step's queries
    ((2, 3, 5, 8), (2, 1, 5, 8)),  # a batch, the tables per position
    ((3, 5, 8), (5, 8)),  # rank 3
    ((6, 16), (16,)),  # rank 2, one table row for all
    ((2, 2, 4, 6), (1, 1, 1, 1)),  # a table of one value
]


@needs_jit
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", TABLES, ids=str)
def test_the_compiled_pass_gives_the_compositions_bits(shapes, dtype):
    x_shape, table_shape = shapes
    x = RNG.standard_normal(x_shape).astype(dtype)
    cos, sin = (RNG.standard_normal(table_shape).astype(dtype) for _ in range(2))
    x[..., 0] = np.nan if x.size > 8 else x[..., 0]  # NaN travels as in the composition
    out = np.empty_like(x)
    assert fused_rotary_cpu(np, x, cos, sin, out=out) is out
    np.testing.assert_array_equal(out, composition(x, cos, sin))
    np.testing.assert_array_equal(fused_rotary.fn(np, x, cos, sin), composition(x, cos, sin))


@needs_jit
def test_in_place_over_x_reads_each_pair_before_writing_it():
    x = RNG.standard_normal((1, 4, 3, 16)).astype(np.float32)
    cos, sin = (RNG.standard_normal((1, 1, 3, 16)).astype(np.float32) for _ in range(2))
    expected = composition(x, cos, sin)
    assert fused_rotary_cpu(np, x, cos, sin, out=x) is x
    np.testing.assert_array_equal(x, expected)


def test_what_the_pass_does_not_take_runs_the_composition(monkeypatch):
    from mixrt.ops.attention import fused_rotary as module
    monkeypatch.setattr(module.jit_cpu, "load", lambda name: pytest.fail("compiled"))
    x = RNG.standard_normal((2, 4, 8)).astype(np.float32)
    wide = RNG.standard_normal((3, 2, 4, 8)).astype(np.float32)  # widens x: broadcasting
    np.testing.assert_array_equal(fused_rotary_cpu(np, x, wide, wide),
                                  composition(x, wide, wide))
    strided = np.empty((2, 4, 16), np.float32)[..., ::2]
    result = fused_rotary_cpu(np, x, wide[0, 0], wide[0, 0], out=strided)
    np.testing.assert_array_equal(result, composition(x, wide[0, 0], wide[0, 0]))


def test_inference_broadcasts_the_three():
    infer = fused_rotary.kernels[0].infer_fn
    f32 = np.dtype(np.float32)
    x, table = TensorType(f32, ("b", 4, "s", 64)), TensorType(f32, ("b", 1, "s", 64))
    assert infer(x, table, table)[0].shape == ("b", 4, "s", 64)
    assert infer(x, TensorType(f32, None), table)[0].shape is None


def test_an_odd_last_axis_has_no_halves_to_rotate():
    x = np.ones((2, 7), np.float32)
    with pytest.raises(ValueError, match="not of even length"):
        fused_rotary_cpu(np, x, x, x, out=np.empty_like(x))
