"""FusedAttention's CPU form, registered beside its generic kernel
(``ops/attention/fused_attention.py``): the heads in one compiled pass
(``ops/panels/_jit_panels.py``, its attention section) that reads Q, K and V where the dense layers
wrote them and writes Y in place, split over the intra-op threads; what that kernel does not take
runs the generic composition.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.attention.fused_attention import fused_attention
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.parallel import intra_op_threads, parallel_for
from mixrt.ops.ir.types import broadcast_or_none

# multiply-adds from which the heads are split over the intra-op threads (as
# ops/nn/matmul_cpu.py's PANEL_SPLIT_WORK: a hand-off costs ~20 us)
SPLIT_WORK = 1 << 23
# parts per thread through the native pool (claimed one at a time: a late worker still takes
# its share)
NATIVE_PARTS_PER_THREAD = 4


@fused_attention.fast("cpu")
def fused_attention_cpu(xp, Q, K, V, mask=None, *, scale=1.0, out=None):
    """The compiled heads where they take this call, else the generic composition."""
    if _compiled_suits(Q, K, V, mask, out):
        return _compiled(Q, K, V, mask, scale, out)
    return fused_attention.fn(np, Q, K, V, mask, scale=scale, out=out)


# -- the compiled heads ---------------------------------------------------------------------------

def _compiled_suits(Q, K, V, mask, out) -> bool:
    """Whether the compiled kernel computes this call: one native float dtype, Q and ``out``
    C-contiguous and apart from the inputs, batch and heads equal across Q, K and V (no
    broadcasting between them), K and V with the same keys, a mask that broadcasts to the
    scores without widening them."""
    if out is None or Q.ndim != 4 or K.ndim != 4 or V.ndim != 4:
        return False
    if not (Q.dtype == K.dtype == V.dtype == out.dtype and Q.dtype in jit_cpu.NATIVE):
        return False
    batch, queries, heads, size = Q.shape
    keys = K.shape[1]
    if K.shape != (batch, keys, heads, size) or V.shape[:3] != (batch, keys, heads) \
            or out.shape != (batch, queries, heads, V.shape[3]) or min(out.shape) == 0 \
            or keys == 0:
        return False
    if mask is not None and (mask.dtype != Q.dtype or broadcast_or_none(
            (batch, heads, queries, keys), mask.shape) != (batch, heads, queries, keys)):
        return False
    return Q.flags.c_contiguous and out.flags.c_contiguous \
        and not any(np.may_share_memory(out, x) for x in (Q, K, V, mask) if x is not None) \
        and jit_cpu.panel_kernels() is not None


def _compiled(Q, K, V, mask, scale, out):
    kernels = jit_cpu.panel_kernels()
    batch, queries, heads, size = Q.shape
    keys, value_size = K.shape[1], V.shape[3]
    dtype = Q.dtype
    width = kernels.PANEL_VECTORS * kernels.VECTOR_BYTES // dtype.itemsize
    K, V = np.ascontiguousarray(K), np.ascontiguousarray(V)
    mask_span, mask_strides = _mask_layout(mask, (batch, heads, queries, keys), dtype)
    shapes = ((-(-keys // width), size, width), (-(-value_size // width), keys, width),
              (kernels.STRIP_ROWS, -(-keys // width) * width), (kernels.STRIP_ROWS, width))

    def scratch(suffix):
        return tuple(jit_cpu.scratch_array(f"attention_{name}{suffix}", dtype, shape)
                     for name, shape in zip(("keys", "values", "scores", "spill"), shapes))
    native = jit_cpu.native_pool()
    parts = np.array(_parts(batch * heads, queries, kernels.STRIP_ROWS,
                            queries * keys * (size + value_size),
                            NATIVE_PARTS_PER_THREAD if native is not None else 1), np.int64)
    if native is not None:
        kernels.native_attention(native.block, len(parts), parts, Q, K, V, mask_span,
                                 mask_strides, mask is not None, out, dtype.type(scale),
                                 scratch(""), scratch("_worker"))
        return out

    def part(pair0, pair1, row0, row1):
        kernels.attention(Q, K, V, mask_span, mask_strides, mask is not None, out,
                          dtype.type(scale), pair0, pair1, row0, row1, *scratch(""))
    parallel_for([tuple(int(x) for x in bounds) for bounds in parts], part)
    return out


def _mask_layout(mask, shape, dtype):
    """The mask as the kernel reads it: a flat view of the memory it spans from its first
    element, and its strides in elements once broadcast to the scores' ``shape`` (zero
    along the broadcast axes); a copy where a stride is negative."""
    if mask is None:
        return np.zeros(1, dtype), np.zeros(4, np.int64)
    view = np.broadcast_to(mask, shape)
    if any(stride < 0 for stride in view.strides):
        view = np.ascontiguousarray(view)
    strides = np.array([stride // view.itemsize for stride in view.strides], np.int64)
    span = 1 + int(sum((dim - 1) * stride for dim, stride in zip(view.shape, strides)))
    flat = np.lib.stride_tricks.as_strided(view, shape=(span,), strides=(view.itemsize,))
    return flat, strides


def _parts(pairs: int, rows: int, strip: int, work_per_pair: int,
           per_thread: int = 1) -> list[tuple]:
    """(pair0, pair1, row0, row1) parts, about ``per_thread`` per thread: runs of whole
    (batch, head) pairs when there are enough of them, else each pair's query rows split in
    strips. The native pool claims parts one at a time, so finer parts there let a worker
    that wakes late still take its share."""
    work = pairs * work_per_pair
    threads = intra_op_threads()
    if work < SPLIT_WORK or threads < 2:
        return [(0, pairs, 0, rows)]
    wanted = threads * per_thread
    if pairs >= wanted:
        return [(pairs * p // wanted, pairs * (p + 1) // wanted, 0, rows)
                for p in range(wanted)]
    if pairs >= threads:
        return [(pair, pair + 1, 0, rows) for pair in range(pairs)]
    strips = -(-rows // strip)
    count = min(strips, -(-wanted // pairs))
    split = [(strips * p // count * strip, min(rows, strips * (p + 1) // count * strip))
             for p in range(count)]
    return [(pair, pair + 1, r0, r1) for pair in range(pairs) for r0, r1 in split]
