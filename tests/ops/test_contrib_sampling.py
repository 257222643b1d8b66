"""onnxruntime's Sampling (com.microsoft) over tiny GPT-2 style decoders built here, against
onnxruntime itself: with a given seed the sequences are onnxruntime's token for token, which
takes its random engine (libstdc++'s minstd_rand0), its float32 softmax (MLAS) and its sort's
order of equal scores (libstdc++'s introsort)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.errors import ExecutionError, GraphError
from mixrt.importers.onnx import import_model
from mixrt.ops.control.contrib_sampling import (MinstdRand0, _introsort_order, _mlas_exp,
                                               mlas_softmax)
from mixrt.ops.device import CPU, gpu_available
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.session import load_graph
from mixrt.runtime.support import support_table

MS = "com.microsoft"
NODE = "Sampling_gpt2"
VOCAB = 40
EOS, PAD = 7, 1
INPUTS = ["input_ids", "max_length", "min_length", "repetition_penalty", "vocab_mask",
          "prefix_vocab_mask", "attention_mask", "presence_mask", "seed"]
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")


# -- the decoder: a bigram table, a term per position and per attended length, and the sum of
# -- every earlier token's memory row, read back from the past -------------------------------

def _tables(seed: int, spread: float, eos_bias: float, dyadic: bool) -> dict:
    """The decoder's tables. Dyadic tables (multiples of 1/8) make equal logits common and
    every sum exact; the others draw logits at random, so ties are rare."""
    rng = np.random.default_rng(seed)
    if dyadic:
        bigram = rng.integers(-16, 16, (VOCAB, VOCAB)) / 8
    else:
        bigram = rng.normal(0, spread, (VOCAB, VOCAB))
    bigram[:, EOS] += eos_bias  # how soon the end token wins
    tables = {"bigram": bigram, "by_place": rng.integers(-4, 4, (32, VOCAB)) / 8,
              "by_length": rng.integers(-4, 4, (32, VOCAB)) / 8,
              "memory": rng.integers(-2, 2, (VOCAB, VOCAB)) / 8}
    return {name: table.astype(np.float32) for name, table in tables.items()}


def decoder_graph(tables: dict) -> onnx.GraphProto:
    """GreedySearch's decoder interface: past_0 (2, batch, 1, past, VOCAB) holds each earlier
    token's memory row, so a row's past must follow it. Lookups and dyadic sums: both
    runtimes compute the same logits to the bit."""
    node = helper.make_node
    nodes = [
        node("Gather", ["memory", "input_ids"], ["remembered"]),
        node("Unsqueeze", ["remembered", "kv_axes"], ["kv_one"]),
        node("Concat", ["kv_one", "kv_one"], ["kv"], axis=0),
        node("Concat", ["past_0", "kv"], ["present_0"], axis=3),
        node("Gather", ["present_0", "zero"], ["keys"], axis=0),
        node("ReduceSum", ["keys", "length_axis"], ["context"], keepdims=0),
        node("Gather", ["bigram", "input_ids"], ["next"]),
        node("Gather", ["by_place", "position_ids"], ["placed"]),
        node("Add", ["next", "placed"], ["local"]),
        node("ReduceSum", ["attention_mask", "one_axis"], ["attended"], keepdims=1),
        node("Gather", ["by_length", "attended"], ["lengthwise"]),
        node("Add", ["local", "context"], ["with_context"]),
        node("Add", ["with_context", "lengthwise"], ["logits"]),
    ]
    constants = [numpy_helper.from_array(v, n) for n, v in tables.items()]
    constants += [numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in {
        "kv_axes": [0, 2], "zero": 0, "length_axis": [2], "one_axis": [1]}.items()]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", length])
              for name, length in (("input_ids", "seq"), ("position_ids", "seq"),
                                   ("attention_mask", "total"))]
    inputs.append(helper.make_tensor_value_info("past_0", TensorProto.FLOAT,
                                                [2, "batch", 1, "past", VOCAB]))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                             ["batch", "seq", VOCAB]),
               helper.make_tensor_value_info("present_0", TensorProto.FLOAT,
                                             [2, "batch", 1, "total", VOCAB])]
    return helper.make_graph(nodes, "bigram decoder", inputs, outputs, initializer=constants)


# -- the Sampling node ------------------------------------------------------------------------

def sampling_model(feeds: dict, outputs=("sequences",), *, table_seed=0, spread=1.0,
                   eos_bias=0.0, dyadic=False, **attributes) -> onnx.ModelProto:
    """One Sampling node over the decoder; inputs absent from ``feeds`` are left out."""
    used = [name if name in feeds else "" for name in INPUTS]
    while used and not used[-1]:
        used.pop()
    attributes = {"eos_token_id": EOS, "pad_token_id": PAD, **attributes}
    decoder = decoder_graph(_tables(table_seed, spread, eos_bias, dyadic))
    node = helper.make_node("Sampling", used, list(outputs), domain=MS, name=NODE,
                            decoder=decoder, **attributes)
    inputs = [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(feeds[name].dtype),
        ["batch", "sequence"] if name in ("input_ids", "attention_mask") else
        list(feeds[name].shape))
        for name in used if name]
    graph = helper.make_graph([node], "sampling", inputs,
                              [onnx.ValueInfoProto(name=o) for o in outputs])
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def sampling_feeds(input_ids, *, max_length=14, seed=None, min_length=None,
                   repetition_penalty=None, **masks) -> dict:
    feeds = {"input_ids": np.asarray(input_ids, dtype=np.int32),
             "max_length": np.array([max_length], dtype=np.int32)}
    if seed is not None:
        feeds["seed"] = np.array([seed], dtype=np.int32)
    if min_length is not None:
        feeds["min_length"] = np.array([min_length], dtype=np.int32)
    if repetition_penalty is not None:
        feeds["repetition_penalty"] = np.array([repetition_penalty], dtype=np.float32)
    feeds.update({name: np.asarray(value, dtype=np.int32) for name, value in masks.items()})
    return feeds


def run_both(model: onnx.ModelProto, feeds: dict):
    data = model.SerializeToString()
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    return expected, mixrt.Session(data).run(None, feeds)


def compare(model, feeds) -> np.ndarray:
    """The sequences equal up to where the search stopped (onnxruntime leaves the rest
    unset, mixrt pads it); mixrt's sequences."""
    expected, got = run_both(model, feeds)
    assert got[0].dtype == np.int32 and got[0].shape == expected[0].shape
    stop = _stop(got[0], feeds["input_ids"].shape[1])
    np.testing.assert_array_equal(got[0][:, :stop], expected[0][:, :stop])
    assert (got[0][:, stop:] == PAD).all()
    return got[0]


def _stop(sequences, prompt: int) -> int:
    """The length the search stopped at: one past the step where the last row to end wrote
    its end token (as PAD), the whole length where a row never ended."""
    ends = []
    for row in sequences[:, prompt:]:
        kept = np.flatnonzero(row != PAD)
        ends.append(0 if not len(kept) else kept[-1] + 1)
    if any(end == sequences.shape[1] - prompt for end in ends):
        return sequences.shape[1]
    return prompt + max(ends) + 1


PROMPT = [[3, 14, 15, 9]]
LEFT_PADDED = [[PAD, PAD, 21, 4], [11, 12, 13, 5]]
LEFT_PADDED_MASK = [[0, 0, 1, 1], [1, 1, 1, 1]]
SEEDS = [0, 1, 7, 4242, 2**31 - 2]


# -- the draws ----------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.5])
@pytest.mark.parametrize("custom", [0, 1])
def test_sequences_are_onnxruntimes_for_a_seed(seed, top_p, custom):
    feeds = sampling_feeds(LEFT_PADDED, seed=seed, attention_mask=LEFT_PADDED_MASK)
    compare(sampling_model(feeds, top_p=top_p, custom=custom, spread=2.0), feeds)


def test_different_seeds_draw_different_sequences():
    drawn = {}
    for seed in SEEDS:
        feeds = sampling_feeds(PROMPT, seed=seed)
        drawn[seed] = compare(sampling_model(feeds, top_p=1.0), feeds).tobytes()
    # minstd_rand0 starts a seed of 0 at 1, where a zero state would stay
    assert drawn[0] == drawn[1]
    assert len(set(drawn.values())) == len(SEEDS) - 1


def test_an_absent_seed_is_seed_0():
    feeds = sampling_feeds(PROMPT)
    without = compare(sampling_model(feeds, top_p=0.9), feeds)
    with_zero = sampling_feeds(PROMPT, seed=0)
    np.testing.assert_array_equal(compare(sampling_model(with_zero, top_p=0.9), with_zero),
                                  without)


@pytest.mark.parametrize("temperature", [0.5, 1.7, 0.0])
@pytest.mark.parametrize("custom", [0, 1])
def test_temperature(temperature, custom):
    feeds = sampling_feeds(LEFT_PADDED, seed=11, attention_mask=LEFT_PADDED_MASK)
    compare(sampling_model(feeds, top_p=0.8, temperature=temperature, custom=custom,
                           spread=2.0), feeds)


@pytest.mark.parametrize("seed", [0, 5, 99])
@pytest.mark.parametrize("spread", [0.3, 1.0, 3.0])
def test_the_default_top_p_cuts_where_mlas_running_sum_rounds(seed, spread):
    # top_p 0 drops each token whose running sum stays at most 1: float32 roundings of
    # MLAS's softmax decide, and a row with every token dropped draws uniformly from
    # filter_value's -1e20
    feeds = sampling_feeds(LEFT_PADDED, seed=seed, attention_mask=LEFT_PADDED_MASK)
    compare(sampling_model(feeds, spread=spread, table_seed=seed), feeds)


@pytest.mark.parametrize("min_tokens_to_keep", [0, 1, 3, VOCAB - 1])
def test_min_tokens_to_keep(min_tokens_to_keep):
    feeds = sampling_feeds(PROMPT, seed=3)
    compare(sampling_model(feeds, top_p=0.3, min_tokens_to_keep=min_tokens_to_keep,
                           spread=3.0), feeds)


@pytest.mark.parametrize("filter_value", [-1e20, float("-inf"), -3.0])
def test_filter_value(filter_value):
    # -3 keeps the dropped tokens drawable, at a low weight
    feeds = sampling_feeds(LEFT_PADDED, seed=21, attention_mask=LEFT_PADDED_MASK)
    compare(sampling_model(feeds, top_p=0.6, filter_value=filter_value), feeds)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("custom", [0, 1])
def test_equal_logits_straddling_the_cut_go_in_std_sorts_order(seed, custom):
    # multiples of 1/8: which of equal scores the filter drops is libstdc++'s introsort's
    # order of them, not their index order
    feeds = sampling_feeds(LEFT_PADDED, seed=seed, attention_mask=LEFT_PADDED_MASK)
    compare(sampling_model(feeds, top_p=0.5, custom=custom, dyadic=True), feeds)


def test_all_equal_logits():
    feeds = sampling_feeds(PROMPT, seed=8)
    model = sampling_model(feeds, top_p=0.5, custom=1, spread=0.0)
    compare(model, feeds)


# -- the processors -----------------------------------------------------------------------------

def test_repetition_penalty_and_no_repeat_ngrams():
    feeds = sampling_feeds(LEFT_PADDED, seed=2, repetition_penalty=1.8,
                           attention_mask=LEFT_PADDED_MASK)
    compare(sampling_model(feeds, top_p=0.9, no_repeat_ngram_size=2, spread=2.0), feeds)


@pytest.mark.parametrize("penalty", [0.0, 0.7, 3.0])
def test_presence_penalty_comes_off_the_first_score(penalty):
    # onnxruntime subtracts the whole mask's penalties from row 0's token 0
    feeds = sampling_feeds(LEFT_PADDED, seed=4, attention_mask=LEFT_PADDED_MASK,
                           presence_mask=np.eye(2, VOCAB, dtype=np.int32) +
                           np.eye(2, VOCAB, 5, dtype=np.int32))
    compare(sampling_model(feeds, top_p=1.0, presence_penalty=penalty, spread=0.5), feeds)


def test_vocab_masks_and_min_length():
    rng = np.random.default_rng(3)
    feeds = sampling_feeds(LEFT_PADDED, seed=6, min_length=10, attention_mask=LEFT_PADDED_MASK,
                           vocab_mask=rng.random(VOCAB) < 0.7,
                           prefix_vocab_mask=rng.random((2, VOCAB)) < 0.3)
    compare(sampling_model(feeds, top_p=0.9, eos_bias=4.0), feeds)


@pytest.mark.parametrize("seed", [0, 3, 17])
def test_rows_end_early_and_the_search_stops(seed):
    feeds = sampling_feeds(LEFT_PADDED, seed=seed, max_length=20,
                           attention_mask=LEFT_PADDED_MASK)
    sequences = compare(sampling_model(feeds, top_p=0.9, eos_bias=5.0), feeds)
    assert _stop(sequences, 4) < 20  # both rows drew the end token


# -- the pieces, on their own -------------------------------------------------------------------

def test_the_engine_is_minstd_rand0():
    # the C++ standard's check of minstd_rand0: its 10000th output from the default seed
    engine = MinstdRand0(1)
    for _ in range(9999):
        engine.next()
    assert engine.next() == 1043618065
    assert MinstdRand0(0).state == MinstdRand0(2**31 - 1).state == 1


@pytest.mark.parametrize("seed", [0, 1, 5, 12345, 2**24])
def test_the_uniform_draws_are_onnxruntimes_to_the_bit(seed):
    # onnxruntime's RandomUniform of doubles draws from the same engine and distribution
    # (its seed is a float attribute: these seeds are exact as floats)
    node = helper.make_node("RandomUniform", [], ["y"], dtype=TensorProto.DOUBLE, shape=[500],
                            seed=float(seed), low=0.0, high=1.0)
    graph = helper.make_graph([node], "uniform", [],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [500])])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    engine = MinstdRand0(seed)
    np.testing.assert_array_equal([engine.uniform() for _ in range(500)],
                                  session.run(None, {})[0])


@pytest.mark.parametrize("width", [1, 8, 17, 50, 1000])
def test_the_softmax_is_onnxruntimes_to_the_bit(width):
    node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    graph = helper.make_graph(
        [node], "softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, width])])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])
    rows = np.random.default_rng(width).normal(0, 30, (64, width)).astype(np.float32)
    rows[::7, 0] = np.finfo(np.float32).min
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": rows})[0]
    got = np.stack([mlas_softmax(row) for row in rows])
    np.testing.assert_array_equal(got.view(np.int32), expected.view(np.int32))


def test_the_fma3_kernels_exp_parts_from_avx512fs_only_near_underflow():
    # the two kernels share the polynomial; FMA3's clamps at -127.5 ln 2 and builds 2^m in
    # the exponent field, which is 0 at m = -127, where AVX512F's rounds to a subnormal
    shifted = np.linspace(-87, 0, 20001, dtype=np.float32)
    np.testing.assert_array_equal(_mlas_exp(shifted, "fma3"), _mlas_exp(shifted, "avx512f"))
    assert _mlas_exp(np.float32([-88.0]), "fma3")[0] == 0
    assert 0 < _mlas_exp(np.float32([-88.0]), "avx512f")[0] < np.finfo(np.float32).tiny
    row = np.random.default_rng(1).normal(0, 2, 37).astype(np.float32)
    for kernel in ("fma3", "avx512f"):
        np.testing.assert_allclose(mlas_softmax(row, kernel), np.exp(row - row.max()) /
                                   np.exp(row - row.max()).sum(), rtol=1e-6)


def test_the_introsort_is_not_stable_as_libstdcpp_sorts():
    # 17 equal scores: the median-of-three pivot and the final insertion sort move them
    order = _introsort_order(np.zeros(17, dtype=np.float32), descending=False)
    assert sorted(order) == list(range(17)) and list(order) != list(range(17))
    scores = np.random.default_rng(0).integers(0, 3, 200).astype(np.float32)
    for descending in (False, True):
        order = _introsort_order(scores, descending)
        ranked = scores[order]
        assert (np.diff(ranked) <= 0).all() if descending else (np.diff(ranked) >= 0).all()


# -- the outputs, refusals, inference -----------------------------------------------------------

def test_filtered_logits_are_the_last_steps_scores():
    # onnxruntime's release builds leave filtered_logits unset; mixrt gives the scores the
    # last token was drawn from
    feeds = sampling_feeds(PROMPT, seed=9, max_length=8)
    model = sampling_model(feeds, ("sequences", "filtered_logits"), top_p=0.5, spread=2.0)
    expected, got = run_both(model, feeds)
    np.testing.assert_array_equal(got[0], expected[0])
    assert expected[1] is None
    filtered = got[1]
    assert filtered.shape == (1, VOCAB) and filtered.dtype == np.float32
    assert (filtered == np.float32(-1e20)).any() and (filtered > -1e20).any()
    assert filtered[0, got[0][0, -1]] > -1e20  # the last token was among those kept


def _refused(model, feeds, match, error=ExecutionError):
    with pytest.raises(error, match=match):
        mixrt.Session(model.SerializeToString()).run(None, feeds)
    with pytest.raises(Exception):  # noqa: B017  (onnxruntime refuses it too, in its words)
        run_both(model, feeds)


def test_a_negative_seed_is_refused_naming_the_node():
    feeds = sampling_feeds(PROMPT, seed=-1)
    _refused(sampling_model(feeds), feeds, rf"{NODE}.*seed must be 0 or more")


@pytest.mark.parametrize("keep", [-1, VOCAB])
def test_min_tokens_to_keep_outside_the_vocabulary_is_refused_naming_the_node(keep):
    feeds = sampling_feeds(PROMPT, seed=1)
    _refused(sampling_model(feeds, top_p=0.5, min_tokens_to_keep=keep), feeds,
             rf"{NODE}.*min_tokens_to_keep must be in \[0, vocab_size \({VOCAB}\)\)")


def test_a_presence_mask_of_another_shape_is_refused_naming_the_node():
    feeds = sampling_feeds(PROMPT, seed=1, presence_mask=np.ones((2, VOCAB)))
    _refused(sampling_model(feeds, presence_penalty=1.0), feeds,
             rf"{NODE}.*presence_mask must be \(batch, vocab_size\)")


def test_every_token_dropped_is_refused_naming_the_node():
    # with filter_value -inf and top_p 0 no token is left to draw; onnxruntime feeds the
    # vocabulary's size as a token and its decoder's Gather fails
    feeds = sampling_feeds(PROMPT, seed=1)
    _refused(sampling_model(feeds, filter_value=float("-inf"), spread=0.0), feeds,
             rf"{NODE}.*dropped every token")


def test_model_type_1_is_refused_naming_the_node():
    feeds = sampling_feeds(PROMPT, seed=1)
    _refused(sampling_model(feeds, model_type=1), feeds, rf"{NODE}.*model_type 1",
             (ExecutionError, GraphError))


def test_mixrt_check_accepts_a_sampling_model():
    feeds = sampling_feeds(PROMPT, seed=1)
    rows = support_table(import_model(sampling_model(feeds).SerializeToString()), CPU)
    assert all(row.supported for row in rows), [row for row in rows if not row.supported]


def test_the_inferred_types_are_those_a_run_makes():
    feeds = sampling_feeds(LEFT_PADDED, seed=1, attention_mask=LEFT_PADDED_MASK)
    outputs = ("sequences", "filtered_logits")
    data = sampling_model(feeds, outputs, top_p=0.9).SerializeToString()
    types = infer_types(load_graph(data))
    for name, value in zip(outputs, mixrt.Session(data).run(None, feeds)):
        inferred = types[name]
        assert inferred.dtype == value.dtype and len(inferred.shape) == value.ndim, name
        for dim, size in zip(inferred.shape, value.shape):
            assert not isinstance(dim, int) or dim == size, (name, inferred, value.shape)
    assert types["filtered_logits"].shape[1] == VOCAB


@needs_gpu
def test_a_gpu_session_draws_as_the_cpu_does():
    # the draws run on the host; the decoder's calls and its pasts stay on the device
    feeds = sampling_feeds(LEFT_PADDED, seed=13, attention_mask=LEFT_PADDED_MASK)
    data = sampling_model(feeds, top_p=0.9, spread=2.0).SerializeToString()
    want = mixrt.Session(data).run(None, feeds)
    got = mixrt.Session(data, device="gpu").run(None, feeds)
    np.testing.assert_array_equal(got[0], want[0])
