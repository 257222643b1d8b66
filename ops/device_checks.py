"""Checks of device values that a GPU run makes without waiting for the GPU.

On the CPU a kernel checks its inputs as it goes (an out-of-range Gather index raises). On a
GPU, reading a value back to the host to check it stops the run until the GPU catches up,
and CuPy itself does not check: an out-of-range index wraps around, silently. So a kernel
on the GPU computes the condition that must not hold as a 0-d device array and hands it to
:func:`expect_false`; the session collects those of a run (:func:`collecting`) and, once the
run is done, reads them back together, one sync for all (:meth:`Checks.raise_if_failed`),
raising for the first that failed with the node that made it. A CUDA graph captures the
conditions with the rest of the run, so each replay recomputes them and is checked the same
way.

Outside a collecting run (CPU runs, imperative NDArray ops) :func:`expect_false` does
nothing: the CPU kernels raise on their own.
"""

from __future__ import annotations

import contextlib
import threading

from mixrt.base.errors import ExecutionError


class _Collecting(threading.local):
    """Class defaults (a missing thread-local attribute costs ~0.3 us to miss, and the
    executor names every node here)."""

    checks, node = None, None


_local = _Collecting()


class Checks:
    """The conditions one run made: (device flag, what was expected, node label)."""

    def __init__(self):
        self.entries: list[tuple] = []

    def raise_if_failed(self, xp) -> None:
        """Read every flag back at once (``xp`` is CuPy: only GPU kernels make checks)."""
        if not self.entries:
            return
        failed = xp.stack([flag.reshape(()) for flag, _, _ in self.entries]).get()
        for bad, (_, expected, node) in zip(failed, self.entries):
            if bad:
                where = f"node {node!r}" if node else "a kernel"
                raise ExecutionError(f"{where}: {expected}")


@contextlib.contextmanager
def collecting():
    """Collect the checks that kernels on this thread make until the block ends."""
    outer = _local.checks
    checks = _local.checks = Checks()
    try:
        yield checks
    finally:
        _local.checks = outer


def at_node(label: str | None) -> None:
    """The executor names the node whose kernel runs next (for the error's message)."""
    if _local.checks is not None:
        _local.node = label


def deferring() -> bool:
    """Whether this thread's kernels run inside a collecting (GPU) run, where a check is
    handed to :func:`expect_false` rather than read back at once."""
    return _local.checks is not None


def expect_false(flag, expected: str) -> None:
    """``flag`` (a 0-d device bool) must come out False; ``expected`` says what should hold."""
    checks = _local.checks
    if checks is not None:
        checks.entries.append((flag, expected, _local.node))
