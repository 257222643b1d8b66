"""RE2 patterns, searched the way onnxruntime's text kernels search them, with Python's ``re``.

onnxruntime compiles patterns with RE2 and asks for leftmost-longest matches. Python's ``re``
speaks nearly the same syntax, but its matches are leftmost-first, and a few things read
differently. :func:`python_pattern` rewrites an RE2 pattern so that ``re`` gives it RE2's
meaning, and :class:`Re2Pattern` searches it leftmost-longest:

* ``\\w \\d \\s \\b`` and the POSIX classes (``[[:alpha:]]``) are ASCII-only in RE2 (``\\s``
  without ``\\v``); they become explicit ASCII sets, so that ``(?i)`` still folds case
  the Unicode way, as RE2 does.
* ``$`` is the end of the text in RE2 (not also before a final newline): it becomes ``\\Z``,
  except in a pattern that turns on ``m`` anywhere, where it keeps ``re``'s meaning.
* ``\\z``, ``\\Q...\\E``, ``\\x{...}``, ``(?<name>...)``, ``x{,n}`` (a literal in RE2) and flag
  groups in mid-pattern (``a(?i)b``, scoped to the end of their group) are rewritten;
  ``(?U)`` is dropped: leftmost-longest matching makes greediness moot.
* What RE2 refuses (lookarounds, backreferences, possessive quantifiers, ``\\Z``, ``\\C``,
  the ``x``/``u``/``a`` flags) is refused here too, as onnxruntime refuses such a model;
  Unicode classes (``\\pL``) are refused as beyond ``re``.

Left as ``re`` has them: Unicode case folding's rare corners (``re`` folds a few characters,
such as U+0130, that RE2's simple folding does not), and ``$`` outside an ``(?m:...)`` group
of a pattern that uses ``m`` elsewhere.
"""

from __future__ import annotations

import functools
import re
from re import _parser as sre_parse  # re's own parse tree: what a pattern can match

MAX_CODE_POINT = 0x10FFFF
_ASCII_SETS = {  # RE2's Perl and POSIX classes, as inclusive code point ranges
    "d": [(0x30, 0x39)],
    "s": [(0x09, 0x0A), (0x0C, 0x0D), (0x20, 0x20)],
    "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "alnum": [(0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)],
    "alpha": [(0x41, 0x5A), (0x61, 0x7A)],
    "ascii": [(0x00, 0x7F)],
    "blank": [(0x09, 0x09), (0x20, 0x20)],
    "cntrl": [(0x00, 0x1F), (0x7F, 0x7F)],
    "digit": [(0x30, 0x39)],
    "graph": [(0x21, 0x7E)],
    "lower": [(0x61, 0x7A)],
    "print": [(0x20, 0x7E)],
    "punct": [(0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E)],
    "space": [(0x09, 0x0D), (0x20, 0x20)],
    "upper": [(0x41, 0x5A)],
    "word": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "xdigit": [(0x30, 0x39), (0x41, 0x46), (0x61, 0x66)],
}
_REFUSED_GROUPS = {"=": "lookahead", "!": "negative lookahead", "<=": "lookbehind",
                   "<!": "negative lookbehind", ">": "atomic group", "#": "comment group",
                   "(": "conditional group", "P=": "backreference", "P>": "recursion"}
_REFUSED_ESCAPES = {"Z": "\\Z (RE2 writes \\z)", "C": "\\C (a single byte)",
                    "p": "Unicode classes (\\p)", "P": "Unicode classes (\\P)",
                    "N": "named characters (\\N)", "u": "\\u escapes", "U": "\\U escapes",
                    "G": "\\G", "X": "\\X", "R": "\\R", "K": "\\K"}
_RE2_FLAGS = set("imsU")


def python_pattern(pattern: str) -> str:
    """``pattern`` (RE2 syntax) rewritten for Python's ``re`` with RE2's meaning; ValueError
    for what RE2 refuses or ``re`` cannot express."""
    return _Translation(pattern).result()


class _Translation:
    """One left-to-right pass over an RE2 pattern, writing its ``re`` form."""

    def __init__(self, pattern: str):
        self.source, self.at, self.out = pattern, 0, []
        self.multiline = bool(re.search(r"\(\?[imsU]*m", pattern))
        # per open group: how many scoped flag groups a bare (?flags) opened inside it
        self.pending = [0]

    def result(self) -> str:
        while self.at < len(self.source):
            self.step()
        self.out.append(")" * self.pending[0])
        return "".join(self.out)

    def refuse(self, what: str):
        raise ValueError(f"pattern {self.source!r}: {what} is not RE2 syntax mixrt can run "
                         f"(at offset {self.at})")

    def peek(self, text: str) -> bool:
        return self.source.startswith(text, self.at)

    def step(self) -> None:
        char = self.source[self.at]
        if char == "\\":
            self.out.append(self.escape(inside_class=False))
        elif char == "[":
            self.out.append(self.char_class())
        elif char == "(":
            self.open_group()
        elif char == ")":
            self.at += 1
            closing = self.pending.pop() if len(self.pending) > 1 else 0
            self.out.append(")" * closing + ")")
        elif char == "$":
            self.at += 1
            self.out.append("$" if self.multiline else r"\Z")
        elif char == "{" and self.source.startswith("{,", self.at):
            self.at += 1
            self.out.append(r"\{")  # RE2 reads x{,n} as text; re as x{0,n}
        elif char in "*+?":
            self.at += 1
            self.out.append(char)
            if self.peek("+"):  # RE2 refuses a repeated repetition; re reads it possessive
                self.refuse("a possessive quantifier")
        else:
            self.at += 1
            self.out.append(char)

    # -- groups ---------------------------------------------------------------------------

    def open_group(self) -> None:
        self.at += 1
        if not self.peek("?"):
            self.pending.append(0)
            self.out.append("(")
            return
        self.at += 1
        for opener, what in _REFUSED_GROUPS.items():
            if self.peek(opener):
                self.refuse(f"a {what}")
        if self.peek("P<") or self.peek("<"):
            self.at += 2 if self.peek("P<") else 1
            self.pending.append(0)
            self.out.append("(?P<")
            return
        self.flag_group()

    def flag_group(self) -> None:
        end = self.at
        while end < len(self.source) and self.source[end] not in ":)":
            end += 1
        flags = self.source[self.at:end]
        if end == len(self.source) or not set(flags) <= _RE2_FLAGS | {"-"} or \
                not flags.strip("-"):
            self.refuse(f"the group (?{flags}")
        on, _, off = flags.partition("-")
        on, off = on.replace("U", ""), off.replace("U", "")
        written = f"(?{on}-{off}:" if off else f"(?{on}:"
        self.at = end + 1
        self.out.append(written)
        if self.source[end] == ":":
            self.pending.append(0)
        else:  # (?i) rules to the end of the enclosing group: re only knows it scoped
            self.pending[-1] += 1

    # -- escapes and classes --------------------------------------------------------------

    def escape(self, *, inside_class: bool) -> str:
        """The ``re`` form of the escape at ``self.at`` (a backslash)."""
        if self.at + 1 >= len(self.source):
            self.refuse("a trailing backslash")
        letter = self.source[self.at + 1]
        self.at += 2
        if letter in _REFUSED_ESCAPES:
            self.refuse(_REFUSED_ESCAPES[letter])
        if letter in "dswDSW":
            return _set_text(_ASCII_SETS[letter.lower()], letter.isupper(), inside_class)
        if letter in "bB":
            if inside_class:
                return r"\x08" if letter == "b" else self.refuse("\\B in a class")
            return f"(?a:\\{letter})"
        if letter == "z":
            return r"\Z"
        if letter == "Q":
            return self.quoted()
        if letter == "x" and self.peek("{"):
            return self.braced_code_point()
        if letter.isdigit():
            return self.octal(letter)
        return "\\" + letter

    def quoted(self) -> str:
        end = self.source.find("\\E", self.at)
        end = len(self.source) if end < 0 else end
        text, self.at = self.source[self.at:end], min(end + 2, len(self.source))
        return "".join(re.escape(c) for c in text)

    def braced_code_point(self) -> str:
        end = self.source.find("}", self.at)
        try:
            code = int(self.source[self.at + 1:end], 16) if end > 0 else -1
        except ValueError:
            code = -1
        if not 0 <= code <= MAX_CODE_POINT:
            self.refuse("a bad \\x{...} escape")
        self.at = end + 1
        return f"\\U{code:08X}"

    def octal(self, first: str) -> str:
        digits = first
        while len(digits) < 3 and self.at < len(self.source) and self.source[self.at] in \
                "01234567":
            digits += self.source[self.at]
            self.at += 1
        if first not in "01234567" or (first != "0" and len(digits) == 1):
            self.refuse(f"the backreference \\{digits}")
        return f"\\U{int(digits, 8):08X}"

    def char_class(self) -> str:
        self.at += 1
        parts = ["["]
        if self.peek("^"):
            parts.append("^")
            self.at += 1
        if self.peek("]"):  # a ] first is a member, not the end
            parts.append(r"\]")
            self.at += 1
        while self.at < len(self.source) and self.source[self.at] != "]":
            parts.append(self.class_member())
        if self.at >= len(self.source):
            self.refuse("an unclosed [")
        self.at += 1
        return "".join(parts) + "]"

    def class_member(self) -> str:
        char = self.source[self.at]
        if char == "\\":
            return self.escape(inside_class=True)
        if self.peek("[:"):
            end = self.source.find(":]", self.at + 2)
            name = self.source[self.at + 2:end] if end > 0 else ""
            negated = name.startswith("^")
            if name.lstrip("^") not in _ASCII_SETS or len(name.lstrip("^")) == 1:
                self.refuse(f"the class [:{name}:]")
            self.at = end + 2
            return _set_text(_ASCII_SETS[name.lstrip("^")], negated, inside_class=True)
        self.at += 1
        # re warns of set operations (&&, ||, ~~, --) and nested sets to come: RE2 has none
        return "\\" + char if char in "[&|~" else char


def _set_text(ranges: list, negated: bool, inside_class: bool) -> str:
    """An ASCII set as ``re`` text: its ranges, or those of its complement when negated,
    bare inside a class and bracketed outside one."""
    if negated:
        ranges = _complement(ranges)
    body = "".join(f"\\U{lo:08X}" if lo == hi else f"\\U{lo:08X}-\\U{hi:08X}"
                   for lo, hi in ranges)
    return body if inside_class else f"[{body}]"


def _complement(ranges: list) -> list:
    gaps, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            gaps.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        gaps.append((start, MAX_CODE_POINT))
    return gaps


# -- leftmost-longest search ------------------------------------------------------------------

class Re2Pattern:
    """An RE2 pattern compiled with ``re``; :meth:`search` finds its leftmost-longest match.

    Both engines start a match at the same leftmost position; only its length can differ.
    Where the pattern is a run of single-character items under greedy quantifiers (and
    anchors, and plain groups of these: ``[a-z]+``, ``\\s``, ``ab*c``), ``re``'s first match
    is already the longest; otherwise the longest is sought among the ends past it.
    """

    def __init__(self, pattern: str):
        self.source = pattern
        self.python = python_pattern(pattern)
        try:
            self.regex = re.compile(self.python)
        except re.error as exc:
            raise ValueError(f"pattern {pattern!r} is not a valid regular expression: "
                             f"{exc}") from None
        tree = sre_parse.parse(self.python)
        low, high = tree.getwidth()
        self.matches_empty = low == 0
        self.max_width = high
        self.first_is_longest = _single_char_run(tree)
        self._sees_past_end = _has_assertion(tree, ignored=_START_ANCHORS)
        # matches the same text wherever that text stands (no anchor, no boundary)
        self.context_free = not _has_assertion(tree, ignored=frozenset())

    def search(self, text: str, start: int) -> tuple[int, int] | None:
        """(start, end) of the leftmost-longest match at or after ``start``, or None."""
        found = self.regex.search(text, start)
        if found is None:
            return None
        begin, end = found.span()
        if not self.first_is_longest:
            end = self._longest_end(text, begin, end)
        return begin, end

    def _longest_end(self, text: str, begin: int, shortest: int) -> int:
        last = min(len(text), begin + self.max_width)
        for end in range(last, shortest, -1):
            if self._matches_exactly(text, begin, end):
                return end
        return shortest

    def _matches_exactly(self, text: str, begin: int, end: int) -> bool:
        if not self._sees_past_end:  # cutting the text at ``end`` changes nothing it reads
            return self.regex.fullmatch(text, begin, end) is not None
        return _ending_before(self.python, len(text) - end).match(text, begin) is not None


@functools.lru_cache(maxsize=256)
def _ending_before(python: str, remaining: int) -> re.Pattern:
    """The pattern, made to match only where exactly ``remaining`` characters follow."""
    return re.compile(f"(?:{python})(?=(?s:.){{{remaining}}}\\Z)")


_SINGLE_CHAR = {sre_parse.LITERAL, sre_parse.NOT_LITERAL, sre_parse.IN, sre_parse.ANY,
                sre_parse.CATEGORY}
_START_ANCHORS = frozenset({sre_parse.AT_BEGINNING, sre_parse.AT_BEGINNING_STRING,
                            sre_parse.AT_BEGINNING_LINE})


def _single_char_run(tree) -> bool:
    """Whether ``tree`` is a sequence of single-character items (each possibly under a
    greedy quantifier), anchors and plain groups of these, where ``re``'s backtracking
    finds the longest match first."""
    for code, value in tree:
        if code in _SINGLE_CHAR or code == sre_parse.AT:
            continue
        if code == sre_parse.MAX_REPEAT and len(value[2]) == 1 and \
                value[2][0][0] in _SINGLE_CHAR:
            continue
        if code == sre_parse.SUBPATTERN and _single_char_run(value[3]):
            continue
        return False
    return True


def _has_assertion(tree, ignored) -> bool:
    """Whether anything in ``tree`` but the anchors ``ignored`` looks around where it
    stands: with ``_START_ANCHORS`` ignored, whether it looks past its end (``\\b``,
    ``\\Z``, ``$``), which a cut-off text would answer differently."""
    for code, value in tree:
        if code == sre_parse.AT and value not in ignored:
            return True
        if code in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            return True
        for part in value if isinstance(value, (tuple, list)) else ():
            subtrees = part if isinstance(part, list) else [part]
            if any(isinstance(s, sre_parse.SubPattern) and _has_assertion(s, ignored)
                   for s in subtrees):
                return True
    return False


@functools.lru_cache(maxsize=64)
def compiled(pattern: str) -> Re2Pattern:
    return Re2Pattern(pattern)
