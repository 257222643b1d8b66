"""The packed-panel kernels, written as LLVM IR and numba around one register tile: the tile,
the dense products, direct convolutions and their weight gradient, fused attention heads,
and the native worker pool that runs their parts without the GIL (``_jit_panels`` is the
namespace callers read them through); and the vector softmax the attention heads and
Softmax's rows share (``_jit_vector_softmax``, in the CPU's own width, on every CPU).
"""
