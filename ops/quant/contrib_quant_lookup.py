"""onnxruntime's quantized table lookups (``com.microsoft``): GatherBlockQuantized, the
Gather of a block-quantized weight that ``MatMulNBitsQuantizer`` writes for embedding tables
(``op_types_to_quantize`` with Gather), and QEmbedLayerNormalization, the quantized BERT
embedding layer that ``quantize_dynamic`` writes in place of EmbedLayerNormalization.

Both dequantize only the rows they gather, as onnxruntime does, and follow its float32
arithmetic: ``float(code - zero_point) * scale`` for every value, and for the embedding layer
the sum of the three embeddings, its mean, the mean of the squared deviations and
``x / sqrt(var + epsilon) * gamma + beta``.

An index outside the table is an error here (a ValueError the session reports naming the
node); onnxruntime's GatherBlockQuantized fills such a row with zeros, which would hide a
tokenizer bug as a plausible embedding.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import FLOAT8
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, normalize_axis, require_shape, shape_text
from mixrt.ops.quant.contrib_quant import COM_MICROSOFT, F32, one_value

INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
CODE_DTYPES = frozenset({"uint8", "int4", "uint4"}) | FLOAT8


# -- GatherBlockQuantized ---------------------------------------------------------------------

@op("GatherBlockQuantized", since=1, domain=COM_MICROSOFT, dtypes=CODE_DTYPES)
def gather_block_quantized(xp, data, indices, scales, zero_points=None, *, bits=4,
                           block_size=128, gather_axis=0, quantize_axis=1, out=None):
    """Gather along ``gather_axis`` of a table quantized in blocks of ``block_size`` values
    along ``quantize_axis``; the output has the scales' dtype. uint8 data with ``bits`` 2 or
    4 holds several codes a byte along its last axis (low bits first)."""
    layout = _layout(data.dtype, data.shape, bits, block_size, gather_axis, quantize_axis)
    rows = _gathered_codes(xp, data, indices, layout)
    levels = rows.astype(F32) - _zero_levels(xp, data.dtype, zero_points, scales.shape, layout,
                                             indices)
    scale = _gathered_blocks(xp, scales, indices, layout).astype(F32)
    return (levels * scale).astype(scales.dtype, copy=False)


class _Layout:
    """Where the gather and the blocks run, in the table's logical (unpacked) shape."""

    def __init__(self, shape, codes_per_byte, block_size, gather_axis, quantize_axis):
        self.shape, self.codes_per_byte, self.block_size = shape, codes_per_byte, block_size
        self.gather_axis, self.quantize_axis = gather_axis, quantize_axis


def _layout(dtype, packed_shape, bits, block_size, gather_axis, quantize_axis) -> _Layout:
    """The attributes checked as onnxruntime checks them, and the logical table shape."""
    name = "GatherBlockQuantized"
    rank = len(packed_shape)
    gather_axis, quantize_axis = (normalize_axis(a, rank) for a in (gather_axis, quantize_axis))
    is_float8 = str(dtype) in FLOAT8
    if not (block_size >= 16 and block_size & (block_size - 1) == 0) and \
            not (is_float8 and block_size == 0):
        raise ValueError(f"{name}: block_size={block_size}; expected a power of two of at "
                         f"least 16")
    codes_per_byte = 1
    if dtype == np.uint8:
        if bits not in (2, 4, 8):
            raise ValueError(f"{name}: bits={bits} with uint8 data; expected 2, 4 or 8")
        if gather_axis != 0 or quantize_axis != rank - 1:
            raise ValueError(f"{name}: uint8 data needs gather_axis 0 and quantize_axis the "
                             f"last axis; got {gather_axis} and {quantize_axis}")
        codes_per_byte = 8 // bits
    elif not is_float8 and bits != 4:
        raise ValueError(f"{name}: bits={bits} with {dtype} data; expected 4")
    if gather_axis == quantize_axis:
        raise ValueError(f"{name}: gather_axis and quantize_axis are both {gather_axis}")
    shape = tuple(packed_shape[:-1]) + (packed_shape[-1] * codes_per_byte,)
    if block_size == 0:
        block_size = max(shape[quantize_axis], 1)
    return _Layout(shape, codes_per_byte, block_size, gather_axis, quantize_axis)


def _unpacked(xp, packed, codes_per_byte):
    """uint8 bytes holding ``codes_per_byte`` codes each, low bits first, as one code per
    element along the last axis."""
    if codes_per_byte == 1:
        return packed
    bits = 8 // codes_per_byte
    shifts = xp.arange(codes_per_byte, dtype=np.uint8) * np.uint8(bits)
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(packed.shape[:-1] + (packed.shape[-1] * codes_per_byte,))


def _checked_indices(xp, indices, length):
    if indices.dtype not in INDEX_DTYPES:
        raise ValueError(f"GatherBlockQuantized: indices are {indices.dtype}; expected int32 "
                         f"or int64")
    if indices.size and (int(indices.min()) < -length or int(indices.max()) >= length):
        raise ValueError(f"GatherBlockQuantized: indices hold {int(indices.min())} to "
                         f"{int(indices.max())}; the gathered axis has {length} entries")
    return xp.where(indices < 0, indices + length, indices)


def _gathered_codes(xp, data, indices, layout: _Layout):
    picked = _checked_indices(xp, indices, layout.shape[layout.gather_axis])
    rows = xp.take(data, picked, axis=layout.gather_axis)
    return _unpacked(xp, rows, layout.codes_per_byte)


def _per_value(xp, blocks, layout: _Layout, indices_rank: int):
    """Per-block values (already gathered) repeated over each block's values along the
    quantized axis, cut to that axis' length."""
    axis = layout.quantize_axis
    if axis > layout.gather_axis:
        axis += indices_rank - 1
    length = layout.shape[layout.quantize_axis]
    return xp.repeat(blocks, layout.block_size, axis=axis).take(xp.arange(length), axis=axis)


def _gathered_blocks(xp, per_block, indices, layout: _Layout):
    """A per-block tensor (scales, unpacked zero points) gathered like the data and spread
    over each block's values; a dim of 1 beside the quantized axis broadcasts (float8)."""
    _require_block_shape("scales", per_block.shape, layout)
    picked = xp.where(indices < 0, indices + layout.shape[layout.gather_axis], indices)
    if per_block.shape[layout.gather_axis] == 1 != layout.shape[layout.gather_axis]:
        picked = xp.zeros_like(picked)
    gathered = xp.take(per_block, picked, axis=layout.gather_axis)
    return _per_value(xp, gathered, layout, indices.ndim)


def _zero_levels(xp, dtype, zero_points, scales_shape, layout: _Layout, indices):
    """Each gathered value's zero point as float32: the given (packed like the data for
    uint8), else 2^(bits-1) for uint8 codes and 0 for 4-bit integers and float8."""
    if dtype == np.uint8 and zero_points is None:
        return F32.type(1 << (8 // layout.codes_per_byte - 1))
    if zero_points is None:
        return F32.type(0)
    if str(dtype) in FLOAT8:
        raise ValueError("GatherBlockQuantized: float8 data takes no zero_points")
    unpacked = _unpacked(xp, zero_points, layout.codes_per_byte)
    blocks = unpacked[..., :scales_shape[-1]] if layout.codes_per_byte > 1 else unpacked
    if tuple(blocks.shape) != tuple(scales_shape):
        raise ValueError(f"GatherBlockQuantized: zero_points has shape "
                         f"{shape_text(zero_points.shape)}; expected the scales' "
                         f"{shape_text(scales_shape)}"
                         + (" with codes packed along the last axis"
                            if layout.codes_per_byte > 1 else ""))
    return _gathered_blocks(xp, blocks.astype(F32), indices, layout)


def _require_block_shape(name, shape, layout: _Layout) -> None:
    """One entry per block along the quantized axis, the table's dims elsewhere (or 1)."""
    expected = list(layout.shape)
    expected[layout.quantize_axis] = -(-expected[layout.quantize_axis] // layout.block_size)
    matches = len(shape) == len(expected) and all(
        got == want or (got == 1 and axis != layout.quantize_axis)
        for axis, (got, want) in enumerate(zip(shape, expected)))
    if not matches:
        raise ValueError(f"GatherBlockQuantized: {name} has shape {shape_text(shape)}; "
                         f"expected {shape_text(tuple(expected))} (one per block of "
                         f"{layout.block_size} along axis {layout.quantize_axis})")


@gather_block_quantized.infer
def _(data: TensorType, indices: TensorType, scales: TensorType, zero_points=None, *, bits=4,
      block_size=128, gather_axis=0, quantize_axis=1, **_):
    if data.shape is None or indices.shape is None:
        return [TensorType(scales.dtype, None)]
    layout = _layout(data.dtype, data.shape, bits, block_size, gather_axis, quantize_axis)
    if scales.shape is not None and None not in scales.shape and None not in layout.shape:
        _require_block_shape("scales", tuple(scales.shape), layout)
    axis = layout.gather_axis
    shape = layout.shape[:axis] + tuple(indices.shape) + layout.shape[axis + 1:]
    return [TensorType(scales.dtype, shape)]


# -- QEmbedLayerNormalization -----------------------------------------------------------------

QEMBED_PARAMETERS = ("word_embedding", "position_embedding", "segment_embedding", "gamma",
                     "beta")


@op("QEmbedLayerNormalization", since=1, domain=COM_MICROSOFT, dtypes=frozenset({"int32"}))
def qembed_layer_normalization(xp, input_ids, segment_ids=None, word_embedding_quant=None,
                               position_embedding_quant=None, segment_embedding=None,
                               gamma_quant=None, beta_quant=None, mask=None,
                               word_embedding_scale=None, position_embedding_scale=None,
                               segment_embedding_scale=None, gamma_scale=None, beta_scale=None,
                               word_embedding_zero_point=None,
                               position_embedding_zero_point=None,
                               segment_embedding_zero_point=None, gamma_zero_point=None,
                               beta_zero_point=None, *, epsilon=1e-12, _outputs=1, out=None):
    """EmbedLayerNormalization over int8 or uint8 tables, each with one scale and zero point:
    token ``s`` of a sequence takes position row ``s``. Outputs the normalized (B, S, H)
    float32 values and the mask index (how many of each sequence's mask values are 1)."""
    tables = (word_embedding_quant, position_embedding_quant, segment_embedding, gamma_quant,
              beta_quant)
    scales = (word_embedding_scale, position_embedding_scale, segment_embedding_scale,
              gamma_scale, beta_scale)
    zero_points = (word_embedding_zero_point, position_embedding_zero_point,
                   segment_embedding_zero_point, gamma_zero_point, beta_zero_point)
    if segment_ids is None:
        tables, scales, zero_points = (_without_segment(group)
                                       for group in (tables, scales, zero_points))
    quantized = [_QuantizedTable(*entry) for entry in zip(QEMBED_PARAMETERS, tables, scales,
                                                           zero_points)]
    word, position, segment, gamma, beta = quantized
    _require_present(quantized)
    batch, length = _require_ids(input_ids)
    total = word.rows(xp, input_ids, "input_ids") \
        + position.rows(xp, xp.arange(length, dtype=np.int32), "positions")[None]
    if segment.codes is not None:
        total = total + segment.rows(xp, segment_ids, "segment_ids")
    y = _normalized(xp, total, F32.type(epsilon)) * gamma.values(xp) + beta.values(xp)
    if _outputs == 1:
        return y
    counts = xp.zeros(batch, np.int32) if mask is None \
        else xp.sum(mask == 1, axis=1, dtype=np.int32)
    return (y, counts)[:_outputs]


def _without_segment(group):
    return group[:2] + (None,) + group[3:]


class _QuantizedTable:
    """A quantized parameter with its one scale and zero point (onnxruntime takes only
    per-tensor quantization here)."""

    def __init__(self, name, codes, scale, zero_point):
        self.name, self.codes = name, codes
        if codes is None:
            return
        if scale is None or zero_point is None:
            raise ValueError(f"QEmbedLayerNormalization: {name} needs its scale and zero "
                             f"point inputs")
        if codes.dtype not in (np.int8, np.uint8) or zero_point.dtype != codes.dtype:
            raise ValueError(f"QEmbedLayerNormalization: {name} is {codes.dtype} with a "
                             f"{zero_point.dtype} zero point; expected int8 or uint8 for both")
        op_type = "QEmbedLayerNormalization"
        self.scale = one_value(op_type, f"{name}_scale", scale).astype(F32)
        self.zero = one_value(op_type, f"{name}_zero_point", zero_point).astype(np.int32)

    def dequantized(self, codes):
        return (codes.astype(np.int32) - self.zero).astype(F32) * self.scale

    def values(self, xp):
        return self.dequantized(self.codes)

    def rows(self, xp, ids, what):
        """The dequantized rows ``ids`` (an id outside the table is an error, as it is for
        onnxruntime)."""
        count = self.codes.shape[0]
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= count):
            raise ValueError(f"QEmbedLayerNormalization's {what} hold ids from "
                             f"{int(ids.min())} to {int(ids.max())}; {self.name} has rows 0 "
                             f"to {count - 1}")
        return self.dequantized(xp.take(self.codes, ids, axis=0))


def _require_present(quantized) -> None:
    missing = [table.name for table in quantized
               if table.codes is None and table.name != "segment_embedding"]
    if missing:
        raise ValueError(f"QEmbedLayerNormalization needs its {', '.join(missing)} input(s)")


def _require_ids(input_ids):
    if input_ids.ndim != 2:
        raise ValueError(f"QEmbedLayerNormalization's input_ids has shape "
                         f"{shape_text(input_ids.shape)}; expected (batch, sequence)")
    return input_ids.shape


def _normalized(xp, x, epsilon):
    """onnxruntime's float32 steps: the mean, the deviations, their mean square, and each
    deviation divided by sqrt(mean square + epsilon). Its sums run left to right, one
    rounding per term; a cumulative sum's last entry is that order (NumPy's pairwise sum
    is not, and an output one ulp off moves a DynamicQuantizeLinear code after it)."""
    hidden = F32.type(x.shape[-1])
    deviation = x - _sequential_sum(xp, x) / hidden
    spread = xp.sqrt(_sequential_sum(xp, deviation * deviation) / hidden + epsilon)
    return deviation / spread


def _sequential_sum(xp, x):
    return xp.cumsum(x, axis=-1, dtype=F32)[..., -1:]


@qembed_layer_normalization.infer
def _(input_ids: TensorType, segment_ids=None, word_embedding_quant=None,
      position_embedding_quant=None, segment_embedding=None, gamma_quant=None, beta_quant=None,
      mask=None, *rest, **_):
    ids = input_ids.shape
    if ids is not None and len(ids) != 2:
        raise ValueError(f"QEmbedLayerNormalization's input_ids has shape {shape_text(ids)}; "
                         f"expected (batch, sequence)")
    word = word_embedding_quant.shape if isinstance(word_embedding_quant, TensorType) else None
    hidden = word[1] if word is not None and len(word) == 2 else None
    for name, table in (("position_embedding", position_embedding_quant),
                        ("segment_embedding", segment_embedding)):
        require_shape(f"QEmbedLayerNormalization's {name}", table, (None, hidden))
    for name, param in (("gamma", gamma_quant), ("beta", beta_quant)):
        require_shape(f"QEmbedLayerNormalization's {name}", param, (hidden,))
    batch, length = ids if ids is not None else (None, None)
    for name, value in (("segment_ids", segment_ids), ("mask", mask)):
        require_shape(f"QEmbedLayerNormalization's {name}", value, (batch, length))
    shape = None if ids is None else (batch, length, hidden)
    return [TensorType(F32, shape),
            TensorType(np.dtype(np.int32), None if ids is None else (batch,))]
