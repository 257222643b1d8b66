"""The background compiler's child process: ``python -m mixrt.runtime.compile_worker JOB``.

It loads the model a session runs, runs it on the feeds of the session's first run with
compiling in the foreground, so numba compiles exactly the kernels and signatures that
session calls into the disk cache, then on the same feeds at other sizes of their free axes
(the kernels other sequence lengths and batches of the form choose), and then writes the
warm marker that tells every later session of that model and signature to use them at once
(``runtime/kernel_tiers.py``).
It runs at a lower priority than the process it compiles for, which keeps serving meanwhile
(the idle priority where it compiles optional kernels: ``_lower_priority``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from mixrt.runtime.kernel_tiers import write_marker
from mixrt.runtime.npz import read_npz, restored
from mixrt.runtime.session import Session


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m mixrt.runtime.compile_worker JOB.json", file=sys.stderr)
        return 2
    os.environ["MIXRT_COMPILE"] = "foreground"
    _die_with_parent()
    _lower_priority(os.environ.pop("MIXRT_COMPILE_IDLE", "0") == "1")
    spec = json.loads(Path(argv[0]).read_text())
    compile_model(spec["model"], spec["opt_level"], _feeds(spec))
    write_marker(Path(spec["marker"]), spec["model"])
    return 0


def _lower_priority(idle: bool) -> None:
    """Below the process it compiles for: nice 10, which orders the cores' queues but still
    takes a share of a busy core; ``idle`` (a child compiling optional kernels, which the
    parent serves without), Linux's SCHED_IDLE: it runs only on a core nothing else wants,
    and a serving thread that wakes takes the core back at once. Priority is a courtesy to
    the serving process, not a requirement: a system that refuses it compiles as it is.
    Linux sets both per thread, so each thread running now is set (OpenBLAS started its
    threads as NumPy loaded), and the threads started later inherit it."""
    threads = _threads()
    if idle and hasattr(os, "SCHED_IDLE"):
        try:
            for thread in threads:
                os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
            return
        except OSError:
            pass
    for thread in threads:
        try:
            nice = os.getpriority(os.PRIO_PROCESS, thread) + (19 if idle else 10)
            os.setpriority(os.PRIO_PROCESS, thread, min(19, nice))
        except OSError:
            pass


def _threads() -> list[int]:
    """This process's threads (0, this one, first), where Linux lists them."""
    try:
        listed = [int(name) for name in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return [0]
    return [0] + [thread for thread in listed if thread != threading.get_native_id()]


def _die_with_parent() -> None:
    """End when the process compiled for ends, however it ends. Its exit handler stops
    this child, but a service stopped by a signal runs none: the child went on compiling
    for a minute, on the core it shares with the workers of whatever ran next (a service
    restarted, the next model of a benchmark, which then ran 2x slower: 2026-11-26).
    Linux's parent-death signal does it; elsewhere the exit handler alone."""
    parent = int(os.environ.get("MIXRT_COMPILE_PARENT", os.getppid()))
    try:
        import ctypes  # noqa: PLC0415
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended while this process was starting
        os._exit(1)


PR_SET_PDEATHSIG = 1  # prctl's option: the signal this process gets when its parent ends


def compile_model(model: str, opt_level: int, feeds: dict) -> None:
    """Run ``model`` twice on ``feeds`` (the discovery and planned runs of the first call,
    then a planned run that may replay its calls), compiling every kernel they call; then
    once on each of :func:`other_sizes`, so that the kernels the form's other sizes choose
    are compiled too (a failing size is skipped: it may be one the model refuses)."""
    started = time.monotonic()
    session = Session(model, opt_level=opt_level)
    session.run(None, feeds)
    session.run(None, feeds)
    # the extra sizes may take as long as the job's own compile (at least EXTRA_SECONDS): a
    # vision model's pools and depthwise convolutions are generated per plane geometry,
    # and every image size of the ladder would be a module of each
    deadline = time.monotonic() + max(EXTRA_SECONDS, time.monotonic() - started)
    for resized in other_sizes(session.graph, feeds):
        if time.monotonic() > deadline:
            break
        try:
            session.run(None, resized)
        except Exception:  # noqa: BLE001,S112  (a size the model refuses: nothing to compile)
            continue


# sizes each free axis of the feeds takes in the child's extra runs: the kernels choose their
# forms by rows and work (one row, a few, a tile's worth, more than the caches hold), so a
# new sequence length or batch met a kernel compiled for none of the sizes seen before (a
# 6-layer BERT compiled at 32 tokens missed its batched product and two elementwise loops
# at other lengths, each a request served partly on NumPy and another child). A ladder,
# not the sizes a benchmark uses: the forms change at powers of two and at the caches'
# sizes, and the ladder spans both
LADDER = (1, 2, 3, 8, 17, 64, 130, 512)
# an extra run's feeds may be this many times the job's feeds (at least EXTRA_FLOOR bytes):
# a batch of 512 images would take the child minutes and compile nothing new
EXTRA_GROWTH, EXTRA_FLOOR = 16, 1 << 20
EXTRA_SECONDS = 20


def other_sizes(graph, feeds: dict) -> list[dict]:
    """The job's feeds at other sizes of their free axes (the inputs' symbolic or unknown
    dims), each group of axes that share a name (or, unnamed, a size) moved together along
    :data:`LADDER`; the data tiled or cut to the new size, so token ids stay in the
    vocabulary and masks stay masks."""
    groups = _free_axes(graph, feeds)
    budget = max(EXTRA_GROWTH * sum(v.nbytes for v in feeds.values()), EXTRA_FLOOR)
    sized = []
    for axes in groups.values():
        for size in LADDER:
            resized = {name: _resized(value, [a for n, a in axes if n == name], size)
                       for name, value in feeds.items()}
            if sum(v.nbytes for v in resized.values()) <= budget and \
                    any(resized[n].shape != feeds[n].shape for n, _ in axes):
                sized.append(resized)
    return sized


def _free_axes(graph, feeds: dict) -> dict:
    """Group key -> [(feed, axis)] of the feeds' axes an input leaves free."""
    groups: dict = {}
    for value in graph.feed_inputs():
        fed = feeds.get(value.name)
        shape = getattr(value.type, "shape", None)
        if not isinstance(fed, np.ndarray) or shape is None or len(shape) != fed.ndim:
            continue
        for axis, dim in enumerate(shape):
            if not isinstance(dim, int):
                key = dim if isinstance(dim, str) and dim else ("size", fed.shape[axis])
                groups.setdefault(key, []).append((value.name, axis))
    return groups


def _resized(value: np.ndarray, axes: list[int], size: int) -> np.ndarray:
    for axis in axes:
        repeats = -(-size // max(value.shape[axis], 1))
        tiled = np.concatenate([value] * repeats, axis=axis) if value.shape[axis] else value
        value = np.take(tiled, range(min(size, tiled.shape[axis])), axis=axis)
    return np.ascontiguousarray(value)


def _feeds(spec: dict) -> dict:
    arrays = read_npz(spec["feeds"], "feeds")
    dtypes = spec.get("feed_dtypes", {})
    return {name: restored(arrays[f"feed{i}"], dtypes.get(name))
            for i, name in enumerate(spec["feed_names"])}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
