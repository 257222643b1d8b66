"""com.microsoft Tokenizer against onnxruntime: separators, tokenexp (RE2, leftmost-longest),
character mode, marks, padding, mincharnum, empty strings and empty inputs, bad attributes
and patterns; then the graphs skl2onnx writes for CountVectorizer and TfidfVectorizer, built
here by hand (scikit-learn is not needed)."""

from __future__ import annotations

import random
import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt.errors import ExecutionError, GraphError
from mixrt.ops import REGISTRY
from mixrt.ops.text.re2_patterns import Re2Pattern
from mixrt.ops.ir.types import TensorType

IR_VERSION = 8
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
          helper.make_opsetid("ai.onnx.ml", 1)]
PLAIN = {"mark": 0, "mincharnum": 1, "pad_value": "#"}
MARKED = {"mark": 1, "mincharnum": 1, "pad_value": "#"}


def _tokenizer_model(dims=None, **attributes) -> bytes:
    node = helper.make_node("Tokenizer", ["text"], ["tokens"], name="tok",
                            domain="com.microsoft", **attributes)
    graph = helper.make_graph([node], "tokenize",
                              [helper.make_tensor_value_info("text", TensorProto.STRING, dims)],
                              [helper.make_tensor_value_info("tokens", TensorProto.STRING,
                                                             None)])
    return helper.make_model(graph, opset_imports=OPSETS,
                             ir_version=IR_VERSION).SerializeToString()


def _strings(values) -> np.ndarray:
    array = np.empty(np.shape(values), dtype=object)
    array[...] = values
    return array


def _onnxruntime(model: bytes, feeds: dict) -> list:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def _assert_like_onnxruntime(texts, **attributes) -> np.ndarray:
    model, feeds = _tokenizer_model(**attributes), {"text": _strings(texts)}
    expected = _onnxruntime(model, feeds)[0]
    found = mixrt.Session(model).run(None, feeds)[0]
    assert found.dtype == object
    assert found.shape == expected.shape
    assert found.tolist() == expected.tolist()
    return found


# -- against onnxruntime ------------------------------------------------------------------

CASES = {
    "space separator": (["Hello World", "I love computer science !"], {"separators": [" "]}),
    "separators in turn": (["a-b c-d", "x--y"], {"separators": [" ", "-"]}),
    "skl2onnx separators": (["the cat's hat, the bat. ok?", "a;b:c!"],
                            {"separators": [" ", "[.]", "\\?", ",", ";", ":", "\\!"]}),
    "regex separator": (["a1b22c333d", "9"], {"separators": ["[0-9]+"]}),
    "token expression": (["abc ef zoo", "abc,d", "ab/e"], {"tokenexp": "[a-c]+"}),
    "skl2onnx default": (["Hello, World_42! héllo", ""], {"tokenexp": "[a-zA-Z0-9_]+"}),
    "two-letter words": (["one two  three", "a bb ccc dddd"], {"tokenexp": "\\w\\w+"}),
    "characters by separator": (["héllo wörld", "ab", "a\nb"], {"separators": [""]}),
    "characters by dot": (["héllo wörld", "ab", "a\nb"], {"tokenexp": "."}),
    "leftmost longest": (["abcd", "ab ab"], {"tokenexp": "a|ab|abc"}),
    "longest separator": (["abcd", "xbcx"], {"separators": ["b|bc"]}),
    "lazy is longest": (["aaab"], {"tokenexp": "a+?"}),
    "groups longest": (["abcabc", "abab"], {"tokenexp": "(ab|abc)(c|)"}),
    "ascii word class": (["héllo wörld_x", "aéb"], {"tokenexp": "\\w+"}),
    "ascii space class": (["a\vb c\td\ne"], {"separators": ["\\s"]}),
    "end of text": (["ab\n", "ab", "x ab\n"], {"tokenexp": "b$|(a|ab)$"}),
    "word boundary": (["ab ab", "cab"], {"tokenexp": "\\bab"}),
    "boundary after alternation": (["ab ab"], {"tokenexp": "(a|ab)\\b"}),
    "posix classes": (["a_b-c1", "Z9"], {"tokenexp": "[[:alpha:]]+|[[:^alnum:]]"}),
    "case folding": (["ÉCOLE école Ecole"], {"tokenexp": "(?i)école"}),
    "flag in mid-pattern": (["aB ab AB", "Ab"], {"tokenexp": "a(?i)b"}),
    "quoted text": (["a.b axb"], {"tokenexp": "\\Qa.\\E"}),
    "braced code point": (["AaA"], {"tokenexp": "\\x{41}+"}),
    "brace comma is text": (["a{,2}ab"], {"tokenexp": "a{,2}"}),
    "named group": (["ab"], {"tokenexp": "(?<n>a)b"}),
    "unicode class": (["héllo wörld 12", "ÉCOLE"], {"tokenexp": "\\pL+"}),
    "nested quantifier": (["aaaa!", "a" * 40 + "!"], {"tokenexp": "(a+)+$"}),
    "empty matches": (["ab", "x"], {"tokenexp": "x*"}),
    "end or letter": (["ab", "x"], {"tokenexp": "\\z|b"}),
    "empty separator matches": (["ab", "aab b", "", "ba"], {"separators": ["b*"]}),
    "optional separator": (["ab", "aab b", "", "ba"], {"separators": ["(a|)"]}),
    "empty and all-separator strings": (["", "  ", ""], {"separators": [" "]}),
    "2-D input": ([["abc ef", "x"], ["", "d e f g"]], {"tokenexp": "[a-z]+"}),
}


@pytest.mark.parametrize("marks", [PLAIN, MARKED], ids=["plain", "marked"])
@pytest.mark.parametrize("name", CASES)
def test_tokenizer_matches_onnxruntime(name, marks):
    texts, attributes = CASES[name]
    _assert_like_onnxruntime(texts, **marks, **attributes)


@pytest.mark.parametrize("mincharnum", [2, 3])
def test_mincharnum_drops_short_tokens_as_onnxruntime_does(mincharnum):
    """A token expression's match that is too short is skipped one character on, so a
    match inside it can count; a separator's short pieces are dropped."""
    texts = ["ab cdef g hij", "foo bar foobar baz", "a,,bb,ccc"]
    for attributes in ({"tokenexp": "[a-z]+"}, {"tokenexp": "foo|foobar|ba"},
                       {"separators": [","]}, {"separators": [" ", "o"]}):
        _assert_like_onnxruntime(texts, mark=1, mincharnum=mincharnum, pad_value="<pad>",
                                 **attributes)


def test_marks_and_padding_sit_where_onnxruntime_puts_them():
    found = _assert_like_onnxruntime(["a b c", "d"], separators=[" "], mark=1, mincharnum=1,
                                     pad_value="PAD")
    assert found.tolist() == [["\x02", "a", "b", "c", "\x03"],
                              ["\x02", "d", "\x03", "PAD", "PAD"]]


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3)])
def test_empty_inputs_give_onnxruntime_s_empty_shapes(shape):
    found = _assert_like_onnxruntime(np.empty(shape, dtype=object), tokenexp="[a-z]+",
                                     **MARKED)
    assert found.shape == ((0,) if len(shape) == 1 else (shape[0], 0))


def test_no_token_anywhere_gives_a_last_axis_of_zero_without_marks():
    found = _assert_like_onnxruntime([["", "  "], ["", " "]], separators=[" "], **MARKED)
    assert found.shape == (2, 2, 0)


def test_random_strings_and_patterns_match_onnxruntime():
    """Patterns where re's first match is the longest and where it is not, empty-matching
    ones, several separators, mincharnum and marks, on strings of a small alphabet."""
    patterns = ["[a-z]+", "\\w+", "a|ab|abc", "b*", "a?", "\\s+", "[ ,.]", "(ab|a)(c|bc)?",
                "\\bb", "b\\b", "(?i)a+", "a+?b", "..", "[^ ]+", "(a|b)*", "é+", "\\d+|\\w",
                "^a", "a$|b", "(a|ab)(b|)"]
    rng = random.Random(7)
    for _ in range(40):
        attributes = {"mark": rng.randint(0, 1), "mincharnum": rng.choice([1, 1, 2, 3]),
                      "pad_value": "#"}
        if rng.random() < 0.5:
            attributes["tokenexp"] = rng.choice(patterns)
        else:
            attributes["separators"] = rng.sample(patterns, rng.randint(1, 2))
        texts = ["".join(rng.choice("ab cé1,.\nA") for _ in range(rng.randint(0, 9)))
                 for _ in range(6)]
        _assert_like_onnxruntime(np.reshape(_strings(texts), rng.choice([(6,), (2, 3)])),
                                 **attributes)


def test_tokenexpsplit_cuts_at_the_expression_like_a_separator():
    """onnxruntime's schema has no tokenexpsplit (it refuses a model that sets it); mixrt
    reads it as mlprodict's runtime does: tokenexp then separates instead of matching."""
    texts = _strings(["abc ef zoo", "abc,d", "ab/e"])
    split = _tokenizer_model(tokenexp="[a-c]+", tokenexpsplit=1, **MARKED)
    as_separator = _tokenizer_model(separators=["[a-c]+"], **MARKED)
    found = mixrt.Session(split).run(None, {"text": texts})[0]
    assert found.tolist() == _onnxruntime(as_separator, {"text": texts})[0].tolist()
    assert found.tolist() == [["\x02", " ef zoo", "\x03"], ["\x02", ",d", "\x03"],
                              ["\x02", "/e", "\x03"]]
    with pytest.raises(Exception, match="Unrecognized attribute: tokenexpsplit"):
        _onnxruntime(split, {"text": texts})


def test_tokens_run_on_a_graph_input_of_unknown_batch():
    model = _tokenizer_model(dims=["N"], tokenexp="[a-z]+", **PLAIN)
    session = mixrt.Session(model)
    for batch in (1, 4):
        texts = _strings([f"w{i} x y"[: 3 + i] for i in range(batch)])
        assert session.run(None, {"text": texts})[0].tolist() == \
            _onnxruntime(model, {"text": texts})[0].tolist()


# -- shape rule ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape, expected", [((3,), (3, None)), (("N", 2), ("N", 2, None)),
                                             ((0,), (0,)), (("N", 0), ("N", 0)),
                                             (None, None)])
def test_shape_rule(shape, expected):
    infer = REGISTRY.find("com.microsoft", "Tokenizer", 1).infer_fn
    out, = infer(TensorType(np.dtype(object), shape), tokenexp="[a-z]+", **PLAIN)
    assert out.dtype == np.dtype(object) and out.shape == expected


# -- bad attributes and patterns ------------------------------------------------------------

BAD_ATTRIBUTES = {
    "no mark": ({"mincharnum": 1, "pad_value": "#", "tokenexp": "a"}, "mark"),
    "no pad_value": ({"mark": 0, "mincharnum": 1, "tokenexp": "a"}, "pad_value"),
    "mincharnum 0": ({**PLAIN, "mincharnum": 0, "tokenexp": "a"}, "mincharnum is 0"),
    "nothing to cut by": (PLAIN, "separators or a non-empty tokenexp"),
    "empty tokenexp": ({**PLAIN, "tokenexp": ""}, "separators or a non-empty tokenexp"),
    "characters of 2": ({**PLAIN, "mincharnum": 2, "tokenexp": "."}, "mincharnum 2"),
    "lookahead": ({**PLAIN, "tokenexp": "a(?=b)"}, "RE2 accepts: invalid perl operator"),
    "backreference": ({**PLAIN, "tokenexp": "(a)\\1"}, "RE2 accepts: invalid escape"),
    "python flag": ({**PLAIN, "tokenexp": "(?u)\\w+"}, "\\(\\?u"),
    "unbalanced": ({**PLAIN, "separators": ["("]}, "RE2 accepts: missing \\)"),
    "possessive": ({**PLAIN, "tokenexp": "a++"}, "RE2 accepts: bad repetition"),
}


@pytest.mark.parametrize("name", BAD_ATTRIBUTES)
def test_what_onnxruntime_refuses_is_an_error_naming_the_node(name):
    attributes, message = BAD_ATTRIBUTES[name]
    with pytest.raises(Exception):  # noqa: B017 (onnxruntime raises its own Fail)
        _onnxruntime(_tokenizer_model(**attributes), {"text": _strings(["ab"])})
    for dims in ([1], ["N"], None):  # refused at load, whatever inference knows of shapes
        with pytest.raises(GraphError, match=f"node 'tok'.*{message}"):
            mixrt.Session(_tokenizer_model(dims=dims, **attributes))


def test_a_rank_3_input_is_an_error_naming_the_node():
    model = _tokenizer_model(tokenexp="a", **PLAIN)
    with pytest.raises(ExecutionError, match=r"node 'tok'.*\[C\] or \[N, C\].*rank 3"):
        mixrt.Session(model).run(None, {"text": _strings([[["a"]]])})


# -- the RE2 reading on its own -------------------------------------------------------------

def test_the_longest_match_is_found_where_a_backtracking_engine_stops_early():
    assert Re2Pattern("a|ab|abc").search("xabcd", 0) == (1, 4)
    assert Re2Pattern("(a|ab)\\b").search("ab a", 0) == (0, 2)
    assert Re2Pattern("x*").search("ab", 1) == (1, 1)


def test_what_the_fast_paths_ask_of_a_pattern():
    assert not Re2Pattern("[a-z]+").matches_empty and Re2Pattern("[a-z]+").context_free
    assert Re2Pattern("x*").matches_empty and Re2Pattern("\\b").matches_empty
    assert not Re2Pattern("\\bab").context_free
    assert Re2Pattern("\\pL+").matches_empty  # re cannot read it: the cautious answer
    assert not Re2Pattern("\\pL+").context_free


# -- skl2onnx's vectorizers -----------------------------------------------------------------

def _vectorizer_model(vocabulary: dict, ngram_range: tuple, tokenizer: dict,
                      idf: np.ndarray | None = None, lowercase: bool = True) -> bytes:
    """The graph skl2onnx writes for CountVectorizer (``idf`` None) or TfidfVectorizer
    (``idf`` the fitted weights, norm l2): Reshape [-1], StringNormalizer, Tokenizer,
    Flatten, TfIdfVectorizer in TF mode, then Mul by idf and an L2 Normalizer."""
    split = sorted((tuple(word.split(" ")) if tokenizer.get("tokenexp") != "." else
                    tuple(word), index) for word, index in vocabulary.items())
    split.sort(key=lambda item: (len(item[0]), item[0], item[1]))
    pool = [token for gram, _ in split for token in gram]
    counts = [0] * ngram_range[0]
    for i in range(1, len(split)):
        if len(split[i - 1][0]) != len(split[i][0]):
            counts.append(sum(len(g) for g, _ in split[:i]))
    nodes = [helper.make_node("Reshape", ["text", "flat_shape"], ["flattened"]),
             helper.make_node("StringNormalizer", ["flattened"], ["normalized"],
                              case_change_action="LOWER", is_case_sensitive=int(not lowercase),
                              locale=LOCALE),
             helper.make_node("Tokenizer", ["normalized"], ["tokenized"], name="Tokenizer",
                              domain="com.microsoft", **tokenizer),
             helper.make_node("Flatten", ["tokenized"], ["flat_tokens"]),
             helper.make_node("TfIdfVectorizer", ["flat_tokens"], ["counts"],
                              min_gram_length=ngram_range[0], max_gram_length=ngram_range[1],
                              mode="TF", max_skip_count=0, pool_strings=pool,
                              ngram_indexes=[index for _, index in split], ngram_counts=counts,
                              weights=[1.0] * len(split))]
    initializers = [numpy_helper.from_array(np.array([-1], np.int64), "flat_shape")]
    output = "counts"
    if idf is not None:
        initializers.append(numpy_helper.from_array(idf.astype(np.float32), "idfcst"))
        nodes += [helper.make_node("Mul", ["counts", "idfcst"], ["weighted"]),
                  helper.make_node("Normalizer", ["weighted"], ["normed"], norm="L2",
                                   domain="ai.onnx.ml")]
        output = "normed"
    nodes.append(helper.make_node("Identity", [output], ["variable"]))
    graph = helper.make_graph(
        nodes, "vectorizer",
        [helper.make_tensor_value_info("text", TensorProto.STRING, [None, 1])],
        [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, len(split)])],
        initializers)
    return helper.make_model(graph, opset_imports=OPSETS,
                             ir_version=IR_VERSION).SerializeToString()


CORPUS = _strings([["The cat sat on the mat."], ["The dog ate my homework!"],
                   ["Is this the first document?"], ["cat, dog: the cat"], [""]])
WORDS = {"the": 0, "cat": 1, "sat": 2, "on": 3, "mat": 4, "dog": 5, "ate": 6, "my": 7,
         "homework": 8, "is": 9, "this": 10, "first": 11, "document": 12, "the cat": 13,
         "cat sat": 14, "the dog": 15, "dog the": 16}
# skl2onnx's locale option: onnxruntime's StringNormalizer builds the locale it is given,
# en_US.UTF-8 when none is, which a machine without that language pack lacks
LOCALE = "C"
SKL2ONNX_WORD = {"pad_value": "#", "mark": 0, "mincharnum": 1, "tokenexp": "[a-zA-Z0-9_]+"}


def _assert_vectorizer_like_onnxruntime(model: bytes, texts=CORPUS) -> np.ndarray:
    expected = _onnxruntime(model, {"text": texts})[0]
    found = mixrt.Session(model).run(None, {"text": texts})[0]
    np.testing.assert_allclose(found, expected, rtol=1e-6, atol=1e-7)
    return found


def test_count_vectorizer_as_skl2onnx_writes_it():
    counts = _assert_vectorizer_like_onnxruntime(_vectorizer_model(WORDS, (1, 2),
                                                                   SKL2ONNX_WORD))
    assert counts.shape == (5, len(WORDS))
    assert counts[3, WORDS["cat"]] == 2 and counts[3, WORDS["the cat"]] == 1
    assert counts[3, WORDS["dog the"]] == 1 and not counts[4].any()


def test_tfidf_vectorizer_as_skl2onnx_writes_it():
    idf = np.linspace(1.0, 2.5, len(WORDS))
    found = _assert_vectorizer_like_onnxruntime(_vectorizer_model(WORDS, (1, 2),
                                                                  SKL2ONNX_WORD, idf))
    np.testing.assert_allclose(np.linalg.norm(found[:4], axis=1), 1, rtol=1e-6)


def test_vectorizer_with_separators_instead_of_a_token_expression():
    tokenizer = {"pad_value": "#", "mark": 0, "mincharnum": 1,
                 "separators": [" ", "[.]", "\\?", ",", ";", ":", "\\!"]}
    _assert_vectorizer_like_onnxruntime(_vectorizer_model(WORDS, (1, 2), tokenizer))


def test_char_count_vectorizer_as_skl2onnx_writes_it():
    chars = {c: i for i, c in enumerate(["a", "c", "t", " ", "ca", "at", "t "])}
    tokenizer = {"pad_value": "#", "mark": 0, "mincharnum": 1, "tokenexp": "."}
    counts = _assert_vectorizer_like_onnxruntime(_vectorizer_model(chars, (1, 2), tokenizer))
    assert counts[0, chars["at"]] == 3  # "the cat sat on the mat."


def test_vectorizer_runs_one_document_and_many():
    model = _vectorizer_model(WORDS, (1, 2), SKL2ONNX_WORD, np.ones(len(WORDS)))
    _assert_vectorizer_like_onnxruntime(model, CORPUS[:1])
    _assert_vectorizer_like_onnxruntime(model, _strings([[s] for s in CORPUS[:, 0]] * 20))


def test_the_plain_patterns_re_runs_match_as_re2_does():
    """A fixed run of single characters with a greedy last one (\\b before it, or after a last
    \\w+) runs on re (re.ASCII), which must find RE2's leftmost-longest matches: random such
    patterns over random texts."""
    import re2  # noqa: PLC0415

    rng = random.Random(5)
    items = ["a", "b", "é", "-", " ", "\\.", "\\-", "\\w", "\\W", "\\d", "\\D", "[a-c]",
             "[^ ]", "[\\w.]", "[^\\d]", "[ -/]", "x", "\\\\", "w", "\\s", "\\S",
             "[^\\s,.]", "[a\\s]"]
    options = re2.Options()
    options.longest_match = True
    for _ in range(300):
        pattern = rng.choice(["", "", "\\b"])
        pattern += "".join(rng.choice(items) for _ in range(rng.randint(1, 3)))
        pattern += rng.choice(["", "+", "\\w+\\b"])
        compiled = Re2Pattern(pattern)
        assert compiled.regex.__class__ is re.Pattern, pattern  # the plain path
        reference = re2.compile(pattern, options)
        for _ in range(5):
            text = "".join(rng.choice("abx-. é1_\n\v\t\fZ\\w") for _ in range(rng.randint(0, 30)))
            assert compiled.spans(text) == [m.span() for m in reference.finditer(text)], \
                (pattern, text)
            assert compiled.fullmatch(text) == (reference.fullmatch(text) is not None)
