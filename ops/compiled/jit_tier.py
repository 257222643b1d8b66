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
    # None: numba may compile here; a list: it may not (a prebuilt loading run, below), and
    # each kernel that would have compiled is appended to it
    misses = None
    # inside optional(): a kernel that would compile has a compiled fallback its caller takes
    optional = False


_local = _Tier()

# how a miss inside optional() starts in a loading run's list
OPTIONAL = "optional: "


class CompileForbidden(RuntimeError):
    """A kernel that is in no cache was called where nothing may be compiled
    (:func:`loading_only`); the session keeps its NumPy tier and compiles in a child."""


def compiled_allowed() -> bool:
    """May this thread call compiled kernels now?"""
    return _local.compiled


# -- what bound calls were bound under, changed ----------------------------------------------
#
# A run's bound calls (ops/compiled/bound_calls.py) are kept by what they were bound under:
# the tier, the thread, its scratch buffers, the native pool (runtime/run_loop.bound_key).
# Two of those are thread-locals, and a request 10 ms after the last spent ~15-25 us reading
# them cold (a thread-local's code and data, out of the caches by then; the kernels of a
# small model's whole run take ~150-190 us so). Nearly always they are what they were at the
# run before, so they are noted as *changed* instead, process-wide: every change of a
# thread's tier or scratch buffers adds one here, and a run on the same thread that finds
# the count as it was may take its last run's bound calls (``runtime/steady_run.settled_calls``).
# A change on another thread counts too: such a run then asks again, as before. Two threads
# adding at once may lose one of the two additions, never both, so the count still moves.
CHANGES = [0]


def note_change() -> None:
    """A thread's tier or scratch buffers changed (see ``CHANGES``)."""
    CHANGES[0] += 1


@contextlib.contextmanager
def using(compiled: bool, misses: list | None = None):
    """Run the block with the compiled tier allowed (True) or off (False) on this thread;
    ``misses``: a caller's :func:`loading_only` list, which the block shares."""
    before = _local.compiled, _local.misses
    _local.compiled, _local.misses = compiled, misses
    if compiled != before[0]:
        note_change()
    try:
        yield
    finally:
        _local.compiled, _local.misses = before
        if compiled != before[0]:
            note_change()


@contextlib.contextmanager
def loading_only():
    """Run the block on the compiled tier with compiling forbidden on this thread: kernels
    load from the user's cache or the prebuilt ones (``ops/compiled/prebuilt.py``); one that
    would compile raises :class:`CompileForbidden` and is named in the list yielded."""
    misses: list = []
    with using(True, misses):
        yield misses


class optional:  # noqa: N801  (used as ``with jit_tier.optional():``, as a function was)
    """A kernel's specialised form tried where its caller has a compiled fallback (a
    depthwise convolution's form for one plane geometry, whose row form serves any size):
    a forbidden compile inside is still raised, and noted with :data:`OPTIONAL` before it,
    so that the session knows the run took no NumPy path for it
    (``runtime/kernel_tiers.py`` compiles those only for a signature that comes back).
    A class rather than a generator: a depthwise convolution enters it once or twice at
    each new image size, and the generator's context manager cost ~3 us a time, cold."""

    __slots__ = ("_before",)

    def __enter__(self) -> None:
        self._before = _local.optional
        _local.optional = True

    def __exit__(self, *_) -> bool:
        _local.optional = self._before
        return False


class unnoted:  # noqa: N801  (used as ``with jit_tier.unnoted() as tried:``)
    """Loads a warm-up makes ahead, where nothing waits on them: inside a loading run a
    kernel in no cache raises :class:`CompileForbidden` as anywhere, and the block's end
    swallows it and takes its note back out of the run's misses (the run took no other
    path for it, so there is nothing to compile on its account); ``missed`` says whether
    one was."""

    __slots__ = ("_mark", "missed")

    def __enter__(self) -> "unnoted":
        misses = _local.misses
        self._mark = None if misses is None else len(misses)
        self.missed = False
        return self

    def __exit__(self, kind, *_) -> bool:
        if kind is None or not issubclass(kind, CompileForbidden):
            return False
        if self._mark is not None and _local.misses is not None:
            del _local.misses[self._mark:]
        self.missed = True
        return True


def is_optional(miss: str) -> bool:
    return miss.startswith(OPTIONAL)


def noted_miss(text: str) -> str:
    """How a forbidden compile of ``text`` is noted in the loading run's list here."""
    return OPTIONAL + text if _local.optional else text


def note_optional_miss(text: str) -> None:
    """Note an optional kernel not tried (known to be in no cache) in the loading run's
    list, as a forbidden compile inside :func:`optional` would be."""
    if _local.misses is not None:
        _local.misses.append(OPTIONAL + text)


def compile_misses() -> list | None:
    """The list a forbidden compile is noted in, or None where compiling is allowed."""
    return _local.misses


def background_compiles() -> bool:
    """Do sessions serve their first runs from NumPy while a background process compiles
    (``MIXRT_COMPILE=background``, the default), or compile in the foreground on the first
    call as numba does (``MIXRT_COMPILE=foreground``)? ``MIXRT_JIT=0`` needs neither."""
    return os.environ.get("MIXRT_COMPILE", "background") != "foreground"
