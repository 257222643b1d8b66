"""A generated kernel's parts on the native worker pool (``ops/panels/_jit_panels.py``, CALL_JOB).

``parallel_for`` hands a part to a Python thread, which wakes from its queue and then waits
for the GIL: 20-40 us a hand-off, so kernels split only from 256K elements. The native
worker takes a part without the GIL, spinning between back-to-back jobs, in ~5 us, so the
pools and depthwise convolutions split from SPLIT_ELEMENTS.

A generated module (``ops/pool/jit_pool.py``, ``ops/conv/jit_depthwise.py``) carries, beside
its ``run``, the source of two ``cfunc`` entry points from :func:`part_source`, ``part_f``
(float32) and ``part_d`` (float64), as text. Each reads its arguments from an array of
addresses: ``args[0]`` is an int64 array of words (its own length, the shape of every array in
order, the integer scalars, then the parts' bounds), ``args[1:]`` the arrays' data.
:func:`run_parts` writes those and calls the pool's driver, which runs ``part(args, p)`` for
every part on this thread and the worker. Only numba's own ``carray`` reads them, so nothing of
the pool is compiled into the module.

An entry is compiled only where the native pool runs a part of its dtype (:func:`part_entry`:
that one entry, as a generated module of its own). Compiled with the module, as they were
until 2026-11-25, the two entries took most of a depthwise module's 1.6-2.1 s, though a
float32 model calls one and a CPU without the native pool (AVX2) none.

The entry's module takes the generated module's functions from that module itself
(:data:`PART_HEAD`), so the ``run`` it calls is the one the module compiled for Python's calls:
numba types a carray as it types a writeable array, and finds that overload compiled. The
entry's module held a copy of the generated module's source until 2026-11-30, and compiled
its ``run`` and helpers a second time: 232 s of the suite's 1,017 s of numba compiles on a
2-core Xeon, a third of each depthwise and pool part entry's cost.
"""

from __future__ import annotations

import functools
import sys
import weakref

import numpy as np

from mixrt.ops.compiled import jit_cpu, jit_tier
from mixrt.ops.compiled.entry_points import fixed_call
from mixrt.ops.compiled.generated import kernel_module

# work (elements written) from which a kernel's parts go to the native workers: their hand-off
# costs ~5 us, a Python thread's 20-40 (ops/compiled/parallel.py's MIN_ELEMENTS is set for those).
# ShuffleNet's 272x14x14 depthwise layer: 62 us on one thread, 42 split in two
SPLIT_ELEMENTS = 1 << 14
_SIGNATURE = "types.void(types.CPointer(types.voidptr), types.int64)"
_FLAGS = "nopython=True, cache=True, error_model='numpy'"
IMPORTS = ["from numba import carray, cfunc, types"]
# the head of a part entry's module: every name of the generated module it belongs to, which
# is loaded (``generated.kernel_module`` registers it in ``sys.modules``) before the entry's
# module is made or imported; ``MAIN_MODULE`` names it for the kernel records
# (``ops/compiled/recorded_kernels.py``), so the wheel's prebuild loads it first
PART_HEAD = """from {name} import *  # noqa: F403
import numpy as np
from numba import carray, cfunc, types

MAIN_MODULE = "{name}"
"""


def part_source(arrays: list[tuple[str, int, bool]], scalars: list[str], body) -> list[str]:
    """The line that gives a module ``PART_SOURCES``, the source of ``part_f`` and ``part_d``
    by dtype (:func:`part_entry` compiles one where it is called): ``arrays`` as (name,
    ndim, floating) in :func:`run_parts`'s order (floating ones in the part's dtype, the
    others int64), ``scalars`` the integer names after them, and ``body(dtype)`` the
    statements of one part over ``start``..``stop`` (lines without indentation; ``dtype`` is
    ``"np.float32"`` or ``"np.float64"``)."""
    return [f"PART_SOURCES = {part_sources(arrays, scalars, body)!r}", ""]


def part_sources(arrays: list[tuple[str, int, bool]], scalars: list[str], body) -> dict:
    """:func:`part_source`'s sources by dtype suffix, for a module given them afterwards
    (``module.PART_SOURCES``: a generated module whose own source stays as it was)."""
    sources = {}
    for suffix, dtype in (("f", "np.float32"), ("d", "np.float64")):
        lines = [f"@cfunc({_SIGNATURE}, {_FLAGS})", f"def part_{suffix}(args, index):",
                 "    words_ = carray(args[0], (carray(args[0], (1,), np.int64)[0],), np.int64)"]
        at = 1
        for position, (name, ndim, floating) in enumerate(arrays, 1):
            shape = "".join(f"words_[{at + axis}], " for axis in range(ndim))
            at += ndim
            kind = dtype if floating else "np.int64"
            lines.append(f"    {name} = carray(args[{position}], ({shape}), {kind})")
        for name in scalars:
            lines.append(f"    {name} = words_[{at}]")
            at += 1
        lines.append(f"    start, stop = words_[{at} + index], words_[{at} + index + 1]")
        lines += [f"    {line}" for line in body(dtype)]
        sources[suffix] = "\n".join(lines) + "\n"
    return sources


@functools.lru_cache(maxsize=256)
def part_entry(module, suffix: str):
    """``module``'s ``part_f`` (``suffix`` "f") or ``part_d`` ("d"), compiled: a generated
    module of :data:`PART_HEAD` (the module's names, imported) and that entry's source
    (named by its hash like every generated module, so it is cached and prebuilt as they
    are); a kernel file's own entries (``ops/conv/_grouped_parts.py``) as they are."""
    written = getattr(module, f"part_{suffix}", None)
    if written is not None:
        return written
    if sys.modules.get(module.__name__) is module:  # importable by its name
        head = PART_HEAD.format(name=module.__name__)
    else:  # compiled in memory (no cache folder to write): a copy of its source
        head = module.SOURCE
    source = f"{head}\n{module.PART_SOURCES[suffix]}"
    prefix = f"{module.__name__.rsplit('_', 1)[0]}_part_{suffix}"
    return getattr(kernel_module(source, prefix), f"part_{suffix}")


def split(rows: int, work: int, native) -> list[tuple[int, int]] | None:
    """``rows`` in one contiguous part per thread of ``native`` (the calling one included),
    or None when there is no pool or the ``work`` is too small to split."""
    if native is None or work < SPLIT_ELEMENTS or rows < 2:
        return None
    count = min(rows, native.workers + 1)
    bounds = [rows * p // count for p in range(count + 1)]
    return [(bounds[p], bounds[p + 1]) for p in range(count)]


def run_parts(native, module, arrays: tuple, scalars: tuple, parts: list) -> None:
    """``module``'s part entry for ``arrays[0]``'s dtype over ``parts`` ((start, stop) runs,
    contiguous and in order), on ``native`` (``jit_cpu.native_pool()``). ``arrays`` are
    C-contiguous and stay alive through the call, as their addresses are all the part
    gets."""
    prepared(native, module, arrays, scalars, parts)()


def prepared(native, module, arrays: tuple, scalars: tuple, parts: list, keep=()):
    """:func:`run_parts` as a call to make later, ``go()``: it holds the arrays' addresses,
    not the arrays, so they must be alive (and the same) whenever it is made (a replayed
    node's, ``ops/compiled/replay.py``); ``keep``: those among them the caller made for this call
    (a bias of zeros, a divisor), which ``go`` keeps alive."""
    shapes = [extent for array in arrays for extent in array.shape]
    bounds = [start for start, _ in parts] + [parts[-1][1]]
    words = np.array([0, *shapes, *scalars, *bounds], np.int64)
    words[0] = words.size
    addresses = np.empty(len(arrays) + 1, np.uint64)
    _typed_addresses(addresses, (words,) + tuple(arrays))
    entry = part_entry(module, "f" if arrays[0].dtype == np.float32 else "d")
    call = fixed_call(jit_cpu.panel_kernels().native_for, native.block, entry.address,
                      addresses, len(parts))

    def go(*_):
        call()
    go.kept = (words, keep)  # addresses[0] points into the words
    return go


def warm_prepared(arrays: tuple) -> None:
    """Compile (or load) what :func:`prepared` calls for ``arrays``, beside its part entry:
    the address fill, typed by the tuple's arrays. A warmer that compiled a node's fallback
    form and its part entry but not this left a run that may not compile (a service's new
    size) to miss it as the node's split began (a depthwise row form over three images,
    2026-11-28). Nothing where one is None (no such call is prepared)."""
    if all(array is not None for array in arrays):
        _typed_addresses(np.empty(len(arrays) + 1, np.uint64),
                         (np.zeros(1, np.int64),) + arrays)


_addresses = None  # the compiled fill_addresses, once loaded


def fill_addresses(out, arrays) -> None:
    """``out[i]`` = the data address of ``arrays[i]`` (a tuple of arrays), in one compiled
    call (``_jit_addresses.py``, imported on first use: it loads numba), ~1 us for ten.

    The call is compiled per tuple of array types (ranks, layouts, read-only flags), and a
    run that may not compile can meet one no warm-up made. There the addresses are read one
    by one (~11 us for ten, after ~0.3 ms of numba looking in its cache), and no miss is
    left: the step ran NumPy's convolution instead, the run counted a missing kernel, and
    each new size of a MobileNetV3 started a compile child (2026-11-29)."""
    global _addresses
    if _addresses is None:
        _addresses = jit_cpu.load("mixrt.ops.panels._jit_addresses").fill_addresses
    try:
        _addresses(out, arrays)
    except jit_tier.CompileForbidden:
        _forget_own_miss()
        for at, array in enumerate(arrays):
            out[at] = array.ctypes.data


def _forget_own_miss() -> None:
    """Take the address fill's forbidden compile out of the loading run's misses."""
    misses = jit_tier.compile_misses()
    for at in range(len(misses or ()) - 1, -1, -1):
        if "fill_addresses" in misses[at]:
            del misses[at]
            return


def _typed_addresses(out, arrays: tuple) -> None:
    """:func:`fill_addresses` for a prepared call's arrays (made once per node and size, so
    the check of each array is paid there, not per request): read-only ones stand in as a
    writeable array of their rank and dtype, their own addresses read apart. numba types
    read-only arrays apart, and a node's constant bias made the fill of a 1x1
    convolution's bands a specialisation of its own, which no warm-up compiled."""
    for array in arrays:  # (a loop, not all() over a generator: ~12 resumptions a call)
        if not array.flags.writeable:
            break
    else:
        fill_addresses(out, arrays)
        return
    fill_addresses(out, tuple(array if array.flags.writeable else _stand_in(array)
                              for array in arrays))
    for at, array in enumerate(arrays):
        if not array.flags.writeable:
            out[at] = _read_only_address(array)


def _read_only_address(array) -> int:
    """A read-only array's data address, kept by the array (held weakly: its id may be
    reused once it is gone). A node's constants come back at each of its calls, and
    reading an address through ``ndarray.ctypes`` was ~25 us a call at a new size's
    first run, cold (a depthwise convolution's weight and bias, 2026-12-01)."""
    found = _ADDRESSES.get(id(array))
    if found is not None and found[0]() is array:
        return found[1]
    address = array.ctypes.data
    if len(_ADDRESSES) >= 4096:
        _ADDRESSES.clear()
    _ADDRESSES[id(array)] = (weakref.ref(array), address)
    return address


_ADDRESSES: dict = {}  # id(array) -> (its weak reference, its data address)


_STAND_INS: dict = {}  # (rank, dtype) -> a writeable stand-in for a read-only array


def _stand_in(array):
    key = (array.ndim, array.dtype.str)
    found = _STAND_INS.get(key)
    if found is None:
        found = _STAND_INS.setdefault(key, np.zeros((1,) * array.ndim, array.dtype))
    return found
