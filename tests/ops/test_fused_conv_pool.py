"""mixrt::FusedConvPool (ops/conv/fused_conv_pool.py) and the pass that makes it
(runtime/passes/bands.py): the banded kernel against the unfused chain and onnxruntime, on
bands small enough that every band boundary case occurs; the pass's rules; the arena it saves;
the export that writes it back as standard ops."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt  # noqa: F401  (registers the ONNX loader)
from mixrt.exporters.onnx import export_model
from mixrt.ops.conv import conv_pool_cpu, fused_conv_pool as banded
from mixrt.ops.nn import fused
from mixrt.ops.pool.inplace_cpu import average_pool_cpu, lrn_cpu, max_pool_cpu
from mixrt.ops.device import gpu_available
from mixrt.runtime.passes import bands, optimize
from mixrt.runtime.session import Session, load_graph

# the CPU's fast paths, as a CPU session binds them
fused_conv = fused.fused_conv.kernels[-1].for_device("cpu")
fused_conv_pool = banded.fused_conv_pool.kernels[-1].for_device("cpu")

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(11)
F = TensorProto.FLOAT


def unfused(X, W, B, conv, activation, lrn, pool, pool_attributes):
    """The chain the kernel replaces, op by op (the CPU fast paths)."""
    y = fused_conv(np, X, W, B, activation=activation[0], activation_params=activation[1],
                   **conv)
    if lrn:
        y = lrn_cpu(np, y, size=lrn[0], alpha=lrn[1], beta=lrn[2], bias=lrn[3])
    return (max_pool_cpu if pool == "MaxPool" else average_pool_cpu)(np, y, **pool_attributes)


def fused_attributes(activation, lrn, pool, pool_attributes):
    found = dict(activation=activation[0], activation_params=activation[1], pool=pool,
                 pool_kernel_shape=pool_attributes["kernel_shape"],
                 pool_strides=pool_attributes.get("strides"),
                 pool_pads=pool_attributes.get("pads"),
                 pool_ceil_mode=pool_attributes.get("ceil_mode", 0),
                 pool_count_include_pad=pool_attributes.get("count_include_pad", 0))
    if lrn:
        found.update(lrn_size=lrn[0], lrn_alpha=lrn[1], lrn_beta=lrn[2], lrn_bias=lrn[3])
    return found


RELU, NONE, SIGMOID = ("Relu", []), ("", []), ("Sigmoid", [])
LRN = (5, 1e-2, 0.75, 2.0)
CASES = {  # name -> (X, W shape, conv attrs, activation, lrn, pool, pool attrs)
    "zfnet_stem": ((1, 3, 57, 57), (24, 3, 7, 7), dict(strides=[2, 2], pads=[1, 1, 1, 1]),
                   RELU, LRN, "MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2])),
    "resnet_stem": ((2, 3, 40, 36), (16, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]),
                    RELU, None, "MaxPool",
                    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "ceil_overhang": ((1, 3, 31, 30), (8, 3, 3, 3), dict(pads=[1, 1, 1, 1]), NONE, None,
                      "MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "stride_one_pool": ((1, 4, 20, 17), (8, 4, 3, 3), dict(pads=[1, 1, 1, 1]), RELU, LRN,
                        "MaxPool", dict(kernel_shape=[3, 3], strides=[1, 1],
                                        pads=[1, 1, 1, 1])),
    "average_counting_pads": ((1, 3, 24, 22), (8, 3, 3, 3), dict(), SIGMOID, None,
                              "AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2],
                                                  pads=[1, 1, 1, 1], count_include_pad=1)),
    "average_ceil": ((1, 3, 25, 22), (8, 3, 3, 3), dict(), RELU, LRN, "AveragePool",
                     dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    "pointwise": ((1, 8, 18, 18), (16, 8, 1, 1), dict(), ("LeakyRelu", [0.1]), None,
                  "MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
    "grouped": ((1, 4, 21, 20), (8, 2, 3, 3), dict(group=2, pads=[1, 1, 1, 1]), RELU, LRN,
                "MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2])),
    "window_taller_than_band": ((1, 3, 30, 12), (8, 3, 3, 3), dict(), RELU, None, "MaxPool",
                                dict(kernel_shape=[5, 2], strides=[1, 2])),
}


def case_arrays(name, dtype=np.float32):
    x_shape, w_shape, *_ = CASES[name]
    return (RNG.standard_normal(x_shape).astype(dtype),
            (RNG.standard_normal(w_shape) * 0.3).astype(dtype),
            RNG.standard_normal(w_shape[0]).astype(dtype))


@pytest.mark.parametrize("band_bytes", [1, 3000, 1 << 30], ids=["one_row", "few_rows", "one"])
@pytest.mark.parametrize("prepacked", [True, False], ids=["direct", "ordinary"])
@pytest.mark.parametrize("name", CASES)
def test_banded_kernel_matches_the_unfused_chain(monkeypatch, name, prepacked, band_bytes):
    monkeypatch.setattr(banded, "BAND_BYTES", band_bytes)
    monkeypatch.setattr(conv_pool_cpu, "WHOLE_IMAGE_BYTES", 0)  # bands, even for one image
    _, w_shape, conv, activation, lrn, pool, pool_attributes = CASES[name]
    X, W, B = case_arrays(name)
    conv = dict(conv, kernel_shape=list(w_shape[2:]))
    want = unfused(X, W, B, conv, activation, lrn, pool, pool_attributes)
    got = fused_conv_pool(np, X, W, B, **conv,
                          **fused_attributes(activation, lrn, pool, pool_attributes),
                          _prepacked={} if prepacked else None)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", CASES)
def test_a_single_small_image_is_computed_whole_and_matches(monkeypatch, name):
    """One image whose conv output fits WHOLE_IMAGE_BYTES, without an LRN: the direct conv
    over the native threads, then the pool's own kernel (where the direct conv takes the
    conv at all)."""
    _, w_shape, conv, activation, lrn, pool, pool_attributes = CASES[name]
    X, W, B = case_arrays(name)
    conv = dict(conv, kernel_shape=list(w_shape[2:]))
    whole = []
    real = conv_pool_cpu._whole_image
    monkeypatch.setattr(conv_pool_cpu, "_whole_image", lambda *a: whole.append(1) or real(*a))
    want = unfused(X, W, B, conv, activation, lrn, pool, pool_attributes)
    got = fused_conv_pool(np, X, W, B, **conv, _prepacked={},
                          **fused_attributes(activation, lrn, pool, pool_attributes))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    # not: two images (resnet_stem), a grouped conv (the direct conv does not take it), an
    # LRN (it would run on one thread over the whole image)
    taken = name not in ("resnet_stem", "grouped") and CASES[name][4] is None \
        and conv_pool_cpu.jit_cpu.panel_kernels() is not None \
        and conv_pool_cpu.jit_cpu.native_pool() is not None
    assert bool(whole) == taken
    monkeypatch.setattr(conv_pool_cpu, "WHOLE_IMAGE_BYTES", 0)
    whole.clear()
    fused_conv_pool(np, X, W, B, **conv, _prepacked={},
                    **fused_attributes(activation, lrn, pool, pool_attributes))
    assert not whole


def test_float64_and_a_given_out_buffer():
    _, w_shape, conv, activation, lrn, pool, pool_attributes = CASES["zfnet_stem"]
    X, W, B = case_arrays("zfnet_stem", np.float64)
    conv = dict(conv, kernel_shape=list(w_shape[2:]))
    want = unfused(X, W, B, conv, activation, lrn, pool, pool_attributes)
    out = np.full(want.shape, np.nan)
    got = fused_conv_pool(np, X, W, B, **conv, out=out, _prepacked={},
                          **fused_attributes(activation, lrn, pool, pool_attributes))
    assert got is out
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_an_unknown_pool_is_refused():
    X, W, B = case_arrays("pointwise")
    with pytest.raises(ValueError, match="pool must be one of"):
        fused_conv_pool(np, X, W, B, kernel_shape=[1, 1], pool="LpPool",
                        pool_kernel_shape=[2, 2])


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_on_the_gpu_matches_the_cpu():
    import cupy
    _, w_shape, conv, activation, lrn, pool, pool_attributes = CASES["zfnet_stem"]
    X, W, B = case_arrays("zfnet_stem")
    conv = dict(conv, kernel_shape=list(w_shape[2:]))
    attributes = fused_attributes(activation, lrn, pool, pool_attributes)
    want = fused_conv_pool(np, X, W, B, **conv, **attributes)
    got = banded.fused_conv_pool(cupy, cupy.asarray(X), cupy.asarray(W), cupy.asarray(B),
                                 **conv, **attributes)
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-4, atol=1e-4)


# -- the pass ----------------------------------------------------------------------------------

def stem_model(pool_node=None, extra_nodes=(), outputs=(("y", None),), lrn=True,
               shape=(1, 3, 64, 64), channels=16):
    """Conv -> Relu [-> LRN] -> pool, as an ONNX model with random weights."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[7, 7],
                              strides=[2, 2], pads=[3, 3, 3, 3]),
             helper.make_node("Relu", ["c"], ["r"])]
    if lrn:
        nodes.append(helper.make_node("LRN", ["r"], ["n"], size=5, alpha=1e-3, beta=0.75,
                                      bias=2.0))
    nodes.append(pool_node or helper.make_node("MaxPool", ["n" if lrn else "r"], ["y"],
                                               kernel_shape=[3, 3], strides=[2, 2],
                                               pads=[1, 1, 1, 1]))
    nodes.extend(extra_nodes)
    weights = [numpy_helper.from_array((RNG.standard_normal((channels, 3, 7, 7)) * 0.2)
                                       .astype(np.float32), "w"),
               numpy_helper.from_array(RNG.standard_normal(channels).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", F, shape)],
                              [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
                              weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def fused_ops(model, min_bytes=0, monkeypatch=None) -> list[str]:
    if monkeypatch is not None:
        monkeypatch.setattr(bands, "MIN_BYTES", min_bytes)
    return [n.op_type for n in optimize(load_graph(model), 2).nodes]


def test_a_stem_becomes_one_fused_conv_pool_that_matches_onnxruntime(monkeypatch):
    monkeypatch.setattr(bands, "MIN_BYTES", 0)
    monkeypatch.setattr(banded, "BAND_BYTES", 4096)  # several bands a thread
    model = stem_model()
    session = Session(model, opt_level=2)
    assert [n.op_type for n in session.graph.nodes] == ["FusedConvPool"]
    fused = session.graph.nodes[0]
    assert fused.attributes["activation"] == "Relu" and fused.attributes["lrn_size"] == 5
    x = RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_the_conv_output_leaves_the_arena(monkeypatch):
    x = {"x": RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)}
    monkeypatch.setattr(bands, "MIN_BYTES", 1 << 60)
    whole = Session(stem_model(), opt_level=2).memory_plan(x)
    monkeypatch.setattr(bands, "MIN_BYTES", 0)
    banded_plan = Session(stem_model(), opt_level=2).memory_plan(x)
    conv_bytes = 16 * 32 * 32 * 4
    assert whole.arena_bytes >= conv_bytes
    assert banded_plan.arena_bytes < conv_bytes  # nothing of the conv's size is planned


def test_small_convs_are_left_alone():
    assert fused_ops(stem_model()) == ["FusedConv", "LRN", "MaxPool"]  # 64 KiB < MIN_BYTES


def test_a_conv_output_read_twice_is_not_banded(monkeypatch):
    twice = stem_model(extra_nodes=[helper.make_node("Sigmoid", ["c"], ["s"])],
                       outputs=(("y", None), ("s", None)), lrn=False)
    assert "FusedConvPool" not in fused_ops(twice, 0, monkeypatch)


def test_a_pool_with_indices_is_not_banded(monkeypatch):
    pool = helper.make_node("MaxPool", ["n"], ["y", "i"], kernel_shape=[3, 3], strides=[2, 2])
    model = stem_model(pool, outputs=(("y", None), ("i", None)))
    assert "FusedConvPool" not in fused_ops(model, 0, monkeypatch)


def test_an_average_pool_counting_pads_in_ceil_mode_is_not_banded(monkeypatch):
    pool = helper.make_node("AveragePool", ["n"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)
    assert "FusedConvPool" not in fused_ops(stem_model(pool), 0, monkeypatch)
    counted = helper.make_node("AveragePool", ["n"], ["y"], kernel_shape=[3, 3],
                               strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)
    assert fused_ops(stem_model(counted), 0, monkeypatch) == ["FusedConvPool"]


def test_an_unknown_batch_still_bands(monkeypatch):
    model = stem_model(shape=("n", 3, 64, 64))
    assert fused_ops(model, 0, monkeypatch) == ["FusedConvPool"]
    session = Session(model, opt_level=2)
    x = RNG.standard_normal((3, 3, 64, 64)).astype(np.float32)
    want = Session(model, opt_level=0).run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_exports_as_the_standard_chain(monkeypatch, tmp_path):
    monkeypatch.setattr(bands, "MIN_BYTES", 0)
    session = Session(stem_model(), opt_level=2)
    exported = export_model(session.graph)
    onnx.checker.check_model(exported)
    assert [n.op_type for n in exported.graph.node] == ["Conv", "Relu", "LRN", "MaxPool"]
    x = RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = session.run(None, {"x": x})[0]
    got = ort.InferenceSession(exported.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _conv_pool_chain(source, name, channels_in, channels, stride, pool_output):
    """Conv (its weight a Constant) -> Relu -> MaxPool 3x3/2 pad 1 on ``source``."""
    weight = (RNG.standard_normal((channels, channels_in, 3, 3)) * 0.2).astype(np.float32)
    return [helper.make_node("Constant", [], [f"{name}_w"],
                             value=numpy_helper.from_array(weight)),
            helper.make_node("Conv", [source, f"{name}_w"], [f"{name}_c"], kernel_shape=[3, 3],
                             strides=[stride, stride], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"{name}_c"], [f"{name}_r"]),
            helper.make_node("MaxPool", [f"{name}_r"], [pool_output], kernel_shape=[3, 3],
                             strides=[2, 2], pads=[1, 1, 1, 1])]


def _chains_model(nodes, output):
    graph = helper.make_graph(nodes, "chains", [helper.make_tensor_value_info(
        "x", F, (1, 3, 64, 64))], [helper.make_tensor_value_info(output, F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_a_chain_is_not_banded_where_the_peak_lies_elsewhere(monkeypatch):
    # the chain's conv makes 16x32x32 (64 KiB); a later 1x1 conv makes 256x16x16 (256 KiB),
    # which sets the arena's size whether or not the chain is banded
    wide = (RNG.standard_normal((256, 16, 1, 1)) * 0.2).astype(np.float32)
    nodes = _conv_pool_chain("x", "a", 3, 16, 2, "p") + [
        helper.make_node("Constant", [], ["wide_w"], value=numpy_helper.from_array(wide)),
        helper.make_node("Conv", ["p", "wide_w"], ["wide"], kernel_shape=[1, 1]),
        helper.make_node("GlobalAveragePool", ["wide"], ["y"])]
    model = _chains_model(nodes, "y")
    assert "FusedConvPool" not in fused_ops(model, 0, monkeypatch)
    x = {"x": RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)}
    banded_anyway = Session(model, opt_level=2)
    assert banded_anyway.memory_plan(x).arena_bytes >= 256 * 16 * 16 * 4


def test_chains_that_lower_the_peak_only_together_are_both_banded(monkeypatch):
    # a's conv makes 64 KiB; b's conv 48 KiB while a's pooled 16 KiB is alive: both peaks
    # are 64 KiB, so banding either alone saves nothing, and banding both does
    nodes = _conv_pool_chain("x", "a", 3, 16, 2, "p") + _conv_pool_chain("p", "b", 16, 48, 1,
                                                                          "y")
    model = _chains_model(nodes, "y")
    assert fused_ops(model, 0, monkeypatch) == ["FusedConvPool", "FusedConvPool"]
    x = {"x": RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)}
    session = Session(model, opt_level=2)
    assert session.memory_plan(x).arena_bytes < 48 * 16 * 16 * 4
    want = Session(model, opt_level=0).run(None, x)[0]
    np.testing.assert_allclose(session.run(None, x)[0], want, rtol=1e-5, atol=1e-5)
