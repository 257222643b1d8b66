"""mixrt's BLAS policy: NumPy's OpenBLAS with its AVX-512 kernels and a short idle spin.

Two OpenBLAS settings decide how fast mixrt's CPU kernels run around their BLAS calls:

* ``OPENBLAS_CORETYPE``. OpenBLAS's runtime dispatch gives this AMD EPYC (Zen 5) its AVX2
  (Haswell) kernels, and the machines it was measured on also export ``OPENBLAS_CORETYPE=Haswell``,
  while onnxruntime's MLAS uses AVX-512 on the same CPU. The SkylakeX sgemm runs ~1.8x
  faster there (BENCHMARKS.md), so on CPUs with AVX-512 mixrt picks it.
* ``OPENBLAS_THREAD_TIMEOUT``. Between two BLAS calls a kernel runs NumPy copies and ufuncs,
  some split over mixrt's intra-op threads (ops/compiled/parallel.py); an OpenBLAS thread still
  spinning in that gap (2^28 cycles, ~0.1 s, by default) takes a core from them. With 2^16
  a ResNet-18 training step ran ~20% faster on 2 cores (1780 -> 1460 ms). Unless the user
  set it, mixrt sets 16.

OpenBLAS reads both from the C environment when it loads, and has no call that sets them
afterwards. mixrt puts them there only for that moment and then restores the environment as
it was: ``import mixrt`` leaves ``os.environ`` unchanged, so child processes and other
libraries never see mixrt's choice (a child that imports mixrt makes the same choice
itself). When mixrt is imported before NumPy, :func:`before_numpy` loads NumPy (and so its
OpenBLAS) inside that moment. When NumPy came first (isort puts ``numpy``
before ``mixrt``), its OpenBLAS is already running with its own choice: ResNet-50 at batch
1 took 37-41 ms instead of 25 on the 2-core EPYC. :func:`after_numpy` then re-tunes the
loaded library through its exported entry points, the same steps OpenBLAS takes at load and
across a fork: stop its thread pool, re-read the environment, re-select the kernels for the
new core type, start the pool again. That is done only while no other Python thread runs
(one could be inside a BLAS call) and only when the library has all of those entry points;
the result is checked (the core's name, the timeout), and when anything is missing or does
not take, one :class:`mixrt.errors.BlasPolicyWarning` says what was missed and how to fix it.

``MIXRT_BLAS=system`` leaves OpenBLAS entirely alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import warnings

from mixrt.base import errors, placement

AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}  # OpenBLAS's AVX-512 kernels
CORETYPE = "SkylakeX"
THREAD_TIMEOUT = "16"  # OpenBLAS clamps it to 4..30 and spins 2^value cycles
# what OpenBLAS does at load, in order: each returns int or nothing and takes no arguments
_RESTART = ("blas_thread_shutdown_", "openblas_read_env", "blas_thread_init")
_RESELECT = ("gotoblas_dynamic_quit", "gotoblas_dynamic_init")
# the core's name: OpenBLAS's own symbol, or NumPy's scipy-openblas builds' prefixed ones
_CORENAME = ("openblas_get_corename", "scipy_openblas_get_corename64_",
             "scipy_openblas_get_corename")


def active() -> bool:
    return os.environ.get("MIXRT_BLAS", "auto") == "auto"


def cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo
                          if line.startswith("flags")), [])
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= set(flags)


@contextlib.contextmanager
def _settings_in_environment():
    """The two settings in the environment while OpenBLAS reads them, then the environment
    exactly as it was (os.environ writes through to the C environment OpenBLAS reads)."""
    wanted = {"OPENBLAS_CORETYPE": CORETYPE} if cpu_has_avx512() else {}
    if "OPENBLAS_THREAD_TIMEOUT" not in os.environ:
        wanted["OPENBLAS_THREAD_TIMEOUT"] = THREAD_TIMEOUT
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def before_numpy() -> None:
    """NumPy (and so its OpenBLAS) is not loaded yet: load it while the settings are in the
    environment."""
    if active() and "numpy" not in sys.modules:
        # OpenBLAS starts its threads as it loads: mixrt keeps them off the CPU of the
        # thread that calls a run, as its own (base/placement.py)
        with _settings_in_environment(), placement.new_threads():
            import numpy  # noqa: F401,PLC0415  (its OpenBLAS reads the settings as it loads)


def after_numpy(stacklevel: int) -> None:
    """NumPy was loaded before mixrt: re-tune its OpenBLAS in place, or warn once, at
    ``stacklevel`` as seen from the caller (2: the line that imported the caller)."""
    if not active() or not _numpy_uses_openblas():
        return
    wanted_core = cpu_has_avx512()
    user_timeout = "OPENBLAS_THREAD_TIMEOUT" in os.environ
    library = _loaded_openblas()
    if library is not None and _already_tuned(library, wanted_core, user_timeout):
        return
    obstacle = _obstacle(library)
    if obstacle is None:
        retune(library, wanted_core)
        obstacle = "the library did not take the new settings"
    missed = _missed(wanted_core, user_timeout, _corename(library), _timeout(library)) \
        if library is not None else _missed(wanted_core, user_timeout, "", 0)
    if missed:
        _warn(missed, obstacle, stacklevel + 2)  # + this function and _warn


def _obstacle(library) -> str | None:
    """Why the loaded ``library`` cannot be re-tuned now, or None when it can."""
    if library is None:
        return "its OpenBLAS was not found among the loaded libraries"
    if threading.active_count() > 1:
        return "another thread was running, perhaps inside a BLAS call"
    if not all(hasattr(library, name) for name in _RESTART):
        return "its OpenBLAS lacks the entry points to restart its threads"
    return None


def retune(library, wanted_core: bool) -> None:
    """Restart the loaded ``library`` on the settings: stop its threads, re-read the
    environment, re-select the kernels (DYNAMIC_ARCH builds), start the threads again."""
    with _settings_in_environment(), placement.new_threads():
        library.blas_thread_shutdown_()
        library.openblas_read_env()
        if wanted_core and all(hasattr(library, name) for name in _RESELECT):
            library.gotoblas_dynamic_quit()
            library.gotoblas_dynamic_init()
        library.blas_thread_init()


def _already_tuned(library, wanted_core: bool, user_timeout: bool) -> bool:
    return not _missed(wanted_core, user_timeout, _corename(library), _timeout(library))


def _missed(wanted_core: bool, user_timeout: bool, core: str, timeout: int) -> list[str]:
    missed = []
    if wanted_core and core.lower() not in AVX512_CORES:
        missed.append(f"its AVX-512 kernels (OPENBLAS_CORETYPE={CORETYPE})")
    if not user_timeout and timeout != int(THREAD_TIMEOUT):
        missed.append(f"a short idle spin (OPENBLAS_THREAD_TIMEOUT={THREAD_TIMEOUT})")
    return missed


def _warn(missed: list[str], obstacle: str, stacklevel: int) -> None:
    warnings.warn(
        f"mixrt was imported after NumPy and could not re-tune NumPy's OpenBLAS in place "
        f"({obstacle}), so it runs without {' and '.join(missed)}: convolutional models run up to 1.6x slower on the "
        f"CPU (ResNet-50 batch 1: 41 ms instead of 25 on a 2-core AVX-512 EPYC). Import "
        f"mixrt before NumPy, or export those variables before Python starts; "
        f"MIXRT_BLAS=system keeps OpenBLAS's own choice and silences this.",
        errors.BlasPolicyWarning, stacklevel=stacklevel)


def _numpy_uses_openblas() -> bool:
    """Whether the NumPy already loaded uses OpenBLAS (the settings mean nothing to MKL)."""
    try:
        import numpy  # noqa: PLC0415  (already loaded)
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return "openblas" in str(blas.get("name", "")).lower()
    except Exception:  # noqa: BLE001  (NumPy's config layout is its own; when unsure, stay out)
        return False


def _loaded_openblas():
    """The OpenBLAS this process has mapped (NumPy's), as a ctypes library, or None. Opened
    with RTLD_NOLOAD: a handle to the loaded copy, never a second one."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "openblas" in line}
    except OSError:
        return None
    # NumPy's own copy first where several are mapped (SciPy brings another)
    libraries = sorted((p for p in paths if ".so" in os.path.basename(p)),
                       key=lambda p: ("numpy" not in p, p))
    for path in libraries:
        try:
            return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
        except OSError:
            continue
    return None


def _corename(library) -> str:
    for name in _CORENAME:
        if hasattr(library, name):
            function = getattr(library, name)
            function.restype = ctypes.c_char_p
            return (function() or b"").decode("ascii", "replace")
    return ""


def _timeout(library) -> int:
    """The idle spin OpenBLAS read from its environment (0 when unset or unknown)."""
    if not hasattr(library, "openblas_thread_timeout"):
        return 0
    library.openblas_thread_timeout.restype = ctypes.c_int
    return int(library.openblas_thread_timeout())
