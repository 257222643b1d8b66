"""The optimizers' updates on a GPU as one CuPy launch per parameter.

``runtime/training/optimizer.py`` writes each update as array expressions, which on the CPU are
a few NumPy passes over memory the cache holds, and on a GPU a launch each: SGD with momentum
and weight decay six per parameter, Adam about a dozen, most of a ResNet-18 step's 11.7 ms
outside its nodes on an H200. Here the same arithmetic, in the same order with the same float32
scalars, is one ``ElementwiseKernel`` per parameter that reads and writes the weight and its
state in place. Every kernel is compiled with ``--fmad=false``: the GPU's compiler would
otherwise contract a product and a sum into one fused multiply-add, which rounds once, and the
GPU's bits would differ from the CPU's in the last place. LAMB, RMSProp and AdaGrad keep their
array expressions. Below them, the multi-tensor kernels that update every weight of a step in
one launch (``Optimizer.step_many``).

Each function returns False, doing nothing, where the arrays are not CuPy's.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.runtime.training import update_rules


def sgd(xp, weight, grad, momentum_buffer, lr: float, wd: float, momentum: float,
        nesterov: bool) -> bool:
    """``SGD._apply``: ``g = grad + wd * w``; with momentum ``buf = momentum * buf + g``,
    ``w -= lr * (g + momentum * buf if nesterov else buf)``, else ``w -= lr * g``."""
    if not _on_gpu(xp):
        return False
    lines = [_decayed_gradient(wd)]
    if momentum_buffer is None:
        lines.append("w = w - lr * d;")
        _kernel(xp, "T g, T lr, T wd", "T w", lines, "mixrt_sgd")(grad, lr, wd, weight)
        return True
    lines.append("buf = momentum * buf + d;")
    lines.append("w = w - lr * (d + momentum * buf);" if nesterov else "w = w - lr * buf;")
    _kernel(xp, "T g, T lr, T wd, T momentum", "T w, T buf", lines, "mixrt_sgd_momentum")(
        grad, lr, wd, momentum, weight, momentum_buffer)
    return True


def adam(xp, weight, grad, mean, var, *, step_size: float, correction: float, beta1: float,
         beta2: float, epsilon: float, wd: float = 0.0, decay: float | None = None) -> bool:
    """``_AdamMoments._adam_step`` after Adam's L2 term (``wd``) or AdamW's decoupled
    shrink (``decay``, the factor ``1 - lr * wd``): the moments, then ``w -= step_size *
    (mean / (sqrt(var) / correction + epsilon))``, ``correction`` being ``sqrt(1 -
    beta2^t)``."""
    if not _on_gpu(xp):
        return False
    lines = ["w = w * decay;"] if decay is not None else []
    lines += [_decayed_gradient(wd),
              "mean = beta1 * mean + keep1 * d;",
              "var = beta2 * var + keep2 * (d * d);",
              "const T denom = sqrt(var) / correction + epsilon;",
              "w = w - step_size * (mean / denom);"]
    kernel = _kernel(xp, "T g, T wd, T decay, T beta1, T keep1, T beta2, T keep2, "
                         "T correction, T epsilon, T step_size", "T w, T mean, T var", lines,
                     "mixrt_adam")
    kernel(grad, wd, 1.0 if decay is None else decay, beta1, 1 - beta1, beta2, 1 - beta2,
           correction, epsilon, step_size, weight, mean, var)
    return True


def _decayed_gradient(wd: float) -> str:
    # without weight decay the gradient is taken as it is, as _with_l2 does (0 * inf is NaN)
    return "const T d = g + wd * w;" if wd else "const T d = g;"


def _on_gpu(xp) -> bool:
    return xp is not np and hasattr(xp, "ElementwiseKernel")


def _kernel(xp, inputs: str, outputs: str, lines: list[str], name: str):
    return _compiled(xp, inputs, outputs, "\n".join(lines), name)


@functools.lru_cache(maxsize=64)
def _compiled(xp, inputs: str, outputs: str, body: str, name: str):
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

_LOCATE = FIND_TENSOR + """\
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


def _sgd_source(name: str, step: str) -> str:
    return _SGD_HEAD.replace("NAME", name) + step + "    }\n}\n"


SGD_SOURCE = _sgd_source("mixrt_sgd_many", """\
        const T wd = wds[lo];
        const T d = wd != 0 ? g + wd * w[j] : g;
#if MOMENTUM
        T* buf = (T*)buffers[lo];
        const T b = momentum * buf[j] + d;
        buf[j] = b;
#if NESTEROV
        w[j] = w[j] - lrs[lo] * (d + momentum * b);
#else
        w[j] = w[j] - lrs[lo] * b;
#endif
#else
        w[j] = w[j] - lrs[lo] * d;
#endif
""")

ADAM_SOURCE = """
extern "C" __global__ void mixrt_adam_many(
        const long long* weights, const long long* grads, const long long* means,
        const long long* vars, const long long* starts, const T* step_sizes,
        const T* corrections, const T* wds, const int tensors, const long long total,
        const T beta1, const T keep1, const T beta2, const T keep2, const T epsilon,
        const T rescale, const T clip) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
%(locate)s
        const T wd = wds[lo];
#if DECOUPLED
        T weight = wd != 0 ? w[j] * wd : w[j];
        const T d = g;
#else
        T weight = w[j];
        const T d = wd != 0 ? g + wd * weight : g;
#endif
        T* mean = (T*)means[lo];
        T* var = (T*)vars[lo];
        const T m = beta1 * mean[j] + keep1 * d;
        const T v = beta2 * var[j] + keep2 * (d * d);
        mean[j] = m;
        var[j] = v;
        const T denom = sqrt(v) / corrections[lo] + epsilon;
        w[j] = weight - step_sizes[lo] * (m / denom);
    }
}
"""


def source(kernel: str, dtype, **flags) -> str:
    """The CUDA source of ``kernel`` ("sgd" or "adam") for ``dtype``, ``flags`` compiled in
    (MOMENTUM, NESTEROV, CLIP; DECOUPLED for AdamW, CLIP). MXNet's SGD's is its definition's
    (``runtime/training/optimizers/sgd.py``)."""
    body = {"sgd": SGD_SOURCE, "adam": ADAM_SOURCE}[kernel] % {"locate": _LOCATE}
    return with_defines(dtype, flags, body)


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
    return (_on_gpu(xp) and hasattr(xp, "RawKernel") and np.dtype(dtype) in MANY_DTYPES
            and all(a.dtype == dtype and a.flags.c_contiguous for a in arrays))


def sgd_many(xp, weights, grads, buffers, lrs, wds, *, momentum: float, nesterov: bool,
             rescale: float, clip: float | None) -> None:
    """``sgd`` for every weight at once (``buffers`` None without momentum), each with its
    own lr and wd, after the gradient's rescale and clip."""
    dtype = weights[0].dtype
    flags = dict(MOMENTUM=momentum != 0, NESTEROV=nesterov, CLIP=clip is not None)
    kernel = raw_kernel(xp, source("sgd", dtype, **flags), "mixrt_sgd_many")
    tables = [addresses(xp, weights), addresses(xp, grads),
              addresses(xp, buffers if buffers is not None else weights)]
    starts, total = tensor_starts(xp, weights)
    scalar = dtype.type
    kernel(grid(total), (THREADS,), (
        *tables, starts, value_table(xp, lrs, dtype), value_table(xp, wds, dtype),
        np.int32(len(weights)), np.int64(total), scalar(momentum), scalar(rescale),
        scalar(clip or 0)))


def adam_many(xp, weights, grads, means, variances, step_sizes, corrections, wds, *,
              decoupled: bool, beta1: float, beta2: float, epsilon: float, rescale: float,
              clip: float | None) -> None:
    """``adam`` for every weight at once; ``wds`` are Adam's L2 coefficients or, with
    ``decoupled`` (AdamW), each weight's shrink factor 1 - lr * wd (0: none). 1 - beta1
    and 1 - beta2 are worked out here, in double, as the one-weight kernel's are."""
    dtype = weights[0].dtype
    flags = dict(DECOUPLED=decoupled, CLIP=clip is not None)
    kernel = raw_kernel(xp, source("adam", dtype, **flags), "mixrt_adam_many")
    starts, total = tensor_starts(xp, weights)
    scalar = dtype.type
    kernel(grid(total), (THREADS,), (
        addresses(xp, weights), addresses(xp, grads), addresses(xp, means),
        addresses(xp, variances), starts, value_table(xp, step_sizes, dtype),
        value_table(xp, corrections, dtype), value_table(xp, wds, dtype),
        np.int32(len(weights)), np.int64(total), scalar(beta1), scalar(1 - beta1),
        scalar(beta2), scalar(1 - beta2), scalar(epsilon), scalar(rescale), scalar(clip or 0)))


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
