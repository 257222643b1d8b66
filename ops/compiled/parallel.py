"""Intra-op parallelism for the CPU kernels that NumPy runs on one core.

NumPy's BLAS calls use every core, but its ufuncs, reductions and copies use one. On a small
machine that leaves half the CPU idle through a model's elementwise tails, its softmaxes, layer
norms, im2col copies and pooling, which onnxruntime spreads over its intra-op threads. A kernel
here splits such work into parts (rows of its output) and :func:`parallel_for` runs them on a
small pool of persistent threads *and* the calling thread. NumPy releases the GIL inside its
loops, so the parts really run at the same time.

The calling thread always works too and takes whatever parts are left, so a call never waits
for a pool thread that is busy with another request's job: it waits only for parts that have
already started elsewhere. Work under :data:`MIN_ELEMENTS` runs inline (waking a thread costs
more than it saves). ``MIXRT_INTRA_OP_THREADS`` sets the thread count (1 turns this off);
the default is the number of cores this process may run on.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Callable

from mixrt.base.settings import process_id, setting
from mixrt.base import placement
from mixrt.ops.compiled import jit_tier

# below this many elements of work, the hand-off to another thread costs more than it saves
MIN_ELEMENTS = 1 << 16


# each thread's state starts as these class defaults: a thread-local attribute that is
# missing costs ~0.3 us to miss, a found one ~0.04 us (ops/compiled/jit_tier.py's _Tier)
class _WorkerState(threading.local):
    in_worker = False  # a pool worker runs no nested parallel_for


class _PinnedBlock:
    """A thread's :class:`pinned` state: plain slots behind one thread-local lookup (each
    thread-local attribute cost ~0.05 us, and a run's pin and unpin took seven: ~0.4 us of a
    one-node model's ~6, now ~0.14)."""

    __slots__ = ("depth", "threads", "values")

    def __init__(self):
        self.depth, self.threads, self.values = 0, 0, None


class _Pinned(threading.local):
    def __init__(self):
        self.block = _PinnedBlock()


_local = _WorkerState()
_pinned = _Pinned()
_state: dict = {}
_state_lock = threading.Lock()


def intra_op_threads() -> int:
    """Threads a kernel may use, the calling one included (inside :class:`pinned`, as read
    the first time a kernel of the block asked)."""
    block = _pinned.block
    threads = block.threads
    if threads:
        return threads
    threads = _configured_threads()
    if block.depth:
        block.threads = threads
    return threads


def _configured_threads() -> int:
    configured = setting("MIXRT_INTRA_OP_THREADS").strip()
    if configured:
        try:
            return max(1, int(configured))
        except ValueError:
            pass  # a malformed setting falls back to the default rather than failing a run
    return _CORES


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


_CORES = _cores()


def pin() -> None:
    """Enter a :class:`pinned` block without the object (the steady run lane's)."""
    block = _pinned.block
    depth = block.depth
    if not depth:
        block.threads = 0
        block.values = {}
    block.depth = depth + 1


def unpin() -> None:
    """Leave the block :func:`pin` entered."""
    block = _pinned.block
    block.depth -= 1
    if not block.depth:
        block.threads, block.values = 0, None


class pinned:
    """A block (a session's run) within which the settings read from the environment on the
    calling thread are read once: :func:`intra_op_threads`, and whatever a kernel keeps in
    :func:`pinned_values` (``jit_cpu.native_pool``). Each read is ~0.6 us of
    ``os.environ``, and a small convolution asked three times: ~2 us of a ~20 us node.
    Read when first asked, so a run whose kernels never ask does not pay it either.
    Reentrant; other threads are not affected. :func:`pin` and :func:`unpin` are the
    same block as two calls."""

    __slots__ = ()

    def __enter__(self):
        pin()
        return self

    def __exit__(self, *exc):
        unpin()


def pinned_values() -> dict | None:
    """The current :class:`pinned` block's values on this thread, or None outside one."""
    return _pinned.block.values


def parallel_for(parts: list, fn: Callable) -> None:
    """``fn(*part)`` for every part; parts must write disjoint memory. Exceptions are
    re-raised in the caller (the first one)."""
    if len(parts) < 2:  # a small kernel's one part: before the pool lookup (~0.5 us)
        for part in parts:
            fn(*part)
        return
    pool = _pool()
    if pool is None or _local.in_worker:
        for part in parts:
            fn(*part)
        return
    job = _Job(fn, parts)
    for _ in range(min(pool.workers, len(parts) - 1)):
        pool.queue.put(job)
    # a part that calls parallel_for runs it inline, as a worker does: the other threads
    # are busy with this job's parts
    _local.in_worker = True
    try:
        job.work()
    finally:
        _local.in_worker = False
    job.done.wait()
    if job.error is not None:
        raise job.error


def row_parts(rows: int, elements_per_row: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``rows``: one part when the work is small, else about
    two parts per thread (so a late thread still finds work to take)."""
    if rows < 2 or rows * max(elements_per_row, 1) < MIN_ELEMENTS:
        return [(0, rows)]  # before the thread count: reading it costs a small kernel ~1 us
    threads = intra_op_threads()
    if threads < 2:
        return [(0, rows)]
    count = min(rows, 2 * threads)
    step = -(-rows // count)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def thread_parts(rows: int, size: int) -> list[tuple[int, int]]:
    """``rows`` in at most one contiguous part per thread (fewer when the ``size`` elements
    of work would give a part under :data:`MIN_ELEMENTS`), for kernels whose parts each pay
    a setup (a compiled loop's call, its scratch buffers)."""
    count = min(rows, intra_op_threads(), max(1, size // max(MIN_ELEMENTS, 1)))
    bounds = [rows * p // count for p in range(count + 1)]
    return [(bounds[p], bounds[p + 1]) for p in range(count) if bounds[p] < bounds[p + 1]]


def parallel_rows(rows: int, elements_per_row: int, fn: Callable[[int, int], None]) -> None:
    """``fn(start, stop)`` over row ranges covering ``rows``, in parallel when worth it."""
    parallel_for(row_parts(rows, elements_per_row), fn)


class _Job:
    """One parallel_for call: parts handed out one at a time to whoever asks."""

    def __init__(self, fn, parts):
        self.fn, self.parts = fn, parts
        self.compiled = jit_tier.compiled_allowed()  # the caller's tier, for every part
        self.misses = jit_tier.compile_misses()
        self.next = 0
        self.pending = len(parts)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def _take(self):
        with self.lock:
            if self.next >= len(self.parts):
                return None
            self.next += 1
            return self.parts[self.next - 1]

    def work(self) -> None:
        with jit_tier.using(self.compiled, self.misses):
            self._work()

    def _work(self) -> None:
        while (part := self._take()) is not None:
            try:
                self.fn(*part)
            except BaseException as error:  # noqa: BLE001  (handed to the caller)
                self.error = self.error or error
            with self.lock:
                self.pending -= 1
                if self.pending == 0:
                    self.done.set()


class _Pool:
    def __init__(self, workers: int):
        self.workers = workers
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        threads = [threading.Thread(target=self._serve, name=f"mixrt-intra-op-{index}",
                                    daemon=True) for index in range(workers)]
        for thread in threads:
            thread.start()
        placement.adopt(thread.native_id for thread in threads)  # off their callers' CPU

    def _serve(self) -> None:
        _local.in_worker = True
        while True:
            self.queue.get().work()


def _pool() -> _Pool | None:
    """The process's pool (made on first use, and again in a forked child, whose threads did
    not survive the fork); None when one thread is all this process may use."""
    workers = intra_op_threads() - 1
    if workers < 1:
        return None
    key = (process_id(), workers)
    pool = _state.get(key)
    if pool is None:
        with _state_lock:
            pool = _state.get(key)
            if pool is None:
                _state.clear()
                pool = _state[key] = _Pool(workers)
    return pool
