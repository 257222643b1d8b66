"""onnxruntime's ``GroupQueryAttention`` (domain ``com.microsoft``): the attention of LLM
decoders as onnxruntime GenAI exports them. Fewer key/value heads than query heads, a key/value
cache in (batch, kv_heads, cache_seq, head_size) whose valid length differs per batch entry,
rotary embeddings applied inside, a sliding window, a softcap and attention sinks.

Each batch entry b has ``seqlens_k[b] + 1`` valid positions, this call's ``seq`` new tokens
last among them, so its past is ``seqlens_k[b] + 1 - seq`` long; on the first prompt
(``seq == total_sequence_length``) the past is empty and a shorter entry is right-padded. The
present cache holds, per entry, its past then the new keys, then zeros, and is as long as the
longer of ``total_sequence_length`` and the past cache. A query at absolute position p sees
the keys at p and before (all valid keys with ``causal=0``), and only the last
``local_window_size`` of them (itself included) with a window; a padding query of a prompt
sees what its entry's last valid query sees. The quantized caches, the in-place
sliding-window cache and the Q/K norms are onnxruntime's GPU features and are refused here.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.attention.attention import merge_heads, rotary_embedding, split_heads
from mixrt.ops.attention.contrib_attention import (MICROSOFT, attend, check_attention_bias,
                                                   require_heads, require_rank, require_split)
from mixrt.ops.ir.dtypes import compute_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.shape.shape import host_ints
from mixrt.ops.ir.types import TensorType, UNKNOWN, conflicting, fits, shape_text

NAME = "GroupQueryAttention"
DTYPES = frozenset({"float32", "float16", "bfloat16"})


def split_packed(xp, query, key, value, num_heads, kv_num_heads):
    """Q (batch, heads, seq, head_size) and K, V (batch, kv_heads, seq, head_size), from
    separate inputs or from a query packing all three along its last axis."""
    if key is not None:
        return (split_heads(query, num_heads), split_heads(key, kv_num_heads),
                split_heads(value, kv_num_heads))
    head_size = query.shape[-1] // (num_heads + 2 * kv_num_heads)
    q_end, k_end = num_heads * head_size, (num_heads + kv_num_heads) * head_size
    return (split_heads(query[..., :q_end], num_heads),
            split_heads(query[..., q_end:k_end], kv_num_heads),
            split_heads(query[..., k_end:], kv_num_heads))


def past_lengths(xp, seqlens_k, q_len: int, first_prompt: bool):
    """How many cached positions precede this call's tokens, per batch entry, (batch,)."""
    seqlens = seqlens_k.astype(np.int64)
    return xp.zeros_like(seqlens) if first_prompt else seqlens + 1 - q_len


def rotary_positions(xp, past, position_ids, q_len: int, first_prompt: bool):
    """(batch, seq) positions of the new tokens for the rotary embedding: past + i, or the
    given position_ids; on the first prompt every entry counts from the first of those."""
    steps = xp.arange(q_len, dtype=np.int64)
    if position_ids is None:
        return past[:, None] + steps
    if first_prompt:
        return xp.broadcast_to(position_ids.reshape(-1)[:1] + steps, (past.shape[0], q_len))
    return position_ids.astype(np.int64, copy=False)


def rotate(xp, x, positions, cos_cache, sin_cache, interleaved):
    """x (batch, heads, seq, head_size) through the default domain's RotaryEmbedding; a cache
    narrower than half the head rotates only the leading features."""
    return rotary_embedding(xp, x, cos_cache, sin_cache, positions, interleaved=interleaved,
                            rotary_embedding_dim=2 * cos_cache.shape[-1])


def present_cache(xp, past, new, past_len, length: int, uniform_past: int | None):
    """(batch, kv_heads, length, head_size): each entry's first ``past_len[b]`` cached
    positions, then its new ones, then zeros. ``uniform_past`` is the past length when every
    entry has the same one (then two slice copies do it), else None."""
    batch, heads, q_len, size = new.shape
    cache = xp.zeros((batch, heads, length, size), new.dtype)
    if uniform_past is not None:
        if past is not None and uniform_past:
            cache[:, :, :uniform_past] = past[:, :, :uniform_past]
        cache[:, :, uniform_past:uniform_past + q_len] = new
        return cache
    # ragged pasts: gather whole (heads, head_size) rows by (entry, slot)
    slots = xp.arange(length, dtype=np.int64)[None, :]
    entries = xp.arange(batch)[:, None]
    offset = slots - past_len[:, None]
    from_new = ((offset >= 0) & (offset < q_len))[..., None, None]
    by_slot = xp.where(from_new, new.transpose(0, 2, 1, 3)[entries, xp.clip(offset, 0, q_len - 1)],
                       xp.zeros((), new.dtype))
    if past is not None and past.shape[2]:
        kept = past.astype(new.dtype, copy=False).transpose(0, 2, 1, 3)[
            entries, xp.clip(slots, 0, past.shape[2] - 1)]
        by_slot = xp.where((slots < past_len[:, None])[..., None, None], kept, by_slot)
    return by_slot.transpose(0, 2, 1, 3)


def visible_keys(xp, past_len, seqlens_k, q_len: int, length: int, *, causal, window):
    """(batch, 1, seq, length) booleans: the keys each query sees. Query i of entry b sits at
    past_len[b] + i; a padding query past the entry's valid length sees what its last valid
    query sees; keys past the valid length are never seen."""
    keys = xp.arange(length, dtype=np.int64).reshape(1, 1, 1, length)
    last = seqlens_k.astype(np.int64).reshape(-1, 1, 1, 1)
    if not causal:
        return keys <= last
    position = xp.minimum(past_len.reshape(-1, 1, 1, 1) +
                          xp.arange(q_len, dtype=np.int64).reshape(1, 1, q_len, 1), last)
    visible = keys <= position
    if window >= 0:
        visible = visible & (keys > position - window)
    return visible


def _padded_bias(xp, bias, length, wide):
    """attention_bias, its key axis (total_sequence_length) padded with zeros to the cache's
    length: the keys past it are hidden anyway."""
    if bias is None:
        return None
    bias = bias.astype(wide, copy=False)
    short = length - bias.shape[-1]
    if short <= 0:
        return bias
    return xp.concatenate([bias, xp.zeros(bias.shape[:-1] + (short,), wide)], axis=-1)


@op(NAME, since=1, domain=MICROSOFT, dtypes=DTYPES)
def group_query_attention(
        xp, query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
        total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
        attention_bias=None, head_sink=None, k_scale=None, v_scale=None, q_norm_weight=None,
        k_norm_weight=None, *, num_heads=None, kv_num_heads=None, scale=0.0, softcap=0.0,
        do_rotary=0, rotary_interleaved=0, local_window_size=-1, causal=1, smooth_softmax=0,
        qk_output=0, sliding_window_cache=0, kv_cache_bit_width=0, k_quant_type="NONE",
        v_quant_type="NONE", qk_norm_epsilon=1e-6, _outputs=1):
    """Grouped-query attention over a per-entry cache (see the module docstring): y (batch,
    seq, heads x head_size), the present keys and values, and with ``qk_output`` 1 or 2 the
    scores before or the probabilities after softmax, (batch, heads, seq,
    total_sequence_length), zero where a key is hidden."""
    _refuse_unsupported(k_scale, v_scale, q_norm_weight, sliding_window_cache, k_quant_type,
                        v_quant_type)
    dtype, wide = query.dtype, compute_dtype(query.dtype)
    q, k, v = (t.astype(wide, copy=False) for t in
               split_packed(xp, query, key, value, num_heads, kv_num_heads))
    q_len = q.shape[2]
    total = int(total_sequence_length.reshape(-1)[0])
    first_prompt = q_len == total
    past_len = past_lengths(xp, seqlens_k, q_len, first_prompt)
    if do_rotary:
        positions = rotary_positions(xp, past_len, position_ids, q_len, first_prompt)
        q, k = (rotate(xp, t, positions, cos_cache.astype(wide, copy=False),
                       sin_cache.astype(wide, copy=False), rotary_interleaved) for t in (q, k))
    length = max(total, 0 if past_key is None else past_key.shape[2])
    uniform_past = _checked_uniform_past(seqlens_k, q_len, length, first_prompt)
    present_key = present_cache(xp, past_key, k, past_len, length, uniform_past)
    present_value = present_cache(xp, past_value, v, past_len, length, uniform_past)
    visible = visible_keys(xp, past_len, seqlens_k, q_len, length, causal=causal,
                           window=local_window_size)
    mask = xp.where(visible, xp.zeros((), wide), xp.asarray(-np.inf, wide))
    sink = _sink(xp, head_sink, smooth_softmax, num_heads, wide)
    y, scores, probabilities = attend(
        xp, q, present_key, present_value, scale=scale, softcap=softcap,
        bias=_padded_bias(xp, attention_bias, length, wide), mask=mask, sink=sink)
    outputs = [merge_heads(y), present_key, present_value]
    if _outputs > 3:
        shown = scores if qk_output == 1 else probabilities
        outputs.append(xp.where(visible, shown, xp.zeros((), wide))[..., :total])
    return tuple(x.astype(dtype, copy=False) for x in outputs[:max(_outputs, 1)])


group_query_attention.reads_on_host(6)


def _sink(xp, head_sink, smooth_softmax, num_heads, wide):
    """The per-head logit softmax's denominator also counts: ``head_sink``, or 0 for every
    head with ``smooth_softmax``; None for a plain softmax."""
    if head_sink is not None:
        return head_sink.astype(wide, copy=False).reshape(1, -1, 1, 1)
    if smooth_softmax == 1:
        return xp.zeros((1, num_heads, 1, 1), wide)
    return None


def _checked_uniform_past(seqlens_k, q_len, length, first_prompt) -> int | None:
    """The past length shared by every entry, None when they differ; refuses valid lengths
    that cannot hold this call's tokens or do not fit in the cache."""
    valid = [n + 1 for n in host_ints(seqlens_k)]
    if max(valid) > length or min(valid) < (1 if first_prompt else q_len):
        raise ValueError(f"{NAME}: seqlens_k holds {[n - 1 for n in valid]}; expected each "
                         f"entry's valid length - 1, between seq - 1 = {q_len - 1} (0 on the "
                         f"first prompt) and the cache length {length} - 1")
    pasts = {0} if first_prompt else {n - q_len for n in valid}
    return pasts.pop() if len(pasts) == 1 else None


def _refuse_unsupported(k_scale, v_scale, q_norm_weight, sliding_window_cache, k_quant_type,
                        v_quant_type) -> None:
    quantized = k_scale is not None or v_scale is not None or \
        _text(k_quant_type) != "NONE" or _text(v_quant_type) != "NONE"
    what = ("a quantized key/value cache" if quantized else
            "q_norm_weight/k_norm_weight" if q_norm_weight is not None else
            "sliding_window_cache=1" if sliding_window_cache else None)
    if what:
        raise ValueError(f"{NAME}: {what} is not implemented (onnxruntime runs it on GPUs); "
                         "expected a float cache of the full length")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- shapes -------------------------------------------------------------------------------

@group_query_attention.infer
def _(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
      total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
      attention_bias=None, head_sink=None, k_scale=None, v_scale=None, q_norm_weight=None,
      k_norm_weight=None, *, num_heads=None, kv_num_heads=None, do_rotary=0,
      local_window_size=-1, causal=1, sliding_window_cache=0, k_quant_type="NONE",
      v_quant_type="NONE", **_):
    """y (batch, seq, heads x head_size); the present cache (batch, kv_heads, cache_seq,
    head_size), its length ``total_sequence_length`` or the past's where known; the scores
    (batch, heads, seq, total_sequence_length)."""
    require_heads(NAME, num_heads)
    require_heads(NAME, kv_num_heads, "kv_num_heads")
    if num_heads % kv_num_heads:
        raise ValueError(f"{NAME}: num_heads={num_heads} is not a multiple of "
                         f"kv_num_heads={kv_num_heads}")
    _refuse_unsupported(k_scale, v_scale, q_norm_weight, sliding_window_cache, k_quant_type,
                        v_quant_type)
    if not causal and local_window_size > 0:
        raise ValueError(f"{NAME}: local_window_size={local_window_size} needs causal=1")
    batch, q_len, head_size = _query_form(query, key, value, num_heads, kv_num_heads)
    past_len = _check_past(past_key, past_value, batch, kv_num_heads, head_size)
    for name, operand, expected in (("seqlens_k", seqlens_k, (batch,)),
                                    ("total_sequence_length", total_sequence_length, None)):
        _check_index(name, operand, expected)
    total = _known_total(total_sequence_length)
    _check_rotary(do_rotary, cos_cache, sin_cache, position_ids, head_size, batch, q_len)
    check_attention_bias(NAME, attention_bias, batch=batch, heads=num_heads, q_len=q_len,
                         total=total)
    if head_sink is not None and head_sink.shape is not None and \
            not fits(head_sink.shape, (num_heads,)):
        raise ValueError(f"{NAME}: head_sink has shape {shape_text(head_sink.shape)}; "
                         f"expected ({num_heads},), one per head")
    length = total if past_len == 0 else (
        max(total, past_len) if isinstance(total, int) and isinstance(past_len, int) else None)
    dtype = query.dtype
    present = TensorType(dtype, (batch, kv_num_heads, length, head_size))
    hidden = head_size * num_heads if isinstance(head_size, int) else None
    return [TensorType(dtype, (batch, q_len, hidden)), present,
            present, TensorType(dtype, (batch, num_heads, q_len, total))]


def _query_form(query, key, value, num_heads, kv_num_heads):
    """(batch, seq, head_size) of separate or packed Q, K, V; refuses those that do not fit."""
    q = require_rank(NAME, "query", query, (3,), "(batch, seq, hidden)")
    if q is None:
        return None, None, None
    if key is None:
        if value is not None:
            raise ValueError(f"{NAME}: value without key; pass both, or Q, K and V packed in "
                             "query")
        heads = num_heads + 2 * kv_num_heads
        require_split(NAME, "packed query's hidden size", q[2], heads)
        return q[0], q[1], q[2] // heads if isinstance(q[2], int) else None
    require_split(NAME, "query's hidden size", q[2], num_heads)
    head_size = q[2] // num_heads if isinstance(q[2], int) else None
    kv_hidden = head_size * kv_num_heads if isinstance(head_size, int) else None
    for name, operand in (("key", key), ("value", value)):
        shape = None if operand is None else operand.shape
        if operand is None or (shape is not None and not fits(shape, (q[0], q[1], kv_hidden))):
            raise ValueError(f"{NAME}: {name} has shape {shape_text(shape)}; expected "
                             f"({q[0]}, {q[1]}, {kv_hidden}) (batch, seq, kv_heads x "
                             "head_size)")
    return q[0], q[1], head_size


def _check_past(past_key, past_value, batch, kv_heads, head_size):
    """The past cache's length (0 without one; None where unknown)."""
    if past_key is None and past_value is None:
        return 0
    if past_key is None or past_value is None:
        raise ValueError(f"{NAME}: past_key and past_value come together; got only one")
    shapes = (past_key.shape, past_value.shape)
    expected = (batch, kv_heads, None, head_size)
    for name, shape in zip(("past_key", "past_value"), shapes):
        if shape is not None and (not fits(shape, expected) or
                                  conflicting(shape[2], (shapes[0] or shape)[2])):
            raise ValueError(f"{NAME}: {name} has shape {shape_text(shape)}; expected "
                             f"({batch}, {kv_heads}, cache_seq, {head_size}), one cache_seq")
    return None if shapes[0] is None else shapes[0][2]


def _check_index(name, operand, expected):
    if operand is None:
        raise ValueError(f"{NAME}: {name} is required")
    shape = operand.shape
    if shape is None:
        return
    ok = fits(shape, expected) if expected else (len(shape) == 0 or fits(shape, (1,)))
    if not ok:
        raise ValueError(f"{NAME}: {name} has shape {shape_text(shape)}; expected "
                         f"{shape_text(expected) if expected else 'a scalar'}")


def _known_total(total_sequence_length):
    value = None if total_sequence_length is UNKNOWN else total_sequence_length.value
    return int(np.asarray(value).reshape(-1)[0]) if value is not None else None


def _check_rotary(do_rotary, cos_cache, sin_cache, position_ids, head_size, batch, q_len):
    if not do_rotary:
        return
    if cos_cache is None or sin_cache is None:
        raise ValueError(f"{NAME}: do_rotary=1 needs cos_cache and sin_cache")
    for name, cache in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
        shape = cache.shape
        half = None if shape is None or len(shape) != 2 else shape[1]
        if shape is not None and (len(shape) != 2 or (
                isinstance(half, int) and isinstance(head_size, int) and 2 * half > head_size)):
            raise ValueError(f"{NAME}: {name} has shape {shape_text(shape)}; expected "
                             f"(max_seq, rotary_dim / 2), rotary_dim at most the head size "
                             f"{head_size}")
    if position_ids is not None and position_ids.shape is not None and \
            not fits(position_ids.shape, (batch, q_len)):
        raise ValueError(f"{NAME}: position_ids has shape {shape_text(position_ids.shape)}; "
                         f"expected ({batch}, {q_len})")


__all__ = ["group_query_attention", "present_cache", "visible_keys", "rotary_positions"]
