"""onnxruntime's QAttention (``com.microsoft``): the BERT ``Attention`` of
``contrib_attention.py`` with a quantized input and packed Q/K/V weight.

onnxruntime's dynamic quantizer writes it for the Attention its transformer optimizer fuses.
The projection is MatMulIntegerToFloat's (the exact integer product, converted to float32,
times ``input_scale * weight_scale`` per column, plus the float bias); what follows is the
float Attention's own pipeline: heads split, past keys and values in front, onnxruntime's
mask forms and causal rule, softmax, heads merged.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.attention.attention import merge_heads, split_heads
from mixrt.ops.attention.contrib_attention import (MASK_FILTER_VALUE, additive_mask, attend,
                                         causally_hidden, padded_keys, with_past)
from mixrt.ops.quant.contrib_quant import COM_MICROSOFT, INT8S, require_dtype, require_per_tensor
from mixrt.ops.quant.contrib_quant_matmul import device_product_to_float, require_per_column
from mixrt.ops.ir.dtypes import compute_dtype
from mixrt.ops.ir.registry import REGISTRY, op
from mixrt.ops.ir.types import TensorType


# QAttention's inputs: input, weight, bias, input_scale, weight_scale, mask_index,
# input_zero_point, weight_zero_point, past
WEIGHT_ZERO_POINT_INDEX = 7


def _refuse_unsupported(do_rotary, past_present_share_buffer) -> None:
    if do_rotary:
        raise ValueError("QAttention: do_rotary=1 is not implemented (onnxruntime's CPU "
                         "kernel refuses it too)")
    if past_present_share_buffer:
        raise ValueError("QAttention: past_present_share_buffer=1 (a preallocated cache "
                         "updated in place) is not implemented; feed past as "
                         "(2, batch, heads, past_seq, head_size)")


@op("QAttention", since=1, domain=COM_MICROSOFT, dtypes=INT8S)
def qattention(xp, input, weight, bias, input_scale, weight_scale, mask_index=None,
               input_zero_point=None, weight_zero_point=None, past=None, *, num_heads=None,
               unidirectional=0, scale=0.0, mask_filter_value=MASK_FILTER_VALUE,
               do_rotary=0, past_present_share_buffer=0, _outputs=1, _prepacked=None):
    """Self-attention of the quantized ``input`` (batch, seq, input_hidden) through the
    quantized (input_hidden, 3 * hidden) weight; ``present`` stacks the past and this
    call's keys and values. ``_prepacked``: the session's dict for a constant weight (and
    weight_zero_point, input 7), which the CPU's product keeps packed for VNNI or centred
    once, as MatMulIntegerToFloat's does, instead of centring the weight every call."""
    _refuse_unsupported(do_rotary, past_present_share_buffer)
    if not num_heads:
        raise ValueError("QAttention: the num_heads attribute is required")
    dtype = np.dtype(bias.dtype)
    projected = device_product_to_float(xp, "QAttention", input, weight, input_scale,
                                        weight_scale, input_zero_point, weight_zero_point,
                                        bias, _prepacked, WEIGHT_ZERO_POINT_INDEX
                                        ).astype(compute_dtype(dtype), copy=False)
    hidden = weight.shape[1] // 3
    q, k, v = (split_heads(projected[..., i * hidden:(i + 1) * hidden], num_heads)
               for i in range(3))
    k = with_past(xp, None if past is None else past[0], k)
    v = with_past(xp, None if past is None else past[1], v)
    batch, q_len = input.shape[:2]
    total = k.shape[2]
    past_len = total - q_len
    hidden_keys = padded_keys(xp, mask_index, batch=batch, q_len=q_len, total=total,
                              past_len=past_len)
    causal = causally_hidden(xp, q_len, total, past_len) if unidirectional else None
    mask = additive_mask(xp, hidden_keys, causal, projected.dtype, mask_filter_value)
    y, _, _ = attend(xp, q, k, v, scale=scale, mask=mask)
    y = merge_heads(y).astype(dtype, copy=False)
    if _outputs < 2:
        return y
    return y, xp.stack([k, v]).astype(dtype, copy=False)


@qattention.infer
def _(input, weight, bias, input_scale, weight_scale, mask_index=None, input_zero_point=None,
      weight_zero_point=None, past=None, *, num_heads=None, do_rotary=0,
      past_present_share_buffer=0, **_):
    """The float Attention's rule over the same shapes, typed by the bias."""
    name = "QAttention"
    _refuse_unsupported(do_rotary, past_present_share_buffer)
    require_dtype(name, input.dtype, input_zero_point=input_zero_point)
    require_dtype(name, weight.dtype, weight_zero_point=weight_zero_point)
    require_dtype(name, bias.dtype, input_scale=input_scale, weight_scale=weight_scale)
    require_per_tensor(name, input_scale=input_scale, input_zero_point=input_zero_point)
    columns = None if weight.shape is None or len(weight.shape) != 2 else weight.shape[1]
    require_per_column(name, columns, weight_scale=weight_scale,
                       weight_zero_point=weight_zero_point)
    attention_infer = REGISTRY.find(COM_MICROSOFT, "Attention", 1).infer_fn
    return attention_infer(TensorType(bias.dtype, input.shape),
                           TensorType(bias.dtype, weight.shape), bias, mask_index, past,
                           num_heads=num_heads)
