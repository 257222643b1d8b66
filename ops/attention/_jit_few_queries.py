"""FusedAttention for a few queries (``ops/attention/attention_cpu.py``): a decoder's step with
a KV cache asks one query per head against every cached key. The packed-panel heads of
``ops/panels/_jit_attention.py`` pack each head's K and V into panels first, which pays over
many queries; for one it cost 44 us of a 4-head, 64-key step that this loop does in a few.

Q, K, V and the output are C-contiguous and heads first, (batch, heads, seq, size), so a
query, a key and a value row are each contiguous and the inner loops vectorize. The mask is
read at ``mask[b * strides[0] + h * strides[1] + i * strides[2] + j * strides[3]]`` (zero
strides along its broadcast axes). Only the two sums are reassociated; a NaN score still
makes its row of probabilities NaN, as the unfused Softmax does.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", fastmath={"reassoc"})
def attend(q, k, v, mask, mask_strides, has_mask, scale, repeat, nan_to_zero, out, scores):
    """``out[b, h, i] = softmax(scale * q[b, h, i] . k[b, g, :] + mask) @ v[b, g]`` with
    ``g = h // repeat`` (grouped-query attention: K and V have heads / repeat heads);
    ``scores`` a scratch of at least the key count. With ``nan_to_zero`` a row whose
    probabilities are not numbers (their sum is NaN: every key masked with -inf, or a score
    NaN or +inf) weighs nothing, as ``Where(IsNaN(P), 0, P)`` makes it: its output is 0
    (or NaN where a value is not finite, as 0 times it is)."""
    batch, heads, queries, size = q.shape
    keys, value_size = k.shape[2], v.shape[3]
    zero = q.dtype.type(0)
    for b in range(batch):
        for h in range(heads):
            keys_of, values_of = k[b, h // repeat], v[b, h // repeat]
            for i in range(queries):
                query, row = q[b, h, i], out[b, h, i]
                at = b * mask_strides[0] + h * mask_strides[1] + i * mask_strides[2]
                top = -np.inf
                for j in range(keys):
                    key = keys_of[j]
                    total = zero
                    for d in range(size):
                        total += query[d] * key[d]
                    score = total * scale
                    if has_mask:
                        score += mask[at + j * mask_strides[3]]
                    scores[j] = score
                    top = max(top, score)
                weight = zero
                for j in range(keys):
                    shifted = np.exp(scores[j] - top)
                    scores[j] = shifted
                    weight += shifted
                row[:] = zero
                if nan_to_zero and weight != weight:  # the guard's zeros still multiply V
                    for j in range(keys):
                        scores[j] = zero
                    weight = q.dtype.type(1)
                for j in range(keys):
                    p = scores[j] / weight
                    value = values_of[j]
                    for d in range(value_size):
                        row[d] += p * value[d]
