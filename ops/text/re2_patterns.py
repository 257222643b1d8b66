"""RE2 patterns, run on RE2 itself (google-re2), as the ONNX spec and onnxruntime run them.

RegexFullMatch's spec names RE2, and onnxruntime's Tokenizer compiles its separators and
``tokenexp`` with RE2 and asks for leftmost-longest matches. RE2 matches in time linear in
the text whatever the pattern: a model's ``(a+)+$`` cannot hold a worker, where Python's
backtracking ``re`` took 20 s over 29 characters and 17 times longer for every 4 more
(mixrt ran the patterns on ``re`` through a translation of RE2's syntax until 2026-11-27).
What RE2 refuses (lookarounds, backreferences, possessive quantifiers, a program past its
memory budget) is refused here with RE2's reason, when the model is loaded
(``ops/ir/registry.OpHandle.check``), as onnxruntime refuses such a model.

RE2's promise is time linear in the text, times the pattern's size at worst: where a
pattern's automaton has more states than RE2's memory holds (``.*a.{1000}c``, where a
character 1,000 back decides), RE2 steps its NFA over every character, ~5 us a character
(a 1 MB text: 5-7 s, onnxruntime's the same). Groups never capture here (only a whole
match's span is asked for), which keeps RE2 off that NFA everywhere else.

Python's ``re`` still runs the plainest patterns: a fixed run of single characters (literals,
``\\w``, ``\\d``, a bracket class of such) whose last one may take ``+`` (skl2onnx's
``[a-zA-Z0-9_]+`` and its one-character separators, ``\\w+``). There both engines give the
same matches (a greedy final run is the longest match), and ``re`` finds them in linear
time without backtracking, and without google-re2's per-match cost in Python: ~1.5 us a
match against ~0.1 (a 225-token text: 320 us against 20; 1 MB of 500,000 tokens: 2.7 s).

Python's parser of ``re`` is asked one thing besides, as a hint for the tokenizer's fast
paths: whether a pattern can match the empty text, and whether it looks at where it stands
(an anchor or a boundary). Where Python cannot parse a pattern (RE2-only syntax such as
``\\pL`` or ``\\Q...\\E``), the answer is the cautious one, and the tokenizer takes its
general scan, which is right for any pattern.
"""

from __future__ import annotations

import functools
import re
import warnings
from re import _parser as sre_parse  # re's own parse tree: what a pattern can match

import numpy as np
import re2


class Re2Pattern:
    """One pattern compiled by RE2 for leftmost-longest matching (``regex``: RE2's
    compiled form, with ``re``'s methods), and what the tokenizer's fast paths ask of it."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        try:
            self.regex = _plain(pattern) or re2.compile(pattern, _OPTIONS)
        except re2.error as error:
            reason = error.args[0] if error.args else error
            if isinstance(reason, bytes):
                reason = reason.decode("utf-8", "replace")
            raise ValueError(f"pattern {pattern!r} is not one RE2 accepts: {reason}") \
                from None
        tree = _python_tree(pattern)
        # can it match the empty text somewhere? (a cautious yes where re cannot tell)
        self.matches_empty = tree is None or tree.getwidth()[0] == 0
        # matches the same text wherever that text stands (no anchor, no boundary)
        self.context_free = tree is not None and not _has_assertion(tree)
        self._runs = _run_table(self.regex)  # (:meth:`runs_of`)

    def search(self, text, start: int = 0) -> tuple[int, int] | None:
        """(start, end) of the leftmost-longest match at or after character ``start`` of
        ``text`` (a str, or the :class:`Subject` a scan made of it once), or None."""
        if self.regex.__class__ is re.Pattern:  # (the text as it is)
            found = self.regex.search(text.text if text.__class__ is Subject else text, start)
            return None if found is None else found.span()
        subject = text if text.__class__ is Subject else Subject(text)
        found = self.regex.search(subject.data, subject.byte(start))
        return None if found is None else subject.span(found.span())

    def spans(self, text) -> list[tuple[int, int]]:
        """The (start, end) of each leftmost-longest match, each search going on where the
        last match ended (``finditer``'s)."""
        if self.regex.__class__ is re.Pattern:
            text = text.text if text.__class__ is Subject else text
            return [found.span() for found in self.regex.finditer(text)]
        subject = text if text.__class__ is Subject else Subject(text)
        return [subject.span(found.span()) for found in self.regex.finditer(subject.data)]

    def token_finder(self):
        """``str -> list[str]``: the text of each match :meth:`spans` finds; ``re``'s own
        ``findall`` where ``re`` runs the pattern (~2x finditer's pace), which a caller
        maps over many texts in C (a tokenizer's 539 rows: a Python frame less a row)."""
        if self.regex.__class__ is re.Pattern and not self.regex.groups:
            return self.regex.findall
        return lambda text: [text[begin:end] for begin, end in self.spans(text)]

    def runs_of(self, texts: list) -> list[list[str]] | None:
        """Each text's matches (:meth:`token_finder`'s) where the pattern is one class of
        characters repeated (``[a-zA-Z0-9_]+``, ``\\w+``: its matches are the text's
        longest runs of that class) and the texts are ASCII: the texts joined, every
        character outside the class made a space and the runs split off in C, ~0.26 us a
        short text against ~0.63 through ``re`` (539 documents, 2026-12-05). None
        otherwise, or where a text holds the NUL that joins them."""
        table = self._runs
        if table is None or not texts:
            return None
        joined = _JOIN.join(texts)
        if not joined.isascii():
            return None
        parts = joined.translate(table).split(_JOIN)
        return list(map(str.split, parts)) if len(parts) == len(texts) else None

    def fullmatch(self, text: str) -> bool:
        return self.regex.fullmatch(text) is not None


class Subject:
    """A text as RE2 searches it: its UTF-8 bytes, made once, and the way between character
    and byte offsets where it is not ASCII. google-re2's ``search`` of a str encodes the
    whole text and counts its characters up to the start at every call, which makes a scan
    of many searches (the tokenizer's general loop) quadratic in the text."""

    __slots__ = ("text", "data", "_bytes_at", "_chars_before")

    def __init__(self, text: str):
        self.text = text
        if text.isascii():
            self.data, self._bytes_at, self._chars_before = text.encode("ascii"), None, None
            return
        self.data = text.encode("utf-8", "surrogatepass")
        codes = np.frombuffer(self.data, np.uint8)
        starts = (codes & 0xC0) != 0x80  # the first byte of each character
        self._bytes_at = np.append(np.flatnonzero(starts), len(self.data))
        self._chars_before = np.concatenate(([0], np.cumsum(starts)))

    def byte(self, char: int) -> int:
        """The byte offset of character offset ``char``."""
        if self._bytes_at is None:
            return char
        return int(self._bytes_at[min(char, len(self._bytes_at) - 1)])

    def span(self, span: tuple[int, int]) -> tuple[int, int]:
        """A byte span as character offsets."""
        if self._chars_before is None:
            return span
        return int(self._chars_before[span[0]]), int(self._chars_before[span[1]])


def _options() -> "re2.Options":
    options = re2.Options()
    options.longest_match = True  # onnxruntime's Tokenizer asks RE2 for the longest match
    options.log_errors = False  # a refused pattern is the model's typed error, not a log line
    # only a whole match's span is ever asked for; with groups that capture, RE2 must find
    # their spans with its NFA (~3 ns x program size a character: 35 s for (.*){1,1000}[bc]
    # over 1 MB), where without them its DFAs find the span from both ends (11 ms)
    options.never_capture = True
    return options


_OPTIONS = _options()

# what re (with re.ASCII) and RE2 read alike and re matches in linear time: a sequence of
# single characters, each a literal (not syntax, or escaped punctuation), \w \W \d \D (ASCII
# in RE2 and under re.ASCII; not \s, which is \v in re's only), or one bracket class of
# such characters and ASCII ranges (no [[:alpha:]]); an optional + on the last one only.
# A fixed run of characters then one greedy run to its end: re never backtracks into it, and
# its match is RE2's longest (skl2onnx's [a-zA-Z0-9_]+, \w+, \d\d-\d+, separators ",", "[.]")
_PUNCTUATION = r"\\[\x21-\x2f\x3a-\x40\x5b-\x60\x7b-\x7e]"  # escaped: itself in both
_CHAR = rf"(?:[^\\\[\](){{}}.*+?|^$]|{_PUNCTUATION}|\\[wWdDsS])"
_CLASS = rf"\[\^?(?:[\x20-\x5a\x5e-\x7e]|{_PUNCTUATION}|\\[wWdDs])+\]"
# and \b before the first, or after a last \w+ (a greedy run of word characters ends where a
# boundary is, so re never backtracks there): sklearn's \b\w\w+\b
_PLAIN = re.compile(f"(?:\\\\b)?(?:{_CHAR}|{_CLASS})+(?:\\+|(?<=\\\\w)\\+\\\\b)?", re.ASCII)
# RE2's \s is [\t\n\f\r ]; re's (ASCII) has \v too: \s and \S are written out for re
_SPACE = "\\t\\n\\f\\r "
_SPACES = {"s": f"[{_SPACE}]", "S": f"[^{_SPACE}]"}
_ESCAPE_OR_CLASS = re.compile(r"\\.|\[\^?(?:\\.|[^\]])+\]")


def _plain(pattern: str):
    """``re``'s compiled pattern where the pattern is plain (``_PLAIN``) and ``re`` takes it;
    None otherwise (RE2 then compiles it, or says why not: ``[z-a]``)."""
    if not _PLAIN.fullmatch(pattern):
        return None
    try:
        return re.compile(_ESCAPE_OR_CLASS.sub(_spaces_for_re, pattern), re.ASCII)
    except re.error:
        return None


def _spaces_for_re(found) -> str:
    """An escape or a bracket class of a plain pattern, its \\s and \\S as RE2 reads them."""
    text = found.group()
    if text[0] == "\\":
        return _SPACES.get(text[1], text)
    return re.sub(r"\\.", lambda escape: _SPACE if escape.group() == "\\s"
                  else escape.group(), text)


def _python_tree(pattern: str, flags: int = 0):
    """``re``'s parse of the pattern, or None where ``re`` reads it otherwise or not at all."""
    try:
        with warnings.catch_warnings():  # ("possible nested set": RE2's [[:alpha:]])
            warnings.simplefilter("ignore")
            return sre_parse.parse(pattern, flags)
    except (re.error, RecursionError, OverflowError):
        return None


def _has_assertion(tree) -> bool:
    """Whether anything in ``tree`` looks around where it stands (an anchor, a boundary, a
    lookaround): a cut-off piece of text could answer it differently."""
    for code, value in tree:
        if code in (sre_parse.AT, sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            return True
        for part in value if isinstance(value, (tuple, list)) else ():
            subtrees = part if isinstance(part, list) else [part]
            if any(isinstance(s, sre_parse.SubPattern) and _has_assertion(s)
                   for s in subtrees):
                return True
    return False


_JOIN = "\x00"  # what joins the texts :meth:`Re2Pattern.runs_of` splits in one go
# the ASCII whitespace str.split() splits at: a class holding any of it has no runs table
_SPLIT_AT = frozenset(" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f")


def _run_table(regex) -> dict | None:
    """``str.translate``'s table that makes every ASCII character a space but those of the
    one class ``regex`` repeats (its tree one repeat, at least once and without end, of one
    character of width one) and the NUL that joins texts; None for any other pattern, and
    for a class holding whitespace or the NUL."""
    if regex.__class__ is not re.Pattern:
        return None
    tree = _python_tree(regex.pattern, regex.flags)
    if tree is None or len(tree) != 1 or tree[0][0] != sre_parse.MAX_REPEAT:
        return None
    low, high, inner = tree[0][1]
    if low != 1 or high != sre_parse.MAXREPEAT or inner.getwidth() != (1, 1) \
            or _has_assertion(inner):
        return None
    members = {chr(code) for code in range(128) if regex.fullmatch(chr(code))}
    if members & _SPLIT_AT or _JOIN in members:
        return None
    return {code: " " for code in range(128) if chr(code) not in members | {_JOIN}}


@functools.lru_cache(maxsize=256)
def compiled(pattern: str) -> Re2Pattern:
    """The pattern compiled once per process; a ValueError with RE2's reason where RE2
    refuses it."""
    return Re2Pattern(pattern)
