"""What the modules above the Symbol class hand in to it as they load: its arithmetic's op
call and layer names (``mixrt/sym/ops.py``: ``call_op``, ``layer_name``) and binding
(``executor.py``: ``Executor``, ``simple_bind``).

Those modules build on :mod:`mixrt.sym.symbol` (an op call returns Symbols, an Executor
runs one), so the class cannot import them; each calls ``hand_in`` as it is imported
(``mixrt/sym/__init__.py`` imports them all), and the class looks the four functions up
here when it runs, so no import loop ties them. Whatever the class needs that does not
build on it sits below it and is imported as any module (its parameter rules,
``parameter_rules.py``; its JSON, ``symbol_json.py``).
"""

from __future__ import annotations

_HANDED_IN: dict = {}


def hand_in(**functions) -> None:
    _HANDED_IN.update(functions)


def _handed_in(name: str):
    return _HANDED_IN[name]

