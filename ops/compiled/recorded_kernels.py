"""Which kernels, with which argument types, models call: recorded from real runs, and the
list the wheel build compiles ahead of time (``ops/compiled/_prebuild.py``).

numba compiles a kernel once per tuple of argument types (dtype, rank, layout, whether
read-only); which tuples a model meets is known only by running it. With
``MIXRT_RECORD_KERNELS=FILE`` every kernel a process loads or compiles appends one JSON line
to ``FILE``: its module, its name and its argument types, and for a generated module (a
pool, a depthwise convolution, a fused program, named by its source's hash) that source; for
a part entry's module (``ops/panels/native_parts.py``), the generated module it imports from
as well (``main``), which the build loads first.
``benchmarks/record_kernels.py`` runs a corpus of models that way and merges the lines into
``kernels.json`` beside this file, which the build reads. Types are written as plain JSON
(``encode``/``decode``), never pickled. An entry with ``levels`` is built for those x86-64
levels only (the packed-panel families, which load only on AVX-512 CPUs).
"""

from __future__ import annotations

import json
import os
import sys
import threading

RECORD = "MIXRT_RECORD_KERNELS"
_seen: set = set()
_lock = threading.Lock()


def record(cache, sig) -> None:
    """Note one kernel load (numba's ``Cache`` and the signature asked for) where
    ``MIXRT_RECORD_KERNELS`` names a file; a type that has no JSON form is skipped."""
    path = os.environ.get(RECORD)
    if not path:
        return
    py_func = cache._py_func
    try:
        entry = _entry(py_func, sig)
    except TypeError:
        return
    line = json.dumps(entry, sort_keys=True)
    with _lock:
        if line in _seen:
            return
        _seen.add(line)
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def record_into(path: str) -> None:
    """Record from now on into ``path`` (a corpus run's next case), each kernel again."""
    with _lock:
        os.environ[RECORD] = path
        _seen.clear()


def _entry(py_func, sig) -> dict:
    from numba.core.typing.templates import Signature  # noqa: PLC0415
    module = py_func.__module__
    entry = {"module": module, "qualname": py_func.__qualname__}
    if isinstance(sig, Signature):  # a cfunc, compiled as its module is imported
        entry["cfunc"] = True
        entry["args"] = []
    else:
        entry["args"] = [encode(t) for t in sig]
    if module.startswith("mixrt_") and "." not in module:
        entry["source"] = _source_of(module)
        main = getattr(sys.modules[module], "MAIN_MODULE", None)
        if main is not None:  # a part entry's module, whose names come from this one
            entry["main"] = {"module": main, "source": _source_of(main)}
    return entry


def _source_of(module: str) -> str:
    with open(sys.modules[module].__file__, encoding="utf-8") as source:
        return source.read()


def encode(t):
    """A numba type as JSON: ["array", dtype, ndim, layout, readonly, aligned], a scalar's
    name, ["unituple", item, count], ["tuple", [items]], ["cpointer", item]."""
    from numba.core import types  # noqa: PLC0415
    if isinstance(t, types.Array) and type(t) is types.Array:
        return ["array", encode(t.dtype), t.ndim, t.layout, not t.mutable, t.aligned]
    if isinstance(t, types.UniTuple):
        return ["unituple", encode(t.dtype), t.count]
    if isinstance(t, types.Tuple):
        return ["tuple", [encode(item) for item in t.types]]
    if isinstance(t, types.CPointer):
        return ["cpointer", encode(t.dtype)]
    if isinstance(t, (types.Number, types.Boolean, types.NoneType, types.RawPointer)):
        if getattr(types, str(t), None) == t:
            return str(t)
    raise TypeError(f"no JSON form for the numba type {t!r}")


def decode(value):
    """The numba type :func:`encode` wrote."""
    from numba.core import types  # noqa: PLC0415
    if isinstance(value, str):
        found = getattr(types, value, None)
        if not isinstance(found, types.Type):
            raise ValueError(f"{value!r} names no numba type")
        return found
    kind, *rest = value
    if kind == "array":
        dtype, ndim, layout, readonly, aligned = rest
        return types.Array(decode(dtype), ndim, layout, readonly=readonly, aligned=aligned)
    if kind == "unituple":
        return types.UniTuple(decode(rest[0]), rest[1])
    if kind == "tuple":
        return types.Tuple([decode(item) for item in rest[0]])
    if kind == "cpointer":
        return types.CPointer(decode(rest[0]))
    raise ValueError(f"{kind!r} is no recorded kind of numba type")


def read_lines(path) -> list[dict]:
    """The entries of a recording, each once, in a stable order."""
    entries = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                entry = json.loads(line)
                entries[json.dumps(entry, sort_keys=True)] = entry
    return [entries[key] for key in sorted(entries)]
