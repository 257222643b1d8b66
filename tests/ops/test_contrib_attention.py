"""onnxruntime's attention operators of the com.microsoft domain
(ops/attention/contrib_attention*.py) against onnxruntime's CPU kernels: Attention in every
mask_index form, with past state, unidirectional, bias and float16; MultiHeadAttention in its
separate, cached and packed forms; GroupQueryAttention on prompts, ragged decoding,
shared-length caches, windows, softcap, sinks and rotary embeddings; RotaryEmbedding. Then their
shape rules on symbolic models and bad operands, refused naming the node."""

from __future__ import annotations

import sys
import zlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import mixrt
from mixrt.errors import ExecutionError, GraphError
from mixrt.ops.device import gpu_available
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.session import load_graph

rng = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _seeded(request):
    """Each test's inputs from its own seed (its name's), whatever ran before it in this
    process: drawn from one stream, a raw mask came out all zeros for the second batch too
    about once in 128 calls, and such a row of scores near -10000 keeps only ~1e-3 of its
    float32 precision, past this file's 1e-5 tolerance; which test met it depended on how
    pytest-xdist had shared the tests out."""
    global rng
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))
NODE = "fused_attention_node"


def randn(*shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def contrib_model(op_type, inputs, outputs, dtype=np.float32, shapes=None, **attrs) -> bytes:
    """One com.microsoft node; ``inputs`` is name -> array in the op's input order (None
    leaves an optional input out); ``shapes`` overrides declared input shapes."""
    names = [name if value is not None else "" for name, value in inputs.items()]
    while names and not names[-1]:
        names.pop()
    shapes = shapes or {}
    node = helper.make_node(op_type, names, outputs, domain="com.microsoft", name=NODE, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                       shapes.get(name, value.shape))
         for name, value in inputs.items() if value is not None],
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                       None) for name in outputs if name])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


def feeds_of(inputs):
    return {name: value for name, value in inputs.items() if value is not None}


def run_both(op_type, inputs, outputs, dtype=np.float32, **attrs):
    """(mixrt's outputs, onnxruntime's outputs) of one node."""
    model = contrib_model(op_type, inputs, outputs, dtype, **attrs)
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, feeds_of(inputs))
    return mixrt.Session(model).run(None, feeds_of(inputs)), theirs


def run_ours(op_type, inputs, outputs, dtype=np.float32, **attrs):
    return mixrt.Session(contrib_model(op_type, inputs, outputs, dtype, **attrs)).run(
        None, feeds_of(inputs))


def assert_matches(ours, theirs, dtype=np.float32):
    """float32 to 1e-5 relative; float16, which both compute in float32 and round once, to
    one float16 ulp or so."""
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-3, atol=1e-3)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), **tolerance)


# -- Attention (BERT) -------------------------------------------------------------------------

BATCH, SEQ, HIDDEN, HEADS = 2, 4, 8, 2


def mask_index(form, past=0):
    """A mask of the named form for (BATCH, SEQ) queries over past + SEQ keys; each hides
    every key of some query row, whose scores then all sit next to -10000."""
    total = past + SEQ
    if form == "key_lengths":
        return np.array([0, total - 1], np.int32)
    if form == "ends_and_starts":
        return np.array([3, total, 1, total], np.int32)  # the second entry: nothing valid
    if form == "gpu_index":  # (3 * batch + 2): the CPU reads the lengths in front
        return np.array([2, total, 0, 1, 2, 3, 4, 5], np.int32)
    if form == "raw_2d":
        mask = rng.integers(0, 2, (BATCH, total)).astype(np.int32)
        mask[0] = 0
        return mask
    if form == "raw_3d":
        mask = rng.integers(0, 2, (BATCH, SEQ, total)).astype(np.int32)
        mask[1, 2] = 0
        return mask
    return None


def attention_inputs(mask=None, past=0, sizes=(HIDDEN, HIDDEN, HIDDEN), attention_bias=None,
                     dtype=np.float32):
    width = sum(sizes)
    return dict(input=randn(BATCH, SEQ, HIDDEN, dtype=dtype),
                weights=randn(HIDDEN, width, dtype=dtype, scale=0.5),
                # onnxruntime's CPU kernel reads the bias unconditionally: always give one
                bias=randn(width, dtype=dtype), mask_index=mask,
                past=randn(2, BATCH, HEADS, past, sizes[0] // HEADS, dtype=dtype)
                if past else None,
                attention_bias=attention_bias)


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("past", [0, 3])
@pytest.mark.parametrize("form", [None, "key_lengths", "ends_and_starts", "gpu_index",
                                  "raw_2d", "raw_3d"])
def test_attention_mask_forms_past_and_causal_match_onnxruntime(form, past, unidirectional):
    inputs = attention_inputs(mask_index(form, past), past)
    outputs = ["y", "present"] if past else ["y"]
    assert_matches(*run_both("Attention", inputs, outputs, num_heads=HEADS,
                             unidirectional=unidirectional))


def test_attention_hidden_sizes_scale_filter_value_and_attention_bias():
    inputs = attention_inputs(mask_index("raw_3d"), sizes=(8, 8, 4),
                              attention_bias=randn(BATCH, 1, SEQ, SEQ))
    assert_matches(*run_both("Attention", inputs, ["y"], num_heads=HEADS,
                             qkv_hidden_sizes=[8, 8, 4], unidirectional=1, scale=0.3,
                             mask_filter_value=-50.0))
    inputs = attention_inputs(mask_index("key_lengths"),
                              attention_bias=randn(1, HEADS, SEQ, SEQ))
    assert_matches(*run_both("Attention", inputs, ["y"], num_heads=HEADS))


@pytest.mark.parametrize("form", ["raw_2d", "key_lengths"])
def test_attention_float16_computes_in_float32_as_onnxruntime_does(form, monkeypatch):
    # inputs of their own seed: the shared generator's state depends on which tests ran
    # before in this worker, and an exact float16 comparison should not
    monkeypatch.setattr(sys.modules[__name__], "rng", np.random.default_rng(16))
    inputs = attention_inputs(mask_index(form, 3), past=3, dtype=np.float16)
    ours, theirs = run_both("Attention", inputs, ["y", "present"], np.float16,
                            num_heads=HEADS, unidirectional=1)
    assert_matches(ours, theirs, np.float16)
    np.testing.assert_array_equal(ours[0], theirs[0])  # one rounding, at the end


def test_attention_megatron_mask_reads_its_rows_from_the_past_length():
    """onnxruntime's CPU kernel refuses the 4-D mask; its meaning is the 3-D mask of the
    rows past .. past + seq and the first past + seq keys, which it does run."""
    past, longest = 3, 9
    megatron = rng.integers(0, 2, (BATCH, 1, longest, longest)).astype(np.int32)
    megatron[0, 0, past + 1] = 0  # a query row with every key hidden
    inputs = attention_inputs(megatron, past)
    ours = run_ours("Attention", inputs, ["y", "present"], num_heads=HEADS, unidirectional=1)
    as_3d = dict(inputs, mask_index=np.ascontiguousarray(
        megatron[:, 0, past:past + SEQ, :past + SEQ]))
    theirs = ort.InferenceSession(
        contrib_model("Attention", as_3d, ["y", "present"], num_heads=HEADS, unidirectional=1),
        providers=["CPUExecutionProvider"]).run(None, feeds_of(as_3d))
    assert_matches(ours, theirs)


@pytest.mark.parametrize("placeholder", [np.ones((BATCH, 1), np.int32),
                                         np.zeros((1, 1), np.int32)])
def test_attention_placeholder_mask_hides_nothing(placeholder):
    inputs = attention_inputs(placeholder)
    ours, theirs = run_both("Attention", inputs, ["y"], num_heads=HEADS)
    assert_matches(ours, theirs)
    assert_matches(ours, run_ours("Attention", dict(inputs, mask_index=None), ["y"],
                                  num_heads=HEADS))


def test_attention_shape_rule_on_a_symbolic_model():
    inputs = attention_inputs(mask_index("raw_2d", 3), past=3)
    model = contrib_model("Attention", inputs, ["y", "present"], num_heads=HEADS,
                          shapes={"input": ["batch", "seq", HIDDEN],
                                  "mask_index": ["batch", "total"],
                                  "past": [2, "batch", HEADS, "past", HIDDEN // HEADS]})
    types = infer_types(load_graph(model))
    assert types["y"].shape == ("batch", "seq", HIDDEN)
    assert types["present"].shape == (2, "batch", HEADS, None, HIDDEN // HEADS)
    assert types["y"].dtype == np.float32
    y, present = mixrt.Session(model).run(None, feeds_of(inputs))
    assert y.shape == (BATCH, SEQ, HIDDEN) and present.shape == (2, BATCH, HEADS, 7, 4)


@pytest.mark.parametrize("change, expected", [
    (dict(weights=randn(6, 24)), r"weights have shape \(6, 24\); expected 8 rows"),
    (dict(bias=randn(20)), r"bias has shape \(20,\); expected \(24,\)"),
    (dict(mask_index=np.ones((BATCH, 5), np.int32)),
     r"mask_index has shape \(2, 5\); expected \(2,\) key lengths"),
    (dict(past=randn(2, BATCH, 3, 3, 4)), r"past has shape \(2, 2, 3, 3, 4\); expected "
                                          r"\(2, 2, 2, past_seq, 4\)"),
    (dict(attention_bias=randn(BATCH, 3, SEQ, SEQ)), r"attention_bias has shape"),
])
def test_attention_refuses_operands_that_do_not_fit_naming_the_node(change, expected):
    inputs = dict(attention_inputs(), **change)
    with pytest.raises(GraphError, match=expected) as caught:
        mixrt.Session(contrib_model("Attention", inputs, ["y"], num_heads=HEADS))
    assert NODE in str(caught.value)


@pytest.mark.parametrize("attrs, expected", [
    (dict(), r"num_heads attribute is required"),
    (dict(num_heads=3), r"does not split into 3 heads"),
    (dict(num_heads=HEADS, qkv_hidden_sizes=[8, 4, 12]), r"Q's and K's equal"),
    (dict(num_heads=HEADS, do_rotary=1), r"do_rotary=1 is not implemented"),
])
def test_attention_refuses_attributes_it_cannot_honour(attrs, expected):
    with pytest.raises(GraphError, match=expected) as caught:
        mixrt.Session(contrib_model("Attention", attention_inputs(), ["y"], **attrs))
    assert NODE in str(caught.value)


def test_attention_negative_key_length_is_refused_when_it_runs():
    inputs = attention_inputs(np.array([2, -1], np.int32))
    with pytest.raises(ExecutionError, match=rf"{NODE}.*negative key length"):
        run_ours("Attention", inputs, ["y"], num_heads=HEADS)


# -- MultiHeadAttention -----------------------------------------------------------------------

KV_SEQ, HEAD = 5, 4


def mha_inputs(seq=SEQ, kv_seq=KV_SEQ, past=0, v_head=HEAD, bias=True, mask=None,
               attention_bias=None, cached=False, dtype=np.float32):
    hidden, v_hidden = HEADS * HEAD, HEADS * v_head
    if cached:  # keys and values already in (batch, heads, kv_seq, head_size)
        key, value = (randn(BATCH, HEADS, kv_seq, size, dtype=dtype) for size in (HEAD, v_head))
    else:
        key, value = randn(BATCH, kv_seq, hidden, dtype=dtype), \
            randn(BATCH, kv_seq, v_hidden, dtype=dtype)
    return dict(query=randn(BATCH, seq, hidden, dtype=dtype), key=key, value=value,
                bias=randn(2 * hidden + v_hidden, dtype=dtype) if bias else None,
                key_padding_mask=mask, attention_bias=attention_bias,
                past_key=randn(BATCH, HEADS, past, HEAD, dtype=dtype) if past else None,
                past_value=randn(BATCH, HEADS, past, v_head, dtype=dtype) if past else None)


MHA_OUTPUTS = ["y", "present_key", "present_value", "qk"]


@pytest.mark.parametrize("case", [
    dict(), dict(bias=False), dict(v_head=2), dict(past=3), dict(cached=True),
    dict(past=3, unidirectional=1), dict(seq=1, past=3, unidirectional=1),
    # cross-attention: every query but the last is causally masked; the last sees every key
    dict(seq=2, kv_seq=5, unidirectional=1), dict(seq=5, kv_seq=3, unidirectional=1),
    dict(scale=0.7)])
def test_mha_forms_past_and_causal_match_onnxruntime(case):
    case = dict(case)
    attrs = {key: case.pop(key) for key in ("unidirectional", "scale") if key in case}
    assert_matches(*run_both("MultiHeadAttention", mha_inputs(**case), MHA_OUTPUTS,
                             num_heads=HEADS, **attrs))


def key_padding_mask(form, seq=SEQ, total=KV_SEQ):
    if form == "key_lengths":
        return np.array([0, total - 2], np.int32)
    if form == "gpu_index":
        return np.array([total, 1, 0, 1, 2, 3, 4, 5], np.int32)
    mask = rng.integers(0, 2, (BATCH, total) if form == "raw_2d" else (BATCH, seq, total))
    mask[1, 0] = 0  # a fully masked row
    return mask.astype(np.int32)


@pytest.mark.parametrize("past", [0, 3])
@pytest.mark.parametrize("form", ["key_lengths", "gpu_index", "raw_2d", "raw_3d"])
def test_mha_key_padding_masks_with_bias_and_past_match_onnxruntime(form, past):
    total = past + KV_SEQ
    inputs = mha_inputs(past=past, mask=key_padding_mask(form, total=total),
                        attention_bias=randn(BATCH, 1, SEQ, total))
    assert_matches(*run_both("MultiHeadAttention", inputs, MHA_OUTPUTS, num_heads=HEADS,
                             unidirectional=1, mask_filter_value=-300.0))


def test_mha_float16_matches_onnxruntime():
    inputs = mha_inputs(past=3, mask=key_padding_mask("raw_2d", total=8), dtype=np.float16,
                        attention_bias=randn(1, HEADS, SEQ, 8, dtype=np.float16))
    ours, theirs = run_both("MultiHeadAttention", inputs, MHA_OUTPUTS[:3], np.float16,
                            num_heads=HEADS, unidirectional=1)
    assert_matches(ours, theirs, np.float16)


def test_mha_packed_qkv_and_packed_kv_equal_the_separate_form():
    """onnxruntime's CPU kernel refuses packed inputs; they must equal the separate form it
    runs, the bias sliced the same way."""
    seq = kv_seq = SEQ
    separate = mha_inputs(seq=seq, kv_seq=kv_seq)
    theirs = ort.InferenceSession(
        contrib_model("MultiHeadAttention", separate, ["y"], num_heads=HEADS),
        providers=["CPUExecutionProvider"]).run(None, feeds_of(separate))

    def heads(x):
        return x.reshape(BATCH, -1, HEADS, 1, HEAD)
    q, k, v = (heads(separate[name]) for name in ("query", "key", "value"))
    packed_qkv = dict(query=np.concatenate([q, k, v], axis=3), key=None, value=None,
                      bias=separate["bias"])
    packed_kv = dict(query=separate["query"], key=np.concatenate([k, v], axis=3), value=None,
                     bias=separate["bias"])
    for packed in (packed_qkv, packed_kv):
        assert_matches(run_ours("MultiHeadAttention", packed, ["y"], num_heads=HEADS), theirs)


def test_mha_shape_rule_on_a_symbolic_model():
    inputs = mha_inputs(past=3, v_head=2)
    model = contrib_model("MultiHeadAttention", inputs, MHA_OUTPUTS, num_heads=HEADS, shapes={
        "query": ["batch", "seq", 8], "key": ["batch", "kv", 8], "value": ["batch", "kv", 4],
        "past_key": ["batch", HEADS, 3, HEAD], "past_value": ["batch", HEADS, 3, 2]})
    types = infer_types(load_graph(model))
    assert types["y"].shape == ("batch", "seq", 4)
    assert types["present_key"].shape == ("batch", HEADS, None, HEAD)
    assert types["present_value"].shape == ("batch", HEADS, None, 2)
    assert types["qk"].shape == ("batch", HEADS, "seq", None)
    outputs = mixrt.Session(model).run(None, feeds_of(inputs))
    assert [o.shape for o in outputs] == [(BATCH, SEQ, 4), (BATCH, HEADS, 8, HEAD),
                                          (BATCH, HEADS, 8, 2), (BATCH, HEADS, SEQ, 8)]


@pytest.mark.parametrize("change, expected", [
    (dict(key=randn(BATCH, KV_SEQ, 6)), r"query, key and value have shapes"),
    (dict(value=randn(BATCH, 3, 8)), r"query, key and value have shapes"),
    (dict(bias=randn(20)), r"bias has shape \(20,\); expected \(24,\)"),
    (dict(key_padding_mask=np.ones((BATCH, 4), np.int32)),
     r"key_padding_mask has shape \(2, 4\)"),
    (dict(past_key=randn(BATCH, HEADS, 3, HEAD)), r"past_key and past_value come together"),
    (dict(key=randn(BATCH, HEADS, KV_SEQ, HEAD), value=randn(BATCH, HEADS, KV_SEQ, HEAD),
          past_key=randn(BATCH, HEADS, 3, HEAD), past_value=randn(BATCH, HEADS, 3, HEAD)),
     r"cannot be added to them"),
    (dict(key=None, value=None), r"key is missing"),
])
def test_mha_refuses_operands_that_do_not_fit_naming_the_node(change, expected):
    inputs = dict(mha_inputs(), **change)
    with pytest.raises(GraphError, match=expected) as caught:
        mixrt.Session(contrib_model("MultiHeadAttention", inputs, ["y"], num_heads=HEADS))
    assert NODE in str(caught.value)


# -- GroupQueryAttention ----------------------------------------------------------------------

Q_HEADS, KV_HEADS, GQA_HEAD = 4, 2, 16  # onnxruntime wants head sizes in multiples of 16
GQA_OUTPUTS = ["y", "present_key", "present_value", "qk"]


def gqa_inputs(seq=SEQ, past=0, cache=None, seqlens=None, total=None, packed=False,
               rotary=0, position_ids=None, attention_bias=None, head_sink=False,
               head=GQA_HEAD, batch=BATCH, dtype=np.float32):
    """A call of ``seq`` new tokens after ``past`` cached ones (every entry, unless
    ``seqlens`` says otherwise) in a cache of ``cache`` positions (``past`` by default)."""
    cache = past if cache is None else cache
    seqlens = [past + seq - 1] * batch if seqlens is None else seqlens
    query = randn(batch, seq, Q_HEADS * head, dtype=dtype)
    key, value = (randn(batch, seq, KV_HEADS * head, dtype=dtype) for _ in range(2))
    if packed:
        query, key, value = np.concatenate([query, key, value], axis=-1), None, None
    caches = [randn(batch, KV_HEADS, cache, head, dtype=dtype) if cache else None
              for _ in range(2)]
    return dict(query=query, key=key, value=value, past_key=caches[0], past_value=caches[1],
                seqlens_k=np.array(seqlens, np.int32),
                total_sequence_length=np.array(past + seq if total is None else total, np.int32),
                cos_cache=randn(32, rotary // 2, dtype=dtype) if rotary else None,
                sin_cache=randn(32, rotary // 2, dtype=dtype) if rotary else None,
                position_ids=position_ids,
                attention_bias=None if attention_bias is None else randn(*attention_bias,
                                                                          dtype=dtype),
                head_sink=randn(Q_HEADS, dtype=dtype) if head_sink else None)


def assert_gqa_matches(inputs, dtype=np.float32, rows=None, **attrs):
    """Compare every output; onnxruntime leaves the scores of keys past an entry's valid
    length unwritten, so those are left out. ``rows`` limits y to the valid queries."""
    attrs.setdefault("qk_output", 2)
    ours, theirs = run_both("GroupQueryAttention", inputs, GQA_OUTPUTS, dtype,
                            num_heads=Q_HEADS, kv_num_heads=KV_HEADS, **attrs)
    valid_keys = np.arange(theirs[3].shape[-1]) <= inputs["seqlens_k"][:, None, None, None]
    ours[3], theirs[3] = (np.where(valid_keys, qk, 0) for qk in (ours[3], theirs[3]))
    if rows is not None:
        ours[0], theirs[0] = ours[0][rows], theirs[0][rows]
    assert_matches(ours, theirs, dtype)


@pytest.mark.parametrize("case", [
    dict(),                                               # the first prompt
    dict(packed=True),
    dict(seqlens=[SEQ - 1, 1]),                           # a right-padded prompt
    dict(seq=1, past=3, seqlens=[3, 1]),                  # ragged decoding
    dict(seq=1, past=3, cache=6, seqlens=[3, 2], total=4),  # a cache longer than the total
    # a later prompt after a past (onnxruntime takes those for one entry only)
    dict(seq=3, past=4, batch=1),
    dict(seq=3, past=4, cache=9, seqlens=[6], total=7, batch=1),
])
def test_gqa_prompts_decoding_and_caches_match_onnxruntime(case):
    assert_gqa_matches(gqa_inputs(**case))


@pytest.mark.parametrize("attrs, case", [
    (dict(local_window_size=2), dict(seq=6)),
    (dict(local_window_size=3), dict(seq=1, past=5, seqlens=[5, 2])),
    (dict(causal=0), dict()),
    (dict(causal=0), dict(seq=1, past=3, seqlens=[3, 2])),
    (dict(softcap=2.0), dict()),
    (dict(softcap=1.5, qk_output=1), dict(attention_bias=(1, 1, SEQ, SEQ))),
    (dict(scale=0.3), dict(attention_bias=(BATCH, Q_HEADS, SEQ, SEQ))),
    (dict(), dict(seq=1, past=3, cache=6, seqlens=[3, 2], total=4,
                  attention_bias=(BATCH, 1, 1, 4))),
    (dict(), dict(head_sink=True)),
    (dict(smooth_softmax=1), dict(seq=1, past=3)),
])
def test_gqa_windows_softcap_bias_and_sinks_match_onnxruntime(attrs, case):
    assert_gqa_matches(gqa_inputs(**case), **attrs)


def test_gqa_padded_queries_in_a_window_see_what_the_last_valid_one_sees():
    """Padding queries of a prompt are onnxruntime's to leave undefined (its two CPU paths
    differ there when a window is set): only the valid ones are compared."""
    inputs = gqa_inputs(seq=6, seqlens=[5, 2])
    assert_gqa_matches(inputs, rows=(1, slice(0, 3)), local_window_size=2)


@pytest.mark.parametrize("attrs, case", [
    (dict(), dict()),
    (dict(rotary_interleaved=1), dict(packed=True)),
    (dict(), dict(head=32)),                              # half the head rotates
    (dict(rotary_interleaved=1), dict(head=32, seq=1, past=3, seqlens=[3, 2])),
    (dict(), dict(seqlens=[SEQ - 1, 1])),
    (dict(), dict(seq=1, past=3, seqlens=[3, 2], position_ids=np.array([[7], [9]]))),
    # on the first prompt, every entry counts from the first position id
    (dict(), dict(position_ids=np.array([[7, 8, 9, 10], [1, 2, 3, 4]]))),
])
def test_gqa_rotary_embeddings_match_onnxruntime(attrs, case):
    inputs = gqa_inputs(rotary=16, **case)
    if inputs["position_ids"] is not None:
        inputs["position_ids"] = inputs["position_ids"].astype(np.int64)
    assert_gqa_matches(inputs, do_rotary=1, **attrs)


@pytest.mark.parametrize("case", [dict(), dict(seq=1, past=3, seqlens=[3, 2], rotary=16)])
def test_gqa_float16_matches_onnxruntime(case, monkeypatch):
    # inputs of their own seed (see the Attention float16 test): with some draws one entry
    # of the rotary case differs from onnxruntime's by ~1.2e-3, past the float16 tolerance
    monkeypatch.setattr(sys.modules[__name__], "rng", np.random.default_rng(11))
    inputs = gqa_inputs(dtype=np.float16, **case)
    assert_gqa_matches(inputs, np.float16, do_rotary=int("rotary" in case))


def test_gqa_shape_rule_on_a_symbolic_model():
    inputs = gqa_inputs(seq=1, past=3, cache=6, total=4)
    hidden = Q_HEADS * GQA_HEAD
    model = contrib_model("GroupQueryAttention", inputs, GQA_OUTPUTS, num_heads=Q_HEADS,
                          kv_num_heads=KV_HEADS, qk_output=1, shapes={
                              "query": ["batch", "seq", hidden],
                              "key": ["batch", "seq", KV_HEADS * GQA_HEAD],
                              "value": ["batch", "seq", KV_HEADS * GQA_HEAD],
                              "past_key": ["batch", KV_HEADS, "cache", GQA_HEAD],
                              "past_value": ["batch", KV_HEADS, "cache", GQA_HEAD],
                              "seqlens_k": ["batch"]})
    types = infer_types(load_graph(model))
    assert types["y"].shape == ("batch", "seq", hidden)
    assert types["present_key"].shape == ("batch", KV_HEADS, None, GQA_HEAD)
    assert types["qk"].shape == ("batch", Q_HEADS, "seq", None)
    outputs = mixrt.Session(model).run(None, feeds_of(inputs))
    assert [o.shape for o in outputs] == [(BATCH, 1, hidden), (BATCH, KV_HEADS, 6, GQA_HEAD),
                                          (BATCH, KV_HEADS, 6, GQA_HEAD), (BATCH, Q_HEADS, 1, 4)]


@pytest.mark.parametrize("change, attrs, expected", [
    (dict(key=randn(BATCH, SEQ, 48)), {}, r"key has shape \(2, 4, 48\); expected \(2, 4, 32\)"),
    (dict(seqlens_k=np.zeros((BATCH, 1), np.int32)), {}, r"seqlens_k has shape \(2, 1\)"),
    (dict(past_key=randn(BATCH, KV_HEADS, 3, GQA_HEAD)), {}, r"come together"),
    (dict(head_sink=randn(3)), {}, r"head_sink has shape \(3,\); expected \(4,\)"),
    ({}, dict(kv_num_heads=3), r"num_heads=4 is not a multiple of kv_num_heads=3"),
    ({}, dict(causal=0, local_window_size=2), r"local_window_size=2 needs causal=1"),
    ({}, dict(do_rotary=1), r"do_rotary=1 needs cos_cache and sin_cache"),
    ({}, dict(k_quant_type="PER_TENSOR"), r"quantized key/value cache is not implemented"),
])
def test_gqa_refuses_operands_that_do_not_fit_naming_the_node(change, attrs, expected):
    inputs = dict(gqa_inputs(), **change)
    attrs = dict(dict(num_heads=Q_HEADS, kv_num_heads=KV_HEADS), **attrs)
    with pytest.raises(GraphError, match=expected) as caught:
        mixrt.Session(contrib_model("GroupQueryAttention", inputs, ["y"], **attrs))
    assert NODE in str(caught.value)


def test_gqa_valid_lengths_past_the_cache_are_refused_when_it_runs():
    inputs = gqa_inputs(seq=1, past=3, seqlens=[3, 7])
    with pytest.raises(ExecutionError, match=rf"{NODE}.*seqlens_k holds \[3, 7\]"):
        run_ours("GroupQueryAttention", inputs, ["y"], num_heads=Q_HEADS, kv_num_heads=KV_HEADS)


# -- RotaryEmbedding --------------------------------------------------------------------------

def rotary_inputs(four_d=False, half=HEAD // 2, position_ids=None, rows=12, dtype=np.float32):
    x = randn(BATCH, SEQ, HEADS * HEAD, dtype=dtype)
    if four_d:  # (batch, heads, seq, head_size)
        x = np.ascontiguousarray(x.reshape(BATCH, SEQ, HEADS, HEAD).transpose(0, 2, 1, 3))
    return dict(input=x, position_ids=np.array([2]) if position_ids is None else position_ids,
                cos_cache=randn(rows, half, dtype=dtype), sin_cache=randn(rows, half, dtype=dtype))


@pytest.mark.parametrize("case, attrs", [
    (dict(), dict(num_heads=HEADS)),
    (dict(), dict()),                                     # heads from the caches' width
    (dict(four_d=True), dict()),
    (dict(), dict(num_heads=HEADS, interleaved=1)),
    (dict(four_d=True, position_ids=np.array([[1, 5, 2, 0], [0, 0, 9, 11]])), dict(interleaved=1)),
    (dict(half=2), dict(num_heads=HEADS, rotary_embedding_dim=4)),
    (dict(half=2, four_d=True), dict(num_heads=HEADS, rotary_embedding_dim=4, interleaved=1)),
    (dict(), dict(num_heads=HEADS, scale=3.0)),           # accepted, and without effect
    (dict(dtype=np.float16), dict(num_heads=HEADS)),
])
def test_rotary_embedding_matches_onnxruntime(case, attrs):
    inputs = rotary_inputs(**case)
    inputs["position_ids"] = inputs["position_ids"].astype(np.int64)
    dtype = inputs["input"].dtype
    ours, theirs = run_both("RotaryEmbedding", inputs, ["y"], dtype, **attrs)
    assert_matches(ours, theirs, dtype)
    if dtype == np.float16:
        np.testing.assert_array_equal(ours[0], theirs[0])  # float32 inside, one rounding


def test_rotary_embedding_refuses_positions_outside_the_caches_when_it_runs():
    inputs = rotary_inputs(position_ids=np.array([9], np.int64))
    with pytest.raises(ExecutionError, match=rf"{NODE}.*positions 9..12 fall outside"):
        run_ours("RotaryEmbedding", inputs, ["y"], num_heads=HEADS)


def test_rotary_embedding_shape_rule_on_a_symbolic_model():
    inputs = rotary_inputs(position_ids=np.zeros((BATCH, SEQ), np.int64))
    model = contrib_model("RotaryEmbedding", inputs, ["y"], num_heads=HEADS, shapes={
        "input": ["batch", "seq", HEADS * HEAD], "position_ids": ["batch", "seq"]})
    assert infer_types(load_graph(model))["y"].shape == ("batch", "seq", HEADS * HEAD)
    assert mixrt.Session(model).run(None, feeds_of(inputs))[0].shape == (BATCH, SEQ, 8)


@pytest.mark.parametrize("change, attrs, expected", [
    (dict(cos_cache=randn(12, 3), sin_cache=randn(12, 3)), dict(num_heads=HEADS),
     r"cos_cache has shape \(12, 3\); expected \(max_seq, 2\)"),
    (dict(sin_cache=randn(12, 3)), dict(num_heads=HEADS), r"cos_cache \(12, 2\) and sin_cache"),
    (dict(position_ids=np.zeros((BATCH, 3), np.int64)), dict(num_heads=HEADS),
     r"position_ids has shape \(2, 3\); expected \(1,\) or \(2, 4\)"),
    (dict(input=randn(BATCH, SEQ)), dict(num_heads=HEADS), r"input has shape \(2, 4\)"),
    ({}, dict(num_heads=3), r"8 features do not split into num_heads=3"),
    ({}, dict(rotary_embedding_dim=4), r"rotary_embedding_dim=4 needs num_heads"),
])
def test_rotary_embedding_refuses_operands_that_do_not_fit_naming_the_node(change, attrs,
                                                                          expected):
    inputs = dict(rotary_inputs(), **change)
    inputs["position_ids"] = inputs["position_ids"].astype(np.int64)
    with pytest.raises(GraphError, match=expected) as caught:
        mixrt.Session(contrib_model("RotaryEmbedding", inputs, ["y"], **attrs))
    assert NODE in str(caught.value)


# -- the GPU ----------------------------------------------------------------------------------

GPU_CASES = [
    ("Attention", lambda: attention_inputs(mask_index("raw_2d", 3), past=3), ["y", "present"],
     dict(num_heads=HEADS, unidirectional=1)),
    ("MultiHeadAttention", lambda: mha_inputs(past=3, mask=key_padding_mask("key_lengths", total=8),
                                              attention_bias=randn(BATCH, 1, SEQ, 8)),
     MHA_OUTPUTS, dict(num_heads=HEADS, unidirectional=1)),
    ("GroupQueryAttention", lambda: gqa_inputs(seq=1, past=3, cache=6, seqlens=[3, 1], total=4,
                                               rotary=16, head_sink=True),
     GQA_OUTPUTS, dict(num_heads=Q_HEADS, kv_num_heads=KV_HEADS, do_rotary=1, qk_output=2,
                       local_window_size=3)),
    ("RotaryEmbedding", lambda: rotary_inputs(position_ids=np.array([[1, 5, 2, 0], [0, 0, 9, 11]])),
     ["y"], dict(num_heads=HEADS, interleaved=1)),
]


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("op_type, make_inputs, outputs, attrs", GPU_CASES,
                         ids=[case[0] for case in GPU_CASES])
def test_the_gpu_computes_what_the_cpu_does(op_type, make_inputs, outputs, attrs):
    inputs = make_inputs()
    if "position_ids" in inputs and inputs["position_ids"] is not None:
        inputs["position_ids"] = inputs["position_ids"].astype(np.int64)
    model = contrib_model(op_type, inputs, outputs, **attrs)
    on_cpu = mixrt.Session(model).run(None, feeds_of(inputs))
    on_gpu = mixrt.Session(model, device="gpu:0").run(None, feeds_of(inputs))
    for name, want, have in zip(outputs, on_cpu, on_gpu):
        assert have.dtype == want.dtype and have.shape == want.shape, name
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5, err_msg=name)
