"""Resize through per-axis dense matrices on the CPU (ops/image/resize_cpu.py): the generic
kernel's values for linear and cubic modes over short axes, into the planned output, and the
generic way for what the matrices cannot take (nearest, a long axis, an image with inf)."""

import numpy as np
import pytest

from mixrt.ops.image import image, resize_cpu

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("mode, transform", [("linear", "half_pixel"), ("linear", "align_corners"),
                                             ("cubic", "pytorch_half_pixel"),
                                             ("linear", "asymmetric")])
@pytest.mark.parametrize("shape, sizes", [((1, 21, 14, 14), (1, 21, 224, 224)),
                                          ((1, 8, 1, 1), (1, 8, 14, 14)),
                                          ((2, 3, 9, 5), (2, 3, 4, 12))])
def test_dense_matrices_match_the_generic_kernel(mode, transform, shape, sizes):
    X = RNG.standard_normal(shape).astype(np.float32)
    sizes = np.array(sizes, np.int64)
    options = dict(mode=mode, coordinate_transformation_mode=transform)
    want = image.resize(np, X, None, None, sizes, **options)
    out, state = np.empty(want.shape, np.float32), {}
    for _ in range(2):  # the second call reuses the node's matrices
        assert resize_cpu.resize_cpu(np, X, None, None, sizes, out=out, _node=state,
                                     **options) is out
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert any(key[0] == "dense resize" for key in state)


def test_what_the_matrices_cannot_take_goes_the_generic_way(monkeypatch):
    calls = []
    real = image.resize
    monkeypatch.setattr(resize_cpu, "resize", lambda *a, **k: calls.append(1) or real(*a, **k))
    sizes = np.array([1, 2, 8, 8], np.int64)
    X = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    X[0, 0, 1, 1] = np.inf  # a product would spread it into outputs that weigh it by zero
    got = resize_cpu.resize_cpu(np, X, None, None, sizes, mode="linear", _node={})
    np.testing.assert_array_equal(np.isinf(got), np.isinf(real(np, X, None, None, sizes,
                                                               mode="linear")))
    resize_cpu.resize_cpu(np, X, None, None, sizes, mode="nearest", _node={})
    long = RNG.standard_normal((1, 1, 4, resize_cpu.DENSE_INPUTS + 1)).astype(np.float32)
    resize_cpu.resize_cpu(np, long, None, np.array([1, 1, 2, 2], np.float32), None,
                          mode="linear", _node={})
    assert len(calls) == 3
