"""Hostile regular expressions in a model: each runs in time linear in its input or is
refused when the model loads, naming the node (``ops/text/re2_patterns.py``).

A pattern is part of the model file, and the text it runs over is a request's: a pattern
that backtracks (``(a+)+$`` over ``aaa...a!``) took Python's ``re`` 20 s at 29 characters,
17 times longer for every 4 more. RE2, which the ONNX spec names, has no such patterns."""

from __future__ import annotations

import random
import time

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.errors import GraphError

# patterns that backtrack exponentially (or polynomially, to a high power) in re
CATASTROPHIC = ["(a+)+$", "(a|aa)+$", "(a|a?)+$", "(.*a){12}$", "(a*)*b", "(a+)*b",
                "(x+x+)+y", "(\\w+\\s?)+$", "^(a+)+$", "(a|b|ab)*c", "((a+)+)+$",
                "(a|a)*$", "(\\d+)*x", "([a-z]+)*=", "(a?){25}a{25}",
                # nested counted repetitions: RE2 takes them, and its NFA, which finds the
                # spans of capturing groups, is ~3 ns x ~10,000 instructions a character
                "(.*){1,1000}[bc]", "((a*)*b){1,300}", "(a|aa){1,500}$"]
# RE2's own worst case: a pattern whose automaton has more states than its memory budget
# holds (a position ~1,000 characters back decides), so RE2 runs its NFA over every character
# of the text, in time linear in it but ~5 us a character (1 MB: 5-7 s, onnxruntime alike)
RE2_WORST = ["[ab]*a[ab]{999}c", ".*a.{1000}c"]
# what RE2 refuses, with the words of its reason
REFUSED = {"(a)\\1": "invalid escape", "a(?=b)": "invalid perl operator",
           "(?<=a)b": "invalid perl operator", "(?<!a)b": "invalid perl operator",
           "a*+": "bad repetition operator", "(?>a+)b": "invalid perl operator",
           "(a)(?(1)b|c)": "invalid perl operator", "(?R)": "invalid perl operator",
           "((a{100}){100}){100}": "invalid repetition size", "(": "missing \\)",
           "(.*){1,32000}[bc]": "invalid repetition size",
           "[z-a]": "invalid character class range"}
SIZES = [4 << 10, 64 << 10, 1 << 20]  # characters of hostile text
SECONDS = 1.0  # a run over the largest text, on a 2-core machine running the suite
# and per match a run finds (at most one a character): google-re2's Python layer makes a
# match object for each (~1.7 us), so a text of 1 MB that holds a match every character or
# two (500,000-1,000,000 of them) takes ~1-2 s: linear, not hostile
SECONDS_A_MATCH = 2.5e-6


def _model(node, output_type) -> bytes:
    graph = helper.make_graph(
        [node], "patterns", [helper.make_tensor_value_info("x", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("y", output_type, None)])
    return helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    ).SerializeToString()


def _full_match(pattern: str) -> bytes:
    return _model(helper.make_node("RegexFullMatch", ["x"], ["y"], name="match",
                                   pattern=pattern), TensorProto.BOOL)


def _tokenizer(pattern: str, as_separator: bool = False) -> bytes:
    where = {"separators": [pattern]} if as_separator else {"tokenexp": pattern}
    return _model(helper.make_node("Tokenizer", ["x"], ["y"], name="tokens",
                                   domain="com.microsoft", mark=0, mincharnum=1,
                                   pad_value="#", **where), TensorProto.STRING)


def _texts(*values) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _hostile(size: int) -> list[str]:
    """Texts that send a backtracking engine down every path: a run of what the pattern
    repeats, then a character that makes the whole fail."""
    return ["a" * size + "!", "x" * size + "!", ("ab" * size)[:size] + "!",
            "1" * size + "!", "a " * (size // 2) + "!"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_pattern_that_backtracks_runs_in_linear_time(pattern):
    sessions = [mixrt.Session(_full_match(pattern)), mixrt.Session(_tokenizer(pattern)),
                mixrt.Session(_tokenizer(pattern, as_separator=True))]
    for size in SIZES:
        texts = _texts(*_hostile(size))
        for session in sessions:
            started = time.perf_counter()
            session.run(None, {"x": texts})
            took = time.perf_counter() - started
            most = SECONDS + SECONDS_A_MATCH * size * len(texts)
            assert took < most, f"{pattern!r} over {size} characters took {took:.2f} s"


@pytest.mark.parametrize("pattern", RE2_WORST)
def test_re2s_worst_case_costs_what_it_costs_onnxruntime(pattern):
    texts = _texts("".join(random.Random(1).choice("ab") for _ in range(16 << 10)) + "!")
    for model in (_full_match(pattern), _tokenizer(pattern)):
        took = []
        for session in (mixrt.Session(model), ort.InferenceSession(model)):
            session.run(None, {"x": texts[:0]})  # (both compile their automata lazily)
            started = time.perf_counter()
            session.run(None, {"x": texts})
            took.append(time.perf_counter() - started)
        assert took[0] < 2 * took[1] + 0.1, f"{pattern!r}: {took[0]:.2f} s, onnxruntime's " \
            f"{took[1]:.2f} s"


def test_what_the_runs_answer_over_hostile_text_is_what_they_should():
    matched, = mixrt.Session(_full_match("(a+)+$")).run(
        None, {"x": _texts("a" * 4096 + "!", "a" * 4096, "")})
    assert matched.tolist() == [False, True, False]
    tokens, = mixrt.Session(_tokenizer("(a+)+$")).run(
        None, {"x": _texts("a" * 64 + "!", "b" + "a" * 64)})
    assert tokens.tolist() == [["#"], ["a" * 64]]


@pytest.mark.parametrize("pattern", REFUSED)
@pytest.mark.parametrize("model", [_full_match, _tokenizer])
def test_a_pattern_re2_refuses_is_refused_at_load_naming_the_node(pattern, model):
    reason = REFUSED[pattern]
    with pytest.raises(GraphError, match=f"node '(match|tokens)'.*RE2 accepts: {reason}"):
        mixrt.Session(model(pattern))


# -- a fuzz of the string operators' patterns ------------------------------------------------

ATOMS = ["a", "b", "ab", ".", "\\w", "\\d", "\\s", "[ab]", "[^a]", "[a-c]", "\\b", "^", "$",
         "x", "é", "\\pL", "[[:alpha:]]", "(?i)A"]
QUANTIFIERS = ["", "", "*", "+", "?", "{2}", "{1,3}", "*?", "+?", "{,2}"]


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    """A random RE2 pattern: atoms, groups nested up to three deep under any quantifier,
    alternations, and now and then something RE2 refuses (``(?=``, ``\\1``, ``*+``)."""
    parts = []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.25 and depth < 3:
            body = "|".join(_random_pattern(rng, depth + 1)
                            for _ in range(rng.randint(1, 3)))
            part = f"({body})"
        elif roll < 0.28:
            part = rng.choice(["(?=a)", "\\1", "a*+", "(?<=b)"])
        else:
            part = rng.choice(ATOMS)
        parts.append(part + rng.choice(QUANTIFIERS))
    return "".join(parts)


def _random_text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice("aab xé1!\n") for _ in range(size))


def _onnxruntime(model: bytes):
    try:
        return ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001  (its own Fail or InvalidGraph: refused there too)
        return None


@pytest.mark.parametrize("seed", range(4))
def test_random_patterns_finish_in_time_and_answer_as_onnxruntime(seed):
    rng = random.Random(seed)
    for _ in range(25):
        pattern = _random_pattern(rng)
        texts = _texts(*(_random_text(rng, rng.choice([0, 3, 40, 4096])) for _ in range(4)))
        for model in (_full_match(pattern), _tokenizer(pattern)):
            reference = _onnxruntime(model)
            try:
                session = mixrt.Session(model)
            except GraphError as error:
                assert "RE2 accepts" in str(error)
                assert reference is None, f"onnxruntime runs {pattern!r}; mixrt refused it"
                continue
            started = time.perf_counter()
            found, = session.run(None, {"x": texts})
            assert time.perf_counter() - started < SECONDS, pattern
            if reference is not None:
                expected, = reference.run(None, {"x": texts})
                assert found.tolist() == expected.tolist(), pattern
