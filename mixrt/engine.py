"""MXNet's ``mx.engine``: the bulk size of imperative execution, over mixrt's dependency
engine (``runtime/engine.py``).

    with mx.engine.bulk(10):          # up to 10 imperative ops per engine push, in MXNet
        x += 1

MXNet groups that many consecutive imperative ops into one push to save the threaded
engine's per-op overhead. mixrt's imperative ops already run inline on the caller's thread
once their inputs are free (the engine's fast path), so there is nothing to group: the
size is kept and answered, as MXNet does, and results and errors come as they would
without it. ``set_bulk_size`` refuses what MXNet refuses (a negative size, a non-integer).
"""

from __future__ import annotations

import numbers
import threading
from contextlib import contextmanager
from typing import Iterator

from mixrt.base.errors import InputError
from mixrt.runtime.engine import get_engine, set_engine  # noqa: F401  (the engine itself)

_lock = threading.Lock()
_bulk_size = [0]  # MXNet's default: no bulking of imperative ops


def set_bulk_size(size) -> int:
    """Set the number of imperative ops bulked per push; returns the previous size."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
        raise InputError(f"engine.set_bulk_size: size must be a non-negative int, got "
                         f"{size!r}")
    with _lock:
        previous, _bulk_size[0] = _bulk_size[0], int(size)
    return previous


def bulk_size() -> int:
    """The bulk size now in force."""
    return _bulk_size[0]


@contextmanager
def bulk(size) -> Iterator[None]:
    """Bulk up to ``size`` imperative ops inside the block; the previous size comes back
    after it, even when the block raises."""
    previous = set_bulk_size(size)
    try:
        yield
    finally:
        set_bulk_size(previous)


__all__ = ["bulk", "set_bulk_size", "bulk_size"]
