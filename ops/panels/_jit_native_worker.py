"""The native pool's worker thread: its loop over the jobs in the control block
(``ops/panels/_jit_native_pool.py``, whose ``worker_job`` runs each job's parts through a
function pointer: the drivers' registered worker sides, or any kernel's parts), and the
``cfunc`` each thread is started on. Compiled: the worker never takes the GIL. It holds none
of the kernels' code, so it compiles in seconds and no kernel family waits for another.
"""

from __future__ import annotations

import numpy as np
from numba import carray, cfunc, njit

from mixrt.ops.panels._jit_atomics import compare_swap, fetch_add, load, pause
from mixrt.ops.panels._jit_native_pool import (
    BLOCK_WORDS, CLOSED, FUTEX_WAIT_PRIVATE, JOINED, RUNS, SLEEPERS, SPINS, STATE, WAKE,
    WORKER_SIGNATURE, _as_block, _futex, pool, worker_job)

_jit = njit(nogil=True, cache=True, boundscheck=False)


@_jit
def serve(raw):
    """The worker loop over the jobs in the block at ``raw``, each run by ``worker_job``
    (it claims parts until none are left); never returns."""
    block = carray(_as_block(raw), (BLOCK_WORDS,))
    wake = block[WAKE:WAKE + 1].view(np.int32)
    done, idle, in_run = 0, 0, False
    while True:
        state = load(block, STATE)
        sequence = state >> 16
        if sequence != done and not state & CLOSED:
            if compare_swap(block, STATE, state, state + 1):
                done, idle = sequence, 0
                fetch_add(block, JOINED, 1)
                worker_job(block)
                fetch_add(block, STATE, -1)
            continue
        idle += 1
        running = load(block, RUNS) > 0
        if in_run and not running:
            idle = 0  # a run just ended: the next may follow at once
        in_run = running
        if idle < block[SPINS] or idle < block[SPINS + 1] and running:
            pause()
            continue
        # sleep: count in, then check the job once more, so that a caller who published
        # after the check sees a sleeper and wakes it
        word = load(wake, 0)
        fetch_add(block, SLEEPERS, 1)
        if load(block, STATE) == state:
            _futex(wake, FUTEX_WAIT_PRIVATE, word)
        fetch_add(block, SLEEPERS, -1)
        idle = 0


@cfunc(WORKER_SIGNATURE, nopython=True, error_model="numpy", cache=True)
def _worker(raw):
    serve(raw)
    return raw


def native_pool():
    """The worker pool of the native drivers (convolutions, panel products, attention, and
    every kernel that hands parts over as CALL_JOB), or None (one thread)."""
    return pool("panels", _worker)
