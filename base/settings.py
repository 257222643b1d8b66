"""Environment settings read on a run's hot path.

mixrt's switches (``MIXRT_INTRA_OP_THREADS``, ``MIXRT_NATIVE_POOL``...) are read when they are
used, not once at import, so a process (a test, a notebook) may change them between runs.
``os.environ.get`` costs ~0.5-1 us a call: it encodes the name, looks it up and decodes the
value, in four Python frames. A one-node model's run is ~8 us, and a few of those reads a run
were a quarter of it. :func:`setting` reads CPython's bytes mapping behind ``os.environ`` with
the name encoded once, and decodes a value only when it changed: ~0.1 us, the same answer.
Anything that sets the variable through ``os.environ`` (``monkeypatch.setenv`` included) is
seen at the next call; ``os.putenv`` alone is not, as for ``os.environ`` itself.

:func:`process_id` is ``os.getpid()`` for the same paths (pools are kept per process, and a
forked child must not use its parent's threads): a system call each time, ~0.1 us, where
this is kept by a fork hook.
"""

from __future__ import annotations

import os

# name -> (the encoded name, the last raw value seen, its decoded form), replaced whole so that
# a thread never sees one value's bytes with another's text
_known: dict[str, tuple] = {}


def setting(name: str, default: str = "") -> str:
    """``os.environ.get(name, default)``, read cheaply (see the module's docstring)."""
    data = getattr(os.environ, "_data", None)
    known = _known.get(name)
    if known is None:
        known = _known[name] = (_encoded(name), None, None)
    if data is None or known[0] is None:  # not CPython's POSIX mapping: the plain read
        return os.environ.get(name, default)
    raw = data.get(known[0])
    if raw is None:
        return default
    if raw is not known[1]:
        known = _known[name] = (known[0], raw, os.environ.get(name, default))
    return known[2]


def _encoded(name: str):
    """The key ``os.environ`` stores ``name`` under, when it is bytes (POSIX), else None."""
    try:
        key = os.environ.encodekey(name)
    except (AttributeError, TypeError, UnicodeError):
        return None
    return key if isinstance(key, bytes) else None


def batch_invariant() -> bool:
    """``MIXRT_BATCH_INVARIANT=1``: the dense products take one form whatever the number of
    rows, so that a row's result does not depend on the rows beside it (``mixrt serve``
    joins requests into batches and sets it; ``ops/nn/matmul_cpu.py`` says what changes)."""
    return setting("MIXRT_BATCH_INVARIANT") == "1"


def process_id() -> int:
    """This process's id (``os.getpid()``, kept current across forks)."""
    return _pid[0]


_pid = [os.getpid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
else:  # no fork to follow: ask each time
    process_id = os.getpid  # noqa: F811
