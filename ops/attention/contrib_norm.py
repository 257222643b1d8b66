"""onnxruntime's fused normalizations for transformer models: SkipLayerNormalization and
SkipSimplifiedLayerNormalization (the residual add and the normalization after it),
EmbedLayerNormalization (BERT's embeddings and their normalization) in the
``com.microsoft`` domain, and SimplifiedLayerNormalization (RMS normalization), which
onnxruntime registers in the default domain from opset 1. onnxruntime's LayerNormalization
below opset 17 is ONNX's own kernel (``ops/nn/norm.py``), registered from opset 1.

Layer normalization is ONNX LayerNormalization's kernel, called through its fast path
(:func:`~mixrt.ops.attention.contrib_transformer.run_kernel`). The statistics outputs (mean,
inv_std_var) are float32, as onnxruntime's are; the sums are computed in float32 for
half-precision inputs (float64 for float64 ones) and rounded once.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import replay
from mixrt.ops.nn import row_kernels
from mixrt.ops.attention.contrib_transformer import MICROSOFT, is_narrow, run_kernel, widened
from mixrt.ops.ir.dtypes import FLOATS, compute_dtype, to_numpy_dtype
from mixrt.ops.nn.norm import layer_normalization
from mixrt.ops.nn.nn import _trailing_axes
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, conflicting, normalize_axis, require_shape, shape_text

FLOAT32 = np.dtype(np.float32)
STASH_FLOAT32, STASH_FLOAT64 = 1, 11  # ONNX element types


# -- SkipLayerNormalization ---------------------------------------------------------------------

@op("SkipLayerNormalization", since=1, domain=MICROSOFT, dtypes=FLOATS)
def skip_layer_normalization(xp, input, skip, gamma, beta=None, bias=None, *, epsilon=1e-12,
                             _outputs=1, out=None):
    """LayerNormalization of input + skip (+ bias) over the last axis. Outputs: the
    normalized values, the mean and 1 / standard deviation (float32, the last axis kept as
    1) and the sum itself (input_skip_bias_sum, the next residual)."""
    _require_skip(input.shape, skip.shape)
    total = _sum(input, skip, bias)
    stash = STASH_FLOAT64 if total.dtype == np.float64 else STASH_FLOAT32
    y = run_kernel(xp, layer_normalization, total, *widened(gamma, beta), epsilon=epsilon,
                   stash_type=stash, out=None if is_narrow(input) else out)
    outputs = [y.astype(input.dtype, copy=False)]
    if _outputs > 1:
        mean, inv_std = _row_statistics(xp, total, epsilon)
        outputs += [mean.astype(FLOAT32, copy=False), inv_std.astype(FLOAT32, copy=False),
                    total.astype(input.dtype, copy=False)]
    return outputs[0] if _outputs == 1 else tuple(outputs[:_outputs])


@op("SkipSimplifiedLayerNormalization", since=1, domain=MICROSOFT, dtypes=FLOATS)
def skip_simplified_layer_normalization(xp, input, skip, gamma, bias=None, *, epsilon=1e-12,
                                        _outputs=1):
    """RMS normalization of input + skip (+ bias) over the last axis, scaled by gamma. The
    outputs are SkipLayerNormalization's; the mean output is zeros (nothing is centred)."""
    _require_skip(input.shape, skip.shape)
    total = _sum(input, skip, bias)
    normalized, inv_std = _rms_normalized(xp, total, (total.ndim - 1,), epsilon)
    y = (normalized * _as_dtype_of(gamma, total)).astype(input.dtype, copy=False)
    if _outputs == 1:
        return y
    mean = xp.zeros(inv_std.shape, FLOAT32)
    return (y, mean, inv_std.astype(FLOAT32, copy=False),
            total.astype(input.dtype, copy=False))[:_outputs]


def _row_statistics(xp, x, epsilon):
    """The mean and 1 / sqrt(variance + epsilon) of x over its last axis (kept as 1), in
    two passes and one temporary: SkipLayerNormalization's normalized values come from
    LayerNormalization's compiled kernel, which returns no statistics."""
    mean = xp.mean(x, axis=-1, keepdims=True)
    centered = (x - mean).reshape(-1, x.shape[-1])
    variance = xp.einsum("ij,ij->i", centered, centered).reshape(mean.shape) / x.shape[-1]
    return mean, 1.0 / xp.sqrt(variance + epsilon)


def _sum(input, skip, bias):
    """input + skip (+ bias) in the compute dtype."""
    x, s, b = widened(input, skip, bias)
    total = x + s
    if b is not None:
        total += b
    return total


def _as_dtype_of(param, x):
    """``param`` in the dtype the normalization computed ``x`` in."""
    return param.astype(x.dtype, copy=False)


def _rms_normalized(xp, x, axes, epsilon):
    """x / sqrt(mean(x^2) + epsilon) over ``axes``, and that reciprocal root."""
    inv_std = 1.0 / xp.sqrt(xp.mean(x * x, axis=axes, keepdims=True) + epsilon)
    return x * inv_std, inv_std


def _require_skip(shape, skip_shape) -> None:
    """onnxruntime's rule: input (B, S, H) or (S, H); skip of input's shape, or of its last
    two dims with a batch of 1 or none."""
    if shape is None:
        return
    if len(shape) not in (2, 3):
        raise ValueError(f"the input has shape {shape_text(shape)}; expected rank 2 or 3 "
                         f"(batch, sequence, hidden)")
    if skip_shape is None:
        return
    allowed = [tuple(shape)]
    if len(shape) == 3:
        allowed += [tuple(shape[1:]), (1,) + tuple(shape[1:])]
    if not any(len(skip_shape) == len(a) and not any(map(conflicting, skip_shape, a))
               for a in allowed):
        raise ValueError(f"skip has shape {shape_text(skip_shape)}; expected "
                         f"{' or '.join(shape_text(a) for a in allowed)}")


def _infer_skip(op_type, input: TensorType, skip: TensorType, gamma, beta, bias):
    _require_skip(input.shape, skip.shape if isinstance(skip, TensorType) else None)
    stats_shape = None
    if input.shape is not None:
        hidden = input.shape[-1]
        for name, param in (("gamma", gamma), ("beta", beta), ("bias", bias)):
            require_shape(f"{op_type}'s {name}", param, (hidden,))
        stats_shape = tuple(input.shape[:-1]) + (1,)
    same = TensorType(input.dtype, input.shape)
    stats = TensorType(FLOAT32, stats_shape)
    return [same, stats, stats, same]


@skip_layer_normalization.infer
def _(input: TensorType, skip: TensorType, gamma=None, beta=None, bias=None, **_):
    return _infer_skip("SkipLayerNormalization", input, skip, gamma, beta, bias)


@skip_simplified_layer_normalization.infer
def _(input: TensorType, skip: TensorType, gamma=None, bias=None, **_):
    return _infer_skip("SkipSimplifiedLayerNormalization", input, skip, gamma, None, bias)


# -- SimplifiedLayerNormalization ---------------------------------------------------------------

@op("SimplifiedLayerNormalization", since=1, dtypes=FLOATS)
def simplified_layer_normalization(xp, X, scale, *, axis=-1, epsilon=1e-5, stash_type=1,
                                   _outputs=1):
    """RMS normalization over the axes from ``axis`` on, computed in ``stash_type`` and
    rounded once: Y = X / sqrt(mean(X^2) + epsilon) * scale, in scale's type; the second
    output is that 1 / sqrt(...) in ``stash_type``."""
    stash = to_numpy_dtype(stash_type)
    x = X.astype(stash, copy=False)
    normalized, inv_std = _rms_normalized(xp, x, _trailing_axes(axis, X.ndim), epsilon)
    y = (normalized * _as_dtype_of(scale, normalized)).astype(scale.dtype, copy=False)
    return y if _outputs == 1 else (y, inv_std)[:_outputs]


@simplified_layer_normalization.fast("cpu")
def simplified_layer_normalization_cpu(xp, X, scale, *, axis=-1, epsilon=1e-5, stash_type=1,
                                       _outputs=1, out=None, _node=None):
    """float32 rows in one compiled loop each (``ops/nn/_jit_row_reductions.rms_norm``, the
    same order of operations; Llama's (1, 64, 256) took ~50 us in the eight NumPy passes),
    kept as the node's replay (``ops/compiled/replay.py``), else the NumPy form."""
    arrays = (X, scale, out)
    if out is not None and replay.replayed(_node, arrays):
        return out
    if out is not None and _outputs == 1 and stash_type == STASH_FLOAT32 \
            and row_kernels.layer_norm_suits(X, scale, None, out):
        again = row_kernels.rms_norm(X, scale, out, axis % X.ndim, epsilon)
        if again is not None:
            replay.record(_node, arrays, again)
            return out
    result = simplified_layer_normalization(xp, X, scale, axis=axis, epsilon=epsilon,
                                            stash_type=stash_type, _outputs=_outputs)
    if out is None or isinstance(result, tuple):
        return result
    np.copyto(out, result)
    return out


@simplified_layer_normalization.infer
def _(X: TensorType, scale: TensorType = None, *, axis=-1, stash_type=1, **_):
    stats_shape = None
    if X.shape is not None:
        start = normalize_axis(axis, len(X.shape))
        stats_shape = tuple(X.shape[:start]) + (1,) * (len(X.shape) - start)
        require_shape("SimplifiedLayerNormalization's scale", _trailing(scale, X, start),
                      tuple(X.shape[start:]))
    dtype = scale.dtype if isinstance(scale, TensorType) and scale.dtype is not None \
        else X.dtype
    return [TensorType(dtype, X.shape), TensorType(to_numpy_dtype(stash_type), stats_shape)]


def _trailing(scale, X: TensorType, start: int):
    """scale's type when it spells out every normalized dim (else None: a shorter scale
    broadcasts, as onnxruntime's does)."""
    if isinstance(scale, TensorType) and scale.shape is not None \
            and len(scale.shape) == len(X.shape) - start:
        return scale
    return None


# -- EmbedLayerNormalization --------------------------------------------------------------------

@op("EmbedLayerNormalization", since=1, domain=MICROSOFT, dtypes=frozenset({"int32"}))
def embed_layer_normalization(xp, input_ids, segment_ids=None, word_embedding=None,
                              position_embedding=None, segment_embedding=None, gamma=None,
                              beta=None, mask=None, position_ids=None, *, epsilon=1e-12,
                              mask_index_type=1, _outputs=1, out=None):
    """BERT's embedding layer: word, position (``position_ids``, else 0..S-1) and segment
    embeddings of each token summed, then LayerNormalization over the hidden axis. Outputs:
    the normalized (B, S, H), the mask index (per sequence, how many of its mask values are
    1; zeros without a mask) and the embedding sum."""
    _require_embedding_inputs(word_embedding, position_embedding, gamma, beta)
    batch, length = input_ids.shape
    total = _embedding(xp, word_embedding, input_ids, "input_ids")
    positions = xp.arange(length, dtype=np.int32) if position_ids is None \
        else xp.broadcast_to(position_ids, (batch, length))
    total += _embedding(xp, position_embedding, positions, "position_ids")
    if segment_ids is not None and segment_embedding is not None:
        total += _embedding(xp, segment_embedding, segment_ids, "segment_ids")
    y = run_kernel(xp, layer_normalization, total, *widened(gamma, beta), epsilon=epsilon,
                   out=None if is_narrow(word_embedding) else out)
    y = y.astype(word_embedding.dtype, copy=False)
    if _outputs == 1:
        return y
    if mask is None:
        mask_index = xp.zeros(batch, np.int32)
    else:
        mask_index = xp.sum(mask == 1, axis=1, dtype=np.int32)
    return (y, mask_index, total.astype(word_embedding.dtype, copy=False))[:_outputs]


def _embedding(xp, table, ids, what):
    """The rows ``ids`` of ``table`` in its compute dtype; an id outside the table is an
    error (NumPy would read a negative one from the end)."""
    rows = table.shape[0]
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        raise ValueError(f"EmbedLayerNormalization's {what} holds ids from {int(ids.min())} "
                         f"to {int(ids.max())}; its table has rows 0 to {rows - 1}")
    return xp.take(table, ids, axis=0).astype(compute_dtype(table.dtype), copy=False)


def _require_embedding_inputs(*required) -> None:
    names = ("word_embedding", "position_embedding", "gamma", "beta")
    missing = [name for name, value in zip(names, required) if value is None]
    if missing:
        raise ValueError(f"EmbedLayerNormalization needs its {', '.join(missing)} input(s)")


@embed_layer_normalization.infer
def _(input_ids: TensorType, segment_ids=None, word_embedding=None, position_embedding=None,
      segment_embedding=None, gamma=None, beta=None, mask=None, position_ids=None, **_):
    _require_embedding_inputs(word_embedding, position_embedding, gamma, beta)
    ids = input_ids.shape
    if ids is not None and len(ids) != 2:
        raise ValueError(f"EmbedLayerNormalization's input_ids has shape {shape_text(ids)}; "
                         f"expected (batch, sequence)")
    hidden = _hidden_size(word_embedding)
    for name, table in (("position_embedding", position_embedding),
                        ("segment_embedding", segment_embedding)):
        require_shape(f"EmbedLayerNormalization's {name}", table, (None, hidden))
    for name, param in (("gamma", gamma), ("beta", beta)):
        require_shape(f"EmbedLayerNormalization's {name}", param, (hidden,))
    batch, length = ids if ids is not None else (None, None)
    for name, value in (("segment_ids", segment_ids), ("mask", mask)):
        require_shape(f"EmbedLayerNormalization's {name}", value, (batch, length))
    _require_position_ids(position_ids, batch, length)
    dtype = word_embedding.dtype
    shape = None if ids is None else (batch, length, hidden)
    return [TensorType(dtype, shape),
            TensorType(np.dtype(np.int32), None if ids is None else (batch,)),
            TensorType(dtype, shape)]


def _hidden_size(word_embedding: TensorType):
    shape = word_embedding.shape
    if shape is None:
        return None
    if len(shape) != 2:
        raise ValueError(f"EmbedLayerNormalization's word_embedding has shape "
                         f"{shape_text(shape)}; expected (vocabulary, hidden)")
    return shape[1]


def _require_position_ids(position_ids, batch, length) -> None:
    """(1, S) or (B, S), as onnxruntime allows."""
    if not isinstance(position_ids, TensorType) or position_ids.shape is None:
        return
    shape = position_ids.shape
    if len(shape) != 2 or conflicting(shape[1], length) or \
            (conflicting(shape[0], batch) and conflicting(shape[0], 1)):
        raise ValueError(f"EmbedLayerNormalization's position_ids has shape "
                         f"{shape_text(shape)}; expected {shape_text((1, length))} or "
                         f"{shape_text((batch, length))}")
