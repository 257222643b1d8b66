"""``mixrt::TokenCounts``: a Tokenizer's tokens counted by a TfIdfVectorizer, as one node.

skl2onnx writes scikit-learn's ``TfidfVectorizer`` and ``CountVectorizer`` as::

    tokens = com.microsoft::Tokenizer(texts)      [N, C, T] (or [C, T]): padded to the longest
    flat = Flatten(tokens)                        [N, C*T], axis 1 (or no Flatten at all)
    counts = TfIdfVectorizer(flat)                [N, width]

The tokens exist only to be counted, yet the Tokenizer made them an object array padded
to the longest text and the vectorizer read that array back item by item: for 539 short
documents, 457 us of tokens and 287 of counting, where onnxruntime's whole pipeline took
653 (2026-12-05). This node counts each text's tokens as they are cut: one flat list of
them, looked up in one pass, and the padding counted without being made (it counts only
where the pad value is itself a pool entry). The optimizer makes it
(``runtime/passes/fuse_token_counts.py``) where the vectorizer counts single items into
columns of their own with finite weights (``string._TfIdf.unigrams``) and the Tokenizer
adds no marks; the counts, and so the bits, are the two nodes'.

A StringNormalizer before the Tokenizer that only changes case (no stopwords, as
skl2onnx writes it for ``lowercase=True``) is taken in as well: its ``case_change_action``
(a node's dispatch less, ~1.5 us of a one-document request's ~15).

Its attributes are the Tokenizer's (``mincharnum``, ``pad_value``, ``separators``,
``tokenexp``, ``tokenexpsplit``), the vectorizer's, and the normalizer's case change
and locale where it took one, as each node had them, so a ``.mxr`` file or an ONNX export
(``exporters/decompose.py``) carries it.
"""

from __future__ import annotations

import itertools

import numpy as np

from mixrt.ops.compiled.bound_calls import binds
from mixrt.ops.compiled.out_arrays import into
from mixrt.ops.device import to_host
from mixrt.ops.ir.dtypes import STRING
from mixrt.ops.ir.node_state import prepared
from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.ir.types import tensor
from mixrt.ops.text.contrib_text import _check_rank, _cutter_for, cut_texts, runs_for
from mixrt.ops.text.string import NO_ROWS, _Normalizing, _TfIdf, bound_counts


# the node's attributes by the node each came from (the fusion and an export read them)
CUTTING = ("mincharnum", "pad_value", "separators", "tokenexp", "tokenexpsplit")
COUNTING = ("max_gram_length", "max_skip_count", "min_gram_length", "mode", "ngram_counts",
            "ngram_indexes", "pool_strings", "weights")
NORMALIZING = ("case_change_action", "locale")


@op("TokenCounts", since=1, domain=MIXRT, dtypes=STRING)
def token_counts(xp, X, *, mincharnum=None, pad_value=None, separators=None, tokenexp=None,
                 tokenexpsplit=0, max_gram_length=None, max_skip_count=None,
                 min_gram_length=None, mode=None, ngram_counts=None, ngram_indexes=None,
                 pool_strings=None, weights=None, case_change_action=None, locale=None,
                 _node=None, out=None):
    """The vectorizer's output for X's texts ([C]: a row each; [N, C]: a row per N), cut
    as the Tokenizer cuts them (no marks); with ``case_change_action``, X's case changed
    first, as a StringNormalizer without stopwords changes it (X then [C] or [1, C]; its
    ``locale``, kept for an export, is read as the StringNormalizer reads it: not at all)."""
    return into(out, prepared(_node, lambda: _TokenCounts(
        _cutter_for(0, mincharnum, pad_value, separators, tokenexp, tokenexpsplit),
        runs_for(mincharnum, separators, tokenexp, tokenexpsplit), pad_value,
        _TfIdf(max_gram_length=max_gram_length, max_skip_count=max_skip_count,
               min_gram_length=min_gram_length, mode=mode, ngram_counts=ngram_counts,
               ngram_indexes=ngram_indexes, pool_int64s=None, pool_strings=pool_strings,
               weights=weights),
        None if case_change_action is None else _Normalizing(case_change_action, 0, None)
    )).run(xp, X))


class _TokenCounts:
    """A node's cutter and vectorizer, made from its attributes once."""

    def __init__(self, cut, runs, pad_value: str, vectorizer: _TfIdf, normalizing=None):
        if vectorizer.unigrams is None:  # (the optimizer makes the node only where it holds)
            raise ValueError("TokenCounts counts single items into columns of their own, "
                             "with finite weights")
        self.cut, self.runs, self.vectorizer, self.pad_value = cut, runs, vectorizer, pad_value
        self.pad = vectorizer.unigrams.get(pad_value)  # the padding's pool entry, if any
        self.normalizing = normalizing  # the StringNormalizer before, if the node took it

    def run(self, xp, X):
        strings = to_host(X)
        if self.normalizing is not None:  # its words as the Tokenizer would have had them
            texts, shape = self.normalizing.words(strings)
        else:
            texts, shape = strings.reshape(-1).tolist(), strings.shape
        _check_rank(shape)
        count = shape[0]
        if count == 0:  # the Tokenizer's [0, ...] tokens: no rows for the vectorizer
            raise ValueError(NO_ROWS)
        tokens = cut_texts(self.cut, self.runs, texts)  # as the Tokenizer cuts them
        lengths = list(map(len, tokens))
        per_row = len(texts) // count  # a row's texts
        longest = max(lengths, default=0)  # the Tokenizer pads every text to it
        if count < ALL_ROWS_FROM:
            return xp.asarray(self._few_rows(tokens, lengths, count, per_row, longest))
        owner = np.repeat(np.arange(len(texts), dtype=np.int64) // max(per_row, 1), lengths)
        extra = None
        if self.pad is not None:
            padded = longest - np.asarray(lengths, np.int64).reshape(count, per_row)
            extra = (self.pad, padded.sum(axis=1))
        items = list(itertools.chain.from_iterable(tokens))
        return xp.asarray(self.vectorizer.unigram_counts(items, owner, count, extra))

    def _few_rows(self, tokens: list, lengths: list, count: int, per_row: int,
                  longest: int) -> np.ndarray:
        """Each row counted item by item (``_TfIdf._unigram_row``), its padding with it."""
        vectorizer, pad = self.vectorizer, self.pad
        out = np.zeros((count, vectorizer.width), dtype=np.float32)
        if per_row != 1:  # a row's texts' tokens together
            tokens = [[token for t in range(r * per_row, (r + 1) * per_row)
                       for token in tokens[t]] for r in range(count)]
            lengths = [sum(lengths[r * per_row:(r + 1) * per_row]) for r in range(count)]
        count_row, filled = vectorizer._unigram_row, per_row * longest
        for r, row in enumerate(tokens):
            if pad is not None and lengths[r] < filled:
                row = row + [self.pad_value] * (filled - lengths[r])
            count_row(row, out[r])
        return out


# rows from which the counts are made for all rows at once (_TfIdf.unigram_counts: ~10 us,
# then ~0.7 us a short text) rather than row by row (~1-2.5 us a text): 539 documents of
# 3-11 tokens, 2026-12-05
ALL_ROWS_FROM = 8


# not silent: a count times a large weight may overflow float32 (NumPy warns of the cast)
@binds(token_counts.fn, feeds=True, fresh=True, any_inputs=True)
def bind_token_counts(args, out, attributes):
    """The node's cutter and table over each run's texts as given (bound_calls)."""
    return bound_counts(_TokenCounts, args, out, attributes)


@token_counts.infer
def _(X, *, ngram_indexes=(), case_change_action=None, **_):
    width = int(max(ngram_indexes)) + 1 if ngram_indexes is not None and len(ngram_indexes) \
        else None
    if X.shape is None:
        return [tensor(np.float32, None)]
    _check_rank(X.shape)
    rows = X.shape[0] if case_change_action is None else 1 if len(X.shape) == 2 \
        else None if X.shape[0] is None else max(X.shape[0], 1)  # (no texts: one empty one)
    return [tensor(np.float32, (rows, width))]
