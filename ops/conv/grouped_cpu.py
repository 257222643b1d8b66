"""Grouped 1x1 convolutions (ShuffleNet's) as one BLAS product per group, the groups taken
by this thread and the native worker, each with its bias, residual and activation applied
while its output is still in cache.

Before, a grouped 1x1 convolution was one batched ``np.matmul``: NumPy calls sgemm once per
group, one after the other, and OpenBLAS runs each of these small products (ShuffleNet's are
all ~0.9 M multiply-adds, under its small-matrix limit of 100^3) on the calling thread alone;
the bias and the FusedConv epilogue were then two more passes over the output. The 272 ->
272 layer at 14x14 (4 groups) took ~100 us in the model, against onnxruntime's 45.

Here each (image, group) is a part of a native pool job (``ops/panels/native_parts.py``): the part
calls the BLAS's ``cblas_?gemm`` through its address, the same single-threaded small-matrix
kernel NumPy would have reached, so two groups run at once, and then finishes its rows: +
bias, + residual, the slope below zero and the clamp (conv_direct_cpu's epilogue, so Relu,
LeakyRelu and Clip; other activations run after, over the output).

The BLAS is the one NumPy loaded (scipy-openblas in NumPy's wheels), found among the
process's mapped libraries by its CBLAS symbol; without one, or without the native pool, the
convolution keeps the batched matmul.
"""

from __future__ import annotations

import ctypes
import functools
import math

import numpy as np

from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.panels.native_parts import prepared

# (symbol, int bits): the scipy-openblas wheels' ILP64 and LP64 names, then a plain CBLAS
_CBLAS_NAMES = [("scipy_cblas_{}gemm64_", 64), ("cblas_{}gemm64_", 64),
                ("scipy_cblas_{}gemm", 32)]


def suits(X, W, group, geometry, out, Z) -> bool:
    """A grouped 1x1 convolution of stride 1 without padding, native floats, contiguous
    operands, ``out`` (when given) and ``Z`` (when given) of the output's shape, with the
    native pool and a BLAS to call."""
    kernel, strides, _, _, begin, end, out_dims = geometry
    if int(group) < 2 or X.ndim != 4 or X.dtype not in (np.float32, np.float64) \
            or W.dtype != X.dtype or not (X.flags.c_contiguous and W.flags.c_contiguous):
        return False
    if math.prod(kernel) != 1 or any(int(s) != 1 for s in strides) or any(begin) \
            or any(end) or W.shape[0] % int(group) or W.shape[1] * int(group) != X.shape[1]:
        return False
    shape = (X.shape[0], W.shape[0], *out_dims)
    for array in (out, Z):
        if array is not None and (tuple(array.shape) != shape or array.dtype != X.dtype
                                  or not array.flags.c_contiguous
                                  or np.may_share_memory(array, X)):
            return False
    return jit_cpu.native_pool() is not None and _blas() is not None


def conv(X, W, B, Z, limits, out, replays=None):
    """``out`` = limits(Conv(X, W, B) + Z) (``limits``: conv_direct_cpu's (slope, low,
    high)); see :func:`suits`. The call is kept as the node's replay in ``replays`` (its
    prepacked dict, or None: ``ops/compiled/replay.py``) when every array it passes is one of these
    or made here from constants."""
    (n, c), m, group = X.shape[:2], W.shape[0], X.shape[1] // W.shape[1]
    length = X[0, 0].size
    slope, low, high = limits
    bias = np.zeros(m, X.dtype) if B is None else np.ascontiguousarray(B, X.dtype).reshape(m)
    residual = _NONE[X.dtype] if Z is None else Z.reshape(-1)
    bounds = np.array([low, high, slope], X.dtype)
    single, double, wide = _blas()
    go = prepared(jit_cpu.native_pool(), _entries(),
                  (X.reshape(-1), W.reshape(-1), bias, residual, bounds, out.reshape(-1)),
                  (n, group, c // group, m // group, length, Z is not None,
                   double if X.dtype == np.float64 else single, wide),
                  [(p, p + 1) for p in range(n * group)], keep=(bias, bounds))
    if B is None or np.may_share_memory(bias, B):  # else B's values were copied here
        replay.record(replays, (X, W, B, Z, out), go, silent=True)
    go()
    return out


_NONE = {np.dtype(t): np.zeros(0, t) for t in (np.float32, np.float64)}


@functools.lru_cache(maxsize=1)
def _blas():
    """(sgemm address, dgemm address, 64-bit ints) of the CBLAS NumPy loaded, or None."""
    for path in _mapped_blas_libraries():
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for name, bits in _CBLAS_NAMES:
            try:
                single = getattr(library, name.format("s"))
                double = getattr(library, name.format("d"))
            except AttributeError:
                continue
            address = ctypes.cast(single, ctypes.c_void_p).value
            return address, ctypes.cast(double, ctypes.c_void_p).value, bits == 64
    return None


def _mapped_blas_libraries() -> list[str]:
    """Shared libraries of this process whose name says OpenBLAS (NumPy's own first)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/") and ".so" in p)


@functools.lru_cache(maxsize=1)
def _entries():
    """The module holding the compiled parts (numba loads with it)."""
    from mixrt.ops.conv import _grouped_parts  # noqa: PLC0415
    return _grouped_parts
