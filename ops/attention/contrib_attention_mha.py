"""onnxruntime's ``MultiHeadAttention`` (domain ``com.microsoft``): attention of already
projected queries, keys and values, with the projections' bias, a key padding mask, an
additive attention bias and a key/value cache. What it shares with the other fused attention
ops (the masks, the attention itself) is in ``contrib_attention.py``.

Q, K and V arrive in one of these forms:

* separate: query (batch, seq, hidden), key (batch, kv_seq, hidden), value (batch, kv_seq,
  v_hidden), the bias (hidden + hidden + v_hidden) added to each; past_key and past_value
  (batch, heads, past_seq, head_size) go before this call's keys and values;
* cross-attention from a cache: key and value already (batch, heads, kv_seq, head_size), used
  as they are (the bias is added to the query only);
* packed: query (batch, seq, heads, 3, head_size) holding Q, K and V, or query separate and
  key (batch, kv_seq, heads, 2, head_size) holding K and V.
"""

from __future__ import annotations

from mixrt.ops.attention.attention import merge_heads, split_heads
from mixrt.ops.attention.contrib_attention import (MASK_FILTER_VALUE, MICROSOFT, additive_mask,
                                                   attend, causally_hidden, check_attention_bias,
                                                   check_mask_index, dim_sum, padded_keys,
                                                   require_heads, require_rank, require_split,
                                                   with_past)
from mixrt.ops.ir.dtypes import FLOATS, compute_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, conflicting, fits, shape_text

NAME = "MultiHeadAttention"


def _packed_heads(packed, index):
    """One of the tensors in a packed (batch, seq, heads, 2 or 3, head_size) input, as
    (batch, heads, seq, head_size)."""
    return packed[:, :, :, index].transpose(0, 2, 1, 3)


def _biased_heads(x, bias, offset, num_heads):
    """A (batch, seq, hidden) projection plus its slice of the packed bias, in heads."""
    if bias is not None:
        x = x + bias[offset:offset + x.shape[-1]]
    return split_heads(x, num_heads)


def _packed_bias(bias, index, num_heads, head_size):
    """The slice of the bias for one tensor of a packed input, shaped to add to its heads."""
    if bias is None:
        return 0
    size = num_heads * head_size
    return bias[index * size:(index + 1) * size].reshape(1, num_heads, 1, head_size)


def query_key_value(query, key, value, bias, num_heads, wide):
    """Q, K and V as (batch, heads, seq, head_size) in the ``wide`` compute dtype, the bias
    added, from whichever form they arrive in (see the module docstring); and whether K
    and V came from a cache (4-D), which takes no past."""
    query = query.astype(wide, copy=False)
    bias = None if bias is None else bias.astype(wide, copy=False)
    if query.ndim == 5:
        head_size = query.shape[-1]
        return tuple(_packed_heads(query, i) + _packed_bias(bias, i, num_heads, head_size)
                     for i in range(3)) + (False,)
    q = _biased_heads(query, bias, 0, num_heads)
    key = key.astype(wide, copy=False)
    if key.ndim == 5:
        head_size = key.shape[-1]
        k, v = (_packed_heads(key, i) + _packed_bias(bias, i + 1, num_heads, head_size)
                for i in range(2))
        return q, k, v, False
    value = value.astype(wide, copy=False)
    if key.ndim == 4:
        return q, key, value, True
    hidden = query.shape[-1]
    return (q, _biased_heads(key, bias, hidden, num_heads),
            _biased_heads(value, bias, 2 * hidden, num_heads), False)


@op(NAME, since=1, domain=MICROSOFT, dtypes=FLOATS)
def multi_head_attention(xp, query, key=None, value=None, bias=None, key_padding_mask=None,
                         attention_bias=None, past_key=None, past_value=None,
                         past_sequence_length=None, cache_indirection=None, *, num_heads=None,
                         mask_filter_value=MASK_FILTER_VALUE, scale=0.0, unidirectional=0,
                         _outputs=1):
    """Multi-head attention (see the module docstring); outputs y (batch, seq, v_hidden),
    the present keys and values (batch, heads, past + kv_seq, head_size) and the scores
    softmax reads (batch, heads, seq, past + kv_seq)."""
    _refuse_unsupported(past_sequence_length, cache_indirection)
    dtype, wide = query.dtype, compute_dtype(query.dtype)
    q, k, v, from_cache = query_key_value(query, key, value, bias, num_heads, wide)
    if not from_cache:
        k, v = with_past(xp, past_key, k), with_past(xp, past_value, v)
    batch, _, q_len, _ = q.shape
    total = k.shape[2]
    past_len = 0 if past_key is None or from_cache else past_key.shape[2]
    hidden = padded_keys(xp, key_padding_mask, batch=batch, q_len=q_len, total=total,
                         past_len=past_len)
    causal = causally_hidden(xp, q_len, total, past_len) if unidirectional else None
    mask = additive_mask(xp, hidden, causal, wide, mask_filter_value)
    y, scores, _ = attend(xp, q, k, v, scale=scale, bias=attention_bias, mask=mask)
    outputs = (merge_heads(y), k, v, scores)
    return tuple(x.astype(dtype, copy=False) for x in outputs[:max(_outputs, 1)])


def _refuse_unsupported(past_sequence_length, cache_indirection) -> None:
    if past_sequence_length is not None or cache_indirection is not None:
        raise ValueError(f"{NAME}: past_sequence_length and cache_indirection (a shared "
                         "past/present buffer, beam search) are not implemented; feed "
                         "past_key and past_value of the past length")


# -- shapes -------------------------------------------------------------------------------

def _forms(query, key, value, num_heads):
    """(batch, seq, kv_seq, head_size, v_head_size, from_cache) from the inputs' shapes,
    refusing combinations that are none of the forms in the module docstring."""
    q = require_rank(NAME, "query", query, (3, 5), "(batch, seq, hidden) or packed (batch, "
                     "seq, heads, 3, head_size)")
    if q is None:
        return None
    if len(q) == 5:
        if key is not None or value is not None:
            raise ValueError(f"{NAME}: query is packed Q, K and V {shape_text(q)}; key and "
                             "value must then be absent")
        if not fits(q, (None, None, num_heads, 3, None)):
            raise ValueError(f"{NAME}: packed query has shape {shape_text(q)}; expected "
                             f"(batch, seq, {num_heads}, 3, head_size)")
        return q[0], q[1], q[1], q[4], q[4], False
    require_split(NAME, "query's hidden size", q[2], num_heads)
    head_size = q[2] // num_heads if isinstance(q[2], int) else None
    k = require_rank(NAME, "key", key, (3, 4, 5), "(batch, kv_seq, hidden), (batch, heads, "
                     "kv_seq, head_size) or packed (batch, kv_seq, heads, 2, head_size)")
    if k is None:
        if key is None:
            raise ValueError(f"{NAME}: key is missing; only a packed (batch, seq, heads, 3, "
                             "head_size) query comes without one")
        return q[0], q[1], None, head_size, None, False
    return _key_value_form(q, k, value, num_heads, head_size)


def _key_value_form(q, k, value, num_heads, head_size):
    batch = q[0]
    if len(k) == 5:
        expected = (batch, None, num_heads, 2, head_size)
        if value is not None or not fits(k, expected):
            raise ValueError(f"{NAME}: packed key has shape {shape_text(k)}; expected "
                             f"{shape_text(expected)} and no value")
        return batch, q[1], k[1], head_size, head_size, False
    v = None if value is None else value.shape
    if value is None or (v is not None and len(v) != len(k)):
        raise ValueError(f"{NAME}: value has shape {shape_text(v)}; expected {len(k)} axes, "
                         f"as key {shape_text(k)}")
    if len(k) == 4:
        expected = (batch, num_heads, None, head_size)
        if not fits(k, expected) or (v is not None and not fits(v, (batch, num_heads, k[2],
                                                                   None))):
            raise ValueError(f"{NAME}: key and value have shapes {shape_text(k)} and "
                             f"{shape_text(v)}; expected {shape_text(expected)} (batch, "
                             "heads, kv_seq, head_size), one kv_seq")
        return batch, q[1], k[2], head_size, None if v is None else v[3], True
    if conflicting(k[0], batch) or conflicting(k[2], q[2]) or \
            (v is not None and (conflicting(v[0], batch) or conflicting(v[1], k[1]))):
        raise ValueError(f"{NAME}: query, key and value have shapes {shape_text(q)}, "
                         f"{shape_text(k)}, {shape_text(v)}; expected (batch, seq, hidden), "
                         "(batch, kv_seq, hidden), (batch, kv_seq, v_hidden)")
    v_hidden = None if v is None else v[2]
    require_split(NAME, "value's hidden size", v_hidden, num_heads)
    v_size = v_hidden // num_heads if isinstance(v_hidden, int) else None
    return batch, q[1], k[1], head_size, v_size, False


@multi_head_attention.infer
def _(query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
      past_key=None, past_value=None, past_sequence_length=None, cache_indirection=None, *,
      num_heads=None, **_):
    """y (batch, seq, heads x v_head_size), the present keys and values and the scores;
    operands that fit none of the forms, or one another, are refused."""
    require_heads(NAME, num_heads)
    _refuse_unsupported(past_sequence_length, cache_indirection)
    form = _forms(query, key, value, num_heads)
    dtype = query.dtype
    if form is None:
        return [TensorType(dtype, None) for _ in range(4)]
    batch, q_len, kv_len, head_size, v_size, from_cache = form
    past_len = _check_past(past_key, past_value, batch, num_heads, head_size, v_size,
                           from_cache)
    total = dim_sum(past_len, kv_len)
    _check_bias(bias, head_size, v_size, num_heads)
    check_mask_index(NAME, "key_padding_mask", key_padding_mask, batch=batch, q_len=q_len,
                     total=total)
    check_attention_bias(NAME, attention_bias, batch=batch, heads=num_heads, q_len=q_len,
                         total=total)
    v_hidden = v_size * num_heads if isinstance(v_size, int) else None
    return [TensorType(dtype, (batch, q_len, v_hidden)),
            TensorType(dtype, (batch, num_heads, total, head_size)),
            TensorType(dtype, (batch, num_heads, total, v_size)),
            TensorType(dtype, (batch, num_heads, q_len, total))]


def _check_past(past_key, past_value, batch, heads, head_size, v_size, from_cache):
    """The past length (0 without a past); refuses a past of the wrong shape, one of the
    pair alone, or a past beside keys and values that come from a cache."""
    if past_key is None and past_value is None:
        return 0
    if past_key is None or past_value is None:
        raise ValueError(f"{NAME}: past_key and past_value come together; got only one")
    if from_cache:
        raise ValueError(f"{NAME}: key and value are (batch, heads, kv_seq, head_size) "
                         "already; past_key and past_value cannot be added to them")
    pk, pv = past_key.shape, past_value.shape
    if pk is None or pv is None:
        return None
    for name, shape, size in (("past_key", pk, head_size), ("past_value", pv, v_size)):
        if not fits(shape, (batch, heads, pk[2] if len(pk) == 4 else None, size)):
            raise ValueError(f"{NAME}: {name} has shape {shape_text(shape)}; expected "
                             f"({batch}, {heads}, past_seq, {size}), past_seq one for both")
    return pk[2]


def _check_bias(bias, head_size, v_size, heads):
    if bias is None or bias.shape is None:
        return
    sizes = [s * heads if isinstance(s, int) else None for s in (head_size, head_size, v_size)]
    expected = (dim_sum(*sizes),)
    if not fits(bias.shape, expected):
        raise ValueError(f"{NAME}: bias has shape {shape_text(bias.shape)}; expected "
                         f"{shape_text(expected)}, Q's, K's and V's hidden sizes")


__all__ = ["multi_head_attention", "query_key_value"]
