"""The string kernels' bound calls (ops/text/string.py, contrib_text.py): each makes its
output anew, and the next one reads it as given (``binds(any_inputs=True)``), so a TF-IDF
pipeline's steps are all bound after its first planned run, and give what the kernels give,
run after run, for new texts of new lengths, stopwords that empty a document, and either
case change."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.runtime import run_loop

ort = pytest.importorskip("onnxruntime")

POOL = ["runs", "each", "scores", "users", "clients", "model", "a", "b"]
TEXTS = ["Clients each runs scores users runs each", "the model", "A B a b model", "",
         "users users users", "nothing here", "EACH each Each", "b"]


def _pipeline(tmp_path, case, stopwords) -> str:
    """StringNormalizer -> Tokenizer -> TfIdfVectorizer -> Normalizer, a text classifier's
    front as scikit-learn exports it (one document a run)."""
    normalizer = dict(case_change_action=case, is_case_sensitive=0, locale="C")
    if stopwords:
        normalizer["stopwords"] = stopwords
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["text", "flat"], ["words"]),
         helper.make_node("StringNormalizer", ["words"], ["normal"], **normalizer),
         helper.make_node("Tokenizer", ["normal"], ["tokens"], domain="com.microsoft",
                          mark=0, mincharnum=1, pad_value="#", separators=[" "]),
         helper.make_node("TfIdfVectorizer", ["tokens"], ["counts"], mode="TFIDF",
                          min_gram_length=1, max_gram_length=1, max_skip_count=0,
                          ngram_counts=[0], ngram_indexes=list(range(len(POOL))),
                          pool_strings=POOL, weights=[0.5 + i for i in range(len(POOL))]),
         helper.make_node("Normalizer", ["counts"], ["y"], domain="ai.onnx.ml", norm="L2")],
        "tfidf", [helper.make_tensor_value_info("text", TensorProto.STRING, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("flat", TensorProto.INT64, [1], [-1])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3),
        helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / f"tfidf_{case}_{bool(stopwords)}.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


@pytest.mark.parametrize("case, stopwords", [("LOWER", None), ("UPPER", ["EACH", "The"]),
                                             ("NONE", ["nothing", "here"])])
def test_a_bound_tfidf_pipeline_gives_the_kernels_values_run_after_run(tmp_path, case,
                                                                       stopwords):
    path = _pipeline(tmp_path, case, stopwords)
    session = mixrt.Session(path)
    session.wait_compiled()
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for text in TEXTS * 3:  # the first of each repeats were the plan's first runs
        feed = {"text": np.array([[text]], dtype=object)}
        (got,) = session.run(None, feed)
        (fresh,) = mixrt.Session(path, opt_level=0).run(None, feed)  # the kernels unbound
        np.testing.assert_array_equal(got, fresh)
        if text:  # onnxruntime's Tokenizer refuses an empty document
            np.testing.assert_allclose(got, reference.run(None, feed)[0], rtol=1e-6, atol=0)
    ops = {call[0].node.op_type: call[4][-1] is not None
           for steady in session._steady_runs.values() for arena in steady.plan.pool
           for calls in arena.bound.values() for call in run_loop.each_call(calls)}
    # the Tokenizer and the vectorizer run as one node (ops/text/token_counts.py), which
    # takes the normalizer in too where it has no stopwords; with stopwords a document's
    # length after the normalizer is a per-run value: that plan gives the node no view to
    # write (no ``out``) and places its output by copy, and a step without its view is not
    # bound, so there it takes its full route
    assert "Tokenizer" not in ops and "TfIdfVectorizer" not in ops
    wanted = ("StringNormalizer",) if stopwords else ("TokenCounts",)
    for op in wanted:
        assert ops.get(op), (op, ops)


def test_a_string_normalizers_bad_case_change_is_refused_naming_the_node(tmp_path):
    """The binder leaves an attribute the kernel refuses to the kernel, which says so."""
    path = _pipeline(tmp_path, "TITLE", None)
    with pytest.raises(mixrt.errors.MixrtError, match="case_change_action"):
        mixrt.Session(path).run(None, {"text": np.array([["a"]], dtype=object)})
