"""How far apart this machine's two cores are now: the time one cache line takes to pass
from one thread to another (service_regimes.py's children measure it around each regime).

On the 2-core AMD EPYC virtual machine the benchmarks run on, the host moves the two virtual
CPUs now and then for seconds to a minute at a time, between cores that share a last-level
cache (a line passes in ~40 ns) and cores that do not (~180 ns, 4-5x). A model whose kernels
split their work between two threads pays for it wherever one thread reads what the other
wrote: measured 2026-11-27, SqueezeNet at 256 x 320 took mixrt 6.5 -> 12.7 ms a run and
onnxruntime 4.8 -> 7.9, one thread's run unchanged (13 ms) and two threads hashing
unshared data at full speed. A runtime timed in one placement and its peer in the other
reads as 0.8x or 2.6x for the same code, so each regime records the placement it ran in.

Its own two intrinsics (an acquire load, a release store) and numba alone: the onnxruntime
child imports neither mixrt nor its kernels.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

# one-way hand-offs slower than this are cores without a shared cache (near: 30-50 ns,
# far: 170-280 ns on the EPYC; a busy core, time-sliced, several microseconds)
FAR_NS = 100.0
ROUNDS = 2000  # per try; 3 tries take ~0.3 ms near, ~1.5 ms far


def _word(context, builder, signature, args):
    data = context.make_array(signature.args[0])(context, builder, args[0]).data
    return builder.gep(data, [args[1]])


@intrinsic
def _load(typingctx, words, index):
    def codegen(context, builder, signature, args):
        return builder.load_atomic(_word(context, builder, signature, args), "acquire", 8)
    return types.int64(words, types.intp), codegen


@intrinsic
def _store(typingctx, words, index, value):
    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _word(context, builder, signature, args), "release", 8)
        return context.get_dummy_value()
    return types.void(words, types.intp, types.int64), codegen


@njit(nogil=True, cache=True)
def _relay(words, parity, first, rounds):
    """Waits for each value of ``parity`` in turn (steps ``first`` on) and answers with the
    next: the two threads hand one line back and forth ``rounds`` times each."""
    for step in range(first, first + rounds):
        mine = 2 * step + parity
        while _load(words, 0) != mine:
            pass
        _store(words, 0, mine + 1)


@njit(nogil=True, cache=True)
def _await(words, value):
    while _load(words, 0) != value:
        pass


def hand_off_ns(rounds: int = ROUNDS, tries: int = 3) -> float:
    """The fastest of ``tries`` one-way hand-offs between two threads, each held on its own
    CPU while it runs, in ns. Held, because a thread started after the process idled is
    often queued on its starter's CPU for milliseconds (``mixrt/base/placement.py``): the
    hand-offs would then time the two sharing one CPU (~2-3 us), not the distance."""
    words = np.zeros(16, np.int64)
    _relay(words, 0, 0, 1)  # compiled (or loaded) before timing
    _await(words, 1)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    mine, theirs = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    saved = os.sched_getaffinity(0) if mine is not None else None
    best = float("inf")
    try:
        if mine is not None:
            os.sched_setaffinity(0, {mine})  # this thread only (Linux)
        for _ in range(tries):
            words[0] = 0
            other = threading.Thread(target=_relay_on, args=(theirs, words, rounds + 1))
            other.start()
            _relay(words, 0, 0, 1)
            _await(words, 2)  # the other thread runs: its start is not timed
            started = time.perf_counter()
            _relay(words, 0, 1, rounds)
            other.join()
            best = min(best, (time.perf_counter() - started) / (2 * rounds) * 1e9)
    finally:
        if saved is not None:
            os.sched_setaffinity(0, saved)
    return best


def _relay_on(cpu, words, rounds) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    _relay(words, 1, 0, rounds)


def placement(ns: float) -> str:
    return "far" if ns > FAR_NS else "near"
