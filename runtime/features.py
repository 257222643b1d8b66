"""MXNet's ``mx.runtime`` feature query: which of MXNet's build features this mixrt has.

    features = mixrt.runtime.Features()
    features.is_enabled("CUDA")        # True when CuPy sees a GPU
    features                           # [✔ CUDA, ✖ CUDNN, ...]

MXNet reports the switches its native library was compiled with; mixrt has no build
switches, so each of MXNet's feature names (the same list, in MXNet 1.9.1's order) answers
whether this process offers what the switch gave MXNet: a GPU through CuPy for ``CUDA`` and
``CUDA_RTC`` (CuPy compiles kernels at run time), NCCL through CuPy, the CPU's instruction
sets as NumPy detects them, NumPy's BLAS and LAPACK, the profiler, the distributed KVStore and
64-bit tensor sizes (NumPy indexes with int64), cuDNN where it loads and starts beside a GPU
(the convolutions call it). What mixrt does not use (TensorRT, OpenMP, jemalloc, MKL-DNN,
OpenCV, Caffe, TVM) is off. The answers are taken once, on the
first ``Features()``, which is shared as MXNet's is.

This module imports nothing at load time beyond the standard library: ``import mixrt``
loads ``mixrt.runtime`` before NumPy (``blas_policy``).
"""

from __future__ import annotations

import collections

from mixrt.base import cuda_libraries

# MXNet 1.9.1's CPU feature names and NumPy's names for the same instruction sets
_CPU_FLAGS = {"CPU_SSE": "SSE", "CPU_SSE2": "SSE2", "CPU_SSE3": "SSE3",
              "CPU_SSE4_1": "SSE41", "CPU_SSE4_2": "SSE42", "CPU_SSE4A": "SSE4A",
              "CPU_AVX": "AVX", "CPU_AVX2": "AVX2", "SSE": "SSE", "F16C": "F16C"}

# what mixrt does not build on: always off
_ABSENT = ("TENSORRT", "OPENMP", "JEMALLOC", "MKLDNN", "OPENCV", "CAFFE", "CXX14",
           "SIGNAL_HANDLER", "DEBUG", "TVM_OP")

# every name MXNet 1.9.1 lists, in its order
NAMES = ("CUDA", "CUDNN", "NCCL", "CUDA_RTC", "TENSORRT", "CPU_SSE", "CPU_SSE2", "CPU_SSE3",
         "CPU_SSE4_1", "CPU_SSE4_2", "CPU_SSE4A", "CPU_AVX", "CPU_AVX2", "OPENMP", "SSE",
         "F16C", "JEMALLOC", "BLAS_OPEN", "BLAS_ATLAS", "BLAS_MKL", "BLAS_APPLE", "LAPACK",
         "MKLDNN", "OPENCV", "CAFFE", "PROFILER", "DIST_KVSTORE", "CXX14",
         "INT64_TENSOR_SIZE", "SIGNAL_HANDLER", "DEBUG", "TVM_OP")


class Feature:
    """One feature: its ``name`` and whether it is ``enabled``."""

    __slots__ = ("name", "enabled")

    def __init__(self, name: str, enabled: bool):
        self.name, self.enabled = name, bool(enabled)

    def __repr__(self) -> str:
        return f"{'✔' if self.enabled else '✖'} {self.name}"


def feature_list() -> list[Feature]:
    """Every feature of MXNet's list, with whether mixrt offers it here."""
    offered = _offered()
    return [Feature(name, offered.get(name, False)) for name in NAMES]


class Features(collections.OrderedDict):
    """Feature name -> :class:`Feature`, one shared instance (MXNet's)."""

    instance = None

    def __new__(cls):
        if cls.instance is None:
            cls.instance = super().__new__(cls)
            # filled here, once; the __init__ Python calls after is the dict's, given nothing
            super().__init__(cls.instance, [(f.name, f) for f in feature_list()])
        return cls.instance

    def __repr__(self) -> str:
        return str(list(self.values()))

    def is_enabled(self, feature_name: str) -> bool:
        """Whether ``feature_name`` (any case) is on; an unknown name is a RuntimeError
        listing the known ones, as MXNet raises."""
        name = str(feature_name).upper()
        if name not in self:
            raise RuntimeError(f"Feature '{name}' is unknown, known features are: "
                               f"{list(self.keys())}")
        return self[name].enabled


def _offered() -> dict[str, bool]:
    offered = {name: False for name in _ABSENT}
    gpus, nccl = _gpu_support()
    offered.update(CUDA=gpus, CUDA_RTC=gpus, NCCL=nccl, CUDNN=gpus and cuda_libraries.cudnn()[0] is not None)
    cpu = _cpu_flags()
    offered.update({name: cpu.get(flag, False) for name, flag in _CPU_FLAGS.items()})
    blas = _blas_name()
    offered.update(BLAS_OPEN="openblas" in blas, BLAS_MKL="mkl" in blas,
                   BLAS_ATLAS="atlas" in blas, BLAS_APPLE="accelerate" in blas)
    offered.update(LAPACK=True, PROFILER=True, DIST_KVSTORE=True, INT64_TENSOR_SIZE=True)
    return offered


def _gpu_support() -> tuple[bool, bool]:
    """(a GPU CuPy can use, NCCL through CuPy)."""
    try:
        import cupy  # noqa: PLC0415  (optional, and heavy)
        has_gpu = int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # noqa: BLE001  (no CuPy, no driver, no device: no GPU)
        return False, False
    try:
        from cupy.cuda import nccl  # noqa: PLC0415
        return has_gpu, has_gpu and bool(getattr(nccl, "available", True))
    except Exception:  # noqa: BLE001  (CuPy built without NCCL)
        return has_gpu, False


def _cpu_flags() -> dict[str, bool]:
    """The instruction sets NumPy found at its start (its dispatch table)."""
    import numpy  # noqa: PLC0415  (not at mixrt.runtime's load: see the docstring)
    core = getattr(numpy, "_core", None) or getattr(numpy, "core")
    return dict(getattr(core._multiarray_umath, "__cpu_features__", {}))


def _blas_name() -> str:
    import numpy  # noqa: PLC0415
    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return str(blas.get("name", "")).lower()
    except Exception:  # noqa: BLE001  (older NumPy: no dict form of its build record)
        return ""
