"""onnxruntime's generation operators (com.microsoft BeamSearch and GreedySearch) over tiny
GPT-2 style decoders and T5 style encoder-decoders built here, against onnxruntime itself:
the sequences bit for bit, the scores to float32 rounding."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.errors import ExecutionError, GraphError, UnsupportedOperatorError
from mixrt.importers.onnx import import_model
from mixrt.ops.control._generation_scores import _top_k
from mixrt.ops.device import CPU, gpu_available
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.session import load_graph
from mixrt.runtime.support import support_table

MS = "com.microsoft"
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
VOCAB, HIDDEN, HEADS, LAYERS = 50, 16, 2, 2
HEAD_SIZE = HIDDEN // HEADS
EOS = 7
# the decoder's logits differ between the two runtimes in their last bits (float32 products
# summed in another order), and a beam's score sums up to a dozen steps' log-probabilities
# (the largest difference seen is 2.8e-5)
SCORE_TOLERANCE = dict(rtol=1e-5, atol=5e-5)
# a decoder both runtimes compute exactly (lookups and additions) leaves the search's own
# arithmetic: the log-softmax's exponentials and the sums
EXACT_DECODER_TOLERANCE = dict(rtol=1e-5, atol=1e-5)


# -- the decoder: embeddings, attention layers over past keys and values, the LM head ----------

def _weights(seed: int, eos_bias: float) -> dict:
    rng = np.random.default_rng(seed)
    weights = {"wte": rng.normal(0, 1.0, (VOCAB, HIDDEN)), "wpe": rng.normal(0, 0.5, (64, HIDDEN)),
               "lm_head": rng.normal(0, 0.05, (HIDDEN, VOCAB)),
               "lm_bias": rng.normal(0, 0.5, (VOCAB,))}
    weights["lm_bias"][EOS] += eos_bias  # how soon the end token wins
    for layer in range(LAYERS):
        for name in ("q", "k", "v", "o"):
            weights[f"w{name}_{layer}"] = rng.normal(0, 0.4, (HIDDEN, HIDDEN))
    return {name: value.astype(np.float32) for name, value in weights.items()}


def _constants() -> list:
    ints = {"one": [1], "shape_heads": [0, 0, HEADS, HEAD_SIZE],
            "shape_hidden": [0, 0, HIDDEN], "axes_12": [1, 2], "axes_0": [0]}
    made = [numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in ints.items()]
    floats = {"f_one": 1.0, "f_big": -10000.0, "f_scale": 1 / np.sqrt(HEAD_SIZE)}
    made += [numpy_helper.from_array(np.array(v, dtype=np.float32), n) for n, v in floats.items()]
    return made


def _mask_nodes() -> list:
    """bias (batch, 1, new, total): -10000 where the attention mask is 0 or the key comes
    after the query (the past counts as before every new token)."""
    node = helper.make_node
    return [
        node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        node("Sub", ["f_one", "mask_f"], ["mask_off"]),
        node("Mul", ["mask_off", "f_big"], ["mask_add2"]),
        node("Unsqueeze", ["mask_add2", "axes_12"], ["mask_add"]),
        node("Shape", ["input_ids"], ["ids_shape"]),
        node("Shape", ["attention_mask"], ["mask_shape"]),
        node("Slice", ["ids_shape", "one", "shape_2"], ["new_len"]),
        node("Slice", ["mask_shape", "one", "shape_2"], ["total_len"]),
        node("Concat", ["new_len", "total_len"], ["causal_shape"], axis=0),
        node("ConstantOfShape", ["causal_shape"], ["ones"],
             value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
        node("Sub", ["total_len", "new_len"], ["offset1"]),
        node("Squeeze", ["offset1", "axes_0"], ["offset"]),
        node("Trilu", ["ones", "offset"], ["causal"], upper=0),
        node("Sub", ["f_one", "causal"], ["causal_off"]),
        node("Mul", ["causal_off", "f_big"], ["causal_add"]),
        node("Add", ["mask_add", "causal_add"], ["bias"]),
    ]


def _heads(name: str, source: str, weight: str) -> list:
    """(batch, heads, length, head size) of source @ weight."""
    return [helper.make_node("MatMul", [source, weight], [f"{name}_flat"]),
            helper.make_node("Reshape", [f"{name}_flat", "shape_heads"], [f"{name}_split"]),
            helper.make_node("Transpose", [f"{name}_split"], [name], perm=[0, 2, 1, 3])]


def _layer_nodes(layer: int, hidden: str) -> tuple[list, str]:
    node, l = helper.make_node, layer
    nodes = _heads(f"q{l}", hidden, f"wq_{l}") + _heads(f"k{l}", hidden, f"wk_{l}") + \
        _heads(f"v{l}", hidden, f"wv_{l}")
    nodes += [
        node("Gather", [f"past_{l}", "zero_s"], [f"past_k{l}"], axis=0),
        node("Gather", [f"past_{l}", "one_s"], [f"past_v{l}"], axis=0),
        node("Concat", [f"past_k{l}", f"k{l}"], [f"key{l}"], axis=2),
        node("Concat", [f"past_v{l}", f"v{l}"], [f"value{l}"], axis=2),
        node("Unsqueeze", [f"key{l}", "axes_0"], [f"key{l}_1"]),
        node("Unsqueeze", [f"value{l}", "axes_0"], [f"value{l}_1"]),
        node("Concat", [f"key{l}_1", f"value{l}_1"], [f"present_{l}"], axis=0),
        node("Transpose", [f"key{l}"], [f"key{l}_t"], perm=[0, 1, 3, 2]),
        node("MatMul", [f"q{l}", f"key{l}_t"], [f"raw{l}"]),
        node("Mul", [f"raw{l}", "f_scale"], [f"scaled{l}"]),
        node("Add", [f"scaled{l}", "bias"], [f"masked{l}"]),
        node("Softmax", [f"masked{l}"], [f"probs{l}"], axis=-1),
        node("MatMul", [f"probs{l}", f"value{l}"], [f"mixed{l}"]),
        node("Transpose", [f"mixed{l}"], [f"mixed{l}_t"], perm=[0, 2, 1, 3]),
        node("Reshape", [f"mixed{l}_t", "shape_hidden"], [f"joined{l}"]),
        node("MatMul", [f"joined{l}", f"wo_{l}"], [f"attended{l}"]),
        node("Add", [hidden, f"attended{l}"], [f"hidden{l + 1}"]),
    ]
    return nodes, f"hidden{l + 1}"


def decoder_graph(weights: dict, *, layers=LAYERS, presents=None, inside=True,
                  past_declared=True) -> onnx.GraphProto:
    """The decoder with convert_generation's interface; ``inside`` keeps the weights in the
    graph, otherwise the main graph holds them (as convert_generation moves them)."""
    node = helper.make_node
    nodes = [node("Gather", ["wte", "input_ids"], ["tokens"]),
             node("Gather", ["wpe", "position_ids"], ["places"]),
             node("Add", ["tokens", "places"], ["hidden0"])] + _mask_nodes()
    hidden = "hidden0"
    for layer in range(layers):
        made, hidden = _layer_nodes(layer, hidden)
        nodes += made
    nodes += [node("MatMul", [hidden, "lm_head"], ["lm"]),
              node("Add", ["lm", "lm_bias"], ["logits"])]
    past_shape = [2, "batch", HEADS, "past", HEAD_SIZE] if past_declared else None
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", length])
              for name, length in (("input_ids", "seq"), ("position_ids", "seq"),
                                   ("attention_mask", "total"))]
    inputs += [helper.make_tensor_value_info(f"past_{i}", TensorProto.FLOAT, past_shape)
               for i in range(layers)]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])]
    outputs += [helper.make_tensor_value_info(f"present_{i}", TensorProto.FLOAT,
                                              [2, "batch", HEADS, "total", HEAD_SIZE])
                for i in range(layers if presents is None else presents)]
    if presents is not None and presents > layers:  # a present the layers do not make
        nodes += [node("Identity", [f"present_{layers - 1}"], [f"present_{i}"])
                  for i in range(layers, presents)]
    constants = _constants() + [
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero_s"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one_s"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "shape_2")]
    if inside:
        constants += [numpy_helper.from_array(v, n) for n, v in weights.items()]
    return helper.make_graph(nodes, "gpt2 decoder", inputs, outputs, initializer=constants)


def lookup_decoder_graph(seed: int) -> onnx.GraphProto:
    """A decoder both runtimes compute exactly: logits are a bigram table's row for the
    token plus one per position plus the sum of every earlier token's entry in a third
    table (read back from the past, so a beam's past must follow it). All entries are
    multiples of 1/8, so every sum is exact."""
    rng = np.random.default_rng(seed)
    heads, head_size = 2, VOCAB // 2
    tables = {"bigram": rng.integers(-24, 24, (VOCAB, VOCAB)) / 8,
              "by_place": rng.integers(-8, 8, (64, VOCAB)) / 8,
              "memory": rng.integers(-4, 4, (VOCAB, 2 * VOCAB)) / 8}
    node = helper.make_node
    nodes = [
        node("Gather", ["memory", "input_ids"], ["remembered"]),
        node("Reshape", ["remembered", "kv_shape"], ["kv_split"]),
        node("Transpose", ["kv_split"], ["kv"], perm=[2, 0, 3, 1, 4]),
        node("Concat", ["past_0", "kv"], ["present_0"], axis=3),
        node("ReduceSum", ["present_0", "length_axis"], ["summed"], keepdims=0),
        node("Gather", ["summed", "zero_s"], ["keys"], axis=0),
        node("Reshape", ["keys", "context_shape"], ["context"]),
        node("Gather", ["bigram", "input_ids"], ["next"]),
        node("Gather", ["by_place", "position_ids"], ["placed"]),
        node("Add", ["next", "placed"], ["local"]),
        node("Add", ["local", "context"], ["logits"]),
    ]
    constants = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in tables.items()]
    constants += [numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in {
        "kv_shape": [0, 0, 2, heads, head_size], "length_axis": [3], "zero_s": 0,
        "context_shape": [-1, 1, VOCAB]}.items()]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", "seq"])
              for name in ("input_ids", "position_ids", "attention_mask")]
    inputs.append(helper.make_tensor_value_info("past_0", TensorProto.FLOAT,
                                                [2, "batch", heads, "past", head_size]))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                             ["batch", "seq", VOCAB]),
               helper.make_tensor_value_info("present_0", TensorProto.FLOAT,
                                             [2, "batch", heads, "total", head_size])]
    return helper.make_graph(nodes, "lookup decoder", inputs, outputs, initializer=constants)


# -- the search node ----------------------------------------------------------------------------

BEAM_INPUTS = ["input_ids", "max_length", "min_length", "num_beams", "num_return_sequences",
               "length_penalty", "repetition_penalty", "vocab_mask", "prefix_vocab_mask",
               "attention_mask"]
GREEDY_INPUTS = ["input_ids", "max_length", "min_length", "repetition_penalty", "vocab_mask",
                 "prefix_vocab_mask", "attention_mask"]
NODE = "BeamSearch_gpt2"


def search_model(op_type: str, feeds: dict, outputs, *, weights_inside=True, seed=0,
                 eos_bias=0.0, decoder=None, **attributes) -> onnx.ModelProto:
    """One search node over the decoder; inputs absent from ``feeds`` are left out."""
    weights = _weights(seed, eos_bias)
    names = BEAM_INPUTS if op_type == "BeamSearch" else GREEDY_INPUTS
    used = [name if name in feeds else "" for name in names]
    while used and not used[-1]:
        used.pop()
    graph_decoder = decoder if decoder is not None else \
        decoder_graph(weights, inside=weights_inside)
    node = helper.make_node(op_type, used, list(outputs), domain=MS,
                            name=NODE if op_type == "BeamSearch" else "GreedySearch_gpt2",
                            decoder=graph_decoder, **attributes)
    inputs = [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(feeds[name].dtype),
        ["batch", "sequence"] if name in ("input_ids", "attention_mask") else
        list(feeds[name].shape))
        for name in used if name]
    graph = helper.make_graph(
        [node], "generation", inputs, [onnx.ValueInfoProto(name=o) for o in outputs if o],
        initializer=[] if weights_inside else
        [numpy_helper.from_array(v, n) for n, v in weights.items()])
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def beam_feeds(input_ids, *, max_length=12, min_length=0, num_beams=3, num_return_sequences=1,
               length_penalty=1.0, repetition_penalty=1.0, **extra) -> dict:
    feeds = {"input_ids": np.asarray(input_ids, dtype=np.int32),
             "max_length": np.array([max_length], dtype=np.int32),
             "min_length": np.array([min_length], dtype=np.int32),
             "num_beams": np.array([num_beams], dtype=np.int32),
             "num_return_sequences": np.array([num_return_sequences], dtype=np.int32),
             "length_penalty": np.array([length_penalty], dtype=np.float32),
             "repetition_penalty": np.array([repetition_penalty], dtype=np.float32)}
    feeds.update({name: np.asarray(value, dtype=np.int32) for name, value in extra.items()})
    return feeds


def run_both(model: onnx.ModelProto, feeds: dict, **options):
    data = model.SerializeToString()
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = mixrt.Session(data, **options).run(None, feeds)
    return expected, got


def compare_beams(model, feeds, tolerance=SCORE_TOLERANCE, **options) -> float:
    """Sequences equal, scores close; the largest score difference. ``options`` go to
    mixrt's Session."""
    expected, got = run_both(model, feeds, **options)
    np.testing.assert_array_equal(got[0], expected[0])
    assert got[0].dtype == np.int32 and got[0].shape == expected[0].shape
    worst = 0.0
    for index, (want, have) in enumerate(zip(expected[1:], got[1:]), start=1):
        assert have.dtype == np.float32 and have.shape == want.shape, (index, have.shape)
        if index == 2:  # onnxruntime leaves the steps after every entry finished unset
            taken = _steps_taken(have)
            want, have = want[:taken], have[:taken]
        finite = want > -1e30  # banned tokens (float32's lowest, times penalties) aside
        np.testing.assert_array_equal(finite, have > -1e30)
        np.testing.assert_allclose(have[finite], want[finite], **tolerance)
        if finite.any():
            worst = max(worst, float(np.abs(have[finite] - want[finite]).max()))
    DIFFERENCES.append(worst)
    return worst


# the largest score difference of each comparison (printed with -s at the end)
DIFFERENCES: list[float] = []


def _steps_taken(scores) -> int:
    """The steps a search ran: mixrt writes zeros for those it did not."""
    ran = [bool(block.any()) for block in scores]
    taken = ran.index(False) if False in ran else len(ran)
    assert not any(ran[taken:]), "a step after the search ended has scores"
    return taken


def compare_greedy(model, feeds) -> None:
    """Sequences equal up to where the search stopped; mixrt pads the rest (onnxruntime
    leaves it unset)."""
    expected, got = run_both(model, feeds)
    assert got[0].dtype == np.int32 and got[0].shape == expected[0].shape
    pad = _pad_of(model)
    stop = _greedy_stop(got[0], feeds, pad)
    np.testing.assert_array_equal(got[0][:, :stop], expected[0][:, :stop])
    assert (got[0][:, stop:] == pad).all()


def _greedy_stop(sequences, feeds, pad: int) -> int:
    """The length a greedy search stopped at: one past the step where the last row to end
    wrote its end token (as pad_token_id), max_length where a row never ended."""
    prompt = feeds["input_ids"].shape[1]
    ends = []
    for row in sequences[:, prompt:]:
        kept = np.flatnonzero(row != pad)
        ends.append(0 if not len(kept) else kept[-1] + 1)  # where the trailing pads start
    if any(end == sequences.shape[1] - prompt for end in ends):
        return sequences.shape[1]
    return prompt + max(ends) + 1


def _pad_of(model) -> int:
    (attribute,) = [a for a in model.graph.node[0].attribute if a.name == "pad_token_id"]
    return attribute.i


PROMPT = [[3, 14, 15, 9]]
LEFT_PADDED = [[EOS, EOS, 21, 4, 30, 2], [11, 12, 13, 5, 6, 40]]
LEFT_PADDED_MASK = [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
OUTPUTS = ("sequences", "sequences_scores", "scores")
GPT2 = dict(eos_token_id=EOS, pad_token_id=EOS, model_type=0)
# the end token's logit bias: some hypotheses end, many do, most end within a few steps
EOS_BIASES = [0.0, 1.0, 2.0]
EOS_CASES = ["eos rare", "eos plausible", "eos likely"]
PAD = 1  # a pad token that is not the end token
PADDED_WITH_PAD = [[PAD if token == EOS else token for token in row] for row in LEFT_PADDED]

BEAM_CASES = {
    "one beam": (dict(num_beams=1), {}),
    "three beams": (dict(num_beams=3), {}),
    "four beams two returned": (dict(num_beams=4, num_return_sequences=2), {}),
    "four beams all returned": (dict(num_beams=4, num_return_sequences=4), {}),
    "length penalty": (dict(num_beams=3, num_return_sequences=3, length_penalty=0.6), {}),
    "long length penalty": (dict(num_beams=4, num_return_sequences=2, length_penalty=1.8), {}),
    "repetition penalty": (dict(num_beams=3, repetition_penalty=1.6), {}),
    "no repeat 2-grams": (dict(num_beams=3), dict(no_repeat_ngram_size=2)),
    "min length": (dict(num_beams=3, min_length=10), {}),
    "early stopping": (dict(num_beams=3, num_return_sequences=2), dict(early_stopping=1)),
}


@pytest.mark.parametrize("eos_bias", EOS_BIASES, ids=EOS_CASES)
@pytest.mark.parametrize("case", list(BEAM_CASES))
def test_beam_search_matches_onnxruntime(case, eos_bias):
    settings, attributes = BEAM_CASES[case]
    feeds = beam_feeds(PROMPT, **settings)
    model = search_model("BeamSearch", feeds, OUTPUTS, eos_bias=eos_bias,
                         **GPT2, **attributes)
    compare_beams(model, feeds)


@pytest.mark.parametrize("eos_bias", EOS_BIASES, ids=EOS_CASES)
@pytest.mark.parametrize("num_beams", [1, 3, 4])
def test_beam_search_over_a_left_padded_batch(num_beams, eos_bias):
    feeds = beam_feeds(LEFT_PADDED, num_beams=num_beams, max_length=14,
                       num_return_sequences=min(2, num_beams), length_penalty=1.3,
                       attention_mask=LEFT_PADDED_MASK)
    model = search_model("BeamSearch", feeds, OUTPUTS, eos_bias=eos_bias, weights_inside=False,
                         **GPT2)
    compare_beams(model, feeds)


@pytest.mark.parametrize("with_mask", [True, False], ids=["mask", "no mask"])
def test_beam_search_with_a_pad_token_of_its_own(with_mask):
    extra = dict(attention_mask=LEFT_PADDED_MASK) if with_mask else {}
    feeds = beam_feeds(PADDED_WITH_PAD, num_beams=3, num_return_sequences=2, max_length=16,
                       **extra)
    model = search_model("BeamSearch", feeds, OUTPUTS, eos_bias=1.5, eos_token_id=EOS,
                         pad_token_id=PAD)
    compare_beams(model, feeds)


def test_beam_search_derives_the_mask_from_pad_tokens():
    feeds = beam_feeds(LEFT_PADDED, num_beams=3, num_return_sequences=2)
    compare_beams(search_model("BeamSearch", feeds, OUTPUTS, **GPT2), feeds)


def test_beam_search_with_vocab_masks_and_every_processor():
    rng = np.random.default_rng(3)
    vocab_mask = (rng.random(VOCAB) > 0.2).astype(np.int32)
    vocab_mask[EOS] = 1
    prefix = (rng.random((2, VOCAB)) > 0.5).astype(np.int32)
    feeds = beam_feeds(LEFT_PADDED, num_beams=4, num_return_sequences=3, min_length=9,
                       repetition_penalty=1.3, length_penalty=0.8, vocab_mask=vocab_mask,
                       prefix_vocab_mask=prefix, attention_mask=LEFT_PADDED_MASK)
    model = search_model("BeamSearch", feeds, OUTPUTS, eos_bias=2.0, no_repeat_ngram_size=2,
                         **GPT2)
    compare_beams(model, feeds)


@pytest.mark.parametrize("seed", range(6))
def test_beam_search_over_other_weights(seed):
    feeds = beam_feeds(LEFT_PADDED, num_beams=3, num_return_sequences=2, max_length=16,
                       attention_mask=LEFT_PADDED_MASK)
    model = search_model("BeamSearch", feeds, OUTPUTS, seed=seed, eos_bias=1.5, **GPT2)
    compare_beams(model, feeds)


def test_beam_search_with_sequences_only():
    feeds = beam_feeds(PROMPT, num_beams=2)
    model = search_model("BeamSearch", feeds, ["sequences"], **GPT2)
    expected, got = run_both(model, feeds)
    assert len(got) == 1
    np.testing.assert_array_equal(got[0], expected[0])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("settings,attributes", [
    (dict(num_beams=4, num_return_sequences=2), {}),
    (dict(num_beams=3, num_return_sequences=3, length_penalty=0.7, repetition_penalty=1.2),
     dict(no_repeat_ngram_size=3)),
    (dict(num_beams=4, num_return_sequences=1, min_length=9), dict(early_stopping=1)),
], ids=["four beams", "penalties", "min length early stopping"])
def test_beam_scores_over_an_exact_decoder(seed, settings, attributes):
    feeds = beam_feeds(PADDED_WITH_PAD, max_length=15, attention_mask=LEFT_PADDED_MASK,
                       **settings)
    model = search_model("BeamSearch", feeds, OUTPUTS, decoder=lookup_decoder_graph(seed),
                         eos_token_id=seed + 3, pad_token_id=PAD, **attributes)
    compare_beams(model, feeds, EXACT_DECODER_TOLERANCE)


@pytest.mark.parametrize("seed", range(4))
def test_the_candidates_come_in_onnxruntime_topk_order(seed):
    # ties (many equal scores, banned tokens at float32's lowest) in index order
    rng = np.random.default_rng(seed)
    rows = rng.integers(-3, 3, (3, 40)).astype(np.float32)
    rows[:, ::4] = np.finfo(np.float32).min
    if seed % 2:
        rows = rng.standard_normal((3, 40)).astype(np.float32)
    for k in (1, 2, 6, 8, 40):
        order = np.argsort(-rows, axis=1, kind="stable")[:, :k]
        values, indices = _top_k(rows, k)
        np.testing.assert_array_equal(indices, order)
        np.testing.assert_array_equal(values, np.take_along_axis(rows, order, axis=1))


# -- T5: an encoder and a decoder -----------------------------------------------------------------

T5_HEADS, T5_HEAD_SIZE = 2, 4
T5_HIDDEN = T5_HEADS * T5_HEAD_SIZE
START = 2


def _t5_tables(seed: int, eos: int, eos_bias: float) -> list:
    rng = np.random.default_rng(seed)
    tables = {"t5_embed": rng.integers(-4, 4, (VOCAB, T5_HIDDEN)) / 8,
              "t5_start_embed": rng.integers(-4, 4, (VOCAB, T5_HIDDEN)) / 8,
              "t5_bigram": rng.integers(-16, 16, (VOCAB, VOCAB)) / 8,
              "t5_proj": rng.integers(-4, 4, (T5_HIDDEN, VOCAB)) / 8,
              # the old encoder's first logits differ from what the decoder would make
              "t5_first_bias": rng.integers(-8, 8, (VOCAB,)) / 8}
    tables["t5_bigram"][:, eos] += eos_bias
    made = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in tables.items()]
    made += [numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in {
        "t5_split": [0, 0, T5_HEADS, T5_HEAD_SIZE], "t5_join": [-1, 1, T5_HIDDEN],
        "t5_axis_1": [1], "t5_axis_2": [2], "t5_axes_13": [1, 3]}.items()]
    made.append(numpy_helper.from_array(np.array(0.5, dtype=np.float32), "t5_half"))
    return made


def _t5_heads(source: str, name: str) -> list:
    """(batch, heads, length, head size) of a (batch, length, hidden) value."""
    return [helper.make_node("Reshape", [source, "t5_split"], [f"{name}_split"]),
            helper.make_node("Transpose", [f"{name}_split"], [name], perm=[0, 2, 1, 3])]


def _t5_values(prefix: str, layers: int, length: str) -> list:
    return [helper.make_tensor_value_info(f"{prefix}_{kind}_{i}", TensorProto.FLOAT,
                                          ["batch", T5_HEADS, length, T5_HEAD_SIZE])
            for i in range(layers) for kind in ("key", "value")]


def _t5_value_names(kind: str, layers: int) -> list:
    return [f"{part}_{kind}_{i}" for i in range(layers) for part in ("key", "value")]


def t5_encoder_graph(seed: int, *, decodes: bool, layers: int = 1, eos: int = 3,
                     eos_bias: float = 0.0) -> onnx.GraphProto:
    """The encoder: hidden states are the masked token embeddings, each layer's cross key
    those split into heads and its value their negation. The old form (``decodes``) also
    takes the decoder's first step from decoder_input_ids."""
    node = helper.make_node
    nodes = [node("Gather", ["t5_embed", "encoder_input_ids"], ["embedded"]),
             node("Cast", ["encoder_attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
             node("Unsqueeze", ["mask_f", "t5_axis_2"], ["mask_3"]),
             node("Mul", ["embedded", "mask_3"], ["encoder_hidden_states"])]
    nodes += _t5_heads("encoder_hidden_states", "cross_key")
    nodes.append(node("Neg", ["cross_key"], ["cross_value"]))
    cross = [f"present_{n}" for n in _t5_value_names("cross", layers)]
    nodes += [node("Identity", ["cross_key" if "key" in n else "cross_value"], [n])
              for n in cross]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", "length"])
              for n in ENCODER_INPUTS[:2]]
    outputs = _t5_values("present", 0, "length")
    if decodes:
        nodes += [node("Gather", ["t5_start_embed", "decoder_input_ids"], ["start"])]
        nodes += _t5_heads("start", "self_key")
        nodes += [node("Neg", ["self_key"], ["self_value"]),
                  node("ReduceSum", ["encoder_hidden_states", "t5_axis_1"], ["pooled"],
                       keepdims=1),
                  node("Add", ["pooled", "start"], ["context"]),
                  node("MatMul", ["context", "t5_proj"], ["mixed"]),
                  node("Gather", ["t5_bigram", "decoder_input_ids"], ["next"]),
                  node("Add", ["next", "mixed"], ["unbiased"]),
                  node("Add", ["unbiased", "t5_first_bias"], ["logits"])]
        nodes += [node("Identity", ["self_key" if "key" in n else "self_value"],
                       [f"present_{n}"]) for n in _t5_value_names("self", layers)]
        inputs.append(helper.make_tensor_value_info("decoder_input_ids", TensorProto.INT32,
                                                    ["batch", 1]))
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                 ["batch", 1, VOCAB]),
                   helper.make_tensor_value_info("encoder_hidden_states", TensorProto.FLOAT,
                                                 ["batch", "length", T5_HIDDEN])]
        outputs += _t5_self_outputs(layers, 1)
    outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT,
                                              ["batch", T5_HEADS, "length", T5_HEAD_SIZE])
                for n in cross]
    return helper.make_graph(nodes, "t5 encoder", inputs, outputs,
                             initializer=_t5_tables(seed, eos, eos_bias))


def _t5_self_outputs(layers: int, length) -> list:
    return [helper.make_tensor_value_info(f"present_{n}", TensorProto.FLOAT,
                                          ["batch", T5_HEADS, length, T5_HEAD_SIZE])
            for n in _t5_value_names("self", layers)]


ENCODER_INPUTS = ("encoder_input_ids", "encoder_attention_mask", "decoder_input_ids")


def t5_decoder_graph(seed: int, *, hidden: bool, layers: int = 1, eos: int = 3,
                     eos_bias: float = 0.0) -> onnx.GraphProto:
    """The decoder: logits are the token's bigram row plus (its self keys so far, its cross
    keys where the encoder's mask is 1, and half the pooled hidden states where it reads
    them) through one projection. All values are multiples of 1/64, every sum exact."""
    node = helper.make_node
    nodes = [node("Gather", ["t5_start_embed", "input_ids"], ["token"])]
    nodes += _t5_heads("token", "new_key")
    nodes.append(node("Neg", ["new_key"], ["new_value"]))
    for i in range(layers):
        nodes += [node("Concat", [f"past_key_self_{i}", "new_key"], [f"present_key_self_{i}"],
                       axis=2),
                  node("Concat", [f"past_value_self_{i}", "new_value"],
                       [f"present_value_self_{i}"], axis=2)]
    nodes += [node("ReduceSum", ["present_key_self_0", "t5_axis_2"], ["self_sum"], keepdims=0),
              node("Reshape", ["self_sum", "t5_join"], ["self_context"]),
              node("Cast", ["encoder_attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
              node("Unsqueeze", ["mask_f", "t5_axes_13"], ["mask_4"]),
              node("Mul", ["past_key_cross_0", "mask_4"], ["cross_masked"]),
              node("ReduceSum", ["cross_masked", "t5_axis_2"], ["cross_sum"], keepdims=0),
              node("Reshape", ["cross_sum", "t5_join"], ["cross_context"]),
              node("Add", ["self_context", "cross_context"], ["context"])]
    if hidden:
        nodes += [node("ReduceSum", ["encoder_hidden_states", "t5_axis_1"], ["pooled"],
                       keepdims=1),
                  node("Mul", ["pooled", "t5_half"], ["halved"]),
                  node("Add", ["context", "halved"], ["context_all"])]
    nodes += [node("MatMul", ["context_all" if hidden else "context", "t5_proj"], ["mixed"]),
              node("Gather", ["t5_bigram", "input_ids"], ["next"]),
              node("Add", ["next", "mixed"], ["logits"])]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", 1]),
              helper.make_tensor_value_info("encoder_attention_mask", TensorProto.INT32,
                                            ["batch", "length"])]
    if hidden:
        inputs.append(helper.make_tensor_value_info("encoder_hidden_states", TensorProto.FLOAT,
                                                    ["batch", "length", T5_HIDDEN]))
    inputs += [helper.make_tensor_value_info(f"past_{n}", TensorProto.FLOAT,
                                             ["batch", T5_HEADS, "past", T5_HEAD_SIZE])
               for n in _t5_value_names("self", layers)]
    inputs += [helper.make_tensor_value_info(f"past_{n}", TensorProto.FLOAT,
                                             ["batch", T5_HEADS, "length", T5_HEAD_SIZE])
               for n in _t5_value_names("cross", layers)]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1, VOCAB])]
    outputs += _t5_self_outputs(layers, "total")
    return helper.make_graph(nodes, "t5 decoder", inputs, outputs,
                             initializer=_t5_tables(seed, eos, eos_bias))


def t5_model(feeds: dict, *, seed=0, decodes=True, hidden=True, layers=1, eos_bias=0.0,
             eos_token_id=3, **attributes):
    names = [name if name in feeds else "" for name in BEAM_INPUTS]
    while not names[-1]:
        names.pop()
    ends = dict(eos=eos_token_id, eos_bias=eos_bias)
    node = helper.make_node("BeamSearch", names, list(OUTPUTS), domain=MS, name="BeamSearch_t5",
                            encoder=t5_encoder_graph(seed, decodes=decodes, layers=layers, **ends),
                            decoder=t5_decoder_graph(seed, hidden=hidden, layers=layers, **ends),
                            model_type=1, decoder_start_token_id=START,
                            eos_token_id=eos_token_id, **attributes)
    inputs = [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(feeds[name].dtype),
        ["batch", "sequence"] if name in ("input_ids", "attention_mask") else
        list(feeds[name].shape)) for name in names if name]
    graph = helper.make_graph([node], "t5 generation", inputs,
                              [onnx.ValueInfoProto(name=o) for o in OUTPUTS])
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


T5_PROMPTS = [[PAD, PAD, 21, 4, 30, PAD], [11, 12, 13, 5, 6, 40]]
T5_MASK = [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]


@pytest.mark.parametrize("eos_bias", [0.0, 1.5], ids=["eos rare", "eos likely"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("decodes,hidden", [(True, True), (True, False), (False, False)],
                         ids=["encoder decodes, hidden states", "encoder decodes",
                              "encoder makes cross keys"])
@pytest.mark.parametrize("settings", [
    dict(num_beams=1),
    dict(num_beams=4, num_return_sequences=2, length_penalty=0.8),
    dict(num_beams=3, num_return_sequences=3, repetition_penalty=1.4, min_length=5),
], ids=["one beam", "four beams", "penalties"])
def test_t5_beam_search_matches_onnxruntime(seed, decodes, hidden, settings, eos_bias):
    feeds = beam_feeds(T5_PROMPTS, max_length=10, **settings)
    model = t5_model(feeds, seed=seed, decodes=decodes, hidden=hidden, eos_token_id=seed + 3,
                     eos_bias=eos_bias, pad_token_id=PAD)
    compare_beams(model, feeds, EXACT_DECODER_TOLERANCE)


@pytest.mark.parametrize("decodes", [True, False], ids=["old encoder", "new encoder"])
def test_t5_beam_search_with_a_mask_and_two_layers(decodes):
    feeds = beam_feeds(T5_PROMPTS, max_length=12, num_beams=3, num_return_sequences=2,
                       attention_mask=T5_MASK)
    model = t5_model(feeds, decodes=decodes, hidden=False, layers=2, eos_token_id=4,
                     eos_bias=1.0, pad_token_id=PAD, no_repeat_ngram_size=2)
    compare_beams(model, feeds, EXACT_DECODER_TOLERANCE)


@pytest.mark.parametrize("decodes", [True, False], ids=["old encoder", "new encoder"])
def test_a_t5_decoder_reading_the_whole_sequence(decodes):
    # input_ids declared (batch, sequence) rather than (batch, 1): onnxruntime feeds every
    # token so far at each step. opt_level 2: the encoder and the decoder both name values
    # `mixed` and `next`, (batch, 1, vocab) in the one and (batch, 2, vocab) in the other;
    # inference once typed them by name across both bodies, and the decoder's MatMul + Add
    # was fused in place on the encoder's shape and failed
    feeds = beam_feeds(T5_PROMPTS, max_length=8, num_beams=3, num_return_sequences=2)
    model = t5_model(feeds, decodes=decodes, hidden=False, eos_bias=1.0, pad_token_id=PAD)
    (decoder,) = [a.g for a in model.graph.node[0].attribute if a.name == "decoder"]
    for declared in (decoder.input[0], decoder.output[0]):
        declared.type.tensor_type.shape.dim[1].dim_param = "sequence"
    compare_beams(model, feeds, EXACT_DECODER_TOLERANCE, opt_level=2)


def test_t5_old_encoder_runs_the_decoder_once_after_its_token():
    # both entries end on the encoder's token; onnxruntime still runs the decoder once
    feeds = beam_feeds(T5_PROMPTS, max_length=8, num_beams=1)
    model = t5_model(feeds, eos_token_id=4, eos_bias=8.0, pad_token_id=PAD)
    compare_beams(model, feeds, EXACT_DECODER_TOLERANCE)
    expected, got = run_both(model, feeds)
    assert (got[0][:, :, 1:] == PAD).all() and _steps_taken(got[2]) == 2  # ended at once
    np.testing.assert_allclose(got[2][1], expected[2][1], **EXACT_DECODER_TOLERANCE)


# -- GreedySearch -------------------------------------------------------------------------------

def greedy_feeds(input_ids, *, max_length=12, min_length=0, repetition_penalty=1.0,
                 **extra) -> dict:
    feeds = {"input_ids": np.asarray(input_ids, dtype=np.int32),
             "max_length": np.array([max_length], dtype=np.int32),
             "min_length": np.array([min_length], dtype=np.int32),
             "repetition_penalty": np.array([repetition_penalty], dtype=np.float32)}
    feeds.update({name: np.asarray(value, dtype=np.int32) for name, value in extra.items()})
    return feeds


_MASKS = np.random.default_rng(4)
VOCAB_MASK = (_MASKS.random(VOCAB) > 0.3).astype(np.int32)
VOCAB_MASK[EOS] = 1
PREFIX_MASK = (_MASKS.random((2, VOCAB)) > 0.5).astype(np.int32)

GREEDY_CASES = {
    "plain": (dict(), {}),
    "repetition penalty": (dict(repetition_penalty=1.5), {}),
    "no repeat 2-grams": (dict(), dict(no_repeat_ngram_size=2)),
    "min length": (dict(min_length=9), {}),
    "vocab masks": (dict(vocab_mask=VOCAB_MASK, prefix_vocab_mask=PREFIX_MASK), {}),
}


@pytest.mark.parametrize("eos_bias", EOS_BIASES, ids=EOS_CASES)
@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_search_matches_onnxruntime(case, eos_bias):
    settings, attributes = GREEDY_CASES[case]
    feeds = greedy_feeds(LEFT_PADDED, attention_mask=LEFT_PADDED_MASK, **settings)
    model = search_model("GreedySearch", feeds, ["sequences"], eos_bias=eos_bias,
                         **GPT2, **attributes)
    compare_greedy(model, feeds)


@pytest.mark.parametrize("with_mask", [True, False], ids=["mask", "no mask"])
def test_greedy_search_writes_the_end_token_as_pad(with_mask):
    extra = dict(attention_mask=LEFT_PADDED_MASK) if with_mask else {}
    feeds = greedy_feeds(PADDED_WITH_PAD, max_length=16, **extra)
    model = search_model("GreedySearch", feeds, ["sequences"], eos_bias=1.5,
                         eos_token_id=EOS, pad_token_id=PAD)
    compare_greedy(model, feeds)


# -- refusals -----------------------------------------------------------------------------------

def _refused(model, feeds, error, match):
    with pytest.raises(error, match=match):
        mixrt.Session(model.SerializeToString()).run(None, feeds)


def test_a_search_without_a_decoder_is_refused_naming_the_node():
    feeds = beam_feeds(PROMPT)
    node = helper.make_node("BeamSearch", BEAM_INPUTS[:7], ["sequences"], domain=MS,
                            name=NODE, **GPT2)
    model = search_model("BeamSearch", feeds, ["sequences"], **GPT2)
    model.graph.ClearField("node")
    model.graph.node.append(node)
    _refused(model, feeds, (ExecutionError, GraphError), rf"{NODE}.*decoder attribute")


def test_more_returned_sequences_than_beams_is_refused_naming_the_node():
    feeds = beam_feeds(PROMPT, num_beams=2, num_return_sequences=3)
    model = search_model("BeamSearch", feeds, ["sequences"], **GPT2)
    _refused(model, feeds, ExecutionError, rf"{NODE}.*num_return_sequences \(3\)")


def test_a_decoder_with_a_past_per_present_missing_is_refused_naming_the_node():
    feeds = beam_feeds(PROMPT)
    decoder = decoder_graph(_weights(0, 0.0), presents=LAYERS + 1)
    model = search_model("BeamSearch", feeds, ["sequences"], decoder=decoder, **GPT2)
    _refused(model, feeds, (ExecutionError, GraphError), rf"{NODE}.*one past per present")


def test_a_decoder_without_declared_heads_is_refused_naming_the_node():
    feeds = beam_feeds(PROMPT)
    decoder = decoder_graph(_weights(0, 0.0), past_declared=False)
    model = search_model("BeamSearch", feeds, ["sequences"], decoder=decoder, **GPT2)
    _refused(model, feeds, (ExecutionError, GraphError), rf"{NODE}.*past_0 must be declared")


def test_an_encoder_without_model_type_1_is_refused_naming_the_node():
    feeds = beam_feeds(PROMPT)
    model = search_model("BeamSearch", feeds, ["sequences"], **GPT2)
    encoder = t5_encoder_graph(0, decodes=False)
    model.graph.node[0].attribute.append(helper.make_attribute("encoder", encoder))
    _refused(model, feeds, ExecutionError, rf"{NODE}.*encoder attribute needs model_type 1")


def test_whisper_is_refused_naming_the_node():
    feeds = beam_feeds(PROMPT)
    model = search_model("BeamSearch", feeds, ["sequences"], eos_token_id=EOS,
                         pad_token_id=EOS, model_type=2)
    _refused(model, feeds, (ExecutionError, GraphError), rf"{NODE}.*model_type 2")


def test_mixrt_check_accepts_a_search_model():
    feeds = beam_feeds(PROMPT)
    model = search_model("BeamSearch", feeds, OUTPUTS, **GPT2)
    rows = support_table(import_model(model.SerializeToString()), CPU)
    search = [row for row in rows if row.op_type == "BeamSearch"]
    assert search and search[0].supported, search
    assert all(row.supported for row in rows), [row for row in rows if not row.supported]


def test_an_init_decoder_serves_the_first_step():
    feeds = beam_feeds(LEFT_PADDED, num_beams=3, num_return_sequences=2,
                       attention_mask=LEFT_PADDED_MASK)
    first = decoder_graph(_weights(5, 1.0))
    first.name = "gpt2 init decoder"
    model = search_model("BeamSearch", feeds, OUTPUTS, eos_bias=1.0, **GPT2)
    model.graph.node[0].attribute.append(helper.make_attribute("init_decoder", first))
    compare_beams(model, feeds)


def test_the_inferred_types_are_those_a_run_makes():
    feeds = beam_feeds(LEFT_PADDED, num_beams=3, num_return_sequences=2, max_length=11)
    data = search_model("BeamSearch", feeds, OUTPUTS, **GPT2).SerializeToString()
    types = infer_types(load_graph(data))
    outputs = mixrt.Session(data).run(None, feeds)
    for name, value in zip(OUTPUTS, outputs):
        inferred = types[name]
        assert inferred.dtype == value.dtype and len(inferred.shape) == value.ndim, name
        for dim, size in zip(inferred.shape, value.shape):
            assert not isinstance(dim, int) or dim == size, (name, inferred, value.shape)
    assert types["scores"].shape[2:] == (None, VOCAB)  # num_beams is fed, the vocab declared


@needs_gpu
@pytest.mark.parametrize("build", ["gpt2 beams", "gpt2 greedy", "t5 beams"])
def test_a_gpu_session_searches_as_the_cpu_does(build):
    # the search runs on the host; the decoder's calls and its pasts stay on the device
    if build == "gpt2 greedy":
        feeds = greedy_feeds(LEFT_PADDED, attention_mask=LEFT_PADDED_MASK)
        model = search_model("GreedySearch", feeds, ["sequences"], eos_bias=1.0, **GPT2)
    elif build == "gpt2 beams":
        feeds = beam_feeds(LEFT_PADDED, num_beams=3, num_return_sequences=2,
                           attention_mask=LEFT_PADDED_MASK)
        model = search_model("BeamSearch", feeds, OUTPUTS, eos_bias=1.0, **GPT2)
    else:
        feeds = beam_feeds(T5_PROMPTS, max_length=10, num_beams=3, num_return_sequences=2)
        model = t5_model(feeds, eos_bias=1.0, pad_token_id=PAD)
    data = model.SerializeToString()
    want = mixrt.Session(data).run(None, feeds)
    got = mixrt.Session(data, device="gpu").run(None, feeds)
    np.testing.assert_array_equal(got[0], want[0])
    for have, expected in zip(got[1:], want[1:]):
        np.testing.assert_allclose(have, expected, rtol=1e-5, atol=5e-5)
