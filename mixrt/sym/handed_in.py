"""What the modules above the Symbol class hand in to it as they load: its arithmetic's op
call and layer names, its parameter-shape and dtype rules (``mixrt/sym/ops.py``), JSON
(``serialize.py``) and binding (``executor.py``).

Those modules build on :mod:`mixrt.sym.symbol`, so the class cannot import them; each calls
``hand_in`` as it is imported (``mixrt/sym/__init__.py`` imports them all), and the class and
the parts it is composed of look the functions up here when they run, so no import loop ties
them.
"""

from __future__ import annotations

_HANDED_IN: dict = {}


def hand_in(**functions) -> None:
    _HANDED_IN.update(functions)


def _handed_in(name: str):
    return _HANDED_IN[name]

