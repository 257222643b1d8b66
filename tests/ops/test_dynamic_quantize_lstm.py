"""DynamicQuantizeLSTM (ops/quant/contrib_quant_lstm.py) against onnxruntime, on the models
onnxruntime's own ``quantize_dynamic`` writes from float LSTMs (forward, reverse,
bidirectional; with and without B, initial states, sequence_lens, peepholes, clip,
input_forget, other activations; per-tensor and per-channel weights), on uint8 weights
written by hand, and on a PyTorch LSTM exported and quantized.

The outputs are onnxruntime's bits: its sigmoid and tanh are emulated as MLAS's AVX2 kernels
compute them (checked here against onnxruntime's Sigmoid and Tanh). Elu's exp is NumPy's, a
unit in the last place from the C library's: those outputs are compared within ``TOLERANCE``
(measured: 1.2e-7 at most over 6 random models of hidden 29-51 and 5-9 steps; a hidden
state landing on the neighbouring code would move the next step's gates by about
``h_scale * r_scale * 127``, a few 1e-4 at these sizes, and was not seen).

onnxruntime runs on one intra-op thread here: with several, and a batch of 2 or more, it
splits the batch between its threads and quantizes each part's hidden state on its own, so
its codes depend on its thread count (the module's docstring); a batch of one is compared on
two threads.

Every test runs on both tiers: the compiled recurrence (``ops/quant/_jit_quant_lstm.py``) and
the NumPy form (``MIXRT_JIT=0``), and random models compare the two forms' bits directly,
with R's product through the VNNI tile and through the 16-bit dot products.
"""

from __future__ import annotations

import io
import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

import mixrt
from mixrt.errors import MixrtError
from mixrt.ops.compiled import jit_cpu, jit_tier
from mixrt.ops.quant import contrib_quant_lstm, int8_cpu
from mixrt.ops.quant.contrib_quant_lstm import (COMPILED, dynamic_quantize_lstm, mlas_logistic,
                                                mlas_tanh)
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.session import load_graph

f32 = np.float32
TOLERANCE = 1e-6  # for Elu's exp only (docstring)

logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's advice on preprocessing


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def tier(request, monkeypatch):
    """Each test on the compiled tier (the suite compiles in the foreground) and on the NumPy
    form, which serves a session's first runs and every run without numba."""
    monkeypatch.setenv("MIXRT_JIT", "1" if request.param == "compiled" else "0")
    return request.param


# -- models ------------------------------------------------------------------------------------

def float_lstm(rng, *, input_size, hidden, direction, bias=True, states=False, lengths=False,
               peepholes=False, clip=None, input_forget=0, **activation_attributes):
    """A float LSTM node with its weights as initializers; X, sequence_lens and the initial
    states are fed. ``activation_attributes``: activations (one direction's, repeated for
    both), activation_alpha, activation_beta."""
    directions = 2 if direction == "bidirectional" else 1
    weights = {"W": (directions, 4 * hidden, input_size), "R": (directions, 4 * hidden, hidden)}
    if bias:
        weights["B"] = (directions, 8 * hidden)
    if peepholes:
        weights["P"] = (directions, 3 * hidden)
    names = ["X", "W", "R", "B" if bias else "", "lengths" if lengths else "",
             "h0" if states else "", "c0" if states else "", "P" if peepholes else ""]
    while not names[-1]:
        names.pop()
    attributes = {"hidden_size": hidden, "direction": direction, **activation_attributes}
    if "activations" in attributes:
        attributes["activations"] = attributes["activations"] * directions
    if clip is not None:
        attributes["clip"] = clip
    if input_forget:
        attributes["input_forget"] = 1
    fed = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["S", "N", input_size])]
    if lengths:
        fed.append(helper.make_tensor_value_info("lengths", TensorProto.INT32, ["N"]))
    if states:
        fed += [helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                              [directions, "N", hidden])
                for name in ("h0", "c0")]
    graph = helper.make_graph(
        [helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], name="lstm", **attributes)],
        "g", fed,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
         for name in ("Y", "Y_h", "Y_c")],
        initializer=[numpy_helper.from_array(rng.standard_normal(shape).astype(f32), name)
                     for name, shape in weights.items()])
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 14)])


def quantized(model, tmp_path, *, per_channel, weight_type=QuantType.QInt8):
    """The model as ``quantize_dynamic`` writes it (its LSTMs become DynamicQuantizeLSTM)."""
    source, target = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(model, source)
    quantize_dynamic(source, target, per_channel=per_channel, weight_type=weight_type)
    result = onnx.load(target)
    assert [n.op_type for n in result.graph.node if n.op_type.endswith("LSTM")] == \
        ["DynamicQuantizeLSTM"]
    return result


def feeds_for(rng, model, *, seq, batch):
    """Random feeds for the graph's inputs: X, lengths in [0, seq], initial states."""
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value or {"S": seq, "N": batch}[d.dim_param]
                for d in value.type.tensor_type.shape.dim]
        if value.name == "lengths":
            feeds[value.name] = rng.integers(0, seq + 1, dims).astype(np.int32)
        else:
            feeds[value.name] = rng.standard_normal(dims).astype(f32)
    return feeds


def run_both(model, feeds, *, threads=1):
    data = model.SerializeToString()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    theirs = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(
        None, feeds)
    return mixrt.Session(data).run(None, feeds), theirs


def assert_same_bits(ours, theirs):
    assert [(a.dtype, a.shape) for a in ours] == [(b.dtype, b.shape) for b in theirs]
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


def largest_difference(ours, theirs) -> float:
    assert [(a.dtype, a.shape) for a in ours] == [(b.dtype, b.shape) for b in theirs]
    return max((float(np.abs(a - b).max()) for a, b in zip(ours, theirs) if a.size),
               default=0.0)


# -- onnxruntime's sigmoid and tanh ------------------------------------------------------------

def one_op(op_type):
    graph = helper.make_graph(
        [helper.make_node(op_type, ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])])
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("op_type, emulated", [("Sigmoid", mlas_logistic), ("Tanh", mlas_tanh)])
def test_the_emulated_activations_are_onnxruntimes_bits(op_type, emulated):
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(50_000) * s for s in (0.1, 1, 4, 30)]
                       + [np.array([0, -0.0, 9, -9, 18, -18, 1e30, -1e30])]).astype(f32)
    np.testing.assert_array_equal(emulated(np, x), one_op(op_type).run(None, {"x": x})[0])


# -- quantize_dynamic's models -----------------------------------------------------------------

# (direction, input_size, hidden, seq, batch, options)
CASES = [
    ("forward", 3, 4, 5, 1, {}),
    ("forward", 5, 6, 4, 3, {"states": True, "lengths": True}),
    ("forward", 2, 3, 3, 2, {"peepholes": True, "clip": 0.7}),
    ("forward", 4, 5, 2, 2, {"bias": False, "input_forget": 1}),
    ("reverse", 3, 4, 5, 2, {}),
    ("reverse", 2, 3, 4, 3, {"lengths": True, "peepholes": True}),
    ("reverse", 4, 2, 1, 1, {"states": True, "clip": 1.5, "input_forget": 1}),
    ("bidirectional", 3, 4, 3, 2, {}),
    ("bidirectional", 2, 5, 5, 3, {"states": True, "lengths": True, "peepholes": True}),
    ("bidirectional", 5, 3, 2, 1, {"bias": False, "clip": 0.5, "input_forget": 1}),
    ("bidirectional", 1, 8, 4, 3, {"lengths": True, "states": True, "clip": 2.0}),
    ("forward", 6, 20, 5, 2, {"activations": ["HardSigmoid", "Relu", "Softsign"],
                              "activation_alpha": [0.3], "activation_beta": [0.4]}),
    ("bidirectional", 4, 9, 3, 2, {"activations": ["Sigmoid", "Affine", "Tanh"],
                                   "lengths": True}),
]


def case_id(case) -> str:
    words = [k if v is True else f"{k}={'+'.join(map(str, v)) if isinstance(v, list) else v}"
             for k, v in case[5].items()]
    return "-".join([case[0], *words])


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("weight_type", [QuantType.QInt8, QuantType.QUInt8],
                         ids=["QInt8", "QUInt8"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_quantize_dynamic_models_match_onnxruntime(case, weight_type, per_channel, tmp_path):
    direction, input_size, hidden, seq, batch, options = case
    rng = np.random.default_rng([input_size, hidden, seq, batch, len(options)])
    model = quantized(float_lstm(rng, input_size=input_size, hidden=hidden,
                                 direction=direction, **options),
                      tmp_path, per_channel=per_channel, weight_type=weight_type)
    assert_same_bits(*run_both(model, feeds_for(rng, model, seq=seq, batch=batch)))


def test_elu_outputs_are_onnxruntimes_to_its_exp(tmp_path):
    rng = np.random.default_rng(6)
    model = quantized(float_lstm(rng, input_size=5, hidden=12, direction="reverse",
                                 activations=["Sigmoid", "LeakyRelu", "Elu"], states=True),
                      tmp_path, per_channel=True)
    ours, theirs = run_both(model, feeds_for(rng, model, seq=5, batch=2))
    assert largest_difference(ours, theirs) <= TOLERANCE


def test_the_outputs_are_the_quantized_ones_not_the_float_lstms(tmp_path):
    """The float LSTM is far from both: the comparisons above see the quantization."""
    rng = np.random.default_rng(1)
    source = float_lstm(rng, input_size=4, hidden=6, direction="bidirectional")
    model = quantized(source, tmp_path, per_channel=False)
    feeds = feeds_for(rng, model, seq=5, batch=2)
    ours, theirs = run_both(model, feeds)
    exact = ort.InferenceSession(source.SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, feeds)
    assert_same_bits(ours, theirs)
    assert largest_difference(ours, exact) > 1e-3


def test_one_sequence_matches_onnxruntime_on_any_thread_count(tmp_path):
    """A batch of one is never split between onnxruntime's threads."""
    rng = np.random.default_rng(2)
    model = quantized(float_lstm(rng, input_size=3, hidden=8, direction="bidirectional",
                                 states=True), tmp_path, per_channel=True)
    assert_same_bits(*run_both(model, feeds_for(rng, model, seq=5, batch=1), threads=2))


def test_the_outputs_types_follow_from_symbolic_inputs(tmp_path):
    rng = np.random.default_rng(8)
    model = quantized(float_lstm(rng, input_size=3, hidden=5, direction="bidirectional",
                                 states=True, lengths=True), tmp_path, per_channel=True)
    graph = load_graph(model)
    types = infer_types(graph)
    assert [(types[v.name].dtype, types[v.name].shape) for v in graph.outputs] == [
        (np.dtype(f32), ("S", 2, "N", 5)), (np.dtype(f32), (2, "N", 5)),
        (np.dtype(f32), (2, "N", 5))]


# -- uint8 weights (quantize_dynamic writes int8 ones for an LSTM) ----------------------------

def as_uint8_weights(model, *, per_channel_zero_point):
    """The same weights as uint8 codes shifted by 128 with zero point 128: the dequantized
    weights are unchanged, the integer products are not."""
    replaced = []
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor)
        if tensor.name.endswith("_quantized"):
            array = (array.astype(np.int16) + 128).astype(np.uint8)
        elif tensor.name.endswith("_zero_point"):
            array = np.full(array.shape if per_channel_zero_point else array.shape[:1], 128,
                            np.uint8)
        replaced.append(numpy_helper.from_array(array, tensor.name))
    del model.graph.initializer[:]
    model.graph.initializer.extend(replaced)
    return model


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_uint8_weights_match_onnxruntime(per_channel, tmp_path):
    rng = np.random.default_rng(3)
    model = quantized(float_lstm(rng, input_size=4, hidden=5, direction="bidirectional",
                                 lengths=True, peepholes=True), tmp_path,
                      per_channel=per_channel)
    model = as_uint8_weights(model, per_channel_zero_point=per_channel)
    assert_same_bits(*run_both(model, feeds_for(rng, model, seq=4, batch=3)))


# -- PyTorch's LSTM ----------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore")  # the exporter's notes on tracing and its deprecation
def test_a_pytorch_lstm_exported_and_quantized_matches_onnxruntime(tmp_path):
    # PyTorch is a benchmark extra, not a test dependency: the README's test command skips this
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer = torch.nn.LSTM(6, 8, num_layers=2, bidirectional=True).eval()
    buffer = io.BytesIO()
    torch.onnx.export(layer, (torch.randn(5, 1, 6),), buffer, input_names=["X"],
                      output_names=["Y", "h", "c"], opset_version=14, dynamo=False)
    source = tmp_path / "torch.onnx"
    source.write_bytes(buffer.getvalue())
    quantize_dynamic(source, tmp_path / "q.onnx", weight_type=QuantType.QInt8)
    model = onnx.load(tmp_path / "q.onnx")
    assert [n.op_type for n in model.graph.node].count("DynamicQuantizeLSTM") == 2
    x = np.random.default_rng(4).standard_normal((5, 1, 6)).astype(f32)
    assert_same_bits(*run_both(model, {"X": x}))


# -- bad operands --------------------------------------------------------------------------

def bad_node(tmp_path, replace):
    """A quantize_dynamic model whose node is named ``bad_node`` and whose initializers
    ``replace`` maps to new arrays."""
    rng = np.random.default_rng(5)
    model = quantized(float_lstm(rng, input_size=3, hidden=4, direction="forward"), tmp_path,
                      per_channel=False)
    model.graph.node[0].name = "bad_node"
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    arrays.update(replace(arrays))
    del model.graph.initializer[:]
    model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in arrays.items())
    return model, {"X": rng.standard_normal((2, 1, 3)).astype(f32)}


@pytest.mark.parametrize("replace, words", [
    (lambda a: {"W_quantized": a["W_quantized"].transpose(0, 2, 1).copy()},
     r"W has shape \(1, 16, 3\); expected \(1, 3, 16\)"),
    (lambda a: {"R_quantized": a["R_quantized"][:, :, :8].copy()},
     r"R has shape \(1, 4, 8\)"),
    (lambda a: {"W_scale": np.full((1, 3), 0.01, f32)}, r"W_scale has shape \(1, 3\)"),
    (lambda a: {"R_zero_point": np.zeros(2, np.int8)}, r"R_zero_point has shape \(2,\)"),
    (lambda a: {"B": a["B"][:, :10].copy()}, r"B has shape \(1, 10\)"),
], ids=["W-untransposed", "R-columns", "W_scale", "R_zero_point", "B"])
def test_bad_operands_are_refused_naming_the_node(replace, words, tmp_path):
    model, feeds = bad_node(tmp_path, replace)
    with pytest.raises(MixrtError, match=words) as caught:
        mixrt.Session(model.SerializeToString()).run(None, feeds)
    assert "bad_node" in str(caught.value) and "DynamicQuantizeLSTM" in str(caught.value)


def test_per_column_int8_zero_points_must_be_zero(tmp_path):
    """onnxruntime refuses them too: its integer product takes one zero point."""
    model, feeds = bad_node(tmp_path, lambda a: {
        "W_scale": np.full((1, 16), 0.01, f32),
        "W_zero_point": np.arange(16, dtype=np.int8).reshape(1, 16)})
    with pytest.raises(MixrtError, match="zero points must be 0") as caught:
        mixrt.Session(model.SerializeToString()).run(None, feeds)
    assert "bad_node" in str(caught.value)
    with pytest.raises(Exception, match="zero point must be zero"):
        run_both(model, feeds)


def test_a_zero_point_of_another_type_than_its_weight_is_refused(tmp_path):
    model, feeds = bad_node(tmp_path, lambda a: {"R_zero_point": np.zeros(1, np.uint8)})
    with pytest.raises(MixrtError, match="R_zero_point is uint8; expected int8") as caught:
        mixrt.Session(model.SerializeToString()).run(None, feeds)
    assert "bad_node" in str(caught.value)


# -- the compiled recurrence against the NumPy form --------------------------------------------

needs_numba = pytest.mark.skipif(jit_cpu.load(COMPILED) is None, reason="needs numba")


def random_operands(rng, *, direction, weight_type, per_channel, input_size, hidden, seq,
                    batch, peepholes, clip, input_forget, lengths, activations):
    """DynamicQuantizeLSTM's inputs and attributes with random codes, scales and zero
    points."""
    directions = 2 if direction == "bidirectional" else 1
    low, high = (-128, 128) if weight_type == np.int8 else (0, 256)

    def weight(rows):
        return rng.integers(low, high, (directions, rows, 4 * hidden)).astype(weight_type)

    def scale_and_zero():
        shape = (directions, 4 * hidden) if per_channel else (directions,)
        zero = np.zeros(shape, weight_type) if weight_type == np.int8 else \
            np.full(shape, rng.integers(100, 156), weight_type)
        return (rng.uniform(0.002, 0.02, shape).astype(f32), zero)

    inputs = {"X": rng.standard_normal((seq, batch, input_size)).astype(f32),
              "W": weight(input_size), "R": weight(hidden),
              "B": (rng.standard_normal((directions, 8 * hidden)) * 0.3).astype(f32),
              "sequence_lens": rng.integers(0, seq + 1, batch).astype(np.int32)
              if lengths else None,
              "initial_h": rng.standard_normal((directions, batch, hidden)).astype(f32),
              "initial_c": rng.standard_normal((directions, batch, hidden)).astype(f32),
              "P": (rng.standard_normal((directions, 3 * hidden)) * 0.5).astype(f32)
              if peepholes else None}
    (inputs["W_scale"], inputs["W_zero_point"]), (inputs["R_scale"], inputs["R_zero_point"]) \
        = scale_and_zero(), scale_and_zero()
    attributes = {"direction": direction, "hidden_size": hidden, "clip": clip,
                  "input_forget": input_forget,
                  "activations": activations * directions if activations else None,
                  "activation_alpha": [0.3, 0.6, 0.9] * directions,
                  "activation_beta": [0.1, 0.2, 0.4] * directions}
    return inputs, attributes


RANDOM_MODELS = [
    dict(direction="forward", weight_type=np.int8, per_channel=False, input_size=7, hidden=16,
         seq=6, batch=1, peepholes=False, clip=None, input_forget=0, lengths=False,
         activations=None),
    dict(direction="reverse", weight_type=np.uint8, per_channel=True, input_size=5, hidden=21,
         seq=5, batch=3, peepholes=True, clip=1.0, input_forget=0, lengths=True,
         activations=None),
    dict(direction="bidirectional", weight_type=np.int8, per_channel=True, input_size=9,
         hidden=33, seq=4, batch=5, peepholes=True, clip=None, input_forget=1, lengths=True,
         activations=["HardSigmoid", "Relu", "Softsign"]),
    dict(direction="bidirectional", weight_type=np.uint8, per_channel=False, input_size=3,
         hidden=12, seq=7, batch=9, peepholes=False, clip=2.5, input_forget=0, lengths=True,
         activations=["Sigmoid", "Affine", "LeakyRelu"]),
    dict(direction="forward", weight_type=np.int8, per_channel=True, input_size=4, hidden=64,
         seq=3, batch=2, peepholes=True, clip=0.8, input_forget=0, lengths=False,
         activations=["Sigmoid", "ThresholdedRelu", "Tanh"]),
]


def outputs_of(inputs, attributes, *, compiled):
    with jit_tier.using(compiled):
        return dynamic_quantize_lstm(np, **inputs, **attributes)


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@needs_numba
@pytest.mark.parametrize("vnni", [True, False], ids=["vnni", "dot_products"])
@pytest.mark.parametrize("case", range(len(RANDOM_MODELS)))
def test_the_compiled_recurrence_gives_the_numpy_forms_bits(case, vnni, tier, monkeypatch):
    if tier == "numpy" or (vnni and not int8_cpu.available()):
        pytest.skip("compares the two forms itself" if tier == "numpy" else "needs VNNI")
    if not vnni:
        monkeypatch.setattr(int8_cpu, "available", lambda: False)
    calls = []
    direction = contrib_quant_lstm.compiled_direction
    monkeypatch.setattr(contrib_quant_lstm, "compiled_direction",
                        lambda *args: calls.append(direction(*args)) or calls[-1])
    rng = np.random.default_rng(case)
    inputs, attributes = random_operands(rng, **RANDOM_MODELS[case])
    theirs = outputs_of(inputs, attributes, compiled=False)
    assert not calls
    ours = outputs_of(inputs, attributes, compiled=True)
    assert calls and all(result is not None for result in calls)
    assert all(same_bits(a, b) for a, b in zip(ours, theirs))


@needs_numba
def test_a_hidden_state_that_is_not_finite_is_left_to_the_numpy_form(tier):
    """It has no codes: the NumPy form's NaNs, not the compiled form's."""
    rng = np.random.default_rng(11)
    inputs, attributes = random_operands(rng, **RANDOM_MODELS[0])
    inputs["initial_h"][0, 0, 3] = np.nan
    theirs = outputs_of(inputs, attributes, compiled=False)
    ours = outputs_of(inputs, attributes, compiled=True)
    assert np.isnan(theirs[0]).all()
    assert all(same_bits(a, b) for a, b in zip(ours, theirs))


@needs_numba
def test_a_session_runs_the_tier_it_is_on(tier, tmp_path, monkeypatch):
    calls = []
    direction = contrib_quant_lstm.compiled_direction
    monkeypatch.setattr(contrib_quant_lstm, "compiled_direction",
                        lambda *args: calls.append(direction(*args)) or calls[-1])
    rng = np.random.default_rng(12)
    model = quantized(float_lstm(rng, input_size=3, hidden=6, direction="bidirectional"),
                      tmp_path, per_channel=False)
    assert_same_bits(*run_both(model, feeds_for(rng, model, seq=4, batch=2)))
    assert bool(calls) == (tier == "compiled") and None not in calls


@needs_numba
@pytest.mark.parametrize("name", sorted(contrib_quant_lstm.COMPILED_ACTIVATIONS))
def test_the_compiled_activations_give_the_numpy_forms_bits(name, tier):
    """MLAS's sigmoid and tanh (each fused multiply-add emulated in float64) and the other
    activations the compiled gates know, on a million values and the edges."""
    if tier == "numpy":
        pytest.skip("compares the two forms itself")
    rng = np.random.default_rng(13)
    x = np.concatenate([rng.standard_normal(250_000) * s for s in (0.1, 1, 4, 30)]
                       + [np.array([0, -0.0, 9, -9, 18, -18, 1e30, -1e30, np.inf, -np.inf,
                                    np.nan, 1e-40, -1e-40])]).astype(f32)
    alpha, beta = f32(0.3), f32(0.4)
    (numpy_form, *_), = contrib_quant_lstm.gate_activations(
        np, [name, "tanh", "tanh"], [alpha], [beta], 1)
    compiled = x.copy()
    jit_cpu.load(COMPILED).activate(contrib_quant_lstm.COMPILED_ACTIVATIONS[name], compiled,
                                    alpha, beta)
    with np.errstate(all="ignore"):  # Softsign's inf / inf
        expected = numpy_form(x)
    np.testing.assert_array_equal(compiled, expected)
    finite = np.isfinite(expected)
    assert same_bits(compiled[finite], expected[finite])
