"""Automatic node names for symbols (MXNet's ``mx.name``).

    with mx.name.NameManager():                 # counters start again at 0 inside
        net = mx.sym.FullyConnected(data, num_hidden=10)    # fullyconnected0
    with mx.name.Prefix("mynet_"):
        net = mx.sym.FullyConnected(data, num_hidden=10, name="fc1")  # mynet_fc1

A symbol function asks the current manager for its node's name: the name the caller gave,
or a hint (the operator's name in lower case) and a counter per hint. Managers nest; each
thread has its own current one.
"""

from __future__ import annotations

import threading

from mixrt.base.errors import GraphError


class CurrentProperty:
    """MXNet's class property ``current`` (``NameManager.current``, ``AttrScope.current``):
    read on the class or an instance, this thread's current object; assigned on the
    class (through :class:`HasCurrent`), the new current one."""

    def __init__(self, fget, fset):
        self.fget, self.fset = fget, fset

    def __get__(self, instance, owner=None):
        return self.fget(owner if owner is not None else type(instance))

    def __set__(self, instance, value):
        self.fset(type(instance), value)


class HasCurrent(type):
    """A metaclass that sends ``Class.current = value`` to the class's CurrentProperty
    (a plain class attribute assignment would replace the property)."""

    def __setattr__(cls, key, value):
        found = cls.__dict__.get(key)
        if isinstance(found, CurrentProperty):
            found.fset(cls, value)
            return
        super().__setattr__(key, value)


def _set_current_manager(cls, manager) -> None:
    if not isinstance(manager, NameManager):
        raise GraphError(f"NameManager.current must be a NameManager, got "
                         f"{type(manager).__name__}")
    NameManager._current.value = manager


class NameManager(metaclass=HasCurrent):
    """Names nodes: the caller's name when given, else ``hint`` and a counter per hint
    (``fullyconnected0``, ``fullyconnected1``). ``with NameManager():`` makes it the
    current one, with counters of its own; ``NameManager.current`` is this thread's."""

    _current = threading.local()
    current = CurrentProperty(lambda cls: current(), _set_current_manager)

    def __init__(self):
        self._counter: dict[str, int] = {}
        self._old_manager: NameManager | None = None

    def get(self, name: str | None, hint: str) -> str:
        """The node's name: ``name`` when given, else the next automatic one for ``hint``."""
        if name:
            return name
        count = self._counter.get(hint, 0)
        self._counter[hint] = count + 1
        return f"{hint}{count}"

    def __enter__(self) -> "NameManager":
        self._old_manager = current()
        NameManager._current.value = self
        return self

    def __exit__(self, *exc_info) -> None:
        if self._old_manager is None:
            raise GraphError("NameManager: exited without having been entered")
        NameManager._current.value = self._old_manager
        self._old_manager = None


class Prefix(NameManager):
    """A manager that puts ``prefix`` before every name, given or automatic."""

    def __init__(self, prefix: str):
        super().__init__()
        if not isinstance(prefix, str):
            raise GraphError(f"Prefix: prefix must be a string, got {prefix!r}")
        self._prefix = prefix

    def get(self, name: str | None, hint: str) -> str:
        return self._prefix + super().get(name, hint)


def current() -> NameManager:
    """This thread's current manager (a fresh one the first time a thread asks)."""
    manager = getattr(NameManager._current, "value", None)
    if manager is None:
        manager = NameManager._current.value = NameManager()
    return manager


__all__ = ["NameManager", "Prefix", "current", "CurrentProperty", "HasCurrent"]
