"""MXNet's user-annotated profiler objects (``mixrt.profiler`` is the public module):
``Domain`` and the ``Task``, ``Frame``, ``Counter`` and ``Marker`` made in one, and ``Event``.

They write Chrome-trace events as MXNet's do, recorded only while the profiler runs: a task
is an async pair ("b"/"e", category the domain's name, an id), a frame a "("/")" pair
(category "<domain>,frame"), an event a "B"/"E" pair (category "event"), a counter a "C"
event per value (``args: {name: value}``), a marker an instant ("n", category
"<domain>,instant_marker"). With aggregate statistics, tasks, frames and events count in
``dumps`` under their domain ("event" for events) by name.
"""

from __future__ import annotations

import itertools
import threading
import time

from mixrt.base.errors import InputError
from mixrt.runtime import profiler as _runtime

_IDS = itertools.count(1)


def _name(value, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"profiler.{what}: name must be a non-empty string, got {value!r}")
    return value


def _record(event: dict) -> None:
    """``event`` (without ts, pid, tid) into the process-wide trace while it runs."""
    profiler = _runtime.current()
    if profiler is None:
        return
    # the runtime profiler's own clock and event list (mixrt/profiler.py is its frontend)
    now = time.perf_counter()
    profiler._add({**event, "ts": profiler._us(now), "pid": profiler._pid,
                   "tid": threading.get_ident()})


def _count(category: str, name: str, started: float) -> None:
    profiler = _runtime.current()
    if profiler is None or profiler.stats is None:
        return
    duration = round((time.perf_counter() - started) * 1e6, 3)
    with profiler._lock:
        _runtime._accumulate(profiler.stats, (category, name), duration)


class Domain:
    """A named group of tasks, frames, counters and markers."""

    def __init__(self, name):
        self.name = _name(name, "Domain")

    def __str__(self) -> str:
        return self.name

    def new_task(self, name) -> "Task":
        return Task(self, name)

    def new_frame(self, name) -> "Frame":
        return Frame(self, name)

    def new_counter(self, name, value=None) -> "Counter":
        return Counter(self, name, value)

    def new_marker(self, name) -> "Marker":
        return Marker(self, name)


def _domain(domain, what: str) -> Domain:
    if not isinstance(domain, Domain):
        raise InputError(f"profiler.{what}: domain must be a profiler.Domain, got {domain!r}")
    return domain


class _Span:
    """A named interval: ``start()`` then ``stop()``."""

    _begin = _end = ""

    def __init__(self, name, category: str, what: str):
        self.name = _name(name, what)
        self._category = category
        self._started = None
        self._id = next(_IDS)

    def __str__(self) -> str:
        return self.name

    def _event(self, phase: str) -> dict:
        return {"name": self.name, "cat": self._category, "ph": phase}

    def start(self) -> None:
        self._started = time.perf_counter()
        _record(self._event(self._begin))

    def stop(self) -> None:
        if self._started is None:
            raise InputError(f"profiler: {type(self).__name__} {self.name!r} stopped before "
                             f"it started")
        _record(self._event(self._end))
        _count(self._category.split(",")[0], self.name, self._started)
        self._started = None


class Task(_Span):
    """A task of a domain: an async interval."""

    _begin, _end = "b", "e"

    def __init__(self, domain, name):
        self.domain = _domain(domain, "Task")
        super().__init__(name, domain.name, "Task")

    def _event(self, phase: str) -> dict:
        return {**super()._event(phase), "id": self._id}


class Frame(_Span):
    """A frame of a domain (a stretch such as one iteration)."""

    _begin, _end = "(", ")"

    def __init__(self, domain, name):
        self.domain = _domain(domain, "Frame")
        super().__init__(name, f"{domain.name},frame", "Frame")


class Event(_Span):
    """An interval of its own, outside any domain."""

    _begin, _end = "B", "E"

    def __init__(self, name):
        super().__init__(name, "event", "Event")


class Counter:
    """A value traced over time: ``set_value``, ``increment``, ``decrement``, ``+=``,
    ``-=``."""

    def __init__(self, domain, name, value=None):
        self.domain = _domain(domain, "Counter")
        self.name = _name(name, "Counter")
        self.value = 0
        if value is not None:
            self.set_value(value)

    def __str__(self) -> str:
        return self.name

    def set_value(self, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"profiler.Counter {self.name!r}: values are integers, got "
                             f"{value!r}")
        self.value = value
        _record({"name": self.name, "cat": self.domain.name, "ph": "C",
                 "args": {self.name: value}})

    def increment(self, delta=1) -> None:
        self.set_value(self.value + delta)

    def decrement(self, delta=1) -> None:
        self.set_value(self.value - delta)

    def __iadd__(self, delta):
        self.increment(delta)
        return self

    def __isub__(self, delta):
        self.decrement(delta)
        return self


class Marker:
    """An instant: ``Marker(domain, name).mark(scope)``, MXNet's form; ``Marker(name)``
    marks outside any domain, named with the enclosing ``profiler.scope``."""

    def __init__(self, domain, name=None):
        if name is None:  # Marker(name): mixrt's shorter form
            self.domain, self.name = None, _name(domain, "Marker")
        else:
            self.domain, self.name = _domain(domain, "Marker"), _name(name, "Marker")

    def mark(self, scope: str = "process") -> None:
        """``scope``: how far the line is drawn — "global", "process" or "thread"."""
        if scope not in _runtime.INSTANT_SCOPES:
            raise InputError(f"profiler.Marker.mark: scope must be one of "
                             f"{list(_runtime.INSTANT_SCOPES)}, got {scope!r}")
        profiler = _runtime.current()
        if profiler is None:
            return
        if self.domain is None:
            profiler.mark(self.name, scope)
        else:
            _record({"name": self.name, "cat": f"{self.domain.name},instant_marker",
                     "ph": "n", "s": _runtime.INSTANT_SCOPES[scope], "id": next(_IDS)})


__all__ = ["Domain", "Task", "Frame", "Event", "Counter", "Marker"]
