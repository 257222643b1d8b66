"""A convolution with taps at a new image size (ops/conv/tap_sizes.py): its kit is made from
the node's kit at another size, with no layout: the very words the full route's kit has (the
arrays made anew compared by value), the same bits, for every form the direct path lays out
(the tap tile, the weight on the left, a strided 1x1 read in strips; split by rows or by
channels), and only from a kit of the same form, pads and epilogue."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import conv_direct_cpu, direct_forms, direct_layout, pointwise_rows, tap_sizes
from mixrt.ops.conv.conv import conv as reference_conv
from mixrt.ops.conv.conv_cpu import direct, geometry

RNG = np.random.default_rng(23)
pytestmark = pytest.mark.skipif(jit_cpu.panel_kernels() is None,
                                reason="the panel tile needs AVX-512 and numba")

RELU = (1.0, 0.0, float("inf"))
# (C, M, kernel, strides, pads, dilations), then the image sizes the node meets in turn
NODES = [
    ((3, 16, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)), [(64, 48), (40, 88), (72, 56), (17, 23)]),
    ((8, 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)), [(20, 20), (36, 28), (9, 13), (44, 40)]),
    ((5, 9, (5, 3), (3, 2), (2, 0, 1, 2), (1, 1)),
     [(33, 30), (48, 41), (51, 44), (27, 35), (30, 30)]),
    ((6, 12, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)), [(20, 21), (31, 17), (26, 26)]),
    ((3, 8, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1)), [(45, 45), (61, 37), (29, 52)]),
    # strided 1x1s of fewer outputs than the weight on the left takes: read in strips
    ((40, 64, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1)), [(14, 14), (30, 30), (26, 22), (13, 11)]),
    ((17, 8, (1, 1), (2, 2), (1, 0, 0, 1), (1, 1)), [(9, 9), (21, 17), (15, 15), (25, 19)]),
]


@pytest.fixture(params=["tap tile", "weight on the left"])
def tap_form(request, monkeypatch):
    """The direct path for every convolution here, its taps through the tap tile or with
    the weight on the left wherever the output channels come in whole strips."""
    monkeypatch.setattr(pointwise_rows, "MAX_PIXELS", 0)
    monkeypatch.setattr(direct_forms, "POINTWISE_POSITIONS", 0)
    monkeypatch.setattr(direct_layout, "ROWS_SPLIT_MIN", 6)  # both splits at these sizes
    monkeypatch.setattr(direct_forms, "LEFT_TAPS_MAX_K",
                        0 if request.param == "tap tile" else 1 << 30)
    jit_cpu._scratch.__dict__.clear()
    jit_cpu._thread_kits().clear()
    return request.param


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _attributes(kernel, strides, pads, dilations) -> dict:
    return {"auto_pad": "NOTSET", "dilations": list(dilations), "group": 1,
            "kernel_shape": list(kernel), "pads": list(pads), "strides": list(strides)}


def _conv(X, W, B, attributes, prepacked, limits=RELU):
    out = direct(X, W, B, None, limits, attributes, None, prepacked)
    assert out is not None, "the direct path did not take this convolution"
    return out


def _expected(X, W, B, attributes):
    y = reference_conv(np, X.astype(np.float64), W.astype(np.float64), B.astype(np.float64),
                       **{k: v for k, v in attributes.items() if k != "group"})
    return np.maximum(y, 0)


def _layouts_made(patch) -> list:
    made, real = [], direct_layout.layout
    patch.setattr(conv_direct_cpu, "layout", lambda *a, **k: made.append(1) or real(*a, **k))
    return made


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("node, sizes", NODES)
def test_a_new_size_s_kit_is_the_full_route_s_words(node, sizes, dtype, tap_form):
    c, m, kernel, strides, pads, dilations = node
    attributes = _attributes(kernel, strides, pads, dilations)
    W, B = _rand(m, c, *kernel, dtype=dtype), _rand(m, dtype=dtype)
    prepacked: dict = {}
    kernels = jit_cpu.panel_kernels()
    started = 0
    for height, width in sizes:
        X = _rand(2, c, height, width, dtype=dtype)
        found = geometry(prepacked, X, W, **{k: attributes[k] for k in (
            "auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")})
        # a form whose kit the thread keeps (none let go since: a grown scratch buffer lets
        # go of every kit) starts from it; another takes its full route
        start = jit_cpu.kept_kit(W, tap_sizes._form_key(X, W, found, RELU)) is not None
        with pytest.MonkeyPatch.context() as patch:
            made = _layouts_made(patch)
            out = _conv(X, W, B, attributes, prepacked)
        assert bool(made) is not start
        started += start
        np.testing.assert_allclose(out, _expected(X, W, B, attributes), rtol=2e-4, atol=2e-4)
        quick = tap_sizes.kit_at(X, W, found, RELU)
        kernel_, strides_, dilations_, _, begin, end, out_dims = found
        plan = direct_layout.layout(prepacked, X, W, kernel_, strides_, dilations_, begin, end,
                                    out_dims, constant=True)
        if not plan.taps:  # a strided 1x1 with the weight on the left: no taps to lay out
            assert quick is None
            continue
        full = conv_direct_cpu._Kit(plan, np.dtype(dtype), RELU)
        parts = plan.native_parts()
        mine = dict(zip((kernels.ROWS_AT, kernels.PLACES, kernels.BOUNDS), quick.kept[:3]))
        theirs = {kernels.ROWS_AT: parts.rows_at, kernels.PLACES: parts.places,
                  kernels.BOUNDS: parts.bounds}
        # the epilogue's constants: the full route's kit may have a base of its own (a
        # scratch buffer grown since lets go of every kit), of the same values
        for slot in (kernels.NO_BIAS, kernels.LIMITS):
            mine[slot] = quick.kept[3].kit._kept[0]._arrays[slot]
            theirs[slot] = full._kept[0]._arrays[slot]
        assert np.array_equal(np.delete(quick.words, list(mine)),
                              np.delete(full.words, list(mine)))
        for slot, array in mine.items():  # made apart: the same values
            assert np.array_equal(array, theirs[slot])
        assert quick.parts == full.parts
    assert started or not plan.taps, "no size started from the node's kit"


@pytest.mark.parametrize("node, sizes", NODES)
def test_a_new_size_through_the_nodes_kit_gives_a_fresh_node_s_bits(node, sizes, tap_form):
    c, m, kernel, strides, pads, dilations = node
    attributes = _attributes(kernel, strides, pads, dilations)
    W, B = _rand(m, c, *kernel), _rand(m)
    met: dict = {}
    _conv(_rand(3, c, *sizes[0]), W, B, attributes, met)
    for height, width in sizes[1:]:
        X = _rand(3, c, height, width)
        again = _conv(X, W, B, attributes, met)
        jit_cpu._thread_kits().clear()  # no kit of the node left: its full route
        fresh = _conv(X, W, B, attributes, {})
        assert np.array_equal(again, fresh)


def test_a_kit_of_other_pads_or_another_epilogue_is_not_a_start(tap_form):
    W, B = _rand(16, 8, 3, 3), _rand(16)
    prepacked: dict = {}
    padded = _attributes((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    _conv(_rand(1, 8, 20, 20), W, B, padded, prepacked)
    X = _rand(1, 8, 24, 30)

    def geometry_of(attributes):
        return geometry(prepacked, X, W, **{k: attributes[k] for k in (
            "auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")})
    assert tap_sizes.kit_at(X, W, geometry_of(padded), RELU) is not None
    unpadded = _attributes((3, 3), (1, 1), (0, 0, 0, 0), (1, 1))
    assert tap_sizes.kit_at(X, W, geometry_of(unpadded), RELU) is None
    assert tap_sizes.kit_at(X, W, geometry_of(padded), conv_direct_cpu.NO_ACTIVATION) is None
    assert tap_sizes.kit_at(X.astype(np.float64), W, geometry_of(padded), RELU) is None
    other = _rand(16, 8, 3, 3)  # another node's weight
    assert tap_sizes.kit_at(X, other, geometry_of(padded), RELU) is None
