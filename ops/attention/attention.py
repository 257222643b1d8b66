"""Attention operators: Attention (23/24/25), RotaryEmbedding, SwiGLU and the preview
FlexAttention.

Attention is written as one pipeline (scores -> softcap -> bias -> softmax -> P @ V) over 4D
``(batch, heads, seq, head_size)`` tensors; 3D inputs are unpacked into heads first and packed
again at the end. The per-version functions only fix which inputs and attributes a version
has. The recurrent relatives (LinearAttention, CausalConvWithState) live in
``attention_recurrent.py``.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS, compute_dtype, to_numpy_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, broadcast_shapes, conflicting, fits, \
    same_as_input, shape_text


# -- layout helpers -----------------------------------------------------------------------

def split_heads(x, num_heads):
    """(batch, seq, heads*size) -> (batch, heads, seq, size); 4D passes through."""
    if x.ndim == 4:
        return x
    if not num_heads:
        raise ValueError("3D attention inputs need q_num_heads and kv_num_heads")
    batch, seq, hidden = x.shape
    return x.reshape(batch, seq, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(batch, heads, seq, size) -> (batch, seq, heads*size)."""
    batch, heads, seq, size = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, seq, heads * size)


def repeat_kv_heads(xp, x, q_heads):
    """Grouped-query attention: query head h reads kv head h // (q_heads / kv_heads)."""
    kv_heads = x.shape[1]
    if kv_heads == q_heads:
        return x
    if q_heads % kv_heads:
        raise ValueError(f"q_num_heads ({q_heads}) must be a multiple of kv_num_heads "
                         f"({kv_heads})")
    return xp.repeat(x, q_heads // kv_heads, axis=1)


def product(xp, a, b, dtype):
    """``a @ b`` rounded to ``dtype`` once, as the spec's reference computes it: narrow floats
    multiply in float32 (NumPy's float16 matmul accumulates in float32, and CuPy has no
    bfloat16 matmul at all), and every stage of the pipeline stays in the input type."""
    wide = compute_dtype(dtype)
    return xp.matmul(a.astype(wide, copy=False), b.astype(wide, copy=False)).astype(
        dtype, copy=False)


def softmax_last(xp, x):
    """Softmax over the last axis. A row with no finite score (every key masked) is a
    zero row rather than 0/0: the spec's fully-masked-row guard."""
    top = xp.max(x, axis=-1, keepdims=True)
    top = xp.where(top > -np.inf, top, xp.zeros_like(top))
    e = xp.exp(x - top)
    total = xp.sum(e, axis=-1, keepdims=True)
    return e / xp.where(total > 0, total, xp.ones_like(total))


# -- the mask ---------------------------------------------------------------------------

def pad_last_axis(xp, mask, total, fill):
    """A mask whose key axis is shorter than the total sequence is padded with ``fill``."""
    short = total - mask.shape[-1]
    if short <= 0:
        return mask
    pad = xp.full(mask.shape[:-1] + (short,), fill, dtype=mask.dtype)
    return xp.concatenate([mask, pad], axis=-1)


def structural_mask(xp, q_len, total, *, is_causal, past_len, nonpad,
                    left_window, right_window):
    """Keys each query may see from causality, the window and kv padding, as a boolean
    (batch or 1, 1, q_len, total) array, or None when nothing is masked.

    Queries sit at absolute positions ``offset + i``: offset is the past length for an
    internal cache, ``nonpad - q_len`` per batch for an external one, else 0.
    """
    if not (is_causal or nonpad is not None or left_window >= 0 or right_window >= 0):
        return None
    keys = xp.arange(total).reshape(1, 1, 1, total)
    query = xp.arange(q_len).reshape(1, 1, q_len, 1)
    if nonpad is not None and past_len == 0:
        valid = nonpad.astype(np.int64).reshape(-1, 1, 1, 1)
        position = query + (valid - q_len)
    else:
        valid = None
        position = query + past_len
    allowed = xp.ones((1, 1, q_len, total), dtype=bool)
    if valid is not None:
        allowed = allowed & (keys < valid)
    if is_causal:
        allowed = allowed & (keys <= position)
    if left_window >= 0:
        allowed = allowed & (keys >= position - left_window)
    if right_window >= 0:
        allowed = allowed & (keys <= position + right_window)
    return allowed


def attention_bias(xp, attn_mask, allowed, total, dtype):
    """The additive bias (0 / -inf from boolean constraints, plus a float mask), or None."""
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            mask = pad_last_axis(xp, attn_mask, total, False)
            allowed = mask if allowed is None else allowed & mask
        else:
            bias = pad_last_axis(xp, attn_mask.astype(dtype), total, -np.inf)
    if allowed is not None:
        neg_inf = xp.asarray(-np.inf, dtype=dtype)
        blocked = xp.where(allowed, xp.zeros((), dtype=dtype), neg_inf)
        bias = blocked if bias is None else bias + blocked
    return bias


# -- Attention --------------------------------------------------------------------------

def scaled_dot_product_attention(
        xp, Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
        is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
        scale=None, softcap=0.0, softmax_precision=None, left_window_size=-1,
        right_window_size=-1, _outputs=1):
    """The ONNX Attention computation shared by every version (see the module docstring)."""
    was_3d = Q.ndim == 3
    q = split_heads(Q, q_num_heads)
    k = split_heads(K, kv_num_heads)
    v = split_heads(V, kv_num_heads)
    past_len = 0
    if past_key is not None:
        past_len = past_key.shape[2]
        k = xp.concatenate([past_key, k], axis=2)
        v = xp.concatenate([past_value, v], axis=2)
    present_key, present_value = k, v
    heads, q_len, head_size = q.shape[1:]
    total = k.shape[2]
    dtype = Q.dtype

    if scale is None:
        scale = 1.0 / math.sqrt(head_size)
    # Scaling Q and K by sqrt(scale) each, as the spec does, keeps the product in range.
    root = dtype.type(math.sqrt(scale))
    k = repeat_kv_heads(xp, k, heads)
    v = repeat_kv_heads(xp, v, heads)
    scores = product(xp, q * root, (k * root).swapaxes(-1, -2), dtype)
    qk_output = scores
    if softcap:
        cap = dtype.type(softcap)
        scores = cap * xp.tanh(scores / cap)
    if qk_matmul_output_mode == 1:
        qk_output = scores

    allowed = structural_mask(
        xp, q_len, total, is_causal=is_causal, past_len=past_len,
        nonpad=nonpad_kv_seqlen, left_window=left_window_size, right_window=right_window_size)
    bias = attention_bias(xp, attn_mask, allowed, total, dtype)
    if bias is not None:
        scores = scores + bias
    if qk_matmul_output_mode == 2:
        qk_output = scores

    precision = to_numpy_dtype(softmax_precision) if softmax_precision else dtype
    probs = softmax_last(xp, scores.astype(precision)).astype(dtype)
    if qk_matmul_output_mode == 3:
        qk_output = probs

    y = product(xp, probs, v, dtype)
    if was_3d:
        y = merge_heads(y)
    return (y, present_key, present_value, qk_output)[:max(_outputs, 1)]


@op("Attention", since=23, dtypes=FLOATS)
def attention_23(xp, Q, K, V, attn_mask=None, past_key=None, past_value=None, *, is_causal=0,
                 kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None,
                 softcap=0.0, softmax_precision=None, _outputs=1):
    return scaled_dot_product_attention(
        xp, Q, K, V, attn_mask, past_key, past_value, is_causal=is_causal,
        kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
        qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
        softmax_precision=softmax_precision, _outputs=_outputs)


@op("Attention", since=24, dtypes=FLOATS)
def attention_24(xp, Q, K, V, attn_mask=None, past_key=None, past_value=None,
                 nonpad_kv_seqlen=None, *, is_causal=0, kv_num_heads=None, q_num_heads=None,
                 qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
                 _outputs=1):
    return scaled_dot_product_attention(
        xp, Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
        kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
        qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
        softmax_precision=softmax_precision, _outputs=_outputs)


@op("Attention", since=25, dtypes=FLOATS)
def attention_25(xp, Q, K, V, attn_mask=None, past_key=None, past_value=None,
                 nonpad_kv_seqlen=None, *, is_causal=0, kv_num_heads=None, q_num_heads=None,
                 qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
                 left_window_size=-1, right_window_size=-1, _outputs=1):
    return scaled_dot_product_attention(
        xp, Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
        kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
        qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
        softmax_precision=softmax_precision, left_window_size=left_window_size,
        right_window_size=right_window_size, _outputs=_outputs)


def _sum_dims(a, b):
    return a + b if isinstance(a, int) and isinstance(b, int) else None


def _heads_dim(hidden, num, heads):
    """``hidden * num / heads`` when all are known ints (3D head re-packing)."""
    if isinstance(hidden, int) and num and heads:
        return hidden * num // heads
    return None


def _divides(part, whole) -> bool:
    return not (isinstance(part, int) and isinstance(whole, int) and part and whole % part)


def check_attention_shapes(op_type: str, Q, K, V, past_key=None, past_value=None, *,
                           q_num_heads=None, kv_num_heads=None, attn_mask=None,
                           nonpad_kv_seqlen=None) -> None:
    """Raises a ValueError naming the first of Q, K, V, past_key, past_value, attn_mask
    (shapes; None unknown) that does not fit the others: (batch, heads, seq, head size)
    each, or 3-D (batch, seq, heads x head size) with ``q_num_heads``/``kv_num_heads``; K
    and V one sequence and one head count, which divides Q's; K's head size Q's; the mask
    broadcast to the scores (batch, heads, q seq, past + kv seq), its key axis no longer
    (a shorter one is padded); nonpad_kv_seqlen one length per batch entry."""
    if Q is None or K is None or V is None:
        return
    four = len(Q) == 4
    if len(Q) not in (3, 4):
        raise ValueError(f"{op_type}: Q has shape {shape_text(Q)}; expected 4 axes (batch, "
                         "heads, seq, head_size) or 3 (batch, seq, heads x head_size)")
    for name, shape in (("K", K), ("V", V)):
        if len(shape) != len(Q):
            raise ValueError(f"{op_type}: {name} has shape {shape_text(shape)}; expected "
                             f"{len(Q)} axes, as Q {shape_text(Q)}")
    if not four and not (q_num_heads and kv_num_heads):
        raise ValueError(f"{op_type}: 3-D inputs need q_num_heads and kv_num_heads")
    q_heads, kv_heads = (Q[1], K[1]) if four else (q_num_heads, kv_num_heads)
    q_size = Q[3] if four else (Q[2] // q_heads if isinstance(Q[2], int) else None)
    k_size = K[3] if four else (K[2] // kv_heads if isinstance(K[2], int) else None)
    seq_axis = 2 if four else 1
    problems = (
        ("K", K, conflicting(K[0], Q[0]), f"batch {K[0]}, Q's is {Q[0]}"),
        ("V", V, conflicting(V[0], Q[0]), f"batch {V[0]}, Q's is {Q[0]}"),
        ("Q", Q, not four and not _divides(q_heads, Q[2]),
         f"{Q[2]} features do not split into q_num_heads={q_heads}"),
        ("K", K, not four and not _divides(kv_heads, K[2]),
         f"{K[2]} features do not split into kv_num_heads={kv_heads}"),
        ("V", V, not four and not _divides(kv_heads, V[2]),
         f"{V[2]} features do not split into kv_num_heads={kv_heads}"),
        ("V", V, four and conflicting(V[1], K[1]), f"{V[1]} heads, K's are {K[1]}"),
        ("K", K, not _divides(kv_heads, q_heads),
         f"{kv_heads} heads do not divide Q's {q_heads}"),
        ("K", K, conflicting(k_size, q_size), f"head size {k_size}, Q's is {q_size}"),
        ("V", V, conflicting(V[seq_axis], K[seq_axis]),
         f"{V[seq_axis]} positions, K's are {K[seq_axis]}"))
    for name, shape, wrong, why in problems:
        if wrong:
            raise ValueError(f"{op_type}: {name} has shape {shape_text(shape)}: {why} (Q "
                             f"{shape_text(Q)}, K {shape_text(K)}, V {shape_text(V)})")
    v_size = V[3] if four else (V[2] // kv_heads if isinstance(V[2], int) else None)
    for name, past, size in (("past_key", past_key, k_size), ("past_value", past_value, v_size)):
        expected = (Q[0], kv_heads, None, size)
        if past is not None and not fits(past, expected):
            raise ValueError(f"{op_type}: {name} has shape {shape_text(past)}; expected "
                             f"{shape_text(expected)} (batch, kv heads, past seq, head size)")
    total = K[seq_axis] if past_key is None else _sum_dims(past_key[2], K[seq_axis])
    _check_mask(op_type, attn_mask, (Q[0], q_heads, Q[seq_axis], total))
    if nonpad_kv_seqlen is not None and (len(nonpad_kv_seqlen) != 1
                                         or conflicting(nonpad_kv_seqlen[0], Q[0])):
        raise ValueError(f"{op_type}: nonpad_kv_seqlen has shape {shape_text(nonpad_kv_seqlen)};"
                         f" expected ({Q[0]},), one length per batch entry")


def _check_mask(op_type: str, mask, scores) -> None:
    if not mask:  # absent, or a scalar (it broadcasts)
        return
    padded = tuple(mask[:-1]) + (scores[-1],)
    try:
        fits = len(mask) <= 4 and not (
            isinstance(mask[-1], int) and isinstance(scores[-1], int) and mask[-1] > scores[-1])
        fits = fits and broadcast_shapes(scores, padded) is not None
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{op_type}: attn_mask has shape {shape_text(mask)}; expected one that "
                         f"broadcasts to the scores {shape_text(scores)} (batch, q heads, q "
                         "seq, past + kv seq), its last axis no longer than theirs")


def infer_attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
      q_num_heads=None, kv_num_heads=None, **_):
    check_attention_shapes("Attention", Q.shape, K.shape, V.shape,
                           None if past_key is None else past_key.shape,
                           None if past_value is None else past_value.shape,
                           q_num_heads=q_num_heads, kv_num_heads=kv_num_heads,
                           attn_mask=None if attn_mask is None else attn_mask.shape,
                           nonpad_kv_seqlen=None if nonpad_kv_seqlen is None
                           else nonpad_kv_seqlen.shape)
    if Q.shape is None or K.shape is None or V.shape is None:
        return [TensorType(Q.dtype, None) for _ in range(4)]
    past_len = 0 if past_key is None or past_key.shape is None else past_key.shape[2]
    if len(Q.shape) == 4:
        batch, q_heads, q_len, _size = Q.shape
        kv_heads, kv_len, k_size, v_size = K.shape[1], K.shape[2], K.shape[3], V.shape[3]
        y_shape = (batch, q_heads, q_len, v_size)
    else:
        batch, q_len, _hidden = Q.shape
        q_heads, kv_heads, kv_len = q_num_heads, kv_num_heads, K.shape[1]
        k_size = _heads_dim(K.shape[2], 1, kv_heads)
        v_size = _heads_dim(V.shape[2], 1, kv_heads)
        y_shape = (batch, q_len, _heads_dim(V.shape[2], q_heads, kv_heads))
    total = _sum_dims(past_len, kv_len) if past_key is not None else kv_len
    return [TensorType(Q.dtype, y_shape),
            TensorType(K.dtype, (batch, kv_heads, total, k_size)),
            TensorType(V.dtype, (batch, kv_heads, total, v_size)),
            TensorType(Q.dtype, (batch, q_heads, q_len, total))]


for _version in (attention_23, attention_24, attention_25):
    _version.infer(infer_attention)


# -- FlexAttention (ai.onnx.preview) ----------------------------------------------------

@op("FlexAttention", since=1, domain="ai.onnx.preview", dtypes=FLOATS)
def flex_attention(xp, Q, K, V, *, prob_mod=None, scale=None, score_mod=None,
                   softmax_precision=None):
    """Attention whose scores and probabilities pass through user subgraphs. Everything
    between the two matmuls runs at ``softmax_precision`` (float32 unless inputs are
    double), which is also the element type the subgraphs see."""
    if softmax_precision:
        precision = to_numpy_dtype(softmax_precision)
    else:
        precision = np.dtype(np.float64 if Q.dtype == np.float64 else np.float32)
    heads = Q.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(Q.shape[-1])
    q = Q.astype(precision)
    k = repeat_kv_heads(xp, K.astype(precision), heads)
    v = repeat_kv_heads(xp, V.astype(precision), heads)
    scores = xp.matmul(q, k.swapaxes(-1, -2)) * precision.type(scale)
    if score_mod is not None:
        scores = score_mod(scores)[0]
    probs = softmax_last(xp, scores)
    if prob_mod is not None:
        probs = prob_mod(probs)[0]
    return xp.matmul(probs, v).astype(Q.dtype)


@flex_attention.infer
def _(Q, K, V, **_):
    if Q.shape is not None and len(Q.shape) != 4:
        raise ValueError(f"FlexAttention: Q has shape {shape_text(Q.shape)}; expected 4 axes "
                         "(batch, heads, seq, head_size)")
    check_attention_shapes("FlexAttention", Q.shape, K.shape, V.shape)
    if Q.shape is None or V.shape is None:
        return [TensorType(Q.dtype, None)]
    return [TensorType(Q.dtype, Q.shape[:3] + V.shape[3:])]


# -- RotaryEmbedding --------------------------------------------------------------------

@op("RotaryEmbedding", since=23, dtypes=frozenset({"float32", "float16", "bfloat16"}))
def rotary_embedding(xp, X, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                     num_heads=None, rotary_embedding_dim=0):
    """Rotate pairs of features by position-dependent angles. Pairs are (i, i + half) or,
    interleaved, (2i, 2i + 1); features past ``rotary_embedding_dim`` pass through."""
    if position_ids is not None:
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    # Bring x to (batch, seq, heads, size) so the (batch, seq, half) caches broadcast.
    if X.ndim == 4:
        x = X.transpose(0, 2, 1, 3)
    else:
        if not num_heads:
            raise ValueError("RotaryEmbedding with a 3D input needs the num_heads attribute")
        batch, seq, hidden = X.shape
        x = X.reshape(batch, seq, num_heads, hidden // num_heads)
    rotary = rotary_embedding_dim or x.shape[-1]
    cos, sin = cos_cache[:, :, None, :], sin_cache[:, :, None, :]
    if interleaved:
        first, second = x[..., 0:rotary:2], x[..., 1:rotary:2]
    else:
        first, second = x[..., :rotary // 2], x[..., rotary // 2:rotary]
    real = cos * first - sin * second
    imag = sin * first + cos * second
    if interleaved:
        rotated = xp.stack([real, imag], axis=-1).reshape(real.shape[:-1] + (rotary,))
    else:
        rotated = xp.concatenate([real, imag], axis=-1)
    out = xp.concatenate([rotated.astype(X.dtype), x[..., rotary:]], axis=-1)
    return out.transpose(0, 2, 1, 3) if X.ndim == 4 else out.reshape(X.shape)


@rotary_embedding.infer
def _(X, cos_cache, sin_cache, position_ids=None, *, num_heads=None, rotary_embedding_dim=0,
      **_):
    """X's type; operands whose shapes do not fit are refused: X (batch, heads, seq, size)
    or (batch, seq, heads x size) with num_heads, each cache (batch, seq, rotary / 2), or
    (positions, rotary / 2) with position_ids (batch, seq)."""
    x = X.shape
    if x is None:
        return same_as_input(X)
    if len(x) not in (3, 4) or (len(x) == 3 and not num_heads):
        raise ValueError(f"RotaryEmbedding: X has shape {shape_text(x)}; expected (batch, "
                         "heads, seq, head_size), or (batch, seq, hidden) with num_heads")
    batch, seq = x[0], (x[2] if len(x) == 4 else x[1])
    size = x[3] if len(x) == 4 else _heads_dim(x[2], 1, num_heads)
    if len(x) == 3 and not _divides(num_heads, x[2]):
        raise ValueError(f"RotaryEmbedding: X's {x[2]} features do not split into "
                         f"num_heads={num_heads}")
    rotary = rotary_embedding_dim or size
    if isinstance(rotary, int) and (rotary % 2 or (isinstance(size, int) and rotary > size)):
        raise ValueError(f"RotaryEmbedding: a rotary size of {rotary} for X {shape_text(x)}; "
                         f"expected an even number of features, at most the head size {size}")
    half = rotary // 2 if isinstance(rotary, int) else None
    by_position = position_ids is not None
    expected = (None, half) if by_position else (batch, seq, half)
    operands = [("cos_cache", cos_cache.shape, expected), ("sin_cache", sin_cache.shape, expected)]
    if by_position:
        operands.append(("position_ids", position_ids.shape, (batch, seq)))
    for name, shape, want in operands:
        # a cache of batch 1 broadcasts over X's batch, as the kernel computes it
        if shape is not None and (len(shape) != len(want) or any(
                conflicting(d, w) and not (i == 0 and d == 1 and not by_position)
                for i, (d, w) in enumerate(zip(shape, want)))):
            raise ValueError(f"RotaryEmbedding: {name} has shape {shape_text(shape)}; expected "
                             f"{shape_text(want)} for X {shape_text(x)} and a rotary size of "
                             f"{rotary}")
    return same_as_input(X)


# -- SwiGLU -----------------------------------------------------------------------------

@op("SwiGLU", since=28, dtypes=FLOATS)
def swiglu(xp, A, B, *, alpha=1.0):
    """Swish(A) * B. Narrow floats are computed in float32 and rounded once at the end."""
    wide = np.float64 if A.dtype == np.float64 else np.float32
    a, b = A.astype(wide), B.astype(wide)
    gate = a / (1 + xp.exp(-wide(alpha) * a))
    return (gate * b).astype(A.dtype)


@swiglu.infer
def _(A, B, **_):
    """Swish(A) * B, elementwise: A and B must broadcast (a ValueError otherwise)."""
    if A.shape is None or B.shape is None:
        return [TensorType(A.dtype, None)]
    return [TensorType(A.dtype, broadcast_shapes(A.shape, B.shape))]
