"""``mixrt::FusedAttention``: a transformer's self-attention between its dense layers, as the
optimizer finds it in exported models (``runtime/passes/fuse_attention.py``, opt_level 2).

The node stands for this exact composition of ONNX ops, which the exporter writes back out
(``exporters/decompose.py``)::

    Qh = Transpose(Q, perm=[0, 2, 1, 3])      Q, V: (batch, seq, heads, size)
    Kt = Transpose(K, perm=[0, 2, 3, 1])      K:    (batch, keys, heads, size)
    Vh = Transpose(V, perm=[0, 2, 1, 3])
    P = Softmax(MatMul(Qh, Kt) * scale [+ mask], axis=-1)
    P = Where(IsNaN(P), 0, P)                 only with nan_to_zero=1
    Y = Transpose(MatMul(P, Vh), perm=[0, 2, 1, 3])

``heads_first`` ([q, k, v], each 0 or 1; all 0 by default) says which inputs already come
heads first, (batch, heads, seq, size), as PyTorch's ``scaled_dot_product_attention`` takes
them: such a Q or V is used as it is (no transpose), such a K is transposed by [0, 1, 3, 2].
``nan_to_zero`` is that function's guard as its exporters write it: a row of probabilities
that is not a number (every key masked with -inf) weighs nothing instead. ``kv_repeat``
(grouped-query attention, K and V heads first) serves each head of K and V to that many
consecutive query heads, as Llama's ``repeat_kv`` spells it before the products::

    K = Reshape(Expand(Unsqueeze(K, [2]), (b, kv_heads, kv_repeat, s, d)),
                (b, kv_heads * kv_repeat, s, d))      the same for V

The generic kernel runs that composition, with broadcasting, exactly as the unfused nodes would,
on any device. On the CPU (``ops/attention/attention_cpu.py``, registered with ``.fast("cpu")``)
the heads are computed in one compiled pass (``ops/panels/_jit_attention.py``) that reads Q, K
and V where the dense layers wrote them and writes Y in place: the four transposes the graph
spells out are never copied, and the scores never leave L1. Anything that kernel does not take
(other dtypes, a mask that would widen the scores, shapes that do not line up, no AVX-512) runs
the composition.
"""

from __future__ import annotations

from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.nn.fused import _into
from mixrt.ops.nn.nn import matmul_shape, softmax
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, broadcast_or_none

QUERY_PERM = (0, 2, 1, 3)
KEY_PERM = (0, 2, 3, 1)
# K already heads first: its last two axes swapped
HEADS_FIRST_KEY_PERM = (0, 1, 3, 2)
SEQUENCE_FIRST = (0, 0, 0)


def input_perms(heads_first) -> tuple:
    """The transposes that bring (Q, K, V) to the products' layouts (None: as it is)."""
    q, k, v = _flags(heads_first)
    return (None if q else QUERY_PERM, HEADS_FIRST_KEY_PERM if k else KEY_PERM,
            None if v else QUERY_PERM)


def _flags(heads_first) -> tuple:
    flags = SEQUENCE_FIRST if heads_first is None else tuple(int(f) for f in heads_first)
    if len(flags) != 3 or any(f not in (0, 1) for f in flags):
        raise ValueError(f"FusedAttention's heads_first is [q, k, v] of 0 or 1, got "
                         f"{list(heads_first)}")
    return flags


def _permuted(xp, x, perm):
    return x if perm is None else xp.transpose(x, perm)


def kv_repeat_of(heads_first, kv_repeat) -> int:
    """``kv_repeat`` checked: at least 1, and above 1 only with K and V heads first."""
    repeat = int(kv_repeat)
    if repeat < 1 or repeat > 1 and _flags(heads_first)[1:] != (1, 1):
        raise ValueError(f"FusedAttention's kv_repeat is {repeat}; expected 1, or more with "
                         f"K and V heads first (heads_first [q, 1, 1])")
    return repeat


def repeated_heads(xp, x, repeat: int):
    """A heads-first K or V with each head repeated ``repeat`` times in a row."""
    return x if repeat == 1 else xp.repeat(x, repeat, axis=1)


@op("FusedAttention", since=1, domain=MIXRT, dtypes=FUSED_DTYPES)
def fused_attention(xp, Q, K, V, mask=None, *, scale=1.0, heads_first=None, nan_to_zero=0,
                    kv_repeat=1, out=None):
    """softmax(Q K^T * scale + mask) V per head; Y in (batch, seq, heads, size) layout."""
    q_perm, k_perm, v_perm = input_perms(heads_first)
    repeat = kv_repeat_of(heads_first, kv_repeat)
    K, V = repeated_heads(xp, K, repeat), repeated_heads(xp, V, repeat)
    scores = xp.matmul(_permuted(xp, Q, q_perm), xp.transpose(K, k_perm))
    if scale != 1.0:
        scores = scores * scores.dtype.type(scale)
    if mask is not None:
        scores = scores + mask
    probabilities = softmax(xp, scores, axis=-1)
    if nan_to_zero:
        probabilities = xp.where(xp.isnan(probabilities), probabilities.dtype.type(0),
                                 probabilities)
    result = xp.transpose(xp.matmul(probabilities, _permuted(xp, V, v_perm)), QUERY_PERM)
    return _into(xp, result, out)


@fused_attention.infer
def _(Q, K, V, mask=None, *, heads_first=None, kv_repeat=1, **_):
    repeat = kv_repeat_of(heads_first, kv_repeat)

    def permuted(value_type, perm, grouped=False):
        shape = value_type.shape
        if shape is None or len(shape) != 4:
            return None
        if grouped and repeat > 1:
            heads = shape[1] * repeat if isinstance(shape[1], int) else None
            shape = (shape[0], heads, *shape[2:])
        return tuple(shape) if perm is None else tuple(shape[i] for i in perm)
    q_perm, k_perm, v_perm = input_perms(heads_first)
    scores = matmul_shape(permuted(Q, q_perm), permuted(K, k_perm, True))
    if scores is not None and mask is not None:
        scores = broadcast_or_none(scores, mask.shape) if mask.shape is not None else None
    shape = matmul_shape(scores, permuted(V, v_perm, True))
    return [TensorType(Q.dtype, None if shape is None else tuple(shape[i] for i in QUERY_PERM))]


__all__ = ["fused_attention", "input_perms", "kv_repeat_of", "repeated_heads", "MIXRT",
           "QUERY_PERM", "KEY_PERM",
           "HEADS_FIRST_KEY_PERM"]
