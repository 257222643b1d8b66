"""Which kernel tier the calling thread runs: the compiled (numba) kernels, or NumPy/BLAS.

numba compiles a kernel on its first call, and a model's kernels took 10-100 s to compile on
a machine with empty caches. A session whose kernels are not compiled yet therefore runs its
first calls with the compiled tier turned off for the thread that runs it (every
``jit_cpu`` accessor then answers "no compiled kernel" and the ops take their NumPy paths)
while a background process compiles them (``runtime/kernel_tiers.py``). The override is
per thread and per run, so concurrent runs of one session may run different tiers, each
consistently; ``parallel.parallel_for`` hands it to the threads that run a call's parts.

Outside an override (a kernel called directly, imperative arrays) the compiled tier is
allowed, and numba compiles on demand as before.
"""

from __future__ import annotations

import contextlib
import os
import threading


class _Tier(threading.local):
    """What each thread starts with. A class default, not ``getattr(local, name, default)``:
    a thread-local attribute that is missing costs ~0.3 us to miss (the raised and caught
    AttributeError), one that is found ~0.04 us, and every compiled kernel asks."""

    compiled = True


_local = _Tier()


def compiled_allowed() -> bool:
    """May this thread call compiled kernels now?"""
    return _local.compiled


@contextlib.contextmanager
def using(compiled: bool):
    """Run the block with the compiled tier allowed (True) or off (False) on this thread."""
    before = _local.compiled
    _local.compiled = compiled
    try:
        yield
    finally:
        _local.compiled = before


def background_compiles() -> bool:
    """Do sessions serve their first runs from NumPy while a background process compiles
    (``MIXRT_COMPILE=background``, the default), or compile in the foreground on the first
    call as numba does (``MIXRT_COMPILE=foreground``)? ``MIXRT_JIT=0`` needs neither."""
    return os.environ.get("MIXRT_COMPILE", "background") != "foreground"
