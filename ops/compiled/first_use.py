"""C entry points compiled on their first use, not when their kernel file is imported.

numba compiles a ``cfunc`` where it is declared, so a kernel file's entries were all compiled
(or loaded) as the file was imported: ``ops/rnn/_jit_recurrent.py``'s six (LSTM, GRU and
RNN, each dtype) took ~50 s of a first GRU model's background compile on a 2-core Xeon
(2026-11-30), to use one of them or none (a part entry runs only where a sequence splits over
the native workers). Declared with :func:`first_use_cfunc` instead, an entry is an object
whose ``address`` (or any other attribute of the ``cfunc``) compiles it, or loads it from the
caches, the first time it is read; then it is a plain attribute.

Compiling happens where numba's caches allow it: under ``jit_tier.loading_only`` (a serving
run's new shape) an entry in no cache raises ``CompileForbidden`` like any kernel, the step
runs its NumPy path and the background compiler compiles it; the compile child, running the
same model, reads the same entries. The wheel's prebuild (``_prebuild.compile_entry``)
compiles the recorded ones through :meth:`FirstUseEntry.compile`; an entry keeps its body's
name and module, so the record of a loaded entry names the attribute that holds it.
"""

from __future__ import annotations

import threading


class FirstUseEntry:
    """A ``cfunc`` of ``signature`` over ``body``, compiled on first use (module docstring)."""

    def __init__(self, body, signature, flags: dict):
        self.body, self.signature, self.flags = body, signature, flags
        self.__name__, self.__qualname__ = body.__name__, body.__qualname__
        self.__module__, self.__doc__ = body.__module__, body.__doc__
        self._compiled = None
        self._lock = threading.Lock()

    def compile(self):
        """The numba ``cfunc``, compiled (or loaded) once; may raise ``CompileForbidden``."""
        compiled = self._compiled
        if compiled is None:
            with self._lock:
                if self._compiled is None:
                    from numba import cfunc  # noqa: PLC0415  (numba loads on first use)
                    made = cfunc(self.signature, **self.flags)(self.body)
                    self.address = made.address  # a plain attribute from now on
                    self._compiled = made
                compiled = self._compiled
        return compiled

    def __getattr__(self, name: str):
        # reached only for what the instance does not hold: the cfunc's own attributes
        if name.startswith("__") or name in ("body", "signature", "flags", "_compiled"):
            raise AttributeError(name)
        return getattr(self.compile(), name)

    def __call__(self, *args):
        return self.compile()(*args)

    def __repr__(self) -> str:
        state = "compiled" if self._compiled is not None else "not compiled yet"
        return f"<first-use cfunc {self.__module__}.{self.__qualname__} ({state})>"


def first_use_cfunc(signature, **flags):
    """``@cfunc(signature, **flags)``, compiled where it is first used (module docstring)."""
    def declare(body) -> FirstUseEntry:
        return FirstUseEntry(body, signature, flags)
    return declare
