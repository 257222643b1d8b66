"""What the module above the Symbol class hands in to it as it loads: binding
(``executor.py``: ``Executor``, ``simple_bind``, what ``Symbol.bind`` and
``Symbol.simple_bind`` call).

The Executor builds on :mod:`mixrt.sym.symbol` (it runs a Symbol's graphs as sessions over
NDArrays), so the class cannot import it; ``executor.py`` calls ``hand_in`` as it is imported
(``mixrt/sym/__init__.py`` imports it), and the class looks the two functions up here when it
binds, so no import loop ties them. Whatever else the class needs sits below it or in its
own module and is imported as any module (its op calls, its parameter rules,
``parameter_rules.py``, its JSON, ``symbol_json.py``).
"""

from __future__ import annotations

_HANDED_IN: dict = {}


def hand_in(**functions) -> None:
    _HANDED_IN.update(functions)


def _handed_in(name: str):
    return _HANDED_IN[name]

