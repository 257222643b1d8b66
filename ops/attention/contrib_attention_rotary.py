"""onnxruntime's ``RotaryEmbedding`` (domain ``com.microsoft``), which its fusions put before
``MultiHeadAttention``. The rotation is the default domain's RotaryEmbedding (opset 23,
``attention.rotary_embedding``); what differs is how positions are given: ``position_ids``
(batch, seq), or a single offset (1,) that numbers every entry's tokens from it. Narrow floats
rotate in float32 and are rounded once, as onnxruntime computes them. The ``scale`` attribute
is accepted and, as in onnxruntime's kernels, has no effect.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.attention.attention import rotary_embedding
from mixrt.ops.attention.contrib_attention import MICROSOFT, require_rank
from mixrt.ops.ir.dtypes import compute_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import conflicting, fits, same_as_input, shape_text

NAME = "RotaryEmbedding"
DTYPES = frozenset({"float32", "float16", "bfloat16"})


def positions_of(xp, position_ids, q_len: int, cache_len: int):
    """(batch or 1, seq) positions into the caches, refusing any outside them."""
    if position_ids.size == 1:
        start = int(position_ids.reshape(-1)[0])
        last = start + q_len - 1
        positions = xp.arange(start, start + q_len, dtype=np.int64)[None, :]
    else:
        positions = position_ids.astype(np.int64, copy=False)
        start, last = int(positions.min()), int(positions.max())
    if start < 0 or last >= cache_len:
        raise ValueError(f"{NAME}: positions {start}..{last} fall outside the cos/sin caches' "
                         f"{cache_len} rows")
    return positions


@op(NAME, since=1, domain=MICROSOFT, dtypes=DTYPES)
def contrib_rotary_embedding(xp, input, position_ids, cos_cache, sin_cache, *, interleaved=0,
                             num_heads=0, rotary_embedding_dim=0, is_packed_batching=0,
                             scale=1.0):
    """Rotate each head's leading ``rotary_embedding_dim`` features (the whole head by
    default) of a (batch, seq, hidden) or (batch, heads, seq, head_size) input."""
    wide = compute_dtype(input.dtype)
    q_len = input.shape[2] if input.ndim == 4 else input.shape[1]
    positions = positions_of(xp, position_ids, q_len, cos_cache.shape[0])
    cos, sin = (cache.astype(wide, copy=False)[positions] for cache in (cos_cache, sin_cache))
    half = cos_cache.shape[1]
    if input.ndim == 3 and not num_heads:
        num_heads = input.shape[2] // (2 * half)
    rotated = rotary_embedding(xp, input.astype(wide, copy=False), cos, sin,
                               interleaved=interleaved, num_heads=num_heads,
                               rotary_embedding_dim=2 * half)
    return rotated.astype(input.dtype, copy=False)


@contrib_rotary_embedding.infer
def _(input, position_ids, cos_cache, sin_cache, *, num_heads=0, rotary_embedding_dim=0, **_):
    """The input's type; refuses operands that do not fit: a head size the caches' width
    does not give (2 x width is the rotated part: ``rotary_embedding_dim``, else the head),
    position_ids neither (1,) nor (batch, seq)."""
    x = require_rank(NAME, "input", input, (3, 4), "(batch, seq, hidden) or (batch, heads, "
                     "seq, head_size)")
    if rotary_embedding_dim and not num_heads and (x is None or len(x) == 3):
        raise ValueError(f"{NAME}: rotary_embedding_dim={rotary_embedding_dim} needs "
                         "num_heads")
    cos = _check_caches(cos_cache, sin_cache)
    half = None if cos is None else cos[1]
    if x is not None:
        head_size = _head_size(x, num_heads, half)
        rotary = rotary_embedding_dim or head_size
        if isinstance(half, int) and isinstance(rotary, int) and (
                2 * half != rotary or (isinstance(head_size, int) and rotary > head_size)):
            raise ValueError(f"{NAME}: cos_cache has shape {shape_text(cos)}; expected "
                             f"(max_seq, {rotary // 2}) for a rotary size of {rotary} and "
                             f"a head size of {head_size}")
    ids = require_rank(NAME, "position_ids", position_ids, (1, 2), "(1,) or (batch, seq)")
    if ids is not None and x is not None:
        expected = (x[0], x[2] if len(x) == 4 else x[1])
        if not fits(ids, (1,) if len(ids) == 1 else expected):
            raise ValueError(f"{NAME}: position_ids has shape {shape_text(ids)}; expected (1,) "
                             f"or {shape_text(expected)} (batch, seq)")
    return same_as_input(input)


def _check_caches(cos_cache, sin_cache):
    cos = require_rank(NAME, "cos_cache", cos_cache, (2,), "(max_seq, rotary_dim / 2)")
    sin = require_rank(NAME, "sin_cache", sin_cache, (2,), "(max_seq, rotary_dim / 2)")
    if cos is not None and sin is not None and any(map(conflicting, cos, sin)):
        raise ValueError(f"{NAME}: cos_cache {shape_text(cos)} and sin_cache {shape_text(sin)} "
                         "differ; expected one shape")
    return cos if cos is not None else sin


def _head_size(x, num_heads, half):
    if len(x) == 4:
        return x[3]
    hidden = x[2]
    if num_heads:
        size, what = num_heads, f"num_heads={num_heads}"
    else:
        size, what = (2 * half if isinstance(half, int) else None), "heads of 2 x cos_cache width"
    if isinstance(hidden, int) and isinstance(size, int) and hidden % size:
        raise ValueError(f"{NAME}: input's {hidden} features do not split into {what}")
    if not num_heads:
        return size
    return hidden // num_heads if isinstance(hidden, int) else None


__all__ = ["contrib_rotary_embedding", "positions_of"]
