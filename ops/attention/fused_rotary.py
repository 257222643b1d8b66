"""``mixrt::FusedRotary``: rotary position embedding as Hugging Face's Llama-family models
apply it to queries and keys, found in their exports by ``runtime/passes/fuse_rotary.py``
(opt_level 2).

The node stands for this exact composition of ONNX ops, which the exporter writes back out
(``exporters/decompose.py``)::

    x1, x2 = the two halves of X's last axis
    Y = X * cos + Concat(Neg(x2), x1, axis=-1) * sin

``cos`` and ``sin`` broadcast to X (Llama's are (batch, 1, seq, size) against X's (batch,
heads, seq, size)). Exported, the rotation is five nodes (two Slices, a Neg, a Concat, then
the products and the sum), each of which costs a decoder step more to dispatch than to
compute; fused, it is one pass over X.

The generic kernel runs the composition on any device. The CPU form (below) runs one compiled
loop (``ops/attention/_jit_rotary.py``) that rounds as the composition does: each product
rounded, then their sum (no fused multiply-add), so the results are the same bits.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.ir.types import TensorType, broadcast_or_none, broadcasts_to
from mixrt.ops.nn.fused import _into

ROTARY_KERNELS = "mixrt.ops.attention._jit_rotary"


def _halves(X) -> int:
    size = X.shape[-1] if X.ndim else 0
    if X.ndim == 0 or size % 2:
        raise ValueError(f"FusedRotary rotates halves of the last axis; X has shape "
                         f"{tuple(X.shape)}, whose last axis is not of even length")
    return size // 2


@op("FusedRotary", since=1, domain=MIXRT, dtypes=FUSED_DTYPES)
def fused_rotary(xp, X, cos, sin, *, out=None):
    """X * cos + rotate_half(X) * sin, rotate_half(X) = [-x2, x1] over the last axis."""
    half = _halves(X)
    rotated = xp.concatenate([-X[..., half:], X[..., :half]], axis=-1)
    return _into(xp, X * cos + rotated * sin, out)


@fused_rotary.infer
def _(X, cos, sin, **_):
    shape = X.shape
    for other in (cos, sin):
        shape = None if shape is None or other.shape is None \
            else broadcast_or_none(shape, other.shape)
    return [TensorType(X.dtype, shape)]


# -- CPU: one compiled pass ---------------------------------------------------------------------

@fused_rotary.fast("cpu")
def fused_rotary_cpu(xp, X, cos, sin, *, out=None, _node=None):
    """The compiled loop where X, cos, sin and ``out`` share one native float dtype, cos and
    sin broadcast to X (up to rank 4) without widening it, and ``out`` is a C-contiguous
    array of X's shape that is X itself or apart from all three, kept as the node's replay
    (``ops/compiled/replay.py``: the checks were ~2 of a decoder step's ~4 us); the
    composition otherwise."""
    arrays = (X, cos, sin, out)
    if out is not None and replay.replayed(_node, arrays):
        return out
    if out is None or not _compiled_suits(X, cos, sin, out):
        return fused_rotary(xp, X, cos, sin, out=out)
    rotate, half = jit_cpu.load(ROTARY_KERNELS).rotate, X.shape[-1] // 2

    def again(X, cos, sin, out):
        rotate(_four_axes(X), _four_axes(cos), _four_axes(sin), _four_axes(out), half)
    again(X, cos, sin, out)
    replay.record(_node, arrays, again)
    return out


def _compiled_suits(X, cos, sin, out) -> bool:
    dtype, shape = X.dtype, X.shape
    if not (cos.dtype == dtype and sin.dtype == dtype and out.dtype == dtype
            and dtype in jit_cpu.NATIVE):
        return False
    if not 1 <= len(shape) <= 4 or out.shape != shape or not out.flags.c_contiguous \
            or shape[-1] % 2 or X.size == 0:
        return False
    for table in (cos, sin):
        if not broadcasts_to(table.shape, shape):
            return False
    if np.may_share_memory(out, cos) or np.may_share_memory(out, sin) or (
            np.may_share_memory(out, X) and not (out.ctypes.data == X.ctypes.data
                                                 and out.strides == X.strides)):
        return False  # in place over X is safe (each pair is read before it is written)
    return jit_cpu.enabled()


def _four_axes(array):
    """``array`` with ones in front up to rank 4 (a view: never a copy)."""
    return array if array.ndim == 4 else array.reshape((1,) * (4 - array.ndim) + array.shape)


__all__ = ["fused_rotary"]
