"""Matrix products that a CUDA-graph capture can record (``runtime/cuda_graph.py``).

cuBLAS routines can be captured into a CUDA graph (NVIDIA's cuBLAS guide, "CUDA Graphs
Support"), but CuPy refuses every cuBLAS call on a capturing stream: its ``cublas.setStream``
raises NotImplementedError, and the check sits in compiled code that Python cannot reach.
Every matrix product (MatMul, Gemm, the GPU's convolutions, attention) goes through cuBLAS, so
under CuPy alone no model could be captured. While a capture runs, the kernels are therefore
handed :class:`CapturingModule`: CuPy itself, except that ``matmul`` (and a 2-D ``dot``) call
``cublasGemmStridedBatchedEx`` through ctypes, on a cuBLAS handle of mixrt's own. An operand
pair it does not cover (other dtypes, 1-D operands, mixed types) goes to CuPy, which refuses
it while capturing, and the run then falls back to the ordinary way.

The handle, one per device, is never shared with CuPy, and each captured graph gets its own
cuBLAS workspace from the graph's private memory pool (set on the handle just before the
capture), so two graphs replayed at once never share scratch memory.
"""

from __future__ import annotations

import ctypes
import functools
import math

import numpy as np

# cudaDataType_t, cublasComputeType_t and the alpha/beta C type, per operand dtype
_TYPES = {np.dtype(np.float16): (2, 68, ctypes.c_float),   # CUDA_R_16F, COMPUTE_32F
          np.dtype(np.float32): (0, 68, ctypes.c_float),   # CUDA_R_32F, COMPUTE_32F
          np.dtype(np.float64): (1, 70, ctypes.c_double)}  # CUDA_R_64F, COMPUTE_64F
_OP_N = 0
_GEMM_DEFAULT = -1
_POINTER_MODE_HOST = 0
# cuBLAS's recommended workspace on Hopper (its guide, cublasSetWorkspace)
WORKSPACE_BYTES = 32 << 20


class CublasError(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    """libcublas, as CuPy loaded it (its soname carries the CUDA major version)."""
    import cupy  # noqa: PLC0415
    major = cupy.cuda.runtime.runtimeGetVersion() // 1000
    names = [f"libcublas.so.{major}", "libcublas.so"]
    try:
        import nvidia.cublas  # noqa: PLC0415  (CUDA's pip wheels put it beside their package)
        names += [f"{path}/lib/libcublas.so.{major}" for path in nvidia.cublas.__path__]
    except ImportError:
        pass
    for name in names:
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        _declare(library)
        return library
    raise CublasError(f"cannot load cuBLAS (tried {', '.join(names)})")


def _declare(library) -> None:
    p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    library.cublasCreate_v2.argtypes = [ctypes.POINTER(p)]
    library.cublasSetStream_v2.argtypes = [p, p]
    library.cublasSetWorkspace_v2.argtypes = [p, p, ctypes.c_size_t]
    library.cublasSetPointerMode_v2.argtypes = [p, i]
    library.cublasGemmStridedBatchedEx.argtypes = [
        p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll, i, i, i]


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasError(f"{what} returned cuBLAS status {status}")


@functools.lru_cache(maxsize=None)
def _handle(device: int) -> int:
    """mixrt's own cuBLAS handle on ``device`` (made while that device is current)."""
    handle = ctypes.c_void_p()
    _check(_library().cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
    _check(_library().cublasSetPointerMode_v2(handle, _POINTER_MODE_HOST),
           "cublasSetPointerMode")
    return handle.value


class CapturingModule:
    """CuPy with matrix products that a capture records (see the module docstring)."""

    def __init__(self, cupy, stream, workspace):
        self._cupy, self._stream, self._workspace = cupy, stream, workspace
        self.__name__ = cupy.__name__
        self._unavailable = None  # why cuBLAS could not be reached, once prepare() tried

    def __getattr__(self, name):
        return getattr(self._cupy, name)

    def prepare(self) -> None:
        """Point the device's handle at this capture's stream and workspace. Where cuBLAS
        cannot be reached, the first matrix product raises why (a run without one needs
        none)."""
        try:
            library, handle = _library(), self._current_handle()
            _check(library.cublasSetStream_v2(handle, self._stream.ptr), "cublasSetStream")
            _check(library.cublasSetWorkspace_v2(handle, self._workspace.data.ptr,
                                                 self._workspace.nbytes), "cublasSetWorkspace")
        except CublasError as exc:
            self._unavailable = str(exc)

    def _current_handle(self) -> int:
        return _handle(self._cupy.cuda.Device().id)

    def dot(self, a, b, out=None):
        if getattr(a, "ndim", 0) == 2 and getattr(b, "ndim", 0) == 2:
            return self.matmul(a, b, out=out)
        return self._cupy.dot(a, b, out=out)

    def matmul(self, a, b, out=None, **options):
        if options or not _covered(a, b):
            return self._cupy.matmul(a, b, out=out, **options)
        product = self._product(a, b)
        if out is None:
            return product
        out[...] = product
        return out

    def _product(self, a, b):
        if self._unavailable is not None:
            raise CublasError(self._unavailable)
        cp = self._cupy
        a, b = cp.ascontiguousarray(a), cp.ascontiguousarray(b)
        rows, inner, cols = a.shape[-2], a.shape[-1], b.shape[-1]
        if inner != b.shape[-2]:
            raise ValueError(f"matmul: operands {a.shape} and {b.shape} do not share an inner "
                             f"dim ({inner} against {b.shape[-2]})")
        if b.ndim == 2:  # every row of every matrix of a against one b: a single product
            result = cp.empty(a.shape[:-1] + (cols,), dtype=a.dtype)
            self._gemm(a, b, result, math.prod(a.shape[:-1]), inner, cols, [(0, 0, 0, 1)],
                       (0, 0, 0))
            return result
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        result = cp.empty(batch + (rows, cols), dtype=a.dtype)
        calls, strides = _batched_calls(batch, a, b, rows * cols)
        self._gemm(a, b, result, rows, inner, cols, calls, strides)
        return result

    def _gemm(self, a, b, c, rows, inner, cols, calls, strides) -> None:
        """c = a @ b for each (a offset, b offset, c offset, count) in ``calls``, offsets and
        ``strides`` in elements. Row-major c = a b is column-major c^T = b^T a^T: cuBLAS is
        given b first."""
        data_type, compute, scalar = _TYPES[a.dtype]
        alpha, beta = scalar(1.0), scalar(0.0)
        item = a.dtype.itemsize
        library, handle = _library(), self._current_handle()
        a_stride, b_stride, c_stride = strides
        for a_at, b_at, c_at, count in calls:
            status = library.cublasGemmStridedBatchedEx(
                handle, _OP_N, _OP_N, cols, rows, inner, ctypes.byref(alpha),
                b.data.ptr + b_at * item, data_type, cols, b_stride,
                a.data.ptr + a_at * item, data_type, inner, a_stride,
                ctypes.byref(beta), c.data.ptr + c_at * item, data_type, cols, c_stride,
                count, compute, _GEMM_DEFAULT)
            _check(status, "cublasGemmStridedBatchedEx")


def _covered(a, b) -> bool:
    """Operand pairs the ctypes path multiplies: one float type, matrices (2-D or more)."""
    return (getattr(a, "ndim", 0) >= 2 and getattr(b, "ndim", 0) >= 2
            and a.dtype == b.dtype and a.dtype in _TYPES and a.size and b.size)


def _batched_calls(batch: tuple, a, b, c_size: int):
    """Split the broadcast batch into strided-batched calls: the longest trailing run of
    batch dims over which each operand's matrices sit one fixed stride apart (0 where it is
    broadcast) is one call; the leading dims are looped over. Returns the calls as (a, b, c
    offsets, count) and the (a, b, c) strides, in elements."""
    a_strides = _batch_strides(a, batch)
    b_strides = _batch_strides(b, batch)
    split = _uniform_from(batch, a_strides, b_strides)
    inner_batch = batch[split:]
    count = math.prod(inner_batch)
    strides = (_run_stride(inner_batch, a_strides[split:]),
               _run_stride(inner_batch, b_strides[split:]), c_size)
    calls = []
    for outer in np.ndindex(*batch[:split]):
        a_at = sum(i * s for i, s in zip(outer, a_strides))
        b_at = sum(i * s for i, s in zip(outer, b_strides))
        c_at = sum(i * s for i, s in zip(outer, _contiguous_strides(batch[:split], count * c_size)))
        calls.append((a_at, b_at, c_at, count))
    return calls, strides


def _batch_strides(x, batch: tuple) -> list[int]:
    """Element strides of ``x``'s matrices along the broadcast ``batch`` (0 where broadcast)."""
    own = x.shape[:-2]
    padded = (1,) * (len(batch) - len(own)) + tuple(own)
    strides = _contiguous_strides(padded, x.shape[-2] * x.shape[-1])
    return [0 if size == 1 else stride for size, stride in zip(padded, strides)]


def _contiguous_strides(shape: tuple, innermost: int) -> list[int]:
    strides, step = [], innermost
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def _uniform_from(batch: tuple, *operand_strides) -> int:
    """The first batch dim from which, for every operand, the dims (size-1 ones aside) step
    by one fixed stride."""
    for split in range(len(batch) + 1):
        if all(_run_stride(batch[split:], strides[split:]) is not None
               for strides in operand_strides):
            return split
    return len(batch)


def _run_stride(shape: tuple, strides: list[int]) -> int | None:
    """The stride between consecutive matrices over ``shape``'s dims taken as one, or None
    when they are not evenly spaced."""
    dims = [(size, stride) for size, stride in zip(shape, strides) if size != 1]
    if not dims:
        return 0
    if all(stride == 0 for _, stride in dims):
        return 0
    for (_, outer), (size, inner) in zip(dims, dims[1:]):
        if inner == 0 or outer != inner * size:
            return None
    return dims[-1][1]
