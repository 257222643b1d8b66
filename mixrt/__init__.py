"""mixrt: an embeddable inference and training runtime with ONNX as its interchange format.

    import mixrt
    session = mixrt.Session("model.onnx", device="cpu")      # or mixrt.load(...)
    outputs = session.run(None, {"input": array})
"""

from __future__ import annotations

import os
import sys


# whether NumPy (and so its OpenBLAS) was loaded before mixrt: then the BLAS policy below
# cannot act, and _warn_if_blas_policy_missed says so
_NUMPY_FIRST = "numpy" in sys.modules
_AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}  # OpenBLAS's AVX-512 kernels


def _cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo
                          if line.startswith("flags")), [])
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= set(flags)


def _prefer_avx512_blas() -> None:
    """Give NumPy's OpenBLAS its AVX-512 (SkylakeX) kernels on CPUs that have AVX-512.

    OpenBLAS's runtime dispatch gives AMD Zen 4 its AVX2 (Haswell) kernels, and this
    workplace's machines also set OPENBLAS_CORETYPE=Haswell globally; onnxruntime's own GEMM
    uses AVX-512 on the same CPU. On the project's 2-core EPYC the SkylakeX sgemm runs 1.8x
    faster (BENCHMARKS.md), so mixrt's BLAS policy (MIXRT_BLAS=auto, the default) picks the
    widest kernels the CPU has. MIXRT_BLAS=system leaves OpenBLAS's choice alone. OpenBLAS
    reads the choice once, when NumPy loads it: this works only when mixrt is imported first.
    """
    if os.environ.get("MIXRT_BLAS", "auto") != "auto" or "numpy" in sys.modules:
        return
    if _cpu_has_avx512():
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"


def _short_blas_spin() -> None:
    """Let OpenBLAS's idle threads sleep after 2^16 cycles instead of 2^28 (~0.1 s).

    Between two BLAS calls a kernel runs NumPy copies and ufuncs, some split over mixrt's
    intra-op threads (ops/parallel.py); an OpenBLAS thread still spinning in that gap takes a
    core from them. On the 2-core machine that cost a ResNet-18 training step ~20% (1780 ->
    1460 ms; MaxPoolGrad 77 -> 40 ms), with no change to ResNet-50 inference. Same policy
    and constraint as above: MIXRT_BLAS=system, or a value set by the user, is left alone."""
    if os.environ.get("MIXRT_BLAS", "auto") != "auto" or "numpy" in sys.modules:
        return
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "16")


def _warn_if_blas_policy_missed() -> None:
    """Say so, once, when NumPy's OpenBLAS was loaded before mixrt without the settings the
    two functions above would have made: with OpenBLAS's AVX2 kernels and its long idle spin,
    ResNet-50 at batch 1 took 41 ms instead of 25 on the 2-core AVX-512 EPYC (DenseNet-121
    34 instead of 26), each setting about half of that. Setting them now would change
    nothing: OpenBLAS read its environment when it loaded."""
    if not _NUMPY_FIRST or os.environ.get("MIXRT_BLAS", "auto") != "auto" or not _openblas():
        return
    missed = []
    if _cpu_has_avx512() and \
            os.environ.get("OPENBLAS_CORETYPE", "").lower() not in _AVX512_CORES:
        missed.append("its AVX-512 kernels (OPENBLAS_CORETYPE=SkylakeX)")
    if "OPENBLAS_THREAD_TIMEOUT" not in os.environ:
        missed.append("a short idle spin (OPENBLAS_THREAD_TIMEOUT=16)")
    if missed:
        import warnings  # noqa: PLC0415
        warnings.warn(
            f"mixrt was imported after NumPy, so NumPy's OpenBLAS runs without "
            f"{' and '.join(missed)}: convolutional models run up to 1.6x slower on the CPU "
            f"(ResNet-50 batch 1: 41 ms instead of 25 on a 2-core AVX-512 EPYC). Import mixrt "
            f"before NumPy, or export those variables before Python starts; MIXRT_BLAS=system "
            f"keeps OpenBLAS's own choice and silences this.",
            errors.BlasPolicyWarning, stacklevel=3)


def _openblas() -> bool:
    """Whether the NumPy already loaded uses OpenBLAS (the variables mean nothing to MKL)."""
    try:
        import numpy  # noqa: PLC0415  (already loaded: _NUMPY_FIRST)
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return "openblas" in str(blas.get("name", "")).lower()
    except Exception:  # noqa: BLE001  (NumPy's config layout is its own; when unsure, stay quiet)
        return False


_prefer_avx512_blas()
_short_blas_spin()

from mixrt import errors  # noqa: E402,F401

_warn_if_blas_policy_missed()
from mixrt.runtime.session import NodeArg, Session, register_loader  # noqa: E402

__version__ = "0.1.0"


def _is_onnx_source(source) -> bool:
    import onnx  # noqa: PLC0415  (onnx is heavy; import only when a model is loaded)
    if isinstance(source, (bytes, bytearray, memoryview, onnx.ModelProto)):
        return True
    return isinstance(source, (str, os.PathLike))


def _import_onnx(source):
    from mixrt.importers.onnx import import_model  # noqa: PLC0415
    return import_model(source)


def _is_mxr_source(source) -> bool:
    from mixrt.runtime.format import is_mxr  # noqa: PLC0415
    return is_mxr(source)


def _load_mxr(source):
    from mixrt.runtime.format import load_mxr  # noqa: PLC0415
    return load_mxr(source)


register_loader(_is_onnx_source, _import_onnx)
register_loader(_is_mxr_source, _load_mxr)  # tried first: .mxr files are recognised by content


def load(model, device: str = "cpu", **options) -> Session:
    """A :class:`Session` for ``model`` (a path, bytes, an onnx.ModelProto or a Graph)."""
    return Session(model, device=device, **options)


# submodules reachable as attributes of ``mixrt`` without importing each (``mixrt.sym``,
# ``mixrt.random.seed``), loaded on first use so that ``import mixrt`` stays light
_LAZY_SUBMODULES = frozenset({"sym", "random", "initializer", "optimizer", "lr_scheduler",
                              "gluon", "io", "metric", "module", "models", "kv", "nd",
                              "autograd", "context", "profiler", "viz"})


def cpu(device_id: int = 0):
    from mixrt.context import cpu as make  # noqa: PLC0415
    return make(device_id)


def gpu(device_id: int = 0):
    from mixrt.context import gpu as make  # noqa: PLC0415
    return make(device_id)


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        import importlib  # noqa: PLC0415
        return importlib.import_module(f"mixrt.{name}")
    raise AttributeError(f"module 'mixrt' has no attribute {name!r}")


__all__ = ["Session", "NodeArg", "load", "errors", "cpu", "gpu", "__version__"]
