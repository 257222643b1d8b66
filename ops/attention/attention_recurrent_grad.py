"""Gradients of LinearAttention and CausalConvWithState (attention_recurrent.py).

* LinearAttention is a recurrence over tokens, so its gradient is backpropagation through
  time in one kernel (``LinearAttentionGrad``), as the recurrent layers' is. Keeping every
  token's (d_k x d_v) state per head would cost T times the state, gigabytes for a long
  prefill; the kernel keeps one state every ``chunk_size`` tokens (the attribute a chunked
  forward uses for its blocks) and replays each chunk forward from its checkpoint before
  walking it backwards: T / chunk_size + chunk_size states, one extra forward.
* CausalConvWithState is a depthwise convolution over the past state and the input laid end
  to end; ``CausalConvWithStateGrad`` runs the taps backwards over that padded sequence and
  splits its gradient into the input's and the past state's.

Neither backward kernel has a gradient of its own: second order through these ops is an
error naming the node. Every kernel takes ``xp`` and works on NumPy and CuPy alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mixrt.ops.attention import attention_recurrent as ar
from mixrt.ops.conv.conv_grad import forwarded, optional_input
from mixrt.ops.ir.dtypes import accumulation_dtype
from mixrt.ops.training.grad_support import MIXRT
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType

LINEAR_ATTENTION_ATTRIBUTES = ("chunk_size", "kv_num_heads", "q_num_heads", "scale",
                               "update_rule")


# -- LinearAttention ----------------------------------------------------------------------

@dataclass
class _Tokens:
    """The forward's inputs per head, in the accumulation dtype: q (b, T, H, group, d_k),
    k (b, T, H, d_k), v (b, T, H, d_v), decay (b, T, H, d_k or 1) in log space,
    beta (b, T, H or 1, 1); the update rule's unused inputs are None."""

    q: object
    k: object
    v: object
    decay: object
    beta: object
    rule: str
    scale: float

    @property
    def gated(self) -> bool:
        return self.rule in ("gated", "gated_delta")

    @property
    def delta(self) -> bool:
        return self.rule in ("delta", "gated_delta")

    def decayed(self, xp, state, t):
        """exp(g_t) * S_{t-1}, the state the token's write starts from (S' below)."""
        return xp.exp(self.decay[:, t])[..., None] * state if self.gated else state

    def written(self, xp, decayed, t):
        """What token t adds to each state row: v_t, or under the delta rule
        beta_t (v_t - S'^T k_t), with the residual v_t - S'^T k_t."""
        if not self.delta:
            return self.v[:, t], None
        residual = self.v[:, t] - xp.einsum("bhkv,bhk->bhv", decayed, self.k[:, t])
        return self.beta[:, t] * residual, residual

    def step(self, xp, state, t):
        decayed = self.decayed(xp, state, t)
        written, _ = self.written(xp, decayed, t)
        return decayed + self.k[:, t][..., :, None] * written[..., None, :]


def _tokens(query, key, value, decay, beta, *, q_num_heads, kv_num_heads, rule, scale):
    wide = accumulation_dtype(query.dtype)
    batch, steps, _ = query.shape
    group = q_num_heads // kv_num_heads
    k = ar.per_head(key.astype(wide), batch, steps, kv_num_heads)
    q = ar.per_head(query.astype(wide), batch, steps, q_num_heads)
    q = q.reshape(batch, steps, kv_num_heads, group, k.shape[-1])
    v = ar.per_head(value.astype(wide), batch, steps, kv_num_heads)
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    g = ar.per_head(decay.astype(wide), batch, steps, kv_num_heads) if gated else None
    b = beta.astype(wide).reshape(batch, steps, -1, 1) if delta else None
    return _Tokens(q, k, v, g, b, rule, float(scale or 1.0 / math.sqrt(k.shape[-1])))


@op("LinearAttentionGrad", since=1, domain=MIXRT)
def linear_attention_grad(xp, dY, d_present, query, key, value, past_state=None, decay=None,
                          beta=None, *, chunk_size=64, kv_num_heads=None, q_num_heads=None,
                          scale=0.0, update_rule="gated_delta"):
    """(dQ, dK, dV, then d past_state, d decay, d beta for those the node has) of
    LinearAttention, given the gradients of its output and present state (either None)."""
    x = _tokens(query, key, value, decay, beta, q_num_heads=q_num_heads,
                kv_num_heads=kv_num_heads, rule=update_rule, scale=scale)
    wide = x.q.dtype
    batch, steps, heads, group, d_k = x.q.shape
    d_v = x.v.shape[-1]
    start = (xp.zeros((batch, heads, d_k, d_v), dtype=wide) if past_state is None
             else past_state.astype(wide))
    d_out = None if dY is None else dY.astype(wide).reshape(batch, steps, heads, group, d_v)
    d_state = (xp.zeros_like(start) if d_present is None else d_present.astype(wide))
    grads = _Grads.zeros(xp, x)

    interval = max(1, int(chunk_size or 64))
    checkpoints = _checkpoints(xp, x, start, interval)
    for first in reversed(range(0, steps, interval)):
        states = _replay(xp, x, checkpoints[first // interval], first,
                         min(steps, first + interval))
        for t in reversed(range(first, first + len(states) - 1)):
            d_state = _token_backward(xp, x, states[t - first], states[t - first + 1], t,
                                      d_state, None if d_out is None else d_out[:, t], grads)
    result = [grads.q.reshape(query.shape).astype(query.dtype),
              grads.k.reshape(key.shape).astype(key.dtype),
              grads.v.reshape(value.shape).astype(value.dtype)]
    if past_state is not None:
        result.append(d_state.astype(past_state.dtype))
    if decay is not None:
        result.append(xp.zeros_like(decay) if grads.decay is None
                      else grads.decay.reshape(decay.shape).astype(decay.dtype))
    if beta is not None:
        result.append(xp.zeros_like(beta) if grads.beta is None
                      else grads.beta.reshape(beta.shape).astype(beta.dtype))
    return tuple(result)


@dataclass
class _Grads:
    """Per-token gradients, filled from the last token to the first."""

    q: object
    k: object
    v: object
    decay: object
    beta: object

    @classmethod
    def zeros(cls, xp, x: _Tokens) -> "_Grads":
        return cls(xp.zeros_like(x.q), xp.zeros_like(x.k), xp.zeros_like(x.v),
                   None if x.decay is None else xp.zeros_like(x.decay),
                   None if x.beta is None else xp.zeros_like(x.beta))


def _checkpoints(xp, x: _Tokens, state, interval: int) -> list:
    """The state entering tokens 0, interval, 2 * interval, ..."""
    kept = [state]
    steps = x.q.shape[1]
    for t in range(steps - 1):
        state = x.step(xp, state, t)
        if (t + 1) % interval == 0:
            kept.append(state)
    return kept


def _replay(xp, x: _Tokens, state, first: int, stop: int) -> list:
    """States entering tokens first .. stop - 1, and the one leaving stop - 1."""
    states = [state]
    for t in range(first, stop):
        states.append(x.step(xp, states[-1], t))
    return states


def _token_backward(xp, x: _Tokens, before, after, t: int, d_state, d_out, grads: _Grads):
    """Token t backwards: d_state is dL/dS_t on entry (the later tokens' share), the
    gradient of the state entering token t on exit; the token's own input gradients go
    into ``grads``. Forward: S_t = S' + k_t w^T with S' = exp(g_t) S_{t-1} and w = v_t or
    beta_t (v_t - S'^T k_t); o_t = scale * q_t^T S_t for each query head of the group."""
    k_t = x.k[:, t]
    if d_out is not None:
        d_state = d_state + x.scale * xp.einsum("bhgk,bhgv->bhkv", x.q[:, t], d_out)
        grads.q[:, t] = x.scale * xp.einsum("bhgv,bhkv->bhgk", d_out, after)
    decayed = x.decayed(xp, before, t)
    written, residual = x.written(xp, decayed, t)
    grads.k[:, t] = xp.einsum("bhkv,bhv->bhk", d_state, written)
    d_written = xp.einsum("bhkv,bhk->bhv", d_state, k_t)
    d_decayed = d_state
    if x.delta:
        d_beta = (d_written * residual).sum(axis=-1, keepdims=True)
        grads.beta[:, t] = d_beta.sum(axis=1, keepdims=True) if x.beta.shape[2] == 1 \
            else d_beta
        d_residual = x.beta[:, t] * d_written
        grads.v[:, t] = d_residual
        # residual = v_t - S'^T k_t: S' and k_t get minus its gradient through the read.
        d_decayed = d_decayed - k_t[..., :, None] * d_residual[..., None, :]
        grads.k[:, t] -= xp.einsum("bhkv,bhv->bhk", decayed, d_residual)
    else:
        grads.v[:, t] = d_written
    if not x.gated:
        return d_decayed
    # d/dg of exp(g) S_{t-1} is S' itself, summed over the d_v columns each g scales.
    d_decay = (d_decayed * decayed).sum(axis=-1)
    grads.decay[:, t] = d_decay.sum(axis=-1, keepdims=True) if x.decay.shape[-1] == 1 \
        else d_decay
    return xp.exp(x.decay[:, t])[..., None] * d_decayed


@linear_attention_grad.infer
def _(dY, d_present, query, key, value, past_state=None, decay=None, beta=None, **_):
    present = [t for t in (query, key, value, past_state, decay, beta) if t is not None]
    return [TensorType(t.dtype, t.shape) for t in present]


def _state_op_gradient(kernel: str, required: int, optional: tuple, attributes: tuple):
    """The gradient of an op with two outputs (Y and the next state): one backward node
    fed both output gradients and every input, whose outputs are the gradients of the
    ``required`` inputs, then of the optional inputs (indices ``optional``) the node has."""
    def gradient(b, node, dy):
        d_outputs = [dy[i] if i < len(dy) else None for i in range(2)]
        if all(g is None for g in d_outputs):
            return []
        inputs = list(node.inputs[:required]) + [optional_input(node, i) for i in optional]
        present = [name for name in inputs[required:] if name is not None]
        grads = b.emit(kernel, *d_outputs, *inputs, domain=MIXRT,
                       outputs=required + len(present), **forwarded(node, attributes))
        rest = iter(grads[required:])
        by_input = list(grads[:required])
        by_input += [None if name is None else next(rest) for name in inputs[required:]]
        return by_input[:len(node.inputs)]
    return gradient


ar.linear_attention.grad(_state_op_gradient("LinearAttentionGrad", 3, (3, 4, 5),
                                            LINEAR_ATTENTION_ATTRIBUTES))


# -- CausalConvWithState ------------------------------------------------------------------

@op("CausalConvWithStateGrad", since=1, domain=MIXRT)
def causal_conv_with_state_grad(xp, dY, d_present, input, weight, bias=None, past_state=None,
                                *, activation="none"):
    """(d input, d weight, then d bias and d past_state for those the node has) of
    CausalConvWithState, given the gradients of its output and present state (either
    None)."""
    wide = accumulation_dtype(input.dtype)
    batch, channels, length = input.shape
    taps = weight.shape[-1]
    past = (xp.zeros((batch, channels, taps - 1), dtype=wide) if past_state is None
            else past_state.astype(wide))
    padded = xp.concatenate([past, input.astype(wide)], axis=-1)
    w = weight.astype(wide).reshape(channels, taps)
    d_padded = xp.zeros_like(padded)
    d_w = xp.zeros_like(w)
    d_pre = None
    if dY is not None:
        d_pre = _through_activation(xp, dY.astype(wide), padded, w, bias, activation, length)
        for tap in range(taps):
            d_padded[:, :, tap:tap + length] += w[:, tap, None] * d_pre
            d_w[:, tap] = (d_pre * padded[:, :, tap:tap + length]).sum(axis=(0, 2))
    if d_present is not None and taps > 1:
        # present is the padded sequence's last taps - 1 positions.
        d_padded[:, :, padded.shape[-1] - (taps - 1):] += d_present.astype(wide)
    result = [d_padded[:, :, taps - 1:].astype(input.dtype),
              d_w.reshape(weight.shape).astype(weight.dtype)]
    if bias is not None:
        d_bias = xp.zeros(channels, dtype=wide) if d_pre is None else d_pre.sum(axis=(0, 2))
        result.append(d_bias.astype(bias.dtype))
    if past_state is not None:
        result.append(xp.ascontiguousarray(d_padded[:, :, :taps - 1]).astype(past_state.dtype))
    return tuple(result)


def _through_activation(xp, d_out, padded, w, bias, activation: str, length: int):
    """dL/d pre-activation: SiLU's derivative s (1 + pre (1 - s)) with s = sigmoid(pre),
    the convolution recomputed for it."""
    if activation == "none":
        return d_out
    pre = xp.zeros_like(d_out)
    for tap in range(w.shape[1]):
        pre = pre + w[:, tap, None] * padded[:, :, tap:tap + length]
    if bias is not None:
        pre = pre + bias.astype(pre.dtype)[:, None]
    s = 1 / (1 + xp.exp(-pre))
    return d_out * s * (1 + pre * (1 - s))


@causal_conv_with_state_grad.infer
def _(dY, d_present, input, weight, bias=None, past_state=None, **_):
    present = [t for t in (input, weight, bias, past_state) if t is not None]
    return [TensorType(t.dtype, t.shape) for t in present]


ar.causal_conv_with_state.grad(_state_op_gradient("CausalConvWithStateGrad", 2, (2, 3),
                                                   ("activation",)))
