"""What one run is told: a time limit, and a way to end it from another thread.

``Session.run(names, feeds, run_options)`` takes a :class:`RunOptions` as onnxruntime's
``InferenceSession.run`` does: setting ``terminate`` from another thread ends the run at its
next check, as onnxruntime's does, and ``timeout`` (seconds; onnxruntime has none) ends it
once that long has passed since the run began. Either way the run raises
:class:`~mixrt.errors.RunTerminated` naming the node it stopped in, its arena goes back, and
the session runs its next request as before: a model whose run takes minutes (a Loop whose
trip count comes from its input, a huge NonMaxSuppression) no longer holds its caller.

The run loop checks between nodes (``runtime/run_loop.py``); the kernels with long loops of
their own check between their steps (:func:`check`: Loop's and Scan's iterations,
NonMaxSuppression's boxes, the string operators' texts). A run without options pays one
context-variable read.
"""

from __future__ import annotations

import contextlib
import contextvars
import time

# the run in progress on this thread (or task) that has a deadline or may be terminated
_CURRENT: contextvars.ContextVar = contextvars.ContextVar("mixrt_run_limits", default=None)


class RunOptions:
    """onnxruntime's ``RunOptions`` as far as a mixrt run honours it: ``terminate``,
    ``timeout`` (seconds from the run's start, None for none), and ``run_tag`` and
    ``log_severity_level``, kept for the caller (mixrt logs nothing per run)."""

    def __init__(self, timeout: float | None = None, terminate: bool = False):
        if timeout is not None and not timeout > 0:
            raise ValueError(f"RunOptions.timeout is {timeout!r}; expected a number of "
                             f"seconds above 0, or None")
        self.timeout = timeout
        self.terminate = terminate
        self.run_tag = ""
        self.log_severity_level = 2
        self.log_verbosity_level = 0


class Expired(Exception):
    """Raised inside a run where its limit is reached; the run loop makes it a
    :class:`~mixrt.errors.RunTerminated` that names the node."""


class _Limits:
    __slots__ = ("options", "ends")

    def __init__(self, options: RunOptions):
        self.options = options
        self.ends = None if options.timeout is None else time.monotonic() + options.timeout

    def check(self) -> None:
        if self.options.terminate:
            raise Expired("its RunOptions.terminate was set")
        if self.ends is not None and time.monotonic() >= self.ends:
            raise Expired(f"its RunOptions.timeout of {self.options.timeout:g} s passed")


def check() -> None:
    """Raise :class:`Expired` where the run in progress has reached its limit (a kernel's
    long loop asks between its steps)."""
    limits = _CURRENT.get()
    if limits is not None:
        limits.check()


def each(values):
    """``values``, with the run's limits checked before each one where the run has limits
    (a kernel's loop over its texts or rows); ``values`` as they are otherwise."""
    limits = _CURRENT.get()
    return values if limits is None else _checking(values, limits)


def _checking(values, limits):
    for value in values:
        limits.check()
        yield value


# the limits of the run in progress, or None: the run loop's test per run (the context
# variable's own method, without a Python call's frame)
current = _CURRENT.get


@contextlib.contextmanager
def limited(options: RunOptions | None):
    """The block runs under ``options``' limits (none where ``options`` is None)."""
    if options is None:
        yield
        return
    if not isinstance(options, RunOptions):
        raise TypeError(f"run_options must be a mixrt.RunOptions, got "
                        f"{type(options).__name__}")
    limits = _Limits(options)
    limits.check()  # terminated before it began
    token = _CURRENT.set(limits)
    try:
        yield
    finally:
        _CURRENT.reset(token)
