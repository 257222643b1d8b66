"""Attention relatives that carry a recurrent state: LinearAttention and CausalConvWithState
(both opset 27). Imported by ``attention.py`` so that its registrations happen."""

from __future__ import annotations

import math


from mixrt.ops.ir.dtypes import accumulation_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, conflicting, fits, shape_text

NARROW_FLOATS = frozenset({"float32", "float16", "bfloat16"})
UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


# -- LinearAttention --------------------------------------------------------------------

def per_head(x, batch, steps, heads):
    """(batch, steps, heads*d) -> (batch, steps, heads, d); a per-head scalar becomes d=1."""
    return x.reshape(batch, steps, heads, -1)


@op("LinearAttention", since=27, dtypes=NARROW_FLOATS)
def linear_attention(xp, query, key, value, past_state=None, decay=None, beta=None, *,
                     chunk_size=64, kv_num_heads=None, q_num_heads=None, scale=0.0,
                     update_rule="gated_delta"):
    """The recurrence computed a chunk of tokens at a time (see ``_chunk``), which gives
    the token-by-token result up to rounding."""
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
    # (batch, heads, steps, size): each kv head's tokens as the rows of a matrix; query
    # heads are grouped contiguously over kv heads (head h reads state h // group).
    k = per_head(key.astype(wide), batch, steps, kv_num_heads).transpose(0, 2, 1, 3)
    v = per_head(value.astype(wide), batch, steps, kv_num_heads).transpose(0, 2, 1, 3)
    d_k, d_v = k.shape[-1], v.shape[-1]
    q = query.astype(wide).reshape(batch, steps, kv_num_heads, group, d_k)
    q = q.transpose(0, 2, 3, 1, 4)  # (batch, heads, group, steps, d_k)
    g = b = None
    if update_rule in ("gated", "gated_delta"):
        g = per_head(decay.astype(wide), batch, steps, kv_num_heads).transpose(0, 2, 1, 3)
    if update_rule in ("delta", "gated_delta"):
        b = beta.astype(wide).reshape(batch, steps, -1, 1).transpose(0, 2, 1, 3)
    if past_state is None:
        state = xp.zeros((batch, kv_num_heads, d_k, d_v), dtype=wide)
    else:
        state = past_state.astype(wide)
    # A decay per key channel needs a (C, C, d_k) table of decays per chunk: smaller chunks.
    size = max(1, int(chunk_size or 64))
    if g is not None and g.shape[-1] > 1:
        size = min(size, PER_KEY_CHUNK)
    output = xp.empty((batch, kv_num_heads, group, steps, d_v), dtype=wide)
    for first in range(0, steps, size):
        end = min(steps, first + size)
        state, output[:, :, :, first:end] = _chunk(
            xp, state, q[:, :, :, first:end], k[:, :, first:end], v[:, :, first:end],
            None if g is None else g[:, :, first:end], None if b is None else b[:, :, first:end])
    output = output * wide.type(scale or 1.0 / math.sqrt(d_k))
    output = output.transpose(0, 3, 1, 2, 4).reshape(batch, steps, q_num_heads * d_v)
    state_dtype = query.dtype if past_state is None else past_state.dtype
    return output.astype(query.dtype), state.astype(state_dtype)


PER_KEY_CHUNK = 8


def _chunk(xp, state, q, k, v, g, b):
    """C tokens of the recurrence at once, per (batch, kv head); q (group, C, d_k), k
    (C, d_k), v (C, d_v), g (C, d_k or 1) log decays, b (C, 1) betas, state (d_k, d_v).
    Returns the state after the chunk and the unscaled outputs q_t^T S_t.

    With G_t the running sum of g from the chunk's start and Gamma_t = exp(G_t), token t
    writes u_t (v_t, or under the delta rule beta_t (v_t - read_t)) and
        S_t = Gamma_t S_0 + sum_{s <= t} (Gamma_t / Gamma_s) k_s u_s^T
    (a decay per key channel is a diagonal Gamma). The delta rule's reads depend on the
    earlier writes, which makes U one unit lower-triangular solve:
        (I + A) U = beta (V - (Gamma k) S_0),  A[t, s] = beta_t (Gamma_t/Gamma_s) k_t . k_s
    for s < t. Only ratios Gamma_t / Gamma_s with s <= t are formed, as exp(G_t - G_s) <= 1
    for decays <= 0, so long chunks of strong decay neither overflow nor cancel."""
    steps = k.shape[-2]
    causal = xp.tril(xp.ones((steps, steps), dtype=bool))
    if g is None:
        ratio = causal.astype(k.dtype)[..., None]  # (C, C, 1): 1 where s <= t
        gamma = last = tail = None
    else:
        running = xp.cumsum(g, axis=-2)  # G_t: (..., C, d_k or 1)
        spread = running[..., :, None, :] - running[..., None, :, :]
        ratio = xp.exp(xp.where(causal[..., None], spread, -xp.inf))  # (..., C, C, d_k|1)
        gamma = xp.exp(running)
        last = xp.exp(running[..., -1, :])  # Gamma_C: (..., d_k or 1)
        tail = xp.exp(running[..., -1:, :] - running)  # Gamma_C / Gamma_s
    key_products = _decayed_products(xp, k, k, ratio)  # (..., C, C)
    query_products = _decayed_products(xp, q, k[..., None, :, :], ratio[..., None, :, :, :])
    decayed_q = q if gamma is None else q * gamma[..., None, :, :]
    if b is None:
        written = v
    else:
        decayed_k = k if gamma is None else k * gamma
        strict = xp.tril(xp.ones((steps, steps), dtype=bool), -1)
        system = xp.eye(steps, dtype=k.dtype) + xp.where(strict, b * key_products, 0)
        written = xp.linalg.solve(system, b * (v - decayed_k @ state))
    out = decayed_q @ state[..., None, :, :] + query_products @ written[..., None, :, :]
    if gamma is None:
        new_state = state + k.swapaxes(-1, -2) @ written
    else:
        new_state = last[..., :, None] * state + (k * tail).swapaxes(-1, -2) @ written
    return new_state, out


def _decayed_products(xp, a, k, ratio):
    """sum_c a_t[c] k_s[c] (Gamma_t / Gamma_s)[c] for s <= t, 0 above: a product of the
    rows when the decay is per head (one factor), a sum over channels when per key."""
    if ratio.shape[-1] == 1:
        return (a @ k.swapaxes(-1, -2)) * ratio[..., 0]
    return (a[..., :, None, :] * k[..., None, :, :] * ratio).sum(axis=-1)


def _shape_of(value_type):
    return None if value_type is None else value_type.shape


def _refuse(op_type, name, shape, expected, axes):
    raise ValueError(f"{op_type}: {name} has shape {shape_text(shape)}; expected "
                     f"{expected} ({axes})")


def _check_linear_attention(query, key, value, past_state, decay, beta, q_heads, kv_heads):
    """Refuses (ValueError, naming the operand) shapes that do not fit one another: query
    (B, T, Hq x dk), key (B, T, Hkv x dk), value (B, T, Hkv x dv), past_state (B, Hkv, dk,
    dv), decay (B, T, Hkv or Hkv x dk), beta (B, T, Hkv or 1)."""
    q, k, v = query, key, value
    if q is None or k is None or v is None or not q_heads or not kv_heads:
        return
    axes = "batch, steps, heads x size"
    for name, shape in (("query", q), ("key", k), ("value", v)):
        if len(shape) != 3 or conflicting(shape[0], q[0]) or conflicting(shape[1], q[1]):
            _refuse("LinearAttention", name, shape, f"3 axes, batch and steps as the query "
                    f"{shape_text(q)}'s", axes)
    for name, shape, heads in (("query", q, q_heads), ("key", k, kv_heads),
                               ("value", v, kv_heads)):
        if isinstance(shape[2], int) and shape[2] % heads:
            _refuse("LinearAttention", name, shape, f"a last axis that splits into {heads} "
                    "heads", axes)
    d_k = k[2] // kv_heads if isinstance(k[2], int) else None
    d_v = v[2] // kv_heads if isinstance(v[2], int) else None
    if q_heads % kv_heads or conflicting(q[2], None if d_k is None else q_heads * d_k):
        _refuse("LinearAttention", "query", q, f"q_num_heads={q_heads} heads of the key's "
                f"size {d_k}, a multiple of kv_num_heads={kv_heads}", axes)
    state = (q[0], kv_heads, d_k, d_v)
    if past_state is not None and not fits(past_state, state):
        _refuse("LinearAttention", "past_state", past_state, shape_text(state),
                "batch, kv heads, key size, value size")
    for name, shape, lasts in (("decay", decay, (kv_heads, None if d_k is None else
                                                 kv_heads * d_k)),
                               ("beta", beta, (kv_heads, 1))):
        if shape is None:
            continue
        if len(shape) != 3 or conflicting(shape[0], q[0]) or conflicting(shape[1], q[1]) or (
                isinstance(shape[2], int) and None not in lasts and shape[2] not in lasts):
            _refuse("LinearAttention", name, shape, f"(batch {q[0]}, steps {q[1]}, "
                    f"{' or '.join(str(n) for n in lasts if n is not None)})",
                    "batch, steps, per head or per key channel")


@linear_attention.infer
def _(query, key, value, past_state=None, decay=None, beta=None, *, kv_num_heads=None,
      q_num_heads=None, **_):
    _check_linear_attention(*(_shape_of(t) for t in (query, key, value, past_state, decay,
                                                     beta)), q_num_heads, kv_num_heads)
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
    x, w = input.shape, weight.shape
    if x is not None and len(x) != 3:
        _refuse("CausalConvWithState", "input", x, "3 axes", "batch, channels, length")
    if x is not None and w is not None:
        taps = w[-1]
        channels = x[1]
        if len(w) not in (2, 3) or conflicting(w[0], channels) \
                or (len(w) == 3 and conflicting(w[1], 1)):
            _refuse("CausalConvWithState", "weight", w,
                    f"({channels}, 1, k) or ({channels}, k)",
                    "one filter per channel of the input " + shape_text(x))
        operands = (("bias", _shape_of(bias), (channels,), "one per channel"),
                    ("past_state", _shape_of(past_state),
                     (x[0], channels, taps - 1 if isinstance(taps, int) else None),
                     "batch, channels, k - 1"))
        for name, shape, want, axes in operands:
            if shape is not None and not fits(shape, want):
                _refuse("CausalConvWithState", name, shape, shape_text(want), axes)
    state_shape = None
    if input.shape is not None and weight.shape is not None:
        taps = weight.shape[-1]
        state_shape = input.shape[:2] + (taps - 1 if isinstance(taps, int) else None,)
    return [TensorType(input.dtype, input.shape), TensorType(input.dtype, state_shape)]
