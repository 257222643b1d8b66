"""FusedAttention's CPU form, registered beside its generic kernel
(``ops/attention/fused_attention.py``): the heads in one compiled pass
(``ops/panels/_jit_panels.py``, its attention section) that reads Q, K and V where the dense layers
wrote them and writes Y in place, split over the intra-op threads; what that kernel does not take
runs the generic composition.
"""

from __future__ import annotations

import threading

import numpy as np

from mixrt.ops.attention.fused_attention import (QUERY_PERM, fused_attention, kv_repeat_of,
                                                 repeated_heads)
from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.compiled.bound_calls import binds_replay, padded
from mixrt.ops.compiled.parallel import intra_op_threads, parallel_for
from mixrt.ops.nn.product_parts import even_parts
from mixrt.ops.ir.types import broadcasts_to

# multiply-adds from which the heads are split over the intra-op threads (as
# ops/nn/matmul_cpu.py's PANEL_SPLIT_WORK: a hand-off costs ~20 us)
SPLIT_WORK = 1 << 23
# parts per thread through the native pool (claimed one at a time: a late worker still takes
# its share)
NATIVE_PARTS_PER_THREAD = 4


@fused_attention.fast("cpu")
def fused_attention_cpu(xp, Q, K, V, mask=None, *, scale=1.0, heads_first=None, nan_to_zero=0,
                        kv_repeat=1, out=None, _node=None):
    """The compiled heads where they take this call, else the generic composition. Grouped
    K and V (``kv_repeat``) are read in place by the few-queries loop; the packed heads
    take them repeated."""
    if out is not None and replay.replayed(_node, (Q, K, V, mask, out)):
        return out  # the packed heads' call on these very arrays, kept (_kept_call)
    step = None if _node is None or out is None else _node.get(STEP)
    if step is not None and step.takes(Q, K, V, mask, out):
        return step.run(Q, K, V, mask, out)
    if _few_queries_suit(Q, K, V, mask, out):
        repeat = kv_repeat_of(heads_first, kv_repeat)
        if _few_queries(Q, K, V, mask, scale, heads_first, repeat, bool(nan_to_zero), out):
            if _node is not None:
                _node[STEP] = _Step.after(Q, K, V, mask, out, scale, heads_first, repeat,
                                          bool(nan_to_zero))
            return out  # the loop applies the guard itself
        done = False
    else:
        repeat = kv_repeat_of(heads_first, kv_repeat)
        call = _packed(Q, repeated_heads(np, K, repeat), repeated_heads(np, V, repeat), mask,
                       scale, heads_first, out)
        done = call is not None
        if done and repeat == 1 and not any(heads_first or ()):
            replay.record(_node, (Q, K, V, mask, out), _kept_call(call, scale, nan_to_zero))
    if done:
        return _guarded(out, Q, K, V, mask, scale, heads_first, nan_to_zero, kv_repeat)
    return fused_attention.fn(np, Q, K, V, mask, scale=scale, heads_first=heads_first,
                              nan_to_zero=nan_to_zero, kv_repeat=kv_repeat, out=out)


def _guarded(out, Q, K, V, mask, scale, heads_first, nan_to_zero, kv_repeat):
    """``out`` as the packed heads wrote it. A row of probabilities that is not a number
    makes its output row not a number (it multiplies every value): where the guard is asked
    for and one shows, the generic composition computes the call again, guard and all. It
    shows in the output's minimum (NumPy's propagates one), read without the mask of flags
    ``isnan(out).any()`` wrote first: ~35-50 -> ~20 us of a 2 x 66-token BERT layer's
    attention, bound or not."""
    if nan_to_zero and out.size and np.isnan(np.minimum.reduce(out, axis=None)):
        return fused_attention.fn(np, Q, K, V, mask, scale=scale, heads_first=heads_first,
                                  nan_to_zero=nan_to_zero, kv_repeat=kv_repeat, out=out)
    return out


def _kept_call(call, scale, nan_to_zero):
    """The packed heads' call as the node's replay (``ops/compiled/replay.py``) and bound
    call: its parts, scratch and mask strides were worked out once, for these arrays'
    layouts (a 2-layer BERT's attention spent ~30 us a call choosing them again)."""
    def action(Q, K, V, mask, out):
        call(Q, K, V, mask, out)
        return _guarded(out, Q, K, V, mask, scale, None, nan_to_zero, 1)
    return action


# its planned call, bound once per arena (ops/compiled/bound_calls.py): the recorded replay
binds_replay(fused_attention_cpu, lambda args, out: padded(args, 4) + (out,))


def _packed(Q, K, V, mask, scale, heads_first, out):
    """The call by the packed-panel heads into ``out``: the call made, ``call(Q, K, V, mask,
    out)`` for arrays laid out as these (:func:`_compiled_call`), or None (nothing written)
    where they do not take it."""
    q, k, v = _sequence_first(Q, K, V, heads_first)
    if not _compiled_suits(q, k, v, mask, out):
        return None
    call = _shared_call(q, k, v, mask, scale)
    call(q, k, v, mask, out)
    return call


# calls of the compiled heads kept per thread by their arrays' layouts: a transformer's
# layers at one length make the same call, whose parts, scratch views and mask strides were
# worked out again in each layer (~30 us a layer at a service's new length, cold)
_shared = threading.local()
MAX_SHARED_CALLS = 8


def _shared_call(Q, K, V, mask, scale):
    """:func:`_compiled_call` for these layouts and ``scale``, made once on this thread for
    its scratch buffers and native pool as they are now. (The buffers a call copies strided
    inputs into are shared too: a thread's calls run one at a time.)"""
    pool = jit_cpu.native_pool()
    key = (_layout(Q, K, V, mask), float(scale), jit_cpu.scratch_generation(),
           intra_op_threads())
    kept = _shared.__dict__.get("calls")
    if kept is None:
        kept = _shared.calls = {}
    found = kept.get(key)
    if found is not None and found[0] is pool:
        return found[1]
    if len(kept) >= MAX_SHARED_CALLS:  # a service's lengths come and go
        kept.clear()
    call = _compiled_call(Q, K, V, mask, scale)
    kept[key] = (pool, call)
    return call


def _sequence_first(Q, K, V, heads_first) -> tuple:
    """Q, K and V in the (batch, seq, heads, size) layout the compiled heads read: an input
    that comes heads first (``scaled_dot_product_attention``'s layout) as a transposed copy,
    which costs what the Transpose node before it in the unfused graph did."""
    if heads_first is None or not any(heads_first):
        return Q, K, V
    return tuple(np.ascontiguousarray(x.transpose(QUERY_PERM)) if first and x.ndim == 4 else x
                 for x, first in zip((Q, K, V), heads_first))


# -- a few queries: a decoder's step ------------------------------------------------------------

FEW_QUERIES_KERNELS = "mixrt.ops.attention._jit_few_queries"
# queries per head up to which the direct loop beats packing each head's K and V into panels
# (one query, 4 heads of 64 keys: 9 against 44 us)
FEW_QUERIES = 4


def _few_queries_suit(Q, K, V, mask, out) -> bool:
    """A call of at most FEW_QUERIES queries per head, in one native float dtype, with as
    many heads and keys in K and V as Q asks for, a mask that broadcasts to the scores, and
    ``out`` C-contiguous apart from the inputs. (The layouts are read through the flags: the
    axes of Q, K, V are checked in :func:`_few_queries`.)"""
    if out is None or Q.ndim != 4 or K.ndim != 4 or V.ndim != 4 or out.ndim != 4:
        return False
    if not (Q.dtype == K.dtype == V.dtype == out.dtype and Q.dtype in jit_cpu.NATIVE):
        return False
    if not out.flags.c_contiguous or out.shape[1] > FEW_QUERIES or out.size == 0 \
            or any(np.may_share_memory(out, x) for x in (Q, K, V, mask) if x is not None):
        return False
    return (mask is None or mask.dtype == Q.dtype) and jit_cpu.enabled()


def _few_queries(Q, K, V, mask, scale, heads_first, repeat, nan_to_zero, out) -> bool:
    """The call by the direct loop into ``out``; False (nothing written) where K, V (their
    heads each serving ``repeat`` query heads), the mask or ``out`` do not line up with Q's
    batch, heads and queries without broadcasting."""
    q_first, k_first, v_first = heads_first or (0, 0, 0)
    q = Q if q_first else Q.transpose(QUERY_PERM)
    k = K if k_first else K.transpose(QUERY_PERM)
    v = V if v_first else V.transpose(QUERY_PERM)
    batch, heads, queries, _ = q.shape
    keys = k.shape[2]
    scores_shape = (batch, heads, queries, keys)
    kv_heads = heads // repeat
    if kv_heads * repeat != heads or k.shape[:2] != (batch, kv_heads) \
            or v.shape[:3] != (batch, kv_heads, keys) \
            or q.shape[3] != k.shape[3] or out.shape != (batch, queries, heads, v.shape[3]) \
            or keys == 0 or (mask is not None and not broadcasts_to(mask.shape, scores_shape)):
        return False
    kernels = jit_cpu.load(FEW_QUERIES_KERNELS)
    target = out.transpose(QUERY_PERM)
    into = target if target.flags.c_contiguous else np.empty(target.shape, out.dtype)
    mask_span, mask_strides = _flat_mask(mask, scores_shape, out.dtype)
    kernels.attend(*(np.ascontiguousarray(x) for x in (q, k, v)), mask_span, mask_strides,
                   mask is not None, out.dtype.type(scale), repeat, nan_to_zero, into,
                   jit_cpu.scratch_array("attention_few_scores", out.dtype, (keys,)))
    if into is not target:
        np.copyto(target, into)
    return True


STEP = ("decoder_step",)  # a node's _Step, in its _node dict


class _Step:
    """A decoder step's call of the direct loop, as the last one was laid out: the next step
    passes new arrays (K and V are the KV cache's Concat, a graph output made anew each
    step) with the same shapes, strides and dtype, so what :func:`_few_queries_suit` and
    :func:`_few_queries` worked out holds, and the call is the kernel and the views it reads
    (a GPT-2 step's attention: ~17 -> ~12 us a call in the run, the guard's NaN scan
    over the output included, which the loop now does itself)."""

    __slots__ = ("key", "perms", "scale", "repeat", "guard", "mask_strides", "keys",
                 "kernels")

    @classmethod
    def after(cls, Q, K, V, mask, out, scale, heads_first, repeat, guard):
        """The step of the call just made, or None where its layout is not one this replays
        (copies were made, or the mask is not contiguous)."""
        q_first, k_first, v_first = heads_first or (0, 0, 0)
        views = [x if first else x.transpose(QUERY_PERM)
                 for x, first in ((Q, q_first), (K, k_first), (V, v_first))]
        target = out.transpose(QUERY_PERM)
        if not all(v.flags.c_contiguous for v in (*views, target)) \
                or (mask is not None and (not mask.flags.c_contiguous or mask.ndim > 4)):
            return None
        step = cls()
        step.key = _layout(Q, K, V, mask, out)
        step.perms = tuple(None if first else QUERY_PERM for first in (q_first, k_first, v_first))
        step.scale, step.repeat, step.guard = out.dtype.type(scale), repeat, guard
        step.mask_strides = None if mask is None else _flat_mask(
            mask, (*views[0].shape[:3], views[1].shape[2]), out.dtype)[1]
        step.keys = views[1].shape[2]
        step.kernels = jit_cpu.load(FEW_QUERIES_KERNELS)
        return step

    def takes(self, Q, K, V, mask, out) -> bool:
        return _layout(Q, K, V, mask, out) == self.key and jit_cpu.enabled() \
            and not any(np.may_share_memory(out, x) for x in (Q, K, V, mask) if x is not None)

    def run(self, Q, K, V, mask, out):
        q, k, v = (x if perm is None else x.transpose(perm)
                   for x, perm in zip((Q, K, V), self.perms))
        span, strides = (_NO_MASK[out.dtype.char] if mask is None
                         else (mask.reshape(-1), self.mask_strides))
        self.kernels.attend(q, k, v, span, strides, mask is not None, self.scale, self.repeat,
                            self.guard, out.transpose(QUERY_PERM),
                            jit_cpu.scratch_array("attention_few_scores", out.dtype,
                                                  (self.keys,)))
        return out


def _layout(*arrays) -> tuple:
    return tuple(None if x is None else (x.shape, x.strides, x.dtype.char) for x in arrays)


# -- the compiled heads ---------------------------------------------------------------------------

def _compiled_suits(Q, K, V, mask, out) -> bool:
    """Whether the compiled kernel computes this call: one native float dtype, ``out``
    C-contiguous and apart from the inputs, batch and heads equal across Q, K and V (no
    broadcasting between them), K and V with the same keys, a mask that broadcasts to the
    scores without widening them. (Q, K and V that are not C-contiguous are read from
    copies, :func:`_compiled_call`.)"""
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
    if mask is not None and (mask.dtype != Q.dtype
                             or not broadcasts_to(mask.shape, (batch, heads, queries, keys))):
        return False
    return out.flags.c_contiguous \
        and not any(np.may_share_memory(out, x) for x in (Q, K, V, mask) if x is not None) \
        and jit_cpu.panel_kernels() is not None


def _compiled_call(Q, K, V, mask, scale):
    """``call(Q, K, V, mask, out)``: the compiled heads for arrays of these shapes, strides
    and dtype (:func:`_compiled_suits`), their parts, scratch and the mask's strides worked
    out once. An input that is not C-contiguous (a part of a fused projection's Split:
    GPT-2's Q, K and V) is copied into a buffer of the call's own each time."""
    kernels = jit_cpu.panel_kernels()
    batch, queries, heads, size = Q.shape
    keys, value_size = K.shape[1], V.shape[3]
    dtype = Q.dtype
    width = kernels.PANEL_VECTORS * kernels.VECTOR_BYTES // dtype.itemsize
    shapes = ((-(-keys // width), size, width), (-(-value_size // width), keys, width),
              (kernels.STRIP_ROWS, -(-keys // width) * width), (kernels.STRIP_ROWS, width))

    def scratch(suffix):
        return tuple(jit_cpu.scratch_array(f"attention_{name}{suffix}", dtype, shape)
                     for name, shape in zip(("keys", "values", "scores", "spill"), shapes))
    buffers = tuple(None if x.flags.c_contiguous else np.empty(x.shape, dtype)
                    for x in (Q, K, V))
    read_mask = _mask_reader(mask, (batch, heads, queries, keys), dtype)
    masked, factor = mask is not None, dtype.type(scale)
    native = jit_cpu.native_pool()
    parts = np.array(_parts(batch * heads, queries, kernels.STRIP_ROWS,
                            queries * keys * (size + value_size),
                            NATIVE_PARTS_PER_THREAD if native is not None else 1), np.int64)
    if native is not None:
        run, block, count = kernels.native_attention, native.block, len(parts)
        kernels.job_ready(kernels.ATTENTION_JOB, dtype.itemsize)  # the worker's side
        own, worker = scratch(""), scratch("_worker")

        def call(Q, K, V, mask, out):
            q, k, v = _contiguous(buffers, (Q, K, V))
            span, strides = read_mask(mask)
            run(block, count, parts, q, k, v, span, strides, masked, out, factor, own, worker)
            return out
        return call
    bounds = [tuple(int(x) for x in part) for part in parts]

    def call(Q, K, V, mask, out):
        q, k, v = _contiguous(buffers, (Q, K, V))
        span, strides = read_mask(mask)

        def part(pair0, pair1, row0, row1):
            kernels.attention(q, k, v, span, strides, masked, out, factor, pair0, pair1,
                              row0, row1, *scratch(""))
        parallel_for(bounds, part)
        return out
    return call


def _contiguous(buffers: tuple, arrays: tuple) -> tuple:
    """Each array as it is, or copied into its buffer where it has one."""
    return tuple(x if buffer is None else _copied_into(buffer, x)
                 for buffer, x in zip(buffers, arrays))


def _copied_into(buffer, x):
    np.copyto(buffer, x)
    return buffer


def _mask_reader(mask, shape, dtype):
    """``read(mask) -> (span, strides)`` (:func:`_mask_layout`) for masks laid out as
    ``mask``: a C-contiguous one's strides worked out once, its span its flat view."""
    if mask is None:
        fixed = _NO_MASK[np.dtype(dtype).char]
        return lambda _: fixed
    if mask.flags.c_contiguous and mask.ndim <= 4:
        strides = _flat_mask(mask, shape, dtype)[1]
        return lambda m: (m.reshape(-1), strides)
    return lambda m: _mask_layout(m, shape, dtype)


_NO_MASK = {np.dtype(t).char: (np.zeros(1, t), np.zeros(4, np.int64))
            for t in (np.float32, np.float64)}


def _flat_mask(mask, shape, dtype):
    """:func:`_mask_layout` without its NumPy views (~8 us) for the common case, a
    C-contiguous mask of at most 4 axes: its flat view, and each axis's stride where it has
    more than one entry (zero where it broadcasts)."""
    if mask is None:
        return _NO_MASK[np.dtype(dtype).char]
    if not mask.flags.c_contiguous or mask.ndim > 4:
        return _mask_layout(mask, shape, dtype)
    dims = (1,) * (4 - mask.ndim) + mask.shape
    strides, step = [0, 0, 0, 0], 1
    for axis in range(3, -1, -1):
        strides[axis] = step if dims[axis] > 1 else 0
        step *= dims[axis]
    return mask.reshape(-1), np.array(strides, np.int64)


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
    """(pair0, pair1, row0, row1) parts, at most ``per_thread`` per thread: runs of whole
    (batch, head) pairs, over bands of strips of query rows where the pairs do not share
    evenly (``product_parts.even_parts``: BERT-base's 12 heads as eight runs were 1, 2, 1,
    2, ... heads, and one thread claimed 7 of the 12). The native pool claims parts one at a
    time, so more parts let a worker that wakes late still take its share."""
    work = pairs * work_per_pair
    threads = intra_op_threads()
    if work < SPLIT_WORK or threads < 2:
        return [(0, pairs, 0, rows)]
    return even_parts(pairs, rows, strip, threads * per_thread, threads)
