"""Generated kernel modules: Python source that a family writes for one case (a pool's
window, a depthwise convolution's taps, a fused elementwise program), compiled by numba.

Each generated module is written once to the cache directory's ``jit/`` folder
(``MIXRT_CACHE_DIR``, else ``$XDG_CACHE_HOME/mixrt`` or ``~/.cache/mixrt``) under a name that
holds the hash of its source, and numba caches its machine code beside it, so later processes
load a kernel in milliseconds instead of compiling it (0.2-0.5 s). The same name finds the
module's prebuilt entries, where the wheel build compiled it (``ops/compiled/prebuilt.py``).
A file whose contents differ from the source it should hold is rewritten before it is
imported. Where no cache directory is writable the source is compiled in memory, uncached.

Python's bytecode of each module is kept beside it too (``jit/__pycache__``), also where
the process may not write bytecode (``PYTHONDONTWRITEBYTECODE``, which container images
often set): Python still reads it there, and without it every import compiled the source
again (~1 ms a module; EfficientNet-B0 imports a few at each new image size, 2026-11-27).
Its name carries the source's hash, so the bytecode of one file can only be its own.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import py_compile
import sys
import threading
import time
import types
from pathlib import Path

from mixrt.ops.compiled import prebuilt
from mixrt.ops.compiled.jit_cache import cache_root, cache_root_text, guard_damaged_entries

_lock = threading.Lock()


def cache_dir() -> Path:
    return cache_root() / "jit"


@functools.lru_cache(maxsize=None)
def kernel_file_stamp(path: str) -> str:
    """The hash of a kernel file (``ops/<family>/_jit*.py``) whose compiled code a generated
    module calls, for the module's text: a module is cached by its text, and numba keeps the
    called code inside it, so a change to that file must name new modules."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def module_name(text: str, prefix: str = "mixrt_fused") -> str:
    """The name :func:`kernel_module` gives the module of ``text``."""
    return f"{prefix}_{hashlib.sha256(text.encode()).hexdigest()[:20]}"


# -- which generated modules have machine code to load ------------------------------------
#
# A kernel specialised on a size (a depthwise convolution's form for one plane geometry)
# is worth trying in a run that may not compile only where it was compiled before: trying
# one that was not wrote and imported its module and looked its entries up, ~2-3 ms a node
# (EfficientNet-B0 at a new image size: ~40 ms of a first run), only to fall back. A module
# whose kernels ran where compiling was allowed is marked so (a file beside its source).

_marked: set = set()


def mark_compiled(module) -> None:
    """Note that ``module``'s kernels ran where compiling was allowed (so their machine
    code is in the cache) for :func:`compiled_before`."""
    mark_name(module.__name__)


def mark_name(name: str) -> None:
    """:func:`mark_compiled` under ``name``: a module's, or another name a caller gives
    what it compiled (a depthwise flat form's geometry, asked before its source is made)."""
    if name in _marked:
        return
    try:
        (cache_dir() / f"{name}.compiled").touch()
    except OSError:
        return
    _marked.add(name)


def compiled_before(name: str) -> bool:
    """Whether a module named ``name`` has machine code to load: marked by
    :func:`mark_compiled` (here or in an earlier process), or among the prebuilt ones."""
    if name in _marked or _prebuilt(name):
        return True
    if f"{name}.compiled" in _markers():
        _marked.add(name)
        return True
    return False


def _markers() -> frozenset:
    """The names of the marker files in the cache's ``jit/`` folder, listed again where the
    folder changed since (its modification time, asked at most every MARKERS_FRESH_S).
    Each name was asked of the disk, a stat of ~20-27 us cold (a string path and os.path:
    a Path's making was ~35 us more, 2026-11-29), and a new image size's first run asks
    one for each depthwise convolution's geometry: thirteen a ShuffleNetV2 size
    (2026-12-05). A mark another process writes (the background compiler's) is seen
    MARKERS_FRESH_S later at most; meanwhile the node takes the form that stands in for
    its compiled one, as it did before the mark."""
    folder = os.path.join(cache_root_text(), "jit")
    now = time.monotonic()
    found = _listing.get(folder)
    if found is not None and now < found[0]:
        return found[2]
    try:
        changed = os.stat(folder).st_mtime_ns
    except OSError:
        changed = None
    if found is None or found[1] != changed:
        try:
            names = frozenset(entry for entry in os.listdir(folder)
                              if entry.endswith(".compiled"))
        except OSError:
            names = frozenset()
    else:
        names = found[2]
    _listing[folder] = (now + MARKERS_FRESH_S, changed, names)
    return names


MARKERS_FRESH_S = 0.1
_listing: dict = {}  # folder -> (fresh until, its modification time, its markers' names)


@functools.lru_cache(maxsize=1024)
def _prebuilt(name: str) -> bool:
    found = prebuilt.chosen()
    return found is not None and any(
        any((folder / prebuilt.GENERATED).glob(f"{name}.*"))
        for folder, _ in (found, *prebuilt.additions()))


def kernel(text: str, prefix: str = "mixrt_fused"):
    """The compiled ``run`` of a generated source (:func:`kernel_module`)."""
    return kernel_module(text, prefix).run


@functools.lru_cache(maxsize=256)
def kernel_module(text: str, prefix: str = "mixrt_fused"):
    """The module of a generated source (from the cache directory when possible), named
    ``prefix`` and the source's hash: its ``run`` and whatever else the source defines."""
    name = module_name(text, prefix)
    guard_damaged_entries()
    with _lock:
        path = _written(cache_dir() / f"{name}.py", text)
        if path is None:
            module = types.ModuleType(name)
            module.SOURCE = text
            exec(compile(text.replace("cache=True", "cache=False"), name, "exec"),
                 module.__dict__)
            return module
        if sys.dont_write_bytecode:  # Python reads the bytecode there, but writes none
            _keep_bytecode(path)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        module.SOURCE = text  # what a module generated from this one starts with
        sys.modules[name] = module  # numba's cache locates functions through their module
        spec.loader.exec_module(module)
        return module


def _keep_bytecode(path: Path) -> None:
    """Write ``path``'s bytecode where its import looks for it, where it is missing (the
    write is atomic; a folder that cannot be written leaves the import to compile)."""
    cached = importlib.util.cache_from_source(str(path))
    if os.path.exists(cached):
        return
    try:
        py_compile.compile(str(path), cfile=cached, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    except (OSError, py_compile.PyCompileError):
        pass


def _drop_bytecode(path: Path) -> None:
    try:
        os.unlink(importlib.util.cache_from_source(str(path)))
    except OSError:
        pass


def _written(path: Path, text: str) -> Path | None:
    """``path`` holding exactly ``text`` (written atomically when missing or different), or
    None when it cannot be written."""
    try:
        if path.is_file() and path.read_text() == text:
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        temporary.write_text(text)
        os.replace(temporary, path)
        _drop_bytecode(path)  # of the contents it replaced
        return path
    except OSError:
        return None
