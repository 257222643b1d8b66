"""What the optimizers' GPU updates share (each optimizer's own kernels are in its file of
``runtime/training/optimizers/``).

On the CPU an update is a few NumPy passes over memory the cache holds; on a GPU each array
expression is a launch: SGD with momentum and weight decay six per parameter, Adam about a
dozen, most of a ResNet-18 step's 11.7 ms outside its nodes on an H200. So an optimizer
writes its arithmetic, in the same order with the same scalars, as one ``ElementwiseKernel``
per parameter (``elementwise``) or one ``RawKernel`` for every weight of a step
(``raw_kernel``, the tables below). Every kernel is compiled with ``--fmad=false``: the GPU's
compiler would otherwise contract a product and a sum into one fused multiply-add, which
rounds once, and the GPU's bits would differ from the CPU's in the last place.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.runtime.training import update_rules


def decayed_gradient(wd: float) -> str:
    # without weight decay the gradient is taken as it is, as _with_l2 does (0 * inf is NaN)
    return "const T d = g + wd * w;" if wd else "const T d = g;"


def on_gpu(xp) -> bool:
    return xp is not np and hasattr(xp, "ElementwiseKernel")


def elementwise(xp, inputs: str, outputs: str, lines: list[str], name: str):
    """The kernel of ``lines`` (C statements on ``T``), made once and kept."""
    return compiled_elementwise(xp, inputs, outputs, "\n".join(lines), name)


@functools.lru_cache(maxsize=64)
def compiled_elementwise(xp, inputs: str, outputs: str, body: str, name: str):
    """One kernel per body (a handful: each optimizer's flags pick one), compiled by CuPy
    on its first launch and kept, without fused multiply-adds (``update_rules.FMAD``): each
    product and sum rounds as NumPy's do, so the GPU's bits are the CPU's."""
    return xp.ElementwiseKernel(inputs, outputs, body, name, options=(update_rules.FMAD,))


# -- every weight in one launch ------------------------------------------------------------
# Even at one launch a weight, a step launches once per parameter from Python (62 for
# ResNet-18, 161 for ResNet-50; ~10 us each). The kernels below update every weight of a
# device and dtype in one launch, as PyTorch's foreach optimizers do: the weights, gradients
# and state arrays stay where they are, and the kernel gets tables of their addresses and of
# where each tensor's elements start in the concatenation of all of them. Each thread finds
# its tensor by binary search over those starts (log2 of the tensor count, 6-8 steps). The
# per-tensor scalars (lr and wd, after lr_mult and wd_mult; Adam's bias corrections) are
# tables too; the flags (momentum, Nesterov, L2 or decoupled decay, clipping) are compiled
# in. The tables are device arrays made once for each set of addresses or values and kept.

MANY_DTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
THREADS = 256
MAX_BLOCKS = 4096  # a grid-stride loop past that

# each thread finds its tensor (also for a rule that reads its own arrays: MXNet's SGD's)
FIND_TENSOR = """
    int lo = 0, hi = tensors - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (starts[mid] <= i) lo = mid; else hi = mid - 1;
    }
    const long long j = i - starts[lo];
"""

LOCATE = FIND_TENSOR + """\
    T* w = (T*)weights[lo];
    T g = ((const T*)grads[lo])[j] * rescale;
#if CLIP
    g = g < -clip ? -clip : (g > clip ? clip : g);
#endif
"""

# the two SGD rules' signature and grid-stride loop; each rule's step follows %(locate)s
_SGD_HEAD = """
extern "C" __global__ void NAME(
        const long long* weights, const long long* grads, const long long* buffers,
        const long long* starts, const T* lrs, const T* wds, const int tensors,
        const long long total, const T momentum, const T rescale, const T clip) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
%(locate)s
"""


def sgd_source(name: str, step: str) -> str:
    """An SGD rule's multi-tensor kernel: the head, where ``%(locate)s`` finds the tensor,
    then ``step``."""
    return _SGD_HEAD.replace("NAME", name) + step + "    }\n}\n"


def with_defines(dtype, flags: dict, body: str) -> str:
    """``body`` after ``#define T`` (the C type of ``dtype``) and each flag as 0 or 1."""
    defines = [f"#define T {MANY_DTYPES[np.dtype(dtype)]}"]
    defines += [f"#define {name} {int(bool(value))}" for name, value in sorted(flags.items())]
    return "\n".join(defines) + "\n" + body


def sgd_head(name: str, scalars: str = "const T rescale, const T clip") -> str:
    """The signature and grid-stride loop of an SGD rule's multi-tensor kernel ``name``,
    whose last parameters are ``scalars``; the step follows (see ``FIND_TENSOR``)."""
    return _SGD_HEAD.replace("NAME", name).replace("const T rescale, const T clip", scalars) \
        .replace("%(locate)s\n", "")


def many_on_gpu(xp, dtype, arrays) -> bool:
    """Whether the multi-tensor kernels take these arrays: CuPy's, C-contiguous, ``dtype``
    float32 or float64."""
    return (on_gpu(xp) and hasattr(xp, "RawKernel") and np.dtype(dtype) in MANY_DTYPES
            and all(a.dtype == dtype and a.flags.c_contiguous for a in arrays))


def grid(total: int) -> tuple:
    return (max(1, min(MAX_BLOCKS, -(-total // THREADS))),)


@functools.lru_cache(maxsize=16)
def raw_kernel(xp, code: str, name: str):
    return xp.RawKernel(code, name, options=(update_rules.FMAD,))


def addresses(xp, arrays):
    return _table(xp, tuple(a.data.ptr for a in arrays), np.int64)


def tensor_starts(xp, weights) -> tuple:
    sizes = [w.size for w in weights]
    starts = np.concatenate([[0], np.cumsum(sizes[:-1])]) if sizes else np.zeros(0)
    return _table(xp, tuple(int(s) for s in starts), np.int64), int(sum(sizes))


def value_table(xp, values, dtype):
    return _table(xp, tuple(float(v) for v in values), dtype)


def _table(xp, values: tuple, dtype):
    """``values`` as a device array, made once while the same values come back (the
    addresses of a training step's arrays, a constant learning rate)."""
    return _tables(xp, values, np.dtype(dtype))


@functools.lru_cache(maxsize=256)
def _tables(xp, values: tuple, dtype):
    return xp.asarray(np.array(values, dtype=dtype))
