"""The numba side of the compiled-kernel machinery: loading the families' compiled modules,
per-thread scratch buffers and prepared calls, and the packed-panel kernels' entry.

NumPy's ufuncs do some ops only in many passes: a depthwise 3x3 convolution is eighteen
ufunc calls over the whole tensor, a pooling window the same story, and on small layers
each call is mostly overhead. The families write those loops for numba in their own
``_jit_*.py`` modules (``ops/conv/_jit_depthwise_pool.py``, ``ops/nn/_jit_row_reductions.py``,
``ops/rnn/_jit_rnn_steps.py``, ...) and reach them through :func:`load`, which imports a
module on its first call, so that ``import mixrt`` does not pay for numba (~0.4 s). Each
kernel is compiled once per dtype and cached on disk (``cache=True``; ``jit_cache.py``), so
later processes load it in milliseconds. ``MIXRT_JIT=0`` turns these kernels off, and so
does a failed import: callers then take their NumPy paths.

The loops share one convention: every array is passed flat (1-D) and indexed as
``array[uint64(offset + i)]``. With a signed index numba wraps negative values on every
access, and that alone kept LLVM from vectorizing (314 against 38 microseconds for the same
multiply-adds); slicing a view per run avoids the wrap but costs ~20-30 ns a view
(reference counts), more than a short run's arithmetic. Copies and padding stay in NumPy.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import os
import platform
import sys
import threading
import weakref

import numpy as np

from mixrt.base import placement
from mixrt.base.settings import process_id, setting
from mixrt.ops.compiled.jit_cache import guard_damaged_entries
from mixrt.ops.compiled.jit_tier import compiled_allowed, note_change
from mixrt.ops.compiled.parallel import pinned_values
from mixrt.ops.compiled.prebuilt import LEVEL_VECTOR_BYTES
from mixrt.ops.device import aligned_empty

NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
_MISSING = object()
_modules: dict = {}  # name -> the imported kernel module, or None where it cannot be
_panels: list = []
_lock = threading.Lock()
_scratch = threading.local()


class _Kits(threading.local):
    """A thread's kept kits (class defaults: see ops/compiled/jit_tier.py's _Tier)."""

    generation, table = 0, None


_kits = _Kits()
# prepared calls one thread keeps (:func:`scratch_kit`); past this many they are all dropped
# (a thread that outlives many sessions would otherwise keep the dead ones' entries)
KITS_KEPT = 4096


def enabled() -> bool:
    """May compiled kernels run here? Not with ``MIXRT_JIT=0``, without numba, nor on a
    thread whose session runs its NumPy tier (``ops/compiled/jit_tier.py``). Inside a session's run
    the setting is read once (``parallel.pinned``): ~0.7 us of ``os.environ`` a kernel."""
    if not compiled_allowed():
        return False
    values = pinned_values()
    if values is None:
        return _jit_setting_on() and _numba_ready()
    on = values.get("jit")
    if on is None:
        on = values["jit"] = _jit_setting_on() and _numba_ready()
    return on


def _jit_setting_on() -> bool:
    return setting("MIXRT_JIT", "1") != "0"


def load(name: str):
    """The compiled-kernel module ``name`` (a family's ``_jit_*.py``, which imports numba),
    imported on its first call and kept, or None when it cannot be imported (no numba).
    Callers check :func:`enabled` first; the families name their own modules, so this layer
    names none of them."""
    module = _modules.get(name, _MISSING)
    if module is _MISSING:
        with _lock:
            module = _modules.get(name, _MISSING)
            if module is _MISSING:
                try:
                    guard_damaged_entries()
                    module = importlib.import_module(name)
                except ImportError:
                    module = None
                _modules[name] = module
    return module


def _numba_ready() -> bool:
    return load("numba") is not None


def panel_kernels():
    """ops/panels/_jit_panels.py (the packed-panel tile: ops/nn/matmul_cpu.py's products,
    ops/conv/conv_direct_cpu.py's convolutions), or None where it does not pay: without AVX-512
    (its 64-byte vectors would be split in two), with MIXRT_JIT=0, without numba, or on a
    thread running the NumPy tier. ``MIXRT_JIT`` is read as every switch is, when asked
    (within a run, once: :func:`enabled`): loaded once, the tile was kept for a process
    that set MIXRT_JIT=0 later, whose runs went on splitting over the native pool."""
    if not enabled():
        return None
    if not _panels:
        with _lock:
            if not _panels:
                _panels.append(_load_panel_kernels())
    return _panels[0]


@functools.lru_cache(maxsize=1)
def core_cache_bytes() -> int:
    """The cache a core has to itself (its L2, from Linux's sysfs; 1 MiB where it cannot be
    read): a table that fits it is walked at the core's pace, a larger one at its misses'."""
    folder = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(folder)):
            with open(f"{folder}/{index}/level") as level:
                if level.read().strip() != "2":
                    continue
            with open(f"{folder}/{index}/size") as size:
                text = size.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return 1 << 20


@functools.lru_cache(maxsize=1)
def vector_bytes() -> int:
    """The widest float vector the CPU has, from llvmlite's host features (numba's target;
    where numba is told an x86-64 level instead, ``ops/compiled/_prebuild.py``, that level's):
    64 bytes with AVX-512 (32 vector registers), 32 with AVX2 (16), else 16. Loops whose
    partial sums fill the registers pick their form by it."""
    target = os.environ.get("NUMBA_CPU_NAME")  # numba told another CPU: a prebuild's level
    if target in LEVEL_VECTOR_BYTES:
        return LEVEL_VECTOR_BYTES[target]
    from llvmlite import binding  # noqa: PLC0415  (with numba, on first use)
    features = binding.get_host_cpu_features()
    if features.get("avx512f", False):
        return 64
    return 32 if features.get("avx2", False) else 16


# the native pool's futex call is Linux x86-64's system call (the panel tile is x86 already)
NATIVE_POOL_PLATFORM = sys.platform.startswith("linux") and platform.machine() == "x86_64"


def native_pool():
    """The native workers' pool of ops/panels/_jit_panels.py (its drivers hand parts to a worker
    thread without the GIL), or None: one thread, no panel kernels, not Linux x86-64, or
    turned off with ``MIXRT_NATIVE_POOL=0`` (callers then split through ``parallel_for``).
    Looked up once per ``parallel.pinned`` block (a session's run)."""
    values = pinned_values()
    if values is None:
        return _native_pool()
    found = values.get("native_pool", values)  # the dict itself: not looked up yet
    if found is values:
        found = values["native_pool"] = _native_pool()
    return found


def note_native_job() -> None:
    """A kernel handed parts to the native workers in this run (a ``parallel.pinned``
    block). A plan whose runs did not wake them as they began (``ExecutionPlan
    .wakes_workers``, from the bytes its values hold) learns to: a forest's walk is much
    work over few bytes, and a worker woken by the job itself joins 10-15 us late."""
    values = pinned_values()
    if values is not None:
        values["native_job"] = True


def native_job_noted() -> bool:
    """Did a kernel of this run (:func:`note_native_job`) hand the workers parts?"""
    values = pinned_values()
    return values is not None and "native_job" in values


def forget_native_job() -> None:
    """Takes back this run's :func:`note_native_job`: the job was a kernel's own warm-up,
    not one the plan's later runs will hand out."""
    values = pinned_values()
    if values is not None:
        values.pop("native_job", None)


def loaded_native_pool():
    """:func:`native_pool` once this process has loaded the panel kernels, else None
    (without loading them: a run of no split kernel has no use for them)."""
    if not panel_kernels_loaded():
        return None
    return native_pool()


def release_abandoned_pool() -> None:
    """After a kernel raised on this thread: free the native pool where that kernel's job
    left it taken (``Pool.release_abandoned``)."""
    pool = loaded_native_pool()
    if pool is not None:
        pool.release_abandoned()


def panel_kernels_loaded() -> bool:
    """Has this process loaded the panel kernels (so that :func:`native_pool`'s None means
    no pool for these settings, not one not made yet)?"""
    return "mixrt.ops.panels._jit_panels" in sys.modules


def native_run_begins():
    """A session's run that uses the native workers starts: they wake if they sleep (once
    this process has loaded them), and spin between its jobs until the run calls the pool's
    ``run_ends()``; returns that pool, or None. A worker asleep since the last run takes
    10-15 us (far more on a busy host) to run again, and meanwhile the first kernel's caller
    takes the parts: with 2 ms between requests, SqueezeNet's first conv went 736 -> 668 us.
    (``ops/panels/_jit_native_pool.py`` says why the spin lasts the run; a planned run
    asks ``ops/compiled/worker_wakes.py`` instead, which may leave them asleep.)"""
    pool = loaded_native_pool()
    if pool is not None:
        pool.run_begins()
    return pool


@contextlib.contextmanager
def native_run(uses_workers: bool, choice=None):
    """The block of a run that uses the native workers (:func:`native_run_begins`, or
    ``choice``'s, a plan's ``worker_wakes.WakeChoice``), or of one that does not
    (``uses_workers`` False: nothing is done)."""
    if not uses_workers:
        yield
        return
    token = native_run_begins() if choice is None else choice.begins()
    try:
        yield
    finally:
        if token is not None and choice is None:
            token.run_ends()  # the pool native_run_begins woke
        elif token is not None:
            choice.ends(token)


def native_pool_key() -> tuple:
    """What :func:`native_pool` answers from on this thread (with the tier, which decides
    whether the panel kernels are there): the switches and the process. Equal keys mean the
    same pool (each is kept for the process's life), so a run's bound calls are looked up by
    it: ~0.3 us against the pool's own lookup's ~0.75, every run."""
    return setting("MIXRT_NATIVE_POOL", "1"), setting("MIXRT_INTRA_OP_THREADS"), process_id()


def _native_pool():
    if setting("MIXRT_NATIVE_POOL", "1") == "0" or not NATIVE_POOL_PLATFORM:
        return None
    kernels = panel_kernels()
    if kernels is None:
        return None
    key = native_pool_key()
    if key in _pools_adopted:
        return kernels.native_pool()
    with placement.new_threads():  # its workers are kept off their callers' CPU
        found = kernels.native_pool()
    _pools_adopted.add(key)
    return found


_pools_adopted: set = set()  # native_pool_key()s whose pool's threads were adopted


def _load_panel_kernels():
    try:
        if vector_bytes() < 64:  # the tile's 8 x 32 lanes need AVX-512's registers
            return None
        guard_damaged_entries()
        return importlib.import_module("mixrt.ops.panels._jit_panels")
    except ImportError:
        return None


def scratch_array(name, dtype, shape) -> np.ndarray:
    """A per-thread scratch array (its buffer kept between calls)."""
    return _scratch_view(name, dtype, shape)[0]


def scratch_address(name, dtype, shape) -> tuple[np.ndarray, int]:
    """:func:`scratch_array` and the address of its first element (what a kit's words
    hold: reading it through ``__array_interface__`` took ~1.5 us an array)."""
    return _scratch_view(name, dtype, shape)


def _scratch_view(name, dtype, shape) -> tuple:
    """(the scratch array, its address), the same objects for the same name, dtype and
    shape until the thread's buffers are reallocated: the name's dict, the size and the
    dtype's key, the slice and the reshape were ~2 us a call, three to five a product's or
    a convolution's first call at a new size."""
    views = _scratch.__dict__.get(_VIEWS)  # in the same dict: dropped with the buffers
    if views is None:
        views = _scratch.__dict__[_VIEWS] = {}
    if shape.__class__ is list:
        shape = tuple(shape)
    found = views.get((name, dtype, shape))
    if found is not None:
        return found
    if len(views) >= MAX_SCRATCH_VIEWS:  # a service's sizes come and go
        views.clear()
    held = _scratch.__dict__.setdefault(name, {})
    size = math.prod(shape) if isinstance(shape, (tuple, list)) else int(shape)
    key = np.dtype(dtype).str
    array = held.get(key)
    if array is None or array.size < size:
        grown = size if array is None else max(size, _grown(array))
        array = held[key] = aligned_empty(grown * np.dtype(dtype).itemsize).view(dtype)
        _thread_kits().clear()  # they may hold the old buffer: rebuilt from the new one
        _kits.generation += 1
        note_change()  # what a run's bound calls hold: asked again (jit_tier.CHANGES)
        views.clear()  # views of the old buffer
    view = array[:size].reshape(shape)
    found = views[(name, dtype, shape)] = view, view.__array_interface__["data"][0]
    return found


def _grown(array: np.ndarray) -> int:
    """The elements a scratch buffer outgrown grows to at least. Each growth lets go of
    every kit of the thread and asks every arena's bound calls again (``note_change``), so
    the next run of every size met before runs unbound and binds again: a service's image
    sizes come larger a few at a time, and a buffer grown by a quarter at a time grew ~25
    times over MobileNetV3-small's first 160 image sizes; doubled, ~8 (its first runs of
    a new size, median of three processes, 9.5 -> 8.9 ms over 100 sizes, 10.7 -> 9.0 over
    160; 2026-12-04). Past SCRATCH_DOUBLING_BYTES, a quarter: the spare is memory."""
    if array.nbytes < SCRATCH_DOUBLING_BYTES:
        return array.size * 2
    return array.size * 5 // 4


SCRATCH_DOUBLING_BYTES = 32 << 20
_VIEWS = "\0views"  # the key of a thread's views of its scratch buffers (no buffer's name)
MAX_SCRATCH_VIEWS = 1024  # views a thread keeps, past which they are all dropped


def scratch_kit(owner, key, make):
    """``make()``, kept for this thread per (``owner``, ``key``): a kernel's prepared call,
    the addresses of its fixed arrays and of this thread's scratch arrays written out once
    (``conv_direct_cpu``'s kits). Working those out again on every call cost a small
    convolution more than its kernel (~13 of 24 us). A kit is rebuilt when any scratch
    buffer of the thread is reallocated (so none keeps an old one alive), and is never
    returned for another ``owner`` (held weakly: its id may be reused once it is gone)."""
    kits = _thread_kits()
    found = kits.get((id(owner), key))
    if found is not None and found[0]() is owner:
        return found[1]
    kit = make()
    if len(kits) >= KITS_KEPT:
        kits.clear()
    kits[(id(owner), key)] = (weakref.ref(owner), kit)
    return kit


def kept_kit(owner, key):
    """The kit :func:`scratch_kit` keeps for this thread per (``owner``, ``key``), or None
    (nothing is made)."""
    found = _thread_kits().get((id(owner), key))
    return found[1] if found is not None and found[0]() is owner else None


def scratch_generation() -> int:
    """How many times this thread's scratch buffers were reallocated, plus how many times
    the process's routes were let go (:func:`forget_routes`): what a kept kit, a node's
    replay or kept route and an arena's bound calls were made under is current while this
    holds."""
    return _kits.generation + _ROUTES_FORGOTTEN[0]


_ROUTES_FORGOTTEN = [0]


def forget_routes() -> None:
    """Every thread's replays, kept routes and bound calls lapse (each is made again at its
    node's next call): the forms they chose were picked under a model of the machine that
    has since changed (``ops/conv/depthwise_costs.refresh``)."""
    _ROUTES_FORGOTTEN[0] += 1
    note_change()


def _thread_kits() -> dict:
    table = _kits.table
    if table is None:
        table = _kits.table = {}
    return table
