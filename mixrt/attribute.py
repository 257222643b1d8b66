"""Attributes given to every symbol made in a scope (MXNet's ``mx.AttrScope``).

    with mx.AttrScope(ctx_group="dev1", __init_bias__="0.0"):
        fc = mx.sym.FullyConnected(data, num_hidden=10)
    fc.attr("ctx_group")        # 'dev1'

Attributes are strings, stored on the symbol's node (``list_attr``, ``attr_dict``) and saved
with it; operators do not read them. Scopes nest, the inner value winning, and a symbol's
own ``attr=`` wins over the scope's.
"""

from __future__ import annotations

import threading

from mixrt.base.errors import GraphError
from mixrt.name import CurrentProperty, HasCurrent


class AttributeValueError(GraphError, ValueError):
    """An attribute value that is not a string (MXNet raises ValueError)."""


def _set_current_scope(cls, scope) -> None:
    if not isinstance(scope, AttrScope):
        raise GraphError(f"AttrScope.current must be an AttrScope, got {type(scope).__name__}")
    AttrScope._current.value = scope


class AttrScope(metaclass=HasCurrent):
    """The attributes ``kwargs`` (strings) for every symbol made inside ``with``;
    ``AttrScope.current`` is this thread's scope."""

    _current = threading.local()
    current = CurrentProperty(lambda cls: current(), _set_current_scope)

    def __init__(self, **kwargs):
        for key, value in kwargs.items():
            if not isinstance(value, str):
                raise AttributeValueError(f"AttrScope: attribute {key!r} must be a string, "
                                          f"got {type(value).__name__} {value!r}")
        self._attr = dict(kwargs)
        self._old_scope: AttrScope | None = None

    def get(self, attr: dict | None) -> dict:
        """The scope's attributes updated with ``attr`` (those the symbol was given)."""
        merged = dict(self._attr)
        merged.update(attr or {})
        return merged

    def __enter__(self) -> "AttrScope":
        self._old_scope = current()
        self._attr = {**self._old_scope._attr, **self._attr}
        AttrScope._current.value = self
        return self

    def __exit__(self, *exc_info) -> None:
        if self._old_scope is None:
            raise GraphError("AttrScope: exited without having been entered")
        AttrScope._current.value = self._old_scope
        self._old_scope = None


def current() -> AttrScope:
    """This thread's current scope (an empty one the first time a thread asks)."""
    scope = getattr(AttrScope._current, "value", None)
    if scope is None:
        scope = AttrScope._current.value = AttrScope()
    return scope


__all__ = ["AttrScope", "AttributeValueError", "current"]
