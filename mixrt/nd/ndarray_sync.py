"""An NDArray's synchronisation with the engine: engine work (a KVStore pull, ``copyto``
another device) writes arrays asynchronously, so every read first waits for the array's
pending writes (``_read``) and every in-place write for its pending reads and writes
(``_write``, which also counts the write and refuses one autograd would lose). A view and its
base share one engine tag and one version counter (``_share_memory_of``).

:class:`EngineSync` is one of the parts :class:`mixrt.nd.ndarray.NDArray` is composed of; it
keeps the rules of when an array's memory may be touched apart from what is done with it.
"""

from __future__ import annotations

from mixrt import tape
from mixrt.base.errors import GradientError
from mixrt.runtime.engine import get_engine


class EngineSync:
    """Waiting on the engine before an array's memory is read or written (the array's
    ``_data``, ``_var``, ``_base``, ``_versions``, ``_entry`` and ``_grad``)."""

    __slots__ = ()

    def _read(self):
        var = self._var if self._base is None else self._base._var
        if var is not None:
            _engine().wait_to_read(var)
        return self._data

    def _read_carrying(self):
        """The data once pending writes are done, and the error they left that no wait has
        raised yet (None when there is none): for a copy or a view, which carries the
        error on instead of raising it, as MXNet's asynchronous copies do (an op does the
        same in ``dispatch._carried_failure``)."""
        var = self._var if self._base is None else self._base._var
        failure = None if var is None else _engine().failure_of(var)
        return (self._data if failure is not None else self._read()), failure

    def _write(self):
        """The data, for an in-place write that follows (bumps the version)."""
        if tape.is_recording() and (self._entry is not None or self._grad is not None):
            raise GradientError(
                "in-place write to an array autograd is recording (it was computed under "
                "record() or has a gradient attached); write `y = x + v` instead of "
                "`x += v`, or do the update under autograd.pause()")
        var = self._var if self._base is None else self._base._var
        if var is not None:
            _engine().wait_to_write(var)
        self._versions[0] += 1
        return self._data

    @property
    def _version(self) -> int:
        """In-place writes to this array's memory so far (through it or a view)."""
        return self._versions[0]

    def _share_memory_of(self, source: "NDArray") -> "NDArray":
        """Mark this array as a view of ``source``'s memory: one version counter and one
        engine tag for both."""
        root = source if source._base is None else source._base
        self._base = root
        self._versions = root._versions
        return self

    def engine_var(self):
        """This array's engine tag, for work pushed to ``mixrt.runtime.engine`` (a view's
        is its base's)."""
        if self._base is not None:
            return self._base.engine_var()
        if self._var is None:
            self._var = _engine().new_var(f"ndarray{id(self):x}")
        return self._var

    def wait_to_read(self) -> "NDArray":
        self._read()
        return self


def _engine():
    return get_engine()
