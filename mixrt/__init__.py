"""mixrt: an embeddable inference and training runtime with ONNX as its interchange format.

    import mixrt
    session = mixrt.Session("model.onnx", device="cpu")      # or mixrt.load(...)
    outputs = session.run(None, {"input": array})
"""

from __future__ import annotations

import os
import sys


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
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo
                          if line.startswith("flags")), [])
    except OSError:
        return
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= set(flags):
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


_prefer_avx512_blas()
_short_blas_spin()

from mixrt import errors  # noqa: E402,F401
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
