"""A bounded, thread-safe cache for things compiled per shape signature.

Sessions keep a plan per input-shape signature, the imperative autograd a compiled backward
per op call signature, a hybridized block a traced graph per input signature. A workload
whose shapes keep changing (sequences of every length, a smaller last batch) would otherwise
keep every one of them, arenas included, for the life of the process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Hashable

import numpy as np


class LruCache:
    """At most ``capacity`` entries, and with ``weight`` (value -> a number) at most
    ``budget`` of their weights together (the last ``keep`` kept whatever they weigh); the
    least recently used one goes first, and ``forgotten`` (where given) hears of each value
    that leaves, so whatever else refers to it can let it go."""

    def __init__(self, capacity: int, weight=None, budget: float = float("inf"),
                 keep: int = 1, forgotten=None):
        self.capacity = capacity
        self._weight, self._budget, self._held, self._keep = weight, budget, 0, keep
        self._forgotten = forgotten  # called with each value that leaves (evicted, dropped)
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value for ``key`` (now the most recently used), or None."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> Any:
        """Keep ``value`` unless another thread stored one first; returns the kept one."""
        with self._lock:
            kept = self._items.setdefault(key, value)
            self._items.move_to_end(key)
            if kept is value and self._weight is not None:
                self._held += self._weight(value)
            while len(self._items) > self.capacity or \
                    self._held > self._budget and len(self._items) > self._keep:
                self._forget(self._items.popitem(last=False)[1])
            return kept

    def _forget(self, value) -> None:
        if self._weight is not None:
            self._held -= self._weight(value)
        if self._forgotten is not None:
            self._forgotten(value)

    def drop(self, key: Hashable) -> None:
        """Forget ``key`` (nothing happens where it is not kept)."""
        with self._lock:
            dropped = self._items.pop(key, None)
            if dropped is not None:
                self._forget(dropped)

    def values(self) -> list:
        with self._lock:
            return list(self._items.values())

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._held = 0

    def __len__(self) -> int:
        return len(self._items)


def frozen(value) -> Hashable:
    """A hashable form of an op's attribute value (lists, arrays, dicts of them), for keys
    of the caches above."""
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    return value
