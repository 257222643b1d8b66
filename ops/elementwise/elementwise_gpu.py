"""The elementwise ops' GPU forms, registered beside their generic kernels: a FusedElementwise
program as one generated ``cupy.ElementwiseKernel``, one pass over memory (its source:
``Program.cuda_source`` in ``ops/elementwise/fused_elementwise.py``). Nothing here imports CuPy
before a GPU runs it.
"""

from __future__ import annotations

import functools
import hashlib

from mixrt.ops.elementwise.fused_elementwise import fused_elementwise, node_program

# NaN-propagating max/min (NumPy's maximum/minimum semantics; CUDA's fmax drops NaN).
CUDA_PREAMBLE = """
template <typename T> __device__ T mx_max(T a, T b) { return (a > b || isnan(a)) ? a : b; }
template <typename T> __device__ T mx_min(T a, T b) { return (a < b || isnan(a)) ? a : b; }
"""


@functools.lru_cache(maxsize=512)
def cuda_kernel(in_params: str, out_params: str, operation: str):
    """The ElementwiseKernel of one program's source, built once."""
    import cupy  # noqa: PLC0415  (only reached on a GPU)
    digest = hashlib.sha1(operation.encode()).hexdigest()[:12]
    return cupy.ElementwiseKernel(in_params, out_params, operation,
                                  name=f"mixrt_fused_{digest}", preamble=CUDA_PREAMBLE)


@fused_elementwise.fast("gpu")
def fused_elementwise_gpu(xp, *inputs, ops=(), operands=(), params=(), out=None, _node=None):
    """The program as one generated kernel, into ``out`` when given."""
    kernel = cuda_kernel(*node_program(_node, ops, operands, params, len(inputs)).cuda_source())
    return kernel(*inputs) if out is None else kernel(*inputs, out)
