"""Kernels compiled ahead of time: numba's machine code for the standard kernels, built when
the wheel is built, shipped inside it and loaded where the CPU can run it.

numba compiles a kernel on its first call and keeps the machine code in a disk cache keyed by
the function, its argument types and the CPU it was compiled for. A fresh machine's cache is
empty, so a session spent its first seconds to minutes compiling in a child process
(``runtime/kernel_tiers.py``). The wheel build (``setup.py``, through
``ops/compiled/_prebuild.py``) compiles the kernels a list of recorded calls names
(``kernels.json``: every standard kernel and argument type a corpus of models called, the
generated pools and convolutions among them) once per x86-64 micro-architecture level:

* ``x86-64-v3``: AVX2 and FMA (Intel since Haswell, AMD since Excavator and every Zen);
* ``x86-64-v4``: AVX-512 F/BW/CD/DQ/VL (Intel Skylake-SP and later servers, AMD Zen 4);
  its addition ``x86-64-v4-vnni`` holds the 8-bit products, which need AVX-512 VNNI (Intel
  Cascade Lake and later, AMD Zen 4).

Each level's entries live in ``prebuilt/<level>/`` in numba's own cache format, named by the
kernel's file relative to the package (or ``generated/`` for a generated module, whose name
holds its source's hash), so they do not depend on where the package is installed. A
process picks the best level its CPU has (:func:`chosen`) and ``jit_cache.py`` looks an entry
up there when the user's cache misses, with the level's target in place of the host's in
numba's key. A kernel whose source changed no longer matches its entry (numba stamps an index
with its source's hash; the kernel files also with every kernel file's, ``jit_cache.py``), and
compiles as before; so does every kernel on another CPU, another numba or another Python.

The entries are numba's cache files, which numba reads with pickle: they come with the
package and are trusted as its code is, never taken from a user's or a model's file.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

# x86-64 levels as LLVM names them, best first, with the host features (llvmlite's names) a
# CPU must have to run code built for them
LEVELS = {
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma",
                  "bmi2"),
    "x86-64-v3": ("avx", "avx2", "fma", "bmi", "bmi2", "f16c", "lzcnt", "movbe"),
}
# the widest float vector of each level (jit_cpu.vector_bytes when building for it)
LEVEL_VECTOR_BYTES = {"x86-64-v4": 64, "x86-64-v3": 32}
# a level's additions: kernels that need features beyond it, in a folder of their own, built
# for the level's CPU with those features and loaded after the level's own entries where the
# CPU has them too. The 8-bit products are LLVM IR around AVX-512 VNNI's vpdpbusd
# (ops/quant/_jit_int8.py), which x86-64-v4 lacks: LLVM aborts on it for that target.
ADDITIONS = {"x86-64-v4-vnni": ("x86-64-v4", ("avx512vnni",))}
MANIFEST = "manifest.json"
# the environment of a build (ops/compiled/_prebuild.py): the level and where its entries go
BUILD_LEVEL, BUILD_INTO = "MIXRT_PREBUILD_LEVEL", "MIXRT_PREBUILD_INTO"
_PACKAGE = Path(__file__).resolve().parent.parent.parent  # mixrt/ installed; the repo root here
GENERATED = "generated"


def root() -> Path:
    """Where the wheel keeps the levels' entries (``MIXRT_PREBUILT_DIR``: elsewhere, as
    ``NUMBA_CACHE_DIR`` moves numba's own cache; a source checkout builds its own there)."""
    configured = os.environ.get("MIXRT_PREBUILT_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parent / "prebuilt"


def build_target(level: str) -> tuple[str, str]:
    """What numba is told while building ``level``: the CPU name and the features beyond it
    (``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES``)."""
    if level in ADDITIONS:
        base, features = ADDITIONS[level]
        return base, ",".join(f"+{name}" for name in features)
    return level, ""


def builds_entry(level: str, entry: dict) -> bool:
    """Is a recorded entry compiled into ``level``? A level's own take every entry not
    marked for others; an addition only those marked for it."""
    levels = entry.get("levels")
    if level in ADDITIONS:
        return levels is not None and level in levels
    return levels is None or level in levels


@functools.lru_cache(maxsize=1)
def additions() -> tuple[tuple[Path, tuple], ...]:
    """The chosen level's additions this CPU runs, as (folder, numba's target tuple), in the
    order they are looked in after the level itself."""
    found = chosen()
    if found is None:
        return ()
    features = _host_features()
    kept = []
    for name, (base, needs) in ADDITIONS.items():
        if base != found[0].name or not all(features.get(n, False) for n in needs) \
                or not told_features_have(needs):
            continue
        manifest = _manifest(root() / name)
        if manifest is not None and _same_build(manifest):
            kept.append((root() / name, tuple(manifest["target"])))
    return tuple(kept)


def told_features_have(names) -> bool:
    """Does the CPU numba compiles for have these features (llvmlite's names), as far as
    the settings say? Told a CPU with stated features (``NUMBA_CPU_NAME``,
    ``NUMBA_CPU_FEATURES``: a level's build or view), only those count; told none, or a CPU
    without features, numba takes the host's (``numba.core.config``): True. Code that needs
    them (the VNNI products) must not be compiled for a target without them: LLVM aborts."""
    told = os.environ.get("NUMBA_CPU_FEATURES")
    if not os.environ.get("NUMBA_CPU_NAME") or told is None:
        return True
    return all(f"+{name}" in told.split(",") for name in names)


def _same_build(manifest: dict) -> bool:
    return manifest.get("numba") == _numba_version() and \
        manifest.get("python") == _python_tag()


@functools.lru_cache(maxsize=1)
def chosen() -> tuple[Path, tuple] | None:
    """The prebuilt level this process uses, as (its folder, numba's target tuple its
    entries were built under), or None: the CPU's level (:func:`host_level`) not shipped,
    built by another numba or Python, ``MIXRT_PREBUILT=0``, or while building one."""
    if os.environ.get("MIXRT_PREBUILT", "1") == "0" or os.environ.get(BUILD_LEVEL):
        return None
    if not any((root() / level / MANIFEST).is_file() for level in LEVELS):
        return None  # none shipped (a checkout, the sdist): no llvmlite for a NumPy first run
    level = host_level()
    manifest = None if level is None else _manifest(root() / level)
    if manifest is None or not _same_build(manifest):
        return None
    return root() / level, tuple(manifest["target"])


def host_level() -> str | None:
    """The best level this CPU runs, and only that one: the kernels' Python picks its forms
    by the CPU's vector width (``jit_cpu.vector_bytes``), so an AVX-512 machine must not
    load the AVX2 level's code, built for the other forms. Where numba is told a level's
    CPU (``NUMBA_CPU_NAME=x86-64-v3``, as for caches shared by a mixed cluster), that
    level, if this CPU runs it: the kernels' forms follow the same setting."""
    features = _host_features()
    told = os.environ.get("NUMBA_CPU_NAME")
    if told in LEVELS:
        return told if all(features.get(name, False) for name in LEVELS[told]) else None
    widest = 64 if features.get("avx512f") else 32 if features.get("avx2") else 16
    for level, needs in LEVELS.items():
        if all(features.get(name, False) for name in needs):
            return level if LEVEL_VECTOR_BYTES[level] == widest else None
    return None


def level_name() -> str | None:
    """The level this process loads prebuilt kernels of, with its additions, or None
    (``mixrt warmup`` says it)."""
    found = chosen()
    if found is None:
        return None
    return " + ".join(folder.name for folder, _ in (found, *additions()))


def _manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def _host_features() -> dict:
    from llvmlite import binding  # noqa: PLC0415  (numba's, loaded with it)
    return dict(binding.get_host_cpu_features())


def _numba_version() -> str:
    import numba  # noqa: PLC0415
    return numba.__version__


def _python_tag() -> str:
    return f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"


def building() -> Path | None:
    """The level folder a prebuild writes (``BUILD_INTO``/``BUILD_LEVEL``), else None."""
    level, into = os.environ.get(BUILD_LEVEL), os.environ.get(BUILD_INTO)
    return Path(into) / level if level and into else None


# -- where one kernel's entries live --------------------------------------------------------------

def home(py_file: str, module: str) -> str | None:
    """A kernel's folder within a level: its file's folder relative to the package
    (``ops/pool``), ``generated`` for a generated module, or None for code that is not
    mixrt's (a user's own numba functions never touch these entries)."""
    if module.startswith("mixrt_") and "." not in module:
        return GENERATED
    try:
        relative = Path(py_file).resolve().relative_to(_PACKAGE)
    except ValueError:
        return None
    if not module.startswith("mixrt.") or relative.parts[0] != "ops":
        return None
    return relative.parent.as_posix()


def index_file(cache, level_folder: Path):
    """numba's index and data files for ``cache`` (a numba ``Cache``) in ``level_folder``,
    or None when the kernel is not mixrt's."""
    from numba.core.caching import IndexDataCacheFile  # noqa: PLC0415
    py_func = cache._py_func
    where = home(cache._impl.locator._py_file, py_func.__module__)
    if where is None:
        return None
    return IndexDataCacheFile(cache_path=str(level_folder / where),
                              filename_base=cache._impl.filename_base,
                              source_stamp=cache._cache_file._source_stamp)


def load(cache, sig, target_context):
    """``cache``'s entry for ``sig`` from the chosen level or one of its additions, rebuilt,
    or None."""
    found = chosen()
    if found is None:
        return None
    key = cache._index_key(sig, target_context.codegen())
    for folder, target in (found, *additions()):
        entries = index_file(cache, folder)
        if entries is None:
            return None
        # read without the index lock of jit_cache.py: nothing writes these files after
        # the build, and a lock file would be created inside the installed package
        name = entries._load_index().get((key[0], target, key[2]))
        if name is not None:
            return cache._impl.rebuild(target_context, entries._load_data(name))
    return None


def save(cache, sig, data) -> None:
    """While building a level: ``cache``'s newly compiled ``data`` for ``sig`` into it too."""
    folder = building()
    if folder is None or not cache._impl.check_cachable(data):
        return
    entries = index_file(cache, folder)
    if entries is None:
        return
    os.makedirs(entries._cache_path, exist_ok=True)
    entries.save(cache._index_key(sig, data.codegen), cache._impl.reduce(data))
