"""onnxruntime's text operator in the com.microsoft domain: Tokenizer.

skl2onnx writes ``TfidfVectorizer`` and ``CountVectorizer`` as StringNormalizer, then this
Tokenizer, then the standard TfIdfVectorizer. Its results follow onnxruntime's kernel
(``contrib_ops/cpu/tokenizer.cc``) to the character, quirks included; its patterns are RE2's,
run on RE2 itself for leftmost-longest matches (``ops/text/re2_patterns.py``).

Strings live on the host whatever the device (no GPU array library holds them), as in
``ops/text/string.py``.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.base import run_options
from mixrt.ops.compiled.bound_calls import binds
from mixrt.ops.text.re2_patterns import Subject, compiled
from mixrt.ops.text.string import object_strings
from mixrt.ops.ir.dtypes import STRING
from mixrt.ops.ir.node_state import prepared
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import to_host

MICROSOFT = "com.microsoft"
START_OF_TEXT, END_OF_TEXT = "\x02", "\x03"  # the marks ``mark=1`` puts around each row
OBJECT = np.dtype(object)


# -- the three ways to cut a string -------------------------------------------------------

def _characters(text: str) -> list[str]:
    return list(text)


def _matches(text: str, pattern, mincharnum: int) -> list[str]:
    """The tokens ``tokenexp`` matches, scanning left to right. A match shorter than
    ``mincharnum`` is skipped one character on from where it starts (not from its end), so
    a match inside it may still count: onnxruntime's scan. (Where every match counts and
    none is empty, RE2's longest matches in turn are the same: ``_cutter`` takes the
    pattern's ``token_finder`` there.)"""
    subject, tokens, start = Subject(text), [], 0
    while start <= len(text):
        found = pattern.search(subject, start)
        if found is None:
            break
        begin, end = found
        if end - begin >= mincharnum:
            tokens.append(text[begin:end])
            start = end
        else:
            start = begin + 1
    return tokens


def _split(text: str, pattern, mincharnum: int) -> list[str]:
    """The pieces between matches of one separator, those shorter than ``mincharnum``
    dropped. An empty match skips the character it stands before; one at the very end
    leaves no trailing piece (onnxruntime reads past the text there; it ends up with none)."""
    if not pattern.matches_empty:
        edges = [0, *(e for span in pattern.spans(text) for e in span), len(text)]
        pieces = (text[a:b] for a, b in zip(edges[::2], edges[1::2]))
        return [piece for piece in pieces if len(piece) >= mincharnum]
    subject, pieces, start = Subject(text), [], 0
    while start <= len(text):
        found = pattern.search(subject, start)
        if found is None:
            pieces.append(text[start:])
            break
        begin, end = found
        pieces.append(text[start:begin])
        start = end if end > begin else begin + 1
    return [piece for piece in pieces if len(piece) >= mincharnum]


def _split_by_all(text: str, patterns: tuple, mincharnum: int) -> list[str]:
    """Each separator in turn splits every piece the ones before it left. Most pieces hold
    no separator: one search says so, and a context-free separator found nowhere in the
    whole text is found in none of its pieces."""
    pieces = _split(text, patterns[0], mincharnum)
    for pattern in patterns[1:]:
        search = pattern.search
        if pattern.context_free and search(text) is None:
            continue
        pieces = [token for piece in pieces for token in
                  ((piece,) if search(piece) is None else _split(piece, pattern, mincharnum))]
    return pieces


# -- the attributes, checked once per set ---------------------------------------------------

@functools.lru_cache(maxsize=64)
def _cutter(mark, mincharnum, pad_value, separators, tokenexp, tokenexpsplit):
    """``str -> list[str]`` for one set of attributes (``separators`` a tuple), or a
    ValueError saying which attribute is wrong, as onnxruntime refuses the node."""
    missing = [name for name, value in
               (("mark", mark), ("mincharnum", mincharnum), ("pad_value", pad_value))
               if value is None]
    if missing:
        raise ValueError(f"Tokenizer needs the attribute(s) {', '.join(missing)}")
    if mincharnum < 1:
        raise ValueError(f"Tokenizer's mincharnum is {mincharnum}; expected at least 1")
    if separators is None and tokenexpsplit and tokenexp:
        separators, tokenexp = (tokenexp,), None  # split on tokenexp: a lone separator
    if separators is not None:
        return _separator_cutter(separators, mincharnum)
    if not tokenexp:
        raise ValueError("Tokenizer needs separators or a non-empty tokenexp")
    if tokenexp == ".":
        return _character_cutter(mincharnum)
    pattern = compiled(tokenexp)
    if mincharnum == 1 and not pattern.matches_empty:  # RE2's longest matches in turn
        return pattern.token_finder()
    return lambda text: _matches(text, pattern, mincharnum)


def _separator_cutter(separators: tuple, mincharnum: int):
    if not separators:
        raise ValueError("Tokenizer's separators are empty; expected at least one")
    if separators == ("",):
        return _character_cutter(mincharnum)
    patterns = tuple(compiled(s) for s in separators)
    return lambda text: _split_by_all(text, patterns, mincharnum)


def _character_cutter(mincharnum: int):
    if mincharnum > 1:
        raise ValueError(f"Tokenizer cuts into single characters (separators [''] or "
                         f"tokenexp '.'), so mincharnum {mincharnum} would drop everything; "
                         f"expected 1")
    return _characters


def _cutter_for(mark, mincharnum, pad_value, separators, tokenexp, tokenexpsplit):
    return _cutter(mark, mincharnum, pad_value,
                   None if separators is None else tuple(separators), tokenexp,
                   bool(tokenexpsplit))


def runs_for(mincharnum, separators, tokenexp, tokenexpsplit):
    """``texts -> list of token lists or None``: where the cutter is a pattern's longest
    matches in turn (``_cutter``'s ``token_finder``), that pattern's ``runs_of``, which cuts
    many texts at once where it can; None where the cutter is another (call it after
    ``_cutter_for`` has checked the attributes)."""
    if separators is not None or (tokenexpsplit and tokenexp) or not tokenexp \
            or tokenexp == "." or mincharnum != 1:
        return None
    pattern = compiled(tokenexp)
    return None if pattern.matches_empty else pattern.runs_of


def cut_texts(cut, runs, texts: list) -> list:
    """Each text's tokens: by ``runs`` (:func:`runs_for`) in one go where it holds, there
    are texts enough to pay its joining (~0.8 us), and no run limit watches the texts one by
    one; else by ``cut`` text by text."""
    if runs is not None and len(texts) >= RUNS_FROM_TEXTS and run_options.current() is None:
        found = runs(texts)
        if found is not None:
            return found
    return list(map(cut, run_options.each(texts)))


# -- Tokenizer ------------------------------------------------------------------------------

@op("Tokenizer", since=1, domain=MICROSOFT, dtypes=STRING)
def tokenizer(xp, X, *, mark=None, mincharnum=None, pad_value=None, separators=None,
              tokenexp=None, tokenexpsplit=0, _node=None):
    """Cut each string of a [C] or [N, C] tensor into tokens along a new last axis, padded
    with ``pad_value`` to the longest row; ``mark`` puts 0x02 before and 0x03 after each
    row's tokens (the padding comes after). ``separators`` (RE2 patterns, applied in turn)
    cut between matches, ``tokenexp`` keeps its matches; ``[""]`` or ``"."`` cut into
    characters. ``tokenexpsplit=1`` cuts at ``tokenexp``'s matches instead (onnxruntime's
    schema lacks this attribute and refuses a model that sets it)."""
    return prepared(_node, lambda: _Tokenizer(
        _cutter_for(mark, mincharnum, pad_value, separators, tokenexp, tokenexpsplit),
        runs_for(mincharnum, separators, tokenexp, tokenexpsplit),
        bool(mark), pad_value)).run(xp, X)


class _Tokenizer:
    """A node's cutter, made from its attributes once (ops/ir/node_state.py)."""

    def __init__(self, cut, runs, mark: bool, pad_value: str):
        self.cut, self.runs, self.mark, self.pad_value = cut, runs, mark, pad_value

    def run(self, xp, X):
        strings = to_host(X)
        _check_rank(strings.shape)
        if strings.size == 0:
            return np.empty(_empty_output_shape(strings.shape), dtype=object)
        # (under a run's limits, checked text by text: a request of many long texts)
        rows = cut_texts(self.cut, self.runs, strings.reshape(-1).tolist())
        return _padded(rows, strings.shape, self.mark, self.pad_value)


@binds(tokenizer.fn, feeds=True, fresh=True, silent=True, any_inputs=True)
def bind_tokenizer(args, out, attributes):
    """The node's cutter over each run's strings as given (bound_calls): the call its
    executor made anyway, without the run loop's general route to it."""
    model = (attributes.get("_node") or {}).get("model")
    if not isinstance(model, _Tokenizer) or not isinstance(args[0], np.ndarray):
        return None
    run = model.run
    return lambda X: run(np, X)


# texts from which cut_texts cuts them all at once (a short text's re.findall ~0.6 us, its
# share of the texts joined and split ~0.26, plus ~0.8 once: 2026-12-05)
RUNS_FROM_TEXTS = 3


def _padded(rows: list, shape: tuple, mark: bool, pad_value: str) -> np.ndarray:
    lengths = list(map(len, rows))
    longest = max(lengths)
    if longest == 0:  # nothing left of any string: no marks either
        return np.empty((*shape, 0), dtype=object)
    width = longest + 2 * mark
    if mark:
        rows = [[START_OF_TEXT, *row, END_OF_TEXT] for row in rows]
        lengths = [length + 2 for length in lengths]
    # one flat list into an object array, each row and its padding added by list.extend, in
    # C (a comprehension over every token took 223 us for 539 rows of 3-11 tokens, this 127;
    # 5.1 against 2.2 us for 4 rows; filling a padded array row by row cost more still)
    pads, flat = [pad_value] * width, []
    extend = flat.extend
    for row, length in zip(rows, lengths):
        extend(row)
        extend(pads[length:])
    return object_strings(flat, (*shape, width))


def _check_rank(shape) -> None:
    if len(shape) not in (1, 2):
        raise ValueError(f"Tokenizer takes a [C] or [N, C] tensor, got rank {len(shape)} "
                         f"(shape {tuple(shape)})")


def _empty_output_shape(shape: tuple) -> tuple:
    """An empty input gives [0] for [0], and [N, 0] for [N, C] with no strings (not
    [N, C, 0]): onnxruntime's rule."""
    return (0,) if len(shape) == 1 else (shape[0], 0)


@tokenizer.check
def _(*, mark=None, mincharnum=None, pad_value=None, separators=None, tokenexp=None,
      tokenexpsplit=0, **_):
    """Attributes that no input makes right (a pattern RE2 refuses), refused at load."""
    _cutter_for(mark, mincharnum, pad_value, separators, tokenexp, tokenexpsplit)


@tokenizer.infer
def _(X, *, mark=None, mincharnum=None, pad_value=None, separators=None, tokenexp=None,
      tokenexpsplit=0, **_):
    _cutter_for(mark, mincharnum, pad_value, separators, tokenexp, tokenexpsplit)
    if X.shape is None:
        return [TensorType(OBJECT, None)]
    _check_rank(X.shape)
    if any(d == 0 for d in X.shape):
        return [TensorType(OBJECT, _empty_output_shape(X.shape))]
    return [TensorType(OBJECT, (*X.shape, None))]
