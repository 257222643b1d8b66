"""``mixrt::FusedAttention``: a transformer's self-attention between its dense layers, as the
optimizer finds it in exported models (``runtime/passes/fuse_attention.py``, opt_level 2).

The node stands for this exact composition of ONNX ops, which the exporter writes back out
(``exporters/decompose.py``)::

    Qt = Transpose(Q, perm=[0, 2, 1, 3])      Q, V: (batch, seq, heads, size)
    Kt = Transpose(K, perm=[0, 2, 3, 1])      K:    (batch, keys, heads, size)
    Vt = Transpose(V, perm=[0, 2, 1, 3])
    P = Softmax(MatMul(Qt, Kt) * scale [+ mask], axis=-1)
    Y = Transpose(MatMul(P, Vt), perm=[0, 2, 1, 3])

The generic kernel runs that composition, with broadcasting, exactly as the unfused nodes would,
on any device. On the CPU (``ops/attention/attention_cpu.py``, registered with ``.fast("cpu")``)
the heads are computed in one compiled pass (``ops/panels/_jit_panels.py``, its attention
section) that reads Q, K and V where the dense layers wrote them and writes Y in place: the four
transposes the graph spells out are never copied, and the scores never leave L1. Anything that
kernel does not take (other dtypes, a mask that would widen the scores, shapes that do not line
up, no AVX-512) runs the composition.
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


@op("FusedAttention", since=1, domain=MIXRT, dtypes=FUSED_DTYPES)
def fused_attention(xp, Q, K, V, mask=None, *, scale=1.0, out=None):
    """softmax(Q K^T * scale + mask) V per head, in (batch, seq, heads, size) layout."""
    scores = xp.matmul(xp.transpose(Q, QUERY_PERM), xp.transpose(K, KEY_PERM))
    if scale != 1.0:
        scores = scores * scores.dtype.type(scale)
    if mask is not None:
        scores = scores + mask
    probabilities = softmax(xp, scores, axis=-1)
    result = xp.transpose(xp.matmul(probabilities, xp.transpose(V, QUERY_PERM)), QUERY_PERM)
    return _into(xp, result, out)


@fused_attention.infer
def _(Q, K, V, mask=None, **_):
    def permuted(value_type, perm):
        shape = value_type.shape
        return None if shape is None or len(shape) != 4 else tuple(shape[i] for i in perm)
    scores = matmul_shape(permuted(Q, QUERY_PERM), permuted(K, KEY_PERM))
    if scores is not None and mask is not None:
        scores = broadcast_or_none(scores, mask.shape) if mask.shape is not None else None
    shape = matmul_shape(scores, permuted(V, QUERY_PERM))
    return [TensorType(Q.dtype, None if shape is None else tuple(shape[i] for i in QUERY_PERM))]


__all__ = ["fused_attention", "MIXRT", "QUERY_PERM", "KEY_PERM"]
