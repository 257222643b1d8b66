"""What the background compiler's child may take from the machine: its cores, its
environment, its confinement (``runtime/kernel_tiers.py`` starts it, ``compile_worker.py``
is the child)."""

from __future__ import annotations

import contextlib
import os

from mixrt.ops.compiled import parallel

# The child compiles while the process it compiles for keeps serving. Its compiles are one
# thread, but its two runs of the model split products and convolutions over threads and
# over OpenBLAS's: on a 2-core machine those took the second core from serving for the
# whole compile (nice 10 orders the cores' queues, it does not bound the child). So the
# child is confined to ``MIXRT_COMPILE_CORES`` cores (default 1; 0 lifts the limit), the
# highest-numbered ones the parent may use; it is told the parent's thread count, so that it
# calls the same kernel forms (the native pool's, chosen by thread count) the parent will
# load, its threads sharing its cores.

def compile_cores() -> int:
    """Cores the compile child may use (``MIXRT_COMPILE_CORES``; 0: as many as the parent)."""
    configured = os.environ.get("MIXRT_COMPILE_CORES", "1").strip()
    try:
        return max(0, int(configured))
    except ValueError:
        return 1  # a malformed setting keeps the default rather than failing a compile


def child_cores() -> set[int] | None:
    """The cores the child is confined to, or None where it is not confined."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    limit = compile_cores()
    if limit == 0 or limit >= len(allowed):
        return None
    return set(allowed[-limit:])


def child_environment(cores: set[int] | None, idle: bool = False) -> dict:
    """The child's environment; confined to ``cores``, it is told the parent's threads;
    ``idle``, it runs at the idle priority (``compile_worker``)."""
    environment = dict(os.environ, MIXRT_COMPILE="foreground",
                       MIXRT_COMPILE_PARENT=str(os.getpid()),  # it ends with this process
                       MIXRT_COMPILE_IDLE="1" if idle else "0")
    if cores is not None:
        environment.setdefault("MIXRT_INTRA_OP_THREADS", str(parallel.intra_op_threads()))
    return environment


@contextlib.contextmanager
def spawning_confined(cores: set[int] | None):
    """Confine this thread to ``cores`` (:func:`child_cores`) while it starts the child.

    A child inherits the affinity of the thread that forks it, so it is confined from its
    first instruction. Confining it by pid after it started raced with the GIL: while the
    serving thread held it (a compile in LLVM holds it for long), the child read its cores
    unconfined. Affinity is per thread on Linux, so the serving threads are untouched."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cores)
    except OSError:
        pass  # the system refuses: the child compiles unconfined
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
