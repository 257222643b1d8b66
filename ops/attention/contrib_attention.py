"""onnxruntime's fused attention operators (domain ``com.microsoft``), part one: what they
share, and the BERT ``Attention``. ``MultiHeadAttention`` is in ``contrib_attention_mha.py``,
``GroupQueryAttention`` in ``contrib_attention_gqa.py``, ``RotaryEmbedding`` in
``contrib_attention_rotary.py``.

onnxruntime's transformer optimizer and its GenAI exports fuse a transformer's attention into
these ops. Each is written here as what differs from the ONNX Attention (projections, the
forms of its mask, the layout of its state); the attention itself, ``attend`` below, is made
of the ONNX Attention's pieces (``attention.product``, ``softmax_last``, its head layout
helpers, the default domain's ``rotary_embedding``). It does not call that op's whole
pipeline (``scaled_dot_product_attention``) because onnxruntime's arithmetic differs in
ways that show: it scales Q K^T once rather than Q and K by the root of the scale each, adds
the attention bias and then the mask as two roundings rather than one, and computes float16
in float32 throughout, rounding once at the end. In a row whose keys are all padding the
scores sit next to -10000, where a float32 ulp is 0.001, so only the same order of
operations gives the same probabilities.

The masks are onnxruntime's, which are not the ONNX Attention's: a padded key has
``mask_filter_value`` (-10000) added to its score rather than -inf, so a query whose keys are
all padding attends to all of them as if none were (softmax ignores a common shift); a key a
causal mask hides gets the dtype's lowest finite value instead, and only when more than one
query is computed (a single query sees every key, past or not).
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.attention.attention import merge_heads, product, softmax_last, split_heads
from mixrt.ops.ir.dtypes import FLOATS, compute_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, conflicting, fits, shape_text

MICROSOFT = "com.microsoft"
MASK_FILTER_VALUE = -10000.0


# -- dims that may be symbolic ------------------------------------------------------------

def dim_sum(*dims):
    return sum(dims) if all(isinstance(d, int) for d in dims) else None


def dim_quotient(dim, parts):
    """``dim / parts`` when both are known and it divides; else unknown."""
    if isinstance(dim, int) and isinstance(parts, int) and parts and dim % parts == 0:
        return dim // parts
    return None


def require_heads(op_type: str, num_heads, name: str = "num_heads") -> None:
    if not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"{op_type}: the {name} attribute is required and must be positive; "
                         f"got {num_heads!r}")


def require_split(op_type: str, what: str, size, heads: int) -> None:
    if isinstance(size, int) and size % heads:
        raise ValueError(f"{op_type}: {what} of {size} features does not split into "
                         f"{heads} heads")


def require_rank(op_type: str, name: str, value_type, ranks: tuple, meaning: str) -> tuple | None:
    """The shape of an input whose rank must be one of ``ranks``; None where unknown."""
    shape = None if value_type is None else value_type.shape
    if shape is not None and len(shape) not in ranks:
        raise ValueError(f"{op_type}: {name} has shape {shape_text(shape)}; expected "
                         f"{meaning}")
    return shape


# -- the mask -----------------------------------------------------------------------------

def padded_keys(xp, mask, *, batch: int, q_len: int, total: int, past_len: int):
    """The keys onnxruntime's ``mask_index``/``key_padding_mask`` hides, as a boolean array
    broadcasting to (batch, 1, q_len, total), or None for no mask. The forms:

    * (batch) valid lengths: keys from there on are padding; (2 * batch) those, then the
      first valid positions (left padding); (3 * batch + 2), the packed-sequence index of
      onnxruntime's GPU kernels, whose first batch entries are the valid lengths;
    * (batch, total) or (batch, q_len, total) 0/1, 0 hiding; (batch or 1, 1) a placeholder
      that hides nothing (where total is not 1);
    * Megatron's (batch, 1, max_seq, max_seq) 0/1, read from row ``past_len`` on.
    """
    if mask is None:
        return None
    if mask.ndim == 1:
        ends = mask[:batch].astype(np.int64).reshape(batch, 1, 1, 1)
        if int(ends.min()) < 0:
            raise ValueError(f"mask_index holds a negative key length ({int(ends.min())}); "
                             "expected the number of valid keys of each batch entry")
        keys = xp.arange(total)
        hidden = keys >= ends
        if mask.shape[0] == 2 * batch:
            hidden = hidden | (keys < mask[batch:].astype(np.int64).reshape(batch, 1, 1, 1))
        return hidden
    if mask.ndim == 2:
        if mask.shape[1] == 1 and total != 1:
            return None
        return (mask <= 0).reshape(mask.shape[0], 1, 1, mask.shape[1])
    if mask.ndim == 3:
        return (mask <= 0)[:, None]
    if mask.shape[2] < past_len + q_len or mask.shape[3] < total:
        raise ValueError(f"a 4-D mask_index of shape {tuple(mask.shape)} is too small for "
                         f"{past_len} past and {q_len} new positions; expected (batch, 1, "
                         f"max_seq, max_seq) with max_seq >= {past_len + q_len}")
    return mask[:, :, past_len:past_len + q_len, :total] <= 0


def causally_hidden(xp, q_len: int, total: int, past_len: int):
    """The keys onnxruntime's causal mask hides, as (1, 1, q_len, total): those after each
    query's position past_len + i, for every query but the last, which sees every key (in
    self-attention nothing follows it anyway; in cross-attention with more keys than
    queries this is what onnxruntime computes). None for a single query."""
    if q_len <= 1:
        return None
    keys = xp.arange(total).reshape(1, 1, 1, total)
    queries = xp.arange(q_len).reshape(1, 1, q_len, 1)
    return (keys > queries + past_len) & (queries < q_len - 1)


def additive_mask(xp, hidden, causal, dtype, filter_value: float):
    """0 for a visible key, ``filter_value`` for padding, the lowest finite value for what
    the causal mask hides (it wins over padding); None when nothing is hidden."""
    if hidden is None and causal is None:
        return None
    zero = xp.zeros((), dtype=dtype)
    mask = zero if hidden is None else xp.where(hidden, xp.asarray(filter_value, dtype), zero)
    if causal is not None:
        mask = xp.where(causal, xp.asarray(np.finfo(dtype).min, dtype), mask)
    return mask


def with_past(xp, past, new):
    """The past keys (or values) then this call's, along the sequence axis."""
    return new if past is None else xp.concatenate([past.astype(new.dtype, copy=False), new],
                                                   axis=2)


def attend(xp, q, k, v, *, scale=0.0, bias=None, mask=None, softcap=0.0, sink=None):
    """softmax(scale Q K^T, softcapped, + bias + mask) V over (batch, heads, seq, size)
    tensors, K and V with the same number of heads as Q or a divisor of it (grouped-query
    attention: query head h reads kv head h // (heads / kv heads)). Returns (y, scores,
    probabilities), in the precision onnxruntime's CPU kernels compute: float32 for narrower
    floats, rounded once by the caller.

    The bias and the mask are added one after the other, as onnxruntime does: where every key
    is masked, which scores survive rounding next to -10000 depends on it. A ``sink``
    (broadcasting to the scores' rows) is a logit that only the denominator counts: an
    attention sink."""
    wide = compute_dtype(q.dtype)
    batch, heads, q_len, head_size = q.shape
    kv_heads, total = k.shape[1], k.shape[2]
    # grouped query heads ride along the query rows, so K and V are never repeated per head
    grouped = q.astype(wide, copy=False).reshape(batch, kv_heads, -1, head_size)
    keys = k.astype(wide, copy=False).swapaxes(-1, -2)
    scores = product(xp, grouped, keys, wide).reshape(batch, heads, q_len, total)
    scores *= wide.type(scale or 1.0 / math.sqrt(head_size))  # a fresh array: in place
    if softcap:
        cap = wide.type(softcap)
        scores = cap * xp.tanh(scores / cap)
    for term in (bias, mask):
        if term is not None:
            scores += term.astype(wide, copy=False)
    probabilities = softmax_last(xp, scores) if sink is None else \
        softmax_with_sink(xp, scores, sink)
    y = product(xp, probabilities.reshape(batch, kv_heads, -1, total),
                v.astype(wide, copy=False), wide)
    return y.reshape(batch, heads, q_len, -1), scores, probabilities


def softmax_with_sink(xp, scores, sink):
    """Softmax over the last axis whose denominator also counts exp(sink)."""
    top = xp.maximum(xp.max(scores, axis=-1, keepdims=True), sink)
    exps = xp.exp(scores - top)
    return exps / (xp.sum(exps, axis=-1, keepdims=True) + xp.exp(sink - top))


def check_mask_index(op_type: str, name: str, mask, *, batch, q_len, total,
                     bert_forms: bool = False):
    """Raises a ValueError when a mask's shape is none of the forms ``padded_keys`` reads
    that ``op_type`` accepts: (batch) and (3 * batch + 2) key lengths, (batch, total),
    (batch, q_len, total); with ``bert_forms`` also (2 * batch) ends and starts, the
    (batch or 1, 1) placeholder and Megatron's (batch, 1, max_seq, max_seq)."""
    if mask is None or mask.shape is None:
        return
    forms = [(batch,), (dim_sum(batch, batch, batch, 2),), (batch, total), (batch, q_len, total)]
    extra = ", (2 x batch,) ends and starts, (batch, 1, max_seq, max_seq)" if bert_forms else ""
    if bert_forms:
        forms += [(dim_sum(batch, batch),), (batch, 1), (1, 1), (batch, 1, None, None)]
    if any(fits(mask.shape, form) for form in forms):
        return
    raise ValueError(
        f"{op_type}: {name} has shape {shape_text(mask.shape)}; expected ({batch},) key "
        f"lengths, ({batch}, {total}) or ({batch}, {q_len}, {total}) 0/1 masks{extra}")


def check_attention_bias(op_type: str, bias, *, batch, heads, q_len, total):
    if bias is None or bias.shape is None:
        return
    shape = bias.shape
    if len(shape) == 4 and fits(shape[2:], (q_len, total)) \
            and all(d == 1 or not conflicting(d, want) for d, want in zip(shape, (batch, heads))):
        return
    raise ValueError(f"{op_type}: attention_bias has shape {shape_text(shape)}; expected "
                     f"({batch} or 1, {heads} or 1, {q_len}, {total})")


# -- Attention (BERT: one input, packed Q/K/V weights) ----------------------------------

def _qkv_sizes(op_type: str, weights_width, num_heads, qkv_hidden_sizes) -> tuple:
    """(q, k, v) hidden sizes: ``qkv_hidden_sizes``, else the weights' width in thirds."""
    if qkv_hidden_sizes:
        sizes = tuple(int(s) for s in qkv_hidden_sizes)
        if len(sizes) != 3 or sizes[0] != sizes[1] or min(sizes) <= 0:
            raise ValueError(f"{op_type}: qkv_hidden_sizes is {list(sizes)}; expected three "
                             "positive sizes, Q's and K's equal")
        if isinstance(weights_width, int) and sum(sizes) != weights_width:
            raise ValueError(f"{op_type}: qkv_hidden_sizes {list(sizes)} add up to "
                             f"{sum(sizes)}; the weights have {weights_width} columns")
    else:
        third = dim_quotient(weights_width, 3)
        if isinstance(weights_width, int) and third is None:
            raise ValueError(f"{op_type}: the weights' {weights_width} columns do not split "
                             "into Q, K and V thirds; give qkv_hidden_sizes")
        sizes = (third,) * 3
    for what, size in zip(("Q", "K", "V"), sizes):
        require_split(op_type, f"{what}'s hidden size", size, num_heads)
    return sizes


@op("Attention", since=1, domain=MICROSOFT, dtypes=FLOATS)
def bert_attention(xp, input, weights, bias=None, mask_index=None, past=None,
                   attention_bias=None, past_sequence_length=None, *, num_heads=None,
                   qkv_hidden_sizes=None, unidirectional=0, scale=0.0,
                   mask_filter_value=MASK_FILTER_VALUE, do_rotary=0, rotary_embedding_dim=0,
                   past_present_share_buffer=0, _outputs=1):
    """Self-attention of ``input`` through one (input_hidden, q + k + v) projection; the
    optional ``past`` (2, batch, heads, past_seq, head_size) keys and values come first,
    and ``present`` stacks them with this call's."""
    _refuse_unsupported(do_rotary, past_present_share_buffer)
    dtype, wide = input.dtype, compute_dtype(input.dtype)
    q_size, k_size, _ = _qkv_sizes("Attention", weights.shape[1], num_heads, qkv_hidden_sizes)
    projected = product(xp, input, weights, wide)
    if bias is not None:
        projected = projected + bias.astype(wide, copy=False)
    q, k, v = (split_heads(part, num_heads) for part in
               (projected[..., :q_size], projected[..., q_size:q_size + k_size],
                projected[..., q_size + k_size:]))
    k = with_past(xp, None if past is None else past[0], k)
    v = with_past(xp, None if past is None else past[1], v)
    batch, q_len = input.shape[:2]
    total = k.shape[2]
    past_len = total - q_len
    hidden = padded_keys(xp, mask_index, batch=batch, q_len=q_len, total=total,
                         past_len=past_len)
    causal = causally_hidden(xp, q_len, total, past_len) if unidirectional else None
    mask = additive_mask(xp, hidden, causal, wide, mask_filter_value)
    y, _, _ = attend(xp, q, k, v, scale=scale, bias=attention_bias, mask=mask)
    y = merge_heads(y).astype(dtype, copy=False)
    if _outputs < 2:
        return y
    return y, xp.stack([k, v]).astype(dtype, copy=False)


def _refuse_unsupported(do_rotary, past_present_share_buffer) -> None:
    if do_rotary:
        raise ValueError("Attention: do_rotary=1 is not implemented (onnxruntime's CPU "
                         "kernel refuses it too); apply a com.microsoft RotaryEmbedding to "
                         "Q and K and use MultiHeadAttention")
    if past_present_share_buffer:
        raise ValueError("Attention: past_present_share_buffer=1 (a preallocated cache "
                         "updated in place) is not implemented; feed past as "
                         "(2, batch, heads, past_seq, head_size)")


@bert_attention.infer
def _(input, weights, bias=None, mask_index=None, past=None, attention_bias=None,
      past_sequence_length=None, *, num_heads=None, qkv_hidden_sizes=None, do_rotary=0,
      past_present_share_buffer=0, **_):
    """(batch, seq, v_hidden) and the present (2, batch, heads, past + seq, head_size);
    refuses operands that do not fit one another (see ``check_mask_index``)."""
    name = "Attention"
    require_heads(name, num_heads)
    _refuse_unsupported(do_rotary, past_present_share_buffer)
    x = require_rank(name, "input", input, (3,), "(batch, seq, input_hidden)")
    w = require_rank(name, "weights", weights, (2,), "(input_hidden, q + k + v hidden)")
    batch, q_len = (None, None) if x is None else x[:2]
    width = None if w is None else w[1]
    if x is not None and w is not None and conflicting(x[2], w[0]):
        raise ValueError(f"{name}: weights have shape {shape_text(w)}; expected {x[2]} rows, "
                         f"the input's hidden size (input {shape_text(x)})")
    q_size, _, v_size = _qkv_sizes(name, width, num_heads, qkv_hidden_sizes)
    b = require_rank(name, "bias", bias, (1,), f"({width},), one per weight column")
    if b is not None and conflicting(b[0], width):
        raise ValueError(f"{name}: bias has shape {shape_text(b)}; expected ({width},), one "
                         "per weight column")
    head_size = dim_quotient(q_size, num_heads)
    p = require_rank(name, "past", past, (5,), "(2, batch, heads, past_seq, head_size)")
    if p is not None:
        if isinstance(q_size, int) and isinstance(v_size, int) and q_size != v_size:
            raise ValueError(f"{name}: past needs Q, K and V of one hidden size; "
                             f"qkv_hidden_sizes gives {list(qkv_hidden_sizes)}")
        if not fits(p, (2, batch, num_heads, None, head_size)):
            raise ValueError(f"{name}: past has shape {shape_text(p)}; expected (2, {batch}, "
                             f"{num_heads}, past_seq, {head_size})")
    total = q_len if p is None else dim_sum(p[3], q_len)
    check_mask_index(name, "mask_index", mask_index, batch=batch, q_len=q_len, total=total,
                     bert_forms=True)
    check_attention_bias(name, attention_bias, batch=batch, heads=num_heads, q_len=q_len,
                         total=total)
    dtype = input.dtype
    return [TensorType(dtype, (batch, q_len, v_size)),
            TensorType(dtype, (2, batch, num_heads, total, head_size))]


__all__ = ["bert_attention", "MICROSOFT", "MASK_FILTER_VALUE", "padded_keys",
           "causally_hidden", "additive_mask", "with_past", "attend"]
