"""Where mixrt keeps what it compiles: ``MIXRT_CACHE_DIR``, else ``$XDG_CACHE_HOME/mixrt``
or ``~/.cache/mixrt``. The generated kernels' sources live in its ``jit/`` folder, the
markers of models whose kernels are compiled in ``warm/`` (``runtime/kernel_tiers.py``).

numba's own cache is patched once per process (:func:`guard_damaged_entries`): a damaged
entry counts as missing, index updates are locked, the kernel files' entries are stamped with
every kernel file's hash; an entry is read before numba's registries are loaded
(``numba_start.py``); a miss looks in the wheel's prebuilt level (``prebuilt.py``); under
``jit_tier.loading_only`` a kernel in no cache raises instead of compiling; a kernel another
process is compiling is waited for and loaded, not compiled twice; a prebuild saves each
entry into its level too; ``MIXRT_RECORD_KERNELS`` notes every load
(``recorded_kernels.py``)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from pathlib import Path

from mixrt.ops.compiled import jit_tier, prebuilt
from mixrt.ops.compiled.numba_start import load_before_registries
from mixrt.ops.compiled.recorded_kernels import record as _record

try:
    import fcntl
except ImportError:  # not POSIX: numba's unlocked saves, as before
    fcntl = None


def cache_root() -> Path:
    return Path(cache_root_text())


def cache_root_text() -> str:
    """:func:`cache_root` as a string, made once per value of the variables it reads: a
    Path built from the environment cost ~15-30 us cold, and a new image size's first run
    asks a marker file's path for each of its depthwise convolutions (2026-11-29)."""
    key = (os.environ.get("MIXRT_CACHE_DIR"), os.environ.get("XDG_CACHE_HOME"),
           os.environ.get("HOME"))
    found = _ROOTS.get(key)
    if found is None:
        configured, xdg, _ = key
        base = xdg or os.path.join(os.path.expanduser("~"), ".cache")
        found = _ROOTS[key] = configured or os.path.join(base, "mixrt")
    return found


_ROOTS: dict = {}  # (the variables cache_root reads) -> the root they name


# -- damaged entries -----------------------------------------------------------------------------
#
# numba reads its disk cache with pickle and lets any failure escape: a truncated index or
# data file (a full disk, a process killed mid-write on a file system without atomic
# rename, a bad copy of a cache into an image) made every later call of that kernel raise
# UnpicklingError or EOFError, in every process, until someone deleted the file. Guarded,
# such an entry is deleted and counts as missing, so the kernel is compiled and saved again.

_guarded: list = []


def guard_damaged_entries() -> None:
    """Make numba treat a damaged cache file as a missing one (once per process)."""
    if _guarded:
        return
    from numba.core import caching  # noqa: PLC0415  (numba loads on first use)
    index_file, cache = caching.IndexDataCacheFile, caching.Cache
    load_index, load_data = index_file._load_index, index_file._load_data

    def _load_index(self):
        try:
            return load_index(self)
        except Exception:  # noqa: BLE001  (any damage: unpickling, truncation, bad types)
            _remove(self._index_path)
            return {}

    def _load_data(self, name):
        try:
            return load_data(self, name)
        except OSError:
            raise
        except Exception as exc:  # noqa: BLE001
            _remove(self._data_path(name))
            raise OSError(f"damaged numba cache entry {name}") from exc  # load() skips it

    def _load_overload(self, sig, target_context):
        try:
            return load_before_registries(self, sig, target_context)
        except Exception:  # noqa: BLE001  (an entry that unpickled but cannot be rebuilt)
            return None

    def _cached_overload(self, sig, target_context):
        loaded = _load_overload(self, sig, target_context)
        if loaded is not None and not _same_arguments(loaded, sig):
            loaded = None  # another signature's machine code under this key: compile instead
        if loaded is None:
            loaded = _prebuilt_overload(self, sig, target_context)
        return loaded

    def _load_overload_checked(self, sig, target_context):
        loaded = _cached_overload(self, sig, target_context)
        _record(self, sig)
        if loaded is None:
            _forbid_compile(self, sig)
            # this process's turn to compile it, once another one compiling it is done;
            # what that one saved meanwhile is loaded instead
            index = self._cache_file._index_path
            _turns.take(index)
            loaded = _cached_overload(self, sig, target_context)
            if loaded is not None:
                _turns.give_back(index)
        return loaded

    def _save_overload(self, sig, data):
        try:
            save_overload(self, sig, data)
            prebuilt.save(self, sig, data)
        finally:
            _turns.give_back(self._cache_file._index_path)

    def _null_load(self, sig, target_context):
        _forbid_compile(self, sig)  # a kernel numba would compile without caching it

    save_overload, null_cache = cache.save_overload, caching.NullCache
    index_file._load_index, index_file._load_data = _load_index, _load_data
    cache.load_overload, cache.save_overload = _load_overload_checked, _save_overload
    null_cache.load_overload = _null_load
    _lock_index_updates(index_file)
    _stamp_kernel_files(caching._SourceFileBackedLocatorMixin)
    _guarded.append(True)


# numba stamps a cache entry with its own source file's mtime and size only, but a cached
# kernel keeps the machine code it inlined from the other kernel files (the tile, the
# atomics): an entry of ops/panels/_jit_conv_direct.py would outlive a change to
# ops/panels/_jit_tile.py. The entries of the kernel files (ops/*/_jit*.py) are stamped with
# every kernel file's mtime and size.
_OPS_FOLDER = Path(__file__).resolve().parent.parent


def _stamp_kernel_files(locator) -> None:
    own = locator.get_source_stamp

    def get_source_stamp(self):
        stamp = own(self)
        path = Path(self._py_file).resolve()
        if path.parent.parent == _OPS_FOLDER and path.name.startswith("_jit"):
            return stamp, kernel_files_stamp()
        return stamp
    locator.get_source_stamp = get_source_stamp


def _prebuilt_overload(cache, sig, target_context):
    try:
        loaded = prebuilt.load(cache, sig, target_context)
    except Exception:  # noqa: BLE001  (a damaged prebuilt entry: compile, as for a miss)
        return None
    return loaded if loaded is None or _same_arguments(loaded, sig) else None


def _forbid_compile(cache, sig) -> None:
    """Under ``jit_tier.loading_only``: name the kernel and refuse to compile it."""
    misses = jit_tier.compile_misses()
    if misses is None:
        return
    name = getattr(cache, "_name", None) or repr(cache)
    misses.append(jit_tier.noted_miss(f"{name} {sig}"))
    raise jit_tier.CompileForbidden(f"{name} for {sig} is in no cache")


def _same_arguments(loaded, sig) -> bool:
    from numba.core import sigutils  # noqa: PLC0415
    wanted, _ = sigutils.normalize_signature(sig)
    return tuple(loaded.signature.args) == tuple(wanted)


# -- concurrent writers --------------------------------------------------------------------------
#
# numba saves an entry by reading the index, naming the data file after the first free
# number, and writing the index and then the data, all without a lock. Two processes that
# compile new signatures of one kernel at once (the test suite's workers, a service's workers
# started together on an empty cache) both pick the same number: the index names one
# signature, the data file holds the other's code, and every later process that loads it gets
# a kernel typed for the wrong arguments (a TypingError naming known signatures that lack the
# one asked for). Index updates take an exclusive flock on a lock file beside the index,
# loads a shared one, so an index and the data it names always agree.

def _lock_index_updates(index_file) -> None:
    if fcntl is None:
        return
    save, load = index_file.save, index_file.load

    def locked_save(self, key, data):
        with _index_lock(self, fcntl.LOCK_EX):
            save(self, key, data)

    def locked_load(self, key):
        with _index_lock(self, fcntl.LOCK_SH):
            return load(self, key)

    index_file.save, index_file.load = locked_save, locked_load


@contextlib.contextmanager
def _index_lock(index_file, mode: int):
    try:
        handle = os.open(index_file._index_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only cache (an image's): nothing writes it, nothing to order
        yield
        return
    try:
        fcntl.flock(handle, mode)
        yield
    finally:
        os.close(handle)  # closing releases the lock


# -- one compile of a kernel at a time, across processes ------------------------------------------
#
# Processes that start together on an empty cache (a service's workers, a distributed job's,
# the test suite's) met each kernel at about the same time and each compiled it: on 2 cores,
# 3-5 processes compiling the same panel family took 2-3 times as long each as one did alone.
# A process that misses a kernel now takes that kernel's turn, an exclusive flock on a file
# beside its index, before it compiles, and gives it back once the entry is saved; one that
# finds the turn taken waits, then finds the entry saved and loads it. The flock goes with
# its process, so a compile killed midway frees the turn; a compile that raised keeps it
# until its process ends, so a waiter gives up after COMPILE_WAIT seconds and compiles
# itself. A cache it cannot write to (an image's, read-only) has no turns.

COMPILE_WAIT = 300.0  # seconds a process waits for another one's compile of a kernel
_POLL = 0.02


class _CompileTurns:
    def __init__(self):
        self._held: dict = {}  # index path -> the descriptor holding its turn

    def take(self, index_path: str) -> None:
        """Wait for ``index_path``'s kernel's turn and hold it (numba's compiler lock keeps
        one thread of a process compiling at a time, so a process holds each turn once)."""
        if fcntl is None or index_path in self._held:
            return
        try:
            handle = os.open(index_path + ".compiling", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return
        deadline = time.monotonic() + COMPILE_WAIT
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(handle)
                    return
                time.sleep(_POLL)
            except OSError:
                os.close(handle)
                return
        self._held[index_path] = handle

    def give_back(self, index_path: str) -> None:
        handle = self._held.pop(index_path, None)
        if handle is not None:
            os.close(handle)  # closing releases the flock


_turns = _CompileTurns()


def kernel_files_stamp() -> tuple:
    """(family/name, SHA-256 of the contents) of every compiled-kernel source file
    (ops/*/_jit*.py): contents, not mtimes, so that an installed copy of the package matches
    the entries its wheel was built with (``ops/compiled/prebuilt.py``)."""
    return tuple((f"{p.parent.name}/{p.name}", _content_hash(p, p.stat()))
                 for p in _kernel_files())


@functools.lru_cache(maxsize=1)
def _kernel_files() -> tuple[Path, ...]:
    # listed once a process: every kernel-file entry's stamp asks (17 loads of ResNet-50's
    # first run globbed ~1,500 paths, ~30 ms); a file's change still shows in its stat
    return tuple(sorted(_OPS_FOLDER.glob("*/_jit*.py")))


def _content_hash(path: Path, stat) -> str:
    return _hashed(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _hashed(path: str, mtime_ns: int, size: int) -> str:  # a changed file is read again
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
