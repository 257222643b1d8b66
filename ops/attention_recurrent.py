"""Attention relatives that carry a recurrent state: LinearAttention and CausalConvWithState
(both opset 27). Imported by ``attention.py`` so that its registrations happen."""

from __future__ import annotations

import math


from mixrt.ops.dtypes import accumulation_dtype
from mixrt.ops.registry import op
from mixrt.ops.types import TensorType

NARROW_FLOATS = frozenset({"float32", "float16", "bfloat16"})
UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


# -- LinearAttention --------------------------------------------------------------------

def per_head(x, batch, steps, heads):
    """(batch, steps, heads*d) -> (batch, steps, heads, d); a per-head scalar becomes d=1."""
    return x.reshape(batch, steps, heads, -1)


def linear_attention_step(xp, state, k, v, decay, beta, rule):
    """One token of the recurrence; state (b, h, dk, dv), k (b, h, dk), v (b, h, dv),
    decay (b, h, dk or 1) in log space, beta (b, h or 1, 1)."""
    if rule in ("gated", "gated_delta"):
        state = xp.exp(decay)[..., None] * state
    if rule in ("delta", "gated_delta"):
        # Delta rule: write only the part of v the state does not already predict from k.
        predicted = xp.einsum("bhkv,bhk->bhv", state, k)
        v = beta * (v - predicted)
    return state + k[..., :, None] * v[..., None, :]


@op("LinearAttention", since=27, dtypes=NARROW_FLOATS)
def linear_attention(xp, query, key, value, past_state=None, decay=None, beta=None, *,
                     chunk_size=64, kv_num_heads=None, q_num_heads=None, scale=0.0,
                     update_rule="gated_delta"):
    """Token-by-token recurrence (``chunk_size`` is only a tuning hint for chunked kernels,
    which give the same result)."""
    if not q_num_heads or not kv_num_heads:
        raise ValueError("LinearAttention needs q_num_heads and kv_num_heads")
    if update_rule not in UPDATE_RULES:
        raise ValueError(f"LinearAttention update_rule must be one of {UPDATE_RULES}, "
                         f"got {update_rule!r}")
    if update_rule in ("gated", "gated_delta") and decay is None:
        raise ValueError(f"LinearAttention update_rule {update_rule!r} needs the decay input")
    if update_rule in ("delta", "gated_delta") and beta is None:
        raise ValueError(f"LinearAttention update_rule {update_rule!r} needs the beta input")
    wide = accumulation_dtype(query.dtype)
    batch, steps, _ = query.shape
    group = q_num_heads // kv_num_heads
    q = per_head(query.astype(wide), batch, steps, q_num_heads)
    k = per_head(key.astype(wide), batch, steps, kv_num_heads)
    v = per_head(value.astype(wide), batch, steps, kv_num_heads)
    d_k, d_v = k.shape[-1], v.shape[-1]
    g = None if decay is None else per_head(decay.astype(wide), batch, steps, kv_num_heads)
    b = None if beta is None else beta.astype(wide).reshape(batch, steps, -1, 1)
    if past_state is None:
        state = xp.zeros((batch, kv_num_heads, d_k, d_v), dtype=wide)
    else:
        state = past_state.astype(wide)
    scale = wide.type(scale or 1.0 / math.sqrt(d_k))

    outputs = []
    for t in range(steps):
        state = linear_attention_step(
            xp, state, k[:, t], v[:, t], None if g is None else g[:, t],
            None if b is None else b[:, t], update_rule)
        # Query heads are grouped contiguously over kv heads: head h reads state h // group.
        q_t = q[:, t].reshape(batch, kv_num_heads, group, d_k)
        outputs.append(xp.einsum("bhgk,bhkv->bhgv", q_t, state) * scale)
    output = xp.stack(outputs, axis=1).reshape(batch, steps, q_num_heads * d_v)
    state_dtype = query.dtype if past_state is None else past_state.dtype
    return output.astype(query.dtype), state.astype(state_dtype)


@linear_attention.infer
def _(query, key, value, past_state=None, decay=None, beta=None, *, kv_num_heads=None,
      q_num_heads=None, **_):
    state_dtype = query.dtype if past_state is None else past_state.dtype
    if query.shape is None or key.shape is None or value.shape is None or not kv_num_heads:
        return [TensorType(query.dtype, None), TensorType(state_dtype, None)]
    batch, steps = query.shape[:2]
    d_k, d_v = (d // kv_num_heads if isinstance(d, int) else None
                for d in (key.shape[2], value.shape[2]))
    hidden = d_v * q_num_heads if d_v is not None and q_num_heads else None
    return [TensorType(query.dtype, (batch, steps, hidden)),
            TensorType(state_dtype, (batch, kv_num_heads, d_k, d_v))]


# -- CausalConvWithState ----------------------------------------------------------------

ACTIVATIONS = ("none", "silu", "swish")


@op("CausalConvWithState", since=27, dtypes=NARROW_FLOATS)
def causal_conv_with_state(xp, input, weight, bias=None, past_state=None, *,
                           activation="none"):
    """Depthwise causal conv over (batch, channels, length): each output sees the current
    and the k-1 previous positions, the first of which come from ``past_state`` (or zeros).
    The last k-1 positions of that padded sequence are the next call's state."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"CausalConvWithState activation must be one of {ACTIVATIONS}, "
                         f"got {activation!r}")
    wide = accumulation_dtype(input.dtype)
    batch, channels, length = input.shape
    taps = weight.shape[-1]
    if past_state is None:
        past = xp.zeros((batch, channels, taps - 1), dtype=wide)
    else:
        past = past_state.astype(wide)
    padded = xp.concatenate([past, input.astype(wide)], axis=-1)
    w = weight.astype(wide).reshape(channels, taps)
    out = xp.zeros((batch, channels, length), dtype=wide)
    for tap in range(taps):
        out = out + w[:, tap, None] * padded[:, :, tap:tap + length]
    if bias is not None:
        out = out + bias.astype(wide)[:, None]
    if activation != "none":
        out = out / (1 + xp.exp(-out))
    present = padded[:, :, padded.shape[-1] - (taps - 1):]
    return out.astype(input.dtype), present.astype(input.dtype)


@causal_conv_with_state.infer
def _(input, weight, bias=None, past_state=None, **_):
    state_shape = None
    if input.shape is not None and weight.shape is not None:
        taps = weight.shape[-1]
        state_shape = input.shape[:2] + (taps - 1 if isinstance(taps, int) else None,)
    return [TensorType(input.dtype, input.shape), TensorType(input.dtype, state_shape)]
