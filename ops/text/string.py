"""String operators and TfIdfVectorizer.

ONNX strings are NumPy object arrays of ``str``. No GPU array library holds strings, so these
kernels work on the host with NumPy whatever ``xp`` is; a numeric result is handed back as an
``xp`` array.
"""

from __future__ import annotations

import itertools

import numpy as np

from mixrt.base import run_options
from mixrt.ops.compiled.bound_calls import binds
from mixrt.ops.compiled.out_arrays import into
from mixrt.ops.ir.dtypes import STRING
from mixrt.ops.ir.node_state import prepared
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, broadcast_shapes, tensor
from mixrt.ops.device import to_host
from mixrt.ops.text.re2_patterns import compiled as compiled_pattern


def object_strings(values, shape) -> np.ndarray:
    """An object array of ``shape`` from a flat list of str (np.array would make '<U' arrays
    or nested lists from them)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


# -- StringNormalizer -------------------------------------------------------------------

@op("StringNormalizer", since=10, dtypes=STRING)
def string_normalizer(xp, X, *, case_change_action="NONE", is_case_sensitive=0, locale="",
                      stopwords=None):
    """Drop stopwords, then change case. Only [C] and [1, C] inputs exist; the locale is
    accepted, but case mapping is Python's Unicode one whatever it says."""
    return _Normalizing(case_change_action, is_case_sensitive, stopwords)(to_host(X))


class _Normalizing:
    """A StringNormalizer's attributes, checked, as the call on a host array of strings."""

    __slots__ = ("stop", "sensitive", "change")

    def __init__(self, case_change_action, is_case_sensitive, stopwords):
        if case_change_action not in _CASE_CHANGES:
            raise ValueError(f"StringNormalizer case_change_action must be one of "
                             f"{sorted(_CASE_CHANGES)}, got {case_change_action!r}")
        self.sensitive = bool(is_case_sensitive)
        self.stop = None if not stopwords else set(stopwords) if self.sensitive \
            else {s.lower() for s in stopwords}
        self.change = _CASE_CHANGES[case_change_action]

    def __call__(self, X):
        words, shape = self.words(X)
        return object_strings(words, shape)

    def words(self, X) -> tuple[list, tuple]:
        """The output's strings, as a list, and its shape."""
        if X.ndim == 2 and X.shape[0] != 1 or X.ndim > 2:
            raise ValueError(f"StringNormalizer takes a [C] or [1, C] tensor, got shape "
                             f"{X.shape}")
        words = X.reshape(-1).tolist()
        stop = self.stop
        if stop is not None:
            words = [w for w in words if (w if self.sensitive else w.lower()) not in stop]
        if self.change is not None:
            words = list(map(self.change, words))  # (in C: a TF-IDF pipeline's batch is 1 row)
        if not words:  # everything dropped: one empty string, keeping the input's rank
            words = [""]
        return words, (len(words),) if X.ndim == 1 else (1, len(words))


@binds(string_normalizer.fn, feeds=True, fresh=True, silent=True, any_inputs=True)
def bind_string_normalizer(args, out, attributes):
    """The checked attributes' call, made on each run's strings as given (bound_calls)."""
    (X,) = args
    if not isinstance(X, np.ndarray):
        return None
    try:
        return _Normalizing(attributes.get("case_change_action", "NONE"),
                            attributes.get("is_case_sensitive", 0),
                            attributes.get("stopwords"))
    except ValueError:  # the kernel raises it, naming the node, on every run
        return None


_CASE_CHANGES = {"LOWER": str.lower, "UPPER": str.upper, "NONE": None}


@string_normalizer.infer
def _(X, *, stopwords=None, **_):
    if X.shape is None or not stopwords:
        return [TensorType(np.dtype(object), X.shape)]
    return [TensorType(np.dtype(object), (*X.shape[:-1], None))]  # stopwords drop columns


# -- StringSplit, StringConcat, RegexFullMatch ------------------------------------------

@op("StringSplit", since=20, dtypes=STRING)
def string_split(xp, X, *, delimiter=None, maxsplit=None):
    """Consecutive delimiters delimit empty strings, except with no (or an empty) delimiter,
    where runs of whitespace separate and both ends are trimmed (also from the unsplit tail
    maxsplit leaves, which Python's str.split keeps)."""
    limit = -1 if maxsplit is None else maxsplit
    strings = to_host(X).reshape(-1)
    pieces = ([s.split(delimiter, limit) for s in strings] if delimiter else
              [s.strip().split(None, limit) for s in strings])
    width = max((len(p) for p in pieces), default=0)
    padded = [word for p in pieces for word in p + [""] * (width - len(p))]
    counts = np.array([len(p) for p in pieces], dtype=np.int64).reshape(X.shape)
    return object_strings(padded, (*X.shape, width)), xp.asarray(counts)


@string_split.infer
def _(X, **_):
    return [TensorType(np.dtype(object), None if X.shape is None else (*X.shape, None)),
            TensorType(np.dtype(np.int64), X.shape)]


@op("StringConcat", since=20, dtypes=STRING)
def string_concat(xp, X, Y):
    left, right = np.broadcast_arrays(to_host(X), to_host(Y))
    joined = [a + b for a, b in zip(left.reshape(-1), right.reshape(-1))]
    return object_strings(joined, left.shape)


@string_concat.infer
def _(X, Y, **_):
    return [TensorType(np.dtype(object), broadcast_shapes(X.shape, Y.shape))]


@op("RegexFullMatch", since=20, dtypes=STRING)
def regex_full_match(xp, X, *, pattern=None):
    """Whether each string matches ``pattern`` whole, on RE2 as the spec says (linear in the
    string whatever the pattern: ``ops/text/re2_patterns.py``)."""
    compiled = _full_match_pattern(pattern)
    strings = to_host(X)
    matched = [compiled.fullmatch(s) for s in run_options.each(strings.reshape(-1))]
    return xp.asarray(np.array(matched, dtype=np.bool_).reshape(strings.shape))


@regex_full_match.check
def _full_match_pattern(pattern=None, **_):
    if pattern is None:
        raise ValueError("RegexFullMatch needs the pattern attribute")
    return compiled_pattern(pattern)


@regex_full_match.infer
def _(X, **_):
    return [TensorType(np.dtype(np.bool_), X.shape)]


# -- TfIdfVectorizer --------------------------------------------------------------------

def _ngram_table(pool, ngram_counts) -> dict:
    """Map each n-gram of the pool (a tuple) to its position k in the pool's n-gram order.
    ngram_counts[n-1] is where the pool's n-grams start."""
    table, k = {}, 0
    starts = list(ngram_counts) + [len(pool)]
    for n, (start, end) in enumerate(zip(starts, starts[1:]), start=1):
        for i in range(start, end, n):
            table[tuple(pool[i:i + n])] = k
            k += 1
    return table


def _count_ngrams(row, table, counts, *, min_n, max_n, max_skip) -> None:
    """Add the pool n-grams found in one row to ``counts`` (indexed by pool position k).
    An n-gram takes n items spaced skip+1 apart, for every skip up to max_skip; a unigram
    has no spacing, so it is counted once."""
    for n in range(max(min_n, 1), max_n + 1):
        for skip in range(max_skip + 1 if n > 1 else 1):
            span = (n - 1) * (skip + 1)
            for start in range(len(row) - span):
                k = table.get(tuple(row[start:start + span + 1:skip + 1]))
                if k is not None:
                    counts[k] += 1


@op("TfIdfVectorizer", since=9, dtypes=STRING | frozenset({"int32", "int64"}))
def tfidf_vectorizer(xp, X, *, max_gram_length=None, max_skip_count=None,
                     min_gram_length=None, mode=None, ngram_counts=None, ngram_indexes=None,
                     pool_int64s=None, pool_strings=None, weights=None, _node=None, out=None):
    """Into ``out`` where the run gives its output a view in the arena (so that its
    planned call can be bound: :func:`bind_tfidf_vectorizer`)."""
    return into(out, prepared(_node, lambda: _TfIdf(
        max_gram_length=max_gram_length, max_skip_count=max_skip_count,
        min_gram_length=min_gram_length, mode=mode, ngram_counts=ngram_counts,
        ngram_indexes=ngram_indexes, pool_int64s=pool_int64s, pool_strings=pool_strings,
        weights=weights)).run(xp, X))


class _TfIdf:
    """A TfIdfVectorizer's checked attributes, its n-gram table and output columns, made
    once per node (rebuilding the table was most of a one-document run)."""

    def __init__(self, *, max_gram_length, max_skip_count, min_gram_length, mode,
                 ngram_counts, ngram_indexes, pool_int64s, pool_strings, weights):
        if None in (max_gram_length, max_skip_count, min_gram_length, mode, ngram_counts,
                    ngram_indexes):
            raise ValueError("TfIdfVectorizer needs max_gram_length, max_skip_count, "
                             "min_gram_length, mode, ngram_counts and ngram_indexes")
        if mode not in ("TF", "IDF", "TFIDF"):
            raise ValueError(f"TfIdfVectorizer mode must be one of TF, IDF, TFIDF, got "
                             f"{mode!r}")
        pool = list(pool_strings) if pool_strings is not None \
            else [int(v) for v in pool_int64s]
        self.table = _ngram_table(pool, [int(c) for c in ngram_counts])
        self.mode, self.max_skip = mode, max_skip_count
        self.min_n, self.max_n = min_gram_length, max_gram_length
        self.width = int(max(ngram_indexes)) + 1
        self.index = np.asarray(ngram_indexes, dtype=np.int64)
        self.scale = (np.ones(len(self.index), np.float32) if weights is None
                      else np.asarray(weights, dtype=np.float32))
        # each pool entry's own column once: then a row's counts are written, not added at
        self.distinct = len(set(self.index.tolist())) == len(self.index)
        # single items only (scikit-learn's default): a row is counted item by item into a
        # dict, and only the entries found are weighted and written (building the n-gram
        # tuples and weighting every pool entry was most of a one-document run); finite
        # weights, so that the entries not found are the zeros the full path writes
        self.unigrams = {key[0]: k for key, k in self.table.items()} \
            if self.max_n == 1 and self.min_n <= 1 and self.distinct \
            and np.all(np.isfinite(self.scale)) else None
        if self.unigrams is not None:
            # a few items are written one by one as Python floats: a count times a float32
            # weight is exact in float64, so its one rounding to float32 is the float32
            # product's (five NumPy calls on a short document cost ~2 us)
            self.columns = self.index.tolist()
            self.weights = (self.scale if mode != "TF" else np.ones_like(self.scale)).tolist()

    def run(self, xp, X):
        data = to_host(X)
        if data.ndim > 1 and data.shape[0] == 0:
            raise ValueError(NO_ROWS)
        rows = data.reshape(1, -1) if data.ndim <= 1 else data.reshape(data.shape[0], -1)
        if self.unigrams is not None and len(rows) >= ARRAY_ROWS:
            out = self._unigram_rows(rows)
            return xp.asarray(out.reshape(self.width) if data.ndim <= 1 else out)
        rows = rows.tolist()  # python ints/strs hash like the pool's entries
        out = np.zeros((len(rows), self.width), dtype=np.float32)
        if self.unigrams is not None:
            for r, row in enumerate(rows):
                self._unigram_row(row, out[r])
            return xp.asarray(out.reshape(self.width) if data.ndim <= 1 else out)
        for r, row in enumerate(run_options.each(rows)):  # (n-grams of skips: a long walk)
            counts = np.zeros(len(self.index), dtype=np.float32)
            _count_ngrams(row, self.table, counts, min_n=self.min_n, max_n=self.max_n,
                          max_skip=self.max_skip)
            if self.mode == "IDF":
                counts = np.minimum(counts, 1) * self.scale
            elif self.mode == "TFIDF":
                counts = counts * self.scale
            if self.distinct:  # + 0: a -0.0 count reads 0.0, as added to the zeros
                out[r, self.index] = counts + np.float32(0)
            else:
                np.add.at(out[r], self.index, counts)
        return xp.asarray(out.reshape(self.width) if data.ndim <= 1 else out)

    def _unigram_row(self, row, out) -> None:
        """One row's counts of single items into ``out`` (zeros), weighted as the mode
        says: the same float32 products as the full path's, written where they belong."""
        found: dict = {}
        lookup = self.unigrams.get
        for item in row:
            k = lookup(item)
            if k is not None:
                found[k] = found.get(k, 0) + 1
        if len(found) <= SCALAR_WRITES:
            columns, weights, once = self.columns, self.weights, self.mode == "IDF"
            for k, count in found.items():  # + 0.0: a -0.0 product reads 0.0, as below
                out[columns[k]] = (1 if once else count) * weights[k] + 0.0
            return
        entries = np.fromiter(found, np.int64, len(found))
        counts = np.fromiter(found.values(), np.float32, len(found))
        if self.mode == "IDF":
            counts = np.minimum(counts, 1) * self.scale[entries]
        elif self.mode == "TFIDF":
            counts = counts * self.scale[entries]
        out[self.index[entries]] = counts + np.float32(0)

    def _unigram_rows(self, rows):
        """:meth:`_unigram_row` of many rows at once: every item looked up in one pass of
        C (``map`` of the table's ``get``), the counts one ``bincount`` over (row, entry),
        then weighted and written as whole columns. The same float32 products: a count
        times a float32 weight, plus zero. 64 documents of 11 tokens: 257 -> ~60 us."""
        count = rows.shape[0]
        owner = np.repeat(np.arange(count, dtype=np.int64), rows.shape[1])
        return self.unigram_counts(rows.ravel().tolist(), owner, count)

    def unigram_counts(self, items: list, owner: np.ndarray, count: int, extra=None):
        """The output of ``count`` rows whose single items are ``items``, item i in row
        ``owner[i]``; ``extra``: (pool entry, the times each row holds it besides), where a
        caller knows those counts without the items (a tokenizer's padding)."""
        entries = len(self.index)
        found = np.fromiter(map(self.unigrams.get, items, itertools.repeat(-1, len(items))),
                            np.int64, len(items))
        hits = found >= 0
        counts = np.bincount(owner[hits] * entries + found[hits],
                             minlength=count * entries).reshape(count, entries)
        if extra is not None:
            counts[:, extra[0]] += extra[1]
        counts = counts.astype(np.float32)
        if self.mode == "IDF":
            counts = np.minimum(counts, 1) * self.scale
        elif self.mode == "TFIDF":
            counts = counts * self.scale
        out = np.zeros((count, self.width), dtype=np.float32)
        out[:, self.index] = counts + np.float32(0)
        return out


# not silent: a count times a large weight may overflow float32 (NumPy warns of the cast)
@binds(tfidf_vectorizer.fn, feeds=True, fresh=True, any_inputs=True)
def bind_tfidf_vectorizer(args, out, attributes):
    """The node's table over each run's items as given (bound_calls)."""
    return bound_counts(_TfIdf, args, out, attributes)


def bound_counts(kind, args, out, attributes):
    """A counting node's bound call (its model of class ``kind`` run on each run's input as
    given), made anew where its output has no view, else written into it; None where the
    node has no such model or its view is not the float32 rows it makes."""
    model = (attributes.get("_node") or {}).get("model")
    if not isinstance(model, kind) or not isinstance(args[0], np.ndarray):
        return None
    run = model.run
    if out is None:  # a graph output: made anew, as the kernel makes it
        return lambda X: run(np, X)
    if out.dtype != np.float32 or not out.flags.c_contiguous:
        return None
    return lambda X: into(out, run(np, X))  # the output's view, as the kernel writes it


# onnxruntime's refusal of a batch of no rows, which has no rows to count into
NO_ROWS = "TfIdfVectorizer's input must be [C] or [B, C] with B > 0 (got no rows)"
# a row finding at most this many pool entries writes them one by one (~70 ns each)
# instead of through five array operations (~2 us whatever the count)
SCALAR_WRITES = 24
# documents from which single items are counted for all rows at once (_unigram_rows)
ARRAY_ROWS = 4


@tfidf_vectorizer.infer
def _(X, *, ngram_indexes=(), **_):
    width = int(max(ngram_indexes)) + 1 if ngram_indexes is not None and len(ngram_indexes) \
        else None
    if X.shape is None:
        return [tensor(np.float32, None)]
    return [tensor(np.float32, (width,) if len(X.shape) <= 1 else (X.shape[0], width))]
