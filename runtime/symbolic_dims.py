"""Dimensions as expressions of a feed signature's sizes, and the guards a trace takes.

A :class:`Trace` walks a graph once with every feed dimension a variable (``d0``, ``d1``,
...) instead of a number (``runtime/shape_programs.py``). A :class:`Dim` is one such
expression: the name of a local of the program the trace writes, and the number it stands
for at the signature traced, so that every rule computes what it computed before and the
trace can be checked against inference at that signature.

Arithmetic over dims writes a line of the program (``v3 = d1 * 12``), the same expression
twice the same local. A comparison a rule makes (is this axis 1, do these two dims agree)
is answered by the traced numbers and kept as a *guard*: the program it writes returns
None, for the caller to take the concrete way, at any signature where the comparison
would have gone the other way. Whatever a rule reads of a dim is therefore either
arithmetic the program repeats or a guard it checks: a dim turned into a plain number
(``int()``, ``__index__``, NumPy's conversion to int64) raises :class:`NotSymbolic`, and
the trace is given up, rather than fixed at that number without a guard.
"""

from __future__ import annotations

import numpy as np


class NotSymbolic(Exception):
    """What a trace cannot follow: a rule needs a dim as a plain number, or an op has none."""


_COMMUTATIVE = frozenset({"+", "*"})
_NEGATED = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
_COMPARE = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}
_ARITHMETIC = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "//": lambda a, b: a // b, "%": lambda a, b: a % b,
}


class Dim:
    """One dimension of a trace: ``code`` names the program's local holding it, ``value``
    is its number at the traced signature."""

    __slots__ = ("trace", "code", "value")

    def __init__(self, trace: "Trace", code: str, value: int):
        self.trace, self.code, self.value = trace, code, value

    def __repr__(self) -> str:
        return f"{self.code}={self.value}"

    def __add__(self, other):
        return self.trace.arithmetic("+", self, other)

    def __radd__(self, other):
        return self.trace.arithmetic("+", other, self)

    def __sub__(self, other):
        return self.trace.arithmetic("-", self, other)

    def __rsub__(self, other):
        return self.trace.arithmetic("-", other, self)

    def __mul__(self, other):
        return self.trace.arithmetic("*", self, other)

    def __rmul__(self, other):
        return self.trace.arithmetic("*", other, self)

    def __floordiv__(self, other):
        return self.trace.arithmetic("//", self, other)

    def __rfloordiv__(self, other):
        return self.trace.arithmetic("//", other, self)

    def __mod__(self, other):
        return self.trace.arithmetic("%", self, other)

    def __rmod__(self, other):
        return self.trace.arithmetic("%", other, self)

    def __neg__(self):
        return self.trace.arithmetic("-", 0, self)

    def __eq__(self, other):
        return self.trace.compare("==", self, other)

    def __ne__(self, other):
        return self.trace.compare("!=", self, other)

    def __lt__(self, other):
        return self.trace.compare("<", self, other)

    def __le__(self, other):
        return self.trace.compare("<=", self, other)

    def __gt__(self, other):
        return self.trace.compare(">", self, other)

    def __ge__(self, other):
        return self.trace.compare(">=", self, other)

    __hash__ = None  # a dim in a set or a dict key would compare without a guard

    def __index__(self):
        raise NotSymbolic(f"dim {self.code} ({self.value}) read as a plain number")

    __int__ = __float__ = __bool__ = __index__


def number(value):
    """A plain int for NumPy's integers (and bools), the dim itself for a :class:`Dim`."""
    if value.__class__ is Dim or value.__class__ is int:
        return value
    if isinstance(value, (int, np.integer, np.bool_)):  # bool is an int
        return int(value)
    raise NotSymbolic(f"{type(value).__name__} {value!r} where a dim was expected")


def concrete(value):
    """The traced number of a dim, a plain int as it is."""
    return value.value if value.__class__ is Dim else value


def code_of(value) -> str:
    return value.code if value.__class__ is Dim else repr(int(value))


class Trace:
    """The program's lines as a trace writes them: definitions and guards, in order."""

    def __init__(self):
        self.lines: list[str] = []
        self._defined: dict = {}  # (op, codes) -> Dim: one local per expression
        self._guarded: set = set()
        self._locals = 0

    def variable(self, code: str, value: int) -> Dim:
        """A dim the program's caller defines (a feed's size)."""
        return Dim(self, code, value)

    def local(self, prefix: str = "v") -> str:
        self._locals += 1
        return f"{prefix}{self._locals}"

    def arithmetic(self, op: str, a, b):
        a, b = number(a), number(b)
        if a.__class__ is int and b.__class__ is int:
            return _ARITHMETIC[op](a, b)
        simpler = _simplified(op, a, b)
        if simpler is not None:
            return simpler
        if op in ("//", "%") and b.__class__ is Dim:
            self.guard("!=", b, 0)  # Python's floor division, here and in the program
        codes = (code_of(a), code_of(b))
        if op in _COMMUTATIVE:
            codes = tuple(sorted(codes))
        key = (op, codes)
        found = self._defined.get(key)
        if found is None:
            found = Dim(self, self.local(), _ARITHMETIC[op](concrete(a), concrete(b)))
            self.lines.append(f"{found.code} = {codes[0]} {op} {codes[1]}")
            self._defined[key] = found
        return found

    def maximum(self, a, b):
        return self._extreme("max", a, b)

    def minimum(self, a, b):
        return self._extreme("min", a, b)

    def _extreme(self, which: str, a, b):
        a, b = number(a), number(b)
        if a.__class__ is int and b.__class__ is int or code_of(a) == code_of(b):
            return max(a, b) if which == "max" else min(a, b)
        codes = tuple(sorted((code_of(a), code_of(b))))
        key = (which, codes)
        found = self._defined.get(key)
        if found is None:
            pick = max if which == "max" else min
            found = Dim(self, self.local(), pick(concrete(a), concrete(b)))
            self.lines.append(f"{found.code} = {which}({codes[0]}, {codes[1]})")
            self._defined[key] = found
        return found

    def compare(self, op: str, a, b) -> bool:
        """The comparison at the traced numbers, kept as a guard where it reads a dim."""
        a, b = number(a), number(b)
        outcome = _COMPARE[op](concrete(a), concrete(b))
        if a.__class__ is Dim or b.__class__ is Dim:
            if code_of(a) == code_of(b):
                return outcome  # the same expression: equal at every signature
            self.guard(op if outcome else _NEGATED[op], a, b)
        return outcome

    def guard(self, op: str, a, b) -> None:
        """The program goes on only where ``a op b`` (true at the traced numbers)."""
        condition = f"{code_of(a)} {op} {code_of(b)}"
        if condition not in self._guarded:
            self._guarded.add(condition)
            self.lines.append(f"if not ({condition}): return None")


def _simplified(op: str, a, b):
    """``a op b`` where one side makes it trivial (x + 0, x * 1, x // 1, x * 0), else None."""
    if op == "+":
        if a.__class__ is int and a == 0:
            return b
        return a if b.__class__ is int and b == 0 else None
    if op == "-":
        return a if b.__class__ is int and b == 0 else None
    if op == "*":
        for one, other in ((a, b), (b, a)):
            if one.__class__ is int and one in (0, 1):
                return other if one == 1 else 0
        return None
    if op == "//":
        return a if b.__class__ is int and b == 1 else None
    return None


def product(dims):
    """The product of ints and dims, as arithmetic of the trace."""
    result = 1
    for dim in dims:
        result = result * number(dim)
    return result
