"""The elementwise ops' GPU forms, registered beside their generic kernels: a FusedElementwise
program as one generated ``cupy.ElementwiseKernel``, one pass over memory (its source:
``Program.cuda_source`` in ``ops/elementwise/fused_elementwise.py``); Relu and Sum written
into the arena's view (``out=``), which the run loop otherwise fills with a device copy of
a new array (17 Relus and the gradient sums of a ResNet-18 training step: an extra read
and write of each activation). Nothing here imports CuPy before a GPU runs it.
"""

from __future__ import annotations

import functools
import hashlib

from mixrt.ops.elementwise.activation import relu
from mixrt.ops.elementwise.elementwise import compute_dtype, sum_
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


def _filled(out, result):
    """``result`` (a new array) into ``out`` when given."""
    if out is None:
        return result
    out[...] = result
    return out


@relu.fast("gpu")
def relu_gpu(xp, X, *, out=None):
    """max(X, 0) into ``out``: exact in any float dtype, so no widening is needed (NaN
    stays NaN, as NumPy's maximum keeps it); integers as the generic kernel."""
    if out is None or X.dtype.kind != "f" or out.dtype != X.dtype or out.shape != X.shape:
        return _filled(out, relu(xp, X))
    xp.maximum(X, X.dtype.type(0), out=out)
    return out


@sum_.fast("gpu")
def sum_gpu(xp, *data_0, out=None):
    """The inputs added left to right into ``out`` (the generic fold's order), where they
    share out's dtype and it needs no wider accumulator."""
    dtype = data_0[0].dtype
    if out is None or len(data_0) < 2 or out.dtype != dtype or compute_dtype(dtype) != dtype \
            or any(x.dtype != dtype for x in data_0) \
            or any(xp.may_share_memory(out, x) for x in data_0[2:]):
        return _filled(out, sum_(xp, *data_0))
    xp.add(data_0[0], data_0[1], out=out)
    for x in data_0[2:]:
        xp.add(out, x, out=out)
    return out
