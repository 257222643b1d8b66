"""The squeeze-excite pass and op: MobileNetV3's, RegNet-Y's and EfficientNet's blocks become
one SqueezeExcite with onnxruntime's results, each image's output the same bits alone or in
a batch, and near misses stay as they are."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt  # noqa: F401  (registers the ONNX loader)
from mixrt.ops.nn.squeeze_excite import squeeze_excite
from mixrt.ops.ir.registry import CONSTANT_INPUTS
from mixrt.ops.nn.squeeze_excite_cpu import _module as squeeze_excite_module
from mixrt.ops.nn.squeeze_excite_cpu import squeeze_excite_cpu
from mixrt.runtime.passes import optimize
from mixrt.runtime.session import Session, load_graph

RNG = np.random.default_rng(5)
CHANNELS, HIDDEN = 40, 12


def se_model(first="Relu", gate="HardSigmoid", conv_pads=(0, 0, 0, 0), gate_output=False,
             squeeze="GlobalAveragePool", opset=17):
    """x -> Relu -> [squeeze -> Conv -> first -> Conv -> gate] * x -> Relu: the block between
    two other nodes, as a network has it. ``squeeze``: GlobalAveragePool, or "ReduceMean"
    over the plane (axes 2, 3 as an attribute before opset 18, -1, -2 as an input from it)."""
    c = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    extra = []
    if squeeze == "GlobalAveragePool":
        pool = helper.make_node("GlobalAveragePool", ["a"], ["s"])
    elif opset < 18:
        pool = helper.make_node("ReduceMean", ["a"], ["s"], axes=[2, 3], keepdims=1)
    else:
        pool = helper.make_node("ReduceMean", ["a", "axes"], ["s"], keepdims=1)
        extra = [numpy_helper.from_array(np.array([-1, -2], np.int64), "axes")]
    nodes = [helper.make_node("Relu", ["x"], ["a"]), pool,
             helper.make_node("Conv", ["s", "w1", "b1"], ["h0"], pads=list(conv_pads))]
    if first == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["h0"], ["h1"]),
                  helper.make_node("Mul", ["h0", "h1"], ["h"])]
    else:
        nodes.append(helper.make_node(first, ["h0"], ["h"]))
    nodes.append(helper.make_node("Conv", ["h", "w2", "b2"], ["g0"]))
    # HardSigmoid as torch exports it (alpha 1/6, exact in float32 as ONNX stores it)
    nodes.append(helper.make_node(gate, ["g0"], ["g"], alpha=1 / 6, beta=0.5)
                 if gate == "HardSigmoid" else helper.make_node(gate, ["g0"], ["g"]))
    nodes += [helper.make_node("Mul", ["a", "g"], ["m"]),
              helper.make_node("Relu", ["m"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if gate_output:
        outputs.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "se",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", CHANNELS, "h", "w"])],
        outputs,
        [c("w1", RNG.standard_normal((HIDDEN, CHANNELS, 1, 1)) / 4),
         c("b1", RNG.standard_normal(HIDDEN)), c("b2", RNG.standard_normal(CHANNELS)),
         c("w2", RNG.standard_normal((CHANNELS, HIDDEN, 1, 1)) / 2), *extra])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def ops(graph):
    return Counter(node.op_type for node in graph.nodes)


@pytest.mark.parametrize("first, gate, squeeze, opset", [
    ("Relu", "HardSigmoid", "GlobalAveragePool", 17), ("Relu", "Sigmoid", "ReduceMean", 17),
    ("SiLU", "Sigmoid", "ReduceMean", 18)])
def test_blocks_fuse_to_one_node_with_onnxruntime_results(tmp_path, first, gate, squeeze,
                                                         opset):
    model = se_model(first, gate, squeeze=squeeze, opset=opset)
    path = tmp_path / "se.onnx"
    path.write_bytes(model.SerializeToString())
    assert ops(optimize(load_graph(model), 2)) == {"SqueezeExcite": 1, "Relu": 2}
    session = Session(str(path))
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    # a small plane, a batch, and one image large enough to be split by planes
    for shape in [(1, CHANNELS, 3, 5), (3, CHANNELS, 9, 7), (1, CHANNELS, 64, 80)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        for _ in range(3):  # the full route, the binding run, the bound call
            got = session.run(None, {"x": x})[0]
            np.testing.assert_allclose(got, reference.run(None, {"x": x})[0],
                                       rtol=1e-5, atol=1e-6)


def _near_miss(change: str):
    if change == "padded":
        return se_model(conv_pads=(1, 1, 1, 1))
    if change == "gate read elsewhere":
        return se_model(gate_output=True)
    model = se_model(squeeze="ReduceMean")  # a mean over the columns alone
    model.graph.node[1].attribute[0].ints[:] = [2]
    return model


@pytest.mark.parametrize("change", ["padded", "gate read elsewhere", "mean over other axes"])
def test_near_misses_stay_unfused(change):
    model = _near_miss(change)
    assert "SqueezeExcite" not in ops(optimize(load_graph(model), 2))


def _block(n, height, width):
    x = RNG.random((n, CHANNELS, height, width)).astype(np.float32)
    weights = (RNG.standard_normal((HIDDEN, CHANNELS, 1, 1)).astype(np.float32),
               RNG.standard_normal(HIDDEN).astype(np.float32),
               RNG.standard_normal((CHANNELS, HIDDEN, 1, 1)).astype(np.float32),
               RNG.standard_normal(CHANNELS).astype(np.float32))
    return x, weights


def test_an_image_gives_the_same_bits_alone_or_in_a_batch():
    x, weights = _block(4, 20, 24)
    attributes = dict(activation1="Relu", activation2="Sigmoid")
    batch = squeeze_excite_cpu(np, x, *weights, **attributes)
    for image in range(4):
        alone = squeeze_excite_cpu(np, x[image:image + 1].copy(), *weights, **attributes)
        assert np.array_equal(alone[0], batch[image])
    np.testing.assert_allclose(batch, squeeze_excite(np, x, *weights, **attributes),
                               rtol=1e-5, atol=1e-6)


def test_an_activation_without_a_compiled_gate_takes_the_generic_kernel():
    x, weights = _block(2, 5, 6)
    got = squeeze_excite_cpu(np, x, *weights, activation1="Tanh", activation2="Sigmoid")
    want = squeeze_excite(np, x, *weights, activation1="Tanh", activation2="Sigmoid")
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_read_only_constants_take_the_entries_the_warm_up_compiled():
    """A session's weights and biases are read-only arrays: the call copies them, so a
    single image large enough to split (whose products run through ``gates`` here) takes
    the entry compiled with the module, not another one compiled in the request."""
    x, weights = _block(1, 128, 128)
    for array in weights:
        array.flags.writeable = False
    out = np.empty_like(x)
    squeeze_excite_cpu(np, x, *weights, activation1="Relu", activation2="HardSigmoid",
                       activation2_params=[1 / 6, 0.5], out=out,
                       _prepacked={CONSTANT_INPUTS: frozenset({1, 2, 3, 4})})
    module = squeeze_excite_module("Relu", "HardSigmoid")
    assert len(module.gates.signatures) == 1 and len(module.images.signatures) == 1
    np.testing.assert_allclose(out, squeeze_excite(
        np, x, *weights, activation1="Relu", activation2="HardSigmoid",
        activation2_params=[1 / 6, 0.5]), rtol=1e-5, atol=1e-6)
