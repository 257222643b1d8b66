"""Where mixrt's worker threads run: on any CPU the process may use but the caller's.

A run hands parts of its kernels to worker threads (the native pool of
``ops/panels/_jit_native_pool.py``, the intra-op pool of ``ops/compiled/parallel.py``,
OpenBLAS's own) and
takes parts itself. A worker that sleeps between runs must be woken, and Linux places a
woken thread where it judges best. After the process has idled for ~10 ms, in a virtual
machine, it judged the idle virtual CPU unavailable (the hypervisor had taken it back: the
guest sees it as *preempted*) and queued the worker behind the caller, on the caller's
CPU, which the caller then kept busy with its own parts for the whole run: the worker ran
milliseconds later, if at all. Measured 2026-11-26 on the 2-core machine: a native worker
woken at a run's start, while the caller computed, was running after 33 us when the process
had idled 2 ms, after 132 us (and often not within 50 ms) when it had idled 10 ms, and not
within 50 ms after 50 ms; it joined 8 of a 2-layer BERT's 15 split products, and the run
took 7.6 ms against 3.5 back to back (onnxruntime 3.3 -> 3.8, its workers spinning
through a run; with its spinning off, 3.4 -> 6.7). With the worker kept off the caller's
CPU, it ran within 30-130 us whatever the idle time.

So each run first reads the CPU its caller is on (``sched_getcpu``, ~0.1 us) and, when that
changed since the last run, allows every worker thread mixrt started the process's CPUs but
that one (``sched_setaffinity``, a few us a thread). The caller itself is never pinned: it
is the service's thread. Threads come to this module as they are started
(:func:`adopt`, :func:`new_threads`): mixrt's own, and OpenBLAS's where mixrt loaded or
restarted it (``runtime/blas_policy.py``); threads of other libraries are left alone.
``MIXRT_PLACE_WORKERS=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

from mixrt.base.settings import setting

_workers: set[int] = set()  # thread ids of this process's workers
_state = {"pid": None, "cpu": None}
_lock = threading.Lock()


def _sched_getcpu():
    try:
        return ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return None


_getcpu = _sched_getcpu()


def supported() -> bool:
    return _getcpu is not None and hasattr(os, "sched_setaffinity") \
        and os.path.isdir("/proc/self/task")


def adopt(thread_ids) -> None:
    """Place these threads (ids as the kernel numbers them) as workers from the next run."""
    with _lock:
        _own_process()
        _workers.update(int(t) for t in thread_ids if t)
        _state["cpu"] = None  # place them at the next run, wherever its caller is


@contextlib.contextmanager
def new_threads():
    """Adopt the threads the block starts (a native pool's, OpenBLAS's as it loads)."""
    before = _threads()
    try:
        yield
    finally:
        adopt(_threads() - before - {threading.get_native_id()})


def keep_off_caller() -> None:
    """At a run's start: the workers on every allowed CPU but the caller's, when the
    caller's CPU changed since the last run (nothing is done otherwise)."""
    if not _workers or _getcpu is None:
        return
    cpu = _getcpu()
    if cpu == _state["cpu"] or cpu < 0 or setting("MIXRT_PLACE_WORKERS", "1") == "0":
        return
    with _lock:
        if _own_process():
            return
        _state["cpu"] = cpu
        allowed = _process_cpus() - {cpu}
        if not allowed:
            return
        for thread_id in list(_workers):
            try:
                os.sched_setaffinity(thread_id, allowed)
            except ProcessLookupError:
                _workers.discard(thread_id)  # ended
            except OSError:
                pass  # refused (a container's policy): it stays where Linux puts it


def placed_off() -> int:
    """What a compiled check of the caller's CPU compares with (``_jit_native_pool
    .run_starts``, a planned run's start): the CPU the workers were last kept off, -2 where
    they are not placed yet, -1 where there is nothing to place (or placing is turned off:
    else every run would find its CPU "moved"). A different one there means
    :func:`keep_off_caller` has work to do."""
    if not _workers or _getcpu is None or setting("MIXRT_PLACE_WORKERS", "1") == "0":
        return -1
    cpu = _state["cpu"]
    return -2 if cpu is None else cpu


def workers() -> frozenset:
    """The thread ids placed (for the tests)."""
    return frozenset(_workers)


def _own_process() -> bool:
    """Forget the workers of the process this one was forked from (their ids mean other
    threads here, or none); True when that was the case."""
    pid = os.getpid()
    if _state["pid"] == pid:
        return False
    _state["pid"], _state["cpu"] = pid, None
    _workers.clear()
    return True


def _threads() -> set[int]:
    try:
        return {int(name) for name in os.listdir("/proc/self/task")}
    except OSError:
        return set()


_cpus: dict = {}


def _process_cpus() -> set[int]:
    """The CPUs the process may use, as the first caller found them: a caller thread's own
    mask is the process's unless someone pinned that thread."""
    pid = os.getpid()
    if pid not in _cpus:
        _cpus.clear()
        _cpus[pid] = set(os.sched_getaffinity(0))
    return _cpus[pid]
