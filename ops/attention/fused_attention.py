"""``mixrt::FusedAttention``: a transformer's self-attention between its dense layers, as the
optimizer finds it in exported models (``runtime/passes/fuse_attention.py``, opt_level 2).

The node stands for this exact composition of ONNX ops, which the exporter writes back out
(``exporters/decompose.py``)::

    Qt = Transpose(Q, perm=[0, 2, 1, 3])      Q, V: (batch, seq, heads, size)
    Kt = Transpose(K, perm=[0, 2, 3, 1])      K:    (batch, keys, heads, size)
    Vt = Transpose(V, perm=[0, 2, 1, 3])
    P = Softmax(MatMul(Qt, Kt) * scale [+ mask], axis=-1)
    Y = Transpose(MatMul(P, Vt), perm=[0, 2, 1, 3])

On the CPU the heads are computed in one compiled pass (``ops/panels/_jit_panels.py``, its
attention section) that reads Q, K and V where the dense layers wrote them and writes Y in place:
the four transposes the graph spells out are never copied, and the scores never leave L1. Anything
that kernel does not take (other dtypes, a mask that would widen the scores, shapes that do not
line up, no AVX-512) runs the composition itself, with broadcasting, exactly as the unfused nodes
would.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.nn.fused import _into
from mixrt.ops.nn.nn import matmul_shape, softmax
from mixrt.ops.compiled.parallel import intra_op_threads, parallel_for
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, broadcast_or_none

QUERY_PERM = (0, 2, 1, 3)
KEY_PERM = (0, 2, 3, 1)
# multiply-adds from which the heads are split over the intra-op threads (as
# ops/nn/matmul_cpu.py's PANEL_SPLIT_WORK: a hand-off costs ~20 us)
SPLIT_WORK = 1 << 23
# parts per thread through the native pool (claimed one at a time: a late worker still takes
# its share)
NATIVE_PARTS_PER_THREAD = 4


@op("FusedAttention", since=1, domain=MIXRT, dtypes=FUSED_DTYPES)
def fused_attention(xp, Q, K, V, mask=None, *, scale=1.0, out=None):
    """softmax(Q K^T * scale + mask) V per head, in (batch, seq, heads, size) layout."""
    if xp is np and _compiled_suits(Q, K, V, mask, out):
        return _compiled(Q, K, V, mask, scale, out)
    scores = xp.matmul(xp.transpose(Q, QUERY_PERM), xp.transpose(K, KEY_PERM))
    if scale != 1.0:
        scores = scores * scores.dtype.type(scale)
    if mask is not None:
        scores = scores + mask
    probabilities = softmax(xp, scores, axis=-1)
    result = xp.transpose(xp.matmul(probabilities, xp.transpose(V, QUERY_PERM)), QUERY_PERM)
    return _into(xp, result, out)


@fused_attention.infer
def _(Q, K, V, mask=None, **_):
    def permuted(value_type, perm):
        shape = value_type.shape
        return None if shape is None or len(shape) != 4 else tuple(shape[i] for i in perm)
    scores = matmul_shape(permuted(Q, QUERY_PERM), permuted(K, KEY_PERM))
    if scores is not None and mask is not None:
        scores = broadcast_or_none(scores, mask.shape) if mask.shape is not None else None
    shape = matmul_shape(scores, permuted(V, QUERY_PERM))
    return [TensorType(Q.dtype, None if shape is None else tuple(shape[i] for i in QUERY_PERM))]


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


__all__ = ["fused_attention", "MIXRT", "QUERY_PERM", "KEY_PERM"]
