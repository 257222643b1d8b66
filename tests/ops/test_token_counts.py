"""``mixrt::TokenCounts`` (ops/text/token_counts.py) and its fusion
(runtime/passes/fuse_token_counts.py): a Tokenizer whose tokens only a TfIdfVectorizer
counts becomes one node, which gives the two nodes' bits (opt_level 0 runs them as
imported) and onnxruntime's values, for batches counted row by row and all at once, with
the padding counted where the pad value is a pool entry, non-ASCII texts and texts
holding a NUL; chains it must not fuse are left as they are."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.ops.text.re2_patterns import compiled

ort = pytest.importorskip("onnxruntime")

POOL = ["runs", "each", "scores", "users", "clients", "model", "a", "b", "#", "é"]
WORDS = ["runs", "each", "scores", "users", "clients", "model", "a", "b", "the", "x_1", "é"]


def _model(tmp_path, *, flatten=True, two_d=False, mark=0, max_gram=1, mode="TFIDF",
           tokens_out=False, tokenexp="[a-zA-Z0-9_]+", separators=None) -> str:
    """Tokenizer -> [Flatten] -> TfIdfVectorizer over texts [N] (or [N, 2])."""
    cut = dict(separators=separators) if separators else dict(tokenexp=tokenexp)
    nodes = [helper.make_node("Tokenizer", ["text"], ["tokens"], domain="com.microsoft",
                              mark=mark, mincharnum=1, pad_value="#", **cut)]
    if flatten:
        nodes.append(helper.make_node("Flatten", ["tokens"], ["flat"], axis=1))
    pool = POOL if max_gram == 1 else POOL + ["each", "runs"]
    counts = [0, len(POOL)] if max_gram == 2 else [0]
    nodes.append(helper.make_node(
        "TfIdfVectorizer", ["flat" if flatten else "tokens"], ["y"], mode=mode,
        min_gram_length=1, max_gram_length=max_gram, max_skip_count=0, ngram_counts=counts,
        ngram_indexes=list(range(len(POOL) + (max_gram == 2))), pool_strings=pool,
        weights=[0.5 + i for i in range(len(POOL) + (max_gram == 2))]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if tokens_out:
        outputs.append(helper.make_tensor_value_info("tokens", TensorProto.STRING, None))
    shape = [None, 2] if two_d else [None]
    graph = helper.make_graph(nodes, "counts",
                              [helper.make_tensor_value_info("text", TensorProto.STRING, shape)],
                              outputs)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "counts.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def _texts(rng, count: int, two_d: bool) -> np.ndarray:
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(0, 12))) + rng.choice(["", ".", " !"])
             for _ in range(count * (2 if two_d else 1))]
    return np.array(texts, dtype=object).reshape((count, 2) if two_d else (count,))


def _op_types(session) -> list[str]:
    return [step.node.op_type for step in session._bound.nodes]


@pytest.mark.parametrize("two_d, flatten", [(False, True), (True, True), (False, False)],
                         ids=["[N]", "[N, 2]", "[N] unflattened"])  # (rank 3: not a model)
@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
def test_token_counts_give_the_two_nodes_bits(tmp_path, two_d, flatten, mode):
    path = _model(tmp_path, flatten=flatten, two_d=two_d, mode=mode)
    fused, plain = mixrt.Session(path), mixrt.Session(path, opt_level=0)
    assert _op_types(fused) == ["TokenCounts"] and "Tokenizer" in _op_types(plain)
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(len(path) + two_d + 2 * flatten)
    for count in (1, 2, 3, 7, 8, 20, 1, 20):  # row by row and all at once, then bound
        text = _texts(rng, count, two_d)
        (got,), (want,) = fused.run(None, {"text": text}), plain.run(None, {"text": text})
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, reference.run(None, {"text": text})[0], rtol=1e-6)


def test_the_padding_counts_where_the_pad_value_is_a_pool_entry(tmp_path):
    """'#' is in the pool: each text shorter than the batch's longest counts its padding."""
    path = _model(tmp_path)
    fused, plain = mixrt.Session(path), mixrt.Session(path, opt_level=0)
    for texts in (["a", "a b runs each users"], ["a"] * 3 + ["b b b b b b b b"] * 6):
        text = np.array(texts, dtype=object)
        (got,), (want,) = fused.run(None, {"text": text}), plain.run(None, {"text": text})
        np.testing.assert_array_equal(got, want)
        assert got[0, POOL.index("#")] > 0


@pytest.mark.parametrize("texts", [["été model a", "é é b"] * 5, ["a\x00b runs", "each"] * 5,
                                   ["", ""] * 5, ["!!", "..."] * 5],
                         ids=["non-ASCII", "NUL", "empty", "no tokens"])
def test_texts_the_joined_cut_cannot_take_are_cut_one_by_one(tmp_path, texts):
    path = _model(tmp_path)
    fused, plain = mixrt.Session(path), mixrt.Session(path, opt_level=0)
    text = np.array(texts, dtype=object)
    (got,), (want,) = fused.run(None, {"text": text}), plain.run(None, {"text": text})
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("change", [dict(mark=1), dict(max_gram=2), dict(tokens_out=True)],
                         ids=["marks", "bigrams", "tokens an output"])
def test_chains_the_fused_op_cannot_count_are_left_alone(tmp_path, change):
    path = _model(tmp_path, **change)
    session = mixrt.Session(path)
    assert "TokenCounts" not in _op_types(session) and "Tokenizer" in _op_types(session)


def test_separators_cut_as_the_tokenizer_cuts(tmp_path):
    path = _model(tmp_path, separators=[" ", "[.!]"])
    fused, plain = mixrt.Session(path), mixrt.Session(path, opt_level=0)
    assert _op_types(fused) == ["TokenCounts"]
    text = _texts(np.random.default_rng(3), 12, False)
    np.testing.assert_array_equal(fused.run(None, {"text": text})[0],
                                  plain.run(None, {"text": text})[0])


@pytest.mark.parametrize("pattern, runs", [("[a-zA-Z0-9_]+", True), (r"\w+", True),
                                           (r"\d+", True), (r"\b\w\w+\b", False),
                                           ("[a-z ]+", False), (r"\S+", False),
                                           ("[^ ]+", False), ("[a-z]", False)])
def test_a_class_repeated_cuts_many_texts_at_once_as_its_matches(pattern, runs):
    """Re2Pattern.runs_of: the longest runs of one class, the same as the matches one by
    one; no such table for any other pattern (a run that may hold whitespace, a single
    character, a boundary)."""
    found = compiled(pattern)
    texts = ["Hello wor_ld 12,x", "a-b  c\td", "", "x" * 50, "9 8.7"]
    if not runs:
        assert found.runs_of(texts) is None
        return
    assert found.runs_of(texts) == [found.token_finder()(text) for text in texts]
    assert found.runs_of(["é b"]) is None and found.runs_of(["a\x00b"]) is None


def test_a_batch_of_no_texts_is_refused_as_onnxruntime_refuses_it(tmp_path):
    path = _model(tmp_path)
    for session in (mixrt.Session(path), mixrt.Session(path, opt_level=0)):
        with pytest.raises(mixrt.errors.ExecutionError, match="B > 0"):
            session.run(None, {"text": np.array([], dtype=object)})


def _normalized_model(tmp_path, case: str, stopwords=None, two_d=False) -> str:
    """StringNormalizer -> Tokenizer -> Flatten -> TfIdfVectorizer, as skl2onnx writes a
    lowercasing vectorizer, over texts [C] (or [1, C])."""
    normalizer = dict(case_change_action=case, is_case_sensitive=0, locale="C")
    if stopwords:
        normalizer["stopwords"] = stopwords
    graph = helper.make_graph(
        [helper.make_node("StringNormalizer", ["text"], ["normal"], **normalizer),
         helper.make_node("Tokenizer", ["normal"], ["tokens"], domain="com.microsoft",
                          mark=0, mincharnum=1, pad_value="#", tokenexp="[a-zA-Z0-9_]+"),
         helper.make_node("Flatten", ["tokens"], ["flat"], axis=1),
         helper.make_node("TfIdfVectorizer", ["flat"], ["y"], mode="TF",
                          min_gram_length=1, max_gram_length=1, max_skip_count=0,
                          ngram_counts=[0], ngram_indexes=list(range(len(POOL))),
                          pool_strings=POOL)],
        "normalized", [helper.make_tensor_value_info(
            "text", TensorProto.STRING, None if two_d is None else [1, None] if two_d
            else [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / f"normalized_{case}.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


@pytest.mark.parametrize("two_d", [False, True], ids=["[C]", "[1, C]"])
@pytest.mark.parametrize("case", ["LOWER", "UPPER", "NONE"])
def test_a_case_change_before_the_tokenizer_is_taken_in(tmp_path, case, two_d):
    path = _normalized_model(tmp_path, case, two_d=two_d)
    fused, plain = mixrt.Session(path), mixrt.Session(path, opt_level=0)
    assert _op_types(fused) == ["TokenCounts"]
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for count in (1, 3, 12, 0):  # no texts: the normalizer's one empty text, one row
        text = np.array([t.title() for t in _texts(rng, count, False)], dtype=object)
        text = text.reshape((1, count) if two_d else (count,))
        (got,), (want,) = fused.run(None, {"text": text}), plain.run(None, {"text": text})
        np.testing.assert_array_equal(got, want)
        if count:
            np.testing.assert_allclose(got, reference.run(None, {"text": text})[0])
    any_rank = _normalized_model(tmp_path, case, two_d=None)  # the normalizer's own refusal
    for session in (mixrt.Session(any_rank), mixrt.Session(any_rank, opt_level=0)):
        with pytest.raises(mixrt.errors.MixrtError, match=r"\[C\] or \[1, C\]"):
            session.run(None, {"text": np.array([["a"], ["b"]], dtype=object)})


def test_a_normalizer_with_stopwords_stays_a_node_of_its_own(tmp_path):
    path = _normalized_model(tmp_path, "LOWER", stopwords=["each"])
    assert _op_types(mixrt.Session(path)) == ["StringNormalizer", "TokenCounts"]


@pytest.mark.parametrize("case", [None, "LOWER"])
def test_an_optimized_graph_exports_its_token_counts_as_the_standard_nodes(tmp_path, case):
    """exporters/decompose.py writes the node back as [StringNormalizer ->] Tokenizer ->
    Flatten -> TfIdfVectorizer, which onnxruntime runs to the same values."""
    from mixrt.exporters.onnx import export_model

    path = _model(tmp_path, flatten=False) if case is None else _normalized_model(tmp_path, case)
    session = mixrt.Session(path)
    assert _op_types(session) == ["TokenCounts"]
    model = export_model(session.graph)
    assert [n.op_type for n in model.graph.node] == (["StringNormalizer"] if case else []) + [
        "Tokenizer", "Flatten", "TfIdfVectorizer"]
    exported = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
    text = _texts(np.random.default_rng(11), 9, False)
    np.testing.assert_allclose(exported.run(None, {"text": text})[0],
                               session.run(None, {"text": text})[0], rtol=1e-6)
